"""Shared helpers of the CLI tests: SQLite-pinned stack environments, ``gpuest`` in this process (Typer's
CliRunner) and the installed ``gpuest`` script in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from typer.testing import CliRunner

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


def forget_process_state() -> None:
    """Drop what this process cached from the environment (settings, engines, the key secret): the next use
    reads them again, as a new process does."""
    from core.settings import get_settings
    from store import db
    from store.keys import forget_secret

    get_settings.cache_clear()
    db.engine_for.cache_clear()
    db._session_factory.cache_clear()
    forget_secret()


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` over os.environ inside the block, with the caches that derive from it read afresh; os.environ is
    restored whole afterwards (a command may set variables itself, as ``keys --data-dir`` does)."""
    saved = dict(os.environ)
    os.environ.update(env)
    forget_process_state()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        forget_process_state()


def gpuest_in_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuest ARGS`` run in this process through Typer's CliRunner, with ``env`` over os.environ for the call;
    answered as :func:`run_gpuest` answers (exit status, stdout, stderr)."""
    from cli.main import app

    with environment(env or {}):
        result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def run_gpuest(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed ``gpuest`` console script as a user runs it (a separate process, its own settings)."""
    script = Path(sys.executable).with_name("gpuest")
    return subprocess.run(
        [str(script), *args], env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
