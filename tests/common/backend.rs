//! The backend-neutral store harness behind the conformance suite.
//!
//! A semantic test is a plain function `fn name(b: &TestBackend)` that gets
//! its stores from `b` (never from `Store::open` directly), listed once in
//! [`conformance!`](crate::conformance); the macro makes one `#[test]` per
//! backend (`lmdb::name`, later `postgres::name`). Like object_store's shared
//! suite: a backend is done when every listed test passes on it. A test
//! function left out of the list is dead code, which `clippy -D warnings`
//! refuses, so none is silently skipped.
//!
//! # Adding a backend
//! 1. A variant in [`TestBackend`] (and its name in [`TestBackend::name`] /
//!    [`TestBackend::from_name`]).
//! 2. How a fresh store is made in [`TestBackend::location`]: a
//!    [`Location`] variant that owns what must outlive the test (for
//!    PostgreSQL: a server URL from the environment plus a database created
//!    per test and dropped with the location), its `--store` value in
//!    [`Location::arg`] and its opening in [`Location::open`].
//! 3. One line in the `conformance!` macro:
//!    `@backend postgres, Postgres;`.
//!
//! Every store option and every `Store::open` call of the suite lives in this
//! file, so a change to the opening API is one edit here.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use uwf_db::{Durability, Store, StoreOptions};

/// A storage backend the conformance suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    /// LMDB in a fresh temporary directory per store.
    Lmdb,
    /// The in-memory backend (`Store::memory`): owned rows, as a server
    /// backend returns them. In-process only: no CLI, no second process.
    Memory,
    /// PostgreSQL: a fresh database per store on the server named by
    /// `UWF_TEST_POSTGRES` (default [`DEFAULT_POSTGRES`]), dropped with
    /// the location.
    #[cfg(feature = "postgres")]
    Postgres,
}

/// The server the PostgreSQL tests use when `UWF_TEST_POSTGRES` is unset:
/// the local one, trust authentication (`README.md`, "The two commands").
pub const DEFAULT_POSTGRES: &str = "postgres://root@127.0.0.1:5432/postgres";

/// The admin URL of the test server.
#[cfg(feature = "postgres")]
pub fn postgres_admin_url() -> String {
    std::env::var("UWF_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_POSTGRES.to_owned())
}

/// Whether the PostgreSQL server can be reached. When it cannot, a
/// PostgreSQL test says so loudly on stderr and passes without running,
/// except under CI (`CI` set), where it fails: `.ci/run` must run them.
#[cfg(feature = "postgres")]
pub fn postgres_available() -> bool {
    static REACHABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let url = postgres_admin_url();
    let reachable = REACHABLE.get_or_init(|| {
        postgres::Client::connect(&url, postgres::NoTls)
            .map(drop)
            .map_err(|e| e.to_string())
    });
    match reachable {
        Ok(()) => true,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("PostgreSQL is not reachable at {url} ({e}); CI must run the PostgreSQL suite")
        }
        Err(e) => {
            eprintln!(
                "\n!!! PostgreSQL NOT REACHABLE at {url} ({e}): this PostgreSQL test did NOT run.\n\
                 !!! Start a server or point UWF_TEST_POSTGRES at one (a URL whose user may CREATE DATABASE).\n"
            );
            false
        }
    }
}

/// A database made for one test, dropped (with any session still on it)
/// when the test's location goes.
#[cfg(feature = "postgres")]
struct TestDatabase {
    admin: String,
    name: String,
    url: String,
}

#[cfg(feature = "postgres")]
impl TestDatabase {
    fn create() -> TestDatabase {
        let admin = postgres_admin_url();
        let name = format!(
            "uwf_test_{}",
            uwf_db::thread::ThreadId::generate()
                .to_string()
                .to_lowercase()
        );
        let mut client = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("UWF_TEST_POSTGRES must end in /DATABASE: {admin}"),
        };
        TestDatabase { admin, name, url }
    }
}

#[cfg(feature = "postgres")]
impl TestDatabase {
    /// Whether a store was created in it.
    fn has_schema(&self) -> bool {
        let mut client = postgres::Client::connect(&self.url, postgres::NoTls).unwrap();
        client
            .query_one("SELECT to_regclass('uwf_schema') IS NOT NULL", &[])
            .unwrap()
            .get(0)
    }
}

#[cfg(feature = "postgres")]
impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = client.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

impl TestBackend {
    /// The backend's name: the module of its tests, and what a child
    /// process is told in `UWF_TEST_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            TestBackend::Lmdb => "lmdb",
            TestBackend::Memory => "memory",
            #[cfg(feature = "postgres")]
            TestBackend::Postgres => "postgres",
        }
    }

    pub fn from_name(name: &str) -> Option<TestBackend> {
        match name {
            "lmdb" => Some(TestBackend::Lmdb),
            "memory" => Some(TestBackend::Memory),
            #[cfg(feature = "postgres")]
            "postgres" => Some(TestBackend::Postgres),
            _ => None,
        }
    }

    /// Where a new, empty store of this backend goes; nothing is created yet
    /// (the CLI tests let `uwf-db` create it).
    pub fn location(self) -> Location {
        let scratch = tempfile::tempdir().unwrap();
        match self {
            TestBackend::Lmdb => Location {
                backend: self,
                place: Place::Dir(scratch.path().join("store")),
                scratch,
            },
            TestBackend::Memory => Location {
                backend: self,
                place: Place::Memory(Store::memory()),
                scratch,
            },
            #[cfg(feature = "postgres")]
            TestBackend::Postgres => Location {
                backend: self,
                place: Place::Database(TestDatabase::create()),
                scratch,
            },
        }
    }

    /// Whether this backend can run here (PostgreSQL needs a server; see
    /// [`postgres_available`]).
    pub fn available(self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            TestBackend::Postgres => postgres_available(),
            _ => true,
        }
    }

    /// A fresh store that commits without fsync: most tests, which commit
    /// many transactions and never crash the machine.
    pub fn fast(self) -> TestStore {
        self.location().into_store(Durability::None)
    }

    /// A fresh store with the default (durable) options.
    pub fn durable(self) -> TestStore {
        self.location().into_store(Durability::Sync)
    }

    /// Opens the store a [`Location::arg`] named, from another process
    /// (see `tests/thread_processes.rs`).
    pub fn open_arg(self, arg: &str, durability: Durability) -> Store {
        match self {
            TestBackend::Lmdb => Store::open(Path::new(arg), options(durability)).unwrap(),
            TestBackend::Memory => {
                panic!("the memory backend cannot be opened by name ({arg}): it is in-process only")
            }
            #[cfg(feature = "postgres")]
            TestBackend::Postgres => Store::open_location(arg, options(durability)).unwrap(),
        }
    }
}

fn options(durability: Durability) -> StoreOptions {
    StoreOptions {
        durability,
        ..StoreOptions::default()
    }
}

/// A place for one store, and a scratch directory for the test's own files
/// (scenarios, prompt files, markers). Dropping it removes both.
pub struct Location {
    backend: TestBackend,
    place: Place,
    scratch: tempfile::TempDir,
}

enum Place {
    /// A directory inside the scratch directory.
    Dir(PathBuf),
    /// An in-memory store: every handle opened on this location is a clone
    /// of this one.
    Memory(Store),
    /// A PostgreSQL database made for this test.
    #[cfg(feature = "postgres")]
    Database(TestDatabase),
}

impl Location {
    pub fn backend(&self) -> TestBackend {
        self.backend
    }

    /// The `--store` value (`UWF_STORE`) that names this store.
    pub fn arg(&self) -> OsString {
        match &self.place {
            Place::Dir(p) => p.clone().into_os_string(),
            Place::Memory(_) => panic!("the memory backend has no --store value"),
            #[cfg(feature = "postgres")]
            Place::Database(db) => OsString::from(&db.url),
        }
    }

    /// [`Location::arg`] as text, for environment variables and messages.
    pub fn arg_str(&self) -> String {
        self.arg().into_string().unwrap()
    }

    /// Whether the store has been created (by a handle or by `uwf-db`).
    pub fn exists(&self) -> bool {
        match &self.place {
            Place::Dir(p) => p.exists(),
            Place::Memory(_) => true,
            #[cfg(feature = "postgres")]
            Place::Database(db) => db.has_schema(),
        }
    }

    /// A directory for the test's own files; never the store itself.
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Opens (creating if needed) a handle on this store.
    pub fn open(&self, durability: Durability) -> Store {
        match &self.place {
            Place::Memory(store) => store.clone(),
            _ => self.backend.open_arg(&self.arg_str(), durability),
        }
    }

    /// The LMDB directory, for the tests in `tests/lmdb.rs` that open the
    /// environment with heed. Panics on any other backend.
    pub fn lmdb_dir(&self) -> &Path {
        match &self.place {
            Place::Dir(p) => p,
            Place::Memory(_) => panic!("the memory backend has no LMDB directory"),
            #[cfg(feature = "postgres")]
            Place::Database(_) => panic!("the PostgreSQL backend has no LMDB directory"),
        }
    }

    pub fn into_store(self, durability: Durability) -> TestStore {
        let store = self.open(durability);
        TestStore {
            location: self,
            durability,
            store: Some(store),
        }
    }
}

/// An open store and everything that must live as long as it. Derefs to
/// [`Store`], so a test calls `store.put(..)` and passes `&store` where a
/// `&Store` is wanted.
pub struct TestStore {
    // Field order: the handle is dropped before its location is removed.
    store: Option<Store>,
    durability: Durability,
    location: Location,
}

impl TestStore {
    pub fn backend(&self) -> TestBackend {
        self.location.backend
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// A second, independently opened handle on the same store, with the
    /// same options.
    pub fn open_again(&self) -> Store {
        self.location.open(self.durability)
    }

    /// Drops this handle and opens the store again.
    pub fn reopen(&mut self) {
        self.store = None;
        self.store = Some(self.location.open(self.durability));
    }

    /// Drops this handle (clones made from it stay open), e.g. before
    /// changing the store from outside; [`TestStore::reopen`] opens it
    /// again.
    pub fn close(&mut self) {
        self.store = None;
    }

    /// The `--store` value for the CLI.
    pub fn store_arg(&self) -> OsString {
        self.location.arg()
    }

    pub fn scratch(&self) -> &Path {
        self.location.scratch()
    }
}

impl std::ops::Deref for TestStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        self.store
            .as_ref()
            .expect("the test closed this store; reopen it first")
    }
}

/// Turns each listed semantic test `fn name(b: &TestBackend)` into one
/// `#[test]` per backend: `lmdb::name`, `memory::name`, and so on. Attributes before a name
/// (`#[ignore]`, `#[ignore = "why"]`) go onto every backend's test.
///
/// ```ignore
/// conformance!(put_get_and_dedup, #[ignore] long_stress);
/// ```
#[macro_export]
macro_rules! conformance {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        // The backend list: one line per backend.
        $crate::conformance!(@backend lmdb, Lmdb; $($(#[$attr])* $name),*);
        $crate::conformance!(@backend memory, Memory; $($(#[$attr])* $name),*);
        #[cfg(feature = "postgres")]
        $crate::conformance!(@backend postgres, Postgres; $($(#[$attr])* $name),*);
    };
    (@backend $module:ident, $variant:ident; $($(#[$attr:meta])* $name:ident),*) => {
        mod $module {
            $(
                #[test]
                $(#[$attr])*
                fn $name() {
                    let backend = $crate::common::backend::TestBackend::$variant;
                    if backend.available() {
                        super::$name(backend);
                    }
                }
            )*
        }
    };
}

/// [`conformance!`] for tests that name the store to another process (the
/// CLI, a second process racing the first): only backends that a separate
/// process can open by `--store` value. The in-memory backend is not one.
#[macro_export]
macro_rules! process_conformance {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        // The backend list: one line per backend another process can reach.
        $crate::conformance!(@backend lmdb, Lmdb; $($(#[$attr])* $name),*);
        #[cfg(feature = "postgres")]
        $crate::conformance!(@backend postgres, Postgres; $($(#[$attr])* $name),*);
    };
}
