//! Reading workflow YAML and validating it, collecting every problem with its
//! YAML path and, where the parser gives it, its line and column.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::model::{
    BODY_VARIABLE, Compact, DEFAULT_MAX_ROUNDS, DEFAULT_STATUS, END, Edge, FORMAT_VERSION, RESUME,
    Role, START, START_NEW, SUSPEND, Workflow,
};
use super::retry::RetrySrc;
use super::template;
use crate::thread::END_ROLE;

/// One validation problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Problem {
    /// Where, as a YAML path (`graph.reviewer.approved.role`).
    pub path: String,
    /// 1-based line, when known.
    pub line: Option<u32>,
    /// 1-based column, when known.
    pub column: Option<u32>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{l}:{c}: {}: {}", self.path, self.message),
            _ => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

type Extra = BTreeMap<String, serde_json::Value>;

/// `graph` as written: node → status → edge, each with its position.
type GraphSrc = BTreeMap<String, Spanned<BTreeMap<String, Spanned<EdgeSrc>>>>;

#[derive(Deserialize)]
struct WorkflowSrc {
    /// The reference's format version: absent, or 1.
    version: Option<Spanned<serde_json::Value>>,
    name: Option<Spanned<String>>,
    description: Option<String>,
    #[serde(rename = "maxRounds")]
    max_rounds: Option<Spanned<i64>>,
    compact: Option<Spanned<CompactSrc>>,
    roles: Option<BTreeMap<String, Spanned<RoleSrc>>>,
    graph: Option<GraphSrc>,
    retry: Option<Spanned<RetrySrc>>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct CompactSrc {
    every: Option<i64>,
    prompt: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct RoleSrc {
    description: Option<String>,
    goal: Option<String>,
    #[serde(default)]
    capabilities: Vec<String>,
    procedure: Option<String>,
    output: Option<String>,
    frontmatter: Option<serde_json::Value>,
    workflow: Option<String>,
    model: Option<String>,
    #[serde(rename = "allowedTools", default)]
    allowed_tools: Vec<String>,
    retry: Option<Spanned<RetrySrc>>,
    foreach: Option<Spanned<ForeachSrc>>,
    parallel: Option<Spanned<BTreeMap<String, BranchSrc>>>,
    join: Option<Spanned<JoinSrc>>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct ForeachSrc {
    items: Option<String>,
    #[serde(rename = "as")]
    as_name: Option<String>,
    workflow: Option<String>,
    prompt: Option<String>,
    max_items: Option<i64>,
    max_concurrency: Option<i64>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct BranchSrc {
    workflow: Option<String>,
    prompt: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct JoinSrc {
    on_failure: Option<String>,
    tolerate: Option<i64>,
    #[serde(flatten)]
    extra: Extra,
}

/// Default and largest `max_items` of a `foreach:`.
const DEFAULT_MAX_ITEMS: u32 = 1000;
const LARGEST_MAX_ITEMS: u32 = 10_000;
/// Default and largest `max_concurrency` (and most `parallel:` branches).
const DEFAULT_CONCURRENCY: u32 = 4;
const LARGEST_CONCURRENCY: u32 = 64;

/// A role's `foreach:` or `parallel:` with its `join:` (at `path`); every
/// problem recorded. `None` for a role with neither.
fn check_fan_out(
    path: &str,
    r: &Spanned<RoleSrc>,
    is_registered: &dyn Fn(&str) -> bool,
    p: &mut Problems,
) -> Option<super::model::FanOut> {
    use super::model::{Branch, FanOut, Foreach};
    let v = &r.value;
    if v.foreach.is_none() && v.parallel.is_none() {
        if v.join.is_some() {
            p.at(
                format!("{path}.join"),
                Some(r),
                "join: closes a foreach: or parallel:, and this role has neither",
            );
        }
        return None;
    }
    if v.foreach.is_some() && v.parallel.is_some() {
        p.at(path, Some(r), "a role has foreach: or parallel:, not both");
    }
    for (key, set) in [
        ("workflow", v.workflow.is_some()),
        ("frontmatter", v.frontmatter.is_some()),
        ("retry", v.retry.is_some()),
    ] {
        if set {
            p.at(
                format!("{path}.{key}"),
                Some(r),
                format!("a fan-out role calls no agent itself and has no {key}: (its children's workflows do)"),
            );
        }
    }
    let mut foreach = None;
    let mut branches = Vec::new();
    let mut concurrency = DEFAULT_CONCURRENCY;
    if let Some(f) = &v.foreach {
        let fp = format!("{path}.foreach");
        let workflow = child_workflow(
            format!("{fp}.workflow"),
            &f.value.workflow,
            f,
            is_registered,
            p,
        );
        p.unknown_keys(
            &fp,
            Some(f),
            &f.value.extra,
            "items, as, workflow, prompt, max_items, max_concurrency",
        );
        let items = f.value.items.clone().unwrap_or_else(|| {
            p.at(
                format!("{fp}.items"),
                Some(f),
                "missing: the frontmatter key of the previous reply that holds the list",
            );
            String::new()
        });
        let as_name = f.value.as_name.clone().unwrap_or_else(|| "item".to_owned());
        if as_name.is_empty() || as_name.contains(['.', ' ', '{', '}']) || as_name == "index" {
            p.at(
                format!("{fp}.as"),
                Some(f),
                format!("'{as_name}' cannot name the item (a plain name other than 'index')"),
            );
        }
        let prompt = f.value.prompt.clone().unwrap_or_default();
        check_child_prompt(&format!("{fp}.prompt"), &prompt, f, p);
        let mut bounded = |key: &str, value: Option<i64>, default: u32, largest: u32| -> u32 {
            match value.map(u32::try_from) {
                None => default,
                Some(Ok(n)) if (1..=largest).contains(&n) => n,
                Some(_) => {
                    p.at(
                        format!("{fp}.{key}"),
                        Some(f),
                        format!("must be a whole number from 1 to {largest}"),
                    );
                    default
                }
            }
        };
        let max_items = bounded(
            "max_items",
            f.value.max_items,
            DEFAULT_MAX_ITEMS,
            LARGEST_MAX_ITEMS,
        );
        concurrency = bounded(
            "max_concurrency",
            f.value.max_concurrency,
            DEFAULT_CONCURRENCY,
            LARGEST_CONCURRENCY,
        );
        foreach = Some(Foreach {
            items,
            as_name,
            workflow,
            prompt,
            max_items,
        });
    }
    if let Some(par) = &v.parallel {
        let pp = format!("{path}.parallel");
        if par.value.is_empty() || par.value.len() > LARGEST_CONCURRENCY as usize {
            p.at(
                &pp,
                Some(par),
                format!("needs 1 to {LARGEST_CONCURRENCY} named branches"),
            );
        }
        for (key, b) in &par.value {
            let bp = format!("{pp}.{key}");
            p.unknown_keys(&bp, Some(par), &b.extra, "workflow, prompt");
            let workflow =
                child_workflow(format!("{bp}.workflow"), &b.workflow, par, is_registered, p);
            let prompt = b.prompt.clone().unwrap_or_default();
            check_child_prompt(&format!("{bp}.prompt"), &prompt, par, p);
            branches.push(Branch {
                key: key.clone(),
                workflow,
                prompt,
            });
        }
        concurrency = u32::try_from(branches.len().max(1)).unwrap_or(LARGEST_CONCURRENCY);
    }
    let (mut tolerate, mut fail_fast) = (0, true);
    if let Some(j) = &v.join {
        let jp = format!("{path}.join");
        p.unknown_keys(&jp, Some(j), &j.value.extra, "on_failure, tolerate");
        match j.value.on_failure.as_deref() {
            None | Some("fail_fast") => {}
            Some("continue") => {
                fail_fast = false;
                tolerate = u32::MAX;
            }
            Some(other) => p.at(
                format!("{jp}.on_failure"),
                Some(j),
                format!("'{other}' is not a failure policy (fail_fast or continue)"),
            ),
        }
        if let Some(n) = j.value.tolerate {
            match u32::try_from(n) {
                Ok(n) if fail_fast => tolerate = n,
                Ok(_) => p.at(
                    format!("{jp}.tolerate"),
                    Some(j),
                    "on_failure: continue already tolerates every failure",
                ),
                Err(_) => p.at(
                    format!("{jp}.tolerate"),
                    Some(j),
                    format!("must be a whole number, got {n}"),
                ),
            }
        }
    }
    Some(FanOut {
        foreach,
        branches,
        max_concurrency: concurrency,
        tolerate,
        fail_fast,
    })
}

/// A fan-out child's workflow name: given and registered.
fn child_workflow<T>(
    at: String,
    name: &Option<String>,
    span: &Spanned<T>,
    is_registered: &dyn Fn(&str) -> bool,
    p: &mut Problems,
) -> String {
    match name {
        Some(n) if is_registered(n) => n.clone(),
        Some(n) => {
            p.at(
                at,
                Some(span),
                format!("child workflow '{n}' is not registered (uwf-db workflow add it first)"),
            );
            n.clone()
        }
        None => {
            p.at(at, Some(span), "missing: the child workflow's name");
            String::new()
        }
    }
}

/// A child's task template: present and parseable.
fn check_child_prompt<T>(path: &str, prompt: &str, span: &Spanned<T>, p: &mut Problems) {
    if prompt.trim().is_empty() {
        p.at(
            path,
            Some(span),
            "missing or empty: the child's task template",
        );
    } else if let Err(e) = template::variables(prompt) {
        p.at(path, Some(span), e.to_string());
    }
}

#[derive(Deserialize)]
struct EdgeSrc {
    role: Option<String>,
    prompt: Option<String>,
    location: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

struct Problems(Vec<Problem>);

impl Problems {
    fn at<T>(
        &mut self,
        path: impl Into<String>,
        span: Option<&Spanned<T>>,
        message: impl Into<String>,
    ) {
        self.0.push(Problem {
            path: path.into(),
            line: span.map(|s| s.referenced.line() as u32).filter(|l| *l > 0),
            column: span
                .map(|s| s.referenced.column() as u32)
                .filter(|c| *c > 0),
            message: message.into(),
        });
    }
    fn unknown_keys<T>(
        &mut self,
        path: &str,
        span: Option<&Spanned<T>>,
        extra: &Extra,
        allowed: &str,
    ) {
        for k in extra.keys() {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            self.at(p, span, format!("unknown key '{k}' (allowed: {allowed})"));
        }
    }
}

/// Parses and validates workflow YAML. `expected_name` is the file stem, if
/// the YAML came from a file; `is_registered` says whether a child workflow
/// named by a `workflow:` role exists.
pub fn parse_workflow(
    yaml: &str,
    expected_name: Option<&str>,
    is_registered: &dyn Fn(&str) -> bool,
) -> Result<Workflow, Vec<Problem>> {
    parse_with(
        yaml,
        expected_name,
        is_registered,
        crate::yaml::options(),
        false,
    )
}

/// The name a workflow file must have: its stem, or for `NAME/index.yaml`
/// (or `.yml`) its folder's name.
///
/// ```
/// use std::path::Path;
/// use uwf_db::workflow::workflow_name_of;
///
/// assert_eq!(workflow_name_of(Path::new("flows/review.yaml")).as_deref(), Some("review"));
/// assert_eq!(workflow_name_of(Path::new("flows/triage/index.yaml")).as_deref(), Some("triage"));
/// ```
pub fn workflow_name_of(file: &std::path::Path) -> Option<String> {
    let stem = file.file_stem()?.to_str()?;
    if stem == "index"
        && let Some(folder) = file
            .canonicalize()
            .ok()
            .as_deref()
            .unwrap_or(file)
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
    {
        return Some(folder.to_owned());
    }
    Some(stem.to_owned())
}

/// Parses and validates the workflow YAML `yaml` read from `file`:
/// `!include PATH` takes another file's YAML (resolved against the
/// including file's folder, never outside `file`'s folder; see
/// [`crate::yaml::options_for_file`]), the name must be
/// [`workflow_name_of`] the file, and a workflow at `NAME/index.yaml` may
/// leave `name:` out and take its folder's name.
pub fn parse_workflow_file(
    yaml: &str,
    file: &std::path::Path,
    is_registered: &dyn Fn(&str) -> bool,
) -> Result<Workflow, Vec<Problem>> {
    let options = crate::yaml::options_for_file(file).map_err(|e| {
        vec![Problem {
            path: "(document)".into(),
            line: None,
            column: None,
            message: format!("cannot read the workflow's folder for !include: {e}"),
        }]
    })?;
    let name = workflow_name_of(file);
    let is_index = file.file_stem().is_some_and(|s| s == "index");
    parse_with(yaml, name.as_deref(), is_registered, options, is_index)
}

/// [`parse_workflow`] with YAML `options`; `name_from_file`: a missing
/// `name:` is `expected_name`.
fn parse_with(
    yaml: &str,
    expected_name: Option<&str>,
    is_registered: &dyn Fn(&str) -> bool,
    options: serde_saphyr::Options,
    name_from_file: bool,
) -> Result<Workflow, Vec<Problem>> {
    let src: WorkflowSrc = crate::yaml::from_str_with(yaml, options).map_err(|e| {
        let loc = e.location();
        vec![Problem {
            path: "(document)".into(),
            line: loc.map(|l| l.line() as u32),
            column: loc.map(|l| l.column() as u32),
            message: format!(
                "not a valid workflow YAML document: {}",
                first_line(&e.to_string())
            ),
        }]
    })?;
    let mut src = src;
    if name_from_file && src.name.is_none() {
        src.name = expected_name.map(|n| Spanned {
            value: n.to_owned(),
            referenced: serde_saphyr::Location::UNKNOWN,
            defined: serde_saphyr::Location::UNKNOWN,
        });
    }
    let mut p = Problems(Vec::new());
    let (name, max_rounds, compact) = check_header(&src, expected_name, &mut p);
    let roles_src = src.roles.unwrap_or_default();
    let roles = check_roles(&roles_src, is_registered, &mut p);
    let graph_src = src.graph.unwrap_or_default();
    check_start(&graph_src, &mut p);
    let mut graph: BTreeMap<String, BTreeMap<String, Edge>> = BTreeMap::new();
    for (from, edges) in &graph_src {
        if let Some(out) = check_node(from, edges, &roles, &mut p) {
            graph.insert(from.clone(), out);
        }
    }
    check_reachable(&graph, &roles, &roles_src, &mut p);
    let retry = check_retry("retry", src.retry.as_ref(), &mut p);
    if p.0.is_empty() {
        Ok(Workflow {
            compact,
            description: src.description,
            graph,
            max_rounds,
            name,
            roles,
            retry,
        })
    } else {
        p.0.sort_by_key(|x| (x.line.unwrap_or(u32::MAX), x.column.unwrap_or(0)));
        Err(p.0)
    }
}

/// The top-level keys: unknown ones, the format version, the name, `maxRounds`
/// and `compact`.
fn check_header(
    src: &WorkflowSrc,
    expected_name: Option<&str>,
    p: &mut Problems,
) -> (String, u32, Option<Compact>) {
    p.unknown_keys::<()>(
        "",
        None,
        &src.extra,
        "version, name, description, maxRounds, compact, retry, roles, graph",
    );
    if let Some(v) = &src.version
        && v.value != serde_json::json!(FORMAT_VERSION)
    {
        p.at(
            "version",
            Some(v),
            format!(
                "unsupported workflow format version {} (this uwf-db reads version {FORMAT_VERSION}, or files without a version)",
                v.value
            ),
        );
    }

    let name = match &src.name {
        None => {
            p.at::<()>("name", None, "missing: the workflow needs a name");
            String::new()
        }
        Some(n) => {
            if let Some(stem) = expected_name
                && n.value != stem
            {
                p.at(
                    "name",
                    Some(n),
                    format!("'{}' must match the file stem '{stem}'", n.value),
                );
            }
            if n.value.trim().is_empty() {
                p.at("name", Some(n), "must not be empty");
            }
            n.value.clone()
        }
    };
    let max_rounds = match &src.max_rounds {
        None => DEFAULT_MAX_ROUNDS,
        Some(m) => match u32::try_from(m.value) {
            Ok(v) if v > 0 => v,
            _ => {
                p.at(
                    "maxRounds",
                    Some(m),
                    format!("must be a positive integer, got {}", m.value),
                );
                DEFAULT_MAX_ROUNDS
            }
        },
    };
    let compact = src.compact.as_ref().and_then(|c| {
        p.unknown_keys("compact", Some(c), &c.value.extra, "every, prompt");
        match c.value.every.map(u32::try_from) {
            Some(Ok(every)) if every > 0 => Some(Compact {
                every,
                prompt: c.value.prompt.clone(),
            }),
            _ => {
                p.at("compact.every", Some(c), "must be a positive integer");
                None
            }
        }
    });
    (name, max_rounds, compact)
}

/// The roles: reserved names, unknown keys, child workflows, frontmatter
/// schemas.
fn check_roles(
    roles_src: &BTreeMap<String, Spanned<RoleSrc>>,
    is_registered: &dyn Fn(&str) -> bool,
    p: &mut Problems,
) -> BTreeMap<String, Role> {
    let mut roles = BTreeMap::new();
    if roles_src.is_empty() {
        p.at::<()>(
            "roles",
            None,
            "missing or empty: a workflow needs at least one role",
        );
    }
    for (rname, r) in roles_src {
        let path = format!("roles.{rname}");
        if [START, END, SUSPEND, END_ROLE].contains(&rname.as_str()) {
            p.at(
                &path,
                Some(r),
                format!("'{rname}' is a reserved name and cannot be a role"),
            );
        }
        p.unknown_keys(
            &path,
            Some(r),
            &r.value.extra,
            "description, goal, capabilities, procedure, output, frontmatter, workflow, model, allowedTools, retry, foreach, parallel, join",
        );
        let v = &r.value;
        if let Some(child) = &v.workflow {
            if v.retry.is_some() {
                p.at(
                    format!("{path}.retry"),
                    Some(r),
                    format!("a workflow: role calls no agent itself: set retry: in '{child}'"),
                );
            }
            if v.frontmatter.is_some() {
                p.at(
                    &path,
                    Some(r),
                    "a workflow: role has no frontmatter (its statuses are done and failed)",
                );
            }
            if !is_registered(child) {
                p.at(
                    format!("{path}.workflow"),
                    Some(r),
                    format!(
                        "child workflow '{child}' is not registered (uwf-db workflow add it first)"
                    ),
                );
            }
        }
        if let Some(schema) = &v.frontmatter
            && declares_property(schema, BODY_VARIABLE)
        {
            p.at(
                format!("{path}.frontmatter"),
                Some(r),
                format!(
                    "'{BODY_VARIABLE}' is reserved (the template variable holding the previous reply's body); rename the property"
                ),
            );
        }
        if let Some(schema) = &v.frontmatter
            && let Err(e) = jsonschema::validator_for(schema)
        {
            p.at(
                format!("{path}.frontmatter"),
                Some(r),
                format!("not a valid JSON Schema: {e}"),
            );
        }
        roles.insert(
            rname.clone(),
            Role {
                allowed_tools: v.allowed_tools.clone(),
                capabilities: v.capabilities.clone(),
                description: v.description.clone(),
                fan_out: check_fan_out(&path, r, is_registered, p),
                frontmatter: v.frontmatter.clone(),
                goal: v.goal.clone(),
                model: v.model.clone(),
                output: v.output.clone(),
                procedure: v.procedure.clone(),
                retry: check_retry(&format!("{path}.retry"), v.retry.as_ref(), p),
                workflow: v.workflow.clone(),
            },
        );
    }
    roles
}

/// A `retry:` block (at `path`): its policy, or its problems recorded.
fn check_retry(
    path: &str,
    src: Option<&Spanned<RetrySrc>>,
    p: &mut Problems,
) -> Option<super::RetryPolicy> {
    let src = src?;
    match src.value.check() {
        Ok(policy) => Some(policy),
        Err(problems) => {
            for (key, message) in problems {
                p.at(format!("{path}.{key}"), Some(src), message);
            }
            None
        }
    }
}

/// `$START`: one entry edge (`_` or `new`), maybe a `resume` edge into a
/// role.
fn check_start(graph_src: &GraphSrc, p: &mut Problems) {
    match graph_src.get(START) {
        None => p.at::<()>("graph", None, "missing the $START node"),
        Some(s) => {
            let entries = [DEFAULT_STATUS, START_NEW]
                .iter()
                .filter(|k| s.value.contains_key(**k))
                .count();
            let others: Vec<&String> = s
                .value
                .keys()
                .filter(|k| ![DEFAULT_STATUS, START_NEW, RESUME].contains(&k.as_str()))
                .collect();
            if entries != 1 || !others.is_empty() {
                p.at(
                    format!("graph.{START}"),
                    Some(s),
                    "$START must have exactly one entry edge, '_' or 'new', and may have a 'resume' edge",
                );
            }
            if let Some(resume) = s.value.get(RESUME)
                && resume
                    .value
                    .role
                    .as_deref()
                    .is_some_and(|t| t == END || t == SUSPEND)
            {
                p.at(
                    format!("graph.{START}.{RESUME}.role"),
                    Some(resume),
                    "the resume edge must lead to a role",
                );
            }
        }
    }
}

/// One graph node's edges: the statuses its role allows, each edge's
/// target, prompt, location and template variables. `None` for `$END` and
/// `$SUSPEND`, which have no outgoing edges.
fn check_node(
    from: &String,
    edges: &Spanned<BTreeMap<String, Spanned<EdgeSrc>>>,
    roles: &BTreeMap<String, Role>,
    p: &mut Problems,
) -> Option<BTreeMap<String, Edge>> {
    let node_path = format!("graph.{from}");
    let from_role = roles.get(from);
    if from == END || from == SUSPEND {
        p.at(
            &node_path,
            Some(edges),
            format!("{from} has no outgoing edges"),
        );
        return None;
    }
    if from != START && from_role.is_none() {
        p.at(&node_path, Some(edges), format!("'{from}' is not a role"));
    }
    // The status keys must equal what the role's schema allows.
    if let Some(role) = from_role {
        let allowed: BTreeSet<String> = if role.runs_children() {
            ["done", "failed"].map(String::from).into()
        } else {
            let s = role.statuses();
            if s.is_empty() {
                [DEFAULT_STATUS.to_owned()].into()
            } else {
                s.into_iter().collect()
            }
        };
        let keys: BTreeSet<String> = edges.value.keys().cloned().collect();
        if role.runs_children() {
            let what = if role.workflow.is_some() {
                "a workflow: role"
            } else {
                "a fan-out role"
            };
            for k in keys.difference(&allowed) {
                p.at(
                    format!("{node_path}.{k}"),
                    edges.value.get(k),
                    format!("{what}'s statuses are done and failed, not '{k}'"),
                );
            }
        } else {
            for k in keys.difference(&allowed) {
                p.at(format!("{node_path}.{k}"), edges.value.get(k), format!("status '{k}' is not allowed by role '{from}''s frontmatter schema (allowed: {})", join(&allowed)));
            }
            for k in allowed.difference(&keys) {
                p.at(
                    &node_path,
                    Some(edges),
                    format!("no edge for status '{k}', which role '{from}''s schema allows"),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    for (status, e) in &edges.value {
        let path = format!("{node_path}.{status}");
        p.unknown_keys(&path, Some(e), &e.value.extra, "role, prompt, location");
        if e.value.location.is_some() && (target_is(e, END) || target_is(e, SUSPEND)) {
            p.at(
                format!("{path}.location"),
                Some(e),
                "a location applies to an edge into a role, not to $END or $SUSPEND",
            );
        }
        let target = match &e.value.role {
            Some(t) => t.clone(),
            None => {
                p.at(&path, Some(e), "missing 'role' (a role, $END or $SUSPEND)");
                continue;
            }
        };
        if target != END && target != SUSPEND && !roles.contains_key(&target) {
            p.at(
                format!("{path}.role"),
                Some(e),
                format!("edge target '{target}' is not a role, $END or $SUSPEND"),
            );
        }
        if target == START {
            p.at(
                format!("{path}.role"),
                Some(e),
                "$START cannot be an edge target",
            );
        }
        let prompt = e.value.prompt.clone().unwrap_or_default();
        if prompt.trim().is_empty() {
            p.at(format!("{path}.prompt"), Some(e), "missing or empty prompt");
        }
        let templates = std::iter::once(("prompt", prompt.as_str()))
            .chain(e.value.location.as_deref().map(|l| ("location", l)));
        for (field, text) in templates {
            match template::variables(text) {
                Err(err) => p.at(format!("{path}.{field}"), Some(e), err.to_string()),
                Ok(vars) => {
                    let mut allowed: Vec<String> = match from_role {
                        _ if from == START => Vec::new(),
                        Some(r) if r.workflow.is_some() => vec!["$status".into()],
                        Some(r) if r.fan_out.is_some() => super::model::JOIN_VARIABLES
                            .iter()
                            .map(|v| (*v).to_owned())
                            .collect(),
                        Some(r) => r.properties_for(status),
                        None => Vec::new(),
                    };
                    if from != START {
                        allowed.push(BODY_VARIABLE.to_owned());
                    }
                    for v in vars {
                        if !allowed.contains(&v) {
                            let why = if from == START {
                                "$START prompts have no variables".to_owned()
                            } else {
                                format!(
                                    "the '{status}' variant of role '{from}' defines {}",
                                    join(&allowed)
                                )
                            };
                            p.at(
                                format!("{path}.{field}"),
                                Some(e),
                                format!("template variable '{v}' is not defined: {why}"),
                            );
                        }
                    }
                }
            }
        }
        // `new` is the reference's name for the entry edge: stored as
        // `_`, so both spellings make the same workflow blob.
        let key = if from == START && status == START_NEW {
            DEFAULT_STATUS.to_owned()
        } else {
            status.clone()
        };
        out.insert(
            key,
            Edge {
                role: target,
                prompt,
                location: e.value.location.clone(),
            },
        );
    }
    Some(out)
}

/// Every role has a graph node and is reachable from `$START`.
fn check_reachable(
    graph: &BTreeMap<String, BTreeMap<String, Edge>>,
    roles: &BTreeMap<String, Role>,
    roles_src: &BTreeMap<String, Spanned<RoleSrc>>,
    p: &mut Problems,
) {
    // Every role has a graph node and is reachable from $START.
    let mut reachable = BTreeSet::new();
    let mut stack = vec![START.to_owned()];
    while let Some(n) = stack.pop() {
        for e in graph.get(&n).into_iter().flat_map(|m| m.values()) {
            if roles.contains_key(&e.role) && reachable.insert(e.role.clone()) {
                stack.push(e.role.clone());
            }
        }
    }
    for (rname, r) in roles_src {
        if [START, END, SUSPEND, END_ROLE].contains(&rname.as_str()) {
            continue; // already reported as reserved
        }
        if !graph.contains_key(rname) {
            p.at(
                format!("roles.{rname}"),
                Some(r),
                format!("role '{rname}' has no node in graph"),
            );
        }
        if !reachable.contains(rname) {
            p.at(
                format!("roles.{rname}"),
                Some(r),
                format!("role '{rname}' is not reachable from $START"),
            );
        }
    }
}

/// Whether an edge as written leads to `target`.
fn target_is(edge: &Spanned<EdgeSrc>, target: &str) -> bool {
    edge.value.role.as_deref() == Some(target)
}

/// Whether a JSON Schema declares `name` as a property, at its top level
/// or in one of its `oneOf` variants.
fn declares_property(schema: &serde_json::Value, name: &str) -> bool {
    let here = |s: &serde_json::Value| {
        s.get("properties")
            .and_then(|p| p.as_object())
            .is_some_and(|o| o.contains_key(name))
    };
    here(schema)
        || schema
            .get("oneOf")
            .and_then(|v| v.as_array())
            .is_some_and(|variants| variants.iter().any(here))
}

fn join(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let v: Vec<String> = items
        .into_iter()
        .map(|s| format!("'{}'", s.as_ref()))
        .collect();
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).to_owned()
}
