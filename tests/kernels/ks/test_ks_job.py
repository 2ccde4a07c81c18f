"""The ``ks_solve`` job kind: parameter validation, the runner's result and artifacts (NumPy, through
``run_kind`` as the worker runs it)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from pydantic import ValidationError

from kernels.context import MissingDatasetError, local_context, run_kind
from kernels.ks.jobs import KS_SOLVE, policy_damping
from kernels.ks.spec import KSSolveParams, KSSolveResult
from kernels.progress import JobCancelled, LocalProgress
from kernels.registry import get_kind

# a warm start near the converged ALM keeps the job test short (see test_ks_numerics.REFERENCE_ALM)
WARM = [0.144219, 0.960361, 0.154786, 0.958879]
SMALL = {"n_agents": 1_000, "periods": 200, "burn_in": 50, "tolerance": 1e-3, "max_iterations": 3,
         "interpolation": "bilinear", "policy_tolerance": 1e-5, "initial_alm": WARM, "den_haan_periods": 100,
         "seed": 5}


def test_registered_with_example() -> None:
    kind = get_kind("ks_solve")
    assert kind is KS_SOLVE
    assert kind.params_model is KSSolveParams
    assert kind.result_model is KSSolveResult
    assert kind.dataset_fields == ("initial_distribution", "accuracy_path", "accuracy_distribution")
    KSSolveParams.model_validate(kind.example.params)
    assert kind.example.frames() == {}


def test_defaults_are_the_standard_ks_sim_settings() -> None:
    p = KSSolveParams()
    assert (p.n_agents, p.periods, p.burn_in) == (10_000, 1_100, 100)
    assert (p.k_grid.size, p.k_grid.min, p.k_grid.max, p.k_grid.spacing_power) == (100, 0.0, 1000.0, 7.0)
    assert (p.K_grid.size, p.K_grid.min, p.K_grid.max) == (4, 30.0, 50.0)
    assert (p.tolerance, p.damping, p.policy_method, p.policy_damping) == (1e-7, 0.3, "time_iteration", None)
    assert policy_damping(p) == 0.7  # the stored jobs' damping when none is given
    assert policy_damping(KSSolveParams(policy_method="egm")) == 1.0
    assert p.calibration.transition[3] == [0.009115, 0.115885, 0.024306, 0.850694]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"n_agents": 10}, "n_agents"),
        ({"k_grid": {"size": 5000}}, "k_grid.size"),
        ({"K_grid": {"size": 2}}, "K_grid.size"),
        ({"interpolation": "spline"}, "interpolation"),
        ({"precision": "float16"}, "precision"),
        ({"periods": 100, "burn_in": 95}, "burn_in"),
        ({"k_grid": {"min": 10.0, "max": 5.0}}, "k_grid"),
        ({"calibration": {"beta": 1.2}}, "calibration.beta"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_parameters_name_the_field(payload: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        KSSolveParams.model_validate_json(json.dumps(payload))
    text = str(info.value)
    assert field.split(".")[0] in text


@pytest.mark.parametrize("periods", [1, 2, 9])
def test_a_den_haan_test_of_one_to_nine_periods_is_refused(periods: int) -> None:
    # it used to validate and then skip the accuracy test silently (den_haan_error: null)
    with pytest.raises(ValidationError, match="den_haan_periods must be 0") as info:
        KSSolveParams.model_validate({"den_haan_periods": periods})
    assert info.value.errors()[0]["loc"] == ("den_haan_periods",)


@pytest.mark.parametrize("periods", [None, 0, 10, 1_100])
def test_den_haan_periods_zero_none_or_at_least_ten_are_accepted(periods: int | None) -> None:
    assert KSSolveParams.model_validate({"den_haan_periods": periods}).den_haan_periods == periods


def test_inconsistent_transition_matrix_is_refused() -> None:
    rows = [list(r) for r in KSSolveParams().calibration.transition]
    rows[3][3] = 0.859604  # the OCR error in the paper's Table B.1
    with pytest.raises(ValidationError, match="sum to one"):
        KSSolveParams.model_validate({"calibration": {"transition": rows}})
    rows = [[0.4375, 0.4375, 0.0625, 0.0625]] * 4  # a valid Markov matrix, but 50% unemployment
    with pytest.raises(ValidationError, match="reproduce"):
        KSSolveParams.model_validate({"calibration": {"transition": rows}})
    rows = [[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 0.5]]
    with pytest.raises(ValidationError, match="positive probability"):
        KSSolveParams.model_validate({"calibration": {"transition": rows}})


def test_run_returns_every_result_name_and_artifacts() -> None:
    kind = KS_SOLVE
    params = KSSolveParams.model_validate(SMALL)
    progress = LocalProgress()
    result = run_kind(kind, params, local_context(device="cpu", progress=progress))
    KSSolveResult.model_validate(result)
    assert result["device"] == "cpu"
    for state in ("bad", "good"):
        assert set(result["alm"][state]) == {"intercept", "slope", "r2", "se", "n_obs"}
        assert 0.9 < result["alm"][state]["slope"] < 1.0
        assert result["alm"][state]["r2"] > 0.999
        assert 0 < result["alm"][state]["se"] < 0.01
    assert set(result["den_haan_error"]) == {"max_pct", "mean_pct", "periods", "test"}
    assert result["den_haan_error"]["test"] == "panel" and result["accuracy"] is None
    assert result["den_haan_error"]["periods"] == 100
    assert 0 < result["den_haan_error"]["mean_pct"] <= result["den_haan_error"]["max_pct"] < 5
    assert 1 <= result["iterations"] <= 3 and isinstance(result["converged"], bool)
    assert len(result["policy_iterations"]) == result["iterations"]
    assert 35.0 < result["mean_capital"] < 45.0
    assert result["device"] == "cpu" or result["device"].startswith("NVIDIA")
    assert {"policy", "panel", "regression", "den_haan_test", "total"} <= set(result["timings"])
    assert set(progress.artifacts) == {"capital_path", "policy", "den_haan_path"}
    assert progress.artifacts["capital_path"]["K"].shape == (200,)
    assert progress.artifacts["policy"]["policy"].shape == (2, 2, 100, 4)
    assert progress.reports[-1] == (1.0, "done")
    json.dumps(result)


def test_initial_distribution_dataset_and_its_errors() -> None:
    import pandas as pd  # here, not at the top: the GPU machine runs this module's gpu test without pandas

    kind = KS_SOLVE
    params = KSSolveParams.model_validate({**SMALL, "max_iterations": 1, "den_haan_periods": 0,
                                           "initial_distribution": "ds-1"})
    frame = pd.DataFrame({"k": np.linspace(20.0, 60.0, 500), "employed": np.tile([0, 1, 1, 1, 1], 100)})
    progress = LocalProgress()
    ctx = local_context(device="cpu", datasets={"initial_distribution": frame}, progress=progress)
    result = run_kind(kind, params, ctx)
    assert result["den_haan_error"] is None
    # the panel starts at the dataset's mean (tiled to n_agents = 1000, the mean is kept)
    assert progress.artifacts["capital_path"]["K"][0] == pytest.approx(40.0, rel=1e-12)
    for bad_frame, message in ((frame.rename(columns={"k": "capital"}), "column 'k'"),
                               (frame.assign(employed=2), "employed")):
        with pytest.raises(ValueError, match=message):
            run_kind(kind, params, local_context(device="cpu", datasets={"initial_distribution": bad_frame}))
    with pytest.raises(MissingDatasetError, match="initial_distribution"):  # named in the params, not given
        run_kind(kind, params, local_context(device="cpu"))


def test_cancellation_stops_the_run() -> None:
    progress = LocalProgress()
    progress.cancel()
    with pytest.raises(JobCancelled):
        run_kind(KS_SOLVE, SMALL, local_context(device="cpu", progress=progress))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"n_agents": 10_000, "coarse_agents": 10_000}, "fewer than n_agents"),
        ({"n_agents": 10_000, "coarse_agents": 500}, "at least 1,000"),
        ({"coarse_agents": 2_000, "alm_simulation": "histogram"}, "histogram"),
        ({"alm_update": "newton"}, "coarse_agents"),
        ({"alm_update": "broyden"}, "alm_update"),
    ],
)
def test_staged_solve_options_are_checked_at_submission(payload: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KSSolveParams.model_validate(payload)


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"periods": 100}, "burn_in", "burn_in (100) must leave at least 10 of the 100 periods"),
        ({"periods": 100, "burn_in": 91}, "burn_in", "at least 10 of the 100 periods"),
        ({"n_agents": 10_000, "coarse_agents": 10_000}, "coarse_agents", "fewer than n_agents"),
        ({"alm_update": "newton"}, "coarse_agents", "takes its Jacobian from the coarse stage"),
        ({"coarse_agents": 2_000, "alm_simulation": "histogram"}, "alm_simulation", "coarse_agents stages the panel"),
        ({"gpus": 2, "alm_simulation": "histogram"}, "alm_simulation", "gpus = 2"),
        ({"n_agents": 3_000, "gpus": 4}, "gpus", "at least 1,000 agents per GPU"),
        ({"accuracy_path": "p"}, "accuracy_path", "set accuracy_test to 'jedc'"),
        ({"accuracy_test": "jedc", "den_haan_periods": 10_001}, "accuracy_path", "den_haan_periods"),
    ],
)
def test_rules_across_fields_name_a_field_of_the_rule(payload: dict, field: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)) as info:
        KSSolveParams.model_validate(payload)
    assert [error["loc"] for error in info.value.errors()] == [(field,)]


@pytest.mark.parametrize("payload", [{"periods": 100, "burn_in": 90}, {"n_agents": 4_000, "gpus": 4},
                                     {"gpus": 2}, {"coarse_agents": 1_000, "n_agents": 1_001}])
def test_the_rules_boundaries_are_accepted(payload: dict) -> None:
    KSSolveParams.model_validate(payload)


# params fields the solve's settings do not take: the runner reads them (grids, calibration, datasets, the jedc
# test after the solve)
NOT_IN_SOLVE_SETTINGS = {"k_grid", "K_grid", "calibration", "initial_distribution", "accuracy_test", "accuracy_path",
                         "accuracy_distribution"}


def test_the_solve_settings_take_every_other_params_field() -> None:
    from dataclasses import asdict

    from kernels.ks.jobs import solve_settings

    params = KSSolveParams.model_validate({
        "n_agents": 20_000, "periods": 300, "burn_in": 40, "tolerance": 1e-5, "damping": 0.5,
        "alm_update": "anderson", "gpus": 2, "coarse_agents": 2_000, "max_iterations": 7, "interpolation": "cubic",
        "precision": "float32", "seed": 11, "policy_tolerance": 1e-6, "policy_method": "egm",
        "policy_damping": 0.9, "policy_max_iterations": 77, "den_haan_periods": 50, "initial_alm": WARM,
    })
    settings = asdict(solve_settings(params))
    policy = settings.pop("policy")
    taken = {name: value for name, value in settings.items() if name in KSSolveParams.model_fields}
    taken |= {f"policy_{name}": value for name, value in policy.items()
              if f"policy_{name}" in KSSolveParams.model_fields}
    assert set(taken) | NOT_IN_SOLVE_SETTINGS == set(KSSolveParams.model_fields)
    expected = params.model_dump(exclude=NOT_IN_SOLVE_SETTINGS)
    assert taken == {**expected, "initial_alm": tuple(WARM)}
    # the derived ones: the method's damping when none is given, no panel test before the jedc test
    assert solve_settings(KSSolveParams(policy_method="egm")).policy.damping == 1.0
    assert solve_settings(KSSolveParams(accuracy_test="jedc", den_haan_periods=100)).den_haan_periods == 0


@pytest.mark.slow
def test_the_staged_anderson_job_reaches_the_direct_jobs_alm() -> None:
    # the fast path of large panels (coarse stage, then the full panel, Anderson steps) as a job: the fixed point
    # of the same map from another ergodic start panel, so equal to the direct solve's up to sampling noise,
    # which is large at N = 2,000 (test_ks_convergence's staged test measured slopes 5e-3 apart at N = 8,000)
    base = {**SMALL, "n_agents": 2_000, "tolerance": 1e-4, "policy_tolerance": 1e-7, "max_iterations": 80,
            "den_haan_periods": 0}
    direct = run_kind(KS_SOLVE, KSSolveParams.model_validate(base), local_context(device="cpu"))
    staged = run_kind(KS_SOLVE, KSSolveParams.model_validate({**base, "coarse_agents": 1_000,
                                                              "alm_update": "anderson"}),
                      local_context(device="cpu"))
    assert direct["converged"] and staged["converged"]
    assert direct["coarse_iterations"] == 0 and staged["coarse_iterations"] >= 1
    assert staged["iterations"] < direct["iterations"]
    for state in ("bad", "good"):
        assert staged["alm"][state]["slope"] == pytest.approx(direct["alm"][state]["slope"], abs=1e-2)
    assert staged["mean_capital"] == pytest.approx(direct["mean_capital"], rel=3e-2)


def test_a_panel_over_several_gpus_on_a_cpu_worker_fails_naming_the_field() -> None:
    params = KSSolveParams.model_validate({**SMALL, "n_agents": 2_000, "gpus": 2})
    with pytest.raises(ValueError, match="gpus = 2 spreads the panel over GPUs: it needs a GPU worker"):
        run_kind(KS_SOLVE, params, local_context(device="cpu"))
    with pytest.raises(ValidationError, match="gpus"):
        KSSolveParams.model_validate({"gpus": 0})


def test_progress_follows_convergence_not_only_the_iteration_cap() -> None:
    # progress that counted max_iterations jumped from 0.33 to 1.0
    from kernels.ks.solve import outer_progress

    history = [{"change": c} for c in (1e-1, 1e-3, 1e-5)]
    assert outer_progress(1, 100, [], 1e-7) == 0.0
    assert outer_progress(4, 100, history, 1e-7) == pytest.approx(0.9 * 4 / 6)  # log(1e4) / log(1e6)
    assert outer_progress(99, 100, history[:1], 1e-7) == pytest.approx(0.9 * 0.98)  # the count still moves it
    assert outer_progress(4, 100, [*history, {"change": 1e-9}], 1e-7) == pytest.approx(0.9)


@pytest.mark.slow
def test_a_job_s_progress_follows_its_convergence() -> None:
    params = KSSolveParams.model_validate({**SMALL, "max_iterations": 100, "tolerance": 1e-5})
    progress = LocalProgress()
    run_kind(KS_SOLVE, params, local_context(device="cpu", progress=progress))
    fractions = [fraction for fraction, _ in progress.reports]
    assert fractions == sorted(fractions)
    last_outer = max(f for f, stage in progress.reports if stage and stage.startswith("iteration"))
    assert last_outer > 0.3  # converged in a few of 100 iterations: the bar got well past 3 %


def test_the_calibration_takes_every_field_of_its_spec() -> None:
    from dataclasses import asdict

    from kernels.ks.spec import CalibrationSpec

    spec = CalibrationSpec.model_validate({"preset": "ks1998", "beta": 0.98})
    expected = {**spec.model_dump(exclude={"preset"}), "transition": tuple(tuple(row) for row in spec.transition)}
    cal = spec.to_calibration()
    assert {name: getattr(cal, name) for name in asdict(cal)} == expected
    assert (cal.beta, cal.mu, cal.l_bar) == (0.98, 0.0, 0.3271)
