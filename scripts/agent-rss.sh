#!/usr/bin/env bash
# Peak memory of a driver whose agent talks too much (issue 10): an agent
# whose reply never ends (`yes`), and one that prints 100 MB to stderr.
# Both steps must fail, and the driver's peak RSS must stay under 100 MB
# (it is bounded by --max-reply-size, 16 MiB by default, and the 16 KiB
# stderr tail). Prints the peak RSS of each run from /usr/bin/time -v.
#
# usage: scripts/agent-rss.sh [BIN]   (default target/release/uwf-db, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/uwf-db}
[ -x "$bin" ] || cargo build --release --quiet
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
work=$(mktemp -d /tmp/uwf-rss.XXXXXX)
trap 'rm -rf "$work"' EXIT
store="$work/store"
"$bin" --store "$store" init >/dev/null
fail=0
run() {
    local name=$1 agent=$2
    shift 2
    local id
    id=$("$bin" --store "$store" --json thread start examples/review.yaml -p "$name" |
        sed -n 's/.*"thread":"\([0-9A-Z]*\)".*/\1/p')
    set +e
    /usr/bin/time -v "$bin" --store "$store" thread step "$id" --agent "$agent" --reasks 0 "$@" \
        >"$work/out" 2>"$work/err"
    local rc=$?
    set -e
    local kb
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/err")
    local said
    said=$(grep -m1 "^error" "$work/err" | cut -c1-120 || true)
    echo "$name: exit $rc, peak RSS $((kb / 1024)) MB ($kb kB): $said"
    [ "$kb" -lt $((100 * 1024)) ] || fail=1
}
run "endless reply (yes)" "cmd:yes"
run "100 MB on stderr" "cmd:sh -c 'head -c 100000000 /dev/zero | tr \"\\0\" e >&2; exit 1'"
run "endless reply, --max-reply-size 1MiB" "cmd:yes" --max-reply-size 1MiB
"$bin" --store "$store" verify
exit $fail
