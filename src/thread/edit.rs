//! The edits a user makes to a thread, each one transaction: staging a
//! compaction summary, labels, and unlinking (`thread rm`). The record
//! writes the engine is built from are `write.rs`'s [`LowLevel`](super::LowLevel).

use super::index;
use super::labels::{Labels, check_key, check_labels};
use super::write::load_checked;
use super::{ThreadError, ThreadId, ThreadRecord, Threads};
use crate::hash::Hash;
use crate::node::Blob;
use crate::usage::{StepUsage, UsageTotals};

impl Threads<'_> {
    /// Stages a compaction summary covering everything up to the current
    /// head: context assembly uses it at once, and the next node appended
    /// records it as its `compact`.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let (summary, record) = store.threads().stage_compact(started.id, started.head, "so far, so good")?;
    /// assert_eq!(record.staged_compact, Some(summary));
    /// // The head moved on since? Then nothing is staged.
    /// assert!(store.threads().stage_compact(started.id, summary, "stale").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stage_compact(
        &self,
        id: ThreadId,
        expected_head: Hash,
        summary: &str,
    ) -> Result<(Hash, ThreadRecord), ThreadError> {
        self.stage_compact_counted(id, expected_head, summary, None)
    }

    /// [`Threads::stage_compact`], adding the summarising call's usage to
    /// the thread's totals.
    pub(crate) fn stage_compact_counted(
        &self,
        id: ThreadId,
        expected_head: Hash,
        summary: &str,
        usage: Option<StepUsage>,
    ) -> Result<(Hash, ThreadRecord), ThreadError> {
        let summary = summary.to_owned();
        self.store
            .write_op_reading(super::index::record_reads_for(self.store, id), move |w| {
                let (mut record, location) = load_checked(w, id, expected_head)?;
                let old = record.clone();
                let hash = w.put_blob(&Blob::content(summary.as_str(), []))?;
                if let Some(u) = &usage {
                    record
                        .usage
                        .get_or_insert_with(UsageTotals::default)
                        .add_step(u);
                }
                record.staged_compact = Some(hash);
                record.updated_at = w.now_ms();
                index::put(w, Some((&old, location)), &record)?;
                Ok((hash, record))
            })
    }

    /// Changes a thread's labels: sets every pair of `set` (replacing the
    /// value of a key it has), then removes the keys of `remove` (a key it
    /// does not have is no error). Works on any thread, running or ended
    /// (labels are not state: the head, status and last activity stay, so
    /// a driver's next step is not disturbed). Returns the record.
    ///
    /// ```
    /// use uwf_db::thread::Labels;
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let set = Labels::from([("team".to_owned(), "a".to_owned())]);
    /// assert_eq!(store.threads().set_labels(started.id, &set, &[])?.labels, set);
    /// let record = store.threads().set_labels(started.id, &Labels::new(), &["team".to_owned()])?;
    /// assert!(record.labels.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_labels(
        &self,
        id: ThreadId,
        set: &Labels,
        remove: &[String],
    ) -> Result<ThreadRecord, ThreadError> {
        check_labels(set)?;
        for key in remove {
            check_key(key)?;
        }
        self.store.write(|w| {
            let (old, location) =
                index::find(w.tables(), id)?.ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
            let mut record = old.clone();
            record
                .labels
                .extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            for key in remove {
                record.labels.remove(key);
            }
            check_labels(&record.labels)?;
            if record.labels != old.labels {
                index::put(w, Some((&old, location)), &record)?;
            }
            Ok(record)
        })
    }

    /// Unlinks a thread from the index and history; its blobs stay until
    /// garbage collection frees what nothing else reaches.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let removed = store.threads().remove(started.id)?;
    /// assert_eq!(removed.id, started.id);
    /// assert!(store.threads().get(started.id)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove(&self, id: ThreadId) -> Result<ThreadRecord, ThreadError> {
        self.store.write(|w| {
            let (record, location) =
                index::find(w.tables(), id)?.ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
            index::remove(w, &record, location)?;
            Ok(record)
        })
    }
}
