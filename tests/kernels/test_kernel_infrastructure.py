"""Backend choice, progress channel, stage timer and registry invariants."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import backend
from kernels.progress import JobCancelled, LocalProgress
from kernels.registry import registry
from kernels.spec import JobParams
from kernels.timing import StageTimer


def test_cpu_choice_gives_numpy_and_bad_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    assert backend.get_namespace() is np and backend.device_label(np) == "cpu"
    monkeypatch.setenv("GPUEST_DEVICE", "tpu")
    with pytest.raises(ValueError, match="GPUEST_DEVICE"):
        backend.get_namespace()


def test_demanding_a_missing_gpu_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    with pytest.raises(backend.GPUUnavailableError):
        backend.get_namespace()
    monkeypatch.setenv("GPUEST_DEVICE", "auto")
    assert backend.get_namespace() is np


def test_local_progress_records_and_cancels() -> None:
    progress = LocalProgress()
    progress(0.25, "first")
    progress.save_artifact("grid", np.arange(3))
    progress.cancel()
    with pytest.raises(JobCancelled):
        progress(0.5)
    with pytest.raises(ValueError):
        progress(1.5)
    assert progress.reports == [(0.25, "first"), (0.5, None)] and list(progress.artifacts) == ["grid"]


def test_stage_timer_accumulates_and_totals() -> None:
    timer = StageTimer(np)
    for _ in range(2):
        with timer.stage("a"):
            sum(range(10_000))
    with timer.stage("b"):
        pass
    timings = timer.as_dict()
    assert set(timings) == {"a", "b", "total"} and timings["total"] == pytest.approx(timings["a"] + timings["b"])


def test_every_registered_kind_is_strict_and_bounded() -> None:
    kinds = registry()
    assert "crve_montecarlo" in kinds
    for kind in kinds.values():
        assert issubclass(kind.params_model, JobParams)
        assert kind.params_model.model_config.get("extra") == "forbid"
        kind.params_model.model_validate(dict(kind.example))
        for name in kind.dataset_fields:
            assert name in kind.params_model.model_fields, f"{kind.name}: dataset field {name} is not a param"


def _unbounded_integers(schema: dict, definitions: dict, path: str) -> list[str]:
    if "$ref" in schema:
        return _unbounded_integers(definitions[schema["$ref"].split("/")[-1]], definitions, path)
    found: list[str] = []
    if schema.get("type") == "integer":
        has_low = "minimum" in schema or "exclusiveMinimum" in schema
        has_high = "maximum" in schema or "exclusiveMaximum" in schema
        if not (has_low and has_high):
            found.append(path)
    for name, sub in schema.get("properties", {}).items():
        found += _unbounded_integers(sub, definitions, f"{path}.{name}")
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            found += _unbounded_integers(sub, definitions, path)
    return found  # list items are identifiers (covariate ids, states), not sizes


def test_every_integer_size_parameter_has_both_bounds() -> None:
    for kind in registry().values():
        schema = kind.params_model.model_json_schema()
        assert _unbounded_integers(schema, schema.get("$defs", {}), kind.name) == []
