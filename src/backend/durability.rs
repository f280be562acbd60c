//! When a commit is on disk: the one setting every backend honours.

use std::fmt;
use std::str::FromStr;

/// Whether a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every commit is flushed to disk before it returns (LMDB's default).
    #[default]
    Sync,
    /// Commits are not flushed: a crash of the machine (not of the process)
    /// may lose recent commits. For throwaway runs and benchmarks.
    None,
}

impl Durability {
    /// `"sync"` or `"none"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::None => "none",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Durability::Sync),
            "none" => Ok(Durability::None),
            other => Err(format!("unknown durability '{other}' (use sync or none)")),
        }
    }
}
