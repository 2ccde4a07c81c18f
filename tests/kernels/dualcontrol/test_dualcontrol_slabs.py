"""Sweeps in slabs of grid points (issue 19, kernels/dualcontrol/slabs.py) on NumPy: every slab computes its
own points only, and the assembled sweep is the whole sweep bit for bit (the GPU twin of this: several GPUs
against one, in test_dualcontrol_gpu.py)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from kernels.dualcontrol.bellman import ArrayBellman, MinimiserSettings
from kernels.dualcontrol.grid import make_state_grid
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.slabs import SlabBellman, level_gpus, slab_bounds
from kernels.dualcontrol.solve import SolveSettings, solve

MODEL = ModelParams(alpha=0.3, gamma=0.6, sigma_eps=0.8, delta=0.9, omega=0.5, xbar=1.0, ubar=0.2)
# 5 x planes of 7 x 6 points: 210 points, so 4 slabs (52/53 points) and 7 slabs (30) cut planes, and 11 slabs
# (19/20 points) are more slabs than x planes
GRID = make_state_grid((-5.0, 7.0, 5), (-3.0, 3.0, 7), (0.05, 2.0, 6), MODEL.xbar, 1.5)
NODES = 8
MINIMISER = MinimiserSettings(scan_points=5, golden_iterations=12)
INTERPOLATIONS = ["trilinear", "quadratic", "residual"]


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A smooth value function (so the minimiser's probes differ well above rounding) and a wide policy."""
    rng = np.random.default_rng(seed)
    x, mu, s = GRID.mesh(np)
    c = rng.uniform(0.2, 1.0, 4)
    values = np.ascontiguousarray(10.0 + c[0] * (x - 1) ** 2 + c[1] * mu**2 + c[2] * s + c[3] * np.sin(x * mu))
    return values, rng.normal(0.0, 2.0, GRID.shape)


def test_slab_bounds_cover_the_points_once_in_order_with_sizes_one_apart() -> None:
    for n_points, slabs in ((210, 4), (210, 11), (7, 7), (1, 1), (10**8 + 3, 8)):
        bounds = slab_bounds(n_points, slabs)
        assert len(bounds) == slabs and bounds[0][0] == 0
        assert all(first + count == nxt for (first, count), (nxt, _) in pairwise(bounds))
        assert bounds[-1][0] + bounds[-1][1] == n_points
        assert max(c for _, c in bounds) - min(c for _, c in bounds) <= 1
    with pytest.raises(ValueError, match="cannot be cut into 8 slabs"):
        slab_bounds(7, 8)
    with pytest.raises(ValueError, match="cannot be cut into 0 slabs"):
        slab_bounds(7, 0, unit=3)


def test_slab_bounds_cut_at_band_boundaries_while_there_are_enough_bands() -> None:
    # 17 x nodes in bands of 16 over 14 x 11 (mu, Sigma): 2 bands, the second of one x plane
    band = 16 * 14 * 11
    assert slab_bounds(17 * 14 * 11, 2, band) == [(0, band), (band, 14 * 11)]
    for n_bands, slabs in ((16, 2), (16, 3), (17, 4), (5, 5)):
        bounds = slab_bounds(n_bands * 1000 - 7, slabs, 1000)  # the last band short
        assert all(first % 1000 == 0 for first, _ in bounds) and bounds[0][0] == 0
        assert all(first + count == nxt for (first, count), (nxt, _) in pairwise(bounds))
        assert bounds[-1][0] + bounds[-1][1] == n_bands * 1000 - 7
        assert max(-(-c // 1000) for _, c in bounds) - min(c // 1000 for _, c in bounds) <= 1
    # fewer bands than slabs: cut anywhere, sizes one point apart
    assert slab_bounds(2 * 1000, 3, 1000) == slab_bounds(2 * 1000, 3)
    with pytest.raises(ValueError, match="cannot be cut into 0 slabs"):
        slab_bounds(7, 0)


def test_levels_spread_only_while_every_gpu_keeps_enough_points() -> None:
    assert level_gpus(256**3, 4) == 4
    assert level_gpus(64**3, 4) == 1  # 2^18 points: one GPU's worth
    assert level_gpus(128**3, 16) == 8
    assert level_gpus(100, 4, min_points_per_gpu=30) == 3
    assert level_gpus(100, 1, min_points_per_gpu=1) == 1


def test_the_array_sweep_does_not_depend_on_how_points_are_batched() -> None:
    """Q at a point is the same bits whichever batch (chunk, slab) it is computed in: the quadrature sum is a
    row sum, not a BLAS gemv (whose rounding of a row depends on where the batch starts)."""
    values, u = _inputs(1)
    whole = ArrayBellman(MODEL, GRID, NODES, np, interpolation="quadratic").q_values(values, u)
    for chunk_points in (1, 3, 17, 64):
        chunked = ArrayBellman(MODEL, GRID, NODES, np, chunk_entries=chunk_points * NODES, interpolation="quadratic")
        assert np.array_equal(chunked.q_values(values, u), whole)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("slabs", [2, 4, 7, 11])
def test_slabbed_policy_sweep_is_the_whole_sweep_bit_for_bit(interpolation: str, slabs: int) -> None:
    values, policy = _inputs(2)
    whole = ArrayBellman(MODEL, GRID, NODES, np, interpolation=interpolation)
    slabbed = SlabBellman(MODEL, GRID, NODES, np, interpolation=interpolation, slabs=slabs)  # type: ignore[arg-type]
    assert np.array_equal(slabbed.evaluate(values, policy), whole.evaluate(values, policy))


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("slabs", [3, 11])
@pytest.mark.parametrize("with_previous", [False, True])
def test_slabbed_bellman_sweep_is_the_whole_sweep_bit_for_bit(
    interpolation: str, slabs: int, with_previous: bool
) -> None:
    values, previous = _inputs(3)
    previous = previous if with_previous else None
    kwargs = {"minimiser": MINIMISER, "interpolation": interpolation}
    q_whole, u_whole = ArrayBellman(MODEL, GRID, NODES, np, **kwargs).improve(values, previous)  # type: ignore[arg-type]
    q_slab, u_slab = SlabBellman(MODEL, GRID, NODES, np, slabs=slabs, **kwargs).improve(values, previous)  # type: ignore[arg-type]
    assert np.array_equal(q_slab, q_whole) and np.array_equal(u_slab, u_whole)


def test_each_slab_computes_its_own_points_only() -> None:
    """Outside its slab an operator's Q is the stand-in u^2 (so a slab costs its share of a sweep); inside,
    the true Q."""
    values, policy = _inputs(4)
    slabbed = SlabBellman(MODEL, GRID, NODES, np, slabs=3)
    true_q = ArrayBellman(MODEL, GRID, NODES, np).evaluate(values, policy)
    for slab in slabbed.slabs:
        own = np.zeros(GRID.shape, dtype=bool)
        slab.of(own)[...] = True
        q = slab.operator.evaluate(values, policy)
        assert np.array_equal(q[own], true_q[own])
        assert np.array_equal(q[~own], policy[~own] ** 2)


def test_heartbeat_reaches_every_slab() -> None:
    values, policy = _inputs(5)
    beats: list[int] = []
    slabbed = SlabBellman(MODEL, GRID, NODES, np, slabs=4)
    slabbed.heartbeat = lambda: beats.append(1)
    slabbed.evaluate(values, policy)
    assert len(beats) == 4  # one chunk per slab at this size


def test_several_gpus_on_the_host_namespace_are_refused_before_any_work() -> None:
    settings = SolveSettings("myopic", 1e-6, quadrature_nodes=NODES, gpus=2)
    with pytest.raises(ValueError, match="gpus = 2 spreads the Bellman sweeps over GPUs: it needs a GPU worker"):
        solve(MODEL, GRID, settings, np)
