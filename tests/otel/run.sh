#!/usr/bin/env bash
# uwf-db's OTLP traces received by a receiver nobody here wrote the decoding
# of: the OpenTelemetry project's own protobuf classes (`opentelemetry-proto`
# from PyPI, pinned in tests/otel/requirements.txt) parse every export the
# binary sends. Builds nothing; makes its own stores and its own venv when
# missing.
#
# Usage: tests/otel/run.sh [PATH-TO-uwf-db]   (default target/debug/uwf-db)
# Env:   OTEL_VENV (default /tmp/otel-venv): the Python venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${1:-target/debug/uwf-db}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
[ -x "$bin" ] || { echo "tests/otel/run.sh: no uwf-db binary at $bin (build it first)" >&2; exit 2; }
venv=${OTEL_VENV:-/tmp/otel-venv}
if [ ! -x "$venv/bin/python" ]; then
    echo "== venv $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/tests/otel/requirements.txt"
exec "$venv/bin/python" "$root/tests/otel/test_otel.py" "$bin"
