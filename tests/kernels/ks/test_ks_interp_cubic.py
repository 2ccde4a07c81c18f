"""The ``cubic`` policy interpolation of kernels/ks/interp.py (local four-point Lagrange in physical k and K,
issue 12) and its CUDA twin ``ks_interpolate`` (method 2 of kernels/ks/interp.cuh).

References independent of the code: polynomials (exactness), SciPy's not-a-knot cubic spline (with four K
nodes the one cubic through them), an explicit refinement study (the error order), the clamped point (edges).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernels import cuda, rng
from kernels.ks.grids import Grids
from kernels.ks.interp import interpolate
from kernels.ks.model import Calibration
from kernels.ks.policy import EulerProblem, PolicySettings, grid_args, initial_policy, method_code, solve_policy

_POINTS_SOURCE = cuda.kernel_source(__file__, "ks_interp_points.cu", headers=["ks/interp.cuh"])
GRIDS = (Grids(), Grids(60, 5.0, 300.0, 3.0, 7, 20.0, 60.0), Grids(12, 0.0, 50.0, 1.0, 5, 1.0, 3.0))


def _table(fun, grids: Grids, planes: int = 1) -> np.ndarray:
    """fun on the grid nodes, scaled by 1 + plane so that a wrong plane shows."""
    values = fun(grids.k[:, None], grids.K[None, :])
    return np.stack([(1.0 + p) * values for p in range(planes)])


def _points(grids: Grids, n: int, seed: int = 7, margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Random points over the grid's box; k uniform in the grid coordinate so every k cell is visited."""
    draws = np.random.default_rng(seed)
    unit = draws.uniform(0.0, 1.0, n) ** grids.spacing_power
    k = grids.k_min + (grids.k_max - grids.k_min) * unit
    capital = draws.uniform(grids.K_min - margin, grids.K_max + margin, n)
    return k, capital


def _cubic(grids: Grids, table: np.ndarray, plane, k, capital) -> np.ndarray:
    return interpolate(np, table, np.broadcast_to(plane, np.shape(k)), k, capital, grids, "cubic")


def _tensor_cubic(grids: Grids, seed: int):
    """A random tensor product of cubics in the scaled variables (x, y) in [0, 1]^2 (no cancellation)."""
    coef = np.random.default_rng(seed).normal(size=(4, 4))

    def fun(k, capital):
        x = (k - grids.k_min) / (grids.k_max - grids.k_min)
        y = (capital - grids.K_min) / (grids.K_max - grids.K_min)
        return sum(coef[p, q] * x**p * y**q for p in range(4) for q in range(4))

    return fun


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("grids", GRIDS)
def test_cubic_is_exact_on_tensor_products_of_cubics(grids: Grids) -> None:
    """Every cell, the first and the last included (shifted stencils), on the polynomial k grid: Catmull-Rom
    in grid coordinates is not exact even on quadratics in k there (checked below for contrast)."""
    fun = _tensor_cubic(grids, seed=grids.k_size)
    table = _table(fun, grids, planes=3)
    k, capital = _points(grids, 20_000)
    plane = np.arange(k.size) % 3
    got = _cubic(grids, table, plane, k, capital)
    want = (1.0 + plane) * fun(k, capital)
    scale = np.abs(table).max()
    assert np.max(np.abs(got - want)) < 1e-12 * scale
    if grids.spacing_power > 1.0:
        quadratic = lambda k, capital: ((k - grids.k_min) / (grids.k_max - grids.k_min)) ** 2 + 0.0 * capital  # noqa: E731
        catmull = interpolate(np, _table(quadratic, grids), np.zeros(k.size, dtype=np.int64), k, capital, grids,
                              "catmull_rom")
        assert np.max(np.abs(catmull - quadratic(k, capital))) > 1e-4


@pytest.mark.parametrize("grids", GRIDS)
def test_cubic_reproduces_the_table_at_the_nodes(grids: Grids) -> None:
    table = np.random.default_rng(3).normal(size=(1, grids.k_size, grids.K_size))
    k, capital = np.meshgrid(grids.k, grids.K, indexing="ij")
    got = _cubic(grids, table, 0, k.ravel(), capital.ravel()).reshape(k.shape)
    np.testing.assert_allclose(got, table[0], rtol=0, atol=1e-12)


def test_short_axes_fall_back_to_the_polynomial_through_all_nodes() -> None:
    """Fewer than four nodes on an axis: the polynomial through all of them (2: linear, 3: quadratic)."""
    two = Grids(2, 0.0, 10.0, 1.0, 2, 1.0, 2.0)
    linear = lambda k, capital: 1.0 + 0.5 * k - 2.0 * capital + 0.25 * k * capital  # noqa: E731
    k, capital = _points(two, 500)
    np.testing.assert_allclose(_cubic(two, _table(linear, two), 0, k, capital), linear(k, capital), rtol=1e-13)
    np.testing.assert_allclose(_cubic(two, _table(linear, two), 0, k, capital),
                               interpolate(np, _table(linear, two), np.zeros(k.size, dtype=np.int64), k, capital, two,
                                           "bilinear"), rtol=1e-13)
    three = Grids(3, 0.0, 10.0, 2.0, 3, 1.0, 2.0)
    quadratic = lambda k, capital: (1.0 + 0.1 * k - 0.03 * k**2) * (2.0 - capital + 0.5 * capital**2)  # noqa: E731
    k, capital = _points(three, 500)
    np.testing.assert_allclose(_cubic(three, _table(quadratic, three), 0, k, capital), quadratic(k, capital),
                               rtol=1e-12)


# ---------------------------------------------------------------- accuracy against independent references


def test_with_four_K_nodes_the_K_filter_is_scipys_not_a_knot_spline() -> None:
    """MMV interpolate with MATLAB's cubic spline; on four K nodes it is the one cubic through them, so the
    default 100 x 4 grid's K direction must equal SciPy's not-a-knot CubicSpline (k on the nodes)."""
    CubicSpline = pytest.importorskip("scipy.interpolate").CubicSpline  # inside: the GPU image may lack SciPy
    grids = Grids()
    table = np.random.default_rng(11).normal(size=(1, grids.k_size, grids.K_size))
    capital = np.random.default_rng(12).uniform(grids.K_min, grids.K_max, 400)
    rows = np.arange(0, grids.k_size, 9)
    spline = CubicSpline(grids.K, table[0, rows, :], axis=1, bc_type="not-a-knot")(capital)  # (rows, points)
    k = np.broadcast_to(grids.k[rows, None], spline.shape)
    got = _cubic(grids, table, 0, k, np.broadcast_to(capital, spline.shape))
    np.testing.assert_allclose(got, spline, rtol=0, atol=1e-12 * np.abs(table).max())


def test_along_k_cubic_is_within_a_small_factor_of_scipys_spline_and_far_better_than_catmull_rom() -> None:
    """A smooth policy-like curve on the default polynomial k grid, K on a node: SciPy's spline in physical k
    (an independent, globally solved reference) against the pointwise filters. Measured: spline 4.5e-6,
    cubic 1.4e-5, bilinear 1.2e-3, catmull_rom 5.1e-3."""
    CubicSpline = pytest.importorskip("scipy.interpolate").CubicSpline
    grids = Grids()
    fun = lambda k, capital: np.log(1.0 + k / 5.0) * (capital / 40.0) ** 0.3  # noqa: E731
    table = _table(fun, grids)
    k = np.linspace(grids.k_min, grids.k_max, 100_001)
    capital = np.full(k.size, grids.K[1])
    exact = fun(k, capital)
    spline = np.max(np.abs(CubicSpline(grids.k, table[0, :, 1])(k) - exact))
    errors = {m: np.max(np.abs(interpolate(np, table, np.zeros(k.size, dtype=np.int64), k, capital, grids, m) - exact))
              for m in ("bilinear", "catmull_rom", "cubic")}
    assert errors["cubic"] < 4.0 * spline
    assert errors["cubic"] < errors["bilinear"] / 50.0 and errors["cubic"] < errors["catmull_rom"] / 50.0


def _max_error(fun, grids: Grids, k: np.ndarray, capital: np.ndarray) -> float:
    table = _table(fun, grids)
    return float(np.max(np.abs(_cubic(grids, table, 0, k, capital) - fun(k, capital))))


def test_error_is_fourth_order_under_refinement() -> None:
    """Halving the spacing divides the maximum error by ~16 (fourth order), along k on the polynomial grid
    (doubling the nodes halves every spacing) and along the uniform K grid (4 -> 7 -> 13 -> 25 nodes)."""
    along_k = lambda k, capital: np.log(1.0 + k / 5.0) + 0.0 * capital  # noqa: E731
    k = np.linspace(0.0, 1000.0, 200_001)
    errors = [_max_error(along_k, Grids(n, 0.0, 1000.0, 7.0, 4, 30.0, 50.0), k, np.full(k.size, 30.0))
              for n in (50, 100, 200, 400)]
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all(ratios > 12.0) and np.all(ratios < 20.0), ratios  # measured 16.6, 16.3, 16.2
    along_K = lambda k, capital: np.exp(-capital / 15.0) + 0.0 * k  # noqa: E731
    capital = np.linspace(30.0, 50.0, 100_001)
    errors = [_max_error(along_K, Grids(4, 0.0, 10.0, 1.0, n, 30.0, 50.0), np.full(capital.size, 5.0), capital)
              for n in (4, 7, 13, 25)]
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all(ratios > 12.0) and np.all(ratios < 20.0), ratios  # measured 12.2, 13.9, 14.9


# ---------------------------------------------------------------- edges, precision, plumbing


def test_points_outside_the_grid_take_the_value_at_the_clamped_point() -> None:
    grids = GRIDS[1]
    table = np.random.default_rng(5).normal(size=(2, grids.k_size, grids.K_size))
    k = np.array([grids.k_min - 3.0, grids.k_max + 50.0, 40.0, 40.0, -1e9, 1e9])
    capital = np.array([35.0, 35.0, grids.K_min - 2.0, grids.K_max + 7.0, 1e-3, 1e9])
    clamped_k = np.clip(k, grids.k_min, grids.k_max)
    clamped_K = np.clip(capital, grids.K_min, grids.K_max)
    for plane in (0, 1):
        np.testing.assert_array_equal(_cubic(grids, table, plane, k, capital),
                                      _cubic(grids, table, plane, clamped_k, clamped_K))
    corners = _cubic(grids, table, 1, np.array([-5.0, 1e6]), np.array([0.0, 1e6]))
    np.testing.assert_allclose(corners, [table[1, 0, 0], table[1, -1, -1]], rtol=0, atol=1e-12)


def test_float32_tables_and_points_stay_float32() -> None:
    grids = Grids()
    fun = _tensor_cubic(grids, seed=2)
    table = _table(fun, grids)
    k, _ = _points(grids, 2_000)
    got = _cubic(grids, table.astype(np.float32), 0, k.astype(np.float32), np.float32(41.5))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, fun(k, 41.5), rtol=0, atol=1e-5 * np.abs(table).max())


def test_method_codes_are_distinct_and_unknown_methods_are_refused() -> None:
    assert [method_code(m) for m in ("bilinear", "catmull_rom", "cubic")] == [0, 1, 2]  # interp.cuh's dispatch
    with pytest.raises(ValueError, match="cubic"):
        method_code("spline")  # type: ignore[arg-type]
    grids = Grids()
    with pytest.raises(ValueError, match="cubic"):
        interpolate(np, np.zeros((1, grids.k_size, grids.K_size)), np.zeros(1, dtype=np.int64), np.ones(1),
                    40.0, grids, "spline")  # type: ignore[arg-type]


def test_the_job_spec_accepts_cubic() -> None:
    from kernels.ks.spec import KSSolveParams

    assert KSSolveParams.model_validate({"interpolation": "cubic"}).interpolation == "cubic"


@pytest.mark.slow
def test_cubic_policy_has_smaller_euler_residuals_off_the_grid_than_catmull_rom() -> None:
    """The point of the method: the same Euler fixed point (a fixed ALM) on a small grid, residuals between
    the k nodes (where the interpolation acts). Measured on 100 x 4 with the JEDC test's Euler statistic:
    log10 mean -4.63 (cubic) against -2.73 (catmull_rom), -3.36 (bilinear); here 40 x 4 for speed."""
    from kernels.ks.policy import euler_residuals

    cal, grids = Calibration(), Grids(k_size=40, K_size=4)
    alm = np.array([0.09762, 0.97266, 0.10140, 0.97301])
    settings = PolicySettings(tolerance=1e-7, max_iterations=20_000)
    k_points = np.linspace(1.0, 100.0, 397)
    medians = {}
    for method in ("catmull_rom", "cubic"):
        problem = EulerProblem(np, cal, grids, method)
        solution = solve_policy(np, problem, alm, initial_policy(np, grids), settings)
        assert solution.converged
        residuals = euler_residuals(np, problem, solution.policy, alm, k_points)
        medians[method] = float(np.nanmedian(np.abs(residuals)))
    assert medians["cubic"] < medians["catmull_rom"] / 10.0, medians


# ---------------------------------------------------------------- the CUDA twin


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_the_point_kernel_compiles_in_both_precisions(tmp_path: Path) -> None:
    """interp.cuh with the new method, compiled to PTX by nvcc through the loader's text (no GPU needed)."""
    code = tmp_path / "ks_interp_points.cu"
    code.write_text(_POINTS_SOURCE.text())
    for dtype in (np.float64, np.float32):
        options = cuda.compile_options(_POINTS_SOURCE, cuda.real_define(dtype))
        done = subprocess.run(["nvcc", "--ptx", "-arch=sm_90", *options, str(code), "-o", os.devnull],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[:500]


def _device_points(cp, grids: Grids, table: np.ndarray, plane: np.ndarray, k: np.ndarray, capital: np.ndarray,
                   method: str, dtype) -> np.ndarray:
    kernel = cuda.function(_POINTS_SOURCE, "ks_interp_points", defines=cuda.real_define(dtype))
    out = cp.empty(k.size, dtype=dtype)
    threads = 128
    kernel(((k.size + threads - 1) // threads,), (threads,),
           (cp.asarray(table, dtype=dtype), cp.asarray(grids.k, dtype=dtype), cp.asarray(plane, dtype=cp.int32),
            cp.asarray(k, dtype=dtype), cp.asarray(capital, dtype=dtype), out, np.int32(k.size),
            *grid_args(grids, dtype), np.int32(method_code(method))))
    return cp.asnumpy(out)


@pytest.mark.gpu
@pytest.mark.parametrize("grids", (*GRIDS, Grids(3, 0.0, 10.0, 2.0, 2, 1.0, 2.0)))
@pytest.mark.parametrize("method", ["bilinear", "catmull_rom", "cubic"])
def test_cuda_twin_equals_numpy(grids: Grids, method: str) -> None:
    cp = pytest.importorskip("cupy")
    seed = int(np.random.SeedSequence().entropy % (2**62))
    n = 50_001
    table = 10.0 + rng.uniform(np, seed, 1, np.arange(4 * grids.k_size * grids.K_size, dtype=np.uint64)).reshape(
        4, grids.k_size, grids.K_size)
    k, capital = _points(grids, n, seed=seed % 1000, margin=0.1 * (grids.K_max - grids.K_min))
    k[:100] = np.linspace(grids.k_min - 1.0, grids.k_max + 1.0, 100)  # the ends and beyond
    plane = (np.arange(n) % 4).astype(np.int64)
    want = interpolate(np, table, plane, k, capital, grids, method)
    got = _device_points(cp, grids, table, plane, k, capital, method, np.float64)
    assert np.max(np.abs(got - want) / np.abs(want)) < 1e-12
    want32 = interpolate(np, table.astype(np.float32), plane, k.astype(np.float32), capital.astype(np.float32), grids,
                         method)
    got32 = _device_points(cp, grids, table, plane, k, capital, method, np.float32)
    # float32: the two twins round differently (FMA contraction), and the cubic's Lagrange weights on the steep
    # end of the polynomial k grid are large and of both signs, so the twins may differ by more than a few ulps
    # (8.7e-5 relative seen on the H100 on these noise tables); what must hold is that the CUDA twin is as
    # accurate as the NumPy one against the float64 result
    error32_numpy = np.max(np.abs(want32 - want) / np.abs(want))
    error32_cuda = np.max(np.abs(got32 - want) / np.abs(want))
    assert error32_cuda <= 4.0 * error32_numpy + 1e-6


@pytest.mark.gpu
def test_euler_kernel_with_cubic_equals_numpy() -> None:
    cp = pytest.importorskip("cupy")
    cal, grids = Calibration(), Grids(k_size=200, K_size=12)
    seed = int(np.random.SeedSequence().entropy % (2**62))
    noise = rng.uniform(np, seed, 1, np.arange(4 * 200 * 12, dtype=np.uint64)).reshape(2, 2, 200, 12)
    start = initial_policy(np, grids) * (1.0 + 0.05 * noise)
    settings = PolicySettings(tolerance=1e-8, max_iterations=400)
    alm = np.array([0.144219, 0.960361, 0.154786, 0.958879])
    ref = solve_policy(np, EulerProblem(np, cal, grids, "cubic"), alm, start, settings)
    got = solve_policy(cp, EulerProblem(cp, cal, grids, "cubic"), alm, cp.asarray(start), settings, use_kernel=True)
    assert got.iterations == ref.iterations
    policy = cp.asnumpy(got.policy)
    assert np.max(np.abs(policy - ref.policy) / np.maximum(np.abs(ref.policy), 1e-3 * np.abs(ref.policy).max())) < 1e-12


@pytest.mark.gpu
def test_panel_kernel_with_cubic_equals_numpy() -> None:
    from kernels.ks.simulate import aggregate_path, initial_employment, simulate_panel

    cp = pytest.importorskip("cupy")
    cal, grids = Calibration(), Grids()
    seed = int(np.random.SeedSequence().entropy % (2**62))
    n, periods = 100_003, 60
    problem = EulerProblem(np, cal, grids, "cubic")
    alm = np.array([0.125503, 0.965100, 0.137609, 0.963268])  # the cubic policy's JEDC fixed point
    policy = solve_policy(np, problem, alm, initial_policy(np, grids), PolicySettings(tolerance=1e-6)).policy
    k0 = 5.0 + 70.0 * rng.uniform(np, seed, 7, np.arange(n, dtype=np.uint64)) ** 2
    e0 = initial_employment(np, cal, seed, n, 0)
    a_path = aggregate_path(cal, seed, periods + 1)
    ref = simulate_panel(np, cal, grids, "cubic", policy, k0, e0, a_path, seed)
    got = simulate_panel(cp, cal, grids, "cubic", cp.asarray(policy), cp.asarray(k0), cp.asarray(e0), a_path, seed,
                         use_kernel=True)
    assert np.max(np.abs(got.capital_path - ref.capital_path) / ref.capital_path) < 1e-12
    assert np.max(np.abs(cp.asnumpy(got.k) - ref.k) / np.maximum(ref.k, 1e-3 * ref.k.max())) < 1e-12
    assert np.array_equal(cp.asnumpy(got.employed), ref.employed)
