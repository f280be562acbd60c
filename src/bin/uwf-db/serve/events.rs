//! Live events over Server-Sent Events (`docs/design.md` §8d).
//!
//! One poller per server ([`start_poller`]: the library's
//! `Engine::watch_threads` on a thread of its own) sends each change into
//! a broadcast channel; every stream subscribes to it. No stream polls
//! the store on its own: a thread's stream reads that thread's new steps
//! when the poller says it changed (and, as a backstop, every
//! [`BACKSTOP`]).
//!
//! Event ids make reconnection exact. `GET /api/events`: `MS-THREAD`, the
//! thread's position in the activity index; a client reconnecting with
//! `Last-Event-ID` is first sent every thread whose activity is newer (read
//! from the index, newest state of each), then the live changes, less
//! those it was just sent. `GET /api/threads/{id}/events`: the step's
//! `seq`; a reconnect is sent the steps after it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use uwf_db::api;
use uwf_db::thread::{ActivityCursor, ThreadId, ThreadQuery, ThreadRecord, ThreadStatus};

use super::Shared;
use super::error::{ApiError, ApiResult, blocking};
use super::params::{Params, truncated};
use super::reads::resolve;

/// Changes the broadcast channel holds for a slow stream before it lags
/// (and catches up from the index instead).
pub const CHANNEL: usize = 4096;
/// Most threads a reconnecting stream is sent from the index; past it the
/// stream says `reset` (reload the list) and goes on live.
const CATCH_UP_MAX: usize = 2_000;
/// A thread's stream rereads its record this often even when the poller
/// said nothing.
const BACKSTOP: Duration = Duration::from_secs(2);
/// Steps read per page while a thread's stream catches up.
const STEP_PAGE: usize = 64;
/// Events buffered per stream before its writer waits for the client.
const STREAM_BUFFER: usize = 64;

/// One thread's change, as the poller saw it.
pub struct Change {
    pub cursor: ActivityCursor,
    /// Its [`api::ThreadActivity`], serialized once for every stream.
    pub json: String,
}

impl Change {
    fn of(r: &ThreadRecord) -> Option<Change> {
        Some(Change {
            cursor: ActivityCursor::of(r),
            json: serde_json::to_string(&api::ThreadActivity::from(r)).ok()?,
        })
    }

    fn event(&self) -> Event {
        Event::default()
            .event("thread")
            .id(self.cursor.to_string())
            .data(&self.json)
    }
}

/// Starts the server's one poller.
pub fn start_poller(state: &Shared) -> std::thread::JoinHandle<()> {
    let state = state.clone();
    let spawned = std::thread::Builder::new()
        .name("uwf-events".into())
        .spawn(move || {
            // The first poll hands over nothing (limit 0): streams want
            // changes from now on, and catch up from the index themselves.
            let query = ThreadQuery {
                limit: 0,
                ..ThreadQuery::default()
            };
            while !state.cancel.is_cancelled() {
                let watched = state
                    .store
                    .engine()
                    .watch_threads(&query, &state.cancel, &mut |r| {
                        if let Some(change) = Change::of(r) {
                            // No subscriber is not an error.
                            let _ = state.changes.send(Arc::new(change));
                        }
                        Ok(ControlFlow::Continue(()))
                    });
                if let Err(e) = watched {
                    // A server that went away comes back; say so and retry.
                    eprintln!("uwf-db serve: watching threads failed (retrying in 1 s): {e}");
                    state.cancel.sleep(Duration::from_secs(1));
                }
            }
        });
    match spawned {
        Ok(handle) => handle,
        // Without a thread the server has no events; it still serves.
        Err(e) => {
            eprintln!("uwf-db serve: cannot start the event poller: {e}");
            std::thread::spawn(|| {})
        }
    }
}

/// `Last-Event-ID`, else the `after` query parameter, parsed (`what` says
/// what it should be).
fn resume_point<T: std::str::FromStr>(
    headers: &HeaderMap,
    p: &Params,
    what: &str,
) -> ApiResult<Option<T>> {
    let given = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("the Last-Event-ID header is not text"))?,
        ),
        None => p.get("after"),
    };
    given
        .map(|s| {
            s.parse::<T>()
                .map_err(|_| ApiError::invalid(format!("'{}' is not {what}", truncated(s))))
        })
        .transpose()
}

type EventStream = axum::response::Response;

fn stream_of(rx: mpsc::Receiver<Event>) -> EventStream {
    let stream = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    // Proxies must not buffer the stream.
    response.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    response
}

/// `GET /api/events`: every thread's status changes.
pub async fn all(
    State(state): State<Shared>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> ApiResult<EventStream> {
    let p = Params::parse(q.as_deref(), &["after"], &[])?;
    let after: Option<ActivityCursor> =
        resume_point(&headers, &p, "an event id of /api/events (MS-THREAD)")?;
    // Subscribed before the catch-up is read: nothing falls between.
    let changes = state.changes.subscribe();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(pump_all(state, after, changes, tx));
    Ok(stream_of(rx))
}

/// The threads whose activity is after `after`, oldest first (at most
/// [`CATCH_UP_MAX`]; `None` when there were more).
fn catch_up(state: &Shared, after: ActivityCursor) -> ApiResult<Option<Vec<Change>>> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = state.store.threads().list(&ThreadQuery {
            since: Some(after.at),
            before,
            limit: 1000,
            ..ThreadQuery::default()
        })?;
        let full = page.len() == 1000;
        for r in &page {
            let c = ActivityCursor::of(r);
            if c <= after {
                continue;
            }
            if out.len() == CATCH_UP_MAX {
                return Ok(None);
            }
            out.extend(Change::of(r));
        }
        match page.last() {
            Some(last) if full => before = Some(ActivityCursor::of(last)),
            _ => break,
        }
    }
    out.reverse();
    Ok(Some(out))
}

/// Sends `event` unless the client is gone or the server is closing.
async fn send(
    tx: &mpsc::Sender<Event>,
    event: Event,
    closing: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        sent = tx.send(event) => sent.is_ok(),
        _ = closing.changed() => false,
    }
}

/// The newest position in the activity index (none: no thread yet).
fn newest_cursor(state: &Shared) -> ApiResult<Option<ActivityCursor>> {
    let top = state.store.threads().list(&ThreadQuery {
        limit: 1,
        ..ThreadQuery::default()
    })?;
    Ok(top.first().map(ActivityCursor::of))
}

async fn pump_all(
    state: Shared,
    mut after: Option<ActivityCursor>,
    mut changes: broadcast::Receiver<Arc<Change>>,
    tx: mpsc::Sender<Event>,
) {
    let mut closing = state.closing.clone();
    if after.is_none() {
        // A first `ready` event carries the newest position as its id, so
        // that a client that sees nothing before it reconnects still
        // resumes from here.
        let shared = state.clone();
        let id = match blocking(move || newest_cursor(&shared)).await {
            Ok(Some(c)) => c.to_string(),
            Ok(None) => "0-00000000000000000000000000".to_owned(),
            Err(e) => {
                let _ = send(&tx, error_event(&e), &mut closing).await;
                return;
            }
        };
        if !send(
            &tx,
            Event::default().event("ready").id(id).data("{}"),
            &mut closing,
        )
        .await
        {
            return;
        }
    }
    // Each thread the catch-up sent, with the activity it sent: a live
    // change at or before it (broadcast before the catch-up read) is older
    // news and is dropped.
    let mut caught: HashMap<ThreadId, u64> = HashMap::new();
    let mut newest: Option<ActivityCursor> = None;
    loop {
        if let Some(from) = after.take() {
            let shared = state.clone();
            match blocking(move || catch_up(&shared, from)).await {
                Ok(Some(changes)) => {
                    for c in changes {
                        caught.insert(c.cursor.thread, c.cursor.at);
                        newest = newest.max(Some(c.cursor));
                        if !send(&tx, c.event(), &mut closing).await {
                            return;
                        }
                    }
                }
                Ok(None) => {
                    let reset = Event::default()
                        .event("reset")
                        .data(r#"{"message":"too many changes to replay: reload the list"}"#);
                    if !send(&tx, reset, &mut closing).await {
                        return;
                    }
                }
                Err(e) => {
                    let _ = send(&tx, error_event(&e), &mut closing).await;
                    return;
                }
            }
        }
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(c) => {
                        if let Some(&at) = caught.get(&c.cursor.thread) {
                            if c.cursor.at <= at {
                                continue;
                            }
                            caught.remove(&c.cursor.thread);
                        }
                        newest = newest.max(Some(c.cursor));
                        if !send(&tx, c.event(), &mut closing).await {
                            return;
                        }
                    }
                    // Too slow for the channel: catch up from the index.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        after = newest.or(Some(ActivityCursor { at: 0, thread: ThreadId::NIL }));
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tx.closed() => return,
                _ = closing.changed() => return,
            }
        }
    }
}

fn error_event(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(serde_json::to_string(&e.0).unwrap_or_default())
}

/// `GET /api/threads/{id}/events`: one thread's steps as they commit, and
/// its status changes.
pub async fn thread(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> ApiResult<EventStream> {
    let p = Params::parse(q.as_deref(), &["after"], &[])?;
    let after: u64 = resume_point(
        &headers,
        &p,
        "an event id of a thread's events (a step number)",
    )?
    .unwrap_or(0);
    let shared = state.clone();
    let id = blocking(move || resolve(&shared.store, &id)).await?;
    let changes = state.changes.subscribe();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(pump_thread(state, id, after, changes, tx));
    Ok(stream_of(rx))
}

/// A page of steps after `cursor`, as events, and the record.
fn read_steps(
    state: &Shared,
    id: ThreadId,
    cursor: u64,
) -> ApiResult<(ThreadRecord, Vec<(u64, String)>)> {
    let store = &state.store;
    let (record, entries) = store.threads().steps_after(id, cursor, STEP_PAGE)?;
    let mut out = Vec::with_capacity(entries.len());
    // The page's texts in one read (§8f item 13).
    for entry in api::LogEntry::read_all(store, &entries, api::KeptTexts::default())? {
        let json = serde_json::to_string(&entry)
            .map_err(|e| ApiError::new(api::ErrorKind::Failed, e.to_string()))?;
        out.push((entry.seq, json));
    }
    Ok((record, out))
}

async fn pump_thread(
    state: Shared,
    id: ThreadId,
    mut cursor: u64,
    mut changes: broadcast::Receiver<Arc<Change>>,
    tx: mpsc::Sender<Event>,
) {
    let mut closing = state.closing.clone();
    let mut said: Option<(ThreadStatus, u64)> = None;
    loop {
        let shared = state.clone();
        let (record, steps) = match blocking(move || read_steps(&shared, id, cursor)).await {
            Ok(read) => read,
            Err(e) => {
                let _ = send(&tx, error_event(&e), &mut closing).await;
                return;
            }
        };
        let more = steps.len() == STEP_PAGE;
        for (seq, json) in steps {
            let event = Event::default()
                .event("step")
                .id(seq.to_string())
                .data(json);
            if !send(&tx, event, &mut closing).await {
                return;
            }
            cursor = seq;
        }
        if said != Some((record.status, record.seq)) {
            said = Some((record.status, record.seq));
            if let Ok(json) = serde_json::to_string(&api::ThreadActivity::from(&record))
                && tx
                    .send(Event::default().event("thread").data(json))
                    .await
                    .is_err()
            {
                return;
            }
        }
        if more {
            continue;
        }
        // Wait for the poller to see this thread change.
        let backstop = tokio::time::sleep(BACKSTOP);
        tokio::pin!(backstop);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(c) if c.cursor.thread == id => break,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = &mut backstop => break,
                _ = tx.closed() => return,
                _ = closing.changed() => return,
            }
        }
    }
}
