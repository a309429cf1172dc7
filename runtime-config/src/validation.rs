//! Mimir's series and metadata validation limits, per tenant: what a distributor checks in
//! each series and metadata entry before it charges the tenant's ingestion limit. The keys,
//! their meaning and their defaults are Mimir's (`max_label_names_per_series: 30`,
//! `max_label_names_per_info_series: 80`,
//! `max_label_name_length: 1024`, `max_label_value_length: 2048`,
//! `label_value_length_over_limit_strategy: error`, `creation_grace_period: 10m`,
//! `past_grace_period: 0s`, which is off, `max_metadata_length: 1024`,
//! `enforce_metadata_metric_name: true`, `max_native_histogram_buckets: 0`, which is off,
//! `reduce_native_histogram_over_max_buckets: true`, and for exemplars
//! `max_global_exemplars_per_user: 0`, which takes them all out, and
//! `max_exemplars_per_series_per_request: 0`, which is off, and `name_validation_scheme: legacy`).
//! weir's remote-write 1.0 and 2.0
//! scans apply them (`src/remote_write/validate.rs`, shared by both).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes of the `(hash:<64 hex digits>)` that `truncate` and `drop` write into a label value
/// over `max_label_value_length` (Mimir's `LabelValueHashLen`: blake2b-256 in hex).
pub const LABEL_VALUE_HASH_LENGTH: u32 = 71;

/// What happens to a label value over `max_label_value_length` (Mimir's
/// `label_value_length_over_limit_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LabelValueLengthOverLimitStrategy {
    /// The series is refused (`label_value_too_long`).
    #[default]
    Error,
    /// The value keeps its first `max_label_value_length - 71` bytes, followed by
    /// `(hash:<blake2b-256 of the whole value>)`; the series is accepted.
    Truncate,
    /// The value becomes `(hash:<blake2b-256 of the whole value>)`; the series is accepted.
    Drop,
}

impl<'de> Deserialize<'de> for LabelValueLengthOverLimitStrategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // Mimir reads an empty value as `error` too.
        match text.as_str() {
            "" | "error" => Ok(Self::Error),
            "truncate" => Ok(Self::Truncate),
            "drop" => Ok(Self::Drop),
            other => Err(serde::de::Error::custom(format!(
                "unrecognized label_value_length_over_limit_strategy {other:?}: expected \
                 error, truncate or drop"
            ))),
        }
    }
}

/// Which metric and label names are valid (Mimir's `name_validation_scheme`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NameValidationScheme {
    /// Prometheus' legacy names: a metric `[a-zA-Z_:][a-zA-Z0-9_:]*`, a label
    /// `[a-zA-Z_][a-zA-Z0-9_]*`. Mimir's default.
    #[default]
    Legacy,
    /// Any name that is not empty (and UTF-8, which every string of a push is).
    Utf8,
}

impl<'de> Deserialize<'de> for NameValidationScheme {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "legacy" => Ok(Self::Legacy),
            "utf8" => Ok(Self::Utf8),
            other => Err(serde::de::Error::custom(format!(
                "unrecognized name_validation_scheme {other:?}: expected legacy or utf8"
            ))),
        }
    }
}

/// One tenant's validation limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ValidationLimits {
    /// Labels per series, `__name__` included.
    pub max_label_names_per_series: u32,
    /// Labels per info series (a metric name ending in `_info`, such as `target_info`), which
    /// may have more than `max_label_names_per_series`.
    pub max_label_names_per_info_series: u32,
    /// Bytes of a label name.
    pub max_label_name_length: u32,
    /// Bytes of a label value. What a longer one does is
    /// `label_value_length_over_limit_strategy`'s.
    pub max_label_value_length: u32,
    /// `error` refuses a series with a value over `max_label_value_length`; `truncate` and
    /// `drop` rewrite the value with its hash and accept the series.
    pub label_value_length_over_limit_strategy: LabelValueLengthOverLimitStrategy,
    /// How far ahead of the replica's clock a sample's timestamp may be.
    #[serde(serialize_with = "serialize_duration")]
    pub creation_grace_period: Duration,
    /// How far behind the replica's clock a sample's timestamp may be; zero: no bound.
    #[serde(serialize_with = "serialize_duration")]
    pub past_grace_period: Duration,
    /// Bytes of a metadata entry's metric name, unit and help. A longer help is cut to fit;
    /// a longer name or unit refuses the entry.
    pub max_metadata_length: u32,
    /// A metadata entry without a metric name is refused.
    pub enforce_metadata_metric_name: bool,
    /// Buckets of a native histogram sample (positive and negative); zero: no limit.
    pub max_native_histogram_buckets: u32,
    /// Over `max_native_histogram_buckets`, a histogram's resolution is lowered until it fits;
    /// without it, or when it cannot be lowered enough, its series is refused.
    pub reduce_native_histogram_over_max_buckets: bool,
    /// Exemplars a tenant may store in all (the ingesters' limit). A distributor reads only
    /// whether it is zero, as Mimir's does: zero, the default, takes every exemplar out of a
    /// push before it is charged or forwarded.
    pub max_global_exemplars_per_user: u64,
    /// Exemplars a series may carry in one request; the rest are dropped
    /// (`too_many_exemplars_per_series_per_request`). Zero: no limit.
    pub max_exemplars_per_series_per_request: u32,
    /// Which metric and label names are valid.
    pub name_validation_scheme: NameValidationScheme,
}

impl Default for ValidationLimits {
    fn default() -> Self {
        ValidationLimits {
            max_label_names_per_series: 30,
            max_label_names_per_info_series: 80,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            label_value_length_over_limit_strategy: LabelValueLengthOverLimitStrategy::Error,
            creation_grace_period: Duration::from_secs(600),
            past_grace_period: Duration::ZERO,
            max_metadata_length: 1024,
            enforce_metadata_metric_name: true,
            max_native_histogram_buckets: 0,
            reduce_native_histogram_over_max_buckets: true,
            max_global_exemplars_per_user: 0,
            max_exemplars_per_series_per_request: 0,
            name_validation_scheme: NameValidationScheme::Legacy,
        }
    }
}

/// The validation keys of a tenant's entry under `overrides:`; what is missing is inherited.
/// Read through [`ValidationKeys`], so that a combination Mimir refuses fails the load.
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub(crate) struct ValidationOverride(ValidationKeys);

#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct ValidationKeys {
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_label_names_per_series: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_label_names_per_info_series: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_label_name_length: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_label_value_length: Option<u32>,
    pub label_value_length_over_limit_strategy: Option<LabelValueLengthOverLimitStrategy>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub creation_grace_period: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub past_grace_period: Option<Duration>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_metadata_length: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub enforce_metadata_metric_name: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_native_histogram_buckets: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub reduce_native_histogram_over_max_buckets: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_global_exemplars_per_user: Option<u64>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_exemplars_per_series_per_request: Option<u32>,
    pub name_validation_scheme: Option<NameValidationScheme>,
}

impl<'de> Deserialize<'de> for ValidationOverride {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let keys = ValidationKeys::deserialize(deserializer)?;
        let entry = ValidationOverride(keys);
        entry
            .apply(&ValidationLimits::default())
            .check()
            .map_err(serde::de::Error::custom)?;
        Ok(entry)
    }
}

impl ValidationLimits {
    /// Mimir's load-time check: the hash `truncate` and `drop` write must fit in the limit.
    pub fn check(&self) -> Result<(), String> {
        use LabelValueLengthOverLimitStrategy::{Drop, Truncate};
        let strategy = self.label_value_length_over_limit_strategy;
        if matches!(strategy, Truncate | Drop)
            && self.max_label_value_length < LABEL_VALUE_HASH_LENGTH
        {
            let name = if strategy == Truncate {
                "truncate"
            } else {
                "drop"
            };
            return Err(format!(
                "cannot set label_value_length_over_limit_strategy to {name:?}: label value \
                 hash suffix would exceed max label value length of {}",
                self.max_label_value_length
            ));
        }
        Ok(())
    }
}

impl ValidationOverride {
    /// The entry's `name_validation_scheme`, or Mimir's default.
    pub(crate) fn scheme(&self) -> NameValidationScheme {
        self.0.name_validation_scheme.unwrap_or_default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        let ValidationKeys {
            max_label_names_per_series,
            max_label_names_per_info_series,
            max_label_name_length,
            max_label_value_length,
            label_value_length_over_limit_strategy,
            creation_grace_period,
            past_grace_period,
            max_metadata_length,
            enforce_metadata_metric_name,
            max_native_histogram_buckets,
            reduce_native_histogram_over_max_buckets,
            max_global_exemplars_per_user,
            max_exemplars_per_series_per_request,
            name_validation_scheme,
        } = &self.0;
        max_label_names_per_series.is_none()
            && max_label_names_per_info_series.is_none()
            && max_label_name_length.is_none()
            && max_label_value_length.is_none()
            && label_value_length_over_limit_strategy.is_none()
            && creation_grace_period.is_none()
            && past_grace_period.is_none()
            && max_metadata_length.is_none()
            && enforce_metadata_metric_name.is_none()
            && max_native_histogram_buckets.is_none()
            && reduce_native_histogram_over_max_buckets.is_none()
            && max_global_exemplars_per_user.is_none()
            && max_exemplars_per_series_per_request.is_none()
            && name_validation_scheme.is_none()
    }

    pub(crate) fn apply(&self, defaults: &ValidationLimits) -> ValidationLimits {
        let keys = &self.0;
        ValidationLimits {
            max_label_names_per_series: keys
                .max_label_names_per_series
                .unwrap_or(defaults.max_label_names_per_series),
            max_label_names_per_info_series: keys
                .max_label_names_per_info_series
                .unwrap_or(defaults.max_label_names_per_info_series),
            max_label_name_length: keys
                .max_label_name_length
                .unwrap_or(defaults.max_label_name_length),
            max_label_value_length: keys
                .max_label_value_length
                .unwrap_or(defaults.max_label_value_length),
            label_value_length_over_limit_strategy: keys
                .label_value_length_over_limit_strategy
                .unwrap_or(defaults.label_value_length_over_limit_strategy),
            creation_grace_period: keys
                .creation_grace_period
                .unwrap_or(defaults.creation_grace_period),
            past_grace_period: keys.past_grace_period.unwrap_or(defaults.past_grace_period),
            max_metadata_length: keys
                .max_metadata_length
                .unwrap_or(defaults.max_metadata_length),
            enforce_metadata_metric_name: keys
                .enforce_metadata_metric_name
                .unwrap_or(defaults.enforce_metadata_metric_name),
            max_native_histogram_buckets: keys
                .max_native_histogram_buckets
                .unwrap_or(defaults.max_native_histogram_buckets),
            reduce_native_histogram_over_max_buckets: keys
                .reduce_native_histogram_over_max_buckets
                .unwrap_or(defaults.reduce_native_histogram_over_max_buckets),
            max_global_exemplars_per_user: keys
                .max_global_exemplars_per_user
                .unwrap_or(defaults.max_global_exemplars_per_user),
            max_exemplars_per_series_per_request: keys
                .max_exemplars_per_series_per_request
                .unwrap_or(defaults.max_exemplars_per_series_per_request),
            name_validation_scheme: keys
                .name_validation_scheme
                .unwrap_or(defaults.name_validation_scheme),
        }
    }
}

/// A duration as Mimir writes one (`10m`, `1h30m`, `0s`; a bare `0` too).
pub(crate) fn optional_duration<'de, D: Deserializer<'de>>(
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

pub(crate) fn serialize_duration<S: Serializer>(
    value: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
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
        assert_eq!(
            limits.max_label_names_per_info_series, 80,
            "Mimir's default"
        );
        assert_eq!(limits.max_label_name_length, 1024);
        assert_eq!(limits.past_grace_period, Duration::from_secs(5400));
        assert_eq!(limits.creation_grace_period, Duration::from_secs(600));
        let zero: ValidationOverride =
            serde_yaml_ng::from_str("creation_grace_period: 0\n").unwrap();
        assert_eq!(zero.0.creation_grace_period, Some(Duration::ZERO));
        assert!(
            serde_yaml_ng::from_str::<ValidationOverride>("past_grace_period: soon\n").is_err()
        );
    }

    #[test]
    fn strategies_and_metadata_and_histogram_keys_read_as_mimir_writes_them() {
        let entry: ValidationOverride = serde_yaml_ng::from_str(
            "label_value_length_over_limit_strategy: truncate\nmax_metadata_length: 10\n\
             enforce_metadata_metric_name: false\nmax_native_histogram_buckets: 8\n\
             reduce_native_histogram_over_max_buckets: false\n",
        )
        .unwrap();
        let limits = entry.apply(&ValidationLimits::default());
        assert_eq!(
            limits.label_value_length_over_limit_strategy,
            LabelValueLengthOverLimitStrategy::Truncate
        );
        assert_eq!(limits.max_metadata_length, 10);
        assert!(!limits.enforce_metadata_metric_name);
        assert_eq!(limits.max_native_histogram_buckets, 8);
        assert!(!limits.reduce_native_histogram_over_max_buckets);
        let exemplars: ValidationOverride = serde_yaml_ng::from_str(
            "max_global_exemplars_per_user: 100000
max_exemplars_per_series_per_request: 2
",
        )
        .unwrap();
        assert!(!exemplars.is_empty());
        let limits = exemplars.apply(&ValidationLimits::default());
        assert_eq!(limits.max_global_exemplars_per_user, 100_000);
        assert_eq!(limits.max_exemplars_per_series_per_request, 2);
        assert_eq!(ValidationLimits::default().max_global_exemplars_per_user, 0);
        assert_eq!(
            ValidationLimits::default().max_exemplars_per_series_per_request,
            0
        );
        // Mimir's defaults.
        let defaults = ValidationLimits::default();
        assert_eq!(defaults.max_metadata_length, 1024);
        assert!(defaults.enforce_metadata_metric_name);
        assert_eq!(defaults.max_native_histogram_buckets, 0);
        assert!(defaults.reduce_native_histogram_over_max_buckets);
        let parse = |yaml: &str| serde_yaml_ng::from_str::<ValidationOverride>(yaml);
        for (text, strategy) in [
            ("\"\"", LabelValueLengthOverLimitStrategy::Error),
            ("error", LabelValueLengthOverLimitStrategy::Error),
            ("drop", LabelValueLengthOverLimitStrategy::Drop),
        ] {
            let entry =
                parse(&format!("label_value_length_over_limit_strategy: {text}\n")).unwrap();
            assert_eq!(
                entry.0.label_value_length_over_limit_strategy,
                Some(strategy)
            );
        }
        assert!(parse("label_value_length_over_limit_strategy: cut\n").is_err());
        // The hash must fit: Mimir refuses the combination at load.
        let err =
            parse("label_value_length_over_limit_strategy: drop\nmax_label_value_length: 70\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains(
                "cannot set label_value_length_over_limit_strategy to \"drop\": label \
                          value hash suffix would exceed max label value length of 70"
            ),
            "{err}"
        );
        assert!(parse(
            "label_value_length_over_limit_strategy: truncate\nmax_label_value_length: 71\n"
        )
        .is_ok());
        // `error` needs no room for a hash.
        assert!(parse("max_label_value_length: 5\n").is_ok());
    }
}
