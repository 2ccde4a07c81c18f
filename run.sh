#!/usr/bin/env bash
# Install gpuest into ./.venv (first run only) and start the embedded stack: API on http://127.0.0.1:8000,
# a Celery worker process, SQLite + a server-less broker under ./var. Arguments go to `gpuest serve`
# (e.g. ./run.sh --port 8080). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/gpuest ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e .
fi
exec .venv/bin/gpuest serve "$@"
