//! How a store is opened: durability and limits.

pub use crate::backend::Durability;

/// How to open a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Commit durability for this process.
    pub durability: Durability,
    /// Largest size the data file may reach, in bytes. `None` reserves
    /// [`DEFAULT_MAP_SIZE`](crate::store::DEFAULT_MAP_SIZE). A write that would pass it fails with
    /// [`BackendError::MapFull`](crate::backend::BackendError::MapFull) and changes nothing.
    pub max_map_size: Option<u64>,
    /// Create the store when it does not exist (else fail with
    /// [`BackendError::NotInitialized`](crate::backend::BackendError::NotInitialized)).
    pub create: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Sync,
            max_map_size: None,
            create: true,
        }
    }
}
