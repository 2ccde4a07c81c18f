"""GPU (CuPy + CUDA kernels) against the NumPy twins, float64 at 1e-12 relative, on fresh random inputs.

Imports numerics modules only (the GPU machine has no pydantic/pandas).
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels import rng
from kernels.ks.grids import Grids
from kernels.ks.model import Calibration
from kernels.ks.policy import EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import aggregate_path, initial_employment, simulate_panel
from kernels.ks.solve import SolveSettings, solve

pytestmark = pytest.mark.gpu

METHODS = ("bilinear", "catmull_rom")
REFERENCE_ALM = np.array([0.144219, 0.960361, 0.154786, 0.958879])


def _cupy():
    import cupy

    return cupy


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300 + np.abs(b).max() * 1e-3)))


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % (2**62))


@pytest.mark.parametrize("method", METHODS)
def test_euler_kernel_equals_numpy(method: str) -> None:
    cp = _cupy()
    cal, grids = Calibration(), Grids(k_size=200, K_size=12)
    seed = _fresh_seed()
    noise = rng.uniform(np, seed, 1, np.arange(4 * 200 * 12, dtype=np.uint64)).reshape(2, 2, 200, 12)
    start = initial_policy(np, grids) * (1.0 + 0.05 * noise)
    settings = PolicySettings(tolerance=1e-8, max_iterations=400)
    alm = REFERENCE_ALM + 0.002 * (rng.uniform(np, seed, 2, np.arange(4, dtype=np.uint64)) - 0.5)
    ref = solve_policy(np, EulerProblem(np, cal, grids, method), alm, start, settings)
    got = solve_policy(cp, EulerProblem(cp, cal, grids, method), alm, cp.asarray(start), settings, use_kernel=True)
    assert got.iterations == ref.iterations
    assert _rel(cp.asnumpy(got.policy), ref.policy) < 1e-12
    # the kernel is not the array code: the same array code on CuPy agrees too
    arr = solve_policy(cp, EulerProblem(cp, cal, grids, method), alm, cp.asarray(start), settings, use_kernel=False)
    assert _rel(cp.asnumpy(arr.policy), ref.policy) < 1e-12


@pytest.mark.parametrize("method", METHODS)
def test_panel_kernel_equals_numpy(method: str) -> None:
    cp = _cupy()
    cal, grids = Calibration(), Grids()
    seed = _fresh_seed()
    n, periods = 200_003, 120  # odd n: partial blocks and the grid-stride tail
    problem = EulerProblem(np, cal, grids, method)
    policy = solve_policy(np, problem, REFERENCE_ALM, initial_policy(np, grids), PolicySettings(tolerance=1e-6)).policy
    k0 = 5.0 + 70.0 * rng.uniform(np, seed, 7, np.arange(n, dtype=np.uint64)) ** 2
    e0 = initial_employment(np, cal, seed, n, 0)
    a_path = aggregate_path(cal, seed, periods + 1)
    ref = simulate_panel(np, cal, grids, method, policy, k0, e0, a_path, seed)
    got = simulate_panel(cp, cal, grids, method, cp.asarray(policy), cp.asarray(k0), cp.asarray(e0), a_path, seed,
                         use_kernel=True)
    assert _rel(got.capital_path, ref.capital_path) < 1e-12
    assert _rel(cp.asnumpy(got.k), ref.k) < 1e-12
    assert np.array_equal(cp.asnumpy(got.employed), ref.employed)
    # float32 panel: same draws, single-precision arithmetic
    got32 = simulate_panel(cp, cal, grids, method, cp.asarray(policy), cp.asarray(k0.astype(np.float32)),
                           cp.asarray(e0), a_path, seed, use_kernel=True)
    assert _rel(got32.capital_path, ref.capital_path) < 1e-4
    assert np.array_equal(cp.asnumpy(got32.employed), ref.employed)


def test_panel_is_deterministic_on_the_gpu() -> None:
    cp = _cupy()
    cal, grids = Calibration(), Grids()
    n, seed = 1_000_000, _fresh_seed()
    policy = cp.asarray(initial_policy(np, grids))
    k0 = cp.full(n, 40.0)
    e0 = initial_employment(cp, cal, seed, n, 0)
    a_path = aggregate_path(cal, seed, 51)
    first = simulate_panel(cp, cal, grids, "catmull_rom", policy, k0, e0, a_path, seed)
    second = simulate_panel(cp, cal, grids, "catmull_rom", policy, k0, e0, a_path, seed)
    np.testing.assert_array_equal(first.capital_path, second.capital_path)


@pytest.mark.parametrize("method", METHODS)
def test_full_solve_gpu_equals_numpy(method: str) -> None:
    cp = _cupy()
    seed = _fresh_seed()
    settings = SolveSettings(n_agents=10_000, periods=300, burn_in=100, tolerance=1e-5, interpolation=method,
                             seed=seed, policy=PolicySettings(tolerance=1e-8), den_haan_periods=200,
                             initial_alm=tuple(REFERENCE_ALM), max_iterations=6)
    ref = solve(np, Calibration(), Grids(), settings)
    got = solve(cp, Calibration(), Grids(), settings)
    assert got.iterations == ref.iterations and got.policy_iterations == ref.policy_iterations
    assert _rel(got.alm, ref.alm) < 1e-10
    assert _rel(got.capital_path, ref.capital_path) < 1e-12
    assert _rel(cp.asnumpy(got.policy), ref.policy) < 1e-11
    assert abs(got.den_haan_max - ref.den_haan_max) < 1e-8
