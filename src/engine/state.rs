//! What the engine keeps per open store (never per process): caches keyed
//! by content hashes and the bookkeeping of the claims this handle holds.
//! Two stores open in one process share nothing of it.

/// The engine's per-store state, owned by the store handle.
#[derive(Debug, Default)]
#[allow(dead_code)] // filled by the per-store caches (in progress)
pub(crate) struct EngineState {}
