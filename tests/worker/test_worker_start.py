"""Worker start (Celery's worker_init): on a GPU, CuPy's disk cache is pointed into the data directory before
anything compiles (unless the operator set CUPY_CACHE_DIR), then the kernels are warmed up; a failed warm-up is
logged and the worker serves anyway; on CPU none of it runs. The GPU is a stand-in here (this runs on any machine)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from core.settings import get_settings
from kernels import backend, cuda
from worker.tasks import CUDA_CACHE_DIR_NAME, EXIT_NOT_READY, _prepare_worker


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    """What worker start did, in order; the schema check and logging set-up are skipped."""
    made: list[Any] = []
    monkeypatch.setenv("GPUEST_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("CUPY_CACHE_DIR", raising=False)
    get_settings.cache_clear()
    monkeypatch.setattr("worker.tasks.configure_worker_logging", lambda: None)
    monkeypatch.setattr("worker.tasks.ensure_migrated", lambda: None)
    monkeypatch.setattr("worker.tasks.registry", lambda: made.append("registry") or {})
    monkeypatch.setattr(cuda, "use_disk_cache", lambda directory: made.append(("use_disk_cache", directory)))
    monkeypatch.setattr(cuda, "warm_up", lambda: made.append("warm_up") or 5)
    yield made
    get_settings.cache_clear()


def on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupy = types.ModuleType("cupy")
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    monkeypatch.setattr(backend, "get_namespace", lambda device=None: fake_cupy)


def test_on_a_gpu_the_disk_cache_comes_before_the_warm_up(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_gpu(monkeypatch)
    with capture_logs() as logs:
        _prepare_worker()
    assert calls == ["registry", ("use_disk_cache", tmp_path / CUDA_CACHE_DIR_NAME), "warm_up"]
    (warmed,) = [entry for entry in logs if entry["event"] == "kernels warmed up"]
    assert warmed["modules"] == 5 and warmed["seconds"] >= 0


def test_an_operators_cupy_cache_dir_is_kept(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_gpu(monkeypatch)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "operator-cache"))
    _prepare_worker()
    assert calls == ["registry", "warm_up"]


def test_a_failed_warm_up_is_logged_and_the_worker_starts_anyway(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    on_gpu(monkeypatch)

    def broken_warm_up() -> int:
        calls.append("warm_up")
        raise RuntimeError("nvrtc: error: invalid option")

    monkeypatch.setattr(cuda, "warm_up", broken_warm_up)
    with capture_logs() as logs:
        _prepare_worker()
    assert [call if isinstance(call, str) else call[0] for call in calls] == ["registry", "use_disk_cache", "warm_up"]
    (failure,) = [entry for entry in logs if entry["log_level"] == "error"]
    assert "warm-up failed" in failure["event"] and "invalid option" in failure["traceback"]


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_on_cpu_nothing_is_cached_or_compiled(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", device)
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    if device == "auto":  # the real choice on this machine would be the GPU where one exists
        monkeypatch.setattr(backend, "get_namespace", lambda device=None: np)
    _prepare_worker()
    assert calls == ["registry"]


def test_a_demanded_gpu_that_is_missing_refuses_to_start(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 16: it used to start, report healthy and fail every job with the reason
    def missing(device: Any = None) -> Any:
        raise backend.GPUUnavailableError("GPUEST_DEVICE=gpu but no CUDA device is usable through CuPy")

    monkeypatch.setattr(backend, "get_namespace", missing)
    monkeypatch.setattr(sys, "__stderr__", sys.stderr)  # refuse_to_start writes to the real stderr
    with pytest.raises(SystemExit) as stopped:
        _prepare_worker()
    assert stopped.value.code == EXIT_NOT_READY != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["gpuest worker: refusing to start: GPUEST_DEVICE=gpu but no CUDA device is usable through "
                     "CuPy (set GPUEST_DEVICE=cpu or auto to compute on the CPU)"]
    assert calls == []  # nothing imported or compiled
