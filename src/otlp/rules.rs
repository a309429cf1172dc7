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
pub(super) const SCALE_BELOW_MINUS_4: &str = "an exponential histogram point's scale is below \
                                              -4: it and the metric's later points are left out";
pub(super) const LABEL_NAME_INVALID: &str = "a data point's attribute key makes no label name \
                                             (empty, or only `_` once escaped): it and the \
                                             metric's later points are left out";
pub(super) const TARGET_INFO_LABEL_NAME_INVALID: &str =
    "a resource attribute key makes no label name (empty, or only `_` once escaped): no \
     target_info";
pub(super) const NO_DATA: &str = "the metric has no data";
pub(super) const NO_POINTS: &str = "empty data points: the metric has data but no data point";
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

/// What a resource's attributes say about its `target_info` series, as Mimir's translator
/// decides (`addResourceTargetInfo`): it adds one when the resource has more attributes than
/// it has of `service.name`, `service.namespace` and `service.instance.id` (a repeated key
/// counts each time), and the series gets `job` or `instance`: from `service.name` (the
/// first, as pdata's `Get` finds it; `namespace/name` with a namespace, so never empty then),
/// from `service.instance.id`, or from an attribute itself called `job` or `instance`, each
/// only with a value.
#[derive(Debug, Default)]
pub(super) struct TargetKeys {
    attributes: u32,
    /// Which of `service.name`, `service.namespace`, `service.instance.id` the resource has,
    /// and whether the first `service.name` and `service.instance.id` have a value.
    name: Option<bool>,
    namespace: bool,
    instance: Option<bool>,
    /// An attribute `job` or `instance` with a value.
    labelled: bool,
    /// An attribute whose key makes no label name, on which the translator errors.
    unnamed: bool,
}

impl TargetKeys {
    /// A resource's attributes, seen: each key, whether its value is written empty and
    /// whether the key makes no label name (`translate::makes_no_label_name`).
    pub(super) fn of<'k>(
        attributes: impl IntoIterator<Item = (&'k [u8], bool, bool)>,
    ) -> TargetKeys {
        let mut seen = TargetKeys::default();
        for (key, empty, unnamed) in attributes {
            seen.see(key, empty, unnamed);
        }
        seen
    }

    #[inline(always)]
    pub(super) fn see(&mut self, key: &[u8], empty: bool, unnamed: bool) {
        self.attributes = self.attributes.saturating_add(1);
        self.unnamed |= unnamed;
        match key {
            b"service.name" => {
                self.name.get_or_insert(!empty);
            }
            b"service.instance.id" => {
                self.instance.get_or_insert(!empty);
            }
            b"service.namespace" => self.namespace = true,
            b"job" | b"instance" => self.labelled |= !empty,
            _ => {}
        }
    }

    /// Whether the resource makes a `target_info` (when it has points): `Err` when the
    /// translator errors on it instead (its labels are built, with a key that makes no name,
    /// before it asks for `job` or `instance`).
    fn makes_one(&self) -> Result<bool, &'static str> {
        let identifying = u32::from(self.name.is_some())
            + u32::from(self.namespace)
            + u32::from(self.instance.is_some());
        if self.attributes <= identifying {
            return Ok(false);
        }
        if self.unnamed {
            return Err(TARGET_INFO_LABEL_NAME_INVALID);
        }
        let job = self.name.is_some_and(|valued| valued || self.namespace);
        Ok(job || self.instance == Some(true) || self.labelled)
    }
}

/// Unix nanoseconds as Unix milliseconds.
pub fn nanos_to_millis(nanos: u64) -> i64 {
    (nanos / 1_000_000) as i64
}

/// The time between two `target_info` samples of a resource: half the default 5 m lookback.
const TARGET_INFO_STEP_NANOS: u64 = 150_000_000_000;
const TARGET_INFO_STEP_MS: i64 = 150_000;

/// When Mimir's translator stamps a resource's `target_info` samples
/// (`addResourceTargetInfo`), if it adds one (see [`TargetKeys`]; and the resource has
/// points): one at each `earliest + k·150 s` strictly before the resource's latest point, and
/// one at the latest, each at its millisecond. A sample at a millisecond already stamped for the
/// same labels is skipped, in the resource ([`TargetInfoTimes::samples`]) and across the
/// request's resources ([`TargetInfoSeen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetInfoTimes {
    /// The millisecond of the first stepped sample (the earliest point's).
    first_ms: i64,
    /// How many are stepped: none when every point has the same nanosecond.
    stepped: u64,
    /// The millisecond of the last sample (the latest point's).
    last_ms: i64,
}

impl TargetInfoTimes {
    /// `Err`: the translator reports an error for the resource's `target_info` and makes none.
    pub(super) fn of(
        keys: &TargetKeys,
        times: &TimeRange,
    ) -> Result<Option<TargetInfoTimes>, &'static str> {
        let Some(earliest) = times.earliest else {
            return Ok(None);
        };
        if !keys.makes_one()? {
            return Ok(None);
        }
        Ok(Some(TargetInfoTimes {
            first_ms: nanos_to_millis(earliest),
            stepped: (times.latest - earliest).div_ceil(TARGET_INFO_STEP_NANOS),
            last_ms: nanos_to_millis(times.latest),
        }))
    }

    /// The samples of this `target_info` alone: the stepped ones, and the last unless it falls
    /// in the millisecond of the last stepped one (points a fraction of a millisecond apart
    /// make one sample, not two).
    pub fn samples(&self) -> u64 {
        let last_stepped = self.first_ms + (self.stepped as i64 - 1) * TARGET_INFO_STEP_MS;
        self.stepped + u64::from(self.stepped == 0 || self.last_ms != last_stepped)
    }
}

/// The `target_info` samples a request's resources stamp, by the labels of their series
/// (`K`): Mimir's translator skips a sample whose labels and millisecond an earlier one of the
/// request had (`seenTargetInfo`), so resources that make the same `target_info` at the same
/// times are charged its samples once.
pub struct TargetInfoSeen<K> {
    stamped: std::collections::HashMap<K, Stamped>,
}

impl<K> Default for TargetInfoSeen<K> {
    fn default() -> Self {
        TargetInfoSeen {
            stamped: std::collections::HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq> TargetInfoSeen<K> {
    /// A resource's `target_info` of these labels, stamped at `times`: the samples no earlier
    /// one stamped, and whether its series is new to the request.
    pub fn stamp(&mut self, labels: K, times: TargetInfoTimes) -> (u64, bool) {
        let mut new_series = false;
        let stamped = self.stamped.entry(labels).or_insert_with(|| {
            new_series = true;
            Stamped::default()
        });
        let samples = stamped.add(times.first_ms, times.stepped) + stamped.add(times.last_ms, 1);
        (samples, new_series)
    }
}

/// The milliseconds stamped for one `target_info` series: every sample falls on a step of
/// 150 s from some first one, so each residue modulo the step keeps the runs of steps stamped
/// (first step → one past the last), disjoint and apart. A resource's samples are counted in
/// one pass over the runs they touch, however long its points span.
#[derive(Default)]
struct Stamped {
    runs: std::collections::HashMap<i64, std::collections::BTreeMap<i64, i64>>,
}

impl Stamped {
    /// Stamps `count` samples a step apart from `first_ms`; returns how many were not
    /// stamped before.
    fn add(&mut self, first_ms: i64, count: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        let runs = self
            .runs
            .entry(first_ms.rem_euclid(TARGET_INFO_STEP_MS))
            .or_default();
        let (from, to) = {
            let from = first_ms.div_euclid(TARGET_INFO_STEP_MS);
            (from, from.saturating_add(count as i64))
        };
        // The runs that overlap or touch [from, to): disjoint and apart, so their ends grow
        // with their starts, and those before the first that ends short of `from` end short.
        let touching: Vec<(i64, i64)> = runs
            .range(..=to)
            .rev()
            .take_while(|(_, &end)| end >= from)
            .map(|(&start, &end)| (start, end))
            .collect();
        let (mut start, mut end, mut before) = (from, to, 0);
        for (run_start, run_end) in touching {
            before += (run_end.min(to) - run_start.max(from)).max(0);
            runs.remove(&run_start);
            start = start.min(run_start);
            end = end.max(run_end);
        }
        runs.insert(start, end);
        (to - from - before) as u64
    }
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
