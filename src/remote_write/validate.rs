//! Mimir's series validation, on the remote-write 1.0 scan: a series with too many labels, a
//! label name or value too long, an invalid metric or label name, a duplicate label name, or
//! a sample too far in the future or the past is refused, with Mimir's reasons, and the rest
//! of the request goes on (see [`super::decode_validated`]).
//!
//! The checks run as the scan walks each label and sample, on what it already holds: a count,
//! two lengths and a byte loop over each name. Messages are built only for a refused series.

use runtime_config::ValidationLimits;

use crate::counts::SeriesReason;

/// The limits a request is checked against, the replica's clock (Unix milliseconds), and the
/// label names the tenant's series lose first (`drop_labels`).
#[derive(Debug, Clone)]
pub struct Validation {
    pub limits: ValidationLimits,
    pub now_ms: i64,
    pub drop_labels: Option<std::sync::Arc<[String]>>,
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

    /// Whether a label of this name is dropped.
    #[inline]
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.drop_labels
            .as_ref()
            .is_some_and(|labels| labels.iter().any(|label| label.as_bytes() == name))
    }

    pub fn new(limits: ValidationLimits, now_ms: i64) -> Validation {
        let millis = |period: std::time::Duration| period.as_millis().min(i64::MAX as u128) as i64;
        Validation {
            limits,
            now_ms,
            drop_labels: None,
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
    metric_name: Option<&'a [u8]>,
    previous_name: &'a [u8],
    /// The first label that failed a per-label check, with its index.
    label_error: Option<(SeriesReason, u32)>,
    min_timestamp: i64,
    max_timestamp: i64,
    /// The byte ranges, in the series, of the labels `drop_labels` cuts.
    pub(crate) dropped: Vec<std::ops::Range<usize>>,
}

impl<'a> SeriesCheck<'a> {
    pub(crate) fn new() -> Self {
        SeriesCheck {
            dropped: Vec::new(),
            labels: 0,
            metric_name: None,
            previous_name: b"",
            label_error: None,
            min_timestamp: i64::MAX,
            max_timestamp: i64::MIN,
        }
    }

    /// A label, in the order of the series.
    #[inline]
    pub(crate) fn label(&mut self, name: &'a [u8], value: &'a [u8], limits: &ValidationLimits) {
        if name == b"__name__" {
            self.metric_name = Some(value);
        }
        if self.label_error.is_none() {
            let reason = if !is_label_name(name) {
                Some(SeriesReason::LabelInvalid)
            } else if name.len() > limits.max_label_name_length as usize {
                Some(SeriesReason::LabelNameTooLong)
            } else if value.len() > limits.max_label_value_length as usize {
                Some(SeriesReason::LabelValueTooLong)
            } else if name == self.previous_name {
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
            Some(name) if !is_metric_name(name) => SeriesReason::MetricNameInvalid,
            Some(_) if self.labels > limits.max_label_names_per_series => {
                SeriesReason::MaxLabelNamesPerSeries
            }
            Some(_) => match self.label_error {
                Some((reason, _)) => reason,
                None if self.max_timestamp > validation.latest_ms => SeriesReason::TooFarInFuture,
                None if self.min_timestamp < validation.earliest_ms => SeriesReason::TooFarInPast,
                None => return None,
            },
        };
        Some((reason, self.message(reason, validation, series)))
    }

    #[cold]
    #[inline(never)]
    fn message(&self, reason: SeriesReason, validation: &Validation, series: &[u8]) -> String {
        let limits = &validation.limits;
        let labels: Vec<(String, String)> = labels_of(series)
            .into_iter()
            .filter(|(name, _)| !validation.drops(name.as_bytes()))
            .collect();
        let named = render(&labels);
        let label = self
            .label_error
            .and_then(|(_, index)| labels.get(index as usize))
            .cloned()
            .unwrap_or_default();
        let id = reason.as_str().replace('_', "-");
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
            SeriesReason::LabelValueTooLong => (
                format!(
                    "received a series whose label value length exceeds the limit (actual: {}, \
                     limit: {}), label: '{}' value: '{}' series: '{named}'",
                    label.1.len(),
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
        };
        format!("{text} (err-weir-{id}).{advice}")
    }
}

/// Prometheus' legacy label name: `[a-zA-Z_][a-zA-Z0-9_]*` (Mimir's default scheme). One
/// table lookup a byte: every label of every series comes here.
#[inline]
fn is_label_name(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => {
            NAME_BYTE[*first as usize] == FIRST && rest.iter().all(|b| NAME_BYTE[*b as usize] != 0)
        }
        None => false,
    }
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

/// Prometheus' legacy metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`. A table lookup a byte, as
/// for label names (one a series).
#[inline]
fn is_metric_name(name: &[u8]) -> bool {
    let allowed = |b: u8| NAME_BYTE[b as usize] != 0 || b == b':';
    match name.split_first() {
        Some((first, rest)) => {
            (NAME_BYTE[*first as usize] == FIRST || *first == b':')
                && rest.iter().all(|b| allowed(*b))
        }
        None => false,
    }
}

/// A series' labels, from its (already checked) bytes.
fn labels_of(mut series: &[u8]) -> Vec<(String, String)> {
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
            if let Ok(label) = <super::prompb::Label as prost::Message>::decode(label) {
                labels.push((label.name, label.value));
            }
        } else if skip_field(wire_type, tag, &mut series, DecodeContext::default()).is_err() {
            break;
        }
    }
    labels
}

/// `name{a="b", c="d"}`, at most 200 characters, as Mimir names a series.
fn render(labels: &[(String, String)]) -> String {
    let name = labels
        .iter()
        .find(|(label, _)| label == "__name__")
        .map(|(_, value)| value.as_str())
        .unwrap_or("");
    let rest: Vec<String> = labels
        .iter()
        .filter(|(label, _)| label != "__name__")
        .map(|(label, value)| format!("{label}={value:?}"))
        .collect();
    clip(&format!("{name}{{{}}}", rest.join(", ")))
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
}
