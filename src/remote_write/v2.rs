//! Remote-write 2.0 bodies (`io.prometheus.write.v2.Request`): a zero-copy scan that checks
//! the symbol table and every reference into it, and counts what the request carries the way
//! Grafana Mimir charges it to a tenant's ingestion rate.
//!
//! Two passes over the decompressed bytes: the first finds the symbols (they may come after
//! the series on the wire) and checks each is UTF-8; the second walks the series. Nothing is
//! copied: symbols are kept as offsets into the body, in a buffer reused per thread.
//!
//! Counting, as Mimir does when it turns a 2.0 request into its 1.0 form:
//! - samples, histograms and exemplars: one each;
//! - metadata: in 2.0 each series may carry it; Mimir keeps one entry per metric family (the
//!   `__name__` with `_bucket`, `_count`, `_sum`, `_gcount`, `_gsum` removed as the type says),
//!   the first seen, and only entries with a type, help or unit. So does this scan.

use std::cell::RefCell;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};

use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

use super::v2_proto;
use super::wire::{check, check_sample, field, is_utf8};
use crate::counts::{DecodeError, WriteCounts};

/// Buffers above this many entries are not kept between requests.
const RETAINED_ENTRIES: usize = 1 << 16;

thread_local! {
    /// (offset, length) of each symbol in the body being scanned.
    static SYMBOLS: RefCell<Vec<(u32, u32)>> = const { RefCell::new(Vec::new()) };
    /// Hashes of the metric families whose metadata was counted in this request.
    static FAMILIES: RefCell<HashSet<u64, foldhash::fast::FixedState>> =
        RefCell::new(HashSet::with_hasher(foldhash::fast::FixedState::default()));
}

/// Metric types from `Metadata.MetricType` whose series names carry suffixes.
const HISTOGRAM: u64 = 3;
const GAUGE_HISTOGRAM: u64 = 4;
const SUMMARY: u64 = 5;

/// Scans an uncompressed `io.prometheus.write.v2.Request`, validating its structure and its
/// symbol references, and counts what it carries.
pub fn scan(body: &[u8]) -> Result<WriteCounts, DecodeError> {
    SYMBOLS.with(|symbols| {
        FAMILIES.with(|families| {
            let mut symbols = symbols.borrow_mut();
            let mut families = families.borrow_mut();
            symbols.clear();
            families.clear();
            let result = scan_with(body, &mut symbols, &mut families);
            if symbols.capacity() > RETAINED_ENTRIES {
                *symbols = Vec::new();
            }
            if families.capacity() > RETAINED_ENTRIES {
                *families = HashSet::with_hasher(foldhash::fast::FixedState::default());
            }
            result
        })
    })
}

fn scan_with(
    body: &[u8],
    symbols: &mut Vec<(u32, u32)>,
    families: &mut HashSet<u64, foldhash::fast::FixedState>,
) -> Result<WriteCounts, DecodeError> {
    let error = |reason: String| DecodeError::Protobuf(reason);
    // Pass 1: the symbol table.
    let mut buf = body;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| error(format!("Request: {e}")))?;
        match tag {
            1..=3 => {
                return Err(error(format!(
                    "Request has field {tag}, reserved in remote-write 2.0: this looks like a \
                     1.0 prometheus.WriteRequest; send it with Content-Type \
                     application/x-protobuf;proto=prometheus.WriteRequest"
                )))
            }
            4 => {
                let symbol = field(&mut buf, wire_type, "symbols").map_err(error)?;
                if !is_utf8(symbol) {
                    return Err(error(format!(
                        "symbols[{}] is not valid UTF-8",
                        symbols.len()
                    )));
                }
                let offset = symbol.as_ptr() as usize - body.as_ptr() as usize;
                symbols.push((offset as u32, symbol.len() as u32));
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| error(format!("Request: field {tag}: {e}")))?,
        }
    }
    if let Some(&(_, length)) = symbols.first() {
        if length != 0 {
            return Err(error(
                "symbols[0] must be the empty string (remote-write 2.0)".to_string(),
            ));
        }
    }
    let table = Symbols { body, symbols };
    // Pass 2: the series.
    let mut counts = WriteCounts::default();
    let mut buf = body;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| error(format!("Request: {e}")))?;
        if tag == 5 {
            let series = field(&mut buf, wire_type, "timeseries").map_err(error)?;
            scan_series(series, &table, &mut counts, families)
                .map_err(|reason| error(format!("timeseries[{}]: {reason}", counts.series)))?;
            counts.series += 1;
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| error(format!("Request: field {tag}: {e}")))?;
        }
    }
    Ok(counts)
}

/// The request's symbols, as offsets into its body.
struct Symbols<'a> {
    body: &'a [u8],
    symbols: &'a [(u32, u32)],
}

impl<'a> Symbols<'a> {
    /// The symbol `reference` points at; `what` names the reference in the error (built
    /// only when there is one: the happy path allocates nothing).
    fn get(&self, reference: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], String> {
        match self
            .symbols
            .get(usize::try_from(reference).unwrap_or(usize::MAX))
        {
            Some(&(offset, length)) => Ok(&self.body[offset as usize..(offset + length) as usize]),
            None => Err(format!(
                "{} = {reference} is out of range: the request has {} symbols",
                what(),
                self.symbols.len()
            )),
        }
    }
}

fn scan_series<'a>(
    mut buf: &[u8],
    symbols: &Symbols<'a>,
    counts: &mut WriteCounts,
    families: &mut HashSet<u64, foldhash::fast::FixedState>,
) -> Result<(), String> {
    let mut labels = LabelRefs::<'a>::default();
    // A series' metadata may come in several pieces: protobuf merges them, each field's last
    // value winning, so references are checked once the pieces are merged.
    let mut metadata: Option<MetadataFields> = None;
    let (mut exemplars, mut samples, mut histograms) = (0u64, 0u64, 0u64);
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => labels.read(&mut buf, wire_type, symbols, "labels_refs")?,
            2 => {
                check_sample(field(&mut buf, wire_type, "samples")?)
                    .map_err(|reason| format!("samples[{samples}]: {reason}"))?;
                samples += 1;
            }
            3 => {
                check::<v2_proto::Histogram>(field(&mut buf, wire_type, "histograms")?)
                    .map_err(|reason| format!("histograms[{histograms}]: {reason}"))?;
                histograms += 1;
            }
            4 => {
                let exemplar = field(&mut buf, wire_type, "exemplars")?;
                check::<v2_proto::Exemplar>(exemplar)
                    .and_then(|()| scan_exemplar(exemplar, symbols))
                    .map_err(|reason| format!("exemplars[{exemplars}]: {reason}"))?;
                exemplars += 1;
            }
            // created_timestamp, an int64.
            6 if wire_type != WireType::Varint => {
                return Err(format!(
                    "field `created_timestamp` has wire type {wire_type:?}, expected Varint"
                ))
            }
            5 => {
                let message = field(&mut buf, wire_type, "metadata")?;
                scan_metadata(
                    message,
                    metadata.get_or_insert_with(MetadataFields::default),
                )
                .map_err(|reason| format!("metadata: {reason}"))?;
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    labels.finish("labels_refs")?;
    if labels.count == 0 {
        return Err("series has no labels".into());
    }
    counts.samples += samples;
    counts.histograms += histograms;
    counts.exemplars += exemplars;
    let metadata = metadata
        .map(|fields| fields.resolve(symbols))
        .transpose()
        .map_err(|reason| format!("metadata: {reason}"))?;
    if let (Some(metadata), Some(name)) = (metadata, labels.metric_name) {
        if metadata.counts() && !name.is_empty() {
            let mut hasher = families.hasher().build_hasher();
            hasher.write(family(name, metadata.metric_type));
            if families.insert(hasher.finish()) {
                counts.metadata += 1;
            }
        }
    }
    Ok(())
}

/// A run of label references: pairs of (name, value), each in range; remembers `__name__`.
#[derive(Default)]
struct LabelRefs<'a> {
    count: u64,
    pending_name: Option<&'a [u8]>,
    metric_name: Option<&'a [u8]>,
}

impl<'a> LabelRefs<'a> {
    /// Reads one `labels_refs` field: packed (the proto3 default) or a single varint.
    fn read(
        &mut self,
        buf: &mut &[u8],
        wire_type: WireType,
        symbols: &Symbols<'a>,
        what: &str,
    ) -> Result<(), String> {
        match wire_type {
            // References are uint32: a longer varint keeps its low 32 bits, as every protobuf
            // decoder (prost, Go's) reads it.
            WireType::LengthDelimited => {
                let mut packed = field(buf, wire_type, what)?;
                while !packed.is_empty() {
                    let reference = decode_varint(&mut packed).map_err(|e| e.to_string())?;
                    self.push(u64::from(reference as u32), symbols, what)?;
                }
                Ok(())
            }
            WireType::Varint => {
                let reference = decode_varint(buf).map_err(|e| e.to_string())?;
                self.push(u64::from(reference as u32), symbols, what)
            }
            other => Err(format!(
                "field `{what}` has wire type {other:?}, expected packed varints"
            )),
        }
    }

    fn push(&mut self, reference: u64, symbols: &Symbols<'a>, what: &str) -> Result<(), String> {
        let text = symbols.get(reference, || format!("{what}[{}]", self.count))?;
        match self.pending_name.take() {
            None => self.pending_name = Some(text),
            // The first `__name__` is the name (a series has one; Prometheus refuses two).
            Some(name) if name == b"__name__" && self.metric_name.is_none() => {
                self.metric_name = Some(text)
            }
            Some(_) => {}
        }
        self.count += 1;
        Ok(())
    }

    fn finish(&self, what: &str) -> Result<(), String> {
        if self.count % 2 == 1 {
            return Err(format!(
                "odd number of {what} ({}): references come in name-value pairs",
                self.count
            ));
        }
        Ok(())
    }
}

fn scan_exemplar(mut buf: &[u8], symbols: &Symbols) -> Result<(), String> {
    let mut labels = LabelRefs::default();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => labels.read(&mut buf, wire_type, symbols, "labels_refs")?,
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    labels.finish("labels_refs")
}

struct Metadata {
    metric_type: u64,
    has_help: bool,
    has_unit: bool,
}

impl Metadata {
    /// Mimir keeps metadata that says something: a type, a help text or a unit.
    fn counts(&self) -> bool {
        self.metric_type != 0 || self.has_help || self.has_unit
    }
}

/// A series' metadata as read so far: each field's last value (0 when absent, as proto3 has
/// it).
#[derive(Default)]
struct MetadataFields {
    metric_type: u64,
    help_ref: u64,
    unit_ref: u64,
}

impl MetadataFields {
    /// The merged metadata, its references checked.
    fn resolve(self, symbols: &Symbols) -> Result<Metadata, String> {
        let help = symbols.get(self.help_ref, || "help_ref".to_string())?;
        let unit = symbols.get(self.unit_ref, || "unit_ref".to_string())?;
        Ok(Metadata {
            metric_type: self.metric_type,
            has_help: !help.is_empty(),
            has_unit: !unit.is_empty(),
        })
    }
}

fn scan_metadata(mut buf: &[u8], metadata: &mut MetadataFields) -> Result<(), String> {
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match (tag, wire_type) {
            // An enum is an int32 and the references uint32s: longer varints are truncated,
            // as decoders do.
            (1, WireType::Varint) => {
                let value = decode_varint(&mut buf).map_err(|e| e.to_string())?;
                metadata.metric_type = value as i32 as u64;
            }
            (3 | 4, WireType::Varint) => {
                let reference =
                    u64::from(decode_varint(&mut buf).map_err(|e| e.to_string())? as u32);
                if tag == 3 {
                    metadata.help_ref = reference;
                } else {
                    metadata.unit_ref = reference;
                }
            }
            (1 | 3 | 4, other) => {
                return Err(format!(
                    "field {tag} has wire type {other:?}, expected Varint"
                ))
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(())
}

/// The metric family a series name belongs to, as Mimir normalizes it for metadata.
pub fn family(name: &[u8], metric_type: u64) -> &[u8] {
    let suffixes: &[&[u8]] = match metric_type {
        HISTOGRAM => &[b"_bucket", b"_count", b"_sum"],
        SUMMARY => &[b"_count", b"_sum"],
        GAUGE_HISTOGRAM => &[b"_bucket", b"_gcount", b"_gsum"],
        _ => &[],
    };
    suffixes
        .iter()
        .find_map(|suffix| name.strip_suffix(*suffix))
        .unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::super::v2_proto::{
        metadata::MetricType, Exemplar, Histogram, Metadata, Request, Sample, TimeSeries,
    };
    use super::*;
    use proptest::prelude::*;

    /// What Mimir would charge for a decoded request: the reference the scan must match
    /// (the same oracle the fuzz target uses).
    fn expected(request: &Request) -> WriteCounts {
        crate::fuzzing::expected_v2(request)
    }

    fn request() -> impl Strategy<Value = Request> {
        let symbols = prop::collection::vec(
            prop_oneof![
                Just("__name__".to_string()),
                Just("http_requests_total".to_string()),
                Just("latency_seconds_bucket".to_string()),
                Just("latency_seconds".to_string()),
                Just("job".to_string()),
                "[a-z]{1,6}",
            ],
            1..8,
        )
        .prop_map(|mut symbols| {
            symbols.insert(0, String::new());
            symbols
        });
        symbols.prop_flat_map(|symbols| {
            let n = symbols.len() as u32;
            let series = (
                prop::collection::vec(0..n, 1..4).prop_map(|names| {
                    names
                        .into_iter()
                        .flat_map(|i| [i, (i + 1) % 1_000])
                        .collect::<Vec<_>>()
                }),
                0usize..3,
                0usize..2,
                prop::collection::vec(prop::collection::vec(0..n, 0..2), 0..2),
                prop::option::of((0i32..8, 0..n, 0..n)),
            )
                .prop_map(
                    move |(mut labels, samples, histograms, exemplars, metadata)| {
                        // Keep every reference in range.
                        for reference in &mut labels {
                            *reference %= n;
                        }
                        TimeSeries {
                            labels_refs: labels,
                            samples: (0..samples)
                                .map(|i| Sample {
                                    value: i as f64,
                                    timestamp: i as i64,
                                })
                                .collect(),
                            histograms: (0..histograms)
                                .map(|_| Histogram {
                                    schema: 3,
                                    ..Histogram::default()
                                })
                                .collect(),
                            exemplars: exemplars
                                .into_iter()
                                .map(|names| Exemplar {
                                    labels_refs: names.into_iter().flat_map(|i| [i, i]).collect(),
                                    value: 1.0,
                                    timestamp: 1,
                                })
                                .collect(),
                            metadata: metadata.map(|(r#type, help_ref, unit_ref)| Metadata {
                                r#type,
                                help_ref,
                                unit_ref,
                            }),
                            created_timestamp: 0,
                        }
                    },
                );
            (Just(symbols), prop::collection::vec(series, 0..6)).prop_map(
                |(symbols, timeseries)| Request {
                    symbols,
                    timeseries,
                },
            )
        })
    }

    fn raw(request: &Request) -> Vec<u8> {
        prost::Message::encode_to_vec(request)
    }

    fn series(labels_refs: Vec<u32>) -> TimeSeries {
        TimeSeries {
            labels_refs,
            samples: vec![Sample {
                value: 1.0,
                timestamp: 1,
            }],
            ..TimeSeries::default()
        }
    }

    fn symbols(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    proptest! {
        /// Differential: the zero-copy scan counts what a full decode with Prometheus' own
        /// types counts, metadata deduplicated by family as Mimir does.
        #[test]
        fn scan_matches_a_full_decode(request in request()) {
            prop_assert_eq!(scan(&raw(&request)), Ok(expected(&request)));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = scan(&bytes);
        }

        #[test]
        fn corrupted_requests_never_panic_and_agree_with_prost_when_both_accept(
            request in request(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = raw(&request);
            if !bytes.is_empty() {
                for (index, byte) in flips {
                    let i = index.index(bytes.len());
                    bytes[i] = byte;
                }
            }
            if let (Ok(counts), Ok(decoded)) = (scan(&bytes), <Request as prost::Message>::decode(&bytes[..])) {
                prop_assert_eq!(counts.samples, decoded.timeseries.iter().map(|s| s.samples.len() as u64).sum::<u64>());
                prop_assert_eq!(counts.series, decoded.timeseries.len() as u64);
            }
        }
    }

    #[test]
    fn counts_samples_histograms_exemplars_and_metadata_per_family() {
        let request = Request {
            symbols: symbols(&[
                "",
                "__name__",
                "latency_seconds_bucket",
                "le",
                "0.1",
                "latency_seconds_sum",
                "help",
                "trace_id",
                "abc",
            ]),
            timeseries: vec![
                TimeSeries {
                    labels_refs: vec![1, 2, 3, 4],
                    samples: vec![Sample::default(); 3],
                    exemplars: vec![Exemplar {
                        labels_refs: vec![7, 8],
                        value: 1.0,
                        timestamp: 1,
                    }],
                    metadata: Some(Metadata {
                        r#type: MetricType::Histogram as i32,
                        help_ref: 6,
                        unit_ref: 0,
                    }),
                    ..TimeSeries::default()
                },
                // Same family (`latency_seconds`): its metadata is not counted again.
                TimeSeries {
                    labels_refs: vec![1, 5],
                    samples: vec![Sample::default()],
                    histograms: vec![Histogram::default(); 2],
                    metadata: Some(Metadata {
                        r#type: MetricType::Histogram as i32,
                        help_ref: 6,
                        unit_ref: 0,
                    }),
                    ..TimeSeries::default()
                },
            ],
        };
        assert_eq!(
            scan(&raw(&request)),
            Ok(WriteCounts {
                series: 2,
                samples: 4,
                histograms: 2,
                exemplars: 1,
                metadata: 1
            })
        );
    }

    #[test]
    fn metadata_that_says_nothing_is_not_counted() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up"]),
            timeseries: vec![TimeSeries {
                metadata: Some(Metadata::default()),
                ..series(vec![1, 2])
            }],
        };
        assert_eq!(scan(&raw(&request)).unwrap().metadata, 0);
    }

    #[test]
    fn references_out_of_range_are_named() {
        let out_of_range = Request {
            symbols: symbols(&["", "a", "b"]),
            timeseries: vec![series(vec![1, 2]), series(vec![1, 7])],
        };
        assert_eq!(
            scan(&raw(&out_of_range)),
            Err(DecodeError::Protobuf(
                "timeseries[1]: labels_refs[1] = 7 is out of range: the request has 3 symbols"
                    .into()
            ))
        );
        let odd = Request {
            symbols: symbols(&["", "a", "b"]),
            timeseries: vec![series(vec![1, 2, 1])],
        };
        assert_eq!(
            scan(&raw(&odd)),
            Err(DecodeError::Protobuf(
                "timeseries[0]: odd number of labels_refs (3): references come in name-value pairs"
                    .into()
            ))
        );
        let help = Request {
            symbols: symbols(&["", "a", "b"]),
            timeseries: vec![TimeSeries {
                metadata: Some(Metadata {
                    r#type: 1,
                    help_ref: 9,
                    unit_ref: 0,
                }),
                ..series(vec![1, 2])
            }],
        };
        assert!(scan(&raw(&help))
            .unwrap_err()
            .to_string()
            .contains("metadata: help_ref = 9 is out of range"));
        let exemplar = Request {
            symbols: symbols(&["", "a", "b"]),
            timeseries: vec![TimeSeries {
                exemplars: vec![Exemplar {
                    labels_refs: vec![1, 5],
                    ..Exemplar::default()
                }],
                ..series(vec![1, 2])
            }],
        };
        assert!(scan(&raw(&exemplar))
            .unwrap_err()
            .to_string()
            .contains("exemplars[0]: labels_refs[1] = 5 is out of range"));
        // No symbols at all: any reference is out of range.
        let empty = Request {
            symbols: vec![],
            timeseries: vec![series(vec![0, 0])],
        };
        assert!(scan(&raw(&empty))
            .unwrap_err()
            .to_string()
            .contains("the request has 0 symbols"));
    }

    #[test]
    fn the_first_symbol_must_be_empty_and_series_need_labels() {
        let request = Request {
            symbols: symbols(&["x", "a"]),
            timeseries: vec![series(vec![0, 1])],
        };
        assert_eq!(
            scan(&raw(&request)),
            Err(DecodeError::Protobuf(
                "symbols[0] must be the empty string (remote-write 2.0)".into()
            ))
        );
        let unlabelled = Request {
            symbols: symbols(&[""]),
            timeseries: vec![series(vec![])],
        };
        assert!(scan(&raw(&unlabelled))
            .unwrap_err()
            .to_string()
            .contains("series has no labels"));
    }

    #[test]
    fn a_1_0_body_sent_as_2_0_is_refused_and_the_other_way_round() {
        let v1 = super::super::prompb::WriteRequest::synthetic(10, 1, 1);
        let err = scan(&prost::Message::encode_to_vec(&v1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("reserved in remote-write 2.0"), "{err}");
        let v2 = Request {
            symbols: symbols(&["", "__name__", "up"]),
            timeseries: vec![series(vec![1, 2])],
        };
        let err = super::super::scan(&raw(&v2)).unwrap_err().to_string();
        assert!(err.contains("remote-write 2.0's"), "{err}");
    }

    #[test]
    fn unpacked_label_references_are_read_too() {
        // labels_refs as two separate varint fields (tag 1, wire type 0), as a non-packing
        // encoder may send them.
        let mut series_bytes = vec![0x08, 0x01, 0x08, 0x02];
        series_bytes.extend(prost::Message::encode_to_vec(&TimeSeries {
            samples: vec![Sample::default()],
            ..TimeSeries::default()
        }));
        let mut body = prost::Message::encode_to_vec(&Request {
            symbols: symbols(&["", "a", "b"]),
            timeseries: vec![],
        });
        body.push(0x2a); // field 5, length-delimited
        body.push(series_bytes.len() as u8);
        body.extend(series_bytes);
        assert_eq!(scan(&body).unwrap().samples, 1);
    }
}
