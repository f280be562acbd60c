//! Labels through the library (SPEC §11), on every backend: every filtered
//! listing — one label or several, with status and workflow filters, time
//! bounds and paging — equals the unfiltered listing filtered by hand, as
//! labels change, threads step, end, fork and are unlinked; and `verify`
//! checks the `labels` index against the records.

mod common;

use common::backend::TestBackend;
use common::{append_n, new_thread, next, step};
use uwf_db::Store;
use uwf_db::thread::{
    EndSpec, LabelError, Labels, Next, ThreadError, ThreadQuery, ThreadRecord, ThreadStatus,
};
use uwf_db::verify::verify;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A tiny deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every thread, newest activity first (the unfiltered listing).
fn everything(store: &Store, q: &ThreadQuery) -> Vec<ThreadRecord> {
    store
        .threads()
        .list(&ThreadQuery {
            labels: Vec::new(),
            limit: usize::MAX,
            offset: 0,
            ..q.clone()
        })
        .unwrap()
}

/// Checks `q` (with labels) against the unfiltered listing filtered by
/// hand, whole and page by page.
fn check_query(store: &Store, q: &ThreadQuery) {
    let want: Vec<_> = everything(store, q)
        .into_iter()
        .filter(|r| q.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
        .map(|r| r.id)
        .collect();
    let all = ThreadQuery {
        limit: usize::MAX,
        offset: 0,
        ..q.clone()
    };
    let got: Vec<_> = store
        .threads()
        .list(&all)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(got, want, "{q:?}");
    let mut paged = Vec::new();
    for offset in (0..want.len() + 3).step_by(3) {
        let page = ThreadQuery {
            limit: 3,
            offset,
            ..q.clone()
        };
        paged.extend(store.threads().list(&page).unwrap().iter().map(|r| r.id));
    }
    assert_eq!(paged, want, "paged {q:?}");
}

fn filtered_listings_equal_the_listing_filtered_by_hand(b: TestBackend) {
    let store = b.fast();
    let teams = ["a", "b", "c"];
    let kinds = ["review", "plan"];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ids = Vec::new();
    for i in 0..60 {
        let name = if i % 4 == 0 { "plan" } else { "review" };
        let t = new_thread(&store, name);
        let mut set = Labels::new();
        if rng.below(5) > 0 {
            set.insert("team".into(), teams[rng.below(3) as usize].into());
        }
        if rng.below(3) > 0 {
            set.insert("kind".into(), kinds[rng.below(2) as usize].into());
        }
        if rng.below(4) == 0 {
            set.insert("x/y.z-w_1".into(), String::new());
        }
        store.threads().set_labels(t.id, &set, &[]).unwrap();
        ids.push(t.id);
    }
    let queries = |rng: &mut Rng| {
        let mut q = ThreadQuery::default();
        for _ in 0..=rng.below(3) {
            match rng.below(4) {
                0 => q
                    .labels
                    .push(("kind".into(), kinds[rng.below(2) as usize].into())),
                1 => q.labels.push(("x/y.z-w_1".into(), String::new())),
                _ => q
                    .labels
                    .push(("team".into(), teams[rng.below(3) as usize].into())),
            }
        }
        match rng.below(4) {
            0 => q.statuses = vec![ThreadStatus::Idle],
            1 => q.statuses = vec![ThreadStatus::Completed, ThreadStatus::Cancelled],
            2 => q.workflow = Some("plan".into()),
            _ => {}
        }
        q
    };
    for round in 0..6 {
        // Change the store: steps move last activity, ends move threads to
        // history, labels change, forks inherit, threads go.
        for _ in 0..12 {
            let id = ids[rng.below(ids.len() as u64) as usize];
            let Some(r) = store.threads().get(id).unwrap() else {
                continue;
            };
            let low = store.threads().low_level();
            match rng.below(6) {
                0 | 1 if !r.status.is_done() => {
                    append_n(&store, id, 1);
                }
                2 if !r.status.is_done() => {
                    low.append_step(
                        id,
                        r.head,
                        step("dev", "done", "finished"),
                        Next::End(EndSpec {
                            return_code: 0,
                            summary: "done".into(),
                            prompt: "end".into(),
                        }),
                    )
                    .unwrap();
                }
                3 => {
                    let k = if rng.below(2) == 0 { "team" } else { "kind" };
                    let v = if k == "team" {
                        teams[rng.below(3) as usize]
                    } else {
                        kinds[rng.below(2) as usize]
                    };
                    if rng.below(3) == 0 {
                        store
                            .threads()
                            .set_labels(id, &Labels::new(), &[k.into()])
                            .unwrap();
                    } else {
                        store
                            .threads()
                            .set_labels(id, &labels(&[(k, v)]), &[])
                            .unwrap();
                    }
                }
                4 if !r.status.is_done() && r.seq > 0 => {
                    let fork = low.fork_thread(id, r.head, next("dev")).unwrap();
                    assert_eq!(fork.labels, r.labels, "a fork inherits its labels");
                    ids.push(fork.id);
                }
                5 if rng.below(3) == 0 => {
                    store.threads().remove(id).unwrap();
                }
                _ => {}
            }
        }
        for _ in 0..25 {
            check_query(&store, &queries(&mut rng));
        }
        // Time bounds: the middle of the activity range.
        let all = everything(&store, &ThreadQuery::default());
        if all.len() > 4 {
            let until = all[all.len() / 4].last_activity();
            let since = all[3 * all.len() / 4].last_activity();
            let mut q = queries(&mut rng);
            q.since = Some(since);
            q.until = Some(until);
            check_query(&store, &q);
        }
        let report = verify(&store, |_| {}).unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
    }
}

fn labels_are_checked_and_limited(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "review");
    let err = store
        .threads()
        .set_labels(t.id, &labels(&[("bad key", "v")]), &[])
        .unwrap_err();
    assert!(
        matches!(err, ThreadError::Label(LabelError::BadKey(_))),
        "{err}"
    );
    let many: Labels = (0..32).map(|i| (format!("k{i}"), "v".into())).collect();
    store.threads().set_labels(t.id, &many, &[]).unwrap();
    let err = store
        .threads()
        .set_labels(t.id, &labels(&[("one", "more")]), &[])
        .unwrap_err();
    assert!(
        matches!(err, ThreadError::Label(LabelError::TooMany(33))),
        "{err}"
    );
    // Nothing of the refused change was written.
    assert_eq!(store.threads().get(t.id).unwrap().unwrap().labels, many);
    // Replacing a value and removing keys in one change.
    let r = store
        .threads()
        .set_labels(
            t.id,
            &labels(&[("k0", "new")]),
            &(1..32).map(|i| format!("k{i}")).collect::<Vec<_>>(),
        )
        .unwrap();
    assert_eq!(r.labels, labels(&[("k0", "new")]));
    let q = ThreadQuery {
        labels: vec![("k0".into(), "v".into())],
        ..ThreadQuery::default()
    };
    assert!(store.threads().list(&q).unwrap().is_empty());
    let q = ThreadQuery {
        labels: vec![("k0".into(), "new".into())],
        ..ThreadQuery::default()
    };
    assert_eq!(store.threads().list(&q).unwrap().len(), 1);
    // A query with a malformed label is refused, not an empty page.
    let q = ThreadQuery {
        labels: vec![("k 0".into(), "new".into())],
        ..ThreadQuery::default()
    };
    assert!(matches!(
        store.threads().list(&q),
        Err(ThreadError::Label(LabelError::BadKey(_)))
    ));
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

conformance!(
    filtered_listings_equal_the_listing_filtered_by_hand,
    labels_are_checked_and_limited,
);
