//! Fan-out of child workflows through the real binary (SPEC §13,
//! `docs/design.md` §5f): a planner's 50 items run as 50 child threads at
//! most `max_concurrency` at a time and join in item order; failures within
//! `tolerate`; a driver killed mid fan-out and `batch --continue`; stop and
//! cancel of the parent reach its children; `parallel:` branches.
#![cfg(feature = "cli")]

mod common;

use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;

const SOLVE: &str = "name: solve
roles:
  solver:
    goal: Solve one task
graph:
  $START: { _: { role: solver, prompt: 'Solve it' } }
  solver: { _: { role: $END, prompt: '{{{_body}}}' } }
";

/// `plan` with a fan-out role; `TOLERATE` and `CONCURRENCY` filled in.
const PLAN: &str = "name: plan
roles:
  planner:
    goal: Split the work
    frontmatter:
      properties: { $status: { const: planned }, tasks: { type: array, items: { type: string } } }
      required: [$status, tasks]
  solve_all:
    foreach:
      items: tasks
      as: task
      workflow: solve
      prompt: 'Solve: {{task}} (item {{index}})'
      max_concurrency: CONCURRENCY
    join: { tolerate: TOLERATE }
graph:
  $START: { _: { role: planner, prompt: 'Plan the work' } }
  planner: { planned: { role: solve_all, prompt: 'Solve every task' } }
  solve_all:
    done: { role: $END, prompt: '{{completed}} of {{total}} solved' }
    failed: { role: $END, prompt: '{{failed}} failed' }
";

/// Registers `solve` and `plan`, and writes the agent: the planner answers
/// `n` tasks; a solver takes `delay` seconds, fails for the tasks listed
/// in `fail` (exit 1), and otherwise answers `solved TASK`. It logs every
/// call (`ROLE THREAD TASK`) in `calls`, and the most solver calls it saw
/// running at once in `max`.
fn setup(
    cli: &Cli,
    n: usize,
    tolerate: u32,
    concurrency: u32,
    delay: &str,
    fail: &[&str],
) -> String {
    let solve = cli.file("solve.yaml", SOLVE);
    cli.json(&["workflow", "add", &solve]);
    let plan = PLAN
        .replace("TOLERATE", &tolerate.to_string())
        .replace("CONCURRENCY", &concurrency.to_string());
    let plan = cli.file("plan.yaml", &plan);
    cli.json(&["workflow", "add", &plan]);
    let tasks: Vec<String> = (1..=n).map(|i| format!("task-{i}")).collect();
    let d = cli.path("agent");
    std::fs::create_dir_all(&d).unwrap();
    let fails = fail.join(" ");
    let script = cli.file(
        "agent.sh",
        &format!(
            r#"prompt=$(cat)
D='{d}'
if [ "$UWF_ROLE" = planner ]; then
  echo "planner $UWF_THREAD -" >> "$D/calls"
  printf -- '---\n$status: planned\ntasks: [{tasks}]\n---\nThe plan.\n'
  exit 0
fi
task=$(printf '%s\n' "$prompt" | sed -n 's/^Solve: \(task-[0-9]*\) .*/\1/p' | head -1)
exec 9>>"$D/lock"
flock 9
now=$(( $(cat "$D/now" 2>/dev/null || echo 0) + 1 )); echo $now > "$D/now"
max=$(cat "$D/max" 2>/dev/null || echo 0); [ $now -gt $max ] && echo $now > "$D/max"
echo "solver $UWF_THREAD $task" >> "$D/calls"
flock -u 9
sleep {delay}
flock 9; echo $(( $(cat "$D/now") - 1 )) > "$D/now"; flock -u 9
for f in {fails}; do
  if [ "$f" = "$task" ]; then echo "cannot solve $task" >&2; exit 1; fi
done
printf 'solved %s\n' "$task"
"#,
            d = d.display(),
            tasks = tasks.join(", "),
            delay = delay,
            fails = fails,
        ),
    );
    format!("cmd:sh {script}")
}

fn calls(cli: &Cli) -> Vec<(String, String, String)> {
    std::fs::read_to_string(cli.path("agent/calls"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut w = l.split(' ').map(str::to_owned);
            (w.next().unwrap(), w.next().unwrap(), w.next().unwrap())
        })
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fifty_items_fan_out_eight_at_a_time_and_join_in_item_order(b: TestBackend) {
    let cli = Cli::new(b);
    let agent = setup(&cli, 50, 0, 8, "0.2", &[]);
    let r = cli.json(&["run", "plan", "-p", "Ship it", "--agent", &agent]);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap();
    let max: usize = std::fs::read_to_string(cli.path("agent/max"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        (2..=8).contains(&max),
        "peak concurrent solver calls: {max}"
    );
    // One call per child, each child driven once.
    let solver: Vec<_> = calls(&cli)
        .into_iter()
        .filter(|c| c.0 == "solver")
        .collect();
    assert_eq!(solver.len(), 50);
    let mut threads: Vec<&String> = solver.iter().map(|c| &c.1).collect();
    threads.sort();
    threads.dedup();
    assert_eq!(threads.len(), 50, "50 distinct child threads");
    // The join: results in item order, the body in item order, the end.
    let log = cli.log(id);
    assert_eq!(log[0]["content"], "50 of 50 solved");
    let join = &log[1];
    assert_eq!(join["role"], "solve_all");
    assert_eq!(join["status"], "done");
    let results = join["meta"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 50);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["index"], i + 1);
        assert_eq!(r["status"], "completed");
        assert_eq!(r["summary"], format!("solved task-{}\n", i + 1), "{r}");
    }
    let body = join["content"].as_str().unwrap();
    let p7 = body.find("solved task-7\n").unwrap();
    let p8 = body.find("solved task-8\n").unwrap();
    assert!(p7 < p8, "item order, not completion order");
    assert_eq!(join["meta"]["$children"].as_array().unwrap().len(), 50);
    // The children are ordinary threads in the call stack.
    let tree = cli.json(&["thread", "tree", id]);
    assert_eq!(
        tree["thread"]["children"].as_array().unwrap().len(),
        50,
        "{tree}"
    );
    let child = results[0]["thread"].as_str().unwrap();
    let shown = cli.show(child);
    assert_eq!(shown["task"], "Solve: task-1 (item 1)");
    assert_eq!(shown["parent_thread"], id);
    cli.verify_clean();
}

fn failures_within_tolerate_join_done_and_more_fail_the_join(b: TestBackend) {
    let cli = Cli::new(b);
    let agent = setup(&cli, 12, 2, 4, "0", &["task-3", "task-9"]);
    let r = cli.json(&["run", "plan", "-p", "t", "--agent", &agent]);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap();
    let log = cli.log(id);
    assert_eq!(log[0]["content"], "10 of 12 solved");
    let results = log[1]["meta"]["results"].as_array().unwrap();
    let statuses: Vec<&str> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses[2], "cancelled",
        "a tolerated errored child is ended"
    );
    assert_eq!(statuses[8], "cancelled");
    assert_eq!(statuses.iter().filter(|s| **s == "completed").count(), 10);
    // Nothing of this fan-out is left for a runner to pick up.
    let idle = cli.json(&["thread", "list", "--status", "idle"]);
    assert!(idle.as_array().unwrap().is_empty(), "{idle}");

    // Three failing children with tolerate 2: the step fails (a retry may
    // mend the errors), nothing is committed, and a rerun drives only the
    // children that did not finish.
    let cli = Cli::new(b);
    let agent = setup(&cli, 12, 2, 4, "0", &["task-3", "task-9", "task-11"]);
    let o = cli.uwf(&["run", "plan", "-p", "t", "--agent", &agent]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("3 children failed, more than the 2 its join tolerates"),
        "{}",
        stderr(&o)
    );
    let parent = &cli.json(&["thread", "list", "--workflow", "plan"])[0];
    assert_eq!(parent["status"], "idle");
    assert_eq!(parent["next_role"], "solve_all");
    let before = calls(&cli).len();
    let pid = parent["thread"].as_str().unwrap();
    // The same failures again: only the three errored children are
    // driven; the nine that completed are not.
    let o = cli.uwf(&["thread", "step", pid, "--agent", &agent]);
    assert_eq!(code(&o), Some(1));
    let again: Vec<_> = calls(&cli)[before..].to_vec();
    let mut tasks: Vec<&str> = again.iter().map(|c| c.2.as_str()).collect();
    tasks.sort();
    assert_eq!(tasks, ["task-11", "task-3", "task-9"]);
}

fn a_killed_driver_is_continued_with_no_child_driven_twice(b: TestBackend) {
    let cli = Cli::new(b);
    let agent = setup(&cli, 50, 0, 8, "0.3", &[]);
    let t = cli.json(&["thread", "start", "plan", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let mut driver = cli
        .std_cmd()
        .args(["thread", "step", &id, "-c", "5", "--agent", &agent])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("some children to finish", || {
        calls(&cli).iter().filter(|c| c.0 == "solver").count() >= 20
    });
    driver.kill().unwrap(); // SIGKILL
    driver.wait().unwrap();
    let o = cli.uwf(&["--json", "batch", "plan", "--continue", "--agent", &agent]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(cli.show(&id)["status"], "completed");
    let log = cli.log(&id);
    let results = log[1]["meta"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 50);
    assert!(results.iter().all(|r| r["status"] == "completed"));
    // Each child's task was called once, but for the calls in flight when
    // the driver died (at most 8), whose steps were never committed.
    let solver: Vec<_> = calls(&cli)
        .into_iter()
        .filter(|c| c.0 == "solver")
        .collect();
    assert!(
        (50..=58).contains(&solver.len()),
        "{} solver calls",
        solver.len()
    );
    let mut threads: Vec<&String> = solver.iter().map(|c| &c.1).collect();
    threads.sort();
    threads.dedup();
    assert_eq!(threads.len(), 50, "no second set of children");
    for r in results {
        let child = r["thread"].as_str().unwrap();
        assert_eq!(cli.log(child).len(), 2, "one step and the end: {child}");
    }
    cli.verify_clean();
}

fn stop_and_cancel_of_the_parent_reach_its_children(b: TestBackend) {
    let cli = Cli::new(b);
    let agent = setup(&cli, 12, 0, 2, "0.5", &[]);
    let t = cli.json(&["thread", "start", "plan", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let driver = cli
        .std_cmd()
        .args(["thread", "step", &id, "-c", "5", "--agent", &agent])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the fan-out to start", || {
        calls(&cli).iter().any(|c| c.0 == "solver")
    });
    let o = cli.uwf(&["thread", "stop", &id]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let out = driver.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = cli.show(&id);
    assert_eq!(s["status"], "idle", "{s}");
    assert_eq!(s["next_role"], "solve_all");
    let started = calls(&cli).iter().filter(|c| c.0 == "solver").count();
    assert!(started < 12, "the children stopped: {started} of 12 ran");
    let children = s["children"].as_array().unwrap().clone();
    assert_eq!(children.len(), 12);
    // Cancel reaches every child not ended.
    cli.json(&["thread", "cancel", &id]);
    for c in &children {
        let st = cli.show(c.as_str().unwrap())["status"].clone();
        assert!(st == "completed" || st == "cancelled", "{st}");
    }
    assert!(
        cli.json(&["thread", "list", "--status", "idle"])
            .as_array()
            .unwrap()
            .is_empty()
    );
}

fn parallel_branches_join_in_name_order(b: TestBackend) {
    let cli = Cli::new(b);
    let solve = cli.file("solve.yaml", SOLVE);
    cli.json(&["workflow", "add", &solve]);
    let wf = cli.file(
        "review2.yaml",
        "name: review2
roles:
  both:
    parallel:
      style: { workflow: solve, prompt: 'Solve: task-1 (style)' }
      security: { workflow: solve, prompt: 'Solve: task-2 (security)' }
    join: { on_failure: continue }
graph:
  $START: { _: { role: both, prompt: 'Review' } }
  both: { done: { role: $END, prompt: '{{{_body}}}' } }
",
    );
    let script = cli.file(
        "echo.sh",
        "prompt=$(cat); printf '%s\\n' \"$prompt\" | sed -n 's/^Solve: task-[0-9]* (\\(.*\\))$/checked \\1/p' | head -1\n",
    );
    let r = cli.json(&[
        "run",
        &wf,
        "-p",
        "t",
        "--agent",
        &format!("cmd:sh {script}"),
    ]);
    assert_eq!(r["status"], "completed", "{r}");
    let log = cli.log(r["thread"].as_str().unwrap());
    let results = log[1]["meta"]["results"].as_array().unwrap();
    assert_eq!(results[0]["key"], "security");
    assert_eq!(results[0]["summary"], "checked security\n");
    assert_eq!(results[1]["key"], "style");
    // A bad fan-out is refused with every problem named.
    let bad = cli.file(
        "bad.yaml",
        "name: bad
roles:
  fan:
    foreach: { items: tasks, workflow: nowhere, max_concurrency: 0 }
    join: { on_failure: sometimes }
graph:
  $START: { _: { role: fan, prompt: 'Go' } }
  fan: { done: { role: $END, prompt: 'D' }, maybe: { role: $END, prompt: 'M' } }
",
    );
    let o = cli.uwf(&["workflow", "add", &bad]);
    assert_eq!(code(&o), Some(1));
    let e = stderr(&o);
    for want in [
        "roles.fan.foreach.workflow: child workflow 'nowhere' is not registered",
        "roles.fan.foreach.prompt: missing or empty",
        "roles.fan.foreach.max_concurrency: must be a whole number from 1 to 64",
        "roles.fan.join.on_failure: 'sometimes' is not a failure policy",
        "graph.fan.maybe: a fan-out role's statuses are done and failed, not 'maybe'",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// `examples/survey.yaml`, as the README runs it.
fn the_survey_example_runs(b: TestBackend) {
    let cli = Cli::new(b);
    cli.json(&["workflow", "add", "examples/review.yaml"]);
    let r = cli.json(&[
        "run",
        "examples/survey.yaml",
        "-p",
        "Add a --json flag",
        "--agent",
        "script:examples/survey.scenario.yaml",
    ]);
    assert_eq!(r["status"], "completed", "{r}");
    let log = cli.log(r["thread"].as_str().unwrap());
    assert_eq!(log[0]["content"], "3 of 3 parts built and approved");
    let results = log[1]["meta"]["results"].as_array().unwrap();
    let tasks: Vec<String> = results
        .iter()
        .map(|r| {
            cli.show(r["thread"].as_str().unwrap())["task"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        tasks,
        [
            "Implement this part of the change: the parser",
            "Implement this part of the change: the printer",
            "Implement this part of the change: the tests"
        ]
    );
    cli.verify_clean();
}

/// A child that asks a human leaves the parent suspended until it is
/// answered: directly (then the parent goes on without an answer of its
/// own), or through the parent's resume.
fn a_waiting_child_suspends_the_parent(b: TestBackend) {
    let cli = Cli::new(b);
    setup(&cli, 3, 0, 2, "0", &[]);
    let script = cli.file(
        "asker.sh",
        r#"prompt=$(cat)
if [ "$UWF_ROLE" = planner ]; then printf -- '---\n$status: planned\ntasks: [task-1, task-2, task-3]\n---\nplan\n'; exit 0; fi
task=$(printf '%s\n' "$prompt" | sed -n 's/^Solve: \(task-[0-9]*\) .*/\1/p' | head -1)
if [ "$task" != task-1 ] && ! printf '%s' "$prompt" | grep -q 'ANSWER'; then
  printf -- '---\n$status: $SUSPEND\nreason: Which version for %s?\n---\n' "$task"; exit 0
fi
printf 'solved %s\n' "$task"
"#,
    );
    let agent = format!("cmd:sh {script}");
    let r = cli.json(&["run", "plan", "-p", "t", "--agent", &agent]);
    assert_eq!(r["status"], "suspended", "{r}");
    assert_eq!(r["suspended_role"], "solve_all");
    let message = r["suspend_message"].as_str().unwrap();
    assert!(
        message.starts_with("2 of 3 children wait for a human's answer"),
        "{message}"
    );
    assert!(message.contains("Which version for task-2?"), "{message}");
    let id = r["thread"].as_str().unwrap().to_owned();
    let children: Vec<String> = cli.show(&id)["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let waiting: Vec<&String> = children
        .iter()
        .filter(|c| cli.show(c)["status"] == "suspended")
        .collect();
    assert_eq!(waiting.len(), 2);
    // One child answered directly; the other through the parent.
    let o = cli.uwf(&["thread", "resume", waiting[0], "-p", "ANSWER: 2.0"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(cli.show(waiting[0])["status"], "completed");
    let r = cli.json(&["thread", "resume", &id, "-p", "ANSWER: 3.0", "-c", "3"]);
    let last = r.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["status"], "completed", "{r}");
    assert_eq!(cli.log(&id)[0]["content"], "3 of 3 solved");
    for c in &children {
        assert_eq!(cli.show(c)["status"], "completed");
    }
    cli.verify_clean();
}

process_conformance!(
    a_waiting_child_suspends_the_parent,
    the_survey_example_runs,
    fifty_items_fan_out_eight_at_a_time_and_join_in_item_order,
    failures_within_tolerate_join_done_and_more_fail_the_join,
    a_killed_driver_is_continued_with_no_child_driven_twice,
    stop_and_cancel_of_the_parent_reach_its_children,
    parallel_branches_join_in_name_order,
);
