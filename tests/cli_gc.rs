//! `uwf-db gc` through the real binary, while other processes drive
//! threads.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn gc_frees_a_removed_thread_while_other_processes_drive_threads(b: TestBackend) {
    let env = Cli::new(b);
    let run = |prompt: &str| {
        env.json(&[
            "run",
            "examples/review.yaml",
            "-p",
            prompt,
            "--agent",
            "script:examples/review.scenario.yaml",
        ])
    };
    let gone = run("to be removed");
    let kept = run("to be kept");
    let gone = gone["thread"].as_str().unwrap();
    let kept = kept["thread"].as_str().unwrap();
    env.json(&["thread", "rm", gone]);
    let dry = env.json(&["gc", "--dry-run", "--grace", "0"]);
    // The removed thread's start, four steps, end, and their unique texts.
    assert!(dry["swept"].as_u64().unwrap() >= 6, "{dry}");
    assert_eq!(env.json(&["gc"])["swept"], 0, "within the default grace");

    // Collections with no grace period while other processes run threads.
    let drivers: Vec<_> = (0..3)
        .map(|i| {
            env.spawn(&[
                "run",
                "examples/review.yaml",
                "-p",
                &format!("concurrent {i}"),
                "--agent",
                "script:examples/review.scenario.yaml",
            ])
        })
        .collect();
    let mut swept = 0;
    for _ in 0..5 {
        swept += env.json(&["gc", "--grace", "0"])["swept"].as_u64().unwrap();
    }
    for d in drivers {
        let o = d.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(swept, dry["swept"].as_u64().unwrap());
    assert_eq!(env.log(kept).len(), 5);
    let listed = env.json(&["thread", "list"]);
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    for t in listed.as_array().unwrap() {
        let id = t["thread"].as_str().unwrap();
        assert_eq!(env.log(id).len(), 5, "thread {id} reads back whole");
    }
    // Drop runs `verify`.
}

process_conformance!(gc_frees_a_removed_thread_while_other_processes_drive_threads,);
