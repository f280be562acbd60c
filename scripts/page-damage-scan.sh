#!/usr/bin/env bash
# The page-damage scan (issue 10): make a real store, then for every 4 KiB
# page of its data file in turn, damage that page in a copy of the store
# (zeroed, or filled with random bytes) and run `uwf-db verify` and
# `uwf-db thread list` on the copy. Each run is classed by how it ended:
#
#   clean    exit 0: the damage hit a free or unused page, nothing to see
#   reported exit 1 or 3 with a message (stderr, or stdout for `verify`):
#            the damage was found and said (1: verify listed problems; 3:
#            the data file is damaged)
#   crash    killed by a signal (SIGSEGV, SIGBUS, SIGABRT ...), a panic
#            (exit 101), or anything else without a message
#   hang     still running after the timeout (killed)
#
# The goal is 0 crashes and 0 hangs.
#
# With `salvage` as the first argument (issue 18), each damaged copy is
# given to `uwf-db --json salvage COPY NEW` instead, and each run is
# classed as
#
#   finished exit 0 or 1 with a JSON report (how many threads it kept is
#            counted), or exit 1 with a message
#   crash    a signal, a panic, or an exit without a report or message
#   hang     still running after the timeout (killed)
#
# The goal is 0 hangs, 0 crashes, and every thread kept wherever the
# damaged page held none of it (a page of a thread's record or blobs, or
# of a blob all threads share, such as the workflow, loses them).
#
# With `flip` as the first argument (issue 18), each copy gets ONE byte
# changed (XOR with a random non-zero value) at FLIPS offsets of each page
# in turn (default 4, spread over the page; a seed per page makes a run
# repeatable), and the copy is read by `verify`, `thread list --json` and
# `export` of every thread (which reads every record and every blob they
# reach), against the same commands on the undamaged store:
#
#   clean    every command exited 0 with the undamaged store's output
#            (the byte was in free space or unused bytes of a page)
#   reported verify, or a reading command, said there is damage (exit 1
#            or 3 with a message)
#   silent   SILENT WRONG ANSWER: verify exited 0 and a reading command
#            exited 0 with output that differs from the undamaged store's
#   crash    a signal, a panic, or an exit without a message
#   hang     still running after 20 s (killed)
#
# The goal is 0 silent, 0 crashes, 0 hangs.
#
# usage: scripts/page-damage-scan.sh [zero|random] [THREADS] [BIN]
#        scripts/page-damage-scan.sh salvage [zero|random] [THREADS] [BIN] [TIMEOUT]
#        scripts/page-damage-scan.sh flip [THREADS] [BIN] [FLIPS]
#   defaults: zero, 60 threads, target/release/uwf-db (built if missing),
#   salvage timeout 120 s
set -euo pipefail
cd "$(dirname "$0")/.."
salvage=no
flip=no
if [ "${1:-}" = salvage ]; then
    salvage=yes
    shift
fi
if [ "${1:-}" = flip ]; then
    flip=yes
    shift
    set -- flip "$@"
fi
mode=${1:-zero}
threads=${2:-60}
bin=${3:-target/release/uwf-db}
limit=${4:-120}
flips=${4:-4}
if [ ! -x "$bin" ]; then
    cargo build --release --quiet
fi
bin=$(realpath "$bin")
work=$(mktemp -d /tmp/uwf-pagescan.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A store with something in every table: completed threads (history),
# idle ones (active index), a fork, a registered workflow, a pin.
store="$work/store"
"$bin" --store "$store" init >/dev/null
"$bin" --store "$store" batch examples/review.yaml -n "$threads" -p "Add a --json flag" \
    --agent script:examples/review.scenario.yaml >/dev/null
"$bin" --store "$store" workflow add examples/planner.yaml >/dev/null 2>&1 || true
"$bin" --store "$store" thread start examples/review.yaml -p "left idle" >/dev/null
"$bin" --store "$store" verify >/dev/null
size=$(stat -c %s "$store/data.mdb")
pages=$((size / 4096))
echo "store: $threads threads, data.mdb $size bytes, $pages pages; damage: $mode"

damage() {
    if [ "$mode" = zero ]; then
        dd if=/dev/zero of="$1/data.mdb" bs=4096 seek="$2" count=1 conv=notrunc status=none
    else
        head -c 4096 /dev/urandom | dd of="$1/data.mdb" bs=4096 seek="$2" count=1 conv=notrunc status=none
    fi
}

if [ $flip = yes ]; then
    ids=$("$bin" --store "$store" --json thread list --limit 100000 |
        python3 -c 'import json,sys; print(" ".join(t["thread"] for t in json.load(sys.stdin)))')
    # shellcheck disable=SC2086
    read_all() { # STORE: the readers' outputs, one file each
        "$bin" --store "$1" --json thread list --limit 100000 >"$work/list.$2" 2>"$work/list.err" &&
            "$bin" --store "$1" export $ids >"$work/export.$2" 2>"$work/export.err"
    }
    read_all "$store" base
    clean=0 reported=0 silent=0 crash=0 hang=0 runs=0
    notes=()
    for ((p = 0; p < pages; p++)); do
        for ((f = 0; f < flips; f++)); do
            runs=$((runs + 1))
            copy="$work/copy"
            rm -rf "$copy"
            cp -r "$store" "$copy"
            at=$(python3 - "$copy/data.mdb" "$p" "$f" "$flips" <<'PY'
import random, sys
path, page, f, flips = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(page * 1000 + f)
# One offset in each of `flips` equal slices of the page.
lo = 4096 * f // flips
hi = 4096 * (f + 1) // flips
at = page * 4096 + rng.randrange(lo, hi)
with open(path, "r+b") as file:
    file.seek(at)
    b = file.read(1)[0]
    file.seek(at)
    file.write(bytes([b ^ rng.randrange(1, 256)]))
print(at)
PY
)
            set +e
            timeout -s KILL 20 "$bin" --store "$copy" verify >"$work/vout" 2>"$work/verr"
            vrc=$?
            timeout -s KILL 20 "$bin" --store "$copy" --json thread list --limit 100000 \
                >"$work/list.copy" 2>"$work/lerr"
            lrc=$?
            # shellcheck disable=SC2086
            timeout -s KILL 20 "$bin" --store "$copy" export $ids >"$work/export.copy" 2>"$work/eerr"
            erc=$?
            set -e
            bad_exit=""
            for pair in "verify:$vrc:verr" "list:$lrc:lerr" "export:$erc:eerr"; do
                IFS=: read -r name rc err <<<"$pair"
                if [ "$rc" -eq 137 ]; then
                    bad_exit="hang"
                    notes+=("page $p byte $at, $name: hang")
                elif [ "$rc" -ne 0 ] && { grep -q panicked "$work/$err" ||
                    { [ "$rc" -ne 1 ] && [ "$rc" -ne 3 ]; } ||
                    { [ ! -s "$work/$err" ] && [ "$name" != verify ]; }; }; then
                    [ "$bad_exit" = hang ] || bad_exit="crash"
                    notes+=("page $p byte $at, $name: exit $rc $(head -c 160 "$work/$err" | tr '\n' ' ')")
                fi
            done
            if [ "$bad_exit" = hang ]; then
                hang=$((hang + 1))
            elif [ "$bad_exit" = crash ]; then
                crash=$((crash + 1))
            elif [ $vrc -ne 0 ] || [ $lrc -ne 0 ] || [ $erc -ne 0 ]; then
                reported=$((reported + 1))
            elif cmp -s "$work/list.copy" "$work/list.base" &&
                cmp -s "$work/export.copy" "$work/export.base"; then
                clean=$((clean + 1))
            else
                silent=$((silent + 1))
                notes+=("page $p byte $at: SILENT WRONG ANSWER (verify exit 0, output differs)")
            fi
        done
    done
    echo "flip runs: $runs ($flips per page, one byte each; verify, thread list, export per run)"
    echo "clean: $clean  reported: $reported  silent wrong answers: $silent  crash: $crash  hang: $hang"
    for n in "${notes[@]+"${notes[@]}"}"; do
        echo "  $n"
    done
    [ $silent -eq 0 ] && [ $crash -eq 0 ] && [ $hang -eq 0 ]
    exit
fi

if [ $salvage = yes ]; then
    total=$("$bin" --store "$store" --json thread list --limit 100000 |
        python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
    finished=0 crash=0 hang=0 all=0 kept_sum=0
    notes=()
    for ((p = 0; p < pages; p++)); do
        copy="$work/copy" new="$work/new"
        rm -rf "$copy" "$new"
        cp -r "$store" "$copy"
        damage "$copy" "$p"
        set +e
        timeout -s KILL "$limit" "$bin" --json salvage "$copy" "$new" >"$work/out" 2>"$work/err"
        rc=$?
        set -e
        kept=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["report"]["threads"])' \
            "$work/out" 2>/dev/null || echo "")
        if [ $rc -eq 137 ]; then
            hang=$((hang + 1))
            notes+=("page $p: hang (killed after $limit s)")
        elif { [ $rc -eq 0 ] || [ $rc -eq 1 ]; } && ! grep -q panicked "$work/err" &&
            { [ -n "$kept" ] || [ -s "$work/err" ]; }; then
            finished=$((finished + 1))
            kept=${kept:-0}
            kept_sum=$((kept_sum + kept))
            if [ "$kept" -eq "$total" ]; then
                all=$((all + 1))
            else
                notes+=("page $p: kept $kept of $total threads (exit $rc) $(head -c 160 "$work/err" | tr '\n' ' ')")
            fi
        else
            crash=$((crash + 1))
            notes+=("page $p: exit $rc: $(head -c 200 "$work/err" | tr '\n' ' ')")
        fi
    done
    echo "salvage runs: $pages (one per page); threads in the store: $total"
    echo "finished: $finished (all $total threads kept: $all; threads kept in all: $kept_sum)  crash: $crash  hang: $hang"
    for n in "${notes[@]+"${notes[@]}"}"; do
        echo "  $n"
    done
    [ $crash -eq 0 ] && [ $hang -eq 0 ]
    exit
fi

clean=0 reported=0 damaged=0 crash=0 hang=0
crashes=()
for ((p = 0; p < pages; p++)); do
    copy="$work/copy"
    rm -rf "$copy"
    cp -r "$store" "$copy"
    damage "$copy" "$p"
    for cmd in verify "thread list"; do
        set +e
        # shellcheck disable=SC2086
        timeout -s KILL 20 "$bin" --store "$copy" $cmd >"$work/out" 2>"$work/err"
        rc=$?
        set -e
        if [ $rc -eq 137 ]; then
            hang=$((hang + 1))
            crashes+=("page $p, $cmd: hang (killed after 20 s)")
        elif [ $rc -eq 0 ]; then
            clean=$((clean + 1))
        elif { [ $rc -eq 1 ] || [ $rc -eq 3 ]; } && { [ -s "$work/err" ] || [ -s "$work/out" ]; } &&
            ! grep -q "panicked" "$work/err"; then
            # `verify` reports on stdout, the other commands on stderr.
            reported=$((reported + 1))
            [ $rc -eq 3 ] && damaged=$((damaged + 1))
        else
            crash=$((crash + 1))
            crashes+=("page $p, $cmd: exit $rc: $(head -c 200 "$work/err" | tr '\n' ' ')")
        fi
    done
done
echo "runs: $((pages * 2)) (verify and thread list per page)"
echo "clean: $clean  reported: $reported (exit 3: $damaged)  crash: $crash  hang: $hang"
for c in "${crashes[@]+"${crashes[@]}"}"; do
    echo "  $c"
done
[ $crash -eq 0 ] && [ $hang -eq 0 ]
