#!/usr/bin/env bash
# Measures the claim takeover bound on PostgreSQL when a runner's network
# vanishes silently (docs/design.md §4b, "Claims on PostgreSQL, and
# failover"): a runner claims a thread and waits in its agent; iptables
# then drops every packet of its claim connection, both ways, as a pulled
# cable would. The script times how long the server keeps the claim (the
# design says at most 25 s: keepalive probes after 10 s idle, every 5 s,
# 3 unanswered) and shows a second runner finishing the thread.
#
# Needs root, iptables and a PostgreSQL server on 127.0.0.1:5432 reached
# over TCP (UWF_TAKEOVER_SERVER, default postgres://root@127.0.0.1:5432).
# Run: bash scripts/takeover-bound.sh   (about 30 s; not part of CI)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${UWF_TAKEOVER_SERVER:-postgres://root@127.0.0.1:5432}
db=uwf_takeover_$$
url="$server/$db"
psql "$server/postgres" -qc "CREATE DATABASE $db"
cargo build --quiet --release --bin uwf-db
bin=target/release/uwf-db
rules=()
runner=
cleanup() {
    for r in "${rules[@]}"; do iptables -D $r 2>/dev/null || true; done
    [ -n "$runner" ] && kill -9 "$runner" 2>/dev/null || true
    pkill -9 -f "sleep 3600" 2>/dev/null || true
    psql "$server/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}
trap cleanup EXIT

# Runner A: claims the thread, then waits in its agent for an hour.
$bin --store "$url" run examples/review.yaml -p "a task" --agent 'cmd:sleep 3600' \
    >/dev/null 2>&1 &
runner=$!
lock_pid=
for _ in $(seq 100); do
    lock_pid=$(psql "$url" -Atc "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted LIMIT 1")
    [ -n "$lock_pid" ] && break
    sleep 0.1
done
[ -n "$lock_pid" ] || { echo "runner A never took its claim"; exit 1; }
port=$(psql "$url" -Atc "SELECT client_port FROM pg_stat_activity WHERE pid = $lock_pid")
thread=$($bin --store "$url" --json thread list | grep -o '"thread": *"[^"]*"' | head -1 | sed 's/.*"\([^"]*\)"$/\1/')
echo "runner A (pid $runner) holds the claim on thread $thread in server process $lock_pid (client port $port)"

# The cable is pulled: nothing of that connection gets through either way.
rules=("INPUT -i lo -p tcp --sport $port -j DROP" "INPUT -i lo -p tcp --dport $port -j DROP")
for r in "${rules[@]}"; do iptables -A $r; done
start=$(date +%s%N)
echo "dropping every packet of client port $port from now on"
while [ -n "$(psql "$url" -Atc "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $lock_pid")" ]; do
    sleep 0.25
done
end=$(date +%s%N)
ms=$(( (end - start) / 1000000 ))
echo "the server released the claim after $((ms / 1000)).$(( (ms % 1000) / 100 )) s (bound: 25 s; polled every 0.25 s)"

# Runner B takes the thread over and finishes it.
$bin --store "$url" batch review --continue --agent script:examples/review.scenario.yaml
$bin --store "$url" thread show "$thread" | grep -i status
