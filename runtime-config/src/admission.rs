//! Limits for the admission API (`Allow`, `Acquire`): per tenant and per key (a route or any
//! string), with defaults, and whether a client may send its own limit spec.
//!
//! ```yaml
//! admission:
//!   strict: false                 # unknown tenant or key: NOT_FOUND instead of the default
//!   default_limit: {rate: 100}    # for keys without a limit of their own
//! overrides:
//!   team-a:
//!     allow_client_limits: false  # a spec sent by a client applies only when true
//!     limits:
//!       "GET /search": {algorithm: sliding_window, rate: 100, window: 1s}
//!       "POST /upload": {max_concurrent: 10}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest window a spec may have: a window is counted in nanoseconds, and past about
/// 584 years their count no longer fits; a century is room for any quota.
pub const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 86_400);

/// How a key's rate is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// A bucket of `burst` tokens refilled at `rate` per second: bursts up to `burst`, then
    /// the rate.
    #[default]
    TokenBucket,
    /// The previous window's count, weighted by how much of it still overlaps the last
    /// `window`, plus the current one: at most `rate × window` per window.
    SlidingWindow,
    /// A meter that drains at `rate`: a request conforms after a delay (returned, so a caller
    /// can wait instead of failing), refused when the backlog would exceed `burst`.
    LeakyBucket,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }
}

/// One key's limit, fleet-wide.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Per second, fleet-wide. 0: no rate limit (only `max_concurrent`).
    #[serde(default)]
    pub rate: f64,
    /// Token bucket: capacity; leaky bucket: the most backlog, in cost units. 0 means one
    /// second's worth (at least 1).
    #[serde(default)]
    pub burst: u64,
    /// Sliding window: its length (default 1s).
    #[serde(
        default = "one_second",
        deserialize_with = "duration",
        serialize_with = "serialize_duration"
    )]
    pub window: Duration,
    /// Requests in flight at once, fleet-wide (`Acquire`); 0: no cap.
    #[serde(default)]
    pub max_concurrent: u64,
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(serde::de::Error::custom)
}

fn serialize_duration<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}

impl LimitSpec {
    /// A token bucket of `rate` per second and one second's burst.
    pub fn rate(rate: f64) -> LimitSpec {
        LimitSpec {
            algorithm: Algorithm::TokenBucket,
            rate,
            burst: 0,
            window: one_second(),
            max_concurrent: 0,
        }
        .resolved()
    }

    /// Fills in the defaults (`burst: 0` becomes one second's worth).
    pub fn resolved(mut self) -> LimitSpec {
        if self.burst == 0 && self.rate > 0.0 {
            self.burst = (self.rate.ceil() as u64).max(1);
        }
        self
    }

    /// The rules a spec must meet; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate >= 0.0) {
            return Err(format!(
                "rate must be a finite number ≥ 0, got {}",
                self.rate
            ));
        }
        if self.rate == 0.0 && self.max_concurrent == 0 {
            return Err("a limit needs a rate > 0 or max_concurrent > 0".to_string());
        }
        crate::limits::check_refill("rate", self.rate, self.burst)?;
        if self.algorithm == Algorithm::SlidingWindow && self.window.is_zero() {
            return Err("window must be > 0 for a sliding window".to_string());
        }
        if self.window > MAX_WINDOW {
            return Err(format!(
                "window must be at most 100 years ({} s), got {} s",
                MAX_WINDOW.as_secs(),
                self.window.as_secs()
            ));
        }
        if self.algorithm == Algorithm::SlidingWindow && self.rate > 0.0 {
            let per_window = self.rate * self.window.as_secs_f64();
            if per_window < 1.0 {
                return Err(format!(
                    "rate × window is {per_window}: a sliding window must allow at least one \
                     request per window"
                ));
            }
        }
        Ok(())
    }

    /// What a sliding window allows per window.
    pub fn per_window(&self) -> f64 {
        self.rate * self.window.as_secs_f64()
    }
}

/// The top-level `admission:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionDefaults {
    /// Unknown tenants and keys get NOT_FOUND instead of the default limit.
    #[serde(default)]
    pub strict: bool,
    /// The limit of keys without one of their own (none: such keys get NOT_FOUND).
    #[serde(default = "default_limit")]
    pub default_limit: Option<LimitSpec>,
}

fn default_limit() -> Option<LimitSpec> {
    Some(LimitSpec::rate(100.0))
}

/// A tenant's admission settings (`overrides.<tenant>.limits`, `.allow_client_limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TenantAdmission {
    pub allow_client_limits: bool,
    pub limits: BTreeMap<String, LimitSpec>,
}

/// Every admission setting in force.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionConfig {
    pub strict: bool,
    pub default_limit: Option<LimitSpec>,
    pub tenants: BTreeMap<String, TenantAdmission>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            strict: false,
            default_limit: default_limit(),
            tenants: BTreeMap::new(),
        }
    }
}

/// Why no limit applies to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// Strict: the tenant is not in the overrides.
    UnknownTenant,
    /// Strict: the tenant has no limit for the key.
    UnknownKey,
    /// Not strict, but no default limit is configured.
    NoLimit,
}

/// Where the limit in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    Key,
    Client,
    Default,
}

impl AdmissionConfig {
    /// The limit in force for `tenant`'s `key`: the operator's for that key; else the
    /// client's, where the tenant allows client limits; else (unless strict) the default.
    pub fn resolve(
        &self,
        tenant: &str,
        key: &str,
        client: Option<LimitSpec>,
    ) -> Result<(LimitSpec, LimitSource), Unresolved> {
        let settings = self.tenants.get(tenant);
        if let Some(spec) = settings.and_then(|s| s.limits.get(key)) {
            return Ok((*spec, LimitSource::Key));
        }
        if let (Some(client), true) = (client, settings.is_some_and(|s| s.allow_client_limits)) {
            return Ok((client.resolved(), LimitSource::Client));
        }
        if self.strict {
            return Err(if settings.is_none() {
                Unresolved::UnknownTenant
            } else {
                Unresolved::UnknownKey
            });
        }
        self.default_limit
            .map(|spec| (spec, LimitSource::Default))
            .ok_or(Unresolved::NoLimit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AdmissionConfig {
        let mut tenants = BTreeMap::new();
        tenants.insert(
            "a".to_string(),
            TenantAdmission {
                allow_client_limits: false,
                limits: [("GET /x".to_string(), LimitSpec::rate(5.0))].into(),
            },
        );
        tenants.insert(
            "b".to_string(),
            TenantAdmission {
                allow_client_limits: true,
                limits: BTreeMap::new(),
            },
        );
        AdmissionConfig {
            strict: false,
            default_limit: Some(LimitSpec::rate(100.0)),
            tenants,
        }
    }

    #[test]
    fn the_operator_s_limit_wins_and_clients_only_speak_where_allowed() {
        let config = config();
        let client = LimitSpec::rate(1e9);
        assert_eq!(
            config.resolve("a", "GET /x", Some(client)),
            Ok((LimitSpec::rate(5.0), LimitSource::Key))
        );
        assert_eq!(
            config.resolve("a", "other", Some(client)),
            Ok((LimitSpec::rate(100.0), LimitSource::Default)),
            "a client cannot raise its own limit"
        );
        assert_eq!(
            config.resolve("b", "other", Some(client)),
            Ok((client, LimitSource::Client))
        );
        let strict = AdmissionConfig {
            strict: true,
            ..config.clone()
        };
        assert_eq!(
            strict.resolve("zz", "k", None),
            Err(Unresolved::UnknownTenant)
        );
        assert_eq!(strict.resolve("a", "k", None), Err(Unresolved::UnknownKey));
        let none = AdmissionConfig {
            default_limit: None,
            ..config
        };
        assert_eq!(none.resolve("a", "k", None), Err(Unresolved::NoLimit));
    }

    #[test]
    fn specs_are_checked() {
        assert!(LimitSpec::rate(-1.0).validate().is_err());
        let nothing = LimitSpec {
            rate: 0.0,
            ..LimitSpec::rate(1.0)
        };
        assert!(nothing.validate().unwrap_err().contains("max_concurrent"));
        let tiny = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            rate: 0.5,
            window: Duration::from_secs(1),
            ..LimitSpec::rate(1.0)
        };
        assert!(tiny.validate().is_err());
        assert_eq!(LimitSpec::rate(2.5).burst, 3);
        // A window whose nanoseconds would not fit (2^64 ns, about 584.5 years) is refused,
        // not wrapped round to a few nanoseconds; a century passes.
        let window = |window: Duration| LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            window,
            ..LimitSpec::rate(1.0)
        };
        let wraps = window(Duration::from_nanos(u64::MAX) + Duration::from_nanos(1));
        assert!(wraps.validate().unwrap_err().contains("at most 100 years"));
        assert_eq!(window(MAX_WINDOW).validate(), Ok(()));
        assert!(window(MAX_WINDOW + Duration::from_secs(1))
            .validate()
            .is_err());
    }
}
