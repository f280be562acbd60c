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
use std::hash::Hash as StdHash;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::HeldLock;
use crate::hash::Hash;
use crate::thread::ThreadId;
use crate::workflow::Workflow;
use crate::workflow::template::Templates;

use super::extract::Validators;

/// A map that is cleared when it reaches its capacity: the working set of a
/// store (its workflows, their roles) is small, so a rare refill is cheaper
/// than tracking recency.
#[derive(Debug)]
pub(crate) struct Bounded<K, V> {
    map: Mutex<HashMap<K, V>>,
    capacity: usize,
}

impl<K: Eq + StdHash, V: Clone> Bounded<K, V> {
    /// An empty cache holding at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> Self {
        Bounded {
            map: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// The map itself (a poisoned lock is taken over: a cache holds no
    /// invariant a panic could break).
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Most entries kept.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The cached value for `key`.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + StdHash + ?Sized,
    {
        self.lock().get(key).cloned()
    }

    /// Caches `value`, first clearing the cache when it is full.
    pub(crate) fn insert(&self, key: K, value: V) {
        let mut map = self.lock();
        if map.len() >= self.capacity {
            map.clear();
        }
        map.insert(key, value);
    }
}

/// A thread's task prompt and `max_rounds`, from its (immutable) start node.
pub(crate) type Task = (Arc<str>, u32);

/// The claims this store handle holds, and its claim lock file.
#[derive(Debug, Default)]
pub(crate) struct ClaimState {
    /// Threads claimed through this store now, with the backend's lock
    /// (nested claims reuse it and check it is still held; `None` while
    /// the outer claim is being taken).
    pub(crate) held: Mutex<HashMap<ThreadId, Option<Arc<dyn HeldLock>>>>,
}

/// The engine's per-store state, owned by the store handle.
#[derive(Debug)]
pub(crate) struct EngineState {
    /// Task prompts by start-node hash.
    pub(crate) tasks: Bounded<Hash, Task>,
    /// Role prompt headers by workflow hash, then role name.
    pub(crate) headers: Bounded<Hash, HashMap<String, Arc<str>>>,
    /// Decoded workflows by blob hash.
    pub(crate) workflows: Bounded<Hash, Arc<Workflow>>,
    /// Compiled frontmatter schemas.
    pub(crate) validators: Validators,
    /// Compiled edge-prompt templates.
    pub(crate) templates: Templates,
    /// Claim bookkeeping.
    pub(crate) claims: ClaimState,
}

impl Default for EngineState {
    fn default() -> Self {
        EngineState {
            tasks: Bounded::new(65_536),
            headers: Bounded::new(4096),
            workflows: Bounded::new(4096),
            validators: Validators::default(),
            templates: Templates::default(),
            claims: ClaimState::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_cache_starts_over() {
        let cache: Bounded<u32, u32> = Bounded::new(2);
        cache.insert(1, 10);
        cache.insert(2, 20);
        assert_eq!((cache.get(&1), cache.get(&2)), (Some(10), Some(20)));
        cache.insert(3, 30);
        assert_eq!((cache.get(&1), cache.get(&2)), (None, None));
        assert_eq!(cache.get(&3), Some(30));
    }

    #[test]
    fn two_stores_share_no_state() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open =
            |p: &std::path::Path| crate::Store::open(p, crate::StoreOptions::default()).unwrap();
        let (sa, sb, sa2) = (open(a.path()), open(b.path()), open(a.path()));
        let state = |s: &crate::Store| std::ptr::from_ref(s.engine_state());
        assert_ne!(state(&sa), state(&sb));
        // Two handles of one directory share one engine state.
        assert_eq!(state(&sa), state(&sa2));
    }
}
