//! The read endpoints: each parses its parameters, runs one library call
//! on the blocking pool, and answers with the contract's type.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use uwf_db::api::{
    self, Health, LogPage, ThreadDetail, ThreadDiff, ThreadPage, TreeView, WorkflowGraph,
    WorkflowList, WorkflowView,
};
use uwf_db::thread::{ActivityCursor, IdPrefix, ThreadId, ThreadQuery, ThreadStatus};
use uwf_db::{Hash, HashPrefix, Store};

use super::Shared;
use super::error::{ApiError, ApiResult, blocking};
use super::params::{Params, truncated};

/// Default page of `GET /api/threads`.
const THREAD_PAGE: usize = 50;
/// Default page of `GET /api/threads/{id}/log`.
const LOG_PAGE: usize = 20;
/// Default and largest `max_bytes` of `GET /api/nodes/{hash}`.
const NODE_BYTES: u64 = 1 << 20;
const MAX_NODE_BYTES: u64 = 64 << 20;
/// Steps of each thread `GET /api/diff` compares.
const DIFF_STEPS: usize = 200;
/// Largest log page: its steps carry their texts.
const MAX_LOG_PAGE: usize = 200;

/// A thread named by its id or a unique prefix, in the path.
pub fn resolve(store: &Store, id: &str) -> ApiResult<ThreadId> {
    let prefix: IdPrefix = id.parse().map_err(|e: uwf_db::thread::ParseIdError| {
        ApiError::invalid(format!("'{}' is not a thread id: {e}", truncated(id)))
    })?;
    Ok(store.threads().resolve(&prefix)?)
}

fn hash_prefix(s: &str, what: &str) -> ApiResult<HashPrefix> {
    s.parse().map_err(|e: uwf_db::ParseHashError| {
        ApiError::invalid(format!("{what}: '{}' is not a hash: {e}", truncated(s)))
    })
}

pub async fn healthz(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Health>> {
    Params::parse(q.as_deref(), &[], &[])?;
    Ok(Json(Health {
        agents: state.agents.keys().cloned().collect(),
        api_version: api::API_VERSION,
        backend: state.backend.into(),
        read_only: state.read_only,
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    }))
}

fn parse_status(s: &str) -> ApiResult<ThreadStatus> {
    s.parse().map_err(|_| {
        ApiError::invalid(format!(
            "query parameter 'status': '{}' is not a status (idle, running, suspended, completed, failed, cancelled)",
            truncated(s)
        ))
    })
}

pub async fn list_threads(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<ThreadPage>> {
    let p = Params::parse(
        q.as_deref(),
        &[
            "status", "workflow", "label", "since", "until", "failed", "limit", "cursor",
        ],
        &["status", "label"],
    )?;
    let mut statuses = Vec::new();
    for s in p.all("status").flat_map(|s| s.split(',')) {
        statuses.push(parse_status(s)?);
    }
    let mut labels = Vec::new();
    for l in p.all("label") {
        let (k, v) = uwf_db::thread::parse_label(l)
            .map_err(|e| ApiError::invalid(format!("query parameter 'label': {e}")))?;
        labels.push((k, v));
    }
    let limit = p.limit(THREAD_PAGE)?;
    let query = ThreadQuery {
        statuses,
        workflow: p.get("workflow").map(str::to_owned),
        failed_only: p.flag("failed")?,
        labels,
        since: p.time("since")?,
        until: p.time("until")?,
        limit,
        offset: 0,
        before: p.parsed::<ActivityCursor>("cursor", "a cursor from a previous page")?,
    };
    blocking(move || {
        let records = state.store.threads().list(&query)?;
        let next_cursor = (records.len() == limit)
            .then(|| records.last().map(|r| ActivityCursor::of(r).to_string()))
            .flatten();
        Ok(Json(ThreadPage {
            next_cursor,
            threads: records.iter().map(api::ThreadSummary::from).collect(),
        }))
    })
    .await
}

pub async fn get_thread(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<ThreadDetail>> {
    Params::parse(q.as_deref(), &[], &[])?;
    blocking(move || {
        let store = &state.store;
        let id = resolve(store, &id)?;
        let tree = store.threads().tree(id)?;
        let alive = uwf_db::engine::claim::is_held(store, id)?;
        let parent = store.engine().parent_context(&tree.thread)?;
        let task = store.engine().task(&tree.thread)?;
        Ok(Json(
            ThreadDetail::of(&tree, alive)
                .with_parent_context(parent)
                .with_task(task),
        ))
    })
    .await
}

pub async fn thread_log(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<LogPage>> {
    let p = Params::parse(q.as_deref(), &["before", "limit"], &[])?;
    let limit = p.limit(LOG_PAGE)?;
    if limit > MAX_LOG_PAGE {
        return Err(ApiError::invalid(format!(
            "query parameter 'limit': a log page holds at most {MAX_LOG_PAGE} steps (their texts with them)"
        )));
    }
    let before = p
        .get("before")
        .map(|b| hash_prefix(b, "query parameter 'before'"))
        .transpose()?;
    blocking(move || {
        let store = &state.store;
        let id = resolve(store, &id)?;
        let before = before.map(|b| store.resolve(&b)).transpose()?;
        let entries = store.threads().log(id, limit, before)?;
        let next_before = entries
            .last()
            .filter(|e| entries.len() == limit && e.node.seq > 1)
            .map(|e| e.hash);
        let entries = api::LogEntry::read_all(store, &entries, api::KeptTexts::default())?;
        Ok(Json(LogPage {
            entries,
            next_before,
        }))
    })
    .await
}

pub async fn thread_tree(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<TreeView>> {
    Params::parse(q.as_deref(), &[], &[])?;
    blocking(move || {
        let id = resolve(&state.store, &id)?;
        Ok(Json(TreeView::of(&state.store.threads().tree(id)?)))
    })
    .await
}

pub async fn get_node(
    State(state): State<Shared>,
    Path(hash): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<api::BlobDetail>> {
    let p = Params::parse(q.as_deref(), &["max_bytes"], &[])?;
    let max = p
        .parsed::<u64>("max_bytes", "a number of bytes")?
        .unwrap_or(NODE_BYTES);
    if max > MAX_NODE_BYTES {
        return Err(ApiError::invalid(format!(
            "query parameter 'max_bytes': {max} is more than the {MAX_NODE_BYTES} this server sends"
        )));
    }
    let prefix = hash_prefix(&hash, "path")?;
    blocking(move || {
        let store = &state.store;
        let hash = store.resolve(&prefix)?;
        let stored = store
            .get_stored(&hash)?
            .ok_or_else(|| ApiError::not_found(format!("no blob {hash}")))?;
        let size = stored.bytes.len() as u64;
        if size > max {
            return Err(ApiError::new(
                api::ErrorKind::TooLarge,
                format!("blob {hash} is {size} bytes, more than max_bytes ({max})"),
            )
            .with_hint(format!("GET /api/nodes/{hash}?max_bytes={size}")));
        }
        let blob = stored.decode()?;
        Ok(Json(api::BlobDetail::of(&stored, &blob)))
    })
    .await
}

/// `GET /api/steps/{hash}`: a step with its kept texts (the dashboard
/// fetches them when asked: a log page does not carry them).
pub async fn get_step(
    State(state): State<Shared>,
    Path(hash): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<api::LogEntry>> {
    Params::parse(q.as_deref(), &[], &[])?;
    let prefix = hash_prefix(&hash, "path")?;
    blocking(move || {
        let store = &state.store;
        let hash = store.resolve(&prefix)?;
        let entry = store.threads().step(hash)?;
        let texts = api::KeptTexts {
            prompt: true,
            stderr: true,
        };
        Ok(Json(api::LogEntry::read_with(store, &entry, texts)?))
    })
    .await
}

pub async fn diff(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<ThreadDiff>> {
    let p = Params::parse(q.as_deref(), &["a", "b"], &[])?;
    let (Some(a), Some(b)) = (p.get("a"), p.get("b")) else {
        return Err(ApiError::invalid(
            "query parameters 'a' and 'b' (two thread ids) are required",
        ));
    };
    let (a, b) = (a.to_owned(), b.to_owned());
    blocking(move || {
        let store = &state.store;
        let (a, b) = (resolve(store, &a)?, resolve(store, &b)?);
        Ok(Json(ThreadDiff::of(store, a, b, DIFF_STEPS)?))
    })
    .await
}

pub async fn list_workflows(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<WorkflowList>> {
    Params::parse(q.as_deref(), &[], &[])?;
    blocking(move || {
        let workflows = state
            .store
            .workflows()
            .list()?
            .into_iter()
            .map(|(name, hash)| api::WorkflowEntry { hash, name })
            .collect();
        Ok(Json(WorkflowList { workflows }))
    })
    .await
}

pub async fn get_workflow(
    State(state): State<Shared>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<WorkflowView>> {
    Params::parse(q.as_deref(), &[], &[])?;
    blocking(move || {
        let (hash, wf) = state.store.workflows().by_name(&name)?.ok_or_else(|| {
            ApiError::not_found(format!("no workflow named '{}'", truncated(&name)))
        })?;
        let yaml = serde_saphyr::to_string(wf.as_ref()).map_err(|e| {
            ApiError::new(
                api::ErrorKind::Failed,
                format!("cannot write workflow '{}' as YAML: {e}", truncated(&name)),
            )
        })?;
        Ok(Json(WorkflowView {
            graph: WorkflowGraph::of(&wf),
            definition: api::WorkflowDetail {
                workflow: (*wf).clone(),
                hash,
            },
            hash: Hash::clone(&hash),
            name: wf.name.clone(),
            yaml,
        }))
    })
    .await
}

pub async fn usage(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<uwf_db::usage::UsageTotals>> {
    Params::parse(q.as_deref(), &[], &[])?;
    blocking(move || Ok(Json(state.store.threads().usage_totals()?))).await
}
