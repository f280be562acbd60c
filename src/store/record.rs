//! The value stored for a blob in the `blobs` database.
//!
//! Layout (all integers big-endian; `docs/design.md`, "blobs"):
//!
//! | offset      | size | field                                              |
//! |-------------|------|----------------------------------------------------|
//! | 0           | 1    | record version, `1`                                |
//! | 1           | 1    | kind code (0 start, 1 state, 2 content, 3 workflow)|
//! | 2           | 8    | `written_at`: ms since the epoch of the first put  |
//! | 10          | 8    | `touched_at`: ms of the last re-put or re-link     |
//! | 18          | 4    | `n`: number of refs                                |
//! | 22          | 32·n | refs, in the blob's order                          |
//! | 22 + 32·n   | rest | the canonical bytes (hashed to the key)            |
//!
//! Garbage collection reads the kind, the times and the refs from the header
//! without decoding the payload.

use crate::hash::{HASH_LEN, Hash};
use crate::node::{EncodedBlob, Kind};

/// The record layout version written in byte 0.
pub const RECORD_VERSION: u8 = 1;

/// Size of the fixed part of the header.
pub const HEADER_LEN: usize = crate::backend::format::BLOB_HEADER_LEN;

/// A parsed record, borrowing the stored value.
#[derive(Debug, Clone, Copy)]
pub struct BlobRecord<'a> {
    /// The blob's kind.
    pub kind: Kind,
    /// When the blob was first written (ms since the epoch).
    pub written_at: u64,
    /// When a writer last re-put or re-linked it (ms since the epoch).
    pub touched_at: u64,
    refs: &'a [u8],
    /// The canonical bytes.
    pub bytes: &'a [u8],
}

/// Why a stored value is not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Shorter than its header says.
    #[error("record is truncated ({len} bytes)")]
    Truncated {
        /// The value's length.
        len: usize,
    },
    /// A record version this build does not know.
    #[error("unknown record version {0}")]
    UnknownVersion(u8),
    /// A kind code this build does not know.
    #[error("unknown kind code {0}")]
    UnknownKind(u8),
}

fn be_u64(b: &[u8]) -> u64 {
    b.iter().fold(0, |acc, x| (acc << 8) | u64::from(*x))
}

impl<'a> BlobRecord<'a> {
    /// Parses a stored value.
    pub fn parse(value: &'a [u8]) -> Result<Self, RecordError> {
        let truncated = RecordError::Truncated { len: value.len() };
        let Some((header, rest)) = value.split_first_chunk::<HEADER_LEN>() else {
            return Err(truncated);
        };
        let [version, code, ..] = *header;
        if version != RECORD_VERSION {
            return Err(RecordError::UnknownVersion(version));
        }
        let kind = Kind::from_code(code).ok_or(RecordError::UnknownKind(code))?;
        let field = |at: std::ops::Range<usize>| header.get(at).map_or(0, be_u64);
        let n = usize::try_from(field(18..22)).map_err(|_| truncated.clone())?;
        let (refs, bytes) = n
            .checked_mul(HASH_LEN)
            .and_then(|len| rest.split_at_checked(len))
            .ok_or(truncated)?;
        Ok(BlobRecord {
            kind,
            written_at: field(2..10),
            touched_at: field(10..18),
            refs,
            bytes,
        })
    }

    /// The refs stored in the header.
    pub fn refs(&self) -> impl Iterator<Item = Hash> + 'a {
        self.refs
            .chunks_exact(HASH_LEN)
            .filter_map(Hash::from_slice)
    }

    /// The refs stored in the header, as 32-byte runs.
    pub fn refs_bytes(&self) -> &'a [u8] {
        self.refs
    }

    /// Number of refs in the header.
    pub fn ref_count(&self) -> usize {
        self.refs.len() / HASH_LEN
    }
}

/// Offset of `touched_at` in a record.
pub const TOUCHED_AT: std::ops::Range<usize> = 10..18;

/// A stored record's `touched_at`, without parsing the rest (`None` when the
/// value is too short to hold one).
pub fn touched_at(value: &[u8]) -> Option<u64> {
    value.get(TOUCHED_AT).map(be_u64)
}

/// Writes the record for `blob`, first put at `written_at`, into `buf`
/// (cleared first).
pub fn write_record(buf: &mut Vec<u8>, blob: &EncodedBlob, written_at: u64, touched_at: u64) {
    buf.clear();
    buf.reserve(HEADER_LEN + blob.refs().len() * HASH_LEN + blob.bytes().len());
    buf.push(RECORD_VERSION);
    buf.push(blob.kind().code());
    buf.extend_from_slice(&written_at.to_be_bytes());
    buf.extend_from_slice(&touched_at.to_be_bytes());
    // A blob cannot have 2^32 refs: its encoding would exceed LMDB's value limit.
    let n = u32::try_from(blob.refs().len()).unwrap_or(u32::MAX);
    buf.extend_from_slice(&n.to_be_bytes());
    for r in blob.refs() {
        buf.extend_from_slice(r.as_bytes());
    }
    buf.extend_from_slice(blob.bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Blob;

    #[test]
    fn record_round_trip() {
        let a = Hash::of(b"a");
        let enc = Blob::content("text", [a]).encode().unwrap();
        let mut buf = Vec::new();
        write_record(&mut buf, &enc, 0x0102_0304_0506_0708, 0x0102_0304_0506_0709);
        let rec = BlobRecord::parse(&buf).unwrap();
        assert_eq!(rec.kind, Kind::Content);
        assert_eq!(rec.written_at, 0x0102_0304_0506_0708);
        assert_eq!(rec.touched_at, 0x0102_0304_0506_0709);
        assert_eq!(touched_at(&buf), Some(rec.touched_at));
        assert_eq!(touched_at(&buf[..17]), None);
        assert_eq!(rec.refs().collect::<Vec<_>>(), vec![a]);
        assert_eq!(rec.bytes, enc.bytes());
        assert_eq!(&buf[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn damaged_headers_are_errors_not_panics() {
        assert!(matches!(
            BlobRecord::parse(&[1, 2]),
            Err(RecordError::Truncated { .. })
        ));
        let mut buf = vec![1, 2];
        buf.extend_from_slice(&[0; 16]);
        buf.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            BlobRecord::parse(&buf),
            Err(RecordError::Truncated { .. })
        ));
        buf[0] = 9;
        assert_eq!(
            BlobRecord::parse(&buf).unwrap_err(),
            RecordError::UnknownVersion(9)
        );
        buf[0] = 1;
        buf[1] = 77;
        assert_eq!(
            BlobRecord::parse(&buf).unwrap_err(),
            RecordError::UnknownKind(77)
        );
    }
}
