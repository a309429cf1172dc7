//! The series an OTLP export becomes, with their labels, as Mimir's translator builds them
//! (Prometheus' `otlptranslator`, with Mimir's defaults: underscore escaping, no unit or type
//! suffixes, no scope labels; the tenant's promoted resource attributes and
//! `otel_keep_identifying_resource_attributes`, [`OtlpTranslation`]): what Mimir's series
//! checks see. Only the labels and the times are built; the values are not.
//!
//! Per data point: its attributes, each key escaped to a label name (a character outside
//! `[A-Za-z0-9_]` becomes `_`; `key_` before a leading digit, `key` before a single leading
//! `_`), values of keys that escape alike joined with `;` in key order; then the promoted
//! resource attributes, in key order, each escaped as a point's and set where the point's
//! attributes left no value of that name; then `job` (the
//! resource's `service.namespace/service.name`, or `service.name`) and `instance`
//! (`service.instance.id`); then `__name__` (the metric name escaped as
//! [`metric_name`] says) and, for a bucket or a quantile, `le` or `quantile`. Per resource,
//! `target_info` under [`super::rules`]' rule: its attributes other than the three above (all
//! of them with `otel_keep_identifying_resource_attributes`; none promoted), with
//! `job` and `instance`. A label with an empty value is left out, as Mimir's distributor
//! removes it before its checks.
//!
//! Where this departs from the translator (only the lengths of rare labels can differ): an
//! array or a key-value list is written as JSON with Rust's numbers; `le` and `quantile`
//! values are not measured (a bucket series is checked once, with `le="+Inf"`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use super::proto::{
    common::{any_value::Value as Any, AnyValue, KeyValue},
    metrics::{
        exemplar::Value as ExemplarValue, metric::Data, summary_data_point::ValueAtQuantile,
        AggregationTemporality, Exemplar, ExponentialHistogramDataPoint, HistogramDataPoint,
        Metric, ResourceMetrics, ScopeMetrics,
    },
    ExportMetricsServiceRequest,
};
use runtime_config::OtlpTranslation;

pub use super::rules::nanos_to_millis;
use super::rules::{
    escapes_to_nothing, name_refused, Bounds, Conversion, TargetInfoSeen, TargetInfoTimes,
    TargetKeys, TimeRange, DOUBLE_TEXT, LABEL_NAME_INVALID, SCALE_BELOW_MINUS_4, TARGET_INFO,
    UNMEASURED,
};

/// Where in the request a translated item comes from: a data point (by its resource, scope,
/// metric and point index), or a resource's `target_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Point {
        resource: usize,
        scope: usize,
        metric: usize,
        point: usize,
    },
    TargetInfo {
        resource: usize,
    },
}

/// One data point, or one `target_info`, as the series it becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub place: Place,
    /// Each series' labels, sorted by name; the `_bucket` series of a histogram once (with
    /// `le="+Inf"`: they differ only in `le`, whose values are short).
    pub series: Vec<Vec<(String, String)>>,
    /// The samples and histograms each of those series carries, in their order (the
    /// `_bucket` series once: all its buckets).
    pub series_items: Vec<u64>,
    /// The earliest and the latest sample of those series (Unix milliseconds).
    pub earliest_ms: i64,
    pub latest_ms: i64,
    /// The samples and histograms they carry, as [`super::count`] charges them.
    pub items: u64,
    /// A point that becomes a native histogram, for the checks of its buckets.
    pub native: Option<NativePoint>,
}

/// A point that becomes a native histogram.
#[derive(Debug, Clone, PartialEq)]
pub enum NativePoint {
    Exponential(ExponentialHistogramDataPoint),
    /// A classic histogram's, with custom buckets (`otel_convert_histograms_to_nhcb`).
    Custom(HistogramDataPoint),
}

/// [`NativePoint`], borrowed from the request.
#[derive(Debug, Clone, Copy)]
pub enum Native<'r> {
    Exponential(&'r ExponentialHistogramDataPoint),
    Custom(&'r HistogramDataPoint),
}

impl Native<'_> {
    pub fn cloned(self) -> NativePoint {
        match self {
            Native::Exponential(point) => NativePoint::Exponential(point.clone()),
            Native::Custom(point) => NativePoint::Custom(point.clone()),
        }
    }
}

/// The data points of the metrics Mimir translates, and every `target_info`, in request
/// order, as series. `drops(name)`: a label of this name is taken out first (`drop_labels`).
/// `wanted(bounds)`: whether to translate a point measured as `bounds` (its attributes, its
/// resource's `service.*` values, its metric name and time, as the scan measures a request);
/// a point not wanted is left out.
pub fn translate(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
    drops: &dyn Fn(&str) -> bool,
    wanted: &dyn Fn(&Bounds) -> bool,
) -> Vec<Translated> {
    let mut out = Vec::new();
    walk(request, settings, wanted, &mut |head, item| {
        let (series, series_items): (Vec<_>, Vec<u64>) = match item {
            Item::Point { base, name, kind } => kind.series(&name, &base).into_iter().unzip(),
            Item::TargetInfo { labels, samples } => (vec![labels], vec![samples]),
        };
        out.push(Translated {
            place: head.place,
            series: series
                .into_iter()
                .map(|labels| kept(labels, drops))
                .collect(),
            items: series_items.iter().sum(),
            series_items,
            earliest_ms: head.earliest_ms,
            latest_ms: head.latest_ms,
            native: head.native.map(Native::cloned),
        });
    });
    out
}

/// Where a data point or a `target_info` is, and when: a [`Translated`] but its series.
#[derive(Debug, Clone, Copy)]
pub struct Head<'r> {
    pub place: Place,
    pub earliest_ms: i64,
    pub latest_ms: i64,
    /// A point that becomes a native histogram.
    pub native: Option<Native<'r>>,
}

/// One series of [`each_point_every_series`]: its labels (sorted), what it carries, and its
/// part of the point (a classic histogram's `_sum`, `_count`, buckets; a summary's `_sum`,
/// `_count`, quantiles): the series of one part differ only in `le` or `quantile`.
pub type OneSeries = (Vec<(String, String)>, u64, usize);

/// Every data point the translator takes, and every `target_info`, in request order, with
/// every series it becomes, each bucket and quantile its own (`le` and `quantile` written as
/// the translator writes them), made one at a time as `series` is read, so that a point of a
/// million buckets never has them all at once: the series a tenant's relabelling rules see.
/// `drops`: as [`translate`]'s. Without `each_bucket`, a part's buckets or quantiles are one
/// series carrying them all (`le="+Inf"`, `quantile="0"`), as [`translate`] has them: for
/// rules that read neither label, which judge every series of a part alike.
pub fn each_point_every_series<'r>(
    request: &'r ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
    drops: &dyn Fn(&str) -> bool,
    each_bucket: bool,
    each: &mut dyn FnMut(Head<'r>, &mut dyn Iterator<Item = OneSeries>),
) {
    walk(request, settings, &|_| true, &mut |head, item| match item {
        Item::Point { base, name, kind } => each(
            head,
            &mut kind
                .every_series(&name, &base, each_bucket)
                .map(|(labels, items, part)| (kept(labels, drops), items, part)),
        ),
        Item::TargetInfo { labels, samples } => each(
            head,
            &mut std::iter::once((kept(labels, drops), samples, 0)),
        ),
    });
}

/// A data point or a `target_info` as [`walk`] hands it over.
enum Item<'r> {
    /// A point: its labels but `__name__` (its attributes, the promoted resource attributes,
    /// `job` and `instance`), its metric's name escaped, its kind.
    Point {
        base: BTreeMap<String, String>,
        name: String,
        kind: PointKind<'r>,
    },
    /// A resource's `target_info`: its labels and its samples.
    TargetInfo {
        labels: BTreeMap<String, String>,
        samples: u64,
    },
}

/// Every data point the translator takes, and every `target_info`, in request order, by the
/// `__name__`s of the series it becomes: `each(place, name, parts)` with the metric's name
/// escaped (`target_info`'s own) and each series' suffix with what it carries (a classic
/// histogram's `_bucket` once, with all its buckets; a summary's quantiles once). No label is
/// built: what rules that read only `__name__` need.
pub fn each_point_by_name(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
    mut each: impl FnMut(Place, &str, &[(&str, u64)]),
) {
    let conversion = Conversion::of(settings);
    let target_infos = target_info_charges(request, settings);
    for (r, resource) in request.resource_metrics.iter().enumerate() {
        for (s, scope) in resource.scope_metrics.iter().enumerate() {
            for (m, metric) in scope.metrics.iter().enumerate() {
                let name = family_name(Naming::of(metric), conversion)
                    .map(Cow::into_owned)
                    .unwrap_or_default();
                let times = &mut TimeRange::default();
                metric_points(metric, conversion, times, |point, _, _, kind| {
                    let place = Place::Point {
                        resource: r,
                        scope: s,
                        metric: m,
                        point,
                    };
                    let mut parts = [("", 0); 3];
                    let mut n = 0;
                    for (suffix, _, items) in kind.parts() {
                        parts[n] = (suffix, items);
                        n += 1;
                    }
                    each(place, &name, &parts[..n]);
                });
            }
        }
        if let Some((samples, _)) = target_infos[r] {
            each(
                Place::TargetInfo { resource: r },
                TARGET_INFO,
                &[("", samples)],
            );
        }
    }
}

/// The walk [`translate`] and [`each_point_every_series`] share: every data point the
/// translator takes that `wanted` wants, and every `target_info`, in request order.
fn walk<'r>(
    request: &'r ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
    wanted: &dyn Fn(&Bounds) -> bool,
    each: &mut dyn FnMut(Head<'r>, Item<'r>),
) {
    let conversion = Conversion::of(settings);
    let mut stamped = TargetInfoSeen::default();
    for (r, resource) in request.resource_metrics.iter().enumerate() {
        let attributes: &[KeyValue] = resource
            .resource
            .as_ref()
            .map_or(&[], |resource| &resource.attributes);
        let identity = identity_labels(attributes);
        // The resource attributes the tenant promotes: labels of each point's series, and
        // measured with its attributes.
        let promoted_attributes: Vec<&KeyValue> = attributes
            .iter()
            .filter(|kv| settings.promote_otel_resource_attributes.contains(&kv.key))
            .collect();
        let promoted = promoted_labels(&promoted_attributes, conversion);
        let identity_size = attributes
            .iter()
            .filter(|kv| is_identity(&kv.key))
            .map(|kv| measured(kv.value.as_ref()))
            .max()
            .unwrap_or(0);
        let mut times = TimeRange::default();
        for (s, scope) in resource.scope_metrics.iter().enumerate() {
            let scoped = ScopeLabels::of(scope, settings, conversion);
            for (m, metric) in scope.metrics.iter().enumerate() {
                // Each point's series are named alike (a refused name has no points).
                let family = family_name(Naming::of(metric), conversion);
                let family = family.as_deref().unwrap_or_default();
                metric_points(
                    metric,
                    conversion,
                    &mut times,
                    |point, attributes, time, kind| {
                        let mut bounds = Bounds {
                            point_attributes: attributes.len() as u32,
                            metric_name: metric.name.len(),
                            value: identity_size,
                            unusual: escapes_to_nothing(metric.name.as_bytes()),
                            ..scoped.bounds.clone()
                        };
                        bounds.times.see(time);
                        match kind {
                            PointKind::Exponential(point) => bounds.buckets = bucket_counts(point),
                            PointKind::Custom(point) => {
                                bounds.buckets = point.bucket_counts.len() as u64
                            }
                            _ => {}
                        }
                        for kv in attributes {
                            let size = measured(kv.value.as_ref());
                            bounds.attribute(kv.key.as_bytes(), size);
                            bounds.joined = bounds.joined.saturating_add(size).saturating_add(1);
                        }
                        for kv in &promoted_attributes {
                            bounds.attribute(kv.key.as_bytes(), measured(kv.value.as_ref()));
                        }
                        if !wanted(&bounds) {
                            return;
                        }
                        let mut base = labels_of(attributes, conversion);
                        for (name, value) in &promoted {
                            let unset = base.get(name).is_none_or(|set| set.is_empty());
                            if unset {
                                base.insert(name.clone(), value.clone());
                            }
                        }
                        for (name, value) in &identity {
                            base.insert(name.to_string(), value.clone());
                        }
                        scoped.apply(&mut base);
                        let time = nanos_to_millis(time);
                        let head = Head {
                            place: Place::Point {
                                resource: r,
                                scope: s,
                                metric: m,
                                point,
                            },
                            earliest_ms: time,
                            latest_ms: time,
                            native: kind.native(),
                        };
                        let name = family.to_string();
                        each(head, Item::Point { base, name, kind });
                    },
                );
            }
        }
        let keys = target_keys(attributes, conversion);
        if let Ok(Some(stamps)) = TargetInfoTimes::of(&keys, &times) {
            let labels = target_info_labels(attributes, settings);
            // Its samples that an earlier resource's `target_info` did not stamp.
            let (samples, _) = stamped.stamp(kept(labels.clone(), &|_| false), stamps);
            let head = Head {
                place: Place::TargetInfo { resource: r },
                earliest_ms: nanos_to_millis(times.earliest.unwrap_or_default()),
                latest_ms: nanos_to_millis(times.latest),
                native: None,
            };
            each(head, Item::TargetInfo { labels, samples });
        }
    }
}

/// The labels a scope gives its points' series under `otel_promote_scope_metadata` (none when
/// the setting is off or the scope has no name), in the translator's order, and their
/// measures for the points' [`Bounds`].
struct ScopeLabels {
    labels: Vec<(String, String)>,
    bounds: Bounds,
}

impl ScopeLabels {
    fn of(scope: &ScopeMetrics, settings: &OtlpTranslation, conversion: Conversion) -> ScopeLabels {
        let none = ScopeLabels {
            labels: Vec::new(),
            bounds: Bounds::default(),
        };
        let Some(instrumentation) = scope.scope.as_ref() else {
            return none;
        };
        if !settings.otel_promote_scope_metadata || instrumentation.name.is_empty() {
            return none;
        }
        let mut bounds = Bounds {
            scope_attributes: instrumentation.attributes.len() as u32,
            ..Bounds::default()
        };
        let mut labels = Vec::new();
        for kv in &instrumentation.attributes {
            bounds.scope_key = bounds.scope_key.max(kv.key.len());
            bounds.scope_value = bounds.scope_value.max(measured(kv.value.as_ref()));
            labels.push((
                label_name(&format!("otel_scope_{}", kv.key), conversion),
                value_string(kv.value.as_ref()),
            ));
        }
        for (name, value) in [
            ("otel_scope_name", &instrumentation.name),
            ("otel_scope_version", &instrumentation.version),
            ("otel_scope_schema_url", &scope.schema_url),
        ] {
            bounds.scope_value = bounds.scope_value.max(value.len());
            labels.push((name.to_string(), value.clone()));
        }
        ScopeLabels { labels, bounds }
    }

    /// Sets the labels on a point's, as Prometheus' label builder sets them: over what the
    /// point's attributes gave, an empty value removing the label.
    fn apply(&self, base: &mut BTreeMap<String, String>) {
        for (name, value) in &self.labels {
            if value.is_empty() {
                base.remove(name);
            } else {
                base.insert(name.clone(), value.clone());
            }
        }
    }
}

/// The labels of the first series Mimir's translation makes of a request, where its
/// distributor's HA tracker reads the cluster and replica labels: the first data point it
/// translates (a resource's `target_info` follows the resource's points), before
/// `drop_labels`. `None` when the request makes no series.
pub fn first_series(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> Option<Vec<(String, String)>> {
    let first = std::cell::Cell::new(true);
    let translated = translate(request, settings, &|_| false, &|_| first.replace(false));
    translated.into_iter().next()?.series.into_iter().next()
}

/// [`first_series`] of an encoded request, decoded a metric at a time: the first metric that
/// translates to a point gives it, and the rest of the request is not decoded. A resource
/// none of whose metrics does is decoded whole (its `target_info` may be the first series).
/// A resource's attributes are merged from each of its `resource` fields, as prost merges them.
pub fn first_series_encoded(
    raw: &[u8],
    settings: &OtlpTranslation,
) -> Result<Option<Vec<(String, String)>>, String> {
    use super::proto::metrics::{ResourceMetrics, ScopeMetrics};
    use super::proto::resource::Resource;
    use prost::Message;
    for entry in fields(raw, 1)? {
        let mut resource: Option<Resource> = None;
        for bytes in fields(entry, 1)? {
            let resource = resource.get_or_insert_with(Resource::default);
            resource.merge(bytes).map_err(|err| err.to_string())?;
        }
        for scope in fields(entry, 2)? {
            // The scope itself, without its metrics, for a tenant that promotes it.
            let mut head = ScopeMetrics::default();
            if settings.otel_promote_scope_metadata {
                for bytes in fields(scope, 1)? {
                    let instrumentation = head.scope.get_or_insert_with(Default::default);
                    instrumentation
                        .merge(bytes)
                        .map_err(|err| err.to_string())?;
                }
                if let Some(url) = fields(scope, 3)?.last() {
                    head.schema_url = String::from_utf8(url.to_vec()).map_err(|e| e.to_string())?;
                }
            }
            for metric in fields(scope, 2)? {
                let one = ExportMetricsServiceRequest {
                    resource_metrics: vec![ResourceMetrics {
                        resource: resource.clone(),
                        scope_metrics: vec![ScopeMetrics {
                            metrics: vec![Metric::decode(metric).map_err(|err| err.to_string())?],
                            ..head.clone()
                        }],
                        ..Default::default()
                    }],
                };
                let first = translate(&one, settings, &|_| false, &|_| true)
                    .into_iter()
                    .next();
                if let Some(Translated {
                    place: Place::Point { .. },
                    series,
                    ..
                }) = first
                {
                    return Ok(series.into_iter().next());
                }
            }
        }
        let whole = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics::decode(entry).map_err(|err| err.to_string())?],
        };
        if let Some(series) = first_series(&whole, settings) {
            return Ok(Some(series));
        }
    }
    Ok(None)
}

/// The bodies of the length-delimited fields numbered `tag` in the message `buf`, in order.
fn fields(mut buf: &[u8], tag: u32) -> Result<Vec<&[u8]>, String> {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    let mut found = Vec::new();
    while !buf.is_empty() {
        let (field, wire_type) = decode_key(&mut buf).map_err(|err| err.to_string())?;
        if field == tag && wire_type == WireType::LengthDelimited {
            let length = decode_varint(&mut buf).map_err(|err| err.to_string())? as usize;
            if length > buf.len() {
                return Err(format!("field {tag} is longer than its message"));
            }
            let (body, rest) = buf.split_at(length);
            found.push(body);
            buf = rest;
        } else {
            skip_field(wire_type, field, &mut buf, DecodeContext::default())
                .map_err(|err| err.to_string())?;
        }
    }
    Ok(found)
}

/// An exemplar as Mimir's translation carries it: its place in the request (its point, and
/// its index among the point's exemplars), the series it lands on (a classic histogram's
/// bucket, counted from the first bound, the last being `+Inf`; 0 for a sum's or an
/// exponential histogram's), its timestamp and its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct TranslatedExemplar {
    pub point: Place,
    pub index: usize,
    pub series: usize,
    pub timestamp_ms: i64,
    pub labels: Vec<(String, String)>,
}

/// The exemplars Mimir's translation carries, in request order (a gauge's are never
/// translated, a summary has none), and the request's earliest sample: its translated points'
/// and its `target_info`s' (Unix milliseconds; `i64::MAX` when it has none), from which
/// Mimir's distributor judges an exemplar's age.
pub fn exemplars(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> (Vec<TranslatedExemplar>, i64) {
    let conversion = Conversion::of(settings);
    let target_infos = translate(request, settings, &|_| false, &|_| false);
    let mut earliest = target_infos
        .iter()
        .map(|info| info.earliest_ms)
        .min()
        .unwrap_or(i64::MAX);
    let mut out = Vec::new();
    for (r, resource) in request.resource_metrics.iter().enumerate() {
        for (s, scope) in resource.scope_metrics.iter().enumerate() {
            for (m, metric) in scope.metrics.iter().enumerate() {
                let times = &mut TimeRange::default();
                metric_points(metric, conversion, times, |p, _, time, kind| {
                    earliest = earliest.min(nanos_to_millis(time));
                    let (exemplars, bounds): (&[Exemplar], &[f64]) = match (&metric.data, kind) {
                        (Some(Data::Sum(sum)), _) => (&sum.data_points[p].exemplars, &[]),
                        (Some(Data::Histogram(histogram)), PointKind::Histogram { bounds, .. }) => {
                            (&histogram.data_points[p].exemplars, bounds)
                        }
                        // With custom buckets, the one series of the point has them all.
                        (Some(Data::Histogram(histogram)), _) => {
                            (&histogram.data_points[p].exemplars, &[])
                        }
                        (Some(Data::ExponentialHistogram(histogram)), _) => {
                            (&histogram.data_points[p].exemplars, &[])
                        }
                        _ => return,
                    };
                    // The translator hands a classic histogram's exemplars out bucket by
                    // bucket, in their order: each goes to the first bucket from the one the
                    // exemplar before it went to whose bound is not below its value.
                    let mut bucket = 0;
                    for (index, exemplar) in exemplars.iter().enumerate() {
                        let value = match exemplar.value {
                            Some(ExemplarValue::AsDouble(value)) => value,
                            Some(ExemplarValue::AsInt(value)) => value as f64,
                            None => 0.0,
                        };
                        while bucket < bounds.len() && value > bounds[bucket] {
                            bucket += 1;
                        }
                        out.push(TranslatedExemplar {
                            point: Place::Point {
                                resource: r,
                                scope: s,
                                metric: m,
                                point: p,
                            },
                            index,
                            series: bucket,
                            timestamp_ms: (exemplar.time_unix_nano as i64).div_euclid(1_000_000),
                            labels: exemplar_labels(exemplar),
                        });
                    }
                });
            }
        }
    }
    (out, earliest)
}

/// An exemplar's labels as the translator writes them: `trace_id` and `span_id` in hex when
/// set (an id of zeros is none), then its filtered attributes, unless they would take the
/// labels over 128 characters, names and values together (OpenMetrics' bound).
fn exemplar_labels(exemplar: &Exemplar) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut characters = 0;
    for (name, id) in [
        ("trace_id", &exemplar.trace_id),
        ("span_id", &exemplar.span_id),
    ] {
        if id.iter().any(|&byte| byte != 0) {
            let hex: String = id.iter().map(|byte| format!("{byte:02x}")).collect();
            characters += name.len() + hex.len();
            labels.push((name.to_string(), hex));
        }
    }
    let attributes: Vec<(String, String)> = exemplar
        .filtered_attributes
        .iter()
        .map(|kv| (kv.key.clone(), value_string(kv.value.as_ref())))
        .collect();
    characters += attributes
        .iter()
        .map(|(key, value)| key.chars().count() + value.chars().count())
        .sum::<usize>();
    if characters <= EXEMPLAR_MAX_LABEL_SET_LENGTH {
        labels.extend(attributes);
    }
    labels
}

/// Characters an exemplar's labels may hold (the translator's `maxExemplarRunes`).
const EXEMPLAR_MAX_LABEL_SET_LENGTH: usize = 128;

/// The resource attributes that become `job` and `instance`, not `target_info` labels.
pub fn is_identity(key: &str) -> bool {
    matches!(
        key,
        "service.name" | "service.namespace" | "service.instance.id"
    )
}

/// The labels of a resource's `target_info`: its attributes as labels, but `service.name`,
/// `service.namespace` and `service.instance.id` (all of them with
/// `otel_keep_identifying_resource_attributes`), then `job` and `instance`, and `__name__`.
pub fn target_info_labels(
    attributes: &[KeyValue],
    settings: &OtlpTranslation,
) -> BTreeMap<String, String> {
    let keep = settings.otel_keep_identifying_resource_attributes;
    let mut labels = labels_of(
        attributes.iter().filter(|kv| keep || !is_identity(&kv.key)),
        Conversion::of(settings),
    );
    for (name, value) in identity_labels(attributes) {
        labels.insert(name.to_string(), value);
    }
    labels.insert("__name__".to_string(), TARGET_INFO.to_string());
    labels
}

/// The samples each resource's `target_info` is charged, by resource (`None`: it makes none),
/// and whether its series is new to the request: those an earlier resource's `target_info` of
/// the same labels did not stamp (`rules::TargetInfoSeen`).
pub fn target_info_charges(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> Vec<Option<(u64, bool)>> {
    let stamps: Vec<Option<TargetInfoTimes>> = request
        .resource_metrics
        .iter()
        .map(|resource| {
            let mut times = TimeRange::default();
            for metric in resource
                .scope_metrics
                .iter()
                .flat_map(|scope| &scope.metrics)
            {
                metric_points(metric, Conversion::default(), &mut times, |_, _, _, _| {});
            }
            let keys = target_keys(resource_attributes(resource), Conversion::of(settings));
            TargetInfoTimes::of(&keys, &times).ok().flatten()
        })
        .collect();
    let made = request
        .resource_metrics
        .iter()
        .zip(&stamps)
        .filter_map(|(resource, stamp)| Some((resource_attributes(resource), (*stamp)?)));
    let mut charged = target_infos_stamped(made, settings).into_iter();
    stamps
        .iter()
        .map(|stamp| stamp.and_then(|_| charged.next()))
        .collect()
}

/// The `target_info`s of a request's resources (each its resource's attributes and stamps, in
/// request order), each with the samples it is charged and whether its series is new to the
/// request: its own (`TargetInfoTimes::samples`) when it is the only one, else those an
/// earlier one of the same labels did not stamp (`rules::TargetInfoSeen`), which takes their labels.
pub fn target_infos_stamped<'r>(
    target_infos: impl IntoIterator<Item = (&'r [KeyValue], TargetInfoTimes)>,
    settings: &OtlpTranslation,
) -> Vec<(u64, bool)> {
    let target_infos: Vec<_> = target_infos.into_iter().collect();
    if let [(_, stamps)] = target_infos[..] {
        return vec![(stamps.samples(), true)];
    }
    let mut stamped = TargetInfoSeen::default();
    target_infos
        .into_iter()
        .map(|(attributes, stamps)| {
            let labels = target_info_labels(attributes, settings);
            // As the translator's label builder ends with them: no label of an empty value.
            stamped.stamp(kept(labels, &|_| false), stamps)
        })
        .collect()
}

/// What a resource's attributes say about its `target_info`.
pub(super) fn target_keys(attributes: &[KeyValue], conversion: Conversion) -> TargetKeys {
    TargetKeys::of(attributes.iter().map(|kv| {
        let key = kv.key.as_bytes();
        let empty = renders_empty(kv.value.as_ref());
        (key, empty, makes_no_label_name(key, conversion))
    }))
}

/// A resource's attributes (none when it has no `Resource`).
pub fn resource_attributes(resource: &ResourceMetrics) -> &[KeyValue] {
    resource.resource.as_ref().map_or(&[], |r| &r.attributes)
}

/// The attributes to give a resource's points so that, once its refused `target_info` is cut
/// from the forwarded export, each point is still the series it was sent as. The cut leaves
/// the resource only the first of each identifying attribute (the receiver then builds no
/// `target_info`, and the same `job` and `instance`), so the labels promoted from the
/// attributes it takes go with them: each point that does not set such a label itself is
/// given it as an attribute named as the label (a point's own label wins over a promoted
/// one, as in `createAttributes`). By `(scope, metric, point)`; `None` when no attributes can
/// keep the series: the resource left would promote a label the sent one does not (a
/// repeated identifying key whose last value is empty), a label's name escapes to another, or
/// a point's attributes name the label but leave it empty.
#[allow(clippy::type_complexity)]
pub fn target_info_cut(
    resource: &ResourceMetrics,
    settings: &OtlpTranslation,
) -> Option<Vec<((usize, usize, usize), Vec<(String, String)>)>> {
    let conversion = Conversion::of(settings);
    let attributes = resource_attributes(resource);
    let promoted = |kept: &dyn Fn(usize, &KeyValue) -> bool| {
        let promoted: Vec<&KeyValue> = attributes
            .iter()
            .enumerate()
            .filter(|(i, kv)| {
                settings.promote_otel_resource_attributes.contains(&kv.key) && kept(*i, kv)
            })
            .map(|(_, kv)| kv)
            .collect();
        promoted_labels(&promoted, conversion)
    };
    let sent = promoted(&|_, _| true);
    let left = promoted(&|i, kv| {
        is_identity(&kv.key) && !attributes[..i].iter().any(|earlier| earlier.key == kv.key)
    });
    if left
        .iter()
        .any(|(name, _)| !sent.iter().any(|(sent, _)| sent == name))
    {
        return None;
    }
    let moved: Vec<&(String, String)> = sent.iter().filter(|label| !left.contains(label)).collect();
    if moved.is_empty() {
        return Some(Vec::new());
    }
    if moved
        .iter()
        .any(|(name, _)| label_name(name, conversion) != *name)
    {
        return None;
    }
    let mut added = Vec::new();
    let mut times = TimeRange::default();
    for (s, scope) in resource.scope_metrics.iter().enumerate() {
        for (m, metric) in scope.metrics.iter().enumerate() {
            let mut unkept = false;
            metric_points(metric, conversion, &mut times, |p, attributes, _, _| {
                let labels = labels_of(attributes, conversion);
                let mut given = Vec::new();
                for (name, value) in &moved {
                    match labels.get(name) {
                        Some(set) if !set.is_empty() => {}
                        Some(_) => unkept = true,
                        None => given.push((name.clone(), value.clone())),
                    }
                }
                if !given.is_empty() {
                    added.push(((s, m, p), given));
                }
            });
            if unkept {
                return None;
            }
        }
    }
    Some(added)
}

/// Promoted resource attributes as labels, as the translator's `addPromotedAttributes` sets
/// them: in the resource's order, each key escaped as a point attribute's, a later one of the
/// same name over an earlier (an empty value removing it).
fn promoted_labels(promoted: &[&KeyValue], conversion: Conversion) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = Vec::with_capacity(promoted.len());
    for kv in promoted {
        let name = label_name(&kv.key, conversion);
        let value = value_string(kv.value.as_ref());
        match labels.iter_mut().find(|(set, _)| *set == name) {
            Some((_, set)) => *set = value,
            None => labels.push((name, value)),
        }
    }
    labels.retain(|(_, value)| !value.is_empty());
    labels
}

/// `job` and `instance`, as the translator sets them over a series' other labels: `job` from
/// `service.name` (`namespace/name` when `service.namespace` is there, even empty), `instance`
/// from `service.instance.id`, each the first of its key (pdata's `Get`), and only with a
/// value (an empty one sets nothing, and leaves an attribute of that name as it was).
fn identity_labels(attributes: &[KeyValue]) -> Vec<(&'static str, String)> {
    let value = |key: &str| {
        attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| value_string(kv.value.as_ref()))
    };
    let mut labels = Vec::new();
    if let Some(name) = value("service.name") {
        let job = match value("service.namespace") {
            Some(namespace) => format!("{namespace}/{name}"),
            None => name,
        };
        labels.push(("job", job));
    }
    if let Some(instance) = value("service.instance.id") {
        labels.push(("instance", instance));
    }
    labels.retain(|(_, value)| !value.is_empty());
    labels
}

/// Attributes as labels: keys escaped, values of keys that escape alike joined with `;` in
/// key order, as the translator joins them: onto a value set so far, an empty one replaced
/// (`a.b: ""` then `a_b: "x"` is `a_b="x"`; the other way round, `a_b="x;"`).
fn labels_of<'k>(
    attributes: impl IntoIterator<Item = &'k KeyValue>,
    conversion: Conversion,
) -> BTreeMap<String, String> {
    let mut sorted: Vec<&KeyValue> = attributes.into_iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for kv in sorted {
        let value = value_string(kv.value.as_ref());
        labels
            .entry(label_name(&kv.key, conversion))
            .and_modify(|joined| {
                if joined.is_empty() {
                    *joined = value.clone();
                } else {
                    joined.push(';');
                    joined.push_str(&value);
                }
            })
            .or_insert(value);
    }
    labels
}

/// The labels Mimir's checks see: no empty value, no dropped name; sorted by name.
fn kept(labels: BTreeMap<String, String>, drops: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    labels
        .into_iter()
        .filter(|(name, value)| !value.is_empty() && !drops(name))
        .collect()
}

/// An attribute key as a label name (Prometheus' `otlptranslator.LabelNamer`): as sent when
/// names are kept as sent; else each character outside `[A-Za-z0-9]` made `_` (a run of them
/// one `_` unless runs are kept, a reserved `__name__` keeping its ends), `key_` before a
/// leading digit, and `key` before a leading single `_` when the tenant sanitizes those.
pub fn label_name(key: &str, conversion: Conversion) -> String {
    if key.is_empty() {
        return String::new();
    }
    if conversion.utf8 {
        return key.to_string();
    }
    let mut name = if conversion.keep_underscores {
        key.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    } else {
        let reserved = key
            .strip_prefix("__")
            .and_then(|inner| inner.strip_suffix("__"))
            .filter(|_| key.len() >= 4);
        let mut out = String::with_capacity(key.len() + 4);
        for c in reserved.unwrap_or(key).chars() {
            if c.is_ascii_alphanumeric() {
                out.push(c);
            } else if !out.ends_with('_') {
                out.push('_');
            }
        }
        match reserved {
            Some(_) => format!("__{out}__"),
            None => out,
        }
    };
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert_str(0, "key_");
    } else if conversion.key_prefix && name.starts_with('_') && !name.starts_with("__") {
        name.insert_str(0, "key");
    }
    name
}

/// Whether an attribute key makes no label name where Mimir's translator builds one
/// (`LabelNamer.Build`, names escaped), which it reports as an error: empty, or nothing but
/// `_` once escaped (`.`, `__`; a lone `_` is `key_` when the tenant sanitizes). Names kept as
/// sent are not built for a point's or a `target_info`'s attributes, so never refused here.
#[inline]
pub fn makes_no_label_name(key: &[u8], conversion: Conversion) -> bool {
    if conversion.utf8 || key.first().is_some_and(u8::is_ascii_alphanumeric) {
        return false;
    }
    no_label_name(key, conversion)
}

#[cold]
#[inline(never)]
fn no_label_name(key: &[u8], conversion: Conversion) -> bool {
    if key.iter().any(u8::is_ascii_alphanumeric) {
        return false;
    }
    let name = label_name(std::str::from_utf8(key).unwrap_or_default(), conversion);
    name.bytes().all(|b| b == b'_')
}

/// Why Mimir's translator stops at a data point of a metric it takes, leaving that point and
/// the metric's later ones out (the points before stay; the metric is one error it reports):
/// an exponential histogram's scale below -4, or an attribute key that makes no label name.
pub(super) fn point_stops(
    attributes: &[KeyValue],
    scale: Option<i32>,
    conversion: Conversion,
) -> Option<&'static str> {
    if scale.is_some_and(|scale| scale < -4) {
        return Some(SCALE_BELOW_MINUS_4);
    }
    attributes
        .iter()
        .any(|kv| makes_no_label_name(kv.key.as_bytes(), conversion))
        .then_some(LABEL_NAME_INVALID)
}

/// What a metric's family name is made of (Prometheus' `otlptranslator.Metric`): its name, its
/// unit, and whether it is a monotonic sum (`_total`) or a gauge (`_ratio`, for unit `1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Naming<'a> {
    pub name: &'a str,
    pub unit: &'a str,
    pub counter: bool,
    pub gauge: bool,
}

impl<'a> Naming<'a> {
    pub fn of(metric: &'a Metric) -> Naming<'a> {
        Naming {
            name: &metric.name,
            unit: &metric.unit,
            counter: matches!(&metric.data, Some(Data::Sum(sum)) if sum.is_monotonic),
            gauge: matches!(&metric.data, Some(Data::Gauge(_))),
        }
    }

    /// A name of its own (`target_info`'s): no unit, not a sum or a gauge.
    pub fn fixed(name: &'a str) -> Naming<'a> {
        Naming {
            name,
            unit: "",
            counter: false,
            gauge: false,
        }
    }
}

/// Whether the translator can name the metric ([`family_name`] is not `None`), without
/// building the name when it has no suffixes.
pub fn is_named(naming: Naming<'_>, conversion: Conversion) -> bool {
    if conversion.utf8 {
        true
    } else if conversion.suffixes {
        !suffixed_name(naming).is_empty()
    } else {
        !name_refused(naming.name.as_bytes())
    }
}

/// The family name Mimir's translation gives a metric: [`metric_name`], or with suffixes
/// (`otel_metric_suffixes_enabled`) [`suffixed_name`]; with names kept as sent, the name as
/// sent, or [`utf8_suffixed_name`]. `None` when the translator refuses it (escaped, nothing
/// is left, or only `_` where the escaping changed the name).
pub fn family_name(naming: Naming<'_>, conversion: Conversion) -> Option<Cow<'_, str>> {
    if conversion.utf8 {
        return Some(if conversion.suffixes {
            Cow::Owned(utf8_suffixed_name(naming))
        } else {
            Cow::Borrowed(naming.name)
        });
    }
    if conversion.suffixes {
        let name = suffixed_name(naming);
        return (!name.is_empty()).then_some(Cow::Owned(name));
    }
    if name_refused(naming.name.as_bytes()) {
        None
    } else if is_metric_name(naming.name) {
        Some(Cow::Borrowed(naming.name))
    } else {
        Some(Cow::Owned(metric_name(naming.name)))
    }
}

/// Prometheus' `buildMetricName` (its metric namer with suffixes, UTF-8 allowed): the name as
/// sent, its main unit after a `_` unless it ends so already, then its per unit, `_total` for
/// a monotonic sum and `_ratio` for a gauge of unit `1`, each taken off the name's end first
/// (with the character before it) so that it comes once, last. Units are named
/// (`ms` is `milliseconds`, `/s` `per_second`) but not cleaned.
pub fn utf8_suffixed_name(naming: Naming<'_>) -> String {
    /// The translator's `trimSuffixAndDelimiter`: `suffix` and the character before it off
    /// the end, when the name is longer than both. (Go cuts a byte; this the whole character
    /// before the suffix.)
    fn trimmed<'n>(name: &'n str, suffix: &str) -> &'n str {
        match name.strip_suffix(suffix) {
            Some(rest) if name.len() > suffix.len() + 1 => {
                let mut end = rest.len() - 1;
                while !rest.is_char_boundary(end) {
                    end -= 1;
                }
                &rest[..end]
            }
            _ => name,
        }
    }
    let ratio = naming.unit == "1" && naming.gauge;
    let mut name = naming.name;
    if ratio {
        name = trimmed(name, "ratio");
    }
    if naming.counter {
        name = trimmed(name, "total");
    }
    let (main, per) = named_units(naming.unit);
    if !per.is_empty() {
        name = trimmed(name, &per);
    }
    let mut out = name.to_string();
    if !main.is_empty() && !out.ends_with(main.as_str()) {
        out.push('_');
        out.push_str(&main);
    }
    for suffix in [per.as_str(), if naming.counter { "total" } else { "" }] {
        if !suffix.is_empty() {
            out.push('_');
            out.push_str(suffix);
        }
    }
    if ratio {
        out.push_str("_ratio");
    }
    out
}

/// Prometheus' `normalizeName` (its metric namer with suffixes, names escaped): the name's
/// words (runs of `[A-Za-z0-9:]`; so `_` separates too, and runs of it become one), then its
/// unit's (`ms` is `milliseconds`, `By/s` `bytes` and `per_second`; a word the name has
/// already is not added again), `total` for a monotonic sum and `ratio` for a gauge of unit
/// `1` (each once, last), joined with `_`; `_` before a leading digit. Empty when no word is
/// left, which the translator refuses.
pub fn suffixed_name(naming: Naming<'_>) -> String {
    let mut words: Vec<Cow<str>> = naming
        .name
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|word| !word.is_empty())
        .map(Cow::Borrowed)
        .collect();
    let (main, per) = unit_suffixes(naming.unit);
    let mut main = if words.iter().any(|word| *word == main) {
        String::new()
    } else {
        main
    };
    let per = if per == "per_" {
        String::new()
    } else {
        let per = per.strip_suffix('_').unwrap_or(&per).to_string();
        if words.iter().any(|word| *word == per) {
            String::new()
        } else {
            per
        }
    };
    if !per.is_empty() {
        if let Some(trimmed) = main.strip_suffix('_') {
            main = trimmed.to_string();
        }
    }
    for suffix in [main, per] {
        if !suffix.is_empty() {
            words.push(Cow::Owned(suffix));
        }
    }
    let mut last = |word: &'static str| {
        words.retain(|w| w != word);
        words.push(Cow::Borrowed(word));
    };
    if naming.counter {
        last("total");
    }
    if naming.unit == "1" && naming.gauge {
        last("ratio");
    }
    let mut out = words.join("_");
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A metric name as a `__name__`: each run of characters outside `[A-Za-z0-9_:]` becomes one
/// `_`, and none is kept at either end; `_` before a leading digit.
pub fn metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    write_metric_name(name, &mut out);
    out
}

/// [`metric_name`] written into `out`, which is cleared first.
fn write_metric_name(name: &str, out: &mut String) {
    out.clear();
    for field in name.split(|c: char| !is_name_char(c)) {
        if !field.is_empty() {
            if !out.is_empty() {
                out.push('_');
            }
            out.push_str(field);
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Whether `name` is its own [`metric_name`].
fn is_metric_name(name: &str) -> bool {
    name.chars().all(is_name_char) && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The Prometheus type of a metadata entry, as the translation gives it to a metric it takes
/// (a cumulative one: it refuses the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// A sum's or a histogram's of delta temporality (`otel_native_delta_ingestion`): the
    /// translator has no type for those yet.
    Unknown,
    Gauge,
    /// A monotonic sum.
    Counter,
    /// An explicit or exponential histogram.
    Histogram,
    Summary,
}

impl MetricType {
    /// The type of a decoded metric's `data`.
    pub fn of(data: &Data) -> MetricType {
        let delta = |temporality: i32| temporality == AggregationTemporality::Delta as i32;
        match data {
            Data::Sum(sum) if delta(sum.aggregation_temporality) => MetricType::Unknown,
            Data::Histogram(histogram) if delta(histogram.aggregation_temporality) => {
                MetricType::Unknown
            }
            Data::ExponentialHistogram(histogram) if delta(histogram.aggregation_temporality) => {
                MetricType::Unknown
            }
            Data::Gauge(_) => MetricType::Gauge,
            Data::Sum(sum) if sum.is_monotonic => MetricType::Counter,
            Data::Sum(_) => MetricType::Gauge,
            Data::Histogram(_) | Data::ExponentialHistogram(_) => MetricType::Histogram,
            Data::Summary(_) => MetricType::Summary,
        }
    }
}

/// What a metadata entry carries besides its family's name, as sent (the unit is named
/// only to compare two that differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta<'a> {
    pub kind: MetricType,
    pub unit: &'a [u8],
    pub help: &'a [u8],
}

impl Meta<'_> {
    /// `target_info`'s entry: a gauge with no unit.
    pub const TARGET_INFO: Meta<'static> = Meta {
        kind: MetricType::Gauge,
        unit: b"",
        help: b"Target metadata",
    };

    /// Whether an entry with `self` and one with `other` say the same.
    fn same(&self, other: &Meta) -> bool {
        let named = |unit: &[u8]| std::str::from_utf8(unit).map(unit_name).ok();
        self.kind == other.kind
            && self.help == other.help
            && (self.unit == other.unit || named(self.unit) == named(other.unit))
    }
}

/// The metadata entries of a request as Mimir's translation makes them (its appender's
/// `appendMetadata`): one when a family's first metric is appended, and one more each time a
/// later metric of the family brings another type, unit or help than the family's last entry.
/// A family is the metric's [`family_name`].
#[derive(Default)]
pub struct MetadataEntries<'a> {
    /// Each family's last entry; a name that is its own family name is borrowed.
    last: HashMap<Cow<'a, str>, Meta<'a>>,
    entries: u64,
    /// A reused buffer for a name that needs escaping.
    name: String,
    /// How family names are made ([`family_name`]).
    conversion: Conversion,
}

impl<'a> MetadataEntries<'a> {
    /// Entries of families named as `conversion` names them.
    pub fn new(conversion: Conversion) -> MetadataEntries<'a> {
        MetadataEntries {
            last: HashMap::new(),
            entries: 0,
            name: String::new(),
            conversion,
        }
    }

    /// Whether a metric named as `naming` says with `meta`, appended now, makes an entry.
    pub fn see(&mut self, naming: Naming<'a>, meta: Meta<'a>) -> bool {
        let name = naming.name;
        let Conversion { suffixes, utf8, .. } = self.conversion;
        let own = !suffixes && (utf8 || is_metric_name(name));
        let family = if own {
            name
        } else if suffixes {
            self.name = if utf8 {
                utf8_suffixed_name(naming)
            } else {
                suffixed_name(naming)
            };
            self.name.as_str()
        } else {
            write_metric_name(name, &mut self.name);
            self.name.as_str()
        };
        match self.last.get_mut(family) {
            Some(last) if last.same(&meta) => return false,
            Some(last) => *last = meta,
            None => {
                let family = if own {
                    Cow::Borrowed(name)
                } else {
                    Cow::Owned(family.to_string())
                };
                self.last.insert(family, meta);
            }
        }
        self.entries += 1;
        true
    }

    /// How many entries the metrics seen so far make.
    pub fn count(&self) -> u64 {
        self.entries
    }
}

/// A metric's unit as the metadata entry Mimir's translation makes carries it (Prometheus'
/// `otlptranslator.UnitNamer`, UTF-8 not allowed): the unit before a `/` and the one after,
/// each trimmed, left out if it has a `{` or a `}`, and named (`s` is `seconds`, `/s`
/// `per_second`; an unknown one stays); in each, every character outside `[A-Za-z0-9:]`
/// becomes `_`, runs of `_` one, and a leading `_` goes; joined with `_`; then one `_` at
/// either end goes.
pub fn unit_name(unit: &str) -> String {
    let (main, per) = unit_suffixes(unit);
    let mut out = match (main.is_empty(), per.is_empty()) {
        (false, false) => format!("{main}_{per}"),
        (false, true) => main,
        _ => per,
    };
    if out.starts_with('_') {
        out.remove(0);
    }
    if out.ends_with('_') {
        out.pop();
    }
    out
}

/// Prometheus' `buildUnitSuffixes` and `cleanUpUnit`: the main unit and the per unit
/// (`per_<unit>`) a unit is named by, each cleaned as a metric name's part; empty where there
/// is none (blank, or in braces).
fn unit_suffixes(unit: &str) -> (String, String) {
    let (main, per) = named_units(unit);
    let clean = |part: String| {
        if part.is_empty() {
            part
        } else {
            clean_unit(&part)
        }
    };
    (clean(main), clean(per))
}

/// Prometheus' `buildUnitSuffixes`: the main unit and the per unit (`per_<unit>`) a unit is
/// named by, not cleaned; empty where there is none (blank, or in braces).
fn named_units(unit: &str) -> (String, String) {
    let (main, per) = match unit.split_once('/') {
        Some((main, per)) => (main, Some(per)),
        None => (unit, None),
    };
    let named = |part: &str, names: &[(&str, &'static str)]| -> Option<String> {
        let part = part.trim();
        if part.is_empty() || part.contains(['{', '}']) {
            return None;
        }
        let name = names.iter().find(|(from, _)| *from == part);
        Some(name.map_or(part, |(_, to)| to).to_string())
    };
    let main = named(main, UNITS).unwrap_or_default();
    let per = per
        .and_then(|per| named(per, PER_UNITS))
        .filter(|per| !per.is_empty())
        .map_or_else(String::new, |per| format!("per_{per}"));
    (main, per)
}

/// A unit part with every character outside `[A-Za-z0-9:]` made `_`, runs of `_` made one,
/// and a leading `_` cut (the translator's `cleanUpUnit`).
fn clean_unit(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        let c = if c.is_ascii_alphanumeric() || c == ':' {
            c
        } else {
            '_'
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    match out.strip_prefix('_') {
        Some(rest) => rest.to_string(),
        None => out,
    }
}

/// The translator's names of units (its `unitMap`): UCUM's as Prometheus names them.
const UNITS: &[(&str, &str)] = &[
    ("d", "days"),
    ("h", "hours"),
    ("min", "minutes"),
    ("s", "seconds"),
    ("ms", "milliseconds"),
    ("us", "microseconds"),
    ("ns", "nanoseconds"),
    ("By", "bytes"),
    ("KiBy", "kibibytes"),
    ("MiBy", "mebibytes"),
    ("GiBy", "gibibytes"),
    ("TiBy", "tibibytes"),
    ("KBy", "kilobytes"),
    ("MBy", "megabytes"),
    ("GBy", "gigabytes"),
    ("TBy", "terabytes"),
    ("m", "meters"),
    ("V", "volts"),
    ("A", "amperes"),
    ("J", "joules"),
    ("W", "watts"),
    ("g", "grams"),
    ("Cel", "celsius"),
    ("Hz", "hertz"),
    ("1", ""),
    ("%", "percent"),
];

/// The translator's names of the unit after a `/` (its `perUnitMap`).
const PER_UNITS: &[(&str, &str)] = &[
    ("s", "second"),
    ("m", "minute"),
    ("h", "hour"),
    ("d", "day"),
    ("w", "week"),
    ("mo", "month"),
    ("y", "year"),
];

/// How much longer [`unit_name`] can make a unit: `us` is `microseconds` (10 more) and `/s`
/// `_per_second` (9 more).
pub const UNIT_GROWTH: usize = 19;

/// How long an attribute value can be as a label value, as the scan measures it: a string's
/// bytes, the longest a bool, an integer or a double is written; [`UNMEASURED`] for the
/// others.
pub fn measured(value: Option<&AnyValue>) -> usize {
    match value.and_then(|value| value.value.as_ref()) {
        None => 0,
        Some(Any::StringValue(text)) => text.len(),
        Some(Any::BoolValue(_)) => 5,
        Some(Any::IntValue(_)) => 20,
        Some(Any::DoubleValue(_)) => DOUBLE_TEXT,
        Some(_) => UNMEASURED,
    }
}

/// Whether [`value_string`] writes a value empty: none, an empty string or byte string.
pub fn renders_empty(value: Option<&AnyValue>) -> bool {
    match value.and_then(|value| value.value.as_ref()) {
        None => true,
        Some(Any::StringValue(text)) => text.is_empty(),
        Some(Any::BytesValue(bytes)) => bytes.is_empty(),
        Some(_) => false,
    }
}

/// An attribute value as a label value (pdata's `AsString`).
pub fn value_string(value: Option<&AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        None => String::new(),
        Some(Any::StringValue(text)) => text.clone(),
        Some(Any::BoolValue(flag)) => flag.to_string(),
        Some(Any::IntValue(number)) => number.to_string(),
        Some(Any::DoubleValue(number)) => double_string(*number),
        Some(Any::BytesValue(bytes)) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
        Some(other) => json_of(Some(other)).to_string(),
    }
}

/// A double as pdata writes it (Go's `encoding/json` rule): shortest round-trip digits, with
/// an exponent below 1e-6 and from 1e21 (`1e+21`, `1e-7`); not-a-number and the infinities
/// as Go's error text.
fn double_string(number: f64) -> String {
    if !number.is_finite() {
        let go = if number.is_nan() {
            "NaN"
        } else if number > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        };
        return format!("json: unsupported value: {go}");
    }
    let abs = number.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let text = format!("{number:e}");
        match text.split_once('e') {
            Some((digits, exponent)) if !exponent.starts_with('-') => {
                format!("{digits}e+{exponent}")
            }
            _ => text,
        }
    } else {
        format!("{number}")
    }
}

fn json_of(value: Option<&Any>) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        None => Json::Null,
        Some(Any::StringValue(text)) => Json::String(text.clone()),
        Some(Any::BoolValue(flag)) => Json::Bool(*flag),
        Some(Any::IntValue(number)) => Json::from(*number),
        Some(Any::DoubleValue(number)) => Json::from(*number),
        Some(Any::BytesValue(_)) => Json::String(value_string(Some(&AnyValue {
            value: value.cloned(),
        }))),
        Some(Any::ArrayValue(array)) => Json::Array(
            array
                .values
                .iter()
                .map(|value| json_of(value.value.as_ref()))
                .collect(),
        ),
        Some(Any::KvlistValue(list)) => Json::Object(
            list.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        json_of(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                    )
                })
                .collect(),
        ),
    }
}

/// How many bucket counts an exponential histogram's point has, positive and negative.
fn bucket_counts(point: &ExponentialHistogramDataPoint) -> u64 {
    [&point.positive, &point.negative]
        .into_iter()
        .flatten()
        .map(|buckets| buckets.bucket_counts.len() as u64)
        .sum()
}

/// The series kinds a point becomes.
#[derive(Debug, Clone, Copy)]
enum PointKind<'p> {
    /// A gauge's or a sum's: one sample.
    Number,
    /// A classic histogram's: `_sum` (when `sum`), `_count`, the `_bucket` series, one a
    /// bound of `bounds` and `+Inf`.
    Histogram { bounds: &'p [f64], sum: bool },
    /// A native histogram.
    Exponential(&'p ExponentialHistogramDataPoint),
    /// A classic histogram's point as a native histogram with custom buckets
    /// (`otel_convert_histograms_to_nhcb`): one series, the metric's own name.
    Custom(&'p HistogramDataPoint),
    /// A summary's: `_sum`, `_count`, one series a quantile.
    Summary { quantiles: &'p [ValueAtQuantile] },
}

/// A point's series labels: `base` with `__name__` `name` + `suffix` and, for a bucket or a
/// quantile, its `le` or `quantile`.
fn labelled(
    name: &str,
    base: &BTreeMap<String, String>,
    suffix: &str,
    extra: Option<(&str, &str)>,
) -> BTreeMap<String, String> {
    let mut labels = base.clone();
    labels.insert("__name__".to_string(), format!("{name}{suffix}"));
    if let Some((label, value)) = extra {
        labels.insert(label.to_string(), value.to_string());
    }
    labels
}

/// One part of a point's series: its name's suffix, for buckets and quantiles the label that
/// tells them apart (with the value the checks measure them by), and what the part carries.
type Part = (&'static str, Option<(&'static str, &'static str)>, u64);

impl<'p> PointKind<'p> {
    /// The native histogram the point becomes, if it becomes one.
    fn native(self) -> Option<Native<'p>> {
        match self {
            PointKind::Exponential(point) => Some(Native::Exponential(point)),
            PointKind::Custom(point) => Some(Native::Custom(point)),
            _ => None,
        }
    }

    /// The parts of the point's series, in the translator's order (at most three).
    fn parts(self) -> impl Iterator<Item = Part> {
        let none = ("", None, 0);
        let (parts, n) = match self {
            PointKind::Number | PointKind::Exponential(_) | PointKind::Custom(_) => {
                ([("", None, 1), none, none], 1)
            }
            PointKind::Histogram { bounds, sum } => {
                let buckets = ("_bucket", Some(("le", "+Inf")), bounds.len() as u64 + 1);
                if sum {
                    ([("_sum", None, 1), ("_count", None, 1), buckets], 3)
                } else {
                    ([("_count", None, 1), buckets, none], 2)
                }
            }
            PointKind::Summary { quantiles } => {
                let values = ("", Some(("quantile", "0")), quantiles.len() as u64);
                let n = if quantiles.is_empty() { 2 } else { 3 };
                ([("_sum", None, 1), ("_count", None, 1), values], n)
            }
        };
        parts.into_iter().take(n)
    }

    /// The series (labels) of a point with base labels `base` and `__name__` `name`, each
    /// with the samples and histograms it carries; a histogram's buckets and a summary's
    /// quantiles one series (`le="+Inf"`, `quantile="0"`) carrying them all.
    fn series(
        self,
        name: &str,
        base: &BTreeMap<String, String>,
    ) -> Vec<(BTreeMap<String, String>, u64)> {
        self.parts()
            .map(|(suffix, extra, items)| (labelled(name, base, suffix, extra), items))
            .collect()
    }

    /// [`series`](Self::series), each bucket and quantile its own series of one sample (`le`
    /// and `quantile` as the translator writes them) when `each_bucket`, with its part's
    /// index; made as read.
    fn every_series<'s>(
        self,
        name: &'s str,
        base: &'s BTreeMap<String, String>,
        each_bucket: bool,
    ) -> impl Iterator<Item = (BTreeMap<String, String>, u64, usize)> + 's
    where
        'p: 's,
    {
        // The values of the one part a point has with many series.
        let values = move || -> Box<dyn Iterator<Item = String> + 's> {
            match self {
                PointKind::Histogram { bounds, .. } => Box::new(
                    bounds
                        .iter()
                        .map(|bound| go_float(*bound))
                        .chain(std::iter::once("+Inf".to_string())),
                ),
                PointKind::Summary { quantiles } => {
                    Box::new(quantiles.iter().map(|quantile| go_float(quantile.quantile)))
                }
                PointKind::Number | PointKind::Exponential(_) | PointKind::Custom(_) => {
                    Box::new(std::iter::empty())
                }
            }
        };
        self.parts().enumerate().flat_map(
            move |(part, (suffix, extra, items))| -> Box<dyn Iterator<Item = _> + 's> {
                match extra {
                    Some((label, _)) if each_bucket => Box::new(values().map(move |value| {
                        (labelled(name, base, suffix, Some((label, &value))), 1, part)
                    })),
                    _ => Box::new(std::iter::once((
                        labelled(name, base, suffix, extra),
                        items,
                        part,
                    ))),
                }
            },
        )
    }
}

/// A float as Go's `strconv.FormatFloat(value, 'f', -1, 64)` writes it, as the translator
/// writes `le` and `quantile`: the shortest decimal that reads back the same, no exponent.
fn go_float(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{value}")
    }
}

/// Calls `each(point index, attributes, time, kind)` for every point of a metric Mimir's
/// translator takes with `conversion` (cumulative, or delta when the tenant ingests it, where
/// it has a temporality, every exponential scale at -4 or above, with data); every point's
/// time widens `times`, taken or not, as [`super::count`] has it.
fn metric_points<'p>(
    metric: &'p Metric,
    conversion: Conversion,
    times: &mut TimeRange,
    mut each: impl FnMut(usize, &'p [KeyValue], u64, PointKind<'p>),
) {
    // A metric whose name the translator refuses has no points, and one cut at a point
    // ([`point_stops`]) none from that point on; their times still count.
    let named = is_named(Naming::of(metric), conversion);
    let mut cut = false;
    let mut each = |p, attributes: &'p [KeyValue], time, kind: PointKind<'p>| {
        let scale = match kind {
            PointKind::Exponential(point) => Some(point.scale),
            _ => None,
        };
        cut = cut || point_stops(attributes, scale, conversion).is_some();
        if named && !cut {
            each(p, attributes, time, kind)
        }
    };
    let cumulative = |temporality: i32| conversion.takes(temporality);
    match metric.data.as_ref() {
        None => {}
        Some(Data::Gauge(gauge)) => {
            for (p, point) in gauge.data_points.iter().enumerate() {
                times.see(point.time_unix_nano);
                each(
                    p,
                    &point.attributes,
                    point.time_unix_nano,
                    PointKind::Number,
                );
            }
        }
        Some(Data::Sum(sum)) => {
            for point in &sum.data_points {
                times.see(point.time_unix_nano);
            }
            if cumulative(sum.aggregation_temporality) {
                for (p, point) in sum.data_points.iter().enumerate() {
                    each(
                        p,
                        &point.attributes,
                        point.time_unix_nano,
                        PointKind::Number,
                    );
                }
            }
        }
        Some(Data::Histogram(histogram)) => {
            for point in &histogram.data_points {
                times.see(point.time_unix_nano);
            }
            if cumulative(histogram.aggregation_temporality) {
                for (p, point) in histogram.data_points.iter().enumerate() {
                    let buckets = point.explicit_bounds.len().min(point.bucket_counts.len());
                    let kind = if conversion.nhcb {
                        PointKind::Custom(point)
                    } else {
                        PointKind::Histogram {
                            bounds: &point.explicit_bounds[..buckets],
                            sum: point.sum.is_some(),
                        }
                    };
                    each(p, &point.attributes, point.time_unix_nano, kind);
                }
            }
        }
        Some(Data::ExponentialHistogram(histogram)) => {
            for point in &histogram.data_points {
                times.see(point.time_unix_nano);
            }
            if cumulative(histogram.aggregation_temporality) {
                for (p, point) in histogram.data_points.iter().enumerate() {
                    each(
                        p,
                        &point.attributes,
                        point.time_unix_nano,
                        PointKind::Exponential(point),
                    );
                }
            }
        }
        Some(Data::Summary(summary)) => {
            for (p, point) in summary.data_points.iter().enumerate() {
                times.see(point.time_unix_nano);
                let kind = PointKind::Summary {
                    quantiles: &point.quantile_values,
                };
                each(p, &point.attributes, point.time_unix_nano, kind);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string attribute.
    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(Any::StringValue(value.into())),
            }),
        }
    }

    /// A series' labels, from pairs.
    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn names_are_escaped_as_the_translator_escapes_them() {
        let label_name = |key| label_name(key, Conversion::default());
        assert_eq!(label_name("http.method"), "http_method");
        assert_eq!(label_name("123invalid"), "key_123invalid");
        assert_eq!(label_name("_private"), "key_private");
        assert_eq!(label_name("__reserved__"), "__reserved__");
        assert_eq!(label_name("ü"), "key_");
        assert_eq!(label_name("a..b__c"), "a__b__c");
        assert_eq!(metric_name("http.server.duration"), "http_server_duration");
        assert_eq!(metric_name("a..b__c."), "a_b__c");
        assert_eq!(metric_name("2xx.count"), "_2xx_count");
    }

    /// The label-name options and names kept as sent, worked out from Prometheus'
    /// `LabelNamer.Build` and `sanitizeLabelName`.
    #[test]
    fn label_names_follow_the_tenant_s_options() {
        let collapsing = Conversion {
            keep_underscores: false,
            ..Conversion::default()
        };
        for (key, name) in [
            ("http..method", "http_method"),
            ("a__b", "a_b"),
            ("__private", "key_private"),
            ("_private", "key_private"),
            ("__reserved__", "__reserved__"),
            ("__a..b__", "__a_b__"),
            ("___", "key_"),
            ("123..x", "key_123_x"),
            ("ü.ü", "key_"),
        ] {
            assert_eq!(label_name(key, collapsing), name, "{key:?}");
        }
        let unsanitized = Conversion {
            key_prefix: false,
            ..Conversion::default()
        };
        for (key, name) in [
            ("_private", "_private"),
            ("__private", "__private"),
            ("1a", "key_1a"),
        ] {
            assert_eq!(label_name(key, unsanitized), name, "{key:?}");
        }
        let utf8 = Conversion {
            utf8: true,
            ..Conversion::default()
        };
        for key in ["http.method", "_x", "1a", "ü", "a..b"] {
            assert_eq!(label_name(key, utf8), key);
        }
    }

    /// A metric, `(name, unit, monotonic sum, gauge)`, and the name it should get.
    type NameCase<'a> = ((&'a str, &'a str, bool, bool), &'a str);

    /// Each case's metric as `namer` names it.
    fn names_are(namer: fn(Naming<'_>) -> String, cases: &[NameCase<'_>]) {
        for &((name, unit, counter, gauge), expected) in cases {
            let naming = Naming {
                name,
                unit,
                counter,
                gauge,
            };
            assert_eq!(namer(naming), expected, "{name:?} {unit:?}");
        }
    }

    /// A gauge of no unit named `name`.
    fn gauge(name: &str) -> Naming<'_> {
        Naming {
            name,
            unit: "",
            counter: false,
            gauge: true,
        }
    }

    /// Metric names kept as sent, with suffixes: Prometheus' `buildMetricName`, case by case.
    #[test]
    fn utf8_names_get_their_suffixes_as_prometheus_gives_them() {
        let cases = [
            (
                ("http.server.duration", "s", false, false),
                "http.server.duration_seconds",
            ),
            (("http.requests", "", true, false), "http.requests_total"),
            (
                ("http.requests.total", "", true, false),
                "http.requests_total",
            ),
            (
                ("cpu.utilization", "1", false, true),
                "cpu.utilization_ratio",
            ),
            (("cpu.utilization", "1", false, false), "cpu.utilization"),
            (
                ("system.io", "By/s", true, false),
                "system.io_bytes_per_second_total",
            ),
            (("latency.seconds", "s", false, true), "latency.seconds"),
            (
                ("io_per_second", "By/s", false, true),
                "io_bytes_per_second",
            ),
            // Units outside the map stay as sent; braces are none.
            (("temp", "°C", false, true), "temp_°C"),
            (("x", "{packets}", true, false), "x_total"),
            // Only a longer name loses its suffix.
            (("total", "", true, false), "total_total"),
            // The character before a suffix goes with it, whole.
            (("aératio", "1", false, true), "a_ratio"),
        ];
        names_are(utf8_suffixed_name, &cases);
        let utf8 = |suffixes| Conversion {
            utf8: true,
            suffixes,
            ..Conversion::default()
        };
        // Kept as sent, nothing is refused; without suffixes the name is the family.
        assert_eq!(
            family_name(gauge("..."), utf8(false)).as_deref(),
            Some("...")
        );
        assert_eq!(
            family_name(gauge("a.b"), utf8(false)).as_deref(),
            Some("a.b")
        );
        assert!(is_named(gauge("..."), utf8(true)));
        let mut entries = MetadataEntries::new(utf8(false));
        let meta = Meta {
            kind: MetricType::Gauge,
            unit: b"",
            help: b"",
        };
        // `a.b` and `a_b` are one family escaped, two kept as sent.
        assert!(entries.see(gauge("a.b"), meta));
        assert!(entries.see(gauge("a_b"), meta));
        let mut escaped = MetadataEntries::new(Conversion::default());
        assert!(escaped.see(gauge("a.b"), meta));
        assert!(!escaped.see(gauge("a_b"), meta));
    }

    /// Units as Prometheus' `UnitNamer` builds them: its documented examples, then its rules
    /// one at a time (a part with braces left out, trimmed parts, characters outside
    /// `[A-Za-z0-9:]`, runs of `_`, a `_` at either end).
    #[test]
    fn units_are_named_as_the_translator_names_them() {
        let cases = [
            ("s", "seconds"),
            ("By/s", "bytes_per_second"),
            ("requests/s", "requests_per_second"),
            ("1", ""),
            ("%", "percent"),
            ("us/s", "microseconds_per_second"),
            ("1/s", "per_second"),
            ("/mo", "per_month"),
            ("By/", "bytes"),
            ("{packets}", ""),
            ("{packets}/s", "per_second"),
            ("ms/{request}", "milliseconds"),
            (" s / m ", "seconds_per_minute"),
            ("km/h", "km_per_hour"),
            ("a.b-c", "a_b_c"),
            ("__a__", "a"),
            ("é", ""),
            ("kB/é", "kB_per"),
            ("a/b/c", "a_per_b_c"),
            ("", ""),
        ];
        for (unit, named) in cases {
            assert_eq!(unit_name(unit), named, "{unit:?}");
            assert!(named.len() <= unit.len() + UNIT_GROWTH, "{unit:?}");
        }
    }

    /// The HA tracker's series: the first point Mimir translates, across resources, kinds
    /// and refused metrics; its resource's `job`, not the resource's other attributes.
    #[test]
    fn the_first_series_is_the_first_translated_point() {
        use super::super::proto::metrics::{self, metric::Data};
        use super::super::proto::resource::Resource;
        let resource = |attributes: Vec<KeyValue>, metrics: Vec<Metric>| metrics::ResourceMetrics {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        };
        let gauge = |replica: &str| Metric {
            name: "g".into(),
            data: Some(Data::Gauge(metrics::Gauge {
                data_points: vec![metrics::NumberDataPoint {
                    attributes: vec![kv("__replica__", replica), kv("cluster", "c")],
                    time_unix_nano: 1,
                    ..Default::default()
                }],
            })),
            ..Default::default()
        };
        let delta = Metric {
            name: "d".into(),
            data: Some(Data::Sum(metrics::Sum {
                data_points: vec![metrics::NumberDataPoint {
                    attributes: vec![kv("__replica__", "refused")],
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Delta as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let histogram = Metric {
            name: "h".into(),
            data: Some(Data::Histogram(metrics::Histogram {
                data_points: vec![metrics::HistogramDataPoint {
                    attributes: vec![kv("__replica__", "h")],
                    explicit_bounds: vec![1.0],
                    bucket_counts: vec![0, 1],
                    count: 1,
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        };
        let request = |resource_metrics| ExportMetricsServiceRequest { resource_metrics };
        // A resource without points, then a delta sum Mimir refuses, come to nothing: the
        // first series is the next resource's gauge, with its `job`.
        let mimir = OtlpTranslation::default();
        let first = first_series(
            &request(vec![
                resource(vec![kv("__replica__", "none")], vec![]),
                resource(
                    vec![kv("service.name", "api"), kv("__replica__", "resource")],
                    vec![delta.clone(), gauge("a"), gauge("b")],
                ),
            ]),
            &mimir,
        );
        assert_eq!(
            first,
            Some(labels(&[
                ("__name__", "g"),
                ("__replica__", "a"),
                ("cluster", "c"),
                ("job", "api")
            ]))
        );
        // A histogram's first series carries its point's attributes too.
        let first = first_series(
            &request(vec![resource(vec![], vec![histogram, gauge("a")])]),
            &mimir,
        )
        .unwrap();
        assert!(
            first.contains(&("__replica__".to_string(), "h".to_string())),
            "{first:?}"
        );
        // Nothing Mimir translates: no series.
        assert_eq!(
            first_series(&request(vec![resource(vec![], vec![delta])]), &mimir),
            None
        );
    }

    /// `promote_otel_resource_attributes` and `otel_keep_identifying_resource_attributes`, as
    /// the translator's `createAttributes` applies them: a promoted attribute is a label of
    /// every point's series unless the point set that name; `job` and `instance` still win;
    /// `target_info` gets none promoted, and the identifying attributes only when kept.
    #[test]
    fn promoted_and_identifying_attributes_are_labels_as_mimir_makes_them() {
        use super::super::proto::metrics::{self, metric::Data};
        use super::super::proto::resource::Resource;
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", "api"),
                        kv("k8s.namespace.name", "ns"),
                        kv("cluster", "from-resource"),
                        kv("a.b", "first"),
                        kv("a_b", "second"),
                        kv("host.name", "h1"),
                    ],
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics: vec![Metric {
                        name: "g".into(),
                        data: Some(Data::Gauge(metrics::Gauge {
                            data_points: vec![metrics::NumberDataPoint {
                                attributes: vec![kv("cluster", "from-point"), kv("job", "mine")],
                                time_unix_nano: 1_000_000,
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let settings = OtlpTranslation {
            promote_otel_resource_attributes: [
                "k8s.namespace.name",
                "cluster",
                "a_b",
                "a.b",
                "service.name",
                "absent",
            ]
            .map(String::from)
            .to_vec(),
            ..OtlpTranslation::default()
        };
        let translated = translate(&request, &settings, &|_| false, &|_| true);
        assert_eq!(
            translated[0].series,
            vec![labels(&[
                ("__name__", "g"),
                ("a_b", "second"),
                ("cluster", "from-point"),
                ("job", "api"),
                ("k8s_namespace_name", "ns"),
                ("service_name", "api"),
            ])],
            "the point's cluster stays, a_b (later in the resource) is set over a.b, job is the \
             resource's"
        );
        let target_info = |settings: &OtlpTranslation| {
            translate(&request, settings, &|_| false, &|_| true)
                .into_iter()
                .find(|translated| matches!(translated.place, Place::TargetInfo { .. }))
                .unwrap()
                .series
        };
        let info = labels(&[
            ("__name__", "target_info"),
            ("a_b", "first;second"),
            ("cluster", "from-resource"),
            ("host_name", "h1"),
            ("job", "api"),
            ("k8s_namespace_name", "ns"),
        ]);
        assert_eq!(target_info(&settings), vec![info.clone()], "none promoted");
        let keep = OtlpTranslation {
            otel_keep_identifying_resource_attributes: true,
            ..OtlpTranslation::default()
        };
        let mut kept = info;
        kept.push(("service_name".to_string(), "api".to_string()));
        kept.sort();
        assert_eq!(target_info(&keep), vec![kept]);
        // Mimir's defaults: the point's series as before, nothing promoted.
        assert_eq!(
            translate(&request, &OtlpTranslation::default(), &|_| false, &|_| true)[0].series,
            vec![labels(&[
                ("__name__", "g"),
                ("cluster", "from-point"),
                ("job", "api")
            ])]
        );
    }

    #[test]
    fn a_named_scope_is_labels_when_the_tenant_promotes_it() {
        use super::super::proto::common::InstrumentationScope;
        use super::super::proto::metrics::{self, metric::Data};
        use super::super::proto::resource::Resource;
        use prost::Message;
        let scoped = |name: &str, version: &str, url: &str| metrics::ScopeMetrics {
            scope: Some(InstrumentationScope {
                name: name.into(),
                version: version.into(),
                attributes: vec![kv("lib.kind", "http"), kv("point", "from-scope")],
                dropped_attributes_count: 0,
            }),
            schema_url: url.into(),
            metrics: vec![Metric {
                name: "g".into(),
                data: Some(Data::Gauge(metrics::Gauge {
                    data_points: vec![metrics::NumberDataPoint {
                        attributes: vec![kv("otel_scope_point", "from-point")],
                        time_unix_nano: 1_000_000,
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            }],
        };
        let export = |scope| ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "api"), kv("host.name", "h1")],
                    ..Default::default()
                }),
                scope_metrics: vec![scope],
                ..Default::default()
            }],
        };
        let promoting = OtlpTranslation {
            otel_promote_scope_metadata: true,
            ..OtlpTranslation::default()
        };
        let request = export(scoped("io.http", "1.2", "https://schema"));
        let series = translate(&request, &promoting, &|_| false, &|_| true);
        // The scope's attributes over the point's (`otel_scope_point`), escaped; its name,
        // version and schema URL; `target_info` none of them.
        assert_eq!(
            series[0].series,
            vec![labels(&[
                ("__name__", "g"),
                ("job", "api"),
                ("otel_scope_lib_kind", "http"),
                ("otel_scope_name", "io.http"),
                ("otel_scope_point", "from-scope"),
                ("otel_scope_schema_url", "https://schema"),
                ("otel_scope_version", "1.2"),
            ])]
        );
        assert!(series[1].series[0]
            .iter()
            .all(|(name, _)| !name.starts_with("otel_scope")));
        // The first series read from the encoded export has them too.
        assert_eq!(
            first_series_encoded(&request.encode_to_vec(), &promoting).unwrap(),
            Some(series[0].series[0].clone())
        );
        // An empty version or URL is no label; a scope with no name promotes nothing, nor
        // does a tenant that does not promote.
        let bare = export(scoped("io.http", "", ""));
        let names: Vec<String> = translate(&bare, &promoting, &|_| false, &|_| true)[0].series[0]
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        assert!(
            !names.contains(&"otel_scope_version".to_string()),
            "{names:?}"
        );
        assert!(
            !names.contains(&"otel_scope_schema_url".to_string()),
            "{names:?}"
        );
        let plain = vec![labels(&[
            ("__name__", "g"),
            ("job", "api"),
            ("otel_scope_point", "from-point"),
        ])];
        let unnamed = export(scoped("", "1.2", "u"));
        assert_eq!(
            translate(&unnamed, &promoting, &|_| false, &|_| true)[0].series,
            plain
        );
        let default = OtlpTranslation::default();
        assert_eq!(
            translate(&request, &default, &|_| false, &|_| true)[0].series,
            plain
        );
    }

    /// Names with suffixes as Prometheus' `normalizeName` builds them, worked out from its
    /// code (`otlptranslator` as vendored in Mimir 3.0.3).
    #[test]
    fn names_with_suffixes_are_built_as_the_translator_builds_them() {
        let cases = [
            // The unit, `_total` for a monotonic sum, `_ratio` for a gauge of unit 1.
            (
                ("system.filesystem.usage", "By", false, true),
                "system_filesystem_usage_bytes",
            ),
            (
                ("system.network.io", "By", true, false),
                "system_network_io_bytes_total",
            ),
            (
                ("cpu.utilization", "1", false, true),
                "cpu_utilization_ratio",
            ),
            (("cpu.utilization", "1", false, false), "cpu_utilization"),
            (
                ("system.io", "By/s", false, true),
                "system_io_bytes_per_second",
            ),
            (("requests", "1/s", false, true), "requests_per_second"),
            (("latency", "ms", false, false), "latency_milliseconds"),
            // `_` separates words too, and runs of it become one; a word the name has is not
            // added again; `total` and `ratio` move to the end, once.
            (("a__b", "", false, true), "a_b"),
            (
                ("http.duration.seconds", "s", false, true),
                "http_duration_seconds",
            ),
            (("total.requests.total", "", true, false), "requests_total"),
            (("ratio.of.x", "1", false, true), "of_x_ratio"),
            // A unit in braces is none; one outside the map is cleaned as a name's part.
            (("packets", "{packets}", true, false), "packets_total"),
            (("temperature", "°C", false, true), "temperature_C"),
            (("speed", "km/h", false, true), "speed_km_per_hour"),
            // A leading digit; a name with no word, which only a suffix saves.
            (("2xx.count", "", false, true), "_2xx_count"),
            (("...", "", true, false), "total"),
            (("...", "", false, true), ""),
        ];
        names_are(suffixed_name, &cases);
        // The family name refuses what comes out empty; without suffixes, as before.
        let suffixes = |suffixes| Conversion {
            suffixes,
            ..Conversion::default()
        };
        assert_eq!(family_name(gauge("..."), suffixes(true)), None);
        assert_eq!(
            family_name(gauge("___"), suffixes(false)).as_deref(),
            Some("___")
        );
        assert_eq!(
            family_name(gauge("a.b"), suffixes(false)).as_deref(),
            Some("a_b")
        );
    }

    #[test]
    fn values_are_written_as_pdata_writes_them() {
        let any = |value| Some(AnyValue { value: Some(value) });
        assert_eq!(value_string(any(Any::IntValue(-12)).as_ref()), "-12");
        assert_eq!(value_string(any(Any::BoolValue(true)).as_ref()), "true");
        assert_eq!(value_string(any(Any::DoubleValue(1.5)).as_ref()), "1.5");
        let double = |number| value_string(any(Any::DoubleValue(number)).as_ref());
        assert_eq!(double(1e21), "1e+21");
        assert_eq!(double(123456789.0), "123456789");
        assert_eq!(double(-1.2429013403811885e-144), "-1.2429013403811885e-144");
        assert_eq!(double(0.000001), "0.000001");
        assert_eq!(double(-0.0), "-0");
        assert_eq!(double(f64::INFINITY), "json: unsupported value: +Inf");
        assert_eq!(
            value_string(any(Any::BytesValue(vec![0xff, 0x00])).as_ref()),
            "/wA="
        );
        let array = Any::ArrayValue(super::super::proto::common::ArrayValue {
            values: vec![AnyValue {
                value: Some(Any::StringValue("a".into())),
            }],
        });
        assert_eq!(value_string(any(array).as_ref()), r#"["a"]"#);
    }
}
