"""Every registered kind's example, run through the one wrap-up (``run_kind``): on NumPy in every test run,
and on NumPy and the GPU with the two result JSONs compared leaf by leaf (``gpu`` marker).

The examples are the kinds' own (``JobKind.example``), so a new kind is covered the day it registers.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernels.backend import DeviceChoice
from kernels.context import local_context, namespace_for, run_kind
from kernels.progress import LocalProgress
from kernels.registry import JobKind, registry
from kernels.result_diff import compare_leaves

# GPU and NumPy agree to this relative difference on every leaf (float64 kernels, sums in another order).
TOLERANCE = 1e-9
# A residual at a converged optimum (a KKT gradient norm) is a small difference of large sums: its relative
# error is the sums' rounding divided by the residual, so it is held to the sums' scale instead. So are a value
# iteration's stopping statistic and its MacQueen-Porteus bounds (dual control's history[]: the span of
# V_new - V, ~1e-4 of V ~ 40 near convergence, and V + beta / (1 - beta) times its extremes). With the quadratic
# interpolation GPU and NumPy differ there by up to 1.2e-8 (criterion) and 6.6e-9 (mqp_upper) relative, every
# other leaf of the example within 2e-10 (H100, 2026-11-23).
RESIDUAL_TOLERANCE = 1e-6
RESIDUAL_KEYS = frozenset({"gradient_norm", "criterion", "mqp_upper", "mqp_lower"})

KIND_NAMES = sorted(registry())


def _run(kind: JobKind, device: DeviceChoice) -> tuple[dict[str, Any], LocalProgress]:
    progress = LocalProgress()
    ctx = local_context(xp=namespace_for(kind, device), datasets=kind.example.frames(), progress=progress)
    return run_kind(kind, kind.example.params, ctx), progress


def worst_share(leaves: list[tuple[float, str]]) -> tuple[float, str]:
    """The leaf nearest its tolerance: (relative difference / tolerance, path)."""
    shares = [
        (error / (RESIDUAL_TOLERANCE if path.rsplit(".", 1)[-1] in RESIDUAL_KEYS else TOLERANCE), path)
        for error, path in leaves
    ]
    return max(shares, default=(0.0, "-"))


def test_compare_leaves_catches_what_it_must() -> None:
    base = {"a": 1.0, "b": [1, 2.0], "gradient_norm": 1e-3, "timings": {"total": 1.0}, "device": "cpu"}
    assert worst_share(compare_leaves(base, {**base, "timings": {"x": 5.0}, "device": "H100"}))[0] == 0.0
    assert worst_share(compare_leaves(base, {**base, "a": 1.0 + 2e-9}))[0] > 1.0
    assert worst_share(compare_leaves(base, {**base, "gradient_norm": 1e-3 * (1 + 5e-7)}))[0] < 1.0
    assert max(compare_leaves(base, {**base, "a": 1.5}))[0] == pytest.approx(1 / 3)
    with pytest.raises(AssertionError):
        compare_leaves(base, {**base, "b": [1, 2.0, 3.0]})
    with pytest.raises(AssertionError):
        compare_leaves(base, {**base, "extra": 1})
    with pytest.raises(AssertionError):
        compare_leaves({"n": 3}, {"n": 4})


@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_example_runs_on_numpy_and_stamps_device_and_timings(kind_name: str) -> None:
    kind = registry()[kind_name]
    result, progress = _run(kind, "cpu")
    kind.result_model.model_validate(result)
    assert result["device"] == "cpu"
    stages = {stage: seconds for stage, seconds in result["timings"].items() if stage != "total"}
    assert stages and all(seconds >= 0 for seconds in stages.values()), "the runner timed no stage"
    assert progress.reports[-1] == (1.0, "done")
    fractions = [fraction for fraction, _ in progress.reports]
    assert all(0.0 <= f <= 1.0 for f in fractions)


@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_example_params_and_datasets_fit_the_kind(kind_name: str) -> None:
    kind = registry()[kind_name]
    params = kind.params_model.model_validate(kind.example.params)
    frames = kind.example.frames()
    assert set(frames) <= set(kind.dataset_fields)
    assert set(kind.dataset_ids(params)) <= set(frames), "every dataset field the example sets has a table"


@pytest.mark.gpu
@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_example_gives_the_same_result_on_gpu_and_numpy(kind_name: str) -> None:
    kind = registry()[kind_name]
    gpu, _ = _run(kind, "gpu")
    if kind.host_only:  # nothing to compare: both runs would be NumPy's
        assert gpu["device"] == "cpu", "a host-only kind runs on NumPy whatever the device choice"
        return
    cpu, _ = _run(kind, "cpu")
    assert cpu["device"] == "cpu" and gpu["device"] != "cpu"
    share, leaf = worst_share(compare_leaves(cpu, gpu, kind_name))
    assert share <= 1.0, f"worst leaf {leaf} at {share:.3g} x its tolerance"
