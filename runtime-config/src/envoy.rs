//! Limits for Envoy's rate-limit service protocol, in a form close to envoyproxy/ratelimit's
//! descriptor config, under the top-level `envoy_domains:` key:
//!
//! ```yaml
//! envoy_domains:
//!   - domain: edge              # Envoy's rate_limit_service domain
//!     tenant: edge              # whose strategy and overrides apply (default: the domain)
//!     descriptors:
//!       - key: remote_address   # no value: each remote address gets its own limit
//!         rate_limit: {unit: second, requests_per_unit: 10}
//!       - key: path
//!         value: /search        # this value only
//!         rate_limit: {unit: minute, requests_per_unit: 100}
//!         descriptors:          # nested: path=/search and then client_id=…
//!           - key: client_id
//!             rate_limit: {unit: second, requests_per_unit: 5}
//! ```
//!
//! A request's descriptor (a list of key/value entries) walks the tree: at each level an
//! entry matches a config descriptor with its key and value first, then one with its key
//! alone. The deepest match with a `rate_limit` is the limit, counted per matched entries
//! (`key=value` pairs joined by `|`), as a sliding window of one unit. A descriptor that
//! matches no limit is not limited (envoyproxy/ratelimit's rule).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admission::{Algorithm, LimitSpec};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyDomain {
    pub domain: String,
    /// The tenant whose strategy (and `allow_client_limits`) applies; the domain by default.
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub descriptors: Vec<EnvoyDescriptor>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyDescriptor {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub rate_limit: Option<EnvoyRateLimit>,
    #[serde(default)]
    pub descriptors: Vec<EnvoyDescriptor>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyRateLimit {
    pub unit: Unit,
    pub requests_per_unit: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit's number in Envoy's `RateLimitUnit` / `RateLimitResponse.RateLimit.Unit`.
    pub fn envoy_code(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    pub fn from_envoy_code(code: i32) -> Option<Unit> {
        Some(match code {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

impl EnvoyRateLimit {
    /// The limit as a sliding window of one unit: `requests_per_unit` per unit.
    pub fn spec(&self) -> LimitSpec {
        let window = Duration::from_secs(self.unit.seconds());
        LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            rate: self.requests_per_unit as f64 / window.as_secs_f64(),
            burst: self.requests_per_unit as u64,
            window,
            max_concurrent: 0,
        }
    }
}

/// The limit a descriptor matched, and the key it is counted under.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    pub key: String,
    pub limit: EnvoyRateLimit,
}

impl EnvoyDomain {
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or(&self.domain)
    }

    /// The limit of the config descriptor the request's last entry reaches, every entry
    /// matching on the way: envoyproxy/ratelimit's rule, under which a request deeper or
    /// shallower than the limit it passes on the way ("request depth does not match config
    /// depth") has none.
    pub fn matches(&self, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut level = &self.descriptors;
        let mut key = String::new();
        let mut found = None;
        for (name, value) in entries {
            found = None;
            let node = level
                .iter()
                .find(|d| d.key == *name && d.value.as_deref() == Some(*value))
                .or_else(|| level.iter().find(|d| d.key == *name && d.value.is_none()))?;
            if !key.is_empty() {
                key.push('|');
            }
            key.push_str(name);
            key.push('=');
            key.push_str(value);
            if let Some(limit) = node.rate_limit {
                found = Some(Matched {
                    key: key.clone(),
                    limit,
                });
            }
            level = &node.descriptors;
        }
        found
    }

    pub fn validate(&self) -> Result<(), String> {
        fn walk(descriptors: &[EnvoyDescriptor], path: &str) -> Result<(), String> {
            for descriptor in descriptors {
                if descriptor.key.is_empty() {
                    return Err(format!("{path}: a descriptor needs a key"));
                }
                if descriptor
                    .rate_limit
                    .is_some_and(|l| l.requests_per_unit == 0)
                {
                    return Err(format!(
                        "{path}.{}: requests_per_unit must be at least 1",
                        descriptor.key
                    ));
                }
                walk(
                    &descriptor.descriptors,
                    &format!("{path}.{}", descriptor.key),
                )?;
            }
            Ok(())
        }
        if self.domain.is_empty() {
            return Err("a domain needs a name".to_string());
        }
        walk(&self.descriptors, &self.domain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain() -> EnvoyDomain {
        serde_yaml_ng::from_str(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: path\n    value: /search\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    descriptors:\n      - key: client_id\n        rate_limit: {unit: second, requests_per_unit: 5}\n      - key: region\n  - key: path\n    descriptors:\n      - key: client_id\n        value: vip\n        rate_limit: {unit: second, requests_per_unit: 50}\n",
        )
        .unwrap()
    }

    #[test]
    fn descriptors_walk_the_tree_value_first_then_key_alone() {
        let domain = domain();
        let matched = domain.matches(&[("remote_address", "10.0.0.1")]).unwrap();
        assert_eq!(matched.key, "remote_address=10.0.0.1");
        assert_eq!(matched.limit.requests_per_unit, 10);
        let deepest = domain
            .matches(&[("path", "/search"), ("client_id", "a")])
            .unwrap();
        assert_eq!(deepest.key, "path=/search|client_id=a");
        assert_eq!(deepest.limit.requests_per_unit, 5);
        let vip = domain
            .matches(&[("path", "/other"), ("client_id", "vip")])
            .unwrap();
        assert_eq!(vip.limit.requests_per_unit, 50);
        assert_eq!(
            domain.matches(&[("path", "/other"), ("client_id", "b")]),
            None
        );
        assert_eq!(domain.matches(&[("unknown", "x")]), None);
        // The limit is the last entry's: one passed on the way does not count, as in
        // envoyproxy/ratelimit; nor does a request deeper than the tree.
        let shallow = domain.matches(&[("path", "/search")]).unwrap();
        assert_eq!(shallow.limit.requests_per_unit, 100);
        assert_eq!(
            domain.matches(&[("path", "/search"), ("region", "eu")]),
            None
        );
        assert_eq!(
            domain.matches(&[("path", "/search"), ("client_id", "a"), ("extra", "1")]),
            None
        );
        assert_eq!(domain.tenant(), "edge");
        let spec = matched.limit.spec();
        assert_eq!(spec.per_window(), 10.0);
    }
}
