"""crve_montecarlo split into chunks (issue 19): the lead, any split of the other blocks into chunks, computed
in any order in separate contexts and passed through JSON, reduces to the single run's result bit for bit."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from kernels.context import local_context, run_kind
from kernels.crve import jobs as crve_jobs
from kernels.crve import montecarlo as mc
from kernels.crve import montecarlo_chunks as chunks
from kernels.crve.spec import MonteCarloParams
from kernels.registry import get_kind

CASES = {
    "crv1": {"n_clusters": 12, "cluster_size": 7, "n_regressors": 3, "replications": 1_003, "seed": 5},
    "crv1_normal_unbalanced": {"n_clusters": 15, "cluster_size": 6, "n_regressors": 2, "replications": 770,
                               "seed": 9, "critical_values": "normal", "cluster_size_dispersion": 0.8},
    "wild_bootstrap": {"n_clusters": 9, "cluster_size": 5, "n_regressors": 3, "replications": 301, "seed": 3,
                       "test": "wild_bootstrap", "bootstrap_reps": 99, "weights_type": "webb"},
    "wild_bootstrap_enumerated": {"n_clusters": 6, "cluster_size": 4, "n_regressors": 2, "replications": 250,
                                  "seed": 4, "test": "wild_bootstrap", "bootstrap_reps": 199},
}


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("timings", "device")}


def chunked_result(params: MonteCarloParams, n_chunks: int, xp: Any, order_seed: int) -> tuple[dict[str, Any], int]:
    """The job as a fan-out computes it: the lead, then the chunks in a shuffled order, each in a context of
    its own, the partials through JSON text, reduced in block order."""
    plan = chunks.plan(params, xp)
    lead = chunks.lead(params, local_context(xp=xp), plan)
    ranges = chunks.split_blocks(plan.n_blocks, n_chunks)
    stored: dict[int, str] = {}
    for index in random.Random(order_seed).sample(range(len(ranges)), len(ranges)):
        partials = chunks.chunk(params, local_context(xp=xp), plan, lead.shift, ranges[index])
        stored[index] = json.dumps([chunks.partial_to_json(partial) for partial in partials])
    in_order = [lead.partial] + [chunks.partial_from_json(item) for index in sorted(stored)
                                 for item in json.loads(stored[index])]
    assert sum(partial.count for partial in in_order) == params.replications
    result = chunks.reduce(params, lead.shift, in_order)
    return json.loads(result.model_dump_json()), plan.n_blocks


BLOCK_REPLICATIONS = 37


def use_small_blocks(monkeypatch: pytest.MonkeyPatch, params: MonteCarloParams) -> None:
    """NumPy blocks of 37 replications, so that small runs have many blocks (the split's unit) and a short
    last one."""
    design = crve_jobs.montecarlo_design(params)
    draws = chunks.plan(params, np).draws
    data = design.n_clusters * design.largest_cluster * (design.n_regressors + 2)
    per_replication = data + 4 * design.n_clusters * draws
    monkeypatch.setattr(crve_jobs, "NUMPY_BLOCK_ELEMENTS", BLOCK_REPLICATIONS * per_replication)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n_chunks", [1, 2, 3, 7, 1_000])
def test_chunked_run_equals_the_single_run_exactly(case: str, n_chunks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    params = MonteCarloParams.model_validate(CASES[case])
    use_small_blocks(monkeypatch, params)
    single = comparable(run_kind(get_kind(chunks.KIND), params, local_context(device="cpu")))
    chunked, n_blocks = chunked_result(params, n_chunks, np, order_seed=n_chunks)
    plan = chunks.plan(params, np)
    assert plan.block == BLOCK_REPLICATIONS and n_blocks >= 5 and params.replications % plan.block != 0
    assert comparable(chunked) == single
    for key in ("mean_estimate", "sd_estimate", "mean_se"):  # the floats themselves, bit for bit
        np.testing.assert_array_equal(np.float64(chunked[key]), np.float64(single[key]))


def test_the_sums_depend_on_the_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the chunks follow the single run's blocks: the same replications summed in other blocks give
    other last bits, so an equality test with free chunk boundaries would be luck, not design."""
    params = MonteCarloParams.model_validate(CASES["crv1"])
    use_small_blocks(monkeypatch, params)
    plan = chunks.plan(params, np)
    compute = mc.block_function(np, crve_jobs.montecarlo_design(params), test_coefficient=1, ssc=True,
                                bootstrap_reps=None, weights_type="rademacher", timer=local_context(device="cpu").timer)
    crit = crve_jobs.montecarlo_critical_values(params)
    per_block = mc.run_blocks(params.replications, plan.block, compute, crit, np, lambda *_: None)
    other = mc.run_blocks(params.replications, plan.block + 13, compute, crit, np, lambda *_: None)
    assert per_block.rejection_rate == other.rejection_rate  # counts do not care
    assert per_block.mean_estimate != other.mean_estimate or per_block.sd_estimate != other.sd_estimate
    assert per_block.mean_estimate == pytest.approx(other.mean_estimate, rel=1e-13)


@pytest.mark.parametrize(("n_blocks", "n_chunks"), [(2, 1), (2, 5), (10, 3), (11, 4), (100, 8), (5, 100)])
def test_split_blocks_covers_every_block_but_the_lead_once_in_order(n_blocks: int, n_chunks: int) -> None:
    ranges = chunks.split_blocks(n_blocks, n_chunks)
    assert [block for blocks in ranges for block in blocks] == list(range(1, n_blocks))
    assert len(ranges) == min(n_chunks, n_blocks - 1)
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_partials_round_trip_through_json_exactly() -> None:
    partial = mc.BlockPartial(7, {0.01: 0, 0.05: 1, 0.10: 2}, 0.1 + 0.2, -1e-300, float("nan"))
    back = chunks.partial_from_json(json.loads(json.dumps(chunks.partial_to_json(partial))))
    assert back.count == 7 and back.rejections == partial.rejections
    assert back.sum_centred == 0.1 + 0.2 and back.sum_centred_sq == -1e-300 and np.isnan(back.sum_se)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["crv1", "wild_bootstrap"])
def test_chunked_gpu_run_equals_the_single_gpu_run_exactly(case: str) -> None:
    cp = pytest.importorskip("cupy")
    # GPU blocks are large: enough replications for several blocks at the job's own block size.
    params = MonteCarloParams.model_validate({**CASES[case], "replications": 3 * chunks.plan(
        MonteCarloParams.model_validate(CASES[case]), cp).block + 17})
    single = comparable(run_kind(get_kind(chunks.KIND), params, local_context(xp=cp)))
    chunked, n_blocks = chunked_result(params, 2, cp, order_seed=1)
    assert n_blocks == 4
    assert comparable(chunked) == single
