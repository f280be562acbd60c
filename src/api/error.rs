//! Failures in the contract: what kind of failure an error is (the same
//! for every face: the CLI's `--json` error line, the HTTP status, the MCP
//! tool error), and the answer that carries it.

use schemars::JsonSchema;
use serde::Serialize;

use crate::backend::BackendError;
use crate::bundle::BundleError;
use crate::copy::CopyError;
use crate::engine::EngineError;
use crate::gc::GcError;
use crate::salvage::SalvageError;
use crate::store::{OpenError, StoreError};
use crate::thread::ThreadError;
use crate::workflow::WorkflowError;

/// What kind of failure an error is: what a client acts on without
/// reading the message.
///
/// ```
/// use uwf_db::api::ErrorKind;
/// use uwf_db::thread::ThreadError;
/// let unknown = ThreadError::Unknown("01ab".into());
/// assert_eq!(ErrorKind::from(&unknown), ErrorKind::NotFound);
/// assert_eq!(serde_json::to_string(&ErrorKind::NotFound)?, r#""not_found""#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No thread, workflow, blob or store has that name (HTTP 404).
    NotFound,
    /// A prefix matches more than one (HTTP 400).
    Ambiguous,
    /// The input is not acceptable: a workflow, a label, a bundle, an
    /// option (HTTP 400).
    Invalid,
    /// The thread or store is not in a state that allows it: its head
    /// moved, it is driven elsewhere, it is suspended, it exists (HTTP 409).
    Conflict,
    /// Past a size or count limit (HTTP 413).
    TooLarge,
    /// A step failed: the agent, its reply, or routing; recorded on the
    /// thread, which can be driven again (HTTP 422).
    StepFailed,
    /// The store's data file is damaged: `verify`, then `salvage` (exit 3).
    Damaged,
    /// A stored record or blob is wrong (its checks fail): `verify`.
    Corrupt,
    /// The store has no room left: its map size or its disk.
    Full,
    /// The storage could not be reached or failed (a server, a connection,
    /// the file system): the same request may succeed later (HTTP 503).
    Unavailable,
    /// Cancelled by a signal or a token: nothing was half-written.
    Interrupted,
    /// The request carries no token, or a wrong one (HTTP 401; `serve`).
    Unauthorized,
    /// The request is refused whoever sends it: a write from another
    /// origin, a host name the server does not answer to, a write to a
    /// read-only server (HTTP 403; `serve`).
    Forbidden,
    /// Anything else.
    Failed,
}

impl ErrorKind {
    /// The kind's name, as in JSON (`not_found`, `step_failed`, ...).
    ///
    /// ```
    /// use uwf_db::api::ErrorKind;
    /// assert_eq!(ErrorKind::StepFailed.as_str(), "step_failed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Ambiguous => "ambiguous",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Conflict => "conflict",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::StepFailed => "step_failed",
            ErrorKind::Damaged => "damaged",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Full => "full",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Failed => "failed",
        }
    }

    /// The HTTP status `uwf-db serve` answers with (SPEC §12).
    ///
    /// ```
    /// use uwf_db::api::ErrorKind;
    /// assert_eq!(ErrorKind::NotFound.http_status(), 404);
    /// assert_eq!(ErrorKind::Conflict.http_status(), 409);
    /// assert_eq!(ErrorKind::Corrupt.http_status(), 500);
    /// ```
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::Ambiguous | ErrorKind::Invalid => 400,
            ErrorKind::Conflict => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::StepFailed => 422,
            ErrorKind::Unavailable | ErrorKind::Interrupted => 503,
            ErrorKind::Full => 507,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::Damaged | ErrorKind::Corrupt | ErrorKind::Failed => 500,
        }
    }
}

impl From<&BackendError> for ErrorKind {
    fn from(e: &BackendError) -> Self {
        if e.is_damage() {
            return ErrorKind::Damaged;
        }
        if e.is_full() {
            return ErrorKind::Full;
        }
        match e {
            BackendError::NotInitialized { .. } => ErrorKind::NotFound,
            BackendError::UnsupportedFormat { .. }
            | BackendError::MissingFormat { .. }
            | BackendError::UnsupportedSchema { .. }
            | BackendError::BadSchema { .. }
            | BackendError::PlantedFile { .. } => ErrorKind::Invalid,
            BackendError::ReadOnly { .. } | BackendError::LockLost { .. } => ErrorKind::Conflict,
            BackendError::UndecodableRecord { .. } => ErrorKind::Corrupt,
            _ => ErrorKind::Unavailable,
        }
    }
}

impl From<&OpenError> for ErrorKind {
    fn from(e: &OpenError) -> Self {
        match e {
            OpenError::OptionsConflict { .. } => ErrorKind::Conflict,
            OpenError::NoPostgres { .. } => ErrorKind::Invalid,
            OpenError::Backend(b) => b.into(),
        }
    }
}

impl From<&StoreError> for ErrorKind {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::Backend(b) => b.into(),
            StoreError::Open(o) => o.as_ref().into(),
            StoreError::MissingRef { .. } | StoreError::Codec(_) => ErrorKind::Invalid,
            StoreError::UnknownHash { .. } => ErrorKind::NotFound,
            StoreError::AmbiguousPrefix { .. } => ErrorKind::Ambiguous,
            StoreError::Corrupt { .. } => ErrorKind::Corrupt,
            StoreError::GroupCommit { source } => source.as_ref().into(),
            StoreError::GroupStopped => ErrorKind::Unavailable,
        }
    }
}

impl From<&ThreadError> for ErrorKind {
    fn from(e: &ThreadError) -> Self {
        match e {
            ThreadError::Store(s) => s.into(),
            ThreadError::Unknown(_) => ErrorKind::NotFound,
            ThreadError::Ambiguous { .. } => ErrorKind::Ambiguous,
            ThreadError::Conflict { .. }
            | ThreadError::IdTaken(_)
            | ThreadError::ChildrenConflict { .. }
            | ThreadError::WrongStatus { .. } => ErrorKind::Conflict,
            ThreadError::MissingNode { .. } | ThreadError::CorruptRecord { .. } => {
                ErrorKind::Corrupt
            }
            _ => ErrorKind::Invalid,
        }
    }
}

impl From<&WorkflowError> for ErrorKind {
    fn from(e: &WorkflowError) -> Self {
        match e {
            WorkflowError::Store(s) => s.into(),
            WorkflowError::Unknown(_) => ErrorKind::NotFound,
            WorkflowError::Corrupt { .. } => ErrorKind::Corrupt,
            _ => ErrorKind::Invalid,
        }
    }
}

impl From<&EngineError> for ErrorKind {
    fn from(e: &EngineError) -> Self {
        match e {
            EngineError::Store(s) => s.into(),
            EngineError::Thread(t) => t.into(),
            EngineError::Workflow(w) => w.into(),
            EngineError::StepFailed { .. } => ErrorKind::StepFailed,
            EngineError::NotSteppable { .. }
            | EngineError::NotRunning { .. }
            | EngineError::AlreadyEnded { .. }
            | EngineError::NotResumable { .. }
            | EngineError::ResumeThroughParent { .. }
            | EngineError::Claimed { .. }
            | EngineError::RemoveDriven { .. } => ErrorKind::Conflict,
            EngineError::TooManyThreads { .. } => ErrorKind::TooLarge,
            EngineError::Interrupted | EngineError::FanOutStopped { .. } => ErrorKind::Interrupted,
            EngineError::NoSuchStep { .. } => ErrorKind::NotFound,
            _ => ErrorKind::Invalid,
        }
    }
}

impl From<&GcError> for ErrorKind {
    fn from(e: &GcError) -> Self {
        match e {
            GcError::Store(s) => s.into(),
            GcError::Retention(t) => t.into(),
            GcError::Busy { .. } | GcError::UnfinishedCopy { .. } => ErrorKind::Conflict,
            GcError::Corrupt { .. } => ErrorKind::Corrupt,
            GcError::TooLarge { .. } => ErrorKind::TooLarge,
            _ => ErrorKind::Failed,
        }
    }
}

impl From<&CopyError> for ErrorKind {
    fn from(e: &CopyError) -> Self {
        match e {
            CopyError::SourceMissing { .. } => ErrorKind::NotFound,
            CopyError::OtherCopy { .. } | CopyError::Busy { .. } => ErrorKind::Conflict,
            CopyError::Cancelled { .. } => ErrorKind::Interrupted,
            CopyError::Source { source, .. } | CopyError::Destination { source, .. } => {
                source.into()
            }
            CopyError::Mismatch { .. } | CopyError::Problems { .. } => ErrorKind::Corrupt,
            CopyError::OpenSource { .. } | CopyError::OpenDestination { .. } => ErrorKind::Failed,
            _ => ErrorKind::Invalid,
        }
    }
}

impl From<&BundleError> for ErrorKind {
    fn from(e: &BundleError) -> Self {
        match e {
            BundleError::Store(s) => s.into(),
            BundleError::Thread(t) => t.into(),
            BundleError::TooLarge { .. } => ErrorKind::TooLarge,
            BundleError::Exists { .. } => ErrorKind::Conflict,
            BundleError::Write(_) => ErrorKind::Failed,
            _ => ErrorKind::Invalid,
        }
    }
}

impl From<&SalvageError> for ErrorKind {
    fn from(e: &SalvageError) -> Self {
        match e {
            SalvageError::Store(s) => s.into(),
            SalvageError::Thread(t) => t.into(),
            _ => ErrorKind::Failed,
        }
    }
}

/// A failed command, under `--json`: `{"error": {...}}`, one line on
/// stderr (SPEC §12).
///
/// ```
/// use uwf_db::api::{ErrorAnswer, ErrorBody, ErrorKind};
/// let e = ErrorAnswer {
///     error: ErrorBody {
///         kind: ErrorKind::NotFound,
///         message: "no thread matches '01ab'".into(),
///         causes: vec![],
///         hint: None,
///         exit_code: 1,
///     },
/// };
/// let line = serde_json::to_string(&e)?;
/// assert_eq!(
///     line,
///     r#"{"error":{"kind":"not_found","message":"no thread matches '01ab'","causes":[],"hint":null,"exit_code":1}}"#
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ErrorAnswer {
    /// What went wrong.
    pub error: ErrorBody,
}

/// The parts of a failure: the same as the text form's lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ErrorBody {
    /// What kind of failure it is.
    pub kind: ErrorKind,
    /// What went wrong (the text's `error:` line).
    pub message: String,
    /// Its causes the message does not already say, outermost first.
    pub causes: Vec<String>,
    /// What to type next, when the remedy is a command line.
    pub hint: Option<String>,
    /// The process's exit code: 1 a failure, 3 a damaged data file.
    pub exit_code: u8,
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    /// `as_str` names each kind as its JSON does.
    #[test]
    fn as_str_is_the_json_name() {
        let all = [
            ErrorKind::NotFound,
            ErrorKind::Ambiguous,
            ErrorKind::Invalid,
            ErrorKind::Conflict,
            ErrorKind::TooLarge,
            ErrorKind::StepFailed,
            ErrorKind::Damaged,
            ErrorKind::Corrupt,
            ErrorKind::Full,
            ErrorKind::Unavailable,
            ErrorKind::Interrupted,
            ErrorKind::Unauthorized,
            ErrorKind::Forbidden,
            ErrorKind::Failed,
        ];
        for kind in all {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json.as_str(), Some(kind.as_str()));
        }
    }
}
