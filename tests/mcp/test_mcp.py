"""`uwf-db mcp` through the official Python SDK's stdio client (`mcp`).

On a real store (LMDB, then PostgreSQL): initialize, list the tools and
their annotations, call every tool (a suspended thread resumed through the
tool and followed to its end, a run started and driven, a fork, labels,
stop, cancel), read both resource templates, bad arguments as tool errors
(never a crash: the session goes on), and `--read-only` offering no write.

Usage: python tests/mcp/test_mcp.py PATH-TO-uwf-db   (run by tests/mcp/run.sh)
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/uwf-db")
PLANNER_AGENT = "script:examples/planner.scenario.yaml"
REVIEW_AGENT = "script:examples/review.scenario.yaml"

READS = {"list_threads", "waiting_for_human", "get_thread", "read_log", "read_node",
         "call_stack", "list_workflows", "usage"}
WRITES = {"start_run", "resume", "drive", "stop", "cancel", "fork", "label"}

passed = 0


def ok(what):
    global passed
    passed += 1
    print(f"ok - {what}", flush=True)


def uwf(store, *args):
    """Runs the CLI on `store` with --json; returns the parsed answer (the
    last line's, for JSON Lines such as batch's)."""
    out = subprocess.run([BIN, "--store", store, "--json", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"uwf-db {args}: {out.returncode}: {out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def seed(store):
    """Two workflows; a completed labelled review, a suspended planner, an
    idle review. Returns their ids."""
    uwf(store, "workflow", "add", "examples/review.yaml")
    uwf(store, "workflow", "add", "examples/planner.yaml")
    done = uwf(store, "run", "review", "-p", "Add a flag", "--agent", REVIEW_AGENT,
               "--label", "team=cli")["thread"]
    asked = uwf(store, "run", "planner", "-p", "Export", "--agent", PLANNER_AGENT)["thread"]
    idle = uwf(store, "thread", "start", "review", "-p", "idle one")["thread"]
    # And what a batch run leaves: four completed, labelled threads.
    summary = uwf(store, "batch", "review", "-n", "4", "-p", "Batch item", "--agent",
                  REVIEW_AGENT, "--label", "batch=b1")
    assert summary["summary"]["completed"] == 4, summary
    return done, asked, idle


def value(result):
    """A successful tool result's JSON."""
    assert not result.is_error, f"tool error: {result.content[0].text}"
    return json.loads(result.content[0].text)


def error_of(result):
    """A tool error's ErrorAnswer (or its text, for the SDK's own)."""
    assert result.is_error, f"expected a tool error, got {result.content[0].text}"
    text = result.content[0].text
    try:
        return json.loads(text)["error"]
    except (ValueError, KeyError):
        return {"kind": None, "message": text}


async def session_on(store, *extra):
    params = StdioServerParameters(
        command=BIN,
        args=["--store", store, "mcp", "--agent", f"default={PLANNER_AGENT}",
              "--agent", "slow=cmd:sh tests/mcp/slow-agent.sh", *extra],
        cwd=ROOT,
    )
    return stdio_client(params)


async def until(session, thread, status, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        t = value(await session.call_tool("get_thread", {"id": thread}))
        if t["status"] == status and not t["driver_alive"]:
            return t
        assert time.monotonic() < deadline, f"{thread} never became {status}: {t}"
        await asyncio.sleep(0.05)


async def full_session(store, backend):
    done, asked, idle = seed(store)
    async with await session_on(store) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            assert init.server_info.name == "uwf-db", init.server_info
            assert "uwf://node/{hash}" in (init.instructions or "")
            ok(f"{backend}: initialize names the server and says how to use it")

            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == READS | WRITES, sorted(tools)
            for name in READS:
                a = tools[name].annotations
                assert a.read_only_hint is True and a.idempotent_hint is True, (name, a)
            for name in WRITES:
                assert tools[name].annotations.read_only_hint is False, name
            assert tools["cancel"].annotations.destructive_hint is True
            assert tools["start_run"].annotations.idempotent_hint is False
            assert tools["label"].annotations.idempotent_hint is True
            assert tools["get_thread"].input_schema["required"] == ["id"]
            ok(f"{backend}: 15 tools, reads and writes annotated as such")

            page = value(await s.call_tool("list_threads", {}))
            assert {done, asked, idle} <= {t["thread"] for t in page["threads"]}
            assert len(page["threads"]) == 7 and page["next_cursor"] is None
            batch = value(await s.call_tool("list_threads",
                                            {"label": ["batch=b1"], "status": ["completed"]}))
            assert len(batch["threads"]) == 4, batch
            assert all(t["usage"]["calls"] == 4 for t in batch["threads"]), batch
            only = value(await s.call_tool("list_threads", {"status": ["suspended"]}))
            assert [t["thread"] for t in only["threads"]] == [asked]
            labelled = value(await s.call_tool("list_threads", {"label": ["team=cli"]}))
            assert [t["thread"] for t in labelled["threads"]] == [done]
            first = value(await s.call_tool("list_threads", {"limit": 3}))
            rest = value(await s.call_tool("list_threads",
                                           {"limit": 10, "cursor": first["next_cursor"]}))
            assert len(first["threads"]) == 3 and len(rest["threads"]) == 4
            seen = [t["thread"] for t in first["threads"] + rest["threads"]]
            assert sorted(seen) == sorted(t["thread"] for t in page["threads"])
            ok(f"{backend}: list_threads filters and pages by cursor")

            waiting = value(await s.call_tool("waiting_for_human", {}))
            assert [t["thread"] for t in waiting["threads"]] == [asked]
            assert "Which database" in waiting["threads"][0]["suspend_message"]
            t = value(await s.call_tool("get_thread", {"id": asked}))
            assert t["status"] == "suspended"
            assert t["resume_command"] == f"uwf-db thread resume {asked} -p 'YOUR ANSWER'"
            ok(f"{backend}: waiting_for_human and get_thread say how to resume")

            log = value(await s.call_tool("read_log", {"id": done}))
            assert [e["seq"] for e in log["entries"]] == [5, 4, 3, 2, 1]
            assert all("content" not in e and e["content_bytes"] >= 0 for e in log["entries"])
            newest = log["entries"][0]
            bodies = value(await s.call_tool("read_log",
                                             {"id": done, "limit": 2, "bodies": True,
                                              "max_bytes": 3}))
            assert len(bodies["entries"]) == 2 and bodies["next_before"] is not None
            role_step = bodies["entries"][1]
            assert len(role_step["content"].encode()) <= 3 and role_step["content_cut"] is True
            older = value(await s.call_tool("read_log",
                                            {"id": done, "before": bodies["next_before"]}))
            assert [e["seq"] for e in older["entries"]] == [3, 2, 1]
            ok(f"{backend}: read_log pages, bodies only when asked and capped")

            node = value(await s.call_tool("read_node", {"hash": newest["hash"]}))
            assert node["hash"] == newest["hash"] and node["kind"] == "state"
            big = error_of(await s.call_tool("read_node",
                                             {"hash": newest["hash"], "max_bytes": 10}))
            assert big["kind"] == "too_large", big
            ok(f"{backend}: read_node decodes a node; max_bytes refuses a larger one")

            stack = value(await s.call_tool("call_stack", {"id": done}))
            assert stack["thread"]["thread"] == done and stack["parents"] == []
            wfs = value(await s.call_tool("list_workflows", {}))
            assert {w["name"] for w in wfs["workflows"]} == {"review", "planner"}
            spent = value(await s.call_tool("usage", {}))
            cli = uwf(store, "stats")["usage"]
            assert spent["calls"] == cli["calls"] > 0, (spent, cli)
            ok(f"{backend}: call_stack, list_workflows and usage")

            # The suspended thread, answered through the tool and followed.
            accepted = value(await s.call_tool("resume", {"id": asked, "text": "PostgreSQL"}))
            assert accepted["agent"] == "default" and accepted["thread"]["thread"] == asked
            end = await until(s, asked, "completed")
            assert "resume_command" not in end
            log = value(await s.call_tool("read_log", {"id": asked, "bodies": True}))
            assert any("PostgreSQL" in e["input"] for e in log["entries"]), log
            ok(f"{backend}: a suspended thread resumed through the tool runs to its end")

            started = value(await s.call_tool("start_run",
                                              {"workflow": "planner", "prompt": "Import",
                                               "drive": True}))
            run = started["thread"]["thread"]
            await until(s, run, "suspended")
            fresh = value(await s.call_tool("start_run",
                                            {"workflow": "planner", "prompt": "Later"}))
            later = fresh["thread"]["thread"]
            assert fresh["agent"] is None and fresh["thread"]["status"] == "idle"
            value(await s.call_tool("drive", {"id": later}))
            await until(s, later, "suspended")
            ok(f"{backend}: start_run drives with the server's agent; drive runs an idle one")

            forked = value(await s.call_tool("fork", {"id": done, "before_role": "reviewer"}))
            assert forked["forked_from"]["thread"] == done and forked["thread"] != done
            labels = value(await s.call_tool("label", {"id": idle, "set": {"stage": "mcp"}}))
            assert labels["labels"] == {"stage": "mcp"}
            labels = value(await s.call_tool("label", {"id": idle, "remove": ["stage"]}))
            assert labels["labels"] == {}
            # A running thread stops after its step in flight, kept idle.
            slow = value(await s.call_tool("start_run",
                                           {"workflow": "review", "prompt": "Slowly",
                                            "drive": True, "agent": "slow"}))["thread"]["thread"]
            deadline = time.monotonic() + 30
            while not value(await s.call_tool("get_thread", {"id": slow}))["driver_alive"]:
                assert time.monotonic() < deadline, "the slow run never started"
                await asyncio.sleep(0.02)
            stopped = value(await s.call_tool("stop", {"id": slow}))
            assert stopped["thread"] == slow and stopped["stop_requested_at"] is not None
            t = await until(s, slow, "idle")
            assert t["seq"] == 1 and t["next_role"] == "reviewer", t
            # Nothing drives the idle thread: stopping it is refused, saying why.
            e = error_of(await s.call_tool("stop", {"id": idle}))
            assert e["kind"] == "conflict" and "nothing to stop" in e["message"], e
            cancelled = value(await s.call_tool("cancel", {"id": idle}))
            assert cancelled["status"] == "cancelled", cancelled
            ok(f"{backend}: fork, label, stop and cancel")

            # Bad arguments: tool errors the model can read; the session goes on.
            e = error_of(await s.call_tool("get_thread", {}))
            assert "id" in e["message"], e
            e = error_of(await s.call_tool("get_thread", {"id": 42}))
            assert "string" in e["message"], e
            e = error_of(await s.call_tool("get_thread", {"id": "zz"}))
            assert e["kind"] == "invalid" and "not a thread id" in e["message"], e
            e = error_of(await s.call_tool("get_thread", {"id": "01M8BZ8549ZZX7H0SFTYMDKYK3"}))
            assert e["kind"] == "not_found", e
            e = error_of(await s.call_tool("list_threads", {"status": ["bogus"]}))
            assert e["kind"] == "invalid" and "bogus" in e["message"], e
            e = error_of(await s.call_tool("list_threads", {"colour": "red"}))
            assert "colour" in e["message"], e
            e = error_of(await s.call_tool("resume", {"id": done, "agent": "rm -rf /"}))
            assert e["kind"] == "invalid" and "no agent named" in e["message"], e
            e = error_of(await s.call_tool("start_run", {"workflow": "nope", "prompt": "x"}))
            assert e["kind"] == "not_found", e
            try:
                await s.call_tool("no_such_tool", {})
                raise AssertionError("an unknown tool was answered")
            except MCPError as err:
                assert err.code == -32602, err
            assert value(await s.call_tool("get_thread", {"id": done}))["thread"] == done
            ok(f"{backend}: bad arguments are tool errors, the session goes on")

            templates = (await s.list_resource_templates()).resource_templates
            assert {t.uri_template for t in templates} == {"uwf://thread/{id}",
                                                           "uwf://node/{hash}"}
            assert any("never changes" in (t.description or "") for t in templates)
            listed = (await s.list_resources()).resources
            assert f"uwf://thread/{done}" in {str(r.uri) for r in listed}
            r = (await s.read_resource(f"uwf://thread/{done}")).contents[0]
            assert r.mime_type == "application/json" and json.loads(r.text)["thread"] == done
            r = (await s.read_resource(f"uwf://node/{newest['hash']}")).contents[0]
            assert json.loads(r.text)["kind"] == "state"
            try:
                await s.read_resource("uwf://nothing/here")
                raise AssertionError("an unknown resource was read")
            except MCPError:
                pass
            ok(f"{backend}: resources for a thread and a node")


async def read_only_session(store, backend):
    threads = uwf(store, "thread", "list")
    before = sorted((t["thread"], t["status"], t["seq"]) for t in threads)
    async with await session_on(store, "--read-only") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            assert names == READS, sorted(names)
            for name, args in [("start_run", {"workflow": "review", "prompt": "x"}),
                               ("cancel", {"id": threads[0]["thread"]})]:
                try:
                    await s.call_tool(name, args)
                    raise AssertionError(f"{name} was answered in read-only mode")
                except MCPError as err:
                    assert err.code == -32602, err
            value(await s.call_tool("list_threads", {}))
    after = sorted((t["thread"], t["status"], t["seq"])
                   for t in uwf(store, "thread", "list"))
    assert before == after
    ok(f"{backend}: --read-only offers only the reads and changes nothing")


def postgres_url():
    setting = os.environ.get("MCP_POSTGRES", "")
    if setting == "off":
        return None, None
    name = "uwf_mcp_" + uuid.uuid4().hex[:12]
    made = subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "root", name],
                          capture_output=True, text=True)
    if made.returncode != 0:
        print("!!! PostgreSQL: cannot create a test database "
              f"({made.stderr.strip()}); set MCP_POSTGRES=off to skip it", file=sys.stderr)
        sys.exit(1)
    return f"postgres://root@127.0.0.1:5432/{name}", name


def a_missing_store_is_an_error():
    """A mistyped store in a client's configuration is refused, not served
    empty (and not created)."""
    with tempfile.TemporaryDirectory() as tmp:
        missing = os.path.join(tmp, "typo")
        out = subprocess.run([BIN, "--store", missing, "mcp"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, (out.returncode, out.stderr)
        assert "no uwf-db store at" in out.stderr and "uwf-db init" in out.stderr, out.stderr
        assert not os.path.exists(missing)
    ok("a missing store is refused, not created")


async def main():
    a_missing_store_is_an_error()
    with tempfile.TemporaryDirectory() as tmp:
        lmdb = os.path.join(tmp, "store")
        await full_session(lmdb, "lmdb")
        await read_only_session(lmdb, "lmdb")
    url, name = postgres_url()
    if url:
        try:
            await full_session(url, "postgres")
            await read_only_session(url, "postgres")
        finally:
            subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "root", "--force", name],
                           capture_output=True)
    print(f"MCP client tests passed: {passed}")


def first_leaf(e):
    """The first plain exception inside (nested) exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


try:
    asyncio.run(main())
except BaseException as group:  # the SDK's task groups wrap the failure
    leaf = first_leaf(group)
    if leaf is group:
        raise
    import traceback
    traceback.print_exception(leaf)
    print(f"MCP client tests FAILED after {passed} passed", file=sys.stderr)
    sys.exit(1)
