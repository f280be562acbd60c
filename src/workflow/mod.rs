//! Workflows: the YAML model, validation, templates, routing, and the
//! registry of workflows by name (`workflows` database).

pub mod draw;
pub mod model;
mod parse;
mod retry;
pub mod template;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use model::{Branch, Compact, Edge, FanOut, Foreach, Role, Workflow};
pub use parse::{Problem, parse_workflow, parse_workflow_file, workflow_name_of};
pub use retry::{
    DEFAULT_BACKOFF, DEFAULT_MAX_DELAY, DEFAULT_ON, MAX_ATTEMPTS, RetryOn, RetryOverride,
    RetryPolicy,
};

use crate::backend::{Direction, KeyRange, Table};
use crate::hash::Hash;
use crate::node::{Blob, Value, WorkflowNode};
use crate::store::{Store, StoreError};
use crate::thread::{EndSpec, Next};
use template::{TemplateError, Templates};

/// The workflow layer of one store: stored definitions by name and
/// hash. A cheap borrow: get one with [`Store::workflows`].
///
/// ```
/// let store = uwf_db::Store::memory();
/// assert!(store.workflows().list()?.is_empty());
/// # Ok::<(), uwf_db::workflow::WorkflowError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Workflows<'s> {
    store: &'s Store,
}

impl<'s> Workflows<'s> {
    /// The workflow layer of `store` (the same as [`Store::workflows`]).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// assert!(uwf_db::Workflows::new(&store).list()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: &'s Store) -> Workflows<'s> {
        Workflows { store }
    }
}

impl Store {
    /// The workflow layer of this store: see [`Workflows`].
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// assert!(store.workflows().by_name("review")?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn workflows(&self) -> Workflows<'_> {
        Workflows::new(self)
    }
}

/// What went wrong with a workflow.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkflowError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The YAML failed validation.
    #[error("workflow {source_name} is invalid ({} problem{}):\n{}", problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The file or name.
        source_name: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
    /// No workflow registered under this name (and no blob with this hash).
    #[error("no workflow named '{0}' is registered (uwf-db workflow add FILE registers one)")]
    Unknown(String),
    /// A stored workflow blob does not hold a workflow.
    #[error("blob {hash} is not a valid stored workflow: {detail}")]
    Corrupt {
        /// The blob.
        hash: Hash,
        /// What is wrong.
        detail: String,
    },
    /// The agent's `$status` has no edge.
    #[error("role '{role}' answered status '{status}', which has no edge (allowed: {})", allowed.join(", "))]
    UnknownStatus {
        /// The role.
        role: String,
        /// The status given.
        status: String,
        /// The statuses with edges.
        allowed: Vec<String>,
    },
    /// A role with no graph node.
    #[error("role '{0}' is not in the workflow graph")]
    UnknownRole(String),
    /// A prompt failed to render.
    #[error("the edge {role} → {target}: {source}")]
    Template {
        /// The role the edge leaves.
        role: String,
        /// The edge target.
        target: String,
        /// The template error.
        source: TemplateError,
    },
}

impl WorkflowError {
    /// Whether the error says the store's data file is damaged
    /// ([`StoreError::is_damage`]).
    pub fn is_damage(&self) -> bool {
        matches!(self, WorkflowError::Store(e) if e.is_damage())
    }
}

impl From<crate::backend::BackendError> for WorkflowError {
    fn from(e: crate::backend::BackendError) -> Self {
        WorkflowError::Store(e.into())
    }
}

/// The status a step's frontmatter selects: `$status`, or `_` when absent.
pub fn status_of(meta: &BTreeMap<String, Value>) -> String {
    match meta.get("$status") {
        Some(Value::Str(s)) => s.clone(),
        Some(other) => other.to_json().to_string(),
        None => model::DEFAULT_STATUS.to_owned(),
    }
}

/// Longest suspend message taken from a reply's body: 4 KiB.
const MAX_SUSPEND_REASON: usize = 4 << 10;

/// What a reply of `$status: $SUSPEND` tells the human: its `reason` (or
/// `message`) when that is text, else its body (cut to 4 KiB), else a
/// sentence naming the role.
fn suspend_reason(role: &str, meta: &BTreeMap<String, Value>, body: &str) -> String {
    for key in ["reason", "message"] {
        if let Some(Value::Str(s)) = meta.get(key)
            && !s.trim().is_empty()
        {
            return s.clone();
        }
    }
    let body = body.trim();
    if body.is_empty() {
        return format!("role '{role}' suspended the thread and waits for an answer");
    }
    let mut end = body.len().min(MAX_SUSPEND_REASON);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body.get(..end).unwrap_or_default().to_owned()
}

impl Workflow {
    /// Where a step of `role` with frontmatter `meta` leads, with the edge
    /// prompt rendered from `meta`: a role, a suspend (the answering role
    /// runs again on resume), or an end with return code 0 whose summary and
    /// prompt are the rendered `$END` prompt. An unknown status is an error
    /// (the step must not be committed).
    pub fn route(&self, role: &str, meta: &BTreeMap<String, Value>) -> Result<Next, WorkflowError> {
        self.route_in(None, role, meta, "")
    }

    /// [`Workflow::route`] for a reply whose body is `body`: the edge
    /// prompt may use it as `{{_body}}`.
    pub fn route_reply(
        &self,
        role: &str,
        meta: &BTreeMap<String, Value>,
        body: &str,
    ) -> Result<Next, WorkflowError> {
        self.route_in(None, role, meta, body)
    }

    /// [`Workflow::route`] rendering with a store's compiled templates.
    pub(crate) fn route_in(
        &self,
        templates: Option<&Templates>,
        role: &str,
        meta: &BTreeMap<String, Value>,
        body: &str,
    ) -> Result<Next, WorkflowError> {
        let edges = self
            .graph
            .get(role)
            .ok_or_else(|| WorkflowError::UnknownRole(role.to_owned()))?;
        let status = status_of(meta);
        if status == model::SUSPEND && !edges.contains_key(&status) {
            // The reference's suspend without a graph edge (SPEC §13):
            // the answering role runs again on resume.
            return Ok(Next::Suspend {
                role: role.to_owned(),
                message: suspend_reason(role, meta, body),
            });
        }
        let edge = edges
            .get(&status)
            .ok_or_else(|| WorkflowError::UnknownStatus {
                role: role.to_owned(),
                status: status.clone(),
                allowed: edges.keys().cloned().collect(),
            })?;
        let data = ReplyData { meta, body };
        let text = render_in(templates, &edge.prompt, &data).map_err(|source| {
            WorkflowError::Template {
                role: role.to_owned(),
                target: edge.role.clone(),
                source,
            }
        })?;
        Ok(match edge.role.as_str() {
            model::END => Next::End(EndSpec {
                return_code: 0,
                summary: text.clone(),
                prompt: text,
            }),
            model::SUSPEND => Next::Suspend {
                role: role.to_owned(),
                message: text,
            },
            next => Next::Role {
                role: next.to_owned(),
                instruction: text,
                location: edge_location(templates, role, edge, &data)?,
            },
        })
    }

    /// The first role and its instruction (the `$START` edge).
    pub fn first(&self) -> Result<(String, String), WorkflowError> {
        self.first_in(None)
    }

    /// [`Workflow::first`] rendering with a store's compiled templates.
    pub(crate) fn first_in(
        &self,
        templates: Option<&Templates>,
    ) -> Result<(String, String), WorkflowError> {
        let edge = self
            .start_edge()
            .ok_or_else(|| WorkflowError::UnknownRole(model::START.to_owned()))?;
        Self::start_text(templates, edge)
    }

    /// Where a completed or failed thread's resume starts: the
    /// `$START.resume` edge's role and prompt, or, without one, the
    /// `$START` entry edge's (SPEC §4).
    pub fn first_on_resume(&self) -> Result<(String, String), WorkflowError> {
        self.resume_in(None)
    }

    /// [`Workflow::first_on_resume`] rendering with a store's compiled
    /// templates.
    pub(crate) fn resume_in(
        &self,
        templates: Option<&Templates>,
    ) -> Result<(String, String), WorkflowError> {
        match self.resume_edge() {
            Some(edge) => Self::start_text(templates, edge),
            None => self.first_in(templates),
        }
    }

    /// The rendered `location` of the `$START` entry edge (`resume`: of the
    /// edge a resume of an ended thread follows), if it has one.
    pub(crate) fn start_location_in(
        &self,
        templates: Option<&Templates>,
        resume: bool,
    ) -> Result<Option<String>, WorkflowError> {
        let edge = match (resume, self.resume_edge()) {
            (true, Some(edge)) => Some(edge),
            _ => self.start_edge(),
        };
        match edge {
            Some(edge) => edge_location(templates, model::START, edge, &serde_json::json!({})),
            None => Ok(None),
        }
    }

    /// A `$START` edge's role and rendered prompt (no variables).
    fn start_text(
        templates: Option<&Templates>,
        edge: &model::Edge,
    ) -> Result<(String, String), WorkflowError> {
        let text =
            render_in(templates, &edge.prompt, &serde_json::json!({})).map_err(|source| {
                WorkflowError::Template {
                    role: model::START.into(),
                    target: edge.role.clone(),
                    source,
                }
            })?;
        Ok((edge.role.clone(), text))
    }

    /// The definition as a `workflow` blob.
    pub fn to_blob(&self) -> Result<Blob, WorkflowError> {
        let json = serde_json::to_value(self).map_err(|e| WorkflowError::Corrupt {
            hash: Hash::from_bytes([0; 32]),
            detail: e.to_string(),
        })?;
        Ok(Blob::Workflow(WorkflowNode {
            definition: Value::from_json(&json),
        }))
    }

    /// Reads a definition back from its blob.
    pub fn from_blob(hash: Hash, blob: &Blob) -> Result<Workflow, WorkflowError> {
        let corrupt = |detail: String| WorkflowError::Corrupt { hash, detail };
        match blob {
            Blob::Workflow(w) => {
                serde_json::from_value(w.definition.to_json()).map_err(|e| corrupt(e.to_string()))
            }
            other => Err(corrupt(format!("it is a {} blob", other.kind()))),
        }
    }
}

/// An edge's `location`, rendered with `data`; `None` when it has none or
/// it renders to nothing but whitespace.
fn edge_location(
    templates: Option<&Templates>,
    from: &str,
    edge: &model::Edge,
    data: &impl serde::Serialize,
) -> Result<Option<String>, WorkflowError> {
    let Some(template) = &edge.location else {
        return Ok(None);
    };
    let text = render_in(templates, template, data).map_err(|source| WorkflowError::Template {
        role: from.to_owned(),
        target: edge.role.clone(),
        source,
    })?;
    Ok(Some(text).filter(|t| !t.trim().is_empty()))
}

/// What an edge prompt is rendered with: the reply's frontmatter, and its
/// body as `_body`.
#[derive(serde::Serialize)]
struct ReplyData<'a> {
    #[serde(flatten)]
    meta: &'a BTreeMap<String, Value>,
    #[serde(rename = "_body")]
    body: &'a str,
}

/// Renders with `templates` when given, else compiles for this one call.
fn render_in(
    templates: Option<&Templates>,
    template: &str,
    data: &impl serde::Serialize,
) -> Result<String, TemplateError> {
    match templates {
        Some(t) => t.render(template, data),
        None => template::render(template, data),
    }
}

impl Workflows<'_> {
    /// Stores a validated workflow and points its name at it. Returns the
    /// blob's hash and whether the name moved (identical content: no-op).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// let (hash, changed) = store.workflows().add(&wf)?;
    /// assert!(changed);
    /// assert_eq!(store.workflows().add(&wf)?, (hash, false)); // the same definition again
    /// # Ok::<(), uwf_db::workflow::WorkflowError>(())
    /// ```
    pub fn add(&self, wf: &Workflow) -> Result<(Hash, bool), WorkflowError> {
        let blob = wf.to_blob()?;
        let changed = self.store.write(|w| {
            let hash = w.put_blob(&blob)?;
            let t = w.tables_mut();
            let old = t.get(Table::Workflows, wf.name.as_bytes())?;
            if old.as_deref() == Some(hash.as_bytes()) {
                return Ok::<_, WorkflowError>((hash, false));
            }
            drop(old);
            t.put(Table::Workflows, wf.name.as_bytes(), hash.as_bytes())?;
            Ok((hash, true))
        })?;
        Ok(changed)
    }

    /// The registered workflow with this name.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// let (hash, _) = store.workflows().add(&wf)?;
    /// let (found, loaded) = store.workflows().by_name("two")?.ok_or("not registered")?;
    /// assert_eq!((found, loaded.name.as_str()), (hash, "two"));
    /// assert!(store.workflows().by_name("three")?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn by_name(&self, name: &str) -> Result<Option<(Hash, Arc<Workflow>)>, WorkflowError> {
        let hash = self.store.read(|r| {
            let v = r.tables().get(Table::Workflows, name.as_bytes())?;
            Ok::<_, StoreError>(v.as_deref().and_then(Hash::from_slice))
        })?;
        match hash {
            None => Ok(None),
            Some(h) => Ok(Some((h, self.load(h)?))),
        }
    }

    /// A stored workflow by hash.
    ///
    /// Workflows are content-addressed and immutable, so decoded ones are
    /// cached per hash for this store (in its layer slots).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// let (hash, _) = store.workflows().add(&wf)?;
    /// assert_eq!(*store.workflows().load(hash)?, wf);
    /// # Ok::<(), uwf_db::workflow::WorkflowError>(())
    /// ```
    pub fn load(&self, hash: Hash) -> Result<Arc<Workflow>, WorkflowError> {
        let cache = &self.store.layer_state::<Decoded>().0;
        if let Some(wf) = cache.get(&hash) {
            return Ok(wf);
        }
        let blob = self
            .store
            .get(&hash)?
            .ok_or_else(|| WorkflowError::Unknown(hash.to_string()))?;
        let wf = Arc::new(Workflow::from_blob(hash, &blob)?);
        cache.insert(hash, Arc::clone(&wf));
        Ok(wf)
    }

    /// Registered workflows: name and hash, by name.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// let (hash, _) = store.workflows().add(&wf)?;
    /// assert_eq!(store.workflows().list()?, vec![("two".to_owned(), hash)]);
    /// # Ok::<(), uwf_db::workflow::WorkflowError>(())
    /// ```
    pub fn list(&self) -> Result<Vec<(String, Hash)>, WorkflowError> {
        Ok(self.store.read(|r| {
            let mut out = Vec::new();
            for entry in r
                .tables()
                .range(Table::Workflows, KeyRange::ALL, Direction::Forward)?
            {
                let (k, v) = entry?;
                if let (Ok(name), Some(h)) = (std::str::from_utf8(&k), Hash::from_slice(&v)) {
                    out.push((name.to_owned(), h));
                }
            }
            Ok::<_, StoreError>(out)
        })?)
    }
}

/// Decoded workflows by blob hash, kept per store in its layer slots.
pub(crate) struct Decoded(crate::cache::Bounded<Hash, Arc<Workflow>>);

impl Default for Decoded {
    fn default() -> Self {
        Decoded(crate::cache::Bounded::new(4096))
    }
}
