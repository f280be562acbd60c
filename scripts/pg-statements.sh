#!/bin/bash
# What one `uwf-db batch` sends PostgreSQL, per step (issue 22; docs/design.md
# §8f "Fewer statements a step"): a fresh database with `log_statement = all`,
# a batch of N review threads (4 steps each, the scripted agent), then the
# server log's entries for that database counted by kind, and the runner's and
# the machine's CPU over the run.
#
# usage: scripts/pg-statements.sh [N threads, default 200] [jobs, default 8]
# env: LOG=0 skips the statement log (for the CPU figures alone: logging every
#      statement slows the server), BIN (default target/release/uwf-db), PGURL (a server URL whose user is a
#      superuser, default postgres://root@127.0.0.1:5432), PGLOG (the server's
#      log file, default /var/log/postgresql/postgresql-15-main.log).
# Not part of CI: it needs a superuser and the server's log file.
set -euo pipefail
N=${1:-200}
JOBS=${2:-8}
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/uwf-db}
PGURL=${PGURL:-postgres://root@127.0.0.1:5432}
PGLOG=${PGLOG:-/var/log/postgresql/postgresql-15-main.log}
DB=uwf_statements_$$
psql "$PGURL/postgres" -qc "CREATE DATABASE $DB"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)"' EXIT
LOG=${LOG:-1}
if [ "$LOG" != 0 ]; then
    psql "$PGURL/postgres" -qc "ALTER DATABASE $DB SET log_statement = 'all'"
fi
URL=$PGURL/$DB
"$BIN" --store "$URL" workflow add examples/review.yaml >/dev/null
prompts=$(mktemp)
seq 1 "$N" | sed 's/^/change /' >"$prompts"
start=$(wc -l <"$PGLOG")
# The server's CPU: its backends' once the postmaster has reaped them
# (cutime + cstime), and its background processes' (WAL writer,
# checkpointer…) — when this user can read the postmaster's pid file.
PGPID=${PGPID:-/var/run/postgresql/15-main.pid}
server_ticks() {
    local pm t=0 p
    pm=$(head -1 "$PGPID" 2>/dev/null) || return 0
    [ -r "/proc/$pm/stat" ] || return 0
    t=$(awk '{print $16 + $17}' "/proc/$pm/stat")
    for p in $(pgrep -P "$pm"); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
sv1=$(server_ticks)
read -r _ u1 n1 s1 i1 w1 q1 sq1 _ </proc/stat
/usr/bin/time -f "runner: %e s wall, %U s user, %S s sys" -o /tmp/pg-statements-time.txt \
    "$BIN" --store "$URL" --json batch review --prompts "$prompts" \
    --agent script:examples/review.scenario.yaml --jobs "$JOBS" |
    tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print('steps/s', round(d['steps_per_sec']), '· groups', d['summary']['groups'])"
read -r _ u2 n2 s2 i2 w2 q2 sq2 _ </proc/stat
[ "$LOG" = 0 ] || echo "(every statement logged: slower than without; LOG=0 for the CPU figures)"
cat /tmp/pg-statements-time.txt
sleep 0.2
sv2=$(server_ticks)
[ -z "$sv1" ] || echo "server: $((sv2 - sv1)) ticks (its backends, reaped, and its background processes)"
echo "machine busy: $(((u2 + n2 + s2 + q2 + sq2) - (u1 + n1 + s1 + q1 + sq1))) ticks, idle $(((i2 + w2) - (i1 + w1))) (100 a second a core)"
if [ "$LOG" = 0 ]; then
    rm -f "$prompts"
    exit 0
fi
sleep 0.5
log=$(mktemp)
tail -n +$((start + 1)) "$PGLOG" | grep "@$DB " >"$log" || true
lines=$(grep -cE "LOG:  (statement|execute)" "$log" || true)
echo "round trips (log entries): $lines, a step: $(python3 -c "print(round($lines / ($N * 4), 2))")"
grep -oE "(statement|execute [^:]*): .{0,60}" "$log" |
    sed -E 's/decode\([^)]*\)/K/g; s/[0-9a-f]{16,}/H/g; s/-?[0-9]+/N/g' | cut -c1-80 |
    sort | uniq -c | sort -rn | head -20
rm -f "$prompts" "$log"
