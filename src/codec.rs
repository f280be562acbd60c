//! Canonical MessagePack: the one byte layout every blob is hashed in.
//!
//! The rules (also in `docs/design.md`, "Canonical encoding"):
//! - maps have UTF-8 string keys, sorted by their bytes, without duplicates
//!   (structs are encoded as such maps, never as arrays);
//! - integers use the smallest MessagePack form, and non-negative integers
//!   always use the unsigned forms;
//! - floats are always `float 64`, NaN is rejected, and `-0.0` is written
//!   as `0.0` (they compare equal, so they must not hash differently);
//! - string, binary, array and map headers use the smallest form for their
//!   length; hashes are `bin 8` of 32 bytes;
//! - no extension types, nothing after the top-level value.
//!
//! [`to_canonical`] encodes with `rmp-serde` (struct fields are declared in
//! sorted order, and maps are `BTreeMap`s). [`from_canonical`] first checks the
//! bytes against the rules above with [`check_canonical`] (which gives a
//! precise error and bounds every length before anything is allocated), then
//! decodes, re-encodes and compares, so one value has exactly one encoding.

use rmp::Marker;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Deepest nesting of arrays and maps accepted on decode.
pub const MAX_DEPTH: usize = 64;

/// Why bytes could not be encoded or decoded canonically.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The value could not be serialized.
    #[error("cannot encode value: {0}")]
    Encode(String),
    /// The bytes end inside a value.
    #[error("truncated MessagePack: input ends inside the value at byte {offset}")]
    Truncated {
        /// Where the unfinished value starts.
        offset: usize,
    },
    /// Bytes remain after the top-level value.
    #[error("{count} trailing bytes after the value")]
    TrailingBytes {
        /// How many bytes follow the value.
        count: usize,
    },
    /// The bytes are MessagePack but not in the canonical layout.
    #[error("not canonical at byte {offset}: {reason}")]
    NotCanonical {
        /// Byte offset of the offending item.
        offset: usize,
        /// What rule it breaks.
        reason: &'static str,
    },
    /// A float is NaN.
    #[error("NaN at byte {offset}: NaN has no canonical encoding")]
    NaN {
        /// Byte offset of the float.
        offset: usize,
    },
    /// The bytes are canonical MessagePack but not the expected shape.
    #[error("cannot decode: {0}")]
    Decode(String),
    /// Decoding then re-encoding gave different bytes.
    #[error("not canonical: the decoded value re-encodes to different bytes")]
    ReencodeMismatch,
}

/// Encodes `value` in the canonical layout.
pub fn to_canonical<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::with_capacity(256);
    to_canonical_into(value, &mut buf)?;
    Ok(buf)
}

/// Encodes `value` in the canonical layout, appending to `buf`.
pub fn to_canonical_into<T: Serialize + ?Sized>(
    value: &T,
    buf: &mut Vec<u8>,
) -> Result<(), CodecError> {
    let mut ser = rmp_serde::Serializer::new(buf).with_struct_map();
    value
        .serialize(&mut ser)
        .map_err(|e| CodecError::Encode(e.to_string()))
}

/// Decodes canonical bytes, refusing any other encoding of the same value.
pub fn from_canonical<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    check_canonical(bytes)?;
    let value: T = rmp_serde::from_slice(bytes).map_err(|e| CodecError::Decode(e.to_string()))?;
    if to_canonical(&value)? != bytes {
        return Err(CodecError::ReencodeMismatch);
    }
    Ok(value)
}

/// Checks that `bytes` hold exactly one MessagePack value in the canonical layout.
///
/// ```
/// use uwf_db::codec::{check_canonical, CodecError};
/// assert!(check_canonical(&[0x05]).is_ok());            // positive fixint 5
/// assert!(matches!(check_canonical(&[0xcc, 0x05]),      // uint 8 holding 5
///     Err(CodecError::NotCanonical { .. })));
/// ```
pub fn check_canonical(bytes: &[u8]) -> Result<(), CodecError> {
    let mut scan = Scanner { bytes, pos: 0 };
    scan.value(0)?;
    match bytes.len() - scan.pos {
        0 => Ok(()),
        count => Err(CodecError::TrailingBytes { count }),
    }
}

struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn take(&mut self, n: usize, start: usize) -> Result<&[u8], CodecError> {
        let end = self
            .pos
            .checked_add(n)
            .and_then(|end| Some((end, self.bytes.get(self.pos..end)?)))
            .ok_or(CodecError::Truncated { offset: start })?;
        let (end, out) = end;
        self.pos = end;
        Ok(out)
    }

    fn byte(&mut self, start: usize) -> Result<u8, CodecError> {
        self.take(1, start)?
            .first()
            .copied()
            .ok_or(CodecError::Truncated { offset: start })
    }

    fn uint(&mut self, width: usize, start: usize) -> Result<u64, CodecError> {
        let raw = self.take(width, start)?;
        Ok(raw.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn len(&mut self, width: usize, start: usize, min: u64) -> Result<usize, CodecError> {
        let n = self.uint(width, start)?;
        if n < min {
            return Err(CodecError::NotCanonical {
                offset: start,
                reason: "length header is wider than needed",
            });
        }
        usize::try_from(n).map_err(|_| CodecError::Truncated { offset: start })
    }

    fn value(&mut self, depth: usize) -> Result<(), CodecError> {
        let start = self.pos;
        let not = |reason| CodecError::NotCanonical {
            offset: start,
            reason,
        };
        let marker = Marker::from_u8(self.byte(start)?);
        match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                Ok(())
            }
            Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
                let (width, min) = match marker {
                    Marker::U8 => (1, 0x80),
                    Marker::U16 => (2, 0x100),
                    Marker::U32 => (4, 0x1_0000),
                    _ => (8, 0x1_0000_0000),
                };
                if self.uint(width, start)? < min {
                    return Err(not("integer is not in its smallest form"));
                }
                Ok(())
            }
            Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
                let (width, min): (usize, i64) = match marker {
                    Marker::I8 => (1, -32),
                    Marker::I16 => (2, -128),
                    Marker::I32 => (4, -32_768),
                    _ => (8, -2_147_483_648),
                };
                let raw = self.uint(width, start)?;
                // Sign-extend the big-endian two's complement value.
                let shift = 64 - 8 * width as u32;
                let v = ((raw << shift) as i64) >> shift;
                if v >= min {
                    return Err(not("integer is not in its smallest form"));
                }
                Ok(())
            }
            Marker::F32 => Err(not("floats must be float 64")),
            Marker::F64 => {
                let bits = self.uint(8, start)?;
                if f64::from_bits(bits).is_nan() {
                    return Err(CodecError::NaN { offset: start });
                }
                if bits == (-0.0f64).to_bits() {
                    return Err(not("negative zero is written as 0.0"));
                }
                Ok(())
            }
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                self.string(marker, start).map(|_| ())
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                let n = match marker {
                    Marker::Bin8 => self.len(1, start, 0)?,
                    Marker::Bin16 => self.len(2, start, 0x100)?,
                    _ => self.len(4, start, 0x1_0000)?,
                };
                self.take(n, start).map(|_| ())
            }
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                let n = match marker {
                    Marker::FixArray(n) => usize::from(n),
                    Marker::Array16 => self.len(2, start, 16)?,
                    _ => self.len(4, start, 0x1_0000)?,
                };
                if depth >= MAX_DEPTH {
                    return Err(not("nesting is too deep"));
                }
                // Every element takes at least one byte: refuse impossible counts early.
                if n > self.bytes.len() - self.pos {
                    return Err(CodecError::Truncated { offset: start });
                }
                (0..n).try_for_each(|_| self.value(depth + 1))
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                let n = match marker {
                    Marker::FixMap(n) => usize::from(n),
                    Marker::Map16 => self.len(2, start, 16)?,
                    _ => self.len(4, start, 0x1_0000)?,
                };
                if depth >= MAX_DEPTH {
                    return Err(not("nesting is too deep"));
                }
                if n > (self.bytes.len() - self.pos) / 2 {
                    return Err(CodecError::Truncated { offset: start });
                }
                let mut previous: Option<(usize, usize)> = None;
                for _ in 0..n {
                    let key_start = self.pos;
                    let key_marker = Marker::from_u8(self.byte(key_start)?);
                    let key = self.string(key_marker, key_start)?;
                    if let Some((ps, pe)) = previous
                        && self.bytes.get(ps..pe) >= self.bytes.get(key.0..key.1)
                    {
                        return Err(CodecError::NotCanonical {
                            offset: key_start,
                            reason: "map keys are not sorted or repeat",
                        });
                    }
                    previous = Some(key);
                    self.value(depth + 1)?;
                }
                Ok(())
            }
            Marker::FixExt1
            | Marker::FixExt2
            | Marker::FixExt4
            | Marker::FixExt8
            | Marker::FixExt16
            | Marker::Ext8
            | Marker::Ext16
            | Marker::Ext32 => Err(not("extension types are not allowed")),
            Marker::Reserved => Err(not("reserved marker byte 0xc1")),
        }
    }

    /// Reads a string whose marker was already consumed; returns its byte range.
    fn string(&mut self, marker: Marker, start: usize) -> Result<(usize, usize), CodecError> {
        let n = match marker {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.len(1, start, 32)?,
            Marker::Str16 => self.len(2, start, 0x100)?,
            Marker::Str32 => self.len(4, start, 0x1_0000)?,
            _ => {
                return Err(CodecError::NotCanonical {
                    offset: start,
                    reason: "map keys must be strings",
                });
            }
        };
        let body_start = self.pos;
        let body = self.take(n, start)?;
        if std::str::from_utf8(body).is_err() {
            return Err(CodecError::NotCanonical {
                offset: start,
                reason: "string is not valid UTF-8",
            });
        }
        Ok((body_start, body_start + n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn not_canonical(bytes: &[u8]) -> bool {
        matches!(check_canonical(bytes), Err(CodecError::NotCanonical { .. }))
    }

    #[test]
    fn encoder_output_passes_the_checker() {
        let samples: Vec<Vec<u8>> = vec![
            to_canonical(&0u64).unwrap(),
            to_canonical(&127u64).unwrap(),
            to_canonical(&128u64).unwrap(),
            to_canonical(&u64::MAX).unwrap(),
            to_canonical(&-1i64).unwrap(),
            to_canonical(&-33i64).unwrap(),
            to_canonical(&-129i64).unwrap(),
            to_canonical(&i64::MIN).unwrap(),
            to_canonical(&5i64).unwrap(),
            to_canonical(&1.5f64).unwrap(),
            to_canonical(&"x".repeat(40)).unwrap(),
            to_canonical(&vec![1u8; 20]).unwrap(),
            to_canonical(&BTreeMap::from([("b", 1), ("a", 2), ("$s", 3)])).unwrap(),
        ];
        for s in samples {
            check_canonical(&s).unwrap_or_else(|e| panic!("{s:02x?}: {e}"));
        }
        // Non-negative signed values use the unsigned forms.
        assert_eq!(to_canonical(&5i64).unwrap(), vec![0x05]);
        assert_eq!(to_canonical(&200i64).unwrap(), vec![0xcc, 200]);
    }

    #[test]
    fn non_minimal_and_disallowed_forms_are_rejected() {
        assert!(not_canonical(&[0xcc, 0x05])); // uint8 5
        assert!(not_canonical(&[0xcd, 0x00, 0xff])); // uint16 255
        assert!(not_canonical(&[0xd0, 0x05])); // int8 5
        assert!(not_canonical(&[0xd0, 0xff])); // int8 -1 (fits fixneg)
        assert!(not_canonical(&[0xd9, 0x01, b'a'])); // str8 of length 1
        assert!(not_canonical(&[0xca, 0, 0, 0, 0])); // float32
        assert!(not_canonical(&[0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0])); // -0.0
        assert!(not_canonical(&[0xd4, 0, 0])); // fixext1
        assert!(not_canonical(&[0xc1])); // reserved
        // {"b":1,"a":2}: keys out of order.
        assert!(not_canonical(&[0x82, 0xa1, b'b', 1, 0xa1, b'a', 2]));
        // {"a":1,"a":2}: duplicate key.
        assert!(not_canonical(&[0x82, 0xa1, b'a', 1, 0xa1, b'a', 2]));
        // {1: 2}: integer key.
        assert!(not_canonical(&[0x81, 0x01, 0x02]));
        let nan = [0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0];
        assert!(matches!(
            check_canonical(&nan),
            Err(CodecError::NaN { offset: 0 })
        ));
        assert!(matches!(
            check_canonical(&[0x01, 0x02]),
            Err(CodecError::TrailingBytes { count: 1 })
        ));
        assert!(matches!(
            check_canonical(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(CodecError::Truncated { .. })
        ));
    }

    #[test]
    fn deep_nesting_is_refused_without_recursing_forever() {
        let bytes = vec![0x91; 10_000]; // [[[[...
        assert!(check_canonical(&bytes).is_err());
    }

    #[test]
    fn from_canonical_rejects_unsorted_maps() {
        let unsorted = [0x82, 0xa1, b'b', 1, 0xa1, b'a', 2];
        let r: Result<BTreeMap<String, u8>, _> = from_canonical(&unsorted);
        assert!(r.is_err());
        let sorted = [0x82, 0xa1, b'a', 2, 0xa1, b'b', 1];
        let m: BTreeMap<String, u8> = from_canonical(&sorted).unwrap();
        assert_eq!(m["a"], 2);
    }
}
