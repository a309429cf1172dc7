//! Mimir's series and metadata validation, on the remote-write 1.0 scan: a series with too
//! many labels, a label name or value too long, an invalid metric or label name, a duplicate
//! label name, a sample too far in the future or the past, or a native histogram with too
//! many buckets is refused, with Mimir's reasons, and the rest of the request goes on (see
//! [`super::decode_validated`]); so is a metadata entry without a metric name or with one, or
//! a unit, too long.
//!
//! Some checks rewrite instead of refusing, as Mimir's do: a label value over the limit under
//! `truncate` or `drop`, a histogram whose resolution can be lowered to fit, a help text over
//! the limit. Each gives the scan a [`Splice`] for the forwarded body.
//!
//! The checks run as the scan walks each label and sample, on what it already holds: a count,
//! two lengths and a byte loop over each name. Messages and rewrites are built only for the
//! series that need them.

use runtime_config::validation::{
    LabelValueLengthOverLimitStrategy, NameValidationScheme, LABEL_VALUE_HASH_LENGTH,
};
use runtime_config::ValidationLimits;

use super::prompb::{BucketSpan, Histogram, RawMetricMetadata};
use super::wire::is_utf8;
use crate::counts::{ExemplarReason, MetadataReason, SeriesReason};

/// The limits a request is checked against, the replica's clock (Unix milliseconds), and the
/// label names the tenant's series lose first (`drop_labels`).
#[derive(Debug, Clone)]
pub struct Validation {
    pub limits: ValidationLimits,
    pub now_ms: i64,
    pub drop_labels: Option<std::sync::Arc<[String]>>,
    /// The tenant's HA check, when it deduplicates HA pairs (`accept_ha_samples`).
    pub ha: Option<crate::ha::HaCheck>,
    /// The tenant's `metric_relabel_configs`, run on each series after the HA check and
    /// before the rest (see [`super::relabel`]).
    pub relabel: Option<super::relabel::Relabelling>,
    /// The tenant's OTLP translation settings (promoted resource attributes, identifying
    /// attributes kept), which shape the series an OTLP export is checked as.
    pub otlp: Option<std::sync::Arc<runtime_config::OtlpTranslation>>,
    /// The latest and earliest timestamps allowed (Unix milliseconds), from the two above.
    latest_ms: i64,
    earliest_ms: i64,
}

impl Validation {
    /// With `drop_labels`: these label names are cut from every series first.
    pub fn dropping(mut self, labels: Option<std::sync::Arc<[String]>>) -> Validation {
        self.drop_labels = labels.filter(|labels| !labels.is_empty());
        self
    }

    /// With the tenant's HA check: the first series' cluster and replica labels are looked
    /// up before anything else (see [`crate::ha`]).
    pub fn deduplicating(mut self, ha: Option<crate::ha::HaCheck>) -> Validation {
        self.ha = ha;
        self
    }

    /// With the tenant's OTLP translation settings.
    pub fn translating(
        mut self,
        otlp: Option<std::sync::Arc<runtime_config::OtlpTranslation>>,
    ) -> Validation {
        self.otlp = otlp;
        self
    }

    /// The OTLP translation settings in force: the tenant's, or Mimir's defaults.
    pub(crate) fn translation(&self) -> &runtime_config::OtlpTranslation {
        static DEFAULT: runtime_config::OtlpTranslation = runtime_config::OtlpTranslation::DEFAULT;
        self.otlp.as_deref().unwrap_or(&DEFAULT)
    }

    /// With the tenant's relabelling rules.
    pub fn relabelling(mut self, relabel: Option<super::relabel::Relabelling>) -> Validation {
        self.relabel = relabel;
        self
    }

    /// What the HA tracker's `outcome` leaves of this validation: `None` when the push goes
    /// no further (deduplicated, or a cluster too many); else this validation, dropping the
    /// replica label too when the push is from the elected replica.
    pub(crate) fn after_ha(
        &self,
        outcome: &crate::ha::HaOutcome,
    ) -> Option<std::borrow::Cow<'_, Validation>> {
        use crate::ha::HaOutcome;
        match outcome {
            HaOutcome::Deduplicated { .. } | HaOutcome::TooManyClusters { .. } => None,
            HaOutcome::Accepted { replica_label, .. } => {
                Some(std::borrow::Cow::Owned(self.also_dropping(replica_label)))
            }
            HaOutcome::Off | HaOutcome::NotHa => Some(std::borrow::Cow::Borrowed(self)),
        }
    }

    /// This validation, with `label` dropped from every series too (the HA replica label).
    fn also_dropping(&self, label: &str) -> Validation {
        let mut labels: Vec<String> = self.drop_labels.as_deref().unwrap_or_default().to_vec();
        labels.push(label.to_string());
        Validation {
            drop_labels: Some(labels.into()),
            ha: None,
            ..self.clone()
        }
    }

    /// Whether a label of this name is dropped.
    #[inline]
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.drop_labels
            .as_ref()
            .is_some_and(|labels| labels.iter().any(|label| label.as_bytes() == name))
    }

    /// The samples' timestamps allowed (Unix milliseconds): from now minus
    /// `past_grace_period` (when set) to now plus `creation_grace_period`.
    pub(crate) fn window(&self) -> std::ops::RangeInclusive<i64> {
        self.earliest_ms..=self.latest_ms
    }

    pub fn new(limits: ValidationLimits, now_ms: i64) -> Validation {
        let millis = |period: std::time::Duration| period.as_millis().min(i64::MAX as u128) as i64;
        Validation {
            limits,
            now_ms,
            drop_labels: None,
            ha: None,
            relabel: None,
            otlp: None,
            latest_ms: now_ms.saturating_add(millis(limits.creation_grace_period)),
            earliest_ms: if limits.past_grace_period.is_zero() {
                i64::MIN
            } else {
                now_ms.saturating_sub(millis(limits.past_grace_period))
            },
        }
    }
}

/// One series as the scan walks it.
pub(crate) struct SeriesCheck<'a> {
    labels: u32,
    /// Whether the series' metric name (its `__name__` label's value) is a legacy metric
    /// name; `None` when it has none.
    metric_name: Option<bool>,
    /// Whether that name ends in `_info`: an info series, with a label limit of its own.
    info: bool,
    previous_name: &'a [u8],
    /// Whether a label's name sorts before the one before it. Mimir sorts a series' labels
    /// before its checks, so then the checks are made again on them sorted
    /// ([`first_label_error`](Self::first_label_error)). Prometheus sorts them; vmagent
    /// sorts them only with `-sortLabels` (off by default).
    unsorted: bool,
    /// The series' label names in the order checked (the first [`NAMES`]), for the duplicates
    /// of a series out of order.
    names: [&'a [u8]; NAMES],
    /// The first label that failed a per-label check, with its index, in the order sent.
    label_error: Option<(SeriesReason, u32)>,
    min_timestamp: i64,
    max_timestamp: i64,
    /// The last sample's and histogram's timestamps, and whether one came at or before the
    /// one before it: only then can a timestamp repeat, which
    /// [`cut_repeats`](Self::cut_repeats) looks for.
    last_sample: i64,
    last_histogram: i64,
    unordered: bool,
    /// The byte ranges, in the series, of the fields cut whole: the labels `drop_labels` and
    /// empty values cut (1.0; 2.0 rewrites its `labels_refs` instead), and the samples and
    /// histograms that repeat a timestamp ([`cut_repeats`](Self::cut_repeats)).
    pub(crate) dropped: Vec<std::ops::Range<usize>>,
    /// Fields of the series written again: labels with a value rewritten under `truncate` or
    /// `drop`, histograms of a lower resolution. In series order.
    pub(crate) replaced: Vec<Splice>,
    /// The first histogram over `max_native_histogram_buckets` that stays over it.
    histogram_error: Option<HistogramError>,
    /// The series' exemplars, in series order, for [`exemplar_cuts`] once the request's
    /// earliest sample is known.
    pub(crate) exemplars: Vec<ExemplarSeen>,
    /// Label names, by position, and a metric name that passed the legacy name checks in an
    /// earlier series of the request ([`next`](Self::next) keeps them). The series of one
    /// request mostly share their names, which a compare confirms for less than the checks.
    known_names: [&'a [u8]; KNOWN_NAMES],
    known_metric: &'a [u8],
}

/// How many label names, by position, [`SeriesCheck`] remembers from series to series.
const KNOWN_NAMES: usize = 16;

/// How many of a series' label names [`SeriesCheck`] keeps, to find the duplicates of a
/// series out of order without reading it again (Mimir's default limit is 30 labels).
const NAMES: usize = 32;

/// The fields of `series` whose sample, or histogram (under `histogram_tag`), repeats the
/// timestamp of an earlier one of its kind, in series order, each with whether it is a
/// histogram. The scan has already checked every field, so a field that does not read ends
/// the walk. (Remote-write 1.0 and 2.0 share the sample's and the histogram's layout.)
#[cold]
#[inline(never)]
fn repeated_timestamps(series: &[u8], histogram_tag: u32) -> Vec<(std::ops::Range<usize>, bool)> {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    let mut samples = std::collections::HashSet::new();
    let mut histograms = std::collections::HashSet::new();
    let mut repeats = Vec::new();
    let mut buf = series;
    while !buf.is_empty() {
        let start = series.len() - buf.len();
        let Ok((tag, wire_type)) = decode_key(&mut buf) else {
            break;
        };
        let histogram = tag == histogram_tag;
        if wire_type != WireType::LengthDelimited || (tag != 2 && !histogram) {
            if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
                break;
            }
            continue;
        }
        let Some(length) = decode_varint(&mut buf)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
        else {
            break;
        };
        let Some((body, rest)) = buf.split_at_checked(length) else {
            break;
        };
        buf = rest;
        let range = start..series.len() - buf.len();
        let timestamp = if histogram {
            <Histogram as prost::Message>::decode(body).map(|h| h.timestamp)
        } else {
            <super::prompb::Sample as prost::Message>::decode(body).map(|s| s.timestamp)
        };
        let Ok(timestamp) = timestamp else {
            break;
        };
        let seen = if histogram {
            &mut histograms
        } else {
            &mut samples
        };
        if !seen.insert(timestamp) {
            repeats.push((range, histogram));
        }
    }
    repeats
}

/// One exemplar of a series, as the scan read it: its whole field in the series' bytes, its
/// timestamp, and what its own content fails ([`exemplar_content`]), if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExemplarSeen {
    pub field: std::ops::Range<usize>,
    pub timestamp: i64,
    pub invalid: Option<ExemplarReason>,
}

/// Mimir's checks of one exemplar's own content (its distributor's `validateExemplar`), in
/// its order: no labels, no timestamp, labels over 128 characters (names and values
/// together, counted as Go counts runes: see [`go_runes`]), no label with both a name and a
/// value. Text that is not UTF-8 is not refused here, as in Mimir.
pub(crate) fn exemplar_content<'l>(
    labels: impl Iterator<Item = (&'l [u8], &'l [u8])>,
    timestamp: i64,
) -> Option<ExemplarReason> {
    let (mut count, mut length, mut any_whole) = (0usize, 0usize, false);
    for (name, value) in labels {
        count += 1;
        length += go_runes(name) + go_runes(value);
        any_whole |= !name.is_empty() && !value.is_empty();
    }
    if count == 0 {
        Some(ExemplarReason::LabelsMissing)
    } else if timestamp == 0 {
        Some(ExemplarReason::TimestampInvalid)
    } else if length > EXEMPLAR_MAX_LABEL_SET_LENGTH {
        Some(ExemplarReason::LabelsTooLong)
    } else if !any_whole {
        Some(ExemplarReason::LabelsBlank)
    } else {
        None
    }
}

/// How many runes Go's `utf8.RuneCount` finds in `text`: its characters, and each byte that
/// is not part of one (Rust's `utf8_chunks` ends an invalid piece where Go's decoder resumes).
pub(crate) fn go_runes(text: &[u8]) -> usize {
    if let Ok(text) = std::str::from_utf8(text) {
        return text.chars().count();
    }
    text.utf8_chunks()
        .map(|chunk| chunk.valid().chars().count() + chunk.invalid().len())
        .sum()
}

/// Where Mimir cuts a text over `max` bytes: at the last rune that starts at or before `max`
/// (Go's `for i := range text`, each byte that is not part of a character a rune of its own),
/// so no character is split.
fn cut_at_rune(text: &[u8], max: usize) -> usize {
    let (mut at, mut cut) = (0, 0);
    for chunk in text.utf8_chunks() {
        let starts = chunk.valid().char_indices().map(|(i, _)| i);
        let starts = starts.chain(chunk.valid().len()..chunk.valid().len() + chunk.invalid().len());
        for start in starts {
            if at + start > max {
                return cut;
            }
            cut = at + start;
        }
        at += chunk.valid().len() + chunk.invalid().len();
    }
    cut
}

/// Characters an exemplar's labels may hold, names and values together (OpenMetrics').
pub(crate) const EXEMPLAR_MAX_LABEL_SET_LENGTH: usize = 128;

/// How far before the request's earliest sample an exemplar may be: Prometheus' client
/// libraries send an exemplar again on every scrape until a newer one replaces it.
const EXEMPLAR_BEFORE_EARLIEST_SAMPLE_MS: i64 = 5 * 60 * 1000;

impl Validation {
    /// The exemplar timestamps a request keeps, from its earliest sample or histogram
    /// (`i64::MAX` when it has none), as Mimir's distributor computes them: no more than 5
    /// minutes before that sample, nor before `past_grace_period` when it is set, and no
    /// further ahead than `creation_grace_period`. A request without samples keeps every
    /// exemplar from the epoch on.
    pub(crate) fn exemplar_window(&self, earliest_sample: i64) -> std::ops::RangeInclusive<i64> {
        let earliest = if earliest_sample == i64::MAX {
            0
        } else {
            earliest_sample
                .saturating_sub(EXEMPLAR_BEFORE_EARLIEST_SAMPLE_MS)
                .max(self.earliest_ms)
        };
        earliest..=self.latest_ms
    }
}

/// Mimir's rules for one kept series' exemplars (its distributor's `validateExemplars`), in
/// its order: with `max_global_exemplars_per_user` at zero every exemplar goes, uncounted;
/// past `max_exemplars_per_series_per_request` the rest go; then each that fails its own
/// checks or lies outside `window` goes. Returns the fields to cut, and counts each by
/// reason in `dropped`. The ones kept are sorted by time after ([`exemplar_order`]).
pub(crate) fn exemplar_cuts(
    exemplars: &[ExemplarSeen],
    limits: &ValidationLimits,
    window: &std::ops::RangeInclusive<i64>,
    dropped: &mut crate::counts::DroppedExemplars,
) -> Vec<std::ops::Range<usize>> {
    if limits.max_global_exemplars_per_user == 0 {
        return exemplars.iter().map(|seen| seen.field.clone()).collect();
    }
    let allowed = match limits.max_exemplars_per_series_per_request {
        0 => exemplars.len(),
        limit => exemplars.len().min(limit as usize),
    };
    let (kept, over) = exemplars.split_at(allowed);
    dropped[ExemplarReason::TooManyPerSeries as usize] += over.len() as u64;
    let mut cuts: Vec<_> = over.iter().map(|seen| seen.field.clone()).collect();
    for seen in kept {
        let reason = seen.invalid.or(if seen.timestamp < *window.start() {
            Some(ExemplarReason::TooOld)
        } else if seen.timestamp > *window.end() {
            Some(ExemplarReason::TooFarInFuture)
        } else {
            None
        });
        if let Some(reason) = reason {
            dropped[reason as usize] += 1;
            cuts.push(seen.field.clone());
        }
    }
    cuts.sort_by_key(|range| range.start);
    cuts
}

/// Mimir sorts the exemplars a series keeps by time when they are not (its
/// `SortExemplars`), and a receiver's exemplar storage takes them only in order. When the
/// exemplars kept (those of `exemplars` whose field is not in `cuts`, sorted by start) are
/// out of order: the splices that write them sorted (stably) where the first of them was,
/// the others' fields emptied. `series` is the series' bytes the fields are in.
pub(crate) fn exemplar_order(
    exemplars: &[ExemplarSeen],
    cuts: &[std::ops::Range<usize>],
    series: &[u8],
) -> Vec<Splice> {
    let is_kept = |seen: &&ExemplarSeen| {
        cuts.binary_search_by_key(&seen.field.start, |cut| cut.start)
            .is_err()
    };
    // Checked in place: a series in order, the rule, allocates nothing.
    let in_order = exemplars.iter().filter(is_kept);
    if in_order.is_sorted_by_key(|seen| seen.timestamp) {
        return Vec::new();
    }
    let mut kept: Vec<&ExemplarSeen> = exemplars.iter().filter(is_kept).collect();
    let first = kept[0].field.clone();
    let mut splices: Vec<Splice> = kept[1..]
        .iter()
        .map(|seen| Splice {
            range: seen.field.clone(),
            with: Vec::new(),
        })
        .collect();
    kept.sort_by_key(|seen| seen.timestamp);
    let with = kept.iter().flat_map(|seen| &series[seen.field.clone()]);
    splices.push(Splice {
        range: first,
        with: with.copied().collect(),
    });
    splices
}

/// A series' rewrite as [`PendingExemplars::settle`] finds it in an edit: where the series'
/// bytes are in the request, and its splices.
pub(crate) type SeriesSplices<'e> = Option<(std::ops::Range<usize>, &'e mut Vec<Splice>)>;

/// The exemplars of a request's kept series, judged once the scan is over: an exemplar's
/// age is measured from the request's earliest sample, which only the whole scan knows.
#[derive(Default)]
pub(crate) struct PendingExemplars {
    earliest_sample: Option<i64>,
    /// Each kept series' exemplars, with the index of the series' edit.
    series: Vec<(usize, Vec<ExemplarSeen>)>,
}

impl PendingExemplars {
    /// A series' earliest sample or histogram, refused series' too, as Mimir's window takes
    /// them (`i64::MAX` when it has none).
    #[inline]
    pub(crate) fn samples_from(&mut self, earliest: i64) {
        let known = self.earliest_sample.unwrap_or(i64::MAX);
        self.earliest_sample = Some(known.min(earliest));
    }

    /// A kept series' exemplars, its rewrite being `edit` among the request's edits.
    pub(crate) fn push(&mut self, edit: usize, exemplars: Vec<ExemplarSeen>) {
        self.series.push((edit, exemplars));
    }

    /// Each series' cuts ([`exemplar_cuts`]) and the order of the rest
    /// ([`exemplar_order`]) joined to its rewrite's splices (`splices` finds them in an edit,
    /// with the series' place in `raw`, the request's bytes), in order; a rewrite left with
    /// no splice is no edit at all. Returns how many exemplars were cut, and counts the
    /// drops by reason in `dropped`.
    pub(crate) fn settle<E>(
        self,
        validation: &Validation,
        raw: &[u8],
        edits: &mut Vec<E>,
        splices: fn(&mut E) -> SeriesSplices<'_>,
        dropped: &mut crate::counts::DroppedExemplars,
    ) -> u64 {
        if self.series.is_empty() {
            return 0;
        }
        let window = validation.exemplar_window(self.earliest_sample.unwrap_or(i64::MAX));
        let mut cut = 0;
        for (at, exemplars) in self.series {
            let cuts = exemplar_cuts(&exemplars, &validation.limits, &window, dropped);
            cut += cuts.len() as u64;
            if let Some((series, splices)) = splices(&mut edits[at]) {
                splices.extend(exemplar_order(&exemplars, &cuts, &raw[series]));
                splices.extend(cuts.into_iter().map(|range| Splice {
                    range,
                    with: Vec::new(),
                }));
                splices.sort_by_key(|splice| splice.range.start);
            }
        }
        // A series whose exemplars all stayed, in order, and nothing else changed, keeps its
        // bytes.
        edits.retain_mut(|edit| splices(edit).is_none_or(|(_, splices)| !splices.is_empty()));
        cut
    }
}

/// A field of a message written again: `range`, in the message's bytes, becomes `with` (a
/// whole field: key, length and body; empty to cut the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Splice {
    pub range: std::ops::Range<usize>,
    pub with: Vec<u8>,
}

impl Splice {
    /// `message` written to `out` as field `tag` of its parent with `splices` made (in order;
    /// their ranges in `message`): its key, its new length, its bytes.
    pub(crate) fn write(out: &mut Vec<u8>, tag: u32, message: &[u8], splices: &[Splice]) {
        let length = splices.iter().fold(message.len(), |length, splice| {
            length - splice.range.len() + splice.with.len()
        });
        prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(length as u64, out);
        let mut at = 0;
        for splice in splices {
            out.extend_from_slice(&message[at..splice.range.start]);
            out.extend_from_slice(&splice.with);
            at = splice.range.end;
        }
        out.extend_from_slice(&message[at..]);
    }
}

/// Why a histogram over `max_native_histogram_buckets` refuses its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HistogramProblem {
    /// A schema neither exponential (-4..=8) nor custom buckets (-53): Mimir's
    /// `invalid_native_histogram_schema`, checked before the buckets.
    InvalidSchema(i32),
    /// `reduce_native_histogram_over_max_buckets` is off.
    TooManyBuckets,
    /// Its resolution cannot be lowered enough (schema -4 reached, or a schema outside
    /// -4..=8).
    NotReducible,
    /// Custom buckets (schema -53) have no lower resolution.
    CustomBuckets,
}

#[derive(Debug, Clone, Copy)]
struct HistogramError {
    problem: HistogramProblem,
    timestamp: i64,
    buckets: usize,
    limit: u32,
}

impl<'a> SeriesCheck<'a> {
    pub(crate) fn new() -> Self {
        SeriesCheck {
            dropped: Vec::new(),
            replaced: Vec::new(),
            histogram_error: None,
            exemplars: Vec::new(),
            labels: 0,
            metric_name: None,
            info: false,
            previous_name: b"",
            unsorted: false,
            names: [b""; NAMES],
            label_error: None,
            min_timestamp: i64::MAX,
            max_timestamp: i64::MIN,
            last_sample: i64::MIN,
            last_histogram: i64::MIN,
            unordered: false,
            known_names: [b""; KNOWN_NAMES],
            known_metric: b"",
        }
    }

    /// A fresh check for the request's next series, which keeps the names known good.
    /// In place: the names known are a few hundred bytes, which a new value would copy.
    #[inline]
    pub(crate) fn next(&mut self) {
        // Every field is named, so that a new one cannot be left out of the reset.
        let SeriesCheck {
            labels,
            metric_name,
            info,
            previous_name,
            unsorted,
            label_error,
            min_timestamp,
            max_timestamp,
            last_sample,
            last_histogram,
            unordered,
            dropped,
            replaced,
            histogram_error,
            exemplars,
            known_names: _,
            known_metric: _,
            // Written before they are read, up to `labels`.
            names: _,
        } = self;
        *labels = 0;
        *metric_name = None;
        *info = false;
        *previous_name = b"";
        *unsorted = false;
        *label_error = None;
        *min_timestamp = i64::MAX;
        *max_timestamp = i64::MIN;
        *last_sample = i64::MIN;
        *last_histogram = i64::MIN;
        *unordered = false;
        dropped.clear();
        replaced.clear();
        *histogram_error = None;
        exemplars.clear();
    }

    /// Whether `name` is a valid label name under `scheme`, from the name at its position in
    /// an earlier series when it is the same (a valid name is never empty, the slots' start).
    #[inline(always)]
    fn is_label_name_at(&mut self, name: &'a [u8], scheme: NameValidationScheme) -> bool {
        let slot = self.labels as usize;
        match self.known_names.get_mut(slot) {
            Some(known) if !known.is_empty() && same_name(known, name) => true,
            Some(known) if is_label_name_in(name, scheme) => {
                *known = name;
                true
            }
            Some(_) => false,
            None => is_label_name_in(name, scheme),
        }
    }

    /// Whether `name` is a valid metric name under `scheme`, from the earlier series' when it
    /// is the same.
    #[inline(always)]
    fn is_metric_name_known(&mut self, name: &'a [u8], scheme: NameValidationScheme) -> bool {
        if !self.known_metric.is_empty() && same_name(self.known_metric, name) {
            return true;
        }
        let valid = match scheme {
            NameValidationScheme::Legacy => is_metric_name(name),
            NameValidationScheme::Utf8 => !name.is_empty() && is_utf8(name),
        };
        if valid {
            self.known_metric = name;
        }
        valid
    }

    /// A label, in the order of the series; `value_utf8`: whether its value is UTF-8 (a name
    /// is checked here). A value over `max_label_value_length` refuses the series whatever
    /// the strategy: a caller that can write the label again uses [`label_in`](Self::label_in).
    #[inline]
    pub(crate) fn label(
        &mut self,
        name: &'a [u8],
        value: &'a [u8],
        value_utf8: bool,
        limits: &ValidationLimits,
    ) {
        self.check_label(name, value, value_utf8, limits, true);
    }

    /// [`label`](Self::label) for a label whose whole field is `field` in the series' bytes:
    /// under `truncate` or `drop`, a value over `max_label_value_length` is rewritten (a
    /// [`Splice`] in `replaced`) instead of refusing the series, and the checks go on.
    #[inline(always)]
    pub(crate) fn label_in(
        &mut self,
        name: &'a [u8],
        value: &'a [u8],
        value_utf8: bool,
        limits: &ValidationLimits,
        field: std::ops::Range<usize>,
    ) {
        // The length first: the one compare a label within the limit pays. A value that is
        // not UTF-8 refuses the series before its length counts, in Mimir's order.
        if value.len() > limits.max_label_value_length as usize
            && limits.label_value_length_over_limit_strategy
                != LabelValueLengthOverLimitStrategy::Error
            && value_utf8
        {
            self.check_label(name, value, true, limits, false);
            self.replaced.push(Splice {
                range: field,
                with: label_field(name, &shortened_value(value, limits)),
            });
        } else {
            self.label(name, value, value_utf8, limits);
        }
    }

    #[inline(always)]
    fn check_label(
        &mut self,
        name: &'a [u8],
        value: &'a [u8],
        value_utf8: bool,
        limits: &ValidationLimits,
        value_length: bool,
    ) {
        if same_name(name, b"__name__") {
            self.metric_name =
                Some(self.is_metric_name_known(value, limits.name_validation_scheme));
            self.info = value.ends_with(b"_info");
        }
        let order = name_order(name, self.previous_name);
        self.unsorted |= order == std::cmp::Ordering::Less;
        if let Some(slot) = self.names.get_mut(self.labels as usize) {
            *slot = name;
        }
        if self.label_error.is_none() {
            let reason = if !self.is_label_name_at(name, limits.name_validation_scheme) {
                Some(SeriesReason::LabelInvalid)
            } else if name.len() > limits.max_label_name_length as usize {
                Some(SeriesReason::LabelNameTooLong)
            } else if !value_utf8 {
                Some(SeriesReason::LabelValueInvalid)
            } else if value_length && value.len() > limits.max_label_value_length as usize {
                Some(SeriesReason::LabelValueTooLong)
            } else if order == std::cmp::Ordering::Equal {
                Some(SeriesReason::DuplicateLabelNames)
            } else {
                None
            };
            if let Some(reason) = reason {
                self.label_error = Some((reason, self.labels));
            }
        }
        self.previous_name = name;
        self.labels += 1;
    }

    /// A sample's or histogram's timestamp (milliseconds).
    #[inline]
    pub(crate) fn timestamp(&mut self, timestamp: i64) {
        self.min_timestamp = self.min_timestamp.min(timestamp);
        self.max_timestamp = self.max_timestamp.max(timestamp);
    }

    /// A sample's timestamp (milliseconds).
    #[inline(always)]
    pub(crate) fn sample(&mut self, timestamp: i64) {
        self.unordered |= timestamp <= self.last_sample;
        self.last_sample = timestamp;
        self.timestamp(timestamp);
    }

    /// Mimir's deduplication of a kept series (its distributor's `validateSamples` and
    /// `validateHistograms`): a sample, or a histogram, whose timestamp an earlier one of the
    /// series had goes, uncharged, counted as `sample_duplicate_timestamp`. Their fields join
    /// `dropped` (a repeated histogram's rewrite goes with it); `series` is the series'
    /// bytes, walked again only when a sample or histogram came at or before the one before
    /// it, with its histograms under `histogram_tag` (4 in 1.0, 3 in 2.0). Returns the
    /// samples and histograms cut.
    #[inline(always)]
    pub(crate) fn cut_repeats(&mut self, series: &[u8], histogram_tag: u32) -> (u64, u64) {
        if !self.unordered {
            return (0, 0);
        }
        self.cut_repeats_found(series, histogram_tag)
    }

    #[cold]
    #[inline(never)]
    fn cut_repeats_found(&mut self, series: &[u8], histogram_tag: u32) -> (u64, u64) {
        let (mut samples, mut histograms) = (0, 0);
        for (range, histogram) in repeated_timestamps(series, histogram_tag) {
            if histogram {
                histograms += 1;
                self.replaced.retain(|splice| splice.range != range);
            } else {
                samples += 1;
            }
            self.dropped.push(range);
        }
        (samples, histograms)
    }

    /// Whether the series has no label left to check: none was sent, or each had an empty
    /// value or was dropped. Mimir's distributor drops such a series silently, before its
    /// checks.
    #[inline]
    pub(crate) fn unlabelled(&self) -> bool {
        self.labels == 0
    }

    /// Whether [`verdict`](Self::verdict) needs the series' labels (in `series`) to judge
    /// it, not only to name it: they came out of order, and a label failed a check in the
    /// order sent (which one fails first sorted is Mimir's answer), or there are more than
    /// the check keeps.
    #[inline]
    pub(crate) fn needs_labels(&self) -> bool {
        self.unsorted && (self.label_error.is_some() || self.labels as usize > NAMES)
    }

    /// The first label that fails a per-label check, with its index among the series' kept
    /// labels: in the order sent, or, when they came out of order, sorted by name as Mimir
    /// checks them. A series out of order that passed each check in the order sent can fail
    /// only as a duplicate, which its names kept tell; else its labels are read again from
    /// `series` (1.0 `Label` fields).
    #[inline]
    fn first_label_error(
        &self,
        validation: &Validation,
        series: &[u8],
    ) -> Option<(SeriesReason, u32)> {
        if !self.unsorted {
            return self.label_error;
        }
        if self.needs_labels() {
            return sorted_label_error(validation, series);
        }
        self.sorted_duplicate()
    }

    /// The first duplicate name among the series' names sorted, with its index sorted. Each
    /// name is compared with those before it (a few, and most differ in length), and only a
    /// series with a duplicate is sorted.
    #[inline(never)]
    fn sorted_duplicate(&self) -> Option<(SeriesReason, u32)> {
        let names = &self.names[..self.labels as usize];
        let repeats = |(at, name): (usize, &&[u8])| names[..at].iter().any(|b| same_name(name, b));
        if !names.iter().enumerate().any(repeats) {
            return None;
        }
        let mut sorted = names.to_vec();
        sorted.sort_unstable();
        sorted
            .windows(2)
            .position(|pair| pair[0] == pair[1])
            .map(|at| (SeriesReason::DuplicateLabelNames, at as u32 + 1))
    }

    /// The series' earliest sample or histogram timestamp; `i64::MAX` when it has none.
    #[inline]
    pub(crate) fn earliest(&self) -> i64 {
        self.min_timestamp
    }

    /// A native histogram of the series, decoded from the bytes `field` (its whole field) of
    /// the series: its timestamp, and its buckets against `max_native_histogram_buckets`. One
    /// over the limit is lowered in resolution until it has fewer buckets than the limit, as
    /// Mimir does, and written again (a [`Splice`]); or, when it cannot be, it refuses the
    /// series.
    pub(crate) fn histogram(
        &mut self,
        mut histogram: Histogram,
        limits: &ValidationLimits,
        field: std::ops::Range<usize>,
    ) {
        self.timestamp(histogram.timestamp);
        self.unordered |= histogram.timestamp <= self.last_histogram;
        self.last_histogram = histogram.timestamp;
        let limit = limits.max_native_histogram_buckets;
        let buckets = bucket_count(&histogram);
        if self.histogram_error.is_some() {
            return;
        }
        let schema = histogram.schema;
        if !(MIN_SCHEMA..=MAX_SCHEMA).contains(&schema) && schema != CUSTOM_BUCKETS_SCHEMA {
            self.histogram_error = Some(HistogramError {
                problem: HistogramProblem::InvalidSchema(schema),
                timestamp: histogram.timestamp,
                buckets,
                limit,
            });
            return;
        }
        if limit == 0 || buckets <= limit as usize {
            return;
        }
        let problem = if histogram.schema == CUSTOM_BUCKETS_SCHEMA {
            HistogramProblem::CustomBuckets
        } else if !limits.reduce_native_histogram_over_max_buckets {
            HistogramProblem::TooManyBuckets
        } else if reduce_to_fit(&mut histogram, limit as usize) {
            let mut with = Vec::new();
            prost::encoding::message::encode(4, &histogram, &mut with);
            self.replaced.push(Splice { range: field, with });
            return;
        } else {
            HistogramProblem::NotReducible
        };
        self.histogram_error = Some(HistogramError {
            problem,
            timestamp: histogram.timestamp,
            buckets,
            limit,
        });
    }

    /// The first check the series fails, in Mimir's order, with its message; `series` is the
    /// series' bytes, read again only to name it.
    pub(crate) fn verdict(
        &self,
        validation: &Validation,
        series: &[u8],
    ) -> Option<(SeriesReason, String)> {
        let limits = &validation.limits;
        let reason = match self.metric_name {
            None => SeriesReason::MissingMetricName,
            Some(false) => SeriesReason::MetricNameInvalid,
            // An info series over the series limit is held to its own, Mimir's order.
            Some(_) if self.labels > limits.max_label_names_per_series && !self.info => {
                SeriesReason::MaxLabelNamesPerSeries
            }
            Some(_)
                if self.info
                    && self.labels
                        > limits
                            .max_label_names_per_info_series
                            .max(limits.max_label_names_per_series) =>
            {
                SeriesReason::MaxLabelNamesPerInfoSeries
            }
            Some(_) => match self.first_label_error(validation, series) {
                Some((reason, _)) => reason,
                None if self.max_timestamp > validation.latest_ms => SeriesReason::TooFarInFuture,
                None if self.min_timestamp < validation.earliest_ms => SeriesReason::TooFarInPast,
                None => match self.histogram_error?.problem {
                    HistogramProblem::InvalidSchema(_) => {
                        SeriesReason::InvalidNativeHistogramSchema
                    }
                    _ => SeriesReason::MaxNativeHistogramBuckets,
                },
            },
        };
        Some((reason, self.message(reason, validation, series)))
    }

    #[cold]
    #[inline(never)]
    fn message(&self, reason: SeriesReason, validation: &Validation, series: &[u8]) -> String {
        let limits = &validation.limits;
        let labels = kept_labels(validation, series, self.unsorted);
        let named = render(&labels);
        let (name, value) = self
            .first_label_error(validation, series)
            .and_then(|(_, index)| labels.get(index as usize))
            .copied()
            .unwrap_or((b"", b""));
        let label = (text(name), text(value));
        let mut id = reason.as_str().replace('_', "-");
        let raise = |key: &str| {
            format!(
                " To adjust it, raise {key} in the tenant's runtime overrides, or fix the \
                 sender."
            )
        };
        let (text, advice) = match reason {
            SeriesReason::MissingMetricName => (
                format!("received a series without a metric name, series: '{named}'"),
                String::new(),
            ),
            SeriesReason::MetricNameInvalid => (
                format!("received a series with an invalid metric name, series: '{named}'"),
                String::new(),
            ),
            SeriesReason::MaxLabelNamesPerSeries => (
                format!(
                    "received a series whose number of labels exceeds the limit (actual: {}, \
                     limit: {}) series: '{named}'",
                    self.labels, limits.max_label_names_per_series
                ),
                raise("max_label_names_per_series"),
            ),
            SeriesReason::MaxLabelNamesPerInfoSeries => (
                format!(
                    "received an info series whose number of labels exceeds the limit \
                     (actual: {}, limit: {}) series: '{named}'",
                    self.labels, limits.max_label_names_per_info_series
                ),
                raise("max_label_names_per_info_series"),
            ),
            SeriesReason::LabelInvalid => (
                format!(
                    "received a series with an invalid label: '{}' series: '{named}'",
                    clip(&label.0)
                ),
                String::new(),
            ),
            SeriesReason::LabelNameTooLong => (
                format!(
                    "received a series whose label name length exceeds the limit (limit: {}), \
                     label: '{}' series: '{named}'",
                    limits.max_label_name_length,
                    clip(&label.0)
                ),
                raise("max_label_name_length"),
            ),
            SeriesReason::LabelValueInvalid => (
                format!(
                    "received a series with invalid value in label '{}': '{}' metric: '{}'",
                    clip(&label.0),
                    clip(&label.1),
                    clip(&text(metric_of(&labels)))
                ),
                String::new(),
            ),
            SeriesReason::LabelValueTooLong => (
                format!(
                    "received a series whose label value length exceeds the limit (actual: {}, \
                     limit: {}), label: '{}' value: '{}' series: '{named}'",
                    value.len(),
                    limits.max_label_value_length,
                    clip(&label.0),
                    clip(&label.1)
                ),
                raise("max_label_value_length"),
            ),
            SeriesReason::DuplicateLabelNames => (
                format!(
                    "received a series with duplicate label name, label: '{}' series: '{named}'",
                    clip(&label.0)
                ),
                String::new(),
            ),
            SeriesReason::TooFarInFuture => (
                format!(
                    "received a sample whose timestamp is too far in the future, timestamp: {} \
                     series: '{named}'",
                    self.max_timestamp
                ),
                raise("creation_grace_period"),
            ),
            SeriesReason::TooFarInPast => (
                format!(
                    "received a sample whose timestamp is too far in the past, timestamp: {} \
                     series: '{named}'",
                    self.min_timestamp
                ),
                raise("past_grace_period"),
            ),
            SeriesReason::InvalidNativeHistogramSchema => {
                let schema = match self.histogram_error.map(|error| error.problem) {
                    Some(HistogramProblem::InvalidSchema(schema)) => schema,
                    _ => 0,
                };
                (
                    format!(
                        "received a native histogram sample with an invalid schema: {schema}, series: '{named}'"
                    ),
                    " A native histogram's schema is -4 to 8, or -53 for custom buckets: fix the sender."
                        .to_string(),
                )
            }
            SeriesReason::MaxNativeHistogramBuckets => {
                let Some(error) = self.histogram_error else {
                    return format!(
                        "received a native histogram sample with too many buckets (err-weir-{id})."
                    );
                };
                let detail = format!(
                    "timestamp: {} series: {named}, buckets: {}, limit: {}",
                    error.timestamp, error.buckets, error.limit
                );
                match error.problem {
                    HistogramProblem::TooManyBuckets | HistogramProblem::InvalidSchema(_) => (
                        format!(
                            "received a native histogram sample with too many buckets, {detail}"
                        ),
                        raise("max_native_histogram_buckets"),
                    ),
                    HistogramProblem::NotReducible => {
                        // Mimir's own id for this message; the reason stays the limit's.
                        id = "not-reducible-native-histogram".to_string();
                        (
                            format!(
                                "received a native histogram sample with too many buckets and \
                                 cannot reduce, {detail}"
                            ),
                            raise("max_native_histogram_buckets"),
                        )
                    }
                    HistogramProblem::CustomBuckets => (
                        format!(
                            "received a native histogram sample with more custom buckets than \
                             the limit, {detail}"
                        ),
                        raise("max_native_histogram_buckets"),
                    ),
                }
            }
        };
        format!("{text} (err-weir-{id}).{advice}")
    }
}

/// The labels of `series` (1.0 `Label` fields) that the checks see: without the empty values
/// and the dropped names; `sorted` by name (stably, by bytes), as Mimir sorts them.
fn kept_labels<'s>(validation: &Validation, series: &'s [u8], sorted: bool) -> Vec<Bytes<'s>> {
    let mut labels: Vec<Bytes> = labels_of(series)
        .into_iter()
        .filter(|(name, value)| !value.is_empty() && !validation.drops(name))
        .collect();
    if sorted {
        labels.sort_by(|a, b| a.0.cmp(b.0));
    }
    labels
}

/// Mimir's per-label checks, in its order, on a series' kept labels sorted by name: the first
/// that fails, with its index among them. For a series whose labels came out of order: two of
/// one name are then adjacent, and the first failure is the one Mimir finds.
#[cold]
#[inline(never)]
fn sorted_label_error(validation: &Validation, series: &[u8]) -> Option<(SeriesReason, u32)> {
    let limits = &validation.limits;
    let labels = kept_labels(validation, series, true);
    let mut previous: &[u8] = b"";
    for (index, &(name, value)) in labels.iter().enumerate() {
        let reason = if !is_label_name_in(name, limits.name_validation_scheme) {
            Some(SeriesReason::LabelInvalid)
        } else if name.len() > limits.max_label_name_length as usize {
            Some(SeriesReason::LabelNameTooLong)
        } else if !is_utf8(value) {
            Some(SeriesReason::LabelValueInvalid)
        } else if value.len() > limits.max_label_value_length as usize
            && limits.label_value_length_over_limit_strategy
                == LabelValueLengthOverLimitStrategy::Error
        {
            Some(SeriesReason::LabelValueTooLong)
        } else if name == previous {
            Some(SeriesReason::DuplicateLabelNames)
        } else {
            None
        };
        if let Some(reason) = reason {
            return Some((reason, index as u32));
        }
        previous = name;
    }
    None
}

/// A label value over `max_label_value_length` as Mimir writes it under `truncate` (its
/// first `max - 71` bytes, then `(hash:<hex blake2b-256 of the whole value>)`: `max` bytes)
/// or `drop` (the hash alone). Where Mimir's cut would split a UTF-8 character, weir cuts
/// before it, a byte or three shorter: a label value must stay valid UTF-8 for the receiver.
pub(crate) fn shortened_value(value: &[u8], limits: &ValidationLimits) -> Vec<u8> {
    use blake2::Digest;
    let hash = blake2::Blake2b::<blake2::digest::consts::U32>::digest(value);
    let keep = match limits.label_value_length_over_limit_strategy {
        LabelValueLengthOverLimitStrategy::Truncate => {
            let mut keep = (limits
                .max_label_value_length
                .saturating_sub(LABEL_VALUE_HASH_LENGTH) as usize)
                .min(value.len());
            // A byte 0b10xx_xxxx continues a character: never start the cut there.
            while keep > 0 && keep < value.len() && value[keep] & 0xC0 == 0x80 {
                keep -= 1;
            }
            keep
        }
        _ => 0,
    };
    let mut out = Vec::with_capacity(keep + LABEL_VALUE_HASH_LENGTH as usize);
    out.extend_from_slice(&value[..keep]);
    out.extend_from_slice(b"(hash:");
    for byte in hash {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    out.push(b')');
    out
}

/// A whole `labels` field (key, length, `Label { name, value }`).
fn label_field(name: &[u8], value: &[u8]) -> Vec<u8> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    let body = 2
        + encoded_len_varint(name.len() as u64)
        + name.len()
        + encoded_len_varint(value.len() as u64)
        + value.len();
    let mut out = Vec::with_capacity(body + 6);
    encode_key(1, WireType::LengthDelimited, &mut out);
    encode_varint(body as u64, &mut out);
    for (tag, text) in [(1, name), (2, value)] {
        encode_key(tag, WireType::LengthDelimited, &mut out);
        encode_varint(text.len() as u64, &mut out);
        out.extend_from_slice(text);
    }
    out
}

/// Native histograms with custom buckets: no exponential schema, so no lower resolution.
const CUSTOM_BUCKETS_SCHEMA: i32 = -53;
/// The exponential schemas (Mimir's `MinimumHistogramSchema`, `MaximumHistogramSchema`).
const MIN_SCHEMA: i32 = -4;
const MAX_SCHEMA: i32 = 8;

/// Buckets of a histogram as Mimir counts them: the entries of its four bucket arrays.
pub(crate) fn bucket_count(histogram: &Histogram) -> usize {
    histogram.positive_deltas.len()
        + histogram.negative_deltas.len()
        + histogram.positive_counts.len()
        + histogram.negative_counts.len()
}

/// Mimir's reduction: the schema goes down one step at a time, each merging pairs of
/// neighbouring buckets, until fewer buckets than `limit` remain. False when it cannot get
/// there (schema -4 reached, a schema outside -4..=8, or spans that do not match the buckets).
///
/// Mimir's float histograms stop after one step, whatever they then hold (its float reduction
/// reports the integer buckets' count, zero); weir counts the float buckets and goes on, so
/// what it forwards is within the limit.
pub(crate) fn reduce_to_fit(histogram: &mut Histogram, limit: usize) -> bool {
    let float = matches!(
        histogram.count,
        Some(super::prompb::histogram::Count::CountFloat(_))
    );
    loop {
        if histogram.schema <= MIN_SCHEMA || histogram.schema > MAX_SCHEMA {
            return false;
        }
        let reduced = if float {
            reduce(&histogram.positive_spans, &histogram.positive_counts, false)
                .and_then(|positive| {
                    reduce(&histogram.negative_spans, &histogram.negative_counts, false)
                        .map(|negative| (positive, negative))
                })
                .map(|((ps, pc), (ns, nc))| {
                    histogram.positive_spans = ps;
                    histogram.positive_counts = pc;
                    histogram.negative_spans = ns;
                    histogram.negative_counts = nc;
                })
        } else {
            reduce(&histogram.positive_spans, &histogram.positive_deltas, true)
                .and_then(|positive| {
                    reduce(&histogram.negative_spans, &histogram.negative_deltas, true)
                        .map(|negative| (positive, negative))
                })
                .map(|((ps, pd), (ns, nd))| {
                    histogram.positive_spans = ps;
                    histogram.positive_deltas = pd;
                    histogram.negative_spans = ns;
                    histogram.negative_deltas = nd;
                })
        };
        if reduced.is_none() {
            return false;
        }
        histogram.schema -= 1;
        if bucket_count(histogram) < limit {
            return true;
        }
    }
}

/// A bucket count as a histogram stores it: deltas (integer histograms) or counts (float).
trait BucketValue: Copy + Default {
    fn add(self, other: Self) -> Self;
    fn sub(self, other: Self) -> Self;
}

impl BucketValue for i64 {
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    fn sub(self, other: Self) -> Self {
        self.wrapping_sub(other)
    }
}

impl BucketValue for f64 {
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn sub(self, other: Self) -> Self {
        self - other
    }
}

/// One side's spans and buckets one schema lower: bucket `i` goes to `((i - 1) >> 1) + 1`
/// (Prometheus' `targetIdx`), buckets landing together add up. `delta`: the buckets are
/// deltas from the previous bucket, as they are read and written. `None` when the spans name
/// more buckets than there are, or indices overflow.
fn reduce<T: BucketValue>(
    spans: &[BucketSpan],
    buckets: &[T],
    delta: bool,
) -> Option<(Vec<BucketSpan>, Vec<T>)> {
    let mut merged: Vec<(i64, T)> = Vec::with_capacity(buckets.len());
    let (mut index, mut at, mut count) = (0i64, 0usize, T::default());
    for span in spans {
        index = index.checked_add(i64::from(span.offset))?;
        for _ in 0..span.length {
            let value = *buckets.get(at)?;
            at += 1;
            count = if delta { count.add(value) } else { value };
            let target = ((index - 1) >> 1) + 1;
            match merged.last_mut() {
                Some((last, sum)) if *last == target => *sum = sum.add(count),
                _ => merged.push((target, count)),
            }
            index = index.checked_add(1)?;
        }
    }
    let mut out_spans: Vec<BucketSpan> = Vec::new();
    let mut out_buckets = Vec::with_capacity(merged.len());
    let (mut previous_index, mut previous_count) = (None::<i64>, T::default());
    for (target, sum) in merged {
        match previous_index {
            Some(previous) if target == previous + 1 => {
                out_spans.last_mut().expect("a span precedes").length += 1;
            }
            _ => out_spans.push(BucketSpan {
                offset: i32::try_from(match previous_index {
                    Some(previous) => target - previous - 1,
                    None => target,
                })
                .ok()?,
                length: 1,
            }),
        }
        out_buckets.push(if delta { sum.sub(previous_count) } else { sum });
        previous_index = Some(target);
        previous_count = sum;
    }
    Some((out_spans, out_buckets))
}

/// What Mimir's metadata checks make of one entry.
#[derive(Debug, PartialEq)]
pub(crate) enum MetadataVerdict {
    Keep,
    /// Kept with its help cut to `max_metadata_length`: the entry's new body.
    Rewrite(Vec<u8>),
    /// Refused, with its message.
    Refuse(MetadataReason, String),
}

/// Mimir's `cleanAndValidateMetadata`: an entry without a metric name is refused (with
/// `enforce_metadata_metric_name`); a help over `max_metadata_length` bytes is cut, at a
/// character boundary, to fit; a metric name or unit over it refuses the entry. Its text is
/// read as bytes: Mimir does not refuse text that is not UTF-8 here.
pub(crate) fn check_metadata(
    mut metadata: RawMetricMetadata,
    limits: &ValidationLimits,
) -> MetadataVerdict {
    let max = limits.max_metadata_length as usize;
    let raise = " To adjust it, raise max_metadata_length in the tenant's runtime overrides, or \
                 fix the sender.";
    if limits.enforce_metadata_metric_name && metadata.metric_family_name.is_empty() {
        return MetadataVerdict::Refuse(
            MetadataReason::MissingMetricName,
            "received a metric metadata with no metric name (err-weir-metadata-missing-metric-name)."
                .to_string(),
        );
    }
    if metadata.metric_family_name.len() > max {
        return MetadataVerdict::Refuse(
            MetadataReason::MetricNameTooLong,
            format!(
                "received a metric metadata whose metric name length exceeds the limit, metric \
                 name: '{}' (err-weir-metric-name-too-long).{raise}",
                clip(&String::from_utf8_lossy(&metadata.metric_family_name))
            ),
        );
    }
    if metadata.unit.len() > max {
        return MetadataVerdict::Refuse(
            MetadataReason::UnitTooLong,
            format!(
                "received a metric metadata whose unit name length exceeds the limit, unit: \
                 '{}' metric name: '{}' (err-weir-unit-too-long).{raise}",
                clip(&String::from_utf8_lossy(&metadata.unit)),
                clip(&String::from_utf8_lossy(&metadata.metric_family_name))
            ),
        );
    }
    if metadata.help.len() > max {
        let keep = cut_at_rune(&metadata.help, max);
        metadata.help.truncate(keep);
        return MetadataVerdict::Rewrite(prost::Message::encode_to_vec(&metadata));
    }
    MetadataVerdict::Keep
}

/// Whether `name` is a valid label name under `scheme`: legacy, or any UTF-8 name not empty
/// (a legacy name is ASCII).
#[inline(always)]
fn is_label_name_in(name: &[u8], scheme: NameValidationScheme) -> bool {
    match scheme {
        NameValidationScheme::Legacy => is_label_name(name),
        NameValidationScheme::Utf8 => !name.is_empty() && is_utf8(name),
    }
}

/// Prometheus' legacy label name: `[a-zA-Z_][a-zA-Z0-9_]*` (Mimir's default scheme). Every
/// label of every series comes here.
#[inline]
fn is_label_name(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => NAME_BYTE[*first as usize] == FIRST && none_in(rest, &NOT_LABEL),
        None => false,
    }
}

/// Prometheus' legacy metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*` (one a series).
#[inline]
fn is_metric_name(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => {
            (NAME_BYTE[*first as usize] == FIRST || *first == b':') && none_in(rest, &NOT_METRIC)
        }
        None => false,
    }
}

/// Whether no byte of `bytes` is marked in `table`: one lookup a byte, OR-ed together with no
/// branch and no early exit, which the compiler unrolls. Names are short and almost always
/// valid, so stopping at the first bad byte would only add a branch a byte (it was a fifth
/// of the scan's time at 1 000 series a request, with `weir_loadgen_series` as the name).
#[inline(always)]
fn none_in(bytes: &[u8], table: &[u8; 256]) -> bool {
    bytes.iter().fold(0u8, |bad, b| bad | table[*b as usize]) == 0
}

/// For each byte: `FIRST` if a label name may start with it (`a-z A-Z _`), `LATER` if it may
/// only follow (`0-9`), 0 if neither.
const NAME_BYTE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = if b.is_ascii_alphabetic() || b == b'_' {
            FIRST
        } else if b.is_ascii_digit() {
            LATER
        } else {
            0
        };
        byte += 1;
    }
    table
};
const FIRST: u8 = 1;
const LATER: u8 = 2;

/// 1 for each byte a label name may not hold after its first, 0 for the rest.
const NOT_LABEL: [u8; 256] = not_in(b"");
/// The same for metric names, which may also hold `:`.
const NOT_METRIC: [u8; 256] = not_in(b":");

/// 1 for each byte that is neither a label name's (`a-z A-Z 0-9 _`) nor one of `also`.
const fn not_in(also: &[u8]) -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = (NAME_BYTE[byte] == 0) as u8;
        byte += 1;
    }
    let mut i = 0;
    while i < also.len() {
        table[also[i] as usize] = 0;
        i += 1;
    }
    table
}

/// Whether two names are the same, for the names of one request: most are under 33 bytes,
/// which loads of 8 bytes (4 under 8 bytes), the last overlapping, compare without a call to
/// `memcmp`.
#[inline(always)]
fn same_name(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if (8..=16).contains(&n) {
        let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap());
        return word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8);
    }
    if (17..=32).contains(&n) {
        let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap());
        return [0, 8, n - 16, n - 8]
            .iter()
            .all(|at| word(a, *at) == word(b, *at));
    }
    if (4..8).contains(&n) {
        let half = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap());
        return half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4);
    }
    a == b
}

/// How a label's name sorts against the one before it in its series: senders sort them, so
/// the first bytes mostly differ and settle it; equal is a duplicate.
#[inline(always)]
fn name_order(name: &[u8], previous: &[u8]) -> std::cmp::Ordering {
    match (name.first(), previous.first()) {
        (Some(first), Some(before)) if first != before => first.cmp(before),
        // The series' first label.
        (first, None) => first.is_some().cmp(&false),
        _ if same_name(name, previous) => std::cmp::Ordering::Equal,
        _ => name.cmp(previous),
    }
}

/// A label's name and value as sent, not yet checked as UTF-8.
type Bytes<'s> = (&'s [u8], &'s [u8]);

/// A series' labels, from its (already scanned) bytes.
fn labels_of(mut series: &[u8]) -> Vec<Bytes<'_>> {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut labels = Vec::new();
    while !series.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut series) else {
            break;
        };
        if tag == 1 {
            let Ok(label) = super::wire::field(&mut series, wire_type, "labels") else {
                break;
            };
            if let Ok((name, value, _)) = super::wire::any_label(label) {
                labels.push((name, value));
            }
        } else if skip_field(wire_type, tag, &mut series, DecodeContext::default()).is_err() {
            break;
        }
    }
    labels
}

/// `name{a="b", c="d"}`, at most 200 characters, as Mimir names a series (bytes that are not
/// UTF-8 shown as U+FFFD).
fn render(labels: &[Bytes]) -> String {
    let rest: Vec<String> = labels
        .iter()
        .filter(|(label, _)| *label != b"__name__")
        .map(|(label, value)| format!("{}={:?}", text(label), text(value)))
        .collect();
    clip(&format!(
        "{}{{{}}}",
        text(metric_of(labels)),
        rest.join(", ")
    ))
}

/// The value of `__name__` among `labels`, empty when none.
fn metric_of<'s>(labels: &[Bytes<'s>]) -> &'s [u8] {
    let name = labels.iter().find(|(label, _)| *label == b"__name__");
    name.map_or(b"", |(_, value)| value)
}

/// Bytes as text, each run that is not UTF-8 shown as U+FFFD (Mimir's `validUTF8Message`).
fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// At most 200 characters, marked when cut.
fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}… (truncated)", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_legacy_rules() {
        for good in ["a", "_a", "A_1", "__name__"] {
            assert!(is_label_name(good.as_bytes()), "{good}");
        }
        for bad in ["", "1a", "a-b", "a:b", "é"] {
            assert!(!is_label_name(bad.as_bytes()), "{bad}");
        }
        assert!(is_metric_name(b"job:up:sum"));
        assert!(!is_metric_name(b"9up"));
        assert!(!is_metric_name(b""));
    }

    proptest::proptest! {
        /// `same_name` is byte equality, at every length its loads take a different way.
        #[test]
        fn same_name_is_byte_equality(
            a in proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', 0xff]), 0..40),
            flip in proptest::option::of(0usize..40),
        ) {
            let mut b = a.clone();
            if let Some(at) = flip.filter(|at| *at < b.len()) {
                b[at] = if b[at] == b'a' { b'b' } else { b'a' };
            }
            proptest::prop_assert_eq!(same_name(&a, &b), a == b);
            proptest::prop_assert!(!same_name(&a, &b[..b.len().saturating_sub(1)]) || a.is_empty());
        }
    }

    /// `name_validation_scheme: utf8`: any name that is not empty is valid, the metric's too;
    /// under `legacy` (the default) the same series are refused.
    #[test]
    fn utf8_scheme_takes_any_name_that_is_not_empty() {
        let judge = |scheme: NameValidationScheme, labels: &[(&'static str, &'static str)]| {
            let limits = ValidationLimits {
                name_validation_scheme: scheme,
                ..ValidationLimits::default()
            };
            let validation = Validation::new(limits, 0);
            let mut seen = SeriesCheck::new();
            seen.next();
            for (name, value) in labels {
                seen.label(name.as_bytes(), value.as_bytes(), true, &limits);
            }
            seen.verdict(&validation, b"").map(|(reason, _)| reason)
        };
        let dotted = [("__name__", "http.server.duration"), ("service.name", "é")];
        assert_eq!(judge(NameValidationScheme::Utf8, &dotted), None);
        assert_eq!(
            judge(NameValidationScheme::Legacy, &dotted),
            Some(SeriesReason::MetricNameInvalid)
        );
        let label = [("__name__", "up"), ("k8s.pod-name", "p")];
        assert_eq!(judge(NameValidationScheme::Utf8, &label), None);
        assert_eq!(
            judge(NameValidationScheme::Legacy, &label),
            Some(SeriesReason::LabelInvalid)
        );
        assert_eq!(
            judge(NameValidationScheme::Utf8, &[("", "v"), ("__name__", "up")]),
            Some(SeriesReason::LabelInvalid),
            "an empty name is not one"
        );
    }

    /// A name that passed in an earlier series of the request is taken as known only when it
    /// is the same name: one of the same length at the same place is checked.
    #[test]
    fn names_known_from_an_earlier_series_are_compared_whole() {
        let limits = ValidationLimits::default();
        let validation = Validation::new(limits, 0);
        let mut seen = SeriesCheck::new();
        let judged = |seen: &mut SeriesCheck<'static>, labels: &[(&'static str, &'static str)]| {
            seen.next();
            for (name, value) in labels {
                seen.label(name.as_bytes(), value.as_bytes(), true, &limits);
            }
            seen.verdict(&validation, b"").map(|(reason, _)| reason)
        };
        // In name order, as senders send them (the verdict reads no bytes of the series).
        let good = [("__name__", "up_1"), ("instance_a", "y"), ("job", "x")];
        assert_eq!(judged(&mut seen, &good), None);
        assert_eq!(judged(&mut seen, &good), None);
        assert_eq!(
            judged(
                &mut seen,
                &[("__name__", "up_1"), ("instance_a", "y"), ("j-b", "x")]
            ),
            Some(SeriesReason::LabelInvalid)
        );
        assert_eq!(
            judged(
                &mut seen,
                &[("__name__", "up_1"), ("instance-a", "y"), ("job", "x")]
            ),
            Some(SeriesReason::LabelInvalid)
        );
        assert_eq!(
            judged(
                &mut seen,
                &[("__name__", "9p_1"), ("instance_a", "y"), ("job", "x")]
            ),
            Some(SeriesReason::MetricNameInvalid)
        );
        // A known name again where it was: a duplicate is still one.
        assert_eq!(
            judged(
                &mut seen,
                &[("__name__", "up_1"), ("job", "x"), ("job", "y")]
            ),
            Some(SeriesReason::DuplicateLabelNames)
        );
        assert_eq!(judged(&mut seen, &good), None);
    }

    /// Mimir's two label limits: an info series (`…_info`) over the series limit is held to
    /// its own, with its own reason; any other series to the series limit.
    #[test]
    fn info_series_have_a_label_limit_of_their_own() {
        let limits = ValidationLimits {
            max_label_names_per_series: 3,
            max_label_names_per_info_series: 5,
            ..ValidationLimits::default()
        };
        let validation = Validation::new(limits, 0);
        let mut seen = SeriesCheck::new();
        let names = ["a", "b", "c", "d", "e", "f"];
        let mut judged = |metric: &'static str, labels: usize| {
            seen.next();
            seen.label(b"__name__", metric.as_bytes(), true, &limits);
            for name in &names[..labels - 1] {
                seen.label(name.as_bytes(), b"1", true, &limits);
            }
            seen.verdict(&validation, b"")
        };
        assert_eq!(judged("up", 3), None);
        assert_eq!(
            judged("up", 4).map(|(reason, _)| reason),
            Some(SeriesReason::MaxLabelNamesPerSeries)
        );
        assert_eq!(judged("target_info", 4), None);
        assert_eq!(judged("target_info", 5), None);
        let (reason, message) = judged("target_info", 6).unwrap();
        assert_eq!(reason, SeriesReason::MaxLabelNamesPerInfoSeries);
        assert!(
            message.contains("received an info series whose number of labels exceeds the limit (actual: 6, limit: 5)")
                && message.contains("(err-weir-max-label-names-per-info-series)")
                && message.contains("max_label_names_per_info_series"),
            "{message}"
        );
        // `_info` must end the name.
        assert_eq!(
            judged("info_total", 4).map(|(reason, _)| reason),
            Some(SeriesReason::MaxLabelNamesPerSeries)
        );
        // An info limit under the series limit does not lower it, as in Mimir.
        let lower = ValidationLimits {
            max_label_names_per_series: 3,
            max_label_names_per_info_series: 2,
            ..ValidationLimits::default()
        };
        let validation = Validation::new(lower, 0);
        seen.next();
        for (name, value) in [("__name__", "x_info"), ("a", "1"), ("b", "1")] {
            seen.label(name.as_bytes(), value.as_bytes(), true, &lower);
        }
        assert_eq!(seen.verdict(&validation, b""), None);
    }

    fn limits(strategy: LabelValueLengthOverLimitStrategy, max: u32) -> ValidationLimits {
        ValidationLimits {
            label_value_length_over_limit_strategy: strategy,
            max_label_value_length: max,
            ..ValidationLimits::default()
        }
    }

    /// BLAKE2b-256 of "abc", from RFC 7693's test vectors' family (the 32-byte digest).
    const ABC_HASH: &str =
        "(hash:bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319)";

    #[test]
    fn truncate_and_drop_write_the_hash_of_the_whole_value() {
        let drop = limits(LabelValueLengthOverLimitStrategy::Drop, 71);
        assert_eq!(shortened_value(b"abc", &drop), ABC_HASH.as_bytes());
        // truncate: the first max - 71 bytes, then the hash; max bytes in all.
        let value = "a".repeat(100);
        let truncate = limits(LabelValueLengthOverLimitStrategy::Truncate, 80);
        let short = String::from_utf8(shortened_value(value.as_bytes(), &truncate)).unwrap();
        assert_eq!(short.len(), 80);
        assert!(short.starts_with("aaaaaaaaa(hash:"), "{short}");
        assert_eq!(
            &short[9..],
            String::from_utf8(shortened_value(value.as_bytes(), &drop)).unwrap()
        );
        // A cut inside a character moves before it: the value stays UTF-8.
        let accents = "é".repeat(50);
        let short = shortened_value(accents.as_bytes(), &truncate);
        assert_eq!(short.len(), 79);
        assert!(std::str::from_utf8(&short).unwrap().starts_with("éééé("));
    }

    #[test]
    fn label_in_rewrites_a_long_value_and_the_checks_go_on() {
        let truncate = limits(LabelValueLengthOverLimitStrategy::Truncate, 75);
        let long = "v".repeat(76);
        let mut seen = SeriesCheck::new();
        seen.label_in(b"__name__", b"up", true, &truncate, 0..6);
        seen.label_in(b"a", long.as_bytes(), true, &truncate, 6..90);
        assert_eq!(seen.replaced.len(), 1);
        assert_eq!(seen.replaced[0].range, 6..90);
        let label: super::super::prompb::Label =
            prost::Message::decode(&seen.replaced[0].with[2..]).unwrap();
        assert_eq!((label.name.as_str(), label.value.len()), ("a", 75));
        let validation = Validation::new(truncate, 0);
        assert_eq!(seen.verdict(&validation, b""), None);
        // A duplicate name after it still refuses the series.
        seen.label_in(b"a", b"x", true, &truncate, 90..96);
        assert_eq!(
            seen.verdict(&validation, b"").map(|(reason, _)| reason),
            Some(SeriesReason::DuplicateLabelNames)
        );
        // Under `error` (and through `label`), a long value refuses the series.
        let error = limits(LabelValueLengthOverLimitStrategy::Error, 75);
        let mut seen = SeriesCheck::new();
        seen.label_in(b"__name__", b"up", true, &error, 0..6);
        seen.label_in(b"a", long.as_bytes(), true, &error, 6..90);
        assert!(seen.replaced.is_empty());
        assert_eq!(
            seen.verdict(&Validation::new(error, 0), b"")
                .map(|(reason, _)| reason),
            Some(SeriesReason::LabelValueTooLong)
        );
    }

    fn integer_histogram(schema: i32, counts: &[i64]) -> Histogram {
        let mut previous = 0;
        Histogram {
            count: Some(super::super::prompb::histogram::Count::CountInt(
                counts.iter().sum::<i64>() as u64,
            )),
            schema,
            positive_spans: vec![BucketSpan {
                offset: 0,
                length: counts.len() as u32,
            }],
            positive_deltas: counts
                .iter()
                .map(|count| {
                    let delta = count - previous;
                    previous = *count;
                    delta
                })
                .collect(),
            ..Histogram::default()
        }
    }

    #[test]
    fn reduction_merges_neighbours_until_fewer_buckets_than_the_limit() {
        // Buckets 0..=3 at schema 1 hold 1, 2, 3, 4. One step (schema 0): bucket i goes to
        // ((i - 1) >> 1) + 1, so {0}, {1, 2}, {3}: 1, 5, 4 — three buckets, not fewer than 3,
        // so Mimir goes on (schema -1): {0}, {1, 2}: 1, 9.
        let mut histogram = integer_histogram(1, &[1, 2, 3, 4]);
        assert!(reduce_to_fit(&mut histogram, 3));
        assert_eq!(histogram, integer_histogram(-1, &[1, 9]).with_count(10));
        // Floats the same, in absolute counts.
        let mut float = Histogram {
            count: Some(super::super::prompb::histogram::Count::CountFloat(10.0)),
            schema: 1,
            negative_spans: vec![BucketSpan {
                offset: 0,
                length: 4,
            }],
            negative_counts: vec![1.0, 2.0, 3.0, 4.0],
            ..Histogram::default()
        };
        assert!(reduce_to_fit(&mut float, 3));
        assert_eq!(float.schema, -1);
        assert_eq!(float.negative_counts, vec![1.0, 9.0]);
        assert_eq!(
            float.negative_spans,
            vec![BucketSpan {
                offset: 0,
                length: 2
            }]
        );
        // Gaps stay gaps: buckets 1 and 6 at schema 0 go to 1 and 3 at schema -1.
        let mut gappy = Histogram {
            schema: 0,
            positive_spans: vec![
                BucketSpan {
                    offset: 1,
                    length: 1,
                },
                BucketSpan {
                    offset: 4,
                    length: 1,
                },
            ],
            positive_deltas: vec![2, 3],
            ..Histogram::default()
        };
        assert!(reduce_to_fit(&mut gappy, 3));
        assert_eq!(
            gappy.positive_spans,
            vec![
                BucketSpan {
                    offset: 1,
                    length: 1
                },
                BucketSpan {
                    offset: 1,
                    length: 1
                }
            ]
        );
        assert_eq!(gappy.positive_deltas, vec![2, 3]);
        // Schema -4 is the lowest: no further.
        assert!(!reduce_to_fit(&mut integer_histogram(-4, &[1, 1, 1]), 2));
        // Spans naming more buckets than there are: refused, no panic.
        let mut broken = integer_histogram(3, &[1, 1]);
        broken.positive_spans[0].length = 9;
        assert!(!reduce_to_fit(&mut broken, 1));
    }

    impl Histogram {
        fn with_count(mut self, count: u64) -> Histogram {
            self.count = Some(super::super::prompb::histogram::Count::CountInt(count));
            self
        }
    }

    #[test]
    fn histograms_over_the_limit_are_reduced_or_refuse_their_series() {
        let limits = ValidationLimits {
            max_native_histogram_buckets: 3,
            ..ValidationLimits::default()
        };
        let validation = Validation::new(limits, 0);
        let verdict = |histogram: Histogram, limits: &ValidationLimits| {
            let mut seen = SeriesCheck::new();
            seen.label(b"__name__", b"h", true, limits);
            seen.histogram(histogram, limits, 10..20);
            let replaced = seen.replaced.len();
            (
                replaced,
                seen.verdict(
                    &Validation::new(*limits, 0),
                    b"\x0a\x0d\x0a\x08__name__\x12\x01h",
                ),
            )
        };
        // Within the limit: untouched.
        assert_eq!(
            verdict(integer_histogram(1, &[1, 2, 3]), &limits),
            (0, None)
        );
        // Over it: reduced, written again.
        assert_eq!(
            verdict(integer_histogram(1, &[1, 2, 3, 4]), &limits),
            (1, None)
        );
        // Reduction off: refused.
        let strict = ValidationLimits {
            reduce_native_histogram_over_max_buckets: false,
            ..limits
        };
        let (_, refused) = verdict(integer_histogram(1, &[1, 2, 3, 4]), &strict);
        let (reason, message) = refused.unwrap();
        assert_eq!(reason, SeriesReason::MaxNativeHistogramBuckets);
        assert!(
            message.starts_with(
                "received a native histogram sample with too many buckets, timestamp: 0 \
                 series: h{}, buckets: 4, limit: 3 (err-weir-max-native-histogram-buckets)."
            ),
            "{message}"
        );
        // Cannot be reduced enough.
        let (_, refused) = verdict(integer_histogram(-4, &[1, 2, 3, 4]), &limits);
        let message = refused.unwrap().1;
        assert!(message.contains("cannot reduce"), "{message}");
        assert!(
            message.contains("(err-weir-not-reducible-native-histogram)"),
            "{message}"
        );
        // Custom buckets have no lower resolution.
        let (_, refused) = verdict(integer_histogram(-53, &[1, 2, 3, 4]), &limits);
        assert!(refused
            .unwrap()
            .1
            .contains("more custom buckets than the limit"));
        let _ = validation;
    }

    /// Mimir's schema check (`invalid_native_histogram_schema`): exponential schemas -4 to 8,
    /// and -53 for custom buckets; any other refuses the series, whatever its buckets, before
    /// the bucket limit is looked at.
    #[test]
    fn a_native_histogram_of_a_schema_mimir_does_not_know_refuses_its_series() {
        let verdict = |schema: i32, limit: u32| {
            let limits = ValidationLimits {
                max_native_histogram_buckets: limit,
                ..ValidationLimits::default()
            };
            let mut seen = SeriesCheck::new();
            seen.label(b"__name__", b"h", true, &limits);
            seen.histogram(integer_histogram(schema, &[1, 2]), &limits, 10..20);
            seen.verdict(
                &Validation::new(limits, 0),
                b"\x0a\x0d\x0a\x08__name__\x12\x01h",
            )
        };
        for schema in [-4, 0, 8, -53] {
            assert_eq!(verdict(schema, 0), None, "{schema}");
        }
        for schema in [-5, 9, 100, -52, -54] {
            let (reason, message) = verdict(schema, 0).unwrap();
            assert_eq!(
                reason,
                SeriesReason::InvalidNativeHistogramSchema,
                "{schema}"
            );
            assert!(
                message.starts_with(&format!(
                    "received a native histogram sample with an invalid schema: {schema}, \
                     series: 'h{{}}' (err-weir-invalid-native-histogram-schema)."
                )),
                "{message}"
            );
            // Before the bucket limit, which it is over.
            assert_eq!(
                verdict(schema, 1).unwrap().0,
                SeriesReason::InvalidNativeHistogramSchema
            );
        }
    }

    /// Text that is not UTF-8 is measured as Go measures it: each byte outside a character is
    /// a rune of its own (a character cut short is as many runes as its bytes, where a lossy
    /// read would make it one), and a cut falls on a rune's start.
    #[test]
    fn text_that_is_not_utf8_is_measured_as_go_measures_it() {
        assert_eq!(go_runes(b"abc"), 3);
        assert_eq!(go_runes("\u{e9}t\u{e9}".as_bytes()), 3);
        assert_eq!(go_runes(b"B\xe2\x82D"), 4);
        assert_eq!(go_runes(b"\xff\xfe\xc3\xa9"), 3);
        assert_eq!(cut_at_rune("abcd\u{e9}f".as_bytes(), 5), 4);
        assert_eq!(cut_at_rune(b"abcd\xffgh", 5), 5);
        assert_eq!(cut_at_rune(b"abc\xe2\x82gh", 4), 4);
        assert_eq!(cut_at_rune(b"abcdefgh", 5), 5);
        // 128 runes of labels pass, 129 are too long, a character cut short counting two.
        let value = |ascii: usize| [vec![b'x'; ascii], b"\xe2\x82".to_vec()].concat();
        let content = |value: &[u8]| exemplar_content([(&b"trace_id"[..], value)].into_iter(), 1);
        assert_eq!(content(&value(118)), None);
        assert_eq!(content(&value(119)), Some(ExemplarReason::LabelsTooLong));
        // A help over the limit that is not UTF-8 is cut, not refused; a name or unit is
        // held to the limit in bytes.
        let limits = ValidationLimits {
            max_metadata_length: 5,
            ..ValidationLimits::default()
        };
        let entry = |name: &[u8], help: &[u8]| RawMetricMetadata {
            r#type: 1,
            metric_family_name: name.to_vec(),
            help: help.to_vec(),
            unit: Vec::new(),
        };
        let MetadataVerdict::Rewrite(body) =
            check_metadata(entry(b"up", b"ab\xffd\xffgh"), &limits)
        else {
            panic!("help over the limit is cut")
        };
        let cut: RawMetricMetadata = prost::Message::decode(body.as_slice()).unwrap();
        assert_eq!(cut, entry(b"up", b"ab\xffd\xff"));
        assert_eq!(
            check_metadata(entry(b"u\xffp", b"h\xff"), &limits),
            MetadataVerdict::Keep
        );
        assert!(matches!(
            check_metadata(entry(b"u\xff\xff\xffpp", b""), &limits),
            MetadataVerdict::Refuse(MetadataReason::MetricNameTooLong, message)
                if message.contains("'u\u{fffd}\u{fffd}\u{fffd}pp'")
        ));
    }

    #[test]
    fn metadata_help_is_cut_and_long_names_and_units_are_refused() {
        let limits = ValidationLimits {
            max_metadata_length: 5,
            ..ValidationLimits::default()
        };
        let metadata = |name: &str, help: &str, unit: &str| RawMetricMetadata {
            r#type: 1,
            metric_family_name: name.into(),
            help: help.into(),
            unit: unit.into(),
        };
        assert_eq!(
            check_metadata(metadata("up", "hhhhh", "s"), &limits),
            MetadataVerdict::Keep
        );
        // Help: cut to the limit, before a character it would split.
        let MetadataVerdict::Rewrite(body) = check_metadata(metadata("up", "abcdéf", "s"), &limits)
        else {
            panic!("help over the limit is cut")
        };
        let cut: RawMetricMetadata = prost::Message::decode(body.as_slice()).unwrap();
        assert_eq!(cut, metadata("up", "abcd", "s"));
        let reason = |verdict| match verdict {
            MetadataVerdict::Refuse(reason, message) => {
                assert!(message.contains("(err-weir-"), "{message}");
                Some(reason)
            }
            _ => None,
        };
        assert_eq!(
            reason(check_metadata(metadata("toolong", "h", ""), &limits)),
            Some(MetadataReason::MetricNameTooLong)
        );
        assert_eq!(
            reason(check_metadata(metadata("up", "h", "seconds"), &limits)),
            Some(MetadataReason::UnitTooLong)
        );
        assert_eq!(
            reason(check_metadata(metadata("", "h", ""), &limits)),
            Some(MetadataReason::MissingMetricName)
        );
        let lenient = ValidationLimits {
            enforce_metadata_metric_name: false,
            ..limits
        };
        assert_eq!(
            check_metadata(metadata("", "h", ""), &lenient),
            MetadataVerdict::Keep
        );
    }
}
