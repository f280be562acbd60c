//! Value checksums (issue 18). LMDB keeps no page checksums: a byte that
//! changes on disk inside a value (a thread record's agent path, a blob's
//! `touched_at`) is read back as if it had been written, unless the value
//! carries its own check. In a store of the checksummed layout every value
//! ends with a 4-byte trailer: the low 32 bits of XXH3-64 over the value,
//! seeded with the XXH3-64 of the key seeded with the table's index, so a
//! value read under another key or table fails too.
//!
//! A blob's value (`store/record.rs`) is a header (kind, times, refs) and
//! its canonical bytes; the bytes hash to the key (BLAKE3), which `verify`
//! checks, so the trailer covers the header alone and a read of a large
//! blob costs no more than one of a small one.
//!
//! Stores made before (the legacy layout) have no trailers; which layout a
//! store has is told by its `format_version` value, 4 bytes (legacy) or 8
//! (the version and its trailer), read before anything else. Builds from
//! before the checksummed layout refuse such a store: they expect 4 bytes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::Table;
use crate::backend::format::BLOB_HEADER_LEN as HEADER_LEN;

/// Bytes of the trailer.
pub(super) const SUM_LEN: usize = 4;

/// The part of `value` the trailer covers: all of it, but a blob's header
/// only (all of a blob value shorter than the header it claims, which a
/// damaged ref count gives: the check then fails as it should).
fn covered(table: Table, value: &[u8]) -> &[u8] {
    if table != Table::Blobs {
        return value;
    }
    let header = || {
        let n = value.get(18..HEADER_LEN)?;
        let n = usize::try_from(u32::from_be_bytes(n.try_into().ok()?)).ok()?;
        let len = n.checked_mul(32)?.checked_add(HEADER_LEN)?;
        value.get(..len)
    };
    header().unwrap_or(value)
}

/// The trailer of `value` stored under `key` in `table`.
pub(super) fn sum(table: Table, key: &[u8], value: &[u8]) -> [u8; SUM_LEN] {
    let seed = xxh3_64_with_seed(key, table.index() as u64);
    let h = xxh3_64_with_seed(covered(table, value), seed);
    // The low half: `as` truncates on purpose.
    (h as u32).to_le_bytes()
}

/// The value inside a stored one whose trailer matches; `None` when it
/// does not (or the stored value is shorter than a trailer).
pub(super) fn strip<'v>(table: Table, key: &[u8], stored: &'v [u8]) -> Option<&'v [u8]> {
    let (value, trailer) = stored.split_last_chunk::<SUM_LEN>()?;
    (sum(table, key, value) == *trailer).then_some(value)
}

/// `value` followed by its trailer.
pub(super) fn with_sum(table: Table, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(value.len() + SUM_LEN);
    stored.extend_from_slice(value);
    stored.extend_from_slice(&sum(table, key, value));
    stored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_key_or_table_fails_the_check() {
        let value = b"a thread record".to_vec();
        let mut stored = value.clone();
        stored.extend_from_slice(&sum(Table::Threads, b"k", &value));
        assert_eq!(strip(Table::Threads, b"k", &stored), Some(&value[..]));
        for at in 0..stored.len() {
            let mut bad = stored.clone();
            bad[at] ^= 0x10;
            assert_eq!(strip(Table::Threads, b"k", &bad), None, "byte {at}");
        }
        assert_eq!(strip(Table::Threads, b"j", &stored), None);
        assert_eq!(strip(Table::History, b"k", &stored), None);
        assert_eq!(strip(Table::Threads, b"k", b"abc"), None);
    }

    #[test]
    fn a_blob_trailer_covers_its_header_not_its_bytes() {
        let mut value = vec![1u8, 2];
        value.extend_from_slice(&[0; 16]);
        value.extend_from_slice(&1u32.to_be_bytes());
        value.extend_from_slice(&[7; 32]);
        value.extend_from_slice(b"canonical bytes");
        let mut stored = value.clone();
        stored.extend_from_slice(&sum(Table::Blobs, b"h", &value));
        assert!(strip(Table::Blobs, b"h", &stored).is_some());
        // The times, the ref count and the refs are covered.
        for at in [2, 11, 21, 30] {
            let mut bad = stored.clone();
            bad[at] ^= 1;
            assert_eq!(strip(Table::Blobs, b"h", &bad), None, "byte {at}");
        }
        // A ref count past the value's end is not a panic.
        let mut bad = stored.clone();
        bad[18] = 0xff;
        assert_eq!(strip(Table::Blobs, b"h", &bad), None);
    }
}
