//! A small harness for benchmarks that compare against a baseline in the
//! same run: alternate the two, take medians, print rates and the ratio.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A fresh directory under the target directory (a real disk, not tmpfs).
pub fn scratch_dir(name: &str) -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .unwrap()
}

/// Opens a raw heed environment for the baseline.
pub fn raw_env(dir: &std::path::Path, durable: bool) -> heed::Env<heed::WithoutTls> {
    let mut options = heed::EnvOpenOptions::new().read_txn_without_tls();
    options.map_size(1 << 40).max_dbs(16).max_readers(1024);
    if !durable {
        // SAFETY (bench): NO_SYNC only weakens crash durability of a scratch store.
        #[allow(unsafe_code)]
        unsafe {
            options.flags(heed::EnvFlags::NO_SYNC);
        }
    }
    // SAFETY (bench): a fresh directory, opened once.
    #[allow(unsafe_code)]
    unsafe {
        options.open(dir).unwrap()
    }
}

/// `n` scaled by `UWF_BENCH_SCALE` (default 1), at least `min`.
pub fn scale(n: usize, min: usize) -> usize {
    let s: f64 = std::env::var("UWF_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * s) as usize).max(min)
}

/// The puts a step makes, for raw baselines: its reply and instruction
/// content blobs, a state node of the same shape (`seq`, up to 11
/// ancestors, `start`), and a record-sized value under `record_key`.
pub fn step_puts(
    step: &uwf_db::thread::StepWrite,
    seq: usize,
    start: uwf_db::Hash,
    record_key: Vec<u8>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    use uwf_db::{Blob, Hash, StateNode};
    let reply = Blob::content(step.reply.as_str(), []).encode().unwrap();
    let input = Blob::content(step.instruction.as_str(), [])
        .encode()
        .unwrap();
    let state = Blob::State(StateNode {
        ancestors: (0..11.min(seq))
            .map(|k| Hash::of(&(k as u64).to_le_bytes()))
            .collect(),
        child_thread: None,
        compact: None,
        content: reply.hash(),
        input: input.hash(),
        meta: step.meta.clone(),
        role: step.role.clone(),
        seq: seq as u64 + 1,
        start,
        timestamp: 1_790_000_000_000,
    })
    .encode()
    .unwrap();
    vec![
        (reply.hash().as_bytes().to_vec(), reply.bytes().to_vec()),
        (input.hash().as_bytes().to_vec(), input.bytes().to_vec()),
        (state.hash().as_bytes().to_vec(), state.bytes().to_vec()),
        (record_key, vec![0u8; 330]),
    ]
}

/// Stores a placeholder workflow definition named `name`; returns its hash.
pub fn placeholder_workflow(store: &uwf_db::Store, name: &str) -> uwf_db::Hash {
    use uwf_db::{Blob, Value, WorkflowNode};
    store
        .put(&Blob::Workflow(WorkflowNode {
            definition: Value::Map(std::collections::BTreeMap::from([(
                "name".to_owned(),
                Value::Str(name.into()),
            )])),
        }))
        .unwrap()
}

/// Starts a thread of the placeholder workflow `wf` named `name`, idle
/// with role `role`.
pub fn start_thread(
    store: &uwf_db::Store,
    wf: uwf_db::Hash,
    name: &str,
    prompt: String,
    role: &str,
) -> uwf_db::thread::ThreadRecord {
    store
        .threads()
        .low_level()
        .start_thread(uwf_db::thread::NewThread {
            workflow: name.into(),
            workflow_hash: wf,
            prompt,
            max_rounds: 1_000_000,
            depth: 0,
            parent_state: None,
            parent_thread: None,
            next_role: role.into(),
            next_instruction: "Implement the change".into(),
            agent: None,
            cwd: None,
            next_location: None,
            labels: Default::default(),
        })
        .unwrap()
}

/// Deterministic xorshift, for shuffles without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One comparison: `ops` operations per run, `reps` alternating runs each.
/// `subject` and `baseline` return the time of the measured part of a run.
pub struct Comparison {
    pub name: String,
    pub ops: u64,
    pub subject: Duration,
    pub baseline: Duration,
}

impl Comparison {
    pub fn run(
        name: &str,
        ops: u64,
        reps: usize,
        mut subject: impl FnMut() -> Duration,
        mut baseline: impl FnMut() -> Duration,
    ) -> Comparison {
        // Warm up both once, then alternate so drift hits both alike.
        subject();
        baseline();
        let mut s = Vec::new();
        let mut b = Vec::new();
        for i in 0..reps {
            if i % 2 == 0 {
                s.push(subject());
                b.push(baseline());
            } else {
                b.push(baseline());
                s.push(subject());
            }
        }
        Comparison {
            name: name.to_owned(),
            ops,
            subject: median(s),
            baseline: median(b),
        }
    }

    pub fn rate(ops: u64, d: Duration) -> f64 {
        ops as f64 / d.as_secs_f64()
    }

    /// subject rate / baseline rate.
    pub fn ratio(&self) -> f64 {
        self.baseline.as_secs_f64() / self.subject.as_secs_f64()
    }
}

/// CPU (user + system) of this process's waited-for children so far
/// (`getrusage`); zero where it cannot be read.
pub fn children_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(u) = getrusage(UsageWho::RUSAGE_CHILDREN) else {
        return Duration::ZERO;
    };
    let t = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(tv.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(tv.tv_usec()).unwrap_or(0))
    };
    t(u.user_time()) + t(u.system_time())
}

/// Times `f`.
pub fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// Prints the table (Markdown, ready for the README).
pub fn report(title: &str, goal: &str, rows: &[Comparison]) {
    println!("\n## {title}\n");
    println!("goal: {goal}\n");
    println!("| benchmark | ops/run | uwf-db ops/s | baseline ops/s | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2}× |",
            r.name,
            r.ops,
            Comparison::rate(r.ops, r.subject),
            Comparison::rate(r.ops, r.baseline),
            r.ratio()
        );
    }
    println!(
        "\nmachine: {} cores; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            )
            .unwrap_or_default()
    );
}
