"""sccs_analyses split into parts (issue 19): the lead, any number of parts (more parts than analyses too),
computed in any order in separate contexts and passed through JSON, then the finish, give the single run's
result and ``analyses`` artifact bit for bit: one outcome's tables with all exposures, chosen exposures, stacked
outcomes' pairs, and negative and positive controls (calibration)."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kernels.context import JobCache, RunContext, local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import analyses_chunks
from kernels.sccs.analyses_job import load_analyses
from kernels.sccs.spec import SccsAnalysesParams
from tests.kernels.sccs.sccs_helpers import NEGATIVES, POSITIVES, biased_study_tables
from tests.kernels.sccs.test_sccs_outcomes import _stack, _stacked

DATASETS = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}


def _biased() -> dict[str, pd.DataFrame]:
    return biased_study_tables(n_cases=1200, seed=4)


def _stacked_frames() -> dict[str, pd.DataFrame]:
    return _stack(_stacked(), rename_apart=False)


CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "every_exposure_calibrated": (_biased, {
        "negative_controls": NEGATIVES,
        "positive_controls": [{"covariate_id": c, "true_relative_risk": 2.0} for c in POSITIVES],
    }),
    "chosen_exposures_level_90": (_biased, {"exposures": [15, 3, 14, 1], "level": 0.9}),
    "stacked_outcomes_every_pair": (_stacked_frames, {}),
    "stacked_outcomes_chosen_pairs": (_stacked_frames, {
        "pairs": [{"covariate_id": 5, "outcome_id": 2}, {"covariate_id": 1, "outcome_id": 1},
                  {"covariate_id": 7}],
    }),
}  # fmt: skip


def params_of(case: str) -> SccsAnalysesParams:
    return SccsAnalysesParams.model_validate({**DATASETS, **CASES[case][1]})


def context(datasets: dict[str, pd.DataFrame], progress: LocalProgress | None = None,
            cache: JobCache | None = None) -> RunContext:
    return local_context(xp=np, datasets=datasets, progress=progress, cache=cache)


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("timings", "device")}


def single_run(params: SccsAnalysesParams, datasets: dict[str, pd.DataFrame]) -> tuple[dict, LocalProgress]:
    progress = LocalProgress()
    result = run_kind(get_kind(analyses_chunks.KIND), params, context(datasets, progress))
    return comparable(result), progress


def split_run(params: SccsAnalysesParams, datasets: dict[str, pd.DataFrame], parts: int, order_seed: int,
              cache: JobCache | None = None) -> tuple[dict, LocalProgress, list[dict]]:
    """The job as a fan-out computes it: the lead, the parts in a shuffled order, each in a context of its own,
    specs and outputs through JSON text, then the finish in a context of its own."""
    specs = analyses_chunks.plan(covariate_rows=10**9, chunks=parts, min_rows=1)
    assert specs is not None and len(specs) == parts
    lead_spec, lead_output, specs = analyses_chunks.lead(params, context(datasets, cache=cache), specs)
    stored: dict[int, str] = {}
    for index in random.Random(order_seed).sample(range(parts), parts):
        spec = json.loads(json.dumps(specs[index]))
        stored[index] = json.dumps(analyses_chunks.run(params, context(datasets, cache=cache), spec))
    all_specs = [json.loads(json.dumps(lead_spec)), *json.loads(json.dumps(specs))]
    outputs = [json.loads(json.dumps(lead_output))] + [json.loads(stored[index]) for index in sorted(stored)]
    progress = LocalProgress()
    result = analyses_chunks.finish(params, context(datasets, progress, cache), all_specs, outputs)
    return comparable(json.loads(result.model_dump_json())), progress, outputs


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_any_split_of_the_analyses_gives_the_single_run_exactly(case: str, parts: int) -> None:
    datasets = CASES[case][0]()
    params = params_of(case)
    single, single_progress = single_run(params, datasets)
    result, progress, outputs = split_run(params, datasets, parts, order_seed=parts)
    assert result == single
    pd.testing.assert_frame_equal(progress.artifacts["analyses"], single_progress.artifacts["analyses"],
                                  check_exact=True)
    # The parts cover the analyses in order, each with near-equal work (its columns' nonzeros): at most its
    # share plus one analysis's.
    tables, columns = load_analyses(params, context(datasets))
    work = analyses_chunks.work_of(tables.built.data, columns)
    bounds = [output["analyses"] for output in outputs[1:]]
    assert bounds[0][0] == 0 and bounds[-1][1] == len(single["analyses"]) == columns.size
    assert all(work[start:stop].sum() <= work.sum() / parts + work.max() for start, stop in bounds)


def test_more_parts_than_analyses_leave_some_parts_empty_and_the_result_unchanged() -> None:
    datasets = _biased()
    params = params_of("chosen_exposures_level_90")  # four analyses
    single, _ = single_run(params, datasets)
    result, _, outputs = split_run(params, datasets, parts=6, order_seed=1)
    assert result == single
    counts = [output["analyses"][1] - output["analyses"][0] for output in outputs[1:]]
    assert sum(counts) == 4 and counts.count(0) >= 2 and max(counts) >= 1


def test_one_workers_parts_and_finish_build_the_tables_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.sccs import analyses_job

    datasets = _biased()
    params = params_of("every_exposure_calibrated")
    single, _ = single_run(params, datasets)
    built: list[int] = []
    build = analyses_job._load_analyses_data
    monkeypatch.setattr(analyses_job, "_load_analyses_data", lambda ctx: built.append(1) or build(ctx))
    result, _, _ = split_run(params, datasets, parts=3, order_seed=2, cache=JobCache().enter("job"))
    assert result == single
    assert built == [1]  # the first part built the tables; the other parts and the finish reused them


def test_a_small_or_unknown_covariates_table_is_not_split() -> None:
    assert analyses_chunks.plan(covariate_rows=999, chunks=4, min_rows=1000) is None
    assert analyses_chunks.plan(covariate_rows=None, chunks=4, min_rows=1) is None
    assert analyses_chunks.plan(covariate_rows=1000, chunks=3, min_rows=1000) == [
        {"part": [0, 3], "size": 1}, {"part": [1, 3], "size": 1}, {"part": [2, 3], "size": 1}]


def _outputs(datasets: dict[str, pd.DataFrame], params: SccsAnalysesParams, parts: int) -> list[dict[str, Any]]:
    specs = analyses_chunks.plan(covariate_rows=10**9, chunks=parts, min_rows=1)
    assert specs is not None
    _, lead_output, specs = analyses_chunks.lead(params, context(datasets), specs)
    return [lead_output, *(analyses_chunks.run(params, context(datasets), spec) for spec in specs)]


def test_the_finish_refuses_parts_that_do_not_cover_the_analyses_once_in_order() -> None:
    datasets = _biased()
    params = params_of("chosen_exposures_level_90")
    outputs = _outputs(datasets, params, parts=2)
    specs = [{"backend": "numpy"}] * 3
    for broken in ([outputs[0], outputs[2], outputs[1]], [outputs[0], outputs[1]], [outputs[0]]):
        with pytest.raises(ValueError, match="do not cover the job's analyses once, in order"):
            analyses_chunks.finish(params, context(datasets), specs, broken)
    # Parts of another job's analyses (two exposures where this job has four) are refused by their count.
    other = _outputs(datasets, SccsAnalysesParams.model_validate({**DATASETS, "exposures": [1, 2]}), parts=2)
    with pytest.raises(ValueError, match="the chunks fitted 2 analyses and this job has 4"):
        analyses_chunks.finish(params, context(datasets), specs, other)


def test_a_part_planned_on_the_gpu_is_refused_by_a_numpy_worker() -> None:
    datasets = _biased()
    params = params_of("chosen_exposures_level_90")
    with pytest.raises(ValueError, match="planned on cupy and this worker computes on numpy"):
        analyses_chunks.run(params, context(datasets), {"part": [0, 2], "size": 1, "backend": "cupy"})
