#!/usr/bin/env bash
# The Python package's tests as a newcomer would run them: a fresh virtual
# environment, `pip install ./python` (maturin from PyPI builds the wheel;
# the dev profile, so it reuses `cargo test`'s build), then pytest, on an
# LMDB store and on a PostgreSQL database made for the run and dropped.
#
# Usage: python/run-tests.sh
# Env:   PY_VENV (default /tmp/uwf-py-venv): the venv (made when missing).
#        PY_POSTGRES (default postgres://postgres@127.0.0.1:5432): the
#        server to make the test database on; `off` skips PostgreSQL,
#        which CI never does (a missing server fails the run).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PY_VENV:-/tmp/uwf-py-venv}
if [ ! -x "$venv/bin/python" ]; then
    echo "== venv $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r python/tests/requirements.txt
echo "== pip install ./python (maturin, dev profile)"
MATURIN_PEP517_ARGS="--profile dev" \
    "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall ./python

server=${PY_POSTGRES:-postgres://postgres@127.0.0.1:5432}
db=""
if [ "$server" != off ]; then
    db="uwf_py_$$"
    if ! psql "$server/postgres" -qc "CREATE DATABASE $db" >/dev/null; then
        echo "!!! python/run-tests.sh: no PostgreSQL server at $server (PY_POSTGRES=off to skip)" >&2
        exit 1
    fi
    trap 'psql "$server/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null || true' EXIT
    export UWF_TEST_POSTGRES="$server/$db"
elif [ -n "${CI:-}" ]; then
    echo "!!! python/run-tests.sh: CI runs the PostgreSQL tests; PY_POSTGRES=off is refused" >&2
    exit 1
fi
# From the repository's root, so `import uwf_db` is the installed package,
# never the source folder `python/uwf_db` (which has no built module).
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
