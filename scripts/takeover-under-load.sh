#!/usr/bin/env bash
# Fleet takeover under load (issue 18): FOUR runners of
# `batch --continue --wait` share a queue of THREADS idle threads on one
# store; after WARMUP seconds one runner is killed with SIGKILL while it
# holds its threads. The threads running at that moment are watched; the
# dead runner's are the ones whose step count stays put until a survivor
# takes them over. The figure is the longest time from the kill to a
# watched thread's next step — the takeover bound under load, which the
# design states as ORPHAN_CHECK (5 s) plus one thread of a survivor's
# drivers — with the number of threads still queued at that moment.
#
# usage: scripts/takeover-under-load.sh [STORE] [THREADS] [JOBS] [WARMUP]
#   STORE: an LMDB directory (made fresh) or a postgres:// URL of an empty
#   database; default: PostgreSQL database uwf_takeover_$$ on
#   postgres://root@127.0.0.1:5432 (created and dropped).
#   THREADS 1000, JOBS 4 per runner, WARMUP 8 s. UWF_BIN=PATH measures
#   another build.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${2:-1000}
jobs=${3:-4}
warmup=${4:-8}
# UWF_BIN: another build to measure (the one before the change, say).
if [ -z "${UWF_BIN:-}" ]; then
    cargo build --quiet --release --bin uwf-db
fi
bin=$(realpath "${UWF_BIN:-target/release/uwf-db}")
work=$(mktemp -d /tmp/uwf-takeover.XXXXXX)
db=
store=${1:-}
if [ -z "$store" ]; then
    db=uwf_takeover_$$
    psql -h 127.0.0.1 -U root -d postgres -qc "CREATE DATABASE $db"
    store="postgres://root@127.0.0.1:5432/$db"
fi
pids=()
cleanup() {
    for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null || true; done
    [ -n "$db" ] && psql -h 127.0.0.1 -U root -d postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
    rm -rf "$work"
}
trap cleanup EXIT
uwf() { "$bin" --store "$store" "$@"; }

uwf init >/dev/null
printf 'name: two\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: Write it } }\n  writer: { _: { role: reviewer, prompt: Review it } }\n  reviewer: { _: { role: $END, prompt: Reviewed } }\n' >"$work/two.yaml"
uwf workflow add "$work/two.yaml" >/dev/null
# The queue: THREADS idle threads, started without being driven.
for ((i = 0; i < threads; i++)); do
    echo "task $i"
done >"$work/prompts"
while read -r p; do uwf thread start two -p "$p" >/dev/null; done <"$work/prompts"
echo "store: $store; $threads queued threads; 4 runners x $jobs jobs; agent 0.2 s a call"

for r in 1 2 3 4; do
    # The binary itself, not the `uwf` function: $! must be its pid.
    "$bin" --store "$store" batch two --continue --wait --jobs "$jobs" \
        --agent "cmd:sh -c 'sleep 0.2; echo done'" >/dev/null 2>"$work/runner$r.err" &
    pids+=($!)
done
sleep "$warmup"
# The kill, then the threads running, with their step counts: the dead
# runner's stay put from the kill on, the survivors' keep moving.
kill -9 "${pids[0]}"
killed=$(date +%s.%N)
uwf --json thread list --status running --limit 1000 |
    python3 -c 'import json,sys; [print(t["thread"], t["seq"]) for t in json.load(sys.stdin)]' >"$work/running"
echo "killed runner 1; $(wc -l <"$work/running") threads running in the fleet just after"
# Watch until every thread running at the kill has taken a step since.
python3 - "$bin" "$store" "$work/running" "$killed" <<'PY'
import json, subprocess, sys, time
bin, store, path, killed = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
watched = dict(line.split() for line in open(path))
watched = {k: int(v) for k, v in watched.items()}
moved = {}
deadline = time.time() + 300
while len(moved) < len(watched) and time.time() < deadline:
    for tid, seq in watched.items():
        if tid in moved:
            continue
        out = subprocess.run([bin, "--store", store, "--json", "thread", "show", tid],
                             capture_output=True, text=True)
        if out.returncode != 0:
            continue
        t = json.loads(out.stdout)
        if t["seq"] > seq or t["status"] in ("completed", "failed", "cancelled"):
            moved[tid] = time.time() - killed
    time.sleep(0.2)
idle = subprocess.run([bin, "--store", store, "--json", "thread", "list", "--status", "idle",
                       "--limit", "100000"], capture_output=True, text=True)
queued = len(json.loads(idle.stdout)) if idle.returncode == 0 else -1
slow = sorted(moved.values())
print(f"threads running at the kill: {len(watched)}; moved on: {len(moved)}")
if slow:
    print(f"time from the kill to each one's next step: median {slow[len(slow)//2]:.1f} s, "
          f"longest {slow[-1]:.1f} s (the dead runner's threads are the slow ones)")
print(f"threads still queued when the last moved on: {queued}")
sys.exit(0 if len(moved) == len(watched) else 1)
PY
