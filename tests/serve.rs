//! `uwf-db serve` through the real binary (issue 20, SPEC §12), on LMDB
//! and PostgreSQL: every endpoint answers with its contract type (checked
//! against the committed schemas), filters and paging, each write and its
//! errors with their statuses, live events with `Last-Event-ID`, and the
//! guard (token, host, origin, read-only, asset paths).
#![cfg(all(feature = "cli", feature = "serve"))]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;
use common::contract::assert_instance;
use serde_json::{Value, json};

const REVIEW: &str = "examples/review.yaml";
const PLANNER: &str = "examples/planner.yaml";
const REVIEW_AGENT: &str = "script:examples/review.scenario.yaml";
const PLANNER_AGENT: &str = "script:examples/planner.scenario.yaml";
const PATIENCE: Duration = Duration::from_secs(60);

/// A running `uwf-db serve`, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(env: &Cli, args: &[&str]) -> Server {
        let mut child = env
            .std_cmd()
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(PATIENCE).expect("serve printed nothing");
        let base = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split('/').nth(2))
            .map(|hostport| format!("http://{hostport}"))
            .unwrap_or_else(|| panic!("no address in: {line}"));
        Server { child, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        answer(agent().get(&self.url(path)).call())
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        answer(agent().post(&self.url(path)).send_json(body))
    }

    /// GET, asserting 200 and that the answer is a `schema`.
    fn ok(&self, path: &str, schema: &str) -> Value {
        let (status, v) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {v}");
        assert_instance(schema, &v);
        v
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
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .into()
}

fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
    let mut r = r.unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    if status >= 400 {
        // Every error is the contract's error answer.
        assert_instance("ErrorAnswer", &value);
    }
    (status, value)
}

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("")
}

fn setup(b: TestBackend) -> Cli {
    let env = Cli::new(b);
    env.json(&["workflow", "add", REVIEW]);
    env.json(&["workflow", "add", PLANNER]);
    env
}

fn thread_of(v: &Value) -> String {
    v["thread"].as_str().unwrap().to_owned()
}

/// Polls `GET /api/threads/{id}` until its status is `status`.
fn wait_for(server: &Server, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = server.ok(&format!("/api/threads/{id}"), "ThreadDetail");
        if v["status"] == status && !v["driver_alive"].as_bool().unwrap_or(false) {
            return v;
        }
        assert!(Instant::now() < deadline, "{id} never became {status}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn every_read_endpoint_answers_with_its_contract_type(b: TestBackend) {
    let env = setup(b);
    let done = env.json(&[
        "run",
        "review",
        "-p",
        "Add a flag",
        "--agent",
        REVIEW_AGENT,
        "--label",
        "team=cli",
    ]);
    let done = thread_of(&done);
    let asked = env.json(&["run", "planner", "-p", "Export", "--agent", PLANNER_AGENT]);
    let asked = thread_of(&asked);
    let server = Server::start(&env, &[]);

    let h = server.ok("/api/healthz", "Health");
    assert_eq!(h["status"], "ok");
    assert_eq!(h["backend"], b.name());
    assert_eq!(h["agents"], json!([]));

    // The list: newest activity first, no bodies.
    let page = server.ok("/api/threads", "ThreadPage");
    let ids: Vec<&str> = page["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [asked.as_str(), done.as_str()]);
    assert_eq!(page["next_cursor"], Value::Null);
    // Filters.
    let (asked_, done_) = (vec![asked.clone()], vec![done.clone()]);
    let only = |q: &str| -> Vec<String> {
        server.ok(&format!("/api/threads?{q}"), "ThreadPage")["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(thread_of)
            .collect()
    };
    assert_eq!(only("status=suspended"), asked_);
    assert_eq!(only("status=completed,suspended").len(), 2);
    assert_eq!(only("status=idle&status=completed"), done_);
    assert_eq!(only("workflow=review"), done_);
    assert_eq!(only("label=team%3Dcli"), done_);
    assert_eq!(only("label=team%3Dother"), Vec::<String>::new());
    assert_eq!(only("failed=true"), Vec::<String>::new());
    assert_eq!(only("since=2000-01-01T00:00:00Z").len(), 2);
    assert_eq!(only("until=2000-01-01T00:00:00Z"), Vec::<String>::new());

    // One thread, by a prefix as in the CLI.
    let t = server.ok(&format!("/api/threads/{}", &done[..12]), "ThreadDetail");
    assert_eq!(t["thread"], done.as_str());
    assert_eq!(t["status"], "completed");
    assert_eq!(t["labels"]["team"], "cli");
    assert_eq!(t["children"], json!([]));

    // Its log, newest first, paged by `before`: every step once.
    let first = server.ok(&format!("/api/threads/{done}/log?limit=2"), "LogPage");
    let mut seqs: Vec<u64> = Vec::new();
    let mut page = first;
    loop {
        for e in page["entries"].as_array().unwrap() {
            seqs.push(e["seq"].as_u64().unwrap());
        }
        let Some(before) = page["next_before"].as_str() else {
            break;
        };
        page = server.ok(
            &format!("/api/threads/{done}/log?limit=2&before={before}"),
            "LogPage",
        );
    }
    assert_eq!(seqs, [5, 4, 3, 2, 1]);
    let newest = &server.ok(&format!("/api/threads/{done}/log?limit=1"), "LogPage")["entries"][0];
    let oldest = &server.ok(&format!("/api/threads/{done}/log"), "LogPage")["entries"][4];
    assert_eq!(oldest["role"], "developer");
    assert!(!oldest["input"].as_str().unwrap().is_empty());

    let tree = server.ok(&format!("/api/threads/{done}/tree"), "TreeView");
    assert_eq!(tree["thread"]["thread"], done.as_str());

    // A node, and the size cap.
    let hash = newest["hash"].as_str().unwrap();
    let node = server.ok(&format!("/api/nodes/{hash}"), "BlobDetail");
    assert_eq!(node["kind"], "state");
    let (status, e) = server.get(&format!("/api/nodes/{hash}?max_bytes=10"));
    assert_eq!((status, kind(&e)), (413, "too_large"), "{e}");
    let (status, e) = server.get(&format!("/api/nodes/{}", "0".repeat(64)));
    assert_eq!((status, kind(&e)), (404, "not_found"), "{e}");

    // A step by its hash, with the exact prompt its agent was sent.
    let dev = oldest["hash"].as_str().unwrap();
    let step = server.ok(&format!("/api/steps/{}", &dev[..12]), "LogEntry");
    assert_eq!(
        (&step["hash"], &step["role"]),
        (&oldest["hash"], &json!("developer"))
    );
    assert_eq!(step["prompt_kept"], true);
    let sent = step["sent_prompt"].as_str().unwrap();
    assert!(sent.contains("Implement the change"), "{sent}");
    assert!(
        oldest["sent_prompt"].is_null(),
        "a log page carries no texts: {oldest}"
    );
    // The start node, or any blob that is not a step: refused.
    let start = server.ok(&format!("/api/threads/{done}"), "ThreadDetail")["start"].clone();
    let (status, e) = server.get(&format!("/api/steps/{}", start.as_str().unwrap()));
    assert_eq!(status / 100, 4, "{e}");
    let (status, e) = server.get(&format!("/api/steps/{}", "0".repeat(64)));
    assert_eq!((status, kind(&e)), (404, "not_found"), "{e}");

    let wfs = server.ok("/api/workflows", "WorkflowList");
    assert_eq!(wfs["workflows"].as_array().unwrap().len(), 2);
    let wf = server.ok("/api/workflows/planner", "WorkflowView");
    assert!(wf["yaml"].as_str().unwrap().contains("planner"));
    let edges = wf["graph"]["edges"].as_array().unwrap();
    assert!(edges.contains(&json!({"from": "planner", "status": "need_info", "to": "$SUSPEND"})));
    let (status, _) = server.get("/api/workflows/nope");
    assert_eq!(status, 404);

    let usage = server.ok("/api/usage", "UsageTotals");
    assert_eq!(usage["calls"], 5);

    // The diff of two unrelated runs shares nothing.
    let diff = server.ok(&format!("/api/diff?a={done}&b={asked}"), "ThreadDiff");
    assert_eq!(
        (diff["shared"].as_u64(), diff["same_start"].as_bool()),
        (Some(0), Some(false))
    );
    assert_eq!(diff["a_steps"].as_array().unwrap().len(), 5);

    // The OpenAPI document names every path the server answers.
    let (status, doc) = server.get("/api/openapi.json");
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/api/threads",
        "/api/threads/{id}/log",
        "/api/steps/{hash}",
        "/api/events",
        "/api/diff",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    assert!(doc["paths"]["/api/threads"]["post"].is_object());

    // Bad input: 400 naming the problem; unknown: 404.
    for (path, status, says) in [
        ("/api/threads?limit=0", 400, "limit"),
        ("/api/threads?limit=5000", 400, "limit"),
        ("/api/threads?status=sleeping", 400, "sleeping"),
        ("/api/threads?cursor=nope", 400, "cursor"),
        ("/api/threads?since=yesterday", 400, "since"),
        ("/api/threads?label=bad", 400, "label"),
        ("/api/threads?color=red", 400, "color"),
        ("/api/threads?limit=1&limit=2", 400, "twice"),
        ("/api/threads/not-an-id", 400, "not a thread id"),
        (
            "/api/threads/01ZZZZZZZZZZZZZZZZZZZZZZZZ",
            404,
            "01ZZZZZZZZZZZZZZZZZZZZZZZZ",
        ),
        ("/api/threads/0", 400, ""),
        ("/api/nodes/xyz", 400, "not a hash"),
        ("/api/diff?a=x", 400, "'b'"),
        ("/api/nothing", 404, "no such endpoint"),
    ] {
        let (got, e) = server.get(path);
        assert_eq!(got, status, "{path}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{path}: {e}"
        );
    }
    let r = agent().delete(&server.url("/api/threads")).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

fn threads_page_by_cursor_without_gaps_or_repeats(b: TestBackend) {
    let env = setup(b);
    let mut started = Vec::new();
    for i in 0..7 {
        let t = env.json(&["thread", "start", "review", "-p", &format!("task {i}")]);
        started.push(thread_of(&t));
    }
    let server = Server::start(&env, &[]);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/api/threads?limit=3&cursor={c}"),
            None => "/api/threads?limit=3".to_owned(),
        };
        let page = server.ok(&q, "ThreadPage");
        pages += 1;
        for t in page["threads"].as_array().unwrap() {
            seen.push(thread_of(t));
        }
        // A thread changing between pages moves up; it is not seen twice
        // below the cursor.
        if pages == 1 {
            env.json(&["thread", "label", &started[6], "moved=yes"]);
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    started.reverse();
    assert_eq!(seen, started, "newest first, each once");
    assert_eq!(pages, 3);
}

fn writes_start_resume_stop_cancel_fork_label(b: TestBackend) {
    let env = setup(b);
    let agent_arg = format!("default={PLANNER_AGENT}");
    // An agent that takes a while, so a drive can be stopped mid-step.
    let slow = env.file(
        "slow.sh",
        "sleep 1\nprintf -- '---\\n$status: review_needed\\n---\\nDone slowly\\n'\n",
    );
    let server = Server::start(
        &env,
        &[
            "--agent",
            &agent_arg,
            "--agent",
            &format!("slow=cmd:sh {slow}"),
            "--agent",
            &format!("reviewer={REVIEW_AGENT}"),
        ],
    );

    // Start without driving: 201 and an idle thread.
    let (status, started) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "Add a flag", "labels": {"team": "web"}}),
    );
    assert_eq!(status, 201, "{started}");
    assert_instance("DriveAccepted", &started);
    assert_eq!(started["agent"], Value::Null, "not driven");
    let idle = thread_of(&started["thread"]);
    assert_eq!(started["thread"]["status"], "idle");
    assert_eq!(started["thread"]["labels"]["team"], "web");

    // Start and drive: it runs to the planner's question and suspends.
    let (status, accepted) = server.post(
        "/api/threads",
        json!({"workflow": "planner", "prompt": "Export", "drive": true}),
    );
    assert_eq!(status, 201, "{accepted}");
    assert_instance("DriveAccepted", &accepted);
    assert_eq!(accepted["agent"], "default");
    let asked = thread_of(&accepted["thread"]);
    let t = wait_for(&server, &asked, "suspended");
    assert!(
        t["suspend_message"]
            .as_str()
            .unwrap()
            .contains("Which database")
    );

    // Resume it with the human's answer: it completes.
    let (status, resumed) = server.post(
        &format!("/api/threads/{asked}/resume"),
        json!({"text": "PostgreSQL"}),
    );
    assert_eq!(status, 202, "{resumed}");
    assert_instance("DriveAccepted", &resumed);
    wait_for(&server, &asked, "completed");
    let log = server.ok(&format!("/api/threads/{asked}/log?limit=10"), "LogPage");
    let resumed_step = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["seq"] == 2)
        .unwrap();
    assert!(
        resumed_step["input"]
            .as_str()
            .unwrap()
            .contains("PostgreSQL")
    );

    // Fork the finished run at its first step: 201, sharing that step.
    let (status, forked) = server.post(&format!("/api/threads/{asked}/fork"), json!({"seq": 1}));
    assert_eq!(status, 201, "{forked}");
    assert_instance("ThreadForked", &forked);
    let fork = thread_of(&forked);
    assert_eq!(forked["forked_from"]["thread"], asked.as_str());
    let diff = server.ok(&format!("/api/diff?a={asked}&b={fork}"), "ThreadDiff");
    assert_eq!(diff["shared"], 1);
    assert_eq!(diff["same_start"], true);
    assert_eq!(diff["a_steps"].as_array().unwrap().len(), 3);
    assert_eq!(diff["b_steps"], json!([]));

    // Labels: set and remove.
    let (status, labelled) = server.post(
        &format!("/api/threads/{idle}/labels"),
        json!({"set": {"owner": "ana"}, "remove": ["team"]}),
    );
    assert_eq!(status, 200, "{labelled}");
    assert_instance("LabelsSet", &labelled);
    assert_eq!(labelled["labels"], json!({"owner": "ana"}));

    // Stop: an idle thread has no driver to stop (409, as in the CLI); a
    // driven one stops after its step in flight.
    let (status, e) = server.post(&format!("/api/threads/{idle}/stop"), json!({}));
    assert_eq!((status, kind(&e)), (409, "conflict"), "{e}");
    let (status, slow) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "slowly", "drive": true, "agent": "slow"}),
    );
    assert_eq!(status, 201, "{slow}");
    let slow = thread_of(&slow["thread"]);
    let deadline = Instant::now() + PATIENCE;
    while server.ok(&format!("/api/threads/{slow}"), "ThreadDetail")["status"] != "running" {
        assert!(Instant::now() < deadline, "the slow drive never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, stopped) = server.post(&format!("/api/threads/{slow}/stop"), json!({}));
    assert_eq!(status, 200, "{stopped}");
    assert_instance("StopRequested", &stopped);
    let t = wait_for(&server, &slow, "idle");
    assert_eq!(t["seq"], 1, "stopped after the step in flight: {t}");
    let (status, cancelled) = server.post(&format!("/api/threads/{idle}/cancel"), json!({}));
    assert_eq!(status, 200, "{cancelled}");
    assert_instance("StepResult", &cancelled);
    assert_eq!(cancelled["status"], "cancelled");
    // Cancelling again is a conflict, as in the CLI.
    let (status, e) = server.post(&format!("/api/threads/{idle}/cancel"), json!({}));
    assert_eq!((status, kind(&e)), (409, "conflict"), "{e}");
    // An idle thread is not resumable.
    let (_, t) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "another"}),
    );
    let other = thread_of(&t["thread"]);
    let (status, e) = server.post(&format!("/api/threads/{other}/resume"), json!({}));
    assert_eq!((status, kind(&e)), (409, "conflict"), "{e}");
    // It is driven on instead, with the agent named.
    let (status, driven) = server.post(
        &format!("/api/threads/{other}/drive"),
        json!({"agent": "reviewer"}),
    );
    assert_eq!(status, 202, "{driven}");
    assert_instance("DriveAccepted", &driven);
    assert_eq!(driven["agent"], "reviewer");
    wait_for(&server, &other, "completed");
    let (status, e) = server.post(&format!("/api/threads/{other}/drive"), json!({}));
    assert_eq!(
        (status, kind(&e)),
        (409, "conflict"),
        "only idle threads: {e}"
    );
    // Naming no agent, a resume takes the server agent whose spec the
    // thread stores (not `default`).
    let (status, resumed) = server.post(&format!("/api/threads/{other}/resume"), json!({}));
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["agent"], "reviewer");
    wait_for(&server, &other, "completed");

    // Errors, each as JSON with its status.
    let raw = |body: &str, content_type: Option<&str>| -> (u16, Value) {
        let mut r = agent().post(&server.url("/api/threads"));
        if let Some(ct) = content_type {
            r = r.header("content-type", ct);
        }
        answer(r.send(body))
    };
    let (status, e) = raw(
        "{\"workflow\": \"review\", \"prompt\": ",
        Some("application/json"),
    );
    assert_eq!((status, kind(&e)), (400, "invalid"), "{e}");
    let (status, e) = raw(
        "{\"workflow\": \"review\", \"prompt\": \"x\", \"agent_spec\": \"cmd:sh\"}",
        Some("application/json"),
    );
    assert_eq!(status, 400, "an unknown field is refused: {e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent_spec"),
        "{e}"
    );
    let (status, e) = raw(
        "workflow=review&prompt=x",
        Some("application/x-www-form-urlencoded"),
    );
    assert_eq!(status, 415, "a form post is not JSON: {e}");
    // A body past the cap: refused from its Content-Length, before it is
    // read (raw, since a client still writing its body may see the
    // connection close under it).
    let mut conn = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    let size = 2 << 20;
    write!(
        conn,
        "POST /api/threads HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n{{\"prompt\": \"",
        server.base.trim_start_matches("http://")
    )
    .unwrap();
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut head = String::new();
    BufReader::new(&conn).read_line(&mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    for (body, status, says) in [
        (json!({"workflow": "nope", "prompt": "x"}), 404, "nope"),
        // An empty name is a name no workflow has (LMDB cannot hold the
        // key: found by schemathesis as a 503).
        (
            json!({"workflow": "", "prompt": "x"}),
            404,
            "no workflow named ''",
        ),
        (
            json!({"workflow": "review", "prompt": "x", "drive": true, "agent": "cmd:rm -rf /"}),
            400,
            "no agent named",
        ),
        (
            json!({"workflow": "review", "prompt": "x", "labels": {"BAD KEY": "v"}}),
            400,
            "BAD KEY",
        ),
    ] {
        let (got, e) = server.post("/api/threads", body.clone());
        assert_eq!(got, status, "{body}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{body}: {e}"
        );
    }
    let (status, e) = server.post(&format!("/api/threads/{asked}/fork"), json!({"seq": 99}));
    assert_eq!((status, kind(&e)), (404, "not_found"), "{e}");
    let (status, _) = server.post(
        &format!("/api/threads/{asked}/fork"),
        json!({"seq": 1, "before_role": "planner"}),
    );
    assert_eq!(status, 400);
    let (status, e) = server.post("/api/threads/01ZZZZZZZZZZZZZZZZZZZZZZZZ/stop", json!({}));
    assert_eq!((status, kind(&e)), (404, "not_found"), "{e}");
    drop(server);

    // A server without agents starts threads but drives none.
    let server = Server::start(&env, &[]);
    let (status, e) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "x", "drive": true}),
    );
    assert_eq!((status, kind(&e)), (409, "conflict"), "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("--agent"),
        "{e}"
    );
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: Option<String>,
    data: Value,
}

/// Opens an event stream; its events arrive on the channel.
fn events(server: &Server, path: &str, last_event_id: Option<&str>) -> Receiver<Sse> {
    let mut req = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .get(&server.url(path));
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let response = req.call().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let reader = BufReader::new(response.into_body().into_reader());
        let (mut event, mut id, mut data) = (String::new(), None, String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line.is_empty() {
                if !data.is_empty() {
                    let sse = Sse {
                        event: std::mem::take(&mut event),
                        id: id.take(),
                        data: serde_json::from_str(&data).unwrap_or(Value::String(data.clone())),
                    };
                    if tx.send(sse).is_err() {
                        break;
                    }
                }
                data.clear();
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = v.to_owned();
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    });
    rx
}

/// The next event named `name` (others are skipped).
fn next_event(rx: &Receiver<Sse>, name: &str) -> Sse {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no '{name}' event"));
        if e.event == name {
            return e;
        }
    }
}

fn step(env: &Cli, id: &str) {
    let o = env.uwf(&["thread", "step", id, "--agent", REVIEW_AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

fn thread_events_send_every_step_once_and_resume_from_last_event_id(b: TestBackend) {
    let env = setup(b);
    let t = env.json(&["thread", "start", "review", "-p", "Add a flag"]);
    let id = thread_of(&t);
    let server = Server::start(&env, &[]);
    let all = events(&server, "/api/events", None);
    let rx = events(&server, &format!("/api/threads/{id}/events"), None);
    // The thread's state first, then each step as another process commits it.
    let first = next_event(&rx, "thread");
    assert_eq!(first.data["status"], "idle");
    for seq in 1..=2u64 {
        step(&env, &id);
        let e = next_event(&rx, "step");
        assert_instance("LogEntry", &e.data);
        assert_eq!(
            (e.id.as_deref(), e.data["seq"].as_u64()),
            (Some(&*seq.to_string()), Some(seq))
        );
    }
    drop(rx);
    // A step while nobody watches, then a reconnect from step 2: step 3,
    // then the live ones (the last step writes the end node, 5), each
    // once and in order.
    step(&env, &id);
    let rx = events(&server, &format!("/api/threads/{id}/events"), Some("2"));
    let mut got = vec![next_event(&rx, "step").data["seq"].as_u64().unwrap()];
    step(&env, &id);
    got.push(next_event(&rx, "step").data["seq"].as_u64().unwrap());
    got.push(next_event(&rx, "step").data["seq"].as_u64().unwrap());
    assert_eq!(got, [3, 4, 5]);
    let done = next_event(&rx, "thread");
    assert_eq!(done.data["status"], "completed");
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "nothing repeated"
    );

    // The status stream saw the thread change; every event has an id.
    let change = next_event(&all, "thread");
    assert_instance("ThreadActivity", &change.data);
    assert_eq!(change.data["thread"], id.as_str());
    let mut last = change.id.clone().unwrap();
    while let Ok(e) = all.recv_timeout(Duration::from_millis(500)) {
        if let Some(i) = e.id {
            last = i;
        }
    }
    drop(all);
    // Reconnecting from the last id: only what changed after it.
    let other = thread_of(&env.json(&["thread", "start", "review", "-p", "later"]));
    let again = events(&server, "/api/events", Some(&last));
    let e = next_event(&again, "thread");
    assert_eq!(
        e.data["thread"],
        other.as_str(),
        "the one change after {last}"
    );
    assert!(
        again.recv_timeout(Duration::from_millis(500)).is_err(),
        "nothing repeated"
    );
    // From an old id, the newest state of each thread changed since.
    let from_start = events(&server, "/api/events", Some("0-00000000000000000000000000"));
    let mut seen = vec![
        thread_of(&next_event(&from_start, "thread").data),
        thread_of(&next_event(&from_start, "thread").data),
    ];
    seen.sort();
    let mut want = vec![id.clone(), other.clone()];
    want.sort();
    assert_eq!(seen, want);
    // A fresh stream's first event names where it starts: a client that
    // saw nothing else still resumes from there.
    let fresh = events(&server, "/api/events", None);
    let ready = next_event(&fresh, "ready");
    drop(fresh);
    let third = thread_of(&env.json(&["thread", "start", "review", "-p", "third"]));
    let resumed = events(&server, "/api/events", ready.id.as_deref());
    assert_eq!(thread_of(&next_event(&resumed, "thread").data), third);
    let (status, e) = server.get("/api/events?after=garbage");
    assert_eq!((status, kind(&e)), (400, "invalid"), "{e}");
}

/// A child workflow's thread answers with what its agents are told of
/// their parent: the same section `thread show --json` gives (issue 21).
fn a_child_thread_answers_with_its_parent_context(b: TestBackend) {
    let env = setup(b);
    let r = env.json(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "Ship it",
        "--agent",
        "script:examples/ship.scenario.yaml",
    ]);
    let parent = thread_of(&r);
    let child = env.show(&parent)["children"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let server = Server::start(&env, &[]);
    let t = server.ok(&format!("/api/threads/{child}"), "ThreadDetail");
    let pc = &t["parent_context"];
    assert_eq!(pc["thread"], parent.as_str());
    assert_eq!(pc["role"], "implement");
    assert_eq!(pc["task"]["text"], "Ship it");
    assert_eq!(pc, &env.show(&child)["parent_context"]);
    let top = server.ok(&format!("/api/threads/{parent}"), "ThreadDetail");
    assert!(top.get("parent_context").is_none(), "{top}");
}

/// `GET /metrics`: what a text line of the OpenMetrics answer says, `0.0`
/// when the series is absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn metrics_text(server: &Server) -> String {
    let mut r = agent().get(&server.url("/metrics")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers().get("content-type").unwrap().to_str().unwrap();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    r.body_mut().read_to_string().unwrap()
}

/// The server's own drives, counted for a Prometheus scrape: steps by
/// workflow, role and outcome, their latency, tokens reported, drives, and
/// none in flight once they end.
fn metrics_count_the_servers_steps(b: TestBackend) {
    let env = setup(b);
    let failing = env.file("fail.sh", "echo 'out of quota' >&2; exit 3\n");
    let usage = env.file(
        "usage.sh",
        "case \"$UWF_ROLE\" in developer) s=review_needed ;; *) s=approved ;; esac\n\
         printf -- '---\\n$status: %s\\n$usage: {input_tokens: 100, output_tokens: 7}\\n---\\nok\\n' \"$s\"\n",
    );
    let server = Server::start(
        &env,
        &[
            "--agent",
            &format!("default=cmd:sh {usage}"),
            "--agent",
            &format!("broken=cmd:sh {failing}"),
        ],
    );
    let before = metrics_text(&server);
    // Counters appear with their first series; the gauge at once.
    assert!(
        before.contains("# TYPE uwf_steps_in_flight gauge"),
        "{before}"
    );
    assert!(!before.contains("uwf_steps_total"), "{before}");

    let (status, ok) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "Add a flag", "drive": true}),
    );
    assert_eq!(status, 201, "{ok}");
    wait_for(&server, &thread_of(&ok["thread"]), "completed");
    let (status, bad) = server.post(
        "/api/threads",
        json!({"workflow": "review", "prompt": "Fails", "drive": true, "agent": "broken"}),
    );
    assert_eq!(status, 201, "{bad}");
    let bad_id = thread_of(&bad["thread"]);
    let deadline = Instant::now() + PATIENCE;
    let text = loop {
        let text = metrics_text(&server);
        if metric(
            &text,
            r#"uwf_drives_total{workflow="review",outcome="step_failed"}"#,
        ) >= 1.0
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "{bad_id}: no failed drive counted: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ok_steps = |role: &str| {
        metric(
            &text,
            &format!(r#"uwf_steps_total{{workflow="review",role="{role}",outcome="ok"}}"#),
        )
    };
    assert_eq!(
        (ok_steps("developer"), ok_steps("reviewer")),
        (1.0, 1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"uwf_steps_total{workflow="review",role="developer",outcome="step_failed"}"#
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, r#"uwf_drives_total{workflow="review",outcome="ok"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"uwf_step_duration_seconds_count{workflow="review",role="developer"}"#
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"uwf_agent_tokens_total{workflow="review",role="developer",token_type="input"}"#
        ),
        100.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"uwf_agent_tokens_total{workflow="review",role="reviewer",token_type="output"}"#
        ),
        7.0,
        "{text}"
    );
    assert!(text.contains("# TYPE uwf_steps counter"), "{text}");
    assert!(text.contains("\nuwf_steps_in_flight 0\n"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
}

process_conformance!(
    metrics_count_the_servers_steps,
    a_child_thread_answers_with_its_parent_context,
    every_read_endpoint_answers_with_its_contract_type,
    threads_page_by_cursor_without_gaps_or_repeats,
    writes_start_resume_stop_cancel_fork_label,
    thread_events_send_every_step_once_and_resume_from_last_event_id,
);

/// The token, the host check, the origin check and read-only; the
/// dashboard's headers and asset paths. (The guard runs before any store
/// access: LMDB suffices.)
#[test]
fn the_guard_refuses_what_it_must() {
    let env = setup(TestBackend::Lmdb);
    // Anything but loopback needs a token.
    let o = env.uwf(&["serve", "--bind", "0.0.0.0:0"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("--token"), "{}", stderr(&o));
    let o = env.uwf(&["serve", "--token", "short"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("too short"), "{}", stderr(&o));

    let token = "0123456789abcdef0123";
    let server = Server::start(&env, &["--token", token]);
    let (status, e) = server.get("/api/threads");
    assert_eq!((status, kind(&e)), (401, "unauthorized"), "{e}");
    let with = |t: &str| {
        answer(
            agent()
                .get(&server.url("/api/threads"))
                .header("Authorization", &format!("Bearer {t}"))
                .call(),
        )
    };
    assert_eq!(with(token).0, 200);
    assert_eq!(with("0123456789abcdef0124").0, 401);
    // The metrics are behind the same token.
    let (status, e) = server.get("/metrics");
    assert_eq!((status, kind(&e)), (401, "unauthorized"), "{e}");
    let r = agent()
        .get(&server.url("/metrics"))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // In the query only for an event stream (browsers open those without
    // headers), not for anything else.
    let (status, e) = server.get(&format!("/api/threads?token={token}"));
    assert_eq!((status, kind(&e)), (401, "unauthorized"), "{e}");
    let r = agent()
        .get(&server.url(&format!("/api/events?token={token}")))
        .config()
        .timeout_global(Some(Duration::from_secs(1)))
        .build()
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // The page itself carries no data and loads without the token.
    let r = agent().get(&server.url("/")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(server);

    let server = Server::start(&env, &[]);
    // DNS rebinding: a page served as evil.example that resolves to us.
    let r = agent()
        .get(&server.url("/api/threads"))
        .header("Host", "evil.example:7860")
        .call();
    let (status, e) = answer(r);
    assert_eq!((status, kind(&e)), (403, "forbidden"), "{e}");
    // Writes from another origin, or marked cross-site, are refused.
    let post = |headers: &[(&str, &str)]| {
        let mut r = agent().post(&server.url("/api/threads"));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        answer(r.send_json(json!({"workflow": "review", "prompt": "x"})))
    };
    let (status, e) = post(&[("Origin", "http://evil.example")]);
    assert_eq!((status, kind(&e)), (403, "forbidden"), "{e}");
    let (status, e) = post(&[("Sec-Fetch-Site", "cross-site")]);
    assert_eq!((status, kind(&e)), (403, "forbidden"), "{e}");
    // Reads too: another site's page (even another port on this host,
    // `same-site`) may not make the server work.
    for (k, v) in [
        ("Sec-Fetch-Site", "cross-site"),
        ("Sec-Fetch-Site", "same-site"),
        ("Origin", "http://localhost:3000"),
    ] {
        let (status, e) = answer(agent().get(&server.url("/api/usage")).header(k, v).call());
        assert_eq!((status, kind(&e)), (403, "forbidden"), "{k}: {v}: {e}");
    }
    let (status, _) = answer(
        agent()
            .get(&server.url("/api/usage"))
            .header("Sec-Fetch-Site", "same-origin")
            .call(),
    );
    assert_eq!(status, 200);
    let same = server.base.clone();
    assert_eq!(post(&[("Origin", &same)]).0, 201);

    // The dashboard: a strict content security policy; no path escapes
    // the embedded files.
    let r = agent().get(&server.url("/")).call().unwrap();
    let csp = r
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(r.headers().get("x-frame-options").unwrap(), "DENY");
    for path in [
        "/assets/../Cargo.toml",
        "/assets/%2e%2e/%2e%2e/Cargo.toml",
        "/assets/..%2f..%2fCargo.toml",
        "/assets//etc/passwd",
        "/assets/nope.js",
    ] {
        let r = agent().get(&server.url(path)).call().unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path}");
    }
    drop(server);

    let server = Server::start(&env, &["--read-only"]);
    assert_eq!(server.ok("/api/healthz", "Health")["read_only"], true);
    let (status, e) = server.post("/api/threads", json!({"workflow": "review", "prompt": "x"}));
    assert_eq!((status, kind(&e)), (403, "forbidden"), "{e}");
}

/// A reply full of markup is stored and served as the text it is, as JSON
/// (the dashboard renders it through a sanitizer: tests/browser).
#[test]
fn hostile_replies_are_served_as_json_text() {
    let env = setup(TestBackend::Lmdb);
    let hostile = "<script>window.__xss=1</script> [x](javascript:alert(1))";
    let scenario = env.file(
        "hostile.yaml",
        &format!("steps:\n  - role: developer\n    output: |\n      ---\n      $status: review_needed\n      ---\n      {hostile}\n"),
    );
    let t = env.json(&["thread", "start", "review", "-p", "x"]);
    let id = thread_of(&t);
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "--agent",
        &format!("script:{scenario}"),
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let server = Server::start(&env, &[]);
    let r = agent()
        .get(&server.url(&format!("/api/threads/{id}/log")))
        .call()
        .unwrap();
    assert_eq!(r.headers().get("content-type").unwrap(), "application/json");
    assert_eq!(
        r.headers().get("x-content-type-options").unwrap(),
        "nosniff"
    );
    let (_, log) = answer(Ok(r));
    assert_eq!(
        log["entries"][0]["content"].as_str().unwrap().trim(),
        hostile
    );
}

/// SIGTERM: the server stops taking connections, ends its event streams
/// and exits 0.
#[test]
fn sigterm_shuts_the_server_down_gracefully() {
    let env = setup(TestBackend::Lmdb);
    let mut server = Server::start(&env, &[]);
    let rx = events(&server, "/api/events", None);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    // The stream ended (its reader saw the end of the body) after what it
    // was sent (its `ready` event).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(_) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(e) => panic!("the event stream did not end: {e}"),
        }
    }
}
