//! Remote-write bodies: snappy raw-block decompression and a
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
pub mod relabel;
pub mod v2;
pub mod v2_proto;
pub mod validate;
mod wire;

use std::cell::RefCell;

use prost::encoding::{decode_key, skip_field, DecodeContext, WireType};

use crate::counts::{
    DecodeError, Decoded, Discarded, DroppedExemplars, Forward, Refused, WriteCounts,
};
use crate::ha::HaOutcome;
use validate::{ExemplarSeen, MetadataVerdict, PendingExemplars, SeriesCheck, Splice, Validation};
use wire::{check, check_sample, field, is_utf8, short_field};

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

/// Buffers above this size are not kept between requests, so one huge request does not pin
/// its memory to a worker thread forever.
const RETAINED_BUFFER_BYTES: usize = 4 << 20;

thread_local! {
    /// Decompression buffer reused across requests on this thread: no allocation per request
    /// in steady state. Only synchronous code touches it, so no task can hold it across an await.
    static DECOMPRESSED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Decompresses a snappy raw block of at most `max_size` decompressed bytes and scans it with
/// `scan` ([`scan`] for 1.0, [`v2::scan`] for 2.0; [`crate::format::decode`] picks).
pub fn decode(
    body: &[u8],
    max_size: usize,
    scan: fn(&[u8]) -> Result<WriteCounts, DecodeError>,
) -> Result<WriteCounts, DecodeError> {
    decompressed(body, max_size, scan)
}

/// Runs `read` on `body` decompressed (a snappy raw block of at most `max_size` bytes), in
/// this thread's reused buffer.
fn decompressed<T>(
    body: &[u8],
    max_size: usize,
    read: impl FnOnce(&[u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let size =
        snap::raw::decompress_len(body).map_err(|err| DecodeError::Snappy(err.to_string()))?;
    if size > max_size {
        return Err(DecodeError::TooLarge {
            size: Some(size),
            limit: max_size,
        });
    }
    DECOMPRESSED.with(|cell| {
        let mut buffer = cell.borrow_mut();
        buffer.resize(size, 0);
        let result = snap::raw::Decoder::new()
            .decompress(body, &mut buffer)
            .map_err(|err| DecodeError::Snappy(err.to_string()))
            .and_then(|written| read(&buffer[..written]));
        if buffer.capacity() > RETAINED_BUFFER_BYTES {
            *buffer = Vec::new();
        }
        result
    })
}

/// Scans an uncompressed `WriteRequest`, validating its structure, and counts what it carries.
pub fn scan(buf: &[u8]) -> Result<WriteCounts, DecodeError> {
    scan_validating(buf, None, &mut RefusedSeries::default())
}

/// What validation and `drop_labels` change in a request, as the scan found it.
#[derive(Default)]
struct RefusedSeries {
    /// In body order: the `timeseries` and `metadata` fields to cut or to write again.
    edits: Vec<Edit>,
    refused: u64,
    first: Option<String>,
    /// The first refused metadata entry's message: it answers only when no series was
    /// refused, as Mimir checks every series before the metadata.
    first_metadata: Option<String>,
    discarded: Discarded,
    dropped_exemplars: DroppedExemplars,
    /// Samples and histograms that repeated a timestamp of their series.
    repeated: u64,
    /// The series dropped for having no label left, and what they carried.
    unlabelled: WriteCounts,
}

/// One change to the uncompressed body.
enum Edit {
    /// A refused series or metadata entry: its whole field goes.
    Cut(std::ops::Range<usize>),
    /// A series or metadata entry written again (key `tag`, new length, its bytes with
    /// `splices` made): labels dropped, label values, histograms or a help text rewritten.
    /// `body` is its bytes in the request; the splices' ranges are in those bytes, in order.
    Rewrite {
        field: std::ops::Range<usize>,
        tag: u32,
        body: std::ops::Range<usize>,
        splices: Vec<Splice>,
    },
}

impl Edit {
    /// A rewrite's splices, with where its series' bytes are in the request; a cut has none.
    fn splices(&mut self) -> Option<(std::ops::Range<usize>, &mut Vec<Splice>)> {
        match self {
            Edit::Rewrite { body, splices, .. } => Some((body.clone(), splices)),
            Edit::Cut(_) => None,
        }
    }
}

/// [`scan`], and with `validation` each series is checked as Mimir's distributor checks it:
/// a refused series is not counted, and lands in `refused`.
fn scan_validating(
    whole: &[u8],
    validation: Option<&Validation>,
    refused: &mut RefusedSeries,
) -> Result<WriteCounts, DecodeError> {
    let mut buf = whole;
    let mut counts = WriteCounts::default();
    let (mut index, mut metadata_index) = (0u64, 0u64);
    let mut seen = SeriesCheck::new();
    let mut exemplars = PendingExemplars::default();
    while !buf.is_empty() {
        let start = whole.len() - buf.len();
        let (tag, wire_type) = key(&mut buf, "WriteRequest")?;
        match tag {
            1 => {
                let series = embedded(&mut buf, wire_type, "WriteRequest.timeseries")?;
                let mut own = WriteCounts::default();
                seen.next();
                let labels = scan_series(series, &mut own, validation.map(|v| (v, &mut seen)))
                    .map_err(|reason| {
                        DecodeError::Protobuf(format!("timeseries[{index}]: {reason}"))
                    })?;
                index += 1;
                let field = start..whole.len() - buf.len();
                // A series with no label left (none sent, or each empty or dropped) goes
                // silently, as Mimir's distributor drops it before its checks.
                if validation.map_or(labels == 0, |_| seen.unlabelled()) {
                    if validation.is_some() {
                        refused.edits.push(Edit::Cut(field));
                    }
                    own.series = 1;
                    refused.unlabelled.add(&own);
                    continue;
                }
                exemplars.samples_from(seen.earliest());
                let verdict = validation.and_then(|v| seen.verdict(v, series));
                match verdict {
                    None => {
                        let (samples_cut, histograms_cut) = seen.cut_repeats(series, 4);
                        refused.repeated += samples_cut + histograms_cut;
                        counts.series += 1;
                        counts.samples += own.samples - samples_cut;
                        counts.histograms += own.histograms - histograms_cut;
                        counts.exemplars += own.exemplars;
                        let judged = !seen.exemplars.is_empty();
                        if !seen.dropped.is_empty() || !seen.replaced.is_empty() || judged {
                            if judged {
                                let of_series = std::mem::take(&mut seen.exemplars);
                                exemplars.push(refused.edits.len(), of_series);
                            }
                            refused.edits.push(Edit::Rewrite {
                                body: field.end - series.len()..field.end,
                                field,
                                tag: 1,
                                splices: splices(&mut seen),
                            });
                        }
                    }
                    Some((reason, message)) => {
                        refused.edits.push(Edit::Cut(field));
                        refused.refused += 1;
                        refused.discarded.samples[reason as usize] += own.samples + own.histograms;
                        refused.discarded.series[reason as usize] += 1;
                        refused.first.get_or_insert(message);
                    }
                }
            }
            3 => {
                let metadata = embedded(&mut buf, wire_type, "WriteRequest.metadata")?;
                let field = start..whole.len() - buf.len();
                let at = metadata_index;
                metadata_index += 1;
                let bad = |reason: prost::DecodeError| {
                    DecodeError::Protobuf(format!("metadata[{at}]: {reason}"))
                };
                let Some(validation) = validation else {
                    <prompb::MetricMetadata as prost::Message>::decode(metadata).map_err(bad)?;
                    counts.metadata += 1;
                    continue;
                };
                // Read as bytes, as the exemplars are.
                let decoded =
                    <prompb::RawMetricMetadata as prost::Message>::decode(metadata).map_err(bad)?;
                match validate::check_metadata(decoded, &validation.limits) {
                    MetadataVerdict::Keep => counts.metadata += 1,
                    MetadataVerdict::Rewrite(with) => {
                        counts.metadata += 1;
                        refused.edits.push(Edit::Rewrite {
                            body: field.end - metadata.len()..field.end,
                            field,
                            tag: 3,
                            splices: vec![Splice {
                                range: 0..metadata.len(),
                                with,
                            }],
                        });
                    }
                    MetadataVerdict::Refuse(reason, message) => {
                        refused.edits.push(Edit::Cut(field));
                        refused.discarded.metadata[reason as usize] += 1;
                        refused.first_metadata.get_or_insert(message);
                    }
                }
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
    if let Some(validation) = validation {
        counts.exemplars -= exemplars.settle(
            validation,
            whole,
            &mut refused.edits,
            Edit::splices,
            &mut refused.dropped_exemplars,
        );
    }
    Ok(counts)
}

/// A series' changes in body order: its dropped labels (cut) and its rewritten fields.
fn splices(seen: &mut SeriesCheck) -> Vec<Splice> {
    let cut = std::mem::take(&mut seen.dropped)
        .into_iter()
        .map(|range| Splice {
            range,
            with: Vec::new(),
        });
    let mut splices: Vec<Splice> = cut.chain(std::mem::take(&mut seen.replaced)).collect();
    splices.sort_by_key(|splice| splice.range.start);
    splices
}

/// Scans one series into `counts`; with a validation, also gathers what its checks need.
/// Returns how many labels it was sent with.
fn scan_series<'a>(
    mut buf: &'a [u8],
    counts: &mut WriteCounts,
    mut validating: Option<(&Validation, &mut SeriesCheck<'a>)>,
) -> Result<u32, String> {
    let series = buf;
    let mut labels = 0u32;
    while !buf.is_empty() {
        let field_start = series.len() - buf.len();
        // Labels and samples as senders write them (a one-byte key and a one-byte length)
        // first, on two plain branches; any other field takes the general reader.
        if let Some(label) = short_field(&mut buf, 0x0a) {
            let field = field_start..series.len() - buf.len();
            scan_label(label, field, &mut labels, &mut validating)?;
            continue;
        }
        if let Some(sample) = short_field(&mut buf, 0x12) {
            scan_sample(sample, counts, &mut validating)?;
            continue;
        }
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => {
                let label = field(&mut buf, wire_type, "labels")?;
                let field = field_start..series.len() - buf.len();
                scan_label(label, field, &mut labels, &mut validating)?;
            }
            2 => {
                let sample = field(&mut buf, wire_type, "samples")?;
                scan_sample(sample, counts, &mut validating)?;
            }
            3 => {
                let exemplar = field(&mut buf, wire_type, "exemplars")?;
                match validating.as_mut() {
                    None => check::<prompb::Exemplar>(exemplar),
                    // Read as bytes: its checks do not refuse text that is not UTF-8, as Mimir's.
                    Some((_, seen)) => <prompb::RawExemplar as prost::Message>::decode(exemplar)
                        .map(|decoded| {
                            let labels = decoded.labels.iter();
                            let labels = labels.map(|l| (&l.name[..], &l.value[..]));
                            seen.exemplars.push(ExemplarSeen {
                                field: field_start..series.len() - buf.len(),
                                timestamp: decoded.timestamp,
                                invalid: validate::exemplar_content(labels, decoded.timestamp),
                            })
                        })
                        .map_err(|err| err.to_string()),
                }
                .map_err(|reason| format!("exemplars: {reason}"))?;
                counts.exemplars += 1;
            }
            4 => {
                let histogram = field(&mut buf, wire_type, "histograms")?;
                let decoded = <prompb::Histogram as prost::Message>::decode(histogram)
                    .map_err(|reason| format!("histograms: {reason}"))?;
                if let Some((validation, seen)) = validating.as_mut() {
                    let field = field_start..series.len() - buf.len();
                    seen.histogram(decoded, &validation.limits, field);
                }
                counts.histograms += 1;
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(labels)
}

/// A series' label, the `labels`-th, whose whole field is `field` in the series' bytes. With
/// a validation, a name or value that is not UTF-8 is for the series checks to refuse (Mimir
/// reads the body without checking UTF-8 and refuses only that series); without one, it makes
/// the body malformed, as prost's decode has it.
#[inline(always)]
fn scan_label<'a>(
    label: &'a [u8],
    field: std::ops::Range<usize>,
    labels: &mut u32,
    validating: &mut Option<(&Validation, &mut SeriesCheck<'a>)>,
) -> Result<(), String> {
    let at = *labels;
    *labels += 1;
    let Some((validation, seen)) = validating.as_mut() else {
        return check_label(label)
            .map(drop)
            .map_err(|reason| label_error(at, reason));
    };
    let (name, value, value_utf8) = label_parts(label).map_err(|reason| label_error(at, reason))?;
    // A label with an empty value goes before the checks, as `drop_labels`' do: Mimir
    // removes them (Prometheus stores none).
    if value.is_empty() || (validation.drop_labels.is_some() && validation.drops(name)) {
        seen.dropped.push(field);
    } else {
        seen.label_in(name, value, value_utf8, &validation.limits, field);
    }
    Ok(())
}

/// A series' sample.
#[inline(always)]
fn scan_sample(
    sample: &[u8],
    counts: &mut WriteCounts,
    validating: &mut Option<(&Validation, &mut SeriesCheck<'_>)>,
) -> Result<(), String> {
    let timestamp = check_sample(sample).map_err(|reason| format!("samples: {reason}"))?;
    if let Some((_, seen)) = validating.as_mut() {
        seen.sample(timestamp);
    }
    counts.samples += 1;
    Ok(())
}

#[cold]
#[inline(never)]
fn label_error(index: u32, reason: String) -> String {
    format!("labels[{index}]: {reason}")
}

/// A label's name and value must be well-formed UTF-8 strings; returns them (the last of
/// each, as a decode keeps; empty when missing).
#[inline(always)]
fn check_label(buf: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let (name, value, text) = match wire::plain_label(buf) {
        // The whole field ASCII (its keys and one-byte lengths are): name and value are UTF-8.
        Some(label) if wire::is_ascii(buf) => return Ok(label),
        Some((name, value)) => (name, value, is_utf8(name) && is_utf8(value)),
        None => wire::any_label(buf)?,
    };
    match text {
        true => Ok((name, value)),
        false => Err("label is not valid UTF-8".to_string()),
    }
}

/// A label's name and value as [`check_label`] reads them, and whether the value is UTF-8;
/// the name is left to the name checks (Mimir's legacy names are ASCII; under `utf8` the
/// check reads it).
#[inline(always)]
fn label_parts(buf: &[u8]) -> Result<(&[u8], &[u8], bool), String> {
    match wire::plain_label(buf) {
        Some((name, value)) if wire::is_ascii(buf) => Ok((name, value, true)),
        Some((name, value)) => Ok((name, value, is_utf8(value))),
        None => wire::any_label(buf).map(|(name, value, _)| (name, value, is_utf8(value))),
    }
}

/// [`decode`] of a remote-write 1.0 body with series validation: the counts of what passed,
/// and what was refused, with the body to forward instead (the client's bytes without the
/// refused series, re-compressed). A body with nothing refused keeps its bytes.
pub fn decode_validated(
    body: &[u8],
    max_size: usize,
    validation: &Validation,
) -> Result<Decoded, DecodeError> {
    decompressed(body, max_size, |raw| {
        let earliest = |raw: &[u8]| earliest_sample_ms(raw, 1, 4);
        let (ha, validation) = match ha_first(
            raw,
            validation,
            first_series_labels,
            count_unchecked,
            earliest,
        )? {
            HaStep::Done(decoded) => return Ok(decoded),
            HaStep::Go(ha, validation) => (ha, validation),
        };
        let validation = validation.as_ref();
        let relabelled = relabelled(raw, validation, &ha, relabel::v1);
        let raw = relabelled.as_deref().unwrap_or(raw);
        let mut found = RefusedSeries::default();
        let counts = scan_validating(raw, Some(validation), &mut found)?;
        let forward = if found.edits.is_empty() && relabelled.is_none() {
            Forward::Unchanged
        } else if counts.series + counts.metadata == 0 {
            Forward::Nothing
        } else {
            Forward::Rewritten(bytes::Bytes::from(edited(raw, &found.edits)))
        };
        let refused = found.first.or(found.first_metadata).map(|first| Refused {
            first,
            samples: found.discarded,
            series: found.refused,
        });
        Ok(Decoded {
            counts,
            forward,
            refused,
            dropped_exemplars: found.dropped_exemplars,
            repeated_timestamps: found.repeated,
            unlabelled: found.unlabelled,
            untranslated: 0,
            ha,
        })
    })
}

/// `raw` with `edits` (in body order) made, snappy-compressed: refused series and metadata
/// cut, and the others written again (key, new length, their bytes with the splices made).
fn edited(raw: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut from = 0;
    for edit in edits {
        match edit {
            Edit::Cut(field) => {
                out.extend_from_slice(&raw[from..field.start]);
                from = field.end;
            }
            Edit::Rewrite {
                field,
                tag,
                body,
                splices,
            } => {
                out.extend_from_slice(&raw[from..field.start]);
                Splice::write(&mut out, *tag, &raw[body.clone()], splices);
                from = field.end;
            }
        }
    }
    out.extend_from_slice(&raw[from..]);
    snap::raw::Encoder::new()
        .compress_vec(&out)
        .expect("snappy compresses any buffer that fits in memory")
}

/// Where a push stands after the HA tracker ([`ha_first`]). One a push, on the stack, and
/// moved once: the variants' sizes matter less than a box each push would cost.
#[allow(clippy::large_enum_variant)]
pub(super) enum HaStep<'v> {
    /// Deduplicated, or a cluster too many: the push was only read and counted.
    Done(Decoded),
    /// On to validation, with this validation: the tenant's, dropping the replica label too
    /// when the push is from the elected replica.
    Go(HaOutcome, std::borrow::Cow<'v, Validation>),
}

/// The HA tracker first, on the first series' labels (`labels` reads them, for 1.0 or 2.0),
/// as Mimir's distributor does: a push it does not accept is only read and counted
/// (`count`, for 1.0 [`count_unchecked`]).
pub(super) fn ha_first<'v>(
    raw: &[u8],
    validation: &'v Validation,
    labels: for<'a> fn(&'a [u8], &str, &str) -> Result<FirstLabels<'a>, DecodeError>,
    count: fn(&[u8], &Validation) -> Result<WriteCounts, DecodeError>,
    earliest: fn(&[u8]) -> Option<i64>,
) -> Result<HaStep<'v>, DecodeError> {
    let Some(check) = &validation.ha else {
        return Ok(HaStep::Go(
            HaOutcome::Off,
            std::borrow::Cow::Borrowed(validation),
        ));
    };
    let settings = &check.settings;
    let (cluster, replica) = labels(raw, &settings.ha_cluster_label, &settings.ha_replica_label)?;
    let ha = check.outcome(
        cluster.as_deref(),
        replica.as_deref(),
        validation.now_ms,
        || earliest(raw),
    );
    match validation.after_ha(&ha) {
        Some(validation) => Ok(HaStep::Go(ha, validation)),
        None => Ok(HaStep::Done(Decoded {
            counts: count(raw, validation)?,
            forward: Forward::Nothing,
            refused: None,
            dropped_exemplars: DroppedExemplars::default(),
            repeated_timestamps: 0,
            unlabelled: WriteCounts::default(),
            untranslated: 0,
            ha,
        })),
    }
}

/// Every sample and histogram of a push the HA tracker does not accept, which Mimir counts
/// and answers before its checks: the plain scan's count, or, for a body whose text is not
/// all UTF-8 (which the plain scan holds to prost's decode, and Mimir reads all the same),
/// the validating scan's, with what its checks would take out added back.
fn count_unchecked(raw: &[u8], validation: &Validation) -> Result<WriteCounts, DecodeError> {
    scan(raw).or_else(|strict| {
        let mut found = RefusedSeries::default();
        let kept = scan_validating(raw, Some(validation), &mut found).map_err(|_| strict)?;
        Ok(every_sample(
            kept,
            &found.discarded,
            found.repeated,
            &found.unlabelled,
        ))
    })
}

/// `kept` with the samples and histograms a validation took out added back: those it refused
/// (by reason), repeated timestamps, and series with no label left. Those go into `samples`,
/// the checks keeping no tally of which were histograms; the sum, which the HA tracker counts,
/// is exact.
pub(super) fn every_sample(
    kept: WriteCounts,
    discarded: &Discarded,
    repeated: u64,
    unlabelled: &WriteCounts,
) -> WriteCounts {
    WriteCounts {
        samples: kept.samples + discarded.samples() + repeated + unlabelled.samples,
        histograms: kept.histograms + unlabelled.histograms,
        ..kept
    }
}

/// The body the tenant's relabelling rules (`apply`, for 1.0 or 2.0) make of `raw`, when they
/// change it. For a push the HA tracker accepted, its replica label is gone before the rules
/// run, as Mimir removes it first.
pub(super) fn relabelled(
    raw: &[u8],
    validation: &Validation,
    ha: &HaOutcome,
    apply: relabel::Apply,
) -> Option<Vec<u8>> {
    let relabelling = validation.relabel.as_ref()?;
    let replica = match ha {
        HaOutcome::Accepted { replica_label, .. } => Some(replica_label.as_str()),
        _ => None,
    };
    apply(raw, relabelling, replica)
}

/// The earliest timestamp, in Unix milliseconds, of the first sample and the first histogram
/// of each series of a decompressed request (what Mimir's HA tracker reads as the push's
/// sample time), `None` when it has none. `series` and `histograms` are the request's and the
/// series' field numbers (1.0: 1 and 4; 2.0: 5 and 3); a sample's timestamp is field 2, a
/// histogram's 15, in both. A body that stops being well formed is read up to there: the scan
/// refuses it afterwards.
pub(super) fn earliest_sample_ms(raw: &[u8], series: u32, histograms: u32) -> Option<i64> {
    use wire::Fields;
    // The `tag` field of a message, as an int64 (0 when absent, proto3's default).
    let timestamp = |message: &[u8], tag: u32| {
        let mut at = 0;
        for field in Fields(message) {
            let field = field?;
            if field.tag == tag && field.wire_type == WireType::Varint {
                at = prost::encoding::decode_varint(&mut &field.payload[..]).ok()? as i64;
            }
        }
        Some(at)
    };
    let messages = |body| {
        Fields(body)
            .map_while(|field| field)
            .filter(|field| field.wire_type == WireType::LengthDelimited)
    };
    let mut earliest: Option<i64> = None;
    for one in messages(raw).filter(|field| field.tag == series) {
        let (mut sample, mut histogram) = (false, false);
        for field in messages(one.payload) {
            let (first, tag) = match field.tag {
                2 if !sample => (&mut sample, 2),
                tag if tag == histograms && !histogram => (&mut histogram, 15),
                _ => continue,
            };
            *first = true;
            if let Some(ms) = timestamp(field.payload, tag) {
                earliest = Some(earliest.map_or(ms, |e| e.min(ms)));
            }
        }
    }
    earliest
}

/// The values of a request's HA cluster and replica labels in its first series. A value that
/// is not UTF-8 is read lossily (each bad piece U+FFFD): Mimir's tracker takes it as it is,
/// and its series is then refused by the checks if the push is accepted.
pub(super) type FirstLabels<'a> = (
    Option<std::borrow::Cow<'a, str>>,
    Option<std::borrow::Cow<'a, str>>,
);

/// The values of the labels `cluster` and `replica` in the request's first series (what
/// Mimir's HA tracker reads), each `None` when the series lacks it.
fn first_series_labels<'a>(
    mut buf: &'a [u8],
    cluster: &str,
    replica: &str,
) -> Result<FirstLabels<'a>, DecodeError> {
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf, "WriteRequest")?;
        if tag != 1 {
            skip(&mut buf, wire_type, tag, "WriteRequest")?;
            continue;
        }
        let mut series = embedded(&mut buf, wire_type, "WriteRequest.timeseries")?;
        let (mut cluster_value, mut replica_value) = (None, None);
        while !series.is_empty() {
            let (tag, wire_type) = key(&mut series, "timeseries[0]")?;
            if tag != 1 {
                skip(&mut series, wire_type, tag, "timeseries[0]")?;
                continue;
            }
            let label = embedded(&mut series, wire_type, "timeseries[0].labels")?;
            let (name, value, _) = label_parts(label)
                .map_err(|reason| DecodeError::Protobuf(format!("timeseries[0]: {reason}")))?;
            let value = Some(String::from_utf8_lossy(value));
            if name == cluster.as_bytes() {
                cluster_value = value;
            } else if name == replica.as_bytes() {
                replica_value = value;
            }
        }
        return Ok((cluster_value, replica_value));
    }
    Ok((None, None))
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
    use crate::counts::SeriesReason;
    use crate::format::{decode, Format};
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

    /// Series with these sample and histogram timestamps, in order; the same in 1.0 and 2.0.
    fn timed_series() -> impl Strategy<Value = Vec<(Vec<i64>, Vec<i64>)>> {
        let times = || prop::collection::vec(any::<i64>(), 0..3);
        prop::collection::vec((times(), times()), 0..5)
    }

    /// Mimir's reading: of each series its first sample and first histogram, the earliest.
    fn mimirs_earliest(series: &[(Vec<i64>, Vec<i64>)]) -> Option<i64> {
        series
            .iter()
            .flat_map(|(samples, histograms)| samples.first().into_iter().chain(histograms.first()))
            .copied()
            .min()
    }

    proptest! {
        /// The HA tracker's sample time, read from the wire, is what Mimir reads from the
        /// decoded request, in 1.0 and 2.0.
        #[test]
        fn earliest_sample_reads_as_mimir(series in timed_series()) {
            let v1 = WriteRequest {
                timeseries: series
                    .iter()
                    .map(|(samples, histograms)| TimeSeries {
                        labels: vec![Label { name: "__name__".into(), value: "m".into() }],
                        samples: samples.iter().map(|&timestamp| Sample { value: 1.0, timestamp }).collect(),
                        histograms: histograms.iter().map(|&timestamp| Histogram { timestamp, ..Histogram::default() }).collect(),
                        ..TimeSeries::default()
                    })
                    .collect(),
                metadata: vec![],
            };
            let raw = prost::Message::encode_to_vec(&v1);
            prop_assert_eq!(earliest_sample_ms(&raw, 1, 4), mimirs_earliest(&series));
            use super::v2_proto as v2;
            let v2 = v2::Request {
                symbols: vec![String::new(), "__name__".into(), "m".into()],
                timeseries: series
                    .iter()
                    .map(|(samples, histograms)| v2::TimeSeries {
                        labels_refs: vec![1, 2],
                        samples: samples.iter().map(|&timestamp| v2::Sample { value: 1.0, timestamp }).collect(),
                        histograms: histograms.iter().map(|&timestamp| v2::Histogram { timestamp, ..Default::default() }).collect(),
                        ..Default::default()
                    })
                    .collect(),
            };
            let raw = prost::Message::encode_to_vec(&v2);
            prop_assert_eq!(earliest_sample_ms(&raw, 5, 3), mimirs_earliest(&series));
        }

        /// Any bytes: no panic, whatever it reads.
        #[test]
        fn earliest_sample_takes_any_bytes(raw in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = earliest_sample_ms(&raw, 1, 4);
            let _ = earliest_sample_ms(&raw, 5, 3);
        }
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

    /// Series that validation may refuse for any of its reasons: names from a set with
    /// `__name__`, good and bad names, and timestamps around `NOW`.
    fn checked_series() -> impl Strategy<Value = TimeSeries> {
        let name =
            prop::sample::select(vec!["__name__", "a", "b", "job", "a-b", "9x", "nnnnnnnnnn"]);
        let value = prop::sample::select(vec!["up", "x", "9m", "", "vvvvvvvvvvvv"]);
        (
            prop::collection::vec((name, value), 1..6),
            prop::collection::vec(-7_200_000i64..7_200_000, 0..3),
            prop::collection::vec(any::<u64>(), 0..2),
        )
            .prop_map(|(mut labels, offsets, histograms)| {
                labels.sort();
                TimeSeries {
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| Label {
                            name: name.into(),
                            value: value.into(),
                        })
                        .collect(),
                    samples: offsets
                        .iter()
                        .map(|offset| Sample {
                            value: 1.0,
                            timestamp: NOW + offset,
                        })
                        .collect(),
                    histograms: histograms
                        .into_iter()
                        .map(|count| Histogram {
                            count: Some(super::prompb::histogram::Count::CountInt(count)),
                            timestamp: NOW,
                            ..Histogram::default()
                        })
                        .collect(),
                    ..TimeSeries::default()
                }
            })
    }

    /// Series whose names, valid or not, have the same lengths at the same places: a metric
    /// name and three labels.
    fn look_alike_series() -> impl Strategy<Value = TimeSeries> {
        let name = prop::sample::select(vec!["job", "a-b", "9ob", "jo:"]);
        (
            prop::sample::select(vec!["up", "9p", "u-"]),
            prop::collection::vec(name, 3),
        )
            .prop_map(|(metric, names)| TimeSeries {
                labels: std::iter::once(("__name__", metric))
                    .chain(names.into_iter().map(|name| (name, "x")))
                    .map(|(name, value)| Label {
                        name: name.into(),
                        value: value.into(),
                    })
                    .collect(),
                samples: vec![Sample {
                    value: 1.0,
                    timestamp: NOW,
                }],
                ..TimeSeries::default()
            })
    }

    /// Series for the rewriting checks: values over 75 bytes on labels other than `__name__`,
    /// and integer histograms of 0 to 6 buckets at schemas -4 to 3.
    fn rewritable_series() -> impl Strategy<Value = TimeSeries> {
        let value = prop::sample::select(vec!["x".repeat(3), "v".repeat(80), "é".repeat(60)]);
        (
            prop::collection::vec((prop::sample::select(vec!["a", "b", "c"]), value), 0..3),
            prop::collection::vec((-4i32..4, prop::collection::vec(0i64..5, 0..7)), 0..3),
        )
            .prop_map(|(labels, histograms)| {
                let mut labels: Vec<Label> = labels
                    .into_iter()
                    .map(|(name, value)| Label {
                        name: name.into(),
                        value,
                    })
                    .collect();
                labels.sort_by(|a, b| a.name.cmp(&b.name));
                labels.dedup_by(|a, b| a.name == b.name);
                labels.insert(
                    0,
                    Label {
                        name: "__name__".into(),
                        value: "h".into(),
                    },
                );
                TimeSeries {
                    labels,
                    samples: vec![Sample {
                        value: 1.0,
                        timestamp: NOW,
                    }],
                    histograms: histograms
                        .into_iter()
                        .map(|(schema, deltas)| Histogram {
                            count: Some(super::prompb::histogram::Count::CountInt(1)),
                            schema,
                            timestamp: NOW,
                            positive_spans: vec![BucketSpan {
                                offset: -1,
                                length: deltas.len() as u32,
                            }],
                            positive_deltas: deltas,
                            ..Histogram::default()
                        })
                        .collect(),
                    ..TimeSeries::default()
                }
            })
    }

    /// Every rewriting check on: values over 75 bytes truncated (or dropped), histograms over
    /// 3 buckets reduced, help texts over 8 bytes cut.
    fn rewriting(drop: bool) -> Validation {
        use runtime_config::validation::LabelValueLengthOverLimitStrategy;
        Validation::new(
            runtime_config::ValidationLimits {
                max_label_value_length: 75,
                label_value_length_over_limit_strategy: if drop {
                    LabelValueLengthOverLimitStrategy::Drop
                } else {
                    LabelValueLengthOverLimitStrategy::Truncate
                },
                max_metadata_length: 8,
                max_native_histogram_buckets: 3,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        )
    }

    const NOW: i64 = 1_700_000_000_000;

    fn tight() -> Validation {
        Validation::new(
            runtime_config::ValidationLimits {
                max_label_names_per_series: 4,
                max_label_name_length: 8,
                max_label_value_length: 10,
                creation_grace_period: std::time::Duration::from_secs(600),
                past_grace_period: std::time::Duration::from_secs(3600),
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        )
        .dropping(Some(std::sync::Arc::from(vec!["b".to_string()])))
    }

    proptest! {
        /// What validation forwards is exactly what it counted, and passes validation again;
        /// what it refuses adds up with what it kept to the whole request.
        #[test]
        fn validation_forwards_what_it_counts(
            timeseries in prop::collection::vec(checked_series(), 0..8),
            with_metadata in any::<bool>(),
        ) {
            let request = WriteRequest {
                timeseries,
                metadata: if with_metadata {
                    vec![MetricMetadata { r#type: 1, metric_family_name: "up".into(), help: "h".into(), unit: String::new() }]
                } else {
                    vec![]
                },
            };
            let body = request.encode_snappy();
            let whole = decode(&body, usize::MAX, Format::V1).unwrap();
            // Series whose every label value is empty go silently (`unlabelled`).
            let Decoded { counts, forward, refused, unlabelled, .. } = decode_validated(&body, usize::MAX, &tight()).unwrap();
            let dropped: u64 = refused.as_ref().map_or(0, |refused| refused.samples.samples());
            prop_assert_eq!(counts.samples + counts.histograms + dropped + unlabelled.samples + unlabelled.histograms, whole.samples + whole.histograms);
            prop_assert_eq!(counts.series + refused.as_ref().map_or(0, |r| r.series) + unlabelled.series, whole.series);
            if let Some(refused) = &refused {
                prop_assert!(refused.first.contains("(err-weir-"));
            }
            match forward {
                Forward::Unchanged => prop_assert!(refused.is_none()),
                Forward::Rewritten(rewritten) => {
                    prop_assert_eq!(decode(&rewritten, usize::MAX, Format::V1).unwrap(), counts);
                    let again = decode_validated(&rewritten, usize::MAX, &tight()).unwrap();
                    prop_assert_eq!((again.counts, again.forward, again.refused), (counts, Forward::Unchanged, None));
                    // No dropped label is left.
                    let raw = snap::raw::Decoder::new().decompress_vec(&rewritten).unwrap();
                    let forwarded = <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap();
                    prop_assert!(forwarded.timeseries.iter().all(|series| series.labels.iter().all(|label| label.name != "b")));
                }
                Forward::Nothing => prop_assert_eq!(counts.series + counts.metadata, 0),
            }
        }

        /// A label value that is not UTF-8 refuses its series and no other: a request forwards
        /// the series it forwards with that value written as UTF-8, less those that carry it.
        #[test]
        fn a_value_not_utf8_refuses_its_series_and_no_other(
            drawn in prop::collection::vec(
                (checked_series(), any::<prop::sample::Index>(), any::<bool>()),
                1..8,
            ),
        ) {
            let timeseries: Vec<TimeSeries> = drawn
                .into_iter()
                .map(|(mut series, at, taint)| {
                    if taint {
                        let at = at.index(series.labels.len());
                        series.labels[at].value = "BAD".into();
                    }
                    series
                })
                .collect();
            let tainted = |series: &TimeSeries| series.labels.iter().any(|l| l.value == "BAD");
            prop_assume!(timeseries.iter().any(tainted));
            let request = WriteRequest { timeseries, metadata: vec![] };
            let kept = |body: &[u8]| -> (u64, Vec<TimeSeries>) {
                let decoded = decode_validated(body, usize::MAX, &tight()).unwrap();
                let series = match decoded.forward {
                    Forward::Unchanged => request.timeseries.clone(),
                    Forward::Rewritten(rewritten) => {
                        let raw = snap::raw::Decoder::new().decompress_vec(&rewritten).unwrap();
                        <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap().timeseries
                    }
                    Forward::Nothing => vec![],
                };
                (decoded.counts.series, series)
            };
            let (_, clean) = kept(&request.encode_snappy());
            let (series, not_utf8) = kept(&with_bytes(&request, b"BAD", b"B\xffD"));
            let expected: Vec<TimeSeries> = clean.into_iter().filter(|s| !tainted(s)).collect();
            prop_assert_eq!(series as usize, not_utf8.len());
            prop_assert_eq!(not_utf8, expected);
        }

        /// Each series is judged as if it came alone: a request forwards the series that its
        /// series, sent one a request, would each forward. (The scan remembers the names that
        /// passed in earlier series of a request, by position; a different name of the same
        /// length in the same place, such as `a-b` after `job`, must still be checked.)
        #[test]
        fn each_series_is_judged_as_if_it_came_alone(
            timeseries in prop::collection::vec(prop_oneof![checked_series(), look_alike_series()], 1..8),
        ) {
            let kept = |timeseries: Vec<TimeSeries>| -> Vec<TimeSeries> {
                let body = WriteRequest { timeseries: timeseries.clone(), metadata: vec![] }.encode_snappy();
                match decode_validated(&body, usize::MAX, &tight()).unwrap().forward {
                    Forward::Unchanged => timeseries,
                    Forward::Rewritten(rewritten) => {
                        let raw = snap::raw::Decoder::new().decompress_vec(&rewritten).unwrap();
                        <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap().timeseries
                    }
                    Forward::Nothing => vec![],
                }
            };
            let alone: Vec<TimeSeries> =
                timeseries.iter().flat_map(|series| kept(vec![series.clone()])).collect();
            prop_assert_eq!(kept(timeseries), alone);
        }

        /// With the checks that rewrite (truncate or drop, histogram reduction, help cut):
        /// what is forwarded is what was counted, passes again unchanged, and is within every
        /// limit; metadata refused and kept add up to what was sent.
        #[test]
        fn rewriting_validation_forwards_what_it_counts(
            timeseries in prop::collection::vec(rewritable_series(), 0..6),
            metadata in prop::collection::vec(
                (prop::sample::select(vec!["", "up", "too_long_name"]), prop::sample::select(vec!["", "h", "é long help"])),
                0..3,
            ),
            drop in any::<bool>(),
        ) {
            let request = WriteRequest {
                timeseries,
                metadata: metadata
                    .into_iter()
                    .map(|(name, help)| MetricMetadata { r#type: 1, metric_family_name: name.into(), help: help.into(), unit: String::new() })
                    .collect(),
            };
            let validation = rewriting(drop);
            let body = request.encode_snappy();
            let whole = decode(&body, usize::MAX, Format::V1).unwrap();
            let Decoded { counts, forward, refused, repeated_timestamps, .. } = decode_validated(&body, usize::MAX, &validation).unwrap();
            let discarded = refused.as_ref().map(|refused| refused.samples).unwrap_or_default();
            // The series' histograms all share NOW: all but the first repeat it.
            prop_assert_eq!(counts.samples + counts.histograms + discarded.samples() + repeated_timestamps, whole.samples + whole.histograms);
            prop_assert_eq!(counts.metadata + discarded.metadata(), whole.metadata);
            match forward {
                Forward::Unchanged => prop_assert!(refused.is_none()),
                Forward::Rewritten(rewritten) => {
                    prop_assert_eq!(decode(&rewritten, usize::MAX, Format::V1).unwrap(), counts);
                    let again = decode_validated(&rewritten, usize::MAX, &validation).unwrap();
                    prop_assert_eq!((again.counts, again.forward, again.refused), (counts, Forward::Unchanged, None));
                    let raw = snap::raw::Decoder::new().decompress_vec(&rewritten).unwrap();
                    let forwarded = <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap();
                    for series in &forwarded.timeseries {
                        prop_assert!(series.labels.iter().all(|label| label.value.len() <= 75));
                        prop_assert!(series.histograms.iter().all(|h| h.positive_deltas.len() + h.negative_deltas.len() <= 3));
                        prop_assert!(series.histograms.len() <= 1, "one histogram at NOW");
                    }
                    prop_assert!(forwarded.metadata.iter().all(|m| m.help.len() <= 8 && !m.metric_family_name.is_empty()));
                }
                Forward::Nothing => prop_assert_eq!(counts.series + counts.metadata, 0),
            }
        }

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
            if let Ok(decoded) = <Sample as prost::Message>::decode(bytes.as_slice()) {
                prop_assert_eq!(check_sample(&bytes), Ok(decoded.timestamp));
            }
        }

        #[test]
        fn the_label_check_agrees_with_prost(
            name in ".{0,12}",
            value in prop_oneof![".{0,12}", ".{120,140}"],
            flip in prop::option::of(any::<(usize, u8)>()),
            tail in prop::collection::vec(any::<u8>(), 0..4),
        ) {
            // A real label, perhaps with one byte changed and junk after it: the hand-written
            // check (its plain fast path, or the general reader) accepts exactly what prost's
            // decode accepts, and reads the same name and value.
            let mut bytes = prost::Message::encode_to_vec(&Label { name, value });
            if let (Some((at, byte)), false) = (flip, bytes.is_empty()) {
                let at = at % bytes.len();
                bytes[at] ^= byte;
            }
            bytes.extend(tail);
            match (check_label(&bytes), <Label as prost::Message>::decode(bytes.as_slice())) {
                (Ok((name, value)), Ok(label)) => {
                    prop_assert_eq!(name, label.name.as_bytes());
                    prop_assert_eq!(value, label.value.as_bytes());
                }
                (Err(_), Err(_)) => {}
                (ours, prost) => prop_assert!(false, "check_label {:?}, prost {:?}", ours, prost),
            }
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
        // a series with no labels is no error: it counts for nothing (Mimir drops it)
        assert_eq!(scan(&[0x0a, 0x00]), Ok(WriteCounts::default()));
        // timeseries with the wrong wire type
        let err = scan(&[0x08, 0x01]).unwrap_err().to_string();
        assert!(err.contains("wire type Varint"), "{err}");
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

    /// A name or value sent twice: prost's decode checks every occurrence as UTF-8, the one
    /// it replaces too, and so does the scan without a validation (the fuzz target found a
    /// label whose first name was not UTF-8 and its second was). With one, only the last
    /// value counts, as Mimir keeps it.
    #[test]
    fn a_replaced_name_or_value_must_be_utf8_too_without_a_validation() {
        for (first, second) in [(1u8, 1u8), (2, 2)] {
            let mut label = vec![first << 3 | 2, 2, b'a', 0xff, second << 3 | 2, 1, b'b'];
            if first == 2 {
                // A name, so that the value's check is the one that fails.
                label.splice(0..0, [0x0a, 1, b'n']);
            }
            assert!(<Label as prost::Message>::decode(label.as_slice()).is_err());
            assert_eq!(
                check_label(&label),
                Err("label is not valid UTF-8".to_string())
            );
        }
        let value_replaced = [0x0a, 1, b'n', 0x12, 2, b'a', 0xff, 0x12, 1, b'b'];
        assert_eq!(
            label_parts(&value_replaced),
            Ok((&b"n"[..], &b"b"[..], true))
        );
    }

    /// Labels with an empty value are removed before the checks, as Mimir removes them: they
    /// neither count towards the label limit nor are checked, and the receiver never sees
    /// them; a series whose `__name__` is empty has no metric name.
    #[test]
    fn labels_with_an_empty_value_are_removed_first() {
        let label = |name: &str, value: &str| Label {
            name: name.into(),
            value: value.into(),
        };
        let sample = vec![Sample {
            value: 1.0,
            timestamp: NOW,
        }];
        let with_empty = TimeSeries {
            labels: vec![
                label("__name__", "up"),
                label("a", "1"),
                label("bad-name", ""),
                label("c", "1"),
                label("d", ""),
                label("e", "1"),
            ],
            samples: sample.clone(),
            ..TimeSeries::default()
        };
        let request = WriteRequest {
            timeseries: vec![with_empty],
            metadata: vec![],
        };
        // tight(): at most 4 labels, `b` dropped; the series has 4 once its empty ones go.
        let decoded = decode_validated(&request.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!(decoded.refused, None);
        let Forward::Rewritten(body) = decoded.forward else {
            panic!("{:?}", decoded.forward);
        };
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let forwarded = <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap();
        assert_eq!(
            forwarded.timeseries[0].labels,
            vec![
                label("__name__", "up"),
                label("a", "1"),
                label("c", "1"),
                label("e", "1")
            ]
        );
        let nameless = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![label("__name__", ""), label("a", "1")],
                samples: sample,
                ..TimeSeries::default()
            }],
            metadata: vec![],
        };
        let refused = decode_validated(&nameless.encode_snappy(), usize::MAX, &tight())
            .unwrap()
            .refused
            .unwrap();
        assert!(
            refused.first.contains("(err-weir-missing-metric-name)")
                && refused.first.contains("series: '{a=\"1\"}'"),
            "{}",
            refused.first
        );
    }

    /// `request` encoded and compressed, with each `from` in its bytes made `to` (of one
    /// length): how a test writes a label that is not UTF-8, which prost's `String` cannot
    /// hold.
    fn with_bytes(request: &WriteRequest, from: &[u8], to: &[u8]) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let mut raw = prost::Message::encode_to_vec(request);
        let mut found = 0;
        while let Some(at) = raw.windows(from.len()).position(|bytes| bytes == from) {
            raw[at..at + from.len()].copy_from_slice(to);
            found += 1;
        }
        assert!(found > 0, "no {from:?} in the request");
        snap::raw::Encoder::new().compress_vec(&raw).unwrap()
    }

    /// The first refusal's reason and message for these series, `BAD` in them written as
    /// `B\xffD` (not UTF-8), under `validation`.
    fn not_utf8_refusal(
        series: &[&[(&str, &str)]],
        validation: &Validation,
    ) -> (Option<SeriesReason>, String) {
        let request = WriteRequest {
            timeseries: series.iter().map(|labels| at_now(labels)).collect(),
            metadata: vec![],
        };
        let body = with_bytes(&request, b"BAD", b"B\xffD");
        let decoded = decode_validated(&body, usize::MAX, validation).unwrap();
        let Some(refused) = decoded.refused else {
            return (None, String::new());
        };
        let reason = SeriesReason::ALL
            .into_iter()
            .find(|reason| refused.samples.samples[*reason as usize] > 0);
        (reason, refused.first)
    }

    /// Mimir reads a body without checking UTF-8, and refuses only a series whose label value
    /// is not (`label_value_invalid`): the other series are written. Without a validation the
    /// scan still holds the body to prost's decode, which refuses it.
    #[test]
    fn a_label_value_that_is_not_utf8_refuses_only_its_series() {
        let request = WriteRequest {
            timeseries: vec![
                at_now(&[("__name__", "up"), ("a", "BAD")]),
                at_now(&[("__name__", "up"), ("a", "good")]),
            ],
            metadata: vec![],
        };
        let body = with_bytes(&request, b"BAD", b"B\xffD");
        let decoded = decode_validated(&body, usize::MAX, &tight()).unwrap();
        assert_eq!((decoded.counts.series, decoded.counts.samples), (1, 1));
        let refused = decoded.refused.unwrap();
        assert_eq!(refused.series, 1);
        let invalid = SeriesReason::LabelValueInvalid as usize;
        assert_eq!(refused.samples.samples[invalid], 1);
        assert_eq!(refused.samples.samples.iter().sum::<u64>(), 1);
        assert_eq!(
            refused.first,
            "received a series with invalid value in label 'a': 'B\u{fffd}D' metric: 'up' \
             (err-weir-label-value-invalid)."
        );
        let Forward::Rewritten(forward) = decoded.forward else {
            panic!("{:?}", decoded.forward);
        };
        let raw = snap::raw::Decoder::new().decompress_vec(&forward).unwrap();
        let forwarded = <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap();
        assert_eq!(forwarded.timeseries, vec![request.timeseries[1].clone()]);
        assert!(matches!(
            decode(&body, usize::MAX, Format::V1),
            Err(DecodeError::Protobuf(reason)) if reason.contains("not valid UTF-8")
        ));
    }

    /// Mimir checks an exemplar's labels and a metadata entry without reading them as UTF-8:
    /// such a label value or help passes, counted and forwarded as sent. Without a validation
    /// the scan still holds them to prost's decode.
    #[test]
    fn exemplar_labels_and_metadata_that_are_not_utf8_pass_as_in_mimir() {
        let exemplar = |value: &str| Exemplar {
            labels: vec![Label {
                name: "trace_id".into(),
                value: value.into(),
            }],
            value: 1.0,
            timestamp: NOW,
        };
        let request = WriteRequest {
            timeseries: vec![TimeSeries {
                exemplars: vec![
                    exemplar("BAD"),
                    exemplar(&format!("BAD{}", "x".repeat(117))),
                ],
                ..at_now(&[("__name__", "up")])
            }],
            metadata: vec![MetricMetadata {
                r#type: 1,
                metric_family_name: "up".into(),
                help: "BAD help".into(),
                unit: String::new(),
            }],
        };
        let body = with_bytes(&request, b"BAD", b"B\xffD");
        let on = Validation::new(
            runtime_config::ValidationLimits {
                max_global_exemplars_per_user: 100_000,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        );
        let decoded = decode_validated(&body, usize::MAX, &on).unwrap();
        assert!(decoded.refused.is_none(), "{:?}", decoded.refused);
        let counts = &decoded.counts;
        assert_eq!(
            (counts.samples, counts.exemplars, counts.metadata),
            (1, 2, 1)
        );
        assert_eq!(decoded.dropped_exemplars, DroppedExemplars::default());
        assert!(
            matches!(decoded.forward, Forward::Unchanged),
            "{:?}",
            decoded.forward
        );
        // One character more (128 + 1, the bad byte one of them) and the second goes.
        let longer = WriteRequest {
            timeseries: vec![TimeSeries {
                exemplars: vec![
                    exemplar("BAD"),
                    exemplar(&format!("BAD{}", "x".repeat(118))),
                ],
                ..request.timeseries[0].clone()
            }],
            ..request.clone()
        };
        let body = with_bytes(&longer, b"BAD", b"B\xffD");
        let decoded = decode_validated(&body, usize::MAX, &on).unwrap();
        assert_eq!(decoded.counts.exemplars, 1);
        let strict = decode(&body, usize::MAX, Format::V1);
        assert!(
            matches!(&strict, Err(DecodeError::Protobuf(reason)) if reason.contains("UTF-8")),
            "{strict:?}"
        );
    }

    /// The UTF-8 check is Mimir's, in its order: after the metric name, the label name and its
    /// length, before the value's length (under `truncate` too: such a value is not cut), and
    /// on the labels sorted when they came out of order. Under `utf8` names, a name that is
    /// not UTF-8 is invalid, as under the legacy rules.
    #[test]
    fn a_label_that_is_not_utf8_fails_in_mimirs_order() {
        use runtime_config::validation::{LabelValueLengthOverLimitStrategy, NameValidationScheme};
        let tight = tight();
        let reason = |series: &[(&str, &str)], validation: &Validation| {
            not_utf8_refusal(&[series], validation).0
        };
        let up = ("__name__", "up");
        let long = ("a", "BADxxxxxxxxxxx");
        assert_eq!(
            reason(&[up, ("a", "BAD")], &tight),
            Some(SeriesReason::LabelValueInvalid)
        );
        assert_eq!(
            reason(&[up, ("BAD", "BAD")], &tight),
            Some(SeriesReason::LabelInvalid)
        );
        assert_eq!(
            reason(&[up, ("aaaaaaaaaa", "BAD")], &tight),
            Some(SeriesReason::LabelNameTooLong)
        );
        assert_eq!(
            reason(&[up, long], &tight),
            Some(SeriesReason::LabelValueInvalid)
        );
        assert_eq!(
            reason(&[("__name__", "BAD"), ("a", "BAD")], &tight),
            Some(SeriesReason::MetricNameInvalid)
        );
        // Out of order: sorted, `a` comes before `z`'s duplicate.
        let (unsorted, message) =
            not_utf8_refusal(&[&[up, ("z", "1"), ("a", "BAD"), ("z", "2")]], &tight);
        assert_eq!(unsorted, Some(SeriesReason::LabelValueInvalid));
        assert!(message.contains("label 'a': 'B\u{fffd}D'"), "{message}");
        let truncating = Validation::new(
            runtime_config::ValidationLimits {
                max_label_value_length: 10,
                label_value_length_over_limit_strategy: LabelValueLengthOverLimitStrategy::Truncate,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        );
        assert_eq!(
            reason(&[up, long], &truncating),
            Some(SeriesReason::LabelValueInvalid)
        );
        let utf8 = Validation::new(
            runtime_config::ValidationLimits {
                name_validation_scheme: NameValidationScheme::Utf8,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        );
        assert_eq!(
            reason(&[up, ("a.BAD", "1")], &utf8),
            Some(SeriesReason::LabelInvalid)
        );
        assert_eq!(
            reason(&[("__name__", "up.BAD")], &utf8),
            Some(SeriesReason::MetricNameInvalid)
        );
        assert_eq!(
            reason(&[up, ("a.é", "BAD")], &utf8),
            Some(SeriesReason::LabelValueInvalid)
        );
        // A label dropped (`b`, by tight()'s drop_labels) or with an empty value goes before
        // the checks, whatever its bytes.
        assert_eq!(reason(&[up, ("b", "BAD")], &tight), None);
    }

    /// A series of these labels with one sample at `NOW`.
    fn at_now(labels: &[(&str, &str)]) -> TimeSeries {
        TimeSeries {
            labels: labels
                .iter()
                .map(|(name, value)| Label {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            samples: vec![Sample {
                value: 1.0,
                timestamp: NOW,
            }],
            ..TimeSeries::default()
        }
    }

    /// Mimir sorts a series' labels before its checks: two labels of one name that were not
    /// adjacent are a duplicate, and the first label to fail is the first in name order. A
    /// series out of order that passes is kept, and forwarded as sent.
    #[test]
    fn labels_out_of_order_are_checked_as_mimir_sorts_them() {
        let request = |labels: &[(&str, &str)]| {
            WriteRequest {
                timeseries: vec![at_now(labels)],
                metadata: vec![],
            }
            .encode_snappy()
        };
        let refusal = |labels: &[(&str, &str)]| {
            decode_validated(&request(labels), usize::MAX, &tight())
                .unwrap()
                .refused
                .map(|refused| refused.first)
        };
        let first = refusal(&[("__name__", "up"), ("job", "a"), ("a", "1"), ("job", "b")])
            .expect("two `job` labels");
        assert!(
            first.contains("(err-weir-duplicate-label-names)") && first.contains("label: 'job'"),
            "{first}"
        );
        // Sent first, `zz-x` is not a legacy name; sorted first, `aaaaaaaaa` is over tight()'s
        // 8 bytes, and Mimir names that one.
        let first = refusal(&[("__name__", "up"), ("zz-x", "1"), ("aaaaaaaaa", "1")])
            .expect("both labels are bad");
        assert!(
            first.contains("(err-weir-label-name-too-long)") && first.contains("'aaaaaaaaa'"),
            "{first}"
        );
        let kept = decode_validated(
            &request(&[("job", "a"), ("__name__", "up")]),
            usize::MAX,
            &tight(),
        )
        .unwrap();
        assert_eq!((kept.forward, kept.refused), (Forward::Unchanged, None));
    }

    /// A series with no labels, or none left once the empty values and `drop_labels` go, is
    /// dropped silently, as Mimir's distributor drops it: not counted, not charged, not
    /// refused, not forwarded; with nothing else, nothing is forwarded and nothing refused.
    #[test]
    fn a_series_with_no_label_left_goes_silently() {
        let kept = at_now(&[("__name__", "up")]);
        let request = WriteRequest {
            timeseries: vec![
                at_now(&[]),
                kept.clone(),
                at_now(&[("job", "")]),
                // `b` is dropped by tight().
                at_now(&[("b", "1"), ("job", "")]),
            ],
            metadata: vec![],
        };
        let of = |series: u64| WriteCounts {
            series,
            samples: series,
            ..WriteCounts::default()
        };
        // Without validation only the series sent with no labels is left out.
        assert_eq!(
            decode(&request.encode_snappy(), usize::MAX, Format::V1),
            Ok(of(3))
        );
        let decoded = decode_validated(&request.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!((decoded.counts, decoded.unlabelled), (of(1), of(3)));
        assert_eq!(decoded.refused, None);
        let Forward::Rewritten(body) = decoded.forward else {
            panic!("the unlabelled series are cut: {:?}", decoded.forward);
        };
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let forwarded = <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap();
        assert_eq!(forwarded.timeseries, vec![kept]);
        let nothing = WriteRequest {
            timeseries: vec![at_now(&[]), at_now(&[("job", "")])],
            metadata: vec![],
        };
        let decoded = decode_validated(&nothing.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!(
            (decoded.counts, decoded.forward, decoded.refused),
            (WriteCounts::default(), Forward::Nothing, None)
        );
    }

    /// Exemplars of every kind Mimir's checks tell apart: no labels, blank ones, too long
    /// (in characters, not bytes), no timestamp, and times around `NOW`.
    fn exemplar() -> impl Strategy<Value = Exemplar> {
        let labels = prop::sample::select(vec![
            vec![],
            vec![("trace_id", "abc".to_string())],
            vec![("", "abc".to_string())],
            vec![("trace_id", String::new())],
            vec![("t", "é".repeat(127))],
            vec![("t", "é".repeat(128))],
            vec![("span_id", "1".to_string()), ("trace_id", "2".to_string())],
        ]);
        let minute = 60_000;
        // Every minute around the window's start (5 minutes before the earliest sample, which
        // lies within 3 minutes of NOW), and its end (10 minutes after NOW) and just past it.
        let timestamp = prop::sample::select(vec![
            0,
            -5,
            NOW,
            NOW - 2 * minute,
            NOW - 3 * minute,
            NOW - 4 * minute,
            NOW - 5 * minute,
            NOW - 6 * minute,
            NOW - 7 * minute,
            NOW - 8 * minute,
            NOW - 9 * minute,
            NOW - 30 * minute,
            NOW + 10 * minute,
            NOW + 10 * minute + 1,
            NOW + 20 * minute,
        ]);
        (labels, timestamp).prop_map(|(labels, timestamp)| Exemplar {
            labels: labels
                .into_iter()
                .map(|(name, value)| Label {
                    name: name.into(),
                    value,
                })
                .collect(),
            value: 1.0,
            timestamp,
        })
    }

    /// Valid series with 0 to 2 samples on the minutes from 3 before `NOW` to 2 after, and 0
    /// to 4 exemplars.
    fn exemplar_series() -> impl Strategy<Value = TimeSeries> {
        (
            0u32..1000,
            prop::collection::vec(-3i64..3, 0..3),
            prop::collection::vec(exemplar(), 0..5),
        )
            .prop_map(|(id, minutes, exemplars)| TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "up".into(),
                    },
                    Label {
                        name: "id".into(),
                        value: id.to_string(),
                    },
                ],
                samples: minutes
                    .into_iter()
                    .map(|minutes| Sample {
                        value: 1.0,
                        timestamp: NOW + minutes * 60_000,
                    })
                    .collect(),
                exemplars,
                ..TimeSeries::default()
            })
    }

    /// Mimir's exemplar rules written out from its distributor (`validateExemplars`,
    /// `validateExemplar`, `validateExemplarTimestamp` and the window of
    /// `prePushValidationMiddleware`), on decoded series: the exemplars each series keeps, and
    /// the drops by reason.
    fn mimir_exemplars(
        series: &[TimeSeries],
        limits: &runtime_config::ValidationLimits,
    ) -> (Vec<Vec<Exemplar>>, DroppedExemplars) {
        use crate::counts::ExemplarReason as R;
        let mut dropped = DroppedExemplars::default();
        let earliest = series
            .iter()
            .flat_map(|s| s.samples.iter().map(|sample| sample.timestamp))
            .min();
        let past = limits.past_grace_period.as_millis() as i64;
        let min_ts = match earliest {
            None => 0,
            Some(earliest) if past > 0 => (earliest - 300_000).max(NOW - past),
            Some(earliest) => earliest - 300_000,
        };
        let max_ts = NOW + limits.creation_grace_period.as_millis() as i64;
        let kept = series
            .iter()
            .map(|s| {
                if limits.max_global_exemplars_per_user == 0 {
                    return vec![];
                }
                let mut exemplars = s.exemplars.clone();
                let cap = limits.max_exemplars_per_series_per_request as usize;
                if cap > 0 && exemplars.len() > cap {
                    dropped[R::TooManyPerSeries as usize] += (exemplars.len() - cap) as u64;
                    exemplars.truncate(cap);
                }
                exemplars.retain(|e| {
                    let length: usize = e
                        .labels
                        .iter()
                        .map(|l| l.name.chars().count() + l.value.chars().count())
                        .sum();
                    let reason = if e.labels.is_empty() {
                        Some(R::LabelsMissing)
                    } else if e.timestamp == 0 {
                        Some(R::TimestampInvalid)
                    } else if length > 128 {
                        Some(R::LabelsTooLong)
                    } else if !e
                        .labels
                        .iter()
                        .any(|l| !l.name.is_empty() && !l.value.is_empty())
                    {
                        Some(R::LabelsBlank)
                    } else if e.timestamp < min_ts {
                        Some(R::TooOld)
                    } else if e.timestamp > max_ts {
                        Some(R::TooFarInFuture)
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        dropped[reason as usize] += 1;
                    }
                    reason.is_none()
                });
                // Kept out of order, Mimir sorts them by time (stably here: Mimir's sort may
                // put two of one time either way).
                exemplars.sort_by_key(|exemplar| exemplar.timestamp);
                exemplars
            })
            .collect();
        (kept, dropped)
    }

    proptest! {
        /// Each series forwards the exemplars Mimir's rules keep, sorted by time, and nothing
        /// else of it changes; the charge counts those, and the drops are counted by reason.
        #[test]
        fn exemplars_are_kept_as_mimir_keeps_them(
            timeseries in prop::collection::vec(exemplar_series(), 1..5),
            on in any::<bool>(),
            cap in prop::sample::select(vec![0u32, 1, 2]),
            past_grace_minutes in prop::sample::select(vec![0u64, 2, 60]),
        ) {
            let limits = runtime_config::ValidationLimits {
                max_global_exemplars_per_user: if on { 100_000 } else { 0 },
                max_exemplars_per_series_per_request: cap,
                past_grace_period: std::time::Duration::from_secs(past_grace_minutes * 60),
                ..runtime_config::ValidationLimits::default()
            };
            // Series with samples older than the past grace period would be refused whole.
            let timeseries: Vec<TimeSeries> = timeseries
                .into_iter()
                .map(|mut series| {
                    if past_grace_minutes == 2 {
                        series.samples.retain(|sample| sample.timestamp >= NOW - 60_000);
                    }
                    series
                })
                .collect();
            let (kept, dropped) = mimir_exemplars(&timeseries, &limits);
            let request = WriteRequest { timeseries: timeseries.clone(), metadata: vec![] };
            let body = request.encode_snappy();
            let decoded = decode_validated(&body, usize::MAX, &Validation::new(limits, NOW)).unwrap();
            prop_assert!(decoded.refused.is_none());
            prop_assert_eq!(decoded.dropped_exemplars, dropped);
            prop_assert_eq!(decoded.counts.exemplars, kept.iter().map(|k| k.len() as u64).sum::<u64>());
            let unchanged = matches!(decoded.forward, Forward::Unchanged);
            let forwarded = match decoded.forward {
                Forward::Unchanged => request.clone(),
                Forward::Rewritten(rewritten) => {
                    let raw = snap::raw::Decoder::new().decompress_vec(&rewritten).unwrap();
                    <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap()
                }
                Forward::Nothing => WriteRequest::default(),
            };
            prop_assert_eq!(forwarded.timeseries.len(), timeseries.len());
            let mut repeated = 0;
            for ((sent, got), kept) in timeseries.iter().zip(&forwarded.timeseries).zip(kept) {
                prop_assert_eq!(&got.exemplars, &kept);
                prop_assert_eq!(&got.labels, &sent.labels);
                // Mimir's deduplication: a sample whose timestamp an earlier one had goes.
                let mut first = sent.samples.clone();
                let mut times = std::collections::HashSet::new();
                first.retain(|sample| times.insert(sample.timestamp));
                repeated += sent.samples.len() - first.len();
                prop_assert_eq!(&got.samples, &first);
            }
            prop_assert_eq!(decoded.repeated_timestamps, repeated as u64);
            // Unchanged exactly when every exemplar and sample stayed, in order.
            let sent: usize = timeseries.iter().map(|s| s.exemplars.len()).sum();
            let in_order = timeseries.iter().all(|s| s.exemplars.is_sorted_by_key(|e| e.timestamp));
            prop_assert_eq!(unchanged, decoded.counts.exemplars == sent as u64 && repeated == 0 && in_order);
        }
    }
}
