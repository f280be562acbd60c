//! Threads through the library API: chains, compare-and-swap, ends and
//! history, fork, paging, call stack, compaction, resume.

mod common;

use common::backend::TestBackend;
use common::{append_n, new_thread, next, step};
use uwf_db::thread::{
    EndSpec, NewThread, Next, ThreadError, ThreadId, ThreadQuery, ThreadStatus, utc_day,
};
use uwf_db::verify::verify;
use uwf_db::{Blob, Hash, Value};

fn end(code: u8) -> EndSpec {
    EndSpec {
        return_code: code,
        summary: format!("ended with {code}"),
        prompt: "Approved".into(),
    }
}

fn steps_chain_with_seq_and_ancestors(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "review");
    assert_eq!(t.status, ThreadStatus::Idle);
    assert_eq!(t.next_role.as_deref(), Some("dev"));
    assert_eq!(t.head, t.start);
    let rec = append_n(&store, t.id, 15);
    let log = store.threads().log(t.id, 100, None).unwrap();
    assert_eq!(log.len(), 15);
    for (i, e) in log.iter().enumerate() {
        let seq = 15 - i as u64;
        assert_eq!(e.node.seq, seq);
        // Parent first, then up to 10 more, newest first; none for seq 1.
        let want: Vec<Hash> = log[i + 1..].iter().take(11).map(|e| e.hash).collect();
        assert_eq!(e.node.ancestors, want, "ancestors of seq {seq}");
        assert_eq!(e.node.start, t.start);
    }
    assert_eq!(rec.head, log[0].hash);
    assert_eq!(rec.seq, 15);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn a_moved_head_is_a_conflict_and_writes_nothing(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "w");
    let first = store
        .threads()
        .low_level()
        .append_step(t.id, t.head, step("dev", "ok", "one"), next("rev"))
        .unwrap();
    let blobs_before = store.stats().unwrap().blob_count;
    let err = store
        .threads()
        .low_level()
        .append_step(t.id, t.head, step("dev", "ok", "stale"), next("rev"))
        .unwrap_err();
    match err {
        ThreadError::Conflict {
            expected, actual, ..
        } => {
            assert_eq!(expected, t.head);
            assert_eq!(actual, first.record.head);
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert_eq!(store.stats().unwrap().blob_count, blobs_before);
    assert_eq!(store.threads().get(t.id).unwrap().unwrap(), first.record);
}

fn racing_writer_threads_commit_exactly_once_per_head(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "race");
    for round in 0..20 {
        let head = store.threads().get(t.id).unwrap().unwrap().head;
        let results: Vec<_> = (0..4)
            .map(|w| {
                let s = store.clone();
                std::thread::spawn(move || {
                    s.threads().low_level().append_step(
                        t.id,
                        head,
                        step("dev", "ok", &format!("round {round} writer {w}")),
                        next("dev"),
                    )
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: exactly one writer commits");
        assert!(
            results
                .iter()
                .filter_map(|r| r.as_ref().err())
                .all(|e| matches!(e, ThreadError::Conflict { .. }))
        );
    }
    let log = store.threads().log(t.id, 100, None).unwrap();
    assert_eq!(log.len(), 20, "no lost or duplicated step");
    let seqs: Vec<u64> = log.iter().map(|e| e.node.seq).collect();
    assert_eq!(seqs, (1..=20).rev().collect::<Vec<_>>());
}

fn ending_moves_to_history_found_by_id_and_by_day(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "end");
    let w = store
        .threads()
        .low_level()
        .append_step(
            t.id,
            t.head,
            step("rev", "approved", "fine"),
            Next::End(end(0)),
        )
        .unwrap();
    let rec = &w.record;
    assert_eq!(rec.status, ThreadStatus::Completed);
    let end_hash = w.end.unwrap();
    assert_eq!(rec.head, end_hash);
    let Some(Blob::State(end_node)) = store.get(&end_hash).unwrap() else {
        panic!("end node")
    };
    assert_eq!(end_node.role, "__end__");
    assert_eq!(end_node.seq, 2);
    assert_eq!(end_node.ancestors[0], w.step.unwrap());
    assert_eq!(end_node.meta["return_code"], Value::UInt(0));
    assert_eq!(store.threads().get(t.id).unwrap().unwrap(), *rec);

    // Another thread ends "on another day": write its record into an old
    // partition by ending it and then checking the day-range scan bounds.
    let today = utc_day(rec.completed_at.unwrap());
    let page = store.threads().history(today, today + 1).unwrap();
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.records[0].id, t.id);
    assert_eq!(page.keys_visited, 1);
    let other_days = store.threads().history(0, today).unwrap();
    assert!(other_days.records.is_empty());
    assert_eq!(
        other_days.keys_visited, 0,
        "no key of today's partition read"
    );
    // Appending to an ended thread is refused; it must be resumed.
    let err = store
        .threads()
        .low_level()
        .append_step(t.id, rec.head, step("dev", "x", "y"), next("dev"))
        .unwrap_err();
    assert!(matches!(err, ThreadError::WrongStatus { .. }), "{err}");
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn history_day_ranges_read_only_their_days(b: TestBackend) {
    // Build records on three different days by ending threads and rewriting
    // their completion time through update_record (the record moves to the
    // matching partition).
    let store = b.fast();
    let day_ms = 86_400_000u64;
    let mut ids = Vec::new();
    for (i, day) in [100u64, 200, 200, 300].into_iter().enumerate() {
        let t = new_thread(&store, &format!("w{i}"));
        store
            .threads()
            .low_level()
            .end_thread(t.id, t.head, end(0))
            .unwrap();
        store
            .threads()
            .low_level()
            .update_record(t.id, move |r| {
                r.completed_at = Some(day * day_ms + 5);
                Ok(())
            })
            .unwrap();
        ids.push(t.id);
    }
    let page = store.threads().history(200, 201).unwrap();
    assert_eq!(page.keys_visited, 2);
    let mut got: Vec<_> = page.records.iter().map(|r| r.id).collect();
    got.sort();
    let mut want = vec![ids[1], ids[2]];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(store.threads().history(101, 200).unwrap().keys_visited, 0);
    // Lookup by id still works after the move, in O(log n).
    for id in &ids {
        assert!(store.threads().get(*id).unwrap().is_some());
    }
}

fn log_pages_a_10000_step_thread(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "long");
    append_n(&store, t.id, 10_000);
    let page = store.threads().log(t.id, 50, None).unwrap();
    assert_eq!(page.len(), 50);
    assert_eq!(page[0].node.seq, 10_000);
    assert_eq!(page[49].node.seq, 9_951);
    let next_page = store.threads().log(t.id, 50, Some(page[49].hash)).unwrap();
    assert_eq!(next_page[0].node.seq, 9_950);
    assert_eq!(next_page[49].node.seq, 9_901);
    // Page to the very beginning.
    let mut before = Some(next_page[49].hash);
    let mut total = 100;
    loop {
        let p = store.threads().log(t.id, 1000, before).unwrap();
        if p.is_empty() {
            break;
        }
        total += p.len();
        for pair in p.windows(2) {
            assert_eq!(pair[0].node.seq, pair[1].node.seq + 1);
        }
        before = p.last().map(|e| e.hash);
    }
    assert_eq!(total, 10_000);
}

fn fork_shares_history_and_never_changes_the_source(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "fork");
    let src = append_n(&store, t.id, 5);
    let log = store.threads().log(t.id, 10, None).unwrap();
    let blobs = store.stats().unwrap().blob_count;
    let idle = Next::Role {
        role: "dev".into(),
        instruction: "again".into(),
        location: None,
    };
    // At a middle step, at the head and at the start.
    let mid = store
        .threads()
        .low_level()
        .fork_thread(t.id, log[2].hash, idle.clone())
        .unwrap();
    assert_eq!(mid.head, log[2].hash);
    assert_eq!(mid.seq, 3);
    assert_eq!(mid.forked_from.unwrap().thread, t.id);
    assert_eq!(store.stats().unwrap().blob_count, blobs, "nothing copied");
    let at_start = store
        .threads()
        .low_level()
        .fork_thread(t.id, src.start, idle.clone())
        .unwrap();
    assert_eq!(at_start.head, src.start);
    let at_head = store
        .threads()
        .low_level()
        .fork_thread(t.id, src.head, idle.clone())
        .unwrap();

    let f = append_n(&store, mid.id, 3);
    assert_eq!(f.seq, 6);
    assert_eq!(
        store.threads().get(t.id).unwrap().unwrap(),
        src,
        "source unchanged"
    );
    let flog = store.threads().log(mid.id, 100, None).unwrap();
    assert_eq!(flog.len(), 6);
    assert_eq!(flog[3].hash, log[2].hash, "shared ancestors");
    append_n(&store, at_start.id, 1);
    append_n(&store, at_head.id, 1);
    assert_eq!(store.threads().get(t.id).unwrap().unwrap(), src);

    // A node of another thread is not on this chain; end nodes are refused.
    let err = store
        .threads()
        .low_level()
        .fork_thread(t.id, flog[0].hash, idle.clone())
        .unwrap_err();
    assert!(matches!(err, ThreadError::NotOnChain { .. }), "{err}");
    let ended = store
        .threads()
        .low_level()
        .end_thread(t.id, src.head, end(2))
        .unwrap();
    let err = store
        .threads()
        .low_level()
        .fork_thread(t.id, ended.end.unwrap(), idle.clone())
        .unwrap_err();
    assert!(matches!(err, ThreadError::ForkAtEnd { .. }), "{err}");
    // ...but a step of an ended thread can be forked.
    let revived = store
        .threads()
        .low_level()
        .fork_thread(t.id, log[0].hash, idle)
        .unwrap();
    assert_eq!(revived.status, ThreadStatus::Idle);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn suspend_then_resume_and_resume_from_history(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "plan");
    let s = store
        .threads()
        .low_level()
        .append_step(
            t.id,
            t.head,
            step("planner", "need_info", "which db?"),
            Next::Suspend {
                role: "planner".into(),
                message: "Which database?".into(),
            },
        )
        .unwrap()
        .record;
    assert_eq!(s.status, ThreadStatus::Suspended);
    assert_eq!(s.suspended_role.as_deref(), Some("planner"));
    assert_eq!(s.suspend_message.as_deref(), Some("Which database?"));
    let mut resumed = step("planner", "done", "using LMDB");
    resumed.instruction = "Which database?\n\nLMDB".into();
    let r = store
        .threads()
        .low_level()
        .append_step(t.id, s.head, resumed, Next::End(end(0)))
        .unwrap()
        .record;
    assert_eq!(r.status, ThreadStatus::Completed);
    assert_eq!(r.rounds(), 0);
    let input_hash = store.threads().log(t.id, 3, None).unwrap()[1].node.input;
    let input = store.get(&input_hash).unwrap().unwrap();
    assert_eq!(input, Blob::content("Which database?\n\nLMDB", []));

    // Resume from history: back in the active index, seq continues.
    let back = store
        .threads()
        .low_level()
        .resume_ended(t.id, r.head, step("dev", "ok", "more"), next("dev"))
        .unwrap()
        .record;
    assert_eq!(back.status, ThreadStatus::Idle);
    assert_eq!(back.completed_at, None);
    assert_eq!(back.seq, 4);
    assert_eq!(back.rounds(), 1, "a fresh maxRounds budget");
    let page = store.threads().history(0, u32::MAX).unwrap();
    assert!(page.records.is_empty(), "no longer in history");
    // Cancelled threads cannot be resumed.
    let c = store
        .threads()
        .low_level()
        .end_thread(t.id, back.head, end(2))
        .unwrap()
        .record;
    let err = store
        .threads()
        .low_level()
        .resume_ended(t.id, c.head, step("dev", "ok", "x"), next("dev"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            ThreadError::WrongStatus {
                status: ThreadStatus::Cancelled,
                ..
            }
        ),
        "{err}"
    );
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn failures_are_recorded_listed_and_cleared_by_the_next_step(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "fail");
    let other = new_thread(&store, "fine");
    let r = store
        .threads()
        .low_level()
        .record_failure(t.id, "agent exited with 3")
        .unwrap();
    assert_eq!(r.last_error.as_deref(), Some("agent exited with 3"));
    assert_eq!(r.head, t.head);
    assert_eq!(r.status, ThreadStatus::Idle);
    let failed = store
        .threads()
        .list(&ThreadQuery {
            failed_only: true,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(failed.iter().map(|r| r.id).collect::<Vec<_>>(), vec![t.id]);
    let r = store
        .threads()
        .low_level()
        .append_step(t.id, t.head, step("dev", "ok", "fixed"), next("dev"))
        .unwrap()
        .record;
    assert_eq!(r.last_error, None);
    assert!(
        store
            .threads()
            .list(&ThreadQuery {
                failed_only: true,
                ..ThreadQuery::default()
            })
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.threads().get(other.id).unwrap().unwrap().last_error,
        None
    );
}

fn listing_filters_and_pages_newest_first(b: TestBackend) {
    let store = b.fast();
    let mut ids = Vec::new();
    for i in 0..30 {
        let t = new_thread(&store, if i % 3 == 0 { "alpha" } else { "beta" });
        if i % 5 == 0 {
            store
                .threads()
                .low_level()
                .end_thread(t.id, t.head, end(0))
                .unwrap();
        }
        ids.push(t.id);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let all = store
        .threads()
        .list(&ThreadQuery {
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(all.len(), 30);
    for pair in all.windows(2) {
        assert!(pair[0].last_activity() >= pair[1].last_activity());
    }
    let alpha = store
        .threads()
        .list(&ThreadQuery {
            workflow: Some("alpha".into()),
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(alpha.len(), 10);
    let completed = store
        .threads()
        .list(&ThreadQuery {
            statuses: vec![ThreadStatus::Completed],
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(completed.len(), 6);
    let p1 = store
        .threads()
        .list(&ThreadQuery {
            limit: 7,
            ..ThreadQuery::default()
        })
        .unwrap();
    let p2 = store
        .threads()
        .list(&ThreadQuery {
            limit: 7,
            offset: 7,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(p1.len(), 7);
    assert_eq!(p2.len(), 7);
    assert_eq!(
        all[..14].iter().map(|r| r.id).collect::<Vec<_>>(),
        p1.iter().chain(&p2).map(|r| r.id).collect::<Vec<_>>()
    );
    // since inclusive, until exclusive, on last activity.
    let pivot = all[10].last_activity();
    let since = store
        .threads()
        .list(&ThreadQuery {
            since: Some(pivot),
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert!(since.iter().all(|r| r.last_activity() >= pivot));
    assert!(since.iter().any(|r| r.id == all[10].id));
    let until = store
        .threads()
        .list(&ThreadQuery {
            until: Some(pivot),
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert!(until.iter().all(|r| r.last_activity() < pivot));
    assert_eq!(since.len() + until.len(), 30);
    // Prefix resolution works for active and ended threads.
    for id in &ids {
        let p = id.to_string()[..26].parse().unwrap();
        assert_eq!(store.threads().resolve(&p).unwrap(), *id);
    }
}

fn call_stack_up_and_child_history_down(b: TestBackend) {
    let store = b.fast();
    let parent = new_thread(&store, "parent");
    let p1 = append_n(&store, parent.id, 2);
    let child_wf = common::workflow(&store, "child");
    let child = store
        .threads()
        .low_level()
        .start_thread(NewThread {
            workflow: "child".into(),
            workflow_hash: child_wf,
            prompt: "Run the tests".into(),
            max_rounds: 10,
            depth: 1,
            parent_state: Some(p1.head),
            parent_thread: Some(parent.id),
            next_role: "tester".into(),
            next_instruction: "Run the tests".into(),
            agent: None,
            cwd: None,
            next_location: None,
            labels: Default::default(),
        })
        .unwrap();
    let c = store
        .threads()
        .low_level()
        .append_step(
            child.id,
            child.head,
            step("tester", "passed", "all green"),
            Next::End(end(0)),
        )
        .unwrap();
    let child_end = c.end.unwrap();
    let mut s = step("tester", "done", "all green");
    s.child_thread = Some(child_end);
    let pstep = store
        .threads()
        .low_level()
        .append_step(parent.id, p1.head, s, next("dev"))
        .unwrap()
        .step
        .unwrap();

    // Up: from the child's end node to the top-level thread.
    let stack = store.threads().call_stack(child_end).unwrap();
    assert_eq!(stack.len(), 2);
    assert_eq!(stack[0].start, child.start);
    assert_eq!(stack[0].start_node.depth, 1);
    assert_eq!(stack[1].node, p1.head);
    assert_eq!(stack[1].start, parent.start);
    // Down: from the parent's step into the child's history.
    let down = store.threads().child_history(pstep, 10).unwrap().unwrap();
    assert_eq!(down.len(), 2);
    assert_eq!(down[0].hash, child_end);
    assert_eq!(down[1].node.role, "tester");
    // Records: parents up, children down.
    let tree = store.threads().tree(child.id).unwrap();
    assert_eq!(tree.parents.len(), 1);
    assert_eq!(tree.parents[0].id, parent.id);
    let tree = store.threads().tree(parent.id).unwrap();
    assert_eq!(tree.children.len(), 1);
    assert_eq!(tree.children[0].thread.id, child.id);
    // The parent's log never includes the child's steps.
    let plog = store.threads().log(parent.id, 100, None).unwrap();
    assert_eq!(plog.len(), 3);
    assert!(plog.iter().all(|e| e.node.start == parent.start));
}

fn compaction_is_used_at_once_and_written_on_the_next_node(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "compact");
    let r = append_n(&store, t.id, 4);
    let (summary, staged) = store
        .threads()
        .stage_compact(t.id, r.head, "four steps happened")
        .unwrap();
    let ctx = store.threads().context(t.id, 100).unwrap();
    assert_eq!(
        ctx.summary,
        Some((summary, "four steps happened".to_owned()))
    );
    assert!(ctx.steps.is_empty());
    let after = store
        .threads()
        .low_level()
        .append_step(t.id, staged.head, step("dev", "ok", "fifth"), next("dev"))
        .unwrap();
    let Some(Blob::State(node)) = store.get(&after.step.unwrap()).unwrap() else {
        panic!()
    };
    assert_eq!(node.compact, Some(summary));
    assert_eq!(after.record.staged_compact, None);
    append_n(&store, t.id, 2);
    let ctx = store.threads().context(t.id, 100).unwrap();
    assert_eq!(ctx.summary.unwrap().1, "four steps happened");
    let seqs: Vec<u64> = ctx.steps.iter().map(|e| e.node.seq).collect();
    assert_eq!(seqs, vec![5, 6, 7], "the compacted node and those after it");
    // Without a summary, the context is bounded by max_steps.
    let u = new_thread(&store, "plain");
    append_n(&store, u.id, 9);
    let ctx = store.threads().context(u.id, 4).unwrap();
    assert!(ctx.summary.is_none());
    assert_eq!(
        ctx.steps.iter().map(|e| e.node.seq).collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
}

fn rm_unlinks_and_keeps_blobs(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "rm");
    let r = append_n(&store, t.id, 2);
    store.threads().remove(t.id).unwrap();
    assert!(store.threads().get(t.id).unwrap().is_none());
    assert!(store.get(&r.head).unwrap().is_some(), "GC frees later");
    assert!(
        store
            .threads()
            .list(&ThreadQuery::default())
            .unwrap()
            .is_empty()
    );
    let p = t.id.to_string().parse().unwrap();
    assert!(matches!(
        store.threads().resolve(&p),
        Err(ThreadError::Unknown(_))
    ));
}

/// Regression: resuming from history used the reopened record (no
/// completion time) as the "old" one, so the stale `activity` entry keyed by
/// the completion time stayed behind whenever the end and the last update
/// fell in different milliseconds.
fn resume_from_history_replaces_the_activity_entry(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "r");
    let ended = store
        .threads()
        .low_level()
        .end_thread(t.id, t.head, end(0))
        .unwrap()
        .record;
    std::thread::sleep(std::time::Duration::from_millis(5));
    store
        .threads()
        .low_level()
        .record_failure(t.id, "a failed resume")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    store
        .threads()
        .low_level()
        .resume_ended(t.id, ended.head, step("dev", "ok", "back"), next("dev"))
        .unwrap();
    let report = verify(&store, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(
        store.threads().list(&ThreadQuery::default()).unwrap().len(),
        1
    );
}

/// Regression: context assembly paged on from the wrong ancestor (11 back
/// instead of the parent) and skipped steps on threads longer than a page.
fn context_walks_long_threads_without_gaps(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "long-context");
    let r = append_n(&store, t.id, 150);
    let ctx = store.threads().context(t.id, 140).unwrap();
    let seqs: Vec<u64> = ctx.steps.iter().map(|e| e.node.seq).collect();
    assert_eq!(seqs, (11..=150).collect::<Vec<_>>());
    assert!(ctx.summary.is_none());
    // A summary 100 steps back stops the walk there.
    let (h, _) = store
        .threads()
        .stage_compact(t.id, r.head, "early summary")
        .unwrap();
    append_n(&store, t.id, 100);
    let ctx = store.threads().context(t.id, 1000).unwrap();
    assert_eq!(ctx.summary.map(|s| s.0), Some(h));
    assert_eq!(ctx.steps.len(), 100);
    assert_eq!(ctx.steps[0].node.seq, 151);
}

/// `steps_after` (what `thread watch` reads): the steps after a cursor,
/// oldest first, at most `limit` (the oldest), each once across pages,
/// on a plain chain and on a fork (whose older steps are its source's).
fn steps_after_pages_from_a_cursor(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "review");
    append_n(&store, t.id, 30);
    let seqs = |after: u64, limit: usize| -> Vec<u64> {
        let (record, entries) = store.threads().steps_after(t.id, after, limit).unwrap();
        assert_eq!(record.seq, 30);
        entries.iter().map(|e| e.node.seq).collect()
    };
    assert_eq!(seqs(0, 7), (1..=7).collect::<Vec<_>>());
    assert_eq!(seqs(7, 100), (8..=30).collect::<Vec<_>>());
    assert_eq!(seqs(29, 5), vec![30]);
    assert!(seqs(30, 5).is_empty());
    assert!(seqs(99, 5).is_empty());
    assert!(seqs(0, 0).is_empty());
    // Page by page: every step exactly once, and the hashes of the log.
    let mut cursor = 0;
    let mut paged = Vec::new();
    loop {
        let (_, entries) = store.threads().steps_after(t.id, cursor, 4).unwrap();
        let Some(last) = entries.last() else { break };
        cursor = last.node.seq;
        paged.extend(entries.iter().map(|e| e.hash));
    }
    let mut log: Vec<_> = store
        .threads()
        .log(t.id, 100, None)
        .unwrap()
        .iter()
        .map(|e| e.hash)
        .collect();
    log.reverse();
    assert_eq!(paged, log);
    // A fork at seq 20: its steps after 18 are the source's 19 and 20,
    // then its own.
    let at = store.threads().log(t.id, 11, None).unwrap()[10].hash;
    let fork = store
        .threads()
        .low_level()
        .fork_thread(t.id, at, next("dev"))
        .unwrap();
    append_n(&store, fork.id, 2);
    let (_, entries) = store.threads().steps_after(fork.id, 18, 10).unwrap();
    let got: Vec<u64> = entries.iter().map(|e| e.node.seq).collect();
    assert_eq!(got, vec![19, 20, 21, 22]);
    assert_eq!(entries[1].hash, at);
    assert!(matches!(
        store.threads().steps_after(ThreadId::generate(), 0, 1),
        Err(ThreadError::Unknown(_))
    ));
}

conformance!(
    steps_after_pages_from_a_cursor,
    steps_chain_with_seq_and_ancestors,
    a_moved_head_is_a_conflict_and_writes_nothing,
    racing_writer_threads_commit_exactly_once_per_head,
    ending_moves_to_history_found_by_id_and_by_day,
    history_day_ranges_read_only_their_days,
    log_pages_a_10000_step_thread,
    fork_shares_history_and_never_changes_the_source,
    suspend_then_resume_and_resume_from_history,
    failures_are_recorded_listed_and_cleared_by_the_next_step,
    listing_filters_and_pages_newest_first,
    call_stack_up_and_child_history_down,
    compaction_is_used_at_once_and_written_on_the_next_node,
    rm_unlinks_and_keeps_blobs,
    resume_from_history_replaces_the_activity_entry,
    context_walks_long_threads_without_gaps,
);
