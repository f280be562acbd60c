//! A workflow's graph as a picture: Mermaid (`flowchart`, rendered by
//! GitHub, GitLab and most Markdown viewers) or Graphviz DOT.
//!
//! Nodes: `$START` (a circle), each role (a box; a role that runs a child
//! workflow or fans out says so on a second line), `$END` (a double
//! circle) and `$SUSPEND` (a hexagon: a human answers). Edges carry their
//! status; the catch-all status `_` draws an unlabelled edge. Every name
//! and status is escaped, so a workflow's text cannot break out of its
//! label.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Role, Workflow};

/// The graph's nodes in drawing order (`$START`, the roles in the
/// workflow's order, then `$SUSPEND` and `$END` when an edge reaches
/// them), each with its id in the picture.
fn nodes(wf: &Workflow) -> Vec<(&str, String)> {
    let mut names: Vec<&str> = vec!["$START"];
    names.extend(wf.roles.keys().map(String::as_str));
    let reached = |target: &str| {
        wf.graph
            .values()
            .any(|edges| edges.values().any(|e| e.role == target))
    };
    for special in ["$SUSPEND", "$END"] {
        if reached(special) {
            names.push(special);
        }
    }
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let id = match n {
                // Not `end`: a keyword of Mermaid's flowcharts.
                "$START" => "n_start".to_owned(),
                "$END" => "n_end".to_owned(),
                "$SUSPEND" => "n_suspend".to_owned(),
                _ => format!("r{i}"),
            };
            (n, id)
        })
        .collect()
}

/// What a role does, for its second line: `⇢ review` (a child workflow),
/// `foreach tasks ⇢ solve` or `parallel: a, b`.
fn role_note(role: &Role) -> Option<String> {
    if let Some(fan) = &role.fan_out {
        let what = match &fan.foreach {
            Some(f) => format!("foreach {} ⇢ {}", f.items, f.workflow),
            None => format!(
                "parallel: {}",
                fan.branches
                    .iter()
                    .map(|b| format!("{} ⇢ {}", b.key, b.workflow))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return Some(format!("{what} (≤ {} at once)", fan.max_concurrency));
    }
    role.workflow.as_ref().map(|w| format!("⇢ {w}"))
}

/// A node's label lines.
fn label(wf: &Workflow, name: &str) -> Vec<String> {
    match name {
        "$START" => vec!["start".into()],
        "$END" => vec!["end".into()],
        "$SUSPEND" => vec!["ask a human".into()],
        role => {
            let mut lines = vec![role.to_owned()];
            if let Some(note) = wf.roles.get(role).and_then(role_note) {
                lines.push(note);
            }
            lines
        }
    }
}

/// `s` with each character `special` names replaced by its text, and
/// line breaks by spaces.
fn escaped(s: &str, special: impl Fn(char) -> Option<&'static str>) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match (c, special(c)) {
            (_, Some(text)) => out.push_str(text),
            ('\n' | '\r', None) => out.push(' '),
            (c, None) => out.push(c),
        }
    }
    out
}

/// Mermaid's text in a quoted label or an edge label: quotes, pipes,
/// angle brackets and `#` as its entity codes, no line breaks.
fn mermaid_text(s: &str) -> String {
    escaped(s, |c| match c {
        '"' => Some("#quot;"),
        '|' => Some("#124;"),
        '<' => Some("#lt;"),
        '>' => Some("#gt;"),
        '#' => Some("#35;"),
        _ => None,
    })
}

/// DOT's text inside a double-quoted string.
fn dot_text(s: &str) -> String {
    escaped(s, |c| match c {
        '"' => Some("\\\""),
        '\\' => Some("\\\\"),
        _ => None,
    })
}

/// The edges, `(from id, status, to id)`, in the graph's order.
fn edges<'a>(wf: &'a Workflow, ids: &BTreeMap<&str, String>) -> Vec<(String, &'a str, String)> {
    let mut out = Vec::new();
    for (from, edges) in &wf.graph {
        for (status, edge) in edges {
            // A parsed workflow names only known nodes; a stored one that
            // does not is drawn with a node of its own rather than lost.
            // Only letters and digits reach the picture's syntax.
            let id = |n: &str| {
                ids.get(n).cloned().unwrap_or_else(|| {
                    let safe: String = n.chars().filter(char::is_ascii_alphanumeric).collect();
                    format!("unknown_{safe}")
                })
            };
            out.push((id(from), status.as_str(), id(&edge.role)));
        }
    }
    out
}

/// The workflow as a Mermaid flowchart.
///
/// ```
/// let yaml = "name: two\nroles:\n  writer: { goal: Write, frontmatter: { properties: { $status: { const: done } }, required: [$status] } }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { done: { role: $END, prompt: 'Done' } }\n";
/// let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
/// let chart = uwf_db::workflow::draw::mermaid(&wf);
/// assert!(chart.starts_with("flowchart TD\n"));
/// assert!(chart.contains("  n_start --> r1\n"));
/// assert!(chart.contains("  r1 -->|done| n_end\n"));
/// ```
pub fn mermaid(wf: &Workflow) -> String {
    let nodes = nodes(wf);
    let ids: BTreeMap<&str, String> = nodes.iter().map(|(n, id)| (*n, id.clone())).collect();
    let mut out = String::from("flowchart TD\n");
    for (name, id) in &nodes {
        let text = label(wf, name)
            .iter()
            .map(|l| mermaid_text(l))
            .collect::<Vec<_>>()
            .join("<br/>");
        let shape = match *name {
            "$START" => format!("((\"{text}\"))"),
            "$END" => format!("(((\"{text}\")))"),
            "$SUSPEND" => format!("{{{{\"{text}\"}}}}"),
            _ => format!("[\"{text}\"]"),
        };
        let _ = writeln!(out, "  {id}{shape}");
    }
    for (from, status, to) in edges(wf, &ids) {
        if status == "_" {
            let _ = writeln!(out, "  {from} --> {to}");
        } else {
            let _ = writeln!(out, "  {from} -->|{}| {to}", mermaid_text(status));
        }
    }
    out
}

/// The workflow as a Graphviz DOT digraph (`dot -Tsvg`).
///
/// ```
/// let yaml = "name: two\nroles:\n  writer: { goal: Write, frontmatter: { properties: { $status: { const: done } }, required: [$status] } }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { done: { role: $END, prompt: 'Done' } }\n";
/// let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
/// let graph = uwf_db::workflow::draw::dot(&wf);
/// assert!(graph.starts_with("digraph \"two\" {\n"));
/// assert!(graph.contains("  r1 -> n_end [label=\"done\"];\n"));
/// ```
pub fn dot(wf: &Workflow) -> String {
    let nodes = nodes(wf);
    let ids: BTreeMap<&str, String> = nodes.iter().map(|(n, id)| (*n, id.clone())).collect();
    let mut out = format!("digraph \"{}\" {{\n", dot_text(&wf.name));
    out.push_str("  node [shape=box, fontname=\"Helvetica\"];\n");
    for (name, id) in &nodes {
        let text = label(wf, name)
            .iter()
            .map(|l| dot_text(l))
            .collect::<Vec<_>>()
            .join("\\n");
        let shape = match *name {
            "$START" => ", shape=circle",
            "$END" => ", shape=doublecircle",
            "$SUSPEND" => ", shape=hexagon",
            _ => "",
        };
        let _ = writeln!(out, "  {id} [label=\"{text}\"{shape}];");
    }
    for (from, status, to) in edges(wf, &ids) {
        if status == "_" {
            let _ = writeln!(out, "  {from} -> {to};");
        } else {
            let _ = writeln!(out, "  {from} -> {to} [label=\"{}\"];", dot_text(status));
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow whose role name and statuses hold every character the
    /// two syntaxes give a meaning to.
    fn hostile() -> Workflow {
        let yaml = "name: odd\nroles:\n  \"a\\\"b|c<d>#e\\\\f\": { goal: x }\ngraph:\n  $START: { _: { role: \"a\\\"b|c<d>#e\\\\f\", prompt: p } }\n  \"a\\\"b|c<d>#e\\\\f\": { _: { role: $END, prompt: p } }\n";
        let mut wf = crate::workflow::parse_workflow(yaml, Some("odd"), &|_| false).unwrap();
        let role = "a\"b|c<d>#e\\f".to_owned();
        let mut edge = wf.graph[&role]["_"].clone();
        edge.role = "$SUSPEND".into();
        wf.graph
            .get_mut(&role)
            .unwrap()
            .insert("x|y\"z\n-->".into(), edge);
        wf
    }

    #[test]
    fn mermaid_escapes_names_and_statuses() {
        let chart = mermaid(&hostile());
        assert_eq!(
            chart,
            "flowchart TD\n  n_start((\"start\"))\n  r1[\"a#quot;b#124;c#lt;d#gt;#35;e\\f\"]\n  \
             n_suspend{{\"ask a human\"}}\n  n_end(((\"end\")))\n  n_start --> r1\n  r1 --> n_end\n  \
             r1 -->|x#124;y#quot;z --#gt;| n_suspend\n"
        );
    }

    #[test]
    fn dot_escapes_names_and_statuses() {
        let graph = dot(&hostile());
        assert!(
            graph.contains("  r1 [label=\"a\\\"b|c<d>#e\\\\f\"];\n"),
            "{graph}"
        );
        assert!(
            graph.contains("  r1 -> n_suspend [label=\"x|y\\\"z -->\"];\n"),
            "{graph}"
        );
        assert!(graph.starts_with("digraph \"odd\" {\n") && graph.ends_with("}\n"));
    }

    #[test]
    fn an_edge_to_an_unknown_node_keeps_to_letters_and_digits() {
        let mut wf = hostile();
        let role = "a\"b|c<d>#e\\f".to_owned();
        wf.graph.get_mut(&role).unwrap().get_mut("_").unwrap().role = "gone\"]; x[".into();
        assert!(mermaid(&wf).contains("  r1 --> unknown_gonex\n"));
        assert!(dot(&wf).contains("  r1 -> unknown_gonex;\n"));
    }
}
