//! Mimir's HA-tracker keys, per tenant: whether a tenant's pushes come from Prometheus HA
//! pairs (`accept_ha_samples`), which labels name the pair and the replica, how many pairs a
//! tenant may have, and the tracker's timings. The keys, their meaning and their defaults are
//! Mimir's; weir's tracker is `src/ha.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validation::{optional_duration, serialize_duration};

/// One tenant's HA-tracker settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaLimits {
    /// Whether pushes carrying both labels below are deduplicated.
    pub accept_ha_samples: bool,
    /// The label naming the HA pair (the cluster), in the first series of a push.
    pub ha_cluster_label: String,
    /// The label naming the replica within the pair; removed from every forwarded series.
    pub ha_replica_label: String,
    /// Most HA clusters tracked for the tenant; 0: no limit.
    pub ha_max_clusters: u32,
    /// How long the elected replica's last push is kept to this replica before the fleet is
    /// told again.
    #[serde(serialize_with = "serialize_duration")]
    pub ha_tracker_update_timeout: Duration,
    /// A random part of up to this much, either way, added to the update timeout, so that
    /// replicas do not tell the fleet at the same instant.
    #[serde(serialize_with = "serialize_duration")]
    pub ha_tracker_update_timeout_jitter_max: Duration,
    /// How long the elected replica may be silent before another replica of its cluster is
    /// elected.
    #[serde(serialize_with = "serialize_duration")]
    pub ha_tracker_failover_timeout: Duration,
    /// Above 0, a failover also waits until the earliest sample of the other replica's push
    /// is at least this much later than the elected replica's last push (0: off).
    #[serde(serialize_with = "serialize_duration")]
    pub ha_tracker_sample_failover_timeout: Duration,
}

impl Default for HaLimits {
    fn default() -> Self {
        HaLimits {
            accept_ha_samples: false,
            ha_cluster_label: "cluster".to_string(),
            ha_replica_label: "__replica__".to_string(),
            ha_max_clusters: 100,
            ha_tracker_update_timeout: Duration::from_secs(15),
            ha_tracker_update_timeout_jitter_max: Duration::from_secs(5),
            ha_tracker_failover_timeout: Duration::from_secs(30),
            ha_tracker_sample_failover_timeout: Duration::ZERO,
        }
    }
}

impl HaLimits {
    /// Mimir's rule: the failover timeout must exceed the update timeout and its jitter by at
    /// least a second, or a live elected replica could be failed over between two updates.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.ha_cluster_label.is_empty() || self.ha_replica_label.is_empty() {
            return Err("ha_cluster_label and ha_replica_label must not be empty".to_string());
        }
        if self.ha_cluster_label == self.ha_replica_label {
            return Err(format!(
                "ha_cluster_label and ha_replica_label are both {:?}: the pair and the replica \
                 need two labels",
                self.ha_cluster_label
            ));
        }
        let least = self.ha_tracker_update_timeout
            + self.ha_tracker_update_timeout_jitter_max
            + Duration::from_secs(1);
        if self.ha_tracker_failover_timeout < least {
            return Err(format!(
                "ha_tracker_failover_timeout ({:?}) must be at least ha_tracker_update_timeout \
                 + ha_tracker_update_timeout_jitter_max + 1s ({least:?})",
                self.ha_tracker_failover_timeout
            ));
        }
        Ok(())
    }
}

/// The HA keys of a tenant's entry under `overrides:`; what is missing is inherited.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct HaOverride {
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub accept_ha_samples: Option<bool>,
    pub ha_cluster_label: Option<String>,
    pub ha_replica_label: Option<String>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub ha_max_clusters: Option<u32>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub ha_tracker_update_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub ha_tracker_update_timeout_jitter_max: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub ha_tracker_failover_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub ha_tracker_sample_failover_timeout: Option<Duration>,
}

impl HaOverride {
    pub(crate) fn is_empty(&self) -> bool {
        let HaOverride {
            accept_ha_samples,
            ha_cluster_label,
            ha_replica_label,
            ha_max_clusters,
            ha_tracker_update_timeout,
            ha_tracker_update_timeout_jitter_max,
            ha_tracker_failover_timeout,
            ha_tracker_sample_failover_timeout,
        } = self;
        accept_ha_samples.is_none()
            && ha_cluster_label.is_none()
            && ha_replica_label.is_none()
            && ha_max_clusters.is_none()
            && ha_tracker_update_timeout.is_none()
            && ha_tracker_update_timeout_jitter_max.is_none()
            && ha_tracker_failover_timeout.is_none()
            && ha_tracker_sample_failover_timeout.is_none()
    }

    pub(crate) fn apply(&self, defaults: &HaLimits) -> HaLimits {
        HaLimits {
            accept_ha_samples: self.accept_ha_samples.unwrap_or(defaults.accept_ha_samples),
            ha_cluster_label: self
                .ha_cluster_label
                .clone()
                .unwrap_or_else(|| defaults.ha_cluster_label.clone()),
            ha_replica_label: self
                .ha_replica_label
                .clone()
                .unwrap_or_else(|| defaults.ha_replica_label.clone()),
            ha_max_clusters: self.ha_max_clusters.unwrap_or(defaults.ha_max_clusters),
            ha_tracker_update_timeout: self
                .ha_tracker_update_timeout
                .unwrap_or(defaults.ha_tracker_update_timeout),
            ha_tracker_update_timeout_jitter_max: self
                .ha_tracker_update_timeout_jitter_max
                .unwrap_or(defaults.ha_tracker_update_timeout_jitter_max),
            ha_tracker_failover_timeout: self
                .ha_tracker_failover_timeout
                .unwrap_or(defaults.ha_tracker_failover_timeout),
            ha_tracker_sample_failover_timeout: self
                .ha_tracker_sample_failover_timeout
                .unwrap_or(defaults.ha_tracker_sample_failover_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_mimirs_and_the_failover_rule_holds() {
        let defaults = HaLimits::default();
        assert!(defaults.validate().is_ok());
        let short = HaOverride {
            ha_tracker_failover_timeout: Some(Duration::from_secs(20)),
            ..HaOverride::default()
        }
        .apply(&defaults);
        let err = short.validate().unwrap_err();
        assert!(err.contains("at least"), "{err}");
        let same = HaOverride {
            ha_replica_label: Some("cluster".into()),
            ..HaOverride::default()
        }
        .apply(&defaults);
        assert!(same.validate().is_err());
    }
}
