//! The route table: every endpoint once, with what the OpenAPI document
//! says of it. [`router`] mounts the table; `openapi.rs` describes it.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get, post};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use uwf_db::api;

use super::error::ApiError;
use super::{Shared, assets, events, guard, openapi, reads, writes};

/// A schema maker: adds the type to the generator's components and gives
/// a reference to it.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// Where a parameter is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum In {
    Path,
    Query,
}

/// A parameter and its JSON Schema (as text).
pub struct Param {
    pub name: &'static str,
    pub place: In,
    pub required: bool,
    pub description: &'static str,
    pub schema: &'static str,
}

const fn path(name: &'static str, description: &'static str, schema: &'static str) -> Param {
    Param {
        name,
        place: In::Path,
        required: true,
        description,
        schema,
    }
}

/// A thread id or a prefix of one (at least 6 of its 26 characters).
const THREAD_ID: &str = r#"{"type":"string","pattern":"^[0-9A-Za-z]{6,26}$"}"#;
/// A blob hash or a prefix of one (at least 6 of its 64 hex digits).
const HASH: &str = r#"{"type":"string","pattern":"^[0-9a-fA-F]{6,64}$"}"#;

const fn query(name: &'static str, description: &'static str, schema: &'static str) -> Param {
    Param {
        name,
        place: In::Query,
        required: false,
        description,
        schema,
    }
}

/// What a successful answer is.
pub enum Answer {
    /// JSON of this type, with this status.
    Json(u16, SchemaFn),
    /// A `text/event-stream`.
    Events,
    /// The OpenAPI document itself.
    OpenApi,
}

pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub operation: &'static str,
    pub summary: &'static str,
    pub params: &'static [Param],
    pub body: Option<SchemaFn>,
    pub answer: Answer,
    pub handler: fn() -> MethodRouter<Shared>,
}

const ID: Param = path("id", "A thread id, or a unique prefix of one", THREAD_ID);
const LIMIT: &str = r#"{"type":"integer","minimum":1,"maximum":1000}"#;
const TIME: &str =
    r#"{"type":"string","description":"RFC 3339 (2026-11-26T10:00:00Z) or ms since the epoch"}"#;

/// Every endpoint.
pub static ROUTES: &[Route] = &[
    Route {
        method: "get",
        path: "/api/healthz",
        operation: "healthz",
        summary: "The server is up: its version, backend and agents",
        params: &[],
        body: None,
        answer: Answer::Json(200, schema::<api::Health>),
        handler: || get(reads::healthz),
    },
    Route {
        method: "get",
        path: "/api/threads",
        operation: "listThreads",
        summary: "Threads, newest activity first, filtered and paged by cursor",
        params: &[
            query(
                "status",
                "Only these statuses (repeatable, or comma-separated)",
                r#"{"type":"string","pattern":"^(idle|running|suspended|completed|failed|cancelled)(,(idle|running|suspended|completed|failed|cancelled))*$"}"#,
            ),
            query("workflow", "Only this workflow", r#"{"type":"string"}"#),
            query(
                "label",
                "Only threads with this label, KEY=VALUE (repeatable: all of them)",
                r#"{"type":"string","pattern":"^[a-z0-9][a-z0-9._/-]{0,62}=[^\\u0000-\\u001f]{0,255}$"}"#,
            ),
            query("since", "Last activity at or after", TIME),
            query("until", "Last activity before", TIME),
            query(
                "failed",
                "Only threads whose last attempt failed",
                r#"{"type":"boolean"}"#,
            ),
            query("limit", "Page size (default 50)", LIMIT),
            query(
                "cursor",
                "The next_cursor of the previous page",
                r#"{"type":"string","pattern":"^[0-9]{1,20}-[0-7][0-9A-HJKMNP-TV-Z]{25}$"}"#,
            ),
        ],
        body: None,
        answer: Answer::Json(200, schema::<api::ThreadPage>),
        handler: || get(reads::list_threads),
    },
    Route {
        method: "post",
        path: "/api/threads",
        operation: "startThread",
        summary: "Start a thread of a registered workflow, and drive it with a server agent when asked",
        params: &[],
        body: Some(schema::<api::StartRequest>),
        answer: Answer::Json(201, schema::<api::DriveAccepted>),
        handler: || post(writes::start),
    },
    Route {
        method: "get",
        path: "/api/threads/{id}",
        operation: "getThread",
        summary: "One thread: its record, usage with its children's, its children",
        params: &[ID],
        body: None,
        answer: Answer::Json(200, schema::<api::ThreadDetail>),
        handler: || get(reads::get_thread),
    },
    Route {
        method: "get",
        path: "/api/threads/{id}/log",
        operation: "threadLog",
        summary: "A thread's steps, newest first, paged by `before`",
        params: &[
            ID,
            query(
                "before",
                "The next_before of the previous page (a node hash or prefix)",
                HASH,
            ),
            query(
                "limit",
                "Page size (default 20)",
                r#"{"type":"integer","minimum":1,"maximum":200}"#,
            ),
        ],
        body: None,
        answer: Answer::Json(200, schema::<api::LogPage>),
        handler: || get(reads::thread_log),
    },
    Route {
        method: "get",
        path: "/api/threads/{id}/tree",
        operation: "threadTree",
        summary: "A thread's place in its call tree: parents and children",
        params: &[ID],
        body: None,
        answer: Answer::Json(200, schema::<api::TreeView>),
        handler: || get(reads::thread_tree),
    },
    Route {
        method: "get",
        path: "/api/threads/{id}/events",
        operation: "threadEvents",
        summary: "Server-Sent Events: the thread's steps as they commit (`step`, id = seq) and its status changes (`thread`)",
        params: &[
            ID,
            query(
                "after",
                "Send the steps after this seq (Last-Event-ID wins)",
                r#"{"type":"integer","minimum":0}"#,
            ),
        ],
        body: None,
        answer: Answer::Events,
        handler: || get(events::thread),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/resume",
        operation: "resumeThread",
        summary: "Resume a suspended (or ended) thread with a server agent; answers when driving begins",
        params: &[ID],
        body: Some(schema::<api::ResumeRequest>),
        answer: Answer::Json(202, schema::<api::DriveAccepted>),
        handler: || post(writes::resume),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/drive",
        operation: "driveThread",
        summary: "Drive an idle thread on with a server agent until it ends or suspends; answers when driving begins",
        params: &[ID],
        body: Some(schema::<api::DriveRequest>),
        answer: Answer::Json(202, schema::<api::DriveAccepted>),
        handler: || post(writes::drive),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/stop",
        operation: "stopThread",
        summary: "Ask the thread's driver to stop after its step in flight",
        params: &[ID],
        body: None,
        answer: Answer::Json(200, schema::<api::StopRequested>),
        handler: || post(writes::stop),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/cancel",
        operation: "cancelThread",
        summary: "Cancel a thread (and its children)",
        params: &[ID],
        body: Some(schema::<api::CancelRequest>),
        answer: Answer::Json(200, schema::<uwf_db::engine::StepResult>),
        handler: || post(writes::cancel),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/fork",
        operation: "forkThread",
        summary: "A new thread sharing this one's chain up to a step (no copy)",
        params: &[ID],
        body: Some(schema::<api::ForkRequest>),
        answer: Answer::Json(201, schema::<api::ThreadForked>),
        handler: || post(writes::fork),
    },
    Route {
        method: "post",
        path: "/api/threads/{id}/labels",
        operation: "labelThread",
        summary: "Set and remove a thread's labels",
        params: &[ID],
        body: Some(schema::<api::LabelsRequest>),
        answer: Answer::Json(200, schema::<api::LabelsSet>),
        handler: || post(writes::labels),
    },
    Route {
        method: "get",
        path: "/api/nodes/{hash}",
        operation: "getNode",
        summary: "One blob (a node, a reply, a workflow), refused past max_bytes",
        params: &[
            path("hash", "A blob hash, or a unique prefix of one", HASH),
            query(
                "max_bytes",
                "Largest blob to send (default 1 MiB, at most 64 MiB)",
                r#"{"type":"integer","minimum":0,"maximum":67108864}"#,
            ),
        ],
        body: None,
        answer: Answer::Json(200, schema::<api::BlobDetail>),
        handler: || get(reads::get_node),
    },
    Route {
        method: "get",
        path: "/api/steps/{hash}",
        operation: "getStep",
        summary: "One step by its node's hash, with the exact prompt its agent was sent and its stderr when kept",
        params: &[path(
            "hash",
            "A step's node hash, or a unique prefix of one",
            HASH,
        )],
        body: None,
        answer: Answer::Json(200, schema::<api::LogEntry>),
        handler: || get(reads::get_step),
    },
    Route {
        method: "get",
        path: "/api/diff",
        operation: "diffThreads",
        summary: "Two threads (a fork and its source, say) step by step after what they share",
        params: &[
            Param {
                required: true,
                ..query("a", "A thread id or prefix", THREAD_ID)
            },
            Param {
                required: true,
                ..query("b", "A thread id or prefix", THREAD_ID)
            },
        ],
        body: None,
        answer: Answer::Json(200, schema::<api::ThreadDiff>),
        handler: || get(reads::diff),
    },
    Route {
        method: "get",
        path: "/api/workflows",
        operation: "listWorkflows",
        summary: "Registered workflows",
        params: &[],
        body: None,
        answer: Answer::Json(200, schema::<api::WorkflowList>),
        handler: || get(reads::list_workflows),
    },
    Route {
        method: "get",
        path: "/api/workflows/{name}",
        operation: "getWorkflow",
        summary: "A workflow: its definition, YAML, and graph of roles and status edges",
        params: &[path(
            "name",
            "A registered workflow's name",
            r#"{"type":"string","minLength":1}"#,
        )],
        body: None,
        answer: Answer::Json(200, schema::<api::WorkflowView>),
        handler: || get(reads::get_workflow),
    },
    Route {
        method: "get",
        path: "/api/usage",
        operation: "usage",
        summary: "What every agent call in the store reported, summed",
        params: &[],
        body: None,
        answer: Answer::Json(200, schema::<uwf_db::usage::UsageTotals>),
        handler: || get(reads::usage),
    },
    Route {
        method: "get",
        path: "/api/events",
        operation: "events",
        summary: "Server-Sent Events: every thread's status changes (`thread`, id = MS-THREAD)",
        params: &[query(
            "after",
            "Send the changes after this event id (Last-Event-ID wins)",
            r#"{"type":"string"}"#,
        )],
        body: None,
        answer: Answer::Events,
        handler: || get(events::all),
    },
    Route {
        method: "get",
        path: "/api/openapi.json",
        operation: "openapi",
        summary: "This document",
        params: &[],
        body: None,
        answer: Answer::OpenApi,
        handler: || get(openapi::serve),
    },
];

/// The server's router: the table, the dashboard, the guard and limits.
pub fn router(state: Shared) -> Router {
    let mut api = Router::new();
    let mut streams = Router::new();
    // One router per path, with every method the table gives it.
    let mut by_path: Vec<(&str, bool, MethodRouter<Shared>)> = Vec::new();
    for r in ROUTES {
        let events = matches!(r.answer, Answer::Events);
        match by_path.iter_mut().find(|(p, _, _)| *p == r.path) {
            Some((_, _, m)) => *m = std::mem::take(m).merge((r.handler)()),
            None => by_path.push((r.path, events, (r.handler)())),
        }
    }
    for (path, events, methods) in by_path {
        if events {
            streams = streams.route(path, methods);
        } else {
            api = api.route(path, methods);
        }
    }
    api.merge(streams)
        .route("/metrics", get(super::metrics::serve))
        .route("/", get(assets::index))
        .route("/assets/{*path}", get(assets::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(DefaultBodyLimit::max(super::MAX_BODY))
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> impl IntoResponse {
    ApiError::not_found(format!(
        "no such endpoint: {} (the API is listed at /api/openapi.json)",
        super::params::truncated(uri.path())
    ))
}

async fn not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> impl IntoResponse {
    let mut e = ApiError::invalid(format!(
        "{method} is not allowed on {}",
        super::params::truncated(uri.path())
    ));
    e.1 = Some(StatusCode::METHOD_NOT_ALLOWED);
    e
}
