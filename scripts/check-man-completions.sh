#!/usr/bin/env bash
# Generates every manual page and completion script with the given binary
# and checks that they load: `man -l` renders each page with warnings on
# (any warning fails), `bash -n` parses the bash script, and zsh and fish
# parse theirs where those shells are installed (they are not on CI; the
# Rust test tests/cli_docs.rs checks every script's content).
# Usage: scripts/check-man-completions.sh target/debug/uwf-db
set -euo pipefail
bin="${1:?usage: $0 PATH-TO-uwf-db}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$bin" man --out "$dir/man1" >"$dir/written"
pages=$(wc -l <"$dir/written")
[ "$pages" -gt 30 ] || { echo "only $pages manual pages written"; exit 1; }
while read -r page; do
    warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=w -E UTF-8 -l "$page" 2>&1 >/dev/null || echo "man failed on $page")
    if [ -n "$warnings" ]; then
        echo "$page:"; echo "$warnings"; exit 1
    fi
    LC_ALL=C.UTF-8 MANWIDTH=80 man -E UTF-8 -l "$page" 2>/dev/null | grep -q "^NAME" \
        || { echo "$page renders no NAME section"; exit 1; }
done <"$dir/written"
echo "$pages manual pages render without warnings"
"$bin" completions bash >"$dir/uwf-db.bash"
bash -n "$dir/uwf-db.bash"
echo "bash completion parses"
if command -v zsh >/dev/null; then
    "$bin" completions zsh >"$dir/_uwf-db" && zsh -n "$dir/_uwf-db" && echo "zsh completion parses"
fi
if command -v fish >/dev/null; then
    "$bin" completions fish >"$dir/uwf-db.fish" && fish --no-execute "$dir/uwf-db.fish" && echo "fish completion parses"
fi
