//! Bounded agents and inputs (issue 10) through the real binary: an agent
//! that talks too much is killed and its step fails saying so, its stderr
//! is kept to its tail, and input files past their caps are refused with a
//! message naming the file, its size and the cap.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const REPLY: &str = "---\\n\\$status: review_needed\\n---\\n";

fn start(env: &Cli) -> String {
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "a change"]);
    t["thread"].as_str().unwrap().to_owned()
}

fn an_endless_reply_is_cut_and_the_step_fails(b: TestBackend) {
    let env = Cli::new(b);
    let id = start(&env);
    for size in [None, Some("64KiB")] {
        let mut args = vec![
            "thread",
            "step",
            id.as_str(),
            "--agent",
            "cmd:yes",
            "--reasks",
            "0",
        ];
        if let Some(size) = size {
            args.extend(["--max-reply-size", size]);
        }
        let o = env.uwf(&args);
        assert_eq!(code(&o), Some(1), "{}", stderr(&o));
        let limit = if size.is_some() { "65536" } else { "16777216" };
        assert!(
            stderr(&o).contains(&format!("the agent's reply passed {limit} bytes")),
            "{}",
            stderr(&o)
        );
        let s = env.show(&id);
        assert_eq!(s["status"], "idle", "retryable: {s}");
        assert!(
            s["last_error"].as_str().unwrap().contains("reply passed"),
            "{s}"
        );
    }
    assert!(env.log(&id).is_empty(), "nothing was committed");
}

fn a_reply_under_the_cap_is_taken(b: TestBackend) {
    let env = Cli::new(b);
    let id = start(&env);
    // A valid reply with a 50,000-byte body, under a 64 KiB cap.
    let agent =
        format!("cmd:sh -c 'printf -- \"{REPLY}\"; head -c 50000 /dev/zero | tr \"\\0\" x; echo'");
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "--agent",
        &agent,
        "--max-reply-size",
        "64KiB",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(env.log(&id).len(), 1);
    // The same reply under a smaller cap is refused.
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "--agent",
        &agent,
        "--max-reply-size",
        "40000",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("reply passed 40000 bytes"),
        "{}",
        stderr(&o)
    );
    // A zero cap is bad usage.
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "--agent",
        &agent,
        "--max-reply-size",
        "0",
    ]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("at least 1 byte"), "{}", stderr(&o));
}

fn a_huge_stderr_keeps_its_tail(b: TestBackend) {
    let env = Cli::new(b);
    let id = start(&env);
    let agent =
        "cmd:sh -c 'head -c 2000000 /dev/zero | tr \"\\0\" e >&2; echo THE-LAST-WORDS >&2; exit 3'";
    let o = env.uwf(&["thread", "step", &id, "--agent", agent, "--reasks", "0"]);
    assert_eq!(code(&o), Some(1));
    let s = env.show(&id);
    let error = s["last_error"].as_str().unwrap();
    assert!(error.len() <= 20 << 10, "{} bytes kept", error.len());
    assert!(error.contains("bytes cut]"), "{}", &error[..200]);
    assert!(
        error.trim_end().ends_with("THE-LAST-WORDS"),
        "{}",
        &error[error.len() - 100..]
    );
    assert!(stderr(&o).len() < 64 << 10, "the message is bounded too");
}

fn sparse(path: &std::path::Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

#[test]
fn input_files_past_their_caps_are_refused() {
    let env = Cli::new(TestBackend::Lmdb);
    env.uwf(&["init"]);
    // A 5 MiB workflow file.
    let wf = env.path("big.yaml");
    sparse(&wf, 5 << 20);
    let o = env.uwf(&["workflow", "validate", wf.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("big.yaml is larger than 4194304 bytes, the most a workflow file may be, it is 5242880 bytes"),
        "{e}"
    );
    // A workflow that never ends.
    let o = env.uwf(&["workflow", "validate", "/dev/zero"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("larger than 4194304 bytes"),
        "{}",
        stderr(&o)
    );
    // A 65 MiB prompts file.
    let prompts = env.path("prompts.txt");
    sparse(&prompts, 65 << 20);
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--prompts",
        prompts.to_str().unwrap(),
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("the most a prompts file may be"),
        "{}",
        stderr(&o)
    );
    // One prompt of more than 1 MiB, on line 2.
    let long = env.file(
        "long.txt",
        &format!("fine\n{}\n", "p".repeat((1 << 20) + 1)),
    );
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--prompts",
        &long,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("long.txt:2: a prompt of 1048577 bytes"),
        "{}",
        stderr(&o)
    );
    // A 257 MiB blob.
    let blob = env.path("blob.txt");
    sparse(&blob, 257 << 20);
    let o = env.uwf(&["cas", "put", blob.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("the most a blob may be"),
        "{}",
        stderr(&o)
    );
    // A 5 MiB scenario.
    let scenario = env.path("scenario.yaml");
    sparse(&scenario, 5 << 20);
    let agent = format!("script:{}", scenario.display());
    let o = env.uwf(&["run", "examples/review.yaml", "-p", "x", "--agent", &agent]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("the most a scenario may be"),
        "{}",
        stderr(&o)
    );
    // Nothing was stored by any of these.
    let listed = env.json(&["thread", "list"]);
    assert!(listed.as_array().unwrap().len() <= 1, "{listed}");
}

process_conformance!(
    an_endless_reply_is_cut_and_the_step_fails,
    a_reply_under_the_cap_is_taken,
    a_huge_stderr_keeps_its_tail,
);
