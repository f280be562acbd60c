//! Prometheus metrics of `uwf-db serve` (`GET /metrics`), read off the
//! library's spans by a `tracing` layer: what the server's own drives did
//! (steps by outcome, their latency, tokens, drives, steps in flight). A
//! scrape of every runner's `serve` adds up to the fleet. (Group commit
//! sizes are `batch`'s, which prints them; a server commits each step on
//! its own.)

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    workflow: String,
    role: String,
    /// `ok`, or the error's kind (`step_failed`, `interrupted`, …).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    workflow: String,
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    workflow: String,
    role: String,
    /// `input` or `output` (the GenAI conventions' `gen_ai.token.type`).
    token_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriveLabels {
    workflow: String,
    outcome: String,
}

/// The server's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    steps: Family<StepLabels, Counter>,
    step_seconds: Family<RoleLabels, Histogram>,
    tokens: Family<TokenLabels, Counter>,
    drives: Family<DriveLabels, Counter>,
    in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("uwf");
        let steps = Family::<StepLabels, Counter>::default();
        registry.register(
            "steps",
            "Role steps this process finished, by workflow, role and outcome",
            steps.clone(),
        );
        let step_seconds = Family::<RoleLabels, Histogram>::new_with_constructor(|| {
            // 10 ms to about 30 min.
            Histogram::new(exponential_buckets(0.01, 3.0, 12))
        });
        registry.register(
            "step_duration_seconds",
            "Wall time of a role step: the agent's calls, retries and the commit",
            step_seconds.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "agent_tokens",
            "Tokens the agents reported, by workflow, role and type",
            tokens.clone(),
        );
        let drives = Family::<DriveLabels, Counter>::default();
        registry.register(
            "drives",
            "Drives of a thread (a run, a batch's thread, a child) this process finished, by outcome",
            drives.clone(),
        );
        let in_flight = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        registry.register(
            "steps_in_flight",
            "Role steps running now in this process",
            in_flight.clone(),
        );
        Metrics {
            registry,
            steps,
            step_seconds,
            tokens,
            drives,
            in_flight,
        }
    }

    /// The OpenMetrics text a Prometheus scrape reads.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The layer that feeds [`Metrics`] from the spans.
pub struct MetricsLayer(pub Arc<Metrics>);

/// What a span of interest says, kept in its extensions.
#[derive(Default)]
struct Seen {
    agent: bool,
    started: Option<Instant>,
    workflow: Option<String>,
    role: Option<String>,
    error: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "gen_ai.workflow.name" => self.workflow = Some(value.to_owned()),
            "gen_ai.agent.name" => self.role = Some(value.to_owned()),
            "error.type" => self.error = Some(value.to_owned()),
            _ => {}
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        let value = u64::try_from(value).ok();
        match field.name() {
            "gen_ai.usage.input_tokens" => self.input_tokens = value,
            "gen_ai.usage.output_tokens" => self.output_tokens = value,
            _ => {}
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S> tracing_subscriber::Layer<S> for MetricsLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        let agent = name == "invoke_agent";
        if !agent && name != "invoke_workflow" {
            return;
        }
        let mut seen = Seen {
            agent,
            started: Some(Instant::now()),
            ..Seen::default()
        };
        attrs.record(&mut seen);
        if agent {
            self.0.in_flight.inc();
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(seen);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(seen) = span.extensions_mut().get_mut::<Seen>()
        {
            values.record(seen);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(seen) = span.extensions_mut().remove::<Seen>() else {
            return;
        };
        let outcome = seen.error.clone().unwrap_or_else(|| "ok".to_owned());
        let m = &self.0;
        if !seen.agent {
            let workflow = seen.workflow.unwrap_or_default();
            m.drives
                .get_or_create(&DriveLabels { workflow, outcome })
                .inc();
            return;
        }
        m.in_flight.dec();
        // The workflow is named on the drive's span, the step's parent.
        let workflow = span
            .parent()
            .and_then(|p| {
                p.extensions()
                    .get::<Seen>()
                    .and_then(|s| s.workflow.clone())
            })
            .unwrap_or_default();
        let role = seen.role.unwrap_or_default();
        m.steps
            .get_or_create(&StepLabels {
                workflow: workflow.clone(),
                role: role.clone(),
                outcome,
            })
            .inc();
        if let Some(started) = seen.started {
            m.step_seconds
                .get_or_create(&RoleLabels {
                    workflow: workflow.clone(),
                    role: role.clone(),
                })
                .observe(started.elapsed().as_secs_f64());
        }
        for (kind, n) in [("input", seen.input_tokens), ("output", seen.output_tokens)] {
            if let Some(n) = n {
                m.tokens
                    .get_or_create(&TokenLabels {
                        workflow: workflow.clone(),
                        role: role.clone(),
                        token_type: kind.to_owned(),
                    })
                    .inc_by(n);
            }
        }
    }
}

/// `GET /metrics`: the OpenMetrics text of this process (behind the same
/// guard as the API: a token when the server has one).
pub async fn serve() -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = crate::telemetry::metrics()
        .map(|m| m.encode())
        .unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}
