//! What the engine tells an operator's tools: [`tracing`] spans and events.
//!
//! The library emits and never listens: it installs no subscriber, so with
//! none installed (an embedder who wants no telemetry) each span or event
//! costs a check of a cached flag. The `uwf-db` binary installs one that
//! prints logs on stderr (`-v`, `RUST_LOG`) and, built with the `otel`
//! feature, sends spans over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set;
//! an embedder installs its own (`tracing-subscriber`,
//! `tracing-opentelemetry`).
//!
//! # Spans
//!
//! Field names follow OpenTelemetry's GenAI semantic conventions (agent
//! and framework spans); `otel.name`, `otel.kind` and `otel.status_code`
//! are read by `tracing-opentelemetry` as the span's name, kind and status.
//!
//! - **`invoke_workflow`** (INFO, kind internal): one drive of one thread —
//!   `Engine::drive`, `run_workflow`, and each child workflow or fan-out
//!   child driven inside a parent's step (a child's span is a child of the
//!   parent's `invoke_agent` span, even when a fan-out worker thread drives
//!   it). Fields: `gen_ai.operation.name = "invoke_workflow"`,
//!   `gen_ai.workflow.name`, `gen_ai.conversation.id` (the thread id),
//!   `uwf.thread.parent` (a child's parent thread), `uwf.thread.forked_from`
//!   (a fork's origin thread: forks are separate runs, so the origin is
//!   named, not linked), `uwf.steps`, `uwf.thread.status`, and on failure
//!   `error.type` with the error's [`ErrorKind`](crate::api::ErrorKind).
//! - **`invoke_agent`** (INFO, kind client: the agent runs outside the
//!   engine): one role step. Fields: `gen_ai.operation.name =
//!   "invoke_agent"`, `gen_ai.agent.name` (the role), `gen_ai.conversation.id`,
//!   `gen_ai.response.model`, `gen_ai.usage.input_tokens`,
//!   `gen_ai.usage.output_tokens` (what the agent reported), `uwf.cost_usd`,
//!   `uwf.agent.calls`, `uwf.attempts` (failed attempts retried),
//!   `uwf.status` (the reply's status), `uwf.next_role`, and on failure
//!   `error.type`. With [`set_capture_content`] on, the opt-in
//!   `gen_ai.input.messages` (the exact prompt sent) and
//!   `gen_ai.output.messages` (the reply's body) in the conventions' JSON
//!   message form.
//!
//! # Events (logs)
//!
//! `warn`: a step failed, a PostgreSQL server refusing connections (the
//! runner waits); `info`: an attempt retried, a collection's result, a
//! compaction; `debug`: a step committed, a claim taken over, a group
//! commit's size.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;
use tracing::field::Empty;

use crate::thread::ThreadId;
use crate::usage::StepUsage;

static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether `invoke_agent` spans carry the prompt and the reply (off by
/// default: prompts hold what users and tools wrote). Process-wide, like
/// the subscriber that would receive them.
///
/// ```
/// uwf_db::telemetry::set_capture_content(true);
/// assert!(uwf_db::telemetry::captures_content());
/// uwf_db::telemetry::set_capture_content(false);
/// ```
pub fn set_capture_content(on: bool) {
    CAPTURE_CONTENT.store(on, Ordering::Relaxed);
}

/// See [`set_capture_content`].
pub fn captures_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// The span of one drive of thread `id` (its workflow's name is recorded
/// by [`name_workflow`] once known).
pub(crate) fn workflow_span(id: ThreadId) -> Span {
    tracing::info_span!(
        "invoke_workflow",
        otel.name = "invoke_workflow",
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_workflow",
        gen_ai.workflow.name = Empty,
        gen_ai.conversation.id = %id,
        uwf.thread.parent = Empty,
        uwf.thread.forked_from = Empty,
        uwf.steps = Empty,
        uwf.thread.status = Empty,
        "error.type" = Empty,
    )
}

/// Names `span`'s workflow (and so the span: `invoke_workflow NAME`).
pub(crate) fn name_workflow(span: &Span, workflow: &str) {
    span.record("gen_ai.workflow.name", workflow);
    span.record("otel.name", format!("invoke_workflow {workflow}"));
}

/// The span of one role step of thread `id`.
pub(crate) fn agent_span(id: ThreadId, role: &str) -> Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {role}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = role,
        gen_ai.conversation.id = %id,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        uwf.cost_usd = Empty,
        uwf.agent.calls = Empty,
        uwf.attempts = Empty,
        uwf.status = Empty,
        uwf.next_role = Empty,
        "error.type" = Empty,
    )
}

/// Records what a step's calls cost on the current span.
pub(crate) fn record_usage(usage: &StepUsage, failed_attempts: usize) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("uwf.agent.calls", int(usage.calls));
    if let Some(model) = &usage.model {
        span.record("gen_ai.response.model", model.as_str());
    }
    if let Some(n) = usage.input_tokens {
        span.record("gen_ai.usage.input_tokens", int(n));
    }
    if let Some(n) = usage.output_tokens {
        span.record("gen_ai.usage.output_tokens", int(n));
    }
    if let Some(cost) = usage.cost_usd {
        span.record("uwf.cost_usd", cost);
    }
    if failed_attempts > 0 {
        span.record("uwf.attempts", int(failed_attempts as u64));
    }
}

/// A count as a signed integer: OpenTelemetry's integers are `i64`
/// (`tracing-opentelemetry` would send a `u64` as a string).
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Records the prompt sent and the reply's body on the current span, when
/// [`captures_content`] (as the conventions' message lists).
pub(crate) fn record_content(prompt: &str, reply: &str) {
    if !captures_content() {
        return;
    }
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    let message = |role: &str, text: &str| {
        serde_json::json!([{ "role": role, "parts": [{ "type": "text", "content": text }] }])
            .to_string()
    };
    span.record("gen_ai.input.messages", message("user", prompt));
    span.record("gen_ai.output.messages", message("assistant", reply));
}

/// Marks `span` failed with `error`'s kind (`error.type`).
pub(crate) fn record_error(span: &Span, kind: crate::api::ErrorKind) {
    span.record("error.type", kind.as_str());
    span.record("otel.status_code", "ERROR");
}
