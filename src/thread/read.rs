//! Reading threads: lookup, listings, history paging through the ancestor
//! lists, context assembly with compaction, and the Merkle call stack.

use std::ops::Bound;

use super::chain::MAX_STACK;
use super::index::{self, Location};
use super::labels::{check_label, label_prefix};
use super::record::{ActivityEntry, activity_key, history_key};
use super::{IdPrefix, ThreadError, ThreadId, ThreadRecord, ThreadStatus, Threads};
use crate::backend::{Direction, KeyRange, Table};
use crate::hash::Hash;
use crate::node::Blob;
use crate::store::ReadTxn;
use crate::usage::UsageTotals;

/// Filters for [`Threads::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadQuery {
    /// Only these statuses (empty: all).
    pub statuses: Vec<ThreadStatus>,
    /// Only this workflow.
    pub workflow: Option<String>,
    /// Only threads whose latest attempt failed (`last_error` set).
    pub failed_only: bool,
    /// Only threads carrying every one of these labels (`KEY`, `VALUE`):
    /// served by the `labels` index, a page costs O(page).
    pub labels: Vec<(String, String)>,
    /// Last activity at or after (ms).
    pub since: Option<u64>,
    /// Last activity before (ms).
    pub until: Option<u64>,
    /// Page size.
    pub limit: usize,
    /// Matching threads to skip first.
    pub offset: usize,
    /// Only threads below this position in the activity order: the
    /// [`ActivityCursor::of`] the previous page's last row, for paging that
    /// is stable while threads change and costs O(page) however deep.
    pub before: Option<ActivityCursor>,
}

/// A position in the activity order (newest first): a thread's last
/// activity and its id. Written `MS-THREAD`; [`ThreadQuery::before`]
/// continues a listing below it.
///
/// ```
/// use uwf_db::thread::{ActivityCursor, ThreadId};
/// let c = ActivityCursor { at: 1_700_000_000_000, thread: ThreadId::generate() };
/// let text = c.to_string();
/// assert_eq!(text.parse::<ActivityCursor>()?, c);
/// assert!("12-nope".parse::<ActivityCursor>().is_err());
/// # Ok::<(), uwf_db::thread::ParseCursorError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActivityCursor {
    /// Last activity (ms since the epoch).
    pub at: u64,
    /// The thread.
    pub thread: ThreadId,
}

impl ActivityCursor {
    /// The position of `record` (its [`ThreadRecord::last_activity`]).
    pub fn of(record: &ThreadRecord) -> Self {
        ActivityCursor {
            at: record.last_activity(),
            thread: record.id,
        }
    }

    fn key(&self) -> [u8; 24] {
        activity_key(self.at, self.thread)
    }
}

impl std::fmt::Display for ActivityCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.at, self.thread)
    }
}

/// A cursor that is not `MS-THREAD`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a cursor (MS-THREAD, as a previous page gave it)")]
pub struct ParseCursorError(pub String);

impl std::str::FromStr for ActivityCursor {
    type Err = ParseCursorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseCursorError(s.chars().take(80).collect());
        let (at, thread) = s.split_once('-').ok_or_else(bad)?;
        Ok(ActivityCursor {
            at: at.parse().map_err(|_| bad())?,
            thread: thread.parse().map_err(|_| bad())?,
        })
    }
}

impl ThreadQuery {
    /// Whether an `activity` entry passes the filters other than labels
    /// and time.
    fn admits(&self, a: &ActivityEntry<'_>) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&a.status))
            && (!self.failed_only || a.has_error)
            && self
                .workflow
                .as_ref()
                .is_none_or(|w| w.as_bytes() == a.workflow)
    }

    /// The exclusive upper key of the listing: `until`, or the cursor,
    /// whichever is lower.
    fn upper_key(&self) -> Option<[u8; 24]> {
        let until = self.until.map(|t| activity_key(t, ThreadId::NIL));
        let before = self.before.map(|c| c.key());
        match (until, before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Default for ThreadQuery {
    fn default() -> Self {
        ThreadQuery {
            statuses: Vec::new(),
            workflow: None,
            failed_only: false,
            labels: Vec::new(),
            since: None,
            until: None,
            limit: 50,
            offset: 0,
            before: None,
        }
    }
}

/// Ended threads of a day range, and how many keys the scan read.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    /// The records, by day then id.
    pub records: Vec<ThreadRecord>,
    /// `history` keys read: the range only, never other days.
    pub keys_visited: usize,
}

/// A thread with its parents and children (records).
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadTree {
    /// Parents, from the top-level thread down to the direct parent.
    pub parents: Vec<ThreadRecord>,
    /// The thread itself.
    pub thread: ThreadRecord,
    /// Children, each with its own children.
    pub children: Vec<ThreadTree>,
}

/// A fork found by [`Threads::forks`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fork {
    /// How many forks down from the thread asked about (1: forked from it).
    pub depth: usize,
    /// The fork's record (`forked_from` names its origin and node).
    pub thread: ThreadRecord,
}

impl Threads<'_> {
    /// The forks of thread `id`, and theirs, depth first: each fork right
    /// after the thread it was forked from, siblings oldest first. Every
    /// record of the store (active and ended) is read to find them — no
    /// index names a thread's forks (a record names its origin) — so this
    /// costs O(threads in the store), in pages of 4,096 records.
    ///
    /// ```
    /// use uwf_db::engine::ForkAt;
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let origin = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let fork = store.engine().fork(origin.id, ForkAt::Head)?;
    /// let fork_of_fork = store.engine().fork(fork.id, ForkAt::Head)?;
    /// let found = store.threads().forks(origin.id)?;
    /// let found: Vec<_> = found.iter().map(|f| (f.depth, f.thread.id)).collect();
    /// assert_eq!(found, [(1, fork.id), (2, fork_of_fork.id)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forks(&self, id: ThreadId) -> Result<Vec<Fork>, ThreadError> {
        let mut by_origin: std::collections::BTreeMap<ThreadId, Vec<ThreadRecord>> =
            std::collections::BTreeMap::new();
        for table in [Table::Threads, Table::History] {
            self.store
                .scan_table::<ThreadError>(table, |_, key, value| {
                    let Some(tid) = key
                        .get(key.len().saturating_sub(16)..)
                        .and_then(ThreadId::from_slice)
                    else {
                        return Ok(());
                    };
                    let record = index::decode(tid, value)?;
                    if let Some(origin) = &record.forked_from {
                        by_origin.entry(origin.thread).or_default().push(record);
                    }
                    Ok(())
                })?;
        }
        for forks in by_origin.values_mut() {
            forks.sort_by_key(|r| (r.created_at, r.id));
        }
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::from([id]);
        // (depth, thread) still to list, the next on top.
        let mut stack: Vec<(usize, ThreadRecord)> = by_origin
            .remove(&id)
            .unwrap_or_default()
            .into_iter()
            .rev()
            .map(|r| (1, r))
            .collect();
        while let Some((depth, record)) = stack.pop() {
            if !seen.insert(record.id) {
                continue;
            }
            for next in by_origin
                .remove(&record.id)
                .unwrap_or_default()
                .into_iter()
                .rev()
            {
                stack.push((depth + 1, next));
            }
            out.push(Fork {
                depth,
                thread: record,
            });
        }
        Ok(out)
    }

    /// The records of `ids`, in their order, read in one transaction (a
    /// fan-out's children: one read, not one per child); an unknown id is an
    /// error.
    pub(crate) fn need_all(&self, ids: &[ThreadId]) -> Result<Vec<ThreadRecord>, ThreadError> {
        // One `find_many` (three round trips at most on a server backend,
        // where a `find` a thread cost one to three each).
        self.store.read(|r| {
            ids.iter()
                .zip(index::find_many(r.tables(), ids)?)
                .map(|(id, found)| {
                    found
                        .map(|(rec, _)| rec)
                        .ok_or_else(|| ThreadError::Unknown(id.to_string()))
                })
                .collect()
        })
    }

    /// The reply text of each record's head (empty for a head that is a
    /// start node), in one transaction.
    pub(crate) fn head_texts(&self, records: &[ThreadRecord]) -> Result<Vec<String>, ThreadError> {
        // Two reads whatever the count (two round trips on a server
        // backend, where one head and its content at a time cost two each).
        self.store.read(|r| {
            let heads: Vec<Hash> = records.iter().map(|rec| rec.head).collect();
            let contents: Vec<Option<Hash>> = r
                .get_blobs(&heads)?
                .into_iter()
                .map(|head| match head {
                    Some(Blob::State(s)) => Some(s.content),
                    _ => None,
                })
                .collect();
            let wanted: Vec<Hash> = contents.iter().flatten().copied().collect();
            let mut texts = wanted.iter().zip(r.get_blobs(&wanted)?);
            contents
                .iter()
                .map(|content| {
                    let Some(content) = content else {
                        return Ok(String::new());
                    };
                    match texts.next() {
                        Some((_, Some(Blob::Content(c)))) => Ok(c.text),
                        Some((_, Some(_))) => Err(ThreadError::WrongKind {
                            hash: *content,
                            expected: "content",
                        }),
                        _ => Err(ThreadError::MissingNode { hash: *content }),
                    }
                })
                .collect()
        })
    }

    /// The content blobs `hashes` names, in their order, read in one read
    /// (one round trip on a server backend); a blob that is missing or not
    /// content is an error.
    pub(crate) fn content_nodes(
        &self,
        hashes: &[Hash],
    ) -> Result<Vec<crate::node::ContentNode>, ThreadError> {
        self.store.read_once(|r| {
            hashes
                .iter()
                .zip(r.get_blobs(hashes)?)
                .map(|(hash, blob)| match blob {
                    Some(Blob::Content(c)) => Ok(c),
                    Some(_) => Err(ThreadError::WrongKind {
                        hash: *hash,
                        expected: "content",
                    }),
                    None => Err(ThreadError::MissingNode { hash: *hash }),
                })
                .collect()
        })
    }

    /// The text of a content blob (a reply, a prompt); a blob that is
    /// missing or not content is an error, never an empty text.
    pub(crate) fn content_text(&self, hash: &Hash) -> Result<String, ThreadError> {
        self.content_node(hash).map(|c| c.text)
    }

    /// A content blob, text and refs.
    pub(crate) fn content_node(
        &self,
        hash: &Hash,
    ) -> Result<crate::node::ContentNode, ThreadError> {
        match self.store.get(hash)? {
            Some(Blob::Content(c)) => Ok(c),
            Some(_) => Err(ThreadError::WrongKind {
                hash: *hash,
                expected: "content",
            }),
            None => Err(ThreadError::MissingNode { hash: *hash }),
        }
    }
}

pub(super) fn find_in(
    r: &ReadTxn<'_>,
    id: ThreadId,
) -> Result<Option<(ThreadRecord, Location)>, ThreadError> {
    index::find(r.tables(), id)
}

pub(super) fn need(r: &ReadTxn<'_>, id: ThreadId) -> Result<ThreadRecord, ThreadError> {
    find_in(r, id)?
        .map(|(rec, _)| rec)
        .ok_or_else(|| ThreadError::Unknown(id.to_string()))
}

impl Threads<'_> {
    /// A thread's record, active or ended: O(log n).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let record = store.threads().get(started.id)?.ok_or("gone")?;
    /// assert_eq!((record.workflow.as_str(), record.seq), ("two", 0));
    /// assert!(store.threads().get(uwf_db::thread::ThreadId::generate())?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&self, id: ThreadId) -> Result<Option<ThreadRecord>, ThreadError> {
        // One round trip for an active thread (its record and
        // `history_ids` in one statement); an ended one reads again in a
        // transaction.
        self.store
            .read_once(|r| Ok(find_in(r, id)?.map(|(rec, _)| rec)))
    }

    /// Resolves a full thread id or a unique prefix.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let prefix = started.id.to_string()[..20].parse()?;
    /// assert_eq!(store.threads().resolve(&prefix)?, started.id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve(&self, prefix: &IdPrefix) -> Result<ThreadId, ThreadError> {
        self.store.read(|r| index::resolve(r.tables(), prefix))
    }

    /// Threads by last activity, newest first, filtered and paged. Filters
    /// read the `activity` index only; records are read for the page alone.
    ///
    /// ```
    /// use uwf_db::thread::{ThreadQuery, ThreadStatus};
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let a = store.engine().start_workflow(hash, "one", &Default::default())?;
    /// store.engine().start_workflow(hash, "two", &Default::default())?;
    /// let idle = ThreadQuery { statuses: vec![ThreadStatus::Idle], ..ThreadQuery::default() };
    /// let page = store.threads().list(&idle)?;
    /// assert_eq!(page.len(), 2);
    /// assert!(page.iter().any(|t| t.id == a.id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn list(&self, q: &ThreadQuery) -> Result<Vec<ThreadRecord>, ThreadError> {
        if !q.labels.is_empty() {
            return self.list_labelled(q);
        }
        self.store.read(|r| {
            let lower = q.since.map(|t| activity_key(t, ThreadId::NIL));
            let upper = q.upper_key();
            let range = KeyRange {
                lower: lower
                    .as_ref()
                    .map_or(Bound::Unbounded, |k| Bound::Included(&k[..])),
                upper: upper
                    .as_ref()
                    .map_or(Bound::Unbounded, |k| Bound::Excluded(&k[..])),
            };
            let mut ids = Vec::with_capacity(q.limit.min(1024));
            let mut skipped = 0;
            for entry in r
                .tables()
                .range(Table::Activity, range, Direction::Reverse)?
            {
                if ids.len() == q.limit {
                    break;
                }
                let (key, value) = entry?;
                let Some(a) = ActivityEntry::parse(&value) else {
                    continue;
                };
                if !q.admits(&a) {
                    continue;
                }
                if skipped < q.offset {
                    skipped += 1;
                    continue;
                }
                ids.extend(key.get(8..).and_then(ThreadId::from_slice));
            }
            // The page's records in one batch (a few round trips on a
            // server backend, not one per thread).
            index::find_many(r.tables(), &ids)?
                .into_iter()
                .zip(&ids)
                .map(|(found, id)| {
                    found
                        .map(|(record, _)| record)
                        .ok_or_else(|| ThreadError::Unknown(id.to_string()))
                })
                .collect()
        })
    }

    /// The threads matching `q`'s filters other than labels (and ignoring
    /// its `since`, `limit` and paging) whose activity entry is at or
    /// after `since`, newest first, at most `limit` entries read, less
    /// those `unchanged` says were already seen (by id, status and last
    /// activity): a scan of the `activity` index alone, with records read
    /// only for the changed threads. What [`crate::Engine::watch_threads`]
    /// polls with.
    pub(crate) fn changed_since(
        &self,
        q: &ThreadQuery,
        since: u64,
        limit: usize,
        unchanged: &dyn Fn(ThreadId, ThreadStatus, u64) -> bool,
    ) -> Result<Vec<ThreadRecord>, ThreadError> {
        self.store.read(|r| {
            let lower = activity_key(since, ThreadId::NIL);
            let upper = q.upper_key();
            let range = KeyRange {
                lower: Bound::Included(&lower[..]),
                upper: upper
                    .as_ref()
                    .map_or(Bound::Unbounded, |k| Bound::Excluded(&k[..])),
            };
            let mut ids = Vec::new();
            for (read, entry) in r
                .tables()
                .range(Table::Activity, range, Direction::Reverse)?
                .enumerate()
            {
                if read == limit {
                    break;
                }
                let (key, value) = entry?;
                let Some(a) = ActivityEntry::parse(&value) else {
                    continue;
                };
                if !q.admits(&a) {
                    continue;
                }
                let (Some(at), Some(id)) = (
                    key.get(..8)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_be_bytes),
                    key.get(8..).and_then(ThreadId::from_slice),
                ) else {
                    continue;
                };
                if !unchanged(id, a.status, at) {
                    ids.push(id);
                }
            }
            Ok(index::find_many(r.tables(), &ids)?
                .into_iter()
                .flatten()
                .map(|(record, _)| record)
                .collect())
        })
    }

    /// [`Threads::list`] with labels: a leapfrog join of the
    /// labels' runs of the `labels` index. Each label's entries end in the
    /// same `activity` key (last activity, id), so the runs are walked
    /// newest first together: each seeks to the newest entry at or below
    /// the current candidate; when all land on it, the thread matches.
    /// One label is a plain scan of its run. The entries carry the
    /// `activity` value, so the other filters need no record.
    fn list_labelled(&self, q: &ThreadQuery) -> Result<Vec<ThreadRecord>, ThreadError> {
        for (k, v) in &q.labels {
            check_label(k, v)?;
        }
        self.store.read(|r| {
            let t = r.tables();
            let since = q.since.map(|at| activity_key(at, ThreadId::NIL));
            let until = q.upper_key();
            let prefixes: Vec<Vec<u8>> = q.labels.iter().map(|(k, v)| label_prefix(k, v)).collect();
            let wanted = |value: &[u8]| ActivityEntry::parse(value).is_some_and(|a| q.admits(&a));
            let mut found: Vec<([u8; 24], ThreadId)> = Vec::with_capacity(q.limit.min(1024));
            let mut skipped = 0;
            let mut take = |suffix: [u8; 24], value: &[u8]| -> bool {
                if wanted(value) {
                    if skipped < q.offset {
                        skipped += 1;
                    } else if let Some(id) = suffix.get(8..).and_then(ThreadId::from_slice) {
                        found.push((suffix, id));
                    }
                }
                found.len() < q.limit
            };
            if q.limit > 0 {
                if let [prefix] = prefixes.as_slice() {
                    let lower = bounded(prefix, since.as_ref());
                    let upper = match &until {
                        Some(u) => bounded(prefix, Some(u)),
                        None => prefix_end(prefix),
                    };
                    let range = KeyRange {
                        lower: Bound::Included(&lower[..]),
                        upper: if upper.is_empty() {
                            Bound::Unbounded
                        } else {
                            Bound::Excluded(&upper[..])
                        },
                    };
                    for entry in t.range(Table::Labels, range, Direction::Reverse)? {
                        let (key, value) = entry?;
                        let Some(suffix) = suffix_of(&key, prefix.len()) else {
                            continue;
                        };
                        if !take(suffix, &value) {
                            break;
                        }
                    }
                } else {
                    leapfrog(t, &prefixes, since, until, &mut take)?;
                }
            }
            let ids: Vec<ThreadId> = found.iter().map(|(_, id)| *id).collect();
            let records = index::find_many(t, &ids)?;
            // An entry that disagrees with its record (left by a build that
            // did not know labels; `verify` reports it) is skipped.
            Ok(records
                .into_iter()
                .zip(&found)
                .filter_map(|(record, (suffix, id))| {
                    let (record, _) = record?;
                    let current = activity_key(record.last_activity(), *id) == *suffix
                        && q.labels
                            .iter()
                            .all(|(k, v)| record.labels.get(k) == Some(v));
                    current.then_some(record)
                })
                .collect())
        })
    }

    /// Ended threads whose UTC completion day is in `from_day..to_day`,
    /// reading only that range of `history`.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// let done = EndSpec { return_code: 0, summary: "done".into(), prompt: "Done".into() };
    /// low.end_thread(t.id, t.head, done)?;
    /// let page = store.threads().history(0, u32::MAX)?; // every day
    /// assert_eq!(page.records.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn history(&self, from_day: u32, to_day: u32) -> Result<HistoryPage, ThreadError> {
        self.store.read(|r| {
            let lower = history_key(from_day, ThreadId::NIL);
            let upper = history_key(to_day, ThreadId::NIL);
            let range = KeyRange::between(&lower, &upper);
            let mut page = HistoryPage {
                records: Vec::new(),
                keys_visited: 0,
            };
            for entry in r
                .tables()
                .range(Table::History, range, Direction::Forward)?
            {
                let (key, value) = entry?;
                page.keys_visited += 1;
                page.records.push(ThreadRecord::decode(&value).map_err(|e| {
                    ThreadError::CorruptRecord {
                        thread: format!("{key:02x?}"),
                        detail: e.to_string(),
                    }
                })?);
            }
            Ok(page)
        })
    }

    /// Usage totals of every thread in the store, active and ended (what
    /// `stats` shows): one scan of `threads` and `history`, decoding each
    /// record, so its cost grows with the number of threads. Threads
    /// unlinked by `rm` or `prune` are no longer counted.
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// assert_eq!(store.threads().usage_totals()?.calls, 0);
    /// # Ok::<(), uwf_db::thread::ThreadError>(())
    /// ```
    pub fn usage_totals(&self) -> Result<UsageTotals, ThreadError> {
        let mut totals = UsageTotals::default();
        for table in [Table::Threads, Table::History] {
            self.store.scan_table::<ThreadError>(table, |_, _, value| {
                if let Some(u) = ThreadRecord::decode(value)?.usage {
                    totals.add(&u);
                }
                Ok(())
            })?;
        }
        Ok(totals)
    }

    /// Usage totals of a thread and its children, recursively (what
    /// `thread show` shows), from a [`Threads::tree`].
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let tree = store.threads().tree(started.id)?;
    /// assert_eq!(uwf_db::Threads::tree_usage(&tree).calls, 0); // no agent call yet
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tree_usage(tree: &ThreadTree) -> UsageTotals {
        let mut totals = tree.thread.usage.clone().unwrap_or_default();
        for child in &tree.children {
            totals.add(&Threads::tree_usage(child));
        }
        totals
    }

    /// A thread's parents (up) and children (down), as records.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let tree = store.threads().tree(started.id)?;
    /// assert_eq!(tree.thread.id, started.id);
    /// assert!(tree.parents.is_empty() && tree.children.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tree(&self, id: ThreadId) -> Result<ThreadTree, ThreadError> {
        self.store.read(|r| {
            let thread = need(r, id)?;
            let mut parents = Vec::new();
            let mut up = thread.parent_thread;
            while let Some(p) = up {
                if parents.len() == MAX_STACK {
                    break;
                }
                // A parent removed with `thread rm` ends the walk up.
                let Some((rec, _)) = find_in(r, p)? else {
                    break;
                };
                up = rec.parent_thread;
                parents.push(rec);
            }
            parents.reverse();
            Ok(ThreadTree {
                parents,
                children: subtree(r, id, 0)?,
                thread,
            })
        })
    }
}

fn subtree(r: &ReadTxn<'_>, id: ThreadId, depth: usize) -> Result<Vec<ThreadTree>, ThreadError> {
    if depth >= MAX_STACK {
        return Ok(Vec::new());
    }
    let kids = index::children(r.tables(), id)?;
    let mut out = Vec::with_capacity(kids.len());
    for child in kids {
        // A child removed with `thread rm` leaves no record: skip it.
        if let Some((thread, _)) = find_in(r, child)? {
            out.push(ThreadTree {
                parents: Vec::new(),
                children: subtree(r, child, depth + 1)?,
                thread,
            });
        }
    }
    Ok(out)
}

/// `prefix` followed by `suffix` (or `prefix` alone).
fn bounded(prefix: &[u8], suffix: Option<&[u8; 24]>) -> Vec<u8> {
    let mut k = prefix.to_vec();
    if let Some(s) = suffix {
        k.extend_from_slice(s);
    }
    k
}

/// The first key after every key that starts with `prefix` (empty: none,
/// the prefix is all 0xff).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    end
}

/// The 24-byte `activity` suffix of a `labels` key with a prefix of
/// `prefix_len` bytes.
fn suffix_of(key: &[u8], prefix_len: usize) -> Option<[u8; 24]> {
    key.get(prefix_len..)?.try_into().ok()
}

/// A `labels` entry found by [`seek`]: its `activity` suffix and value.
type LabelHit = ([u8; 24], Vec<u8>);

/// The newest entry of one label's run whose suffix is at most `at_most`
/// (or below `below`), and not below `since`: its suffix and value.
fn seek(
    t: &dyn crate::backend::ReadTables,
    prefix: &[u8],
    upper: Bound<&[u8; 24]>,
    since: Option<&[u8; 24]>,
) -> Result<Option<LabelHit>, ThreadError> {
    let lower = bounded(prefix, since);
    let upper_key = match upper {
        Bound::Included(s) | Bound::Excluded(s) => bounded(prefix, Some(s)),
        Bound::Unbounded => prefix_end(prefix),
    };
    let range = KeyRange {
        lower: Bound::Included(&lower[..]),
        upper: match upper {
            Bound::Included(_) => Bound::Included(&upper_key[..]),
            _ if upper_key.is_empty() => Bound::Unbounded,
            _ => Bound::Excluded(&upper_key[..]),
        },
    };
    let Some(entry) = t.range(Table::Labels, range, Direction::Reverse)?.next() else {
        return Ok(None);
    };
    let (key, value) = entry?;
    Ok(suffix_of(&key, prefix.len()).map(|s| (s, value.into_owned())))
}

/// Walks the threads carrying every label of `prefixes` (two or more),
/// newest first, handing each (its suffix and `activity` value) to `take`
/// until it returns `false`.
fn leapfrog(
    t: &dyn crate::backend::ReadTables,
    prefixes: &[Vec<u8>],
    since: Option<[u8; 24]>,
    until: Option<[u8; 24]>,
    take: &mut dyn FnMut([u8; 24], &[u8]) -> bool,
) -> Result<(), ThreadError> {
    // Every match found is above this (exclusive): `--until`, then the
    // last match.
    let mut bound: Option<[u8; 24]> = until;
    loop {
        let mut candidate: Option<[u8; 24]> = None;
        let mut agreed = 0;
        let mut value = Vec::new();
        let mut turn = 0;
        while agreed < prefixes.len() {
            let Some(prefix) = prefixes.get(turn) else {
                break;
            };
            let upper = match (&candidate, &bound) {
                (Some(c), _) => Bound::Included(c),
                (None, Some(b)) => Bound::Excluded(b),
                (None, None) => Bound::Unbounded,
            };
            let Some((suffix, v)) = seek(t, prefix, upper, since.as_ref())? else {
                return Ok(());
            };
            if candidate == Some(suffix) {
                agreed += 1;
            } else {
                candidate = Some(suffix);
                agreed = 1;
            }
            value = v;
            turn = (turn + 1) % prefixes.len();
        }
        let Some(found) = candidate else {
            return Ok(());
        };
        if !take(found, &value) {
            return Ok(());
        }
        bound = Some(found);
    }
}
