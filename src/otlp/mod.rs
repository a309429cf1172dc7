//! OTLP/HTTP metrics (`POST /otlp/v1/metrics`): the body's encoding from its headers, its
//! compression (gzip, lz4, zstd),
//! and what an `ExportMetricsServiceRequest` costs, counted the way Grafana Mimir charges it.
//!
//! Mimir translates OTLP into Prometheus series and charges the tenant's ingestion rate with
//! samples + histograms + exemplars + metadata of the result. weir forwards OTLP, so it does
//! not translate what it forwards; it counts what the translation would produce:
//!
//! | data point | samples | histograms | exemplars |
//! | --- | --- | --- | --- |
//! | gauge | 1 | | (not translated) |
//! | sum, cumulative | 1 | | each |
//! | histogram, cumulative | one per bucket (bounds + `+Inf`), `_count`, `_sum` if set | | each |
//! | exponential histogram, cumulative | | 1 (a native histogram) | each |
//! | summary | one per quantile, `_sum`, `_count` | | |
//!
//! Plus the metadata entries the translation makes ([`translate::MetadataEntries`]: one per metric
//! family that has points, and another when a later metric of the family brings another type, unit
//! or help), and per resource the `target_info` series Mimir adds (see `rules::TargetInfoTimes`; its samples
//! charged once a millisecond when resources make the same one, `rules::TargetInfoSeen`).
//! Delta or unspecified temporality, an exponential scale below -4, a metric with no data or no data points and a
//! name that escapes to no metric name ([`name_refused`]) are what Mimir's translator refuses: such
//! a metric costs nothing, and a request where nothing else is left is a 400. Two of a tenant's
//! translation settings change that ([`Conversion`]): `otel_native_delta_ingestion` takes delta
//! sums and histograms (their metadata type `unknown`), and `otel_convert_histograms_to_nhcb`
//! makes a classic histogram's point one native histogram with custom buckets (1 histogram). The counts include
//! every exemplar the translation would carry; [`crate::format::decode_validated`] charges none of
//! them for a tenant with exemplars off (`max_global_exemplars_per_user: 0`, Mimir's default, which
//! drops them before its limiter) and cuts them from the forwarded export
//! ([`edit::without_exemplars`]); for a tenant with exemplars on, those Mimir's exemplar checks
//! drop are cut ([`crate::otlp_checks`]) and the rest charged.
//!
//! A protobuf body is counted by [`scan`], a zero-copy walk of the wire format, and never
//! decoded: the count is all weir needs from it, as the forward sends the client's bytes.
//! The same walk measures the labels the request's series can have ([`scan_bounded`],
//! [`Bounds`]): Mimir's series checks ([`crate::otlp_checks`]) translate the series of a
//! request ([`translate`]) and cut the failing points ([`edit`]) only when those bounds say a
//! series could fail.
//! [`count`] of a full prost decode is the reference the scan is held to (the `otlp_scan`
//! fuzz target and the property tests in `tests.rs`) and the baseline `benches/hot_path.rs`
//! measures it against. OTLP/JSON is still decoded in full ([`json`]) and counted by [`count`].

pub mod edit;
pub mod json;
pub mod proto;
mod rules;
mod scan;
pub mod translate;

pub use rules::{Bounds, Conversion, TimeRange};
pub use scan::{scan, scan_bounded};

use std::borrow::Cow;
use std::io::Read;

use prost::Message;

use crate::counts::{DecodeError, UnsupportedMedia, WriteCounts};
use proto::metrics::{metric::Data, Metric};
use rules::{
    nothing_ingested, TargetInfoTimes, NOT_CUMULATIVE, NO_DATA, NO_NAME, NO_POINTS, TARGET_INFO,
};
use runtime_config::OtlpTranslation;
use translate::{Meta, MetadataEntries, MetricType, Naming};

/// How an OTLP body is encoded, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtlpFormat {
    /// `application/json` (OTLP/JSON); otherwise `application/x-protobuf`.
    pub json: bool,
    /// Its `Content-Encoding`.
    pub compression: Compression,
}

/// The `Content-Encoding`s Mimir's OTLP handler reads, and so weir: none, gzip, and the LZ4
/// and Zstandard frame formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Lz4,
    Zstd,
}

impl Compression {
    /// The `Content-Encoding` header's value, or none for an uncompressed body.
    pub fn header(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Gzip => Some("gzip"),
            Compression::Lz4 => Some("lz4"),
            Compression::Zstd => Some("zstd"),
        }
    }
}

impl OtlpFormat {
    /// Uncompressed protobuf: OTLP's default encoding.
    pub const PROTOBUF: OtlpFormat = OtlpFormat {
        json: false,
        compression: Compression::None,
    };

    pub fn from_headers(
        content_type: Option<&[u8]>,
        content_encoding: Option<&[u8]>,
    ) -> Result<OtlpFormat, UnsupportedMedia> {
        let compression = match content_encoding.map(|value| String::from_utf8_lossy(value)) {
            None => Compression::None,
            Some(encoding) => match encoding.trim().to_ascii_lowercase().as_str() {
                "" | "identity" => Compression::None,
                "gzip" => Compression::Gzip,
                "lz4" => Compression::Lz4,
                "zstd" => Compression::Zstd,
                other => {
                    return Err(UnsupportedMedia(format!(
                        "unsupported Content-Encoding {other:?} for OTLP: weir accepts gzip, \
                         lz4, zstd or no compression"
                    )))
                }
            },
        };
        let content_type = content_type
            .map(|value| String::from_utf8_lossy(value).to_string())
            .unwrap_or_default();
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        let json = if media_type.eq_ignore_ascii_case("application/x-protobuf") {
            false
        } else if media_type.eq_ignore_ascii_case("application/json") {
            true
        } else {
            return Err(UnsupportedMedia(format!(
                "unsupported Content-Type {content_type:?} for OTLP: weir accepts \
                 application/x-protobuf and application/json"
            )));
        };
        Ok(OtlpFormat { json, compression })
    }

    /// The `Content-Type` of answers to this request: OTLP/HTTP answers in the request's.
    pub fn content_type(self) -> &'static str {
        if self.json {
            "application/json"
        } else {
            "application/x-protobuf"
        }
    }

    /// A successful export's answer: an empty `ExportMetricsServiceResponse`.
    pub fn success_body(self) -> &'static [u8] {
        if self.json {
            b"{}"
        } else {
            b""
        }
    }

    /// An error's answer: a `google.rpc.Status` with `code` (a gRPC code) and `message`.
    pub fn status_body(self, code: i32, message: &str) -> Vec<u8> {
        if self.json {
            serde_json::json!({ "code": code, "message": message })
                .to_string()
                .into_bytes()
        } else {
            RpcStatus {
                code,
                message: message.to_string(),
            }
            .encode_to_vec()
        }
    }
}

/// `google.rpc.Status` without `details`, which weir never sends.
#[derive(Clone, PartialEq, Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The gRPC code an OTLP error body carries for an HTTP status (OTLP clients act on the
/// HTTP status only; the code is for people reading logs).
pub fn grpc_code(status: u16) -> i32 {
    match status {
        400 | 413 | 415 => 3, // INVALID_ARGUMENT
        401 => 16,            // UNAUTHENTICATED
        429 => 8,             // RESOURCE_EXHAUSTED
        504 => 4,             // DEADLINE_EXCEEDED
        500..=599 => 14,      // UNAVAILABLE
        _ => 2,               // UNKNOWN
    }
}

/// Decompresses (at most `max_size` bytes out) and counts an OTLP metrics body under
/// Mimir's default translation: a protobuf body with [`scan`], without decoding it; OTLP/JSON
/// decoded in full and [`count`]ed.
pub fn decode(
    body: &[u8],
    max_size: usize,
    format: OtlpFormat,
) -> Result<WriteCounts, DecodeError> {
    let raw = inflate(body, max_size, format)?;
    let settings = OtlpTranslation::default();
    if format.json {
        count(&json::decode(&raw)?, &settings)
    } else {
        scan(&raw, &settings)
    }
}

/// [`decode`] with a full prost decode of protobuf bodies instead of the scan: the reference
/// the scan is held to, and the baseline it is measured against.
pub fn decode_full(
    body: &[u8],
    max_size: usize,
    format: OtlpFormat,
) -> Result<WriteCounts, DecodeError> {
    let raw = inflate(body, max_size, format)?;
    let request = if format.json {
        json::decode(&raw)?
    } else {
        proto::ExportMetricsServiceRequest::decode(&raw[..])
            .map_err(|err| DecodeError::Otlp(format!("invalid protobuf: {err}")))?
    };
    count(&request, &OtlpTranslation::default())
}

/// The body as sent, or decompressed into at most `max_size` bytes. Every gzip member, LZ4
/// frame or Zstandard frame is read, as Go's readers (Mimir's) read them: a body of several is
/// one export, charged and held to the size limit whole. Bytes after the last that are not one
/// are an error.
pub fn inflate(
    body: &[u8],
    max_size: usize,
    format: OtlpFormat,
) -> Result<Cow<'_, [u8]>, DecodeError> {
    let name = match format.compression.header() {
        None => return Ok(Cow::Borrowed(body)),
        Some(name) => name,
    };
    let invalid =
        |err: &dyn std::fmt::Display| DecodeError::Otlp(format!("invalid {name} body: {err}"));
    let mut out = Vec::new();
    // Reads `reader` to its end into `out`, one byte past the limit at most.
    let read = |reader: &mut dyn Read, out: &mut Vec<u8>| {
        let room = (max_size + 1).saturating_sub(out.len()) as u64;
        reader
            .take(room)
            .read_to_end(out)
            .map_err(|err| invalid(&err))
    };
    match format.compression {
        Compression::None => unreachable!("returned above"),
        Compression::Gzip => {
            read(&mut flate2::read::MultiGzDecoder::new(body), &mut out)?;
        }
        Compression::Zstd => {
            let mut decoder =
                zstd::stream::read::Decoder::with_buffer(body).map_err(|err| invalid(&err))?;
            read(&mut decoder, &mut out)?;
        }
        Compression::Lz4 => {
            // lz4_flex's decoder ends with its frame; Go's reads on into the next.
            let mut rest = body;
            while !rest.is_empty() && out.len() <= max_size {
                let before = rest.len();
                let read_now = read(&mut lz4_flex::frame::FrameDecoder::new(&mut rest), &mut out)?;
                // Fewer bytes than any frame is long, taken for nothing: a frame cut short
                // after its magic number, which the decoder reads as the end.
                if read_now == 0 && before - rest.len() < LZ4_SHORTEST_FRAME {
                    return Err(invalid(&"a frame cut short"));
                }
            }
        }
    }
    if out.len() > max_size {
        return Err(DecodeError::TooLarge {
            size: None,
            limit: max_size,
        });
    }
    Ok(Cow::Owned(out))
}

/// Magic number, frame descriptor and end mark: an empty LZ4 frame.
const LZ4_SHORTEST_FRAME: usize = 4 + 3 + 4;

/// `bytes` compressed as `compression` compresses them: how an edited export is forwarded in
/// the encoding its client sent.
pub fn compress(bytes: Vec<u8>, compression: Compression) -> Vec<u8> {
    use std::io::Write;
    const IN_MEMORY: &str = "compressing into memory does not fail";
    match compression {
        Compression::None => bytes,
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&bytes).expect(IN_MEMORY);
            encoder.finish().expect(IN_MEMORY)
        }
        Compression::Lz4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder.write_all(&bytes).expect(IN_MEMORY);
            encoder.finish().expect(IN_MEMORY)
        }
        Compression::Zstd => zstd::bulk::compress(&bytes, 1).expect(IN_MEMORY),
    }
}

/// What the request costs, as Mimir's translation under the tenant's `settings` and its
/// limiter count it.
pub fn count(
    request: &proto::ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> Result<WriteCounts, DecodeError> {
    count_left_out(request, settings).map(|(counts, _)| counts)
}

/// [`count`], with each metric the translator leaves out of a request it translates the rest
/// of, and why (`metric "name": why`), in request order.
pub fn count_left_out(
    request: &proto::ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> Result<(WriteCounts, Vec<String>), DecodeError> {
    let (counts, refused) = walk(request, settings, |_| {});
    if counts.cost() == 0 && !refused.is_empty() {
        return Err(nothing_ingested(&refused));
    }
    Ok((counts, refused))
}

/// The metrics whose metadata entries Mimir's translation makes, in request order: the first
/// metric with points the translator takes of each family, and each later one of the family
/// with another type, unit or help ([`translate::MetadataEntries`]). (`target_info`'s entries,
/// the others it makes, have a fixed name and no unit.)
pub fn metadata_metrics<'r>(
    request: &'r proto::ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> Vec<&'r Metric> {
    let mut metrics = Vec::new();
    walk(request, settings, |metric| metrics.extend(metric));
    metrics
}

/// Counts `request` as [`count`] does, calling `family` for each metadata entry it charges,
/// with the metric that makes it (`None` for `target_info`);
/// returns the counts and each metric the translator refuses, with why.
fn walk<'r>(
    request: &'r proto::ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
    mut family: impl FnMut(Option<&'r Metric>),
) -> (WriteCounts, Vec<String>) {
    let conversion = Conversion::of(settings);
    let mut target_infos = Vec::new();
    let mut counts = WriteCounts::default();
    let mut entries = MetadataEntries::new(conversion);
    let mut refused: Vec<String> = Vec::new();
    for resource in &request.resource_metrics {
        let mut times = TimeRange::default();
        for metric in resource
            .scope_metrics
            .iter()
            .flat_map(|scope| &scope.metrics)
        {
            // Charged only once the translator's name rule passes.
            let mut own = WriteCounts::default();
            let counted =
                count_metric(metric, conversion, &mut own, &mut times).and_then(|counted| {
                    if !translate::is_named(Naming::of(metric), conversion) {
                        Err(NO_NAME)
                    } else if data_points(metric) == 0 {
                        Err(NO_POINTS)
                    } else {
                        Ok(counted)
                    }
                });
            match counted {
                Ok((points, kind, cut)) => {
                    if points > 0 {
                        counts.add(&own);
                        let meta = Meta {
                            kind,
                            unit: metric.unit.as_bytes(),
                            help: metric.description.as_bytes(),
                        };
                        if entries.see(Naming::of(metric), meta) {
                            family(Some(metric));
                        }
                    }
                    if let Some(why) = cut {
                        refused.push(format!("metric {:?}: {why}", metric.name));
                    }
                }
                Err(why) => refused.push(format!("metric {:?}: {why}", metric.name)),
            }
        }
        let attributes = translate::resource_attributes(resource);
        match TargetInfoTimes::of(&translate::target_keys(attributes, conversion), &times) {
            Ok(Some(stamps)) => {
                target_infos.push((attributes, stamps));
                if entries.see(Naming::fixed(TARGET_INFO), Meta::TARGET_INFO) {
                    family(None);
                }
            }
            Ok(None) => {}
            Err(why) => refused.push(format!("metric {TARGET_INFO:?}: {why}")),
        }
    }
    for (samples, new_series) in translate::target_infos_stamped(target_infos, settings) {
        counts.series += u64::from(new_series);
        counts.samples = counts.samples.saturating_add(samples);
    }
    counts.metadata = entries.count();
    (counts, refused)
}

/// The earliest data point of `request`, in Unix milliseconds (`None`: it has none): the
/// sample time Mimir's HA tracker reads of the series an export becomes (of each series its
/// first sample; here the earliest point of all, which is no later).
pub fn earliest_point_ms(request: &proto::ExportMetricsServiceRequest) -> Option<i64> {
    let mut times = TimeRange::default();
    for metric in request
        .resource_metrics
        .iter()
        .flat_map(|resource| &resource.scope_metrics)
        .flat_map(|scope| &scope.metrics)
    {
        // Only the times are wanted; a metric the translator refuses has them too.
        let unused = &mut WriteCounts::default();
        let _ = count_metric(metric, Conversion::default(), unused, &mut times);
    }
    times.earliest.map(translate::nanos_to_millis)
}

/// How many data points `metric` has.
fn data_points(metric: &Metric) -> usize {
    match &metric.data {
        None => 0,
        Some(Data::Gauge(gauge)) => gauge.data_points.len(),
        Some(Data::Sum(sum)) => sum.data_points.len(),
        Some(Data::Histogram(histogram)) => histogram.data_points.len(),
        Some(Data::ExponentialHistogram(histogram)) => histogram.data_points.len(),
        Some(Data::Summary(summary)) => summary.data_points.len(),
    }
}

/// What `metric`'s points charge, added to `counts`, with how many points are charged and why
/// the translator stopped at a point, if it did ([`translate::point_stops`]: that point and the
/// later ones are left out); or why it refuses the whole metric. Every point's time counts
/// for `target_info` either way.
fn count_metric(
    metric: &Metric,
    conversion: Conversion,
    counts: &mut WriteCounts,
    times: &mut TimeRange,
) -> Result<(usize, MetricType, Option<&'static str>), &'static str> {
    let cumulative = |temporality: i32| {
        if conversion.takes(temporality) {
            Ok(())
        } else {
            Err(NOT_CUMULATIVE)
        }
    };
    let add = |total: &mut u64, n: usize| *total = total.saturating_add(n as u64);
    let data = metric.data.as_ref().ok_or(NO_DATA)?;
    // The points the translator takes: up to the first it stops at.
    let mut cut = None;
    let mut takes = |attributes: &[proto::common::KeyValue], scale: Option<i32>| {
        cut = cut.or_else(|| translate::point_stops(attributes, scale, conversion));
        cut.is_none()
    };
    let mut points = 0;
    match data {
        Data::Gauge(gauge) => {
            for point in &gauge.data_points {
                times.see(point.time_unix_nano);
            }
            for point in &gauge.data_points {
                if takes(&point.attributes, None) {
                    points += 1;
                    add(&mut counts.samples, 1);
                }
            }
        }
        Data::Sum(sum) => {
            for point in &sum.data_points {
                times.see(point.time_unix_nano);
            }
            cumulative(sum.aggregation_temporality)?;
            for point in &sum.data_points {
                if takes(&point.attributes, None) {
                    points += 1;
                    add(&mut counts.samples, 1);
                    add(&mut counts.exemplars, point.exemplars.len());
                }
            }
        }
        Data::Histogram(histogram) => {
            for point in &histogram.data_points {
                times.see(point.time_unix_nano);
            }
            cumulative(histogram.aggregation_temporality)?;
            for point in &histogram.data_points {
                if !takes(&point.attributes, None) {
                    continue;
                }
                points += 1;
                add(&mut counts.exemplars, point.exemplars.len());
                if conversion.nhcb {
                    // One native histogram with custom buckets.
                    add(&mut counts.histograms, 1);
                    continue;
                }
                let buckets = point.explicit_bounds.len().min(point.bucket_counts.len());
                // the buckets, `+Inf`, `_count`, and `_sum` when the point has one.
                add(
                    &mut counts.samples,
                    buckets + 2 + usize::from(point.sum.is_some()),
                );
            }
        }
        Data::ExponentialHistogram(histogram) => {
            for point in &histogram.data_points {
                times.see(point.time_unix_nano);
            }
            cumulative(histogram.aggregation_temporality)?;
            for point in &histogram.data_points {
                if takes(&point.attributes, Some(point.scale)) {
                    points += 1;
                    add(&mut counts.histograms, 1);
                    add(&mut counts.exemplars, point.exemplars.len());
                }
            }
        }
        Data::Summary(summary) => {
            for point in &summary.data_points {
                times.see(point.time_unix_nano);
                if takes(&point.attributes, None) {
                    points += 1;
                    add(&mut counts.samples, point.quantile_values.len() + 2);
                }
            }
        }
    };
    counts.series = counts.series.saturating_add(points as u64);
    Ok((points, MetricType::of(data), cut))
}

#[cfg(test)]
mod tests;
