//! Remote-write bodies: the format from the headers, snappy raw-block decompression, and a
//! zero-copy protobuf scan of 1.0 (`prometheus.WriteRequest`, here) and 2.0
//! (`io.prometheus.write.v2.Request`, [`v2`]).
//!
//! Admission needs only counts (samples, histograms, exemplars, metadata) and the assurance
//! that the body is well-formed, and forwarding passes the original compressed bytes through.
//! So the body is never decoded into owned structs: [`scan`] walks the wire format with
//! prost's own varint and key primitives, checks every length, wire type and label string,
//! and counts. `benches/hot_path.rs` compares it with a full prost decode; the README has the
//! figures.
//!
//! A body weir cannot count is refused, never passed uncharged: an unknown `proto=` is 415,
//! and a body of one version labelled as the other is 400 (each scan refuses the other
//! version's fields).

pub mod prompb;
pub mod v2;
pub mod v2_proto;

use std::cell::RefCell;

use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

/// What one request carries, for the ingestion-rate cost and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    pub series: u64,
    pub samples: u64,
    pub histograms: u64,
    pub exemplars: u64,
    pub metadata: u64,
}

impl WriteCounts {
    /// The ingestion-rate cost, as Mimir counts it: samples + histograms + exemplars + metadata.
    pub fn cost(&self) -> u64 {
        self.samples + self.histograms + self.exemplars + self.metadata
    }
}

/// The protobuf message a push carries, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `prometheus.WriteRequest`: `application/x-protobuf` with no `proto=` or
    /// `proto=prometheus.WriteRequest`, and (as Mimir does) a missing or other media type.
    V1,
    /// `application/x-protobuf;proto=io.prometheus.write.v2.Request`.
    V2,
    /// An OTLP metrics export (`POST /otlp/v1/metrics`), protobuf or JSON.
    Otlp(crate::otlp::OtlpFormat),
}

/// A `Content-Type` or `Content-Encoding` weir cannot read: answered 415, as the
/// remote-write 2.0 specification requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedMedia(pub String);

impl Format {
    /// The format from the push's headers.
    pub fn from_headers(
        content_type: Option<&[u8]>,
        content_encoding: Option<&[u8]>,
    ) -> Result<Format, UnsupportedMedia> {
        if let Some(encoding) = content_encoding {
            let encoding = String::from_utf8_lossy(encoding);
            if !encoding.trim().eq_ignore_ascii_case("snappy") {
                return Err(UnsupportedMedia(format!(
                    "unsupported Content-Encoding {:?}: remote-write bodies must be \
                     snappy-compressed (block format)",
                    encoding.trim()
                )));
            }
        }
        let Some(content_type) = content_type else {
            return Ok(Format::V1);
        };
        let content_type = String::from_utf8_lossy(content_type);
        let mut parts = content_type.split(';');
        let media_type = parts.next().unwrap_or("").trim();
        if !media_type.eq_ignore_ascii_case("application/x-protobuf") {
            return Ok(Format::V1);
        }
        for parameter in parts {
            let Some((name, value)) = parameter.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("proto") {
                continue;
            }
            return match value.trim().trim_matches('"') {
                "prometheus.WriteRequest" => Ok(Format::V1),
                "io.prometheus.write.v2.Request" => Ok(Format::V2),
                other => Err(UnsupportedMedia(format!(
                    "unsupported remote-write message proto={other:?}: weir accepts \
                     prometheus.WriteRequest (remote-write 1.0) and \
                     io.prometheus.write.v2.Request (2.0)"
                ))),
            };
        }
        Ok(Format::V1)
    }
}

/// What a remote-write 2.0 receiver reports it wrote, in the `X-Prometheus-Remote-Write-*-Written`
/// response headers (required by the 2.0 specification, on success and failure alike).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub samples: u64,
    pub histograms: u64,
    pub exemplars: u64,
}

impl Written {
    pub const SAMPLES_HEADER: &'static str = "x-prometheus-remote-write-samples-written";
    pub const HISTOGRAMS_HEADER: &'static str = "x-prometheus-remote-write-histograms-written";
    pub const EXEMPLARS_HEADER: &'static str = "x-prometheus-remote-write-exemplars-written";

    pub fn of(counts: &WriteCounts) -> Written {
        Written {
            samples: counts.samples,
            histograms: counts.histograms,
            exemplars: counts.exemplars,
        }
    }

    /// What a receiver's response says it wrote, if it says anything (a missing header of
    /// the three counts as 0, as the specification allows).
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<Written> {
        let read = |name: &str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
        };
        let (samples, histograms, exemplars) = (
            read(Self::SAMPLES_HEADER),
            read(Self::HISTOGRAMS_HEADER),
            read(Self::EXEMPLARS_HEADER),
        );
        (samples.is_some() || histograms.is_some() || exemplars.is_some()).then(|| Written {
            samples: samples.unwrap_or(0),
            histograms: histograms.unwrap_or(0),
            exemplars: exemplars.unwrap_or(0),
        })
    }

    pub fn insert_into(&self, headers: &mut axum::http::HeaderMap) {
        for (name, value) in [
            (Self::SAMPLES_HEADER, self.samples),
            (Self::HISTOGRAMS_HEADER, self.histograms),
            (Self::EXEMPLARS_HEADER, self.exemplars),
        ] {
            headers.insert(name, axum::http::HeaderValue::from(value));
        }
    }
}

/// Why a body was refused. Each message is meant for the client that sent it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("decompressed body is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("invalid snappy block: {0}")]
    Snappy(String),
    #[error("invalid protobuf WriteRequest: {0}")]
    Protobuf(String),
    #[error("invalid OTLP metrics request: {0}")]
    Otlp(String),
}

/// Buffers above this size are not kept between requests, so one huge request does not pin
/// its memory to a worker thread forever.
const RETAINED_BUFFER_BYTES: usize = 4 << 20;

thread_local! {
    /// Decompression buffer reused across requests on this thread: no allocation per request
    /// in steady state. Only synchronous code touches it, so no task can hold it across an await.
    static DECOMPRESSED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Decompresses a snappy raw block of at most `max_size` decompressed bytes and scans it as
/// `format`.
pub fn decode(body: &[u8], max_size: usize, format: Format) -> Result<WriteCounts, DecodeError> {
    if let Format::Otlp(otlp) = format {
        return crate::otlp::decode(body, max_size, otlp);
    }
    let size =
        snap::raw::decompress_len(body).map_err(|err| DecodeError::Snappy(err.to_string()))?;
    if size > max_size {
        return Err(DecodeError::TooLarge {
            size,
            limit: max_size,
        });
    }
    DECOMPRESSED.with(|cell| {
        let mut buffer = cell.borrow_mut();
        buffer.resize(size, 0);
        let result = snap::raw::Decoder::new()
            .decompress(body, &mut buffer)
            .map_err(|err| DecodeError::Snappy(err.to_string()))
            .and_then(|written| match format {
                Format::V2 => v2::scan(&buffer[..written]),
                _ => scan(&buffer[..written]),
            });
        if buffer.capacity() > RETAINED_BUFFER_BYTES {
            *buffer = Vec::new();
        }
        result
    })
}

/// Scans an uncompressed `WriteRequest`, validating its structure, and counts what it carries.
pub fn scan(mut buf: &[u8]) -> Result<WriteCounts, DecodeError> {
    let mut counts = WriteCounts::default();
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf, "WriteRequest")?;
        match tag {
            1 => {
                let series = embedded(&mut buf, wire_type, "WriteRequest.timeseries")?;
                scan_series(series, &mut counts).map_err(|reason| {
                    DecodeError::Protobuf(format!("timeseries[{}]: {reason}", counts.series))
                })?;
                counts.series += 1;
            }
            3 => {
                let metadata = embedded(&mut buf, wire_type, "WriteRequest.metadata")?;
                check::<prompb::MetricMetadata>(metadata).map_err(|reason| {
                    DecodeError::Protobuf(format!("metadata[{}]: {reason}", counts.metadata))
                })?;
                counts.metadata += 1;
            }
            // Remote-write 2.0's symbols and series: a 2.0 body sent as 1.0 would otherwise
            // scan as empty and pass uncharged.
            4 | 5 => {
                return Err(DecodeError::Protobuf(format!(
                    "WriteRequest has field {tag}, which is remote-write 2.0's: send 2.0 \
                     bodies with Content-Type \
                     application/x-protobuf;proto=io.prometheus.write.v2.Request"
                )))
            }
            _ => skip(&mut buf, wire_type, tag, "WriteRequest")?,
        }
    }
    Ok(counts)
}

fn scan_series(mut buf: &[u8], counts: &mut WriteCounts) -> Result<(), String> {
    let mut labels = 0u32;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => {
                let label = field(&mut buf, wire_type, "labels")?;
                check_label(label).map_err(|reason| format!("labels[{labels}]: {reason}"))?;
                labels += 1;
            }
            2 => {
                let sample = field(&mut buf, wire_type, "samples")?;
                check_sample(sample).map_err(|reason| format!("samples: {reason}"))?;
                counts.samples += 1;
            }
            3 => {
                let exemplar = field(&mut buf, wire_type, "exemplars")?;
                check::<prompb::Exemplar>(exemplar)
                    .map_err(|reason| format!("exemplars: {reason}"))?;
                counts.exemplars += 1;
            }
            4 => {
                let histogram = field(&mut buf, wire_type, "histograms")?;
                check::<prompb::Histogram>(histogram)
                    .map_err(|reason| format!("histograms: {reason}"))?;
                counts.histograms += 1;
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    if labels == 0 {
        return Err("series has no labels".into());
    }
    Ok(())
}

/// A label's name and value must be well-formed UTF-8 strings.
fn check_label(mut buf: &[u8]) -> Result<(), String> {
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 | 2 => {
                let text = field(&mut buf, wire_type, if tag == 1 { "name" } else { "value" })?;
                if !is_utf8(text) {
                    return Err("label is not valid UTF-8".to_string());
                }
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(())
}

/// Checks a `Sample` (1.0 and 2.0 alike: `double value = 1; int64 timestamp = 2;`) by prost's
/// rules, as `check::<Sample>` would, without its generic merge loop: samples are most of a
/// request, and this is the scan's inner loop. Each known field must have its wire type (and
/// its 8 bytes, or a well-formed varint); other fields are skipped as prost skips them.
/// `fuzz`'s differential target and the property tests hold the two to the same answers.
pub(super) fn check_sample(mut buf: &[u8]) -> Result<(), String> {
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => {
                if wire_type != WireType::SixtyFourBit {
                    return Err(format!(
                        "Sample.value has wire type {wire_type:?}, expected SixtyFourBit"
                    ));
                }
                if buf.len() < 8 {
                    return Err("Sample.value: buffer underflow".to_string());
                }
                buf = &buf[8..];
            }
            2 => {
                if wire_type != WireType::Varint {
                    return Err(format!(
                        "Sample.timestamp has wire type {wire_type:?}, expected Varint"
                    ));
                }
                decode_varint(&mut buf).map_err(|e| format!("Sample.timestamp: {e}"))?;
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(())
}

/// Checks a sample, histogram, exemplar or metadata message by decoding it with the
/// protocol's own types: each known field must have its wire type and, for strings, valid
/// UTF-8, exactly as a full decode requires. (A sample decodes without allocating; the rarer
/// histograms, exemplars and metadata may allocate.) Only series and labels, the bulk of a
/// request, are walked by hand.
pub(super) fn check<M: prost::Message + Default>(buf: &[u8]) -> Result<(), String> {
    M::decode(buf).map(drop).map_err(|err| err.to_string())
}

/// Whether `bytes` are valid UTF-8. Label names and most values are ASCII, which a word at a
/// time checks faster than the general validator does for strings this short.
#[inline]
pub(super) fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// A length-delimited field's bytes, after checking its wire type and length. On the scan's
/// inner loop: the error messages are built out of line.
#[inline(always)]
pub(super) fn field<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    name: &str,
) -> Result<&'a [u8], String> {
    if wire_type != WireType::LengthDelimited {
        return Err(wrong_wire_type(name, wire_type));
    }
    let len = match decode_varint(buf) {
        Ok(len) => len,
        Err(err) => return Err(format_field_error(name, &err)),
    };
    if len > buf.len() as u64 {
        return Err(too_short(name, len, buf.len()));
    }
    let (bytes, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(bytes)
}

#[cold]
#[inline(never)]
fn wrong_wire_type(name: &str, wire_type: WireType) -> String {
    format!("field `{name}` has wire type {wire_type:?}, expected LengthDelimited")
}

#[cold]
#[inline(never)]
fn format_field_error(name: &str, err: &prost::DecodeError) -> String {
    format!("field `{name}`: {err}")
}

#[cold]
#[inline(never)]
fn too_short(name: &str, len: u64, remaining: usize) -> String {
    format!("field `{name}` claims {len} bytes but only {remaining} remain")
}

fn key(buf: &mut &[u8], message: &str) -> Result<(u32, WireType), DecodeError> {
    decode_key(buf).map_err(|e| DecodeError::Protobuf(format!("{message}: {e}")))
}

fn embedded<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    name: &str,
) -> Result<&'a [u8], DecodeError> {
    field(buf, wire_type, name).map_err(DecodeError::Protobuf)
}

fn skip(buf: &mut &[u8], wire_type: WireType, tag: u32, message: &str) -> Result<(), DecodeError> {
    skip_field(wire_type, tag, buf, DecodeContext::default())
        .map_err(|e| DecodeError::Protobuf(format!("{message}: field {tag}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::prompb::*;
    use super::*;
    use proptest::prelude::*;

    fn label() -> impl Strategy<Value = Label> {
        ("[a-z_]{1,8}", ".{0,8}").prop_map(|(name, value)| Label { name, value })
    }

    fn series() -> impl Strategy<Value = TimeSeries> {
        (
            prop::collection::vec(label(), 1..4),
            prop::collection::vec((any::<f64>(), any::<i64>()), 0..4),
            prop::collection::vec((prop::collection::vec(label(), 0..2), any::<f64>()), 0..2),
            prop::collection::vec((any::<u64>(), any::<i32>()), 0..2),
        )
            .prop_map(|(labels, samples, exemplars, histograms)| TimeSeries {
                labels,
                samples: samples
                    .into_iter()
                    .map(|(value, timestamp)| Sample { value, timestamp })
                    .collect(),
                exemplars: exemplars
                    .into_iter()
                    .map(|(labels, value)| Exemplar {
                        labels,
                        value,
                        timestamp: 1,
                    })
                    .collect(),
                histograms: histograms
                    .into_iter()
                    .map(|(count_int, schema)| Histogram {
                        count: Some(super::prompb::histogram::Count::CountInt(count_int)),
                        schema,
                        sum: 1.0,
                        timestamp: 2,
                        ..Histogram::default()
                    })
                    .collect(),
            })
    }

    fn write_request() -> impl Strategy<Value = WriteRequest> {
        (
            prop::collection::vec(series(), 0..6),
            prop::collection::vec(".{0,6}", 0..3),
        )
            .prop_map(|(timeseries, names)| WriteRequest {
                timeseries,
                metadata: names
                    .into_iter()
                    .map(|metric_family_name| MetricMetadata {
                        r#type: 1,
                        metric_family_name,
                        help: "h".into(),
                        unit: String::new(),
                    })
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn scan_counts_match_a_full_decode(request in write_request()) {
            let body = request.encode_snappy();
            prop_assert_eq!(decode(&body, usize::MAX, Format::V1), Ok(request.counts()));
        }

        #[test]
        fn the_sample_check_agrees_with_prost(
            value in any::<f64>(),
            timestamp in any::<i64>(),
            flip in any::<(usize, u8)>(),
            tail in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            // A real sample with one byte changed and junk after it: the hand-written check
            // accepts exactly what prost's decode accepts.
            let mut bytes = prost::Message::encode_to_vec(&Sample { value, timestamp });
            let at = flip.0 % bytes.len();
            bytes[at] ^= flip.1;
            bytes.extend(tail);
            prop_assert_eq!(check_sample(&bytes).is_ok(), check::<Sample>(&bytes).is_ok());
            prop_assert_eq!(
                check_sample(&bytes).is_ok(),
                check::<super::v2_proto::Sample>(&bytes).is_ok()
            );
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = scan(&bytes);
            let _ = decode(&bytes, 1 << 20, Format::V1);
            let _ = decode(&bytes, 1 << 20, Format::V2);
            let _ = v2::scan(&bytes);
        }

        #[test]
        fn corrupted_valid_requests_never_panic(
            request in write_request(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut raw = prost::Message::encode_to_vec(&request);
            if !raw.is_empty() {
                for (index, byte) in flips {
                    let i = index.index(raw.len());
                    raw[i] = byte;
                }
            }
            // A scan that succeeds on corrupted bytes must agree with prost where prost also succeeds.
            if let (Ok(counts), Ok(decoded)) = (scan(&raw), <WriteRequest as prost::Message>::decode(&raw[..])) {
                prop_assert_eq!(counts, decoded.counts());
            }
        }
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(matches!(
            decode(b"\xff\xff\xff", 100, Format::V1),
            Err(DecodeError::Snappy(_))
        ));
        let big = WriteRequest::synthetic(100, 1, 1).encode_snappy();
        assert!(matches!(
            decode(&big, 10, Format::V1),
            Err(DecodeError::TooLarge { limit: 10, .. })
        ));
        // timeseries field claiming more bytes than remain
        assert_eq!(
            scan(&[0x0a, 0x05, 0x0a]),
            Err(DecodeError::Protobuf(
                "field `WriteRequest.timeseries` claims 5 bytes but only 1 remain".into()
            ))
        );
        // a series with no labels
        assert_eq!(
            scan(&[0x0a, 0x00]),
            Err(DecodeError::Protobuf(
                "timeseries[0]: series has no labels".into()
            ))
        );
        // timeseries with the wrong wire type
        let err = scan(&[0x08, 0x01]).unwrap_err().to_string();
        assert!(err.contains("wire type Varint"), "{err}");
    }

    #[test]
    fn format_follows_the_content_type_as_the_2_0_specification_says() {
        let format = |content_type: Option<&str>, encoding: Option<&str>| {
            Format::from_headers(content_type.map(str::as_bytes), encoding.map(str::as_bytes))
        };
        assert_eq!(format(None, None), Ok(Format::V1));
        assert_eq!(
            format(Some("application/x-protobuf"), Some("snappy")),
            Ok(Format::V1)
        );
        assert_eq!(
            format(
                Some("application/x-protobuf;proto=prometheus.WriteRequest"),
                None
            ),
            Ok(Format::V1)
        );
        assert_eq!(
            format(
                Some("Application/X-Protobuf; proto=\"io.prometheus.write.v2.Request\""),
                Some("SNAPPY")
            ),
            Ok(Format::V2)
        );
        // Mimir reads other media types as 1.0; so does weir (the scan then decides).
        assert_eq!(format(Some("text/plain"), None), Ok(Format::V1));
        assert!(format(
            Some("application/x-protobuf;proto=io.prometheus.write.v3.Request"),
            None
        )
        .unwrap_err()
        .0
        .contains("io.prometheus.write.v3.Request"));
        assert!(format(None, Some("gzip")).unwrap_err().0.contains("gzip"));
        // One line of prose each, without the source's indentation in it.
        assert_eq!(
            format(None, Some("gzip")).unwrap_err().0,
            "unsupported Content-Encoding \"gzip\": remote-write bodies must be \
             snappy-compressed (block format)"
        );
        let v3 = format(Some("application/x-protobuf;proto=v3"), None)
            .unwrap_err()
            .0;
        assert_eq!(
            v3,
            "unsupported remote-write message proto=\"v3\": weir accepts \
             prometheus.WriteRequest (remote-write 1.0) and io.prometheus.write.v2.Request (2.0)"
        );
    }

    #[test]
    fn invalid_utf8_label_is_rejected() {
        let raw = prost::Message::encode_to_vec(&WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "a".into(),
                    value: "b".into(),
                }],
                ..Default::default()
            }],
            metadata: vec![],
        });
        let mut bad = raw.clone();
        let last = bad.len() - 1;
        bad[last] = 0xff; // the value "b" becomes an invalid UTF-8 byte
        assert_eq!(
            scan(&bad),
            Err(DecodeError::Protobuf(
                "timeseries[0]: labels[0]: label is not valid UTF-8".into()
            ))
        );
        assert!(scan(&raw).is_ok());
    }
}
