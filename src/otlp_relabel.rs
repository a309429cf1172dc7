//! A tenant's `metric_relabel_configs` on an OTLP export. Mimir's distributor runs them on the
//! series its translator makes of the export, after the HA tracker and before `drop_labels`
//! and the series checks. weir forwards OTLP, so it runs them on the series the export would
//! become ([`translate::each_point_every_series`]: every bucket and quantile its own series,
//! the HA replica label gone for a push from the elected replica), and then:
//! - a data point every series of which the rules drop is cut from the forwarded export, and
//!   neither checked nor charged nor counted anywhere, as in Mimir;
//! - the series the rules drop from a point that keeps others (some of a histogram's
//!   buckets, say), and a resource's `target_info` the rules drop, are not charged but stay
//!   in the export: OTLP cannot carry a part of a point, nor a resource without the attributes
//!   its points' `job` and `instance` come from;
//! - a point the rules change is checked as they left it (then `drop_labels`), and forwarded
//!   as sent.
//!
//! A receiver that runs the same rules, as a Mimir behind weir does with the same overrides,
//! stores what Mimir would have.
//!
//! Above `otlp` and `remote_write`, which do not import each other.

use std::collections::{HashMap, HashSet};

use runtime_config::relabel::Labels;

use crate::otlp::proto::ExportMetricsServiceRequest;
use crate::otlp::translate::{self, Place, Translated};
use crate::remote_write::relabel::{Outcome, Relabelling};

/// What a tenant's rules make of an export's series.
#[derive(Debug, Default)]
pub struct Relabelled {
    /// Data points every series of which the rules drop, and resources whose `target_info`
    /// they drop.
    pub dropped: HashSet<Place>,
    /// Points and `target_info`s the rules changed, or dropped some of the series of: what
    /// they left, one series a part (its labels sorted, carrying what the part's series left
    /// carry; `items` their sum), and what the dropped series carried.
    pub changed: HashMap<Place, (Translated, u64)>,
}

impl Relabelled {
    /// Whether the rules touched the series of `place`.
    pub fn touches(&self, place: &Place) -> bool {
        self.dropped.contains(place) || self.changed.contains_key(place)
    }
}

/// The rules on every series `request` becomes. `replica`: the HA replica label, gone before
/// the rules run (the push is from the elected replica).
pub fn relabel(
    request: &ExportMetricsServiceRequest,
    relabelling: &Relabelling,
    settings: &runtime_config::OtlpTranslation,
    replica: Option<&str>,
) -> Relabelled {
    if relabelling
        .rules
        .only_drops_by(&["__name__", crate::remote_write::relabel::TENANT_LABEL])
    {
        if let Some(out) = by_name(request, relabelling, settings) {
            return out;
        }
    }
    every_series(request, relabelling, settings, replica)
}

/// [`relabel`], every series built with its labels and put through the rules.
pub(crate) fn every_series(
    request: &ExportMetricsServiceRequest,
    relabelling: &Relabelling,
    settings: &runtime_config::OtlpTranslation,
    replica: Option<&str>,
) -> Relabelled {
    let drops = |name: &str| replica == Some(name);
    let rules = &relabelling.rules;
    let each_bucket = rules.reads_value_of("le") || rules.reads_value_of("quantile");
    let mut out = Relabelled::default();
    let walk = translate::each_point_every_series;
    walk(
        request,
        settings,
        &drops,
        each_bucket,
        &mut |head, series| {
            // What the rules left, a series a part (the first left of its part, carrying what
            // all those left of the part carry): the series of a part differ only in `le` or
            // `quantile`, which the checks do not measure, so a point of many buckets is checked
            // by at most three series, and never holds more.
            let mut left: Vec<translate::OneSeries> = Vec::new();
            let mut dropped_items = 0;
            let mut touched = false;
            for (series, items, part) in series {
                let sent: Vec<(&str, &str)> = series
                    .iter()
                    .map(|(name, value)| (&**name, &**value))
                    .collect();
                let mut labels = Labels::new();
                let outcome = relabelling.outcome(&sent, None, &mut labels);
                touched |= outcome != Outcome::Same;
                if outcome == Outcome::Dropped {
                    dropped_items += items;
                    continue;
                }
                match left.last_mut() {
                    Some(last) if last.2 == part => last.1 += items,
                    // The part's first series left: its labels as the rules left them.
                    _ if outcome == Outcome::Changed => {
                        let changed = labels
                            .iter()
                            .map(|(name, value)| (name.to_string(), value.to_string()))
                            .collect();
                        left.push((changed, items, part));
                    }
                    _ => left.push((series, items, part)),
                }
            }
            if left.is_empty() {
                out.dropped.insert(head.place);
            } else if touched {
                let (series, series_items): (Vec<_>, Vec<u64>) = left
                    .into_iter()
                    .map(|(labels, items, _)| (labels, items))
                    .unzip();
                let kept = Translated {
                    place: head.place,
                    items: series_items.iter().sum(),
                    series,
                    series_items,
                    earliest_ms: head.earliest_ms,
                    latest_ms: head.latest_ms,
                    native: head.native.map(translate::Native::cloned),
                };
                out.changed.insert(head.place, (kept, dropped_items));
            }
        },
    );
    out
}

/// [`relabel`] for rules that only keep or drop a series by its name (the usual rules: drop
/// these metrics): each name judged once, no point's labels built. `None` when the rules drop
/// some of a point's series and keep others (some histogram's `_bucket`, say): those points
/// need their series built, to be checked without the dropped ones.
pub(crate) fn by_name(
    request: &ExportMetricsServiceRequest,
    relabelling: &Relabelling,
    settings: &runtime_config::OtlpTranslation,
) -> Option<Relabelled> {
    let mut judged: HashMap<String, bool> = HashMap::new();
    let mut dropped = |name: &str| -> bool {
        if let Some(&dropped) = judged.get(name) {
            return dropped;
        }
        let outcome = relabelling.outcome(&[("__name__", name)], None, &mut Labels::new());
        let dropped = outcome == Outcome::Dropped;
        judged.insert(name.to_string(), dropped);
        dropped
    };
    let mut out = Relabelled::default();
    let mut partly = false;
    let mut full = String::new();
    translate::each_point_by_name(request, settings, |place, name, parts| {
        let gone = parts
            .iter()
            .filter(|(suffix, _)| {
                full.clear();
                full.push_str(name);
                full.push_str(suffix);
                dropped(&full)
            })
            .count();
        if gone == parts.len() {
            out.dropped.insert(place);
        } else if gone > 0 {
            partly = true;
        }
    });
    (!partly).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prost::Message;
    use runtime_config::relabel::RuleConfig;
    use runtime_config::{Relabel, ValidationLimits};

    use super::*;
    use crate::counts::{Decoded, Forward};
    use crate::otlp::proto::{common, metrics, metrics::metric::Data, resource};
    use crate::otlp::OtlpFormat;
    use crate::otlp_checks::decode_validated;
    use crate::otlp_checks::tests::{kv, NOW_MS, POINT_NS};
    use crate::remote_write::validate::Validation;

    fn gauge(name: &str, attributes: Vec<common::KeyValue>) -> metrics::Metric {
        metrics::Metric {
            name: name.into(),
            data: Some(Data::Gauge(metrics::Gauge {
                data_points: vec![metrics::NumberDataPoint {
                    attributes,
                    time_unix_nano: POINT_NS,
                    value: Some(metrics::number_data_point::Value::AsDouble(1.0)),
                    ..Default::default()
                }],
            })),
            ..Default::default()
        }
    }

    /// A cumulative histogram of one point: bounds 0.005, 0.1 and 1, and a sum: six samples.
    fn latency() -> metrics::Metric {
        metrics::Metric {
            name: "latency".into(),
            data: Some(Data::Histogram(metrics::Histogram {
                data_points: vec![metrics::HistogramDataPoint {
                    time_unix_nano: POINT_NS,
                    count: 4,
                    sum: Some(1.5),
                    explicit_bounds: vec![0.005, 0.1, 1.0],
                    bucket_counts: vec![1, 1, 1, 1],
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        }
    }

    /// One resource (`service.name` and a `host.name`, so it has a `target_info`).
    fn export(metrics: Vec<metrics::Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: vec![kv("service.name", "api"), kv("host.name", "h1")],
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

    /// Tenant `t1`'s rules, written as the overrides file writes them.
    fn rules(yaml: &str) -> Relabelling {
        let configs: Vec<RuleConfig> = serde_yaml_ng::from_str(yaml).unwrap();
        Relabelling {
            rules: Arc::new(Relabel::new(configs).unwrap()),
            tenant: Arc::from("t1"),
        }
    }

    /// A summary of one point with these quantiles.
    fn summary(name: &str, quantiles: &[f64]) -> metrics::Metric {
        metrics::Metric {
            name: name.into(),
            data: Some(Data::Summary(metrics::Summary {
                data_points: vec![metrics::SummaryDataPoint {
                    time_unix_nano: POINT_NS,
                    quantile_values: quantiles
                        .iter()
                        .map(|&quantile| metrics::summary_data_point::ValueAtQuantile {
                            quantile,
                            value: 1.0,
                        })
                        .collect(),
                    ..Default::default()
                }],
            })),
            ..Default::default()
        }
    }

    /// `request` checked for a tenant with the rules `yaml` (none: `None`).
    fn checked(request: &ExportMetricsServiceRequest, yaml: Option<&str>) -> Decoded {
        let relabelling = yaml.map(rules);
        let validation =
            Validation::new(ValidationLimits::default(), NOW_MS).relabelling(relabelling);
        let body = request.encode_to_vec();
        decode_validated(&body, 1 << 20, OtlpFormat::PROTOBUF, &validation).unwrap()
    }

    fn metric_names(decoded: &Decoded) -> Vec<String> {
        let Forward::Rewritten(bytes) = &decoded.forward else {
            panic!("not rewritten: {:?}", decoded.forward);
        };
        let request = ExportMetricsServiceRequest::decode(&bytes[..]).unwrap();
        request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .filter(|metric| match &metric.data {
                Some(Data::Gauge(gauge)) => !gauge.data_points.is_empty(),
                Some(Data::Histogram(histogram)) => !histogram.data_points.is_empty(),
                _ => true,
            })
            .map(|metric| metric.name.clone())
            .collect()
    }

    /// A point the rules drop is cut and not charged; a bucket they drop from a histogram
    /// that stays, and a `target_info` they drop, are not charged; the rest is as without
    /// rules.
    #[test]
    fn dropped_series_are_not_charged_and_dropped_points_not_forwarded() {
        let request = export(vec![
            gauge("go_goroutines", vec![]),
            gauge("up", vec![]),
            latency(),
        ]);
        let plain = checked(&request, None);
        // go_goroutines 1, up 1, latency 6, target_info 1; three points and the target_info.
        assert_eq!((plain.counts.samples, plain.counts.series), (9, 4));
        assert_eq!(plain.forward, Forward::Unchanged);

        let rules = "- source_labels: [__name__]\n  regex: go_.*|target_info\n  action: drop\n\
                     - source_labels: [__name__, le]\n  regex: latency_bucket;0\\.005\n  action: drop\n";
        let relabelled = checked(&request, Some(rules));
        assert_eq!(
            (relabelled.counts.samples, relabelled.counts.series),
            (6, 2)
        );
        // go_goroutines and target_info, with no point left, keep their metadata entries:
        // Mimir makes them as it translates, before the rules drop series.
        assert_eq!(relabelled.counts.metadata, plain.counts.metadata);
        assert!(relabelled.refused.is_none());
        assert_eq!(metric_names(&relabelled), ["up", "latency"]);

        // A bucket only: charged one sample less, forwarded as sent.
        let buckets = checked(
            &request,
            Some("- source_labels: [le]\n  regex: 0\\.1\n  action: drop\n"),
        );
        assert_eq!((buckets.counts.samples, buckets.counts.series), (8, 4));
        assert_eq!(buckets.forward, Forward::Unchanged);

        // Everything: nothing charged, nothing forwarded, nothing refused.
        let all = checked(
            &request,
            Some("- regex: .*\n  source_labels: [__name__]\n  action: drop\n"),
        );
        assert_eq!(all.counts.samples + all.counts.series, 0);
        assert_eq!(all.forward, Forward::Nothing);
        assert!(all.refused.is_none());
    }

    /// Mimir checks a series as the rules left it: a label they drop cannot fail it, one
    /// they add can.
    #[test]
    fn a_changed_point_is_checked_as_the_rules_left_it() {
        let long = "x".repeat(3_000);
        let request = export(vec![
            gauge("up", vec![kv("blob", &long)]),
            gauge("ok", vec![]),
        ]);
        let plain = checked(&request, None);
        assert!(plain.refused.is_some(), "over max_label_value_length");
        assert_eq!(plain.counts.samples, 2, "ok and target_info");

        let dropped = checked(&request, Some("- regex: blob\n  action: labeldrop\n"));
        assert!(dropped.refused.is_none());
        assert_eq!(dropped.counts.samples, 3);
        assert_eq!(dropped.forward, Forward::Unchanged, "forwarded as sent");

        let added = format!(
            "- source_labels: [__name__]\n  regex: ok\n  target_label: blob2\n  replacement: {long}\n"
        );
        let request = export(vec![gauge("ok", vec![]), gauge("fine", vec![])]);
        let refused = checked(&request, Some(&added));
        let refused_samples: u64 = refused
            .refused
            .as_ref()
            .expect("refused")
            .samples
            .samples
            .iter()
            .sum();
        assert_eq!(refused_samples, 1);
        assert_eq!(refused.counts.samples, 2, "fine and target_info");
        assert_eq!(metric_names(&refused), ["fine"]);
    }

    /// Rules that keep or drop by name alone are judged a name at a time, with the same
    /// outcome as when every series is built: a metric, a histogram's or a summary's every
    /// series, `target_info`; a rule that drops a part of a point is left to the full walk.
    #[test]
    fn rules_by_name_alone_are_judged_as_every_series_is() {
        let summary = summary("rpc.duration", &[0.5]);
        let delta = metrics::Metric {
            name: "go_delta".into(),
            data: Some(Data::Sum(metrics::Sum {
                data_points: vec![metrics::NumberDataPoint {
                    time_unix_nano: POINT_NS,
                    ..Default::default()
                }],
                aggregation_temporality: metrics::AggregationTemporality::Delta as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let request = export(vec![
            gauge("go.goroutines", vec![kv("a", "1")]),
            gauge("up", vec![]),
            latency(),
            summary,
            delta,
        ]);
        let settings = runtime_config::OtlpTranslation::default();
        // Classic histograms as native ones, one series named as the metric; delta taken.
        let converting = runtime_config::OtlpTranslation {
            otel_convert_histograms_to_nhcb: true,
            otel_native_delta_ingestion: true,
            ..Default::default()
        };
        let whole = [
            "- source_labels: [__name__]\n  regex: go_.*|target_info\n  action: drop\n",
            "- source_labels: [__name__]\n  regex: latency_.*|rpc_duration.*\n  action: drop\n",
            "- source_labels: [__meta_tenant_id, __name__]\n  regex: t1;up\n  action: keep\n",
            "- source_labels: [__name__]\n  regex: nothing\n  action: drop\n",
            "- source_labels: [__name__]\n  regex: latency|latency_bucket\n  action: drop\n",
        ];
        for settings in [&settings, &converting] {
            for yaml in whole {
                let rules = rules(yaml);
                assert!(rules.rules.only_drops_by(&["__name__", "__meta_tenant_id"]));
                let Some(fast) = by_name(&request, &rules, settings) else {
                    // Only the classic histogram's `_bucket` alone is a part of a point.
                    assert!(
                        yaml.contains("latency|latency_bucket") && settings.eq(&Default::default())
                    );
                    continue;
                };
                let slow = every_series(&request, &rules, settings, None);
                assert!(slow.changed.is_empty(), "{yaml}");
                assert_eq!(fast.dropped, slow.dropped, "{yaml}");
            }
        }
        // The keep of `up` alone drops all but one point and the target_info; the delta sum
        // too, once it is taken.
        let kept = by_name(&request, &rules(whole[2]), &settings).unwrap();
        assert_eq!(kept.dropped.len(), 4);
        let kept = by_name(&request, &rules(whole[2]), &converting).unwrap();
        assert_eq!(kept.dropped.len(), 5);
        for part in ["latency_bucket", "rpc_duration", "latency_sum"] {
            let yaml = format!("- source_labels: [__name__]\n  regex: {part}\n  action: drop\n");
            assert!(
                by_name(&request, &rules(&yaml), &settings).is_none(),
                "{part}"
            );
            let slow = every_series(&request, &rules(&yaml), &settings, None);
            assert_eq!(slow.changed.len(), 1, "{part}");
        }
        // A native histogram has no `_bucket` series: a rule for them drops none of it, and
        // one for its name drops it whole.
        let buckets = "- source_labels: [__name__]\n  regex: latency_bucket\n  action: drop\n";
        let out = by_name(&request, &rules(buckets), &converting).unwrap();
        assert!(out.dropped.is_empty() && out.changed.is_empty());
        let name = "- source_labels: [__name__]\n  regex: latency\n  action: drop\n";
        let out = by_name(&request, &rules(name), &converting).unwrap();
        assert_eq!(out.dropped.len(), 1);
    }

    /// A point the rules change is kept for its checks as one series a part, carrying all
    /// the part's samples, however many buckets it has: whether its buckets were judged one
    /// by one (the rules read `le`) or once (they do not, and judge them alike).
    #[test]
    fn a_changed_point_keeps_a_series_a_part() {
        let mut wide = latency();
        if let Some(Data::Histogram(histogram)) = &mut wide.data {
            let point = &mut histogram.data_points[0];
            point.explicit_bounds = (0..100_000).map(f64::from).collect();
            point.bucket_counts = vec![0; 100_001];
        }
        let request = export(vec![wide]);
        let point = Place::Point {
            resource: 0,
            scope: 0,
            metric: 0,
            point: 0,
        };
        let settings = runtime_config::OtlpTranslation::default();
        let add = "- target_label: env\n  replacement: prod\n";
        let by_le = "- source_labels: [le]\n  regex: none\n  action: drop\n";
        for (yaml, each_bucket) in [(add.to_string(), false), (format!("{add}{by_le}"), true)] {
            let rules = rules(&yaml);
            assert_eq!(rules.rules.reads_value_of("le"), each_bucket);
            let out = every_series(&request, &rules, &settings, None);
            assert!(out.dropped.is_empty());
            let (kept, dropped) = &out.changed[&point];
            assert_eq!(*dropped, 0);
            assert_eq!(
                kept.series_items,
                [1, 1, 100_001],
                "_sum, _count, the buckets"
            );
            let env = ("env".to_string(), "prod".to_string());
            assert!(kept.series.iter().all(|labels| labels.contains(&env)));
        }
    }

    /// Each bucket and quantile is a series of one sample, `le` and `quantile` written as
    /// the translator writes them, in its part; together they carry what the point is
    /// charged. A summary's quantiles likewise.
    #[test]
    fn every_bucket_is_its_own_series() {
        let summary = summary("rpc", &[0.5, 0.99]);
        let request = export(vec![latency(), summary]);
        let settings = runtime_config::OtlpTranslation::default();
        let once = translate::translate(&request, &settings, &|_| false, &|_| true);
        let mut points = Vec::new();
        translate::each_point_every_series(
            &request,
            &settings,
            &|_| false,
            true,
            &mut |head, series| {
                let series: Vec<_> = series.collect();
                points.push((head.place, series));
            },
        );
        assert_eq!(points.len(), once.len(), "both points and the target_info");
        for ((place, series), once) in points.iter().zip(&once) {
            assert_eq!(*place, once.place);
            let items: u64 = series.iter().map(|(_, items, _)| items).sum();
            assert_eq!(items, once.items, "{place:?}");
        }
        let values = |label: &str, at: usize| -> Vec<(String, usize)> {
            points[at]
                .1
                .iter()
                .filter_map(|(labels, _, part)| {
                    let (_, value) = labels.iter().find(|(name, _)| name == label)?;
                    Some((value.clone(), *part))
                })
                .collect()
        };
        let part = |values: &[&str], part: usize| -> Vec<(String, usize)> {
            values
                .iter()
                .map(|value| (value.to_string(), part))
                .collect()
        };
        assert_eq!(values("le", 0), part(&["0.005", "0.1", "1", "+Inf"], 2));
        assert_eq!(values("quantile", 1), part(&["0.5", "0.99"], 2));
    }
}
