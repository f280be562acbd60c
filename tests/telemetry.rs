//! The spans the engine emits (`uwf_db::telemetry`), seen by a subscriber
//! layer that records them: names, fields, parents, errors — for a child
//! workflow, a fan-out driven on worker threads, a failed step, a fork,
//! and prompt content only when asked. (The OTLP export of the same spans
//! is tested against a real receiver by `tests/otel/run.sh`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use uwf_db::Store;
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::{DriveOptions, ForkAt, StartOptions};
use uwf_db::workflow::parse_workflow;

/// A span as recorded: its name, fields, and its parent's index.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
    parent: Option<usize>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

/// The index of a span in the recorder, kept in the span's extensions.
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Recorder
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let span = ctx.span(id).expect("the new span");
        seen.parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut all = self.0.lock().unwrap();
        all.push(seen);
        span.extensions_mut().insert(Index(all.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a live span");
        let Some(i) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        values.record(&mut Fields(&mut self.0.lock().unwrap()[i].fields));
    }
}

const SOLVE: &str = "name: solve
roles:
  solver: { goal: Solve one task }
graph:
  $START: { _: { role: solver, prompt: 'Solve it' } }
  solver: { _: { role: $END, prompt: '{{{_body}}}' } }
";

const PLAN: &str = "name: plan
roles:
  planner:
    goal: Split the work
    frontmatter:
      properties: { $status: { const: planned }, tasks: { type: array, items: { type: string } } }
      required: [$status, tasks]
  solve_all:
    foreach: { items: tasks, as: task, workflow: solve, prompt: 'Solve: {{task}}', max_concurrency: 3 }
    join: { tolerate: 0 }
  check:
    workflow: solve
graph:
  $START: { _: { role: planner, prompt: 'Plan the work' } }
  planner: { planned: { role: solve_all, prompt: 'Solve every task' } }
  solve_all:
    done: { role: check, prompt: 'Check it' }
    failed: { role: $END, prompt: 'failed' }
  check: { done: { role: $END, prompt: 'Checked' }, failed: { role: $END, prompt: 'no' } }
";

/// Plans three tasks, solves each (reporting usage), fails a solver whose
/// task is `boom`.
#[derive(Clone)]
struct Scripted {
    tasks: &'static str,
}

impl Agent for Scripted {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        let out = match req.role_name {
            "planner" => format!(
                "---\n$status: planned\ntasks: [{}]\n---\nplanned",
                self.tasks
            ),
            _ if req.prompt.contains("Solve: boom") => {
                return Err(AgentError::BadSpec("the solver gave up".into()));
            }
            _ => {
                "---\n$usage: {input_tokens: 10, output_tokens: 2, model: test-model}\n---\nsolved"
                    .to_owned()
            }
        };
        Ok(out.into())
    }
    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }
}

fn store() -> Store {
    let store = Store::memory();
    let solve = parse_workflow(SOLVE, Some("solve"), &|_| false).unwrap();
    store.workflows().add(&solve).unwrap();
    let plan = parse_workflow(PLAN, Some("plan"), &|w| w == "solve").unwrap();
    store.workflows().add(&plan).unwrap();
    store
}

fn run(
    store: &Store,
    agent: &mut Scripted,
    id: uwf_db::thread::ThreadId,
) -> uwf_db::engine::DriveReport {
    store.engine().drive(id, &DriveOptions::default(), agent)
}

/// The spans' tree is checked from one recording; one test, because the
/// recorder is the process's global subscriber (fan-out workers run on
/// threads of their own, which see only the global one).
#[test]
fn spans_follow_the_genai_conventions() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .unwrap();
    let store = store();
    let wf = store.workflows().by_name("plan").unwrap().unwrap().0;

    // Nothing is recorded before anything is driven.
    let started = store
        .engine()
        .start_workflow(wf, "the task", &StartOptions::default())
        .unwrap();
    assert!(recorder.0.lock().unwrap().is_empty());

    run(&store, &mut Scripted { tasks: "a, b, c" }, started.id)
        .into_result()
        .unwrap();
    let spans = std::mem::take(&mut *recorder.0.lock().unwrap());
    let root = &spans[0];
    assert_eq!(root.name, "invoke_workflow");
    assert_eq!(root.parent, None);
    assert_eq!(root.fields["otel.name"], "invoke_workflow plan");
    assert_eq!(root.fields["gen_ai.operation.name"], "invoke_workflow");
    assert_eq!(root.fields["gen_ai.workflow.name"], "plan");
    assert_eq!(
        root.fields["gen_ai.conversation.id"],
        started.id.to_string()
    );
    assert_eq!(root.fields["uwf.thread.status"], "completed");
    assert_eq!(root.fields["uwf.steps"], "3", "{root:?}");
    assert!(!root.fields.contains_key("error.type"));

    // The parent's three role steps are children of its workflow span.
    let steps: Vec<(usize, &Seen)> = spans
        .iter()
        .enumerate()
        .filter(|(_, s)| s.parent == Some(0))
        .collect();
    let roles: Vec<&str> = steps
        .iter()
        .map(|(_, s)| s.fields["gen_ai.agent.name"].as_str())
        .collect();
    assert_eq!(roles, ["planner", "solve_all", "check"]);
    for (_, s) in &steps {
        assert_eq!(s.name, "invoke_agent");
        assert_eq!(s.fields["otel.kind"], "client");
        assert_eq!(s.fields["gen_ai.conversation.id"], started.id.to_string());
        assert!(!s.fields.contains_key("gen_ai.input.messages"), "{s:?}");
    }
    assert_eq!(steps[0].1.fields["otel.name"], "invoke_agent planner");
    assert_eq!(steps[0].1.fields["uwf.status"], "planned");
    assert_eq!(steps[0].1.fields["uwf.next_role"], "solve_all");

    // The fan-out's three children (driven on worker threads) and the
    // child workflow are workflow spans under their role's step, each
    // naming the parent thread, each with its solver step reporting usage.
    for (step, children) in [(steps[1].0, 3), (steps[2].0, 1)] {
        let kids: Vec<(usize, &Seen)> = spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.parent == Some(step))
            .collect();
        assert_eq!(kids.len(), children, "{kids:?}");
        for (k, kid) in kids {
            assert_eq!(kid.fields["otel.name"], "invoke_workflow solve");
            assert_eq!(kid.fields["uwf.thread.parent"], started.id.to_string());
            assert_ne!(kid.fields["gen_ai.conversation.id"], started.id.to_string());
            let solver = spans
                .iter()
                .find(|s| s.parent == Some(k))
                .expect("the solver's step");
            assert_eq!(solver.fields["gen_ai.agent.name"], "solver");
            assert_eq!(solver.fields["gen_ai.usage.input_tokens"], "10");
            assert_eq!(solver.fields["gen_ai.usage.output_tokens"], "2");
            assert_eq!(solver.fields["gen_ai.response.model"], "test-model");
            assert_eq!(solver.fields["uwf.agent.calls"], "1");
        }
    }

    // A failed step: its span and its thread's carry the error's kind.
    let failing = store
        .engine()
        .start_workflow(wf, "fails", &StartOptions::default())
        .unwrap();
    let report = run(&store, &mut Scripted { tasks: "boom" }, failing.id);
    let error = report
        .error
        .expect("a child failed beyond the join's tolerance");
    let spans = std::mem::take(&mut *recorder.0.lock().unwrap());
    let failed_step = spans
        .iter()
        .find(|s| s.fields.get("gen_ai.agent.name").map(String::as_str) == Some("solver"))
        .expect("the solver's step");
    assert_eq!(failed_step.fields["error.type"], "step_failed");
    assert_eq!(failed_step.fields["otel.status_code"], "ERROR");
    let fan_out = spans
        .iter()
        .find(|s| s.fields.get("gen_ai.agent.name").map(String::as_str) == Some("solve_all"))
        .expect("the fan-out's step");
    let kind = uwf_db::api::ErrorKind::from(&error).as_str();
    assert_eq!(fan_out.fields["error.type"], kind, "{error}");
    assert_eq!(spans[0].fields["error.type"], kind, "the run's span too");
    assert_eq!(spans[0].fields["otel.status_code"], "ERROR");

    // A fork's drive names its origin.
    let fork = store
        .engine()
        .fork(started.id, ForkAt::BeforeRole("check".into()))
        .unwrap();
    run(&store, &mut Scripted { tasks: "a" }, fork.id)
        .into_result()
        .unwrap();
    let spans = std::mem::take(&mut *recorder.0.lock().unwrap());
    assert_eq!(
        spans[0].fields["uwf.thread.forked_from"],
        started.id.to_string()
    );

    // Prompt and reply only when asked.
    uwf_db::telemetry::set_capture_content(true);
    let asked = store
        .engine()
        .start_workflow(wf, "a secret task", &StartOptions::default())
        .unwrap();
    run(&store, &mut Scripted { tasks: "a" }, asked.id)
        .into_result()
        .unwrap();
    uwf_db::telemetry::set_capture_content(false);
    let spans = std::mem::take(&mut *recorder.0.lock().unwrap());
    let planner = spans
        .iter()
        .find(|s| s.fields.get("gen_ai.agent.name").map(String::as_str) == Some("planner"))
        .expect("the planner's step");
    let input: serde_json::Value =
        serde_json::from_str(&planner.fields["gen_ai.input.messages"]).unwrap();
    assert_eq!(input[0]["role"], "user");
    let prompt = input[0]["parts"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("a secret task"), "{prompt}");
    let output: serde_json::Value =
        serde_json::from_str(&planner.fields["gen_ai.output.messages"]).unwrap();
    assert_eq!(output[0]["parts"][0]["content"], "planned");
}
