#!/usr/bin/env bash
# `uwf-db mcp` driven by a client nobody here wrote: the official Python
# SDK's (`mcp` from PyPI, pinned in tests/mcp/requirements.txt). Builds
# nothing; makes its own stores (LMDB, and PostgreSQL when the machine's
# server answers) and its own venv when missing.
#
# Usage: tests/mcp/run.sh [PATH-TO-uwf-db]   (default target/debug/uwf-db)
# Env:   MCP_VENV (default /tmp/mcp-venv): the Python venv.
#        MCP_POSTGRES (default postgres://root@127.0.0.1:5432/postgres):
#        where to make the PostgreSQL test database; `off` skips it, and
#        so does CI=... never: under CI a missing server fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${1:-target/debug/uwf-db}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
[ -x "$bin" ] || { echo "tests/mcp/run.sh: no uwf-db binary at $bin (build it first)" >&2; exit 2; }
venv=${MCP_VENV:-/tmp/mcp-venv}
if [ ! -x "$venv/bin/python" ]; then
    echo "== venv $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/tests/mcp/requirements.txt"
exec "$venv/bin/python" "$root/tests/mcp/test_mcp.py" "$bin"
