//! OTLP/JSON (the protobuf JSON mapping with OTLP's rules: lowerCamelCase keys, enums as
//! numbers, 64-bit integers as decimal strings) into the prost types, for the fields the
//! count and the series checks read (the metric names and the resources' and points'
//! attributes among them). Field names in the proto's own snake_case are accepted too, as protobuf JSON
//! parsers do; unknown fields are ignored. The body is still forwarded as sent.

use serde_json::{Map, Value};

use super::proto::{common, metrics, resource, ExportMetricsServiceRequest};
use crate::counts::DecodeError;

pub fn decode(raw: &[u8]) -> Result<ExportMetricsServiceRequest, DecodeError> {
    decode_value(&parse(raw)?)
}

/// The body as JSON.
pub fn parse(raw: &[u8]) -> Result<Value, DecodeError> {
    serde_json::from_slice(raw).map_err(|err| DecodeError::Otlp(format!("invalid JSON: {err}")))
}

/// [`decode`] of a body already parsed.
pub fn decode_value(value: &Value) -> Result<ExportMetricsServiceRequest, DecodeError> {
    let root = object(value, "the request")?;
    Ok(ExportMetricsServiceRequest {
        resource_metrics: list(root, "resourceMetrics", "resource_metrics")?
            .iter()
            .map(resource_metrics)
            .collect::<Result<_, _>>()?,
    })
}

fn error(message: String) -> DecodeError {
    DecodeError::Otlp(format!("invalid OTLP/JSON: {message}"))
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, DecodeError> {
    value
        .as_object()
        .ok_or_else(|| error(format!("{what} is not an object")))
}

/// A field by its JSON name or its proto name; `null` counts as absent.
fn field<'a>(map: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    map.get(camel)
        .or_else(|| map.get(snake))
        .filter(|value| !value.is_null())
}

fn list<'a>(
    map: &'a Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Result<&'a [Value], DecodeError> {
    match field(map, camel, snake) {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(error(format!("{camel} is not an array"))),
    }
}

/// A 64-bit unsigned integer: a decimal string (OTLP's rule) or a JSON number.
fn uint(map: &Map<String, Value>, camel: &str, snake: &str) -> Result<u64, DecodeError> {
    field(map, camel, snake).map_or(Ok(0), |value| uint_of(value, camel))
}

/// [`uint`] of a value (`what` names it in the error).
fn uint_of(value: &Value, what: &str) -> Result<u64, DecodeError> {
    match value {
        Value::String(text) => text
            .parse()
            .map_err(|_| error(format!("{what} {text:?} is not an unsigned integer"))),
        Value::Number(number) => number
            .as_u64()
            .ok_or_else(|| error(format!("{what} {number} is not an unsigned integer"))),
        _ => Err(error(format!("{what} is not an integer"))),
    }
}

fn int(map: &Map<String, Value>, camel: &str, snake: &str) -> Result<i64, DecodeError> {
    match field(map, camel, snake) {
        None => Ok(0),
        Some(Value::String(text)) => text
            .parse()
            .map_err(|_| error(format!("{camel} {text:?} is not an integer"))),
        Some(Value::Number(number)) => number
            .as_i64()
            .ok_or_else(|| error(format!("{camel} {number} is not an integer"))),
        Some(_) => Err(error(format!("{camel} is not an integer"))),
    }
}

/// `aggregationTemporality`: a number, or the enum value's name.
fn temporality(map: &Map<String, Value>) -> Result<i32, DecodeError> {
    match field(map, "aggregationTemporality", "aggregation_temporality") {
        Some(Value::String(name)) => metrics::AggregationTemporality::from_str_name(name)
            .map(|value| value as i32)
            .ok_or_else(|| error(format!("unknown aggregationTemporality {name:?}"))),
        _ => Ok(int(map, "aggregationTemporality", "aggregation_temporality")? as i32),
    }
}

fn resource_metrics(value: &Value) -> Result<metrics::ResourceMetrics, DecodeError> {
    let map = object(value, "a resourceMetrics entry")?;
    let resource = match field(map, "resource", "resource") {
        None => None,
        Some(value) => {
            let attributes = attributes(object(value, "resource")?)?;
            Some(resource::Resource {
                attributes,
                ..Default::default()
            })
        }
    };
    let scope_metrics = list(map, "scopeMetrics", "scope_metrics")?
        .iter()
        .map(|scope| {
            let scope = object(scope, "a scopeMetrics entry")?;
            Ok(metrics::ScopeMetrics {
                metrics: list(scope, "metrics", "metrics")?
                    .iter()
                    .map(metric)
                    .collect::<Result<_, _>>()?,
                ..Default::default()
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(metrics::ResourceMetrics {
        resource,
        scope_metrics,
        ..Default::default()
    })
}

fn metric(value: &Value) -> Result<metrics::Metric, DecodeError> {
    use metrics::metric::Data;
    let map = object(value, "a metric")?;
    let name = match field(map, "name", "name") {
        None => String::new(),
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err(error("a metric's name is not a string".into())),
    };
    let data = if let Some(gauge) = field(map, "gauge", "gauge") {
        let gauge = object(gauge, "gauge")?;
        Some(Data::Gauge(metrics::Gauge {
            data_points: data_points(gauge)?
                .iter()
                .map(number_point)
                .collect::<Result<_, _>>()?,
        }))
    } else if let Some(sum) = field(map, "sum", "sum") {
        let sum = object(sum, "sum")?;
        Some(Data::Sum(metrics::Sum {
            data_points: data_points(sum)?
                .iter()
                .map(number_point)
                .collect::<Result<_, _>>()?,
            aggregation_temporality: temporality(sum)?,
            is_monotonic: matches!(
                field(sum, "isMonotonic", "is_monotonic"),
                Some(Value::Bool(true))
            ),
        }))
    } else if let Some(histogram) = field(map, "histogram", "histogram") {
        let histogram = object(histogram, "histogram")?;
        Some(Data::Histogram(metrics::Histogram {
            data_points: data_points(histogram)?
                .iter()
                .map(histogram_point)
                .collect::<Result<_, _>>()?,
            aggregation_temporality: temporality(histogram)?,
        }))
    } else if let Some(histogram) = field(map, "exponentialHistogram", "exponential_histogram") {
        let histogram = object(histogram, "exponentialHistogram")?;
        Some(Data::ExponentialHistogram(metrics::ExponentialHistogram {
            data_points: data_points(histogram)?
                .iter()
                .map(exponential_point)
                .collect::<Result<_, _>>()?,
            aggregation_temporality: temporality(histogram)?,
        }))
    } else if let Some(summary) = field(map, "summary", "summary") {
        let summary = object(summary, "summary")?;
        Some(Data::Summary(metrics::Summary {
            data_points: data_points(summary)?
                .iter()
                .map(summary_point)
                .collect::<Result<_, _>>()?,
        }))
    } else {
        None
    };
    Ok(metrics::Metric {
        name,
        data,
        ..Default::default()
    })
}

/// An object's `attributes`: each key and its value.
fn attributes(map: &Map<String, Value>) -> Result<Vec<common::KeyValue>, DecodeError> {
    list(map, "attributes", "attributes")?
        .iter()
        .map(key_value)
        .collect()
}

fn key_value(kv: &Value) -> Result<common::KeyValue, DecodeError> {
    let kv = object(kv, "an attribute")?;
    Ok(common::KeyValue {
        key: match field(kv, "key", "key") {
            Some(Value::String(key)) => key.clone(),
            _ => return Err(error("an attribute has no string key".into())),
        },
        value: field(kv, "value", "value").map(any_value).transpose()?,
    })
}

/// An `AnyValue`. A byte string is kept as the base64 text it was sent as: what a label
/// value makes of it.
fn any_value(value: &Value) -> Result<common::AnyValue, DecodeError> {
    use common::any_value::Value as Any;
    let map = object(value, "an attribute's value")?;
    let value = if let Some(text) = field(map, "stringValue", "string_value") {
        match text {
            Value::String(text) => Some(Any::StringValue(text.clone())),
            _ => return Err(error("stringValue is not a string".into())),
        }
    } else if let Some(flag) = field(map, "boolValue", "bool_value") {
        Some(Any::BoolValue(
            flag.as_bool()
                .ok_or_else(|| error("boolValue is not a boolean".into()))?,
        ))
    } else if field(map, "intValue", "int_value").is_some() {
        Some(Any::IntValue(int(map, "intValue", "int_value")?))
    } else if field(map, "doubleValue", "double_value").is_some() {
        Some(Any::DoubleValue(double(
            map,
            "doubleValue",
            "double_value",
        )?))
    } else if let Some(bytes) = field(map, "bytesValue", "bytes_value") {
        match bytes {
            Value::String(text) => Some(Any::StringValue(text.clone())),
            _ => return Err(error("bytesValue is not a string".into())),
        }
    } else if let Some(array) = field(map, "arrayValue", "array_value") {
        Some(Any::ArrayValue(common::ArrayValue {
            values: list(object(array, "arrayValue")?, "values", "values")?
                .iter()
                .map(any_value)
                .collect::<Result<_, _>>()?,
        }))
    } else if let Some(pairs) = field(map, "kvlistValue", "kvlist_value") {
        Some(Any::KvlistValue(common::KeyValueList {
            values: list(object(pairs, "kvlistValue")?, "values", "values")?
                .iter()
                .map(key_value)
                .collect::<Result<_, _>>()?,
        }))
    } else {
        None
    };
    Ok(common::AnyValue { value })
}

fn data_points(data: &Map<String, Value>) -> Result<&[Value], DecodeError> {
    list(data, "dataPoints", "data_points")
}

/// A point's exemplars: their time, ids, filtered attributes and value, which Mimir's
/// exemplar checks read.
fn exemplars(map: &Map<String, Value>) -> Result<Vec<metrics::Exemplar>, DecodeError> {
    use metrics::exemplar::Value as Number;
    list(map, "exemplars", "exemplars")?
        .iter()
        .map(|item| {
            let map = object(item, "an exemplar")?;
            let value = if field(map, "asInt", "as_int").is_some() {
                Some(Number::AsInt(int(map, "asInt", "as_int")?))
            } else if field(map, "asDouble", "as_double").is_some() {
                Some(Number::AsDouble(double(map, "asDouble", "as_double")?))
            } else {
                None
            };
            Ok(metrics::Exemplar {
                time_unix_nano: time(map)?,
                span_id: id(map, "spanId", "span_id")?,
                trace_id: id(map, "traceId", "trace_id")?,
                filtered_attributes: list(map, "filteredAttributes", "filtered_attributes")?
                    .iter()
                    .map(key_value)
                    .collect::<Result<_, _>>()?,
                value,
            })
        })
        .collect()
}

/// A trace or a span id: hex in OTLP/JSON, where other bytes are base64.
fn id(map: &Map<String, Value>, camel: &str, snake: &str) -> Result<Vec<u8>, DecodeError> {
    let hex = match field(map, camel, snake) {
        None => return Ok(Vec::new()),
        Some(Value::String(hex)) => hex,
        Some(_) => return Err(error(format!("{camel} is not a string"))),
    };
    let digit = |c: u8| (c as char).to_digit(16);
    if hex.len() % 2 != 0 {
        return Err(error(format!("{camel} {hex:?} is not hex")));
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| match (digit(pair[0]), digit(pair[1])) {
            (Some(high), Some(low)) => Ok((high * 16 + low) as u8),
            _ => Err(error(format!("{camel} {hex:?} is not hex"))),
        })
        .collect()
}

fn time(map: &Map<String, Value>) -> Result<u64, DecodeError> {
    uint(map, "timeUnixNano", "time_unix_nano")
}

/// A double: a JSON number, or a string of one or of `NaN`, `Infinity`, `-Infinity` (the
/// protobuf JSON mapping).
fn double(map: &Map<String, Value>, camel: &str, snake: &str) -> Result<f64, DecodeError> {
    match field(map, camel, snake) {
        None => Ok(0.0),
        Some(Value::Number(number)) => Ok(number.as_f64().unwrap_or(0.0)),
        Some(Value::String(text)) => match text.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => other
                .parse()
                .map_err(|_| error(format!("{camel} {text:?} is not a number"))),
        },
        Some(_) => Err(error(format!("{camel} is not a number"))),
    }
}

fn number_point(value: &Value) -> Result<metrics::NumberDataPoint, DecodeError> {
    let map = object(value, "a data point")?;
    // Not counted, but a value no decoder reads is an invalid export, as Mimir answers it.
    int(map, "asInt", "as_int")?;
    double(map, "asDouble", "as_double")?;
    Ok(metrics::NumberDataPoint {
        attributes: attributes(map)?,
        time_unix_nano: time(map)?,
        exemplars: exemplars(map)?,
        ..Default::default()
    })
}

fn histogram_point(value: &Value) -> Result<metrics::HistogramDataPoint, DecodeError> {
    let map = object(value, "a histogram data point")?;
    let bounds = list(map, "explicitBounds", "explicit_bounds")?.len();
    let buckets = list(map, "bucketCounts", "bucket_counts")?.len();
    Ok(metrics::HistogramDataPoint {
        attributes: attributes(map)?,
        time_unix_nano: time(map)?,
        exemplars: exemplars(map)?,
        explicit_bounds: vec![0.0; bounds],
        bucket_counts: vec![0; buckets],
        sum: field(map, "sum", "sum").map(|_| 0.0),
        ..Default::default()
    })
}

fn exponential_point(value: &Value) -> Result<metrics::ExponentialHistogramDataPoint, DecodeError> {
    let map = object(value, "an exponential histogram data point")?;
    let scale = int(map, "scale", "scale")?;
    let buckets = |camel: &str| -> Result<_, DecodeError> {
        let Some(buckets) = field(map, camel, camel) else {
            return Ok(None);
        };
        let buckets = object(buckets, camel)?;
        let offset = int(buckets, "offset", "offset")?;
        Ok(Some(metrics::exponential_histogram_data_point::Buckets {
            offset: i32::try_from(offset)
                .map_err(|_| error(format!("offset {offset} is out of range")))?,
            bucket_counts: list(buckets, "bucketCounts", "bucket_counts")?
                .iter()
                .map(|count| uint_of(count, "a bucket count"))
                .collect::<Result<_, _>>()?,
        }))
    };
    Ok(metrics::ExponentialHistogramDataPoint {
        attributes: attributes(map)?,
        count: uint(map, "count", "count")?,
        zero_count: uint(map, "zeroCount", "zero_count")?,
        positive: buckets("positive")?,
        negative: buckets("negative")?,
        time_unix_nano: time(map)?,
        exemplars: exemplars(map)?,
        scale: i32::try_from(scale).map_err(|_| error(format!("scale {scale} is out of range")))?,
        ..Default::default()
    })
}

fn summary_point(value: &Value) -> Result<metrics::SummaryDataPoint, DecodeError> {
    let map = object(value, "a summary data point")?;
    let quantiles = list(map, "quantileValues", "quantile_values")?.len();
    Ok(metrics::SummaryDataPoint {
        attributes: attributes(map)?,
        time_unix_nano: time(map)?,
        quantile_values: vec![Default::default(); quantiles],
        ..Default::default()
    })
}
