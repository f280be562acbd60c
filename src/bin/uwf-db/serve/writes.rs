//! The write endpoints: start, resume, stop, cancel, fork, label.
//!
//! A request never carries an agent spec: it names one of the agents the
//! server was started with (`--agent NAME=SPEC`), so HTTP runs nothing the
//! operator did not name. Drives run on their own threads under the
//! server's cancel token (a shutdown stops them after the step in flight)
//! and the answer does not wait for them: clients follow the thread's
//! events.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use uwf_db::api::{
    self, CancelRequest, DriveAccepted, DriveRequest, ErrorKind, ForkRequest, LabelsRequest,
    ResumeRequest, StartRequest,
};
use uwf_db::engine::{CancelOptions, DriveOptions, ForkAt, StartOptions};
use uwf_db::thread::{ThreadId, ThreadStatus};

use super::error::{ApiError, ApiResult, blocking};
use super::params::{Params, truncated};
use super::reads::resolve;
use super::{Shared, lock};

/// The agent a request names, as `(name, spec)`; absent: the server agent
/// whose spec `stored` is (the thread's own), else `default`.
fn agent(state: &Shared, name: Option<&str>, stored: Option<&str>) -> ApiResult<(String, String)> {
    if state.agents.is_empty() {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            "this server drives no threads: it was started without --agent",
        )
        .with_hint("uwf-db serve --agent default=script:FILE (or 'cmd:PROGRAM ARGS')"));
    }
    let name = match (name, stored) {
        (Some(name), _) => name,
        (None, Some(spec)) => state
            .agents
            .iter()
            .find(|(_, s)| s.as_str() == spec)
            .map_or("default", |(n, _)| n.as_str()),
        (None, None) => "default",
    };
    match state.agents.get(name) {
        Some(spec) => Ok((name.to_owned(), spec.clone())),
        None => Err(ApiError::invalid(format!(
            "no agent named '{}' on this server (it has: {})",
            truncated(name),
            state.agents.keys().cloned().collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// A drive ready to start: its slot among [`super::MAX_DRIVES`] and its
/// agent, taken before anything is written, so that a request refused for
/// want of either leaves no thread behind.
struct Ready {
    permit: tokio::sync::OwnedSemaphorePermit,
    agent: Box<dyn uwf_db::engine::agent::Agent>,
    spec: String,
}

fn ready(state: &Shared, spec: String) -> ApiResult<Ready> {
    let permit = state.drives.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "this server is driving {} threads already; try again when one ends",
                super::MAX_DRIVES
            ),
        )
    })?;
    let agent = state
        .store
        .engine()
        .build_agent(&spec, &state.agent_options)?;
    Ok(Ready {
        permit,
        agent,
        spec,
    })
}

/// Drives `id` on a thread of its own (a resume first when `resume` is
/// given, with its text).
fn spawn_drive(
    state: &Shared,
    id: ThreadId,
    ready: Ready,
    resume: Option<Option<String>>,
) -> ApiResult<()> {
    if uwf_db::engine::claim::is_held(&state.store, id)? {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!("thread {id} is being driven by another runner"),
        ));
    }
    let Ready {
        permit,
        mut agent,
        spec,
    } = ready;
    let shared = state.clone();
    let handle = std::thread::Builder::new()
        .name(format!("uwf-drive-{id}"))
        .spawn(move || {
            let options = DriveOptions {
                max_steps: None,
                resume: resume.is_some(),
                resume_text: resume.flatten(),
                agent_spec: Some(spec),
                cancel: shared.cancel.clone(),
            };
            // A failed step is recorded on the thread (`last_error`) and
            // shows in its events; a drive refused before any step (another
            // runner claimed the thread first) is said here, as nobody
            // waits for the answer.
            let report = shared.store.engine().drive(id, &options, agent.as_mut());
            match report.error {
                None | Some(uwf_db::engine::EngineError::StepFailed { .. }) => {}
                Some(e) => eprintln!("uwf-db serve: drive of thread {id}: {e}"),
            }
            drop(permit);
        })
        .map_err(|e| ApiError::new(ErrorKind::Unavailable, format!("cannot start a drive: {e}")))?;
    let mut threads = lock(&state.drive_threads);
    threads.retain(|h| !h.is_finished());
    threads.push(handle);
    Ok(())
}

fn no_query(q: Option<&str>) -> ApiResult<()> {
    Params::parse(q, &[], &[]).map(|_| ())
}

pub async fn start(
    State(state): State<Shared>,
    RawQuery(q): RawQuery,
    body: Result<Json<StartRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<DriveAccepted>)> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || {
        let store = &state.store;
        uwf_db::thread::check_labels(&req.labels).map_err(|e| ApiError::invalid(e.to_string()))?;
        let driver = req
            .drive
            .then(|| agent(&state, req.agent.as_deref(), None))
            .transpose()?;
        if !req.drive && req.agent.is_some() {
            agent(&state, req.agent.as_deref(), None)?;
        }
        let (hash, _) = store.workflows().by_name(&req.workflow)?.ok_or_else(|| {
            ApiError::not_found(format!(
                "no workflow named '{}' (register it with uwf-db workflow add FILE)",
                truncated(&req.workflow)
            ))
        })?;
        let cwd = std::env::current_dir().map_err(|e| {
            ApiError::new(
                ErrorKind::Failed,
                format!("the server's directory is gone: {e}"),
            )
        })?;
        // The drive's slot and agent before the thread exists: a start
        // refused for want of them writes nothing.
        let driver = driver
            .map(|(name, spec)| Ok::<_, ApiError>((name, ready(&state, spec)?)))
            .transpose()?;
        let options = StartOptions {
            agent_spec: driver.as_ref().map(|(_, r)| r.spec.clone()),
            max_rounds: req.max_rounds,
            cwd: Some(cwd),
            labels: req.labels.clone(),
            ..StartOptions::default()
        };
        let record = store.engine().start_workflow(hash, &req.prompt, &options)?;
        let agent = match driver {
            Some((name, ready)) => {
                spawn_drive(&state, record.id, ready, None)?;
                Some(name)
            }
            None => None,
        };
        let value = DriveAccepted {
            agent,
            thread: api::ThreadSummary::from(&record),
        };
        Ok((StatusCode::CREATED, Json(value)))
    })
    .await
}

/// Drives thread `id` (named by id or prefix) on with the agent `name`
/// (see [`agent`]): a resume with its text when `resume` is given, else a
/// drive of an idle thread. Refuses now what the drive would refuse, since
/// the answer does not wait for it.
fn drive_on(
    state: &Shared,
    id: &str,
    name: Option<&str>,
    resume: Option<Option<String>>,
) -> ApiResult<(StatusCode, Json<DriveAccepted>)> {
    let store = &state.store;
    let id = resolve(store, id)?;
    if resume.is_some() {
        // A thread that cannot be resumed says so before its agent is
        // looked at.
        store.engine().check_resumable(id)?;
    }
    let record = store
        .threads()
        .get(id)?
        .ok_or_else(|| ApiError::not_found(format!("no thread {id}")))?;
    // Only an idle thread (or one whose driver died) takes steps.
    let status = record.underlying_status();
    if resume.is_none() && status != ThreadStatus::Idle {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!(
                "thread {id} is {status}: only idle threads take steps (resume a suspended or ended thread)"
            ),
        ));
    }
    let (name, spec) = agent(state, name, record.agent.as_deref())?;
    spawn_drive(state, id, ready(state, spec)?, resume)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(DriveAccepted {
            agent: Some(name),
            thread: api::ThreadSummary::from(&record),
        }),
    ))
}

pub async fn resume(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Result<Json<ResumeRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<DriveAccepted>)> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || drive_on(&state, &id, req.agent.as_deref(), Some(req.text))).await
}

pub async fn drive(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Result<Json<DriveRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<DriveAccepted>)> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || drive_on(&state, &id, req.agent.as_deref(), None)).await
}

pub async fn stop(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<api::StopRequested>> {
    no_query(q.as_deref())?;
    blocking(move || {
        let id = resolve(&state.store, &id)?;
        let record = state.store.engine().request_stop(id)?;
        Ok(Json(api::StopRequested {
            stop_requested_at: record.stop_requested_at.map(api::Timestamp),
            thread: id,
        }))
    })
    .await
}

pub async fn cancel(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Result<Json<CancelRequest>, JsonRejection>,
) -> ApiResult<Json<uwf_db::engine::StepResult>> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || {
        let id = resolve(&state.store, &id)?;
        Ok(Json(
            state
                .store
                .engine()
                .cancel_thread(id, &CancelOptions { force: req.force })?,
        ))
    })
    .await
}

pub async fn fork(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Result<Json<ForkRequest>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<api::ThreadForked>)> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || {
        let store = &state.store;
        let id = resolve(store, &id)?;
        let at = match (req.seq, req.node, req.before_role) {
            (None, None, None) => ForkAt::Head,
            (Some(seq), None, None) => ForkAt::Node(node_at(&state, id, seq)?),
            (None, Some(node), None) => {
                let prefix: uwf_db::HashPrefix = node.parse().map_err(|e| {
                    ApiError::invalid(format!("'node': '{}' is not a hash: {e}", truncated(&node)))
                })?;
                ForkAt::Node(store.resolve(&prefix)?)
            }
            (None, None, Some(role)) => ForkAt::BeforeRole(role),
            _ => {
                return Err(ApiError::invalid(
                    "give at most one of 'seq', 'node' and 'before_role'",
                ));
            }
        };
        let record = store.engine().fork(id, at)?;
        Ok((
            StatusCode::CREATED,
            Json(api::ThreadForked::of(id, &record)),
        ))
    })
    .await
}

/// The hash of step `seq` of thread `id`'s chain (0: its start node).
fn node_at(state: &Shared, id: ThreadId, seq: u64) -> ApiResult<uwf_db::Hash> {
    let threads = state.store.threads();
    let record = threads
        .get(id)?
        .ok_or_else(|| ApiError::not_found(format!("no thread {id}")))?;
    if seq == 0 {
        return Ok(record.start);
    }
    if seq > record.seq {
        return Err(ApiError::not_found(format!(
            "thread {id} has {} steps; there is no step {seq}",
            record.seq
        )));
    }
    let back = usize::try_from(record.seq - seq + 1).unwrap_or(usize::MAX);
    let entries = threads.log(id, back, None)?;
    entries
        .iter()
        .find(|e| e.node.seq == seq)
        .map(|e| e.hash)
        .ok_or_else(|| ApiError::not_found(format!("thread {id} has no step {seq}")))
}

pub async fn labels(
    State(state): State<Shared>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Result<Json<LabelsRequest>, JsonRejection>,
) -> ApiResult<Json<api::LabelsSet>> {
    no_query(q.as_deref())?;
    let Json(req) = body?;
    blocking(move || {
        let id = resolve(&state.store, &id)?;
        let record = state
            .store
            .threads()
            .set_labels(id, &req.set, &req.remove)?;
        Ok(Json(api::LabelsSet {
            labels: record.labels,
            thread: id,
        }))
    })
    .await
}
