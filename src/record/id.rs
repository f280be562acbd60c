//! Thread ids: ULIDs, shown in the standard 26-character encoding, stored as
//! 16 big-endian bytes (so keys sort by creation time), abbreviable to a
//! unique prefix like hashes.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::Ulid;

/// Characters in an encoded ULID.
pub const ID_LEN: usize = 26;

/// The shortest thread-id prefix accepted.
pub const MIN_ID_PREFIX_LEN: usize = 6;

/// A thread id (ULID).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadId(Ulid);

/// Why a string is not a thread id or id prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseIdError {
    /// Not a valid ULID.
    #[error("'{input}' is not a thread id (26 characters of Crockford base32, the first 0 to 7)")]
    Invalid {
        /// The text given.
        input: String,
    },
    /// Too short to be a prefix.
    #[error(
        "'{input}' is too short to name a thread: give at least {MIN_ID_PREFIX_LEN} characters"
    )]
    TooShort {
        /// The text given.
        input: String,
    },
}

impl ThreadId {
    /// The smallest id (all zero bits): a lower bound for key ranges.
    pub const NIL: ThreadId = ThreadId(Ulid::nil());

    /// A new id for the current time.
    pub fn generate() -> Self {
        ThreadId(Ulid::generate())
    }

    /// The 16-byte key form.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0.to_bytes()
    }

    /// From the 16-byte key form.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| ThreadId(Ulid::from_bytes(b)))
    }

    /// Creation time encoded in the id (ms since the epoch).
    pub const fn timestamp_ms(self) -> u64 {
        self.0.timestamp_ms()
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0.to_string())
    }
}

impl fmt::Debug for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ThreadId({})", self.0)
    }
}

impl FromStr for ThreadId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseIdError::Invalid {
            input: s.to_owned(),
        };
        if !fits_128_bits(s) {
            return Err(invalid());
        }
        Ulid::from_string(&s.to_ascii_uppercase())
            .map(ThreadId)
            .map_err(|_| invalid())
    }
}

/// Whether an id (or a prefix of one) can name 128 bits: 26 base-32
/// characters hold 130, so the first is at most `7`. The `ulid` crate's
/// decoder does not check it, and `81M…` would quietly name `01M…`.
fn fits_128_bits(s: &str) -> bool {
    s.as_bytes().first().is_none_or(|c| *c <= b'7')
}

/// In JSON a thread id is its 26-character ULID.
impl schemars::JsonSchema for ThreadId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ThreadId".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A thread id: a ULID, 26 Crockford base-32 characters, the first 0 to 7 (128 bits).",
            "type": "string",
            "pattern": "^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
        })
    }
}

impl Serialize for ThreadId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            s.serialize_bytes(&self.to_bytes())
        }
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = ThreadId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 16-byte ULID")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ThreadId, E> {
                ThreadId::from_slice(v).ok_or_else(|| E::invalid_length(v.len(), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ThreadId, E> {
                v.parse().map_err(E::custom)
            }
        }
        if d.is_human_readable() {
            d.deserialize_str(IdVisitor)
        } else {
            d.deserialize_bytes(IdVisitor)
        }
    }
}

/// A full thread id or a unique prefix of one (6–26 characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPrefix(String);

impl IdPrefix {
    /// The prefix, uppercased.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The full id, when all 26 characters are given.
    pub fn as_full_id(&self) -> Option<ThreadId> {
        (self.0.len() == ID_LEN)
            .then(|| self.0.parse().ok())
            .flatten()
    }

    /// The smallest key whose encoding starts with this prefix.
    pub fn lower_bound(&self) -> [u8; 16] {
        let padded = format!("{:0<width$}", self.0, width = ID_LEN);
        Ulid::from_string(&padded).map_or([0; 16], |u| u.to_bytes())
    }

    /// Whether the id's encoding starts with this prefix.
    pub fn matches(&self, id: &ThreadId) -> bool {
        id.0.to_string().starts_with(&self.0)
    }
}

impl FromStr for IdPrefix {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.to_ascii_uppercase();
        if upper.len() < MIN_ID_PREFIX_LEN {
            return Err(ParseIdError::TooShort {
                input: s.to_owned(),
            });
        }
        // Valid iff padding it with zeros gives a valid ULID.
        let padded = format!("{:0<width$}", upper, width = ID_LEN);
        if upper.len() > ID_LEN || !fits_128_bits(&upper) || Ulid::from_string(&padded).is_err() {
            return Err(ParseIdError::Invalid {
                input: s.to_owned(),
            });
        }
        Ok(IdPrefix(upper))
    }
}

impl fmt::Display for IdPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_by_time() {
        let a = ThreadId(Ulid::from_parts(1000, 5));
        let b = ThreadId(Ulid::from_parts(2000, 1));
        assert!(a.to_bytes() < b.to_bytes());
        assert!(a.to_string() < b.to_string());
        assert_eq!(a.to_string().parse::<ThreadId>().unwrap(), a);
        assert_eq!(a.to_string().to_lowercase().parse::<ThreadId>().unwrap(), a);
        assert_eq!(ThreadId::from_slice(&a.to_bytes()), Some(a));
    }

    #[test]
    fn prefixes() {
        let id = ThreadId::generate();
        let s = id.to_string();
        let p: IdPrefix = s[..8].to_lowercase().parse().unwrap();
        assert!(p.matches(&id));
        assert!(p.lower_bound() <= id.to_bytes());
        assert!("01AB".parse::<IdPrefix>().is_err());
        assert!("01ABCU".parse::<IdPrefix>().is_err(), "U is not Crockford");
        let full: IdPrefix = s.parse().unwrap();
        assert_eq!(full.as_full_id(), Some(id));
    }

    #[test]
    fn an_id_past_128_bits_is_refused_not_wrapped() {
        let max = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ";
        assert!(max.parse::<ThreadId>().is_ok());
        assert!(max.parse::<IdPrefix>().is_ok());
        for s in [
            "81M85T90DDDQKBS4EBF631FVBP",
            "ZZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "81M85T",
        ] {
            assert!(s.parse::<IdPrefix>().is_err(), "{s}");
            if s.len() == ID_LEN {
                assert!(s.parse::<ThreadId>().is_err(), "{s}");
            }
        }
        assert!("81m85t90dddqkbs4ebf631fvbp".parse::<ThreadId>().is_err());
    }
}
