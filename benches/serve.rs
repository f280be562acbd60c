//! Bench `serve` (issue 20): `uwf-db serve` against the library in the
//! same run.
//! - the first page of 50 of 100,000 threads through HTTP (keep-alive
//!   clients on two threads; the page as JSON) vs the same page through
//!   the library, serialized to the same JSON (ratio reported);
//! - commit-to-client latency of a step: a step committed by this process
//!   until a `GET /api/threads/{id}/events` client has read it (goal: p95
//!   under 100 ms), vs the same through the library's own watch in this
//!   process (`Engine::watch_steps`);
//! - the server's memory (VmRSS) with 1,000 open `/api/events` streams,
//!   after each was sent 100 changes (goal: under 100 MB), vs the idle
//!   server.
//!
//! Run: `cargo bench --bench serve`. `UWF_BENCH_SCALE=0.1` shrinks it.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use common::{Comparison, report, scale, scratch_dir, start_thread, time};
use uwf_db::engine::Cancel;
use uwf_db::thread::{Next, StepWrite, ThreadQuery};
use uwf_db::{Blob, Durability, Store, StoreOptions, Value, WorkflowNode};

const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");

/// Thread `i` of the placeholder workflow `wf` (two workflow names, as
/// in the threads bench).
fn new_thread(store: &Store, wf: uwf_db::Hash, i: usize) -> uwf_db::thread::ThreadRecord {
    let name = if i.is_multiple_of(2) {
        "review"
    } else {
        "plan"
    };
    start_thread(store, wf, name, format!("task {i}"), "developer")
}

fn step(i: usize) -> StepWrite {
    StepWrite {
        role: "developer".into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str("review_needed".into()))]),
        reply: format!("Step {i}: implemented the change and added tests."),
        artifacts: vec![],
        instruction: format!("Round {i}"),
        child_thread: None,
    }
}

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(store: &std::path::Path) -> Server {
        let mut child = Command::new(BIN)
            .arg("--store")
            .arg(store)
            .args(["serve", "--bind", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("no address in: {line}"))
            .to_owned();
        Server { child, addr }
    }

    /// A line of `/proc/PID/status`, in KiB: `VmRSS` (all resident
    /// memory, with the pages of the store's data file the server mapped)
    /// or `RssAnon` (the server's own memory).
    fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// An open event stream, read line by line on a thread of its own; each
/// `step` event's seq is sent with the time it was read.
fn step_reader(addr: &str, id: &str) -> std::sync::mpsc::Receiver<(u64, Instant)> {
    let response = ureq::Agent::config_builder()
        .build()
        .new_agent()
        .get(&format!("http://{addr}/api/threads/{id}/events"))
        .call()
        .unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let reader = BufReader::new(response.into_body().into_reader());
        let mut step = false;
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line == "event: step" {
                step = true;
            } else if let (true, Some(seq)) = (step, line.strip_prefix("id: ")) {
                if tx.send((seq.parse().unwrap(), Instant::now())).is_err() {
                    break;
                }
                step = false;
            }
        }
    });
    rx
}

/// Commits `steps` steps to thread `t`, 30 ms apart, and times each from
/// its commit until `rx` says it was seen.
fn commit_latencies(
    low: &uwf_db::thread::LowLevel<'_>,
    t: &uwf_db::thread::ThreadRecord,
    steps: usize,
    rx: &std::sync::mpsc::Receiver<(u64, Instant)>,
) -> Vec<Duration> {
    let mut head = t.head;
    let mut out = Vec::with_capacity(steps);
    for i in 0..steps {
        std::thread::sleep(Duration::from_millis(30));
        let w = low
            .append_step(
                t.id,
                head,
                step(i),
                Next::Role {
                    role: "developer".into(),
                    instruction: "again".into(),
                    location: None,
                },
            )
            .unwrap();
        let committed = Instant::now();
        head = w.record.head;
        let (seq, at) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(seq, i as u64 + 1);
        out.push(at.saturating_duration_since(committed));
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut rows = Vec::new();
    let dir = scratch_dir("serve-store");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let wf = store
        .put(&Blob::Workflow(WorkflowNode {
            definition: Value::Str("wf".into()),
        }))
        .unwrap();
    let n = scale(100_000, 100);
    for i in 0..n {
        new_thread(&store, wf, i);
    }
    let server = Server::start(dir.path());

    // The first page, through HTTP (two client threads) and the library.
    let pages = 2000;
    let url = format!("http://{}/api/threads?limit=50", server.addr);
    let http = || {
        time(|| {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        let agent = agent();
                        for _ in 0..pages / 2 {
                            let body = agent
                                .get(&url)
                                .call()
                                .unwrap()
                                .body_mut()
                                .read_to_vec()
                                .unwrap();
                            assert!(body.len() > 50 * 200);
                            std::hint::black_box(body);
                        }
                    });
                }
            })
        })
    };
    let q = ThreadQuery {
        limit: 50,
        ..ThreadQuery::default()
    };
    let library = || {
        time(|| {
            for _ in 0..pages {
                let records = store.threads().list(&q).unwrap();
                let page = uwf_db::api::ThreadPage {
                    next_cursor: None,
                    threads: records
                        .iter()
                        .map(uwf_db::api::ThreadSummary::from)
                        .collect(),
                };
                std::hint::black_box(serde_json::to_vec(&page).unwrap());
            }
        })
    };
    rows.push(Comparison::run(
        &format!("first page of 50 of {n} threads: HTTP (baseline: the library, to JSON)"),
        pages as u64,
        5,
        http,
        library,
    ));

    // Commit-to-client latency of a step.
    let low = store.threads().low_level();
    let steps = scale(100, 20);
    let t = new_thread(&store, wf, n);
    let id = t.id.to_string();
    let rx = step_reader(&server.addr, &id);
    let mut served = commit_latencies(&low, &t, steps, &rx);
    // The same through the library's watch in this process.
    let t2 = new_thread(&store, wf, n + 1);
    let (tx, wrx) = channel();
    let watcher = {
        let store = store.clone();
        let cancel = Cancel::new();
        let c = cancel.clone();
        let handle = std::thread::spawn(move || {
            store
                .engine()
                .watch_steps(t2.id, 0, &c, &mut |e| {
                    let _ = tx.send((e.node.seq, Instant::now()));
                    Ok(std::ops::ControlFlow::Continue(()))
                })
                .unwrap();
        });
        (handle, cancel)
    };
    let mut watched = commit_latencies(&low, &t2, steps, &wrx);
    watcher.1.cancel();
    let _ = watcher.0.join();
    served.sort();
    watched.sort();
    let (p50, p95) = (percentile(&served, 0.5), percentile(&served, 0.95));
    let (w50, w95) = (percentile(&watched, 0.5), percentile(&watched, 0.95));

    // Memory with 1,000 open event streams.
    let idle = (server.status_kib("VmRSS"), server.status_kib("RssAnon"));
    let clients = 1000;
    let mut streams = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        write!(
            s,
            "GET /api/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            server.addr
        )
        .unwrap();
        streams.push(s);
    }
    // Each answered (headers read) before measuring.
    for s in &mut streams {
        let mut buf = [0u8; 256];
        let got = s.read(&mut buf).unwrap();
        assert!(buf[..got].starts_with(b"HTTP/1.1 200"));
    }
    // 100 changes, each sent to every stream.
    for i in 0..100 {
        new_thread(&store, wf, n + 2 + i);
    }
    std::thread::sleep(Duration::from_secs(1));
    // Drain what each was sent, so the server's buffers are not what is
    // measured as much as its state per stream.
    let mut bytes = 0usize;
    for s in &mut streams {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(got) = s.read(&mut buf) {
            bytes += got;
            if got < buf.len() {
                break;
            }
        }
    }
    let loaded = (server.status_kib("VmRSS"), server.status_kib("RssAnon"));
    drop(streams);

    report(
        "serve: HTTP vs the library",
        "list page through HTTP reported; step commit-to-client p95 < 100 ms; RSS with 1,000 event streams < 100 MB",
        &rows,
    );
    println!("\n| measure | uwf-db serve | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| step commit → SSE client, p50 (baseline: in-process watch) | {:.1} ms | {:.1} ms | {:.2}× |",
        p50.as_secs_f64() * 1e3,
        w50.as_secs_f64() * 1e3,
        w50.as_secs_f64() / p50.as_secs_f64().max(1e-9)
    );
    println!(
        "| step commit → SSE client, p95 (goal < 100 ms) | {:.1} ms | {:.1} ms | {:.2}× |",
        p95.as_secs_f64() * 1e3,
        w95.as_secs_f64() * 1e3,
        w95.as_secs_f64() / p95.as_secs_f64().max(1e-9)
    );
    println!(
        "| server VmRSS with {clients} event streams, 100 changes each (baseline: idle; goal < 100 MB) | {:.1} MB | {:.1} MB | {:.2}× |",
        loaded.0 as f64 / 1024.0,
        idle.0 as f64 / 1024.0,
        idle.0 as f64 / loaded.0 as f64
    );
    println!(
        "| server RssAnon (its own memory, without the mapped store) with {clients} event streams (baseline: idle) | {:.1} MB | {:.1} MB | {:.2}× |",
        loaded.1 as f64 / 1024.0,
        idle.1 as f64 / 1024.0,
        idle.1 as f64 / loaded.1 as f64
    );
    println!(
        "\n({} bytes of events read by the {clients} streams)",
        bytes
    );
}
