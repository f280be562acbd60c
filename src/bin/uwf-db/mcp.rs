//! `uwf-db mcp`: a Model Context Protocol server over stdio, so coding
//! agents (Claude Code, Cursor, Codex…) can read and steer a store
//! (`docs/design.md` §8e).
//!
//! Every tool is a thin wrapper of the HTTP handler that answers the same
//! question in `uwf-db serve` (`serve/reads.rs`, `serve/writes.rs`): the
//! same checks, the same agent policy (a call names one of the server's
//! `--agent NAME=SPEC`, never a spec), the same `api` types as `--json`,
//! and errors as the same `ErrorAnswer` JSON, in a tool result marked
//! `isError`. Bodies are left out unless asked for and always capped by
//! `max_bytes`. stdout is the protocol: nothing else is written there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router,
};
use serde::Deserialize;
use serde_json::Value;
use uwf_db::api::{self, ErrorKind, StartRequest};
use uwf_db::engine::Cancel;

use crate::serve::error::{ApiError, ApiResult};
use crate::serve::{AppState, Shared, reads, writes};
use crate::{Cli, CliError};

/// Default cap of each body (a step's reply or instruction) `read_log`
/// returns when bodies are asked for.
const LOG_BODY_BYTES: u64 = 2048;
/// Default and largest `max_bytes` of `read_node` (the HTTP API's).
const NODE_BYTES: u64 = 256 * 1024;

/// `uwf-db mcp`'s flags.
#[derive(clap::Args)]
pub struct McpArgs {
    /// An agent the client may drive threads with (repeatable): NAME=SPEC,
    /// or SPEC alone for the agent named `default`. Calls name an agent;
    /// they never give a spec, so they run only what is named here
    #[arg(long = "agent", value_name = "NAME=SPEC", value_parser = crate::serve::parse_agent)]
    agents: Vec<(String, String)>,
    /// Offer only the tools that read (no start, resume, drive, stop,
    /// cancel, fork or label)
    #[arg(long)]
    read_only: bool,
    /// Kill an agent call after this long (e.g. 10m)
    #[arg(long, value_name = "DURATION", value_parser = crate::output::parse_duration)]
    agent_timeout: Option<Duration>,
}

/// `uwf-db mcp`: serves until the client closes stdin (or a signal).
pub fn run(cli: &Cli, args: &McpArgs, cancel: &Cancel) -> Result<(), CliError> {
    // An existing store only: a mistyped path in a client's configuration
    // is an error the user sees, not an empty store served quietly.
    let store = cli.open(false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("uwf-mcp")
        .max_blocking_threads(32)
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start the MCP server's runtime: {e}")))?;
    // No event streams here: the channel is never closed.
    let (_closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut state = AppState::new(store, &args.agents, args.agent_timeout, cancel, closing);
    state.read_only = args.read_only;
    let state = Arc::new(state);
    let server = UwfMcp::new(state.clone());
    crate::output::note(format_args!(
        "uwf-db mcp: serving {} on stdin/stdout ({} tools{})",
        state.store.location(),
        server.tool_router.list_all().len(),
        if args.read_only { ", read-only" } else { "" }
    ));
    // A signal ends the session whatever it is doing (waiting for the
    // client's `initialize` too); a thread of its own watches the token.
    let (stop_tx, stopped) = tokio::sync::oneshot::channel::<()>();
    {
        let cancel = cancel.clone();
        std::thread::Builder::new()
            .name("uwf-mcp-stop".into())
            .spawn(move || {
                while !cancel.is_stopping() {
                    cancel.sleep(Duration::from_millis(100));
                }
                let _ = stop_tx.send(());
            })
            .map_err(|e| CliError::Failed(format!("cannot start the MCP server: {e}")))?;
    }
    let session = async {
        let service = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| CliError::Failed(format!("the MCP session did not start: {e}")))?;
        service
            .waiting()
            .await
            .map_err(|e| CliError::Failed(format!("the MCP session failed: {e}")))?;
        Ok(())
    };
    let result = runtime.block_on(async {
        tokio::select! {
            r = session => r,
            _ = stopped => Ok(()),
        }
    });
    crate::serve::finish_drives(&state);
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The MCP server: the shared handler state and the tools it offers.
#[derive(Clone)]
pub struct UwfMcp {
    state: Shared,
    tool_router: ToolRouter<Self>,
}

/// A thread, by id or unique prefix.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadArg {
    /// Thread id or unique prefix.
    pub id: String,
}

/// `list_threads`: the filters of `uwf-db thread list`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only these statuses (idle, running, suspended, completed, failed, cancelled).
    #[serde(default)]
    pub status: Vec<String>,
    /// Only threads of this workflow.
    #[serde(default)]
    pub workflow: Option<String>,
    /// Only threads with every one of these labels (KEY=VALUE).
    #[serde(default)]
    pub label: Vec<String>,
    /// Active at or after this time (RFC 3339, or ms since the epoch).
    #[serde(default)]
    pub since: Option<String>,
    /// Active before this time (RFC 3339, or ms since the epoch).
    #[serde(default)]
    pub until: Option<String>,
    /// Only threads whose last step failed.
    #[serde(default)]
    pub failed: bool,
    /// Page size (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `waiting_for_human`: a page of suspended threads.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageArgs {
    /// Page size (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `read_log`: one page of a thread's steps, newest first.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogArgs {
    /// Thread id or unique prefix.
    pub id: String,
    /// Steps on the page (default 20, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_before` of the previous page (a node hash or prefix).
    #[serde(default)]
    pub before: Option<String>,
    /// Include each step's reply (`content`) and instruction (`input`).
    #[serde(default)]
    pub bodies: bool,
    /// With `bodies`: the most bytes of each body (default 2048); a cut
    /// body says so in `content_cut` / `input_cut`.
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// `read_node`: one blob (a node or a text) by hash.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeArgs {
    /// Hash or unique prefix (at least 6 hex characters).
    pub hash: String,
    /// Refuse blobs larger than this (default and most: 262144 bytes).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// `resume`: a suspended (or ended) thread runs on.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    /// Thread id or unique prefix (a suspended child: its top-level parent).
    pub id: String,
    /// The human's answer, added to the resume instruction.
    #[serde(default)]
    pub text: Option<String>,
    /// The server agent (by name) that drives it (absent: the one whose
    /// spec the thread stores, else `default`).
    #[serde(default)]
    pub agent: Option<String>,
}

/// `drive`: an idle thread takes steps until it ends or suspends.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveArgs {
    /// Thread id or unique prefix.
    pub id: String,
    /// The server agent (by name) that drives it.
    #[serde(default)]
    pub agent: Option<String>,
}

/// `cancel`: end a thread (and its suspended children) with code 2.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// Thread id or unique prefix.
    pub id: String,
    /// Cancel even while a live driver holds it.
    #[serde(default)]
    pub force: bool,
}

/// `fork`: a new thread sharing the chain up to a node (nothing copied).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// Thread id or unique prefix.
    pub id: String,
    /// At step `seq` of its chain (0: its start).
    #[serde(default)]
    pub seq: Option<u64>,
    /// At this node of its chain (hash or prefix).
    #[serde(default)]
    pub node: Option<String>,
    /// Just before the latest step of this role.
    #[serde(default)]
    pub before_role: Option<String>,
}

/// `label`: set or remove labels (status and head unchanged).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelArgs {
    /// Thread id or unique prefix.
    pub id: String,
    /// Labels to set (KEY: VALUE).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Label keys to remove.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A tool's answer: the value as JSON text, or the `ErrorAnswer` as JSON
/// text in a result marked `isError` (a mistake the model can read and
/// correct, not a protocol failure).
fn answer<T: serde::Serialize>(r: ApiResult<T>) -> CallToolResult {
    match r.and_then(|v| serde_json::to_value(&v).map_err(|e| failed(&e))) {
        Ok(v) => CallToolResult::success(vec![ContentBlock::text(v.to_string())]),
        Err(ApiError(e, _)) => CallToolResult::error(vec![ContentBlock::text(
            serde_json::to_string(&e).unwrap_or_else(|_| e.error.message.clone()),
        )]),
    }
}

fn failed(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::Failed, e.to_string())
}

/// A query string from pairs (the HTTP handlers parse it strictly).
fn query(pairs: &[(&str, String)]) -> RawQuery {
    if pairs.is_empty() {
        return RawQuery(None);
    }
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    RawQuery(Some(s.finish()))
}

/// A step's body in `read_log`: left out (its size said), or cut.
fn trim_body(entry: &mut serde_json::Map<String, Value>, key: &str, keep: Option<u64>) {
    let Some(Value::String(text)) = entry.get(key).cloned() else {
        return;
    };
    match keep {
        None => {
            entry.remove(key);
            entry.insert(format!("{key}_bytes"), Value::from(text.len()));
        }
        Some(max) => {
            let max = usize::try_from(max).unwrap_or(usize::MAX);
            if text.len() > max {
                let mut end = max;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                entry.insert(
                    key.to_owned(),
                    Value::String(text.get(..end).unwrap_or_default().to_owned()),
                );
                entry.insert(format!("{key}_cut"), Value::Bool(true));
                entry.insert(format!("{key}_bytes"), Value::from(text.len()));
            }
        }
    }
}

#[tool_router]
impl UwfMcp {
    pub fn new(state: Shared) -> Self {
        let mut tool_router = Self::tool_router();
        if state.read_only {
            let writers: Vec<String> = tool_router
                .list_all()
                .into_iter()
                .filter(|t| t.annotations.as_ref().and_then(|a| a.read_only_hint) != Some(true))
                .map(|t| t.name.into_owned())
                .collect();
            for name in writers {
                tool_router.remove_route(&name);
            }
        }
        UwfMcp { state, tool_router }
    }

    /// Threads by last activity, newest first, with the filters of `uwf-db
    /// thread list`; one page (`next_cursor` for the next). No bodies.
    #[tool(annotations(
        title = "List threads",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn list_threads(&self, Parameters(a): Parameters<ListArgs>) -> CallToolResult {
        let mut q = Vec::new();
        for s in a.status {
            q.push(("status", s));
        }
        for l in a.label {
            q.push(("label", l));
        }
        q.extend(a.workflow.map(|w| ("workflow", w)));
        q.extend(a.since.map(|w| ("since", w)));
        q.extend(a.until.map(|w| ("until", w)));
        if a.failed {
            q.push(("failed", "true".to_owned()));
        }
        q.extend(a.limit.map(|l| ("limit", l.to_string())));
        q.extend(a.cursor.map(|c| ("cursor", c)));
        let r = reads::list_threads(State(self.state.clone()), query(&q)).await;
        answer(r.map(|Json(v)| v))
    }

    /// Suspended threads waiting for a human's answer, newest first, each
    /// with its suspend message; answer one with the `resume` tool (its id
    /// and your `text`).
    #[tool(annotations(
        title = "Threads waiting for a human",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn waiting_for_human(&self, Parameters(a): Parameters<PageArgs>) -> CallToolResult {
        let mut q = vec![("status", "suspended".to_owned())];
        q.extend(a.limit.map(|l| ("limit", l.to_string())));
        q.extend(a.cursor.map(|c| ("cursor", c)));
        let r = reads::list_threads(State(self.state.clone()), query(&q)).await;
        answer(r.map(|Json(v)| v))
    }

    /// One thread: its record (status, next role and instruction, suspend
    /// message, last error), usage with its children's, its parent and
    /// children, `resume_command` when suspended, and for a child workflow
    /// what its agents are told of their parent (`parent_context`).
    #[tool(annotations(
        title = "Get a thread",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn get_thread(&self, Parameters(a): Parameters<ThreadArg>) -> CallToolResult {
        let r = reads::get_thread(State(self.state.clone()), Path(a.id), RawQuery(None)).await;
        answer(r.map(|Json(v)| v))
    }

    /// One page of a thread's steps, newest first (`next_before` pages
    /// back). Bodies (reply and instruction) only with `bodies: true`, each
    /// cut to `max_bytes`.
    #[tool(annotations(
        title = "Read a thread's log",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn read_log(&self, Parameters(a): Parameters<LogArgs>) -> CallToolResult {
        let mut q = Vec::new();
        q.extend(a.limit.map(|l| ("limit", l.to_string())));
        q.extend(a.before.map(|b| ("before", b)));
        let keep = a.bodies.then_some(a.max_bytes.unwrap_or(LOG_BODY_BYTES));
        let r = reads::thread_log(State(self.state.clone()), Path(a.id), query(&q)).await;
        let r = r.and_then(|Json(page)| serde_json::to_value(&page).map_err(|e| failed(&e)));
        answer(r.map(|mut page| {
            if let Some(entries) = page.get_mut("entries").and_then(Value::as_array_mut) {
                for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                    trim_body(e, "content", keep);
                    trim_body(e, "input", keep);
                }
            }
            page
        }))
    }

    /// One blob by hash: a node (start, state), a text, or a workflow,
    /// decoded, with its refs. Nodes never change. A blob larger than
    /// `max_bytes` is refused, with its size.
    #[tool(annotations(
        title = "Read a node or blob",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn read_node(&self, Parameters(a): Parameters<NodeArgs>) -> CallToolResult {
        let q = vec![("max_bytes", a.max_bytes.unwrap_or(NODE_BYTES).to_string())];
        let r = reads::get_node(State(self.state.clone()), Path(a.hash), query(&q)).await;
        answer(r.map(|Json(v)| v))
    }

    /// The Merkle call stack of a thread: its parents up to the top-level
    /// thread (with the state each called from) and its children down.
    #[tool(annotations(
        title = "Call stack",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn call_stack(&self, Parameters(a): Parameters<ThreadArg>) -> CallToolResult {
        let r = reads::thread_tree(State(self.state.clone()), Path(a.id), RawQuery(None)).await;
        answer(r.map(|Json(v)| v))
    }

    /// What every agent call of the store cost: calls, wall time, tokens
    /// and cost, over all threads (history included).
    #[tool(annotations(
        title = "Usage",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn usage(&self) -> CallToolResult {
        let r = reads::usage(State(self.state.clone()), RawQuery(None)).await;
        answer(r.map(|Json(v)| v))
    }

    /// Registered workflows, with their roles (what `start_run` can run).
    #[tool(annotations(
        title = "List workflows",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn list_workflows(&self) -> CallToolResult {
        let r = reads::list_workflows(State(self.state.clone()), RawQuery(None)).await;
        answer(r.map(|Json(v)| v))
    }

    /// Start a thread of a registered workflow with a task prompt; with
    /// `drive: true` one of the server's agents (by name; default
    /// `default`) runs it until it ends or suspends, in the background:
    /// follow it with `get_thread`.
    #[tool(annotations(
        title = "Start a run",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn start_run(&self, Parameters(a): Parameters<StartRequest>) -> CallToolResult {
        let r = writes::start(State(self.state.clone()), RawQuery(None), Ok(Json(a))).await;
        answer(r.map(|(_, Json(v))| v))
    }

    /// Resume a suspended thread with the human's answer (`text`), or run
    /// an ended one on, in the background with one of the server's agents.
    #[tool(annotations(
        title = "Resume a thread",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn resume(&self, Parameters(a): Parameters<ResumeArgs>) -> CallToolResult {
        let body = api::ResumeRequest {
            text: a.text,
            agent: a.agent,
        };
        let r = writes::resume(
            State(self.state.clone()),
            Path(a.id),
            RawQuery(None),
            Ok(Json(body)),
        )
        .await;
        answer(r.map(|(_, Json(v))| v))
    }

    /// Drive an idle thread until it ends or suspends, in the background
    /// with one of the server's agents.
    #[tool(annotations(
        title = "Drive a thread",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn drive(&self, Parameters(a): Parameters<DriveArgs>) -> CallToolResult {
        let body = api::DriveRequest { agent: a.agent };
        let r = writes::drive(
            State(self.state.clone()),
            Path(a.id),
            RawQuery(None),
            Ok(Json(body)),
        )
        .await;
        answer(r.map(|(_, Json(v))| v))
    }

    /// Ask the live driver of a thread to stop after its step in flight
    /// (the step is kept, the thread left idle).
    #[tool(annotations(
        title = "Stop a thread",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn stop(&self, Parameters(a): Parameters<ThreadArg>) -> CallToolResult {
        let r = writes::stop(State(self.state.clone()), Path(a.id), RawQuery(None)).await;
        answer(r.map(|Json(v)| v))
    }

    /// Cancel a thread: an end node with return code 2 (its suspended
    /// children too). It cannot be undone, but the thread can be resumed.
    #[tool(annotations(
        title = "Cancel a thread",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn cancel(&self, Parameters(a): Parameters<CancelArgs>) -> CallToolResult {
        let body = api::CancelRequest { force: a.force };
        let r = writes::cancel(
            State(self.state.clone()),
            Path(a.id),
            RawQuery(None),
            Ok(Json(body)),
        )
        .await;
        answer(r.map(|Json(v)| v))
    }

    /// Fork a thread: a new thread sharing its chain up to a node (at the
    /// head, at step `seq`, at `node`, or just before `before_role`'s
    /// latest step); nothing is copied.
    #[tool(annotations(
        title = "Fork a thread",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    ))]
    async fn fork(&self, Parameters(a): Parameters<ForkArgs>) -> CallToolResult {
        let body = api::ForkRequest {
            seq: a.seq,
            node: a.node,
            before_role: a.before_role,
        };
        let r = writes::fork(
            State(self.state.clone()),
            Path(a.id),
            RawQuery(None),
            Ok(Json(body)),
        )
        .await;
        answer(r.map(|(_, Json(v))| v))
    }

    /// Set or remove a thread's labels (any status; its head and status do
    /// not change).
    #[tool(annotations(
        title = "Label a thread",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn label(&self, Parameters(a): Parameters<LabelArgs>) -> CallToolResult {
        let body = api::LabelsRequest {
            set: a.set.into_iter().collect(),
            remove: a.remove,
        };
        let r = writes::labels(
            State(self.state.clone()),
            Path(a.id),
            RawQuery(None),
            Ok(Json(body)),
        )
        .await;
        answer(r.map(|Json(v)| v))
    }
}

const INSTRUCTIONS: &str = "uwf-db stores AI-agent workflow threads: chains of immutable, \
content-addressed nodes. Find threads with list_threads (or waiting_for_human for those \
waiting for an answer), read one with get_thread, its steps with read_log (bodies only with \
bodies: true) and any node or text by hash with read_node; call_stack walks parent and \
child workflows. A child workflow's get_thread has parent_context: what its agents were told \
of their parent. Writes (start_run, resume, drive, stop, cancel, fork, label) name one of \
the server's agents, never a command. Every answer is the JSON of `uwf-db --json`; an error \
is an ErrorAnswer ({\"error\": {\"kind\", \"message\", \"hint\"}}). Resources: \
uwf://thread/{id} (changes as the thread runs) and uwf://node/{hash} (never changes).";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for UwfMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("uwf-db", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        // The 20 threads active last; every other one by its template.
        let q = query(&[("limit", "20".to_owned())]);
        let page = reads::list_threads(State(self.state.clone()), q)
            .await
            .map_err(|ApiError(e, _)| McpError::internal_error(e.error.message, None))?;
        let resources = page
            .0
            .threads
            .iter()
            .map(|t| {
                Resource::new(format!("uwf://thread/{}", t.thread), t.thread.to_string())
                    .with_title(format!("{} ({})", t.workflow, t.status))
                    .with_mime_type("application/json")
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("uwf://thread/{id}", "thread")
                .with_description("A thread as get_thread gives it (its record changes as it runs)")
                .with_mime_type("application/json"),
            ResourceTemplate::new("uwf://node/{hash}", "node")
                .with_description(
                    "A node or blob as read_node gives it; content-addressed, it never changes",
                )
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri;
        let state = State(self.state.clone());
        let value = if let Some(id) = uri.strip_prefix("uwf://thread/") {
            reads::get_thread(state, Path(id.to_owned()), RawQuery(None))
                .await
                .and_then(|Json(v)| serde_json::to_value(v).map_err(|e| failed(&e)))
        } else if let Some(hash) = uri.strip_prefix("uwf://node/") {
            let q = query(&[("max_bytes", NODE_BYTES.to_string())]);
            reads::get_node(state, Path(hash.to_owned()), q)
                .await
                .and_then(|Json(v)| serde_json::to_value(v).map_err(|e| failed(&e)))
        } else {
            Err(ApiError::not_found(format!(
                "no resource {uri}: use uwf://thread/{{id}} or uwf://node/{{hash}}"
            )))
        };
        match value {
            Ok(v) => Ok(ReadResourceResult::new(vec![
                ResourceContents::text(v.to_string(), uri).with_mime_type("application/json"),
            ])
            .into()),
            Err(ApiError(e, _)) if e.error.kind == ErrorKind::NotFound => {
                Err(McpError::resource_not_found(
                    e.error.message,
                    Some(serde_json::json!({"uri": uri})),
                ))
            }
            Err(ApiError(e, _)) => Err(McpError::invalid_params(
                e.error.message,
                Some(serde_json::json!({"uri": uri})),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_left_out_or_cut_at_a_character() {
        let mut e = serde_json::json!({"content": "héllo", "input": "ab"});
        let m = e.as_object_mut().unwrap();
        trim_body(m, "content", Some(2));
        trim_body(m, "input", None);
        assert_eq!(
            e,
            serde_json::json!({"content": "h", "content_cut": true, "content_bytes": 6, "input_bytes": 2})
        );
    }

    #[test]
    fn the_router_offers_the_fifteen_documented_tools() {
        let names = |router: &ToolRouter<UwfMcp>| {
            let mut v: Vec<String> = router
                .list_all()
                .into_iter()
                .map(|t| t.name.into_owned())
                .collect();
            v.sort();
            v
        };
        let all = UwfMcp::tool_router();
        assert_eq!(
            names(&all),
            [
                "call_stack",
                "cancel",
                "drive",
                "fork",
                "get_thread",
                "label",
                "list_threads",
                "list_workflows",
                "read_log",
                "read_node",
                "resume",
                "start_run",
                "stop",
                "usage",
                "waiting_for_human"
            ]
        );
    }
}
