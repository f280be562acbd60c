//! Small caches keyed by content (a blob hash, a schema's or a template's
//! own text), so an entry can never go stale.

use foldhash::HashMap;
use std::hash::Hash as StdHash;
use std::sync::{Mutex, MutexGuard};

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
            map: Mutex::new(HashMap::default()),
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
}
