//! Changes to an OTLP export before it is forwarded: refused data points cut, attributes cut,
//! given a shorter value or added (the labels a cut `target_info` takes from its resource's
//! points), exponential histograms lowered in resolution, exemplars cut.
//! Made on the decoded request (which is then counted again and, for a protobuf body,
//! encoded) and, for a JSON body, on its JSON too, so that the forwarded JSON keeps every field
//! the decode did not read. An export whose only change is its exemplars going is edited on
//! the wire instead ([`without_exemplars`]): no decode, every other byte as sent.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::proto::{
    common::{any_value::Value as Any, AnyValue, KeyValue},
    metrics::{exponential_histogram_data_point::Buckets, metric::Data, Exemplar},
    ExportMetricsServiceRequest,
};
use super::translate::Place;

/// One attribute: a resource's (`point: None`) or a data point's (its scope, metric, point).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttributeAt {
    pub resource: usize,
    pub point: Option<(usize, usize, usize)>,
    pub attribute: usize,
}

/// What to change. Indices are the request's as sent.
#[derive(Debug, Default)]
pub struct Edits {
    /// Data points cut (only [`Place::Point`]s).
    pub points: HashSet<Place>,
    pub removed: HashSet<AttributeAt>,
    /// Attributes whose value becomes this string.
    pub values: HashMap<AttributeAt, String>,
    /// String attributes added to a data point (only [`Place::Point`]s), after its own: the
    /// labels a cut `target_info` took from its resource.
    pub added: HashMap<Place, Vec<(String, String)>>,
    /// Exponential histogram points given a lower resolution.
    pub histograms: HashMap<Place, Resolution>,
    /// Every data point's exemplars cut: the tenant's exemplars are off.
    pub exemplars: bool,
    /// Exemplars cut one by one, by their point and their index there: those Mimir's
    /// exemplar checks drop.
    pub exemplar_cuts: HashSet<(Place, usize)>,
}

/// An exponential histogram point's scale and buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub scale: i32,
    pub positive: Buckets,
    pub negative: Buckets,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        !self.exemplars && self.leaves_points()
    }

    /// Whether the only change is the exemplars going ([`without_exemplars`] makes it).
    pub fn only_exemplars(&self) -> bool {
        self.exemplars && self.leaves_points()
    }

    /// Whether every point, attribute and exemplar stays as sent but for [`Self::exemplars`].
    fn leaves_points(&self) -> bool {
        self.points.is_empty()
            && self.removed.is_empty()
            && self.values.is_empty()
            && self.added.is_empty()
            && self.histograms.is_empty()
            && self.exemplar_cuts.is_empty()
    }

    /// Whether the exemplar at `index` of the point at `place` goes.
    fn cuts_exemplar(&self, place: Place, index: usize) -> bool {
        self.exemplars || self.exemplar_cuts.contains(&(place, index))
    }

    fn attributes_at<'e>(
        &'e self,
        resource: usize,
        point: Option<(usize, usize, usize)>,
    ) -> impl Fn(usize) -> (bool, Option<&'e String>) + 'e {
        move |attribute| {
            let at = AttributeAt {
                resource,
                point,
                attribute,
            };
            (self.removed.contains(&at), self.values.get(&at))
        }
    }

    /// The attributes added to the point at `place`.
    fn added_at(&self, place: Place) -> &[(String, String)] {
        self.added.get(&place).map_or(&[], Vec::as_slice)
    }

    /// Cuts the points to cut from `points`, the point at index `p` being `place(p)`.
    fn cut_points<T>(&self, points: &mut Vec<T>, place: impl Fn(usize) -> Place) {
        let mut p = 0;
        points.retain(|_| {
            p += 1;
            !self.points.contains(&place(p - 1))
        });
    }

    /// The changes made to a decoded request.
    pub fn apply(&self, request: &mut ExportMetricsServiceRequest) {
        if self.exemplars || !self.exemplar_cuts.is_empty() {
            each_point_exemplars(request, |place, exemplars| {
                let mut index = 0;
                exemplars.retain(|_| {
                    index += 1;
                    !self.cuts_exemplar(place, index - 1)
                });
            });
        }
        for (r, resource) in request.resource_metrics.iter_mut().enumerate() {
            if let Some(resource) = resource.resource.as_mut() {
                edit_attributes(&mut resource.attributes, self.attributes_at(r, None));
            }
            for (s, scope) in resource.scope_metrics.iter_mut().enumerate() {
                for (m, metric) in scope.metrics.iter_mut().enumerate() {
                    let Some(data) = metric.data.as_mut() else {
                        continue;
                    };
                    macro_rules! points {
                        ($points:expr) => {{
                            for (p, point) in $points.iter_mut().enumerate() {
                                edit_attributes(
                                    &mut point.attributes,
                                    self.attributes_at(r, Some((s, m, p))),
                                );
                                for (key, value) in self.added_at(point_at(r, s, m, p)) {
                                    point.attributes.push(KeyValue {
                                        key: key.clone(),
                                        value: Some(AnyValue {
                                            value: Some(Any::StringValue(value.clone())),
                                        }),
                                    });
                                }
                            }
                            self.cut_points(&mut $points, |p| point_at(r, s, m, p));
                        }};
                    }
                    match data {
                        Data::Gauge(gauge) => points!(gauge.data_points),
                        Data::Sum(sum) => points!(sum.data_points),
                        Data::Histogram(histogram) => points!(histogram.data_points),
                        Data::ExponentialHistogram(histogram) => {
                            for (p, point) in histogram.data_points.iter_mut().enumerate() {
                                if let Some(resolution) = self.histograms.get(&point_at(r, s, m, p))
                                {
                                    point.scale = resolution.scale;
                                    point.positive = Some(resolution.positive.clone());
                                    point.negative = Some(resolution.negative.clone());
                                }
                            }
                            points!(histogram.data_points)
                        }
                        Data::Summary(summary) => points!(summary.data_points),
                    }
                }
            }
        }
    }

    /// The same changes made to the request's OTLP/JSON (keys in lowerCamelCase or the
    /// proto's snake_case, as [`super::json`] reads them).
    pub fn apply_json(&self, root: &mut Value) {
        for (r, resource) in list_mut(root, "resourceMetrics", "resource_metrics")
            .iter_mut()
            .enumerate()
        {
            if let Some(inner) = field_mut(resource, "resource", "resource") {
                edit_json_attributes(inner, self.attributes_at(r, None));
            }
            for (s, scope) in list_mut(resource, "scopeMetrics", "scope_metrics")
                .iter_mut()
                .enumerate()
            {
                for (m, metric) in list_mut(scope, "metrics", "metrics").iter_mut().enumerate() {
                    let Some(data) = DATA_FIELDS
                        .iter()
                        .find_map(|(camel, snake)| {
                            metric
                                .as_object()
                                .and_then(|map| present(map, camel, snake))
                        })
                        .map(str::to_string)
                    else {
                        continue;
                    };
                    let Some(data) = metric.get_mut(&data) else {
                        continue;
                    };
                    let Some(points) = vec_mut(data, "dataPoints", "data_points") else {
                        continue;
                    };
                    for (p, point) in points.iter_mut().enumerate() {
                        edit_json_attributes(point, self.attributes_at(r, Some((s, m, p))));
                        let place = point_at(r, s, m, p);
                        add_json_attributes(point, self.added_at(place));
                        if let Some(exemplars) = vec_mut(point, "exemplars", "exemplars") {
                            let mut index = 0;
                            exemplars.retain(|_| {
                                index += 1;
                                !self.cuts_exemplar(place, index - 1)
                            });
                        }
                        if let (true, Some(point)) = (self.exemplars, point.as_object_mut()) {
                            point.remove("exemplars");
                        }
                        if let (Some(resolution), Some(point)) = (
                            self.histograms.get(&point_at(r, s, m, p)),
                            point.as_object_mut(),
                        ) {
                            let buckets = |buckets: &Buckets| {
                                serde_json::json!({
                                    "offset": buckets.offset,
                                    "bucketCounts": buckets
                                        .bucket_counts
                                        .iter()
                                        .map(u64::to_string)
                                        .collect::<Vec<_>>(),
                                })
                            };
                            for name in ["positive", "negative", "scale"] {
                                point.remove(name);
                            }
                            point.insert("scale".into(), resolution.scale.into());
                            point.insert("positive".into(), buckets(&resolution.positive));
                            point.insert("negative".into(), buckets(&resolution.negative));
                        }
                    }
                    self.cut_points(points, |p| point_at(r, s, m, p));
                }
            }
        }
    }
}

/// The place of a data point, by its resource, scope, metric and index.
pub fn point_at(resource: usize, scope: usize, metric: usize, point: usize) -> Place {
    Place::Point {
        resource,
        scope,
        metric,
        point,
    }
}

/// The `data` oneof's JSON names, in the order [`super::json`] looks for them.
const DATA_FIELDS: [(&str, &str); 5] = [
    ("gauge", "gauge"),
    ("sum", "sum"),
    ("histogram", "histogram"),
    ("exponentialHistogram", "exponential_histogram"),
    ("summary", "summary"),
];

fn edit_attributes<'e>(
    attributes: &mut Vec<KeyValue>,
    at: impl Fn(usize) -> (bool, Option<&'e String>),
) {
    let mut index = 0;
    attributes.retain_mut(|kv| {
        let (removed, value) = at(index);
        index += 1;
        if let Some(value) = value {
            kv.value = Some(AnyValue {
                value: Some(Any::StringValue(value.clone())),
            });
        }
        !removed
    });
}

fn edit_json_attributes<'e>(object: &mut Value, at: impl Fn(usize) -> (bool, Option<&'e String>)) {
    let Some(attributes) = vec_mut(object, "attributes", "attributes") else {
        return;
    };
    for (index, kv) in attributes.iter_mut().enumerate() {
        if let (Some(value), Some(kv)) = (at(index).1, kv.as_object_mut()) {
            kv.insert(
                "value".to_string(),
                serde_json::json!({ "stringValue": value }),
            );
        }
    }
    let mut index = 0;
    attributes.retain(|_| {
        index += 1;
        !at(index - 1).0
    });
}

fn add_json_attributes(point: &mut Value, added: &[(String, String)]) {
    if added.is_empty() {
        return;
    }
    if vec_mut(point, "attributes", "attributes").is_none() {
        if let Some(point) = point.as_object_mut() {
            point.remove("attributes");
            point.insert("attributes".to_string(), Value::Array(Vec::new()));
        }
    }
    if let Some(attributes) = vec_mut(point, "attributes", "attributes") {
        attributes.extend(added.iter().map(
            |(key, value)| serde_json::json!({ "key": key, "value": { "stringValue": value } }),
        ));
    }
}

/// Which of a field's two names an object has (not `null`), as [`super::json`] reads it.
fn present<'n>(map: &Map<String, Value>, camel: &'n str, snake: &'n str) -> Option<&'n str> {
    [camel, snake]
        .into_iter()
        .find(|name| map.get(*name).is_some_and(|value| !value.is_null()))
}

fn field_mut<'v>(value: &'v mut Value, camel: &str, snake: &str) -> Option<&'v mut Value> {
    let name = present(value.as_object()?, camel, snake)?.to_string();
    value.get_mut(&name)
}

/// A list field's items; none when it is absent (the decode has checked its type).
fn list_mut<'v>(value: &'v mut Value, camel: &str, snake: &str) -> &'v mut [Value] {
    match field_mut(value, camel, snake) {
        Some(Value::Array(items)) => items,
        _ => &mut [],
    }
}

/// [`list_mut`], to cut items from.
fn vec_mut<'v>(value: &'v mut Value, camel: &str, snake: &str) -> Option<&'v mut Vec<Value>> {
    match field_mut(value, camel, snake) {
        Some(Value::Array(items)) => Some(items),
        _ => None,
    }
}

/// Cuts every data point's exemplars from a decoded request; returns whether it had any.
pub fn clear_exemplars(request: &mut ExportMetricsServiceRequest) -> bool {
    let mut any = false;
    each_point_exemplars(request, |_, exemplars| {
        any |= !exemplars.is_empty();
        exemplars.clear();
    });
    any
}

/// Each data point's exemplars (a gauge's, a sum's, a histogram's, an exponential
/// histogram's), with the point's place, in request order.
fn each_point_exemplars(
    request: &mut ExportMetricsServiceRequest,
    mut each: impl FnMut(Place, &mut Vec<Exemplar>),
) {
    for (r, resource) in request.resource_metrics.iter_mut().enumerate() {
        for (s, scope) in resource.scope_metrics.iter_mut().enumerate() {
            for (m, metric) in scope.metrics.iter_mut().enumerate() {
                let mut each =
                    |p, exemplars: &mut Vec<Exemplar>| each(point_at(r, s, m, p), exemplars);
                macro_rules! points {
                    ($points:expr) => {
                        for (p, point) in $points.iter_mut().enumerate() {
                            each(p, &mut point.exemplars);
                        }
                    };
                }
                match &mut metric.data {
                    Some(Data::Gauge(gauge)) => points!(gauge.data_points),
                    Some(Data::Sum(sum)) => points!(sum.data_points),
                    Some(Data::Histogram(histogram)) => points!(histogram.data_points),
                    Some(Data::ExponentialHistogram(histogram)) => points!(histogram.data_points),
                    Some(Data::Summary(_)) | None => {}
                }
            }
        }
    }
}

/// The protobuf export `raw`, which the scan has read, without its data points' exemplars;
/// `None` when it has none. Every other byte stays as sent, unknown fields too: only the
/// length of each message around a cut exemplar is written again. It costs a walk down to the
/// data points and a copy, where a decode and an encode cost ten times as much.
pub fn without_exemplars(raw: &[u8]) -> Result<Option<Vec<u8>>, String> {
    strip(raw, Level::Request)
}

/// Where a message lies on the way from the request to a data point's exemplars.
#[derive(Debug, Clone, Copy)]
enum Level {
    Request,
    Resource,
    Scope,
    Metric,
    /// A `Gauge`, `Sum`, `Histogram` or `ExponentialHistogram`, whose points carry their
    /// exemplars in field `exemplars`.
    Data {
        exemplars: u32,
    },
    Point {
        exemplars: u32,
    },
}

/// What becomes of a field of a message at some [`Level`].
enum Step {
    Into(Level),
    Cut,
    Keep,
}

impl Level {
    fn step(self, tag: u32, wire_type: prost::encoding::WireType) -> Step {
        if wire_type != prost::encoding::WireType::LengthDelimited {
            return Step::Keep;
        }
        match (self, tag) {
            (Level::Request, 1) => Step::Into(Level::Resource),
            (Level::Resource, 2) => Step::Into(Level::Scope),
            (Level::Scope, 2) => Step::Into(Level::Metric),
            // A number point's exemplars are its field 5, a histogram point's 8, an
            // exponential histogram point's 11; a summary point has none.
            (Level::Metric, 5 | 7) => Step::Into(Level::Data { exemplars: 5 }),
            (Level::Metric, 9) => Step::Into(Level::Data { exemplars: 8 }),
            (Level::Metric, 10) => Step::Into(Level::Data { exemplars: 11 }),
            (Level::Data { exemplars }, 1) => Step::Into(Level::Point { exemplars }),
            (Level::Point { exemplars }, tag) if tag == exemplars => Step::Cut,
            _ => Step::Keep,
        }
    }
}

/// The message `buf` at `level` with its exemplars cut, or `None` when nothing in it is.
fn strip(buf: &[u8], level: Level) -> Result<Option<Vec<u8>>, String> {
    use prost::encoding::{decode_key, decode_varint, encode_varint, skip_field, DecodeContext};
    let mut out: Option<Vec<u8>> = None;
    // The output, begun with what came before `at` the first time something changes.
    let begun = |out: &mut Option<Vec<u8>>, at: usize| {
        out.take().unwrap_or_else(|| {
            let mut begun = Vec::with_capacity(buf.len());
            begun.extend_from_slice(&buf[..at]);
            begun
        })
    };
    let mut rest = buf;
    while !rest.is_empty() {
        let start = buf.len() - rest.len();
        let (tag, wire_type) = decode_key(&mut rest).map_err(|err| err.to_string())?;
        let step = level.step(tag, wire_type);
        if let Step::Into(inner) = step {
            let key_end = buf.len() - rest.len();
            let length = decode_varint(&mut rest).map_err(|err| err.to_string())?;
            let body = rest
                .get(..length as usize)
                .ok_or_else(|| format!("field {tag} is longer than its message"))?;
            rest = &rest[body.len()..];
            let end = buf.len() - rest.len();
            match strip(body, inner)? {
                Some(body) => {
                    let mut written = begun(&mut out, start);
                    written.extend_from_slice(&buf[start..key_end]);
                    encode_varint(body.len() as u64, &mut written);
                    written.extend_from_slice(&body);
                    out = Some(written);
                }
                None => {
                    if let Some(out) = out.as_mut() {
                        out.extend_from_slice(&buf[start..end]);
                    }
                }
            }
            continue;
        }
        skip_field(wire_type, tag, &mut rest, DecodeContext::default())
            .map_err(|err| err.to_string())?;
        let end = buf.len() - rest.len();
        match step {
            Step::Cut => out = Some(begun(&mut out, start)),
            _ => {
                if let Some(out) = out.as_mut() {
                    out.extend_from_slice(&buf[start..end]);
                }
            }
        }
    }
    Ok(out)
}
