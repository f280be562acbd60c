//! Export and import (SPEC §11): threads moved between stores as one
//! self-contained, deterministic bundle. Format in `docs/design.md` §4d:
//!
//! ```text
//! "UWFBNDL1"                                   8 bytes
//! threads: u32 LE count, then per thread (by id): u32 LE length, record bytes
//! blobs:   u64 LE count, then per blob (by hash): 32-byte hash, u32 LE length, canonical bytes
//! BLAKE3 of every byte above                   32 bytes
//! ```
//!
//! Export takes the named threads, their children (recursively) and every
//! blob their records reach (start, head, staged summary, workflow, and
//! everything those refer to). The same threads in the same state give the
//! same bytes. Import checks everything before it writes anything: the
//! trailer, every blob's hash and canonical form, every ref (inside the
//! bundle or already stored), every record's nodes, and that no thread id
//! exists (unless new ids are asked for); then writes it all in one
//! transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;

use serde::Serialize;

use crate::hash::Hash;
use crate::node::{Blob, Kind};
use crate::store::{Store, StoreError};
use crate::thread::{ThreadError, ThreadId, ThreadRecord, index};

/// The bundle's first bytes.
pub const MAGIC: &[u8; 8] = b"UWFBNDL1";

/// Largest bundle `import` reads (it holds the whole bundle in memory
/// while it checks it).
pub const MAX_BUNDLE: u64 = 1 << 30;

/// Blobs read per read transaction while exporting.
const BATCH: usize = 1024;

/// What went wrong with a bundle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A thread operation failed (an unknown id, say).
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// Writing the bundle failed.
    #[error("cannot write the bundle: {0}")]
    Write(#[source] std::io::Error),
    /// The bytes are not a bundle, or not a whole one.
    #[error("not a valid bundle: {0}")]
    Malformed(String),
    /// The bundle is larger than [`MAX_BUNDLE`].
    #[error("the bundle is {size} bytes; import reads at most {max} bytes")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A blob's bytes do not hash to its key, or are not canonical.
    #[error("blob {hash} in the bundle is damaged: {detail}")]
    BadBlob {
        /// The key it was stored under.
        hash: Hash,
        /// What is wrong.
        detail: String,
    },
    /// A ref that is neither in the bundle nor in the store.
    #[error("blob {blob} refers to {missing}, which is neither in the bundle nor in the store")]
    MissingRef {
        /// The blob holding the ref.
        blob: Hash,
        /// The missing target.
        missing: Hash,
    },
    /// A record that does not decode, or names a node it lacks.
    #[error("the record of thread {thread} in the bundle is unusable: {detail}")]
    BadRecord {
        /// The thread (or its position).
        thread: String,
        /// What is wrong.
        detail: String,
    },
    /// Threads of the bundle already exist in the store.
    #[error(
        "{} thread{} of the bundle already exist{} in the store ({}); nothing was imported; import with new ids (--new-ids) to keep both",
        ids.len(), if ids.len() == 1 { "" } else { "s" }, if ids.len() == 1 { "s" } else { "" },
        ids.iter().take(5).map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Exists {
        /// The ids.
        ids: Vec<ThreadId>,
    },
}

/// What an import wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    /// The threads written, as (id in the bundle, id in the store).
    pub threads: Vec<(ThreadId, ThreadId)>,
    /// Blobs in the bundle.
    pub blobs: u64,
    /// Of those, blobs the store did not hold yet.
    pub new_blobs: u64,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    /// The threads in the bundle (the ones asked for and their children).
    pub threads: Vec<ThreadId>,
    /// Blobs in the bundle.
    pub blobs: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// A writer that hashes and counts what passes through it.
struct Hashing<'w> {
    out: &'w mut dyn Write,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl Hashing<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), BundleError> {
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes).map_err(BundleError::Write)
    }

    fn put_len(&mut self, len: usize) -> Result<(), BundleError> {
        let len = u32::try_from(len)
            .map_err(|_| BundleError::Malformed(format!("an entry of {len} bytes")))?;
        self.put(&len.to_le_bytes())
    }
}

impl Store {
    /// Writes a bundle of the threads `ids`, their children and every blob
    /// they reach to `out`; deterministic: the same threads in the same
    /// state give the same bytes.
    pub fn export(
        &self,
        ids: &[ThreadId],
        out: &mut dyn Write,
    ) -> Result<ExportReport, BundleError> {
        // The threads: those asked for, then their children, recursively.
        let mut records: BTreeMap<ThreadId, ThreadRecord> = BTreeMap::new();
        let mut queue: Vec<ThreadId> = ids.to_vec();
        while let Some(id) = queue.pop() {
            if records.contains_key(&id) {
                continue;
            }
            let (record, children) = self.read(|r| {
                let (record, _) = index::find(r.tables(), id)?
                    .ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
                Ok::<_, ThreadError>((record, index::children(r.tables(), id)?))
            })?;
            records.insert(id, record);
            queue.extend(children);
        }
        // Every blob they reach, in hash order.
        let mut hashes: BTreeSet<Hash> = BTreeSet::new();
        for record in records.values() {
            for root in [
                Some(record.start),
                Some(record.head),
                Some(record.workflow_hash),
                record.staged_compact,
            ]
            .into_iter()
            .flatten()
            {
                if hashes.contains(&root) {
                    continue;
                }
                self.walk::<StoreError>(&root, |b| {
                    hashes.insert(b.hash);
                    Ok(())
                })?;
            }
        }
        let mut w = Hashing {
            out,
            hasher: blake3::Hasher::new(),
            bytes: 0,
        };
        w.put(MAGIC)?;
        let count = u32::try_from(records.len())
            .map_err(|_| BundleError::Malformed("more than 2^32 threads".into()))?;
        w.put(&count.to_le_bytes())?;
        for record in records.values() {
            let bytes = record.encode().map_err(ThreadError::from)?;
            w.put_len(bytes.len())?;
            w.put(&bytes)?;
        }
        w.put(&(hashes.len() as u64).to_le_bytes())?;
        let all: Vec<Hash> = hashes.into_iter().collect();
        for batch in all.chunks(BATCH) {
            let blobs = self.read(|r| {
                batch
                    .iter()
                    .map(|h| {
                        r.get_stored(h)?.ok_or(StoreError::UnknownHash {
                            prefix: h.to_string(),
                        })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })?;
            for b in blobs {
                w.put(b.hash.as_bytes())?;
                w.put_len(b.bytes.len())?;
                w.put(&b.bytes)?;
            }
        }
        let digest = w.hasher.finalize();
        w.out
            .write_all(digest.as_bytes())
            .map_err(BundleError::Write)?;
        w.out.flush().map_err(BundleError::Write)?;
        Ok(ExportReport {
            threads: records.keys().copied().collect(),
            blobs: all.len() as u64,
            bytes: w.bytes + 32,
        })
    }

    /// Checks `bundle` whole, then writes its blobs and threads in one
    /// transaction (all or nothing). Threads whose ids exist are refused
    /// unless `new_ids`: then every thread gets a new id, and the links
    /// between the bundle's threads (parent, active child, fork origin)
    /// follow.
    pub fn import(&self, bundle: &[u8], new_ids: bool) -> Result<ImportReport, BundleError> {
        let parsed = decode(bundle)?;
        // Blobs: hash, canonical form, refs.
        let mut blobs: HashMap<Hash, (crate::node::EncodedBlob, Kind)> = HashMap::new();
        for (hash, bytes) in &parsed.blobs {
            let bad = |detail: String| BundleError::BadBlob {
                hash: *hash,
                detail,
            };
            if Hash::of(bytes) != *hash {
                return Err(bad(format!("its bytes hash to {}", Hash::of(bytes))));
            }
            let blob = Blob::decode(bytes).map_err(|e| bad(e.to_string()))?;
            let encoded = blob.encode().map_err(|e| bad(e.to_string()))?;
            let kind = blob.kind();
            blobs.insert(*hash, (encoded, kind));
        }
        let stored = |h: &Hash| self.contains(h);
        for (hash, (encoded, _)) in &blobs {
            for target in encoded.refs() {
                if !blobs.contains_key(target) && !stored(target)? {
                    return Err(BundleError::MissingRef {
                        blob: *hash,
                        missing: *target,
                    });
                }
            }
        }
        // Records: decode, nodes present and of the right kinds.
        let mut records = Vec::with_capacity(parsed.records.len());
        for (i, bytes) in parsed.records.iter().enumerate() {
            let record = ThreadRecord::decode(bytes).map_err(|e| BundleError::BadRecord {
                thread: format!("#{}", i + 1),
                detail: e.to_string(),
            })?;
            // Labels become index keys and terminal output; a cost is summed.
            crate::thread::check_labels(&record.labels).map_err(|e| BundleError::BadRecord {
                thread: record.id.to_string(),
                detail: e.to_string(),
            })?;
            if record
                .usage
                .as_ref()
                .is_some_and(|u| !u.cost_usd.is_finite() || u.cost_usd < 0.0)
            {
                return Err(BundleError::BadRecord {
                    thread: record.id.to_string(),
                    detail: "its usage has a cost that is not a finite, non-negative number".into(),
                });
            }
            for (what, hash, want) in record.blob_refs() {
                let Some(hash) = hash else { continue };
                let kind = match blobs.get(&hash) {
                    Some((_, kind)) => Some(*kind),
                    None => self.get_stored(&hash)?.map(|b| b.kind),
                };
                let bad = |detail: String| BundleError::BadRecord {
                    thread: record.id.to_string(),
                    detail,
                };
                match kind {
                    None => return Err(bad(format!("its {what} {hash} is missing"))),
                    Some(k) if !want.is_empty() && !want.contains(&k) => {
                        return Err(bad(format!("its {what} {hash} is a {k} blob")));
                    }
                    Some(_) => {}
                }
            }
            records.push(record);
        }
        let mut seen = HashSet::new();
        if let Some(dup) = records.iter().find(|r| !seen.insert(r.id)) {
            return Err(BundleError::BadRecord {
                thread: dup.id.to_string(),
                detail: "the bundle holds it twice".into(),
            });
        }
        // Ids.
        let map: HashMap<ThreadId, ThreadId> = if new_ids {
            records
                .iter()
                .map(|r| (r.id, ThreadId::generate()))
                .collect()
        } else {
            records.iter().map(|r| (r.id, r.id)).collect()
        };
        // Blobs in an order where every ref comes before its referrer.
        let order = topological(&blobs);
        let report = self.write(|w| {
            if !new_ids {
                let mut exists = Vec::new();
                for r in &records {
                    if index::find(w.tables(), r.id)?.is_some() {
                        exists.push(r.id);
                    }
                }
                if !exists.is_empty() {
                    return Err(BundleError::Exists { ids: exists });
                }
            }
            let mut new_blobs = 0;
            for hash in &order {
                if let Some((encoded, _)) = blobs.get(hash)
                    && w.put_encoded(encoded)?
                {
                    new_blobs += 1;
                }
            }
            let mut threads = Vec::with_capacity(records.len());
            for record in &records {
                let mut r = record.clone();
                let follow = |id: ThreadId| *map.get(&id).unwrap_or(&id);
                r.id = follow(r.id);
                r.parent_thread = r.parent_thread.map(follow);
                r.active_child = r.active_child.map(follow);
                if let Some(origin) = &mut r.forked_from {
                    origin.thread = follow(origin.thread);
                }
                index::put(w, None, &r)?;
                threads.push((record.id, r.id));
            }
            Ok::<_, BundleError>(ImportReport {
                threads,
                blobs: blobs.len() as u64,
                new_blobs,
            })
        })?;
        Ok(report)
    }
}

/// A bundle's parts.
#[derive(Debug, Default)]
pub struct Parsed<'b> {
    /// Record bytes, in bundle order.
    pub records: Vec<&'b [u8]>,
    /// (hash, bytes), in bundle order.
    pub blobs: Vec<(Hash, &'b [u8])>,
}

/// Splits a bundle into its parts, checking the framing, the order (ids
/// and hashes strictly increasing: one bundle per set of threads) and the
/// trailer; never panics, never allocates more than the input's size.
pub fn decode(bundle: &[u8]) -> Result<Parsed<'_>, BundleError> {
    let bad = |what: &str| BundleError::Malformed(what.to_owned());
    let (body, trailer) = bundle
        .split_last_chunk::<32>()
        .ok_or_else(|| bad("shorter than its trailer"))?;
    if blake3::hash(body).as_bytes() != trailer {
        return Err(bad("its checksum does not match (damaged or cut short)"));
    }
    let mut rest = body
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("it does not start with UWFBNDL1"))?;
    let mut take = |n: usize, what: &str| -> Result<&[u8], BundleError> {
        if rest.len() < n {
            return Err(BundleError::Malformed(format!("cut short in {what}")));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let u32_of = |b: &[u8]| b.try_into().map(u32::from_le_bytes).unwrap_or(0);
    let threads = u32_of(take(4, "the thread count")?);
    let mut parsed = Parsed::default();
    for _ in 0..threads {
        let len = u32_of(take(4, "a record length")?) as usize;
        parsed.records.push(take(len, "a record")?);
    }
    let blobs = take(8, "the blob count")?
        .try_into()
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let mut last: Option<Hash> = None;
    for _ in 0..blobs {
        let hash = Hash::from_slice(take(32, "a blob hash")?).ok_or_else(|| bad("a blob hash"))?;
        if last.is_some_and(|l| l >= hash) {
            return Err(bad("blobs out of order or repeated"));
        }
        last = Some(hash);
        let len = u32_of(take(4, "a blob length")?) as usize;
        parsed.blobs.push((hash, take(len, "a blob")?));
    }
    if !rest.is_empty() {
        return Err(bad("bytes after the last blob"));
    }
    Ok(parsed)
}

/// The blobs' hashes, each after every blob of the bundle it refers to.
fn topological(blobs: &HashMap<Hash, (crate::node::EncodedBlob, Kind)>) -> Vec<Hash> {
    let mut order = Vec::with_capacity(blobs.len());
    let mut done: HashSet<Hash> = HashSet::with_capacity(blobs.len());
    let mut roots: Vec<&Hash> = blobs.keys().collect();
    roots.sort();
    for root in roots {
        // Iterative depth-first post-order.
        let mut stack: Vec<(Hash, usize)> = vec![(*root, 0)];
        while let Some((hash, next)) = stack.pop() {
            if done.contains(&hash) {
                continue;
            }
            let refs = blobs.get(&hash).map(|(e, _)| e.refs()).unwrap_or(&[]);
            let pending = refs
                .iter()
                .enumerate()
                .skip(next)
                .find(|(_, r)| blobs.contains_key(r) && !done.contains(r));
            match pending {
                Some((i, target)) => {
                    stack.push((hash, i + 1));
                    stack.push((*target, 0));
                }
                None => {
                    done.insert(hash);
                    order.push(hash);
                }
            }
        }
    }
    order
}
