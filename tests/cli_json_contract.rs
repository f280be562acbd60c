//! The JSON contract through the real binary (SPEC §12, issue 19): every
//! command that prints JSON is run once, and each answer is checked against
//! the committed schema of its type (`docs/schemas/v1/`). Every type of
//! `uwf_db::api::schemas()` must be printed by some command here, so a type
//! no command uses, or a command printing something its schema refuses,
//! fails.
#![cfg(feature = "cli")]

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::backend::TestBackend;
use common::cli::*;
use common::contract::{self, Shape};

const REVIEW: &str = "examples/review.yaml";
const AGENT: &str = "script:examples/review.scenario.yaml";

/// Runs `--json ARGS` (success or not), checks what it printed, and records
/// the answer type as seen.
struct Contract<'a> {
    env: &'a Cli,
    seen: BTreeSet<&'static str>,
}

impl Contract<'_> {
    fn run(&mut self, args: &[&str]) -> serde_json::Value {
        let (name, shape) = contract::answer_of(args).expect("a command with a JSON answer");
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.env.uwf(&all);
        assert!(matches!(code(&o), Some(0 | 1)), "{args:?}: {}", stderr(&o));
        assert!(
            !o.stdout.is_empty(),
            "{args:?} printed nothing: {}",
            stderr(&o)
        );
        self.seen.insert(name);
        if shape == Shape::Lines {
            let lines = json_lines(&o);
            contract::check_lines(args, &lines);
            if name == "BatchItem" {
                self.seen.insert("BatchSummary");
            }
            return serde_json::Value::Array(lines);
        }
        let value: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        contract::check_answer(args, &value);
        value
    }
}

#[test]
fn every_json_answer_matches_its_committed_schema() {
    let env = Cli::new(TestBackend::Lmdb);
    let mut c = Contract {
        env: &env,
        seen: BTreeSet::new(),
    };
    c.run(&["init"]);
    c.run(&["workflow", "validate", REVIEW]);
    let bad = env.file("bad.yaml", "name: bad\nroles: {}\ngraph: {}\n");
    let invalid = c.run(&["workflow", "validate", &bad]);
    assert_eq!(invalid["valid"], false, "{invalid}");
    c.run(&["workflow", "add", REVIEW]);
    c.run(&["workflow", "list"]);
    c.run(&["workflow", "show", "review"]);

    // A finished thread, a thread part-way, a fork.
    let done = c.run(&["run", REVIEW, "-p", "finish it", "--agent", AGENT]);
    let done_id = done["thread"].as_str().unwrap().to_owned();
    let started = c.run(&["thread", "start", REVIEW, "-p", "go", "--label", "team=a"]);
    let id = started["thread"].as_str().unwrap().to_owned();
    c.run(&["thread", "step", &id, "--agent", AGENT]);
    c.run(&["thread", "step", &id, "--agent", AGENT, "-c", "2"]);
    c.run(&["thread", "label", &id, "k=v"]);
    c.run(&["thread", "compact", &id, "--summary", "so far, so good"]);
    let fork = c.run(&["thread", "fork", &id]);
    let fork_id = fork["thread"].as_str().unwrap().to_owned();
    // `thread stop` needs a driver: one whose agent sleeps.
    let mut driver = env.spawn(&["thread", "step", &fork_id, "--agent", "cmd:sleep 3"]);
    env.wait_until_running(&fork_id);
    c.run(&["thread", "stop", &fork_id]);
    driver.wait().unwrap();
    c.run(&["thread", "cancel", &fork_id]);
    c.run(&["thread", "list"]);
    c.run(&["thread", "show", &done_id]);
    c.run(&["thread", "log", &done_id]);
    c.run(&["thread", "tree", &done_id]);
    let watched = c.run(&["thread", "watch", &done_id]);
    assert!(!watched.as_array().unwrap().is_empty(), "{watched}");
    c.run(&["thread", "rm", &fork_id]);

    // `thread list --watch` prints the current threads first, then waits.
    let mut child = env
        .std_cmd()
        .args(["--json", "thread", "list", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let line: serde_json::Value = serde_json::from_str(&first).unwrap();
    contract::check_lines(&["thread", "list", "--watch"], &[line]);
    c.seen.insert("ThreadActivity");

    // The blob store.
    let put = c.run(&["cas", "put", &env.file("note.txt", "a note")]);
    let hash = put["hash"].as_str().unwrap().to_owned();
    c.run(&["cas", "get", &hash]);
    let head = c.run(&["thread", "show", &done_id])["head"]
        .as_str()
        .unwrap()
        .to_owned();
    c.run(&["cas", "get", &head]);
    c.run(&["cas", "has", &hash[..12]]);
    c.run(&["cas", "has", "0123456789ab"]);
    c.run(&["cas", "refs", &head]);
    c.run(&["cas", "walk", &head]);
    c.run(&["cas", "pin", &hash]);
    c.run(&["cas", "pins"]);
    c.run(&["cas", "unpin", &hash]);

    // Batches and maintenance.
    c.run(&["batch", REVIEW, "-n", "3", "-p", "many", "--agent", AGENT]);
    c.run(&["stats"]);
    c.run(&["verify"]);
    c.run(&["prune", "--dry-run", "--keep-latest", "1"]);
    c.run(&["prune", "--set", "--older-than", "30d"]);
    c.run(&["prune", "--show"]);
    c.run(&["prune", "--unset"]);
    c.run(&["gc"]);
    let bundle = env.path("one.bundle");
    let bundle = bundle.to_str().unwrap();
    c.run(&["export", &done_id, "-o", bundle]);
    c.run(&["import", bundle, "--new-ids"]);
    let copy = env.path("copy");
    c.run(&[
        "copy",
        &env.store_arg().to_string_lossy(),
        copy.to_str().unwrap(),
    ]);
    let salvaged = env.path("salvaged");
    c.run(&[
        "salvage",
        copy.to_str().unwrap(),
        salvaged.to_str().unwrap(),
    ]);

    // A command that fails prints one JSON line on stderr (nothing on
    // stdout) with the parts of the text form and the exit code it ends
    // with.
    let idle = c.run(&["thread", "start", REVIEW, "-p", "no agent"]);
    let idle = idle["thread"].as_str().unwrap().to_owned();
    let failing: [&[&str]; 3] = [
        &["thread", "show", "0000000000"],
        &["workflow", "show", "nosuch"],
        &["thread", "step", &idle],
    ];
    let mut kinds = Vec::new();
    for args in failing {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = env.uwf(&all);
        assert_eq!(code(&o), Some(1), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?}");
        let text = stderr(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {text}");
        let value: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        contract::assert_instance("ErrorAnswer", &value);
        let error = &value["error"];
        assert_eq!(error["exit_code"], 1, "{value}");
        kinds.push(error["kind"].as_str().unwrap().to_owned());
        // The text form says the same, line for line.
        let plain = stderr(&env.uwf(args));
        let mut expected = vec![format!("error: {}", error["message"].as_str().unwrap())];
        for cause in error["causes"].as_array().unwrap() {
            expected.push(format!("  caused by: {}", cause.as_str().unwrap()));
        }
        if let Some(hint) = error["hint"].as_str() {
            expected.push(format!("hint: {hint}"));
        }
        assert_eq!(plain.lines().collect::<Vec<_>>(), expected, "{args:?}");
    }
    assert_eq!(kinds, ["not_found", "not_found", "invalid"]);
    // The agent-less step has a remedy to type.
    let o = env.uwf(&["--json", "thread", "step", &idle]);
    let value: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert!(
        value["error"]["hint"]
            .as_str()
            .is_some_and(|h| h.contains("--agent")),
        "{value}"
    );
    // Times are RFC 3339 in UTC with milliseconds; a thread's id is
    // `thread` in every answer.
    let shown = env.json(&["thread", "show", &idle]);
    let created = shown["created_at"].as_str().unwrap();
    assert!(
        created.len() == 24 && created.ends_with('Z') && created.as_bytes()[19] == b'.',
        "{created}"
    );
    assert_eq!(shown["thread"], idle.as_str());
    assert!(shown.get("id").is_none(), "{shown}");
    c.seen.insert("ErrorAnswer");
    // Answers only the HTTP face gives (tests/serve.rs checks each against
    // its schema), and the bodies it reads (schemathesis sends bodies made
    // from them: scripts/schemathesis.sh).
    for http_only in [
        "Health",
        "ThreadPage",
        "LogPage",
        "WorkflowList",
        "WorkflowView",
        "ThreadDiff",
        "DriveAccepted",
        "UsageTotals",
        "StartRequest",
        "ResumeRequest",
        "DriveRequest",
        "CancelRequest",
        "ForkRequest",
        "LabelsRequest",
    ] {
        c.seen.insert(http_only);
    }

    let all: BTreeSet<&str> = uwf_db::api::schemas().iter().map(|s| s.name).collect();
    let unseen: Vec<&&str> = all.difference(&c.seen).collect();
    assert!(unseen.is_empty(), "no command here printed {unseen:?}");
}
