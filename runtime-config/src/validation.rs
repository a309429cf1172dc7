//! Mimir's series validation limits, per tenant: what a distributor checks in each series
//! before it charges the tenant's ingestion limit. The keys, their meaning and their defaults
//! are Mimir's (`max_label_names_per_series: 30`, `max_label_name_length: 1024`,
//! `max_label_value_length: 2048`, `creation_grace_period: 10m`, `past_grace_period: 0s`,
//! which is off). weir's remote-write 1.0 scan applies them (`src/remote_write/validate.rs`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One tenant's validation limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ValidationLimits {
    /// Labels per series, `__name__` included.
    pub max_label_names_per_series: u32,
    /// Bytes of a label name.
    pub max_label_name_length: u32,
    /// Bytes of a label value. A longer one refuses its series (Mimir's
    /// `label_value_length_over_limit_strategy: error`, the only strategy weir applies).
    pub max_label_value_length: u32,
    /// How far ahead of the replica's clock a sample's timestamp may be.
    #[serde(serialize_with = "serialize_duration")]
    pub creation_grace_period: Duration,
    /// How far behind the replica's clock a sample's timestamp may be; zero: no bound.
    #[serde(serialize_with = "serialize_duration")]
    pub past_grace_period: Duration,
}

impl Default for ValidationLimits {
    fn default() -> Self {
        ValidationLimits {
            max_label_names_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            creation_grace_period: Duration::from_secs(600),
            past_grace_period: Duration::ZERO,
        }
    }
}

/// The validation keys of a tenant's entry under `overrides:`; what is missing is inherited.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct ValidationOverride {
    pub max_label_names_per_series: Option<u32>,
    pub max_label_name_length: Option<u32>,
    pub max_label_value_length: Option<u32>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub creation_grace_period: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub past_grace_period: Option<Duration>,
}

impl ValidationOverride {
    pub(crate) fn is_empty(&self) -> bool {
        self.max_label_names_per_series.is_none()
            && self.max_label_name_length.is_none()
            && self.max_label_value_length.is_none()
            && self.creation_grace_period.is_none()
            && self.past_grace_period.is_none()
    }

    pub(crate) fn apply(&self, defaults: &ValidationLimits) -> ValidationLimits {
        ValidationLimits {
            max_label_names_per_series: self
                .max_label_names_per_series
                .unwrap_or(defaults.max_label_names_per_series),
            max_label_name_length: self
                .max_label_name_length
                .unwrap_or(defaults.max_label_name_length),
            max_label_value_length: self
                .max_label_value_length
                .unwrap_or(defaults.max_label_value_length),
            creation_grace_period: self
                .creation_grace_period
                .unwrap_or(defaults.creation_grace_period),
            past_grace_period: self.past_grace_period.unwrap_or(defaults.past_grace_period),
        }
    }
}

/// A duration as Mimir writes one (`10m`, `1h30m`, `0s`; a bare `0` too).
fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    if text.trim() == "0" {
        return Ok(Some(Duration::ZERO));
    }
    humantime::parse_duration(text.trim())
        .map(Some)
        .map_err(|err| serde::de::Error::custom(format!("{text:?}: {err}")))
}

fn serialize_duration<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_inherit_and_durations_read_as_mimir_writes_them() {
        let entry: ValidationOverride =
            serde_yaml_ng::from_str("max_label_names_per_series: 40\npast_grace_period: 1h30m\n")
                .unwrap();
        let limits = entry.apply(&ValidationLimits::default());
        assert_eq!(limits.max_label_names_per_series, 40);
        assert_eq!(limits.max_label_name_length, 1024);
        assert_eq!(limits.past_grace_period, Duration::from_secs(5400));
        assert_eq!(limits.creation_grace_period, Duration::from_secs(600));
        let zero: ValidationOverride =
            serde_yaml_ng::from_str("creation_grace_period: 0\n").unwrap();
        assert_eq!(zero.creation_grace_period, Some(Duration::ZERO));
        assert!(
            serde_yaml_ng::from_str::<ValidationOverride>("past_grace_period: soon\n").is_err()
        );
    }
}
