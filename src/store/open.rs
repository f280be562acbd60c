//! Opening a store. LMDB (and heed) forbid opening one environment twice in
//! a process, so a registry of open stores, keyed by canonical path, hands
//! a second open the handle of the first — with the same engine state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use super::{Durability, OpenError, Store, StoreInner, StoreOptions};
use crate::backend::lmdb::{LmdbBackend, LmdbOptions, OpenFor};
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, BackendError};

/// LMDB stores open in this process, by canonical path. This is the one
/// piece of process-wide state the crate keeps, and LMDB is why: it is the
/// environment itself that may exist once per process.
static OPEN_STORES: LazyLock<Mutex<HashMap<PathBuf, Weak<StoreInner>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl Store {
    /// Opens (or, with `options.create`, creates) the LMDB store in
    /// directory `path`.
    ///
    /// Opening a store that this process already has open returns a handle to
    /// the same environment; asking for different durability or a different
    /// maximum size then is an [`OpenError::OptionsConflict`].
    ///
    /// ```
    /// use uwf_db::{Store, StoreOptions};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    /// assert_eq!(store.stats().unwrap().blob_count, 0);
    /// ```
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store, OpenError> {
        Store::open_for(path.as_ref(), options, OpenFor::Use)
    }

    /// Opens the LMDB store in `path` read-only for
    /// [`salvage`](crate::salvage): a format version that cannot be read
    /// (its page is damaged) is no reason to refuse, the layout is told
    /// from the rows. Nothing is created and nothing is written.
    pub(crate) fn open_damaged(path: &Path) -> Result<Store, OpenError> {
        let options = StoreOptions {
            create: false,
            ..StoreOptions::default()
        };
        Store::open_for(path, options, OpenFor::Salvage)
    }

    fn open_for(path: &Path, options: StoreOptions, purpose: OpenFor) -> Result<Store, OpenError> {
        let io = |op| {
            let path = path.to_path_buf();
            move |source| OpenError::from(BackendError::Io { op, path, source })
        };
        // Only a data file that is not there means "no store": one that
        // cannot be looked at (permission denied, say) is reported as such.
        let data = path.join("data.mdb");
        let exists = match std::fs::metadata(&data) {
            Ok(meta) => meta.is_file(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(source) => {
                return Err(BackendError::Io {
                    op: "read",
                    path: data,
                    source,
                }
                .into());
            }
        };
        if !exists {
            if !options.create {
                return Err(BackendError::NotInitialized {
                    path: path.to_path_buf(),
                }
                .into());
            }
            let existed = path.exists();
            std::fs::create_dir_all(path).map_err(io("create directory"))?;
            if !existed {
                // Whatever the umask: only the owner may enter a new store
                // (a file planted in it could take the place of a lock or
                // data file).
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                    .map_err(io("restrict the new store directory to its owner"))?;
            }
        }
        let canonical = std::fs::canonicalize(path).map_err(io("resolve"))?;

        let mut open = OPEN_STORES.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, weak| weak.strong_count() > 0);
        let requested = LmdbOptions {
            durability: options.durability,
            max_map_size: options.max_map_size,
        };
        if let Some(inner) = open.get(&canonical).and_then(Weak::upgrade) {
            let existing = inner
                .backend
                .as_any()
                .downcast_ref::<LmdbBackend>()
                .map(LmdbBackend::options);
            if let Some(existing) = existing {
                let same_max = requested
                    .max_map_size
                    .is_none_or(|m| Some(m) == existing.max_map_size);
                if existing.durability != requested.durability || !same_max {
                    return Err(OpenError::OptionsConflict {
                        path: canonical,
                        existing: describe(existing.durability, existing.max_map_size),
                        requested: describe(requested.durability, requested.max_map_size),
                    });
                }
            }
            return Ok(Store { inner, group: None });
        }

        let backend = LmdbBackend::open(&canonical, requested, purpose)?;
        let inner = Arc::new(StoreInner::new(Box::new(backend)));
        open.insert(canonical, Arc::downgrade(&inner));
        Ok(Store { inner, group: None })
    }
}

impl Store {
    /// Opens the store `location` names: a `postgres://` or
    /// `postgresql://` URL (the PostgreSQL backend, when built with the
    /// `postgres` feature), else an LMDB directory ([`Store::open`]).
    /// `options.durability` applies to both; the map size only to LMDB.
    /// Each call to a URL makes a new handle with its own connections and
    /// engine state.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let location = dir.path().to_str().ok_or("not UTF-8")?;
    /// // Not a postgres:// URL: an LMDB directory.
    /// let store = uwf_db::Store::open_location(location, Default::default())?;
    /// assert_eq!(store.path(), dir.path());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_location(location: &str, options: StoreOptions) -> Result<Store, OpenError> {
        if !crate::backend::is_postgres_url(location) {
            return Store::open(location, options);
        }
        #[cfg(feature = "postgres")]
        {
            let connections = match options.pg_connections {
                0 => super::options::DEFAULT_PG_CONNECTIONS,
                n => n,
            };
            let backend = crate::backend::postgres::PostgresBackend::connect_with(
                location,
                options.durability,
                options.create,
                connections,
            )?;
            Ok(Store::from_backend(backend))
        }
        #[cfg(not(feature = "postgres"))]
        {
            Err(OpenError::NoPostgres {
                location: location.to_owned(),
            })
        }
    }

    /// A store on any backend (see [`crate::backend`] for what a backend
    /// must guarantee). Each call makes a new handle with its own engine
    /// state; the backend should not be shared with another handle.
    ///
    /// ```
    /// let store = uwf_db::Store::from_backend(uwf_db::backend::memory::MemoryBackend::new());
    /// let hash = store.put(&uwf_db::Blob::content("kept in memory", []))?;
    /// assert!(store.contains(&hash)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_backend(backend: impl Backend + 'static) -> Store {
        Store {
            inner: Arc::new(StoreInner::new(Box::new(backend))),
            group: None,
        }
    }

    /// A new, empty store held in memory (no directory, not durable): for
    /// tests and throwaway runs. It lives as long as its handles.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", [])).unwrap();
    /// assert!(store.contains(&hash).unwrap());
    /// ```
    pub fn memory() -> Store {
        Store::from_backend(MemoryBackend::new())
    }
}

fn describe(d: Durability, m: Option<u64>) -> String {
    format!(
        "durability {d}, maximum size {}",
        m.map_or("default".to_owned(), |m| m.to_string())
    )
}
