//! What a step keeps of its agent call, for debugging an agent (issue 25;
//! `docs/design.md` §5e "Kept with a step"): the exact prompt it was sent
//! and its stderr tail, as blobs of the chain — shown by `thread log
//! --prompt`/`--stderr` and the JSON, kept by GC, carried by export, and
//! turned off store-wide with `uwf-db config keep-prompts off`.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

/// A `cmd:` agent that saves each prompt it reads to `prompt-N`, says two
/// lines on stderr, and answers as the review workflow's roles do — with a
/// forged `$prompt` key in its frontmatter.
fn agent(env: &Cli) -> String {
    let dir = env.scratch().display().to_string();
    let script = env.file(
        "agent.sh",
        &format!(
            r#"n=$(cat {dir}/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > {dir}/n
cat > {dir}/prompt-$n
echo "call $n: thinking" >&2
echo "call $n: done" >&2
if grep -q '^# Role: developer' {dir}/prompt-$n; then s=review_needed; else s=approved; fi
printf -- '---\n$status: %s\n$prompt: forged\n---\nAnswer %s\n' $s $n
"#
        ),
    );
    format!("cmd:sh {script}")
}

fn steps(env: &Cli, id: &str, flags: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["thread", "log", id];
    args.extend_from_slice(flags);
    let mut log = env.json(&args).as_array().unwrap().clone();
    log.reverse(); // oldest first
    log.retain(|e| e["role"] != "__end__");
    log
}

fn each_step_keeps_the_prompt_sent_and_the_stderr(b: TestBackend) {
    let env = Cli::new(b);
    let agent = agent(&env);
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "Add a --json flag",
        "--agent",
        &agent,
    ]);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap().to_owned();
    let log = steps(&env, &id, &["--prompt", "--stderr"]);
    assert_eq!(log.len(), 2, "developer, reviewer");
    for (i, e) in log.iter().enumerate() {
        let n = i + 1;
        let received = std::fs::read_to_string(env.path(&format!("prompt-{n}"))).unwrap();
        assert_eq!(
            e["sent_prompt"].as_str(),
            Some(received.as_str()),
            "step {n}"
        );
        assert_eq!(
            e["stderr_text"].as_str(),
            Some(format!("call {n}: thinking\ncall {n}: done").as_str())
        );
        // The agent's own `$prompt` is dropped, never taken for a ref.
        assert!(e["meta"].get("$prompt").is_none(), "{e}");
        assert_eq!(e["prompt_kept"], true);
    }
    // Without the flags: whether they were kept, and the stderr's hash.
    let plain = steps(&env, &id, &[]);
    assert_eq!(plain[0]["prompt_kept"], true);
    assert!(plain[0]["sent_prompt"].is_null() && plain[0]["stderr_text"].is_null());
    let o = env.uwf(&["cas", "get", plain[0]["stderr"].as_str().unwrap()]);
    assert!(
        stdout(&o).ends_with("\n\ncall 1: thinking\ncall 1: done\n"),
        "{}",
        stdout(&o)
    );
    // In text: each step's line, then its prompt and stderr.
    let text = stdout(&env.uwf(&["thread", "log", &id, "--prompt", "--stderr"]));
    assert!(
        text.contains("  ── prompt sent ──\n  │ # Role: reviewer\n"),
        "{text}"
    );
    assert!(
        text.contains("  ── stderr ──\n  │ call 1: thinking\n  │ call 1: done\n"),
        "{text}"
    );

    // GC keeps them (the chain reaches them); export carries them.
    let gc = env.json(&["gc", "--grace", "0"]);
    assert_eq!(gc["swept"], 0, "{gc}");
    let bundle = env.path("t.bundle");
    let o = env.uwf(&["export", &id, "-o", bundle.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let other = Cli::new(b);
    let o = other.uwf(&["import", bundle.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let moved = steps(&other, &id, &["--prompt", "--stderr"]);
    assert_eq!(moved[1]["sent_prompt"], log[1]["sent_prompt"]);
    assert_eq!(moved[0]["stderr_text"], log[0]["stderr_text"]);

    // Unlinked and collected, they go with the rest of the thread.
    let kept = log[0]["stderr"].as_str().unwrap().to_owned();
    let o = env.uwf(&["thread", "rm", &id]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    env.json(&["gc", "--grace", "0"]);
    let o = env.uwf(&["cas", "get", &kept]);
    assert_eq!(code(&o), Some(1), "{}", stdout(&o));
}

fn keeping_prompts_can_be_turned_off_for_the_store(b: TestBackend) {
    let env = Cli::new(b);
    let agent = agent(&env);
    // A read of a store that is not there creates nothing.
    let o = env.uwf(&["config"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("uwf-db init"), "{}", stderr(&o));
    env.uwf(&["init"]);
    assert_eq!(stdout(&env.uwf(&["config"])), "keep-prompts = on\n");
    let o = env.uwf(&["config", "keep-prompts", "off"]);
    assert_eq!(stdout(&o), "keep-prompts = off\n", "{}", stderr(&o));
    assert_eq!(env.json(&["config", "keep-prompts"])["keep-prompts"], "off");
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "private",
        "--agent",
        &agent,
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    for e in steps(&env, &id, &["--prompt", "--stderr"]) {
        assert!(
            e["prompt_kept"] == false && e["sent_prompt"].is_null(),
            "{e}"
        );
        // Stderr is the agent's own words: kept either way.
        assert!(
            e["stderr_text"].as_str().unwrap().contains("thinking"),
            "{e}"
        );
    }
    let text = stdout(&env.uwf(&["thread", "log", &id, "--prompt"]));
    assert!(text.contains("  ── prompt sent: none kept ──"), "{text}");
    // No blob holds the task's words but the start's prompt.
    env.json(&["config", "keep-prompts", "on"]);
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "public",
        "--agent",
        &agent,
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    assert!(
        steps(&env, &id, &["--prompt"])[0]["sent_prompt"]
            .as_str()
            .unwrap()
            .contains("public")
    );
    let o = env.uwf(&["config", "keep-prompts", "maybe"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
}

process_conformance!(
    each_step_keeps_the_prompt_sent_and_the_stderr,
    keeping_prompts_can_be_turned_off_for_the_store,
);
