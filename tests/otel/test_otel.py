"""`uwf-db` sending OTLP traces (HTTP + protobuf) to a receiver whose
decoding is the OpenTelemetry project's (`opentelemetry-proto`).

The `ship` workflow (its `implement` role runs `review` as a child) with a
scripted agent reporting usage: one trace, an `invoke_workflow` span per
thread, an `invoke_agent` span per role step with the GenAI conventions'
attributes, the child's workflow span under its parent's step; content
only when asked; a failed step's span marked ERROR; `OTEL_SERVICE_NAME`
honoured; no endpoint, no export; a bad or unreachable endpoint never
fails the command.

Usage: python tests/otel/test_otel.py PATH-TO-uwf-db   (run by tests/otel/run.sh)
"""

import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/uwf-db")
AGENT = "script:tests/otel/ship.scenario.yaml"

passed = 0


def ok(what):
    global passed
    passed += 1
    print(f"ok - {what}", flush=True)


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every request decoded, its spans kept."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests = []
        self.paths = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def take(self):
        """The spans received so far, flattened: (resource attrs, scope, span)."""
        with self.lock:
            reqs, self.requests = self.requests, []
        out = []
        for req in reqs:
            for rs in req.resource_spans:
                resource = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append((resource, ss.scope.name, span))
        return out


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.server.lock:
            self.server.requests.append(req)
            self.server.paths.append((self.path, self.headers.get("Content-Type")))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def uwf(store, *args, env=None, check=True):
    full = dict(os.environ)
    for k in list(full):
        if k.startswith("OTEL_") or k == "RUST_LOG":
            del full[k]
    full.update(env or {})
    out = subprocess.run([BIN, "--store", store, "--json", *args], cwd=ROOT, env=full,
                         capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, f"uwf-db {args}: {out.returncode}: {out.stderr}"
    return out


def store_with_workflows():
    store = tempfile.mkdtemp(prefix="uwf-otel-")
    uwf(store, "workflow", "add", "examples/review.yaml")
    uwf(store, "workflow", "add", "examples/ship.yaml")
    return store


def main():
    rx = Receiver()
    store = store_with_workflows()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint}

    # No endpoint: the command works and nothing is sent anywhere.
    uwf(store, "run", "ship", "-p", "quiet", "--agent", AGENT)
    assert rx.take() == []
    ok("no OTEL_EXPORTER_OTLP_ENDPOINT: nothing exported")

    # The run: spans arrive before the process exits (flushed at exit).
    out = uwf(store, "run", "ship", "-p", "Add a --json flag", "--agent", AGENT, env=env)
    parent_id = json.loads(out.stdout.strip().splitlines()[-1])["thread"]
    spans = rx.take()
    assert rx.paths and all(p == ("/v1/traces", "application/x-protobuf") for p in rx.paths), rx.paths
    names = sorted(s.name for _, _, s in spans)
    assert names == sorted([
        "invoke_workflow ship", "invoke_agent implement", "invoke_workflow review",
        "invoke_agent developer", "invoke_agent reviewer", "invoke_agent announce",
    ]), names
    ok("one span per drive and per role step, named by the conventions")

    resource, scope, _ = spans[0]
    assert resource["service.name"] == "uwf-db", resource
    assert scope == "uwf-db", scope
    assert len({s.trace_id for _, _, s in spans}) == 1, "one trace"
    by_name = {s.name: s for _, _, s in spans}
    by_id = {s.span_id: s for _, _, s in spans}
    root = by_name["invoke_workflow ship"]
    assert root.parent_span_id == b"", "the run is the trace's root"
    ok("service.name uwf-db, one trace, the run its root")

    def parent(name):
        return by_id[by_name[name].parent_span_id].name

    assert parent("invoke_agent implement") == "invoke_workflow ship"
    assert parent("invoke_agent announce") == "invoke_workflow ship"
    assert parent("invoke_workflow review") == "invoke_agent implement"
    assert parent("invoke_agent developer") == "invoke_workflow review"
    assert parent("invoke_agent reviewer") == "invoke_workflow review"
    ok("the child workflow's span is under its parent's role step")

    ra = attrs(root.attributes)
    assert root.kind == Span.SPAN_KIND_INTERNAL, root.kind
    assert ra["gen_ai.operation.name"] == "invoke_workflow", ra
    assert ra["gen_ai.workflow.name"] == "ship", ra
    assert ra["gen_ai.conversation.id"] == parent_id, (ra, parent_id)
    assert ra["uwf.thread.status"] == "completed", ra
    assert ra["uwf.steps"] == 2, ra  # implement, announce (the end is in the last step)
    assert not any(k.startswith(("code.", "thread.")) or k in ("target", "busy_ns", "idle_ns") for k in ra), ra
    child = attrs(by_name["invoke_workflow review"].attributes)
    assert child["uwf.thread.parent"] == parent_id, child
    assert child["gen_ai.conversation.id"] != parent_id, child
    ok("invoke_workflow attributes: operation, workflow, conversation, status, parent")

    dev = by_name["invoke_agent developer"]
    da = attrs(dev.attributes)
    assert dev.kind == Span.SPAN_KIND_CLIENT, dev.kind
    assert da["gen_ai.operation.name"] == "invoke_agent", da
    assert da["gen_ai.agent.name"] == "developer", da
    assert da["gen_ai.conversation.id"] == child["gen_ai.conversation.id"], da
    assert da["gen_ai.usage.input_tokens"] == 1200, da
    assert da["gen_ai.usage.output_tokens"] == 300, da
    assert da["gen_ai.response.model"] == "test-model", da
    assert da["uwf.status"] == "review_needed", da
    assert da["uwf.next_role"] == "reviewer", da
    assert "gen_ai.input.messages" not in da and "gen_ai.output.messages" not in da, da
    assert dev.status.code != Status.STATUS_CODE_ERROR
    assert dev.end_time_unix_nano >= dev.start_time_unix_nano > 0
    ok("invoke_agent attributes: agent, usage, model, status; no content by default")

    # Content, when asked by the conventions' switch.
    uwf(store, "run", "ship", "-p", "A secret task", "--agent", AGENT,
        env={**env, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    spans = {s.name: s for _, _, s in rx.take()}
    da = attrs(spans["invoke_agent developer"].attributes)
    sent = json.loads(da["gen_ai.input.messages"])
    assert sent[0]["role"] == "user" and "A secret task" in sent[0]["parts"][0]["content"], sent
    got = json.loads(da["gen_ai.output.messages"])
    assert got[0]["parts"][0]["content"].strip() == "Added --json with tests.", got
    ok("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: prompt and reply on the span")

    # A failed step: its span and the run's say so.
    failed = uwf(store, "run", "review", "-p", "fails", "--agent", "cmd:false", env=env, check=False)
    assert failed.returncode != 0
    spans = {s.name: s for _, _, s in rx.take()}
    dev = spans["invoke_agent developer"]
    assert dev.status.code == Status.STATUS_CODE_ERROR, dev.status
    assert attrs(dev.attributes)["error.type"] == "step_failed", attrs(dev.attributes)
    wf = spans["invoke_workflow review"]
    assert wf.status.code == Status.STATUS_CODE_ERROR, wf.status
    ok("a failed step: status ERROR and error.type on its span and its run's")

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are the SDK's.
    uwf(store, "run", "ship", "-p", "named", "--agent", AGENT,
        env={**env, "OTEL_SERVICE_NAME": "fleet-a", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"})
    resource, _, _ = rx.take()[0]
    assert resource["service.name"] == "fleet-a", resource
    assert resource["deployment.environment"] == "test", resource
    ok("OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES honoured")

    # A batch: a trace per thread.
    prompts = os.path.join(store, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("one\ntwo\nthree\n")
    uwf(store, "batch", "ship", "--prompts", prompts, "--agent", AGENT, "--jobs", "2", env=env)
    spans = rx.take()
    roots = [s for _, _, s in spans if s.name == "invoke_workflow ship"]
    assert len(roots) == 3 and len({s.trace_id for s in roots}) == 3, roots
    ok("batch: one trace per thread")

    # Nothing listening, or nonsense: the command still does its job.
    closed = Receiver()
    gone = closed.endpoint
    closed.shutdown()
    closed.server_close()
    started = time.monotonic()
    uwf(store, "run", "ship", "-p", "unheard", "--agent", AGENT,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": gone, "OTEL_EXPORTER_OTLP_TIMEOUT": "2000"})
    assert time.monotonic() - started < 30
    bad = uwf(store, "run", "ship", "-p", "bad", "--agent", AGENT,
              env={"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url"})
    assert "OTLP" in bad.stderr, bad.stderr
    ok("an unreachable or bad endpoint never fails the command")

    print(f"{passed} passed")


if __name__ == "__main__":
    main()
