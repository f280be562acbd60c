//! A child workflow's agent knows whom it works for (issue 21; seed 000,
//! phase 3): a three-level call stack where the innermost agent's prompt is
//! checked byte for byte, and a `cmd:` agent that follows the command it
//! was given to read its grandparent's task. On LMDB and PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const TOP: &str = "\
name: top
maxRounds: 10
roles:
  plan:
    goal: Plan the release
  delegate:
    description: Runs the mid workflow as a child thread
    workflow: mid
graph:
  $START: { _: { role: plan, prompt: 'Plan it' } }
  plan: { _: { role: delegate, prompt: 'Build the parts the plan names' } }
  delegate:
    done: { role: $END, prompt: 'Released' }
    failed: { role: $END, prompt: 'Not released' }
";

const MID: &str = "\
name: mid
roles:
  design:
    goal: Design the parts
  build:
    goal: Build each part
    workflow: leaf
graph:
  $START: { _: { role: design, prompt: 'Design the parts' } }
  design: { _: { role: build, prompt: 'Build the parser' } }
  build:
    done: { role: $END, prompt: 'Built' }
    failed: { role: $END, prompt: 'Broken' }
";

const LEAF: &str = "\
name: leaf
roles:
  code:
    goal: Write the code
graph:
  $START: { _: { role: code, prompt: 'Write the parser' } }
  code: { _: { role: $END, prompt: 'Coded' } }
";

/// The agent: keeps the prompt it got (one file per role), and as `code`
/// follows the `uwf-db cas get HASH` its prompt names for the top-level
/// thread's task, answering with what that printed.
const AGENT: &str = r#"prompt=$(cat)
printf '%s' "$prompt" > "$PROMPTS/$UWF_ROLE.txt"
if [ "$UWF_ROLE" = code ]; then
  cmd=$(printf '%s\n' "$prompt" | sed -n 's/^- depth 0: .*; its task: \(uwf-db cas get [0-9a-f]*\)$/\1/p')
  [ -n "$cmd" ] || { echo "no command for the top-level task in the prompt" >&2; exit 3; }
  task=$($cmd | sed '1,/^$/d') || exit 4
  printf 'The top-level task is: %s\n' "$task"
else
  printf 'Did %s\n' "$UWF_ROLE"
fi
"#;

fn the_innermost_agent_is_told_its_call_stack(b: TestBackend) {
    let env = Cli::new(b);
    let top = env.file("top.yaml", TOP);
    for (name, text) in [("leaf.yaml", LEAF), ("mid.yaml", MID)] {
        env.json(&["workflow", "add", &env.file(name, text)]);
    }
    let agent = env.file("agent.sh", AGENT);
    let prompts = env.path("prompts");
    std::fs::create_dir(&prompts).unwrap();
    // The agent runs `uwf-db` from PATH, as a real agent would.
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_uwf-db"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = env
        .cmd()
        .args([
            "--json",
            "run",
            &top,
            "-p",
            "Release 2.0 with a JSON parser",
        ])
        .args(["--agent", &format!("cmd:sh {agent}")])
        .env("PROMPTS", &prompts)
        .env("PATH", path)
        .output()
        .unwrap();
    let r = json_of(&o);
    assert_eq!(r["status"], "completed", "{r}");
    let top_id = r["thread"].as_str().unwrap().to_owned();

    // The three threads and the nodes the prompt names.
    let mid_id = only_child(&env, &top_id);
    let leaf_id = only_child(&env, &mid_id);
    let start = |id: &str| env.json(&["cas", "get", env.show(id)["start"].as_str().unwrap()]);
    let (top_start, mid_start, leaf_start) = (start(&top_id), start(&mid_id), start(&leaf_id));
    let top_task = top_start["payload"]["prompt"].as_str().unwrap();
    let mid_task = mid_start["payload"]["prompt"].as_str().unwrap();
    let top_state = mid_start["payload"]["parent_state"].as_str().unwrap();
    let mid_state = leaf_start["payload"]["parent_state"].as_str().unwrap();
    let top_log = env.log(&top_id);
    let mid_log = env.log(&mid_id);
    // The parents called after their first step.
    assert_eq!(top_log.last().unwrap()["hash"], top_state);
    assert_eq!(mid_log.last().unwrap()["hash"], mid_state);
    let design = &mid_state[..12];

    let section = format!(
        "## You are working for a parent workflow
This thread ({leaf_id}, workflow `leaf`) runs for thread {mid_id} (workflow `mid`): its role `build` gave you the task above, and the parent goes on with this thread's end summary.
That role's goal: Build each part

### The parent's task (blob {mid_task})
Build the parts the plan names

### The parent's steps before it called, oldest first
- #1 design (node {design}): Did design

### Further up the call stack, nearest first
- depth 0: thread {top_id} (workflow `top`), at node {top_state}; its task: uwf-db cas get {top_task}

### Reading more (nodes never change)
- uwf-db thread show {mid_id} --json: the parent's record, usage and next step
- uwf-db thread log {mid_id}: its steps, newest first
- uwf-db thread tree {leaf_id}: the whole call stack, parents up and children down
- uwf-db cas get HASH: any node or text named here
- MCP (uwf-db mcp): get_thread, read_log, read_node, call_stack"
    );
    let want = format!(
        "# Role: code

## Goal
Write the code

## Output format
Reply in markdown. No frontmatter is needed.

## Task
Build the parser

{section}

## Instruction
Write the parser
"
    );
    let got = std::fs::read_to_string(prompts.join("code.txt")).unwrap();
    // The shell's $(cat) drops the trailing newline.
    assert_eq!(got, want.trim_end());

    // The agent followed the command it was given and read the top-level
    // thread's task.
    let leaf_log = env.log(&leaf_id);
    let code = leaf_log.iter().find(|e| e["role"] == "code").unwrap();
    assert_eq!(
        code["content"],
        "The top-level task is: Release 2.0 with a JSON parser\n"
    );

    // The middle level is told of the top only; its parent is the top.
    let mid_prompt = std::fs::read_to_string(prompts.join("design.txt")).unwrap();
    assert!(mid_prompt.contains(&format!(
        "This thread ({mid_id}, workflow `mid`) runs for thread {top_id} (workflow `top`): its role `delegate` gave you the task above"
    )));
    assert!(mid_prompt.contains("That role's goal: Runs the mid workflow as a child thread"));
    assert!(mid_prompt.contains("- #1 plan (node "));
    assert!(!mid_prompt.contains("Further up the call stack"));
    // A top-level thread's prompt has no such section.
    let plan_prompt = std::fs::read_to_string(prompts.join("plan.txt")).unwrap();
    assert!(!plan_prompt.contains("parent workflow"), "{plan_prompt}");

    // The same, as data and text, in `thread show` (the parent's call has
    // ended by now: the role is found from the parent's workflow).
    let shown = env.show(&leaf_id);
    let pc = &shown["parent_context"];
    assert_eq!(pc["section"].as_str().unwrap().trim(), section);
    assert_eq!(pc["thread"], mid_id.as_str());
    assert_eq!(pc["role"], "build");
    assert_eq!(pc["task"]["hash"], mid_task);
    assert_eq!(pc["task"]["text"], "Build the parts the plan names");
    assert_eq!(pc["steps"][0]["hash"], mid_state);
    assert_eq!(pc["ancestors"][0]["thread"], top_id.as_str());
    assert_eq!(pc["ancestors"][0]["task"], top_task);
    let text = stdout(&env.uwf(&["thread", "show", &leaf_id]));
    assert!(text.contains(&section), "{text}");
    assert!(env.show(&top_id).get("parent_context").is_none());
}

/// A long parent task and many parent steps: the section stays within its
/// limit, cuts the oldest steps first and says how to read them.
fn the_parent_context_is_bounded(b: TestBackend) {
    let env = Cli::new(b);
    let top = env.file(
        "loop.yaml",
        "name: loop
maxRounds: 100
roles:
  work:
    goal: Work
    frontmatter: { properties: { $status: { enum: [again, call] } }, required: [$status] }
  call: { workflow: leaf }
graph:
  $START: { _: { role: work, prompt: 'Work' } }
  work:
    again: { role: work, prompt: 'Again' }
    call: { role: call, prompt: 'Call the leaf' }
  call: { done: { role: $END, prompt: 'Done' }, failed: { role: $END, prompt: 'Failed' } }
",
    );
    env.json(&["workflow", "add", &env.file("leaf.yaml", LEAF)]);
    let prompts = env.path("prompts");
    std::fs::create_dir(&prompts).unwrap();
    // 40 steps of `work` with long replies, then the call.
    let counter = env.path("n");
    let agent = env.file(
        "agent.sh",
        &format!(
            r#"prompt=$(cat)
printf '%s' "$prompt" > "$PROMPTS/$UWF_ROLE.txt"
n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}
if [ $n -lt 40 ]; then s=again; else s=call; fi
[ "$UWF_ROLE" = work ] && printf -- '---\n$status: %s\n---\n' "$s"
printf 'step %s %s\n' "$n" "$(printf 'x%.0s' $(seq 1 400))"
"#,
            c = counter.display()
        ),
    );
    let long_task = "T".repeat(5000);
    let o = env
        .cmd()
        .args(["--json", "run", &top, "-p", &long_task])
        .args(["--agent", &format!("cmd:sh {agent}")])
        .env("PROMPTS", &prompts)
        .output()
        .unwrap();
    let r = json_of(&o);
    assert_eq!(r["status"], "completed", "{r}");
    let leaf_id = only_child(&env, r["thread"].as_str().unwrap());
    let pc = env.show(&leaf_id)["parent_context"].clone();
    let section = pc["section"].as_str().unwrap();
    assert!(section.len() <= 4096, "{} bytes", section.len());
    assert_eq!(pc["task"]["cut"], true);
    assert_eq!(pc["task"]["bytes"], 5000);
    let steps = pc["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() < 20, "{}", steps.len());
    // Newest kept, oldest cut, and counted.
    assert_eq!(steps.last().unwrap()["seq"], 40);
    let first = steps[0]["seq"].as_u64().unwrap();
    assert_eq!(pc["steps_not_listed"], first - 1);
    assert!(section.contains(&format!(
        "({} earlier: uwf-db thread log {} --before {})",
        first - 1,
        pc["thread"].as_str().unwrap(),
        &steps[0]["hash"].as_str().unwrap()[..12]
    )));
    assert!(section.contains(&format!(
        "more bytes: uwf-db cas get {}]",
        pc["task"]["hash"].as_str().unwrap()
    )));
    let prompt = std::fs::read_to_string(prompts.join("code.txt")).unwrap();
    assert!(prompt.contains(section.trim()));
}

fn only_child(env: &Cli, id: &str) -> String {
    let kids = env.show(id)["children"].as_array().unwrap().clone();
    assert_eq!(kids.len(), 1, "{id}: {kids:?}");
    kids[0].as_str().unwrap().to_owned()
}

process_conformance!(
    the_innermost_agent_is_told_its_call_stack,
    the_parent_context_is_bounded
);
