//! The properties the fuzz targets check (`fuzz/`, run by `scripts/fuzz` under AFL++), here so
//! that `tests/fuzz_corpus.rs` replays every committed corpus input through the same code in
//! `cargo test`. Each function takes untrusted bytes and panics when a property fails; a panic
//! is what the fuzzer reports as a crash.
//!
//! - [`remote_write_v1`], [`remote_write_v2`]: the zero-copy scans against a full prost decode
//!   with the protocols' own types. They must agree on accept and reject and on every count;
//!   the only refusals a decode does not make are weir's documented rules, which are checked
//!   on the decoded request independently.
//! - [`otlp_scan`]: the zero-copy OTLP scan against a full prost decode counted by
//!   [`otlp::count`]: the same counts or the same refusal, and every body prost refuses is
//!   refused.
//! - [`snappy`]: decompression within the size limit never panics and never exceeds it.
//! - [`overrides`]: the runtime config parser; what it accepts renders and parses again.
//! - [`tenant`]: tenant IDs; what is accepted follows Mimir's rules.
//! - [`gossip`]: peer usage reports and member state (untrusted network input); what is
//!   accepted is bounded.
//! - [`usage_report`]: the usage report decoder: a bad line is skipped alone, and what is
//!   accepted re-encodes to the same entries.
//! - [`admission`]: the admission API's JSON and protobuf requests, and client limit specs.
//!
//! No input may make one allocation over [`MAX_ALLOCATION`] (`CappedAllocator`, with the
//! `fuzzing` feature: the fuzz targets and the corpus replay install it).

#[cfg(feature = "fuzzing")]
use std::alloc::{GlobalAlloc, Layout, System};
#[cfg(feature = "fuzzing")]
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::encoding::{decode_key, skip_field, DecodeContext};
use prost::Message;

use crate::counts::{DecodeError, WriteCounts};
use crate::format::{self, Format};
use crate::otlp;
use crate::remote_write::{self, prompb, v2_proto};

/// The most one allocation may take while a property runs on one input. Inputs are at most
/// 1 MiB (AFL's cap) and every decoder works within weir's limits (1 MiB decompressed in
/// [`snappy`]), so a larger allocation is input-driven amplification: a bug.
pub const MAX_ALLOCATION: usize = 64 << 20;

/// The system allocator, keeping the largest allocation seen. With `abort` set (the fuzz
/// targets), an allocation over [`MAX_ALLOCATION`] aborts, which the fuzzer records as a
/// crash; the corpus replay in `cargo test` reads [`CappedAllocator::largest`] instead. Only with
/// the `fuzzing` feature, so the library does not ship an unsafe allocator it never uses.
#[cfg(feature = "fuzzing")]
pub struct CappedAllocator {
    pub abort: bool,
    largest: AtomicUsize,
}

#[cfg(feature = "fuzzing")]
impl CappedAllocator {
    pub const fn new(abort: bool) -> Self {
        CappedAllocator {
            abort,
            largest: AtomicUsize::new(0),
        }
    }

    /// The largest allocation so far, in bytes.
    pub fn largest(&self) -> usize {
        self.largest.load(Ordering::Relaxed)
    }

    fn note(&self, size: usize) {
        self.largest.fetch_max(size, Ordering::Relaxed);
        if self.abort && size > MAX_ALLOCATION {
            std::process::abort();
        }
    }
}

// SAFETY: every call is passed on to `System` unchanged; only sizes are read.
#[cfg(feature = "fuzzing")]
unsafe impl GlobalAlloc for CappedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

/// The 1.0 scan against `prometheus.WriteRequest` decoded by prost.
pub fn remote_write_v1(data: &[u8]) {
    let scanned = remote_write::scan(data);
    let decoded = prompb::WriteRequest::decode(data);
    match (scanned, decoded) {
        (Ok(counts), Ok(request)) => assert_eq!(counts, request.counts()),
        (Ok(counts), Err(err)) => {
            panic!("the scan accepted ({counts:?}) what prost refuses: {err}")
        }
        (Err(err), Ok(_)) => assert!(
            v1_rules_refuse(data),
            "the scan refused what prost accepts, and no rule of weir's refuses it: {err}"
        ),
        (Err(_), Err(_)) => {}
    }
}

/// weir's 1.0 rule beyond the protocol: fields 4 and 5 (2.0's symbols and series) are
/// refused rather than skipped, so a 2.0 body never passes uncharged. (A series with no
/// labels is not refused: it counts for nothing, as Mimir's distributor drops it.)
fn v1_rules_refuse(data: &[u8]) -> bool {
    top_level_tags(data).any(|tag| tag == 4 || tag == 5)
}

/// The 2.0 scan against `io.prometheus.write.v2.Request` decoded by prost, counted as Mimir
/// counts (metadata once per metric family).
pub fn remote_write_v2(data: &[u8]) {
    let scanned = remote_write::v2::scan(data);
    let decoded = v2_proto::Request::decode(data);
    match (scanned, decoded) {
        (Ok(counts), Ok(request)) => {
            assert!(
                v2_rules(data, &request).is_ok(),
                "the scan accepted what weir's 2.0 rules refuse"
            );
            assert_eq!(counts, expected_v2(&request));
        }
        (Ok(counts), Err(err)) => {
            panic!("the scan accepted ({counts:?}) what prost refuses: {err}")
        }
        (Err(err), Ok(request)) => assert!(
            v2_rules(data, &request).is_err(),
            "the scan refused what prost accepts, and no rule of weir's refuses it: {err}"
        ),
        (Err(_), Err(_)) => {}
    }
}

/// The remote-write 2.0 specification's rules a decoder does not check: `symbols[0]` is the
/// empty string; every reference is in range; label references come in pairs. And weir's:
/// fields 1–3 (1.0's) are refused. (A series with no labels is not refused: it counts for
/// nothing, as Mimir's distributor drops it.)
fn v2_rules(data: &[u8], request: &v2_proto::Request) -> Result<(), String> {
    if top_level_tags(data).any(|tag| (1..=3).contains(&tag)) {
        return Err("1.0 fields".into());
    }
    if request
        .symbols
        .first()
        .is_some_and(|first| !first.is_empty())
    {
        return Err("symbols[0] is not empty".into());
    }
    let in_range = |reference: u32| (reference as usize) < request.symbols.len();
    for series in &request.timeseries {
        if series.labels_refs.len() % 2 == 1 || !series.labels_refs.iter().all(|&r| in_range(r)) {
            return Err("labels_refs".into());
        }
        for exemplar in &series.exemplars {
            if exemplar.labels_refs.len() % 2 == 1
                || !exemplar.labels_refs.iter().all(|&r| in_range(r))
            {
                return Err("exemplar labels_refs".into());
            }
        }
        if let Some(metadata) = &series.metadata {
            if !in_range(metadata.help_ref) || !in_range(metadata.unit_ref) {
                return Err("metadata refs".into());
            }
        }
    }
    Ok(())
}

/// What Mimir charges for a decoded 2.0 request (its rules already hold); also the reference
/// of the 2.0 scan's unit tests.
pub(crate) fn expected_v2(request: &v2_proto::Request) -> WriteCounts {
    let mut families = std::collections::HashSet::new();
    let mut counts = WriteCounts::default();
    let symbol = |i: u32| request.symbols[i as usize].as_str();
    for series in &request.timeseries {
        // Mimir's distributor drops a series with no labels.
        if series.labels_refs.is_empty() {
            continue;
        }
        counts.series += 1;
        counts.samples += series.samples.len() as u64;
        counts.histograms += series.histograms.len() as u64;
        counts.exemplars += series.exemplars.len() as u64;
        let Some(metadata) = &series.metadata else {
            continue;
        };
        let name = series
            .labels_refs
            .chunks(2)
            .find(|pair| symbol(pair[0]) == "__name__")
            .map(|pair| symbol(pair[1]))
            .unwrap_or("");
        let says_something = metadata.r#type != 0
            || !symbol(metadata.help_ref).is_empty()
            || !symbol(metadata.unit_ref).is_empty();
        if says_something
            && !name.is_empty()
            && families.insert(metric_family(name, metadata.r#type()))
        {
            counts.metadata += 1;
        }
    }
    counts
}

/// The metric family of a series called `name` whose metadata has type `metric_type`, from
/// the OpenMetrics series forms that Mimir's metadata normalisation undoes: a histogram's
/// series are `<family>_bucket`, `_count` and `_sum`, a gauge histogram's `_bucket`, `_gcount`
/// and `_gsum`, a summary's `_count` and `_sum`; any other series name is its own family.
/// Written apart from `remote_write::v2::family`, which this oracle checks: it reads the word
/// after the last `_`.
fn metric_family(name: &str, metric_type: v2_proto::metadata::MetricType) -> &str {
    use v2_proto::metadata::MetricType;
    let forms: &[&str] = match metric_type {
        MetricType::Histogram => &["bucket", "count", "sum"],
        MetricType::Gaugehistogram => &["bucket", "gcount", "gsum"],
        MetricType::Summary => &["count", "sum"],
        _ => &[],
    };
    match name.rsplit_once('_') {
        Some((family, form)) if forms.contains(&form) => family,
        _ => name,
    }
}

/// The field numbers at the top level of a message that prost has accepted.
fn top_level_tags(mut data: &[u8]) -> impl Iterator<Item = u32> + '_ {
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        let (tag, wire_type) = decode_key(&mut data).ok()?;
        skip_field(wire_type, tag, &mut data, DecodeContext::default()).ok()?;
        Some(tag)
    })
}

/// The OTLP scan against `ExportMetricsServiceRequest` decoded by prost and counted by
/// [`otlp::count`]. Where prost decodes, the two give the same answer: the same counts, or
/// the same refusal word for word (Mimir's "nothing in the request can be ingested", which
/// lists each refused metric). Where prost refuses, the scan refuses too, as invalid
/// protobuf; only the wording of that error differs (the scan names the field its own way).
///
/// And Mimir's series checks on it ([`crate::otlp_checks`]) under tight limits, so that most
/// inputs take their cold path: no panic; a rewritten export decodes, carries no more than
/// the request did, and passes the checks itself. And the exemplars cut on the wire
/// ([`otlp::edit::without_exemplars`]) are those a decode clears.
pub fn otlp_scan(data: &[u8]) {
    let default = runtime_config::OtlpTranslation::default();
    let scanned = otlp::scan(data, &default);
    match otlp::proto::ExportMetricsServiceRequest::decode(data) {
        Ok(request) => {
            assert_eq!(scanned, otlp::count(&request, &default));
            // And under each translation setting that changes the charge; with the same
            // metrics left out of what is translated.
            for settings in [default.clone()].into_iter().chain(conversions()) {
                let scanned = otlp::scan_bounded(data, &settings);
                let counted = otlp::count_left_out(&request, &settings);
                match (scanned, counted) {
                    (Ok((counts, bounds)), Ok((reference, left_out))) => {
                        assert_eq!(counts, reference, "under {settings:?}");
                        assert_eq!(bounds.left_out, left_out.len() as u64, "{settings:?}");
                    }
                    (scanned, counted) => assert_eq!(
                        scanned.map(|(counts, _)| counts),
                        counted.map(|(counts, _)| counts),
                        "under {settings:?}"
                    ),
                }
            }
            otlp_checks(data);
            otlp_relabelling(data, &request);
            // Exemplars cut on the wire are those a decode clears.
            let mut cleared = request.clone();
            let had = otlp::edit::clear_exemplars(&mut cleared);
            // (A cut on the wire may find exemplars a decode never sees: those of a data
            // field a later one of the metric's oneof replaces. Compared as encoded, since a
            // NaN bound is not equal to itself.)
            match otlp::edit::without_exemplars(data).expect("what decodes, the cut walks") {
                Some(cut) => {
                    let decoded = otlp::proto::ExportMetricsServiceRequest::decode(&cut[..]);
                    assert_eq!(
                        decoded.expect("the cut export decodes").encode_to_vec(),
                        cleared.encode_to_vec(),
                        "the cut export is the request without its exemplars"
                    );
                }
                None => assert!(!had, "exemplars left on the wire"),
            }
        }
        Err(err) => {
            let invalid = |message: &str| message.starts_with("invalid protobuf: ");
            assert!(
                matches!(&scanned, Err(DecodeError::Otlp(message)) if invalid(message)),
                "the scan gave {scanned:?} for what prost refuses: {err}"
            );
        }
    }
}

/// The translation settings that change what an export is charged: classic histograms as
/// native ones (`otel_convert_histograms_to_nhcb`), delta temporality taken
/// (`otel_native_delta_ingestion`), names with suffixes (`otel_metric_suffixes_enabled`, which
/// decide the metadata families and the names refused), all three, and names kept as sent
/// (`name_validation_scheme: utf8`), without suffixes and with all three.
fn conversions() -> [runtime_config::OtlpTranslation; 6] {
    let with = |nhcb, delta, suffixes| runtime_config::OtlpTranslation {
        otel_convert_histograms_to_nhcb: nhcb,
        otel_native_delta_ingestion: delta,
        otel_metric_suffixes_enabled: suffixes,
        ..Default::default()
    };
    let utf8 = |settings| runtime_config::OtlpTranslation {
        utf8_names: true,
        ..settings
    };
    [
        with(true, false, false),
        with(false, false, true),
        with(false, true, false),
        utf8(with(false, false, false)),
        utf8(with(true, true, true)),
        with(true, true, true),
    ]
}

fn otlp_checks(data: &[u8]) {
    let limits = runtime_config::ValidationLimits {
        max_label_names_per_series: 6,
        max_label_name_length: 12,
        max_label_value_length: 24,
        max_native_histogram_buckets: 3,
        reduce_native_histogram_over_max_buckets: true,
        ..Default::default()
    };
    let mimir = runtime_config::OtlpTranslation::default();
    otlp_checks_under(data, limits, &mimir);
    // A tenant that keeps exemplars, at most one a series: Mimir's exemplar checks.
    let exemplars = runtime_config::ValidationLimits {
        max_global_exemplars_per_user: 1000,
        max_exemplars_per_series_per_request: 1,
        ..limits
    };
    otlp_checks_under(data, exemplars, &mimir);
    // And one whose classic histograms become native ones (custom buckets, which cannot be
    // lowered to fit the bucket limit), delta temporality taken, scopes promoted to labels.
    let [.., both] = conversions();
    let scoped = runtime_config::OtlpTranslation {
        otel_promote_scope_metadata: true,
        ..both
    };
    otlp_checks_under(data, exemplars, &scoped);
    // And one whose names are kept as sent (`name_validation_scheme: utf8`), with suffixes.
    let utf8 = runtime_config::OtlpTranslation {
        utf8_names: true,
        ..scoped
    };
    let utf8_limits = runtime_config::ValidationLimits {
        name_validation_scheme: runtime_config::validation::NameValidationScheme::Utf8,
        ..exemplars
    };
    otlp_checks_under(data, utf8_limits, &utf8);
}

fn otlp_checks_under(
    data: &[u8],
    limits: runtime_config::ValidationLimits,
    settings: &runtime_config::OtlpTranslation,
) {
    use crate::counts::Forward;
    // Points stamped from 2023 to 2025 pass the time checks; others are refused.
    let validation = crate::remote_write::validate::Validation::new(limits, 1_720_000_000_000)
        .translating(Some(std::sync::Arc::new(settings.clone())));
    let check = |body: &[u8]| {
        crate::otlp_checks::decode_validated(body, 1 << 24, otlp::OtlpFormat::PROTOBUF, &validation)
    };
    let Ok(decoded) = check(data) else {
        return;
    };
    if let Forward::Rewritten(bytes) = &decoded.forward {
        let again = check(bytes).expect("a rewritten export decodes");
        // A metadata entry refused stays refused: the export keeps its metric's series.
        let series_refused = again
            .refused
            .as_ref()
            .map(|r| (r.series, r.samples.samples()));
        assert_eq!(
            series_refused.unwrap_or_default(),
            (0, 0),
            "a rewritten export's series pass the checks"
        );
        // (A cut point can move the request's earliest sample, which ages exemplars.)
        if decoded.refused.is_none() {
            assert!(
                again.dropped_exemplars.iter().all(|&n| n == 0),
                "a rewritten export's exemplars pass the checks"
            );
        }
        let items = |counts: &crate::counts::WriteCounts| counts.samples + counts.histograms;
        let before = otlp::scan(data, validation.translation()).expect("it decoded");
        assert!(items(&decoded.counts) <= items(&before));
    }
}

/// A tenant's relabelling rules on an export ([`crate::otlp_relabel`]): rules that keep or drop
/// by name alone judge each point a name at a time as they do series by series; and rules
/// that only drop, by name or by `le` and `quantile`, never charge more than no rules, and
/// what they forward decodes.
fn otlp_relabelling(data: &[u8], request: &otlp::proto::ExportMetricsServiceRequest) {
    use crate::otlp_relabel;
    use crate::remote_write::relabel::Relabelling;
    let rules = |yaml: &str| {
        let configs: Vec<runtime_config::relabel::RuleConfig> =
            serde_yaml_ng::from_str(yaml).expect("the rules parse");
        Relabelling {
            rules: std::sync::Arc::new(runtime_config::Relabel::new(configs).expect("they load")),
            tenant: std::sync::Arc::from("t"),
        }
    };
    let settings = runtime_config::OtlpTranslation::default();
    let by_name = rules(
        "- source_labels: [__name__]\n  regex: '[a-m].*|.*_sum|target_info'\n  action: drop\n",
    );
    // Names escaped, and kept as sent with suffixes.
    let utf8 = runtime_config::OtlpTranslation {
        utf8_names: true,
        otel_metric_suffixes_enabled: true,
        ..Default::default()
    };
    for names in [&settings, &utf8] {
        let slow = otlp_relabel::every_series(request, &by_name, names, None);
        match otlp_relabel::by_name(request, &by_name, names) {
            Some(fast) => {
                assert_eq!(
                    fast.dropped, slow.dropped,
                    "judged by name as series by series"
                );
                assert!(
                    slow.changed.is_empty(),
                    "a point partly dropped, judged whole by name"
                );
            }
            None => assert!(
                slow.changed.values().any(|(_, dropped)| *dropped > 0),
                "judged partly dropped by name, whole series by series"
            ),
        }
    }
    let by_bucket = rules(
        "- source_labels: [le, quantile]\n  regex: '0\\.5;|;0\\.5|\\+Inf;'\n  action: drop\n",
    );
    let validation = crate::remote_write::validate::Validation::new(
        runtime_config::ValidationLimits::default(),
        1_720_000_000_000,
    );
    let check = |validation: &crate::remote_write::validate::Validation, body: &[u8]| {
        crate::otlp_checks::decode_validated(body, 1 << 24, otlp::OtlpFormat::PROTOBUF, validation)
    };
    let Ok(plain) = check(&validation, data) else {
        return;
    };
    let items = |counts: &crate::counts::WriteCounts| counts.samples + counts.histograms;
    let refused = plain
        .refused
        .as_ref()
        .map_or(0, |refused| refused.samples.samples());
    // Rules that drop whole points leave the others checked as they were, so charge no more
    // of them; rules that drop some of a point's series leave the rest to be checked alone,
    // which may pass a point the checks refused whole: no more than the export carried.
    // (Metadata is left out: a point refused whole takes its metric's entry with it, one its
    // rules dropped does not, as Mimir keeps the entries of series its rules drop.)
    for (relabelling, most) in [
        (by_name, items(&plain.counts)),
        (by_bucket, items(&plain.counts) + refused),
    ] {
        let relabelled = validation.clone().relabelling(Some(relabelling));
        let decoded = check(&relabelled, data).expect("what passes without rules passes with");
        assert!(
            items(&decoded.counts) <= most,
            "dropping charged more: {:?} against {:?}",
            decoded.counts,
            plain.counts
        );
        if let crate::counts::Forward::Rewritten(bytes) = &decoded.forward {
            check(&relabelled, bytes).expect("a rewritten export decodes");
        }
    }
}

/// Snappy and the size limit: no panic, and nothing larger than the limit is ever scanned.
pub fn snappy(data: &[u8]) {
    const LIMIT: usize = 1 << 20;
    for format in [Format::V1, Format::V2] {
        let result = format::decode(data, LIMIT, format);
        if let Ok(size) = snap::raw::decompress_len(data) {
            if size > LIMIT {
                assert!(
                    matches!(result, Err(DecodeError::TooLarge { .. })),
                    "{size} bytes decompressed passed a limit of {LIMIT}"
                );
            }
        }
    }
}

/// The runtime config parser: no panic; what it accepts renders (as `/runtime_config?mode=diff`
/// shows it) to YAML that it accepts again and renders the same.
pub fn overrides(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let defaults = runtime_config::Defaults::default();
    let Ok(config) = runtime_config::RuntimeConfig::parse(text, defaults) else {
        return;
    };
    let rendered = config.render(runtime_config::RenderMode::Diff);
    let again = runtime_config::RuntimeConfig::parse(&rendered, defaults)
        .unwrap_or_else(|err| panic!("a rendered config does not parse: {err}\n{rendered}"));
    assert_eq!(
        again.render(runtime_config::RenderMode::Diff),
        rendered,
        "rendering is not stable"
    );
}

/// Tenant IDs: no panic; an accepted ID follows Mimir's rules.
pub fn tenant(data: &[u8]) {
    if let Ok(name) = crate::tenant::resolve(Some(data), None) {
        assert!((1..=150).contains(&name.len()), "{name:?}");
        assert!(name != "." && name != "..", "{name:?}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!-_.*'()".contains(&b)),
            "{name:?}"
        );
    }
}

/// Peer usage reports and member state, as gossip delivers them: no panic; what is accepted
/// is within the bounds (the report decoder in depth: [`usage_report`]).
pub fn gossip(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ring::MemberState::parse(Some(text));
    if let Ok(report) = ring::usage::decode(text) {
        usage_entries_in_bounds(&report.entries);
    }
}

fn usage_entries_in_bounds(entries: &[ring::UsageEntry]) {
    for entry in entries {
        assert!(entry.requests <= 1 << 53 && entry.items <= 1 << 53 && entry.in_flight <= 1 << 53);
        for level in [entry.requests_level, entry.items_level]
            .into_iter()
            .flatten()
        {
            assert!(level.is_finite() && level.abs() <= 1e15, "{level}");
        }
    }
}

/// The usage report decoder: no panic; each line is either an entry or a skipped one (so one
/// bad line never costs the others); what is accepted is within the bounds, and encodes to a
/// report that decodes to the same entries with nothing skipped.
pub fn usage_report(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(report) = ring::usage::decode(text) else {
        return;
    };
    let lines = text.split('\n').count() - 1;
    assert_eq!(
        report.entries.len() as u64 + report.skipped_total(),
        lines as u64,
        "every line is an entry or a skipped one"
    );
    assert_eq!(report.first_skipped.is_some(), report.skipped_total() > 0);
    usage_entries_in_bounds(&report.entries);
    let (value, listed) = ring::usage::encode(&report.entries, usize::MAX);
    assert_eq!(listed, report.entries.len());
    let again = ring::usage::decode(&value).expect("an encoded report decodes");
    assert_eq!(again.skipped_total(), 0, "{value:?}");
    assert_eq!(again.entries, report.entries, "{value:?}");
}

/// The admission API's requests: JSON bodies and protobuf messages decode or fail cleanly,
/// and a client's limit spec is validated without panicking.
pub fn admission(data: &[u8]) {
    use crate::grpc::proto::weir::admission::v1 as api;
    let _ = serde_json::from_slice::<crate::admission_http::AllowBody>(data);
    let _ = serde_json::from_slice::<crate::admission_http::AllowBatchBody>(data);
    let _ = serde_json::from_slice::<crate::admission_http::AcquireBody>(data);
    let _ = serde_json::from_slice::<crate::admission_http::LeaseBody>(data);
    if let Ok(request) = api::AllowRequest::decode(data) {
        if let Some(spec) = &request.limit {
            if let Ok(spec) = crate::grpc::spec_from_proto(spec) {
                let _ = spec.resolved().validate();
            }
        }
    }
    let _ = api::AllowBatchRequest::decode(data);
    let _ = api::AcquireRequest::decode(data);
    let _ = crate::grpc::proto::envoy::service::ratelimit::v3::RateLimitRequest::decode(data);
}

/// Tenant authentication's parsers: no panic, and
/// - an `Authorization` value: a bearer token is what follows the scheme, trimmed and not
///   empty; a basic credential re-encodes to a value that reads back the same; anything over
///   8 KiB is malformed;
/// - a credentials file: when accepted, it holds one credential per entry of its
///   `credentials` list, as a generic YAML parse of the same text counts them.
pub fn auth(data: &[u8]) {
    use crate::auth::{parse_authorization, Credentials, Presented};
    use base64::Engine;
    match parse_authorization(Some(data)) {
        Ok(Some(Presented::Bearer(token))) => {
            assert!(data.len() <= 8192);
            let token = std::str::from_utf8(&token).expect("a token read from UTF-8");
            assert!(!token.is_empty() && token.trim() == token, "{token:?}");
        }
        Ok(Some(Presented::Basic { user, password })) => {
            assert!(!user.contains(':'), "{user:?}");
            let mut pair = user.clone().into_bytes();
            pair.push(b':');
            pair.extend_from_slice(&password);
            let again = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(&pair)
            );
            assert_eq!(
                parse_authorization(Some(again.as_bytes())),
                Ok(Some(Presented::Basic { user, password }))
            );
        }
        Ok(None) => panic!("a header was given"),
        Err(_) => {}
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(credentials) = Credentials::parse(text) {
        // A generic parse cannot hold every scalar the typed one reads as a string (an
        // integer past i128, in a name or a tenant): then there is nothing to compare with.
        let Ok(value) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
            return;
        };
        let listed = value
            .get("credentials")
            .and_then(serde_yaml_ng::Value::as_sequence)
            .map_or(0, Vec::len);
        assert_eq!(credentials.len(), listed);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// A YAML double-quoted scalar of `text`: any character, escaped.
    fn quoted(text: &str) -> String {
        serde_yaml_ng::to_string(text)
            .unwrap()
            .trim_end()
            .to_string()
    }

    proptest! {
        /// What `/runtime_config?mode=diff` renders of a tenant's relabelling rules, dropped
        /// labels and delay loads again as the same config, whatever characters they hold.
        #[test]
        fn rendered_tenant_keys_load_again(
            target in "\\PC{1,8}",
            replacement in "(\\PC|\n| ){0,8}",
            separator in "\\PC{0,3}",
            dropped in prop::collection::vec("[a-z_:.\"' ]{1,6}", 0..3),
            delay_ms in 0u64..5_000,
            enabled in any::<bool>(),
        ) {
            let file = format!(
                "overrides:\n  a:\n    drop_labels: [{}]\n    ingestion_artificial_delay: {delay_ms}ms\n    \
                 metric_relabeling_enabled: {enabled}\n    metric_relabel_configs:\n    \
                 - target_label: {}\n      replacement: {}\n      separator: {}\n",
                dropped.iter().map(|name| quoted(name)).collect::<Vec<_>>().join(", "),
                quoted(&target),
                quoted(&replacement),
                quoted(&separator),
            );
            let parsed = runtime_config::RuntimeConfig::parse(&file, runtime_config::Defaults::default());
            // A rule Prometheus would refuse (a target label that is not a label name) is not
            // what this property is about.
            prop_assume!(parsed.is_ok());
            super::overrides(file.as_bytes());
        }
    }
}
