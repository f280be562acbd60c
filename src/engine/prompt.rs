//! Prompt assembly: what an agent reads (SPEC §5).

use std::fmt::Write;

use crate::thread::Context;
use crate::workflow::Role;

/// Most recent steps shown as "what happened since your last turn".
pub const RECENT_STEPS: usize = 20;

/// The output-format instruction generated from the role's schema.
pub fn output_format(role: &Role) -> String {
    let statuses = role.statuses();
    let Some(schema) = &role.frontmatter else {
        return "Reply in markdown. No frontmatter is needed.".into();
    };
    let mut s = String::from(
        "Start your reply with YAML frontmatter between two '---' lines, then the body in markdown.\n",
    );
    if !statuses.is_empty() {
        let _ = writeln!(s, "Set $status to one of: {}.", statuses.join(", "));
    }
    let _ = write!(
        s,
        "The frontmatter must satisfy this JSON Schema:\n{}\nIf you cannot go on without a human's answer, set $status to $SUSPEND instead and ask your question in `reason`.",
        serde_json::to_string_pretty(schema).unwrap_or_default()
    );
    s
}

/// The part of a role's prompt that depends only on the role: its name,
/// goal, procedure, output, capabilities and the output format (`format`,
/// from [`output_format`]).
pub fn role_header(role_name: &str, role: &Role, format: &str) -> String {
    let mut p = String::new();
    let _ = writeln!(p, "# Role: {role_name}");
    for (title, v) in [
        ("Goal", &role.goal),
        ("Procedure", &role.procedure),
        ("Output", &role.output),
    ] {
        if let Some(v) = v {
            let _ = writeln!(p, "\n## {title}\n{v}");
        }
    }
    if !role.capabilities.is_empty() {
        let _ = writeln!(p, "\n## Capabilities\n{}", role.capabilities.join(", "));
    }
    let _ = writeln!(p, "\n## Output format\n{format}");
    p
}

/// Assembles the prompt for `role`: goal, capabilities, procedure, output,
/// the output format (`format`, from [`output_format`]), the task, the
/// compact summary, what happened since the role's last turn (bounded), and
/// the instruction. `texts` reads a step's reply text; its error (a blob
/// that cannot be read) is the assembly's error, never an empty text.
#[allow(clippy::too_many_arguments)]
pub fn assemble<E>(
    role_name: &str,
    role: &Role,
    format: &str,
    task: &str,
    context: &Context,
    texts: &dyn Fn(&crate::hash::Hash) -> Result<String, E>,
    instruction: &str,
) -> Result<String, E> {
    let header = role_header(role_name, role, format);
    assemble_with_header(&header, role_name, task, context, texts, instruction)
}

/// [`assemble`] with the role's header already built by [`role_header`].
pub fn assemble_with_header<E>(
    header: &str,
    role_name: &str,
    task: &str,
    context: &Context,
    texts: &dyn Fn(&crate::hash::Hash) -> Result<String, E>,
    instruction: &str,
) -> Result<String, E> {
    let mut p = String::with_capacity(header.len() + task.len() + instruction.len() + 512);
    p.push_str(header);
    let _ = writeln!(p, "\n## Task\n{task}");
    if let Some((_, summary)) = &context.summary {
        let _ = writeln!(p, "\n## Summary of earlier steps\n{summary}");
    }
    // Steps since this role's last turn, oldest first, at most RECENT_STEPS.
    let since: Vec<_> = context
        .steps
        .iter()
        .rev()
        .take_while(|e| e.node.role != role_name)
        .take(RECENT_STEPS)
        .collect();
    if !since.is_empty() {
        let _ = writeln!(p, "\n## Since your last turn");
        for e in since.iter().rev() {
            let _ = writeln!(
                p,
                "\n### {} (step {})\n{}",
                e.node.role,
                e.node.seq,
                texts(&e.node.content)?
            );
        }
    }
    let _ = writeln!(p, "\n## Instruction\n{instruction}");
    Ok(p)
}
