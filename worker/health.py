"""The worker's container healthcheck: ``python -m worker.health`` exits 0 while the alive file is fresh.

The worker touches ``GPUEST_WORKER_ALIVE_FILE`` after every successful reaper pass (a thread of its own,
every ``GPUEST_REAPER_INTERVAL_SECONDS``), so a fresh file means the process lives and reaches its
database. ``celery inspect ping`` cannot serve here: the solo pool runs a job in the thread that would
answer the ping, so every long job would read as unhealthy. This module imports neither Celery nor the
kernels, so the check costs a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_MAX_AGE_SECONDS = 60.0


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def problem(path: Path | None, max_age: float, now: float | None = None) -> str | None:
    """Why the worker is unhealthy, or None when its alive file is younger than ``max_age`` seconds."""
    if path is None:
        return "GPUEST_WORKER_ALIVE_FILE is not set: the worker writes no alive file to check"
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        return f"{path} does not exist: the worker has not completed a reaper pass"
    if age > max_age:
        return f"{path} is {age:.0f} s old (limit {max_age:.0f} s): the worker stopped its reaper passes"
    return None


def main(argv: list[str] | None = None) -> int:
    from core.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m worker.health", description=__doc__.splitlines()[0])
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_SECONDS, help="seconds (default 60)")
    args = parser.parse_args(argv)
    reason = problem(Settings().worker_alive_file, args.max_age)
    if reason is not None:
        print(f"worker unhealthy: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
