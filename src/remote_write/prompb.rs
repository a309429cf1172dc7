//! Prometheus remote-write 1.0 messages (`prometheus/prompb/remote.proto`, `types.proto`) as
//! prost types, written by hand so the build needs no `protoc`.
//!
//! The push path does not decode into these: it scans (see [`super::scan`]). They serve as the
//! oracle in tests, as the baseline in the scan benchmark, and to encode the load generator's
//! requests.

use crate::counts::WriteCounts;

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub exemplars: Vec<Exemplar>,
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<Histogram>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Exemplar {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(double, tag = "2")]
    pub value: f64,
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

/// An [`Exemplar`] whose label text is read as bytes: what the checks read, as Mimir reads a
/// body without checking that its text is UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawExemplar {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<RawLabel>,
    #[prost(double, tag = "2")]
    pub value: f64,
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

/// A [`Label`] read as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawLabel {
    #[prost(bytes = "vec", tag = "1")]
    pub name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// A native histogram, every field of `prompb/types.proto`'s `Histogram`: the scan checks each
/// histogram against this type, so it refuses exactly what a full decode refuses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    #[prost(oneof = "histogram::Count", tags = "1, 2")]
    pub count: Option<histogram::Count>,
    #[prost(double, tag = "3")]
    pub sum: f64,
    #[prost(sint32, tag = "4")]
    pub schema: i32,
    #[prost(double, tag = "5")]
    pub zero_threshold: f64,
    #[prost(oneof = "histogram::ZeroCount", tags = "6, 7")]
    pub zero_count: Option<histogram::ZeroCount>,
    #[prost(message, repeated, tag = "8")]
    pub negative_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "9")]
    pub negative_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "10")]
    pub negative_counts: Vec<f64>,
    #[prost(message, repeated, tag = "11")]
    pub positive_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "12")]
    pub positive_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "13")]
    pub positive_counts: Vec<f64>,
    #[prost(int32, tag = "14")]
    pub reset_hint: i32,
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
    #[prost(double, repeated, tag = "16")]
    pub custom_values: Vec<f64>,
}

pub mod histogram {
    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Count {
        #[prost(uint64, tag = "1")]
        CountInt(u64),
        #[prost(double, tag = "2")]
        CountFloat(f64),
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum ZeroCount {
        #[prost(uint64, tag = "6")]
        ZeroCountInt(u64),
        #[prost(double, tag = "7")]
        ZeroCountFloat(f64),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketSpan {
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricMetadata {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// A [`MetricMetadata`] whose text is read as bytes (see [`RawExemplar`]); the same on the
/// wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawMetricMetadata {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub metric_family_name: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub help: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub unit: Vec<u8>,
}

impl From<MetricMetadata> for RawMetricMetadata {
    fn from(metadata: MetricMetadata) -> Self {
        RawMetricMetadata {
            r#type: metadata.r#type,
            metric_family_name: metadata.metric_family_name.into_bytes(),
            help: metadata.help.into_bytes(),
            unit: metadata.unit.into_bytes(),
        }
    }
}

impl WriteRequest {
    /// A request of `series` series with one sample each, named after `seed` so that
    /// consecutive requests differ; the shape Prometheus sends.
    pub fn synthetic(series: usize, seed: u64, timestamp_ms: i64) -> Self {
        let timeseries = (0..series)
            .map(|i| TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "weir_loadgen_series".into(),
                    },
                    Label {
                        name: "instance".into(),
                        value: format!("loadgen-{}", seed % 16),
                    },
                    Label {
                        name: "series".into(),
                        value: i.to_string(),
                    },
                ],
                samples: vec![Sample {
                    value: (seed as f64) + i as f64,
                    timestamp: timestamp_ms,
                }],
                ..Default::default()
            })
            .collect();
        WriteRequest {
            timeseries,
            metadata: Vec::new(),
        }
    }

    /// The same request with these labels added to every series.
    pub fn with_labels(mut self, labels: &[(&str, &str)]) -> Self {
        for series in &mut self.timeseries {
            series
                .labels
                .extend(labels.iter().map(|(name, value)| Label {
                    name: name.to_string(),
                    value: value.to_string(),
                }));
        }
        self
    }

    /// The body of a remote-write POST: protobuf, then snappy raw-block compression.
    pub fn encode_snappy(&self) -> Vec<u8> {
        let raw = prost::Message::encode_to_vec(self);
        snap::raw::Encoder::new()
            .compress_vec(&raw)
            .expect("snappy compresses any input")
    }

    /// What the scanner should count for this request: a series with no labels counts for
    /// nothing (Mimir's distributor drops it).
    pub fn counts(&self) -> WriteCounts {
        let labelled = || self.timeseries.iter().filter(|s| !s.labels.is_empty());
        WriteCounts {
            series: labelled().count() as u64,
            samples: labelled().map(|s| s.samples.len() as u64).sum(),
            histograms: labelled().map(|s| s.histograms.len() as u64).sum(),
            exemplars: labelled().map(|s| s.exemplars.len() as u64).sum(),
            metadata: self.metadata.len() as u64,
        }
    }
}
