//! Prost types generated from Prometheus' own remote-write 2.0 contract
//! (`proto/prometheus/write/v2/types.proto`, vendored with its licence). The push path never
//! decodes into them: tests, benches and the load generator use them to build real 2.0 bodies,
//! and the differential tests check the zero-copy scan against a full decode with them.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/io.prometheus.write.v2.rs"));

impl Request {
    /// Snappy-compressed protobuf, as a 2.0 sender puts it on the wire.
    pub fn encode_snappy(&self) -> Vec<u8> {
        let raw = prost::Message::encode_to_vec(self);
        snap::raw::Encoder::new()
            .compress_vec(&raw)
            .expect("snappy compresses any input")
    }
}
