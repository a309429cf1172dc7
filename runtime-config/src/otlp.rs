//! Mimir's OTLP translation keys that change the series an export becomes, per tenant:
//! `promote_otel_resource_attributes` (resource attributes that become labels of every series
//! of their resource), `otel_keep_identifying_resource_attributes` (`service.name`,
//! `service.namespace` and `service.instance.id` kept as labels of `target_info`),
//! `otel_convert_histograms_to_nhcb` (a classic histogram's point becomes one native histogram
//! with custom buckets), `otel_native_delta_ingestion` (delta sums and histograms are taken,
//! not refused), `otel_promote_scope_metadata` (a named instrumentation scope's name,
//! version, schema URL and attributes become labels of its points' series) and
//! `otel_metric_suffixes_enabled` (metric names get their unit, `_total` and `_ratio`). weir forwards OTLP unchanged; these decide what its charge counts and the
//! labels its series checks and HA tracker see, as Mimir's translation would make them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One tenant's OTLP translation settings (Mimir's defaults: nothing promoted, identifying
/// attributes not kept, classic histograms, delta temporality refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct OtlpTranslation {
    /// The resource attributes promoted to labels, as Mimir's comma-separated string.
    #[serde(
        default,
        deserialize_with = "comma_separated",
        serialize_with = "joined"
    )]
    pub promote_otel_resource_attributes: Vec<String>,
    #[serde(default)]
    pub otel_keep_identifying_resource_attributes: bool,
    /// A classic (explicit-bucket) histogram's point becomes one native histogram with custom
    /// buckets, charged as one histogram, instead of its `_bucket`, `_sum` and `_count` series.
    #[serde(default)]
    pub otel_convert_histograms_to_nhcb: bool,
    /// Sums and histograms of delta temporality are translated (their metadata type
    /// `unknown`), not refused.
    #[serde(default)]
    pub otel_native_delta_ingestion: bool,
    /// A point's series carry its instrumentation scope, when the scope has a name:
    /// `otel_scope_name`, `otel_scope_version`, `otel_scope_schema_url` and `otel_scope_<key>`
    /// for each of its attributes.
    #[serde(default)]
    pub otel_promote_scope_metadata: bool,
    /// Metric names are built as Prometheus' translator builds them with suffixes: the name's
    /// words, its unit (`_seconds`, `_bytes_per_second`), `_total` for a monotonic sum and
    /// `_ratio` for a gauge of unit `1`.
    #[serde(default)]
    pub otel_metric_suffixes_enabled: bool,
}

/// The keys of a tenant's entry; what is missing is the default.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct OtlpOverride {
    #[serde(default, deserialize_with = "optional_comma_separated")]
    pub promote_otel_resource_attributes: Option<Vec<String>>,
    pub otel_keep_identifying_resource_attributes: Option<bool>,
    pub otel_convert_histograms_to_nhcb: Option<bool>,
    pub otel_native_delta_ingestion: Option<bool>,
    pub otel_promote_scope_metadata: Option<bool>,
    pub otel_metric_suffixes_enabled: Option<bool>,
}

impl OtlpOverride {
    pub(crate) fn is_empty(&self) -> bool {
        self.promote_otel_resource_attributes.is_none()
            && self.otel_keep_identifying_resource_attributes.is_none()
            && self.otel_convert_histograms_to_nhcb.is_none()
            && self.otel_native_delta_ingestion.is_none()
            && self.otel_promote_scope_metadata.is_none()
            && self.otel_metric_suffixes_enabled.is_none()
    }

    pub(crate) fn apply(&self) -> OtlpTranslation {
        OtlpTranslation {
            promote_otel_resource_attributes: self
                .promote_otel_resource_attributes
                .clone()
                .unwrap_or_default(),
            otel_keep_identifying_resource_attributes: self
                .otel_keep_identifying_resource_attributes
                .unwrap_or_default(),
            otel_convert_histograms_to_nhcb: self
                .otel_convert_histograms_to_nhcb
                .unwrap_or_default(),
            otel_native_delta_ingestion: self.otel_native_delta_ingestion.unwrap_or_default(),
            otel_promote_scope_metadata: self.otel_promote_scope_metadata.unwrap_or_default(),
            otel_metric_suffixes_enabled: self.otel_metric_suffixes_enabled.unwrap_or_default(),
        }
    }
}

/// Mimir's `StringSliceCSV`: a string split at every comma, as it is (no trimming); the empty
/// string is no attribute. A YAML list is refused, as Mimir refuses it.
fn split(text: &str) -> Vec<String> {
    if text.is_empty() {
        Vec::new()
    } else {
        text.split(',').map(String::from).collect()
    }
}

fn comma_separated<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    Ok(split(&String::deserialize(deserializer)?))
}

fn optional_comma_separated<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.map(|text| split(&text)))
}

fn joined<S: Serializer>(names: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<OtlpOverride, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(yaml)
    }

    #[test]
    fn promoted_attributes_are_mimirs_comma_separated_string() {
        let set = parse("promote_otel_resource_attributes: k8s.namespace.name,service.version\n")
            .unwrap()
            .apply();
        assert_eq!(
            set.promote_otel_resource_attributes,
            ["k8s.namespace.name", "service.version"]
        );
        // As Mimir splits it: spaces stay, the empty string is none.
        let spaced = parse("promote_otel_resource_attributes: 'a, b'\n")
            .unwrap()
            .apply();
        assert_eq!(spaced.promote_otel_resource_attributes, ["a", " b"]);
        let empty = parse("promote_otel_resource_attributes: ''\n")
            .unwrap()
            .apply();
        assert!(empty.promote_otel_resource_attributes.is_empty());
        // A list is not Mimir's form.
        assert!(parse("promote_otel_resource_attributes: [a, b]\n").is_err());
        // Rendered as it was written.
        assert_eq!(
            serde_yaml_ng::to_string(&set).unwrap(),
            "promote_otel_resource_attributes: k8s.namespace.name,service.version\n\
             otel_keep_identifying_resource_attributes: false\n\
             otel_convert_histograms_to_nhcb: false\n\
             otel_native_delta_ingestion: false\n\
             otel_promote_scope_metadata: false\n\
             otel_metric_suffixes_enabled: false\n"
        );
    }
}
