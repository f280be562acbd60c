//! Text for people: the lines and fields several commands print.

use uwf_db::thread::{Labels, LogEntry};
use uwf_db::{Blob, Hash, Store, StoreError};

use crate::CliError;
use crate::output;

/// `KEY=VALUE` pairs separated by spaces, or `-`.
pub fn labels_text(labels: &Labels) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(" ")
}

pub fn text_of(store: &Store, hash: &Hash) -> Result<String, CliError> {
    content(*hash, store.get(hash)?)
}

/// The texts of the content blobs `hashes` names, in their order, read
/// [`TEXTS_A_READ`] at a time (a page of a log in one read: one round trip
/// on a server backend, [`Store::get_many`], no `BEGIN` or `ROLLBACK`;
/// `thread log --limit` has no upper bound, and one statement stays a
/// bounded size).
pub fn texts_of(store: &Store, hashes: &[Hash]) -> Result<Vec<String>, CliError> {
    let mut texts = Vec::with_capacity(hashes.len());
    for chunk in hashes.chunks(TEXTS_A_READ) {
        for (hash, blob) in chunk.iter().zip(store.get_many(chunk)?) {
            texts.push(content(*hash, blob)?);
        }
    }
    Ok(texts)
}

/// Blobs [`texts_of`] reads in one read.
const TEXTS_A_READ: usize = 512;

/// The text of `blob`, read as the content blob `hash`.
fn content(hash: Hash, blob: Option<Blob>) -> Result<String, CliError> {
    match blob {
        Some(Blob::Content(c)) => Ok(c.text),
        Some(other) => Err(CliError::Failed(format!(
            "blob {hash} is a {} blob, not content",
            other.kind()
        ))),
        None => Err(StoreError::UnknownHash {
            prefix: hash.to_string(),
        }
        .into()),
    }
}

/// Usage totals as people read them.
pub fn usage_text(u: &uwf_db::usage::UsageTotals) -> String {
    let mut text = format!(
        "{} agent call{}, {:.1} s",
        u.calls,
        if u.calls == 1 { "" } else { "s" },
        u.wall_ms as f64 / 1000.0
    );
    if u.input_tokens > 0 || u.output_tokens > 0 {
        text.push_str(&format!(
            ", {} tokens in, {} out",
            u.input_tokens, u.output_tokens
        ));
    }
    if u.cost_usd > 0.0 {
        text.push_str(&format!(", ${:.4}", u.cost_usd));
    }
    text
}

/// One `thread log` text line (also a line of `thread watch`).
pub fn entry_line(store: &Store, e: &LogEntry) -> Result<String, CliError> {
    Ok(entry_line_with(e, &text_of(store, &e.node.content)?))
}

/// [`entry_line`] of a step whose reply `content` is already read.
pub fn entry_line_with(e: &LogEntry, content: &str) -> String {
    let n = &e.node;
    let status = match n.meta.get("$status") {
        Some(uwf_db::Value::Str(s)) => s.clone(),
        _ if n.role == uwf_db::thread::END_ROLE => match n.meta.get("return_code") {
            Some(uwf_db::Value::UInt(c)) => format!("return code {c}"),
            _ => "end".into(),
        },
        _ => "_".into(),
    };
    let first = content.lines().next().unwrap_or("");
    // A step that took more than one attempt says how many, and why the
    // earlier ones failed (SPEC §13).
    let attempts = uwf_db::engine::retry::attempts_of(&n.meta);
    let tries = if attempts.is_empty() {
        String::new()
    } else {
        let causes: Vec<&str> = attempts.iter().map(|a| a.cause.as_str()).collect();
        format!(
            "[{} attempts; failed: {}]  ",
            attempts.len() + 1,
            causes.join(", ")
        )
    };
    format!(
        "{}  #{:<5} {:<14} {:<16} {}  {tries}{}",
        e.hash.short(10),
        n.seq,
        n.role,
        status,
        output::timestamp(n.timestamp),
        first
    )
}
