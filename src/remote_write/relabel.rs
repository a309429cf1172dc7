//! A tenant's `metric_relabel_configs` on a decompressed remote-write body, 1.0 or 2.0, where
//! Mimir's distributor applies them: after the HA tracker (whose replica label is gone by
//! then, for a push it accepted) and before `drop_labels` and the series checks, so a series
//! a rule drops is neither checked nor charged nor forwarded.
//!
//! Each series' labels are read into a label set (a repeated name keeps its last value, an
//! empty value none, as Prometheus' label builder reads them), `__meta_tenant_id` is set to the
//! tenant for the rules to match on, the rules run (`runtime_config::relabel`), and
//! `__meta_tenant_id` goes again. A series whose labels come out as they went in is copied as
//! sent; one a rule changed is written again, its labels sorted first and the rest of its
//! fields as sent; one a rule drops is cut. Every other field of the request is copied as
//! sent, unknown ones included. On 2.0 a label text the request has no symbol for is appended
//! to its symbols, at the end of the body (repeated fields concatenate in stream order).
//!
//! A label that is not UTF-8 is read lossily for the rules, each bad piece U+FFFD, since
//! Mimir's rules see it as a Go string: a rule may drop such a series or the label. A series
//! that still carries such text afterwards goes on as sent, for the series checks to refuse.
//!
//! The body that comes out is the one the scan then checks, counts and forwards. A body this
//! walk cannot read is left as it is: the scan refuses it with its own message.

use std::collections::HashMap;
use std::sync::Arc;

use prost::encoding::{decode_varint, encode_key, encode_varint, WireType};
use runtime_config::relabel::Labels;
use runtime_config::Relabel;

use super::wire::{any_label, plain_label, Field, Fields};

/// The label Mimir sets to the tenant's ID while the rules run.
pub(crate) const TENANT_LABEL: &str = "__meta_tenant_id";

/// A tenant's rules and its ID, for [`super::validate::Validation`].
#[derive(Debug, Clone)]
pub struct Relabelling {
    pub rules: Arc<Relabel>,
    pub tenant: Arc<str>,
}

/// [`v1`] or [`v2`]: the body the rules make of a decompressed request, when they change it.
pub(super) type Apply = fn(&[u8], &Relabelling, Option<&str>) -> Option<Vec<u8>>;

/// What the rules made of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Its labels as sent: copy it.
    Same,
    /// A rule dropped it: cut it.
    Dropped,
    /// The labels the rules left, sorted: write it again.
    Changed,
}

impl Relabelling {
    /// The rules on one series' labels, in the order sent, into `labels`. `strip`: the HA
    /// replica label, removed first.
    pub(crate) fn outcome<'a>(
        &'a self,
        sent: &[(&'a str, &'a str)],
        strip: Option<&str>,
        labels: &mut Labels<'a>,
    ) -> Outcome {
        labels.clear();
        for &(name, value) in sent {
            labels.set(name, value);
        }
        self.run(strip, labels, |labels| {
            labels.len() == sent.len()
                && labels.iter().zip(sent).all(|(label, sent)| label == *sent)
        })
    }

    /// [`Self::outcome`] for labels of which some are not UTF-8. Mimir's rules see them as Go
    /// strings, so they are read lossily here (each bad piece U+FFFD) for the rules to match
    /// on: a rule may drop such a series, or drop the label. A series that still carries such
    /// text after the rules goes on as sent, for the series checks to refuse as Mimir's do;
    /// written again, it would carry U+FFFD in place of the bytes sent. One left without it
    /// has changed.
    #[cold]
    fn outcome_lossy<'a>(
        &'a self,
        sent: &[(&'a [u8], &'a [u8])],
        strip: Option<&str>,
        labels: &mut Labels<'a>,
    ) -> Outcome {
        labels.clear();
        for &(name, value) in sent {
            labels.set(
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(value),
            );
        }
        let carries_it = |labels: &Labels| {
            labels.iter().any(|(name, value)| {
                name.contains(char::REPLACEMENT_CHARACTER)
                    || value.contains(char::REPLACEMENT_CHARACTER)
            })
        };
        self.run(strip, labels, carries_it)
    }

    /// The rules on `labels` as read: `strip` removed and the tenant's label set first.
    /// `same`: whether what they left is to go on as sent.
    fn run<'a>(
        &'a self,
        strip: Option<&str>,
        labels: &mut Labels<'a>,
        same: impl FnOnce(&Labels) -> bool,
    ) -> Outcome {
        if let Some(replica) = strip {
            labels.remove(replica);
        }
        labels.set(TENANT_LABEL, &*self.tenant);
        if !self.rules.process(labels) {
            return Outcome::Dropped;
        }
        labels.remove(TENANT_LABEL);
        if same(labels) {
            Outcome::Same
        } else {
            Outcome::Changed
        }
    }
}

fn write_field(out: &mut Vec<u8>, tag: u32, payload: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// The rules on a remote-write 1.0 `WriteRequest`: the body to check and forward instead,
/// or `None` when they change nothing (or the body cannot be read: the scan then says why).
pub(super) fn v1(raw: &[u8], relabelling: &Relabelling, strip: Option<&str>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut changed = false;
    let (mut sent, mut labels) = (Vec::new(), Labels::new());
    let (mut message, mut label) = (Vec::new(), Vec::new());
    for field in Fields(raw) {
        let field = field?;
        if field.tag != 1 || field.wire_type != WireType::LengthDelimited {
            out.extend_from_slice(field.whole);
            continue;
        }
        sent.clear();
        let mut text = true;
        for part in Fields(field.payload) {
            let part = part?;
            if part.tag == 1 {
                let (name, value) = v1_label(&part)?;
                match (std::str::from_utf8(name), std::str::from_utf8(value)) {
                    (Ok(name), Ok(value)) => sent.push((name, value)),
                    _ => text = false,
                }
            }
        }
        let outcome = if text {
            relabelling.outcome(&sent, strip, &mut labels)
        } else {
            relabelling.outcome_lossy(&v1_labels(field.payload)?, strip, &mut labels)
        };
        match outcome {
            Outcome::Same => out.extend_from_slice(field.whole),
            Outcome::Dropped => changed = true,
            Outcome::Changed => {
                changed = true;
                message.clear();
                for (name, value) in labels.iter() {
                    label.clear();
                    write_field(&mut label, 1, name.as_bytes());
                    write_field(&mut label, 2, value.as_bytes());
                    write_field(&mut message, 1, &label);
                }
                for other in Fields(field.payload) {
                    let other = other?;
                    if other.tag != 1 {
                        message.extend_from_slice(other.whole);
                    }
                }
                write_field(&mut out, 1, &message);
            }
        }
    }
    changed.then_some(out)
}

/// A 1.0 `Label`'s name and value (each field's last value, as a decode keeps it), not yet
/// read as text.
fn v1_label<'a>(field: &Field<'a>) -> Option<(&'a [u8], &'a [u8])> {
    if field.wire_type != WireType::LengthDelimited {
        return None;
    }
    // As senders write it, mostly: the scan's own fast reader.
    plain_label(field.payload).or_else(|| {
        let (name, value, _) = any_label(field.payload).ok()?;
        Some((name, value))
    })
}

/// A 1.0 series' labels as bytes, for [`Relabelling::outcome_lossy`]: off the usual path.
#[cold]
fn v1_labels(series: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    Fields(series)
        .filter_map(|part| match part {
            Some(part) if part.tag != 1 => None,
            part => Some(part.and_then(|part| v1_label(&part))),
        })
        .collect()
}

/// A 2.0 series' labels as bytes, through the symbols, as [`v1_labels`].
#[cold]
fn v2_labels_sent<'a>(
    references: &[u32],
    symbols: &[Result<&'a str, &'a [u8]>],
) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let symbol = |reference: u32| match *symbols.get(reference as usize)? {
        Ok(text) => Some(text.as_bytes()),
        Err(bytes) => Some(bytes),
    };
    references
        .chunks_exact(2)
        .map(|pair| Some((symbol(pair[0])?, symbol(pair[1])?)))
        .collect()
}

/// The rules on a remote-write 2.0 `Request`, as [`v1`]: series' `labels_refs` are resolved
/// through the symbols, and a changed series points at the symbols of its new labels.
pub(super) fn v2(raw: &[u8], relabelling: &Relabelling, strip: Option<&str>) -> Option<Vec<u8>> {
    // Each symbol's text, or its bytes when it is not UTF-8.
    let mut symbols: Vec<Result<&str, &[u8]>> = Vec::new();
    for field in Fields(raw) {
        let field = field?;
        if field.tag == 4 {
            if field.wire_type != WireType::LengthDelimited {
                return None;
            }
            symbols.push(std::str::from_utf8(field.payload).map_err(|_| field.payload));
        }
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut changed = false;
    // The symbol of each text, built on the first series that needs one; texts appended.
    let mut index: Option<HashMap<String, u32>> = None;
    let mut appended: Vec<String> = Vec::new();
    let (mut references, mut sent, mut labels) = (Vec::new(), Vec::new(), Labels::new());
    let (mut packed, mut message) = (Vec::new(), Vec::new());
    for field in Fields(raw) {
        let field = field?;
        if field.tag != 5 || field.wire_type != WireType::LengthDelimited {
            out.extend_from_slice(field.whole);
            continue;
        }
        references.clear();
        for refs in Fields(field.payload) {
            let refs = refs?;
            if refs.tag != 1 {
                continue;
            }
            match refs.wire_type {
                WireType::LengthDelimited => {
                    let mut packed = refs.payload;
                    while !packed.is_empty() {
                        references.push(u32::try_from(decode_varint(&mut packed).ok()?).ok()?);
                    }
                }
                WireType::Varint => {
                    let mut value = refs.payload;
                    references.push(u32::try_from(decode_varint(&mut value).ok()?).ok()?);
                }
                _ => return None,
            }
        }
        if references.len() % 2 != 0 {
            return None;
        }
        sent.clear();
        let mut text = true;
        for pair in references.chunks_exact(2) {
            let symbol = |reference: u32| symbols.get(reference as usize).copied();
            match (symbol(pair[0])?, symbol(pair[1])?) {
                (Ok(name), Ok(value)) => sent.push((name, value)),
                _ => text = false,
            }
        }
        let outcome = if text {
            relabelling.outcome(&sent, strip, &mut labels)
        } else {
            let labels_sent = v2_labels_sent(&references, &symbols)?;
            relabelling.outcome_lossy(&labels_sent, strip, &mut labels)
        };
        match outcome {
            Outcome::Same => out.extend_from_slice(field.whole),
            Outcome::Dropped => changed = true,
            Outcome::Changed => {
                changed = true;
                let index = index.get_or_insert_with(|| {
                    let mut index = HashMap::with_capacity(symbols.len());
                    for (at, text) in symbols.iter().enumerate() {
                        if let Ok(text) = text {
                            index.entry(text.to_string()).or_insert(at as u32);
                        }
                    }
                    index
                });
                let mut symbol = |text: &str| -> u32 {
                    if let Some(&at) = index.get(text) {
                        return at;
                    }
                    let at = (symbols.len() + appended.len()) as u32;
                    index.insert(text.to_string(), at);
                    appended.push(text.to_string());
                    at
                };
                packed.clear();
                for (name, value) in labels.iter() {
                    encode_varint(u64::from(symbol(name)), &mut packed);
                    encode_varint(u64::from(symbol(value)), &mut packed);
                }
                message.clear();
                write_field(&mut message, 1, &packed);
                for other in Fields(field.payload) {
                    let other = other?;
                    if other.tag != 1 {
                        message.extend_from_slice(other.whole);
                    }
                }
                write_field(&mut out, 5, &message);
            }
        }
    }
    for text in &appended {
        write_field(&mut out, 4, text.as_bytes());
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote_write::prompb::{Exemplar, Label, Sample, TimeSeries, WriteRequest};
    use crate::remote_write::v2_proto;
    use prost::Message;
    use runtime_config::relabel::RuleConfig;

    fn relabelling(yaml: &str) -> Relabelling {
        let configs: Vec<RuleConfig> = serde_yaml_ng::from_str(yaml).unwrap();
        Relabelling {
            rules: Arc::new(Relabel::new(configs).unwrap()),
            tenant: Arc::from("t1"),
        }
    }

    fn series(labels: &[(&str, &str)], value: f64) -> TimeSeries {
        TimeSeries {
            labels: labels
                .iter()
                .map(|(name, value)| Label {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            samples: vec![Sample {
                value,
                timestamp: 1_000,
            }],
            ..TimeSeries::default()
        }
    }

    const RULES: &str = "- source_labels: [__name__]\n  regex: go_.*\n  action: drop\n\
                         - source_labels: [__meta_tenant_id]\n  target_label: tenant\n\
                         - regex: pod\n  action: labeldrop\n";

    /// A series with a label that is not UTF-8 goes on as sent, for the series checks to
    /// refuse; the rules still change the request's other series.
    #[test]
    fn a_v1_series_with_a_label_that_is_not_utf8_goes_on_as_sent() {
        let rules = relabelling(RULES);
        let request = WriteRequest {
            timeseries: vec![
                series(&[("__name__", "up"), ("a", "BAD"), ("pod", "p1")], 1.0),
                series(&[("__name__", "up"), ("pod", "p1")], 2.0),
            ],
            metadata: vec![],
        };
        let mut raw = request.encode_to_vec();
        let at = raw.windows(3).position(|bytes| bytes == b"BAD").unwrap();
        raw[at + 1] = 0xff;
        let out = v1(&raw, &rules, None).expect("the rules change the second series");
        let first = Fields(&out).next().unwrap().unwrap();
        let sent = Fields(&raw).next().unwrap().unwrap();
        assert_eq!(first.whole, sent.whole, "the first series as sent");
        let rest = &out[first.whole.len()..];
        let forwarded = WriteRequest::decode(rest).unwrap();
        let labels: Vec<_> = forwarded.timeseries[0]
            .labels
            .iter()
            .map(|l| &l.name)
            .collect();
        assert_eq!(labels, ["__name__", "tenant"], "pod cut, tenant set");
    }

    #[test]
    fn v1_series_are_dropped_changed_or_copied_as_sent() {
        let rules = relabelling(RULES);
        let mut kept = series(&[("__name__", "up"), ("pod", "p1")], 1.0);
        kept.exemplars.push(Exemplar {
            labels: vec![Label {
                name: "trace_id".into(),
                value: "abc".into(),
            }],
            value: 1.0,
            timestamp: 1_000,
        });
        let request = WriteRequest {
            timeseries: vec![series(&[("__name__", "go_gc")], 2.0), kept.clone()],
            metadata: vec![],
        };
        let mut raw = request.encode_to_vec();
        // A field a newer sender might add, which must reach the receiver.
        encode_key(15, WireType::Varint, &mut raw);
        encode_varint(7, &mut raw);
        // And a group, which prost and the scan skip: the rules still run.
        let group = [14 << 3 | 3, 1 << 3, 1, 14 << 3 | 4];
        raw.extend_from_slice(&group);
        let out = v1(&raw, &rules, None).expect("the rules change this request");
        let forwarded = WriteRequest::decode(out.as_slice()).unwrap();
        let mut expected = kept;
        expected.labels = vec![
            Label {
                name: "__name__".into(),
                value: "up".into(),
            },
            Label {
                name: "tenant".into(),
                value: "t1".into(),
            },
        ];
        assert_eq!(
            forwarded.timeseries,
            vec![expected],
            "go_gc dropped, pod cut, tenant set"
        );
        assert!(
            out.ends_with(&[&[15 << 3, 7][..], &group].concat()),
            "the unknown fields are kept"
        );

        // Nothing to change: `None`, and the client's bytes go on.
        let quiet = relabelling("- source_labels: [__name__]\n  regex: nothing\n  action: drop\n");
        assert_eq!(v1(&raw, &quiet, None), None);
        // Labels sent out of order or with an empty value come out sorted and without it, as
        // Mimir's builder writes them.
        let unsorted = WriteRequest {
            timeseries: vec![series(&[("z", "1"), ("__name__", "m"), ("e", "")], 1.0)],
            metadata: vec![],
        };
        let out = v1(&unsorted.encode_to_vec(), &quiet, None).unwrap();
        assert_eq!(
            WriteRequest::decode(out.as_slice()).unwrap().timeseries,
            vec![series(&[("__name__", "m"), ("z", "1")], 1.0)]
        );
        // The HA replica label is gone before the rules run: a rule cannot see it.
        let replica = relabelling("- source_labels: [__replica__]\n  regex: r1\n  action: drop\n");
        let ha = WriteRequest {
            timeseries: vec![series(&[("__name__", "m"), ("__replica__", "r1")], 1.0)],
            metadata: vec![],
        };
        let out = v1(&ha.encode_to_vec(), &replica, Some("__replica__")).unwrap();
        assert_eq!(
            WriteRequest::decode(out.as_slice()).unwrap().timeseries,
            vec![series(&[("__name__", "m")], 1.0)]
        );
        assert_eq!(
            v1(&ha.encode_to_vec(), &replica, None),
            Some(Vec::new()),
            "dropped"
        );
        // A body the walk cannot read is left to the scan.
        assert_eq!(v1(&[0x0a, 0x05, 0x01], &rules, None), None);
    }

    fn v2_request(series: &[&[(&str, &str)]]) -> v2_proto::Request {
        let mut symbols = vec![String::new()];
        let mut timeseries = Vec::new();
        for labels in series {
            let mut refs = Vec::new();
            for text in labels.iter().flat_map(|(name, value)| [name, value]) {
                let at = symbols
                    .iter()
                    .position(|symbol| symbol == text)
                    .unwrap_or_else(|| {
                        symbols.push(text.to_string());
                        symbols.len() - 1
                    });
                refs.push(at as u32);
            }
            timeseries.push(v2_proto::TimeSeries {
                labels_refs: refs,
                samples: vec![v2_proto::Sample {
                    value: 1.0,
                    timestamp: 1_000,
                }],
                ..Default::default()
            });
        }
        v2_proto::Request {
            symbols,
            timeseries,
        }
    }

    /// On 2.0 too, a series with a label whose symbol is not UTF-8 goes on as sent; the rules
    /// still change the others, and the symbols keep their places.
    #[test]
    fn a_v2_series_with_a_symbol_that_is_not_utf8_goes_on_as_sent() {
        let rules = relabelling(RULES);
        let request = v2_request(&[
            &[("__name__", "up"), ("a", "BAD"), ("pod", "p1")],
            &[("__name__", "up"), ("pod", "p1")],
        ]);
        let flip = |mut bytes: Vec<u8>, from: &[u8], to: &[u8]| {
            let at = bytes.windows(3).position(|window| window == from).unwrap();
            bytes[at..at + 3].copy_from_slice(to);
            bytes
        };
        let raw = flip(request.encode_to_vec(), b"BAD", b"B\xffD");
        let out = v2(&raw, &rules, None).expect("the rules change the second series");
        let forwarded = v2_proto::Request::decode(&flip(out, b"B\xffD", b"BAD")[..]).unwrap();
        let labels = v2_labels(&forwarded);
        let owned = |labels: &[(&str, &str)]| -> Vec<(String, String)> {
            labels
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            labels,
            vec![
                owned(&[("__name__", "up"), ("a", "BAD"), ("pod", "p1")]),
                owned(&[("__name__", "up"), ("tenant", "t1")]),
            ]
        );
    }

    /// Each series' labels, resolved through the symbols.
    fn v2_labels(request: &v2_proto::Request) -> Vec<Vec<(String, String)>> {
        request
            .timeseries
            .iter()
            .map(|series| {
                series
                    .labels_refs
                    .chunks_exact(2)
                    .map(|pair| {
                        (
                            request.symbols[pair[0] as usize].clone(),
                            request.symbols[pair[1] as usize].clone(),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn v2_series_point_at_the_symbols_of_their_new_labels() {
        let rules = relabelling(RULES);
        let request = v2_request(&[
            &[("__name__", "go_gc")],
            &[("__name__", "up"), ("pod", "p1")],
            &[("__name__", "kept"), ("tenant", "t1")],
        ]);
        let raw = request.encode_to_vec();
        let out = v2(&raw, &rules, None).unwrap();
        let forwarded = v2_proto::Request::decode(out.as_slice()).unwrap();
        let pairs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect()
        };
        assert_eq!(
            v2_labels(&forwarded),
            vec![
                pairs(&[("__name__", "up"), ("tenant", "t1")]),
                pairs(&[("__name__", "kept"), ("tenant", "t1")]),
            ]
        );
        // The request's symbols stay where they were; `tenant` and `t1` were there already,
        // so nothing is appended.
        assert_eq!(forwarded.symbols, request.symbols);
        // A text the request lacks is appended once, after the others.
        let env = relabelling("- target_label: env\n  replacement: prod\n");
        let out = v2(&raw, &env, None).unwrap();
        let forwarded = v2_proto::Request::decode(out.as_slice()).unwrap();
        assert_eq!(
            forwarded.symbols[..request.symbols.len()],
            request.symbols[..]
        );
        assert_eq!(
            forwarded.symbols[request.symbols.len()..],
            ["env".to_string(), "prod".to_string()]
        );
        assert_eq!(
            v2_labels(&forwarded)[0],
            pairs(&[("__name__", "go_gc"), ("env", "prod")])
        );
        // A reference out of range is left to the scan, which refuses it.
        let mut broken = v2_request(&[&[("__name__", "m")]]);
        broken.timeseries[0].labels_refs[1] = 99;
        assert_eq!(v2(&broken.encode_to_vec(), &env, None), None);
    }

    /// Rules that see text that is not UTF-8 as Mimir's do, each bad byte a character: the
    /// first drops by name, the second by the bad value itself (`.` matching it), the third
    /// drops a label so that the series is left clean, the fourth copies such text into a
    /// new label, which leaves the series with it.
    const SEEING: &str = "- source_labels: [__name__]\n  regex: go_.*\n  action: drop\n\
                          - source_labels: [a]\n  regex: B.D\n  action: drop\n\
                          - regex: bad\n  action: labeldrop\n\
                          - source_labels: [c]\n  target_label: copy\n";

    /// The series [`SEEING`] is run on, each value `BAD` to be made `B\xffD`.
    const SEEN: [&[(&str, &str)]; 5] = [
        &[("__name__", "go_gc"), ("z", "BAD")],
        &[("__name__", "up"), ("a", "BAD")],
        &[("__name__", "up"), ("bad", "BAD")],
        &[("__name__", "up"), ("c", "BAD")],
        &[("__name__", "up"), ("d", "ok")],
    ];

    /// Every `from` in `bytes` made `to`, of the same length.
    fn flip_all(mut bytes: Vec<u8>, from: &[u8], to: &[u8]) -> Vec<u8> {
        let mut at = 0;
        while let Some(found) = bytes[at..].windows(from.len()).position(|w| w == from) {
            bytes[at + found..at + found + from.len()].copy_from_slice(to);
            at += found + from.len();
        }
        bytes
    }

    /// What [`SEEING`] leaves of [`SEEN`]: two dropped, one rewritten clean, the one that
    /// still carries the bad text as sent (the checks refuse it), the clean one as sent.
    fn seen_forwarded() -> Vec<Vec<(String, String)>> {
        [
            &[("__name__", "up")][..],
            &[("__name__", "up"), ("c", "BAD")],
            &[("__name__", "up"), ("d", "ok")],
        ]
        .iter()
        .map(|labels| {
            labels
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect()
        })
        .collect()
    }

    #[test]
    fn the_rules_see_a_v1_label_that_is_not_utf8_as_mimirs_do() {
        let request = WriteRequest {
            timeseries: SEEN.iter().map(|labels| series(labels, 1.0)).collect(),
            metadata: vec![],
        };
        let raw = flip_all(request.encode_to_vec(), b"BAD", b"B\xffD");
        let out = v1(&raw, &relabelling(SEEING), None).expect("the rules drop and change");
        let forwarded = WriteRequest::decode(&flip_all(out.clone(), b"B\xffD", b"BAD")[..]);
        let labels: Vec<Vec<(String, String)>> = forwarded
            .unwrap()
            .timeseries
            .iter()
            .map(|series| {
                let labels = series.labels.iter();
                labels.map(|l| (l.name.clone(), l.value.clone())).collect()
            })
            .collect();
        assert_eq!(labels, seen_forwarded());
        let fourth = Fields(&raw).nth(3).unwrap().unwrap().whole;
        assert!(
            out.windows(fourth.len()).any(|w| w == fourth),
            "the series that still carries the bad bytes goes on byte for byte"
        );
    }

    #[test]
    fn the_rules_see_a_v2_symbol_that_is_not_utf8_as_mimirs_do() {
        let request = v2_request(&SEEN);
        let raw = flip_all(request.encode_to_vec(), b"BAD", b"B\xffD");
        let out = v2(&raw, &relabelling(SEEING), None).expect("the rules drop and change");
        let forwarded = v2_proto::Request::decode(&flip_all(out, b"B\xffD", b"BAD")[..]);
        let forwarded = forwarded.unwrap();
        assert_eq!(v2_labels(&forwarded), seen_forwarded());
        assert_eq!(forwarded.symbols, request.symbols, "no symbol appended");
    }

    proptest::proptest! {
        /// Any bytes: no panic, and either nothing to change or a body prost can decode.
        #[test]
        fn any_bytes_are_read_or_left_to_the_scan(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let rules = relabelling(RULES);
            if let Some(out) = v1(&raw, &rules, Some("__replica__")) {
                proptest::prop_assert!(WriteRequest::decode(out.as_slice()).is_ok());
            }
            if let Some(out) = v2(&raw, &rules, None) {
                proptest::prop_assert!(v2_proto::Request::decode(out.as_slice()).is_ok());
            }
        }

        /// The walk against a full decode: the series it forwards are the decoded request's,
        /// each with the labels the rules make of it, in order, samples untouched.
        #[test]
        fn v1_forwards_what_the_rules_make_of_a_decoded_request(
            names in proptest::collection::vec(
                (proptest::sample::select(vec!["go_gc", "up", "kept"]),
                 proptest::option::of(proptest::sample::select(vec!["p1", "p2"])),
                 proptest::option::of(proptest::sample::select(vec!["r", "t1"]))),
                0..8),
        ) {
            let rules = relabelling(RULES);
            let request = WriteRequest {
                timeseries: names
                    .iter()
                    .enumerate()
                    .map(|(index, (name, pod, tenant))| {
                        let mut labels = vec![("__name__", *name)];
                        labels.extend(pod.map(|pod| ("pod", pod)));
                        labels.extend(tenant.map(|tenant| ("tenant", tenant)));
                        series(&labels, index as f64)
                    })
                    .collect(),
                metadata: vec![],
            };
            let raw = request.encode_to_vec();
            let expected: Vec<TimeSeries> = request
                .timeseries
                .iter()
                .filter_map(|series| {
                    let mut labels = Labels::new();
                    for label in &series.labels {
                        labels.set(label.name.as_str(), label.value.as_str());
                    }
                    labels.set(TENANT_LABEL, "t1");
                    rules.rules.process(&mut labels).then(|| {
                        labels.remove(TENANT_LABEL);
                        TimeSeries {
                            labels: labels
                                .iter()
                                .map(|(name, value)| Label { name: name.into(), value: value.into() })
                                .collect(),
                            ..series.clone()
                        }
                    })
                })
                .collect();
            let forwarded = match v1(&raw, &rules, None) {
                Some(out) => WriteRequest::decode(out.as_slice()).unwrap().timeseries,
                None => request.timeseries.clone(),
            };
            proptest::prop_assert_eq!(forwarded, expected);
        }
    }
}
