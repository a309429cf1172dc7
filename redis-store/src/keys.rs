//! How the Redis store names what the engine asks for. Every name carries a hash tag (`{…}`)
//! around the tenant, so one script touches one Redis Cluster slot; a tenant's sub-buckets
//! (`store_shards`) get tags chosen to land on different parts of the slot space.
//!
//! - push limits: `weir:{tenant}:i` (ingestion) and `weir:{tenant}:r` (requests); sub-bucket
//!   tags `weir:{tenant#j}:i` ([`shard_tag`]);
//! - admission keys: `weir:{tenant}:k:<key>:<what>`, `what` being `t` (token bucket), `w`
//!   (sliding window), `l` (leaky bucket) or `c` (in-flight leases);
//! - cells: `weir:{tenant}:cells`, the tenant's demand per cell and replica, and
//!   `weir:{tenant}:k:<key>:s` an admission key's; and
//!   `weir:cells`, the registry of live cells (one key for the whole store, touched once per
//!   replica per sync interval).

use engine::cells::CellSubject;
use engine::store::{BucketKey, KeyName};
use engine::LimitKind;

/// The name of a bucket.
pub fn bucket(key: &BucketKey<'_>) -> String {
    if let Some(name) = key.key {
        return admission(
            &KeyName {
                tenant: key.tenant,
                key: name,
            },
            't',
        );
    }
    let kind = match key.kind {
        LimitKind::Request => 'r',
        LimitKind::Ingestion => 'i',
    };
    match shard_tag(key.tenant, key.shard, key.shards) {
        0 => format!("weir:{{{}}}:{kind}", key.tenant),
        tag => format!("weir:{{{}#{tag}}}:{kind}", key.tenant),
    }
}

/// The name of an admission key's entry: `what` is `t`, `w`, `l` or `c` (see the module).
pub fn admission(key: &KeyName<'_>, what: char) -> String {
    format!("weir:{{{}}}:k:{}:{what}", key.tenant, key.key)
}

/// Cells: the hash of a subject's reports, per cell and replica (`cell_slice.lua`).
pub fn cell_reports(subject: CellSubject<'_>) -> String {
    match subject {
        CellSubject::Tenant(tenant) => format!("weir:{{{tenant}}}:cells"),
        CellSubject::Key(key) => admission(&key, 's'),
    }
}

/// Cells: the registry of live cells (`cell_heartbeat.lua`).
pub fn cells_registry() -> &'static str {
    "weir:cells"
}

/// The tag number of sub-bucket `shard` of `shards`: the first `j` whose hash tag (`tenant`
/// for 0, `tenant#j` after) falls in the `shard`-th of `shards` equal parts of Redis
/// Cluster's 16 384 slots. A cluster's masters own contiguous slot ranges, so a tenant's
/// sub-buckets land on different masters, not wherever the hash puts them. One sub-bucket is
/// the plain `{tenant}` tag.
pub fn shard_tag(tenant: &str, shard: u32, shards: u32) -> u32 {
    let shards = shards.max(1);
    if shards == 1 {
        return 0;
    }
    let shard = shard % shards;
    let wanted = |slot: u32| slot * shards / 16_384 == shard;
    let mut tag = String::with_capacity(tenant.len() + 6);
    for j in 0..100_000u32 {
        tag.clear();
        tag.push_str(tenant);
        if j > 0 {
            let _ = std::fmt::Write::write_fmt(&mut tag, format_args!("#{j}"));
        }
        if wanted(cluster_slot(tag.as_bytes())) {
            return j;
        }
    }
    shard // unreachable in practice: the slots of `tenant#j` are spread evenly
}

/// Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) mod 16 384.
pub fn cluster_slot(tag: &[u8]) -> u32 {
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    u32::from(crc) % 16_384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_slot_is_redis_crc16() {
        // CRC-16/XMODEM's check value (0x31C3), and the slot Redis documents for "foo".
        assert_eq!(cluster_slot(b"123456789"), 0x31C3);
        assert_eq!(cluster_slot(b"foo"), 12182);
    }

    #[test]
    fn sub_buckets_are_tagged_into_separate_parts_of_the_slot_space() {
        for tenant in ["a", "team-b", "tenant-with-a-long-name-42"] {
            assert_eq!(shard_tag(tenant, 0, 1), 0, "one bucket keeps the plain tag");
            for shards in [2u32, 3, 5, 8] {
                let parts: std::collections::BTreeSet<u32> = (0..shards)
                    .map(|shard| {
                        let j = shard_tag(tenant, shard, shards);
                        let tag = if j == 0 {
                            tenant.to_string()
                        } else {
                            format!("{tenant}#{j}")
                        };
                        cluster_slot(tag.as_bytes()) * shards / 16_384
                    })
                    .collect();
                assert_eq!(parts.len(), shards as usize, "{tenant} over {shards}");
            }
        }
    }

    #[test]
    fn names() {
        let push = BucketKey::push("t", LimitKind::Ingestion, 0, 1);
        assert_eq!(bucket(&push), "weir:{t}:i");
        let request = BucketKey::push("t", LimitKind::Request, 0, 1);
        assert_eq!(bucket(&request), "weir:{t}:r");
        let tag = shard_tag("t", 1, 3);
        assert_eq!(
            bucket(&BucketKey::push("t", LimitKind::Ingestion, 1, 3)),
            format!("weir:{{t#{tag}}}:i")
        );
        let key = KeyName {
            tenant: "t",
            key: "GET%20%2Fa",
        };
        assert_eq!(admission(&key, 'c'), "weir:{t}:k:GET%20%2Fa:c");
        let token = BucketKey {
            key: Some("GET%20%2Fa"),
            ..push
        };
        assert_eq!(bucket(&token), "weir:{t}:k:GET%20%2Fa:t");
        assert_eq!(cell_reports(CellSubject::Tenant("t")), "weir:{t}:cells");
        let key = KeyName {
            tenant: "t",
            key: "a%2Fb",
        };
        assert_eq!(cell_reports(CellSubject::Key(key)), "weir:{t}:k:a%2Fb:s");
    }
}
