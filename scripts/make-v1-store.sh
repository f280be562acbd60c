#!/usr/bin/env bash
# Builds uwf-db at a pinned commit and makes a small format-1 LMDB store
# with it: the fixture `tests/old_store.rs` opens, verifies and drives, so
# a later change that cannot read old stores fails CI (issue 10).
#
#   bash scripts/make-v1-store.sh [COMMIT] [OUT_DIR]
#
# COMMIT defaults to the one the committed fixture was made with; OUT_DIR
# to tests/fixtures/v1-store. Needs git and cargo; takes a few minutes.
set -euo pipefail
commit=${1:-4ada2db}
root=$(git rev-parse --show-toplevel)
out=${2:-$root/tests/fixtures/v1-store}
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git -C "$root" worktree add --detach "$work/src" "$commit" >/dev/null
CARGO_TARGET_DIR="$work/target" cargo build --quiet --manifest-path "$work/src/Cargo.toml" --bin uwf-db
bin="$work/target/debug/uwf-db"
store="$work/store"
cd "$work/src"
uwf() { "$bin" --store "$store" "$@"; }

uwf init >/dev/null
uwf workflow add examples/review.yaml >/dev/null
# Completed, in history.
uwf run examples/review.yaml -p "Add a --json flag" --agent script:examples/review.scenario.yaml >/dev/null
# Idle after two steps, with a stored agent.
idle=$(uwf --json thread start examples/review.yaml -p "Fix the parser" --agent script:examples/review.scenario.yaml | sed -n 's/.*"thread": *"\([0-9A-Z]*\)".*/\1/p')
uwf thread step "$idle" --count 2 >/dev/null
# A fork of it at its first step.
uwf thread fork "$idle" --from-role developer >/dev/null || true
# A failed attempt recorded.
failed=$(uwf --json thread start examples/review.yaml -p "Break it" | sed -n 's/.*"thread": *"\([0-9A-Z]*\)".*/\1/p')
uwf thread step "$failed" --agent "cmd:sh -c 'echo no model >&2; exit 3'" >/dev/null 2>&1 || true
# A child workflow, run to the end.
uwf workflow add examples/planner.yaml >/dev/null
uwf run examples/ship.yaml -p "Ship it" --agent script:examples/ship.scenario.yaml >/dev/null
uwf verify

rm -rf "$out"
mkdir -p "$out"
# A compact copy: only the pages in use, no lock file.
"$bin" --store "$store" stats >/dev/null
cp "$store/data.mdb" "$out/data.mdb"
echo "$commit" > "$out/COMMIT"
echo "made $out from $commit: $(du -h "$out/data.mdb" | cut -f1)"
