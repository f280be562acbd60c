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
