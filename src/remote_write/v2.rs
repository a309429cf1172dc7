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
//!
//! With a [`Validation`] ([`decode_validated`]), each series is checked as Mimir's distributor
//! checks the 1.0 series it turns it into: its labels, resolved through the symbols, its
//! sample and histogram timestamps and its native histograms' buckets go through the same
//! [`SeriesCheck`] as 1.0's. A refused series' `timeseries` field is cut; a series that loses
//! labels to `drop_labels` gets its `labels_refs` written again without them (the symbols
//! stay: unused symbols are allowed), and a histogram over `max_native_histogram_buckets` is
//! written again at a lower resolution, as on 1.0. A request with nothing to change keeps its
//! bytes.
//!
//! A new text needs a new symbol. Under `label_value_length_over_limit_strategy` `truncate`
//! or `drop`, a label value over `max_label_value_length` becomes the shortened value 1.0
//! writes, and a help text over `max_metadata_length` is cut as 1.0 cuts it: each new text is
//! appended once to the request's symbols, at the end of the body (repeated fields concatenate
//! in stream order, so its index is the request's symbol count plus its place among the
//! appended), and the series' `labels_refs` or `metadata` is written again to point at it.
//!
//! Metadata rides on its series in 2.0, so it goes with a refused series and is not charged;
//! Mimir, which holds a decoded request's metadata apart from its series, keeps it. Another
//! kept series of the same family still carries (and is charged for) the family's entry.
//! Mimir keeps the first entry of each family and checks it against `max_metadata_length`;
//! here the first kept series' entry is the family's: a metric name or unit too long refuses
//! it (counted by reason, not charged) and cuts the `metadata` of every kept series of the
//! family, the series staying. A later entry of a kept family, which Mimir ignores, is only
//! held to the same lengths, so that nothing over the limit is forwarded.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;

use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, skip_field, DecodeContext, WireType,
};

use super::v2_proto;
use super::validate::{
    check_metadata, exemplar_content, shortened_value, ExemplarSeen, MetadataVerdict,
    PendingExemplars, SeriesCheck, Splice, Validation,
};
use super::wire::{check, check_sample, field, is_utf8};
use super::{ha_first, FirstLabels, HaStep};
use crate::counts::{
    DecodeError, Decoded, Discarded, DroppedExemplars, Forward, Refused, SeriesReason, WriteCounts,
};

type Families = HashSet<u64, foldhash::fast::FixedState>;

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
    with_tables(|symbols, families| scan_with(body, symbols, families, None))
        .map(|(counts, _)| counts)
}

/// Every sample and histogram of a push the HA tracker does not accept, as 1.0's
/// `count_unchecked`: the plain scan's count, or, for a body with a symbol that is not UTF-8,
/// the validating scan's with what its checks would take out added back.
fn count_unchecked(raw: &[u8], validation: &Validation) -> Result<WriteCounts, DecodeError> {
    scan(raw).or_else(|strict| {
        let (kept, found) =
            with_tables(|symbols, families| scan_with(raw, symbols, families, Some(validation)))
                .map_err(|_| strict)?;
        Ok(super::every_sample(
            kept,
            &found.discarded,
            found.repeated,
            &found.unlabelled,
        ))
    })
}

/// [`super::decode`] of a remote-write 2.0 body with series validation and `drop_labels`:
/// the counts of what passed, what to forward (the client's bytes when nothing changed), and
/// what was refused. As [`super::decode_validated`] does for 1.0.
pub fn decode_validated(
    body: &[u8],
    max_size: usize,
    validation: &Validation,
) -> Result<Decoded, DecodeError> {
    super::decompressed(body, max_size, |raw| {
        // The HA tracker first, as for 1.0.
        let earliest = |raw: &[u8]| super::earliest_sample_ms(raw, 5, 3);
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
        let relabelled = super::relabelled(raw, validation, &ha, super::relabel::v2);
        let raw = relabelled.as_deref().unwrap_or(raw);
        with_tables(|symbols, families| {
            let (counts, found) = scan_with(raw, symbols, families, Some(validation))?;
            let forward = if found.edits.is_empty() && relabelled.is_none() {
                Forward::Unchanged
            } else if counts.series == 0 {
                // 2.0's metadata rides on series: with none left, nothing is.
                Forward::Nothing
            } else {
                Forward::Rewritten(bytes::Bytes::from(edited(
                    raw,
                    &found.edits,
                    &found.appended,
                )?))
            };
            // A series' refusal answers before a metadata entry's, as Mimir checks the
            // series first.
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
    })
}

/// The values of the labels `cluster` and `replica` in the request's first series, read
/// through the symbols (what Mimir's HA tracker reads); `None` when the series lacks one.
/// A reference out of range reads as missing: the scan that follows refuses the body.
fn first_series_labels<'a>(
    body: &'a [u8],
    cluster: &str,
    replica: &str,
) -> Result<FirstLabels<'a>, DecodeError> {
    let error = |reason: String| DecodeError::Protobuf(reason);
    let mut symbols: Vec<&'a [u8]> = Vec::new();
    let mut first = None;
    let mut buf = body;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| error(format!("Request: {e}")))?;
        match tag {
            4 => symbols.push(field(&mut buf, wire_type, "symbols").map_err(error)?),
            5 if first.is_none() => {
                first = Some(field(&mut buf, wire_type, "timeseries").map_err(error)?)
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| error(format!("Request: field {tag}: {e}")))?,
        }
    }
    let Some(mut series) = first else {
        return Ok((None, None));
    };
    let mut references = Vec::new();
    while !series.is_empty() {
        let (tag, wire_type) =
            decode_key(&mut series).map_err(|e| error(format!("timeseries[0]: {e}")))?;
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => {
                let mut packed = field(&mut series, wire_type, "labels_refs").map_err(error)?;
                while !packed.is_empty() {
                    let reference = decode_varint(&mut packed)
                        .map_err(|e| error(format!("timeseries[0]: {e}")))?;
                    references.push(reference as u32);
                }
            }
            (1, WireType::Varint) => {
                let reference =
                    decode_varint(&mut series).map_err(|e| error(format!("timeseries[0]: {e}")))?;
                references.push(reference as u32);
            }
            _ => skip_field(wire_type, tag, &mut series, DecodeContext::default())
                .map_err(|e| error(format!("timeseries[0]: field {tag}: {e}")))?,
        }
    }
    let symbol = |reference: u32| symbols.get(reference as usize).copied();
    let value = |reference: u32| symbol(reference).map(String::from_utf8_lossy);
    let (mut cluster_value, mut replica_value) = (None, None);
    for pair in references.chunks_exact(2) {
        match symbol(pair[0]) {
            Some(name) if name == cluster.as_bytes() => cluster_value = value(pair[1]),
            Some(name) if name == replica.as_bytes() => replica_value = value(pair[1]),
            _ => {}
        }
    }
    Ok((cluster_value, replica_value))
}

/// Runs `read` with this thread's symbol and metric-family tables, cleared, and trims them
/// after a request that grew them past [`RETAINED_ENTRIES`].
fn with_tables<T>(
    read: impl FnOnce(&mut Vec<(u32, u32)>, &mut Families) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    SYMBOLS.with(|symbols| {
        FAMILIES.with(|families| {
            let mut symbols = symbols.borrow_mut();
            let mut families = families.borrow_mut();
            symbols.clear();
            families.clear();
            let result = read(&mut symbols, &mut families);
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

/// What validation changes in a request, as the scan found it.
#[derive(Default)]
struct Found {
    /// In body order: the `timeseries` fields to cut or to write again.
    edits: Vec<Edit>,
    refused: u64,
    first: Option<String>,
    /// The first refused metadata entry's message: it answers only when no series was
    /// refused.
    first_metadata: Option<String>,
    discarded: Discarded,
    dropped_exemplars: DroppedExemplars,
    /// Samples and histograms that repeated a timestamp of their series.
    repeated: u64,
    /// The series dropped for having no label left, and what they carried.
    unlabelled: WriteCounts,
    /// The symbols the rewritten series point at, appended to the request.
    appended: Appended,
    /// Hashes of the metric families whose entry was refused: their later entries go too.
    /// Empty but for a refusal, so a kept entry pays one `is_empty`.
    refused_families: Vec<u64>,
}

impl Found {
    /// Mimir's metadata checks on the metadata of a kept series of `family` (hashed
    /// `hash`): whether it is charged, and what becomes of the series' `metadata` field. The
    /// family's `first` entry is Mimir's: charged, or refused and counted by reason. Entries
    /// within every limit, the rule, pay three compares.
    #[inline]
    fn metadata(
        &mut self,
        first: bool,
        hash: u64,
        family: &[u8],
        metadata: &Metadata,
        limits: &runtime_config::ValidationLimits,
    ) -> (bool, Option<MetadataEdit>) {
        let max = limits.max_metadata_length as usize;
        if family.len() <= max
            && metadata.help.len() <= max
            && metadata.unit.len() <= max
            && (first || self.refused_families.is_empty())
        {
            return (first, None);
        }
        self.metadata_over_limit(first, hash, family, metadata, limits)
    }

    #[cold]
    #[inline(never)]
    fn metadata_over_limit(
        &mut self,
        first: bool,
        hash: u64,
        family: &[u8],
        metadata: &Metadata,
        limits: &runtime_config::ValidationLimits,
    ) -> (bool, Option<MetadataEdit>) {
        if !first && self.refused_families.contains(&hash) {
            return (false, Some(MetadataEdit::Cut));
        }
        // The entry Mimir makes of it: the family's name, the help and unit symbols.
        let entry = super::prompb::RawMetricMetadata {
            r#type: metadata.fields.metric_type as i32,
            metric_family_name: family.to_vec(),
            help: metadata.help.to_vec(),
            unit: metadata.unit.to_vec(),
        };
        match check_metadata(entry, limits) {
            MetadataVerdict::Keep => (first, None),
            MetadataVerdict::Rewrite(body) => {
                let help = <super::prompb::RawMetricMetadata as prost::Message>::decode(&body[..])
                    .map(|cut| cut.help)
                    .unwrap_or_default();
                let edit = MetadataEdit::Help {
                    fields: metadata.fields,
                    help,
                };
                (first, Some(edit))
            }
            MetadataVerdict::Refuse(reason, message) => {
                if first {
                    self.discarded.metadata[reason as usize] += 1;
                    self.first_metadata.get_or_insert(message);
                    self.refused_families.push(hash);
                }
                (false, Some(MetadataEdit::Cut))
            }
        }
    }
}

/// What becomes of a kept series' `metadata` field.
enum MetadataEdit {
    /// Refused: every piece of it goes.
    Cut,
    /// Its help text over `max_metadata_length`: written again as one field, with `help`
    /// (cut to the limit) as a new symbol.
    Help {
        fields: MetadataFields,
        help: Vec<u8>,
    },
}

/// Symbols appended at the end of a rewritten request: protobuf's repeated fields
/// concatenate in stream order, so the n-th has index `first + n` wherever the request's own
/// symbols lie. Each text once.
#[derive(Default)]
struct Appended {
    /// The request's symbol count.
    first: u32,
    texts: Vec<Vec<u8>>,
    references: HashMap<Vec<u8>, u32>,
}

impl Appended {
    /// The reference of `text`, appended if it is not yet.
    fn reference(&mut self, text: Vec<u8>) -> Result<u32, String> {
        if let Some(&reference) = self.references.get(&text) {
            return Ok(reference);
        }
        let reference = u32::try_from(self.texts.len())
            .ok()
            .and_then(|count| self.first.checked_add(count))
            .ok_or_else(|| "no symbol reference is left for a rewritten value".to_string())?;
        self.references.insert(text.clone(), reference);
        self.texts.push(text);
        Ok(reference)
    }
}

/// One change to the uncompressed body.
enum Edit {
    /// A refused series: its whole `timeseries` field goes.
    Cut(Range<usize>),
    /// A series written again: `field` becomes its key, its new length and the series' bytes
    /// (`series`, in the body) with `splices` made (in series order).
    Rewrite {
        field: Range<usize>,
        series: Range<usize>,
        splices: Vec<Splice>,
    },
}

impl Edit {
    /// A rewrite's splices, with where its series' bytes are in the body; a cut has none.
    fn splices(&mut self) -> Option<(Range<usize>, &mut Vec<Splice>)> {
        match self {
            Edit::Rewrite {
                series, splices, ..
            } => Some((series.clone(), splices)),
            Edit::Cut(_) => None,
        }
    }
}

fn scan_with(
    body: &[u8],
    symbols: &mut Vec<(u32, u32)>,
    families: &mut Families,
    validation: Option<&Validation>,
) -> Result<(WriteCounts, Found), DecodeError> {
    let error = |reason: String| DecodeError::Protobuf(reason);
    // Pass 1: the symbol table. With a validation, a symbol that is not UTF-8 is for the
    // series checks to refuse where a series' label uses it, as Mimir reads the body without
    // checking UTF-8; without one, it makes the body malformed, as prost's decode has it.
    let mut not_utf8 = Vec::new();
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
                    if validation.is_none() {
                        return Err(error(format!(
                            "symbols[{}] is not valid UTF-8",
                            symbols.len()
                        )));
                    }
                    not_utf8.push(symbols.len() as u32);
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
    let table = Symbols {
        body,
        symbols,
        not_utf8: &not_utf8,
    };
    // Pass 2: the series.
    let mut counts = WriteCounts::default();
    let mut found = Found {
        appended: Appended {
            first: u32::try_from(symbols.len()).unwrap_or(u32::MAX),
            ..Appended::default()
        },
        ..Found::default()
    };
    let mut index = 0u64;
    let mut buf = body;
    let mut seen = SeriesCheck::new();
    let mut exemplars = PendingExemplars::default();
    while !buf.is_empty() {
        let start = body.len() - buf.len();
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| error(format!("Request: {e}")))?;
        if tag != 5 {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| error(format!("Request: field {tag}: {e}")))?;
            continue;
        }
        let series = field(&mut buf, wire_type, "timeseries").map_err(error)?;
        let mut checking = validation.map(|validation| Checking::new(validation, &mut seen));
        let own = scan_series(series, &table, checking.as_mut())
            .map_err(|reason| error(format!("timeseries[{index}]: {reason}")))?;
        index += 1;
        let field = start..body.len() - buf.len();
        // A series with no label left (none sent, or each empty or dropped) goes silently,
        // as Mimir's distributor drops it before its checks.
        if checking
            .as_ref()
            .map_or(own.labels == 0, |checking| checking.seen.unlabelled())
        {
            if checking.is_some() {
                found.edits.push(Edit::Cut(field));
            }
            found.unlabelled.add(&WriteCounts {
                series: 1,
                samples: own.samples,
                histograms: own.histograms,
                exemplars: own.exemplars,
                metadata: 0,
            });
            continue;
        }
        if let Some(checking) = &checking {
            exemplars.samples_from(checking.seen.earliest());
        }
        match checking.as_ref().and_then(|c| c.verdict(series, &table)) {
            None => {
                let (samples_cut, histograms_cut) = checking
                    .as_mut()
                    .map_or((0, 0), |checking| checking.seen.cut_repeats(series, 3));
                found.repeated += samples_cut + histograms_cut;
                counts.series += 1;
                counts.samples += own.samples - samples_cut;
                counts.histograms += own.histograms - histograms_cut;
                counts.exemplars += own.exemplars;
                let mut metadata_edit = None;
                if let Some((family, metadata)) = own.family.zip(own.metadata.as_ref()) {
                    let mut hasher = families.hasher().build_hasher();
                    hasher.write(family);
                    let hash = hasher.finish();
                    let first = families.insert(hash);
                    let charged = match &checking {
                        None => first,
                        Some(checking) => {
                            let limits = &checking.validation.limits;
                            let (charged, edit) =
                                found.metadata(first, hash, family, metadata, limits);
                            metadata_edit = edit;
                            charged
                        }
                    };
                    if charged {
                        counts.metadata += 1;
                    }
                }
                let judged = checking
                    .as_ref()
                    .is_some_and(|c| !c.seen.exemplars.is_empty());
                let rewrites = metadata_edit.is_some()
                    || judged
                    || checking.as_ref().is_some_and(|c| c.rewrites());
                if let Some(checking) = checking.filter(|_| rewrites) {
                    if judged {
                        let of_series = std::mem::take(&mut checking.seen.exemplars);
                        exemplars.push(found.edits.len(), of_series);
                    }
                    let splices = checking
                        .splices(series, &table, &mut found.appended, metadata_edit)
                        .map_err(|reason| error(format!("timeseries[{}]: {reason}", index - 1)))?;
                    let series = field.end - series.len()..field.end;
                    found.edits.push(Edit::Rewrite {
                        field,
                        series,
                        splices,
                    });
                }
            }
            Some((reason, message)) => {
                found.edits.push(Edit::Cut(field));
                found.refused += 1;
                found.discarded.samples[reason as usize] += own.samples + own.histograms;
                found.discarded.series[reason as usize] += 1;
                found.first.get_or_insert(message);
            }
        }
    }
    if let Some(validation) = validation {
        counts.exemplars -= exemplars.settle(
            validation,
            body,
            &mut found.edits,
            Edit::splices,
            &mut found.dropped_exemplars,
        );
    }
    Ok((counts, found))
}

/// The request's symbols, as offsets into its body.
struct Symbols<'a> {
    body: &'a [u8],
    symbols: &'a [(u32, u32)],
    /// The symbols that are not UTF-8, in order (almost always none).
    not_utf8: &'a [u32],
}

impl<'a> Symbols<'a> {
    /// Whether the symbol `reference` points at is UTF-8.
    #[inline(always)]
    fn is_utf8(&self, reference: u64) -> bool {
        self.not_utf8.is_empty()
            || u32::try_from(reference).map_or(true, |at| self.not_utf8.binary_search(&at).is_err())
    }

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

/// What one series carries, for the request's counts once its verdict is in.
struct SeriesCounts<'a> {
    /// The label pairs it was sent with.
    labels: u64,
    samples: u64,
    histograms: u64,
    exemplars: u64,
    /// The metric family whose metadata the series carries, when that metadata counts.
    family: Option<&'a [u8]>,
    /// That metadata, merged and resolved.
    metadata: Option<Metadata<'a>>,
}

/// One series' validation as the scan walks it: Mimir's checks ([`SeriesCheck`], shared
/// with 1.0) on its labels after `drop_labels`, whether it lost any, and the values
/// `truncate` or `drop` write again.
struct Checking<'a, 'v> {
    validation: &'v Validation,
    /// The request's [`SeriesCheck`], made ready for this series: it keeps the names known
    /// good from series to series.
    seen: &'v mut SeriesCheck<'a>,
    dropped: bool,
    /// Label pairs seen, dropped ones included.
    pairs: u32,
    /// (pair index, new value) of each value over `max_label_value_length` written again,
    /// in series order.
    values: Vec<(u32, Vec<u8>)>,
}

impl<'a, 'v> Checking<'a, 'v> {
    fn new(validation: &'v Validation, seen: &'v mut SeriesCheck<'a>) -> Self {
        seen.next();
        Checking {
            validation,
            seen,
            dropped: false,
            pairs: 0,
            values: Vec::new(),
        }
    }

    /// One (name, value) pair, in the order of the series. A value within the limit pays
    /// one compare.
    #[inline]
    fn label(&mut self, name: &'a [u8], value: &'a [u8], value_utf8: bool) {
        let pair = self.pairs;
        self.pairs += 1;
        // A label with an empty value goes before the checks, as `drop_labels`' do: Mimir
        // removes them (Prometheus stores none).
        if value.is_empty()
            || (self.validation.drop_labels.is_some() && self.validation.drops(name))
        {
            self.dropped = true;
        } else if value.len() > self.validation.limits.max_label_value_length as usize {
            self.long_value(name, value, value_utf8, pair);
        } else {
            self.seen
                .label(name, value, value_utf8, &self.validation.limits);
        }
    }

    /// A value over `max_label_value_length`. [`SeriesCheck::label_in`] decides, as for
    /// 1.0: under `error` the series is refused; under `truncate` or `drop` the checks go on
    /// and the value is written again. The 1.0 `labels` field it writes has no place in a
    /// 2.0 series: the new value becomes a symbol instead.
    #[cold]
    #[inline(never)]
    fn long_value(&mut self, name: &'a [u8], value: &'a [u8], value_utf8: bool, pair: u32) {
        let limits = &self.validation.limits;
        let before = self.seen.replaced.len();
        self.seen.label_in(name, value, value_utf8, limits, 0..0);
        if self.seen.replaced.len() > before {
            self.seen.replaced.pop();
            self.values.push((pair, shortened_value(value, limits)));
        }
    }

    /// The first check the series fails, with its message naming the series.
    /// [`SeriesCheck::verdict`] reads the series' bytes only to name a refused series, or to
    /// check again labels that came out of order and failed ([`SeriesCheck::needs_labels`]),
    /// as 1.0 `Label` fields: a series that passes is judged without them, and a refused one
    /// is judged again with its labels written so (out of line: a refusal is rare).
    #[inline]
    fn verdict(&self, series: &[u8], symbols: &Symbols) -> Option<(SeriesReason, String)> {
        if !self.seen.needs_labels() {
            self.seen.verdict(self.validation, &[])?;
        }
        self.named_verdict(series, symbols)
    }

    #[cold]
    #[inline(never)]
    fn named_verdict(&self, series: &[u8], symbols: &Symbols) -> Option<(SeriesReason, String)> {
        self.seen
            .verdict(self.validation, &labels_as_v1(series, symbols))
    }

    /// Whether the series, kept, must be written again (its metadata aside).
    #[inline]
    fn rewrites(&self) -> bool {
        self.dropped
            || !self.seen.replaced.is_empty()
            || !self.seen.dropped.is_empty()
            || !self.values.is_empty()
    }

    /// The series' changes, in series order: its `labels_refs` as one packed field without
    /// the dropped pairs and with the new values' references, where the first one was; its
    /// histograms written again; its `metadata` cut or written again as one field. New texts
    /// get their references from `appended`.
    fn splices(
        mut self,
        series: &[u8],
        symbols: &Symbols,
        appended: &mut Appended,
        metadata: Option<MetadataEdit>,
    ) -> Result<Vec<Splice>, String> {
        let mut splices = Vec::new();
        if self.dropped || !self.values.is_empty() {
            let (references, fields) = label_refs(series)?;
            let mut values = std::mem::take(&mut self.values).into_iter().peekable();
            let mut packed = Vec::with_capacity(references.len() * 2);
            for (at, pair) in references.chunks_exact(2).enumerate() {
                let name = symbols.get(u64::from(pair[0]), || "labels_refs".to_string())?;
                let value = symbols.get(u64::from(pair[1]), || "labels_refs".to_string())?;
                if value.is_empty() || self.validation.drops(name) {
                    continue;
                }
                let value = match values.next_if(|(pair, _)| *pair as usize == at) {
                    Some((_, text)) => appended.reference(text)?,
                    None => pair[1],
                };
                encode_varint(u64::from(pair[0]), &mut packed);
                encode_varint(u64::from(value), &mut packed);
            }
            let mut labels = Vec::with_capacity(packed.len() + 6);
            encode_key(1, WireType::LengthDelimited, &mut labels);
            encode_varint(packed.len() as u64, &mut labels);
            labels.extend_from_slice(&packed);
            for (i, range) in fields.into_iter().enumerate() {
                let with = if i == 0 {
                    std::mem::take(&mut labels)
                } else {
                    Vec::new()
                };
                splices.push(Splice { range, with });
            }
        }
        // SeriesCheck writes a histogram as 1.0's field (4); in 2.0 it is field 3. Both keys
        // are one byte, and the message is the same.
        // Samples and histograms that repeat a timestamp go whole.
        for range in std::mem::take(&mut self.seen.dropped) {
            splices.push(Splice {
                range,
                with: Vec::new(),
            });
        }
        for mut splice in std::mem::take(&mut self.seen.replaced) {
            let mut key = Vec::with_capacity(1);
            encode_key(3, WireType::LengthDelimited, &mut key);
            if let Some(first) = splice.with.first_mut() {
                *first = key[0];
            }
            splices.push(splice);
        }
        if let Some(edit) = metadata {
            let mut with = match edit {
                MetadataEdit::Cut => Vec::new(),
                MetadataEdit::Help { fields, help } => {
                    let message = v2_proto::Metadata {
                        r#type: fields.metric_type as i32,
                        help_ref: appended.reference(help)?,
                        unit_ref: fields.unit_ref as u32,
                    };
                    let mut field = Vec::new();
                    prost::encoding::message::encode(5, &message, &mut field);
                    field
                }
            };
            // The pieces merge into one: it takes the first one's place.
            for range in field_ranges(series, 5)? {
                splices.push(Splice {
                    range,
                    with: std::mem::take(&mut with),
                });
            }
        }
        splices.sort_by_key(|splice| splice.range.start);
        Ok(splices)
    }
}

fn scan_series<'a>(
    mut buf: &[u8],
    symbols: &Symbols<'a>,
    mut checking: Option<&mut Checking<'a, '_>>,
) -> Result<SeriesCounts<'a>, String> {
    let mut labels = LabelRefs::<'a>::default();
    // A series' metadata may come in several pieces: protobuf merges them, each field's last
    // value winning, so references are checked once the pieces are merged.
    let mut metadata: Option<MetadataFields> = None;
    let (mut exemplars, mut samples, mut histograms) = (0u64, 0u64, 0u64);
    let whole = buf;
    while !buf.is_empty() {
        let start = whole.len() - buf.len();
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => labels.read(
                &mut buf,
                wire_type,
                symbols,
                "labels_refs",
                checking.as_deref_mut(),
            )?,
            2 => {
                let timestamp = check_sample(field(&mut buf, wire_type, "samples")?)
                    .map_err(|reason| format!("samples[{samples}]: {reason}"))?;
                if let Some(checking) = checking.as_deref_mut() {
                    checking.seen.sample(timestamp);
                }
                samples += 1;
            }
            3 => {
                let histogram = field(&mut buf, wire_type, "histograms")?;
                match checking.as_deref_mut() {
                    None => check::<v2_proto::Histogram>(histogram),
                    // 2.0's Histogram is 1.0's, field for field: the 1.0 check reads it.
                    Some(checking) => {
                        <super::prompb::Histogram as prost::Message>::decode(histogram)
                            .map(|decoded| {
                                let field = start..whole.len() - buf.len();
                                let limits = &checking.validation.limits;
                                checking.seen.histogram(decoded, limits, field)
                            })
                            .map_err(|err| err.to_string())
                    }
                }
                .map_err(|reason| format!("histograms[{histograms}]: {reason}"))?;
                histograms += 1;
            }
            4 => {
                let exemplar = field(&mut buf, wire_type, "exemplars")?;
                check::<v2_proto::Exemplar>(exemplar)
                    .and_then(|()| scan_exemplar(exemplar, symbols))
                    .and_then(|()| match checking.as_deref_mut() {
                        None => Ok(()),
                        Some(checking) => {
                            let field = start..whole.len() - buf.len();
                            judge_exemplar(exemplar, symbols, field, checking.seen)
                        }
                    })
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
    let metadata = metadata
        .map(|fields| fields.resolve(symbols))
        .transpose()
        .map_err(|reason| format!("metadata: {reason}"))?;
    let family = match (&metadata, labels.metric_name) {
        (Some(metadata), Some(name)) if metadata.counts() && !name.is_empty() => {
            Some(family(name, metadata.fields.metric_type))
        }
        _ => None,
    };
    Ok(SeriesCounts {
        labels: labels.count / 2,
        samples,
        histograms,
        exemplars,
        family,
        metadata,
    })
}

/// A run of label references: pairs of (name, value), each in range; remembers `__name__`,
/// and hands each pair to a series' validation.
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
        mut checking: Option<&mut Checking<'a, '_>>,
    ) -> Result<(), String> {
        match wire_type {
            // References are uint32: a longer varint keeps its low 32 bits, as every protobuf
            // decoder (prost, Go's) reads it.
            WireType::LengthDelimited => {
                let mut packed = field(buf, wire_type, what)?;
                while !packed.is_empty() {
                    let reference = decode_varint(&mut packed).map_err(|e| e.to_string())?;
                    self.push(
                        u64::from(reference as u32),
                        symbols,
                        what,
                        checking.as_deref_mut(),
                    )?;
                }
                Ok(())
            }
            WireType::Varint => {
                let reference = decode_varint(buf).map_err(|e| e.to_string())?;
                self.push(u64::from(reference as u32), symbols, what, checking)
            }
            other => Err(format!(
                "field `{what}` has wire type {other:?}, expected packed varints"
            )),
        }
    }

    #[inline]
    fn push(
        &mut self,
        reference: u64,
        symbols: &Symbols<'a>,
        what: &str,
        checking: Option<&mut Checking<'a, '_>>,
    ) -> Result<(), String> {
        let text = symbols.get(reference, || format!("{what}[{}]", self.count))?;
        match self.pending_name.take() {
            None => self.pending_name = Some(text),
            Some(name) => {
                // The first `__name__` is the name (a series has one; Prometheus refuses two).
                if name == b"__name__" && self.metric_name.is_none() {
                    self.metric_name = Some(text)
                }
                if let Some(checking) = checking {
                    checking.label(name, text, symbols.is_utf8(reference));
                }
            }
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
            1 => labels.read(&mut buf, wire_type, symbols, "labels_refs", None)?,
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    labels.finish("labels_refs")
}

/// An exemplar of a series being validated, its references already checked: what its own
/// content fails, for [`exemplar_cuts`] once the request is scanned.
#[cold]
#[inline(never)]
fn judge_exemplar(
    exemplar: &[u8],
    symbols: &Symbols,
    field: Range<usize>,
    seen: &mut SeriesCheck,
) -> Result<(), String> {
    let decoded =
        <v2_proto::Exemplar as prost::Message>::decode(exemplar).map_err(|e| e.to_string())?;
    let mut labels = Vec::with_capacity(decoded.labels_refs.len() / 2);
    for pair in decoded.labels_refs.chunks_exact(2) {
        // As bytes: text that is not UTF-8 is not the exemplar checks' to refuse, as on 1.0.
        let text = |reference: u32| symbols.get(u64::from(reference), || "labels_refs".to_string());
        labels.push((text(pair[0])?, text(pair[1])?));
    }
    seen.exemplars.push(ExemplarSeen {
        field,
        timestamp: decoded.timestamp,
        invalid: exemplar_content(labels.into_iter(), decoded.timestamp),
    });
    Ok(())
}

/// A series' metadata, merged, its help and unit read through the symbols.
struct Metadata<'a> {
    fields: MetadataFields,
    help: &'a [u8],
    unit: &'a [u8],
}

impl Metadata<'_> {
    /// Mimir keeps metadata that says something: a type, a help text or a unit.
    fn counts(&self) -> bool {
        self.fields.metric_type != 0 || !self.help.is_empty() || !self.unit.is_empty()
    }
}

/// A series' metadata as read so far: each field's last value (0 when absent, as proto3 has
/// it).
#[derive(Default, Clone, Copy)]
struct MetadataFields {
    metric_type: u64,
    help_ref: u64,
    unit_ref: u64,
}

impl MetadataFields {
    /// The merged metadata, its references checked.
    fn resolve<'a>(self, symbols: &Symbols<'a>) -> Result<Metadata<'a>, String> {
        let help = symbols.get(self.help_ref, || "help_ref".to_string())?;
        let unit = symbols.get(self.unit_ref, || "unit_ref".to_string())?;
        Ok(Metadata {
            fields: self,
            help,
            unit,
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

/// A series' label references in order, and where its `labels_refs` fields lie in it: for
/// the cold paths, naming a refused series and writing a relabelled one again. The scan has
/// already checked the series; an error here is still an error, never a panic.
fn label_refs(series: &[u8]) -> Result<(Vec<u32>, Vec<Range<usize>>), String> {
    let mut buf = series;
    let (mut references, mut fields) = (Vec::new(), Vec::new());
    while !buf.is_empty() {
        let start = series.len() - buf.len();
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => {
                let mut packed = field(&mut buf, wire_type, "labels_refs")?;
                while !packed.is_empty() {
                    references.push(decode_varint(&mut packed).map_err(|e| e.to_string())? as u32);
                }
            }
            (1, WireType::Varint) => {
                references.push(decode_varint(&mut buf).map_err(|e| e.to_string())? as u32)
            }
            _ => {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .map_err(|e| e.to_string())?;
                continue;
            }
        }
        fields.push(start..series.len() - buf.len());
    }
    Ok((references, fields))
}

/// Where the series' fields numbered `tag` lie in it (the cold path that rewrites them).
fn field_ranges(series: &[u8], tag: u32) -> Result<Vec<Range<usize>>, String> {
    let mut buf = series;
    let mut ranges = Vec::new();
    while !buf.is_empty() {
        let start = series.len() - buf.len();
        let (found, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        skip_field(wire_type, found, &mut buf, DecodeContext::default())
            .map_err(|e| e.to_string())?;
        if found == tag {
            ranges.push(start..series.len() - buf.len());
        }
    }
    Ok(ranges)
}

/// A 2.0 series' labels written as 1.0's `TimeSeries.labels` fields, which is how
/// [`SeriesCheck::verdict`] reads the labels it names a refused series with.
fn labels_as_v1(series: &[u8], symbols: &Symbols) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok((references, _)) = label_refs(series) else {
        return out;
    };
    // The symbols' bytes as sent: the checks read a value that is not UTF-8 as such.
    let text = |reference: u32| {
        symbols
            .get(u64::from(reference), String::new)
            .unwrap_or(b"")
    };
    let mut label = Vec::new();
    for pair in references.chunks_exact(2) {
        label.clear();
        for (tag, text) in [(1, text(pair[0])), (2, text(pair[1]))] {
            prost::encoding::encode_key(tag, WireType::LengthDelimited, &mut label);
            prost::encoding::encode_varint(text.len() as u64, &mut label);
            label.extend_from_slice(text);
        }
        prost::encoding::encode_key(1, WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(label.len() as u64, &mut out);
        out.extend_from_slice(&label);
    }
    out
}

/// `raw` with `edits` (in body order) made, snappy-compressed: refused series cut, series
/// written again with their splices. The symbols stay as they were, and `appended` follows
/// them at the end of the body.
fn edited(raw: &[u8], edits: &[Edit], appended: &Appended) -> Result<Vec<u8>, DecodeError> {
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
                series,
                splices,
            } => {
                out.extend_from_slice(&raw[from..field.start]);
                Splice::write(&mut out, 5, &raw[series.clone()], splices);
                from = field.end;
            }
        }
    }
    out.extend_from_slice(&raw[from..]);
    for text in &appended.texts {
        encode_key(4, WireType::LengthDelimited, &mut out);
        encode_varint(text.len() as u64, &mut out);
        out.extend_from_slice(text);
    }
    snap::raw::Encoder::new()
        .compress_vec(&out)
        .map_err(|err| DecodeError::Snappy(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::super::v2_proto::{
        metadata::MetricType, Exemplar, Histogram, Metadata, Request, Sample, TimeSeries,
    };
    use super::*;
    use crate::counts::MetadataReason;
    use proptest::prelude::*;
    use runtime_config::validation::LabelValueLengthOverLimitStrategy;

    /// The validated decode as (counts, forward, refused): what these tests compare (the HA
    /// outcome is `tests/ha.rs`'s).
    fn decode_validated(
        body: &[u8],
        max_size: usize,
        validation: &Validation,
    ) -> Result<(WriteCounts, Forward, Option<Refused>), DecodeError> {
        super::decode_validated(body, max_size, validation)
            .map(|decoded| (decoded.counts, decoded.forward, decoded.refused))
    }

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
                let labelled = || decoded.timeseries.iter().filter(|s| !s.labels_refs.is_empty());
                prop_assert_eq!(counts.samples, labelled().map(|s| s.samples.len() as u64).sum::<u64>());
                prop_assert_eq!(counts.series, labelled().count() as u64);
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
    fn the_first_symbol_must_be_empty() {
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
    }

    /// A series with no labels, or none left once the empty values and `drop_labels` go,
    /// is dropped silently, as Mimir's distributor drops it: not counted, not charged, not
    /// refused, not forwarded; and with nothing else the push forwards nothing.
    #[test]
    fn a_series_with_no_label_left_goes_silently() {
        let at_now = |labels_refs: Vec<u32>| TimeSeries {
            labels_refs,
            samples: sample_at(NOW),
            ..TimeSeries::default()
        };
        // "", __name__, up, job, b (dropped by `tight`)
        let names = symbols(&["", "__name__", "up", "job", "b"]);
        let request = Request {
            symbols: names.clone(),
            timeseries: vec![
                at_now(vec![]),
                at_now(vec![1, 2]),
                at_now(vec![3, 0]),
                at_now(vec![4, 2, 3, 0]),
            ],
        };
        // Without validation only the series sent with no labels is left out.
        let one = WriteCounts {
            series: 1,
            samples: 1,
            ..WriteCounts::default()
        };
        let three = WriteCounts {
            series: 3,
            samples: 3,
            ..WriteCounts::default()
        };
        assert_eq!(scan(&raw(&request)), Ok(three));
        let answer =
            super::decode_validated(&request.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!((answer.counts, answer.unlabelled.series), (one, 3));
        assert_eq!(answer.refused, None);
        let Forward::Rewritten(forwarded) = answer.forward else {
            panic!("the unlabelled series are cut: {:?}", answer.forward);
        };
        assert_eq!(decoded(&forwarded).timeseries, vec![at_now(vec![1, 2])]);
        // Only such series: nothing to forward, and nothing refused.
        let nothing = Request {
            symbols: names,
            timeseries: vec![at_now(vec![]), at_now(vec![3, 0])],
        };
        assert_eq!(
            validated(&nothing),
            (WriteCounts::default(), Forward::Nothing, None)
        );
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

    /// The validation tests' clock, and limits tight enough for every reason to come up.
    const NOW: i64 = 1_700_000_000_000;

    /// [`tight_with`] under `error`.
    fn tight() -> Validation {
        tight_with(LabelValueLengthOverLimitStrategy::Error)
    }

    /// Values over 74 bytes (the hash's 71 and 3), metadata over 6.
    fn tight_with(strategy: LabelValueLengthOverLimitStrategy) -> Validation {
        Validation::new(
            runtime_config::ValidationLimits {
                max_label_names_per_series: 4,
                max_label_name_length: 8,
                max_label_value_length: 74,
                label_value_length_over_limit_strategy: strategy,
                max_metadata_length: 6,
                creation_grace_period: std::time::Duration::from_secs(600),
                past_grace_period: std::time::Duration::from_secs(3600),
                // Exemplars on: the property's are all valid and kept (at NOW, within the
                // window of any request); `exemplars_are_dropped_as_mimir_drops_them` checks
                // the drops.
                max_global_exemplars_per_user: 100_000,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        )
        .dropping(Some(std::sync::Arc::from(vec!["b".to_string()])))
    }

    /// The symbols the validation property draws labels and metadata from: good and bad
    /// names and values, a value over the limit (82 bytes of two-byte characters: `truncate`
    /// keeps 3 bytes, which would split one), and texts over the metadata limit
    /// (`__name__`, `job:rate`).
    const CHECKED: [&str; 12] = [
        "",
        "__name__",
        "up",
        "9m",
        "a",
        "b",
        "job",
        "a-b",
        "nnnnnnnnnn",
        "x",
        "ééééééééééééééééééééééééééééééééééééééééé",
        "job:rate",
    ];
    const NAMES: [u32; 7] = [1, 4, 5, 6, 7, 8, 11];
    /// The long value twice: a series must pass every other check for it to be rewritten.
    const VALUES: [u32; 7] = [0, 2, 3, 9, 10, 10, 11];
    /// Help texts: none, over the limit, within it; units: none, within, over.
    const HELPS: [u32; 3] = [0, 1, 2];
    const UNITS: [u32; 3] = [0, 4, 1];

    /// Series that validation may refuse for any of its reasons, labels mostly sorted by name
    /// as senders sort them, and some in the order drawn.
    fn checked_series() -> impl Strategy<Value = TimeSeries> {
        (
            prop::collection::vec(
                (
                    prop::sample::select(&NAMES[..]),
                    prop::sample::select(&VALUES[..]),
                ),
                1..6,
            ),
            prop::collection::vec(-7_200_000i64..7_200_000, 0..3),
            prop::collection::vec(-7_200_000i64..7_200_000, 0..2),
            0usize..2,
            prop::option::of((
                0i32..4,
                prop::sample::select(&HELPS[..]),
                prop::sample::select(&UNITS[..]),
            )),
            prop::bool::weighted(0.75),
        )
            .prop_map(
                |(mut labels, samples, histograms, exemplars, metadata, in_order)| {
                    if in_order {
                        labels.sort_by_key(|&(name, _)| CHECKED[name as usize]);
                    }
                    // One `__name__` at most: with two, Mimir names the series by the first and
                    // the 1.0 checks by the last (either way it is refused, for one reason or
                    // the other).
                    let mut named = false;
                    labels.retain(|&(name, _)| name != 1 || !std::mem::replace(&mut named, true));
                    TimeSeries {
                        labels_refs: labels.into_iter().flat_map(|(n, v)| [n, v]).collect(),
                        samples: samples
                            .into_iter()
                            .map(|offset| Sample {
                                value: 1.0,
                                timestamp: NOW + offset,
                            })
                            .collect(),
                        histograms: histograms
                            .into_iter()
                            .map(|offset| Histogram {
                                timestamp: NOW + offset,
                                ..Histogram::default()
                            })
                            .collect(),
                        exemplars: (0..exemplars)
                            .map(|_| Exemplar {
                                labels_refs: vec![5, 9],
                                value: 1.0,
                                timestamp: NOW,
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
            )
    }

    /// The oracle's symbols: the request's, then each new text once, in the order needed.
    struct OracleSymbols(Vec<String>, usize);

    impl OracleSymbols {
        fn text(&self, reference: u32) -> &str {
            &self.0[reference as usize]
        }

        fn reference(&mut self, text: String) -> u32 {
            let appended = self.1;
            match self.0[appended..].iter().position(|known| *known == text) {
                Some(at) => (appended + at) as u32,
                None => {
                    self.0.push(text);
                    self.0.len() as u32 - 1
                }
            }
        }
    }

    /// A value over the limit as Mimir writes it: under `truncate`, its first `limit - 71`
    /// bytes (fewer, to end on a character), then `(hash:<hex blake2b-256>)`; under `drop`,
    /// the hash alone.
    fn hashed(value: &str, strategy: LabelValueLengthOverLimitStrategy, limit: usize) -> String {
        use blake2::Digest;
        let digest = blake2::Blake2b::<blake2::digest::consts::U32>::digest(value.as_bytes());
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        let mut keep = match strategy {
            LabelValueLengthOverLimitStrategy::Truncate => limit - 71,
            _ => 0,
        };
        while !value.is_char_boundary(keep) {
            keep -= 1;
        }
        format!("{}(hash:{hex})", &value[..keep])
    }

    /// What [`judged`] answers for a series with no label left: Mimir drops it before its
    /// checks, silently.
    const UNLABELLED: &str = "unlabelled";

    /// The oracle, written apart from the scan: Mimir's checks in Mimir's order on a decoded
    /// series, after `drop_labels` ("b"), with [`tight_with`]'s limits. The series as it must
    /// be forwarded (its metadata as sent) with its metric name, or the reason it is refused.
    fn judged(
        series: &TimeSeries,
        symbols: &mut OracleSymbols,
        strategy: LabelValueLengthOverLimitStrategy,
    ) -> Result<(TimeSeries, String), &'static str> {
        let labels: Vec<(String, String, [u32; 2])> = series
            .labels_refs
            .chunks(2)
            .map(|pair| {
                let text = |i: u32| symbols.text(i).to_string();
                (text(pair[0]), text(pair[1]), [pair[0], pair[1]])
            })
            // drop_labels, then the labels with an empty value, which Mimir removes.
            .filter(|(name, value, _)| name != "b" && !value.is_empty())
            .collect();
        if labels.is_empty() {
            return Err(UNLABELLED);
        }
        let legacy = |name: &str, colon: bool| {
            let mut chars = name.chars();
            chars.next().is_some_and(|first| {
                first.is_ascii_alphabetic() || first == '_' || (colon && first == ':')
            }) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
        };
        let Some((_, metric, _)) = labels.iter().find(|(name, _, _)| name == "__name__") else {
            return Err("missing_metric_name");
        };
        if !legacy(metric, true) {
            return Err("metric_name_invalid");
        }
        if labels.len() > 4 {
            return Err("max_label_names_per_series");
        }
        // Mimir checks the labels sorted by name; they are forwarded in the order sent.
        let mut sorted = labels.clone();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (name, value, _)) in sorted.iter().enumerate() {
            if !legacy(name, false) {
                return Err("label_invalid");
            }
            if name.len() > 8 {
                return Err("label_name_too_long");
            }
            if value.len() > 74 && strategy == LabelValueLengthOverLimitStrategy::Error {
                return Err("label_value_too_long");
            }
            if i > 0 && sorted[i - 1].0 == *name {
                return Err("duplicate_label_names");
            }
        }
        let timestamps: Vec<i64> = series
            .samples
            .iter()
            .map(|sample| sample.timestamp)
            .chain(
                series
                    .histograms
                    .iter()
                    .map(|histogram| histogram.timestamp),
            )
            .collect();
        if timestamps.iter().any(|&t| t > NOW + 600_000) {
            return Err("too_far_in_future");
        }
        if timestamps.iter().any(|&t| t < NOW - 3_600_000) {
            return Err("too_far_in_past");
        }
        let mut labels_refs = Vec::new();
        for (_, value, pair) in &labels {
            labels_refs.push(pair[0]);
            labels_refs.push(if value.len() > 74 {
                symbols.reference(hashed(value, strategy, 74))
            } else {
                pair[1]
            });
        }
        Ok((
            TimeSeries {
                labels_refs,
                ..series.clone()
            },
            metric.clone(),
        ))
    }

    /// The oracle for metadata, on the kept series in order: Mimir keeps a family's first
    /// entry (one with a type, help or unit) and checks it: a name or unit over 6 bytes
    /// refuses it (and the family's later entries go with it), a help over 6 is cut. A later
    /// entry is held to the same lengths. Returns the refused entries by reason.
    fn judged_metadata(
        kept: &mut [(TimeSeries, String)],
        symbols: &mut OracleSymbols,
    ) -> [u64; MetadataReason::ALL.len()] {
        let mut refused = [0u64; MetadataReason::ALL.len()];
        // Family → refused. No name in CHECKED ends in a histogram's or summary's suffix,
        // so a family is its metric name.
        let mut families: HashMap<String, bool> = HashMap::new();
        for (series, name) in kept.iter_mut() {
            let Some(metadata) = series.metadata else {
                continue;
            };
            let help = symbols.text(metadata.help_ref).to_string();
            let unit = symbols.text(metadata.unit_ref).to_string();
            if metadata.r#type == 0 && help.is_empty() && unit.is_empty() {
                continue;
            }
            let first = !families.contains_key(name.as_str());
            let reason = if families.get(name.as_str()) == Some(&true) {
                series.metadata = None;
                continue;
            } else if name.len() > 6 {
                Some("metric_name_too_long")
            } else if unit.len() > 6 {
                Some("unit_too_long")
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    series.metadata = None;
                    if first {
                        let at = MetadataReason::ALL
                            .iter()
                            .position(|r| r.as_str() == reason)
                            .unwrap();
                        refused[at] += 1;
                    }
                }
                None if help.len() > 6 => {
                    let help_ref = symbols.reference(help[..6].to_string());
                    series.metadata = Some(Metadata {
                        help_ref,
                        ..metadata
                    });
                }
                None => {}
            }
            if first {
                families.insert(name.clone(), reason.is_some());
            }
        }
        refused
    }

    /// `request` with its symbols renumbered in the order its series first refer to them
    /// (labels, then help and unit, then exemplars' labels), those no series refers to after
    /// them, sorted: two requests that differ only in where their symbols sit come out equal.
    fn by_reference_order(request: &Request) -> Request {
        let mut order: Vec<u32> = Vec::new();
        let mut renumbered = std::collections::HashMap::new();
        let mut see = |reference: &mut u32| {
            let next = renumbered.len() as u32;
            let new = *renumbered.entry(*reference).or_insert_with(|| {
                order.push(*reference);
                next
            });
            *reference = new;
        };
        // The empty string first: a reference of 0 means none.
        see(&mut 0);
        let mut timeseries = request.timeseries.clone();
        for series in &mut timeseries {
            series.labels_refs.iter_mut().for_each(&mut see);
            if let Some(metadata) = series.metadata.as_mut() {
                see(&mut metadata.help_ref);
                see(&mut metadata.unit_ref);
            }
            for exemplar in &mut series.exemplars {
                exemplar.labels_refs.iter_mut().for_each(&mut see);
            }
        }
        let mut symbols: Vec<String> = order
            .iter()
            .map(|&at| {
                request
                    .symbols
                    .get(at as usize)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        let mut unreferenced: Vec<String> = (0..request.symbols.len() as u32)
            .filter(|at| !order.contains(at))
            .map(|at| request.symbols[at as usize].clone())
            .collect();
        unreferenced.sort();
        symbols.extend(unreferenced);
        Request {
            symbols,
            timeseries,
        }
    }

    fn decoded(body: &[u8]) -> Request {
        let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
        <Request as prost::Message>::decode(raw.as_slice()).unwrap()
    }

    fn strategy() -> impl Strategy<Value = LabelValueLengthOverLimitStrategy> {
        prop::sample::select(vec![
            LabelValueLengthOverLimitStrategy::Error,
            LabelValueLengthOverLimitStrategy::Truncate,
            LabelValueLengthOverLimitStrategy::Drop,
        ])
    }

    proptest! {
        // A series must pass every check before its values or metadata are rewritten: more
        // cases than the default, so that each rewrite comes up in every run.
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// What validation forwards decodes with prost into exactly the series the oracle
        /// keeps, without a dropped label, its long values (under `truncate` or `drop`) and
        /// long help texts as new symbols appended once each, and its refused metadata cut;
        /// it is what was counted, and what was refused is counted under the oracle's
        /// reasons.
        #[test]
        fn validation_forwards_what_it_counts(
            timeseries in prop::collection::vec(checked_series(), 0..8),
            strategy in strategy(),
        ) {
            let validation = tight_with(strategy);
            let symbols: Vec<String> = CHECKED.iter().map(|s| s.to_string()).collect();
            let request = Request { symbols: symbols.clone(), timeseries };
            let body = request.encode_snappy();
            let (counts, forward, refused) =
                decode_validated(&body, usize::MAX, &validation).unwrap();

            let mut oracle = OracleSymbols(symbols.clone(), symbols.len());
            let mut kept = Vec::new();
            let mut refused_samples = [0u64; SeriesReason::ALL.len()];
            // The series with a label left: the others go silently, before Mimir's checks.
            let mut labelled = Request { symbols: vec![], timeseries: vec![] };
            for series in &request.timeseries {
                match judged(series, &mut oracle, strategy) {
                    Err(UNLABELLED) => continue,
                    Ok(kept_series) => kept.push(kept_series),
                    Err(reason) => {
                        let at = SeriesReason::ALL.iter().position(|r| r.as_str() == reason).unwrap();
                        refused_samples[at] += (series.samples.len() + series.histograms.len()) as u64;
                    }
                }
                labelled.timeseries.push(series.clone());
            }
            let refused_metadata = judged_metadata(&mut kept, &mut oracle);
            // Exemplars (all at NOW) stay within Mimir's window: from 5 minutes before the
            // request's earliest sample or histogram, refused series' too but not those of
            // series with no label left (or an hour, the past grace, before NOW), to 10
            // minutes after NOW.
            let in_window = |request: &Request| {
                let earliest = request
                    .timeseries
                    .iter()
                    .flat_map(|s| s.samples.iter().map(|x| x.timestamp).chain(s.histograms.iter().map(|h| h.timestamp)))
                    .min();
                earliest.is_none_or(|earliest| (earliest - 300_000).max(NOW - 3_600_000) <= NOW)
            };
            let kept_exemplars = in_window(&labelled);
            let expected = Request {
                symbols: oracle.0,
                timeseries: kept
                    .into_iter()
                    .map(|(mut series, _)| {
                        if !kept_exemplars {
                            series.exemplars.clear();
                        }
                        series
                    })
                    .collect(),
            };
            prop_assert_eq!(counts, crate::fuzzing::expected_v2(&expected));
            let refused_series = (labelled.timeseries.len() - expected.timeseries.len()) as u64;
            let unlabelled = super::decode_validated(&body, usize::MAX, &validation).unwrap().unlabelled;
            prop_assert_eq!(unlabelled.series, (request.timeseries.len() - labelled.timeseries.len()) as u64);
            match &refused {
                None => prop_assert_eq!(
                    (refused_series, refused_metadata.iter().sum::<u64>()),
                    (0, 0)
                ),
                Some(refused) => {
                    prop_assert_eq!(refused.series, refused_series);
                    prop_assert_eq!(refused.samples.samples, refused_samples);
                    prop_assert_eq!(refused.samples.metadata, refused_metadata);
                    prop_assert!(refused.first.contains("(err-weir-"), "{}", refused.first);
                }
            }
            match forward {
                Forward::Unchanged => prop_assert_eq!(&expected, &request),
                Forward::Nothing => prop_assert!(expected.timeseries.is_empty()),
                Forward::Rewritten(rewritten) => {
                    prop_assert_ne!(&expected, &request);
                    let forwarded = decoded(&rewritten);
                    // The same symbols, each appended once, in whatever order the series'
                    // rewrites came (validation appends them series by series, the oracle
                    // values first): the same request once its references are resolved.
                    let sorted = |request: &Request| {
                        let mut symbols = request.symbols.clone();
                        symbols.sort();
                        symbols
                    };
                    prop_assert_eq!(sorted(&forwarded), sorted(&expected));
                    prop_assert_eq!(by_reference_order(&forwarded), by_reference_order(&expected));
                    let dropped_left = forwarded.timeseries.iter().any(|series| {
                        series.labels_refs.chunks(2).any(|pair| forwarded.symbols[pair[0] as usize] == "b")
                    });
                    prop_assert!(!dropped_left, "no dropped label is forwarded");
                    // And it passes again as it is, unless its exemplars' window moved: the
                    // refused series' samples no longer count for the earliest.
                    if in_window(&forwarded) {
                        prop_assert_eq!(
                            decode_validated(&rewritten, usize::MAX, &validation).unwrap(),
                            (counts, Forward::Unchanged, None)
                        );
                    }
                }
            }
        }

        #[test]
        fn validating_arbitrary_bytes_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            strategy in strategy(),
        ) {
            let compressed = snap::raw::Encoder::new().compress_vec(&bytes).unwrap();
            let _ = decode_validated(&compressed, 1 << 20, &tight_with(strategy));
        }
    }

    fn validated(request: &Request) -> (WriteCounts, Forward, Option<Refused>) {
        decode_validated(&request.encode_snappy(), usize::MAX, &tight()).unwrap()
    }

    fn sample_at(timestamp: i64) -> Vec<Sample> {
        vec![Sample {
            value: 1.0,
            timestamp,
        }]
    }

    #[test]
    fn a_clean_request_keeps_its_bytes_and_counts_as_the_scan() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "job", "a", "help"]),
            timeseries: vec![TimeSeries {
                labels_refs: vec![1, 2, 3, 4],
                samples: sample_at(NOW),
                histograms: vec![Histogram {
                    timestamp: NOW,
                    ..Histogram::default()
                }],
                metadata: Some(Metadata {
                    r#type: 1,
                    help_ref: 5,
                    unit_ref: 0,
                }),
                ..TimeSeries::default()
            }],
        };
        let (counts, forward, refused) = validated(&request);
        assert_eq!(counts, scan(&raw(&request)).unwrap());
        assert_eq!((forward, refused), (Forward::Unchanged, None));
    }

    #[test]
    fn a_refused_series_is_named_from_the_symbols_and_cut() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "a-b", "1", "job", "x", "b", "r"]),
            timeseries: vec![
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 5, 6])
                },
                // `b` is dropped first: the message does not show it.
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 3, 4, 7, 8])
                },
                TimeSeries {
                    samples: vec![Sample::default(); 2],
                    ..series(vec![1, 2])
                },
            ],
        };
        let (counts, forward, refused) = validated(&request);
        let refused = refused.unwrap();
        assert_eq!(
            refused.first,
            "received a series with an invalid label: 'a-b' series: 'up{a-b=\"1\"}' \
             (err-weir-label-invalid)."
        );
        assert_eq!(refused.series, 2);
        // The third series' two samples, at 1, are hours before NOW.
        assert_eq!(
            refused.samples.samples[SeriesReason::LabelInvalid as usize],
            1,
            "{refused:?}"
        );
        assert_eq!(
            refused.samples.samples[SeriesReason::TooFarInPast as usize],
            2
        );
        assert_eq!(counts.series, 1);
        let Forward::Rewritten(body) = forward else {
            panic!("{forward:?}")
        };
        let forwarded = decoded(&body);
        assert_eq!(forwarded.symbols, request.symbols, "the symbols stay");
        assert_eq!(forwarded.timeseries, vec![request.timeseries[0].clone()]);
    }

    /// `bytes` with each `from` made `to` (of one length).
    fn replaced(mut bytes: Vec<u8>, from: &[u8], to: &[u8]) -> Vec<u8> {
        while let Some(at) = bytes.windows(from.len()).position(|window| window == from) {
            bytes[at..at + to.len()].copy_from_slice(to);
        }
        bytes
    }

    /// A symbol that is not UTF-8 refuses the series whose label value it is
    /// (`label_value_invalid`), and no other, as Mimir reads a body without checking UTF-8;
    /// out of order too, where the labels are read again from the symbols' bytes. Without a
    /// validation the scan still holds the body to prost's decode.
    #[test]
    fn a_symbol_that_is_not_utf8_refuses_the_series_whose_value_it_is() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "job", "BAD", "good", "z", "1"]),
            timeseries: vec![
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 3, 4])
                },
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 3, 5])
                },
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 6, 7, 3, 4])
                },
            ],
        };
        let body = replaced(raw(&request), b"BAD", b"B\xffD");
        assert!(
            matches!(scan(&body), Err(DecodeError::Protobuf(reason)) if reason.contains("not valid UTF-8"))
        );
        let compressed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let (counts, forward, refused) =
            decode_validated(&compressed, usize::MAX, &tight()).unwrap();
        let refused = refused.unwrap();
        assert_eq!(
            refused.first,
            "received a series with invalid value in label 'job': 'B\u{fffd}D' metric: 'up' \
             (err-weir-label-value-invalid)."
        );
        assert_eq!((refused.series, counts.series, counts.samples), (2, 1, 1));
        let invalid = SeriesReason::LabelValueInvalid as usize;
        assert_eq!(refused.samples.samples[invalid], 2, "{refused:?}");
        let Forward::Rewritten(rewritten) = forward else {
            panic!("{forward:?}")
        };
        // The symbols stay as sent, the bad one among them (a receiver that reads as Mimir
        // does takes it): it is made UTF-8 again here only so that prost decodes the rest.
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&rewritten)
            .unwrap();
        let forwarded =
            <Request as prost::Message>::decode(&replaced(raw, b"B\xffD", b"BAD")[..]).unwrap();
        assert_eq!(forwarded.symbols, request.symbols);
        assert_eq!(forwarded.timeseries, vec![request.timeseries[1].clone()]);
    }

    /// A push the HA tracker does not accept is counted whole, as Mimir counts it before its
    /// checks: a series whose label value is not UTF-8, and one a check would refuse, too.
    #[test]
    fn a_push_only_counted_takes_text_that_is_not_utf8() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "job", "BAD", "good", "1up"]),
            timeseries: vec![
                TimeSeries {
                    samples: vec![Sample::default(); 2],
                    ..series(vec![1, 2, 3, 4])
                },
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 6, 3, 5])
                },
                TimeSeries {
                    samples: sample_at(NOW),
                    ..series(vec![1, 2, 3, 5])
                },
            ],
        };
        let body = replaced(raw(&request), b"BAD", b"B\xffD");
        assert!(scan(&body).is_err());
        let counts = count_unchecked(&body, &tight()).unwrap();
        assert_eq!(counts.samples + counts.histograms, 4);
        let plain = raw(&request);
        assert_eq!(
            count_unchecked(&plain, &tight()).unwrap(),
            scan(&plain).unwrap()
        );
    }

    #[test]
    fn drop_labels_rewrites_unpacked_references_as_one_packed_field() {
        // labels_refs as separate varints (tag 1, wire type 0), `b` (3) among them, with the
        // sample between two runs of them.
        let symbols_list = symbols(&["", "__name__", "up", "b", "r", "job", "x"]);
        let sample = prost::Message::encode_to_vec(&TimeSeries {
            samples: sample_at(NOW),
            ..TimeSeries::default()
        });
        let mut series_bytes = vec![0x08, 0x01, 0x08, 0x02, 0x08, 0x03];
        series_bytes.extend(&sample);
        series_bytes.extend([0x08, 0x04, 0x08, 0x05, 0x08, 0x06]);
        let mut body = prost::Message::encode_to_vec(&Request {
            symbols: symbols_list.clone(),
            timeseries: vec![],
        });
        body.push(0x2a); // field 5, length-delimited
        body.push(series_bytes.len() as u8);
        body.extend(series_bytes);
        let compressed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let (counts, forward, refused) =
            decode_validated(&compressed, usize::MAX, &tight()).unwrap();
        assert_eq!(refused, None);
        assert_eq!((counts.series, counts.samples), (1, 1));
        let Forward::Rewritten(rewritten) = forward else {
            panic!("{forward:?}")
        };
        let forwarded = decoded(&rewritten);
        assert_eq!(forwarded.symbols, symbols_list);
        assert_eq!(
            forwarded.timeseries,
            vec![TimeSeries {
                labels_refs: vec![1, 2, 5, 6],
                samples: sample_at(NOW),
                ..TimeSeries::default()
            }]
        );
    }

    #[test]
    fn a_refused_series_takes_its_metadata_and_a_kept_one_of_its_family_carries_it() {
        let metadata = Some(Metadata {
            r#type: MetricType::Histogram as i32,
            help_ref: 5,
            unit_ref: 0,
        });
        let request = Request {
            symbols: symbols(&["", "__name__", "lat_bucket", "lat_sum", "a-b", "help"]),
            timeseries: vec![
                // Refused (invalid label), first of its family.
                TimeSeries {
                    labels_refs: vec![1, 2, 4, 5],
                    samples: sample_at(NOW),
                    metadata,
                    ..TimeSeries::default()
                },
                TimeSeries {
                    labels_refs: vec![1, 3],
                    samples: sample_at(NOW),
                    metadata,
                    ..TimeSeries::default()
                },
            ],
        };
        let (counts, _, refused) = validated(&request);
        assert_eq!((counts.series, counts.metadata), (1, 1));
        assert_eq!(refused.unwrap().series, 1);
        // Alone, the refused series' metadata goes with it.
        let alone = Request {
            timeseries: vec![request.timeseries[0].clone()],
            ..request
        };
        let (counts, forward, _) = validated(&alone);
        assert_eq!(
            (counts, forward),
            (WriteCounts::default(), Forward::Nothing)
        );
    }

    #[test]
    fn a_histogram_over_the_bucket_limit_is_lowered_or_refuses_its_series() {
        let limits = |reduce: bool| {
            Validation::new(
                runtime_config::ValidationLimits {
                    max_native_histogram_buckets: 2,
                    reduce_native_histogram_over_max_buckets: reduce,
                    ..runtime_config::ValidationLimits::default()
                },
                NOW,
            )
        };
        // Four buckets at schema 3 (indices 1 to 4: two at schema 2).
        let histogram = Histogram {
            schema: 3,
            positive_spans: vec![super::super::v2_proto::BucketSpan {
                offset: 1,
                length: 4,
            }],
            positive_deltas: vec![1, 0, 0, 0],
            timestamp: NOW,
            ..Histogram::default()
        };
        let request = Request {
            symbols: symbols(&["", "__name__", "lat", "job", "a"]),
            timeseries: vec![TimeSeries {
                labels_refs: vec![1, 2, 3, 4],
                samples: sample_at(NOW),
                histograms: vec![histogram.clone()],
                ..TimeSeries::default()
            }],
        };
        let body = request.encode_snappy();
        let (counts, forward, refused) =
            decode_validated(&body, usize::MAX, &limits(true)).unwrap();
        assert_eq!(refused, None);
        assert_eq!((counts.samples, counts.histograms), (1, 1));
        let Forward::Rewritten(rewritten) = forward else {
            panic!("{forward:?}")
        };
        let forwarded = decoded(&rewritten);
        let lowered = &forwarded.timeseries[0].histograms[0];
        assert!(lowered.schema < 3, "{lowered:?}");
        assert!(lowered.positive_deltas.len() <= 2, "{lowered:?}");
        assert_eq!(
            TimeSeries {
                histograms: vec![],
                ..forwarded.timeseries[0].clone()
            },
            TimeSeries {
                histograms: vec![],
                ..request.timeseries[0].clone()
            },
            "the rest of the series as sent"
        );
        // Reduction off: the series is refused, named.
        let (counts, forward, refused) =
            decode_validated(&body, usize::MAX, &limits(false)).unwrap();
        let refused = refused.unwrap();
        assert_eq!(
            (counts, forward),
            (WriteCounts::default(), Forward::Nothing)
        );
        assert_eq!(
            refused.samples.samples[SeriesReason::MaxNativeHistogramBuckets as usize],
            2
        );
        assert!(
            refused.first.contains("lat{job=\"a\"}")
                && refused
                    .first
                    .contains("err-weir-max-native-histogram-buckets"),
            "{}",
            refused.first
        );
    }

    /// A body whose symbols lie both before and after its series, as protobuf allows.
    fn symbols_around(symbols: &[String], split: usize, timeseries: Vec<TimeSeries>) -> Vec<u8> {
        let part = |symbols: &[String], timeseries: Vec<TimeSeries>| {
            raw(&Request {
                symbols: symbols.to_vec(),
                timeseries,
            })
        };
        let mut body = part(&symbols[..split], vec![]);
        body.extend(part(&[], timeseries));
        body.extend(part(&symbols[split..], vec![]));
        snap::raw::Encoder::new().compress_vec(&body).unwrap()
    }

    #[test]
    fn truncate_and_drop_write_a_long_value_as_one_new_symbol_after_all_others() {
        let long = "v".repeat(80);
        let list = symbols(&["", "__name__", "up", "job", &long, "x", "b", "r"]);
        let timeseries = vec![
            TimeSeries {
                samples: sample_at(NOW),
                ..series(vec![1, 2, 3, 4])
            },
            // The same value again, with a dropped label before it.
            TimeSeries {
                samples: sample_at(NOW),
                ..series(vec![1, 5, 6, 7, 3, 4])
            },
            TimeSeries {
                samples: sample_at(NOW),
                ..series(vec![1, 5, 3, 5])
            },
        ];
        // The symbols `long` and after come after the series on the wire: the new symbol
        // still follows all of them.
        let body = symbols_around(&list, 4, timeseries.clone());
        for strategy in [
            LabelValueLengthOverLimitStrategy::Truncate,
            LabelValueLengthOverLimitStrategy::Drop,
        ] {
            let (counts, forward, refused) =
                decode_validated(&body, usize::MAX, &tight_with(strategy)).unwrap();
            assert_eq!(refused, None, "{strategy:?}");
            assert_eq!((counts.series, counts.samples), (3, 3));
            let Forward::Rewritten(rewritten) = forward else {
                panic!("{forward:?}")
            };
            let forwarded = decoded(&rewritten);
            let new_value = hashed(&long, strategy, 74);
            assert!(new_value.len() <= 74, "{new_value}");
            let mut expected_symbols = list.clone();
            expected_symbols.push(new_value);
            assert_eq!(
                forwarded.symbols, expected_symbols,
                "{strategy:?}: appended once"
            );
            let labels: Vec<Vec<u32>> = forwarded
                .timeseries
                .iter()
                .map(|series| series.labels_refs.clone())
                .collect();
            assert_eq!(
                labels,
                vec![vec![1, 2, 3, 8], vec![1, 5, 3, 8], vec![1, 5, 3, 5]]
            );
            assert_eq!(forwarded.timeseries[2], timeseries[2], "untouched");
            assert_eq!(
                decode_validated(&rewritten, usize::MAX, &tight_with(strategy)).unwrap(),
                (counts, Forward::Unchanged, None),
                "it passes again as it is"
            );
        }
        // Under `error` the series with the value are refused.
        let (counts, _, refused) = decode_validated(&body, usize::MAX, &tight()).unwrap();
        assert_eq!((counts.series, refused.unwrap().series), (1, 2));
    }

    #[test]
    fn a_long_help_is_cut_into_a_new_symbol_and_a_long_unit_cuts_its_familys_metadata() {
        let list = symbols(&["", "__name__", "up", "help text", "seconds", "s", "x"]);
        let metadata = |r#type: i32, help_ref: u32, unit_ref: u32| {
            Some(Metadata {
                r#type,
                help_ref,
                unit_ref,
            })
        };
        // `up`'s metadata in two pieces, merged: type and help, then the unit.
        let mut up = raw(&Request {
            symbols: vec![],
            timeseries: vec![TimeSeries {
                samples: sample_at(NOW),
                metadata: metadata(1, 3, 0),
                ..series(vec![1, 2])
            }],
        });
        let mut unit_piece = Vec::new();
        prost::encoding::message::encode(5, &metadata(0, 0, 5).unwrap(), &mut unit_piece);
        // The body is one `timeseries` field: its length grows by the piece.
        assert!(up.len() < 120, "one-byte length");
        up[1] += unit_piece.len() as u8;
        up.extend(unit_piece);
        let mut body = raw(&Request {
            symbols: list.clone(),
            timeseries: vec![],
        });
        body.extend(up);
        body.extend(raw(&Request {
            symbols: vec![],
            timeseries: vec![
                // `x` with a unit over the limit: its metadata is refused, the series stays.
                TimeSeries {
                    samples: sample_at(NOW),
                    metadata: metadata(2, 0, 4),
                    ..series(vec![1, 6])
                },
                // `x` again, within the limits: the family's entry was refused, this goes too.
                TimeSeries {
                    samples: sample_at(NOW),
                    metadata: metadata(2, 0, 5),
                    ..series(vec![1, 6])
                },
                // `up` again: not charged twice, its help cut to the same new symbol.
                TimeSeries {
                    samples: sample_at(NOW),
                    metadata: metadata(1, 3, 5),
                    ..series(vec![1, 2])
                },
            ],
        }));
        let body = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let (counts, forward, refused) = decode_validated(&body, usize::MAX, &tight()).unwrap();
        assert_eq!((counts.series, counts.metadata), (4, 1));
        let refused = refused.unwrap();
        assert_eq!(refused.series, 0);
        assert_eq!(refused.samples.samples(), 0);
        assert_eq!(
            refused.samples.metadata[MetadataReason::UnitTooLong as usize],
            1
        );
        assert_eq!(refused.samples.metadata(), 1);
        assert!(
            refused.first.contains("unit: 'seconds' metric name: 'x'")
                && refused.first.contains("(err-weir-unit-too-long)"),
            "{}",
            refused.first
        );
        let Forward::Rewritten(rewritten) = forward else {
            panic!("{forward:?}")
        };
        let forwarded = decoded(&rewritten);
        let mut expected_symbols = list.clone();
        expected_symbols.push("help t".to_string());
        assert_eq!(forwarded.symbols, expected_symbols);
        let metadata_of: Vec<Option<Metadata>> = forwarded
            .timeseries
            .iter()
            .map(|series| series.metadata)
            .collect();
        assert_eq!(
            metadata_of,
            vec![metadata(1, 7, 5), None, None, metadata(1, 7, 5)]
        );
        assert!(forwarded
            .timeseries
            .iter()
            .all(|series| series.samples.len() == 1 && series.labels_refs.len() == 2));
        assert_eq!(
            decode_validated(&rewritten, usize::MAX, &tight()).unwrap(),
            (counts, Forward::Unchanged, None),
            "it passes again as it is"
        );
    }

    /// Kept exemplars out of time order are forwarded sorted, as Mimir sorts them; in order,
    /// the series keeps its bytes.
    #[test]
    fn kept_exemplars_are_sorted_by_time() {
        let at = |labels_refs: Vec<u32>, timestamp: i64| Exemplar {
            labels_refs,
            value: 1.0,
            timestamp,
        };
        let with = |exemplars: Vec<Exemplar>| Request {
            symbols: symbols(&["", "__name__", "up", "trace_id", "abc"]),
            timeseries: vec![TimeSeries {
                samples: sample_at(NOW),
                exemplars,
                ..series(vec![1, 2])
            }],
        };
        let on = Validation::new(
            runtime_config::ValidationLimits {
                max_global_exemplars_per_user: 1,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        );
        // The second has no labels and goes; the other two are kept, out of order.
        let request = with(vec![
            at(vec![3, 4], NOW),
            at(vec![], NOW - 60_000),
            at(vec![3, 4], NOW - 30_000),
        ]);
        let answer = super::decode_validated(&request.encode_snappy(), usize::MAX, &on).unwrap();
        let Forward::Rewritten(body) = answer.forward else {
            panic!("{:?}", answer.forward);
        };
        assert_eq!(
            decoded(&body).timeseries[0].exemplars,
            vec![at(vec![3, 4], NOW - 30_000), at(vec![3, 4], NOW)]
        );
        assert_eq!(answer.counts.exemplars, 2);
        let in_order = with(vec![at(vec![3, 4], NOW - 30_000), at(vec![3, 4], NOW)]);
        let answer = super::decode_validated(&in_order.encode_snappy(), usize::MAX, &on).unwrap();
        assert_eq!(answer.forward, Forward::Unchanged);
    }

    /// An exemplar label or a help whose symbol is not UTF-8 passes, as on 1.0: Mimir's checks
    /// read them as they are. (Before, such an exemplar label read as empty and was dropped.)
    #[test]
    fn an_exemplar_label_or_help_that_is_not_utf8_passes_as_in_mimir() {
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "trace_id", "BAD", "BAD help"]),
            timeseries: vec![TimeSeries {
                samples: sample_at(NOW),
                exemplars: vec![Exemplar {
                    labels_refs: vec![3, 4],
                    value: 1.0,
                    timestamp: NOW,
                }],
                metadata: Some(Metadata {
                    r#type: MetricType::Gauge as i32,
                    help_ref: 5,
                    unit_ref: 0,
                }),
                ..series(vec![1, 2])
            }],
        };
        let body = replaced(raw(&request), b"BAD", b"B\xffD");
        let compressed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let on = Validation::new(
            runtime_config::ValidationLimits {
                max_global_exemplars_per_user: 100_000,
                ..runtime_config::ValidationLimits::default()
            },
            NOW,
        );
        let answer = super::decode_validated(&compressed, usize::MAX, &on).unwrap();
        assert!(answer.refused.is_none(), "{:?}", answer.refused);
        let counts = &answer.counts;
        assert_eq!(
            (counts.samples, counts.exemplars, counts.metadata),
            (1, 1, 1)
        );
        assert_eq!(answer.forward, Forward::Unchanged);
        // A help over the limit is cut as its bytes are, not as a lossy copy of them: the
        // new symbol is its first five bytes, the bad one among them.
        let short = Validation::new(
            runtime_config::ValidationLimits {
                max_metadata_length: 5,
                ..on.limits
            },
            NOW,
        );
        let answer = super::decode_validated(&compressed, usize::MAX, &short).unwrap();
        let Forward::Rewritten(rewritten) = answer.forward else {
            panic!("{:?}", answer.forward)
        };
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&rewritten)
            .unwrap();
        let forwarded =
            <Request as prost::Message>::decode(&replaced(raw, b"B\xffD", b"BAD")[..]).unwrap();
        let help_ref = forwarded.timeseries[0].metadata.as_ref().unwrap().help_ref;
        assert_eq!(forwarded.symbols[help_ref as usize], "BAD h");
    }

    #[test]
    fn exemplars_are_dropped_as_mimir_drops_them() {
        use crate::counts::ExemplarReason as R;
        let long = "é".repeat(128);
        let request = Request {
            symbols: symbols(&["", "__name__", "up", "trace_id", "abc", "t", &long, "x"]),
            timeseries: vec![
                TimeSeries {
                    samples: sample_at(NOW - 60_000),
                    exemplars: [
                        (vec![3, 4], NOW),
                        (vec![], NOW),
                        (vec![3, 4], 0),
                        (vec![5, 6], NOW),
                        (vec![3, 0], NOW),
                        (vec![3, 4], NOW - 7 * 60_000),
                        (vec![3, 4], NOW + 11 * 60_000),
                    ]
                    .into_iter()
                    .map(|(labels_refs, timestamp)| Exemplar {
                        labels_refs,
                        value: 1.0,
                        timestamp,
                    })
                    .collect(),
                    ..series(vec![1, 2])
                },
                TimeSeries {
                    samples: sample_at(NOW),
                    exemplars: vec![
                        Exemplar {
                            labels_refs: vec![3, 7],
                            value: 2.0,
                            timestamp: NOW,
                        };
                        3
                    ],
                    ..series(vec![1, 2, 5, 7])
                },
            ],
        };
        let limits = |global, cap| runtime_config::ValidationLimits {
            max_global_exemplars_per_user: global,
            max_exemplars_per_series_per_request: cap,
            ..runtime_config::ValidationLimits::default()
        };
        let exemplar = |series: usize, at: usize| request.timeseries[series].exemplars[at].clone();
        let mut each = DroppedExemplars::default();
        for reason in [
            R::LabelsMissing,
            R::TimestampInvalid,
            R::LabelsTooLong,
            R::LabelsBlank,
            R::TooOld,
            R::TooFarInFuture,
        ] {
            each[reason as usize] = 1;
        }
        let mut capped = DroppedExemplars::default();
        capped[R::LabelsMissing as usize] = 1;
        capped[R::TooManyPerSeries as usize] = 5 + 1;
        for (limits, kept, dropped) in [
            // On, no cap: each of the first series' bad ones goes for its reason.
            (
                limits(1, 0),
                [vec![exemplar(0, 0)], vec![exemplar(1, 0); 3]],
                each,
            ),
            // A cap of 2 a series goes first: the rest of each series goes as too many.
            (
                limits(1, 2),
                [vec![exemplar(0, 0)], vec![exemplar(1, 0); 2]],
                capped,
            ),
            // Off (Mimir's default): every exemplar goes, and none is counted as dropped.
            (limits(0, 0), [vec![], vec![]], DroppedExemplars::default()),
        ] {
            let answer = super::decode_validated(
                &request.encode_snappy(),
                usize::MAX,
                &Validation::new(limits, NOW),
            )
            .unwrap();
            assert_eq!(answer.refused, None);
            assert_eq!(answer.dropped_exemplars, dropped, "{limits:?}");
            let forwarded = match answer.forward {
                Forward::Rewritten(body) => decoded(&body),
                other => panic!("{other:?}"),
            };
            assert_eq!(forwarded.symbols, request.symbols);
            assert_eq!(
                answer.counts.exemplars,
                (kept[0].len() + kept[1].len()) as u64
            );
            for ((got, sent), kept) in forwarded
                .timeseries
                .iter()
                .zip(&request.timeseries)
                .zip(kept)
            {
                assert_eq!(got.exemplars, kept, "{limits:?}");
                assert_eq!(
                    (&got.labels_refs, &got.samples),
                    (&sent.labels_refs, &sent.samples)
                );
            }
        }
        // With every exemplar valid, the client's bytes go on.
        let clean = Request {
            timeseries: vec![request.timeseries[1].clone()],
            ..request.clone()
        };
        let decoded = super::decode_validated(
            &clean.encode_snappy(),
            usize::MAX,
            &Validation::new(limits(1, 0), NOW),
        )
        .unwrap();
        assert_eq!(
            (decoded.forward, decoded.counts.exemplars),
            (Forward::Unchanged, 3)
        );
    }

    /// Mimir's deduplication: a sample or histogram repeating a timestamp of its series goes,
    /// uncharged and counted, and the rest of the series stays.
    #[test]
    fn samples_and_histograms_repeating_a_timestamp_are_dropped() {
        let histogram = |timestamp| Histogram {
            timestamp,
            ..Histogram::default()
        };
        let sample = |value, timestamp| Sample { value, timestamp };
        let request = Request {
            symbols: symbols(&["", "__name__", "up"]),
            timeseries: vec![TimeSeries {
                samples: vec![sample(1.0, NOW), sample(2.0, NOW - 1), sample(3.0, NOW)],
                histograms: vec![histogram(NOW), histogram(NOW)],
                ..series(vec![1, 2])
            }],
        };
        let answer =
            super::decode_validated(&request.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!(answer.refused, None);
        assert_eq!(answer.repeated_timestamps, 2);
        assert_eq!((answer.counts.samples, answer.counts.histograms), (2, 1));
        let Forward::Rewritten(body) = answer.forward else {
            panic!("{:?}", answer.forward);
        };
        let forwarded = decoded(&body);
        assert_eq!(
            forwarded.timeseries[0].samples,
            vec![sample(1.0, NOW), sample(2.0, NOW - 1)]
        );
        assert_eq!(forwarded.timeseries[0].histograms, vec![histogram(NOW)]);
        // Out of order without a repeat: the client's bytes.
        let ordered = Request {
            timeseries: vec![TimeSeries {
                samples: vec![sample(1.0, NOW), sample(2.0, NOW - 1)],
                ..series(vec![1, 2])
            }],
            ..request
        };
        let answer =
            super::decode_validated(&ordered.encode_snappy(), usize::MAX, &tight()).unwrap();
        assert_eq!(
            (answer.forward, answer.repeated_timestamps),
            (Forward::Unchanged, 0)
        );
    }
}
