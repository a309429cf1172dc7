//! Mimir's series checks and `drop_labels` on an OTLP export. Mimir translates an export into
//! Prometheus series and runs its distributor's checks on them; weir forwards OTLP, so it
//! checks the series the export would become ([`otlp::translate`]) with the remote-write
//! checks ([`SeriesCheck`]), and cuts from the forwarded export the data points whose series
//! fail ([`otlp::edit`]).
//!
//! Nearly every export passes, and is forwarded as sent: the scan that counts it also
//! measures its attributes ([`Bounds`]), and when no series it becomes can fail a check
//! ([`may_fail`]), nothing is translated. Only an export with a label near a limit, a time
//! outside the window, an unusual attribute or a tenant with `drop_labels` is decoded in full,
//! checked series by series and, when something changes, encoded again.
//!
//! Above `otlp` and `remote_write`, which do not import each other.

use prost::Message;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use crate::counts::{
    DecodeError, Decoded, Discarded, DroppedExemplars, Forward, Refused, WriteCounts,
    OTLP_PARSE_ERROR,
};
use crate::ha::HaOutcome;
use crate::otlp::edit::{point_at, AttributeAt, Edits, Resolution};
use crate::otlp::proto::metrics::{
    exponential_histogram_data_point::Buckets, metric::Data, ExponentialHistogramDataPoint,
    HistogramDataPoint,
};
use crate::otlp::proto::{common::KeyValue, ExportMetricsServiceRequest};
use crate::otlp::translate::{self, NativePoint, Place};
use crate::otlp::{self, Bounds, OtlpFormat};
use crate::otlp_relabel;
use crate::remote_write::prompb;
use crate::remote_write::validate::{
    self, bucket_count, exemplar_content, reduce_to_fit, shortened_value, ExemplarSeen,
    MetadataVerdict, SeriesCheck, Validation,
};
use runtime_config::validation::LabelValueLengthOverLimitStrategy;

/// Decompresses, counts and checks an OTLP export: what it charges once the refused points
/// are cut, what to forward, and what was refused. With the tenant's exemplars off
/// (`max_global_exemplars_per_user: 0`, Mimir's default), the forwarded export carries none,
/// as Mimir's distributor keeps none. Metrics the translator leaves out of an export it
/// translates the rest of are counted, and, when nothing else was refused, the push is
/// answered 400 once written, as Mimir answers it ("otlp parse error: …").
pub fn decode_validated(
    body: &[u8],
    max_size: usize,
    format: OtlpFormat,
    validation: &Validation,
) -> Result<Decoded, DecodeError> {
    let raw = otlp::inflate(body, max_size, format)?;
    let mut decoded = checked_export(&raw, format, validation)?;
    if decoded.untranslated > 0 && decoded.refused.is_none() {
        // Rare: the export is read again only to name what was left out.
        let request = if format.json {
            otlp::json::decode(&raw)?
        } else {
            ExportMetricsServiceRequest::decode(&raw[..])
                .map_err(|err| DecodeError::Otlp(format!("invalid protobuf: {err}")))?
        };
        let (_, left_out) = otlp::count_left_out(&request, validation.translation())?;
        let mut first = format!("{OTLP_PARSE_ERROR}{}", left_out.join("; "));
        if first.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !first.is_char_boundary(end) {
                end -= 1;
            }
            first.truncate(end);
        }
        decoded.refused = Some(Refused {
            first,
            samples: Discarded::default(),
            series: 0,
        });
    }
    Ok(decoded)
}

/// How long Mimir lets the message of a translation error get (its `maxErrMsgLen`).
const MAX_MESSAGE: usize = 1024;

/// [`decode_validated`] of the inflated export, what it left out counted but not answered.
fn checked_export(
    raw: &[u8],
    format: OtlpFormat,
    validation: &Validation,
) -> Result<Decoded, DecodeError> {
    let exemplars_off = validation.limits.max_global_exemplars_per_user == 0;
    let invalid = |err: prost::DecodeError| DecodeError::Otlp(format!("invalid protobuf: {err}"));
    // The HA tracker first, as in Mimir's distributor: a push it does not accept is only
    // counted; one from the elected replica goes on without the replica label.
    let (mut request, counts, json, ha, validation, untranslated) = if format.json {
        // Parsed once: decoded for the count and the checks, and kept to be edited.
        let json = otlp::json::parse(raw)?;
        let request = otlp::json::decode_value(&json)?;
        let (counts, left_out) = otlp::count_left_out(&request, validation.translation())?;
        let untranslated = left_out.len() as u64;
        let first = || Ok(translate::first_series(&request, validation.translation()));
        let earliest = || otlp::earliest_point_ms(&request);
        let (ha, validation) = match ha_first(first, earliest, validation)? {
            HaStep::Done(ha) => {
                return Ok(Decoded {
                    ha,
                    untranslated,
                    ..decoded(counts, Forward::Nothing, None, validation)
                })
            }
            HaStep::Go(ha, validation) => (ha, validation),
        };
        (request, counts, Some(json), ha, validation, untranslated)
    } else {
        let (counts, bounds) = otlp::scan_bounded(raw, validation.translation())?;
        let untranslated = bounds.left_out;
        // The first series read a metric at a time, not the whole export decoded.
        let first = || {
            translate::first_series_encoded(raw, validation.translation())
                .map_err(|err| DecodeError::Otlp(format!("invalid protobuf: {err}")))
        };
        let earliest = || bounds.times.earliest.map(translate::nanos_to_millis);
        let (ha, validation) = match ha_first(first, earliest, validation)? {
            HaStep::Done(ha) => {
                return Ok(Decoded {
                    ha,
                    untranslated,
                    ..decoded(counts, Forward::Nothing, None, validation)
                })
            }
            HaStep::Go(ha, validation) => (ha, validation),
        };
        if !may_fail(&bounds, &validation)
            && !exemplars_may_fail(&bounds, &validation)
            && !metadata_may_fail(&bounds, &validation)
        {
            let forward = as_sent(raw, exemplars_off && bounds.exemplars > 0, format)?;
            return Ok(Decoded {
                ha,
                untranslated,
                ..decoded(counts, forward, None, &validation)
            });
        }
        // The scan has counted it (as a decode counts it): decoded only to be checked.
        let request = ExportMetricsServiceRequest::decode(raw).map_err(invalid)?;
        (request, counts, None, ha, validation, untranslated)
    };
    let validation = &*validation;
    let replica = match &ha {
        HaOutcome::Accepted { replica_label, .. } => Some(replica_label.as_str()),
        _ => None,
    };
    let (mut edits, mut refused, relabelled) = check(&request, validation, replica);
    let mut dropped = DroppedExemplars::default();
    if exemplars_off {
        edits.exemplars = otlp::edit::clear_exemplars(&mut request);
    } else {
        edits.exemplar_cuts = exemplar_cuts(&request, validation, &edits.points, &mut dropped);
    }
    let decoded = |counts, forward, refused| Decoded {
        dropped_exemplars: dropped,
        ha,
        untranslated,
        ..decoded(counts, forward, refused, validation)
    };
    if edits.is_empty() || (json.is_none() && edits.only_exemplars()) {
        let mut counts = counts;
        if let Some(relabelled) = &relabelled {
            uncharge(
                &mut counts,
                relabelled,
                &edits,
                &request,
                validation.translation(),
            );
        }
        refuse_metadata(&request, validation, &mut counts, &mut refused);
        let forward = if edits.is_empty() {
            Forward::Unchanged
        } else {
            as_sent(raw, true, format)?
        };
        return Ok(decoded(counts, forward, refused));
    }
    // Mimir makes a family's metadata entries as it translates, before its checks and rules
    // drop series: a metric whose every point is cut keeps its entries, and they are charged.
    // So they are judged and counted on the export as sent.
    let mut metadata = WriteCounts {
        metadata: counts.metadata,
        ..WriteCounts::default()
    };
    refuse_metadata(&request, validation, &mut metadata, &mut refused);
    let mut kept = request;
    edits.apply(&mut kept);
    // A request of which nothing is left but metrics the translator refuses costs nothing.
    let mut counts = otlp::count(&kept, validation.translation()).unwrap_or_default();
    if let Some(relabelled) = &relabelled {
        uncharge(
            &mut counts,
            relabelled,
            &edits,
            &kept,
            validation.translation(),
        );
    }
    if counts.samples.saturating_add(counts.histograms) == 0 {
        // No point left to forward: OTLP carries no metadata without points, so nothing is
        // charged (Mimir would charge the entries and push them alone).
        return Ok(decoded(WriteCounts::default(), Forward::Nothing, refused));
    }
    counts.metadata = metadata.metadata;
    let bytes = match json {
        Some(mut json) => {
            edits.apply_json(&mut json);
            json.to_string().into_bytes()
        }
        None => kept.encode_to_vec(),
    };
    Ok(decoded(
        counts,
        Forward::Rewritten(compressed(bytes, format).into()),
        refused,
    ))
}

/// Where an export stands after the HA tracker ([`ha_first`]).
enum HaStep<'v> {
    /// Deduplicated, or a cluster too many: the export is only counted.
    Done(HaOutcome),
    /// On to the checks, with this validation: the tenant's, dropping the replica label too
    /// when the export is from the elected replica.
    Go(HaOutcome, Cow<'v, Validation>),
}

/// The HA tracker's word on an export, read as Mimir's distributor reads it after the
/// translation: from the cluster and replica labels of the first series, which is the
/// request's first translated data point (a resource's `target_info` comes after its
/// points), so from its attributes and its resource's `job` and `instance`. `first_series`
/// is read only for a tenant that deduplicates HA pairs; `earliest` (the export's earliest
/// point) only when a failover waits on `ha_tracker_sample_failover_timeout`.
fn ha_first<'v>(
    first_series: impl FnOnce() -> Result<Option<Vec<(String, String)>>, DecodeError>,
    earliest: impl Fn() -> Option<i64>,
    validation: &'v Validation,
) -> Result<HaStep<'v>, DecodeError> {
    let Some(check) = &validation.ha else {
        return Ok(HaStep::Go(HaOutcome::Off, Cow::Borrowed(validation)));
    };
    let settings = &check.settings;
    let labels = first_series()?.unwrap_or_default();
    let value = |name: &str| {
        labels
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    };
    let ha = check.outcome(
        value(&settings.ha_cluster_label),
        value(&settings.ha_replica_label),
        validation.now_ms,
        earliest,
    );
    Ok(match validation.after_ha(&ha) {
        Some(validation) => HaStep::Go(ha, validation),
        None => HaStep::Done(ha),
    })
}

/// Whether a metadata entry the translation makes could fail Mimir's metadata checks, by the
/// scan's bounds: its family name is the metric name escaped, at most one `_` longer; its
/// unit at most [`translate::UNIT_GROWTH`] longer than the metric's. (A name that escapes to
/// nothing is [`Bounds::unusual`], which [`may_fail`] already takes to the checks.)
fn metadata_may_fail(bounds: &Bounds, validation: &Validation) -> bool {
    let max = validation.limits.max_metadata_length as usize;
    longest_family(bounds, validation) > max || bounds.unit + translate::UNIT_GROWTH > max
}

/// The longest a family name of the export can be: its metric name escaped (a `_` before a
/// leading digit), or with suffixes also its unit's words, `_total` or `_ratio`, and their `_`s.
fn longest_family(bounds: &Bounds, validation: &Validation) -> usize {
    if validation.translation().otel_metric_suffixes_enabled {
        bounds.metric_name + 1 + bounds.unit + translate::UNIT_GROWTH + "_total".len() + 1
    } else {
        bounds.metric_name + 1
    }
}

/// Mimir's metadata checks (its `cleanAndValidateMetadata`) on the entries the translation of
/// `request` makes ([`otlp::metadata_metrics`]; `target_info`'s always passes): one whose
/// family name or unit is over `max_metadata_length` is refused: taken
/// from `counts`, counted by reason in `refused` (whose first message stays a series' if one
/// was refused), and the push answered 400, while the metric's series go on, as in Mimir.
/// The forwarded export keeps the metric: the receiver makes its metadata again. A
/// description over the limit Mimir cuts and keeps, so it changes nothing weir answers or
/// charges, and the receiver makes its own from the export.
fn refuse_metadata(
    request: &ExportMetricsServiceRequest,
    validation: &Validation,
    counts: &mut WriteCounts,
    refused: &mut Option<Refused>,
) {
    let conversion = otlp::Conversion::of(validation.translation());
    for metric in otlp::metadata_metrics(request, validation.translation()) {
        let family = translate::family_name(translate::Naming::of(metric), conversion);
        let entry = prompb::RawMetricMetadata {
            metric_family_name: family.map(Cow::into_owned).unwrap_or_default().into_bytes(),
            unit: translate::unit_name(&metric.unit).into_bytes(),
            ..Default::default()
        };
        if let MetadataVerdict::Refuse(reason, message) =
            validate::check_metadata(entry, &validation.limits)
        {
            counts.metadata = counts.metadata.saturating_sub(1);
            let refused = refused.get_or_insert_with(|| Refused {
                first: message,
                samples: Discarded::default(),
                series: 0,
            });
            refused.samples.metadata[reason as usize] += 1;
        }
    }
}

/// Whether an exemplar the translation carries could fail Mimir's exemplar checks, for a
/// tenant that keeps exemplars, by the scan's bounds: one with neither a trace nor a span id
/// (its labels, its attributes, can be missing or blank), more on one point than a series
/// may carry, a time under a millisecond (no timestamp), or a time outside the window. The
/// window opens at most 5 minutes before the request's latest point, its earliest sample
/// being no later than that.
fn exemplars_may_fail(bounds: &Bounds, validation: &Validation) -> bool {
    let limits = &validation.limits;
    if limits.max_global_exemplars_per_user == 0 || bounds.exemplars_per_point == 0 {
        return false;
    }
    let per_series = u64::from(limits.max_exemplars_per_series_per_request);
    let window = validation.exemplar_window((bounds.times.latest / 1_000_000) as i64);
    let millis = |nanos: u64| (nanos as i64).div_euclid(1_000_000);
    let times = &bounds.exemplar_times;
    bounds.exemplar_without_ids
        || (per_series != 0 && bounds.exemplars_per_point > per_series)
        || times
            .earliest
            .is_some_and(|earliest| millis(earliest) < (*window.start()).max(1))
        || millis(times.latest) > *window.end()
        || times.latest > i64::MAX as u64
}

/// Mimir's checks of a tenant's exemplars (its distributor's `validateExemplars`) on those
/// the translation carries ([`translate::exemplars`]), series by series: past
/// `max_exemplars_per_series_per_request` the rest go; then each that fails its own checks or
/// lies outside the window goes. The exemplars of the points in `cut` are not judged: their
/// series are refused. Returns the exemplars to cut, counted by reason in `dropped`.
fn exemplar_cuts(
    request: &ExportMetricsServiceRequest,
    validation: &Validation,
    cut: &HashSet<Place>,
    dropped: &mut DroppedExemplars,
) -> HashSet<(Place, usize)> {
    let (exemplars, earliest) = translate::exemplars(request, validation.translation());
    let window = validation.exemplar_window(earliest);
    let mut series: BTreeMap<(Place, usize), Vec<ExemplarSeen>> = BTreeMap::new();
    for exemplar in exemplars.iter().filter(|e| !cut.contains(&e.point)) {
        let labels = exemplar.labels.iter();
        let labels = labels.map(|(name, value)| (name.as_bytes(), value.as_bytes()));
        series
            .entry((exemplar.point, exemplar.series))
            .or_default()
            .push(ExemplarSeen {
                field: exemplar.index..exemplar.index + 1,
                timestamp: exemplar.timestamp_ms,
                invalid: exemplar_content(labels, exemplar.timestamp_ms),
            });
    }
    let mut cuts = HashSet::new();
    for ((point, _), seen) in series {
        for index in validate::exemplar_cuts(&seen, &validation.limits, &window, dropped) {
            cuts.insert((point, index.start));
        }
    }
    cuts
}

/// What to forward of a protobuf export the checks leave as it is: the client's bytes, or,
/// with `strip`, the export without its exemplars ([`otlp::edit::without_exemplars`]).
fn as_sent(raw: &[u8], strip: bool, format: OtlpFormat) -> Result<Forward, DecodeError> {
    if !strip {
        return Ok(Forward::Unchanged);
    }
    match otlp::edit::without_exemplars(raw) {
        Ok(Some(stripped)) => Ok(Forward::Rewritten(compressed(stripped, format).into())),
        Ok(None) => Ok(Forward::Unchanged),
        // The scan has read every field it walks; kept for a body it somehow did not.
        Err(err) => Err(DecodeError::Otlp(format!("invalid protobuf: {err}"))),
    }
}

/// The forwarded bytes in the request's encoding: gzip stays gzip, and so on.
fn compressed(bytes: Vec<u8>, format: OtlpFormat) -> Vec<u8> {
    otlp::compress(bytes, format.compression)
}

fn decoded(
    mut counts: WriteCounts,
    forward: Forward,
    refused: Option<Refused>,
    validation: &Validation,
) -> Decoded {
    // With the tenant's exemplars off they are not charged, nor forwarded: Mimir's
    // distributor takes them out of the translation.
    if validation.limits.max_global_exemplars_per_user == 0 {
        counts.exemplars = 0;
    }
    Decoded {
        counts,
        forward,
        refused,
        dropped_exemplars: Default::default(),
        repeated_timestamps: 0,
        unlabelled: WriteCounts::default(),
        untranslated: 0,
        ha: HaOutcome::Off,
    }
}

/// Whether any series of an export measured as `bounds` could fail a check, or lose a label
/// to `drop_labels`: when not, nothing needs translating. Each bound is the longest a label
/// can get after translation: a point's labels are its attributes, `job`, `instance`,
/// `__name__` and `le` or `quantile`; a `target_info`'s (an info series, with a limit of its
/// own) at most its resource's attributes and `__name__`; an escaped key is at most 4 bytes
/// longer (`key_`); `job` is two values and a `/`, and the values of keys that escape alike are
/// joined with `;` ([`Bounds::joined`]); a `__name__` is the metric name, a `_` and
/// `_bucket` at most; a native histogram has at most as many buckets as OTLP bucket counts.
/// A promoted resource attribute is one more label of a point's series, its key and value
/// within the resource's, which the bounds measure too. A tenant with relabelling rules has
/// every export translated, for the rules.
pub fn may_fail(bounds: &Bounds, validation: &Validation) -> bool {
    validation.drop_labels.is_some() || validation.relabel.is_some() || exceeds(bounds, validation)
}

/// Takes from `counts` (of `kept`, the export as forwarded) what the rules dropped but the
/// export still carries: the series dropped from points that stay, and the `target_info`s
/// dropped.
fn uncharge(
    counts: &mut WriteCounts,
    relabelled: &otlp_relabel::Relabelled,
    edits: &Edits,
    kept: &ExportMetricsServiceRequest,
    settings: &runtime_config::OtlpTranslation,
) {
    for (place, (_, dropped)) in &relabelled.changed {
        if matches!(place, Place::Point { .. }) && !edits.points.contains(place) {
            counts.samples = counts.samples.saturating_sub(*dropped);
        }
    }
    let mut charged = None;
    for place in &relabelled.dropped {
        if let Place::TargetInfo { resource } = *place {
            let charged =
                charged.get_or_insert_with(|| translate::target_info_charges(kept, settings));
            if let Some((samples, new_series)) = charged[resource] {
                counts.samples = counts.samples.saturating_sub(samples);
                counts.series = counts.series.saturating_sub(u64::from(new_series));
            }
        }
    }
}

/// [`may_fail`], but for `drop_labels`: whether a label can get past a limit.
fn exceeds(bounds: &Bounds, validation: &Validation) -> bool {
    let limits = &validation.limits;
    let labels = u64::from(limits.max_label_names_per_series);
    let name = limits.max_label_name_length as usize;
    let value = limits.max_label_value_length as usize;
    let window = validation.window();
    let millis = |nanos: u64| (nanos / 1_000_000) as i64;
    let buckets = u64::from(limits.max_native_histogram_buckets);
    // The tenant's promoted resource attributes can add as many labels to a point's series;
    // kept identifying attributes, two more to a `target_info` (`job` and `instance` beside
    // the attributes they come from).
    let settings = validation.translation();
    let promoted = settings.promote_otel_resource_attributes.len() as u64;
    let identifying = if settings.otel_keep_identifying_resource_attributes {
        2
    } else {
        0
    };
    // A named scope's attributes, name, version and schema URL, when the tenant promotes them:
    // labels `otel_scope_<key>` and three more.
    let scope = settings.otel_promote_scope_metadata
        && (u64::from(bounds.scope_attributes)
            + 3
            + u64::from(bounds.point_attributes)
            + 4
            + promoted
            > labels
            || (bounds.scope_key + "otel_scope_".len()).max("otel_scope_schema_url".len()) > name
            || bounds.scope_value > value);
    scope
        || bounds.unusual
        || (buckets != 0 && bounds.buckets > buckets)
        || u64::from(bounds.point_attributes) + 4 + promoted > labels
        || u64::from(bounds.resource_attributes) + 1 + identifying
            > labels.max(u64::from(limits.max_label_names_per_info_series))
        || (bounds.key + 4).max("__name__".len()) > name
        || bounds
            .value
            .saturating_mul(2)
            .saturating_add(1)
            .max(bounds.joined)
            .max(longest_family(bounds, validation) + "_bucket".len())
            > value
        || bounds
            .times
            .earliest
            .is_some_and(|earliest| millis(earliest) < *window.start())
        || millis(bounds.times.latest) > *window.end()
}

/// The changes a request needs (values shortened, labels dropped, refused points cut) and
/// what was refused. Only the points that could fail are translated: each is measured as the
/// scan measures a request. (With `__name__` dropped, every series fails.)
/// With the tenant's relabelling rules (`replica`: the HA replica label, gone before them),
/// what they made of the export's series: a point they drop is cut, one they change is checked
/// as they left it ([`otlp_relabel`]).
fn check(
    request: &ExportMetricsServiceRequest,
    validation: &Validation,
    replica: Option<&str>,
) -> (Edits, Option<Refused>, Option<otlp_relabel::Relabelled>) {
    let every = validation.drops(b"__name__");
    let relabelled = validation.relabel.as_ref().map(|relabelling| {
        otlp_relabel::relabel(request, relabelling, validation.translation(), replica)
    });
    let (edits, refused) = check_points(request, validation, relabelled.as_ref(), &|bounds| {
        every || exceeds(bounds, validation)
    });
    (edits, refused, relabelled)
}

/// [`check`], translating the points `wanted` says, and those the rules changed.
fn check_points(
    request: &ExportMetricsServiceRequest,
    validation: &Validation,
    relabelled: Option<&otlp_relabel::Relabelled>,
    wanted: &dyn Fn(&Bounds) -> bool,
) -> (Edits, Option<Refused>) {
    let limits = &validation.limits;
    let mut edits = Edits::default();
    let conversion = otlp::Conversion::of(validation.translation());
    each_attribute(request, |at, kv| {
        if validation.drops(translate::label_name(&kv.key, conversion).as_bytes())
            && (at.point.is_some() || !translate::is_identity(&kv.key))
        {
            edits.removed.insert(at);
            return;
        }
        let limit = limits.max_label_value_length as usize;
        // A value is written out only when its size as measured could be over the limit.
        if limits.label_value_length_over_limit_strategy != LabelValueLengthOverLimitStrategy::Error
            && translate::measured(kv.value.as_ref()) > limit
        {
            let value = translate::value_string(kv.value.as_ref());
            if value.len() > limit {
                let short = shortened_value(value.as_bytes(), limits);
                edits
                    .values
                    .insert(at, String::from_utf8_lossy(&short).into_owned());
            }
        }
    });
    // The series are translated from the attributes as they will be forwarded; those the
    // rules touched, as the rules left them.
    let edited = if edits.is_empty() {
        std::borrow::Cow::Borrowed(request)
    } else {
        let mut edited = request.clone();
        edits.apply(&mut edited);
        std::borrow::Cow::Owned(edited)
    };
    // A point the rules drop is cut (after the attributes' edits, which keep every point
    // where it is).
    if let Some(relabelled) = relabelled {
        edits.points.extend(
            relabelled
                .dropped
                .iter()
                .filter(|place| matches!(place, Place::Point { .. })),
        );
    }
    let drops = |name: &str| validation.drops(name.as_bytes());
    let mut refused: Option<Refused> = None;
    let mut whole = Vec::new();
    let settings = validation.translation();
    let translated = translate::translate(&edited, settings, &drops, wanted)
        .into_iter()
        .filter(|translated| relabelled.is_none_or(|rules| !rules.touches(&translated.place)));
    let changed = relabelled
        .into_iter()
        .flat_map(|rules| rules.changed.values())
        .map(|(translated, _)| as_checked(translated, validation));
    for translated in translated.chain(changed) {
        let Some(reason_and_message) = translated
            .series
            .iter()
            .find_map(|labels| series_verdict(labels, &translated, validation))
        else {
            // A native histogram over the bucket limit that passed was lowered in resolution
            // to fit, as Mimir lowers it: the export carries it so.
            if let Some(NativePoint::Exponential(point)) = &translated.native {
                if let Some(resolution) = lowered(point, &validation.limits) {
                    edits.histograms.insert(translated.place, resolution);
                }
            }
            continue;
        };
        let (reason, message) = reason_and_message;
        let refused = refused.get_or_insert_with(|| Refused {
            first: message,
            samples: Discarded::default(),
            series: 0,
        });
        refused.samples.samples[reason as usize] += translated.items;
        refused.samples.series[reason as usize] += translated.series.len() as u64;
        refused.series += translated.series.len() as u64;
        match translated.place {
            place @ Place::Point { .. } => {
                edits.points.insert(place);
            }
            // The receiver builds `target_info` from the resource's other attributes: without
            // them (and without an identifying key repeated, which counts as one) it builds
            // none, as Mimir keeps none. The first of each identifying key stays: it is what
            // names the points' `job` and `instance`. The labels promoted from the attributes
            // cut go to the points as attributes; where no attributes keep the points' series,
            // they are refused with it.
            Place::TargetInfo { resource } => {
                match translate::target_info_cut(&edited.resource_metrics[resource], settings) {
                    Some(added) => edits.added.extend(
                        added
                            .into_iter()
                            .map(|((s, m, p), labels)| (point_at(resource, s, m, p), labels)),
                    ),
                    None => whole.push((resource, reason)),
                }
                let attributes = request.resource_metrics[resource]
                    .resource
                    .as_ref()
                    .map_or(&[][..], |resource| &resource.attributes);
                for (attribute, kv) in attributes.iter().enumerate() {
                    let first = || !attributes[..attribute].iter().any(|kv2| kv2.key == kv.key);
                    if !translate::is_identity(&kv.key) || !first() {
                        edits.removed.insert(AttributeAt {
                            resource,
                            point: None,
                            attribute,
                        });
                    }
                }
            }
        }
    }
    if let (false, Some(refused)) = (whole.is_empty(), refused.as_mut()) {
        // Rare: the points of a resource whose `target_info` cannot be cut alone.
        for translated in translate::translate(&edited, settings, &drops, &|_| true) {
            let Place::Point { resource, .. } = translated.place else {
                continue;
            };
            let Some((_, reason)) = whole.iter().find(|(whole, _)| *whole == resource) else {
                continue;
            };
            if edits.points.insert(translated.place) {
                refused.samples.samples[*reason as usize] += translated.items;
                refused.samples.series[*reason as usize] += translated.series.len() as u64;
                refused.series += translated.series.len() as u64;
            }
        }
    }
    (edits, refused)
}

/// A point or a `target_info` as the rules left it, as Mimir's checks then see it: without
/// the labels `drop_labels` names, and under `truncate` or `drop` each value over
/// `max_label_value_length` shortened as the scan shortens it.
fn as_checked(
    translated: &translate::Translated,
    validation: &Validation,
) -> translate::Translated {
    let limits = &validation.limits;
    let shortens =
        limits.label_value_length_over_limit_strategy != LabelValueLengthOverLimitStrategy::Error;
    let series = translated
        .series
        .iter()
        .map(|labels| {
            labels
                .iter()
                .filter(|(name, _)| !validation.drops(name.as_bytes()))
                .map(|(name, value)| {
                    let value = if shortens && value.len() > limits.max_label_value_length as usize
                    {
                        let short = shortened_value(value.as_bytes(), limits);
                        String::from_utf8_lossy(&short).into_owned()
                    } else {
                        value.clone()
                    };
                    (name.clone(), value)
                })
                .collect()
        })
        .collect();
    translate::Translated {
        place: translated.place,
        series,
        series_items: translated.series_items.clone(),
        earliest_ms: translated.earliest_ms,
        latest_ms: translated.latest_ms,
        items: translated.items,
        native: translated.native.clone(),
    }
}

/// Mimir's checks on one translated series, as on a remote-write series: the first that fails,
/// with its message.
fn series_verdict(
    labels: &[(String, String)],
    translated: &translate::Translated,
    validation: &Validation,
) -> Option<(crate::counts::SeriesReason, String)> {
    let mut check = SeriesCheck::new();
    for (name, value) in labels {
        check.label(name.as_bytes(), value.as_bytes(), true, &validation.limits);
    }
    check.timestamp(translated.earliest_ms);
    check.timestamp(translated.latest_ms);
    match &translated.native {
        Some(NativePoint::Exponential(point)) => {
            check.histogram(native_histogram(point), &validation.limits, 0..0)
        }
        Some(NativePoint::Custom(point)) => {
            check.histogram(custom_histogram(point), &validation.limits, 0..0)
        }
        None => {}
    }
    // The labels came sorted, so only a message reads the series again: judged without it,
    // and named, for the few that fail, from the series as remote-write 1.0 bytes.
    check.verdict(validation, &[])?;
    let series = prompb::TimeSeries {
        labels: labels
            .iter()
            .map(|(name, value)| prompb::Label {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec();
    check.verdict(validation, &series)
}

/// An exponential histogram's point as the native histogram Mimir's translator makes of it
/// (Prometheus' `exponentialToNativeHistogram`): a scale above 8 brought down to 8, buckets as
/// spans and deltas, the OTLP bucket index `i` being the native one `i + 1`.
fn native_histogram(point: &ExponentialHistogramDataPoint) -> prompb::Histogram {
    use prompb::histogram::{Count, ZeroCount};
    let (scale, down) = if point.scale > 8 {
        (8, point.scale - 8)
    } else {
        (point.scale, 0)
    };
    let layout = |buckets: &Option<Buckets>| {
        buckets
            .as_ref()
            .map_or((Vec::new(), Vec::new()), |buckets| {
                buckets_layout(&buckets.bucket_counts, buckets.offset, down)
            })
    };
    let (positive_spans, positive_deltas) = layout(&point.positive);
    let (negative_spans, negative_deltas) = layout(&point.negative);
    prompb::Histogram {
        count: Some(Count::CountInt(point.count)),
        sum: point.sum.unwrap_or_default(),
        schema: scale,
        zero_count: Some(ZeroCount::ZeroCountInt(point.zero_count)),
        positive_spans,
        positive_deltas,
        negative_spans,
        negative_deltas,
        timestamp: (point.time_unix_nano / 1_000_000) as i64,
        ..Default::default()
    }
}

/// A classic histogram's point as the native histogram with custom buckets Mimir's translator
/// makes of it (`otel_convert_histograms_to_nhcb`, Prometheus'
/// `explicitHistogramToCustomBucketsHistogram`): the bucket counts from the first that is not
/// empty, as spans and deltas with no shift of their index, the explicit bounds its custom
/// values.
fn custom_histogram(point: &HistogramDataPoint) -> prompb::Histogram {
    use prompb::histogram::Count;
    let counts = &point.bucket_counts;
    let offset = counts.iter().take_while(|&&count| count == 0).count();
    let (mut positive_spans, positive_deltas) = buckets_layout(&counts[offset..], offset as i32, 0);
    // The exponential layout counts its index from 1; custom buckets from 0.
    if let Some(first) = positive_spans.first_mut() {
        first.offset = first.offset.wrapping_sub(1);
    }
    prompb::Histogram {
        count: Some(Count::CountInt(point.count)),
        sum: point.sum.unwrap_or_default(),
        schema: CUSTOM_BUCKETS_SCHEMA,
        positive_spans,
        positive_deltas,
        custom_values: point.explicit_bounds.clone(),
        timestamp: (point.time_unix_nano / 1_000_000) as i64,
        ..Default::default()
    }
}

/// Native histograms with custom buckets.
const CUSTOM_BUCKETS_SCHEMA: i32 = -53;

/// Go's `>>` on an `int32`: a shift of 32 or more leaves the sign.
fn go_shr(value: i32, shift: i32) -> i32 {
    if shift >= 32 {
        if value < 0 {
            -1
        } else {
            0
        }
    } else {
        value >> shift
    }
}

/// Prometheus' `convertBucketsLayout` for an exponential histogram: OTLP's dense bucket
/// counts from `offset`, `2^down` merged into one, as native spans and deltas (a gap of up to
/// two empty buckets stays in its span, a longer one starts a new span).
fn buckets_layout(counts: &[u64], offset: i32, down: i32) -> (Vec<prompb::BucketSpan>, Vec<i64>) {
    if counts.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let index = |i: i32| go_shr(i.wrapping_add(offset), down).wrapping_add(1);
    let mut spans = vec![prompb::BucketSpan {
        offset: index(0),
        length: 0,
    }];
    let mut deltas: Vec<i64> = Vec::new();
    let mut previous = 0i64;
    let mut append = |spans: &mut Vec<prompb::BucketSpan>, count: i64| {
        if let Some(span) = spans.last_mut() {
            span.length += 1;
        }
        deltas.push(count.wrapping_sub(previous));
        previous = count;
    };
    let mut bucket = index(0);
    let mut count = 0i64;
    let mut close = |spans: &mut Vec<prompb::BucketSpan>, gap: i32, count: i64| {
        if gap > 2 {
            spans.push(prompb::BucketSpan {
                offset: gap,
                length: 0,
            });
        } else {
            for _ in 0..gap.max(0) {
                append(spans, 0);
            }
        }
        append(spans, count);
    };
    for (i, &n) in counts.iter().enumerate() {
        let next = index(i as i32);
        if next == bucket {
            count = count.wrapping_add(n as i64);
            continue;
        }
        if count == 0 {
            count = n as i64;
            continue;
        }
        close(&mut spans, next.wrapping_sub(bucket).wrapping_sub(1), count);
        count = n as i64;
        bucket = next;
    }
    let last = index(counts.len() as i32 - 1);
    close(&mut spans, last.wrapping_sub(bucket), count);
    (spans, deltas)
}

/// The lower resolution a point takes to fit `max_native_histogram_buckets` (Mimir's
/// `reduce_native_histogram_over_max_buckets`); `None` when it fits. Lowered a scale at a time
/// in OTLP's own buckets (bucket `j` goes to `j >> 1`) and measured each time as the native
/// histogram the translation makes of it, so that the receiver's translation of the export
/// fits too (it keeps short runs of empty buckets, which a native histogram lowered in place
/// may not have). Should that not fit by scale -4, the native histogram lowered as Mimir lowers
/// it is written back instead.
fn lowered(
    point: &ExponentialHistogramDataPoint,
    limits: &runtime_config::ValidationLimits,
) -> Option<Resolution> {
    let limit = limits.max_native_histogram_buckets as usize;
    let mut native = native_histogram(point);
    if limit == 0 || bucket_count(&native) <= limit || !reduce_to_fit(&mut native, limit) {
        return None;
    }
    let mut lowering = point.clone();
    // A scale above 8 is brought down to 8 first, as the translation brings it.
    let mut down = (lowering.scale - MAX_SCALE).max(1);
    while lowering.scale > MIN_SCALE {
        lowering.scale = (lowering.scale - down).max(MIN_SCALE);
        for buckets in [&mut lowering.positive, &mut lowering.negative]
            .into_iter()
            .flatten()
        {
            *buckets = lowered_buckets(buckets, down);
        }
        down = 1;
        if bucket_count(&native_histogram(&lowering)) < limit {
            return Some(Resolution {
                scale: lowering.scale,
                positive: lowering.positive.unwrap_or_default(),
                negative: lowering.negative.unwrap_or_default(),
            });
        }
    }
    Some(Resolution {
        scale: native.schema,
        positive: otlp_buckets(&native.positive_spans, &native.positive_deltas),
        negative: otlp_buckets(&native.negative_spans, &native.negative_deltas),
    })
}

/// The lowest and highest scales a native histogram takes.
const MIN_SCALE: i32 = -4;
const MAX_SCALE: i32 = 8;

/// OTLP buckets `down` scales lower: bucket `j` goes into `j >> down`; no empty bucket at
/// either end.
fn lowered_buckets(buckets: &Buckets, down: i32) -> Buckets {
    let down = down.clamp(0, 62);
    let start = i64::from(buckets.offset) >> down;
    let mut counts: Vec<u64> = Vec::new();
    for (i, &count) in buckets.bucket_counts.iter().enumerate() {
        // Never past the buckets' own number: `j >> down` grows no faster than `j`.
        let index = (((i64::from(buckets.offset) + i as i64) >> down) - start) as usize;
        if counts.len() <= index {
            counts.resize(index + 1, 0);
        }
        counts[index] = counts[index].wrapping_add(count);
    }
    trimmed(start as i32, counts)
}

/// `counts` from `offset`, without empty buckets at either end.
fn trimmed(offset: i32, counts: Vec<u64>) -> Buckets {
    let Some(start) = counts.iter().position(|&count| count != 0) else {
        return Buckets::default();
    };
    let end = counts
        .iter()
        .rposition(|&count| count != 0)
        .map_or(start, |end| end + 1);
    Buckets {
        offset: offset.wrapping_add(start as i32),
        bucket_counts: counts[start..end].to_vec(),
    }
}

/// Native spans and deltas as OTLP's dense buckets (native index `i` is OTLP's `i - 1`),
/// without empty buckets at either end.
fn otlp_buckets(spans: &[prompb::BucketSpan], deltas: &[i64]) -> Buckets {
    let Some(first) = spans.first() else {
        return Buckets::default();
    };
    let mut counts = Vec::new();
    let mut deltas = deltas.iter();
    let mut count = 0i64;
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            counts.extend(std::iter::repeat_n(0, span.offset.max(0) as usize));
        }
        for _ in 0..span.length {
            count = count.wrapping_add(deltas.next().copied().unwrap_or_default());
            counts.push(count as u64);
        }
    }
    trimmed(first.offset.wrapping_sub(1), counts)
}

/// Calls `each` with every attribute of every resource and data point, where it is.
fn each_attribute(
    request: &ExportMetricsServiceRequest,
    mut each: impl FnMut(AttributeAt, &KeyValue),
) {
    for (r, resource) in request.resource_metrics.iter().enumerate() {
        for (a, kv) in resource
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .enumerate()
        {
            each(
                AttributeAt {
                    resource: r,
                    point: None,
                    attribute: a,
                },
                kv,
            );
        }
        for (s, scope) in resource.scope_metrics.iter().enumerate() {
            for (m, metric) in scope.metrics.iter().enumerate() {
                let points: Vec<&[KeyValue]> = match metric.data.as_ref() {
                    None => Vec::new(),
                    Some(Data::Gauge(gauge)) => gauge
                        .data_points
                        .iter()
                        .map(|p| &p.attributes[..])
                        .collect(),
                    Some(Data::Sum(sum)) => {
                        sum.data_points.iter().map(|p| &p.attributes[..]).collect()
                    }
                    Some(Data::Histogram(h)) => {
                        h.data_points.iter().map(|p| &p.attributes[..]).collect()
                    }
                    Some(Data::ExponentialHistogram(h)) => {
                        h.data_points.iter().map(|p| &p.attributes[..]).collect()
                    }
                    Some(Data::Summary(summary)) => summary
                        .data_points
                        .iter()
                        .map(|p| &p.attributes[..])
                        .collect(),
                };
                for (p, attributes) in points.into_iter().enumerate() {
                    for (a, kv) in attributes.iter().enumerate() {
                        each(
                            AttributeAt {
                                resource: r,
                                point: Some((s, m, p)),
                                attribute: a,
                            },
                            kv,
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use runtime_config::ValidationLimits;

    use super::*;
    use crate::counts::SeriesReason;
    use crate::otlp::proto::{common, metrics, resource};
    use crate::otlp::Compression;

    /// Now, for the checks (Unix milliseconds), and a point's time a second before it.
    pub(crate) const NOW_MS: i64 = 1_750_000_000_000;
    pub(crate) const POINT_NS: u64 = (NOW_MS as u64 - 1_000) * 1_000_000;

    pub(crate) fn kv(key: &str, value: &str) -> common::KeyValue {
        common::KeyValue {
            key: key.into(),
            value: Some(common::AnyValue {
                value: Some(common::any_value::Value::StringValue(value.into())),
            }),
        }
    }

    fn point(attributes: Vec<common::KeyValue>, time: u64) -> metrics::NumberDataPoint {
        metrics::NumberDataPoint {
            attributes,
            time_unix_nano: time,
            value: Some(metrics::number_data_point::Value::AsDouble(1.0)),
            ..Default::default()
        }
    }

    fn gauge(name: &str, points: Vec<metrics::NumberDataPoint>) -> metrics::Metric {
        metrics::Metric {
            name: name.into(),
            data: Some(Data::Gauge(metrics::Gauge {
                data_points: points,
            })),
            ..Default::default()
        }
    }

    fn export(
        resource: Vec<common::KeyValue>,
        metrics: Vec<metrics::Metric>,
    ) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: resource,
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    /// `request` as protobuf, checked against `limits`.
    fn checked(request: &ExportMetricsServiceRequest, limits: ValidationLimits) -> Decoded {
        decode_validated(
            &request.encode_to_vec(),
            1 << 20,
            PROTOBUF,
            &validation(limits),
        )
        .unwrap()
    }

    /// The samples refused for `reason`.
    fn discarded(refused: &Refused, reason: SeriesReason) -> u64 {
        refused.samples.samples[reason as usize]
    }

    fn validation(limits: ValidationLimits) -> Validation {
        Validation::new(limits, NOW_MS)
    }

    const PROTOBUF: OtlpFormat = OtlpFormat::PROTOBUF;
    const JSON: OtlpFormat = OtlpFormat {
        json: true,
        compression: Compression::None,
    };

    /// The request as OTLP/JSON, written apart from weir's decoder (the mapping's names).
    fn as_json(request: &ExportMetricsServiceRequest) -> Vec<u8> {
        let attributes = |attributes: &[common::KeyValue]| {
            attributes
                .iter()
                .map(|kv| {
                    serde_json::json!({
                        "key": kv.key,
                        "value": {"stringValue": translate::value_string(kv.value.as_ref())},
                    })
                })
                .collect::<Vec<_>>()
        };
        let resources: Vec<serde_json::Value> = request
            .resource_metrics
            .iter()
            .map(|rm| {
                let metrics: Vec<serde_json::Value> = rm.scope_metrics[0]
                    .metrics
                    .iter()
                    .map(|metric| {
                        let Some(Data::Gauge(gauge)) = &metric.data else {
                            unreachable!("the tests send gauges as JSON");
                        };
                        let points: Vec<serde_json::Value> = gauge
                            .data_points
                            .iter()
                            .map(|p| {
                                serde_json::json!({
                                    "attributes": attributes(&p.attributes),
                                    "timeUnixNano": p.time_unix_nano.to_string(),
                                    "asDouble": 1.0,
                                    "futureField": "kept",
                                })
                            })
                            .collect();
                        serde_json::json!({"name": metric.name, "gauge": {"dataPoints": points}})
                    })
                    .collect();
                serde_json::json!({
                    "resource": {"attributes": attributes(&rm.resource.as_ref().unwrap().attributes)},
                    "scopeMetrics": [{"metrics": metrics}],
                })
            })
            .collect();
        serde_json::json!({ "resourceMetrics": resources })
            .to_string()
            .into_bytes()
    }

    fn forwarded(decoded: &Decoded, format: OtlpFormat) -> ExportMetricsServiceRequest {
        let Forward::Rewritten(bytes) = &decoded.forward else {
            panic!("not rewritten: {:?}", decoded.forward);
        };
        if format.json {
            otlp::json::decode(bytes).unwrap()
        } else {
            ExportMetricsServiceRequest::decode(&bytes[..]).unwrap()
        }
    }

    fn gauge_points(request: &ExportMetricsServiceRequest) -> Vec<Vec<common::KeyValue>> {
        request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .flat_map(|metric| match &metric.data {
                Some(Data::Gauge(gauge)) => gauge.data_points.clone(),
                _ => Vec::new(),
            })
            .map(|point| point.attributes)
            .collect()
    }

    /// A refused `target_info` is cut by taking its resource's other attributes: the labels
    /// promoted from them go to the points as attributes (a point that sets such a label
    /// itself keeps its own), so each point forwarded is the series it was sent as. When no
    /// attributes can keep the points' series (a repeated identifying key, promoted, whose
    /// last value is empty: the resource left would promote the first), the points are
    /// refused with it, counted under its reason.
    #[test]
    fn a_refused_target_info_takes_no_promoted_label_from_its_points() {
        let limits = ValidationLimits {
            max_label_names_per_series: 4,
            max_label_names_per_info_series: 4,
            ..Default::default()
        };
        let translating = |promoted: &[&str]| {
            validation(limits).translating(Some(std::sync::Arc::new(
                runtime_config::OtlpTranslation {
                    promote_otel_resource_attributes: promoted
                        .iter()
                        .map(|key| key.to_string())
                        .collect(),
                    ..Default::default()
                },
            )))
        };
        // `target_info`: `__name__`, `job`, `env`, `host_name`, `os`: 5 labels over 4.
        let resource = vec![
            kv("service.name", "api"),
            kv("env", "prod"),
            kv("host.name", "h-1"),
            kv("os", "linux"),
        ];
        let request = export(
            resource,
            vec![gauge(
                "g",
                vec![
                    point(vec![kv("q", "1")], POINT_NS),
                    point(vec![kv("env", "canary")], POINT_NS),
                ],
            )],
        );
        let validation = translating(&["env"]);
        let decoded =
            decode_validated(&request.encode_to_vec(), 1 << 20, PROTOBUF, &validation).unwrap();
        let refused = decoded.refused.as_ref().unwrap();
        assert_eq!(
            discarded(refused, SeriesReason::MaxLabelNamesPerInfoSeries),
            1
        );
        assert_eq!(decoded.counts.samples, 2);
        let sent = forwarded(&decoded, PROTOBUF);
        assert_eq!(
            sent.resource_metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .attributes,
            vec![kv("service.name", "api")]
        );
        assert_eq!(
            gauge_points(&sent),
            vec![
                vec![kv("q", "1"), kv("env", "prod")],
                vec![kv("env", "canary")]
            ]
        );
        // Not promoted, the attributes go and the points stay as sent.
        let decoded = decode_validated(
            &request.encode_to_vec(),
            1 << 20,
            PROTOBUF,
            &translating(&[]),
        )
        .unwrap();
        assert_eq!(
            gauge_points(&forwarded(&decoded, PROTOBUF)),
            gauge_points(&request)
        );

        // `service.namespace` promoted, sent `a` then empty: the points have no such label,
        // and `job` is `a/api`. Left its first, the resource would promote `a`.
        let request = export(
            vec![
                kv("service.namespace", "a"),
                kv("service.name", "api"),
                kv("service.namespace", ""),
                kv("host.name", "h-1"),
                kv("os", "linux"),
                kv("arch", "arm"),
            ],
            vec![gauge("g", vec![point(vec![kv("q", "1")], POINT_NS)])],
        );
        let decoded = decode_validated(
            &request.encode_to_vec(),
            1 << 20,
            PROTOBUF,
            &translating(&["service.namespace"]),
        )
        .unwrap();
        let refused = decoded.refused.as_ref().unwrap();
        assert_eq!(
            discarded(refused, SeriesReason::MaxLabelNamesPerInfoSeries),
            2
        );
        assert_eq!(refused.series, 2);
        assert_eq!(decoded.counts.samples, 0);
        assert!(
            matches!(decoded.forward, Forward::Nothing),
            "{:?}",
            decoded.forward
        );
    }

    /// With the tenant's exemplars off (Mimir's default) the forwarded export carries none,
    /// whether it is otherwise forwarded as sent (cut on the wire) or has a point cut (cut in
    /// the decode); gzip stays gzip. With them on, they stay and are charged.
    #[test]
    fn exemplars_go_when_the_tenant_s_are_off_and_stay_when_on() {
        let mut traced = point(vec![kv("path", "/")], POINT_NS);
        traced.exemplars = vec![metrics::Exemplar {
            time_unix_nano: POINT_NS,
            span_id: vec![7; 8],
            value: Some(metrics::exemplar::Value::AsDouble(0.5)),
            ..Default::default()
        }];
        let refused = point(vec![kv("path", &"x".repeat(2049))], POINT_NS);
        let sum = |points| metrics::Metric {
            name: "requests".into(),
            data: Some(Data::Sum(metrics::Sum {
                data_points: points,
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let on = ValidationLimits {
            max_global_exemplars_per_user: 100_000,
            ..Default::default()
        };
        for with_refused in [false, true] {
            let mut points = vec![traced.clone()];
            if with_refused {
                points.push(refused.clone());
            }
            let request = export(vec![kv("service.name", "api")], vec![sum(points)]);
            let kept = export(
                vec![kv("service.name", "api")],
                vec![sum(vec![traced.clone()])],
            );
            let mut kept_without = kept.clone();
            assert!(otlp::edit::clear_exemplars(&mut kept_without));
            for compression in [
                Compression::None,
                Compression::Gzip,
                Compression::Lz4,
                Compression::Zstd,
            ] {
                let format = OtlpFormat {
                    json: false,
                    compression,
                };
                let body = otlp::compress(request.encode_to_vec(), compression);
                let forwarded = |decoded: &Decoded| {
                    let Forward::Rewritten(bytes) = &decoded.forward else {
                        panic!("not rewritten: {:?}", decoded.forward);
                    };
                    let raw = otlp::inflate(bytes, 1 << 20, format).expect("in its encoding");
                    ExportMetricsServiceRequest::decode(&raw[..]).unwrap()
                };
                let off = decode_validated(&body, 1 << 20, format, &validation(Default::default()))
                    .unwrap();
                assert_eq!((off.counts.samples, off.counts.exemplars), (1, 0));
                assert_eq!(forwarded(&off), kept_without);
                assert_eq!(off.refused.is_some(), with_refused);

                let kept_on = decode_validated(&body, 1 << 20, format, &validation(on)).unwrap();
                assert_eq!((kept_on.counts.samples, kept_on.counts.exemplars), (1, 1));
                if with_refused {
                    assert_eq!(forwarded(&kept_on), kept);
                } else {
                    assert_eq!(kept_on.forward, Forward::Unchanged);
                }
            }
        }
    }

    fn exemplar(
        time: u64,
        span: &[u8],
        attributes: Vec<common::KeyValue>,
        value: f64,
    ) -> metrics::Exemplar {
        metrics::Exemplar {
            time_unix_nano: time,
            span_id: span.to_vec(),
            filtered_attributes: attributes,
            value: Some(metrics::exemplar::Value::AsDouble(value)),
            ..Default::default()
        }
    }

    fn cumulative_sum(points: Vec<metrics::NumberDataPoint>) -> metrics::Metric {
        metrics::Metric {
            name: "requests".into(),
            data: Some(Data::Sum(metrics::Sum {
                data_points: points,
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        }
    }

    /// The exemplars of the points a request forwards, point by point.
    fn forwarded_exemplars(decoded: &Decoded, format: OtlpFormat) -> Vec<Vec<metrics::Exemplar>> {
        let Forward::Rewritten(bytes) = &decoded.forward else {
            panic!("not rewritten: {:?}", decoded.forward);
        };
        let raw = otlp::inflate(bytes, 1 << 20, format).unwrap();
        let request = if format.json {
            otlp::json::decode(&raw).unwrap()
        } else {
            ExportMetricsServiceRequest::decode(&raw[..]).unwrap()
        };
        request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .flat_map(|metric| match &metric.data {
                Some(Data::Sum(sum)) => sum
                    .data_points
                    .iter()
                    .map(|p| p.exemplars.clone())
                    .collect(),
                Some(Data::Histogram(h)) => {
                    h.data_points.iter().map(|p| p.exemplars.clone()).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    }

    fn exemplars_on(per_series: u32) -> ValidationLimits {
        ValidationLimits {
            max_global_exemplars_per_user: 100_000,
            max_exemplars_per_series_per_request: per_series,
            ..Default::default()
        }
    }

    /// A tenant that keeps exemplars has each one the translation carries checked as Mimir's
    /// distributor checks it: one that fails is cut from the forwarded export, uncharged, and
    /// counted by reason; the push is accepted.
    #[test]
    fn exemplars_a_tenant_keeps_are_checked_as_mimir_checks_them() {
        use crate::counts::ExemplarReason as Reason;
        let span = [7u8; 8];
        let minute = 60_000_000_000;
        let good = exemplar(POINT_NS, &span, vec![kv("user", "a")], 1.0);
        let sent = vec![
            good.clone(),
            // No id and no attribute: no labels.
            exemplar(POINT_NS, &[], vec![], 1.0),
            // An id of zeros is none; its only attribute has no value.
            exemplar(POINT_NS, &[0; 8], vec![kv("user", "")], 1.0),
            // Under a millisecond: no timestamp.
            exemplar(999_999, &span, vec![], 1.0),
            // 6 minutes before the request's earliest sample.
            exemplar(POINT_NS - 6 * minute, &span, vec![], 1.0),
            // 11 minutes ahead of now (the creation grace is 10).
            exemplar(POINT_NS + 11 * minute, &span, vec![], 1.0),
            // Attributes over 128 characters and no id: the translator leaves them out.
            exemplar(POINT_NS, &[], vec![kv("note", &"n".repeat(130))], 1.0),
        ];
        let mut traced = point(vec![kv("path", "/")], POINT_NS);
        traced.exemplars = sent;
        let request = export(
            vec![kv("service.name", "api")],
            vec![cumulative_sum(vec![traced])],
        );
        let json = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
        "scopeMetrics": [{"metrics": [{"name": "requests", "sum": {
            "aggregationTemporality": 2, "isMonotonic": true,
            "dataPoints": [{
                "attributes": [{"key": "path", "value": {"stringValue": "/"}}],
                "timeUnixNano": POINT_NS.to_string(), "asDouble": 1.0,
                "exemplars": [
                    {"timeUnixNano": POINT_NS.to_string(), "spanId": "0707070707070707",
                     "filteredAttributes": [{"key": "user", "value": {"stringValue": "a"}}],
                     "asDouble": 1.0, "futureField": "kept"},
                    {"timeUnixNano": POINT_NS.to_string(), "asDouble": 1.0}
                ]}]}}]}]}]});
        let checks = validation(exemplars_on(0));
        let decoded =
            decode_validated(&request.encode_to_vec(), 1 << 20, PROTOBUF, &checks).unwrap();
        assert_eq!(
            forwarded_exemplars(&decoded, PROTOBUF),
            vec![vec![good.clone()]]
        );
        assert_eq!(decoded.refused, None, "the push is accepted");
        assert_eq!((decoded.counts.samples, decoded.counts.exemplars), (1, 1));
        let dropped = decoded.dropped_exemplars;
        assert_eq!(dropped[Reason::LabelsMissing as usize], 2);
        assert_eq!(dropped[Reason::LabelsBlank as usize], 1);
        assert_eq!(dropped[Reason::TimestampInvalid as usize], 1);
        assert_eq!(dropped[Reason::TooOld as usize], 1);
        assert_eq!(dropped[Reason::TooFarInFuture as usize], 1);

        let body = json.to_string().into_bytes();
        let decoded = decode_validated(&body, 1 << 20, JSON, &checks).unwrap();
        assert_eq!(forwarded_exemplars(&decoded, JSON), vec![vec![good]]);
        assert_eq!(decoded.dropped_exemplars[Reason::LabelsMissing as usize], 1);
        let Forward::Rewritten(bytes) = &decoded.forward else {
            unreachable!()
        };
        assert!(String::from_utf8_lossy(bytes).contains("\"futureField\":\"kept\""));
    }

    /// `max_exemplars_per_series_per_request` counts per series: a sum point's exemplars are
    /// one series; a classic histogram's are handed out to its bucket series as the
    /// translator does (in their order, never to a bucket below the one before's).
    #[test]
    fn the_exemplar_limit_counts_per_series_as_the_translator_hands_them_out() {
        use crate::counts::ExemplarReason as Reason;
        let span = [7u8; 8];
        let at = |value: f64| exemplar(POINT_NS, &span, vec![], value);
        let histogram = |values: &[f64]| metrics::Metric {
            name: "latency".into(),
            data: Some(Data::Histogram(metrics::Histogram {
                data_points: vec![metrics::HistogramDataPoint {
                    time_unix_nano: POINT_NS,
                    count: 5,
                    bucket_counts: vec![1, 2, 2],
                    explicit_bounds: vec![1.0, 10.0],
                    exemplars: values.iter().map(|&value| at(value)).collect(),
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        };
        let mut sum_point = point(vec![], POINT_NS);
        sum_point.exemplars = vec![at(1.0), at(2.0)];
        for (metric, kept) in [
            // Buckets 1, 1, 10, +Inf, +Inf: one each stays.
            (
                histogram(&[0.5, 0.7, 5.0, 50.0, 60.0]),
                vec![0.5, 5.0, 50.0],
            ),
            // 5 goes to the bucket of 10, and 0.5 after it to the same: one stays.
            (histogram(&[5.0, 0.5]), vec![5.0]),
            // A value on a bound is in its bucket.
            (histogram(&[1.0, 0.5, 5.0]), vec![1.0, 5.0]),
            (cumulative_sum(vec![sum_point]), vec![1.0]),
        ] {
            let request = export(vec![kv("service.name", "api")], vec![metric]);
            let decoded = decode_validated(
                &request.encode_to_vec(),
                1 << 20,
                PROTOBUF,
                &validation(exemplars_on(1)),
            )
            .unwrap();
            let values: Vec<f64> = forwarded_exemplars(&decoded, PROTOBUF)[0]
                .iter()
                .map(|e| match e.value {
                    Some(metrics::exemplar::Value::AsDouble(value)) => value,
                    _ => unreachable!(),
                })
                .collect();
            assert_eq!(values, kept);
            let cut = request.encode_to_vec();
            let sent = ExportMetricsServiceRequest::decode(&cut[..]).unwrap();
            let all: usize = match &sent.resource_metrics[0].scope_metrics[0].metrics[0].data {
                Some(Data::Histogram(h)) => h.data_points[0].exemplars.len(),
                Some(Data::Sum(s)) => s.data_points[0].exemplars.len(),
                _ => unreachable!(),
            };
            assert_eq!(
                decoded.dropped_exemplars[Reason::TooManyPerSeries as usize] as usize,
                all - kept.len()
            );
        }
    }

    #[test]
    fn a_point_whose_series_fails_is_cut_and_the_rest_goes_on() {
        let long = "x".repeat(2049);
        let request = export(
            vec![kv("service.name", "api")],
            vec![gauge(
                "http.requests",
                vec![
                    point(vec![kv("path", "/")], POINT_NS),
                    point(vec![kv("path", &long)], POINT_NS),
                    point(vec![kv("path", "/b")], POINT_NS),
                ],
            )],
        );
        for (format, body) in [
            (PROTOBUF, request.encode_to_vec()),
            (JSON, as_json(&request)),
        ] {
            let decoded =
                decode_validated(&body, 1 << 20, format, &validation(Default::default())).unwrap();
            let refused = decoded.refused.clone().expect("a point is refused");
            assert_eq!(discarded(&refused, SeriesReason::LabelValueTooLong), 1);
            assert!(
                refused
                    .first
                    .contains("label value length exceeds the limit")
                    && refused.first.contains("label: 'path'")
                    && refused
                        .first
                        .contains("series: 'http_requests{job=\"api\", path="),
                "{}",
                refused.first
            );
            // Two samples and one metadata entry are left to charge.
            assert_eq!((decoded.counts.samples, decoded.counts.metadata), (2, 1));
            let kept = forwarded(&decoded, format);
            assert_eq!(
                gauge_points(&kept),
                vec![vec![kv("path", "/")], vec![kv("path", "/b")]]
            );
            if format.json {
                let Forward::Rewritten(bytes) = &decoded.forward else {
                    unreachable!()
                };
                assert!(
                    String::from_utf8_lossy(bytes).contains("\"futureField\":\"kept\""),
                    "fields weir does not read are forwarded"
                );
            }
        }
    }

    #[test]
    fn labels_are_counted_as_the_translation_makes_them() {
        // 26 attributes + job + instance + __name__ = 29 labels: within Mimir's 30; one more
        // attribute is 30; two more, 31.
        let attributes = |n: usize| (0..n).map(|i| kv(&format!("a{i}"), "v")).collect();
        let request = export(
            vec![kv("service.name", "api"), kv("service.instance.id", "i-1")],
            vec![gauge(
                "g",
                vec![
                    point(attributes(26), POINT_NS),
                    point(attributes(27), POINT_NS),
                    point(attributes(28), POINT_NS),
                ],
            )],
        );
        let decoded = checked(&request, Default::default());
        let refused = decoded.refused.unwrap();
        assert_eq!(
            discarded(&refused, SeriesReason::MaxLabelNamesPerSeries),
            1,
            "{}",
            refused.first
        );
        assert!(
            refused.first.contains("(actual: 31, limit: 30)"),
            "{}",
            refused.first
        );
        // Keys that escape alike are one label: `a.b` and `a_b` are `a_b`.
        let alike = export(
            vec![],
            vec![gauge(
                "g",
                vec![point(
                    (0..40)
                        .map(|i| kv(if i % 2 == 0 { "k.x" } else { "k_x" }, "v"))
                        .collect(),
                    POINT_NS,
                )],
            )],
        );
        let decoded = checked(&alike, Default::default());
        assert_eq!(decoded.refused, None);
        assert_eq!(decoded.forward, Forward::Unchanged);
    }

    #[test]
    fn times_outside_the_window_are_refused() {
        let limits = ValidationLimits {
            past_grace_period: Duration::from_secs(3600),
            ..Default::default()
        };
        let future = (NOW_MS as u64 + 11 * 60 * 1000) * 1_000_000;
        let past = (NOW_MS as u64 - 2 * 3600 * 1000) * 1_000_000;
        let request = export(
            vec![],
            vec![gauge(
                "g",
                vec![
                    point(vec![], future),
                    point(vec![], past),
                    point(vec![], POINT_NS),
                ],
            )],
        );
        let decoded = checked(&request, limits);
        let refused = decoded.refused.clone().unwrap();
        assert_eq!(discarded(&refused, SeriesReason::TooFarInFuture), 1);
        assert_eq!(discarded(&refused, SeriesReason::TooFarInPast), 1);
        assert!(
            refused.first.contains("too far in the future"),
            "{}",
            refused.first
        );
        assert_eq!(gauge_points(&forwarded(&decoded, PROTOBUF)).len(), 1);
    }

    #[test]
    fn truncate_shortens_the_value_and_drop_labels_cuts_the_attribute() {
        let long = "y".repeat(3000);
        let limits = ValidationLimits {
            label_value_length_over_limit_strategy: LabelValueLengthOverLimitStrategy::Truncate,
            ..Default::default()
        };
        let request = export(
            vec![kv("service.name", "api")],
            vec![gauge(
                "g",
                vec![point(
                    vec![kv("query", &long), kv("pod.uid", "p")],
                    POINT_NS,
                )],
            )],
        );
        let validation = validation(limits).dropping(Some(vec!["pod_uid".to_string()].into()));
        for (format, body) in [
            (PROTOBUF, request.encode_to_vec()),
            (JSON, as_json(&request)),
        ] {
            let decoded = decode_validated(&body, 1 << 20, format, &validation).unwrap();
            assert_eq!(decoded.refused, None);
            let points = gauge_points(&forwarded(&decoded, format));
            let short = String::from_utf8(shortened_value(long.as_bytes(), &limits)).unwrap();
            assert_eq!(short.len(), 2048);
            assert_eq!(points, vec![vec![kv("query", &short)]]);
        }
    }

    #[test]
    fn a_target_info_that_fails_takes_the_resource_s_other_attributes_with_it() {
        // target_info is an info series: Mimir's limit for it is 80 labels.
        let mut resource: Vec<common::KeyValue> =
            (0..80).map(|i| kv(&format!("host.tag{i}"), "v")).collect();
        resource.push(kv("service.name", "api"));
        let request = export(resource, vec![gauge("g", vec![point(vec![], POINT_NS)])]);
        let decoded = checked(&request, Default::default());
        let refused = decoded.refused.clone().unwrap();
        assert_eq!(
            discarded(&refused, SeriesReason::MaxLabelNamesPerInfoSeries),
            1
        );
        assert!(refused.first.contains("target_info{"), "{}", refused.first);
        let kept = forwarded(&decoded, PROTOBUF);
        assert_eq!(
            kept.resource_metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .attributes,
            vec![kv("service.name", "api")]
        );
        // The gauge's sample, no target_info left; the metadata entries of both, which Mimir
        // makes before its checks refuse the target_info.
        assert_eq!((decoded.counts.samples, decoded.counts.metadata), (1, 2));
    }

    #[test]
    fn a_gzip_export_is_forwarded_gzip_and_one_with_nothing_left_forwards_nothing() {
        let request = export(
            vec![],
            vec![gauge(
                "g",
                vec![point(vec![kv("k", &"z".repeat(5000))], POINT_NS)],
            )],
        );
        let decoded = checked(&request, Default::default());
        assert_eq!(decoded.forward, Forward::Nothing);
        assert!(decoded.refused.is_some());

        let mut two = request.clone();
        let Some(Data::Gauge(g)) = &mut two.resource_metrics[0].scope_metrics[0].metrics[0].data
        else {
            unreachable!()
        };
        g.data_points.push(point(vec![], POINT_NS));
        let gzip = OtlpFormat {
            json: false,
            compression: Compression::Gzip,
        };
        // Written apart from weir's `compress`, which the forward uses.
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut encoder, &two.encode_to_vec()).unwrap();
        let body = encoder.finish().unwrap();
        let decoded =
            decode_validated(&body, 1 << 20, gzip, &validation(Default::default())).unwrap();
        let Forward::Rewritten(bytes) = &decoded.forward else {
            panic!("{:?}", decoded.forward)
        };
        let raw = otlp::inflate(bytes, 1 << 20, gzip).unwrap();
        let kept = ExportMetricsServiceRequest::decode(&raw[..]).unwrap();
        assert_eq!(gauge_points(&kept), vec![Vec::<common::KeyValue>::new()]);
    }

    /// A metric whose name escapes to no metric name is dropped as Mimir's translator drops
    /// it (its `MetricNamer` fails: nothing left, or only `_` where escaping changed the name):
    /// not charged, forwarded with the export, counted, and the push answered 400 once written
    /// ("otlp parse error"); alone, the export is a 400 before anything is charged. A name all
    /// `_` as sent is a name.
    #[test]
    fn a_metric_the_translator_cannot_name_is_dropped_as_mimir_drops_it() {
        let one = |name: &str| gauge(name, vec![point(vec![], POINT_NS)]);
        for name in ["..", "_.", "", "é"] {
            let request = export(vec![], vec![one(name), one("kept")]);
            let decoded = checked(&request, Default::default());
            let refused = decoded.refused.clone().expect("answered 400");
            assert!(
                refused.first.starts_with("otlp parse error: metric ")
                    && refused.first.contains("makes no metric name"),
                "{name:?}: {}",
                refused.first
            );
            assert_eq!((refused.series, refused.samples.samples()), (0, 0));
            assert_eq!(decoded.untranslated, 1, "{name:?}");
            assert_eq!(decoded.forward, Forward::Unchanged, "{name:?}");
            // One sample and one metadata entry: `kept`'s.
            assert_eq!(
                (decoded.counts.samples, decoded.counts.metadata),
                (1, 1),
                "{name:?}"
            );
            let alone = export(vec![], vec![one(name)]).encode_to_vec();
            let err = decode_validated(&alone, 1 << 20, PROTOBUF, &validation(Default::default()))
                .unwrap_err();
            assert!(err.to_string().contains("makes no metric name"), "{err}");
        }
        for name in ["_", "__", "1", ":"] {
            let request = export(vec![], vec![one(name)]);
            let decoded = checked(&request, Default::default());
            assert_eq!(
                (decoded.counts.samples, decoded.refused),
                (1, None),
                "{name:?}"
            );
        }
    }

    /// An export at the edge of one of [`may_fail`]'s bounds, whose series fail: the bounds
    /// must see it (the property below draws such edges only now and then).
    fn at_the_edge(request: ExportMetricsServiceRequest, limits: ValidationLimits) {
        let validation = validation(limits);
        let (_, refused, _) = check(&request, &validation, None);
        assert!(refused.is_some(), "the export at the edge must fail");
        let (_, bounds) =
            otlp::scan_bounded(&request.encode_to_vec(), &Default::default()).unwrap();
        assert!(may_fail(&bounds, &validation), "{bounds:?}");
    }

    fn exponential(name: &str, scale: i32, counts: Vec<u64>) -> metrics::Metric {
        let total = counts.iter().sum();
        metrics::Metric {
            name: name.into(),
            data: Some(Data::ExponentialHistogram(metrics::ExponentialHistogram {
                data_points: vec![ExponentialHistogramDataPoint {
                    time_unix_nano: POINT_NS,
                    scale,
                    count: total,
                    positive: Some(Buckets {
                        offset: -3,
                        bucket_counts: counts,
                    }),
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        }
    }

    #[test]
    fn buckets_become_the_native_histogram_prometheus_makes() {
        // Prometheus' own cases for convertBucketsLayout (otlptranslator histograms_test.go):
        // offset -1 is native index 0; gaps of up to two stay in a span.
        let spans = |list: &[(i32, u32)]| {
            list.iter()
                .map(|&(offset, length)| prompb::BucketSpan { offset, length })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            buckets_layout(&[4, 3, 2, 1], 0, 0),
            (spans(&[(1, 4)]), vec![4, -1, -1, -1])
        );
        assert_eq!(
            buckets_layout(&[4, 0, 0, 0, 1], 0, 0),
            (spans(&[(1, 1), (3, 1)]), vec![4, -3])
        );
        assert_eq!(
            buckets_layout(&[4, 0, 0, 1], 0, 0),
            (spans(&[(1, 4)]), vec![4, -4, 0, 1])
        );
        // Two merged into one (a scale one above 8).
        assert_eq!(
            buckets_layout(&[4, 3, 2, 1], 0, 1),
            (spans(&[(1, 2)]), vec![7, -4])
        );
        // And back to OTLP's dense buckets.
        let (native_spans, deltas) = buckets_layout(&[4, 0, 0, 0, 1], -2, 0);
        assert_eq!(
            otlp_buckets(&native_spans, &deltas),
            Buckets {
                offset: -2,
                bucket_counts: vec![4, 0, 0, 0, 1]
            }
        );
    }

    /// `exponential("latency", 3, 1..=10)` as OTLP/JSON, in the proto's snake_case names.
    fn exponential_json() -> Vec<u8> {
        let counts: Vec<String> = (1..=10).map(|n: u64| n.to_string()).collect();
        serde_json::json!({"resource_metrics": [{"scope_metrics": [{"metrics": [{
            "name": "latency",
            "exponential_histogram": {
                "aggregation_temporality": 2,
                "data_points": [{
                    "time_unix_nano": POINT_NS.to_string(),
                    "scale": 3,
                    "count": "55",
                    "positive": {"offset": -3, "bucket_counts": counts},
                }],
            },
        }]}]}]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_native_histogram_over_the_bucket_limit_is_lowered_or_refused() {
        let counts: Vec<u64> = (1..=10).collect();
        let request = export(vec![], vec![exponential("latency", 3, counts.clone())]);
        let lowering = ValidationLimits {
            max_native_histogram_buckets: 6,
            reduce_native_histogram_over_max_buckets: true,
            ..Default::default()
        };
        for (format, body) in [
            (PROTOBUF, request.encode_to_vec()),
            (JSON, exponential_json()),
        ] {
            let decoded = decode_validated(&body, 1 << 20, format, &validation(lowering)).unwrap();
            assert_eq!(decoded.refused, None);
            let kept = forwarded(&decoded, format);
            let Some(Data::ExponentialHistogram(h)) =
                &kept.resource_metrics[0].scope_metrics[0].metrics[0].data
            else {
                panic!("{kept:?}")
            };
            let point = &h.data_points[0];
            // Offsets -3..=6 at scale 3, halved: -2..=3 at scale 2 (6 buckets, not under 6),
            // then -1..=1 at scale 1.
            assert_eq!(point.scale, 1);
            let positive = point.positive.as_ref().unwrap();
            assert_eq!(positive.offset, -1);
            assert_eq!(
                positive.bucket_counts.iter().sum::<u64>(),
                counts.iter().sum::<u64>()
            );
            // OTLP bucket j goes to j >> 1 at each step.
            assert_eq!(
                positive.bucket_counts,
                vec![1 + 2 + 3, 4 + 5 + 6 + 7, 8 + 9 + 10]
            );
            assert_eq!(bucket_count(&native_histogram(point)), 3);
        }
        // A scale far above 8 is brought down to 8 at once, as the translation brings it:
        // buckets on both sides of 1 stay two buckets down to scale -4, over a limit of 1.
        for scale in [40, i32::MAX] {
            let request = export(vec![], vec![exponential("wide", scale, counts.clone())]);
            let one = ValidationLimits {
                max_native_histogram_buckets: 1,
                ..lowering
            };
            let decoded = checked(&request, one);
            let refused = decoded.refused.unwrap();
            assert!(refused.first.contains("cannot reduce"), "{}", refused.first);
        }
        let refusing = ValidationLimits {
            reduce_native_histogram_over_max_buckets: false,
            ..lowering
        };
        let decoded = checked(&request, refusing);
        let refused = decoded.refused.unwrap();
        assert_eq!(
            discarded(&refused, SeriesReason::MaxNativeHistogramBuckets),
            1
        );
        assert!(
            refused.first.contains("buckets: 10, limit: 6"),
            "{}",
            refused.first
        );
        assert_eq!(decoded.forward, Forward::Nothing);
    }

    /// A classic histogram's metric with one point of these bucket counts, named `name`.
    fn classic(name: &str, counts: Vec<u64>) -> metrics::Metric {
        metrics::Metric {
            name: name.into(),
            data: Some(Data::Histogram(metrics::Histogram {
                data_points: vec![metrics::HistogramDataPoint {
                    time_unix_nano: POINT_NS,
                    explicit_bounds: (1..counts.len()).map(|bound| bound as f64).collect(),
                    count: counts.iter().sum(),
                    bucket_counts: counts,
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        }
    }

    #[test]
    fn with_custom_buckets_a_histogram_is_checked_as_one_native_histogram() {
        let nhcb = |limits| {
            validation(limits).translating(Some(std::sync::Arc::new(
                runtime_config::OtlpTranslation {
                    otel_convert_histograms_to_nhcb: true,
                    ..Default::default()
                },
            )))
        };
        let run = |request: &ExportMetricsServiceRequest, validation: &Validation| {
            decode_validated(&request.encode_to_vec(), 1 << 20, PROTOBUF, validation).unwrap()
        };
        // Custom buckets as Prometheus lays them out: from the first that is not empty, the
        // index not shifted, a run of three empty buckets a new span.
        let point = |counts: Vec<u64>| {
            let Some(Data::Histogram(h)) = classic("h", counts).data else {
                unreachable!()
            };
            custom_histogram(&h.data_points[0])
        };
        let native = point(vec![0, 1, 0, 0, 0, 2]);
        assert_eq!(native.schema, -53);
        assert_eq!(
            native.positive_spans,
            [
                prompb::BucketSpan {
                    offset: 1,
                    length: 1
                },
                prompb::BucketSpan {
                    offset: 3,
                    length: 1
                }
            ]
        );
        assert_eq!(native.positive_deltas, [1, 1]);
        assert_eq!(native.custom_values, [1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(bucket_count(&point(vec![0, 0])), 0);
        // Five buckets against a limit of four: custom buckets have no lower resolution, so
        // the point is refused even where an exponential one would be lowered; as classic
        // series it has no native histogram to limit.
        let limits = ValidationLimits {
            max_native_histogram_buckets: 4,
            reduce_native_histogram_over_max_buckets: true,
            ..Default::default()
        };
        let wide = export(vec![], vec![classic("wide", vec![0, 1, 1, 1, 1, 1])]);
        let decoded = run(&wide, &nhcb(limits));
        let refused = decoded.refused.expect("over the limit");
        assert!(
            refused.first.contains("more custom buckets than the limit"),
            "{}",
            refused.first
        );
        assert_eq!(
            discarded(&refused, SeriesReason::MaxNativeHistogramBuckets),
            1
        );
        assert_eq!(decoded.forward, Forward::Nothing);
        let classic_series = run(&wide, &validation(limits));
        assert_eq!(classic_series.refused, None);
        // Five bounds' buckets, `+Inf` and `_count`.
        assert_eq!(classic_series.counts.samples, 5 + 2);
        // Its series has the metric's own name, where a classic one's buckets add `_bucket`:
        // a 36-character name passes a value limit of 40 only as one native histogram.
        let short = ValidationLimits {
            max_label_value_length: 40,
            ..Default::default()
        };
        let long = export(vec![], vec![classic(&"h".repeat(36), vec![1, 2])]);
        let decoded = run(&long, &nhcb(short));
        assert_eq!(decoded.refused, None);
        assert_eq!((decoded.counts.samples, decoded.counts.histograms), (0, 1));
        assert_eq!(decoded.forward, Forward::Unchanged);
        assert!(run(&long, &validation(short)).refused.is_some());
    }

    #[test]
    fn each_bound_sees_the_export_at_its_edge() {
        let limits = ValidationLimits {
            max_label_names_per_series: 10,
            max_label_names_per_info_series: 10,
            max_label_value_length: 40,
            ..Default::default()
        };
        // target_info: `service.name` and 9 others are 9 labels, `job` and `__name__`: 11.
        let mut resource: Vec<common::KeyValue> =
            (0..9).map(|i| kv(&format!("r{i}"), "v")).collect();
        resource.push(kv("service.name", "api"));
        at_the_edge(
            export(resource, vec![gauge("g", vec![point(vec![], POINT_NS)])]),
            limits,
        );
        // `job` is the namespace, a `/` and the name: 20 + 1 + 20 characters.
        let resource = vec![
            kv("service.namespace", &"n".repeat(20)),
            kv("service.name", &"s".repeat(20)),
        ];
        at_the_edge(
            export(resource, vec![gauge("g", vec![point(vec![], POINT_NS)])]),
            limits,
        );
        // A histogram's bucket series is named with `_bucket`: 36 + 7 characters.
        let histogram = metrics::Metric {
            name: "h".repeat(36),
            data: Some(Data::Histogram(metrics::Histogram {
                data_points: vec![metrics::HistogramDataPoint {
                    time_unix_nano: POINT_NS,
                    bucket_counts: vec![1],
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        };
        at_the_edge(export(vec![], vec![histogram]), limits);
        // A native histogram with one bucket over the limit, not to be lowered.
        let buckets = ValidationLimits {
            max_native_histogram_buckets: 4,
            reduce_native_histogram_over_max_buckets: false,
            ..limits
        };
        at_the_edge(
            export(vec![], vec![exponential("e", 0, vec![1, 1, 1, 1, 1])]),
            buckets,
        );
        // Keys that escape alike are one label, their values joined with `;`: 3 × 13 + 2
        // characters on a point (each value a third of the limit), and on a resource's
        // `target_info` (which a resource with a `job` has).
        let alike = vec![
            kv("http.path", &"a".repeat(13)),
            kv("http_path", &"b".repeat(13)),
            kv("http-path", &"c".repeat(13)),
        ];
        at_the_edge(
            export(
                vec![],
                vec![gauge("g", vec![point(alike.clone(), POINT_NS)])],
            ),
            limits,
        );
        let resource = [alike, vec![kv("service.name", "api")]].concat();
        at_the_edge(
            export(resource, vec![gauge("g", vec![point(vec![], POINT_NS)])]),
            limits,
        );
    }

    /// Exports near the limits drawn with them: most attributes within every bound, a few
    /// past one (a key that escapes longer, a long value, a byte string, an empty key, a
    /// point with as many attributes as the limit allows, a time outside the window).
    fn strategy() -> impl Strategy<Value = (ExportMetricsServiceRequest, ValidationLimits)> {
        use common::any_value::Value as Any;
        use proptest::string::string_regex;
        let buckets = prop_oneof![Just(0u32), 3u32..9];
        (
            (8u32..14, 0u32..4, 12u32..24, 60u32..90),
            (any::<bool>(), buckets, any::<bool>()),
        )
            .prop_flat_map(|((labels, info, name, value), (past, buckets, reduce))| {
                let limits = ValidationLimits {
                    max_label_names_per_series: labels,
                    max_label_names_per_info_series: labels + info,
                    max_label_name_length: name,
                    max_label_value_length: value,
                    past_grace_period: Duration::from_secs(if past { 3600 } else { 0 }),
                    max_native_histogram_buckets: buckets,
                    reduce_native_histogram_over_max_buckets: reduce,
                    ..Default::default()
                };
                let regex = |pattern: String| string_regex(&pattern).unwrap();
                let key = prop_oneof![
                    40 => regex(format!("[a-z][a-z.]{{0,{}}}", name - 5)),
                    1 => regex(format!("[0-9_][a-z.]{{0,{name}}}")),
                    1 => Just("service.name".to_string()),
                    1 => Just("service.namespace".to_string()),
                    1 => Just("service.instance.id".to_string()),
                    1 => Just(String::new()),
                ];
                let text = prop_oneof![
                    40 => regex(format!("[a-z]{{0,{}}}", value / 2 - 1)),
                    1 => regex(format!("[a-z]{{{},{}}}", value / 2, value + 2)),
                ];
                let any_value = prop_oneof![
                    40 => text.clone().prop_map(Any::StringValue),
                    1 => any::<i64>().prop_map(Any::IntValue),
                    1 => any::<f64>().prop_map(Any::DoubleValue),
                    1 => any::<bool>().prop_map(Any::BoolValue),
                    1 => proptest::collection::vec(any::<u8>(), 0..(value as usize))
                        .prop_map(Any::BytesValue),
                ];
                let attribute = (key, any_value).prop_map(|(key, value)| common::KeyValue {
                    key,
                    value: Some(common::AnyValue { value: Some(value) }),
                });
                let near = labels as usize - 4..labels as usize;
                let count = prop_oneof![0..labels as usize, near];
                let scope_attributes = proptest::collection::vec(attribute.clone(), 0..4);
                let attributes = count.prop_flat_map(move |count| {
                    proptest::collection::vec(attribute.clone(), count)
                });
                let identity = |key: &'static str| {
                    proptest::option::of(text.clone().prop_map(move |value| kv(key, &value)))
                };
                let resource = (
                    attributes.clone(),
                    identity("service.name"),
                    identity("service.namespace"),
                    identity("service.instance.id"),
                )
                    .prop_map(|(mut attributes, name, namespace, instance)| {
                        attributes.extend([name, namespace, instance].into_iter().flatten());
                        attributes
                    });
                let time = prop_oneof![
                    20 => Just(POINT_NS),
                    1 => Just((NOW_MS as u64 + 20 * 60 * 1000) * 1_000_000),
                    1 => Just((NOW_MS as u64 - 3 * 3600 * 1000) * 1_000_000),
                ];
                let metric_name = move || regex(format!("[a-z][a-z.]{{0,{}}}", value + 2));
                let gauge_metric = (
                    metric_name(),
                    proptest::collection::vec((attributes.clone(), time), 1..3),
                )
                    .prop_map(|(name, points)| {
                        let points = points
                            .into_iter()
                            .map(|(attributes, time)| point(attributes, time))
                            .collect();
                        gauge(&name, points)
                    });
                // Scales above 8 too, which the translation brings down; zero buckets, which
                // it leaves out or keeps in a span.
                let counts = proptest::collection::vec(prop_oneof![Just(0u64), 1u64..5], 0..14);
                let exponential_metric = (metric_name(), -2i32..11, -4i32..4, counts).prop_map(
                    |(name, scale, offset, counts)| {
                        let mut metric = exponential(&name, scale, counts);
                        if let Some(Data::ExponentialHistogram(h)) = &mut metric.data {
                            if let Some(positive) = &mut h.data_points[0].positive {
                                positive.offset = offset;
                            }
                        }
                        metric
                    },
                );
                // Classic histograms, which a tenant may have made native ones.
                let classic_counts =
                    proptest::collection::vec(prop_oneof![Just(0u64), 1u64..5], 0..14);
                let classic_metric = (metric_name(), classic_counts)
                    .prop_map(|(name, counts)| classic(&name, counts));
                let metric = prop_oneof![
                    3 => gauge_metric,
                    1 => exponential_metric,
                    1 => classic_metric
                ];
                // An instrumentation scope, which a tenant may promote to labels: a name (or
                // none, which promotes nothing), a version, attributes.
                let scope = proptest::option::of((
                    prop_oneof![Just(String::new()), text.clone()],
                    prop_oneof![Just(String::new()), text.clone()],
                    scope_attributes,
                ));
                (resource, proptest::collection::vec(metric, 1..3), scope).prop_map(
                    move |(resource, metrics, scope)| {
                        let mut request = export(resource, metrics);
                        request.resource_metrics[0].scope_metrics[0].scope =
                            scope.map(|(name, version, attributes)| common::InstrumentationScope {
                                name,
                                version,
                                attributes,
                                dropped_attributes_count: 0,
                            });
                        (request, limits)
                    },
                )
            })
    }

    /// Exports whose exemplars sit at the edges of Mimir's exemplar checks: sums', classic
    /// histograms' (bounds 1 and 10) and exponential histograms' points, with exemplars with
    /// or without ids and attributes, at times around the window's edges and under a
    /// millisecond, up to three a point; and the tenant's limits.
    fn exemplar_strategy() -> impl Strategy<Value = (ExportMetricsServiceRequest, ValidationLimits)>
    {
        const MINUTE: u64 = 60_000_000_000;
        let now = NOW_MS as u64 * 1_000_000;
        let time = prop::sample::select(vec![
            POINT_NS,
            POINT_NS - 5 * MINUTE + 1_000_000,
            POINT_NS - 5 * MINUTE - 1_000_000,
            POINT_NS - 9 * MINUTE,
            now + 9 * MINUTE,
            now + 10 * MINUTE,
            now + 10 * MINUTE + 1_000_000,
            999_999,
            1_000_000,
            0,
            u64::MAX,
        ]);
        let id = prop::sample::select(vec![vec![], vec![0u8; 8], vec![7u8; 8]]);
        let attributes = prop::sample::select(vec![
            vec![],
            vec![kv("user", "a")],
            vec![kv("user", "")],
            vec![kv("", "a")],
            vec![kv("note", &"n".repeat(130))],
        ]);
        let value = prop::sample::select(vec![0.5, 5.0, 50.0, f64::NAN]);
        let one = (time, id.clone(), id, attributes, value).prop_map(
            |(time, span, trace, attributes, value)| metrics::Exemplar {
                time_unix_nano: time,
                span_id: span,
                trace_id: trace,
                filtered_attributes: attributes,
                value: Some(metrics::exemplar::Value::AsDouble(value)),
            },
        );
        // A point a millisecond after the epoch opens the window before it.
        let point_time = prop::sample::select(vec![POINT_NS, POINT_NS - 4 * MINUTE, 1_000_000]);
        let point = (0..3u8, point_time, prop::collection::vec(one, 0..4));
        let cumulative = metrics::AggregationTemporality::Cumulative as i32;
        let metric = point.prop_map(move |(kind, time, exemplars)| {
            let data = match kind {
                0 => Data::Sum(metrics::Sum {
                    data_points: vec![metrics::NumberDataPoint {
                        time_unix_nano: time,
                        exemplars,
                        value: Some(metrics::number_data_point::Value::AsDouble(1.0)),
                        ..Default::default()
                    }],
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                1 => Data::Histogram(metrics::Histogram {
                    data_points: vec![metrics::HistogramDataPoint {
                        time_unix_nano: time,
                        count: 3,
                        bucket_counts: vec![1, 1, 1],
                        explicit_bounds: vec![1.0, 10.0],
                        exemplars,
                        ..Default::default()
                    }],
                    aggregation_temporality: cumulative,
                }),
                _ => Data::ExponentialHistogram(metrics::ExponentialHistogram {
                    data_points: vec![metrics::ExponentialHistogramDataPoint {
                        time_unix_nano: time,
                        count: 1,
                        zero_count: 1,
                        exemplars,
                        ..Default::default()
                    }],
                    aggregation_temporality: cumulative,
                }),
            };
            metrics::Metric {
                name: "m".into(),
                data: Some(data),
                ..Default::default()
            }
        });
        let limits = (0u32..3, any::<bool>()).prop_map(|(per_series, past)| ValidationLimits {
            max_global_exemplars_per_user: 1000,
            max_exemplars_per_series_per_request: per_series,
            past_grace_period: if past {
                Duration::from_secs(420)
            } else {
                Duration::ZERO
            },
            ..Default::default()
        });
        (prop::collection::vec(metric, 1..4), limits).prop_map(|(metrics, limits)| {
            (export(vec![kv("service.name", "api")], metrics), limits)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The scan's bounds never pass an export with an exemplar Mimir's checks cut: when
        /// `exemplars_may_fail` says no, the checks, run on every exemplar, cut none. The push
        /// path drops what the checks drop, and, with no point refused, the forwarded export's
        /// exemplars pass the checks again.
        #[test]
        fn the_exemplar_bounds_never_pass_an_exemplar_to_cut(
            (request, limits) in exemplar_strategy()
        ) {
            let validation = validation(limits);
            let raw = request.encode_to_vec();
            let (_, bounds) = otlp::scan_bounded(&raw, &Default::default()).unwrap();
            let mut dropped = DroppedExemplars::default();
            let cuts = exemplar_cuts(&request, &validation, &HashSet::new(), &mut dropped);
            if !exemplars_may_fail(&bounds, &validation) {
                prop_assert!(cuts.is_empty(), "{:?} passed {:?}", bounds, cuts);
            }
            prop_assert_eq!(cuts.len() as u64, dropped.iter().sum::<u64>());
            // The push path judges no exemplar of a point whose series is refused.
            let (edits, _, _) = check(&request, &validation, None);
            let mut dropped = DroppedExemplars::default();
            exemplar_cuts(&request, &validation, &edits.points, &mut dropped);
            let decoded = decode_validated(&raw, 1 << 20, PROTOBUF, &validation).unwrap();
            prop_assert_eq!(decoded.dropped_exemplars, dropped);
            // (A cut point can move the earliest sample, which ages the exemplars.)
            if let (Forward::Rewritten(bytes), None) = (&decoded.forward, &decoded.refused) {
                let again = decode_validated(bytes, 1 << 20, PROTOBUF, &validation).unwrap();
                prop_assert_eq!(again.dropped_exemplars, DroppedExemplars::default());
                prop_assert_eq!(again.counts, decoded.counts);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The bounds never pass an export, or a point, whose translated series fail: when
        /// `may_fail` says no, the series checks of every point translated find nothing, and
        /// the points `check` leaves untranslated are never refused (the oracle translates
        /// every point). And what is forwarded after the cut passes the checks again, with
        /// nothing left to cut.
        #[test]
        fn the_bounds_never_hide_a_failure_and_the_cut_is_complete(
            (request, limits) in strategy(),
            promote in prop_oneof![Just(0u64), any::<u64>()],
            keep in any::<bool>(),
            nhcb in any::<bool>(),
            scope in any::<bool>(),
            suffixes in any::<bool>(),
            names in 0u8..4,
        ) {
            // The tenant promotes some of the resources' attributes (`promote` picks them),
            // keeps the identifying ones or not, converts classic histograms to native ones
            // or not, and promotes scopes or not.
            let promoted = request
                .resource_metrics
                .iter()
                .flat_map(|resource| resource.resource.iter().flat_map(|r| &r.attributes))
                .enumerate()
                .filter(|(index, _)| promote >> (index % 64) & 1 == 1)
                .map(|(_, kv)| kv.key.clone())
                .collect();
            // Names escaped (Mimir's default), kept as sent (with the `utf8` name scheme that
            // comes with it), or escaped with either label-name option off.
            let mut limits = limits;
            if names == 1 {
                limits.name_validation_scheme = runtime_config::validation::NameValidationScheme::Utf8;
            }
            let validation = validation(limits).translating(Some(std::sync::Arc::new(
                runtime_config::OtlpTranslation {
                    promote_otel_resource_attributes: promoted,
                    otel_keep_identifying_resource_attributes: keep,
                    otel_convert_histograms_to_nhcb: nhcb,
                    otel_promote_scope_metadata: scope,
                    otel_metric_suffixes_enabled: suffixes,
                    utf8_names: names == 1,
                    otel_label_name_underscore_sanitization: names != 2,
                    otel_label_name_preserve_multiple_underscores: names != 3,
                    ..Default::default()
                },
            )));
            let raw = request.encode_to_vec();
            let Ok((_, bounds)) = otlp::scan_bounded(&raw, validation.translation()) else {
                // Nothing translates (each metric left out, an attribute key that makes no
                // label name in each): refused whole, before any check.
                let decoded = decode_validated(&raw, 1 << 20, PROTOBUF, &validation);
                let untranslated = matches!(decoded, Err(DecodeError::Untranslated { .. }));
                prop_assert!(untranslated, "{:?}", decoded);
                return Ok(());
            };
            let (every_edit, every_refusal) = check_points(&request, &validation, None, &|_| true);
            let (edits, refused, _) = check(&request, &validation, None);
            prop_assert_eq!(&edits.points, &every_edit.points);
            prop_assert_eq!(&edits.removed, &every_edit.removed);
            prop_assert_eq!(&refused, &every_refusal);
            if !may_fail(&bounds, &validation) {
                prop_assert!(every_edit.is_empty() && every_refusal.is_none(), "{every_refusal:?}");
            }
            let decoded = decode_validated(&raw, 1 << 20, PROTOBUF, &validation).unwrap();
            // Refused by a check, or answered 400 for metrics the translator left out.
            prop_assert_eq!(
                decoded.refused.is_some(),
                refused.is_some() || decoded.untranslated > 0
            );
            if let Forward::Rewritten(bytes) = &decoded.forward {
                let kept = ExportMetricsServiceRequest::decode(&bytes[..]).unwrap();
                let (again, refused, _) = check(&kept, &validation, None);
                prop_assert!(again.is_empty() && refused.is_none(), "{refused:?}");
                // Each point forwarded is the series it was sent as, as the checks saw it (a
                // cut `target_info` takes no promoted label from its resource's points).
                let settings = validation.translation();
                let drops = |name: &str| validation.drops(name.as_bytes());
                let series = |request: &ExportMetricsServiceRequest, cut: &HashSet<Place>| {
                    let mut series: Vec<_> = translate::translate(request, settings, &drops, &|_| true)
                        .into_iter()
                        .filter(|t| matches!(t.place, Place::Point { .. }) && !cut.contains(&t.place))
                        .flat_map(|t| as_checked(&t, &validation).series)
                        .collect();
                    series.sort();
                    series
                };
                prop_assert_eq!(series(&request, &edits.points), series(&kept, &HashSet::new()));
                // What is forwarded is charged, and the metadata entries of the export as
                // sent: a metric cut whole keeps its entries, as in Mimir.
                let forwarded = otlp::count(&kept, validation.translation()).unwrap();
                let sent = otlp::count(&request, validation.translation()).unwrap();
                let refused_entries = decoded.refused.as_ref().map_or(0, |r| r.samples.metadata());
                prop_assert_eq!(
                    WriteCounts { metadata: sent.metadata - refused_entries, ..forwarded },
                    decoded.counts
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The bounds never pass a metadata entry Mimir's checks refuse: when
        /// `metadata_may_fail` says no, every entry passes. Whatever they say, each refused
        /// entry is taken from the charge and counted by reason, and the export, whose
        /// series all pass, goes on as sent. Names and units around a short limit: units
        /// the translator names longer (`us`, `/s`), in braces (left out), with spaces,
        /// `_`, characters it replaces, and a second `/`.
        #[test]
        fn the_metadata_bounds_never_pass_an_entry_to_refuse(
            (request, max) in metadata_strategy(),
            suffixes in any::<bool>(),
            utf8 in any::<bool>(),
        ) {
            let limits = ValidationLimits { max_metadata_length: max, ..Default::default() };
            // Family names with suffixes (the unit's words, `_total`, `_ratio`) or not,
            // escaped or kept as sent.
            let validation = validation(limits).translating(Some(std::sync::Arc::new(
                runtime_config::OtlpTranslation {
                    otel_metric_suffixes_enabled: suffixes,
                    utf8_names: utf8,
                    ..Default::default()
                },
            )));
            let raw = request.encode_to_vec();
            let (counts, bounds) = otlp::scan_bounded(&raw, validation.translation()).unwrap();
            // The checks on every entry, whatever the bounds say.
            let (mut every, mut every_refused) = (counts, None);
            refuse_metadata(&request, &validation, &mut every, &mut every_refused);
            if !metadata_may_fail(&bounds, &validation) {
                prop_assert!(every_refused.is_none(), "{:?} passed {:?}", bounds, every_refused);
            }
            let decoded = decode_validated(&raw, 1 << 20, PROTOBUF, &validation).unwrap();
            prop_assert_eq!(&decoded.refused, &every_refused);
            prop_assert_eq!(&decoded.counts, &every);
            let refused = every_refused.as_ref().map_or(0, |r| r.samples.metadata());
            prop_assert_eq!(every.metadata + refused, counts.metadata);
            prop_assert_eq!(every_refused.as_ref().map_or(0, |r| r.series), 0);
            prop_assert_eq!(&decoded.forward, &Forward::Unchanged);
        }
    }

    fn metadata_strategy() -> impl Strategy<Value = (ExportMetricsServiceRequest, u32)> {
        use proptest::string::string_regex;
        // Limits over `UNIT_GROWTH`, so a name near the limit is judged by its own bound.
        (20u32..40).prop_flat_map(|max| {
            let regex = |pattern: String| string_regex(&pattern).unwrap();
            let part = prop_oneof![
                Just("s".to_string()),
                Just("us".to_string()),
                Just("1".to_string()),
                Just("%".to_string()),
                Just("mo".to_string()),
                Just(" s ".to_string()),
                regex(format!("[a-zA-Z_é. ]{{0,{}}}", max + 4)),
                regex(format!("\\{{[a-z]{{0,{}}}\\}}", max + 4)),
            ];
            let unit = prop_oneof![
                Just(String::new()),
                part.clone(),
                (part.clone(), part.clone()).prop_map(|(a, b)| format!("{a}/{b}")),
                (part.clone(), part.clone(), part).prop_map(|(a, b, c)| format!("{a}/{b}/{c}")),
            ];
            let name = regex(format!("[a-z0-9][a-z0-9._]{{0,{}}}", max + 2));
            let metric = (name, unit).prop_map(|(name, unit)| metrics::Metric {
                unit,
                ..gauge(&name, vec![point(Vec::new(), POINT_NS)])
            });
            (proptest::collection::vec(metric, 1..4), Just(max))
                .prop_map(|(metrics, max)| (export(vec![kv("service.name", "a")], metrics), max))
        })
    }
}
