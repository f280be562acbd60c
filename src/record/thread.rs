//! Thread records (the values of `threads` and `history`) and the
//! `activity` index entries that let listings filter without decoding them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Labels;
use super::id::ThreadId;
use crate::codec::{self, CodecError};
use crate::hash::Hash;
use crate::node::Kind;
use crate::usage::UsageTotals;

/// Where a thread is in its life. Stored, never re-derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ThreadStatus {
    /// Waiting for its next step.
    Idle,
    /// A driver holds it.
    Running,
    /// Waiting for a human (`resume`).
    Suspended,
    /// Reached `$END` (return code 0).
    Completed,
    /// Ended by `maxRounds` (return code 1).
    Failed,
    /// Cancelled (return code 2).
    Cancelled,
}

impl ThreadStatus {
    /// Every status.
    pub const ALL: [ThreadStatus; 6] = [
        ThreadStatus::Idle,
        ThreadStatus::Running,
        ThreadStatus::Suspended,
        ThreadStatus::Completed,
        ThreadStatus::Failed,
        ThreadStatus::Cancelled,
    ];

    /// The lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Idle => "idle",
            ThreadStatus::Running => "running",
            ThreadStatus::Suspended => "suspended",
            ThreadStatus::Completed => "completed",
            ThreadStatus::Failed => "failed",
            ThreadStatus::Cancelled => "cancelled",
        }
    }

    /// Completed, failed or cancelled: the thread lives in history.
    pub const fn is_done(self) -> bool {
        matches!(
            self,
            ThreadStatus::Completed | ThreadStatus::Failed | ThreadStatus::Cancelled
        )
    }

    /// The status an end with this return code leaves.
    pub const fn for_return_code(code: u8) -> ThreadStatus {
        match code {
            0 => ThreadStatus::Completed,
            2 => ThreadStatus::Cancelled,
            _ => ThreadStatus::Failed,
        }
    }

    /// One-byte code in `activity` entries.
    pub(crate) const fn code(self) -> u8 {
        match self {
            ThreadStatus::Idle => 0,
            ThreadStatus::Running => 1,
            ThreadStatus::Suspended => 2,
            ThreadStatus::Completed => 3,
            ThreadStatus::Failed => 4,
            ThreadStatus::Cancelled => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        ThreadStatus::ALL.into_iter().find(|s| s.code() == code)
    }
}

impl fmt::Display for ThreadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for ThreadStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ThreadStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown status '{s}' (use idle, running, suspended, completed, failed or cancelled)"
                )
            })
    }
}

/// Where a fork came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ForkOrigin {
    /// The node the fork's head started at.
    pub node: Hash,
    /// The thread it was forked from.
    pub thread: ThreadId,
}

/// A thread's record. Fields are in byte order of their names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// The child thread a `workflow:` role is running (retries continue it).
    pub active_child: Option<ThreadId>,
    /// The agent spec the thread was driven with.
    pub agent: Option<String>,
    /// Role steps on the chain answered by agents (not `workflow:` roles'
    /// steps, not end nodes), kept by every append; unknown (`None`) for a
    /// fork, whose count would need a walk of the shared history.
    #[serde(default)]
    pub agent_steps: Option<u64>,
    /// While a driver holds the thread (`status` is `running`): the status
    /// underneath, which the steps of the drive update.
    #[serde(default)]
    pub claimed_status: Option<ThreadStatus>,
    /// When the thread ended (ms), while it is in history.
    pub completed_at: Option<u64>,
    /// When the thread was created (ms).
    pub created_at: u64,
    /// The directory its agents work in, and relative `location`s resolve
    /// against: where `run`/`thread start` was called, or `--cwd`. `None`
    /// (a thread made through the library without one): the driver's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// A fan-out role's children, in item order, from the transaction that
    /// creates them until the join is written (`docs/design.md` §5f).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<Vec<ThreadId>>,
    /// The thread and node this thread was forked from.
    pub forked_from: Option<ForkOrigin>,
    /// The newest node of the chain.
    pub head: Hash,
    /// The thread's id.
    pub id: ThreadId,
    /// `KEY=VALUE` labels (SPEC §11), inherited by forks and children,
    /// indexed in `labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    /// `seq` of the newest end node on the chain (0 if none): role steps
    /// since the last end are `seq - last_end_seq` (for `maxRounds`).
    pub last_end_seq: u64,
    /// The latest failed attempt, cleared by the next committed step.
    pub last_error: Option<String>,
    /// The rendered instruction of the next step (when idle).
    pub next_instruction: Option<String>,
    /// The rendered `location` of the edge into the next step (when idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_location: Option<String>,
    /// The role of the next step (when idle).
    pub next_role: Option<String>,
    /// The thread whose `workflow:` role spawned this one.
    pub parent_thread: Option<ThreadId>,
    /// `seq` of the head (0 when the head is the start node).
    pub seq: u64,
    /// A staged compaction summary (a `content` blob) covering everything
    /// up to `head`; written as the `compact` of the next node appended.
    pub staged_compact: Option<Hash>,
    /// The thread's start node.
    pub start: Hash,
    /// The status.
    pub status: ThreadStatus,
    /// When `thread stop` asked the live driver to stop after the step in
    /// flight (ms); the driver clears it when it stops, and a driver that
    /// claims the thread clears a stale one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested_at: Option<u64>,
    /// The rendered edge prompt that suspended the thread.
    pub suspend_message: Option<String>,
    /// The role that produced the suspending status.
    pub suspended_role: Option<String>,
    /// Last change (ms): a step, a status change, a recorded failure.
    pub updated_at: u64,
    /// What the agent calls made for this thread cost (its steps with
    /// their re-asks, compaction summaries, failed attempts; not its
    /// children's calls, which their own records count): absent until one
    /// is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageTotals>,
    /// The workflow's name.
    pub workflow: String,
    /// The stored workflow blob this thread runs.
    pub workflow_hash: Hash,
}

impl ThreadRecord {
    /// The blobs the record refers to, each with its name and the kinds it
    /// may be (empty: any): what `import` and `salvage` check before they
    /// keep a record. The staged summary is `None` when there is none.
    pub(crate) fn blob_refs(&self) -> [(&'static str, Option<Hash>, &'static [Kind]); 4] {
        [
            ("start", Some(self.start), &[Kind::Start]),
            ("head", Some(self.head), &[Kind::Start, Kind::State]),
            ("workflow", Some(self.workflow_hash), &[Kind::Workflow]),
            ("staged summary", self.staged_compact, &[]),
        ]
    }

    /// The status without a driver's claim: what a step left.
    pub fn underlying_status(&self) -> ThreadStatus {
        match (self.status, self.claimed_status) {
            (ThreadStatus::Running, Some(s)) => s,
            (s, _) => s,
        }
    }

    /// Role steps since the last end node (what `maxRounds` counts).
    pub fn rounds(&self) -> u64 {
        self.seq.saturating_sub(self.last_end_seq)
    }

    /// Last activity: the completion time for ended threads, else `updated_at`.
    pub fn last_activity(&self) -> u64 {
        self.completed_at.unwrap_or(self.updated_at)
    }

    /// The stored value: record version `1`, the head (32 bytes, so the hot
    /// path reads it without decoding), then the record as MessagePack.
    /// The stored form: a version byte, the head, then the canonical
    /// encoding of the record (`docs/design.md` §4, thread record value).
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::with_capacity(400);
        out.push(RECORD_VERSION);
        out.extend_from_slice(self.head.as_bytes());
        codec::to_canonical_into(self, &mut out)?;
        Ok(out)
    }

    /// A record from its stored form ([`ThreadRecord::encode`]); any other
    /// bytes are an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let body = record_body(bytes)?;
        let record: ThreadRecord =
            rmp_serde::from_slice(body).map_err(|e| CodecError::Decode(e.to_string()))?;
        if record_head(bytes) != Some(record.head) {
            return Err(CodecError::Decode(
                "the head in the record header differs from the record's".into(),
            ));
        }
        Ok(record)
    }
}

/// Version byte of stored thread records.
const RECORD_VERSION: u8 = 1;

fn record_body(bytes: &[u8]) -> Result<&[u8], CodecError> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, rest)) if rest.len() > 32 => Ok(rest.get(32..).unwrap_or_default()),
        Some((v, _)) => Err(CodecError::Decode(format!(
            "unknown thread record version {v} or truncated record"
        ))),
        None => Err(CodecError::Decode("empty thread record".into())),
    }
}

/// The head stored in a record value, read without decoding the record.
pub(crate) fn record_head(bytes: &[u8]) -> Option<Hash> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, rest)) => rest.get(..32).and_then(Hash::from_slice),
        _ => None,
    }
}

/// The value of an `activity` entry: what listings filter on.
///
/// Layout: status code (1 byte), flags (1 byte: bit 0 = in history,
/// bit 1 = has `last_error`), the workflow name (UTF-8, rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ActivityEntry<'a> {
    pub status: ThreadStatus,
    pub in_history: bool,
    pub has_error: bool,
    pub workflow: &'a [u8],
}

impl<'a> ActivityEntry<'a> {
    pub fn of(record: &'a ThreadRecord) -> Self {
        ActivityEntry {
            status: record.status,
            in_history: record.status.is_done() && record.completed_at.is_some(),
            has_error: record.last_error.is_some(),
            workflow: record.workflow.as_bytes(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(2 + self.workflow.len());
        v.push(self.status.code());
        v.push(u8::from(self.in_history) | (u8::from(self.has_error) << 1));
        v.extend_from_slice(self.workflow);
        v
    }

    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        let (&status, rest) = bytes.split_first()?;
        let (&flags, workflow) = rest.split_first()?;
        Some(ActivityEntry {
            status: ThreadStatus::from_code(status)?,
            in_history: flags & 1 != 0,
            has_error: flags & 2 != 0,
            workflow,
        })
    }
}

/// `activity` key: last activity (u64 BE ms) then the id.
pub(crate) fn activity_key(at_ms: u64, id: ThreadId) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&at_ms.to_be_bytes());
    k[8..].copy_from_slice(&id.to_bytes());
    k
}

/// UTC day number (days since the epoch) of a time in ms.
pub fn utc_day(ms: u64) -> u32 {
    u32::try_from(ms / 86_400_000).unwrap_or(u32::MAX)
}

/// `history` key: UTC completion day (u32 BE) then the id.
pub(crate) fn history_key(day: u32, id: ThreadId) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..4].copy_from_slice(&day.to_be_bytes());
    k[4..].copy_from_slice(&id.to_bytes());
    k
}

/// `children` key: parent id then child id.
pub(crate) fn child_key(parent: ThreadId, child: ThreadId) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..16].copy_from_slice(&parent.to_bytes());
    k[16..].copy_from_slice(&child.to_bytes());
    k
}
