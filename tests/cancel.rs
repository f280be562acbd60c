//! Cancellation tokens through the library API: cancelling a drive's token
//! kills the agent process group started under it and leaves the thread
//! retryable (`docs/design.md` §5c).

mod common;

use std::time::{Duration, Instant};

use common::backend::TestBackend;
use uwf_db::engine::agent::AgentOptions;
use uwf_db::engine::{Cancel, DriveOptions, EngineError, StartOptions, claim};
use uwf_db::thread::ThreadStatus;
use uwf_db::workflow::parse_workflow;

fn cancelling_a_token_kills_its_agent_and_leaves_the_thread_retryable(b: TestBackend) {
    let store = b.fast();
    let yaml = "name: one\nroles:\n  worker:\n    goal: Work\ngraph:\n  $START:\n    _: { role: worker, prompt: 'Work' }\n  worker:\n    _: { role: $END, prompt: 'Done' }\n";
    let wf = parse_workflow(yaml, Some("one"), &|_| false).unwrap();
    let wf = store.workflows().add(&wf).unwrap().0;
    let id = store
        .engine()
        .start_workflow(wf, "a task", &StartOptions::default())
        .unwrap()
        .id;
    let pid_file = store.scratch().join("agent.pid");
    let spec = format!(
        "cmd:sh -c 'echo $$ > {}; exec sleep 30'",
        pid_file.display()
    );
    let (mut agent, spec) = store
        .engine()
        .agent_for(id, Some(&spec), &AgentOptions::default())
        .unwrap();
    let cancel = Cancel::new();
    let options = DriveOptions {
        agent_spec: Some(spec),
        cancel: cancel.clone(),
        ..DriveOptions::default()
    };
    std::thread::scope(|s| {
        let drive = s.spawn(|| store.engine().drive(id, &options, agent.as_mut()));
        let started = Instant::now();
        let pid = loop {
            if let Ok(p) = std::fs::read_to_string(&pid_file)
                && let Ok(p) = p.trim().parse::<u32>()
            {
                break p;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "agent never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        assert!(proc.exists());
        assert_eq!(
            store.threads().get(id).unwrap().unwrap().status,
            ThreadStatus::Running
        );
        let cancelled = Instant::now();
        cancel.cancel();
        // Synchronously inside `cancel`: the thread has its status back.
        assert_eq!(
            store.threads().get(id).unwrap().unwrap().status,
            ThreadStatus::Idle
        );
        let report = drive.join().unwrap();
        assert!(cancelled.elapsed() < Duration::from_secs(10));
        assert!(report.results.is_empty());
        assert!(
            matches!(report.error, Some(EngineError::Interrupted)),
            "{:?}",
            report.error
        );
        // The agent's process is gone (killed and reaped).
        assert!(!proc.exists(), "agent process {pid} still runs");
    });
    // Retryable: idle, no claim, no failure recorded, the spec stored.
    let record = store.threads().get(id).unwrap().unwrap();
    assert_eq!(record.status, ThreadStatus::Idle);
    assert_eq!(record.claimed_status, None);
    assert_eq!(record.last_error, None);
    assert_eq!(record.next_role.as_deref(), Some("worker"));
    assert!(!claim::is_held(&store, id).unwrap());
    // The cancelled token starts nothing more; a new one drives on.
    let again = store.engine().drive(id, &options, agent.as_mut());
    assert!(matches!(again.error, Some(EngineError::Interrupted)));
    let (mut quick, _) = store
        .engine()
        .agent_for(id, Some("cmd:echo done"), &AgentOptions::default())
        .unwrap();
    let done = store
        .engine()
        .drive(id, &DriveOptions::default(), quick.as_mut())
        .into_result()
        .unwrap();
    assert_eq!(done.last().unwrap().status, ThreadStatus::Completed);
}

conformance!(cancelling_a_token_kills_its_agent_and_leaves_the_thread_retryable);
