//! Scalars read as Mimir's YAML reader (yaml.v3) reads them into typed keys, where the YAML
//! crate alone would refuse them: a whole number written as a float (`1e6`, `40.0`) for a
//! count, and YAML 1.1's `yes`, `no`, `on`, `off` (and `y`, `n`, in any of their cases) for a
//! boolean. Used with `#[serde(default, deserialize_with = "…")]` on optional keys.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, Error, Unexpected, Visitor};

/// An optional count: an integer, or a float with no fraction, in the type's range.
pub(crate) fn count<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    deserializer.deserialize_option(Optional(CountVisitor(PhantomData::<T>)))
}

/// An optional boolean: `true`/`false`, or YAML 1.1's words for them.
pub(crate) fn boolean<'de, D>(deserializer: D) -> Result<Option<bool>, D::Error>
where
    D: Deserializer<'de>,
{
    deserializer.deserialize_option(Optional(BoolVisitor))
}

/// `null` (or `~`, or nothing) is `None`; anything else is the inner visitor's.
struct Optional<V>(V);

impl<'de, V: Visitor<'de> + Copy> Visitor<'de> for Optional<V> {
    type Value = Option<V::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self.0).map(Some)
    }
}

struct CountVisitor<T>(PhantomData<T>);

impl<T> Clone for CountVisitor<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for CountVisitor<T> {}

impl<T: TryFrom<u64>> Visitor<'_> for CountVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a whole number, at least 0, at most {}", max::<T>())
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<T, E> {
        T::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<T, E> {
        let unsigned =
            u64::try_from(value).map_err(|_| E::invalid_value(Unexpected::Signed(value), &self))?;
        self.visit_u64(unsigned)
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<T, E> {
        // 2^64 itself is not a u64: the bound is strict.
        if value.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&value) {
            self.visit_u64(value as u64)
        } else {
            Err(E::invalid_value(Unexpected::Float(value), &self))
        }
    }
}

/// The largest value of `T` a count can be, for the message.
fn max<T: TryFrom<u64>>() -> u64 {
    // The largest power of two less one that `T` takes: exact for u8 to u64.
    (0..64)
        .rev()
        .map(|bits| u64::MAX >> (63 - bits))
        .find(|&max| T::try_from(max).is_ok())
        .unwrap_or(0)
}

#[derive(Clone, Copy)]
struct BoolVisitor;

impl Visitor<'_> for BoolVisitor {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("true or false (or yes, no, on, off)")
    }

    fn visit_bool<E: Error>(self, value: bool) -> Result<bool, E> {
        Ok(value)
    }

    fn visit_str<E: Error>(self, value: &str) -> Result<bool, E> {
        // yaml.v3's YAML 1.1 words for a boolean key, in the spellings it takes.
        match value {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
            _ => Err(E::invalid_value(Unexpected::Str(value), &self)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    struct Keys {
        #[serde(default, deserialize_with = "count")]
        big: Option<u64>,
        #[serde(default, deserialize_with = "count")]
        small: Option<u32>,
        #[serde(default, deserialize_with = "boolean")]
        flag: Option<bool>,
    }

    fn read(yaml: &str) -> Result<Keys, String> {
        serde_yaml_ng::from_str(yaml).map_err(|err| err.to_string())
    }

    #[test]
    fn counts_take_whole_floats_as_mimir_does() {
        assert_eq!(read("big: 1e6").unwrap().big, Some(1_000_000));
        assert_eq!(read("small: 40.0").unwrap().small, Some(40));
        assert_eq!(read("small: 40").unwrap().small, Some(40));
        assert_eq!(read("big: ~").unwrap().big, None);
        assert_eq!(read("{}").unwrap(), Keys::default());
        for (yaml, refused) in [
            ("big: 1.5", "floating point `1.5`"),
            ("big: -20", "integer `-20`"),
            ("small: 5e9", "`5000000000`"),
            ("small: 4294967296", "integer `4294967296`"),
            ("big: 1e20", "floating point"),
            ("big: lots", "string \"lots\""),
        ] {
            let err = read(yaml).unwrap_err();
            assert!(err.contains(refused), "{yaml}: {err}");
        }
        assert!(read("small: x").unwrap_err().contains("at most 4294967295"));
    }

    #[test]
    fn booleans_take_yaml_1_1_words_as_mimir_does() {
        for (yaml, value) in [
            ("flag: true", true),
            ("flag: yes", true),
            ("flag: On", true),
            ("flag: Y", true),
            ("flag: false", false),
            ("flag: no", false),
            ("flag: OFF", false),
        ] {
            assert_eq!(read(yaml).unwrap().flag, Some(value), "{yaml}");
        }
        assert!(read("flag: maybe").unwrap_err().contains("maybe"));
        assert!(read("flag: 1").is_err());
    }
}
