//! What each subsystem is built from: the settings of the upstream client, the limits
//! defaults, the `Retry-After` policy, the store, the HTTP server and the ring, read from the
//! parsed flags. Parsing and precedence are in [`super`].

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use runtime_config::{Defaults, InstanceLimits, TenantLimits};

use super::Config;
use crate::rejection::{RetryAfter, RetryBackoff};

impl Config {
    /// The upstream client's TLS files.
    pub fn upstream_tls(&self) -> crate::tls::ClientTls {
        crate::tls::ClientTls {
            ca: self.upstream_tls_ca_file.clone(),
            identity: self
                .upstream_tls_cert_file
                .clone()
                .zip(self.upstream_tls_key_file.clone()),
        }
    }

    /// The limits every tenant inherits unless its override says otherwise.
    pub fn defaults(&self) -> Defaults {
        Defaults {
            tenant: TenantLimits {
                ingestion_rate: self.ingestion_rate,
                ingestion_burst_size: self.ingestion_burst_size,
                ingestion_burst_factor: 0.0,
                request_rate: self.request_rate,
                request_burst_size: self.request_burst_size,
                rate_limit_strategy: self.rate_limit_strategy,
                on_store_failure: self.on_store_failure,
                store_shards: 1,
                max_inflight_push_requests: 0,
            },
            instance: InstanceLimits {
                max_inflight_push_requests: self.max_inflight_push_requests,
                max_inflight_push_requests_bytes: self.max_inflight_push_requests_bytes,
                max_ingestion_rate: self.max_ingestion_rate,
            },
        }
    }

    pub fn retry_after_policy(&self) -> RetryAfter {
        RetryAfter {
            mode: self.retry_after,
            backoff: RetryBackoff {
                min: self.retry_after_min_backoff,
                max: self.retry_after_max_backoff,
            },
        }
    }

    /// How `shared` tenants use the store.
    pub fn shared(&self) -> engine::SharedConfig {
        engine::SharedConfig {
            store_timeout: self.store_timeout,
            lease_window: self.store_lease_window,
            lease_ttl: self.store_lease_ttl,
            calls_per_tenant: self.store_calls_per_tenant,
            breaker: engine::breaker::BreakerConfig {
                consecutive_failures: self.store_breaker_failures.max(1),
                open_for: self.store_breaker_open_for,
                max_open_for: self.store_breaker_open_for.max(Duration::from_secs(1)),
                ..engine::breaker::BreakerConfig::default()
            },
            replica_seed: self.node_id.bytes().fold(0u64, |hash, byte| {
                hash.wrapping_mul(31).wrapping_add(byte as u64)
            }),
        }
    }

    /// The ring's cluster id: `--cluster-id`, and in a cell `<cluster-id>/<cell>`, so each
    /// cell gossips in a ring of its own.
    pub fn ring_cluster_id(&self) -> String {
        match &self.cell {
            Some(cell) => format!("{}/{cell}", self.cluster_id),
            None => self.cluster_id.clone(),
        }
    }

    /// How a replica in a cell keeps its slices (see [`engine::cells`]).
    pub fn cell_sync(&self) -> engine::CellSyncConfig {
        engine::CellSyncConfig {
            slice_ttl_nanos: self.cell_slice_ttl.as_nanos().min(u64::MAX as u128) as u64,
            floor_fraction: self.cell_floor,
            fallback: self.cell_fallback_floor,
        }
    }

    /// The HTTP listener's bounds.
    pub fn http_limits(&self) -> crate::http_serve::HttpLimits {
        crate::http_serve::HttpLimits {
            header_read_timeout: self.http_header_read_timeout,
            max_header_bytes: self.http_max_header_bytes,
            max_connections: self.http_max_connections,
            http2_max_concurrent_streams: self.http2_max_concurrent_streams,
            workers: self.http_workers(),
            pin_workers: self.http_pin_workers,
        }
    }

    /// `--http-workers`, with 0 resolved to the cores this process may use.
    pub fn http_workers(&self) -> usize {
        match self.http_workers {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            workers => workers,
        }
    }

    /// The failure throttle's budget per source (`--auth-failure-burst`, `-rate`).
    pub fn auth_failure_limits(&self) -> crate::auth::FailureLimits {
        crate::auth::FailureLimits {
            rate: self.auth_failure_rate,
            burst: f64::from(self.auth_failure_burst),
        }
    }

    /// The gossip keys, from `--gossip-secret` or `--gossip-secret-file`; `None` without.
    pub fn gossip_keys(&self) -> anyhow::Result<Option<ring::GossipKeys>> {
        let secrets: Vec<String> = match &self.gossip_secret_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --gossip-secret-file {}", path.display()))?
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_string)
                .collect(),
            None => self.gossip_secret.clone(),
        };
        if secrets.is_empty() {
            if self.gossip_secret_file.is_some() {
                bail!("--gossip-secret-file holds no secret");
            }
            return Ok(None);
        }
        ring::GossipKeys::new(&secrets)
            .map(Some)
            .context("--gossip-secret")
    }

    /// How this replica joins the ring; `http_addr` is what it publishes for operators. A
    /// listener on every interface (0.0.0.0, as in a pod) is published at the gossip
    /// advertise address's IP, which peers can reach.
    pub fn ring(
        &self,
        mut http_addr: SocketAddr,
        mut grpc_addr: SocketAddr,
        gossip_keys: Option<ring::GossipKeys>,
    ) -> ring::RingConfig {
        if let Some(advertised) = self.gossip_advertise_addr {
            for addr in [&mut http_addr, &mut grpc_addr] {
                if addr.ip().is_unspecified() {
                    addr.set_ip(advertised.ip());
                }
            }
        }
        ring::RingConfig {
            gossip_keys,
            grpc_addr: Some(grpc_addr.to_string()),
            node_id: self.node_id.clone(),
            cluster_id: self.ring_cluster_id(),
            listen_addr: self.gossip_addr,
            advertise_addr: self.gossip_advertise_addr,
            seeds: self.join.clone(),
            seeds_refresh_interval: self.join_refresh_interval,
            gossip_interval: self.gossip_interval,
            phi_threshold: self.ring_phi_threshold,
            dead_node_grace_period: self.ring_dead_node_grace_period,
            join_timeout: self.ring_join_timeout,
            http_addr: http_addr.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_members: self.ring_max_members,
            usage_forget_after: usage_forget_after(self.tenant_idle_timeout),
        }
    }
}

/// How long a tenant a peer no longer lists stays in this replica's view of the peers' usage:
/// past the idle timeout, after which the peer drops an idle tenant (later only while its
/// buckets refill), with room for a listing cycle (a peer with many tenants lists them in
/// turn, a minute for 100 000). Bounds the view by the tenants active in the last
/// idle timeout plus five minutes, not the last hour.
pub fn usage_forget_after(tenant_idle_timeout: Duration) -> Duration {
    tenant_idle_timeout + Duration::from_secs(300)
}
