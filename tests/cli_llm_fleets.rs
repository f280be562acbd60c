//! Workflows for LLM fleets through the real binary (SPEC §13): retries
//! with backoff against an agent that fails one call in three, exit codes
//! that say a thread failed, and replies as models write them.
#![cfg(feature = "cli")]

mod common;

use std::collections::BTreeMap;

use common::backend::TestBackend;
use common::cli::*;

/// An agent for `examples/review.yaml` that fails one call in three with
/// "HTTP 429" on stderr and exit 1, as a hosted model under load does: the
/// first, fourth, seventh… call for each thread. It logs each call as
/// `THREAD ROLE ok|fail` in `calls` (one short append per call: whole
/// lines, though a batch runs many at once).
fn flaky_agent(cli: &Cli) -> (String, std::path::PathBuf) {
    let calls = cli.path("calls");
    let dir = cli.path("per-thread");
    std::fs::create_dir_all(&dir).unwrap();
    let script = cli.file(
        "flaky.sh",
        &format!(
            r#"cat > /dev/null
mine='{dir}'/"$UWF_THREAD"
n=$(( $(cat "$mine" 2>/dev/null || echo 0) + 1 ))
echo $n > "$mine"
if [ $((n % 3)) -eq 1 ]; then
  echo "$UWF_THREAD $UWF_ROLE fail" >> '{calls}'
  echo 'HTTP 429: rate limited, try again later' >&2
  exit 1
fi
echo "$UWF_THREAD $UWF_ROLE ok" >> '{calls}'
case "$UWF_ROLE" in
  developer) printf -- '---\n$status: review_needed\n---\nCall %s.\n' "$n" ;;
  *) printf -- '---\n$status: approved\n---\nCall %s.\n' "$n" ;;
esac
"#,
            dir = dir.display(),
            calls = calls.display()
        ),
    );
    (format!("cmd:sh {script}"), calls)
}

/// Calls per thread in the agent's own log.
fn calls_per_thread(calls: &std::path::Path) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for line in std::fs::read_to_string(calls).unwrap().lines() {
        let thread = line.split(' ').next().unwrap().to_owned();
        *per.entry(thread).or_default() += 1;
    }
    per
}

fn retries_carry_a_batch_through_an_agent_that_fails_one_call_in_three(b: TestBackend) {
    let cli = Cli::new(b);
    let (agent, calls) = flaky_agent(&cli);
    let o = cli.uwf(&[
        "--json",
        "batch",
        "examples/review.yaml",
        "-n",
        "200",
        "-p",
        "t",
        "--jobs",
        "8",
        "--retries",
        "4",
        "--retry-backoff",
        "5ms",
        "--agent",
        &agent,
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // A line per thread, then the summary.
    let lines = json_lines(&o);
    let summary = lines.last().unwrap();
    assert_eq!(summary["summary"]["completed"], 200, "{summary}");
    let per_thread = calls_per_thread(&calls);
    let total: usize = per_thread.values().sum();
    // 400 steps; each thread's first call failed.
    assert_eq!(total, 600);
    assert_eq!(summary["summary"]["usage"]["calls"], total, "{summary}");
    // Every thread's log says how many attempts each step took, and the
    // sum is what the agent counted for that thread.
    let list = cli.json(&["thread", "list", "--limit", "1000"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 200);
    let mut retried_steps = 0;
    for t in list {
        let id = t["thread"].as_str().unwrap();
        let log = cli.log(id);
        let mut attempts = 0;
        for step in log.iter().filter(|s| s["role"] != "__end__") {
            let failed = step["attempts"].as_array().unwrap();
            attempts += failed.len() + 1;
            assert_eq!(step["usage"]["calls"], failed.len() + 1, "{step}");
            for f in failed {
                assert_eq!(f["cause"], "exit", "{f}");
                assert!(f["error"].as_str().unwrap().contains("HTTP 429"), "{f}");
                assert_eq!(f["usage"]["calls"], 1);
            }
            retried_steps += usize::from(!failed.is_empty());
        }
        assert_eq!(attempts, per_thread[id], "thread {id}");
    }
    assert!(retried_steps > 0);
    cli.verify_clean();
}

fn without_retries_the_batch_exits_non_zero_naming_the_failures(b: TestBackend) {
    let cli = Cli::new(b);
    let (agent, _) = flaky_agent(&cli);
    let o = cli.uwf(&[
        "--json",
        "batch",
        "examples/review.yaml",
        "-n",
        "30",
        "-p",
        "t",
        "--agent",
        &agent,
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let summary = json_lines(&o).pop().unwrap();
    let errors = summary["summary"]["errors"].as_u64().unwrap();
    assert!(errors > 0, "{summary}");
    // The error is JSON on stderr (its last line), with the count.
    let last = stderr(&o).lines().last().unwrap().to_owned();
    let err: serde_json::Value = serde_json::from_str(&last).unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "{errors} of 30 threads did not complete: {errors} stopped with an error"
        )),
        "{message}"
    );
    assert_eq!(err["error"]["exit_code"], 1);
    let failed = cli.json(&["thread", "list", "--failed"]);
    assert_eq!(failed.as_array().unwrap().len() as u64, errors);
    // `--retries 0` turns a workflow's own policy off too.
    let wf = std::fs::read_to_string(root().join("examples/review.yaml"))
        .unwrap()
        .replace(
            "name: review\n",
            "name: patient\nretry: { attempts: 5, backoff: 1ms }\n",
        );
    let wf = cli.file("patient.yaml", &wf);
    let o = cli.uwf(&["batch", &wf, "-n", "20", "-p", "t", "--agent", &agent]);
    assert_eq!(
        code(&o),
        Some(0),
        "the workflow's policy retries: {}",
        stderr(&o)
    );
    let o = cli.uwf(&[
        "batch",
        &wf,
        "-n",
        "20",
        "-p",
        "t",
        "--retries",
        "0",
        "--agent",
        &agent,
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("stopped with an error"),
        "{}",
        stderr(&o)
    );
}

fn a_step_out_of_attempts_says_how_many_and_why(b: TestBackend) {
    let cli = Cli::new(b);
    let wf = cli.file(
        "stubborn.yaml",
        "name: stubborn
roles:
  worker:
    goal: Work
    frontmatter: { properties: { $status: { const: done } }, required: [$status] }
    retry: { attempts: 3, backoff: 1ms, on: [exit, invalid_reply] }
graph:
  $START: { _: { role: worker, prompt: 'Work' } }
  worker: { done: { role: $END, prompt: 'Done' } }
",
    );
    let count = cli.path("n");
    // First call: a failure; then replies without frontmatter (re-asked
    // once each time, so each attempt is two calls).
    let agent = cli.file(
        "agent.sh",
        &format!(
            "cat > /dev/null; n=$(( $(cat '{c}' 2>/dev/null || echo 0) + 1 )); echo $n > '{c}'\nif [ $n -eq 1 ]; then echo 'HTTP 503' >&2; exit 1; fi\necho 'I did it'\n",
            c = count.display()
        ),
    );
    let o = cli.uwf(&[
        "run",
        &wf,
        "-p",
        "t",
        "--reasks",
        "1",
        "--agent",
        &format!("cmd:sh {agent}"),
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("after 3 attempts (earlier: exit, invalid_reply)"),
        "{e}"
    );
    assert!(e.contains("invalid reply from role 'worker'"), "{e}");
    assert_eq!(std::fs::read_to_string(&count).unwrap().trim(), "5");
    let t = &cli.json(&["thread", "list", "--failed"])[0];
    assert!(
        t["last_error"]
            .as_str()
            .unwrap()
            .contains("after 3 attempts"),
        "{t}"
    );
    // The failed step's five calls are counted on the thread.
    let shown = cli.show(t["thread"].as_str().unwrap());
    assert_eq!(shown["usage"]["calls"], 5, "{shown}");
    // A bad policy is refused with every problem named.
    let bad = cli.file(
        "bad.yaml",
        "name: bad
retry: { attempts: 0 }
roles:
  worker: { goal: Work, retry: { attempts: 2, on: [rain], backoff: 2h } }
graph:
  $START: { _: { role: worker, prompt: 'Work' } }
  worker: { _: { role: $END, prompt: 'Done' } }
",
    );
    let o = cli.uwf(&["workflow", "add", &bad]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    for want in [
        "retry.attempts: must be a whole number from 1 to 100",
        "roles.worker.retry.on: unknown cause \"rain\"",
        "roles.worker.retry.backoff: must be at most 1 hour",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

fn replies_as_models_write_them_are_accepted(b: TestBackend) {
    let cli = Cli::new(b);
    let shapes = [
        (
            "blank lines first",
            "\n\n---\n$status: review_needed\n---\nDone.\n",
        ),
        (
            "a markdown fence",
            "```markdown\n---\n$status: review_needed\n---\nDone.\n```\n",
        ),
        (
            "an md fence",
            "```md\n---\n$status: review_needed\n---\nDone.\n```",
        ),
        (
            "a yaml fence, CRLF",
            "```yaml\r\n---\r\n$status: review_needed\r\n---\r\nDone.\r\n```\r\n",
        ),
        ("CRLF", "---\r\n$status: review_needed\r\n---\r\nDone.\r\n"),
    ];
    for (what, reply) in shapes {
        let file = cli.file("reply.txt", reply);
        let t = cli.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
        let id = t["thread"].as_str().unwrap();
        let r = cli.json(&[
            "thread",
            "step",
            id,
            "--reasks",
            "0",
            "--agent",
            &format!("cmd:cat {file}"),
        ]);
        assert_eq!(r["current_role"], "reviewer", "{what}");
        assert_eq!(cli.log(id)[0]["content"], "Done.\n", "{what}");
    }
    // Prose around the fence is not a reply of that shape: re-asked with
    // the extractor's error.
    let counter = cli.path("n");
    let agent = cli.file(
        "agent.sh",
        &format!(
            "cat > /dev/null; n=$(( $(cat '{c}' 2>/dev/null || echo 0) + 1 )); echo $n > '{c}'\nif [ $n -eq 1 ]; then printf 'Sure! Here it is:\\n```markdown\\n---\\n$status: review_needed\\n---\\n```\\n'; else printf -- '---\\n$status: review_needed\\n---\\nSecond try.\\n'; fi\n",
            c = counter.display()
        ),
    );
    let t = cli.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    cli.json(&["thread", "step", id, "--agent", &format!("cmd:sh {agent}")]);
    let log = cli.log(id);
    assert_eq!(log[0]["content"], "Second try.\n");
    assert_eq!(log[0]["usage"]["calls"], 2, "re-asked once");
}

process_conformance!(
    retries_carry_a_batch_through_an_agent_that_fails_one_call_in_three,
    without_retries_the_batch_exits_non_zero_naming_the_failures,
    a_step_out_of_attempts_says_how_many_and_why,
    replies_as_models_write_them_are_accepted,
);
