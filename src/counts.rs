//! What every body decoder (remote-write in [`crate::remote_write`], OTLP in [`crate::otlp`])
//! reports: what a body carries ([`WriteCounts`]) and why a body or its headers were refused
//! ([`DecodeError`], [`UnsupportedMedia`]). Below the decoders, so neither imports the other.

/// What one request carries, for the ingestion-rate cost and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    pub series: u64,
    pub samples: u64,
    pub histograms: u64,
    pub exemplars: u64,
    pub metadata: u64,
}

impl WriteCounts {
    /// `other` added to these counts.
    pub fn add(&mut self, other: &WriteCounts) {
        self.series += other.series;
        self.samples += other.samples;
        self.histograms += other.histograms;
        self.exemplars += other.exemplars;
        self.metadata += other.metadata;
    }

    /// The ingestion-rate cost, as Mimir counts it: samples + histograms + exemplars + metadata.
    pub fn cost(&self) -> u64 {
        self.samples + self.histograms + self.exemplars + self.metadata
    }
}

/// A `Content-Type` or `Content-Encoding` weir cannot read: answered 415, as the
/// remote-write 2.0 specification requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedMedia(pub String);

/// How the refusal of an OTLP export Mimir's translator takes only in part begins (its
/// converter's error), before each metric left out and why.
pub const OTLP_PARSE_ERROR: &str = "otlp parse error: ";

/// Why a body was refused. Each message is meant for the client that sent it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// `size` when known before inflating (snappy says it; gzip stops at the limit).
    #[error(
        "decompressed body is {}over the limit of {limit} bytes",
        .size.map(|size| format!("{size} bytes, ")).unwrap_or_default()
    )]
    TooLarge { size: Option<usize>, limit: usize },
    #[error("invalid snappy block: {0}")]
    Snappy(String),
    #[error("invalid protobuf WriteRequest: {0}")]
    Protobuf(String),
    #[error("invalid OTLP metrics request: {0}")]
    Otlp(String),
    /// An OTLP export of which Mimir's translator takes nothing: each of its `left_out`
    /// metrics is refused (`message` says why, metric by metric).
    #[error("invalid OTLP metrics request: nothing in the request can be ingested: {message}")]
    Untranslated { left_out: u64, message: String },
}

/// Why a series was refused by validation: Mimir's discard reasons, which are the `reason`
/// label of `weir_discarded_samples_total` and, with dashes, the error ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesReason {
    MissingMetricName,
    MetricNameInvalid,
    MaxLabelNamesPerSeries,
    MaxLabelNamesPerInfoSeries,
    LabelInvalid,
    LabelNameTooLong,
    /// A label value that is not UTF-8 (Mimir reads the body without checking it).
    LabelValueInvalid,
    LabelValueTooLong,
    DuplicateLabelNames,
    TooFarInFuture,
    TooFarInPast,
    InvalidNativeHistogramSchema,
    MaxNativeHistogramBuckets,
}

impl SeriesReason {
    pub const ALL: [SeriesReason; 13] = [
        SeriesReason::MissingMetricName,
        SeriesReason::MetricNameInvalid,
        SeriesReason::MaxLabelNamesPerSeries,
        SeriesReason::MaxLabelNamesPerInfoSeries,
        SeriesReason::LabelInvalid,
        SeriesReason::LabelNameTooLong,
        SeriesReason::LabelValueInvalid,
        SeriesReason::LabelValueTooLong,
        SeriesReason::DuplicateLabelNames,
        SeriesReason::TooFarInFuture,
        SeriesReason::TooFarInPast,
        SeriesReason::InvalidNativeHistogramSchema,
        SeriesReason::MaxNativeHistogramBuckets,
    ];

    /// The `reason` label, as Mimir's.
    pub fn as_str(self) -> &'static str {
        match self {
            SeriesReason::MissingMetricName => "missing_metric_name",
            SeriesReason::MetricNameInvalid => "metric_name_invalid",
            SeriesReason::MaxLabelNamesPerSeries => "max_label_names_per_series",
            SeriesReason::MaxLabelNamesPerInfoSeries => "max_label_names_per_info_series",
            SeriesReason::LabelInvalid => "label_invalid",
            SeriesReason::LabelNameTooLong => "label_name_too_long",
            SeriesReason::LabelValueInvalid => "label_value_invalid",
            SeriesReason::LabelValueTooLong => "label_value_too_long",
            SeriesReason::DuplicateLabelNames => "duplicate_label_names",
            SeriesReason::TooFarInFuture => "too_far_in_future",
            SeriesReason::TooFarInPast => "too_far_in_past",
            SeriesReason::InvalidNativeHistogramSchema => "invalid_native_histogram_schema",
            SeriesReason::MaxNativeHistogramBuckets => "max_native_histogram_buckets",
        }
    }
}

/// Why a metadata entry was refused by validation: Mimir's metadata discard reasons, the
/// `reason` label of `weir_discarded_metadata_total`. (A help text over the limit is cut, not
/// refused.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataReason {
    MissingMetricName,
    MetricNameTooLong,
    UnitTooLong,
}

impl MetadataReason {
    pub const ALL: [MetadataReason; 3] = [
        MetadataReason::MissingMetricName,
        MetadataReason::MetricNameTooLong,
        MetadataReason::UnitTooLong,
    ];

    /// The `reason` label, as Mimir's.
    pub fn as_str(self) -> &'static str {
        match self {
            MetadataReason::MissingMetricName => "missing_metric_name",
            MetadataReason::MetricNameTooLong => "metric_name_too_long",
            MetadataReason::UnitTooLong => "unit_too_long",
        }
    }
}

/// Why an exemplar was dropped: Mimir's exemplar discard reasons, the `reason` label of
/// `weir_discarded_exemplars_total`. A dropped exemplar never refuses its series or the push
/// (Mimir drops them and ingests the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExemplarReason {
    /// No labels at all.
    LabelsMissing,
    /// A timestamp of zero: none was set.
    TimestampInvalid,
    /// Labels longer than 128 characters, names and values together.
    LabelsTooLong,
    /// No label with both a name and a value.
    LabelsBlank,
    /// More than 5 minutes older than the request's earliest sample, or older than
    /// `past_grace_period` allows.
    TooOld,
    /// Further ahead of the replica's clock than `creation_grace_period`.
    TooFarInFuture,
    /// Past `max_exemplars_per_series_per_request` in its series.
    TooManyPerSeries,
}

impl ExemplarReason {
    pub const ALL: [ExemplarReason; 7] = [
        ExemplarReason::LabelsMissing,
        ExemplarReason::TimestampInvalid,
        ExemplarReason::LabelsTooLong,
        ExemplarReason::LabelsBlank,
        ExemplarReason::TooOld,
        ExemplarReason::TooFarInFuture,
        ExemplarReason::TooManyPerSeries,
    ];

    /// The `reason` label, as Mimir's.
    pub fn as_str(self) -> &'static str {
        match self {
            ExemplarReason::LabelsMissing => "exemplar_labels_missing",
            ExemplarReason::TimestampInvalid => "exemplar_timestamp_invalid",
            ExemplarReason::LabelsTooLong => "exemplar_labels_too_long",
            ExemplarReason::LabelsBlank => "exemplar_labels_blank",
            ExemplarReason::TooOld => "exemplar_too_old",
            ExemplarReason::TooFarInFuture => "exemplar_too_far_in_future",
            ExemplarReason::TooManyPerSeries => "too_many_exemplars_per_series_per_request",
        }
    }
}

/// Exemplars dropped from one request, by `ExemplarReason as usize`.
pub type DroppedExemplars = [u64; ExemplarReason::ALL.len()];

/// What validation discarded in one request, by reason: the samples and histograms of refused
/// series (by `SeriesReason as usize`) and the refused metadata entries (by
/// `MetadataReason as usize`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Discarded {
    pub samples: [u64; SeriesReason::ALL.len()],
    pub metadata: [u64; MetadataReason::ALL.len()],
    /// What Mimir's `discarded_samples_total` counts of them: one per refused series, however
    /// many samples it carries (its checks count once, at the first that fails).
    pub series: [u64; SeriesReason::ALL.len()],
}

impl Discarded {
    /// Samples and histograms, all reasons together.
    pub fn samples(&self) -> u64 {
        self.samples.iter().sum()
    }

    /// Metadata entries, all reasons together.
    pub fn metadata(&self) -> u64 {
        self.metadata.iter().sum()
    }
}

/// What validation refused in one request: the first error (the 400's message; a series'
/// before a metadata entry's, as Mimir checks the series first), what was discarded by reason
/// (`samples`, which holds the refused metadata entries too), and how many series.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub first: String,
    pub samples: Discarded,
    pub series: u64,
}

/// What to forward after validation and `drop_labels`.
#[derive(Debug, Clone, PartialEq)]
pub enum Forward {
    /// The client's bytes: nothing was cut or changed.
    Unchanged,
    /// The request without its refused series and metadata and its dropped labels, with its
    /// rewritten label values, histograms and help texts, re-compressed.
    Rewritten(bytes::Bytes),
    /// Nothing is left to forward.
    Nothing,
}

/// A decoded push: what it carries (after validation), what to forward, what validation
/// refused, the exemplars it dropped, and what the HA tracker said.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub counts: WriteCounts,
    pub forward: Forward,
    pub refused: Option<Refused>,
    /// Exemplars dropped by Mimir's exemplar checks (not those taken out because the
    /// tenant's exemplars are off, which Mimir does not count either).
    pub dropped_exemplars: DroppedExemplars,
    /// Samples and histograms dropped for repeating a timestamp of their series
    /// (`sample_duplicate_timestamp`), neither charged nor forwarded.
    pub repeated_timestamps: u64,
    /// The series left with no label (none sent, or each empty or dropped) and what they
    /// carried: dropped silently, as Mimir's distributor drops them (neither charged nor
    /// counted nor an error).
    pub unlabelled: WriteCounts,
    /// Metrics of an OTLP export Mimir's translator leaves out while it translates the rest
    /// (a delta metric for a tenant that does not ingest delta, one with no data, …): counted
    /// as Mimir counts them (`otlp_parse_error`), and the push, once written, answered 400.
    pub untranslated: u64,
    pub ha: crate::ha::HaOutcome,
}
