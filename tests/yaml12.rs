//! YAML 1.2 core schema everywhere (SPEC §4): the YAML 1.1 boolean words
//! `y`, `n`, `yes`, `no`, `on`, `off`, in every case, stay strings as status
//! consts, as property names and as frontmatter values, in workflow files,
//! scenario files and agent replies; the frontmatter fast path and the
//! parser agree on them.

use uwf_db::engine::StartOptions;
use uwf_db::engine::agent::ScriptAgent;
use uwf_db::engine::extract::{extract, flat_frontmatter};
use uwf_db::thread::ThreadStatus;
use uwf_db::workflow::parse_workflow;
use uwf_db::{Store, Value};

/// The YAML 1.1 boolean words, lower, Upper and UPPER.
const WORDS: [&str; 16] = [
    "y", "Y", "n", "N", "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF",
];

/// A workflow whose role `asker` answers with status `word` (and a property
/// named `word`, required, used in the edge prompt) or `other`; `word` is
/// also its goal, a flow-sequence item and a plain edge prompt.
fn workflow_of(word: &str) -> String {
    format!(
        "name: words
roles:
  asker:
    goal: {word}
    capabilities: [{word}]
    frontmatter:
      oneOf:
        - properties: {{ $status: {{ const: {word} }}, {word}: {{ type: string }} }}
          required: [$status, {word}]
        - properties: {{ $status: {{ enum: [other] }} }}
          required: [$status]
graph:
  $START:
    _: {{ role: asker, prompt: {word} }}
  asker:
    {word}: {{ role: $END, prompt: 'Said {{{{{word}}}}}' }}
    other: {{ role: $END, prompt: {word} }}
"
    )
}

#[test]
fn yaml_11_boolean_words_stay_strings_in_workflows_scenarios_and_replies() {
    let dir = tempfile::tempdir().unwrap();
    for word in WORDS {
        // The workflow file: `const: no` is the status "no", `required: [n]`
        // names the property "n".
        let wf = parse_workflow(&workflow_of(word), Some("words"), &|_| false)
            .unwrap_or_else(|p| panic!("{word}: {p:#?}"));
        let asker = &wf.roles["asker"];
        assert_eq!(asker.goal.as_deref(), Some(word));
        assert_eq!(asker.capabilities, vec![word.to_owned()]);
        let schema = asker.frontmatter.as_ref().unwrap();
        assert_eq!(schema["oneOf"][0]["properties"]["$status"]["const"], word);
        assert_eq!(schema["oneOf"][0]["required"][1], word);
        assert_eq!(wf.first().unwrap(), ("asker".into(), word.into()));

        // The reply: the fast path takes it, and the parser (forced by a
        // comment) gives the same frontmatter.
        let reply = format!("---\n$status: {word}\n{word}: {word}\n---\nbody\n");
        let front = reply.split("---\n").nth(1).unwrap();
        let fast = flat_frontmatter(front).unwrap_or_else(|| panic!("{word}: fast path"));
        let parsed: serde_json::Value = uwf_db::yaml::from_str(front).unwrap();
        assert_eq!(serde_json::Value::Object(fast), parsed, "{word}");
        let commented = format!("---\n$status: {word}  # c\n{word}: {word}\n---\nbody\n");
        let a = extract(asker, &reply).unwrap();
        let b = extract(asker, &commented).unwrap();
        assert_eq!(a, b, "{word}: fast path and parser");
        assert_eq!(a.meta["$status"], Value::Str(word.into()));
        assert_eq!(a.meta[word], Value::Str(word.into()));

        // The scenario file: `role:` and the reply are read as written, and
        // the thread routes on the status `word`.
        let scenario = dir.path().join(format!("{word}.scenario.yaml"));
        std::fs::write(
            &scenario,
            format!(
                "steps:\n  - role: asker\n    output: |\n      ---\n      $status: {word}\n      {word}: {word}\n      ---\n      Answered.\n"
            ),
        )
        .unwrap();
        let mut agent = ScriptAgent::load(&scenario).unwrap();
        let store = Store::memory();
        let (hash, _) = store.workflows().add(&wf).unwrap();
        let (thread, report) = store
            .engine()
            .run_workflow(hash, "a task", &StartOptions::default(), &mut agent)
            .unwrap();
        let results = report.into_result().unwrap();
        assert_eq!(results.last().unwrap().status, ThreadStatus::Completed);
        let log = store.threads().log(thread.id, 10, None).unwrap();
        assert_eq!(log[1].node.meta["$status"], Value::Str(word.into()));
        assert_eq!(
            log[0].node.meta["summary"],
            Value::Str(format!("Said {word}"))
        );
    }
}

/// The YAML 1.2 booleans are still booleans, in every spelling the core
/// schema allows.
#[test]
fn true_and_false_are_booleans() {
    let v: serde_json::Value =
        uwf_db::yaml::from_str("a: true\nb: True\nc: TRUE\nd: false\ne: False\nf: FALSE\n")
            .unwrap();
    for k in ["a", "b", "c"] {
        assert_eq!(v[k], true, "{k}");
    }
    for k in ["d", "e", "f"] {
        assert_eq!(v[k], false, "{k}");
    }
    // A status const that is a real boolean is refused as a status, as before.
    let yaml = workflow_of("x").replace("const: x", "const: true");
    assert!(parse_workflow(&yaml, Some("words"), &|_| false).is_err());
}
