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
    #[serde(flatten)]
    extra: Extra,
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
    let src: WorkflowSrc = crate::yaml::from_str(yaml).map_err(|e| {
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
    if p.0.is_empty() {
        Ok(Workflow {
            compact,
            description: src.description,
            graph,
            max_rounds,
            name,
            roles,
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
        "version, name, description, maxRounds, compact, roles, graph",
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
            "description, goal, capabilities, procedure, output, frontmatter, workflow, model, allowedTools",
        );
        let v = &r.value;
        if let Some(child) = &v.workflow {
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
                frontmatter: v.frontmatter.clone(),
                goal: v.goal.clone(),
                model: v.model.clone(),
                output: v.output.clone(),
                procedure: v.procedure.clone(),
                workflow: v.workflow.clone(),
            },
        );
    }
    roles
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
        let allowed: BTreeSet<String> = if role.workflow.is_some() {
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
        if role.workflow.is_some() {
            for k in keys.difference(&allowed) {
                p.at(
                    format!("{node_path}.{k}"),
                    edges.value.get(k),
                    format!("a workflow: role's statuses are done and failed, not '{k}'"),
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
