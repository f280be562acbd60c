#!/usr/bin/env bash
# Fuzzes `uwf-db serve`'s HTTP API with schemathesis, a property-based
# fuzzer that reads the server's own OpenAPI 3.1 document
# (/api/openapi.json) and checks every answer against it: no 5xx, only
# documented statuses and content types, and bodies that match their
# schemas. It does not judge which inputs are accepted (no
# positive/negative data acceptance checks).
#
# The server runs on a temporary store with two workflows and a few
# threads (completed and labelled, suspended, idle, a fork, three idle
# ones kept for driveThread) and the planner's scripted agent as
# `default`, so writes drive threads too. Real thread ids, hashes,
# workflow and role names go to schemathesis as dictionaries it draws
# from half the time. The two Server-Sent Events operations (`events`,
# `threadEvents`) stream forever and are left out; schemathesis itself
# skips `openapi`, the document it reads.
#
# Usage: bash scripts/schemathesis.sh [PATH-TO-uwf-db]
#   (default target/debug/uwf-db; builds nothing; about 2 minutes on an
#   idle 2-core machine, 10,000+ requests)
# Env: ST_VENV (default /tmp/st-venv): the Python venv, made when missing,
#      with scripts/schemathesis-requirements.txt installed.
#      ST_MAX_EXAMPLES (default 800): test cases per operation and phase.
#      ST_SEED (default 1): the random seed.
#      ST_ARGS: more `st run` arguments (e.g. "--phases fuzzing", or
#      "--report har --report-dir /tmp/st-report" to keep every request).
# Exits non-zero when schemathesis reports a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=${1:-target/debug/uwf-db}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
[ -x "$bin" ] || { echo "schemathesis.sh: no uwf-db binary at $bin (build it first)" >&2; exit 2; }
venv=${ST_VENV:-/tmp/st-venv}
max_examples=${ST_MAX_EXAMPLES:-800}
seed=${ST_SEED:-1}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/uwf-st.XXXXXX")
server=
st=
cleanup() {
    if [ -n "$st" ]; then kill -TERM "$st" 2>/dev/null || true; fi
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
        kill -TERM "$server" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

store=$tmp/store
uwf() { "$bin" --store "$store" "$@"; }

echo "== store $store"
uwf workflow add examples/review.yaml >/dev/null
uwf workflow add examples/planner.yaml >/dev/null
uwf run review -p "Add a flag" --agent script:examples/review.scenario.yaml >/dev/null
uwf run planner -p Export --agent script:examples/planner.scenario.yaml >/dev/null # suspends
uwf thread start review -p idle >/dev/null
# A fork and a label, so diff, tree and the label filter have something.
review=$(uwf thread list --json | python3 -c \
    'import json,sys; print(next(t["thread"] for t in json.load(sys.stdin) if t["status"] == "completed"))')
uwf thread fork "$review" --from-role reviewer >/dev/null
uwf thread label "$review" team=core >/dev/null
# Idle threads only driveThread is given (cancelThread, tested before
# it, would otherwise have ended every thread it can name).
for i in 1 2 3; do
    uwf thread start planner -p "drive $i" --label fuzz=drive >/dev/null
done

echo "== serve"
"$bin" --store "$store" serve --bind 127.0.0.1:0 \
    --agent default=script:examples/planner.scenario.yaml \
    2>"$tmp/serve.stderr" &
server=$!
port=
for _ in $(seq 300); do
    port=$(sed -n 's|^uwf-db serve: listening on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' "$tmp/serve.stderr" | head -n1)
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "schemathesis.sh: the server did not say where it listens:" >&2
    cat "$tmp/serve.stderr" >&2
    exit 2
fi
base=http://127.0.0.1:$port
echo "   listening on $base"

if [ ! -x "$venv/bin/st" ]; then
    echo "== venv $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    -r "$root/scripts/schemathesis-requirements.txt"

# Real names for the fuzzer to draw from some of the time (the rest is
# random): without them nearly every request naming a thread, a node or
# a workflow is a 400 or 404 and the handlers past the lookup go untested.
"$venv/bin/python" - "$base" >"$tmp/schemathesis.toml" <<'PY'
import json, sys, urllib.request
base = sys.argv[1]
def get(path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.load(r)
threads = get("/api/threads")["threads"]
idle = sorted(t["thread"] for t in threads if t["labels"].get("fuzz") == "drive")
ids = sorted(t["thread"] for t in threads if t["thread"] not in idle)
hashes = set()
for i in ids:
    for e in get(f"/api/threads/{i}/log?limit=200")["entries"]:
        hashes.add(e["hash"])
        hashes.update(get(f"/api/nodes/{e['hash']}")["refs"])
workflows = get("/api/workflows")["workflows"]
roles = set()
for w in workflows:
    roles.update(get(f"/api/workflows/{w['name']}")["definition"]["roles"])
hashes.update(w["hash"] for w in workflows)
hashes = sorted(hashes)
# ULIDs made in one millisecond share 10 characters: 12 name one.
ids += [i[:12] for i in ids] + [ids[0].lower()]
hashes += [h[:8] for h in hashes[:8]]
def toml_list(xs):
    return "[" + ", ".join(json.dumps(x) for x in xs) + "]"
print(f"[dictionaries.threads]\nvalues = {toml_list(ids)}\n")
print(f"[dictionaries.hashes]\nvalues = {toml_list(hashes)}\n")
print(f"[dictionaries.workflows]\nvalues = {toml_list(sorted(w['name'] for w in workflows))}\n")
print(f"[dictionaries.idle]\nvalues = {toml_list(idle)}\n")
print(f"[dictionaries.roles]\nvalues = {toml_list(sorted(roles))}\n")
print("[dictionaries.steps]\nvalues = [0, 1, 2, 3]\n")
print("[parameters]")
# A fork takes at most one of node, seq and before_role: low odds each.
for key, name, p in [
    ("path.id", "threads", 0.5), ("query.a", "threads", 0.5), ("query.b", "threads", 0.5),
    ("path.hash", "hashes", 0.5), ("query.before", "hashes", 0.5),
    ("path.name", "workflows", 0.5), ("query.workflow", "workflows", 0.5),
    ("body.workflow", "workflows", 0.5),
    ("body.node", "hashes", 0.2), ("body.seq", "steps", 0.2), ("body.before_role", "roles", 0.2),
]:
    print(f'"{key}" = {{ dictionary = "{name}", probability = {p} }}')
print('\n[[operations]]\ninclude-operation-id = "driveThread"')
print('parameters = { "path.id" = { dictionary = "idle", probability = 0.5 } }')
PY

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
if "$venv/bin/st" run --help | grep -q response_headers_conformance; then
    checks=$checks,response_headers_conformance
fi

echo "== schemathesis $("$venv/bin/pip" show schemathesis 2>/dev/null | sed -n 's/^Version: //p')"
status=0
# Run from the temp dir: schemathesis writes its example database and
# reports under the working directory. In the background, so that a
# signal to this script ends the run and the server at once.
(
    cd "$tmp"
    # shellcheck disable=SC2086
    exec "$venv/bin/st" --config-file "$tmp/schemathesis.toml" run "$base/api/openapi.json" \
        --checks "$checks" \
        --exclude-operation-id events \
        --exclude-operation-id threadEvents \
        --max-examples "$max_examples" \
        --continue-on-failure \
        --seed "$seed" \
        --generation-database none \
        --workers 1 \
        --request-timeout 40 \
        --no-color \
        ${ST_ARGS:-}
) &
st=$!
wait "$st" || status=$?
st=

if ! kill -0 "$server" 2>/dev/null; then
    echo "schemathesis.sh: the server died during the run" >&2
    if [ "$status" -eq 0 ]; then status=1; fi
fi
if [ -s "$tmp/serve.stderr" ] && [ "$(wc -l <"$tmp/serve.stderr")" -gt 1 ]; then
    echo "== server stderr (beyond its listening line)"
    tail -n +2 "$tmp/serve.stderr" | head -n 100
fi
exit "$status"
