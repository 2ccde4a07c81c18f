"""The per-kind fan-out thresholds: ``GPUEST_FANOUT_MIN_WORK`` (JSON, kind -> least work), each kind's default
where it names none, and the two older one-kind names still read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.settings import Settings
from kernels.registry import get_kind


@pytest.fixture(autouse=True)
def no_fanout_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUEST_FANOUT_MIN_WORK", "GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS", "GPUEST_FANOUT_MIN_ANALYSIS_ROWS"):
        monkeypatch.delenv(name, raising=False)


def threshold(kind_name: str) -> float | None:
    """The threshold the worker hands the kind's planner (worker/fanout.py: try_fan_out)."""
    split = get_kind(kind_name).split
    assert split is not None
    return Settings().fanout_min_work.get(kind_name, split.min_work)


def test_each_kind_keeps_its_own_default_unless_named() -> None:
    assert Settings().fanout_min_work == {}
    assert threshold("crve_bootstrap") == 3e10 and threshold("sccs_analyses") == 2e8
    assert threshold("crve_montecarlo") is None  # its planner needs only GPUEST_FANOUT_MIN_BLOCKS


def test_the_json_setting_names_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_FANOUT_MIN_WORK", '{"sccs_analyses": 1}')
    assert threshold("sccs_analyses") == 1 and threshold("crve_bootstrap") == 3e10


def test_the_older_names_still_set_their_kinds_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS", "5e6")
    monkeypatch.setenv("GPUEST_FANOUT_MIN_ANALYSIS_ROWS", "7")
    assert Settings().fanout_min_work == {"crve_bootstrap": 5e6, "sccs_analyses": 7.0}
    monkeypatch.setenv("GPUEST_FANOUT_MIN_WORK", '{"crve_bootstrap": 9}')  # the per-kind setting wins
    assert Settings().fanout_min_work == {"crve_bootstrap": 9.0, "sccs_analyses": 7.0}


def test_the_older_names_keep_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_FANOUT_MIN_ANALYSIS_ROWS", "0")
    with pytest.raises(ValidationError, match="fanout_min_analysis_rows"):
        Settings()
