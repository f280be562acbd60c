//! `uwf_db._native`: the library's types wrapped for Python
//! (`docs/design.md` §8g). Answers are the JSON contract's types
//! (`uwf_db::api`) as plain dicts; errors are exceptions of one hierarchy
//! named by `api::ErrorKind`; every call that reads, writes or waits lets
//! other Python threads run.

use std::collections::BTreeMap;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use serde::Serialize;
use uwf_db::Blob;
use uwf_db::api::{ErrorKind, ThreadSummary};
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::batch::{BatchItem, BatchOptions, BatchPrompt};
use uwf_db::engine::{Cancel, DriveOptions, ForkAt, StartOptions};
use uwf_db::node::Value;
use uwf_db::thread::{Next, StepWrite, ThreadId, ThreadQuery, ThreadStatus};
use uwf_db::{Durability, Store as RustStore, StoreOptions};

create_exception!(uwf_db, UwfError, PyException, "Any uwf-db failure.");
create_exception!(
    uwf_db,
    NotFound,
    UwfError,
    "No thread, workflow or blob has that name."
);
create_exception!(
    uwf_db,
    Ambiguous,
    UwfError,
    "A prefix matches more than one."
);
create_exception!(
    uwf_db,
    InvalidInput,
    UwfError,
    "The input is not acceptable."
);
create_exception!(
    uwf_db,
    Conflict,
    UwfError,
    "The head moved, or the thread is driven elsewhere."
);
create_exception!(uwf_db, TooLarge, UwfError, "Past a size or count limit.");
create_exception!(
    uwf_db,
    StepFailed,
    UwfError,
    "A step failed; it is recorded on the thread."
);
create_exception!(
    uwf_db,
    Damaged,
    UwfError,
    "The store's data file is damaged."
);
create_exception!(
    uwf_db,
    Corrupt,
    UwfError,
    "A stored record or blob fails its checks."
);
create_exception!(uwf_db, StoreFull, UwfError, "The store has no room left.");
create_exception!(
    uwf_db,
    Unavailable,
    UwfError,
    "The storage could not be reached."
);
create_exception!(
    uwf_db,
    Interrupted,
    UwfError,
    "Cancelled; nothing was half-written."
);

/// The exception for a library error: its class by kind, its text the
/// library's message with its causes, `kind` the contract's name.
fn raise(kind: ErrorKind, e: &dyn std::error::Error) -> PyErr {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    err(kind, message)
}

/// The exception of `kind` with `message`, its `kind` attribute set.
fn err(kind: ErrorKind, message: impl Into<String>) -> PyErr {
    let message: String = message.into();
    let err = match kind {
        ErrorKind::NotFound => NotFound::new_err(message),
        ErrorKind::Ambiguous => Ambiguous::new_err(message),
        ErrorKind::Invalid => InvalidInput::new_err(message),
        ErrorKind::Conflict => Conflict::new_err(message),
        ErrorKind::TooLarge => TooLarge::new_err(message),
        ErrorKind::StepFailed => StepFailed::new_err(message),
        ErrorKind::Damaged => Damaged::new_err(message),
        ErrorKind::Corrupt => Corrupt::new_err(message),
        ErrorKind::Full => StoreFull::new_err(message),
        ErrorKind::Unavailable => Unavailable::new_err(message),
        ErrorKind::Interrupted => Interrupted::new_err(message),
        _ => UwfError::new_err(message),
    };
    Python::attach(|py| {
        let name = serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = err.value(py).setattr("kind", name);
    });
    err
}

/// Errors of the library's layers into exceptions.
trait OrRaise<T> {
    fn or_raise(self) -> PyResult<T>;
}

macro_rules! or_raise {
    ($($e:ty),*) => {$(
        impl<T> OrRaise<T> for Result<T, $e> {
            fn or_raise(self) -> PyResult<T> {
                self.map_err(|e| raise(ErrorKind::from(&e), &e))
            }
        }
    )*};
}

or_raise!(
    uwf_db::engine::EngineError,
    uwf_db::thread::ThreadError,
    uwf_db::workflow::WorkflowError,
    uwf_db::StoreError,
    uwf_db::OpenError
);

/// A contract answer as Python objects.
fn answer<T: Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    Ok(pythonize::pythonize(py, value)?.unbind())
}

/// A thread by full id or unique prefix.
fn thread_id(id: &str, store: &RustStore) -> PyResult<ThreadId> {
    let prefix: uwf_db::thread::IdPrefix = id.parse().map_err(|e| {
        err(
            ErrorKind::Invalid,
            format!("'{id}' is not a thread id: {e}"),
        )
    })?;
    store.threads().resolve(&prefix).or_raise()
}

/// A Python callable as an agent: `fn(request) -> str | dict`.
struct PyAgent {
    f: Py<PyAny>,
}

impl PyAgent {
    fn reply(out: &Bound<'_, PyAny>) -> Result<AgentReply, String> {
        if let Ok(s) = out.cast::<PyString>() {
            return Ok(s.to_string().into());
        }
        let Ok(d) = out.cast::<PyDict>() else {
            return Err(format!(
                "the agent returned {}, not a str or a dict",
                out.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ));
        };
        let body: String = match d.get_item("body").map_err(|e| e.to_string())? {
            Some(b) => b.extract().map_err(|_| "'body' is not a str".to_owned())?,
            None => String::new(),
        };
        let mut output = String::new();
        if let Some(fm) = d.get_item("frontmatter").map_err(|e| e.to_string())? {
            let value: serde_json::Value = pythonize::depythonize(&fm)
                .map_err(|e| format!("'frontmatter' cannot be written: {e}"))?;
            if !value.is_object() {
                return Err("'frontmatter' is not a dict".into());
            }
            // JSON is YAML: the frontmatter block as the engine reads any.
            output.push_str("---\n");
            output.push_str(&value.to_string());
            output.push_str("\n---\n");
        }
        output.push_str(&body);
        let usage = match d.get_item("usage").map_err(|e| e.to_string())? {
            Some(u) => {
                let value: serde_json::Value = pythonize::depythonize(&u)
                    .map_err(|e| format!("'usage' cannot be read: {e}"))?;
                uwf_db::usage::Usage::from_json(&value)
            }
            None => None,
        };
        Ok(AgentReply {
            output,
            usage,
            ..AgentReply::default()
        })
    }
}

impl Agent for PyAgent {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        Python::attach(|py| {
            let request = PyDict::new(py);
            let set = |k: &str, v: Bound<'_, PyAny>| request.set_item(k, v);
            let fill = || -> PyResult<()> {
                set(
                    "thread",
                    req.thread.to_string().into_pyobject(py)?.into_any(),
                )?;
                set("workflow", req.workflow.into_pyobject(py)?.into_any())?;
                set("role", req.role_name.into_pyobject(py)?.into_any())?;
                set("instruction", req.instruction.into_pyobject(py)?.into_any())?;
                set("prompt", req.prompt.into_pyobject(py)?.into_any())?;
                let cwd = req.cwd.map(|c| c.to_string_lossy().into_owned());
                set("cwd", cwd.into_pyobject(py)?.into_any())?;
                Ok(())
            };
            fill().map_err(|e| AgentError::Other(e.to_string().into()))?;
            match self.f.call1(py, (request,)) {
                Ok(out) => Self::reply(out.bind(py)).map_err(|e| AgentError::Other(e.into())),
                Err(e) => {
                    // The exception's type and message, as a failed step
                    // records any agent's failure.
                    let name = e
                        .get_type(py)
                        .name()
                        .map_or_else(|_| "Exception".into(), |n| n.to_string());
                    Err(AgentError::Other(
                        format!("the Python agent raised {name}: {}", e.value(py)).into(),
                    ))
                }
            }
        })
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(PyAgent {
            f: Python::attach(|py| self.f.clone_ref(py)),
        }))
    }
}

/// An agent from Python: a callable, or a spec string (`script:…`,
/// `cmd:…`) as the CLI's `--agent` takes.
fn agent_of(store: &RustStore, agent: &Bound<'_, PyAny>) -> PyResult<Box<dyn Agent>> {
    if let Ok(spec) = agent.extract::<String>() {
        return store
            .engine()
            .build_agent(&spec, &Default::default())
            .or_raise();
    }
    if agent.is_callable() {
        return Ok(Box::new(PyAgent {
            f: agent.clone().unbind(),
        }));
    }
    Err(err(
        ErrorKind::Invalid,
        "agent must be a callable or an agent spec string",
    ))
}

/// A uwf-db store: a directory (LMDB) or a `postgres://` URL.
#[pyclass(module = "uwf_db._native", frozen)]
struct Store {
    store: RustStore,
}

#[pymethods]
impl Store {
    /// Opens (or creates) the store at `location`. `durability`: "sync"
    /// (the default: every acknowledged step survives a crash), "none".
    #[new]
    #[pyo3(signature = (location, durability = "sync"))]
    fn new(py: Python<'_>, location: &str, durability: &str) -> PyResult<Self> {
        let durability = match durability {
            "sync" => Durability::Sync,
            "none" => Durability::None,
            other => {
                return Err(err(
                    ErrorKind::Invalid,
                    format!("durability must be 'sync' or 'none', not '{other}'"),
                ));
            }
        };
        let options = StoreOptions {
            durability,
            ..StoreOptions::default()
        };
        let location = location.to_owned();
        let store = py
            .detach(move || RustStore::open_location(&location, options))
            .or_raise()?;
        Ok(Store { store })
    }

    /// Registers a workflow from YAML text (`name` as a file would give
    /// it) or from a file `path`; its name and hash.
    #[pyo3(signature = (yaml = None, *, path = None))]
    fn add_workflow(
        &self,
        py: Python<'_>,
        yaml: Option<&str>,
        path: Option<std::path::PathBuf>,
    ) -> PyResult<Py<PyAny>> {
        let workflows = self.store.workflows();
        let registered = |n: &str| workflows.by_name(n).ok().flatten().is_some();
        let parsed = match (yaml, &path) {
            (Some(text), None) => uwf_db::workflow::parse_workflow(text, None, &registered),
            (None, Some(p)) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    err(
                        ErrorKind::NotFound,
                        format!("cannot read {}: {e}", p.display()),
                    )
                })?;
                uwf_db::workflow::parse_workflow_file(&text, p, &registered)
            }
            _ => {
                return Err(err(
                    ErrorKind::Invalid,
                    "give the workflow's YAML text or path=, one of them",
                ));
            }
        };
        let wf = parsed.map_err(|problems| {
            let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
            err(
                ErrorKind::Invalid,
                format!("invalid workflow:\n{}", lines.join("\n")),
            )
        })?;
        let (hash, changed) = py.detach(|| workflows.add(&wf)).or_raise()?;
        let d = PyDict::new(py);
        d.set_item("name", &wf.name)?;
        d.set_item("hash", hash.to_string())?;
        d.set_item("changed", changed)?;
        Ok(d.into_any().unbind())
    }

    /// Starts a thread of `workflow` (by name) with `prompt`, idle at its
    /// first role; the thread's summary.
    #[pyo3(signature = (workflow, prompt, *, labels = None))]
    fn start(
        &self,
        py: Python<'_>,
        workflow: &str,
        prompt: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Py<PyAny>> {
        let hash = self.workflow_hash(workflow)?;
        let options = start_options(labels);
        let engine = self.store.engine();
        let record = py
            .detach(|| engine.start_workflow(hash, prompt, &options))
            .or_raise()?;
        answer(py, &ThreadSummary::from(&record))
    }

    /// Runs a new thread of `workflow` to its end (or until it suspends)
    /// with `agent` (a callable `fn(request) -> str | dict`, or a spec
    /// string); `{"thread": …, "steps": [StepResult…]}`. A failed step
    /// raises `StepFailed` (recorded on the thread).
    #[pyo3(signature = (workflow, prompt, agent, *, labels = None))]
    fn run(
        &self,
        py: Python<'_>,
        workflow: &str,
        prompt: &str,
        agent: &Bound<'_, PyAny>,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Py<PyAny>> {
        let hash = self.workflow_hash(workflow)?;
        let mut agent = agent_of(&self.store, agent)?;
        let cancel = Cancel::new();
        let options = StartOptions {
            cancel: cancel.clone(),
            ..start_options(labels)
        };
        let engine = self.store.engine();
        let (record, report) = interruptible(py, &cancel, || {
            engine.run_workflow(hash, prompt, &options, agent.as_mut())
        })?
        .or_raise()?;
        let steps = report.into_result().or_raise()?;
        let d = PyDict::new(py);
        d.set_item("thread", record.id.to_string())?;
        d.set_item("steps", answer(py, &steps)?)?;
        Ok(d.into_any().unbind())
    }

    /// Drives thread `thread` (an id or a unique prefix) with `agent`, at
    /// most `max_steps` steps; the steps committed.
    #[pyo3(signature = (thread, agent, *, max_steps = None))]
    fn step(
        &self,
        py: Python<'_>,
        thread: &str,
        agent: &Bound<'_, PyAny>,
        max_steps: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let mut agent = agent_of(&self.store, agent)?;
        let options = DriveOptions {
            max_steps,
            ..DriveOptions::default()
        };
        self.drive(py, id, options, agent.as_mut())
    }

    /// Resumes thread `thread` (suspended, completed or failed) with
    /// `text` (a suspended thread's answer; for an ended one, what to do
    /// next) and drives it on with `agent`; the steps committed.
    #[pyo3(signature = (thread, agent, text = None, *, max_steps = None))]
    fn resume(
        &self,
        py: Python<'_>,
        thread: &str,
        agent: &Bound<'_, PyAny>,
        text: Option<String>,
        max_steps: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        py.detach(|| self.store.engine().check_resumable(id))
            .or_raise()?;
        if text.is_none() {
            let record = py.detach(|| self.store.threads().get(id)).or_raise()?;
            if let Some(r) = record.filter(|r| r.status == ThreadStatus::Suspended) {
                return Err(err(
                    ErrorKind::Invalid,
                    format!(
                        "thread {id} is suspended: it waits for a human's answer; give it as text (its question: {})",
                        r.suspend_message.as_deref().unwrap_or("none given")
                    ),
                ));
            }
        }
        let mut agent = agent_of(&self.store, agent)?;
        let options = DriveOptions {
            max_steps,
            resume: true,
            resume_text: text,
            ..DriveOptions::default()
        };
        self.drive(py, id, options, agent.as_mut())
    }

    /// Asks the driver of running thread `thread` to stop after the step
    /// in flight; `{"thread", "stop_requested_at"}`.
    fn stop(&self, py: Python<'_>, thread: &str) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let record = py
            .detach(|| self.store.engine().request_stop(id))
            .or_raise()?;
        answer(
            py,
            &uwf_db::api::StopRequested {
                stop_requested_at: record.stop_requested_at.map(uwf_db::api::Timestamp),
                thread: id,
            },
        )
    }

    /// Cancels thread `thread` (it ends with return code 2); `force` even
    /// while a live driver holds it. The end step.
    #[pyo3(signature = (thread, *, force = false))]
    fn cancel(&self, py: Python<'_>, thread: &str, force: bool) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let result = py
            .detach(|| {
                self.store
                    .engine()
                    .cancel_thread(id, &uwf_db::engine::CancelOptions { force })
            })
            .or_raise()?;
        answer(py, &result)
    }

    /// Forks thread `thread` at its head, or at `node` (a hash or prefix
    /// of a node of its chain), or before its latest step of role
    /// `before_role` (one of them at most): a new thread sharing the
    /// history, nothing copied. `{"thread", "forked_from", …}`.
    #[pyo3(signature = (thread, *, node = None, before_role = None))]
    fn fork(
        &self,
        py: Python<'_>,
        thread: &str,
        node: Option<&str>,
        before_role: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let at = match (node, before_role) {
            (None, None) => ForkAt::Head,
            (Some(n), None) => {
                let prefix: uwf_db::HashPrefix = n
                    .parse()
                    .map_err(|e| err(ErrorKind::Invalid, format!("'{n}' is not a hash: {e}")))?;
                ForkAt::Node(self.store.resolve(&prefix).or_raise()?)
            }
            (None, Some(role)) => ForkAt::BeforeRole(role),
            (Some(_), Some(_)) => {
                return Err(err(
                    ErrorKind::Invalid,
                    "give node= or before_role=, not both",
                ));
            }
        };
        let record = py.detach(|| self.store.engine().fork(id, at)).or_raise()?;
        answer(py, &uwf_db::api::ThreadForked::of(id, &record))
    }

    /// Sets labels `set` and removes the keys `remove` of thread
    /// `thread`, in one write; `{"thread", "labels"}`.
    #[pyo3(signature = (thread, set = None, remove = None))]
    fn label(
        &self,
        py: Python<'_>,
        thread: &str,
        set: Option<BTreeMap<String, String>>,
        remove: Option<Vec<String>>,
    ) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let (set, remove) = (set.unwrap_or_default(), remove.unwrap_or_default());
        let record = py
            .detach(|| self.store.threads().set_labels(id, &set, &remove))
            .or_raise()?;
        answer(
            py,
            &uwf_db::api::LabelsSet {
                labels: record.labels,
                thread: id,
            },
        )
    }

    /// Usage (agent calls, tokens, cost, time): of thread `thread` and
    /// its children when given, else of the whole store.
    #[pyo3(signature = (thread = None))]
    fn usage(&self, py: Python<'_>, thread: Option<&str>) -> PyResult<Py<PyAny>> {
        let threads = self.store.threads();
        let totals = match thread {
            None => py.detach(|| threads.usage_totals()).or_raise()?,
            Some(t) => {
                let id = thread_id(t, &self.store)?;
                let tree = py.detach(|| threads.tree(id)).or_raise()?;
                uwf_db::thread::Threads::tree_usage(&tree)
            }
        };
        answer(py, &totals)
    }

    /// Collects garbage: blobs no thread, workflow or pin reaches and
    /// older than `grace_seconds` (default a day) are deleted
    /// (`dry_run`: only counted). The report.
    #[pyo3(signature = (*, grace_seconds = 86400.0, dry_run = false))]
    fn gc(&self, py: Python<'_>, grace_seconds: f64, dry_run: bool) -> PyResult<Py<PyAny>> {
        let grace = std::time::Duration::try_from_secs_f64(grace_seconds).map_err(|_| {
            err(
                ErrorKind::Invalid,
                format!("grace_seconds must be a non-negative number, not {grace_seconds}"),
            )
        })?;
        let options = uwf_db::gc::GcOptions {
            grace,
            dry_run,
            ..uwf_db::gc::GcOptions::default()
        };
        let report = py
            .detach(|| uwf_db::gc::collect_garbage(&self.store, &options, &|_| {}))
            .map_err(|e| raise(ErrorKind::from(&e), &e))?;
        answer(py, &report)
    }

    /// A bundle of threads `threads` (ids or prefixes), their children and
    /// every blob they reach: the bytes `import_` (here or in another
    /// store, or `uwf-db import`) takes.
    fn export(&self, py: Python<'_>, threads: Vec<String>) -> PyResult<Py<PyBytes>> {
        let ids = threads
            .iter()
            .map(|t| thread_id(t, &self.store))
            .collect::<PyResult<Vec<_>>>()?;
        let mut out = Vec::new();
        py.detach(|| uwf_db::bundle::export(&self.store, &ids, &mut out))
            .map_err(|e| raise(ErrorKind::from(&e), &e))?;
        Ok(PyBytes::new(py, &out).unbind())
    }

    /// Imports a bundle (bytes from `export` or `uwf-db export`): checked
    /// whole (a bundle is a stranger's data), then written in one
    /// transaction, all or nothing. `new_ids`: the threads get new ids;
    /// `trust_agents`: keep the agent commands they name. The report.
    #[pyo3(signature = (bundle, *, new_ids = false, trust_agents = false))]
    fn import_(
        &self,
        py: Python<'_>,
        bundle: &[u8],
        new_ids: bool,
        trust_agents: bool,
    ) -> PyResult<Py<PyAny>> {
        use uwf_db::bundle::{BundleError, ImportOptions, MAX_BUNDLE};
        if bundle.len() as u64 > MAX_BUNDLE {
            let e = BundleError::TooLarge {
                size: bundle.len() as u64,
                max: MAX_BUNDLE,
            };
            return Err(raise(ErrorKind::from(&e), &e));
        }
        let mut options = ImportOptions::new_ids(new_ids);
        options.trust_agents = trust_agents;
        let report = py
            .detach(|| uwf_db::bundle::import_with(&self.store, bundle, &options))
            .map_err(|e| raise(ErrorKind::from(&e), &e))?;
        answer(py, &report)
    }

    /// The steps of thread `thread` after step `after` (0: from the
    /// first), oldest first, as they commit: an iterator that ends when
    /// the thread has ended or suspended and every step was given, and
    /// waits meanwhile (Ctrl-C stops it; so does `close()`).
    #[pyo3(signature = (thread, *, after = 0))]
    fn watch(&self, thread: &str, after: u64) -> PyResult<Watch> {
        let id = thread_id(thread, &self.store)?;
        let store = self.store.clone();
        let cancel = Cancel::new();
        let token = cancel.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Watched>(WATCH_BUFFER);
        // The thread ends by itself: at the thread's end, on `close`, or
        // when the iterator is dropped (its sends fail).
        std::thread::Builder::new()
            .name(format!("uwf-watch-{id}"))
            .spawn(move || {
                let end = store.engine().watch_steps(id, after, &token, &mut |e| {
                    let entry = uwf_db::api::LogEntry::read(&store, e)?;
                    Ok(if tx.send(Watched::Step(Box::new(entry))).is_ok() {
                        std::ops::ControlFlow::Continue(())
                    } else {
                        std::ops::ControlFlow::Break(())
                    })
                });
                let _ = tx.send(Watched::End(
                    end.err().map(|e| (ErrorKind::from(&e), e.to_string())),
                ));
            })
            .map_err(|e| err(ErrorKind::Unavailable, format!("cannot start a watch: {e}")))?;
        Ok(Watch {
            rx: std::sync::Mutex::new(rx),
            cancel,
        })
    }

    /// Checks every blob, reference and index entry; the answer lists
    /// the problems (`ok` is true when there are none).
    fn verify(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let report = py
            .detach(|| uwf_db::verify::verify(&self.store, |_| {}))
            .or_raise()?;
        answer(py, &uwf_db::api::VerifyAnswer::from(&report))
    }

    /// Runs one thread of `workflow` per prompt, `jobs` at a time, each
    /// driven to its end (or until it suspends) with `agent`, called from
    /// several threads at once; commits are grouped (durable group
    /// commit). `{"summary": BatchSummary, "items": [BatchItem…]}`, the
    /// items in the order their threads finished. A failed thread is
    /// counted and recorded, not raised.
    #[pyo3(signature = (workflow, prompts, agent, *, jobs = 4, labels = None))]
    fn batch(
        &self,
        py: Python<'_>,
        workflow: &str,
        prompts: Vec<String>,
        agent: &Bound<'_, PyAny>,
        jobs: usize,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Py<PyAny>> {
        if !(1..=256).contains(&jobs) {
            return Err(err(
                ErrorKind::Invalid,
                format!("jobs must be 1 to 256, not {jobs}"),
            ));
        }
        let hash = self.workflow_hash(workflow)?;
        let first = agent_of(&self.store, agent)?;
        let mut agents = Vec::with_capacity(jobs);
        for _ in 1..jobs {
            agents.push(first.fork().ok_or_else(|| {
                err(
                    ErrorKind::Invalid,
                    "this agent cannot drive several threads at once (jobs=1)",
                )
            })?);
        }
        agents.push(first);
        let cancel = Cancel::new();
        let options = BatchOptions {
            labels: labels.unwrap_or_default(),
            cancel: cancel.clone(),
            ..BatchOptions::default()
        };
        let prompts: Vec<BatchPrompt> = prompts.into_iter().map(BatchPrompt::from).collect();
        let engine = self.store.engine();
        let (report, items) = interruptible(py, &cancel, || {
            let mut items = Vec::new();
            let report = engine.run_batch_prompts(
                hash,
                &prompts,
                &options,
                agents,
                &mut |item: &BatchItem| {
                    items.push(item.clone());
                },
            );
            report.map(|r| (r, items))
        })?
        .or_raise()?;
        let d = PyDict::new(py);
        d.set_item(
            "summary",
            answer(
                py,
                &uwf_db::api::BatchSummary::of(report, self.store.durability()),
            )?,
        )?;
        d.set_item("items", answer(py, &items)?)?;
        Ok(d.into_any().unbind())
    }

    /// A thread's summary, by id or unique prefix.
    fn thread(&self, py: Python<'_>, thread: &str) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let record = py
            .detach(|| self.store.threads().get(id))
            .or_raise()?
            .ok_or_else(|| err(ErrorKind::NotFound, format!("no thread matches '{thread}'")))?;
        answer(py, &ThreadSummary::from(&record))
    }

    /// Threads, newest activity first, with the CLI's filters.
    #[pyo3(signature = (*, status = None, workflow = None, labels = None, failed = false, limit = 50))]
    fn threads(
        &self,
        py: Python<'_>,
        status: Option<Vec<String>>,
        workflow: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        failed: bool,
        limit: usize,
    ) -> PyResult<Py<PyAny>> {
        let statuses = status
            .unwrap_or_default()
            .iter()
            .map(|s| {
                s.parse::<ThreadStatus>()
                    .map_err(|e| err(ErrorKind::Invalid, e.to_string()))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let q = ThreadQuery {
            statuses,
            workflow,
            failed_only: failed,
            labels: labels.unwrap_or_default().into_iter().collect(),
            limit,
            ..ThreadQuery::default()
        };
        let records = py.detach(|| self.store.threads().list(&q)).or_raise()?;
        let summaries: Vec<ThreadSummary> = records.iter().map(ThreadSummary::from).collect();
        answer(py, &summaries)
    }

    /// A thread's steps, newest first, at most `limit`: each with its
    /// role, frontmatter and reply.
    #[pyo3(signature = (thread, *, limit = 20))]
    fn log(&self, py: Python<'_>, thread: &str, limit: usize) -> PyResult<Py<PyAny>> {
        let id = thread_id(thread, &self.store)?;
        let store = &self.store;
        let entries = py
            .detach(
                || -> Result<Vec<uwf_db::api::LogEntry>, uwf_db::thread::ThreadError> {
                    store
                        .threads()
                        .log(id, limit, None)?
                        .iter()
                        .map(|e| uwf_db::api::LogEntry::read(store, e))
                        .collect()
                },
            )
            .or_raise()?;
        answer(py, &entries)
    }

    // ---- the primitives of `uwf_db.langgraph` (design §8g): a chain of
    // checkpoint and writes steps per (LangGraph thread, namespace).

    /// The steps of `thread` after step `after_seq`, oldest first:
    /// `(head, seq, [(seq, hash, role, lg, artifacts)])`, `lg` the step's
    /// `lg` frontmatter key (a JSON text) and `artifacts` its reply's.
    #[pyo3(signature = (thread, after_seq = 0))]
    #[allow(clippy::type_complexity)]
    fn _lg_chain(
        &self,
        py: Python<'_>,
        thread: &str,
        after_seq: u64,
    ) -> PyResult<(
        String,
        u64,
        Vec<(u64, String, String, Option<String>, Vec<String>)>,
    )> {
        let id = full_id(thread)?;
        let store = &self.store;
        py.detach(|| {
            let (record, entries) = store.threads().steps_after(id, after_seq, usize::MAX)?;
            let steps = store.read(|r| {
                entries
                    .iter()
                    .map(|e| {
                        let artifacts = match r.get_blob(&e.node.content)? {
                            Some(Blob::Content(c)) => {
                                c.artifacts.iter().map(ToString::to_string).collect()
                            }
                            _ => Vec::new(),
                        };
                        let lg = match e.node.meta.get("lg") {
                            Some(Value::Str(s)) => Some(s.clone()),
                            _ => None,
                        };
                        Ok((
                            e.node.seq,
                            e.hash.to_string(),
                            e.node.role.clone(),
                            lg,
                            artifacts,
                        ))
                    })
                    .collect::<Result<Vec<_>, uwf_db::StoreError>>()
            })?;
            Ok::<_, uwf_db::thread::ThreadError>((record.head.to_string(), record.seq, steps))
        })
        .or_raise()
    }

    /// The hash each text has as a content blob, nothing stored.
    fn _lg_hash_texts(&self, py: Python<'_>, texts: Vec<String>) -> PyResult<Vec<String>> {
        py.detach(|| {
            texts
                .iter()
                .map(|t| {
                    Blob::content(t.as_str(), [])
                        .encode()
                        .map(|e| e.hash().to_string())
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| err(ErrorKind::Invalid, format!("cannot encode a value: {e}")))
    }

    /// The texts of content blobs, in one read; `None` for a missing one.
    fn _lg_get_texts(&self, py: Python<'_>, hashes: Vec<String>) -> PyResult<Vec<Option<String>>> {
        let hashes = hashes
            .iter()
            .map(|h| hash_of(h))
            .collect::<PyResult<Vec<_>>>()?;
        let store = &self.store;
        py.detach(|| {
            store.read(|r| {
                hashes
                    .iter()
                    .map(|h| {
                        Ok(match r.get_blob(h)? {
                            Some(Blob::Content(c)) => Some(c.text),
                            _ => None,
                        })
                    })
                    .collect::<Result<Vec<_>, uwf_db::StoreError>>()
            })
        })
        .or_raise()
    }

    /// Appends a step to `thread` if its head is still `expected_head`
    /// (else `Conflict`, nothing written): role `role`, frontmatter
    /// `{lg: lg}`, reply `reply` naming `artifacts`, stored already or
    /// among `texts`, content blobs stored in the same transaction. The
    /// new `(head, seq)`.
    #[allow(clippy::too_many_arguments)] // a Python method's arguments
    fn _lg_append(
        &self,
        py: Python<'_>,
        thread: &str,
        expected_head: &str,
        role: &str,
        lg: String,
        reply: String,
        artifacts: Vec<String>,
        texts: Vec<String>,
    ) -> PyResult<(String, u64)> {
        let id = full_id(thread)?;
        let expected = hash_of(expected_head)?;
        let artifacts = artifacts
            .iter()
            .map(|h| hash_of(h))
            .collect::<PyResult<Vec<_>>>()?;
        let step = StepWrite {
            role: role.to_owned(),
            meta: [("lg".to_owned(), Value::Str(lg))].into(),
            reply,
            artifacts,
            instruction: LG_INSTRUCTION.to_owned(),
            child_thread: None,
        };
        let store = &self.store;
        let written = py
            .detach(|| {
                let extra: Vec<Blob> = texts
                    .iter()
                    .map(|t| Blob::content(t.as_str(), []))
                    .collect();
                store
                    .threads()
                    .low_level()
                    .append_step_with(id, expected, &extra, step, lg_next())
            })
            .or_raise()?;
        Ok((written.record.head.to_string(), written.record.seq))
    }

    /// Starts a chain of the workflow `langgraph` with `labels`, its id
    /// made from `seed` (so two savers making the same chain at once make
    /// one: the second gets `Conflict`); its id.
    fn _lg_start(
        &self,
        py: Python<'_>,
        prompt: String,
        labels: BTreeMap<String, String>,
        seed: &str,
    ) -> PyResult<String> {
        let workflow_hash = self.workflow_hash("langgraph")?;
        let id = lg_id(seed);
        let new = uwf_db::thread::NewThread {
            workflow: "langgraph".into(),
            workflow_hash,
            prompt,
            max_rounds: 1,
            depth: 0,
            parent_state: None,
            parent_thread: None,
            next_role: "checkpoint".into(),
            next_instruction: LG_INSTRUCTION.into(),
            agent: None,
            cwd: None,
            next_location: None,
            labels,
        };
        let store = &self.store;
        py.detach(|| store.threads().low_level().start_thread_as(new, id, false))
            .map(|r| r.id.to_string())
            .or_raise()
    }

    /// A fork of `thread` at its head carrying `labels`, its id made from
    /// `seed` (`Conflict` if taken); its id.
    fn _lg_fork(
        &self,
        py: Python<'_>,
        thread: &str,
        labels: BTreeMap<String, String>,
        seed: &str,
    ) -> PyResult<String> {
        let id = full_id(thread)?;
        let store = &self.store;
        py.detach(|| {
            let record = store
                .threads()
                .get(id)?
                .ok_or_else(|| uwf_db::thread::ThreadError::Unknown(id.to_string()))?;
            store.threads().low_level().fork_thread_labelled(
                id,
                record.head,
                lg_next(),
                Some(labels),
                Some(lg_id(seed)),
            )
        })
        .map(|r| r.id.to_string())
        .or_raise()
    }

    /// Removes `thread` if its head is still `expected_head` (else
    /// `Conflict`); its nodes stay until GC.
    fn _lg_remove(&self, py: Python<'_>, thread: &str, expected_head: &str) -> PyResult<()> {
        let id = full_id(thread)?;
        let expected = hash_of(expected_head)?;
        let store = &self.store;
        py.detach(|| store.threads().low_level().remove_thread_at(id, expected))
            .or_raise()?;
        Ok(())
    }
}

/// Steps a watch holds before its thread waits for the reader.
const WATCH_BUFFER: usize = 64;

/// What a watch's thread hands over.
enum Watched {
    Step(Box<uwf_db::api::LogEntry>),
    End(Option<(ErrorKind, String)>),
}

/// An iterator over a thread's steps as they commit (`Store.watch`).
#[pyclass(module = "uwf_db._native")]
struct Watch {
    rx: std::sync::Mutex<std::sync::mpsc::Receiver<Watched>>,
    cancel: Cancel,
}

#[pymethods]
impl Watch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next step (a dict, as `log` gives), waiting for it.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            let got = py.detach(|| match self.rx.lock() {
                Ok(rx) => rx.recv_timeout(std::time::Duration::from_millis(100)),
                Err(_) => Err(RecvTimeoutError::Disconnected),
            });
            match got {
                Ok(Watched::Step(entry)) => return answer(py, &entry).map(Some),
                Ok(Watched::End(None)) | Err(RecvTimeoutError::Disconnected) => {
                    self.close();
                    return Ok(None);
                }
                Ok(Watched::End(Some((kind, message)))) => {
                    self.close();
                    return Err(err(kind, message));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.close();
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Stops watching (what was not read yet is dropped).
    fn close(&self) {
        self.cancel.cancel();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The options of a new thread: its labels (the rest as the CLI's defaults).
fn start_options(labels: Option<BTreeMap<String, String>>) -> StartOptions {
    StartOptions {
        labels: labels.unwrap_or_default(),
        ..StartOptions::default()
    }
}

/// Runs `work` (a drive) on a thread of its own while this one, holding
/// no GIL, checks every 50 ms for a signal Python must handle: Ctrl-C
/// cancels the drive (`cancel`), waits for it to stop where it is safe
/// (nothing half-written), and raises `KeyboardInterrupt`. Off the main
/// thread Python delivers no signals, and the drive just runs.
fn interruptible<T: Send>(
    py: Python<'_>,
    cancel: &Cancel,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    std::thread::scope(|scope| {
        let handle = scope.spawn(work);
        let mut interrupted = None;
        while !handle.is_finished() {
            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(50)));
            if interrupted.is_none()
                && let Err(e) = py.check_signals()
            {
                cancel.cancel();
                interrupted = Some(e);
            }
        }
        let out = handle
            .join()
            .map_err(|_| err(ErrorKind::Failed, "the drive panicked"))?;
        match interrupted {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}

/// The instruction every step of a LangGraph chain carries.
const LG_INSTRUCTION: &str = "checkpoint";

/// Where a LangGraph chain stands after each step: idle at `checkpoint`.
fn lg_next() -> Next {
    Next::Role {
        role: "checkpoint".into(),
        instruction: LG_INSTRUCTION.into(),
        location: None,
    }
}

/// The id of a LangGraph chain, from its seed (thread, namespace,
/// generation): time zero (so these ids sort first and read as made, not
/// drawn) and 80 bits of the seed's BLAKE3.
fn lg_id(seed: &str) -> ThreadId {
    let hash = uwf_db::Hash::of(format!("uwf_db.langgraph\0{seed}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes[6..].copy_from_slice(&hash.as_bytes()[..10]);
    ThreadId::from_slice(&bytes).unwrap_or_else(ThreadId::generate)
}

/// A full thread id (no prefix: the saver always has the whole id).
fn full_id(id: &str) -> PyResult<ThreadId> {
    id.parse().map_err(|e| {
        err(
            ErrorKind::Invalid,
            format!("'{id}' is not a thread id: {e}"),
        )
    })
}

/// A hash in hex.
fn hash_of(hex: &str) -> PyResult<uwf_db::Hash> {
    hex.parse()
        .map_err(|e| err(ErrorKind::Invalid, format!("'{hex}' is not a hash: {e}")))
}

/// Where the msgpack value starting at `at` ends, or `None` when it is
/// cut short or malformed. Iterative (a count of values still to skip),
/// so nesting depth costs no stack.
fn msgpack_end(b: &[u8], mut at: usize) -> Option<usize> {
    fn be(b: &[u8], at: usize, n: usize) -> Option<usize> {
        let bytes = b.get(at..at.checked_add(n)?)?;
        Some(
            bytes
                .iter()
                .fold(0usize, |acc, &x| (acc << 8) | usize::from(x)),
        )
    }
    let mut pending: usize = 1;
    while pending > 0 {
        pending -= 1;
        let tag = *b.get(at)?;
        // (bytes of header after the tag, payload length, values inside)
        let (head, len, inside): (usize, usize, usize) = match tag {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0, 0),
            0x80..=0x8f => (0, 0, 2 * usize::from(tag & 0x0f)),
            0x90..=0x9f => (0, 0, usize::from(tag & 0x0f)),
            0xa0..=0xbf => (0, usize::from(tag & 0x1f), 0),
            0xc4 | 0xd9 => (1, be(b, at + 1, 1)?, 0),
            0xc5 | 0xda => (2, be(b, at + 1, 2)?, 0),
            0xc6 | 0xdb => (4, be(b, at + 1, 4)?, 0),
            0xc7 => (2, be(b, at + 1, 1)?, 0),
            0xc8 => (3, be(b, at + 1, 2)?, 0),
            0xc9 => (5, be(b, at + 1, 4)?, 0),
            0xca | 0xce | 0xd2 => (4, 0, 0),
            0xcb | 0xcf | 0xd3 => (8, 0, 0),
            0xcc | 0xd0 => (1, 0, 0),
            0xcd | 0xd1 => (2, 0, 0),
            0xd4 => (2, 0, 0),
            0xd5 => (3, 0, 0),
            0xd6 => (5, 0, 0),
            0xd7 => (9, 0, 0),
            0xd8 => (17, 0, 0),
            0xdc => (2, 0, be(b, at + 1, 2)?),
            0xdd => (4, 0, be(b, at + 1, 4)?),
            0xde => (2, 0, 2 * be(b, at + 1, 2)?),
            0xdf => (4, 0, 2usize.checked_mul(be(b, at + 1, 4)?)?),
            0xc1 => return None,
        };
        at = at.checked_add(1 + head)?.checked_add(len)?;
        if at > b.len() {
            return None;
        }
        pending = pending.checked_add(inside)?;
        // Every value is at least one byte: a count past what is left is a lie.
        if pending > b.len() - at {
            return None;
        }
    }
    Some(at)
}

/// The elements of a msgpack array, each its own bytes, or `None` when
/// `data` is not exactly one well-formed array.
#[pyfunction]
fn _lg_split(py: Python<'_>, data: &[u8]) -> Option<Vec<Py<PyBytes>>> {
    let tag = *data.first()?;
    let (mut at, n) = match tag {
        0x90..=0x9f => (1, usize::from(tag & 0x0f)),
        0xdc => (
            3,
            usize::from(u16::from_be_bytes(data.get(1..3)?.try_into().ok()?)),
        ),
        0xdd => (
            5,
            usize::try_from(u32::from_be_bytes(data.get(1..5)?.try_into().ok()?)).ok()?,
        ),
        _ => return None,
    };
    if n > data.len() {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let end = msgpack_end(data, at)?;
        out.push(PyBytes::new(py, &data[at..end]).unbind());
        at = end;
    }
    (at == data.len()).then_some(out)
}

impl Store {
    /// Drives `id` with `agent` under `options`, interruptible by Ctrl-C.
    fn drive(
        &self,
        py: Python<'_>,
        id: ThreadId,
        mut options: DriveOptions,
        agent: &mut dyn Agent,
    ) -> PyResult<Py<PyAny>> {
        let cancel = Cancel::new();
        options.cancel = cancel.clone();
        let engine = self.store.engine();
        let steps = interruptible(py, &cancel, || {
            engine.drive(id, &options, agent).into_result()
        })?
        .or_raise()?;
        answer(py, &steps)
    }

    fn workflow_hash(&self, name: &str) -> PyResult<uwf_db::Hash> {
        match self.store.workflows().by_name(name).or_raise()? {
            Some((hash, _)) => Ok(hash),
            None => Err(err(
                ErrorKind::NotFound,
                format!("no workflow named '{name}' (add it first)"),
            )),
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Store>()?;
    m.add_class::<Watch>()?;
    m.add_function(wrap_pyfunction!(_lg_split, m)?)?;
    m.add("UwfError", py.get_type::<UwfError>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("Ambiguous", py.get_type::<Ambiguous>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("Conflict", py.get_type::<Conflict>())?;
    m.add("TooLarge", py.get_type::<TooLarge>())?;
    m.add("StepFailed", py.get_type::<StepFailed>())?;
    m.add("Damaged", py.get_type::<Damaged>())?;
    m.add("Corrupt", py.get_type::<Corrupt>())?;
    m.add("StoreFull", py.get_type::<StoreFull>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("Interrupted", py.get_type::<Interrupted>())?;
    Ok(())
}
