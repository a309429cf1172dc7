//! A zero-copy scan of a protobuf `ExportMetricsServiceRequest`: the charge [`super::count`]
//! gives for a full prost decode, and the same refusals, without building the request.
//!
//! weir forwards an OTLP body as the client sent it, so a decode was only ever needed for the
//! count; this walk reads the wire format in place instead, as the remote-write scans do, and
//! allocates nothing per point (a family name that needs escaping is written once, into a
//! reused buffer, and kept when new). It accepts exactly what prost's generated decoder
//! accepts:
//! - every known field must have its wire type (a repeated number may be packed or not), a
//!   length must fit in what remains, a string must be UTF-8;
//! - nested messages count against prost's recursion limit of 100 (attribute values nest:
//!   an `AnyValue` holds arrays and key-value lists), and so does skipping an unknown field;
//! - unknown fields (groups too) are skipped by prost's rules.
//!
//! What it counts follows the decoded request: where prost merges (a singular message sent
//! twice, the `data` oneof sent twice with one variant), the scan adds up; where prost keeps
//! the last (a scalar or string sent twice, the oneof changing variant), so does the scan.
//! The `otlp_scan` fuzz target and `tests.rs` hold it to [`super::count`] of a prost decode:
//! the same counts, or the same refusal; for a body prost cannot decode only the error's
//! wording differs.

use prost::encoding::{decode_key, decode_varint, WireType};

use super::proto::metrics::AggregationTemporality;
use super::rules::{
    escapes_to_nothing, nothing_ingested, Bounds, Conversion, TargetInfoTimes, TargetKeys,
    TimeRange, DOUBLE_TEXT, LABEL_NAME_INVALID, NOT_CUMULATIVE, NO_DATA, NO_NAME, NO_POINTS,
    SCALE_BELOW_MINUS_4, TARGET_INFO, UNMEASURED,
};
use super::translate::{
    self, is_named, makes_no_label_name, Meta, MetadataEntries, MetricType, Naming,
};
use crate::counts::{DecodeError, WriteCounts};
use runtime_config::OtlpTranslation;

/// How many messages deep prost decodes before it refuses ("recursion limit reached"): the
/// request's own fields are read at this depth left, each nested message at one less.
const RECURSION_LIMIT: u32 = 100;

/// The scan's own errors: what was wrong, where. Built only on the way out.
type Scanned<T> = Result<T, String>;

/// Scans an uncompressed protobuf `ExportMetricsServiceRequest` and counts what Mimir would
/// charge for it under the tenant's translation `settings` ([`super::count`]'s rules),
/// refusing what a prost decode refuses.
pub fn scan(body: &[u8], settings: &OtlpTranslation) -> Result<WriteCounts, DecodeError> {
    scan_bounded(body, settings).map(|(counts, _)| counts)
}

/// [`scan`], with how long the labels of the series the request becomes can get
/// ([`Bounds`]), which the same walk reads on the way.
pub fn scan_bounded(
    body: &[u8],
    settings: &OtlpTranslation,
) -> Result<(WriteCounts, Bounds), DecodeError> {
    let invalid = |err: String| DecodeError::Otlp(format!("invalid protobuf: {err}"));
    let conversion = Conversion::of(settings);
    let mut charge = Charge {
        conversion,
        metadata: MetadataEntries::new(conversion),
        ..Charge::default()
    };
    let mut buf = body;
    let mut index = 0u64;
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf).map_err(invalid)?;
        if tag == 1 {
            let (resource, depth) = message(
                &mut buf,
                wire_type,
                RECURSION_LIMIT,
                "ExportMetricsServiceRequest.resource_metrics",
            )
            .map_err(invalid)?;
            charge
                .resource_metrics(resource, depth)
                .map_err(|err| invalid(format!("resource_metrics[{index}]: {err}")))?;
            index += 1;
        } else {
            skip(&mut buf, wire_type, tag, RECURSION_LIMIT).map_err(invalid)?;
        }
    }
    charge.finish(settings)
}

/// The request's charge so far, metric by metric.
#[derive(Default)]
struct Charge<'a> {
    counts: WriteCounts,
    metadata: MetadataEntries<'a>,
    /// Each refused metric's name and why, in the request's order.
    refused: Vec<(&'a str, &'static str)>,
    bounds: Bounds,
    conversion: Conversion,
    /// Each `target_info` charged: when, what names it (`None`: not told from its
    /// attributes' bytes), and the `Resource` fields of its resource (in `resources`), decoded
    /// only when another `target_info` of the request may have its labels.
    target_infos: Vec<(
        TargetInfoTimes,
        Option<Identity<'a>>,
        std::ops::Range<usize>,
    )>,
    resources: Vec<&'a [u8]>,
}

/// The first `service.namespace`, `service.name` and `service.instance.id` of a resource, as
/// sent: what gives its `target_info` its `job` and `instance`. Two `target_info`s whose
/// `job` and `instance` differ cannot have the same labels.
#[derive(Debug, Default, Clone, Copy)]
struct Identity<'a> {
    namespace: Option<&'a [u8]>,
    name: Option<&'a [u8]>,
    instance: Option<&'a [u8]>,
}

impl Identity<'_> {
    /// A hash of `job` and `instance` as the translator makes them (each only with a value):
    /// the same for the same two, however `job` was written (`service.name` `n/s`, or
    /// `service.namespace` `n` and `service.name` `s`). FNV-1a over their bytes, a byte at a
    /// time, so that the parts of `job` hash as the whole would.
    fn labels(&self) -> u64 {
        fn fnv(hash: u64, bytes: &[u8]) -> u64 {
            bytes.iter().fold(hash, |hash, &b| {
                (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
        }
        let mut hash = 0xcbf2_9ce4_8422_2325;
        match (self.namespace, self.name) {
            (Some(namespace), Some(name)) => {
                hash = fnv(fnv(fnv(fnv(hash, b"j"), namespace), b"/"), name);
            }
            (None, Some(name)) if !name.is_empty() => hash = fnv(fnv(hash, b"j"), name),
            _ => {}
        }
        // A byte no UTF-8 text has between the two.
        hash = fnv(hash, &[0xff]);
        match self.instance {
            Some(instance) if !instance.is_empty() => fnv(fnv(hash, b"i"), instance),
            _ => hash,
        }
    }
}

impl<'a> Charge<'a> {
    fn finish(mut self, settings: &OtlpTranslation) -> Result<(WriteCounts, Bounds), DecodeError> {
        if self.target_infos.len() > 1 {
            self.stamp_target_infos(settings)
                .map_err(|err| DecodeError::Otlp(format!("invalid protobuf: {err}")))?;
        }
        self.counts.metadata = self.metadata.count();
        if self.counts.cost() == 0 && !self.refused.is_empty() {
            let refused: Vec<String> = self
                .refused
                .iter()
                .map(|(name, why)| format!("metric {name:?}: {why}"))
                .collect();
            return Err(nothing_ingested(&refused));
        }
        self.bounds.left_out = self.refused.len() as u64;
        Ok((self.counts, self.bounds))
    }

    /// A request with two `target_info`s or more: each was charged its own samples, but of
    /// two with the same labels the later is charged only the milliseconds the earlier did not
    /// stamp, as Mimir's translator skips those ([`translate::target_infos_stamped`]). Those
    /// whose `job` and `instance` another shares (all, when one's are not told from its bytes)
    /// have their resources decoded for their labels; the rest of the request is not.
    #[cold]
    fn stamp_target_infos(&mut self, settings: &OtlpTranslation) -> Result<(), prost::DecodeError> {
        use prost::Message;
        let named: Option<Vec<_>> = self
            .target_infos
            .iter()
            .map(|(_, identity, _)| identity.as_ref().map(Identity::labels))
            .collect();
        let alike: Vec<bool> = match named {
            Some(named) => {
                let mut seen = std::collections::HashMap::new();
                for labels in &named {
                    *seen.entry(labels).or_insert(0u32) += 1;
                }
                named.iter().map(|labels| seen[labels] > 1).collect()
            }
            None => vec![true; self.target_infos.len()],
        };
        let mut resources = Vec::new();
        for ((stamps, _, fields), _) in self.target_infos.iter().zip(&alike).filter(|(_, &a)| a) {
            let mut resource = super::proto::resource::Resource::default();
            for &field in &self.resources[fields.clone()] {
                resource.merge(field)?;
            }
            resources.push((resource, *stamps));
        }
        let target_infos = resources
            .iter()
            .map(|(resource, stamps)| (&resource.attributes[..], *stamps));
        let own: u64 = resources.iter().map(|(_, stamps)| stamps.samples()).sum();
        let (mut stamped, mut series) = (0u64, 0u64);
        for (samples, new_series) in translate::target_infos_stamped(target_infos, settings) {
            stamped = stamped.saturating_add(samples);
            series += u64::from(new_series);
        }
        self.counts.samples = self.counts.samples.saturating_sub(own - stamped);
        self.counts.series = self
            .counts
            .series
            .saturating_sub(resources.len() as u64 - series);
        Ok(())
    }

    /// `ResourceMetrics`: its metrics, then its `target_info`.
    fn resource_metrics(&mut self, mut buf: &'a [u8], depth: u32) -> Scanned<()> {
        let fields = self.resources.len();
        let mut keys = TargetKeys::default();
        let mut identity = Some(Identity::default());
        let mut times = TimeRange::default();
        while !buf.is_empty() {
            let (tag, wire_type) = key(&mut buf)?;
            match tag {
                1 => {
                    let (resource, depth) =
                        message(&mut buf, wire_type, depth, "ResourceMetrics.resource")?;
                    let seen = (&mut keys, &mut identity);
                    let conversion = self.conversion;
                    resource_attributes(resource, depth, seen, conversion, &mut self.bounds)?;
                    self.resources.push(resource);
                }
                2 => {
                    let (scope, depth) =
                        message(&mut buf, wire_type, depth, "ResourceMetrics.scope_metrics")?;
                    self.scope_metrics(scope, depth, &mut times)?;
                }
                3 => {
                    string(&mut buf, wire_type, "ResourceMetrics.schema_url")?;
                }
                _ => skip(&mut buf, wire_type, tag, depth)?,
            }
        }
        self.target_info(&keys, &times, identity, fields);
        Ok(())
    }

    /// A resource's `target_info`, if it makes one, charged its own samples; its resource
    /// fields (from `fields` on) kept for [`Self::stamp_target_infos`].
    #[inline(never)]
    fn target_info(
        &mut self,
        keys: &TargetKeys,
        times: &TimeRange,
        identity: Option<Identity<'a>>,
        fields: usize,
    ) {
        match TargetInfoTimes::of(keys, times) {
            Err(why) => {
                self.resources.truncate(fields);
                self.refused.push((TARGET_INFO, why));
            }
            Ok(Some(stamps)) => {
                self.counts.series += 1;
                self.counts.samples = self.counts.samples.saturating_add(stamps.samples());
                self.metadata
                    .see(Naming::fixed(TARGET_INFO), Meta::TARGET_INFO);
                self.target_infos
                    .push((stamps, identity, fields..self.resources.len()));
            }
            Ok(None) => self.resources.truncate(fields),
        }
    }

    fn scope_metrics(
        &mut self,
        mut buf: &'a [u8],
        depth: u32,
        times: &mut TimeRange,
    ) -> Scanned<()> {
        let mut scope_attributes = 0u32;
        while !buf.is_empty() {
            let (tag, wire_type) = key(&mut buf)?;
            match tag {
                1 => {
                    let (scope, depth) = message(&mut buf, wire_type, depth, "ScopeMetrics.scope")?;
                    // prost merges a scope sent twice: its attributes add up.
                    scope_attributes = scope_attributes.saturating_add(instrumentation_scope(
                        scope,
                        depth,
                        &mut self.bounds,
                    )?);
                    self.bounds.scope_attributes =
                        self.bounds.scope_attributes.max(scope_attributes);
                }
                2 => {
                    let (metric, depth) =
                        message(&mut buf, wire_type, depth, "ScopeMetrics.metrics")?;
                    self.metric(metric, depth, times)?;
                }
                3 => {
                    let url = string(&mut buf, wire_type, "ScopeMetrics.schema_url")?;
                    self.bounds.scope_value = self.bounds.scope_value.max(url.len());
                }
                _ => skip(&mut buf, wire_type, tag, depth)?,
            }
        }
        Ok(())
    }

    /// `Metric`: its data's points, charged once the whole metric is read (its name, its
    /// temporality and its oneof's final variant can come in any order).
    fn metric(&mut self, mut buf: &'a [u8], depth: u32, times: &mut TimeRange) -> Scanned<()> {
        let (mut name, mut unit, mut help) = ("", &b""[..], &b""[..]);
        let mut data: Option<Data> = None;
        while !buf.is_empty() {
            let (tag, wire_type) = key(&mut buf)?;
            match tag {
                1 => name = text(&mut buf, wire_type, "Metric.name")?,
                2 => help = string(&mut buf, wire_type, "Metric.description")?,
                3 => {
                    unit = string(&mut buf, wire_type, "Metric.unit")?;
                    self.bounds.unit = self.bounds.unit.max(unit.len());
                }
                5 | 7 | 9 | 10 | 11 => {
                    let kind = Kind::of_tag(tag);
                    let (body, depth) = message(&mut buf, wire_type, depth, kind.field())?;
                    // prost merges a variant sent again into the one it has, and starts
                    // afresh when the variant changes.
                    if data.as_ref().is_some_and(|data| data.kind != kind) {
                        data = None;
                    }
                    let conversion = self.conversion;
                    data.get_or_insert_with(|| Data::new(kind, conversion))
                        .add(body, depth, &mut self.bounds)?;
                }
                12 => {
                    let (kv, depth) = message(&mut buf, wire_type, depth, "Metric.metadata")?;
                    key_value(kv, depth)?;
                }
                _ => skip(&mut buf, wire_type, tag, depth)?,
            }
        }
        self.bounds.metric_name = self.bounds.metric_name.max(name.len());
        self.bounds.unusual |= escapes_to_nothing(name.as_bytes());
        if let Some(data) = &data {
            self.bounds.times.cover(&data.times);
        }
        let naming = Naming {
            name,
            // A string the scan has read is UTF-8.
            unit: std::str::from_utf8(unit).unwrap_or_default(),
            counter: data
                .as_ref()
                .is_some_and(|data| data.kind == Kind::Sum && data.monotonic),
            gauge: data.as_ref().is_some_and(|data| data.kind == Kind::Gauge),
        };
        let named = is_named(naming, self.conversion);
        match data.ok_or(NO_DATA).and_then(|data| {
            let kind = data.metric_type();
            let (points, cut) = data.settle(&mut self.counts, times, named)?;
            Ok((points, kind, cut))
        }) {
            Ok((points, kind, cut)) => {
                if points > 0 {
                    self.metadata.see(naming, Meta { kind, unit, help });
                }
                if let Some(why) = cut {
                    self.refused.push((name, why));
                }
            }
            Err(why) => self.refused.push((name, why)),
        }
        Ok(())
    }
}

/// The variant of a metric's `data` oneof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Sum,
    Histogram,
    Exponential,
    Summary,
}

impl Kind {
    fn of_tag(tag: u32) -> Kind {
        match tag {
            5 => Kind::Gauge,
            7 => Kind::Sum,
            9 => Kind::Histogram,
            10 => Kind::Exponential,
            _ => Kind::Summary,
        }
    }

    fn field(self) -> &'static str {
        match self {
            Kind::Gauge => "Metric.gauge",
            Kind::Sum => "Metric.sum",
            Kind::Histogram => "Metric.histogram",
            Kind::Exponential => "Metric.exponential_histogram",
            Kind::Summary => "Metric.summary",
        }
    }
}

/// One metric's data as decoded so far: what its points would charge, before the metric's
/// temporality and scale decide whether it is charged at all.
struct Data {
    kind: Kind,
    points: u64,
    times: TimeRange,
    samples: u64,
    histograms: u64,
    exemplars: u64,
    /// `aggregation_temporality` as prost reads an enum: the varint cut to `i32`.
    temporality: i32,
    /// A sum's `is_monotonic`, as prost reads a `bool`: the last one sent.
    monotonic: bool,
    /// Why the translator stops at a point ([`translate::point_stops`]): that point and the
    /// later ones are not charged.
    cut: Option<&'static str>,
    conversion: Conversion,
}

impl Data {
    fn new(kind: Kind, conversion: Conversion) -> Data {
        Data {
            kind,
            conversion,
            points: 0,
            times: TimeRange::default(),
            samples: 0,
            histograms: 0,
            exemplars: 0,
            temporality: 0,
            monotonic: false,
            cut: None,
        }
    }

    /// The type of the metadata entry the translation makes for this metric.
    fn metric_type(&self) -> MetricType {
        match self.kind {
            _ if self.temporal() && self.temporality == AggregationTemporality::Delta as i32 => {
                MetricType::Unknown
            }
            Kind::Gauge => MetricType::Gauge,
            Kind::Sum if self.monotonic => MetricType::Counter,
            Kind::Sum => MetricType::Gauge,
            Kind::Histogram | Kind::Exponential => MetricType::Histogram,
            Kind::Summary => MetricType::Summary,
        }
    }

    /// One `Gauge`, `Sum`, `Histogram`, `ExponentialHistogram` or `Summary` message.
    #[inline(always)]
    fn add(&mut self, mut buf: &[u8], depth: u32, bounds: &mut Bounds) -> Scanned<()> {
        let kind = self.kind;
        while !buf.is_empty() {
            let (tag, wire_type) = key(&mut buf)?;
            match (tag, kind) {
                (1, _) => {
                    let (point, depth) = message(&mut buf, wire_type, depth, "data_points")?;
                    self.point(point, depth, bounds)?;
                }
                (2, Kind::Sum | Kind::Histogram | Kind::Exponential) => {
                    self.temporality =
                        varint(&mut buf, wire_type, "aggregation_temporality")? as i32;
                }
                (3, Kind::Sum) => {
                    self.monotonic = varint(&mut buf, wire_type, "Sum.is_monotonic")? != 0;
                }
                _ => skip(&mut buf, wire_type, tag, depth)?,
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn point(&mut self, buf: &[u8], depth: u32, bounds: &mut Bounds) -> Scanned<()> {
        let mut attributes = 0;
        let mut labels = Labels {
            bounds,
            count: &mut attributes,
            joined: 0,
            suspect: false,
        };
        // What the point charges (samples, histograms) unless the metric stops at it.
        let (time, exemplars, samples, histograms, scale) = match self.kind {
            Kind::Gauge | Kind::Sum => {
                let point = number_point(buf, depth, &mut labels)?;
                (point.time, point.exemplars, 1, 0, 0)
            }
            Kind::Histogram if self.conversion.nhcb => {
                // One native histogram with custom buckets: at most its bucket counts.
                let point = histogram_point(buf, depth, &mut labels)?;
                labels.bounds.buckets = labels.bounds.buckets.max(point.bucket_counts);
                (point.time, point.exemplars, 0, 1, 0)
            }
            Kind::Histogram => {
                let point = histogram_point(buf, depth, &mut labels)?;
                // The buckets, `+Inf`, `_count`, and `_sum` when the point has one.
                let samples = point.bounds.min(point.bucket_counts) + 2 + u64::from(point.sum);
                (point.time, point.exemplars, samples, 0, 0)
            }
            Kind::Exponential => {
                let point = exponential_point(buf, depth, &mut labels)?;
                labels.bounds.buckets = labels.bounds.buckets.max(point.buckets);
                (point.time, point.exemplars, 0, 1, point.scale)
            }
            Kind::Summary => {
                let point = summary_point(buf, depth, &mut labels)?;
                (point.time, Exemplars::default(), point.quantiles + 2, 0, 0)
            }
        };
        let joined = labels.joined;
        let suspect = labels.suspect;
        if !(suspect || scale < -4 || self.cut.is_some())
            || !self.stops_here(buf, depth, suspect, scale)
        {
            self.samples += samples;
            self.histograms += histograms;
            self.exemplars += exemplars.count;
            self.points += 1;
        }
        bounds.exemplars += exemplars.count;
        // Gauge exemplars are never translated, so never checked.
        if self.kind != Kind::Gauge && exemplars.count > 0 {
            bounds.exemplars_per_point = bounds.exemplars_per_point.max(exemplars.count);
            bounds.exemplar_times.cover(&exemplars.times);
            bounds.exemplar_without_ids |= exemplars.without_ids;
        }
        self.times.see(time);
        bounds.point_attributes = bounds.point_attributes.max(attributes);
        bounds.joined = bounds.joined.max(joined);
        Ok(())
    }

    /// Whether the translator stops the metric at this point or has at an earlier one
    /// ([`translate::point_stops`]): its scale is below -4, or (when one of its keys does not
    /// start with a lower-case letter, `suspect`) a key makes no label name.
    #[cold]
    #[inline(never)]
    fn stops_here(&mut self, point: &[u8], depth: u32, suspect: bool, scale: i32) -> bool {
        if self.cut.is_none() {
            self.cut = if scale < -4 {
                Some(SCALE_BELOW_MINUS_4)
            } else if suspect && self.unnamed_key(point, depth) {
                Some(LABEL_NAME_INVALID)
            } else {
                None
            };
        }
        self.cut.is_some()
    }

    /// Whether one of a (checked) point's attribute keys makes no label name.
    fn unnamed_key(&self, mut point: &[u8], depth: u32) -> bool {
        let attributes = match self.kind {
            Kind::Gauge | Kind::Sum | Kind::Summary => 7,
            Kind::Histogram => 9,
            Kind::Exponential => 1,
        };
        while let Ok((tag, wire_type)) = key(&mut point) {
            if tag == attributes {
                let Ok((kv, depth)) = message(&mut point, wire_type, depth, "") else {
                    return false;
                };
                match key_value(kv, depth) {
                    Ok((name, _)) if makes_no_label_name(name, self.conversion) => return true,
                    Ok(_) => {}
                    Err(_) => return false,
                }
            } else if skip(&mut point, wire_type, tag, depth).is_err() {
                return false;
            }
        }
        false
    }

    /// Whether the metric has a temporality: a sum's or a histogram's.
    fn temporal(&self) -> bool {
        matches!(self.kind, Kind::Sum | Kind::Histogram | Kind::Exponential)
    }

    /// Charges the metric to `counts` and returns the points charged and why the translator
    /// stopped at a point, if it did, or why it refuses the whole metric (`named`: its name
    /// passes [`name_refused`]). Its points' times count for `target_info` either way.
    fn settle(
        self,
        counts: &mut WriteCounts,
        times: &mut TimeRange,
        named: bool,
    ) -> Result<(u64, Option<&'static str>), &'static str> {
        times.cover(&self.times);
        if self.temporal() && !self.conversion.takes(self.temporality) {
            return Err(NOT_CUMULATIVE);
        }
        if !named {
            return Err(NO_NAME);
        }
        // No point charged and none cut: the metric has no data points.
        if self.points == 0 && self.cut.is_none() {
            return Err(NO_POINTS);
        }
        counts.samples = counts.samples.saturating_add(self.samples);
        counts.histograms = counts.histograms.saturating_add(self.histograms);
        // Gauge exemplars are never translated.
        if self.kind != Kind::Gauge {
            counts.exemplars = counts.exemplars.saturating_add(self.exemplars);
        }
        counts.series = counts.series.saturating_add(self.points);
        Ok((self.points, self.cut))
    }
}

/// What a `NumberDataPoint` (gauge or sum) contributes.
struct NumberPoint {
    time: u64,
    exemplars: Exemplars,
}

fn number_point(mut buf: &[u8], depth: u32, labels: &mut Labels) -> Scanned<NumberPoint> {
    let mut point = NumberPoint {
        time: 0,
        exemplars: Exemplars::default(),
    };
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            7 => labels.attribute(&mut buf, wire_type, depth, "NumberDataPoint.attributes")?,
            3 => point.time = fixed64(&mut buf, wire_type, "NumberDataPoint.time_unix_nano")?,
            2 | 4 | 6 => {
                fixed64(&mut buf, wire_type, "NumberDataPoint")?;
            }
            5 => {
                let (exemplar_body, depth) =
                    message(&mut buf, wire_type, depth, "NumberDataPoint.exemplars")?;
                point.exemplars.add(exemplar_body, depth)?;
            }
            8 => {
                varint(&mut buf, wire_type, "NumberDataPoint.flags")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(point)
}

/// What a `HistogramDataPoint` contributes.
struct HistogramPoint {
    time: u64,
    bounds: u64,
    bucket_counts: u64,
    sum: bool,
    exemplars: Exemplars,
}

fn histogram_point(mut buf: &[u8], depth: u32, labels: &mut Labels) -> Scanned<HistogramPoint> {
    let mut point = HistogramPoint {
        time: 0,
        bounds: 0,
        bucket_counts: 0,
        sum: false,
        exemplars: Exemplars::default(),
    };
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            9 => labels.attribute(&mut buf, wire_type, depth, "HistogramDataPoint.attributes")?,
            3 => point.time = fixed64(&mut buf, wire_type, "HistogramDataPoint.time_unix_nano")?,
            5 => {
                fixed64(&mut buf, wire_type, "HistogramDataPoint.sum")?;
                point.sum = true;
            }
            2 | 4 | 11 | 12 => {
                fixed64(&mut buf, wire_type, "HistogramDataPoint")?;
            }
            6 => {
                point.bucket_counts +=
                    repeated_fixed64(&mut buf, wire_type, "HistogramDataPoint.bucket_counts")?
            }
            7 => {
                point.bounds +=
                    repeated_fixed64(&mut buf, wire_type, "HistogramDataPoint.explicit_bounds")?
            }
            8 => {
                let (exemplar_body, depth) =
                    message(&mut buf, wire_type, depth, "HistogramDataPoint.exemplars")?;
                point.exemplars.add(exemplar_body, depth)?;
            }
            10 => {
                varint(&mut buf, wire_type, "HistogramDataPoint.flags")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(point)
}

/// What an `ExponentialHistogramDataPoint` contributes.
struct ExponentialPoint {
    time: u64,
    scale: i32,
    exemplars: Exemplars,
    /// Its positive and negative bucket counts.
    buckets: u64,
}

fn exponential_point(mut buf: &[u8], depth: u32, labels: &mut Labels) -> Scanned<ExponentialPoint> {
    let mut point = ExponentialPoint {
        time: 0,
        scale: 0,
        exemplars: Exemplars::default(),
        buckets: 0,
    };
    let name = "ExponentialHistogramDataPoint";
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 => labels.attribute(&mut buf, wire_type, depth, name)?,
            3 => point.time = fixed64(&mut buf, wire_type, name)?,
            2 | 4 | 5 | 7 | 12 | 13 | 14 => {
                fixed64(&mut buf, wire_type, name)?;
            }
            6 => point.scale = sint32(varint(&mut buf, wire_type, name)?),
            8 | 9 => {
                let (buckets_body, depth) = message(&mut buf, wire_type, depth, name)?;
                point.buckets += buckets(buckets_body, depth)?;
            }
            10 => {
                varint(&mut buf, wire_type, name)?;
            }
            11 => {
                let (exemplar_body, depth) = message(&mut buf, wire_type, depth, name)?;
                point.exemplars.add(exemplar_body, depth)?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(point)
}

/// `sint32` as prost decodes it: the varint cut to 32 bits, then zigzag.
fn sint32(value: u64) -> i32 {
    let value = value as u32;
    ((value >> 1) as i32) ^ (-((value & 1) as i32))
}

/// `ExponentialHistogramDataPoint.Buckets`: checked; returns how many bucket counts it has.
fn buckets(mut buf: &[u8], depth: u32) -> Scanned<u64> {
    let mut counts = 0;
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 => {
                varint(&mut buf, wire_type, "Buckets.offset")?;
            }
            2 => counts += repeated_varint(&mut buf, wire_type, "Buckets.bucket_counts")?,
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(counts)
}

/// What a `SummaryDataPoint` contributes.
struct SummaryPoint {
    time: u64,
    quantiles: u64,
}

fn summary_point(mut buf: &[u8], depth: u32, labels: &mut Labels) -> Scanned<SummaryPoint> {
    let mut point = SummaryPoint {
        time: 0,
        quantiles: 0,
    };
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            7 => labels.attribute(&mut buf, wire_type, depth, "SummaryDataPoint.attributes")?,
            3 => point.time = fixed64(&mut buf, wire_type, "SummaryDataPoint.time_unix_nano")?,
            2 | 4 | 5 => {
                fixed64(&mut buf, wire_type, "SummaryDataPoint")?;
            }
            6 => {
                let (quantile, depth) = message(
                    &mut buf,
                    wire_type,
                    depth,
                    "SummaryDataPoint.quantile_values",
                )?;
                value_at_quantile(quantile, depth)?;
                point.quantiles += 1;
            }
            8 => {
                varint(&mut buf, wire_type, "SummaryDataPoint.flags")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(point)
}

fn value_at_quantile(mut buf: &[u8], depth: u32) -> Scanned<()> {
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 | 2 => {
                fixed64(&mut buf, wire_type, "ValueAtQuantile")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(())
}

/// What a point's exemplars tell Mimir's exemplar checks ([`Bounds::exemplar_times`],
/// [`Bounds::exemplar_without_ids`]).
#[derive(Default)]
struct Exemplars {
    count: u64,
    times: TimeRange,
    without_ids: bool,
}

impl Exemplars {
    /// One `Exemplar`, checked: its time, and whether it has a trace or a span id (bytes
    /// not all zero, as pdata reads an id), which give it labels whatever its attributes.
    fn add(&mut self, mut buf: &[u8], depth: u32) -> Scanned<()> {
        let (mut time, mut trace, mut span) = (0, false, false);
        while !buf.is_empty() {
            let (tag, wire_type) = key(&mut buf)?;
            match tag {
                7 => attribute(&mut buf, wire_type, depth, "Exemplar.filtered_attributes")?,
                2 => time = fixed64(&mut buf, wire_type, "Exemplar.time_unix_nano")?,
                3 | 6 => {
                    fixed64(&mut buf, wire_type, "Exemplar")?;
                }
                // The span id, then the trace id: the last of each sent is the one a decode
                // keeps.
                4 => span = is_id(bytes(&mut buf, wire_type, "Exemplar.span_id")?),
                5 => trace = is_id(bytes(&mut buf, wire_type, "Exemplar.trace_id")?),
                _ => skip(&mut buf, wire_type, tag, depth)?,
            }
        }
        self.count += 1;
        self.times.see(time);
        self.without_ids |= !(trace || span);
        Ok(())
    }
}

/// Whether a trace or span id is one: pdata reads an id of zeros as none.
fn is_id(id: &[u8]) -> bool {
    id.iter().any(|&b| b != 0)
}

/// `Resource`: its attributes decide its `target_info` and what names it.
#[inline(never)]
fn resource_attributes<'a>(
    mut buf: &'a [u8],
    depth: u32,
    (keys, identity): (&mut TargetKeys, &mut Option<Identity<'a>>),
    conversion: Conversion,
    bounds: &mut Bounds,
) -> Scanned<()> {
    let (mut attributes, mut joined) = (0, 0usize);
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 => {
                let (kv, depth) = message(&mut buf, wire_type, depth, "Resource.attributes")?;
                let (name, value) = key_value(kv, depth)?;
                keys.see(name, value == 0, makes_no_label_name(name, conversion));
                if let Some(seen) = identity {
                    let told = match name {
                        b"service.namespace" => once(&mut seen.namespace, kv),
                        b"service.name" => once(&mut seen.name, kv),
                        b"service.instance.id" => once(&mut seen.instance, kv),
                        b"job" | b"instance" => false,
                        _ => true,
                    };
                    if !told {
                        *identity = None;
                    }
                }
                bounds.attribute(name, value);
                attributes += 1;
                joined = joined.saturating_add(value).saturating_add(1);
            }
            2 => {
                varint(&mut buf, wire_type, "Resource.dropped_attributes_count")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    bounds.resource_attributes = bounds.resource_attributes.max(attributes);
    bounds.joined = bounds.joined.max(joined);
    Ok(())
}

/// The first value of an identifying key, kept in `slot`: whether it is told from the bytes
/// (a plain string, or none; a later one of the key is not read).
fn once<'a>(slot: &mut Option<&'a [u8]>, kv: &'a [u8]) -> bool {
    if slot.is_some() {
        return true;
    }
    match string_value(kv) {
        Some(text) => {
            *slot = Some(text);
            true
        }
        None => false,
    }
}

/// The value of an already checked `KeyValue` as the text it is written as, when that is
/// plain from its bytes: none (empty), or one `string_value` of under 128 bytes in one value
/// field. `None` for anything else (another type, a value field sent twice, …).
fn string_value(mut kv: &[u8]) -> Option<&[u8]> {
    let mut text: Option<&[u8]> = Some(b"");
    let mut values = 0;
    while !kv.is_empty() {
        let (tag, wire_type) = key(&mut kv).ok()?;
        let field_start = kv;
        skip(&mut kv, wire_type, tag, RECURSION_LIMIT).ok()?;
        if tag == 2 {
            values += 1;
            let field = &field_start[..field_start.len() - kv.len()];
            text = match field {
                [len, value @ ..] if *len < 0x80 && usize::from(*len) == value.len() => match value
                {
                    [] => Some(b""),
                    [0x0a, len, text @ ..] if *len < 0x80 && usize::from(*len) == text.len() => {
                        Some(text)
                    }
                    _ => None,
                },
                _ => None,
            };
        }
    }
    if values > 1 {
        return None;
    }
    text
}

/// An `InstrumentationScope`: checked, and measured for `otel_promote_scope_metadata` (its
/// name, version and attributes can become labels); returns how many attributes it has.
/// Measured whether it has a name or not: a bound may be loose, never short.
fn instrumentation_scope(mut buf: &[u8], depth: u32, bounds: &mut Bounds) -> Scanned<u32> {
    let mut attributes = 0u32;
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 | 2 => {
                let text = string(&mut buf, wire_type, "InstrumentationScope")?;
                bounds.scope_value = bounds.scope_value.max(text.len());
            }
            3 => {
                let field = "InstrumentationScope.attributes";
                let (kv, depth) = message(&mut buf, wire_type, depth, field)?;
                let (key, size) = key_value(kv, depth)?;
                attributes = attributes.saturating_add(1);
                bounds.scope_key = bounds.scope_key.max(key.len());
                bounds.scope_value = bounds.scope_value.max(size);
            }
            4 => {
                varint(&mut buf, wire_type, "InstrumentationScope")?;
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(attributes)
}

/// One attribute (a `KeyValue` field) of a scope or exemplar: checked.
#[inline(always)]
fn attribute(buf: &mut &[u8], wire_type: WireType, depth: u32, field: &str) -> Scanned<()> {
    let (kv, depth) = message(buf, wire_type, depth, field)?;
    key_value(kv, depth).map(|_| ())
}

/// A data point's attributes as they are read: each becomes a label of its series.
struct Labels<'b> {
    bounds: &'b mut Bounds,
    count: &'b mut u32,
    /// The point's values with a separator after each ([`Bounds::joined`]).
    joined: usize,
    /// A key that does not start with a lower-case letter: one that may make no label name
    /// ([`makes_no_label_name`]), looked at again once the point is read.
    suspect: bool,
}

impl Labels<'_> {
    /// One attribute of the point: checked, counted and measured.
    #[inline(always)]
    fn attribute(
        &mut self,
        buf: &mut &[u8],
        wire_type: WireType,
        depth: u32,
        field: &str,
    ) -> Scanned<()> {
        let (kv, depth) = message(buf, wire_type, depth, field)?;
        let (name, value) = key_value(kv, depth)?;
        self.bounds.attribute(name, value);
        // (A key that makes no label name has no letter or digit, so it does not start with
        // a lower-case one; the rare keys that start upper-case or with a digit are looked at
        // again for nothing.)
        self.suspect |= !name.first().is_some_and(u8::is_ascii_lowercase);
        *self.count += 1;
        self.joined = self.joined.saturating_add(value).saturating_add(1);
        Ok(())
    }
}

/// `KeyValue`: checked; returns its key (the last one sent, as a decode keeps) and how long
/// its value can be as a label value ([`any_value`]).
fn key_value(mut buf: &[u8], depth: u32) -> Scanned<(&[u8], usize)> {
    let mut name: &[u8] = b"";
    let mut size = 0;
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 => name = string(&mut buf, wire_type, "KeyValue.key")?,
            2 => {
                let (value, depth) = message(&mut buf, wire_type, depth, "KeyValue.value")?;
                size = match value {
                    // Most values are one short string (`string_value`, under 128 bytes): the
                    // general walk would find just that.
                    [0x0a, len, text @ ..] if *len < 0x80 && usize::from(*len) == text.len() => {
                        utf8(text, "AnyValue.string_value")?;
                        text.len()
                    }
                    _ => any_value(value, depth)?,
                };
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok((name, size))
}

/// `AnyValue`: checked, arrays and key-value lists to any depth prost allows. Returns how
/// long the value can be as a label value: a string's bytes, the longest a bool (5), an
/// integer (20) or a double ([`DOUBLE_TEXT`]) is written; [`UNMEASURED`] for a byte string,
/// an array or a list, which are written as base64 or JSON.
fn any_value(mut buf: &[u8], depth: u32) -> Scanned<usize> {
    let mut size = 0;
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        match tag {
            1 => {
                size = string(&mut buf, wire_type, "AnyValue.string_value")?.len();
            }
            2 | 3 => {
                varint(&mut buf, wire_type, "AnyValue")?;
                size = if tag == 2 { 5 } else { 20 };
            }
            4 => {
                fixed64(&mut buf, wire_type, "AnyValue.double_value")?;
                size = DOUBLE_TEXT;
            }
            5 | 6 => {
                let (list, depth) = message(&mut buf, wire_type, depth, "AnyValue")?;
                list_values(list, depth, tag == 6)?;
                size = UNMEASURED;
            }
            7 => {
                let value = bytes(&mut buf, wire_type, "AnyValue.bytes_value")?;
                // Written as base64: empty only when empty.
                size = if value.is_empty() { 0 } else { UNMEASURED };
            }
            _ => skip(&mut buf, wire_type, tag, depth)?,
        }
    }
    Ok(size)
}

/// `ArrayValue` (of `AnyValue`s) or `KeyValueList` (of `KeyValue`s, `pairs`).
fn list_values(mut buf: &[u8], depth: u32, pairs: bool) -> Scanned<()> {
    while !buf.is_empty() {
        let (tag, wire_type) = key(&mut buf)?;
        if tag == 1 {
            let (value, depth) = message(&mut buf, wire_type, depth, "values")?;
            if pairs {
                key_value(value, depth)?;
            } else {
                any_value(value, depth)?;
            }
        } else {
            skip(&mut buf, wire_type, tag, depth)?;
        }
    }
    Ok(())
}

// The wire format, by prost's rules.

/// A field's number and wire type, as `prost::encoding::decode_key` reads them.
#[inline(always)]
fn key(buf: &mut &[u8]) -> Scanned<(u32, WireType)> {
    // Fields 1 to 15 have one-byte keys: nearly every key in a request.
    if let Some(&byte) = buf.first() {
        let wire_type = match byte & 7 {
            0 => Some(WireType::Varint),
            1 => Some(WireType::SixtyFourBit),
            2 => Some(WireType::LengthDelimited),
            5 => Some(WireType::ThirtyTwoBit),
            _ => None,
        };
        if let (true, Some(wire_type)) = ((8..0x80).contains(&byte), wire_type) {
            *buf = &buf[1..];
            return Ok((u32::from(byte >> 3), wire_type));
        }
    }
    decode_key(buf).map_err(|err| prost_error("a field key", err))
}

/// A nested message's bytes and the depth left inside it, as `prost::encoding::message::merge`
/// checks them: the wire type, the recursion limit, the length.
#[inline(always)]
fn message<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    depth: u32,
    field: &str,
) -> Scanned<(&'a [u8], u32)> {
    expect(wire_type, WireType::LengthDelimited, field)?;
    if depth == 0 {
        return Err(too_deep(field));
    }
    Ok((delimited(buf, field)?, depth - 1))
}

/// A length-delimited field's bytes (its wire type already checked).
#[inline(always)]
fn delimited<'a>(buf: &mut &'a [u8], field: &str) -> Scanned<&'a [u8]> {
    let len = decode_varint(buf).map_err(|err| prost_error(field, err))?;
    if len > buf.len() as u64 {
        return Err(underflow(field));
    }
    let (bytes, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(bytes)
}

#[inline(always)]
fn bytes<'a>(buf: &mut &'a [u8], wire_type: WireType, field: &str) -> Scanned<&'a [u8]> {
    expect(wire_type, WireType::LengthDelimited, field)?;
    delimited(buf, field)
}

/// A string's bytes, checked to be UTF-8.
#[inline(always)]
fn string<'a>(buf: &mut &'a [u8], wire_type: WireType, field: &str) -> Scanned<&'a [u8]> {
    let bytes = bytes(buf, wire_type, field)?;
    utf8(bytes, field)?;
    Ok(bytes)
}

#[inline(always)]
fn utf8(bytes: &[u8], field: &str) -> Scanned<()> {
    // Names and most values are ASCII, which a word at a time checks faster than the
    // general validator does for strings this short.
    if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
        Ok(())
    } else {
        Err(not_utf8(field))
    }
}

/// A string, read as one.
fn text<'a>(buf: &mut &'a [u8], wire_type: WireType, field: &str) -> Scanned<&'a str> {
    let bytes = bytes(buf, wire_type, field)?;
    std::str::from_utf8(bytes).map_err(|_| not_utf8(field))
}

#[inline(always)]
fn varint(buf: &mut &[u8], wire_type: WireType, field: &str) -> Scanned<u64> {
    expect(wire_type, WireType::Varint, field)?;
    decode_varint(buf).map_err(|err| prost_error(field, err))
}

/// A `fixed64`, `sfixed64` or `double`: 8 bytes, little-endian.
#[inline(always)]
fn fixed64(buf: &mut &[u8], wire_type: WireType, field: &str) -> Scanned<u64> {
    expect(wire_type, WireType::SixtyFourBit, field)?;
    let Some((value, rest)) = buf.split_first_chunk::<8>() else {
        return Err(underflow(field));
    };
    *buf = rest;
    Ok(u64::from_le_bytes(*value))
}

/// A repeated `fixed64` or `double`, packed or not: how many values the field holds.
fn repeated_fixed64(buf: &mut &[u8], wire_type: WireType, field: &str) -> Scanned<u64> {
    if wire_type == WireType::LengthDelimited {
        let packed = delimited(buf, field)?;
        // prost reads 8 bytes at a time and refuses to end past the field's length.
        if packed.len() % 8 != 0 {
            return Err(format!("{field}: delimited length exceeded"));
        }
        Ok(packed.len() as u64 / 8)
    } else {
        fixed64(buf, wire_type, field).map(|_| 1)
    }
}

/// A repeated varint, packed or not.
/// A repeated varint field, packed or not: checked; returns how many numbers it holds.
fn repeated_varint(buf: &mut &[u8], wire_type: WireType, field: &str) -> Scanned<u64> {
    if wire_type == WireType::LengthDelimited {
        let mut packed = delimited(buf, field)?;
        let mut numbers = 0;
        while !packed.is_empty() {
            decode_varint(&mut packed).map_err(|err| prost_error(field, err))?;
            numbers += 1;
        }
        Ok(numbers)
    } else {
        varint(buf, wire_type, field).map(|_| 1)
    }
}

/// Skips a field this walk does not read, as `prost::encoding::skip_field` does: at the
/// depth of the message it is in, groups one deeper per level.
fn skip(buf: &mut &[u8], wire_type: WireType, tag: u32, depth: u32) -> Scanned<()> {
    if depth == 0 {
        return Err(too_deep("an unknown field"));
    }
    let len = match wire_type {
        WireType::Varint => decode_varint(buf)
            .map(|_| 0)
            .map_err(|err| prost_error("an unknown field", err))?,
        WireType::ThirtyTwoBit => 4,
        WireType::SixtyFourBit => 8,
        WireType::LengthDelimited => {
            decode_varint(buf).map_err(|err| prost_error("an unknown field", err))?
        }
        WireType::StartGroup => loop {
            let (inner_tag, inner_wire_type) = key(buf)?;
            if inner_wire_type == WireType::EndGroup {
                if inner_tag != tag {
                    return Err(format!("group {tag}: unexpected end group tag"));
                }
                break 0;
            }
            skip(buf, inner_wire_type, inner_tag, depth - 1)?;
        },
        WireType::EndGroup => return Err(format!("field {tag}: unexpected end group tag")),
    };
    if len > buf.len() as u64 {
        return Err(underflow("an unknown field"));
    }
    *buf = &buf[len as usize..];
    Ok(())
}

#[inline(always)]
fn expect(actual: WireType, expected: WireType, field: &str) -> Scanned<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(wrong_wire_type(field, actual, expected))
    }
}

#[cold]
#[inline(never)]
fn wrong_wire_type(field: &str, actual: WireType, expected: WireType) -> String {
    format!("{field}: invalid wire type {actual:?} (expected {expected:?})")
}

#[cold]
#[inline(never)]
fn underflow(field: &str) -> String {
    format!("{field}: buffer underflow")
}

#[cold]
#[inline(never)]
fn too_deep(field: &str) -> String {
    format!("{field}: recursion limit reached")
}

#[cold]
#[inline(never)]
fn not_utf8(field: &str) -> String {
    format!("{field}: invalid string value: data is not UTF-8 encoded")
}

#[cold]
#[inline(never)]
fn prost_error(field: &str, err: prost::DecodeError) -> String {
    format!("{field}: {err}")
}
