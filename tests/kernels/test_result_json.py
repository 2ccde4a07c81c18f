"""run_kind's result is valid JSON: an undefined statistic (NaN, an infinity) is stored as null."""

from __future__ import annotations

import json
import math

from kernels.context import local_context, run_kind
from kernels.registry import JobKind, KindExample
from kernels.spec import JobParams, ResultModel


class _Params(JobParams):
    value: float = 1.0


class _Result(ResultModel):
    kind: str = "nan_probe"
    finite: float
    undefined: float
    unbounded: list[float]


def _run(params: _Params, ctx) -> _Result:
    return _Result(finite=params.value, undefined=math.nan, unbounded=[math.inf, -math.inf, 2.0])


def test_non_finite_numbers_in_a_result_become_null() -> None:
    kind = JobKind(name="nan_probe", params_model=_Params, result_model=_Result, run=_run,
                   example=KindExample(params={}), summary="probe")
    result = run_kind(kind, {"value": 3.5}, local_context(device="cpu"))
    assert result["finite"] == 3.5
    assert result["undefined"] is None
    assert result["unbounded"] == [None, None, 2.0]
    json.dumps(result, allow_nan=False)  # strict JSON: what Postgres and the result route accept
