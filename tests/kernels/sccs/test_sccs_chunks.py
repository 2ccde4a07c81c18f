"""sccs_fit split into chunks (issue 19): the lead, any split of the folds or replicates into chunks, computed in
any order in separate contexts and passed through JSON, then the finish, give the single run's result and
artifacts bit for bit."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kernels.context import JobCache, RunContext, local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import ccd, synthetic
from kernels.sccs import chunks as sccs_chunks
from kernels.sccs.fit_plan import FitPlan
from kernels.sccs.model import Prior
from kernels.sccs.spec import SccsParams


def frames(seed: int = 41, n_cases: int = 240, n_drugs: int = 6, real_values: bool = False) -> dict[str, pd.DataFrame]:
    """Synthetic interval tables; ``real_values``: covariate values that are not 0/1 (non-integer sums)."""
    data = synthetic.generate(np, n_cases, n_drugs, seed=seed, effect_share=0.5, min_eras=3, max_eras=8).data
    tables = synthetic.to_tables(data)
    values = tables.cov_value
    if real_values:
        values = 0.5 + np.random.default_rng(seed).random(values.size)
    names = pd.DataFrame(
        {"covariateId": np.arange(1, n_drugs + 1), "covariateName": [f"drug {i}" for i in range(1, n_drugs + 1)]}
    )
    return {
        "outcomes_dataset_id": pd.DataFrame({"rowId": tables.row_id, "stratumId": tables.stratum_id,
                                             "time": tables.time, "y": tables.y}),
        "covariates_dataset_id": pd.DataFrame({"rowId": tables.cov_row_id, "covariateId": tables.cov_id,
                                               "covariateValue": values}),
        "names_dataset_id": names,
    }  # fmt: skip


DATASETS = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "names_dataset_id": "n"}
CASES: dict[str, dict[str, Any]] = {
    # CV split; the finish then fits the final model, bootstraps and profiles as the single run does.
    "cv_laplace_with_bootstrap_and_profile": {
        "prior": {"type": "laplace", "variance": 0.5, "exclude": [2]},
        "cross_validation": {"folds": 5, "grid": [0.02, 0.2, 2.0], "seed": 4},
        "bootstrap": {"replicates": 6, "seed": 3}, "profile": {"covariates": [1, 3]},
    },
    "cv_normal_real_values_gradient": {
        "prior": {"type": "normal", "variance": 1.0}, "convergence": "gradient", "tolerance": 1e-7,
        "cross_validation": {"folds": 4, "grid": [0.05, 0.5, 5.0, 50.0], "seed": 9},
    },
    # Bootstrap split: 37 replicates, batches of 10 on NumPy (the last one short).
    "bootstrap_laplace_with_diagnostics": {
        "prior": {"type": "laplace", "variance": 0.3}, "bootstrap": {"replicates": 37, "seed": 8},
        "diagnostics": {"pre_exposure_covariates": [4]},
    },
    "bootstrap_normal_real_values": {
        "prior": {"type": "normal", "variance": 2.0, "exclude": [1]}, "bootstrap": {"replicates": 23, "seed": 1},
    },
}  # fmt: skip


def params_of(case: str) -> SccsParams:
    return SccsParams.model_validate({**DATASETS, **CASES[case]})


def frames_of(case: str) -> dict[str, pd.DataFrame]:
    return frames(real_values="real_values" in case)


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("timings", "device")}


def context(datasets: dict[str, pd.DataFrame], xp: Any = np, progress: LocalProgress | None = None,
            cache: JobCache | None = None) -> RunContext:
    return local_context(xp=xp, datasets=datasets, progress=progress, cache=cache)


def single_run(params: SccsParams, datasets: dict[str, pd.DataFrame], xp: Any = np) -> tuple[dict, LocalProgress]:
    progress = LocalProgress()
    return comparable(run_kind(get_kind(sccs_chunks.KIND), params, context(datasets, xp, progress))), progress


def chunked_run(
    params: SccsParams,
    datasets: dict[str, pd.DataFrame],
    n_chunks: int,
    order_seed: int,
    xp: Any = np,
    cache: JobCache | None = None,
) -> tuple[dict, LocalProgress, list[dict]]:
    """The job as a fan-out computes it: the lead, the chunks in a shuffled order, each in a context of its own,
    specs and outputs through JSON text, then the finish in a context of its own. With ``cache``, every run
    is one worker's (which keeps the job's inputs between them)."""
    specs = sccs_chunks.plan(params, n_chunks, min_batches=2)
    assert specs is not None
    lead_spec, lead_output, specs = sccs_chunks.lead(params, context(datasets, xp, cache=cache), specs)
    specs = json.loads(json.dumps(specs))
    stored: dict[int, str] = {}
    for index in random.Random(order_seed).sample(range(len(specs)), len(specs)):
        output = sccs_chunks.run(params, context(datasets, xp, cache=cache), specs[index])
        stored[index] = json.dumps(output)
    all_specs = [json.loads(json.dumps(lead_spec)), *specs]
    outputs = [json.loads(json.dumps(lead_output))] + [json.loads(stored[index]) for index in sorted(stored)]
    progress = LocalProgress()
    result = sccs_chunks.finish(params, context(datasets, xp, progress, cache), all_specs, outputs)
    return comparable(json.loads(result.model_dump_json())), progress, all_specs


def assert_same_artifacts(left: LocalProgress, right: LocalProgress) -> None:
    assert set(left.artifacts) == set(right.artifacts)
    for name, value in left.artifacts.items():
        other = right.artifacts[name]
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(value, other, check_exact=True)
        else:
            assert set(value) == set(other), name
            for key in value:
                a, b = np.asarray(value[key]), np.asarray(other[key])
                assert a.dtype == b.dtype and a.shape == b.shape, (name, key)
                assert a.tobytes() == b.tobytes(), (name, key)  # bit for bit, NaNs included


def units(params: SccsParams) -> int:
    """How many folds or replicates the job's split has (the most chunks it can take)."""
    if params.cross_validation is not None:
        return params.cross_validation.folds
    assert params.bootstrap is not None
    return params.bootstrap.replicates


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n_chunks", [1, 2, 3, 7, "all"])
def test_chunked_run_equals_the_single_run_exactly(case: str, n_chunks: int | str) -> None:
    params, datasets = params_of(case), frames_of(case)
    single, single_progress = single_run(params, datasets)
    count = units(params) if n_chunks == "all" else int(n_chunks)
    chunked, chunked_progress, specs = chunked_run(params, datasets, count, order_seed=len(case) + count)
    assert len(specs) == 1 + min(count, units(params))
    assert chunked == single
    assert_same_artifacts(single_progress, chunked_progress)
    # The floats themselves, bit for bit (== on JSON would pass 0.0 == -0.0).
    for left, right in zip(single["coefficients"], chunked["coefficients"], strict=True):
        assert np.float64(left["estimate"]).tobytes() == np.float64(right["estimate"]).tobytes()
    assert single["log_posterior"].hex() == chunked["log_posterior"].hex()


class CountingCache(JobCache):
    """A worker's job cache that counts what it was asked for and what it had to build."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = self.made = 0

    def get_or_make(self, key: Any, make: Any) -> Any:
        self.asked += 1

        def counted() -> Any:
            self.made += 1
            return make()

        return super().get_or_make(key, counted)


@pytest.mark.parametrize("case", ["cv_laplace_with_bootstrap_and_profile", "bootstrap_normal_real_values"])
def test_one_worker_builds_the_tables_once_for_all_its_runs_of_the_job(case: str) -> None:
    """A worker keeps a job's built tables from its chunks to the finish (``JobCache``): the result is the
    single run's, bit for bit, the tables built once (the fits never change them)."""
    params, datasets = params_of(case), frames_of(case)
    single, single_progress = single_run(params, datasets)
    cache = CountingCache().enter("the job")
    chunked, chunked_progress, specs = chunked_run(params, datasets, 3, order_seed=5, cache=cache)
    assert chunked == single
    assert_same_artifacts(single_progress, chunked_progress)
    assert cache.made == 1 and cache.asked >= len(specs)


def test_a_job_cache_holds_one_jobs_values() -> None:
    cache = JobCache().enter("a")
    made: list[str] = []
    assert cache.get_or_make("k", lambda: made.append("a") or "value a") == "value a"
    assert cache.enter("a").get_or_make("k", lambda: made.append("again") or "other") == "value a"
    assert cache.enter("b").get_or_make("k", lambda: made.append("b") or "value b") == "value b"
    assert made == ["a", "b"] and len(cache) == 1

    def fails() -> str:
        raise ValueError("no tables")

    with pytest.raises(ValueError, match="no tables"):
        cache.get_or_make("bad", fails)
    assert len(cache) == 1  # nothing kept for a build that raised
    cache.clear()
    assert len(cache) == 0
    # Without a cache every run builds; with one, each namespace has its own value.
    assert local_context(xp=np).reuse("k", lambda: 1) == 1
    shared = JobCache().enter("c")
    assert local_context(xp=np, cache=shared).reuse("k", lambda: 1) == 1
    assert local_context(xp=np, cache=shared).reuse("k", lambda: 2) == 1


def test_a_numpy_fit_has_the_same_bits_whatever_else_is_in_its_batch() -> None:
    data = synthetic.generate(np, 150, 5, seed=3, effect_share=0.5, min_eras=3, max_eras=8).data
    prior = Prior("laplace", 0.4, np.ones(data.n_covariates, dtype=bool))
    fitter = ccd.numpy_batch_fitter(data, prior, ccd.FitOptions())
    generator = np.random.default_rng(0)
    weights = generator.integers(0, 3, (4, data.n_cases)).astype(np.float64)
    starts = generator.normal(0.0, 0.1, (4, data.n_covariates))
    variances = np.array([0.1, 0.4, 1.0, 4.0])
    together = fitter(variances, weights, starts, None)
    for member in range(4):
        alone = fitter(variances[[member]], weights[[member]], starts[[member]], None)[0]
        reordered = fitter(variances[::-1], weights[::-1], starts[::-1], None)[3 - member]
        for fit in (alone, reordered):
            assert fit.beta.tobytes() == together[member].beta.tobytes()
            assert (fit.log_likelihood, fit.iterations, fit.gradient_norm) == (
                together[member].log_likelihood,
                together[member].iterations,
                together[member].gradient_norm,
            )


def test_the_plan_splits_only_large_jobs_into_contiguous_ranges() -> None:
    cv = params_of("cv_normal_real_values_gradient")  # 4 folds, 4 variances
    assert sccs_chunks.plan(cv, 3, min_batches=5) is None  # fewer batches (variances) than the threshold
    specs = sccs_chunks.plan(cv, 3, min_batches=4)
    assert specs == [
        {"split": "cross_validation", "folds": [0, 2], "size": 8},
        {"split": "cross_validation", "folds": [2, 3], "size": 4},
        {"split": "cross_validation", "folds": [3, 4], "size": 4},
    ]
    boot = params_of("bootstrap_laplace_with_diagnostics")  # 37 replicates: 4 batches of 10 on NumPy
    assert sccs_chunks.plan(boot, 2, min_batches=5) is None
    assert [spec["replicates"] for spec in sccs_chunks.plan(boot, 2, min_batches=4) or []] == [[0, 19], [19, 37]]
    plain = SccsParams.model_validate({**DATASETS, "prior": {"type": "normal", "variance": 1.0}})
    assert sccs_chunks.plan(plain, 4, min_batches=2) is None  # one fit: nothing to split
    no_prior = SccsParams.model_validate(
        {**DATASETS, "prior": {"type": "none"}, "cross_validation": {"folds": 3, "grid": [0.1, 1.0]}}
    )
    assert sccs_chunks.plan(no_prior, 4, min_batches=2) is None  # the single run refuses it: so does a whole run


@pytest.mark.parametrize(("count", "chunks"), [(5, 1), (5, 2), (10, 3), (4, 9), (37, 4)])
def test_split_range_covers_every_unit_once_in_order(count: int, chunks: int) -> None:
    ranges = sccs_chunks.split_range(count, chunks)
    assert [unit for part in ranges for unit in part] == list(range(count))
    assert len(ranges) == min(count, chunks) and max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_the_finish_refuses_chunks_of_another_device_kind_or_with_a_gap() -> None:
    params, datasets = params_of("cv_normal_real_values_gradient"), frames_of("cv_normal_real_values_gradient")
    specs = sccs_chunks.plan(params, 2, min_batches=2) or []
    lead_spec, lead_output, specs = sccs_chunks.lead(params, context(datasets), specs)
    outputs = [sccs_chunks.run(params, context(datasets), spec) for spec in specs]
    with pytest.raises(ValueError, match="same kind of device"):
        sccs_chunks.finish(
            params, context(datasets), [lead_spec, {**specs[0], "backend": "cupy"}, specs[1]], [lead_output, *outputs]
        )
    with pytest.raises(ValueError, match="do not cover"):
        sccs_chunks.finish(params, context(datasets), [lead_spec, specs[1]], [lead_output, outputs[1]])


def test_the_finish_refuses_bootstrap_chunks_that_fitted_different_final_models() -> None:
    """Every bootstrap chunk fits the final model itself; a chunk whose fit is not the others' bits (a worker on
    another kind of device) would have started its refits elsewhere: the finish refuses the job."""
    case = "bootstrap_normal_real_values"
    params, datasets = params_of(case), frames_of(case)
    specs = sccs_chunks.plan(params, 3, min_batches=2) or []
    lead_spec, lead_output, specs = sccs_chunks.lead(params, context(datasets), specs)
    assert lead_output == {} and all("beta_hat" not in spec for spec in specs)  # the lead fits nothing
    outputs = [json.loads(json.dumps(sccs_chunks.run(params, context(datasets), spec))) for spec in specs]
    assert outputs[0]["final_fit"] == outputs[1]["final_fit"] == outputs[2]["final_fit"]
    sccs_chunks.finish(params, context(datasets), [lead_spec, *specs], [lead_output, *outputs])  # as they are
    other = sccs_chunks.fit_from_json(outputs[2]["final_fit"])
    other.beta[0] = np.nextafter(other.beta[0], np.inf)  # one bit of one coefficient
    outputs[2]["final_fit"] = sccs_chunks.fit_to_json(other)
    with pytest.raises(ValueError, match="different final models"):
        sccs_chunks.finish(params, context(datasets), [lead_spec, *specs], [lead_output, *outputs])
    without = [{key: value for key, value in output.items() if key != "final_fit"} for output in outputs]
    with pytest.raises(ValueError, match="no chunk of this bootstrap holds the final fit"):
        sccs_chunks.finish(params, context(datasets), [lead_spec, *specs], [lead_output, *without])


def test_arrays_and_fits_round_trip_through_json_exactly() -> None:
    values = np.array([[0.1 + 0.2, -0.0, math.inf], [np.nan, 5e-324, -1e308]])
    back = sccs_chunks.array_from_json(json.loads(json.dumps(sccs_chunks.array_to_json(values))))
    assert back.dtype == values.dtype and back.tobytes() == values.tobytes()
    flags = np.array([[True, False]])
    assert sccs_chunks.array_from_json(sccs_chunks.array_to_json(flags)).tolist() == flags.tolist()
    fit = ccd.FitResult(
        beta=np.array([0.1, -0.0]),
        iterations=7,
        converged=False,
        log_likelihood=-12.3456789,
        log_posterior=-1 / 3,
        gradient_norm=math.nan,
        criterion=math.inf,
    )
    again = sccs_chunks.fit_from_json(json.loads(json.dumps(sccs_chunks.fit_to_json(fit))))
    assert again.beta.tobytes() == fit.beta.tobytes() and (again.iterations, again.converged) == (7, False)
    assert (again.log_likelihood, again.log_posterior, again.criterion) == (-12.3456789, -1 / 3, math.inf)
    assert math.isnan(again.gradient_norm) and isinstance(again.converged, bool)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        "cv_laplace_with_bootstrap_and_profile",
        "cv_normal_real_values_gradient",
        "bootstrap_laplace_with_diagnostics",
        "bootstrap_normal_real_values",
    ],
)
def test_chunked_gpu_run_equals_the_single_gpu_run_exactly(case: str) -> None:
    """On the GPU each chunk fits only its own members (a batch of its folds or replicates)."""
    cp = pytest.importorskip("cupy")
    params, datasets = params_of(case), frames_of(case)
    single, single_progress = single_run(params, datasets, cp)
    for n_chunks in (2, 3):
        chunked, chunked_progress, _ = chunked_run(params, datasets, n_chunks, order_seed=n_chunks, xp=cp)
        assert chunked == single, n_chunks
        assert_same_artifacts(single_progress, chunked_progress)
    # One worker running every chunk and the finish builds the tables on the device once (the fits never
    # change them): the same bits.
    cache = CountingCache().enter("the job")
    chunked, chunked_progress, _ = chunked_run(params, datasets, 3, order_seed=3, xp=cp, cache=cache)
    assert chunked == single and cache.made == 1
    assert_same_artifacts(single_progress, chunked_progress)


@pytest.mark.gpu
def test_a_gpu_sccs_fit_gives_the_same_bits_twice() -> None:
    """A fan-out can equal the single run bit for bit only if the single run does so itself: the GPU path adds
    with atomics in places (CuPy's bincount with weights), whose order may vary between runs."""
    cp = pytest.importorskip("cupy")
    params = params_of("cv_laplace_with_bootstrap_and_profile")
    datasets = frames(n_cases=30_000, n_drugs=30, real_values=True)  # many cases over warp edges
    first, first_progress = single_run(params, datasets, cp)
    second, second_progress = single_run(params, datasets, cp)
    assert first == second
    assert_same_artifacts(first_progress, second_progress)


@pytest.mark.gpu
def test_gpu_member_bits_whatever_else_is_in_its_batch() -> None:
    """The GPU engine gives a member the same bits alone, in another batch, at another capacity: what lets a
    chunk fit only its own members (kernels/sccs/chunks.py)."""
    cp = pytest.importorskip("cupy")
    from kernels.sccs import gpu

    built = frames(n_cases=2_000, n_drugs=12, real_values=True)
    fit_plan = FitPlan.load(
        SccsParams.model_validate({**DATASETS, "prior": {"type": "laplace", "variance": 0.4}}), context(built, cp)
    )
    data, prior = fit_plan.data, fit_plan.prior
    generator = np.random.default_rng(0)
    weights = generator.integers(0, 3, (6, data.n_cases)).astype(np.float64)
    starts = np.zeros((6, data.n_covariates))
    variances = np.full(6, 0.4)
    together = gpu.batch_fitter(data, prior, ccd.FitOptions(), 6)(variances, weights, starts, None)
    alone = gpu.batch_fitter(data, prior, ccd.FitOptions(), 1)(variances[:1], weights[:1], starts[:1], None)[0]
    other = gpu.batch_fitter(data, prior, ccd.FitOptions(), 3)(variances[:3], weights[[2, 0, 1]], starts[:3], None)[1]
    for fit in (alone, other):
        assert fit.beta.tobytes() == together[0].beta.tobytes()
        assert (fit.log_likelihood, fit.iterations) == (together[0].log_likelihood, together[0].iterations)
