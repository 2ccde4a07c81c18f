"""The ``dualcontrol_solve`` job kind: spec validation, result names, artifacts, progress, cancellation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.dualcontrol.grid import make_state_grid
from kernels.dualcontrol.jobs import KINDS
from kernels.dualcontrol.model import ModelParams, inert_value
from kernels.dualcontrol.solve import SolveSettings, solve
from kernels.dualcontrol.spec import DualControlParams, DualControlResult
from kernels.progress import JobCancelled, LocalProgress
from kernels.registry import get_kind

(KIND,) = KINDS

SMALL_GRID = {
    "x": {"size": 10, "min": -5.0, "max": 7.0},
    "mu": {"size": 9, "min": -3.0, "max": 3.0},
    "sigma": {"size": 8, "min": 0.05, "max": 2.0},
    "concentration": 1.0,
}


def _params(**overrides):
    spec = {"grid": SMALL_GRID, "quadrature_nodes": 6, "report_states": [[1.0, 0.5, 0.5], [0.0, 0.0, 1.5]]}
    spec.update(overrides)
    return DualControlParams.model_validate(spec)


def _run(params: DualControlParams | dict[str, Any], progress: LocalProgress | None = None) -> dict[str, Any]:
    """The job's result JSON, run on NumPy the way the worker runs it."""
    return run_kind(KIND, params, local_context("cpu", progress=progress))


def test_kind_is_registered_with_its_example() -> None:
    kind = get_kind("dualcontrol_solve")
    assert kind is KIND
    assert kind.params_model is DualControlParams and kind.result_model is DualControlResult
    assert kind.dataset_fields == () and not kind.host_only
    kind.params_model.model_validate(kind.example.params)


def test_example_runs_every_gpu_path() -> None:
    """The cross-backend test runs the example on NumPy and on the GPU: it must converge and take the optimal
    policy (improvement kernel, evaluation sweeps) with its myopic companion. (Its size is kept small by
    review, not by a timed test.)"""
    params = KIND.params_model.model_validate(KIND.example.params)
    result = _run(params)
    assert params.policy == "optimal" and result["converged"]
    assert result["evaluation_sweeps"] > 0 and result["myopic_iterations"] > 0
    assert all(abs(state["control"]) > 1e-3 for state in result["states"])  # no control that is 0 up to rounding


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"quadrature_nodes": 1}, "quadrature_nodes"),
        ({"grid": {**SMALL_GRID, "x": {"size": 4, "min": -1.0, "max": 1.0}}}, "size"),
        ({"grid": {**SMALL_GRID, "x": {"size": 1024, "min": -1.0, "max": 1.0}}}, "size"),
        ({"grid": {**SMALL_GRID, "mu": {"size": 9, "min": 1.0, "max": -1.0}}}, "max"),
        ({"grid": {**SMALL_GRID, "sigma": {"size": 9, "min": 0.0, "max": 1.0}}}, "sigma.min"),
        ({"model": {"gamma": 1.0}}, "gamma"),
        ({"model": {"delta": 1.0}}, "delta"),
        ({"policy": "greedy"}, "policy"),
        ({"tolerance": 0.0}, "tolerance"),
        ({"report_states": [[1.0, 2.0]]}, "report_states"),
        ({"acceleration": {"evaluation_sweeps": -1}}, "evaluation_sweeps"),
        ({"acceleration": {"evaluation": "gmres"}}, "evaluation"),
        ({"acceleration": {"anderson_memory": 0}}, "anderson_memory"),
        ({"precision": "float16"}, "precision"),
        ({"interpolation": "cubic"}, "interpolation"),
        ({"simulation": {"paths": 1}}, "paths"),
        ({"simulation": {"paths": 10, "horizon": 0}}, "horizon"),
        ({"grid": {**SMALL_GRID, "mu_concentration": -1.0}}, "mu_concentration"),
        ({"grid_size": 3}, "grid_size"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": 17}, "gpus"),
    ],
)
def test_spec_rejects_bad_input_naming_the_field(patch, field) -> None:
    with pytest.raises(ValidationError, match=field):
        _params(**patch)


def test_spec_bounds_the_total_grid_size() -> None:
    big = {"size": 512, "min": 0.1, "max": 1.0}
    with pytest.raises(ValidationError, match="exceeds the limit"):
        _params(grid={"x": big, "mu": big, "sigma": big})


def test_spec_bounds_the_simulated_paths() -> None:
    with pytest.raises(ValidationError, match=r"simulation\.paths \* len"):
        _params(simulation={"paths": 600_000})  # two report states: 1.2 M paths


def test_default_tolerance_depends_on_the_policy() -> None:
    assert _params(policy="inert").effective_tolerance == 1e-6
    assert _params(policy="optimal").effective_tolerance == 1e-4
    assert _params(policy="optimal", tolerance=1e-3).effective_tolerance == 1e-3


def test_optimal_job_reports_all_result_names_and_artifacts() -> None:
    progress = LocalProgress()
    result = _run(_params(), progress)
    for name in ("states", "iterations", "converged", "history", "timings", "value_of_experimentation", "device"):
        assert name in result
    assert result["converged"] and result["policy"] == "optimal" and result["device"] == "cpu"
    assert len(result["states"]) == 2 and len(result["value_of_experimentation"]) == 2
    for state, voe in zip(result["states"], result["value_of_experimentation"], strict=True):
        assert set(state) >= {"state", "value", "control", "myopic_value"}
        assert voe == pytest.approx(state["myopic_value"] - state["value"])
        assert voe >= -1e-4 * state["value"]
    optimal_and_myopic = {"value", "policy", "grid", "myopic_value", "myopic_policy"}
    assert set(progress.artifacts) == optimal_and_myopic == set(result["artifacts"])
    assert progress.artifacts["value"].shape == (10, 9, 8)
    fractions = [f for f, _ in progress.reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert {"solve", "myopic_companion", "total"} <= set(result["timings"])
    assert result["gpus"] == 1 and all(level["gpus"] == 1 for level in result["levels"])


def test_anderson_evaluation_job_agrees_with_the_plain_job_in_fewer_companion_sweeps() -> None:
    """``acceleration.evaluation: anderson`` (the default for new jobs; a stored job keeps the value it was
    submitted with) reaches the same exact-state values as plain sweeps (within the tolerances: 1e-4 optimal,
    1e-6 for the myopic companion) and its myopic companion needs fewer sweeps."""
    assert _params().acceleration.evaluation == "anderson"
    plain = _run(_params(acceleration={"evaluation": "sweeps"}))
    fast = _run(_params())
    assert plain["converged"] and fast["converged"]
    assert fast["myopic_iterations"] < plain["myopic_iterations"] / 2
    for a, b in zip(plain["states"], fast["states"], strict=True):
        assert b["value"] == pytest.approx(a["value"], rel=2e-4)
        assert b["myopic_value"] == pytest.approx(a["myopic_value"], rel=2e-6)


def test_inert_job_value_at_a_node_equals_the_artifact() -> None:
    """At a node the interpolated value is the artifact's; the reported value is one exact Bellman step from
    it (equal up to the iteration tolerance), and with residual interpolation both are the inert closed form."""
    progress = LocalProgress()
    grid = {**SMALL_GRID, "concentration": 0.0, "mu_node_at_zero": False}
    state = [-5.0 + 12.0 / 9 * 4, -3.0 + 6.0 / 8 * 2, 0.05 + 1.95 / 7 * 3]  # node (4, 2, 3) of a uniform grid
    result = _run(_params(policy="inert", grid=grid, report_states=[state], interpolation="residual"), progress)
    report = result["states"][0]
    assert result["value_of_experimentation"] is None and report["myopic_value"] is None
    assert report["interpolated_value"] == pytest.approx(progress.artifacts["value"][4, 2, 3], rel=1e-12)
    assert report["value"] == pytest.approx(report["interpolated_value"], rel=2e-6)
    assert report["value"] == pytest.approx(inert_value(ModelParams(0.0, 0.7, 1.0, 0.95, 1.0, 1.0, 0.0), state[0]))
    assert report["control"] == 0.0 and report["interpolated_control"] == 0.0


def test_float32_precision_agrees_with_float64() -> None:
    runs = {p: _run(_params(policy="myopic", precision=p, tolerance=1e-5)) for p in ("float32", "float64")}
    assert runs["float32"]["converged"] and runs["float32"]["precision"] == "float32"
    for s32, s64 in zip(runs["float32"]["states"], runs["float64"]["states"], strict=True):
        assert s32["value"] == pytest.approx(s64["value"], rel=1e-4)


def test_report_state_outside_the_cuboid_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"report_states\[1\]: Sigma = 5.0 lies outside"):
        _params(report_states=[[0.0, 0.0, 1.0], [0.0, 0.0, 5.0]])


def test_cancellation_stops_the_solve() -> None:
    progress = LocalProgress()
    progress.cancel()
    with pytest.raises(JobCancelled):
        _run(_params(), progress)


def test_artifact_grid_holds_the_node_coordinates() -> None:
    progress = LocalProgress()
    _run(_params(policy="inert"), progress)
    nodes = progress.artifacts["grid"]
    assert nodes["x"][0] == -5.0 and nodes["x"][-1] == 7.0 and np.all(np.diff(nodes["mu"]) > 0)


def test_long_cpu_sweeps_keep_reporting_so_a_cancel_is_heard() -> None:
    """The array path calls the progress channel between chunks of one sweep (a heartbeat)."""
    seen: list[str] = []

    def checkpoint(fraction: float, stage: str) -> None:
        seen.append(stage)
        if stage.endswith("sweeping"):
            raise JobCancelled("cancelled mid-sweep")

    model = ModelParams(0.0, 0.7, 1.0, 0.95, 1.0, 1.0, 0.0)
    grid = make_state_grid((-5.0, 7.0, 12), (-3.0, 3.0, 12), (0.05, 2.0, 12), 1.0, 1.0)
    with pytest.raises(JobCancelled):
        solve(model, grid, SolveSettings("myopic", 1e-9, quadrature_nodes=8), np, checkpoint, checkpoint_seconds=0.0)
    assert seen and seen[-1].endswith("sweeping")


def test_several_gpus_on_a_cpu_worker_fail_the_job_naming_the_field() -> None:
    with pytest.raises(ValueError, match="gpus = 2 spreads the Bellman sweeps over GPUs: it needs a GPU worker"):
        _run(_params(gpus=2))


def _gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


@pytest.mark.gpu
def test_more_gpus_than_the_worker_sees_fail_the_job_naming_the_field() -> None:
    asked = _gpu_count() + 1
    with pytest.raises(
        ValueError,
        match=f"gpus = {asked} spreads the Bellman sweeps over {asked} GPUs, but this worker sees {asked - 1}",
    ):
        run_kind(KIND, _params(gpus=asked), local_context("gpu"))


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_count() < 2, reason="needs two or more GPUs")
def test_a_job_on_several_gpus_reports_them_and_gives_the_one_gpu_result() -> None:
    """A grid of 2^19 points (2^18 per GPU, where levels start to spread) on two GPUs against one: every leaf
    of the result the same bits but the timings and the GPU counts, and the finest level says it ran on two."""
    grid = {
        "x": {"size": 128, "min": -9.0, "max": 11.0},
        "mu": {"size": 64, "min": -4.0, "max": 4.0},
        "sigma": {"size": 64, "min": 0.02, "max": 2.0},
    }
    spec = {"policy": "optimal", "grid": grid, "quadrature_nodes": 8, "error_estimate": False}
    one = run_kind(KIND, _params(**spec), local_context("gpu"))
    two = run_kind(KIND, _params(**spec, gpus=2), local_context("gpu"))
    assert one["gpus"] == 1 and two["gpus"] == 2 and [lv["gpus"] for lv in two["levels"]][-2:] == [1, 2]

    def comparable(result: dict[str, Any]) -> dict[str, Any]:
        levels = [{k: v for k, v in lv.items() if k not in ("seconds", "gpus")} for lv in result["levels"]]
        return {**{k: v for k, v in result.items() if k not in ("timings", "gpus")}, "levels": levels}

    assert comparable(two) == comparable(one)
