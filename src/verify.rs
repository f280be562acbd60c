//! `verify`: re-hash every blob, check every ref and every index entry.
//!
//! The scan reads the blobs database in key order, a bounded batch per read
//! transaction, so it never holds one snapshot for the whole store (which
//! would stop LMDB from reusing pages while writers run). Refs are checked in
//! the same snapshot as the blob that holds them; since only garbage
//! collection deletes blobs, a ref found missing is a real problem.

use std::fmt;
use std::ops::Bound;

use crate::hash::Hash;
use crate::node::Blob;
use crate::store::{BlobRecord, Store, StoreError};

/// Blobs checked per read transaction.
const BATCH: usize = 4096;

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Problem {
    /// A key that is not 32 bytes.
    BadKey {
        /// The key, in hex.
        key: String,
    },
    /// The stored bytes do not hash to their key.
    HashMismatch {
        /// The key.
        hash: Hash,
        /// What the bytes hash to.
        actual: Hash,
    },
    /// The record header cannot be parsed.
    BadRecord {
        /// The key.
        hash: Hash,
        /// What is wrong.
        detail: String,
    },
    /// The bytes are not a canonical blob.
    Undecodable {
        /// The key.
        hash: Hash,
        /// The decoder's error.
        detail: String,
    },
    /// The header's kind or refs differ from the blob's own.
    HeaderMismatch {
        /// The key.
        hash: Hash,
        /// What differs.
        detail: String,
    },
    /// A ref whose target is not stored.
    MissingRef {
        /// The blob holding the ref.
        hash: Hash,
        /// The missing target.
        missing: Hash,
    },
    /// The format version entry is absent or malformed.
    FormatVersion {
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::BadKey { key } => write!(f, "key {key} is not a 32-byte hash"),
            Problem::HashMismatch { hash, actual } => {
                write!(f, "blob {hash}: bytes hash to {actual} (altered content)")
            }
            Problem::BadRecord { hash, detail } => write!(f, "blob {hash}: bad record: {detail}"),
            Problem::Undecodable { hash, detail } => {
                write!(f, "blob {hash}: not a canonical blob: {detail}")
            }
            Problem::HeaderMismatch { hash, detail } => {
                write!(f, "blob {hash}: header disagrees with the blob: {detail}")
            }
            Problem::MissingRef { hash, missing } => {
                write!(f, "blob {hash}: refers to missing blob {missing}")
            }
            Problem::FormatVersion { detail } => write!(f, "format version: {detail}"),
        }
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Blobs examined.
    pub blobs_checked: u64,
    /// Refs examined.
    pub refs_checked: u64,
    /// Every problem, in key order.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether the store is clean.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Progress of a running [`verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Blobs checked so far.
    pub checked: u64,
    /// Blobs in the store when the scan started.
    pub total: u64,
}

/// Checks the whole store; `progress` is called after each batch.
pub fn verify(
    store: &Store,
    mut progress: impl FnMut(VerifyProgress),
) -> Result<VerifyReport, StoreError> {
    let inner = store.inner();
    let mut report = VerifyReport::default();
    let total = store.read(|r| {
        if let Err(e) = r.format_version() {
            report.problems.push(Problem::FormatVersion {
                detail: e.to_string(),
            });
        }
        inner
            .dbs
            .blobs
            .len(r.raw())
            .map_err(|e| inner.error("counting blobs", e))
    })?;

    let mut after: Option<Vec<u8>> = None;
    loop {
        let last = store.read(|r| {
            let range = match &after {
                Some(k) => (Bound::Excluded(k.as_slice()), Bound::Unbounded),
                None => (Bound::Unbounded, Bound::Unbounded),
            };
            let iter = inner
                .dbs
                .blobs
                .range(r.raw(), &range)
                .map_err(|e| inner.error("scanning blobs", e))?;
            let mut last = None;
            for entry in iter.take(BATCH) {
                let (key, value) = entry.map_err(|e| inner.error("scanning blobs", e))?;
                last = Some(key.to_vec());
                report.blobs_checked += 1;
                let Some(hash) = Hash::from_slice(key) else {
                    report.problems.push(Problem::BadKey {
                        key: key.iter().map(|b| format!("{b:02x}")).collect(),
                    });
                    continue;
                };
                let refs = check_blob(hash, value, &mut report.problems);
                for target in refs {
                    report.refs_checked += 1;
                    if !r.contains(&target)? {
                        report.problems.push(Problem::MissingRef {
                            hash,
                            missing: target,
                        });
                    }
                }
            }
            Ok::<_, StoreError>(last)
        })?;
        progress(VerifyProgress {
            checked: report.blobs_checked,
            total,
        });
        match last {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    Ok(report)
}

/// Checks one record; returns the refs to look up.
fn check_blob(hash: Hash, value: &[u8], problems: &mut Vec<Problem>) -> Vec<Hash> {
    let record = match BlobRecord::parse(value) {
        Ok(r) => r,
        Err(e) => {
            problems.push(Problem::BadRecord {
                hash,
                detail: e.to_string(),
            });
            return Vec::new();
        }
    };
    let header_refs: Vec<Hash> = record.refs().collect();
    let actual = Hash::of(record.bytes);
    if actual != hash {
        problems.push(Problem::HashMismatch { hash, actual });
        return header_refs;
    }
    match Blob::decode(record.bytes) {
        Err(e) => problems.push(Problem::Undecodable {
            hash,
            detail: e.to_string(),
        }),
        Ok(blob) => {
            if blob.kind() != record.kind {
                problems.push(Problem::HeaderMismatch {
                    hash,
                    detail: format!("header kind {} but blob kind {}", record.kind, blob.kind()),
                });
            }
            if blob.collect_refs() != header_refs {
                problems.push(Problem::HeaderMismatch {
                    hash,
                    detail: "header refs differ from the blob's refs".into(),
                });
            }
        }
    }
    header_refs
}
