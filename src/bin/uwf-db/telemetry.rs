//! Where the library's `tracing` spans and events go: logs on stderr with
//! `-v` or `RUST_LOG`, and (feature `otel`) traces over OTLP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
//! set. With neither, no subscriber is installed and every span costs the
//! library one cached check (`uwf_db::telemetry`).

use std::io::{IsTerminal, Write};

use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[cfg(feature = "otel")]
static PROVIDER: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> =
    std::sync::OnceLock::new();

/// A boxed layer of the registry this module builds.
type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

#[cfg(feature = "serve")]
static METRICS: std::sync::OnceLock<std::sync::Arc<crate::serve::metrics::Metrics>> =
    std::sync::OnceLock::new();

/// The metrics `serve` publishes (`None` in other commands).
#[cfg(feature = "serve")]
pub fn metrics() -> Option<&'static crate::serve::metrics::Metrics> {
    METRICS.get().map(|m| &**m)
}

/// Installs what the environment and the flags ask for (`color`: `--color
/// always|never`, `None` for auto), and with `metrics`
/// (`serve`) the layer that counts steps for `GET /metrics`. Problems (a
/// bad `RUST_LOG`, an OTLP endpoint that is not a URL) are said on stderr
/// and leave that part off; they never stop the command.
pub fn init(verbose: u8, quiet: bool, color: Option<bool>, metrics: bool) {
    let mut layers: Vec<Boxed> = Vec::new();
    #[cfg(feature = "serve")]
    if metrics {
        let m = std::sync::Arc::new(crate::serve::metrics::Metrics::new());
        let _ = METRICS.set(m.clone());
        layers.push(
            crate::serve::metrics::MetricsLayer(m)
                // The drive and step spans.
                .with_filter(EnvFilter::new("uwf_db=info"))
                .boxed(),
        );
    }
    #[cfg(not(feature = "serve"))]
    let _ = metrics;
    if let Some(filter) = log_filter(verbose, quiet) {
        // `--color always|never`, else a terminal without NO_COLOR.
        let color = color.unwrap_or_else(|| {
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        });
        // Events only: each names its thread and role itself, and the
        // spans' GenAI fields would make every line three lines long.
        let events = tracing_subscriber::filter::filter_fn(|meta| meta.is_event());
        layers.push(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color)
                .with_filter(filter.and(events))
                .boxed(),
        );
    }
    #[cfg(feature = "otel")]
    if let Some(layer) = otel_layer() {
        layers.push(layer);
    }
    if layers.is_empty() {
        return;
    }
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

/// The filter of the stderr log: `RUST_LOG` when set, else by `-v`
/// (info, debug, trace of uwf-db's own targets); none when quiet or not
/// verbose.
fn log_filter(verbose: u8, quiet: bool) -> Option<EnvFilter> {
    match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            match EnvFilter::builder().parse(&directives) {
                Ok(filter) => return Some(filter),
                Err(e) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "uwf-db: RUST_LOG ignored: {e} (example: RUST_LOG=uwf_db=debug)"
                    );
                }
            }
        }
        _ => {}
    }
    if quiet {
        return None;
    }
    let level = match verbose {
        0 => return None,
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    Some(EnvFilter::new(format!("uwf_db={level}")))
}

/// A non-empty environment variable.
#[cfg(feature = "otel")]
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The OTLP layer, when an endpoint is configured (the SDK reads the
/// standard variables: endpoint, headers, timeout, `OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`).
#[cfg(feature = "otel")]
fn otel_layer() -> Option<Boxed> {
    use opentelemetry::trace::TracerProvider as _;

    let endpoint =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))?;
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return None;
    }
    let protocol =
        env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(p) = protocol.filter(|p| p != "http/protobuf") {
        let _ = writeln!(
            std::io::stderr(),
            "uwf-db: OTEL_EXPORTER_OTLP_PROTOCOL={p} is not built in; traces go to {endpoint} as http/protobuf"
        );
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "uwf-db: OTLP traces off: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("uwf-db");
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("uwf-db");
    let _ = PROVIDER.set(provider);
    // Prompts and replies only when asked (the GenAI conventions' switch).
    let content = env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    uwf_db::telemetry::set_capture_content(content);
    Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // The conventions' attributes only: no source locations,
            // thread names, targets or busy/idle times on every span.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(EnvFilter::new("uwf_db=info"))
            .boxed(),
    )
}

/// Sends the spans not yet exported (at most the exporter's timeout);
/// called before the process exits.
pub fn flush() {
    #[cfg(feature = "otel")]
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        let _ = writeln!(std::io::stderr(), "uwf-db: OTLP traces: {e}");
    }
}
