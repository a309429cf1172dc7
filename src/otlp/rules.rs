//! What both ways of counting an OTLP export share ([`super::count`] over a prost decode,
//! [`super::scan`] over the bytes): Mimir's refusal reasons, its `target_info` rule and its
//! family names. Below both, so that neither imports the other.

use crate::counts::DecodeError;

/// The 400 for a request of which nothing converts: `refused` lists each refused metric.
pub(super) fn nothing_ingested(refused: &[String]) -> DecodeError {
    DecodeError::Untranslated {
        left_out: refused.len() as u64,
        message: refused.join("; "),
    }
}

/// Why Mimir's translator refuses a metric.
pub(super) const NOT_CUMULATIVE: &str = "only cumulative temporality is ingested (delta too with \
                                         otel_native_delta_ingestion; unspecified never)";
pub(super) const SCALE_BELOW_MINUS_4: &str = "an exponential histogram's scale is below -4";
pub(super) const NO_DATA: &str = "the metric has no data";
pub(super) const NO_NAME: &str =
    "the metric's name makes no metric name (nothing, or only `_`, is left once escaped)";

/// Whether Mimir's translator refuses a metric for its name when it escapes names (its
/// `MetricNamer`, UTF-8 not allowed): escaped, nothing is left, or only `_` where the escaping
/// changed the name. So a name with no character in `[A-Za-z0-9:]` is refused unless it is
/// all `_` already. (Names kept as sent are never refused.)
pub(super) fn name_refused(name: &[u8]) -> bool {
    let kept = name.iter().any(|&b| b.is_ascii_alphanumeric() || b == b':');
    let underscores = !name.is_empty() && name.iter().all(|&b| b == b'_');
    !kept && !underscores
}

/// What of a tenant's translation settings changes what a point is charged or how its series
/// are named: whether a classic histogram's point becomes one native histogram
/// (`otel_convert_histograms_to_nhcb`), whether delta temporality is taken
/// (`otel_native_delta_ingestion`), and how metric and label names are made of OTLP's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conversion {
    pub nhcb: bool,
    pub delta: bool,
    /// Metric names with suffixes (`otel_metric_suffixes_enabled`), which decide families
    /// and which names are refused.
    pub suffixes: bool,
    /// Names kept as sent, not escaped (the strategy `name_validation_scheme: utf8` derives:
    /// `NoUTF8EscapingWithSuffixes` or `NoTranslation`).
    pub utf8: bool,
    /// `key` before a label name that starts with one `_`
    /// (`otel_label_name_underscore_sanitization`).
    pub key_prefix: bool,
    /// Runs of `_` in a label name kept (`otel_label_name_preserve_multiple_underscores`).
    pub keep_underscores: bool,
}

impl Default for Conversion {
    /// Mimir's defaults.
    fn default() -> Conversion {
        Conversion::of(&runtime_config::OtlpTranslation::default())
    }
}

impl Conversion {
    pub fn of(settings: &runtime_config::OtlpTranslation) -> Conversion {
        Conversion {
            nhcb: settings.otel_convert_histograms_to_nhcb,
            delta: settings.otel_native_delta_ingestion,
            suffixes: settings.otel_metric_suffixes_enabled,
            utf8: settings.utf8_names,
            key_prefix: settings.otel_label_name_underscore_sanitization,
            keep_underscores: settings.otel_label_name_preserve_multiple_underscores,
        }
    }

    /// Whether the translator takes a sum or a histogram of this `aggregation_temporality`
    /// (as prost reads the enum): cumulative always, delta when the tenant ingests it.
    pub fn takes(self, temporality: i32) -> bool {
        use super::proto::metrics::AggregationTemporality;
        temporality == AggregationTemporality::Cumulative as i32
            || (self.delta && temporality == AggregationTemporality::Delta as i32)
    }
}

/// The series (and metric family) Mimir adds per resource.
pub(super) const TARGET_INFO: &str = "target_info";

/// The earliest and latest point of one resource, in Unix nanoseconds.
#[derive(Debug, Clone, Default)]
pub struct TimeRange {
    pub earliest: Option<u64>,
    pub latest: u64,
}

impl TimeRange {
    pub(super) fn see(&mut self, time_unix_nano: u64) {
        self.earliest = Some(
            self.earliest
                .map_or(time_unix_nano, |e| e.min(time_unix_nano)),
        );
        self.latest = self.latest.max(time_unix_nano);
    }

    /// Widens this range to cover `other`.
    pub(super) fn cover(&mut self, other: &TimeRange) {
        if let Some(earliest) = other.earliest {
            self.see(earliest);
            self.see(other.latest);
        }
    }
}

/// What a resource's attribute keys say about its `target_info` series: Mimir adds one when
/// the resource has an attribute other than `service.name`, `service.namespace` and
/// `service.instance.id`, and one of `service.name` or `service.instance.id`.
#[derive(Debug, Default)]
pub(super) struct TargetKeys {
    pub(super) other: bool,
    pub(super) identity: bool,
}

impl TargetKeys {
    /// The keys of a resource's attributes, seen.
    pub(super) fn of<'k>(keys: impl IntoIterator<Item = &'k [u8]>) -> TargetKeys {
        let mut seen = TargetKeys::default();
        for key in keys {
            seen.see(key);
        }
        seen
    }

    pub(super) fn see(&mut self, key: &[u8]) {
        match key {
            b"service.name" | b"service.instance.id" => self.identity = true,
            b"service.namespace" => {}
            _ => self.other = true,
        }
    }
}

/// The samples of the `target_info` series Mimir adds for a resource, if it adds one (see
/// [`TargetKeys`]; and the resource has points). One sample every 150 s (half the default
/// 5 m lookback) from the resource's earliest point to before its latest, plus one at the
/// latest: 1 when all points share a timestamp.
pub(super) fn target_info_samples(keys: &TargetKeys, times: &TimeRange) -> Option<u64> {
    const STEP_NANOS: u64 = 150_000_000_000;
    let earliest = times.earliest?;
    if !(keys.other && keys.identity) {
        return None;
    }
    let span = times.latest - earliest;
    Some(span.div_ceil(STEP_NANOS) + 1)
}

/// How long a request's labels can get, from a walk of its attributes: enough to tell, for
/// nearly every request, that none of the series it becomes can fail a label or time check,
/// without translating them ([`super::scan_bounded`]).
#[derive(Debug, Clone, Default)]
pub struct Bounds {
    /// The most attributes of one data point, and of one resource.
    pub point_attributes: u32,
    pub resource_attributes: u32,
    /// The longest attribute key of a point or a resource, in bytes.
    pub key: usize,
    /// The longest such attribute value as a label value can be: a string's bytes, 5 for a
    /// bool, 20 for an integer, 29 for a double; [`UNMEASURED`] for a value rendered as a
    /// label value only a translation can measure (a byte string, an array, a key-value list).
    pub value: usize,
    /// The most a point's or a resource's attribute values come to, with a byte for a
    /// separator after each: the longest a label value made of several can be (the values
    /// of keys that escape alike are joined with `;`, and `job` is two values and a `/`).
    pub joined: usize,
    /// Of an instrumentation scope with a name (`otel_promote_scope_metadata` makes its name,
    /// version, schema URL and attributes labels): the most attributes of one, the longest
    /// attribute key, and the longest of its name, version, schema URL and attribute values
    /// (as [`Bounds::value`] measures them).
    pub scope_attributes: u32,
    pub scope_key: usize,
    pub scope_value: usize,
    /// The longest metric name, in bytes.
    pub metric_name: usize,
    /// The longest metric unit, in bytes.
    pub unit: usize,
    /// The most bucket counts of one exponential histogram point, positive and negative: at
    /// least as many as the native histogram it becomes has buckets.
    pub buckets: u64,
    /// The earliest and the latest point of the request.
    pub times: TimeRange,
    /// An empty key, or a metric name that escapes to nothing.
    pub unusual: bool,
    /// The exemplars of every data point, gauges' too (which Mimir never translates).
    pub exemplars: u64,
    /// Of the exemplars Mimir translates (sums', histograms', exponential histograms'): the
    /// most on one point, their earliest and latest times, and whether one has neither a
    /// trace nor a span id (only its attributes can give it labels).
    pub exemplars_per_point: u64,
    pub exemplar_times: TimeRange,
    pub exemplar_without_ids: bool,
    /// The metrics Mimir's translator leaves out of a request of which it translates the rest
    /// (each an error it reports: a delta metric, one with no data, …).
    pub left_out: u64,
}

/// A [`Bounds::value`] only a translation can measure.
pub const UNMEASURED: usize = usize::MAX;

/// The longest a double is written as a label value: `-1.7976931348623157e+308` is 24
/// characters, and an infinity is `json: unsupported value: +Inf` (pdata's `AsString`).
pub(super) const DOUBLE_TEXT: usize = 29;

/// Whether no character of a metric name is one a metric name keeps: it escapes to nothing.
pub(super) fn escapes_to_nothing(name: &[u8]) -> bool {
    !name
        .iter()
        .any(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

impl Bounds {
    /// An attribute of a point or a resource: its key and its value's size.
    #[inline(always)]
    pub fn attribute(&mut self, key: &[u8], value: usize) {
        self.key = self.key.max(key.len());
        self.value = self.value.max(value);
        self.unusual |= key.is_empty();
    }
}
