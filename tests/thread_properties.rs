//! Random sequences of append / fork / end / resume / suspend on several
//! threads, checked against a simple model: every chain is exactly what the
//! model says (so a fork never changes its source), every node's `seq` and
//! `ancestors` obey the rules, every head resolves, and `verify` is clean.

mod common;

use common::backend::TestBackend;
use common::{new_thread, next, step};
use proptest::prelude::*;
use uwf_db::thread::{EndSpec, Next, ThreadError, ThreadId, ThreadStatus};
use uwf_db::verify::verify;
use uwf_db::{Blob, Hash};

#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    Suspend(usize),
    End(usize, u8),
    Resume(usize),
    Fork(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..8).prop_map(Op::Append),
        1 => (0usize..8).prop_map(Op::Suspend),
        1 => (0usize..8, 0u8..3).prop_map(|(t, c)| Op::End(t, c)),
        1 => (0usize..8).prop_map(Op::Resume),
        2 => (0usize..8, 0usize..64).prop_map(|(t, at)| Op::Fork(t, at)),
    ]
}

/// What the model knows of a thread.
struct Model {
    id: ThreadId,
    start: Hash,
    /// State nodes, oldest first.
    chain: Vec<Hash>,
    /// Which of them are end nodes.
    ends: Vec<bool>,
    status: ThreadStatus,
}

fn end_spec(code: u8) -> EndSpec {
    EndSpec {
        return_code: code,
        summary: format!("end {code}"),
        prompt: "done".into(),
    }
}

fn chains_match_the_model(b: TestBackend) {
    let config = ProptestConfig {
        source_file: Some(file!()),
        ..ProptestConfig::with_cases(48)
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let ops = prop::collection::vec(op(), 1..60);
    if let Err(e) = runner.run(&ops, |ops| check_chains(b, ops)) {
        panic!("{e}");
    }
}

fn check_chains(b: TestBackend, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = b.fast();
    let mut models: Vec<Model> = (0..2)
        .map(|i| {
            let r = new_thread(&store, &format!("w{i}"));
            Model {
                id: r.id,
                start: r.start,
                chain: vec![],
                ends: vec![],
                status: r.status,
            }
        })
        .collect();
    for (n, op) in ops.into_iter().enumerate() {
        let len = models.len();
        match op {
            Op::Append(t) | Op::Suspend(t) | Op::End(t, _) => {
                let m = &mut models[t % len];
                let head = *m.chain.last().unwrap_or(&m.start);
                let after = match op {
                    Op::Suspend(_) => Next::Suspend {
                        role: "dev".into(),
                        message: "ask".into(),
                    },
                    Op::End(_, code) => Next::End(end_spec(code)),
                    _ => next("dev"),
                };
                let r = store.threads().low_level().append_step(
                    m.id,
                    head,
                    step("dev", "s", &format!("op {n}")),
                    after,
                );
                if m.status.is_done() {
                    let refused = matches!(r, Err(ThreadError::WrongStatus { .. }));
                    prop_assert!(refused);
                    continue;
                }
                let w = r.unwrap();
                m.chain.push(w.step.unwrap());
                m.ends.push(false);
                if let Some(e) = w.end {
                    m.chain.push(e);
                    m.ends.push(true);
                }
                m.status = w.record.status;
            }
            Op::Resume(t) => {
                let m = &mut models[t % len];
                let head = *m.chain.last().unwrap_or(&m.start);
                let r = store.threads().low_level().resume_ended(
                    m.id,
                    head,
                    step("dev", "s", &format!("op {n}")),
                    next("dev"),
                );
                if matches!(m.status, ThreadStatus::Completed | ThreadStatus::Failed) {
                    let w = r.unwrap();
                    m.chain.push(w.step.unwrap());
                    m.ends.push(false);
                    m.status = w.record.status;
                } else {
                    let refused = matches!(r, Err(ThreadError::WrongStatus { .. }));
                    prop_assert!(refused);
                }
            }
            Op::Fork(t, at) => {
                let m = &models[t % len];
                // Position 0 is the start, i > 0 is chain[i - 1].
                let pos = at % (m.chain.len() + 1);
                let node = if pos == 0 { m.start } else { m.chain[pos - 1] };
                let before = store.threads().get(m.id).unwrap().unwrap();
                let r = store.threads().low_level().fork_thread(
                    m.id,
                    node,
                    Next::Role {
                        role: "dev".into(),
                        instruction: "go".into(),
                        location: None,
                    },
                );
                prop_assert_eq!(store.threads().get(m.id).unwrap().unwrap(), before);
                if pos > 0 && m.ends[pos - 1] {
                    let refused = matches!(r, Err(ThreadError::ForkAtEnd { .. }));
                    prop_assert!(refused);
                    continue;
                }
                let f = r.unwrap();
                let chain = m.chain[..pos].to_vec();
                let ends = m.ends[..pos].to_vec();
                let start = m.start;
                models.push(Model {
                    id: f.id,
                    start,
                    chain,
                    ends,
                    status: ThreadStatus::Idle,
                });
            }
        }
    }
    for m in &models {
        let rec = store.threads().get(m.id).unwrap().unwrap();
        prop_assert_eq!(rec.head, *m.chain.last().unwrap_or(&m.start));
        prop_assert_eq!(rec.status, m.status);
        prop_assert!(store.get(&rec.head).unwrap().is_some(), "head resolves");
        let log = store.threads().log(m.id, 10_000, None).unwrap();
        let got: Vec<Hash> = log.iter().rev().map(|e| e.hash).collect();
        prop_assert_eq!(&got, &m.chain);
        for (i, e) in log.iter().enumerate() {
            prop_assert_eq!(e.node.seq, (log.len() - i) as u64);
            let want: Vec<Hash> = log[i + 1..].iter().take(11).map(|e| e.hash).collect();
            prop_assert_eq!(&e.node.ancestors, &want);
            prop_assert_eq!(e.node.start, m.start);
            prop_assert_eq!(e.node.role == "__end__", m.ends[log.len() - 1 - i]);
        }
        // maxRounds bookkeeping: role steps since the last end.
        let since_end = m.ends.iter().rev().take_while(|e| !**e).count() as u64;
        prop_assert_eq!(rec.rounds(), since_end);
        if let Some(Blob::State(s)) = store.get(&rec.head).unwrap() {
            prop_assert_eq!(s.seq, rec.seq);
        }
    }
    let report = verify(&store, |_| {}).unwrap();
    prop_assert!(report.is_ok(), "{:?}", report.problems);
    Ok(())
}

conformance!(chains_match_the_model);
