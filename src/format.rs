//! Which decoder reads a push: the format from its headers ([`Format`]) and the dispatch to
//! the remote-write scans or the OTLP decoder ([`decode`]). Above both decoders, so they never
//! import each other.

use crate::counts::{DecodeError, Decoded, UnsupportedMedia, WriteCounts};
use crate::otlp::{self, OtlpFormat};
use crate::remote_write;

/// The protobuf message a push carries, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `prometheus.WriteRequest`: `application/x-protobuf` with no `proto=` or
    /// `proto=prometheus.WriteRequest`, and (as Mimir does) a missing or other media type.
    V1,
    /// `application/x-protobuf;proto=io.prometheus.write.v2.Request`.
    V2,
    /// An OTLP metrics export (`POST /otlp/v1/metrics`), protobuf or JSON.
    Otlp(OtlpFormat),
}

impl Format {
    /// The format from the push's headers.
    pub fn from_headers(
        content_type: Option<&[u8]>,
        content_encoding: Option<&[u8]>,
    ) -> Result<Format, UnsupportedMedia> {
        if let Some(encoding) = content_encoding {
            let encoding = String::from_utf8_lossy(encoding);
            if !encoding.trim().eq_ignore_ascii_case("snappy") {
                return Err(UnsupportedMedia(format!(
                    "unsupported Content-Encoding {:?}: remote-write bodies must be \
                     snappy-compressed (block format)",
                    encoding.trim()
                )));
            }
        }
        let Some(content_type) = content_type else {
            return Ok(Format::V1);
        };
        let content_type = String::from_utf8_lossy(content_type);
        let mut parts = content_type.split(';');
        let media_type = parts.next().unwrap_or("").trim();
        if !media_type.eq_ignore_ascii_case("application/x-protobuf") {
            return Ok(Format::V1);
        }
        for parameter in parts {
            let Some((name, value)) = parameter.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("proto") {
                continue;
            }
            return match value.trim().trim_matches('"') {
                "prometheus.WriteRequest" => Ok(Format::V1),
                "io.prometheus.write.v2.Request" => Ok(Format::V2),
                other => Err(UnsupportedMedia(format!(
                    "unsupported remote-write message proto={other:?}: weir accepts \
                     prometheus.WriteRequest (remote-write 1.0) and \
                     io.prometheus.write.v2.Request (2.0)"
                ))),
            };
        }
        Ok(Format::V1)
    }
}

/// Decodes a push body of at most `max_size` decoded bytes as `format`, counting what it
/// carries.
/// [`decode`] with Mimir's series validation: the counts of what passed, what to forward, and
/// what was refused ([`remote_write::decode_validated`], [`remote_write::v2::decode_validated`],
/// [`crate::otlp_checks::decode_validated`]).
pub fn decode_validated(
    body: &[u8],
    max_size: usize,
    format: Format,
    validation: &remote_write::validate::Validation,
) -> Result<Decoded, DecodeError> {
    match format {
        Format::V1 => remote_write::decode_validated(body, max_size, validation),
        Format::V2 => remote_write::v2::decode_validated(body, max_size, validation),
        Format::Otlp(otlp) => {
            crate::otlp_checks::decode_validated(body, max_size, otlp, validation)
        }
    }
}

pub fn decode(body: &[u8], max_size: usize, format: Format) -> Result<WriteCounts, DecodeError> {
    match format {
        Format::V1 => remote_write::decode(body, max_size, remote_write::scan),
        Format::V2 => remote_write::decode(body, max_size, remote_write::v2::scan),
        Format::Otlp(otlp) => otlp::decode(body, max_size, otlp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_follows_the_content_type_as_the_2_0_specification_says() {
        let format = |content_type: Option<&str>, encoding: Option<&str>| {
            Format::from_headers(content_type.map(str::as_bytes), encoding.map(str::as_bytes))
        };
        assert_eq!(format(None, None), Ok(Format::V1));
        assert_eq!(
            format(Some("application/x-protobuf"), Some("snappy")),
            Ok(Format::V1)
        );
        assert_eq!(
            format(
                Some("application/x-protobuf;proto=prometheus.WriteRequest"),
                None
            ),
            Ok(Format::V1)
        );
        assert_eq!(
            format(
                Some("Application/X-Protobuf; proto=\"io.prometheus.write.v2.Request\""),
                Some("SNAPPY")
            ),
            Ok(Format::V2)
        );
        // Mimir reads other media types as 1.0; so does weir (the scan then decides).
        assert_eq!(format(Some("text/plain"), None), Ok(Format::V1));
        assert!(format(
            Some("application/x-protobuf;proto=io.prometheus.write.v3.Request"),
            None
        )
        .unwrap_err()
        .0
        .contains("io.prometheus.write.v3.Request"));
        assert!(format(None, Some("gzip")).unwrap_err().0.contains("gzip"));
        // One line of prose each, without the source's indentation in it.
        assert_eq!(
            format(None, Some("gzip")).unwrap_err().0,
            "unsupported Content-Encoding \"gzip\": remote-write bodies must be \
             snappy-compressed (block format)"
        );
        let v3 = format(Some("application/x-protobuf;proto=v3"), None)
            .unwrap_err()
            .0;
        assert_eq!(
            v3,
            "unsupported remote-write message proto=\"v3\": weir accepts \
             prometheus.WriteRequest (remote-write 1.0) and io.prometheus.write.v2.Request (2.0)"
        );
    }
}
