//! Mimir's OTLP translation keys that change the series an export becomes, per tenant:
//! `promote_otel_resource_attributes` (resource attributes that become labels of every series
//! of their resource), `otel_keep_identifying_resource_attributes` (`service.name`,
//! `service.namespace` and `service.instance.id` kept as labels of `target_info`),
//! `otel_convert_histograms_to_nhcb` (a classic histogram's point becomes one native histogram
//! with custom buckets), `otel_native_delta_ingestion` (delta sums and histograms are taken,
//! not refused), `otel_promote_scope_metadata` (a named instrumentation scope's name,
//! version, schema URL and attributes become labels of its points' series) and
//! `otel_metric_suffixes_enabled` (metric names get their unit, `_total` and `_ratio`),
//! `otel_translation_strategy` (whether names are escaped, which the tenant's
//! `name_validation_scheme` decides with it) and the two label-name options
//! (`otel_label_name_underscore_sanitization`, `otel_label_name_preserve_multiple_underscores`).
//! weir forwards OTLP unchanged; these decide what its charge counts and the labels its series
//! checks, relabelling rules and HA tracker see, as Mimir's translation would make them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::validation::NameValidationScheme;

/// Mimir's `otel_translation_strategy`: how metric and label names are made of OTLP's. Unset,
/// it follows from the tenant's `name_validation_scheme` and `otel_metric_suffixes_enabled`;
/// set, it must agree with both (Mimir refuses the limits otherwise, and so does weir).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TranslationStrategy {
    /// Not set (`""`).
    #[default]
    Derived,
    UnderscoreEscapingWithSuffixes,
    UnderscoreEscapingWithoutSuffixes,
    NoUTF8EscapingWithSuffixes,
    NoTranslation,
}

impl TranslationStrategy {
    const ALL: [(TranslationStrategy, &'static str); 5] = [
        (TranslationStrategy::Derived, ""),
        (
            TranslationStrategy::UnderscoreEscapingWithSuffixes,
            "UnderscoreEscapingWithSuffixes",
        ),
        (
            TranslationStrategy::UnderscoreEscapingWithoutSuffixes,
            "UnderscoreEscapingWithoutSuffixes",
        ),
        (
            TranslationStrategy::NoUTF8EscapingWithSuffixes,
            "NoUTF8EscapingWithSuffixes",
        ),
        (TranslationStrategy::NoTranslation, "NoTranslation"),
    ];

    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(strategy, _)| *strategy == self)
            .map_or("", |(_, name)| name)
    }

    /// Mimir's `Limits.Validate` for the strategy: a set one must agree with the name scheme
    /// (escaping ones with `legacy`, the others with `utf8`) and with the suffixes setting.
    fn check(self, scheme: NameValidationScheme, suffixes: bool) -> Result<(), String> {
        use TranslationStrategy::*;
        let (wants_scheme, wants_suffixes) = match self {
            Derived => return Ok(()),
            UnderscoreEscapingWithSuffixes => (NameValidationScheme::Legacy, true),
            UnderscoreEscapingWithoutSuffixes => (NameValidationScheme::Legacy, false),
            NoUTF8EscapingWithSuffixes => (NameValidationScheme::Utf8, true),
            NoTranslation => (NameValidationScheme::Utf8, false),
        };
        if scheme != wants_scheme {
            let wanted = match wants_scheme {
                NameValidationScheme::Legacy => "legacy",
                NameValidationScheme::Utf8 => "utf8",
            };
            return Err(format!(
                "OTLP translation strategy {} is not allowed unless validation scheme is {wanted}",
                self.as_str()
            ));
        }
        if suffixes != wants_suffixes {
            let wanted = if wants_suffixes {
                "enabled"
            } else {
                "disabled"
            };
            return Err(format!(
                "OTLP translation strategy {} is not allowed unless metric suffixes are {wanted}",
                self.as_str()
            ));
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for TranslationStrategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::ALL
            .iter()
            .find(|(_, name)| *name == text)
            .map(|(strategy, _)| *strategy)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("unsupported OTLP translation strategy {text:?}"))
            })
    }
}

impl Serialize for TranslationStrategy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

fn yes() -> bool {
    true
}

/// One tenant's OTLP translation settings (Mimir's defaults: nothing promoted, identifying
/// attributes not kept, classic histograms, delta temporality refused, no suffixes, names
/// escaped, label names sanitized with their runs of `_` kept).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
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
    /// As written; what it does is [`OtlpTranslation::utf8_names`] and the suffixes, with
    /// which it must agree.
    #[serde(default)]
    pub otel_translation_strategy: TranslationStrategy,
    /// An attribute key that starts with one `_` is a label name with `key` before it.
    #[serde(default = "yes")]
    pub otel_label_name_underscore_sanitization: bool,
    /// Runs of `_` in a label name made of an attribute key stay as they are; false makes each
    /// run one `_` (of a name with no UTF-8 allowed).
    #[serde(default = "yes")]
    pub otel_label_name_preserve_multiple_underscores: bool,
    /// Metric and label names are kept as sent, not escaped: the strategy in force is
    /// `NoUTF8EscapingWithSuffixes` or `NoTranslation`, which the tenant's
    /// `name_validation_scheme: utf8` derives (not a key of its own).
    #[serde(skip)]
    pub utf8_names: bool,
}

impl Default for OtlpTranslation {
    fn default() -> OtlpTranslation {
        OtlpTranslation::DEFAULT
    }
}

impl OtlpTranslation {
    /// Mimir's defaults, as a constant (for a `static`).
    pub const DEFAULT: OtlpTranslation = OtlpTranslation {
        promote_otel_resource_attributes: Vec::new(),
        otel_keep_identifying_resource_attributes: false,
        otel_convert_histograms_to_nhcb: false,
        otel_native_delta_ingestion: false,
        otel_promote_scope_metadata: false,
        otel_metric_suffixes_enabled: false,
        otel_translation_strategy: TranslationStrategy::Derived,
        otel_label_name_underscore_sanitization: true,
        otel_label_name_preserve_multiple_underscores: true,
        utf8_names: false,
    };
}

/// The keys of a tenant's entry; what is missing is the default.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct OtlpOverride {
    #[serde(default, deserialize_with = "optional_comma_separated")]
    pub promote_otel_resource_attributes: Option<Vec<String>>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_keep_identifying_resource_attributes: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_convert_histograms_to_nhcb: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_native_delta_ingestion: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_promote_scope_metadata: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_metric_suffixes_enabled: Option<bool>,
    pub otel_translation_strategy: Option<TranslationStrategy>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_label_name_underscore_sanitization: Option<bool>,
    #[serde(default, deserialize_with = "crate::scalars::boolean")]
    pub otel_label_name_preserve_multiple_underscores: Option<bool>,
}

impl OtlpOverride {
    pub(crate) fn is_empty(&self) -> bool {
        self.promote_otel_resource_attributes.is_none()
            && self.otel_keep_identifying_resource_attributes.is_none()
            && self.otel_convert_histograms_to_nhcb.is_none()
            && self.otel_native_delta_ingestion.is_none()
            && self.otel_promote_scope_metadata.is_none()
            && self.otel_metric_suffixes_enabled.is_none()
            && self.otel_translation_strategy.is_none()
            && self.otel_label_name_underscore_sanitization.is_none()
            && self.otel_label_name_preserve_multiple_underscores.is_none()
    }

    /// The tenant's settings under its `name_validation_scheme`; an error where the
    /// translation strategy disagrees with it or with the suffixes setting, as Mimir's.
    pub(crate) fn apply(&self, scheme: NameValidationScheme) -> Result<OtlpTranslation, String> {
        let suffixes = self.otel_metric_suffixes_enabled.unwrap_or_default();
        let strategy = self.otel_translation_strategy.unwrap_or_default();
        strategy.check(scheme, suffixes)?;
        Ok(OtlpTranslation {
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
            otel_metric_suffixes_enabled: suffixes,
            otel_translation_strategy: strategy,
            otel_label_name_underscore_sanitization: self
                .otel_label_name_underscore_sanitization
                .unwrap_or(true),
            otel_label_name_preserve_multiple_underscores: self
                .otel_label_name_preserve_multiple_underscores
                .unwrap_or(true),
            // A strategy agrees with the scheme, so the scheme says whether names escape.
            utf8_names: scheme == NameValidationScheme::Utf8,
        })
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

    fn legacy(yaml: &str) -> OtlpTranslation {
        parse(yaml)
            .unwrap()
            .apply(NameValidationScheme::Legacy)
            .unwrap()
    }

    #[test]
    fn promoted_attributes_are_mimirs_comma_separated_string() {
        let set = legacy("promote_otel_resource_attributes: k8s.namespace.name,service.version\n");
        assert_eq!(
            set.promote_otel_resource_attributes,
            ["k8s.namespace.name", "service.version"]
        );
        // As Mimir splits it: spaces stay, the empty string is none.
        let spaced = legacy("promote_otel_resource_attributes: 'a, b'\n");
        assert_eq!(spaced.promote_otel_resource_attributes, ["a", " b"]);
        let empty = legacy("promote_otel_resource_attributes: ''\n");
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
             otel_metric_suffixes_enabled: false\n\
             otel_translation_strategy: ''\n\
             otel_label_name_underscore_sanitization: true\n\
             otel_label_name_preserve_multiple_underscores: true\n"
        );
    }

    /// Mimir's `Limits.Validate`: a strategy agrees with the scheme and the suffixes, and
    /// the scheme decides whether names escape.
    #[test]
    fn the_strategy_must_agree_with_the_scheme_and_the_suffixes() {
        use NameValidationScheme::{Legacy, Utf8};
        let apply = |yaml: &str, scheme| parse(yaml).unwrap().apply(scheme);
        let good = [
            ("otel_translation_strategy: UnderscoreEscapingWithSuffixes\notel_metric_suffixes_enabled: true\n", Legacy, false),
            ("otel_translation_strategy: UnderscoreEscapingWithoutSuffixes\n", Legacy, false),
            ("otel_translation_strategy: NoUTF8EscapingWithSuffixes\notel_metric_suffixes_enabled: true\n", Utf8, true),
            ("otel_translation_strategy: NoTranslation\n", Utf8, true),
            ("otel_translation_strategy: ''\n", Utf8, true),
            ("otel_metric_suffixes_enabled: true\n", Legacy, false),
        ];
        for (yaml, scheme, utf8) in good {
            let set = apply(yaml, scheme).unwrap_or_else(|err| panic!("{yaml}: {err}"));
            assert_eq!(set.utf8_names, utf8, "{yaml}");
        }
        let bad = [
            ("otel_translation_strategy: UnderscoreEscapingWithSuffixes\n", Legacy, "unless metric suffixes are enabled"),
            ("otel_translation_strategy: UnderscoreEscapingWithoutSuffixes\notel_metric_suffixes_enabled: true\n", Legacy, "unless metric suffixes are disabled"),
            ("otel_translation_strategy: NoTranslation\n", Legacy, "unless validation scheme is utf8"),
            ("otel_translation_strategy: NoUTF8EscapingWithSuffixes\notel_metric_suffixes_enabled: true\n", Legacy, "unless validation scheme is utf8"),
            ("otel_translation_strategy: UnderscoreEscapingWithoutSuffixes\n", Utf8, "unless validation scheme is legacy"),
            ("otel_translation_strategy: NoTranslation\notel_metric_suffixes_enabled: true\n", Utf8, "unless metric suffixes are disabled"),
        ];
        for (yaml, scheme, message) in bad {
            let err = apply(yaml, scheme).unwrap_err();
            assert!(err.contains(message), "{yaml}: {err}");
        }
        let unknown = parse("otel_translation_strategy: Escaped\n").unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unsupported OTLP translation strategy \"Escaped\""),
            "{unknown}"
        );
        // The label-name options default to true; false is kept.
        let set = legacy("otel_label_name_underscore_sanitization: false\n");
        assert!(!set.otel_label_name_underscore_sanitization);
        assert!(set.otel_label_name_preserve_multiple_underscores);
        assert_eq!(
            OtlpTranslation::default(),
            legacy("otel_translation_strategy: ''\n")
        );
    }
}
