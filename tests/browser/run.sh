#!/usr/bin/env bash
# Runs the dashboard's browser tests (dashboard.test.mjs) in headless
# Chromium against a real `uwf-db serve` on a temporary store.
#
#   tests/browser/run.sh                  # uses target/debug/uwf-db
#   UWF_DB=path/to/uwf-db tests/browser/run.sh
#
# Needs: node >= 20, npm (first run: installs playwright-core from
# package-lock.json), Chromium (Debian: apt-get install chromium; or set
# CHROMIUM=/path/to/chrome). Screenshots go to docs/screenshots/ (set
# SCREENSHOTS=DIR to write them elsewhere). Extra arguments go to
# `node --test` (e.g. --test-name-pattern=fork).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

# UWF_DB as given is relative to where the script is run from; the default
# is relative to the repository.
if [[ -n "${UWF_DB:-}" ]]; then
  UWF_DB="$(cd "$(dirname "$UWF_DB")" && pwd)/$(basename "$UWF_DB")"
else
  UWF_DB="$repo/target/debug/uwf-db"
fi
export UWF_DB
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

if [[ ! -x "$UWF_DB" ]]; then
  echo "run.sh: no uwf-db binary at $UWF_DB (build it: cargo build; or set UWF_DB)" >&2
  exit 2
fi
if ! "$UWF_DB" serve --help >/dev/null 2>&1; then
  echo "run.sh: $UWF_DB has no 'serve' command" >&2
  exit 2
fi
if [[ ! -x "$CHROMIUM" ]]; then
  echo "run.sh: no Chromium at $CHROMIUM (apt-get install chromium, or set CHROMIUM)" >&2
  exit 2
fi

cd "$here"
if [[ ! -d node_modules/playwright-core || ! -d node_modules/mermaid ]]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

# The binary runs from the repository root so that examples/ paths resolve.
exec node --test --test-reporter=spec --test-timeout=120000 "$@" dashboard.test.mjs pictures.test.mjs
