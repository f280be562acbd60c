//! Export and import (SPEC §11): threads moved between stores as one
//! self-contained, deterministic bundle. Format in `docs/design.md` §4d:
//!
//! ```text
//! "UWFBNDL1" (unsigned) or "UWFBNDS1" (signed) 8 bytes
//! threads: u32 LE count, then per thread (by id): u32 LE length, record bytes
//! blobs:   u64 LE count, then per blob (by hash): 32-byte hash, u32 LE length, canonical bytes
//! trailer                                      32 bytes
//! ```
//!
//! The trailer of an unsigned bundle is the BLAKE3 of every byte before it:
//! anyone can recompute it, so it detects accidents (a cut-short copy, a
//! flipped bit) and nothing else. A signed bundle's trailer is BLAKE3 in
//! keyed mode (a MAC) under a [`BundleKey`] derived from a secret key file:
//! only a holder of the key can make one that [`import`] with
//! [`ImportOptions::verify`] accepts.
//!
//! A bundle is data from a stranger whichever it is. Import checks every
//! record against the chain it points to (see [`import`]) and never
//! keeps the agent a record names, nor the directory its agents worked in,
//! unless [`ImportOptions::trust_agents`] asks for it: an agent spec is a
//! command line.
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
use crate::thread::{ThreadError, ThreadId, ThreadRecord, ThreadStatus, index};

mod format;
mod import;
pub use format::{Parsed, decode, decode_with};

/// The first bytes of an unsigned bundle.
pub const MAGIC: &[u8; 8] = b"UWFBNDL1";

/// The first bytes of a signed bundle.
pub const MAGIC_SIGNED: &[u8; 8] = b"UWFBNDS1";

/// Fewest secret bytes a key file holds.
pub const MIN_KEY_SECRET: usize = 32;

/// Largest key file read.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// BLAKE3 `derive_key` context for bundle keys.
const KEY_CONTEXT: &str = "uwf-db 2026-11 bundle signing key v1";

/// A secret key that signs bundles and verifies their signatures: the
/// BLAKE3 keyed hash of the bundle is its trailer (a MAC). Made from a
/// secret of at least [`MIN_KEY_SECRET`] bytes, which both sides share.
#[derive(Clone)]
pub struct BundleKey([u8; 32]);

impl std::fmt::Debug for BundleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BundleKey(..)")
    }
}

impl BundleKey {
    /// The key a shared secret gives (at least [`MIN_KEY_SECRET`] bytes;
    /// `head -c 32 /dev/urandom` makes one).
    ///
    /// ```
    /// use uwf_db::bundle::BundleKey;
    /// assert!(BundleKey::from_secret(&[7; 32]).is_ok());
    /// assert!(BundleKey::from_secret(b"password").is_err());
    /// ```
    pub fn from_secret(secret: &[u8]) -> Result<BundleKey, BundleError> {
        if secret.len() < MIN_KEY_SECRET {
            return Err(BundleError::WeakKey {
                detail: format!(
                    "it holds {} bytes; a key holds at least {MIN_KEY_SECRET} random bytes (make one with `head -c 32 /dev/urandom > FILE`)",
                    secret.len()
                ),
            });
        }
        Ok(BundleKey(blake3::derive_key(KEY_CONTEXT, secret)))
    }

    /// The key in a key file: its whole contents are the secret. A file
    /// that others may read or write (mode bits for group or others) is
    /// refused, as ssh refuses such a private key, and so is a file of
    /// fewer than [`MIN_KEY_SECRET`] bytes.
    pub fn from_file(path: &std::path::Path) -> Result<BundleKey, BundleError> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let io = |source| BundleError::KeyFile {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(BundleError::WeakKey {
                detail: format!("{} is not a regular file", path.display()),
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(BundleError::WeakKey {
                detail: format!(
                    "{} may be read or written by others (mode {:o}); `chmod 600` it",
                    path.display(),
                    meta.mode() & 0o777
                ),
            });
        }
        let mut secret = Vec::new();
        file.take(MAX_KEY_FILE)
            .read_to_end(&mut secret)
            .map_err(io)?;
        BundleKey::from_secret(&secret).map_err(|e| match e {
            BundleError::WeakKey { detail } => BundleError::WeakKey {
                detail: format!("{}: {detail}", path.display()),
            },
            e => e,
        })
    }

    fn mac(&self, body: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, body)
    }
}

/// How [`export_with`] writes a bundle.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ExportOptions {
    /// Sign the bundle with this key (else its trailer is a plain BLAKE3).
    pub sign: Option<BundleKey>,
}

/// How [`import_with`] reads a bundle.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Give the threads new ids (else ids that exist already are refused).
    pub new_ids: bool,
    /// Keep the agent spec and working directory the records name.
    /// **Dangerous**: an agent spec is a command line, and a bundle's
    /// records are whatever its maker wrote; without this, imported
    /// threads have no stored agent (driving one needs an agent named by
    /// the importing user) and work where their driver does.
    pub trust_agents: bool,
    /// Refuse the bundle unless it is signed with this key.
    pub verify: Option<BundleKey>,
}

impl ImportOptions {
    /// Options with `new_ids` set as given, the rest default.
    pub fn new_ids(new_ids: bool) -> ImportOptions {
        ImportOptions {
            new_ids,
            ..ImportOptions::default()
        }
    }
}

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
    /// A key file that cannot be read.
    #[error("cannot read the key file {path}: {source}")]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A key that is too short, or a key file others may read.
    #[error("the signing key is refused: {detail}")]
    WeakKey {
        /// What is wrong.
        detail: String,
    },
    /// A signed bundle whose signature does not match the key, or a
    /// bundle that is not signed where a signature is required.
    #[error("the bundle's signature is refused: {0}")]
    Signature(String),
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

impl From<crate::backend::BackendError> for BundleError {
    fn from(e: crate::backend::BackendError) -> Self {
        BundleError::Store(e.into())
    }
}

/// What an import wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ImportReport {
    /// The threads written, as (id in the bundle, id in the store).
    pub threads: Vec<(ThreadId, ThreadId)>,
    /// Blobs in the bundle.
    pub blobs: u64,
    /// Of those, blobs the store did not hold yet.
    pub new_blobs: u64,
    /// Threads whose record named an agent that was not kept (every one
    /// that named one, unless [`ImportOptions::trust_agents`]).
    pub agents_dropped: u64,
    /// Whether the bundle's signature was checked against a key.
    pub signed: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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

/// Writes an unsigned bundle of the threads `ids`, their children and
/// every blob they reach to `out` ([`export_with`] with default
/// options).
///
/// ```
/// # let store = uwf_db::Store::memory();
/// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
/// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
/// # let (hash, _) = store.workflows().add(&wf)?;
/// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
/// let mut bundle = Vec::new();
/// let report = uwf_db::bundle::export(&store, &[started.id], &mut bundle)?;
/// assert_eq!(report.threads, vec![started.id]);
/// let other = uwf_db::Store::memory();
/// assert_eq!(uwf_db::bundle::import(&other, &bundle, false)?.threads.len(), 1);
/// assert!(other.threads().get(started.id)?.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export(
    store: &Store,
    ids: &[ThreadId],
    out: &mut dyn Write,
) -> Result<ExportReport, BundleError> {
    export_with(store, ids, out, &ExportOptions::default())
}

/// Writes a bundle of the threads `ids`, their children and every blob
/// they reach to `out`, signed when `options.sign` holds a key;
/// deterministic: the same threads in the same state (and the same
/// key) give the same bytes. A driver's claim does not travel: a
/// thread being driven is written with the status underneath it, and
/// without a pending stop request.
///
/// ```
/// # use uwf_db::Store;
/// use uwf_db::bundle::{BundleKey, ExportOptions, ImportOptions};
/// # let store = Store::memory();
/// let key = BundleKey::from_secret(&[42; 32])?;
/// let mut bytes = Vec::new();
/// let mut options = ExportOptions::default();
/// options.sign = Some(key.clone());
/// uwf_db::bundle::export_with(&store, &[], &mut bytes, &options)?;
/// // Only the key's holder can check it.
/// assert!(uwf_db::bundle::import(&Store::memory(), &bytes, false).is_err());
/// let mut import = ImportOptions::default();
/// import.verify = Some(key);
/// assert!(uwf_db::bundle::import_with(&Store::memory(), &bytes, &import)?.signed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export_with(
    store: &Store,
    ids: &[ThreadId],
    out: &mut dyn Write,
    options: &ExportOptions,
) -> Result<ExportReport, BundleError> {
    // The threads: those asked for, then their children, recursively.
    let mut records: BTreeMap<ThreadId, ThreadRecord> = BTreeMap::new();
    let mut queue: Vec<ThreadId> = ids.to_vec();
    while let Some(id) = queue.pop() {
        if records.contains_key(&id) {
            continue;
        }
        let (record, children) = store.read(|r| {
            let (record, _) =
                index::find(r.tables(), id)?.ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
            Ok::<_, ThreadError>((record, index::children(r.tables(), id)?))
        })?;
        records.insert(id, record);
        queue.extend(children);
    }
    // A claim is a local driver's, not part of the thread.
    for record in records.values_mut() {
        if record.status == ThreadStatus::Running {
            record.status = record.underlying_status();
        }
        record.claimed_status = None;
        record.stop_requested_at = None;
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
            store.walk::<StoreError>(&root, |b| {
                hashes.insert(b.hash);
                Ok(())
            })?;
        }
    }
    let mut w = Hashing {
        out,
        hasher: match &options.sign {
            Some(key) => blake3::Hasher::new_keyed(&key.0),
            None => blake3::Hasher::new(),
        },
        bytes: 0,
    };
    w.put(if options.sign.is_some() {
        MAGIC_SIGNED
    } else {
        MAGIC
    })?;
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
        let blobs = store.read(|r| {
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

/// Imports an unsigned or signed bundle without checking a signature,
/// keeping no agent ([`import_with`] with `new_ids` and the
/// other options at their defaults).
///
/// ```
/// # let store = uwf_db::Store::memory();
/// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
/// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
/// # let (hash, _) = store.workflows().add(&wf)?;
/// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
/// # let mut bundle = Vec::new();
/// # uwf_db::bundle::export(&store, &[started.id], &mut bundle)?;
/// // Into the store it came from: the id exists, so give it a new one.
/// assert!(uwf_db::bundle::import(&store, &bundle, false).is_err());
/// let (old, new) = uwf_db::bundle::import(&store, &bundle, true)?.threads[0];
/// assert!(old == started.id && new != old);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn import(store: &Store, bundle: &[u8], new_ids: bool) -> Result<ImportReport, BundleError> {
    import_with(store, bundle, &ImportOptions::new_ids(new_ids))
}

/// Checks `bundle` whole, then writes its blobs and threads in one
/// transaction (all or nothing). A bundle is data from a stranger:
///
/// - its trailer must match (with [`ImportOptions::verify`], it must be
///   signed with that key); a signed bundle is refused without a key;
/// - every blob must hash to its key, be canonical, and have its refs in
///   the bundle or the store;
/// - every record must agree with the chain it points to: its start,
///   head and workflow of the right kinds, `seq` equal to the chain's
///   length (every node one after its parent, on the same start, with
///   the ancestor list the engine writes), the status the head gives
///   (an ended thread's head is an end node with that return code, a
///   thread whose head is not an end node is not ended; nothing is
///   `running`), `last_end_seq` the newest end on the chain,
///   `completed_at` set exactly when ended, parent, active child and
///   fork origin present in the bundle or the store (an active child
///   naming this thread as its parent), labels and usage in their
///   allowed shapes;
/// - no thread id may exist (unless `new_ids`: then every thread gets a
///   new id, and the links between the bundle's threads follow).
///
/// Any failure refuses the bundle whole, naming the thread and the
/// field. Unless [`ImportOptions::trust_agents`], no record keeps the
/// agent spec or working directory it names.
///
/// ```
/// # use uwf_db::Store;
/// use uwf_db::bundle::{BundleError, ImportOptions};
/// let store = Store::memory();
/// let err = uwf_db::bundle::import_with(&store, b"not a bundle", &ImportOptions::default()).unwrap_err();
/// assert!(matches!(err, BundleError::Malformed(_)));
/// ```
pub fn import_with(
    store: &Store,
    bundle: &[u8],
    options: &ImportOptions,
) -> Result<ImportReport, BundleError> {
    let parsed = decode_with(bundle, options.verify.as_ref())?;
    let (blobs, raw) = import::check_blobs(store, &parsed)?;
    let records = import::check_records(store, &parsed, &blobs, &raw)?;
    import::check_links(store, &records, &blobs)?;
    import::write(store, &records, &blobs, options)
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
