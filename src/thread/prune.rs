//! Retention: unlink ended threads by policy (`uwf-db prune`, SPEC §11),
//! so that `gc` can free what only they reached. Written against the
//! storage boundary: LMDB, PostgreSQL and memory stores all have it.
//!
//! A thread is pruned when it is ended (in `history`) and matches every
//! condition of the policy; a policy with no condition is refused (it
//! would unlink every ended thread). A child thread is never pruned while
//! its parent is kept. Active, running and suspended threads live in the
//! active index and are never looked at. See `docs/design.md` §7b.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::backend::Table;
use crate::hash::Hash;
use crate::store::StoreError;

use super::index;
use super::labels::{Labels, check_labels};
use super::{ThreadError, ThreadId, ThreadRecord, ThreadStatus, Threads};

/// The `meta` key of the stored policy (JSON), which `gc` applies first.
pub(crate) const RETENTION_KEY: &str = "retention_policy";

/// Threads unlinked per write transaction.
const CHUNK: usize = 256;

/// Which ended threads to unlink: those matching every condition given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Ended more than this many ms ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_ms: Option<u64>,
    /// Not among the newest N ended threads of its workflow (by end time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_latest: Option<u64>,
    /// Ended with one of these statuses (`completed`, `failed`,
    /// `cancelled`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statuses: Vec<ThreadStatus>,
    /// Of this workflow (by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// Carrying every one of these labels.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

impl RetentionPolicy {
    /// Whether no condition is set.
    pub fn is_empty(&self) -> bool {
        self.older_than_ms.is_none()
            && self.keep_latest.is_none()
            && self.statuses.is_empty()
            && self.workflow.is_none()
            && self.labels.is_empty()
    }

    fn check(&self) -> Result<(), ThreadError> {
        if self.is_empty() {
            return Err(ThreadError::EmptyRetention);
        }
        check_labels(&self.labels)?;
        if let Some(s) = self.statuses.iter().find(|s| !s.is_done()) {
            return Err(ThreadError::RetentionStatus(*s));
        }
        Ok(())
    }
}

/// What [`Threads::prune`] did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PruneReport {
    /// Nothing was unlinked.
    pub dry_run: bool,
    /// The threads unlinked, oldest end first.
    pub pruned: Vec<ThreadId>,
    /// Ended threads kept.
    pub kept: u64,
    /// Threads that matched but changed before they could be unlinked (a
    /// resume moved one back to the active index, say): kept.
    pub changed: u64,
}

/// One ended thread as the scan saw it.
struct Ended {
    id: ThreadId,
    head: Hash,
    workflow: String,
    completed_at: u64,
    status: ThreadStatus,
    parent: Option<ThreadId>,
    /// Carries every label of the policy.
    labelled: bool,
}

impl Threads<'_> {
    /// Unlinks the ended threads that `policy` selects (every condition
    /// must match), keeping children of kept parents; with `dry_run`,
    /// only says which. Their blobs stay until `gc` frees what nothing
    /// else reaches. Each thread is unlinked only if it is still ended
    /// with the head the scan saw.
    ///
    /// ```
    /// use uwf_db::thread::RetentionPolicy;
    /// let store = uwf_db::Store::memory();
    /// let policy = RetentionPolicy { keep_latest: Some(1), ..RetentionPolicy::default() };
    /// let report = store.threads().prune(&policy, true)?;
    /// assert!(report.pruned.is_empty()); // nothing has ended yet
    /// # Ok::<(), uwf_db::thread::ThreadError>(())
    /// ```
    pub fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
    ) -> Result<PruneReport, ThreadError> {
        policy.check()?;
        let now = crate::store::now_ms();
        let mut ended = Vec::new();
        self.store
            .scan_table::<ThreadError>(Table::History, |_, _, value| {
                let r = ThreadRecord::decode(value)?;
                let labelled = policy
                    .labels
                    .iter()
                    .all(|(k, v)| r.labels.get(k) == Some(v));
                ended.push(Ended {
                    labelled,
                    id: r.id,
                    head: r.head,
                    workflow: r.workflow,
                    completed_at: r.completed_at.unwrap_or(r.updated_at),
                    status: r.status,
                    parent: r.parent_thread,
                });
                Ok(())
            })?;
        // Newest first within each workflow, for keep_latest.
        ended.sort_by(|a, b| {
            (a.workflow.as_str(), std::cmp::Reverse(a.completed_at), a.id).cmp(&(
                b.workflow.as_str(),
                std::cmp::Reverse(b.completed_at),
                b.id,
            ))
        });
        let mut rank: HashMap<&str, u64> = HashMap::new();
        let mut selected: HashSet<ThreadId> = HashSet::new();
        for e in &ended {
            let n = rank.entry(e.workflow.as_str()).or_default();
            *n += 1;
            let matches = policy
                .older_than_ms
                .is_none_or(|d| e.completed_at < now.saturating_sub(d))
                && policy.keep_latest.is_none_or(|k| *n > k)
                && (policy.statuses.is_empty() || policy.statuses.contains(&e.status))
                && policy.workflow.as_ref().is_none_or(|w| *w == e.workflow)
                && e.labelled;
            if matches {
                selected.insert(e.id);
            }
        }
        // A child goes only with its parent (or when its parent is gone).
        let parents: HashMap<ThreadId, ThreadId> = ended
            .iter()
            .filter_map(|e| Some((e.id, e.parent?)))
            .collect();
        let mut exists: HashMap<ThreadId, bool> = HashMap::new();
        loop {
            let mut keep = Vec::new();
            for id in &selected {
                let Some(parent) = parents.get(id) else {
                    continue;
                };
                if selected.contains(parent) {
                    continue;
                }
                let there = match exists.get(parent) {
                    Some(there) => *there,
                    None => {
                        let there = self
                            .store
                            .read(|r| index::find(r.tables(), *parent))?
                            .is_some();
                        exists.insert(*parent, there);
                        there
                    }
                };
                if there {
                    keep.push(*id);
                }
            }
            if keep.is_empty() {
                break;
            }
            for id in keep {
                selected.remove(&id);
            }
        }
        let mut chosen: Vec<&Ended> = ended.iter().filter(|e| selected.contains(&e.id)).collect();
        chosen.sort_by_key(|e| (e.completed_at, e.id));
        let mut report = PruneReport {
            dry_run,
            kept: (ended.len() - chosen.len()) as u64,
            ..PruneReport::default()
        };
        if dry_run {
            report.pruned = chosen.iter().map(|e| e.id).collect();
            return Ok(report);
        }
        for chunk in chosen.chunks(CHUNK) {
            let gone = self.store.write(|w| {
                let mut gone = Vec::with_capacity(chunk.len());
                for e in chunk {
                    match index::find(w.tables(), e.id)? {
                        Some((rec, location))
                            if rec.head == e.head
                                && rec.status.is_done()
                                && matches!(location, index::Location::History(_)) =>
                        {
                            index::remove(w, &rec, location)?;
                            gone.push(e.id);
                        }
                        _ => {}
                    }
                }
                Ok::<_, ThreadError>(gone)
            })?;
            report.changed += (chunk.len() - gone.len()) as u64;
            report.kept += (chunk.len() - gone.len()) as u64;
            report.pruned.extend(gone);
        }
        Ok(report)
    }

    /// The retention policy stored in the store (`uwf-db prune --set`), if
    /// any: `gc` applies it before it collects.
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// assert_eq!(store.threads().retention_policy()?, None); // until one is set
    /// # Ok::<(), uwf_db::thread::ThreadError>(())
    /// ```
    pub fn retention_policy(&self) -> Result<Option<RetentionPolicy>, ThreadError> {
        let stored = self.store.read(|r| {
            Ok::<_, StoreError>(
                r.tables()
                    .get(Table::Meta, RETENTION_KEY.as_bytes())?
                    .map(|v| v.into_owned()),
            )
        })?;
        stored
            .map(|bytes| {
                serde_json::from_slice(&bytes).map_err(|e| ThreadError::BadRetention(e.to_string()))
            })
            .transpose()
    }

    /// Stores `policy` (checked like a prune's) for `gc` to apply first;
    /// `None` removes the stored policy.
    ///
    /// ```
    /// use uwf_db::thread::RetentionPolicy;
    /// let store = uwf_db::Store::memory();
    /// let policy = RetentionPolicy { keep_latest: Some(100), ..RetentionPolicy::default() };
    /// store.threads().set_retention_policy(Some(&policy))?;
    /// assert_eq!(store.threads().retention_policy()?, Some(policy));
    /// store.threads().set_retention_policy(None)?;
    /// assert_eq!(store.threads().retention_policy()?, None);
    /// # Ok::<(), uwf_db::thread::ThreadError>(())
    /// ```
    pub fn set_retention_policy(
        &self,
        policy: Option<&RetentionPolicy>,
    ) -> Result<(), ThreadError> {
        let bytes = match policy {
            Some(p) => {
                p.check()?;
                Some(serde_json::to_vec(p).map_err(|e| ThreadError::BadRetention(e.to_string()))?)
            }
            None => None,
        };
        self.store.write_exclusive(|w| {
            let t = w.tables_mut();
            match &bytes {
                Some(b) => t.put(Table::Meta, RETENTION_KEY.as_bytes(), b)?,
                None => t.remove(Table::Meta, RETENTION_KEY.as_bytes())?,
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(())
    }
}
