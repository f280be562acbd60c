//! Logs on stderr (issue 25): none by default; `-v` info, `-vv` debug, `-vvv`
//! trace of uwf-db's own events; `RUST_LOG` overrides, and a bad one is
//! named and ignored; a prompt's text never reaches a log line.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const REVIEW: &str = "examples/review.yaml";
const AGENT: &str = "script:examples/review.scenario.yaml";

fn review_store() -> Cli {
    let cli = Cli::new(TestBackend::Lmdb);
    cli.json(&["workflow", "add", REVIEW]);
    cli
}

/// The log lines of `o`'s stderr (those with a level).
fn log_lines(o: &std::process::Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| {
            [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|lv| l.contains(lv))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn quiet_by_default_and_louder_with_v() {
    let cli = review_store();
    let plain = cli.uwf(&[
        "run",
        "review",
        "-p",
        "Implement the change quietly",
        "--agent",
        AGENT,
    ]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(stderr(&plain), "", "nothing on stderr without -v");

    // -v: info; a step commit is debug, so not shown.
    let info = cli.uwf(&["-v", "run", "review", "-p", "x", "--agent", AGENT]);
    assert!(info.status.success());
    assert!(
        log_lines(&info)
            .iter()
            .all(|l| !l.contains("step committed")),
        "{}",
        stderr(&info)
    );

    // -vv: debug: each committed step, naming its thread and role.
    let debug = cli.uwf(&[
        "--json",
        "-vv",
        "run",
        "review",
        "-p",
        "the secret task",
        "--agent",
        AGENT,
    ]);
    assert!(debug.status.success());
    let id = json_lines(&debug).last().unwrap()["thread"]
        .as_str()
        .unwrap()
        .to_owned();
    let steps: Vec<String> = log_lines(&debug)
        .into_iter()
        .filter(|l| l.contains("step committed"))
        .collect();
    assert_eq!(steps.len(), 4, "{}", stderr(&debug));
    for (line, role) in steps
        .iter()
        .zip(["developer", "reviewer", "developer", "reviewer"])
    {
        assert!(line.contains(" DEBUG "), "{line}");
        assert!(line.contains(&format!("thread={id}")), "{line}");
        assert!(line.contains(&format!("role=\"{role}\"")), "{line}");
    }
    assert!(steps[3].contains("status=completed"), "{}", steps[3]);
    // No colour when stderr is not a terminal; no prompt text in logs.
    assert!(!stderr(&debug).contains('\u{1b}'));

    let trace = cli.uwf(&[
        "-vvv",
        "run",
        "review",
        "-p",
        "the secret task",
        "--agent",
        AGENT,
    ]);
    assert!(trace.status.success());
    assert!(!log_lines(&trace).is_empty());
    assert!(
        !stderr(&trace).contains("the secret task"),
        "{}",
        stderr(&trace)
    );

    // -v and -q conflict.
    let both = cli.uwf(&["-v", "-q", "thread", "list"]);
    assert_eq!(code(&both), Some(2), "{}", stderr(&both));
}

#[test]
fn gc_logs_its_result_at_info() {
    let cli = review_store();
    let o = cli.uwf(&["-v", "gc", "--grace", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = log_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(" INFO ") && lines[0].contains("garbage collected"),
        "{lines:?}"
    );
    assert!(lines[0].contains("swept=0"), "{lines:?}");
}

#[test]
fn rust_log_overrides_and_a_bad_one_is_named() {
    let cli = review_store();
    let o = cli
        .cmd()
        .env("RUST_LOG", "uwf_db=debug")
        .args(["run", "review", "-p", "x", "--agent", AGENT])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        log_lines(&o)
            .iter()
            .filter(|l| l.contains("step committed"))
            .count(),
        4,
        "{}",
        stderr(&o)
    );

    // A filter for other crates only: nothing of uwf-db's.
    let o = cli
        .cmd()
        .env("RUST_LOG", "hyper=debug")
        .args(["run", "review", "-p", "x", "--agent", AGENT])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(log_lines(&o), Vec::<String>::new());

    let o = cli
        .cmd()
        .env("RUST_LOG", "uwf_db=[[[")
        .args(["thread", "list"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "a bad RUST_LOG does not stop the command"
    );
    assert!(stderr(&o).contains("RUST_LOG ignored"), "{}", stderr(&o));
}

/// `--color always` colours the logs even off a terminal; `never` and
/// `NO_COLOR` keep them plain; a bad value is bad usage, and clap's own
/// errors follow the flag too.
#[test]
fn color_is_asked_for_or_not() {
    let cli = review_store();
    let run = |args: &[&str], no_color: bool| {
        let mut c = cli.cmd();
        if no_color {
            c.env("NO_COLOR", "1");
        }
        c.args(args).output().unwrap()
    };
    let always = run(
        &[
            "--color", "always", "-vv", "run", "review", "-p", "x", "--agent", AGENT,
        ],
        false,
    );
    assert!(always.status.success());
    assert!(stderr(&always).contains('\u{1b}'), "{}", stderr(&always));
    let never = run(
        &[
            "--color=never",
            "-vv",
            "run",
            "review",
            "-p",
            "x",
            "--agent",
            AGENT,
        ],
        false,
    );
    assert!(!stderr(&never).contains('\u{1b}'));
    let plain = run(&["-vv", "run", "review", "-p", "x", "--agent", AGENT], true);
    assert!(!stderr(&plain).contains('\u{1b}'));
    let bad = run(&["--color", "sometimes", "thread", "list"], false);
    assert_eq!(code(&bad), Some(2));
    assert!(stderr(&bad).contains("sometimes"), "{}", stderr(&bad));
    // clap's error for an unknown flag, coloured only when asked.
    let err = run(&["--color", "always", "thread", "list", "--bogus"], false);
    assert!(stderr(&err).contains('\u{1b}'), "{}", stderr(&err));
    let err = run(&["thread", "list", "--bogus"], false);
    assert!(!stderr(&err).contains('\u{1b}'), "{}", stderr(&err));
}
