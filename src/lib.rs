//! # uwf-db
//!
//! An embedded database and synchronous workflow engine for AI-agent threads.
//!
//! This crate is built in layers; each module has one job:
//!
//! - [`hash`]: BLAKE3-256 [`Hash`](struct@Hash)es, hex, and unique prefixes.
//! - [`codec`]: the canonical MessagePack encoding every blob is hashed in.
//! - [`node`]: blobs (`start`, `state`, `content`, `workflow`) and `collect_refs`.
//! - [`backend`]: the storage boundary (transactions over named tables,
//!   locks) and its LMDB implementation (through `heed`).
//! - [`store`]: the store handle, blob put/get with referential integrity,
//!   prefix resolution, group commit, statistics.
//! - [`thread`]: thread records, chains, forks, history and listings.
//! - [`workflow`] and [`engine`]: YAML workflows and the synchronous engine.
//! - [`yaml`]: the one way YAML is read (the YAML 1.2 core schema).
//! - [`gc`]: garbage collection that is safe while writers run.
//! - [`verify`]: re-hash every blob and check every ref and index entry.
//! - [`copy`]: a whole store into another, on any pair of backends,
//!   restartable and verified.
//!
//! The on-disk format is described byte by byte in `docs/design.md`.
//!
//! One handle per layer, each reached from the [`Store`]:
//!
//! | handle | from | what it does |
//! |---|---|---|
//! | [`Store`] | [`Store::open`], [`Store::memory`] | blobs, transactions, pins, group commit, statistics |
//! | [`Threads`] | [`Store::threads`] | thread records, lists, logs, history, the call stack, labels, retention |
//! | [`LowLevel`](thread::LowLevel) | [`Threads::low_level`] | raw record writes below the engine (tools and tests) |
//! | [`Workflows`] | [`Store::workflows`] | stored workflow definitions by name and hash |
//! | [`Engine`] | [`Store::engine`] | start, drive, resume, stop, cancel, fork, batches, watches, claims |
//!
//! An embedder starts with the [`Engine`]: start and drive threads of a
//! YAML workflow with an [`Agent`](engine::agent::Agent) written in Rust,
//! resume, fork, cancel and run batches; garbage collection, copies,
//! bundles and verification sit beside it in [`gc`], [`copy`], [`bundle`]
//! and [`verify`]. Every public method has an example that runs, and
//! `cargo run --example embed` shows them together on an LMDB store.
//!
//! The storage core alone, without the engine:
//!
//! ```
//! use uwf_db::{Blob, Store, StoreOptions};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
//! let hash = store.put(&Blob::content("a reply", [])).unwrap();
//! let prefix = hash.to_string()[..8].parse().unwrap();
//! assert_eq!(store.resolve(&prefix).unwrap(), hash);
//! assert!(uwf_db::verify::verify(&store, |_| {}).unwrap().is_ok());
//! ```

#![deny(unsafe_code)]
#![deny(missing_docs)]
// Storage and engine code never panics on data or I/O: no unwrap/expect,
// no unchecked indexing (the few indexing-by-construction spots say why).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod api;
pub mod backend;
pub mod bundle;
mod cache;
pub mod codec;
pub mod copy;
pub mod engine;
pub mod gc;
pub mod hash;
pub mod input;
pub mod node;
mod prefetch;
mod record;
pub mod salvage;
pub mod store;
pub mod telemetry;
pub mod thread;
pub mod usage;
pub mod verify;
pub mod workflow;
pub mod yaml;

pub use codec::CodecError;
pub use engine::Engine;
pub use hash::{Hash, HashPrefix, ParseHashError};
pub use node::{Blob, ContentNode, EncodedBlob, Kind, StartNode, StateNode, Value, WorkflowNode};
pub use store::{Durability, OpenError, Stats, Store, StoreError, StoreOptions};
pub use thread::Threads;
pub use workflow::Workflows;
