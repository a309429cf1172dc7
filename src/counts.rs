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

/// Why a body was refused. Each message is meant for the client that sent it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("decompressed body is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("invalid snappy block: {0}")]
    Snappy(String),
    #[error("invalid protobuf WriteRequest: {0}")]
    Protobuf(String),
    #[error("invalid OTLP metrics request: {0}")]
    Otlp(String),
}
