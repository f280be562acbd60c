//! The on-disk format's version and the fixed part of a `blobs` value:
//! what a backend must know of the layout above it to check a store at
//! open and to checksum a blob's header (docs/design.md §4).

/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Key of the format version in the `meta` table.
pub const FORMAT_VERSION_KEY: &str = "format_version";

/// Bytes of a `blobs` value's fixed header (kind, flags, timestamps, ref
/// count: §4 "Blob record"); a backend's value checksum covers these and
/// the refs, the blob's own bytes being content-addressed already.
pub const BLOB_HEADER_LEN: usize = 22;

/// Parses a stored format version value (4 bytes, big-endian).
pub(crate) fn parse_format(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_be_bytes)
}
