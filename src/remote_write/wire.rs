//! The protobuf checks both remote-write scans (1.0 in `mod.rs`, 2.0 in `v2.rs`) walk the
//! wire format with, below them both.

use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

/// Checks a `Sample` (1.0 and 2.0 alike: `double value = 1; int64 timestamp = 2;`) by prost's
/// rules, as `check::<Sample>` would, without its generic merge loop: samples are most of a
/// request, and this is the scan's inner loop. Each known field must have its wire type (and
/// its 8 bytes, or a well-formed varint); other fields are skipped as prost skips them.
/// `fuzz`'s differential target and the property tests hold the two to the same answers.
///
/// Returns the sample's timestamp (the last one, as a decode keeps; 0 when missing), which
/// series validation reads.
#[inline]
pub(crate) fn check_sample(buf: &[u8]) -> Result<i64, String> {
    match plain_sample(buf) {
        Some(timestamp) => Ok(timestamp),
        None => check_any_sample(buf),
    }
}

/// A sample as senders write it: the value (key 0x09, 8 bytes), then the timestamp (key
/// 0x10, a varint of at most 10 bytes that ends the message); its timestamp. `None` for any
/// other encoding, which [`check_any_sample`] reads.
#[inline(always)]
fn plain_sample(buf: &[u8]) -> Option<i64> {
    let [0x09, _, _, _, _, _, _, _, _, 0x10, ref varint @ ..] = *buf else {
        return None;
    };
    // A well-formed varint that is the rest of the message: every byte but the last has the
    // continuation bit, and the tenth may only be 0 or 1 (prost's own rule).
    let (last, more) = varint.split_last()?;
    if varint.len() > 10
        || *last >= 0x80
        || more.iter().any(|b| *b < 0x80)
        || (varint.len() == 10 && *last > 1)
    {
        return None;
    }
    let value = varint
        .iter()
        .rev()
        .fold(0u64, |value, b| (value << 7) | u64::from(b & 0x7f));
    Some(value as i64)
}

/// [`check_sample`] for any encoding of a sample, and its errors.
#[inline(never)]
fn check_any_sample(mut buf: &[u8]) -> Result<i64, String> {
    let mut timestamp = 0;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match tag {
            1 => {
                if wire_type != WireType::SixtyFourBit {
                    return Err(format!(
                        "Sample.value has wire type {wire_type:?}, expected SixtyFourBit"
                    ));
                }
                if buf.len() < 8 {
                    return Err("Sample.value: buffer underflow".to_string());
                }
                buf = &buf[8..];
            }
            2 => {
                if wire_type != WireType::Varint {
                    return Err(format!(
                        "Sample.timestamp has wire type {wire_type:?}, expected Varint"
                    ));
                }
                timestamp =
                    decode_varint(&mut buf).map_err(|e| format!("Sample.timestamp: {e}"))? as i64;
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(timestamp)
}

/// Checks a sample, histogram, exemplar or metadata message by decoding it with the
/// protocol's own types: each known field must have its wire type and, for strings, valid
/// UTF-8, exactly as a full decode requires. (A sample decodes without allocating; the rarer
/// histograms, exemplars and metadata may allocate.) Only series and labels, the bulk of a
/// request, are walked by hand.
pub(crate) fn check<M: prost::Message + Default>(buf: &[u8]) -> Result<(), String> {
    M::decode(buf).map(drop).map_err(|err| err.to_string())
}

/// Whether `bytes` are valid UTF-8. Label names and most values are ASCII, which a word at a
/// time checks faster than the general validator does for strings this short.
#[inline]
pub(crate) fn is_utf8(bytes: &[u8]) -> bool {
    is_ascii(bytes) || std::str::from_utf8(bytes).is_ok()
}

/// Whether every byte of `bytes` is ASCII: eight bytes a load, OR-ed together with no branch
/// a byte (the last load overlaps the one before it), and two overlapping 4-byte loads under
/// 8 bytes. A label's whole field is a few dozen bytes; `<[u8]>::is_ascii` takes a byte at a
/// time under 16.
#[inline(always)]
pub(crate) fn is_ascii(bytes: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let n = bytes.len();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let half = |at: usize| u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()));
    let seen = match n {
        0..=3 => bytes.iter().fold(0u64, |seen, b| seen | u64::from(*b)),
        4..=7 => half(0) | half(n - 4),
        _ => (0..n / 8).fold(word(n - 8), |seen, i| seen | word(i * 8)),
    };
    seen & HIGH == 0
}

/// The field of key `key` (a length-delimited field's one-byte key) as senders write it, with
/// a length under 128 that fits: its bytes, `buf` moved past it. `None`, `buf` untouched, for
/// anything else, which the general reader (`decode_key`, then [`field`]) takes.
#[inline(always)]
pub(crate) fn short_field<'a>(buf: &mut &'a [u8], key: u8) -> Option<&'a [u8]> {
    let [first, len, ref rest @ ..] = **buf else {
        return None;
    };
    let len = usize::from(len);
    if first != key || len >= 0x80 || len > rest.len() {
        return None;
    }
    let (bytes, after) = rest.split_at(len);
    *buf = after;
    Some(bytes)
}

/// A label as senders write it: the name (key 0x0a), then the value (key 0x12), each once,
/// both under 128 bytes; its name and value, not yet checked as UTF-8. `None` for any other
/// encoding (an empty value, which proto3 leaves out, among them), which the general
/// reader takes.
#[inline(always)]
pub(crate) fn plain_label(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let [0x0a, name_len, ref rest @ ..] = *buf else {
        return None;
    };
    let name_len = name_len as usize;
    if name_len >= 0x80 || rest.len() < name_len + 2 {
        return None;
    }
    let (name, rest) = rest.split_at(name_len);
    let [0x12, value_len, ref value @ ..] = *rest else {
        return None;
    };
    (value_len < 0x80 && value.len() == value_len as usize).then_some((name, value))
}

/// A `Label`'s name and value in any encoding: fields in any order or repeated (the last of
/// each, as a decode keeps), unknown ones skipped, a missing one empty; and whether every
/// name and value it held was UTF-8 (prost's decode checks each, the ones it replaces too).
/// A field of the wrong wire type or length is an error.
#[inline(never)]
pub(crate) fn any_label(mut buf: &[u8]) -> Result<(&[u8], &[u8], bool), String> {
    let (mut name, mut value): (&[u8], &[u8]) = (b"", b"");
    let mut text = true;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        let slot = match tag {
            1 => &mut name,
            2 => &mut value,
            _ => {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .map_err(|e| e.to_string())?;
                continue;
            }
        };
        *slot = field(&mut buf, wire_type, if tag == 1 { "name" } else { "value" })?;
        text &= is_utf8(slot);
    }
    Ok((name, value, text))
}

/// A length-delimited field's bytes, after checking its wire type and length. On the scan's
/// inner loop: the error messages are built out of line.
#[inline(always)]
pub(crate) fn field<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    name: &str,
) -> Result<&'a [u8], String> {
    if wire_type != WireType::LengthDelimited {
        return Err(wrong_wire_type(name, wire_type));
    }
    let len = match decode_varint(buf) {
        Ok(len) => len,
        Err(err) => return Err(format_field_error(name, &err)),
    };
    if len > buf.len() as u64 {
        return Err(too_short(name, len, buf.len()));
    }
    let (bytes, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(bytes)
}

#[cold]
#[inline(never)]
fn wrong_wire_type(name: &str, wire_type: WireType) -> String {
    format!("field `{name}` has wire type {wire_type:?}, expected LengthDelimited")
}

#[cold]
#[inline(never)]
fn format_field_error(name: &str, err: &prost::DecodeError) -> String {
    format!("field `{name}`: {err}")
}

#[cold]
#[inline(never)]
fn too_short(name: &str, len: u64, remaining: usize) -> String {
    format!("field `{name}` claims {len} bytes but only {remaining} remain")
}

/// One field of a message: its number, its wire type, its bytes from the key on, and its
/// payload (a length-delimited field's contents; else the value's bytes).
pub(super) struct Field<'a> {
    pub tag: u32,
    pub wire_type: WireType,
    pub whole: &'a [u8],
    pub payload: &'a [u8],
}

/// The fields of a message, in order, for walks that read on where they can (the relabelling
/// walk, the HA tracker's sample time); an item is `None` where the message stops being well
/// formed (a group is skipped whole, as prost skips it), and is the last.
pub(super) struct Fields<'a>(pub &'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Option<Field<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = read_field(&mut self.0);
        if field.is_none() {
            self.0 = &[];
        }
        Some(field)
    }
}

fn read_field<'a>(buf: &mut &'a [u8]) -> Option<Field<'a>> {
    let start = *buf;
    let (tag, wire_type) = decode_key(buf).ok()?;
    let length = match wire_type {
        WireType::Varint => {
            let before = buf.len();
            decode_varint(buf).ok()?;
            before - buf.len()
        }
        WireType::SixtyFourBit => 8,
        WireType::ThirtyTwoBit => 4,
        WireType::LengthDelimited => usize::try_from(decode_varint(buf).ok()?).ok()?,
        // A group (proto2, never written by a remote-write sender), skipped to its end as
        // prost and the scan skip it, so a walk reads on past it.
        WireType::StartGroup => {
            let before = buf.len();
            skip_field(wire_type, tag, buf, DecodeContext::default()).ok()?;
            before - buf.len()
        }
        WireType::EndGroup => return None,
    };
    let payload = match wire_type {
        // Read already: its bytes end where `buf` now starts.
        WireType::Varint | WireType::StartGroup => {
            &start[start.len() - buf.len() - length..start.len() - buf.len()]
        }
        _ => {
            let (payload, rest) = buf.split_at_checked(length)?;
            *buf = rest;
            payload
        }
    };
    Some(Field {
        tag,
        wire_type,
        whole: &start[..start.len() - buf.len()],
        payload,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time check answers as the standard library's, at every length its
        /// loads take a different way.
        #[test]
        fn is_ascii_agrees_with_the_standard_library(
            bytes in prop::collection::vec(prop_oneof![30 => 0u8..0x80, 1 => 0x80u8..=0xff], 0..40),
        ) {
            prop_assert_eq!(super::is_ascii(&bytes), bytes.is_ascii());
        }
    }
}
