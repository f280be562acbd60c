//! Usage and cost through the real binary (issue 12, SPEC §11): a `cmd:`
//! agent reporting `$usage` in every reply gives per-step figures in
//! `thread log --json`, totals in `thread show --json` (parent plus child
//! workflow), the `batch --json` summary and `stats`; re-asks count as
//! calls; a malformed or absent `$usage` is never an error. On LMDB and
//! PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

/// A `cmd:` agent for review and ship: each reply sets the role's status
/// and reports 100 tokens in, 20 out, one cent, model `test-model`. With
/// `REASK` set to a file, the first developer reply of each thread has no
/// `$status` (so it is re-asked), but still reports its usage.
const AGENT: &str = r#"#!/bin/sh
case "$UWF_ROLE" in
  developer) s=review_needed ;;
  reviewer) s=approved ;;
  announce) s=announced ;;
  *) s=done ;;
esac
if [ -n "$REASK" ] && [ "$UWF_ROLE" = developer ] && [ ! -e "$REASK.$UWF_THREAD" ]; then
  touch "$REASK.$UWF_THREAD"
  printf -- '---\n$usage: {input_tokens: 7, output_tokens: 3, cost_usd: 0.5}\n---\nforgot the status\n'
  exit 0
fi
printf -- '---\n$status: %s\n$usage: {input_tokens: 100, output_tokens: 20, cost_usd: 0.01, model: test-model}\n---\nok\n' "$s"
"#;

/// A `cmd:` agent running the shell script `text`.
fn script_agent(env: &Cli, name: &str, text: &str) -> String {
    let path = env.file(name, text);
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    format!("cmd:{path}")
}

fn agent(env: &Cli) -> String {
    script_agent(env, "agent.sh", AGENT)
}

fn close(a: &serde_json::Value, b: f64) -> bool {
    (a.as_f64().unwrap() - b).abs() < 1e-9
}

fn steps_threads_and_children_carry_their_usage(b: TestBackend) {
    let env = Cli::new(b);
    let agent = agent(&env);
    env.json(&["workflow", "add", "examples/review.yaml"]);
    let r = env.json(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "Ship it",
        "--agent",
        &agent,
    ]);
    assert_eq!(r["status"], "completed", "{r}");
    let parent = r["thread"].as_str().unwrap().to_owned();
    let tree = env.json(&["thread", "tree", &parent]);
    let child = tree["thread"]["children"][0]["thread"]
        .as_str()
        .unwrap()
        .to_owned();

    // Per step: the child's developer and reviewer steps, one call each.
    let clog = env.log(&child);
    let (end, steps) = clog.split_first().unwrap();
    assert_eq!(steps.len(), 2);
    for e in steps {
        let u = &e["usage"];
        assert_eq!(u["calls"], 1, "{e}");
        assert_eq!(u["input_tokens"], 100);
        assert_eq!(u["output_tokens"], 20);
        assert!(close(&u["cost_usd"], 0.01), "{u}");
        assert_eq!(u["model"], "test-model");
        assert!(u["wall_ms"].is_u64(), "{u}");
        // Kept out of the role's meta.
        assert!(e["meta"].get("$usage").is_none(), "{e}");
    }
    // An end node made no call: every field null.
    assert!(end["usage"]["calls"].is_null(), "{end}");
    assert!(end["usage"]["wall_ms"].is_null(), "{end}");

    // Totals: the child alone, then the parent with its child.
    let cu = &env.show(&child)["usage"];
    assert_eq!(
        (cu["calls"].as_u64(), cu["input_tokens"].as_u64()),
        (Some(2), Some(200))
    );
    let pu = &env.show(&parent)["usage"];
    assert_eq!(pu["calls"], 3, "announce, developer, reviewer: {pu}");
    assert_eq!(pu["input_tokens"], 300);
    assert_eq!(pu["output_tokens"], 60);
    assert!(close(&pu["cost_usd"], 0.03), "{pu}");
    let o = env.uwf(&["thread", "show", &parent]);
    assert!(
        stdout(&o).contains("3 agent calls") && stdout(&o).contains("with its children"),
        "{}",
        stdout(&o)
    );

    // The store's totals.
    let s = env.json(&["stats"]);
    assert_eq!(s["usage"]["calls"], 3, "{s}");
    assert_eq!(s["usage"]["input_tokens"], 300);

    // `uwf-db usage`: the same totals, of a thread's tree or the store.
    let u = env.json(&["usage", &parent]);
    assert_eq!(&u, pu, "the parent with its child, as thread show says");
    let u = env.json(&["usage", &child]);
    assert_eq!(u["calls"], 2, "{u}");
    assert_eq!(env.json(&["usage"]), s["usage"]);
    let text = stdout(&env.uwf(&["usage", &parent]));
    assert!(
        text.starts_with(&format!(
            "thread {parent} with its child workflows: 3 agent calls, "
        )) && text.contains("300 tokens in, 60 out, $0.0300"),
        "{text}"
    );
    let text = stdout(&env.uwf(&["usage"]));
    assert!(
        text.starts_with("every thread in the store: 3 agent calls"),
        "{text}"
    );
}

fn batch_totals_count_every_call_re_asks_included(b: TestBackend) {
    let env = Cli::new(b);
    let agent = agent(&env);
    let marks = env.path("reask");
    let o = env
        .cmd()
        .env("REASK", &marks)
        .args([
            "--json",
            "batch",
            "examples/review.yaml",
            "-n",
            "3",
            "-p",
            "work",
        ])
        .args(["--agent", &agent])
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let summary = json_lines(&o).pop().unwrap();
    let u = &summary["summary"]["usage"];
    // Per thread: a refused developer reply, then developer and reviewer.
    assert_eq!(u["calls"], 9, "{summary}");
    assert_eq!(u["input_tokens"], 3 * (7 + 200));
    assert_eq!(u["output_tokens"], 3 * (3 + 40));
    assert!(close(&u["cost_usd"], 3.0 * (0.5 + 0.02)), "{u}");
    // The re-asked step counts both calls.
    let thread = summary_thread(&env);
    let log = env.log(&thread);
    let developer = log.iter().find(|e| e["role"] == "developer").unwrap();
    assert_eq!(developer["usage"]["calls"], 2, "{developer}");
    assert_eq!(developer["usage"]["input_tokens"], 107);
    assert_eq!(env.show(&thread)["usage"]["calls"], 3);
    // Text summary.
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "1",
        "-p",
        "x",
        "--agent",
        &agent,
    ]);
    assert!(stdout(&o).contains("2 agent calls"), "{}", stdout(&o));
}

fn summary_thread(env: &Cli) -> String {
    let v = env.json(&["thread", "list", "--limit", "1"]);
    v[0]["thread"].as_str().unwrap().to_owned()
}

fn absent_or_malformed_usage_is_never_an_error(b: TestBackend) {
    let env = Cli::new(b);
    // The scripted agent reports nothing: calls and time only.
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "x",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    let u = &env.show(&id)["usage"];
    assert_eq!(u["calls"], 4, "{u}");
    assert_eq!(u["input_tokens"], 0);
    for e in env.log(&id).iter().skip(1) {
        assert_eq!(e["usage"]["calls"], 1, "{e}");
        assert!(e["usage"]["input_tokens"].is_null(), "{e}");
        assert!(e["usage"]["model"].is_null(), "{e}");
    }
    // Garbage in `$usage`: ignored field by field, the step goes on.
    let bad = script_agent(
        &env,
        "bad.sh",
        "#!/bin/sh\nprintf -- '---\\n$status: review_needed\\n$usage: {input_tokens: -5, output_tokens: lots, cost_usd: free, model: [4, 2]}\\n---\\nok\\n'\n",
    );
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "x"]);
    let t = t["thread"].as_str().unwrap().to_owned();
    let o = env.uwf(&["thread", "step", &t, "--agent", &bad]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let e = &env.log(&t)[0];
    assert_eq!(e["usage"]["calls"], 1, "{e}");
    for field in ["input_tokens", "output_tokens", "cost_usd", "model"] {
        assert!(e["usage"][field].is_null(), "{field}: {e}");
    }
    // A `$usage` that is not a map: ignored as well.
    let odd = script_agent(
        &env,
        "odd.sh",
        "#!/bin/sh\nprintf -- '---\\n$status: approved\\n$usage: 12\\n---\\nok\\n'\n",
    );
    let o = env.uwf(&["thread", "step", &t, "--agent", &odd]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(env.show(&t)["usage"]["calls"], 2);
}

process_conformance!(
    steps_threads_and_children_carry_their_usage,
    batch_totals_count_every_call_re_asks_included,
    absent_or_malformed_usage_is_never_an_error,
);
