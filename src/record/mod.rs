//! The thread data model: a thread's id and its stored record (with the
//! key layouts of the tables that index it). Below storage, as `node` is
//! for blobs: the PostgreSQL backend decodes records to fill the columns
//! people query (docs/design.md §4b), and `thread` builds on them. The
//! public paths are `uwf_db::thread::{ThreadId, ThreadRecord, …}`.

use std::collections::BTreeMap;

pub(crate) mod id;
pub(crate) mod thread;

/// A thread's labels, in key order.
pub type Labels = BTreeMap<String, String>;
