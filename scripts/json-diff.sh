#!/usr/bin/env bash
# Compares the --json answers of two uwf-db builds on one store, byte for
# byte, then as JSON values (keys sorted). Usage:
#   scripts/json-diff.sh OLD_BINARY NEW_BINARY
# Builds a store with NEW (a finished thread, one part-way, a fork, a batch,
# pins), then runs every read-only command with both binaries on it.
set -euo pipefail
old=$1 new=$2
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
store=$work/store
u() { "$new" --store "$store" "$@"; }
agent=script:examples/review.scenario.yaml
u init >/dev/null
done_id=$(u --json run examples/review.yaml -p "finish it" --agent $agent | python3 -c 'import json,sys; print(json.load(sys.stdin)["thread"])')
part=$(u --json thread start examples/review.yaml -p "go" --label team=a | python3 -c 'import json,sys; print(json.load(sys.stdin)["thread"])')
u thread step "$part" --agent $agent >/dev/null
u thread fork "$part" >/dev/null
u batch examples/review.yaml -n 3 -p many --agent $agent >/dev/null
head=$(u --json thread show "$done_id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["head"])')
u cas pin "$head" >/dev/null
u prune --set --older-than 30d >/dev/null
same=0 differ=0 reordered=0
while IFS= read -r line; do
    [ -z "$line" ] && continue
    # shellcheck disable=SC2086
    a=$("$old" --store "$store" --json $line 2>&1 || true)
    # shellcheck disable=SC2086
    b=$("$new" --store "$store" --json $line 2>&1 || true)
    if [ "$a" = "$b" ]; then
        same=$((same + 1))
    elif [ "$(printf '%s' "$a" | python3 scripts/json-sorted.py)" = "$(printf '%s' "$b" | python3 scripts/json-sorted.py)" ]; then
        reordered=$((reordered + 1))
        echo "keys reordered: $line"
    else
        differ=$((differ + 1))
        echo "DIFFERS: $line"
        { diff <(printf '%s\n' "$a") <(printf '%s\n' "$b") || true; } | head -c 600; echo
    fi
done <<EOF2
thread list
thread list --label team=a
thread show $done_id
thread show $part
thread log $done_id
thread tree $done_id
thread watch $done_id
workflow list
workflow show review
workflow validate examples/review.yaml
cas get $head
cas has ${head:0:12}
cas refs $head
cas walk $head
cas pins
stats
verify
prune --show
prune --dry-run --keep-latest 1
EOF2
echo "$same identical, $reordered with keys reordered only, $differ different"
[ "$differ" = 0 ]
