"""Shared helpers of the CLI tests: SQLite-pinned stack environments and the installed ``gpuest`` script."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

# Small enough to finish in well under a second on NumPy.
TINY_PARAMS = {"n_clusters": 12, "cluster_size": 5, "n_regressors": 2, "replications": 50, "seed": 3}
# Several seconds of NumPy work with a progress checkpoint per block: long enough to act while it runs.
LONG_PARAMS = {"n_clusters": 50, "cluster_size": 30, "n_regressors": 3, "replications": 4000, "seed": 12}


def sqlite_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """Pin the embedded (SQLite) backends even when DATABASE_URL / REDIS_URL are exported for the servers tier."""
    data_dir = data_dir.resolve()
    return {
        "GPUEST_DATA_DIR": str(data_dir),
        "DATABASE_URL": f"sqlite:///{data_dir / 'gpuest.sqlite3'}",
        "BROKER_URL": f"sqla+sqlite:///{data_dir / 'broker.sqlite3'}",
        "GPUEST_DEVICE": "cpu",
        "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}",
        **extra,
    }


def run_gpuest(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed ``gpuest`` console script as a user runs it (a separate process, its own settings)."""
    script = Path(sys.executable).with_name("gpuest")
    return subprocess.run(
        [str(script), *args], env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
