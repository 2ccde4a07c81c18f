"""Fixtures of the reliability suite: throwaway PostgreSQL + Redis servers per module (tests/reliability/
throwaway.py), and the figures the suite measured printed at the end of the run (written to the file
GPUEST_RELIABILITY_FIGURES names, else to the run's temporary directory)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.reliability import figures
from tests.reliability.throwaway import ThrowawayPostgres, ThrowawayRedis, missing_binaries


@dataclass
class Servers:
    postgres: ThrowawayPostgres
    redis: ThrowawayRedis


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """A PostgreSQL cluster and a Redis server of this module's own, on free loopback ports."""
    reason = missing_binaries()
    if reason is not None:
        if os.environ.get("GPUEST_REQUIRE_SERVERS") == "1":
            pytest.fail(f"reliability suite required (GPUEST_REQUIRE_SERVERS=1) but {reason}", pytrace=False)
        pytest.skip(f"reliability suite skipped: {reason}")
    postgres = ThrowawayPostgres()
    try:
        redis = ThrowawayRedis()
    except Exception:
        postgres.close()
        raise
    try:
        yield Servers(postgres, redis)
    finally:
        redis.close()
        postgres.close()


@pytest.fixture(scope="session", autouse=True)
def figures_file(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The figures file in the run's temporary directory unless GPUEST_RELIABILITY_FIGURES names one; the variable
    stays set for the rest of the run, so the summary at its end names the file written."""
    if not os.environ.get("GPUEST_RELIABILITY_FIGURES"):
        os.environ["GPUEST_RELIABILITY_FIGURES"] = str(tmp_path_factory.mktemp("reliability") / "figures.json")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    measured = figures.recorded()
    if not measured:
        return
    terminalreporter.write_sep("=", "reliability figures")
    terminalreporter.write_line(json.dumps(measured, indent=1, sort_keys=True))
    terminalreporter.write_line(f"(written to {figures.figures_path()})")
