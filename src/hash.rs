//! BLAKE3-256 content hashes: hex display, parsing and prefixes.
//!
//! A [`Hash`](struct@Hash) names a blob by the BLAKE3-256 digest of its canonical encoding
//! (see `docs/design.md`, "Canonical encoding"). People see it as 64 lowercase
//! hex characters and may abbreviate it to a unique prefix of at least
//! [`MIN_PREFIX_LEN`] characters; [`HashPrefix`] is such an abbreviation,
//! resolved against a store by [`crate::Store::resolve`].

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Length of a hash in bytes.
pub const HASH_LEN: usize = 32;

/// The shortest hex prefix accepted wherever a hash is expected.
pub const MIN_PREFIX_LEN: usize = 6;

/// A BLAKE3-256 digest naming a blob.
///
/// Serialized as 32 raw bytes in binary formats (MessagePack `bin 8`) and as a
/// 64-character lowercase hex string in human-readable formats such as JSON.
///
/// ```
/// use uwf_db::Hash;
/// let h = Hash::of(b"hello");
/// let text = h.to_string();
/// assert_eq!(text.len(), 64);
/// assert_eq!(text.parse::<Hash>().unwrap(), h);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hash([u8; HASH_LEN]);

/// Why a string is not a hash or a hash prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseHashError {
    /// A full hash must have exactly 64 hex characters.
    #[error("'{input}' is not a hash: expected 64 hex characters, got {len}")]
    WrongLength {
        /// The text that was given.
        input: String,
        /// Its length in characters.
        len: usize,
    },
    /// A prefix must be between [`MIN_PREFIX_LEN`] and 64 characters.
    #[error("'{input}' is too short to name a hash: give at least {MIN_PREFIX_LEN} hex characters")]
    PrefixTooShort {
        /// The text that was given.
        input: String,
    },
    /// A prefix longer than a hash.
    #[error("'{input}' is longer than a hash (64 hex characters)")]
    PrefixTooLong {
        /// The text that was given.
        input: String,
    },
    /// A character outside `0-9a-fA-F`.
    #[error("'{input}' is not hex: unexpected character {ch:?} at position {position}")]
    NotHex {
        /// The text that was given.
        input: String,
        /// The offending character.
        ch: char,
        /// Its character position.
        position: usize,
    },
}

impl Hash {
    /// Hashes `bytes` with BLAKE3-256.
    pub fn of(bytes: &[u8]) -> Self {
        Hash(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps 32 raw digest bytes.
    pub const fn from_bytes(bytes: [u8; HASH_LEN]) -> Self {
        Hash(bytes)
    }

    /// Reads a hash from a 32-byte slice; `None` when the length is wrong.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; HASH_LEN]>::try_from(bytes).ok().map(Hash)
    }

    /// The raw digest bytes.
    pub const fn as_bytes(&self) -> &[u8; HASH_LEN] {
        &self.0
    }

    /// The first `n` hex characters (at most 64), for display in tables.
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_string();
        s.truncate(n.min(HASH_LEN * 2));
        s
    }
}

/// Lowercase hex of any bytes (a key in a message or a report).
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    push_hex(&mut out, bytes);
    out
}

/// Appends the lowercase hex of `bytes` to `out`: two digits a byte, with
/// no formatting machinery (a hash is printed in every log line, JSON
/// answer and PostgreSQL row; `write!` a byte at a time cost a dozen
/// formatter calls a hash).
///
/// `faster_hex` writes the digits with SIMD where the CPU has it (SSE4.1,
/// AVX2), into a stack buffer appended a kilobyte of digits at a time:
/// every blob of a PostgreSQL group is sent in
/// hex, and the scalar loop this replaced was 3.6% of a runner's
/// instructions (callgrind, a 200-thread batch).
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    let mut buf = [0u8; 1024];
    for chunk in bytes.chunks(buf.len() / 2) {
        // The buffer holds a chunk's digits: this cannot fail.
        if let Ok(digits) = faster_hex::hex_encode(chunk, &mut buf) {
            out.push_str(digits);
        }
    }
}

/// The bytes of an even-length hex string (either case); `None` for
/// anything else.
///
/// Every row a PostgreSQL read returns arrives as hex (`encode(v,
/// 'hex')`): checked and decoded by `faster_hex` with SIMD, into a
/// vector allocated once at its size. The table-driven scalar loop this replaced was 9% of
/// a runner's instructions (callgrind, a 200-thread batch).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let mut out = vec![0u8; digits.len() / 2];
    faster_hex::hex_decode(digits, &mut out).ok()?;
    Some(out)
}

fn hex_digit(ch: char) -> Option<u8> {
    ch.to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn check_hex(input: &str) -> Result<Vec<u8>, ParseHashError> {
    input
        .chars()
        .enumerate()
        .map(|(position, ch)| {
            hex_digit(ch).ok_or_else(|| ParseHashError::NotHex {
                input: input.to_owned(),
                ch,
                position,
            })
        })
        .collect()
}

impl FromStr for Hash {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let len = s.chars().count();
        if len != HASH_LEN * 2 {
            return Err(ParseHashError::WrongLength {
                input: s.to_owned(),
                len,
            });
        }
        let nibbles = check_hex(s)?;
        let mut out = [0u8; HASH_LEN];
        for (byte, pair) in out.iter_mut().zip(nibbles.chunks_exact(2)) {
            if let [hi, lo] = *pair {
                *byte = (hi << 4) | lo;
            }
        }
        Ok(Hash(out))
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; HASH_LEN * 2];
        // The buffer is exactly twice the hash: this cannot fail.
        f.write_str(faster_hex::hex_encode(&self.0, &mut text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({self})")
    }
}

/// In JSON a hash is its 64 lowercase hex digits.
impl schemars::JsonSchema for Hash {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Hash".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A BLAKE3 hash: 64 lowercase hex digits.",
            "type": "string",
            "pattern": "^[0-9a-f]{64}$"
        })
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HashVisitor;
        impl Visitor<'_> for HashVisitor {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 32-byte BLAKE3 hash")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Hash, E> {
                Hash::from_slice(v).ok_or_else(|| E::invalid_length(v.len(), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Hash, E> {
                v.parse().map_err(E::custom)
            }
        }
        if deserializer.is_human_readable() {
            deserializer.deserialize_str(HashVisitor)
        } else {
            deserializer.deserialize_bytes(HashVisitor)
        }
    }
}

/// An abbreviated hash or id: between [`MIN_PREFIX_LEN`] and 64 hex characters.
///
/// ```
/// use uwf_db::{Hash, HashPrefix};
/// let h = Hash::of(b"x");
/// let p: HashPrefix = h.to_string()[..8].parse().unwrap();
/// assert!(p.matches(&h));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashPrefix {
    text: String,
    nibbles: Vec<u8>,
}

impl HashPrefix {
    /// The prefix as given, lowercased.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The smallest 32-byte key that starts with this prefix (missing nibbles are zero).
    pub fn lower_bound(&self) -> [u8; HASH_LEN] {
        let mut out = [0u8; HASH_LEN];
        for (i, n) in self.nibbles.iter().enumerate() {
            if let Some(byte) = out.get_mut(i / 2) {
                *byte |= if i % 2 == 0 { n << 4 } else { *n };
            }
        }
        out
    }

    /// Whether `key` (raw bytes) starts with this prefix.
    pub fn matches_bytes(&self, key: &[u8]) -> bool {
        self.nibbles.iter().enumerate().all(|(i, n)| {
            key.get(i / 2)
                .map(|b| if i % 2 == 0 { b >> 4 } else { b & 0x0f })
                == Some(*n)
        })
    }

    /// Whether `hash` starts with this prefix.
    pub fn matches(&self, hash: &Hash) -> bool {
        self.matches_bytes(hash.as_bytes())
    }

    /// The full hash, when the prefix has all 64 characters.
    pub fn as_full_hash(&self) -> Option<Hash> {
        (self.nibbles.len() == HASH_LEN * 2).then(|| Hash(self.lower_bound()))
    }
}

impl FromStr for HashPrefix {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let len = s.chars().count();
        if len < MIN_PREFIX_LEN {
            return Err(ParseHashError::PrefixTooShort {
                input: s.to_owned(),
            });
        }
        if len > HASH_LEN * 2 {
            return Err(ParseHashError::PrefixTooLong {
                input: s.to_owned(),
            });
        }
        let nibbles = check_hex(s)?;
        Ok(HashPrefix {
            text: s.to_ascii_lowercase(),
            nibbles,
        })
    }
}

impl fmt::Display for HashPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_match_the_formatter_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let formatted: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), formatted);
        // Lengths that end inside a 64-byte chunk of the buffer.
        for n in [1, 63, 64, 65, 100, 255] {
            assert_eq!(hex(&all[..n]), formatted[..2 * n]);
        }
        let h = Hash::of(b"digits");
        let formatted: String = h.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h.to_string(), formatted);
        assert_eq!(h.short(12), formatted[..12]);
        assert_eq!(h.short(99), formatted);
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn unhex_reads_every_byte_in_either_case_and_refuses_the_rest() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)), Some(all.clone()));
        assert_eq!(unhex(&hex(&all).to_uppercase()), Some(all));
        assert_eq!(unhex(""), Some(vec![]));
        assert_eq!(unhex("0"), None);
        // Every byte that is not a hex digit, in either place of a pair.
        for b in (0..=255u8).filter(|b| !b.is_ascii_hexdigit()) {
            let c = char::from(b);
            assert_eq!(unhex(&format!("{c}0")), None, "{b:#x}");
            assert_eq!(unhex(&format!("0{c}")), None, "{b:#x}");
            // Above 0x7f a char is two bytes: alone, and after a pair,
            // an even length, so the digits themselves are refused.
            if !b.is_ascii() {
                assert_eq!(unhex(&format!("{c}")), None, "{b:#x}");
                assert_eq!(unhex(&format!("00{c}")), None, "{b:#x}");
            }
        }
        assert_eq!(unhex("é"), None); // two bytes, neither a digit
        // Long enough for the SIMD paths (a value of a few kilobytes), in
        // either case, and a bad byte anywhere in it found.
        let long: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 256) as u8).collect();
        let digits = hex(&long);
        assert_eq!(unhex(&digits), Some(long.clone()));
        assert_eq!(unhex(&digits.to_uppercase()), Some(long));
        for at in [0, 31, 32, 63, 1023, 1024, 3001, 9999] {
            let mut bad = digits.clone().into_bytes();
            bad[at] = b'g';
            assert_eq!(unhex(std::str::from_utf8(&bad).unwrap()), None, "{at}");
        }
    }

    #[test]
    fn hex_round_trip_and_known_digest() {
        // BLAKE3 of the empty input, from the BLAKE3 reference test vectors.
        let empty = Hash::of(b"");
        assert_eq!(
            empty.to_string(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(empty.to_string().parse::<Hash>().unwrap(), empty);
        let upper = empty.to_string().to_uppercase();
        assert_eq!(upper.parse::<Hash>().unwrap(), empty);
    }

    #[test]
    fn parse_errors_name_the_problem() {
        assert!(matches!(
            "abc".parse::<Hash>(),
            Err(ParseHashError::WrongLength { len: 3, .. })
        ));
        let bad = format!("{}g", "0".repeat(63));
        assert!(matches!(
            bad.parse::<Hash>(),
            Err(ParseHashError::NotHex {
                ch: 'g',
                position: 63,
                ..
            })
        ));
        assert!(matches!(
            "abcde".parse::<HashPrefix>(),
            Err(ParseHashError::PrefixTooShort { .. })
        ));
        let long = "0".repeat(65);
        assert!(matches!(
            long.parse::<HashPrefix>(),
            Err(ParseHashError::PrefixTooLong { .. })
        ));
    }

    #[test]
    fn odd_length_prefix_bounds_and_matches() {
        let h: Hash = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
            .parse()
            .unwrap();
        let p: HashPrefix = "ABCDEF0".parse().unwrap();
        assert_eq!(p.as_str(), "abcdef0");
        assert!(p.matches(&h));
        assert_eq!(&p.lower_bound()[..4], &[0xab, 0xcd, 0xef, 0x00]);
        let q: HashPrefix = "abcdef1".parse().unwrap();
        assert!(!q.matches(&h));
        assert_eq!(
            HashPrefix::from_str(&h.to_string()).unwrap().as_full_hash(),
            Some(h)
        );
        assert_eq!(p.as_full_hash(), None);
    }
}
