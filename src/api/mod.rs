//! The JSON contract: every answer the faces give, as serde types.
//!
//! The CLI's `--json` output is made of these types and of the library's
//! own reports ([`StepResult`], [`BatchItem`], [`GcReport`], [`CopyReport`],
//! [`PruneReport`], [`ExportReport`], [`ImportReport`]); the HTTP server,
//! the MCP server and the Python package serve the same ones. Each has a
//! JSON Schema generated from the code ([`schemas`]), committed under
//! `docs/schemas/v2/` and checked against the code by a test; which command
//! prints which type is in `docs/schemas/README.md`.
//!
//! The contract is versioned as a whole ([`API_VERSION`]): a field may be
//! added within a version; renaming, removing or retyping one makes a new
//! version.
//!
//! ```
//! let names: Vec<&str> = uwf_db::api::schemas().iter().map(|s| s.name).collect();
//! assert!(names.contains(&"ThreadSummary"));
//! assert!(names.contains(&"StepResult"));
//! ```

pub mod blob;
mod error;
mod serve;
mod store;
mod thread;
mod time;
mod workflow;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};

pub use blob::{BlobDetail, BlobPin, BlobPresence, BlobPut, BlobRef, WalkedBlob};
pub use error::{ErrorAnswer, ErrorBody, ErrorKind};
pub use serve::{
    CancelRequest, DriveAccepted, DriveRequest, ForkRequest, GraphEdge, GraphNode, Health,
    LabelsRequest, LogPage, ResumeRequest, StartRequest, ThreadDiff, ThreadPage, WorkflowGraph,
    WorkflowList, WorkflowView,
};
pub use store::{
    BatchSummary, PolicyAnswer, SalvageAnswer, StatsAnswer, StoreInit, VerifyAnswer, VerifyProblem,
};
pub use thread::{
    ForkedFrom, KeptTexts, LabelsSet, LogEntry, StepUsageEntry, StopRequested, SummaryStaged,
    ThreadActivity, ThreadDetail, ThreadForked, ThreadRemoved, ThreadStarted, ThreadSummary,
    TreeFork, TreeNode, TreeParent, TreeView, resume_command,
};
pub use time::Timestamp;
pub use workflow::{WorkflowAdded, WorkflowDetail, WorkflowEntry, WorkflowValidation};

use crate::bundle::{ExportReport, ImportReport};
use crate::copy::CopyReport;
use crate::engine::StepResult;
use crate::engine::batch::BatchItem;
use crate::gc::GcReport;
use crate::thread::PruneReport;

/// The version of the JSON contract (the folder `docs/schemas/v2/`).
///
/// Version 2 (issue 19, SPEC §12): times are RFC 3339 strings in UTC with
/// milliseconds ([`Timestamp`]), a thread's id is `thread` in every
/// answer, and a failure under `--json` is an [`ErrorAnswer`]. Version 1
/// stays under `docs/schemas/v1/` for the record.
pub const API_VERSION: u32 = 2;

/// One type of the contract and its JSON Schema.
#[derive(Debug, Clone)]
pub struct AnswerSchema {
    /// The type's name (the schema's file is `NAME.json`).
    pub name: &'static str,
    /// The JSON Schema (draft 2020-12) of the type as it is serialized.
    pub schema: Schema,
}

/// The schema of `T` as it is serialized, draft 2020-12, with its `$id`
/// naming the contract's version.
pub fn schema_of<T: JsonSchema>(name: &str) -> Schema {
    with_id(SchemaSettings::draft2020_12().for_serialize(), name, |g| {
        g.into_root_schema_for::<T>()
    })
}

/// The schema of `T` as it is read (a request body): a field with a
/// default is optional.
pub fn request_schema_of<T: JsonSchema>(name: &str) -> Schema {
    with_id(
        SchemaSettings::draft2020_12().for_deserialize(),
        name,
        |g| g.into_root_schema_for::<T>(),
    )
}

fn with_id(
    settings: SchemaSettings,
    name: &str,
    root: impl FnOnce(schemars::SchemaGenerator) -> Schema,
) -> Schema {
    let mut schema = root(settings.into_generator());
    schema.insert(
        "$id".into(),
        format!("urn:uwf-db:api:v{API_VERSION}:{name}").into(),
    );
    schema
}

/// Every type of the contract, by name, with its schema.
pub fn schemas() -> Vec<AnswerSchema> {
    fn entry<T: JsonSchema>(name: &'static str) -> AnswerSchema {
        AnswerSchema {
            name,
            schema: schema_of::<T>(name),
        }
    }
    fn request<T: JsonSchema>(name: &'static str) -> AnswerSchema {
        AnswerSchema {
            name,
            schema: request_schema_of::<T>(name),
        }
    }
    vec![
        entry::<ThreadSummary>("ThreadSummary"),
        entry::<ThreadDetail>("ThreadDetail"),
        entry::<LogEntry>("LogEntry"),
        entry::<TreeView>("TreeView"),
        entry::<ThreadStarted>("ThreadStarted"),
        entry::<ThreadForked>("ThreadForked"),
        entry::<SummaryStaged>("SummaryStaged"),
        entry::<LabelsSet>("LabelsSet"),
        entry::<ThreadRemoved>("ThreadRemoved"),
        entry::<StopRequested>("StopRequested"),
        entry::<ThreadActivity>("ThreadActivity"),
        entry::<StepResult>("StepResult"),
        entry::<BatchItem>("BatchItem"),
        entry::<BatchSummary>("BatchSummary"),
        entry::<WorkflowAdded>("WorkflowAdded"),
        entry::<WorkflowEntry>("WorkflowEntry"),
        entry::<WorkflowDetail>("WorkflowDetail"),
        entry::<WorkflowValidation>("WorkflowValidation"),
        entry::<BlobPin>("BlobPin"),
        entry::<BlobPut>("BlobPut"),
        entry::<BlobDetail>("BlobDetail"),
        entry::<BlobPresence>("BlobPresence"),
        entry::<BlobRef>("BlobRef"),
        entry::<WalkedBlob>("WalkedBlob"),
        entry::<crate::Hash>("Hash"),
        entry::<StoreInit>("StoreInit"),
        entry::<VerifyAnswer>("VerifyAnswer"),
        entry::<StatsAnswer>("StatsAnswer"),
        entry::<GcReport>("GcReport"),
        entry::<CopyReport>("CopyReport"),
        entry::<SalvageAnswer>("SalvageAnswer"),
        entry::<PolicyAnswer>("PolicyAnswer"),
        entry::<PruneReport>("PruneReport"),
        entry::<ExportReport>("ExportReport"),
        entry::<ImportReport>("ImportReport"),
        entry::<ErrorAnswer>("ErrorAnswer"),
        entry::<crate::usage::UsageTotals>("UsageTotals"),
        entry::<ThreadPage>("ThreadPage"),
        entry::<LogPage>("LogPage"),
        entry::<Health>("Health"),
        entry::<WorkflowList>("WorkflowList"),
        entry::<WorkflowView>("WorkflowView"),
        entry::<ThreadDiff>("ThreadDiff"),
        entry::<DriveAccepted>("DriveAccepted"),
        request::<StartRequest>("StartRequest"),
        request::<ResumeRequest>("ResumeRequest"),
        request::<DriveRequest>("DriveRequest"),
        request::<CancelRequest>("CancelRequest"),
        request::<ForkRequest>("ForkRequest"),
        request::<LabelsRequest>("LabelsRequest"),
    ]
}
