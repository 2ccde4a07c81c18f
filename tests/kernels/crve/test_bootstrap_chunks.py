"""crve_bootstrap split into parts of draws (issue 19): any split of the run's draw chunks into parts, computed
in any order in separate contexts (each setting the test up from the dataset itself) and passed through JSON,
then finished, gives the single run's result and its ``bootstrap_t`` artifact bit for bit: heteroskedastic
(a bootstrap cluster per observation) and clustered designs, weights, fixed effects, multiway clusters, a joint
test, the confidence interval by test inversion, enumerated draws, the jackknife variants. And the plan: which
jobs are fanned out, into how many parts."""

from __future__ import annotations

import dataclasses
import json
import random
import types
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kernels.context import RunContext, local_context, run_kind
from kernels.crve import bootstrap_chunks as chunks
from kernels.crve import jobs as crve_jobs
from kernels.crve.bootstrap import DrawSchedule, bootstrap_setup, wild_cluster_bootstrap
from kernels.crve.spec import BootstrapParams
from kernels.progress import LocalProgress
from kernels.registry import get_kind

DRAWS_PER_CHUNK = 7


def frame(n_obs: int, seed: int) -> pd.DataFrame:
    """Rows with 12 clusters ``g``, 5 periods ``t`` crossing them, a fixed effect ``f`` crossing both, weights."""
    rs = np.random.default_rng(seed)
    g = np.arange(n_obs) % 12
    t = rs.integers(0, 5, n_obs)
    f = rs.integers(0, 9, n_obs)
    x1 = rs.standard_normal(n_obs) + rs.standard_normal(12)[g]
    x2 = rs.standard_normal(n_obs)
    y = 0.3 * x2 + rs.standard_normal(9)[f] + rs.standard_normal(12)[g] + rs.standard_normal(n_obs) * (1 + x2**2) ** 0.5
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "g": g, "t": t, "f": f, "w": 0.5 + rs.random(n_obs)})


CASES: dict[str, dict[str, Any]] = {
    # heteroskedastic: a bootstrap cluster per observation (the fan-out's case), weights, the interval
    "hc_weights_ci": {"formula": "y ~ x1 + x2", "cluster": None, "weights": "w", "param": "x1", "reps": 199},
    "hc_fixed_effect_wcu": {"formula": "y ~ x1 + x2 | f", "cluster": None, "param": "x2", "r": 0.2, "reps": 150,
                            "impose_null": False, "weights_type": "mammen", "p_val_type": "equal-tailed"},
    "cluster_fixed_effect_ci": {"formula": "y ~ x1 + x2 | f", "cluster": "g", "param": "x1", "reps": 299,
                                "weights_type": "webb"},
    "twoway_joint": {"formula": "y ~ x1 + x2", "cluster": ["g", "t"], "hypothesis": ["x1 = 0", "x2 = 0.3"],
                     "reps": 199, "weights": "w"},
    "twoway_by_period_ci": {"formula": "y ~ x1 + x2", "cluster": ["g", "t"], "bootcluster": "t", "param": "x1",
                            "reps": 99, "weights_type": "norm", "p_val_type": ">"},
    "enumerated": {"formula": "y ~ x1 + x2", "cluster": "t", "param": "x1", "reps": 999},  # the 2^5 sign vectors
    "jackknife_crv3": {"formula": "y ~ x1 + x2", "cluster": "g", "param": "x2", "r": 0.3, "reps": 199,
                       "bootstrap_type": "33", "vcov_type": "CRV3"},
}  # fmt: skip
N_OBS = 240


def params_of(case: str) -> BootstrapParams:
    return BootstrapParams.model_validate({"dataset_id": "dataset_id", "seed": 17, **CASES[case]})


def context(data: pd.DataFrame, progress: LocalProgress | None = None) -> RunContext:
    return local_context(device="cpu", datasets={"dataset_id": data}, progress=progress)


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("timings", "device")}


def use_small_chunks(monkeypatch: pytest.MonkeyPatch, params: BootstrapParams, data: pd.DataFrame) -> None:
    """NumPy chunks of DRAWS_PER_CHUNK draws (the split's unit), so that small runs have many and a short last."""
    ctx = context(data)
    design = crve_jobs.bootstrap_design(params, ctx)
    restrictions = crve_jobs.single_restrictions(params, design.names)
    setup = bootstrap_setup(np, crve_jobs.device_data(design, np), crve_jobs.bootstrap_options(params, restrictions,
                                                                                                ctx))  # fmt: skip
    widest = setup.operator.widest(setup.inference.facts.h_count)
    monkeypatch.setattr(crve_jobs, "_NUMPY_DRAW_BLOCK_ELEMENTS", DRAWS_PER_CHUNK * widest)


def single_run(params: BootstrapParams, data: pd.DataFrame, xp: Any = np) -> tuple[dict[str, Any], LocalProgress]:
    progress = LocalProgress()
    ctx = local_context(xp=xp, datasets={"dataset_id": data}, progress=progress)
    return comparable(run_kind(get_kind(chunks.KIND), params, ctx)), progress


def finished(
    params: BootstrapParams, outputs: list[dict[str, Any]], xp: Any = np
) -> tuple[dict[str, Any], LocalProgress]:
    """The finish as the worker runs it (``worker.fanout.kind_to_run``): the kind run with the parts' outputs."""
    specs = [{"part": [0, 0]}] + [{"part": [index, len(outputs)]} for index in range(len(outputs))]

    def finish(spec: BootstrapParams, ctx: RunContext) -> Any:
        return chunks.finish(spec, ctx, specs, [{}, *outputs])

    kind = dataclasses.replace(get_kind(chunks.KIND), run=finish)
    progress = LocalProgress()
    return comparable(run_kind(kind, params, local_context(xp=xp, progress=progress))), progress


def split_run(
    params: BootstrapParams, data: pd.DataFrame, n_parts: int, order_seed: int, xp: Any = np
) -> tuple[dict[str, Any], LocalProgress, list[dict[str, Any]]]:
    """The job as a fan-out computes it: the parts in a shuffled order, each in a context of its own that reads
    the dataset, the outputs through JSON text, finished in part order."""
    backend = chunks.backend_name(xp)
    stored: dict[int, str] = {}
    for index in random.Random(order_seed).sample(range(n_parts), n_parts):
        ctx = local_context(xp=xp, datasets={"dataset_id": data})
        stored[index] = json.dumps(chunks.run(params, ctx, {"part": [index, n_parts], "backend": backend}))
    outputs = [json.loads(stored[index]) for index in range(n_parts)]
    result, progress = finished(params, outputs, xp)
    return result, progress, outputs


def assert_same_artifacts(left: LocalProgress, right: LocalProgress) -> None:
    assert set(left.artifacts) == set(right.artifacts) == {"bootstrap_t"}
    ours, theirs = np.asarray(left.artifacts["bootstrap_t"]), np.asarray(right.artifacts["bootstrap_t"])
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and ours.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_split_gives_the_single_run_exactly(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    params, data = params_of(case), frame(N_OBS, seed=len(case))
    use_small_chunks(monkeypatch, params, data)
    single, single_progress = single_run(params, data)
    schedule = chunks.part_from_json(split_run(params, data, 1, 0)[2][0]).schedule
    assert schedule.chunk == DRAWS_PER_CHUNK and schedule.n_chunks >= 5 and schedule.reps % schedule.chunk != 0
    assert schedule.reps == single["reps_used"] and schedule.enumerated == single["enumerated"]
    for n_parts in (1, 2, 3, schedule.n_chunks, schedule.n_chunks + 2):  # the last: two parts without draws
        result, progress, outputs = split_run(params, data, n_parts, order_seed=n_parts)
        assert result == single, n_parts
        assert_same_artifacts(progress, single_progress)
        parts = [chunks.part_from_json(output) for output in outputs]
        assert [len(item.draws) for item in parts].count(0) == max(0, n_parts - schedule.n_chunks)
        first = json.dumps(outputs[0]["inference"])  # every part set the test up alike
        assert all(json.dumps(output["inference"]) == first for output in outputs)


def test_the_cases_cover_what_they_claim() -> None:
    """The cases reach the paths they are named for: enumeration, the interval, a joint test, variants."""
    data = frame(N_OBS, seed=3)
    results = {case: single_run(params_of(case), data)[0] for case in CASES}
    assert results["enumerated"]["enumerated"] and results["enumerated"]["reps_used"] == 2**5
    assert results["hc_weights_ci"]["n_boot_clusters"] == N_OBS and results["hc_weights_ci"]["conf_int"] is not None
    assert results["cluster_fixed_effect_ci"]["conf_int"] is not None and results["twoway_joint"]["test"] == "wald"
    assert results["twoway_by_period_ci"]["n_boot_clusters"] == 5 and results["jackknife_crv3"]["vcov_type"] == "CRV3"
    assert results["hc_fixed_effect_wcu"]["bootstrap_type"] == "WCU"


def test_a_part_computes_its_draws_as_the_single_run_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parts' draws are the single run's t* themselves (not only the summaries), each part's in its place."""
    params, data = params_of("hc_weights_ci"), frame(N_OBS, seed=5)
    use_small_chunks(monkeypatch, params, data)
    _, single_progress = single_run(params, data)
    outputs = split_run(params, data, 4, order_seed=1)[2]
    parts = [chunks.part_from_json(output) for output in outputs]
    assert [item.draws.start for item in parts] == [0, 56, 105, 154]  # 29 chunks of 7: 8, 7, 7, 7 chunks
    factor = parts[0].inference.fit.factor
    t_star = np.concatenate([item.sums.numer / np.sqrt(factor * item.sums.sumsq) for item in parts])
    assert t_star.tobytes() == np.asarray(single_progress.artifacts["bootstrap_t"]).tobytes()


def test_the_draws_depend_on_the_chunking() -> None:
    """Why a part computes whole chunks of the single run: the same draws computed in chunks of another size
    differ in their last bits (BLAS products of other shapes), so free part boundaries would match by luck."""
    data = frame(2_000, seed=3)
    differ = []
    for case in ("hc_weights_ci", "cluster_fixed_effect_ci"):
        params = params_of(case)
        ctx = context(data)
        design = crve_jobs.bootstrap_design(params, ctx)
        options = crve_jobs.bootstrap_options(params, crve_jobs.single_restrictions(params, design.names), ctx)
        arrays = crve_jobs.device_data(design, np)
        small, large = (wild_cluster_bootstrap(np, arrays, dataclasses.replace(options, draw_chunk=size)).t_boot
                        for size in (7, 1_000))  # fmt: skip
        np.testing.assert_allclose(small, large, rtol=1e-12)
        differ.append(small.tobytes() != large.tobytes())
    assert any(differ)


def test_a_range_of_draws_must_be_whole_chunks_of_the_run() -> None:
    schedule = DrawSchedule(enumerated=False, reps=100, chunk=7)
    for draws in (range(0, 100), range(7, 14), range(98, 100), range(100, 100), range(0, 0)):
        schedule.check(draws)
    for draws in (range(3, 14), range(0, 10), range(0, 101), range(0, 14, 2)):
        with pytest.raises(ValueError, match="not whole chunks"):
            schedule.check(draws)
    assert schedule.n_chunks == 15 and schedule.draws_of(range(14, 15)) == range(98, 100)
    assert schedule.draws_of(range(15, 15)) == range(100, 100)


def test_the_finish_refuses_parts_that_do_not_cover_the_draws_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    params, data = params_of("hc_weights_ci"), frame(N_OBS, seed=5)
    use_small_chunks(monkeypatch, params, data)
    outputs = split_run(params, data, 3, order_seed=2)[2]
    with pytest.raises(ValueError, match="do not cover"):
        finished(params, [outputs[0], outputs[2], outputs[1]])
    with pytest.raises(ValueError, match="do not cover"):
        finished(params, outputs[:2])
    specs = [{"part": [0, 0]}, {"part": [1, 2]}, {"part": [0, 2]}]
    with pytest.raises(ValueError, match=r"not parts 0 \.\. 1 in order"):
        chunks.finish(params, local_context(device="cpu"), specs, [{}, outputs[0], outputs[1]])


@pytest.mark.parametrize(("n_chunks", "parts"), [(29, 4), (10, 3), (7, 7), (3, 5), (100, 8)])
def test_part_chunks_cover_every_chunk_once_in_order(n_chunks: int, parts: int) -> None:
    ranges = [chunks.part_chunks(n_chunks, parts, index) for index in range(parts)]
    assert [chunk for part in ranges for chunk in part] == list(range(n_chunks))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_values_round_trip_through_json_exactly() -> None:
    value = {
        "floats": [0.1 + 0.2, -0.0, float("nan"), float("inf"), 1e-310],
        "numpy": (np.float64(-2.5e-300), np.int64(7), np.bool_(True)),
        "arrays": [np.array([[1.0, np.nan], [-0.0, 3.0]]), np.arange(4, dtype=np.int64), np.empty(0)],
        "plain": {"bool": False, "int": 3, "str": "map", "none": None},
    }
    back = chunks.value_from_json(json.loads(json.dumps(chunks.value_to_json(value))))
    floats = back["floats"]
    assert [type(item) for item in floats] == [float] * 5 and floats[0] == 0.1 + 0.2 and np.isnan(floats[2])
    assert str(floats[1]) == "-0.0" and floats[3] == float("inf") and floats[4] == 1e-310
    assert [type(item) for item in back["numpy"]] == [np.float64, np.int64, np.bool_]
    assert back["numpy"][0] == np.float64(-2.5e-300) and isinstance(back["numpy"], tuple)
    for ours, theirs in zip(back["arrays"], value["arrays"], strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and ours.tobytes() == theirs.tobytes()
    assert back["plain"] == value["plain"]


# -- the plan --------------------------------------------------------------------------------------------

GPU_LIKE = types.ModuleType("cupy_like")  # a namespace that is not NumPy: the plan's GPU rules
HC_JOB = {"dataset_id": "d", "formula": "y ~ x1 + x2 + x3", "cluster": None, "weights": "w", "param": "x1",
          "reps": 9_999}  # fmt: skip


def plan(xp: Any = np, rows: int | None = 10_000_000, parts: int = 4, min_weights: float = 3e10,
         **changes: Any) -> list[dict[str, Any]] | None:  # fmt: skip
    return chunks.plan(BootstrapParams.model_validate({**HC_JOB, **changes}), xp, rows, parts, min_weights)


def test_a_large_heteroskedastic_job_is_split_into_parts_of_its_draw_chunks() -> None:
    # On the GPU: chunks of 64e6 // 10^7 = 6 draws, 1,667 of them, 417 / 417 / 417 / 416 per part.
    specs = plan(GPU_LIKE)
    assert specs == [{"part": [index, 4], "backend": "cupy", "size": size}
                     for index, size in enumerate([417, 417, 417, 416])]  # fmt: skip
    # On NumPy (chunks of one draw here) and with fewer parts than asked where the chunks are few.
    assert [spec["part"] for spec in plan(np, parts=3)] == [[0, 3], [1, 3], [2, 3]]
    assert [spec["size"] for spec in plan(GPU_LIKE, rows=40_000_000, reps=999)] == [250, 250, 250, 249]
    # At least MIN_CHUNKS_PER_PART = 2 of the single run's chunks a part: 7 chunks of one draw make 3 parts, 3 none.
    assert [spec["size"] for spec in plan(GPU_LIKE, rows=40_000_000, reps=7, min_weights=0)] == [3, 2, 2]
    assert plan(GPU_LIKE, rows=40_000_000, reps=3, min_weights=0) is None


def test_the_plan_runs_whole_what_does_not_pay_or_cannot_be_split() -> None:
    assert plan(rows=1_000_000) is None  # 10^6 x 9,999 = 10^10 weights: below 3 x 10^10
    assert plan(rows=None) is None  # the dataset's rows are unknown
    assert plan(parts=1) is None
    assert plan(family=["x1 = 0", "x2 = 0"], param=None) is None
    assert plan(formula="y ~ x1 | x2 ~ x3", cluster="g", param="x2", weights=None) is None  # IV: the WRE bootstrap
    assert plan(cluster="g") is None  # an uploaded dataset's clusters are not known before it is read
    assert plan(GPU_LIKE, formula="y ~ x1 + x2 | f") is None  # on a GPU the demeaning adds with atomics
    assert plan(np, formula="y ~ x1 + x2 | f") is not None


def test_a_synthetic_job_is_planned_from_its_clusters() -> None:
    synthetic = {"dataset_id": None, "synthetic": {"n_obs": 1_000_000, "n_clusters": 200_000, "n_regressors": 3,
                                                   "seed": 1}, "weights": None, "reps": 199_999}  # fmt: skip
    specs = plan(GPU_LIKE, rows=None, cluster="cluster", **synthetic)
    assert specs is not None and len(specs) == 4  # 2 x 10^5 clusters x 199,999 draws: 4 x 10^10 weights
    assert plan(GPU_LIKE, rows=None, cluster="cluster", **{**synthetic, "reps": 99_999}) is None  # 2 x 10^10
    assert plan(GPU_LIKE, rows=None, cluster=["cluster", "fe"], **synthetic) is None  # cells within clusters
    assert plan(np, rows=None, cluster="cluster", bootcluster="x1", **synthetic) is None  # H unknown


# -- on the GPU ------------------------------------------------------------------------------------------

GPU_CASES = {
    # 2 x 10^6 rows: the heteroskedastic draws in the GPU's own chunks (64e6 // 2e6 = 32 draws, 7 of them here),
    # through the split-K products of many rows.
    "hc_weights_ci": ({"formula": "y ~ x1 + x2", "cluster": None, "weights": "w", "param": "x1", "reps": 199},
                      2_000_000),
    "hc_joint": ({"formula": "y ~ x1 + x2", "cluster": None, "hypothesis": ["x1 = 0", "x2 = 0.3"], "reps": 99},
                 2_000_000),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_a_split_gpu_run_gives_the_single_gpu_run_exactly(case: str) -> None:
    cp = pytest.importorskip("cupy")
    spec, n_obs = GPU_CASES[case]
    params = BootstrapParams.model_validate({"dataset_id": "dataset_id", "seed": 17, **spec})
    assert chunks.plan(params, cp, n_obs, 2, 0) is not None  # a design the plan fans out on a GPU
    data = frame(n_obs, seed=11)
    single, single_progress = single_run(params, data, cp)
    again, _ = single_run(params, data, cp)
    assert again == single  # the premise: the single GPU run gives the same bits twice
    for n_parts in (2, 3):
        result, progress, outputs = split_run(params, data, n_parts, order_seed=n_parts, xp=cp)
        assert chunks.part_from_json(outputs[0]).schedule.n_chunks >= 4
        assert result == single, n_parts
        assert_same_artifacts(progress, single_progress)


@pytest.mark.gpu
def test_a_split_gpu_run_of_one_cluster_dimension_gives_the_single_gpu_run_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clustered design the plan fans out on a GPU (one dimension, bootstrapped by itself, no fixed effect):
    20,000 clusters on the device (above HOST_CELLS), chunks of 64e6 // 20,000 = 3,200 draws."""
    cp = pytest.importorskip("cupy")
    rs = np.random.default_rng(2)
    n_obs, n_clusters = 400_000, 20_000
    g = np.arange(n_obs) % n_clusters
    x1 = rs.standard_normal(n_obs) + rs.standard_normal(n_clusters)[g]
    y = 0.5 * x1 + rs.standard_normal(n_clusters)[g] + rs.standard_normal(n_obs)
    data = pd.DataFrame({"y": y, "x1": x1, "g": g})
    params = BootstrapParams.model_validate({"dataset_id": "dataset_id", "formula": "y ~ x1", "cluster": "g",
                                             "param": "x1", "r": 0.5, "reps": 9_999, "seed": 3})  # fmt: skip
    single, single_progress = single_run(params, data, cp)
    result, progress, outputs = split_run(params, data, 2, order_seed=1, xp=cp)
    assert chunks.part_from_json(outputs[0]).schedule.n_chunks == 4
    assert result == single
    assert_same_artifacts(progress, single_progress)
