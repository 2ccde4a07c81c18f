"""The embedded stack for the CLI tests: real uvicorn and Celery worker processes in a temp dir."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.serve import EmbeddedStack, embedded_stack
from tests.cli.cli_helpers import sqlite_env


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """One auth-off embedded stack shared by the CLI tests (each test makes its own jobs, groups and datasets)."""
    data_dir = tmp_path_factory.mktemp("stack")
    with embedded_stack(data_dir, env=sqlite_env(data_dir), log_dir=data_dir / "logs") as running:
        yield running
