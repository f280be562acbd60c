#!/usr/bin/env bash
# Runs every CLI test binary (tests/cli_*.rs) ROUNDS times, JOBS at once,
# and counts the failed runs of each (issue 18: "tests that cannot
# flake"). A failed run's output is kept in OUT/fail-NAME-ROUND.log.
#
# usage: scripts/flake-loop.sh [ROUNDS] [JOBS] [OUT] [NAME...]
#   defaults: 20 rounds, 2 at once, /tmp/uwf-flake, every tests/cli_*.rs
#   (or only the NAMEs given, e.g. cli_batch cli_fleet)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
jobs=${2:-2}
out=${3:-/tmp/uwf-flake}
shift $(($# < 3 ? $# : 3))
mkdir -p "$out"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/cli_*.rs; do names+=("$(basename "$f" .rs)"); done
fi
# The test binaries as cargo builds them now (their paths, by name).
cargo test --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' >"$out/binaries"
runs=()
for ((r = 1; r <= rounds; r++)); do
    for n in "${names[@]}"; do runs+=("$n $r"); done
done
printf '%s\n' "${runs[@]}" | xargs -P "$jobs" -L 1 bash -c '
    name=$0 round=$1 out='"$out"'
    exe=$(awk -v n="$name" "\$1 == n { print \$2 }" "$out/binaries")
    start=$(date +%s)
    if "$exe" >"$out/run-$name-$round.log" 2>&1; then
        echo "$name $round pass $(( $(date +%s) - start ))" >>"$out/results"
        rm -f "$out/run-$name-$round.log"
    else
        echo "$name $round FAIL $(( $(date +%s) - start ))" >>"$out/results"
        mv "$out/run-$name-$round.log" "$out/fail-$name-$round.log"
    fi
'
echo "binary  runs  failed  mean s"
awk '{ runs[$1]++; if ($3 == "FAIL") failed[$1]++; secs[$1] += $4 }
     END { for (n in runs) printf "%s %d %d %.0f\n", n, runs[n], failed[n], secs[n] / runs[n] }' \
    "$out/results" | sort | column -t
! grep -q FAIL "$out/results"
