"""The worker's container healthcheck (``python -m worker.health``): healthy while the alive file is fresh."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from worker.health import problem, touch

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_check(alive_file: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "GPUEST_WORKER_ALIVE_FILE"}
    if alive_file is not None:
        env["GPUEST_WORKER_ALIVE_FILE"] = str(alive_file)
    return subprocess.run([sys.executable, "-m", "worker.health", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_fresh_file_is_healthy_old_or_missing_is_not(tmp_path: Path) -> None:
    alive = tmp_path / "state" / "alive"
    assert "does not exist" in (problem(alive, max_age=60) or "")
    touch(alive)
    assert problem(alive, max_age=60) is None
    os.utime(alive, (time.time() - 120, time.time() - 120))
    assert "120 s old" in (problem(alive, max_age=60) or "")
    assert "not set" in (problem(None, max_age=60) or "")


def test_the_module_exits_by_the_file_age(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    missing = run_check(alive)
    assert missing.returncode == 1 and "worker unhealthy" in missing.stderr
    touch(alive)
    assert run_check(alive).returncode == 0
    os.utime(alive, (time.time() - 90, time.time() - 90))
    assert run_check(alive, "--max-age", "60").returncode == 1
    assert run_check(alive, "--max-age", "300").returncode == 0
    assert run_check(None).returncode == 1
