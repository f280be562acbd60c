//! What the engine keeps per open store (never per process): caches keyed
//! by content hashes and the bookkeeping of the claims this handle holds.
//! Two stores open in one process share nothing of it; two handles of one
//! store directory share it (the store registry gives them one
//! `StoreInner`).
//!
//! Every cache here is keyed by content (a blob hash, or a schema's or a
//! template's own text), so an entry can never go stale; each is bounded
//! and simply cleared when full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::HeldLock;
use crate::cache::Bounded;
use crate::hash::Hash;
use crate::thread::ThreadId;
use crate::workflow::template::Templates;

use super::extract::Validators;

/// A thread's task prompt and `max_rounds`, from its (immutable) start node.
pub(crate) type Task = (Arc<str>, u32);

/// The longest text [`EngineState::texts`] keeps (so the cache holds at
/// most 4,096 × 16 KiB).
pub(crate) const TEXT_CACHE_MAX: usize = 16 << 10;

/// The claims this store handle holds, and its claim lock file.
#[derive(Debug, Default)]
pub(crate) struct ClaimState {
    /// Threads claimed through this store now, with the backend's lock
    /// (nested claims reuse it and check it is still held; `None` while
    /// the outer claim is being taken).
    pub(crate) held: Mutex<HashMap<ThreadId, Option<Arc<dyn HeldLock>>>>,
}

/// The engine's per-store state, kept in the store's layer slots
/// ([`Store::layer_state`]): the store does not name this type.
#[derive(Debug)]
pub(crate) struct EngineState {
    /// Task prompts by start-node hash.
    pub(crate) tasks: Bounded<Hash, Task>,
    /// Role prompt headers by workflow hash, then role name.
    pub(crate) headers: Bounded<Hash, HashMap<String, Arc<str>>>,
    /// Texts of content blobs a prompt shows (the replies and
    /// instructions of recent steps), each at most [`TEXT_CACHE_MAX`]
    /// bytes: a driver reads back what it wrote a step earlier, and on a
    /// server backend each read is a transaction.
    pub(crate) texts: Bounded<Hash, Arc<str>>,
    /// What parent contexts show of a parent's state node, by its hash
    /// (every child of one call shares it).
    pub(crate) parents: Bounded<Hash, Arc<super::parent::ParentBase>>,
    /// Parent-context prompt sections by (the parent's state, the parent,
    /// the child's workflow), naming [`ThreadId::NIL`](crate::thread::ThreadId::NIL)
    /// for the child (`Engine::parent_section`). Not keyed by content
    /// alone: the parent's record decides the calling role and the
    /// ancestors' ids, which do not change while its call is open.
    pub(crate) sections: Bounded<(Hash, crate::thread::ThreadId, String), Arc<str>>,
    /// Compiled frontmatter schemas.
    pub(crate) validators: Validators,
    /// Compiled edge-prompt templates.
    pub(crate) templates: Templates,
    /// Claim bookkeeping.
    pub(crate) claims: ClaimState,
    /// The store's keep-prompts switch as this handle read or set it
    /// (`super::kept`: unknown until first read).
    pub(crate) keep_prompts: std::sync::atomic::AtomicU8,
}

impl Default for EngineState {
    fn default() -> Self {
        EngineState {
            tasks: Bounded::new(65_536),
            headers: Bounded::new(4096),
            texts: Bounded::new(4096),
            parents: Bounded::new(1024),
            sections: Bounded::new(1024),
            validators: Validators::default(),
            templates: Templates::default(),
            claims: ClaimState::default(),
            keep_prompts: std::sync::atomic::AtomicU8::new(super::kept::UNKNOWN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_stores_share_no_state() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open =
            |p: &std::path::Path| crate::Store::open(p, crate::StoreOptions::default()).unwrap();
        let (sa, sb, sa2) = (open(a.path()), open(b.path()), open(a.path()));
        let state = |s: &crate::Store| Arc::as_ptr(&s.engine().state);
        assert_ne!(state(&sa), state(&sb));
        // Two handles of one directory share one engine state.
        assert_eq!(state(&sa), state(&sa2));
    }
}
