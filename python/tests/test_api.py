"""The Python API over the library (docs/design.md §8g): a store, workflows,
threads, a Python callable as an agent, and errors as exceptions."""

import os
import pathlib
import threading

import pytest

import uwf_db

ROOT = pathlib.Path(__file__).resolve().parents[2]

TWO = """name: two
roles:
  writer: { goal: Write }
  reviewer:
    goal: Review
    frontmatter:
      properties: { $status: { enum: [approved, rejected] } }
      required: [$status]
graph:
  $START: { _: { role: writer, prompt: 'Write it' } }
  writer: { _: { role: reviewer, prompt: 'Review it' } }
  reviewer:
    approved: { role: $END, prompt: 'Done' }
    rejected: { role: writer, prompt: 'Again' }
"""


@pytest.fixture
def store(tmp_path):
    s = uwf_db.Store(str(tmp_path / "store"))
    s.add_workflow(TWO)
    return s


def agent(request):
    """Writes a draft; the reviewer approves with a dict reply and reports usage."""
    if request["role"] == "writer":
        return f"a draft for {request['thread']}"
    return {
        "frontmatter": {"$status": "approved"},
        "body": "Looks good",
        "usage": {"input_tokens": 12, "output_tokens": 3, "model": "py-test"},
    }


def test_a_python_callable_runs_a_workflow_to_its_end(store):
    calls = []

    def recording(request):
        calls.append((request["role"], request["workflow"]))
        assert "## Task" in request["prompt"] and "Ship it" in request["prompt"]
        return agent(request)

    out = store.run("two", "Ship it", recording, labels={"team": "py"})
    assert calls == [("writer", "two"), ("reviewer", "two")]
    assert [s["status"] for s in out["steps"]] == ["idle", "completed"]
    t = store.thread(out["thread"])
    assert t["status"] == "completed"
    assert t["labels"] == {"team": "py"}
    # The log, newest first: the reviewer's frontmatter and both replies.
    log = store.log(out["thread"])
    roles = [e["role"] for e in log if e.get("role") in ("writer", "reviewer")]
    assert roles == ["reviewer", "writer"]
    reviewer = next(e for e in log if e.get("role") == "reviewer")
    assert reviewer["meta"]["$status"] == "approved"
    assert "Looks good" in reviewer["content"]
    writer = next(e for e in log if e.get("role") == "writer")
    assert writer["content"].strip() == f"a draft for {out['thread']}"
    # The usage the callable reported is recorded with the step.
    assert reviewer["usage"]["input_tokens"] == 12
    assert reviewer["usage"]["model"] == "py-test"


def test_an_exception_in_the_agent_is_a_failed_step_recorded_on_the_thread(store):
    def broken(request):
        raise RuntimeError("the model is down")

    t = store.start("two", "Ship it")
    with pytest.raises(uwf_db.StepFailed) as e:
        store.step(t["thread"], broken)
    assert "RuntimeError" in str(e.value) and "the model is down" in str(e.value)
    assert e.value.kind == "step_failed"
    assert isinstance(e.value, uwf_db.UwfError)
    after = store.thread(t["thread"])
    assert after["status"] == "idle"
    assert "the model is down" in after["last_error"]
    # Driven again with a working agent, it goes on from where it stood.
    steps = store.step(t["thread"], agent)
    assert steps[-1]["status"] == "completed"


def test_a_reply_of_the_wrong_type_is_a_failed_step(store):
    t = store.start("two", "x")
    with pytest.raises(uwf_db.StepFailed, match="not a str or a dict"):
        store.step(t["thread"], lambda request: 42)


def test_threads_are_listed_with_the_clis_filters(store):
    done = store.run("two", "a", agent, labels={"k": "1"})["thread"]
    idle = store.start("two", "b", labels={"k": "2"})["thread"]
    ids = lambda rows: {r["thread"] for r in rows}
    assert ids(store.threads()) == {done, idle}
    assert ids(store.threads(status=["completed"])) == {done}
    assert ids(store.threads(labels={"k": "2"})) == {idle}
    assert ids(store.threads(workflow="nope")) == set()
    # A unique prefix names a thread, as in the CLI.
    assert store.thread(idle[:20])["thread"] == idle


def test_errors_are_exceptions_named_by_kind(store, tmp_path):
    with pytest.raises(uwf_db.NotFound):
        store.thread("01" + "Z" * 24)
    with pytest.raises(uwf_db.NotFound, match="no workflow named 'missing'"):
        store.start("missing", "x")
    with pytest.raises(uwf_db.InvalidInput, match="invalid workflow"):
        store.add_workflow("name: bad\nroles: {}\n")
    with pytest.raises(uwf_db.InvalidInput, match="unknown status"):
        store.threads(status=["sleeping"])
    with pytest.raises(uwf_db.InvalidInput):
        store.thread("not an id!")
    with pytest.raises(uwf_db.InvalidInput, match="durability") as e:
        uwf_db.Store(str(tmp_path / "other"), durability="sometimes")
    assert e.value.kind == "invalid"
    with pytest.raises(uwf_db.NotFound) as e:
        store.thread("01" + "Z" * 24)
    assert e.value.kind == "not_found"
    assert type(e.value).__module__ == "uwf_db"


def test_a_workflow_file_and_a_spec_string_agent(tmp_path):
    s = uwf_db.Store(str(tmp_path / "store"))
    added = s.add_workflow(path=str(ROOT / "examples" / "review.yaml"))
    assert added["name"] == "review" and added["changed"]
    out = s.run(
        "review",
        "Add a flag",
        "script:" + str(ROOT / "examples" / "review.scenario.yaml"),
    )
    assert s.thread(out["thread"])["status"] == "completed"


def test_python_threads_drive_threads_in_parallel(store):
    """The GIL is released while the engine works: drives from several
    Python threads interleave and all complete."""
    results, errors = [], []

    def drive(i):
        try:
            results.append(store.run("two", f"task {i}", agent)["thread"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=drive, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert len(set(results)) == 8
    assert all(store.thread(t)["status"] == "completed" for t in results)


@pytest.mark.skipif(
    not os.environ.get("UWF_TEST_POSTGRES"), reason="set UWF_TEST_POSTGRES=postgres://… to run"
)
def test_a_postgres_store():
    s = uwf_db.Store(os.environ["UWF_TEST_POSTGRES"])
    s.add_workflow(TWO)
    out = s.run("two", "on postgres", agent)
    assert s.thread(out["thread"])["status"] == "completed"


SUSPENDS = """name: asks
roles:
  planner:
    goal: Plan
    frontmatter:
      properties: { $status: { enum: [ask, done] } }
      required: [$status]
graph:
  $START: { _: { role: planner, prompt: 'Plan it' } }
  planner:
    ask: { role: $SUSPEND, prompt: 'Which one?' }
    done: { role: $END, prompt: 'Planned' }
"""


def test_resume_fork_labels_cancel_usage(store):
    store.add_workflow(SUSPENDS)
    seen = []

    def planner(request):
        seen.append(request["prompt"])
        answered = "Take the second" in request["prompt"]
        return {"frontmatter": {"$status": "done" if answered else "ask"}, "body": "plan",
                "usage": {"input_tokens": 5, "output_tokens": 1, "model": "py"}}

    out = store.run("asks", "Plan a trip", planner)
    tid = out["thread"]
    assert store.thread(tid)["status"] == "suspended"
    with pytest.raises(uwf_db.InvalidInput):
        store.resume(tid, planner)  # a suspended thread needs the human's answer
    steps = store.resume(tid, planner, "Take the second")
    assert steps[-1]["status"] == "completed"
    assert "Take the second" in seen[-1]

    # A fork shares the history; labels change in one write.
    forked = store.fork(tid, before_role="planner")
    assert forked["forked_from"]["thread"] == tid and forked["thread"] != tid
    assert store.thread(forked["thread"])["seq"] < store.thread(tid)["seq"]
    labelled = store.label(forked["thread"], {"try": "2", "team": "py"}, ["nope"])
    assert labelled["labels"] == {"try": "2", "team": "py"}
    assert store.label(forked["thread"], remove=["team"])["labels"] == {"try": "2"}
    with pytest.raises(uwf_db.InvalidInput):
        store.label(forked["thread"], {"bad key": "x"})

    # Usage of one thread and of the whole store.
    assert store.usage(tid)["calls"] == 2
    assert store.usage()["calls"] >= 2
    assert store.usage(tid)["input_tokens"] == 10

    # Stopping needs a driver; cancelling ends the fork.
    with pytest.raises(uwf_db.UwfError):
        store.stop(forked["thread"])
    ended = store.cancel(forked["thread"])
    assert ended["status"] == "cancelled"
    assert store.thread(forked["thread"])["status"] == "cancelled"
    with pytest.raises(uwf_db.NotFound):
        store.fork("7ZZZZZZZZZZZZZZZZZZZZZZZZZ")


def test_gc_and_verify(store):
    out = store.run("two", "Ship it", agent)
    assert store.verify()["ok"] is True
    report = store.gc(grace_seconds=0, dry_run=True)
    assert isinstance(report, dict)
    with pytest.raises(uwf_db.InvalidInput):
        store.gc(grace_seconds=-1)
    store.gc(grace_seconds=0)
    # What a thread reaches survives a collection with no grace.
    assert store.log(out["thread"], limit=10)
    assert store.verify()["problems"] == []


def test_a_batch_of_threads_with_a_python_agent_from_several_threads(store):
    callers = set()
    lock = threading.Lock()

    def counted(request):
        with lock:
            callers.add(threading.get_ident())
        if "fail" in request["prompt"] and request["role"] == "writer":
            raise RuntimeError("model unavailable")
        return agent(request)

    prompts = [f"task {i}" for i in range(23)] + ["task that will fail"]
    out = store.batch("two", prompts, counted, jobs=4, labels={"run": "b1"})
    summary = out["summary"]["summary"]
    assert (summary["completed"], summary["failed"] + summary["errors"]) == (23, 1), summary
    assert out["summary"]["steps_per_sec"] > 0
    assert len(out["items"]) == 24
    assert len({i["thread"] for i in out["items"]}) == 24
    assert len(callers) > 1, "the agent was called from one thread only"
    labelled = store.threads(labels={"run": "b1"}, limit=100)
    assert len(labelled) == 24
    failed = [i for i in out["items"] if i.get("error")]
    assert len(failed) == 1 and "model unavailable" in failed[0]["error"]
    with pytest.raises(uwf_db.InvalidInput):
        store.batch("two", ["x"], counted, jobs=0)


def test_ctrl_c_stops_a_drive_where_it_is_safe(store):
    import signal
    import time

    started = threading.Event()
    sent = threading.Event()

    def slow(request):
        # The first call holds the drive until Ctrl-C has been sent and the
        # main thread (which checks every 50 ms) has had ample time to see
        # it, so the drive cannot end first however loaded the machine is.
        started.set()
        sent.wait(5)
        time.sleep(1.0)
        return agent(request)

    def interrupt():
        started.wait(5)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    # Ctrl-C as Python sees it in a terminal: a shell that starts a job in
    # the background (`cmd &`, no job control) starts it with SIGINT
    # ignored, and Python then installs no handler of its own.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            store.run("two", "Ship it", slow, labels={"ctrl": "c"})
        assert time.monotonic() - t0 < 8
    finally:
        signal.signal(signal.SIGINT, previous)
    (t,) = store.threads(labels={"ctrl": "c"})
    # The drive stopped after the call in flight (a Python agent cannot be
    # killed; its step is kept whole or not at all), before the reviewer ran;
    # the thread is idle and can be driven on.
    assert t["status"] == "idle" and t["seq"] <= 1, t
    steps = store.step(t["thread"], agent)
    assert steps[-1]["status"] == "completed"


def test_watch_yields_steps_as_they_commit_and_ends_with_the_thread(store):
    import time

    t = store.start("two", "Ship it")["thread"]
    seen = []

    def watcher():
        for step in store.watch(t):
            seen.append((step["seq"], step["role"], time.monotonic()))

    w = threading.Thread(target=watcher)
    w.start()
    time.sleep(0.3)
    assert seen == []  # nothing committed yet: it waits
    committed = time.monotonic()
    store.step(t, agent)
    w.join(10)
    assert not w.is_alive(), "the watch did not end with the thread"
    assert [(s, r) for s, r, _ in seen] == [(1, "writer"), (2, "reviewer"), (3, "__end__")]
    assert all(at >= committed for _, _, at in seen)
    # From a step on; and a watch closed early stops.
    assert [s["seq"] for s in store.watch(t, after=2)] == [3]
    idle = store.start("two", "Never driven")["thread"]
    it = store.watch(idle)
    it.close()
    assert list(it) == []
    with pytest.raises(uwf_db.NotFound):
        store.watch("7ZZZZZZZZZZZZZZZZZZZZZZZZZ")


def test_export_then_import_into_another_store(store, tmp_path):
    out = store.run("two", "Ship it", agent, labels={"team": "py"})
    bundle = store.export([out["thread"]])
    assert isinstance(bundle, bytes) and bundle
    other = uwf_db.Store(str(tmp_path / "other"))
    report = other.import_(bundle)
    assert other.thread(out["thread"])["status"] == "completed"
    assert [e["role"] for e in other.log(out["thread"])] == [e["role"] for e in store.log(out["thread"])]
    assert report["threads"]
    again = other.import_(bundle, new_ids=True)
    assert again["threads"][0][1] != out["thread"]
    # A damaged bundle is refused whole, and nothing is written.
    damaged = bytearray(bundle)
    damaged[len(damaged) // 2] ^= 0xFF
    before = len(other.threads(limit=100))
    with pytest.raises(uwf_db.UwfError):
        other.import_(bytes(damaged))
    assert len(other.threads(limit=100)) == before
