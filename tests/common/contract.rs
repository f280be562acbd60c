//! The JSON contract from the outside: which answer type each `uwf-db
//! --json` command prints (the table in `docs/schemas/README.md`), and a
//! check of a printed value against the committed schema of that type.
//! [`super::cli::Cli::json`] runs the check on every answer it parses, so
//! every CLI test that reads JSON also tests the contract.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// How many values of the type a command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One value.
    One,
    /// A JSON array of them.
    List,
    /// One value, or an array when more than one step was asked for
    /// (`run`, `thread step|resume|cancel`).
    OneOrList,
    /// JSON Lines, one value a line (`cas walk`, `thread watch`,
    /// `thread list --watch`); `batch` ends with a [`BatchSummary`] line.
    Lines,
}

/// The answer type of `uwf-db --json ARGS`, and its shape; `None` for a
/// command that prints no JSON answer.
pub fn answer_of(args: &[&str]) -> Option<(&'static str, Shape)> {
    use Shape::*;
    // Global flags (and the values of those that take one) may come before
    // the command.
    let mut words = args.iter().copied().enumerate().filter_map(|(i, a)| {
        let after_valued = i > 0
            && args
                .get(i - 1)
                .is_some_and(|p| matches!(*p, "--store" | "--durability" | "--max-map-size"));
        (!a.starts_with('-') && !after_valued).then_some(a)
    });
    let has = |flag: &str| args.contains(&flag);
    let first = words.next()?;
    let second = words.next().unwrap_or("");
    Some(match (first, second) {
        ("init", _) => ("StoreInit", One),
        ("run", _) => ("StepResult", OneOrList),
        ("batch", _) => ("BatchItem", Lines),
        ("gc", _) => ("GcReport", One),
        ("verify", _) => ("VerifyAnswer", One),
        ("stats", _) => ("StatsAnswer", One),
        ("copy", _) => ("CopyReport", One),
        ("prune", _) if has("--set") || has("--unset") || has("--show") => ("PolicyAnswer", One),
        ("prune", _) => ("PruneReport", One),
        ("export", _) => ("ExportReport", One),
        ("import", _) => ("ImportReport", One),
        ("salvage", _) => ("SalvageAnswer", One),
        ("thread", "list") if has("--watch") => ("ThreadActivity", Lines),
        ("thread", "list") => ("ThreadSummary", List),
        ("thread", "show") => ("ThreadDetail", One),
        ("thread", "log") => ("LogEntry", List),
        ("thread", "watch") => ("LogEntry", Lines),
        ("thread", "tree") => ("TreeView", One),
        ("thread", "start") => ("ThreadStarted", One),
        ("thread", "step" | "resume" | "cancel") => ("StepResult", OneOrList),
        ("thread", "fork") => ("ThreadForked", One),
        ("thread", "compact") => ("SummaryStaged", One),
        ("thread", "label") => ("LabelsSet", One),
        ("thread", "rm") => ("ThreadRemoved", One),
        ("thread", "stop") => ("StopRequested", One),
        ("workflow", "add") => ("WorkflowAdded", One),
        ("workflow", "list") => ("WorkflowEntry", List),
        ("workflow", "show") => ("WorkflowDetail", One),
        ("workflow", "validate") => ("WorkflowValidation", One),
        ("cas", "put") => ("BlobPut", One),
        ("cas", "get") if has("--raw") => return None,
        ("cas", "get") => ("BlobDetail", One),
        ("cas", "has") => ("BlobPresence", One),
        ("cas", "refs") => ("BlobRef", List),
        ("cas", "walk") => ("WalkedBlob", Lines),
        ("cas", "pin" | "unpin") => ("BlobPin", One),
        ("cas", "pins") => ("Hash", List),
        _ => return None,
    })
}

type Validators = Mutex<HashMap<String, Arc<jsonschema::Validator>>>;

/// The validator of the committed schema `docs/schemas/vN/NAME.json` (N: `API_VERSION`).
pub fn validator(name: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Validators> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap();
    if let Some(v) = cache.get(name) {
        return v.clone();
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("docs/schemas/v{}", uwf_db::api::API_VERSION))
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let v = Arc::new(jsonschema::validator_for(&schema).unwrap());
    cache.insert(name.to_owned(), v.clone());
    v
}

/// Panics unless `value` is an instance of the committed schema `name`.
pub fn assert_instance(name: &str, value: &serde_json::Value) {
    let v = validator(name);
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the answer does not match docs/schemas/v{}/{name}.json:\n{}\nanswer: {value}",
        uwf_db::api::API_VERSION,
        errors.join("\n")
    );
}

/// Checks what `uwf-db --json ARGS` printed (parsed as one JSON value)
/// against the committed schema of its answer type.
pub fn check_answer(args: &[&str], value: &serde_json::Value) {
    let Some((name, shape)) = answer_of(args) else {
        return;
    };
    match (shape, value) {
        (Shape::List | Shape::OneOrList, serde_json::Value::Array(items)) => {
            for item in items {
                assert_instance(name, item);
            }
        }
        (Shape::List, other) => panic!("{args:?}: expected a list of {name}, got {other}"),
        _ => assert_instance(name, value),
    }
}

/// Checks every line of a JSON Lines answer: `batch` ends with a
/// `BatchSummary` line, the others are all of the command's type.
pub fn check_lines(args: &[&str], lines: &[serde_json::Value]) {
    let Some((name, _)) = answer_of(args) else {
        return;
    };
    for (i, line) in lines.iter().enumerate() {
        if name == "BatchItem" && i + 1 == lines.len() {
            assert_instance("BatchSummary", line);
        } else {
            assert_instance(name, line);
        }
    }
}
