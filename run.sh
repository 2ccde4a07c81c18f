#!/usr/bin/env bash
# Install gpuest into ./.venv (first run only) and start the embedded stack: API on http://127.0.0.1:8000,
# a Celery worker process, SQLite + a server-less broker under ./var. Arguments go to `gpuest serve`
# (e.g. ./run.sh --port 8080). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/gpuest ]; then
    # first run: say what the next minutes are (pip is quiet; a fresh install takes one to two minutes)
    echo "gpuest: first run: creating ./.venv and installing gpuest and its dependencies (1-2 minutes)..." >&2
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    if ! .venv/bin/python -m pip install --quiet -e .; then
        echo "gpuest: installing failed (pip's lines above); remove ./.venv and run again" >&2
        exit 1
    fi
    echo "gpuest: installed; starting the embedded stack" >&2
fi
exec .venv/bin/gpuest serve "$@"
