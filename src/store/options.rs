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
    /// PostgreSQL: the most connections this handle opens for
    /// transactions at once (`0`: [`DEFAULT_PG_CONNECTIONS`]); its claims
    /// take one more, whatever their number. Ignored by LMDB.
    pub pg_connections: usize,
}

/// The connections a PostgreSQL store handle opens for transactions when
/// [`StoreOptions::pg_connections`] is `0`.
pub const DEFAULT_PG_CONNECTIONS: usize = 4;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Sync,
            max_map_size: None,
            create: true,
            pg_connections: 0,
        }
    }
}
