"""CUDA kernels equal the NumPy twin (float64, 1e-10) on fresh random inputs; numerics imports only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernels.backend import get_namespace, to_host
from kernels.dualcontrol.bellman import ArrayBellman, CudaBellman, MinimiserSettings
from kernels.dualcontrol.grid import make_state_grid
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.slabs import SlabBellman
from kernels.dualcontrol.solve import SolveSettings, solve

pytestmark = pytest.mark.gpu

MODEL = ModelParams(alpha=0.3, gamma=0.6, sigma_eps=0.8, delta=0.9, omega=0.5, xbar=1.0, ubar=0.2)
GRID = make_state_grid((-5.0, 7.0, 17), (-3.0, 3.0, 14), (0.05, 2.0, 11), MODEL.xbar, 1.5)


def _pair(nodes: int = 16, minimiser: MinimiserSettings | None = None, interpolation: str = "trilinear"):
    cp = get_namespace("gpu")
    return (
        cp,
        ArrayBellman(MODEL, GRID, nodes, np, minimiser=minimiser, interpolation=interpolation),  # type: ignore[arg-type]
        CudaBellman(MODEL, GRID, nodes, cp, minimiser=minimiser, interpolation=interpolation),  # type: ignore[arg-type]
    )


def test_grid_has_the_node_at_mu_zero_the_kernel_locates() -> None:
    """The mu axis (14 nodes, symmetric) is shifted so that a node sits at 0; the kernel reads the shifted
    z_lo, so V at mu' = 0 exactly is that node's value on both paths (checked through the sweeps below)."""
    assert 0.0 in GRID.mu.nodes() and GRID.mu.anchor == 0.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_locator_picks_numpys_cell_on_and_beside_every_node(dtype: type) -> None:
    """bellman.cu's locate (a float32 guess settled by comparisons with the nodes) = grid.locate (a binary
    search) on every axis of the grid: exact indices, weights to rounding, at the nodes, one ulp either side,
    the anchor mu = 0, beyond the ends and at random points."""
    from kernels import cuda
    from kernels.dualcontrol import bellman
    from kernels.dualcontrol.grid import locate

    cp = get_namespace("gpu")
    kernel = cuda.function(bellman._SOURCE, "dc_locate", bellman.kernel_defines(dtype))
    rng = _fresh_rng()
    grid = make_state_grid((-9.0, 11.0, 256), (-4.0, 4.0, 255), (0.02, 2.0, 129), MODEL.xbar, 2.0)
    for axis in grid.axes:
        nodes = axis.nodes().astype(dtype)
        values = np.concatenate([nodes, np.nextafter(nodes, -np.inf), np.nextafter(nodes, np.inf), [0.0],
                                 rng.uniform(axis.lo - 2.0, axis.hi + 2.0, 100_000)]).astype(dtype)
        # a float32 subnormal (one ulp beside the node 0) the device flushes to 0 in float32: left out
        values = values[(values == 0) | (np.abs(values) >= np.finfo(dtype).tiny)]
        expected_index, expected_weight = locate(axis, nodes, values, np)
        index = cp.empty(values.size, dtype=cp.int32)
        weight = cp.empty(values.size, dtype=dtype)
        kernel(((values.size + 127) // 128,), (128,),
               (cp.asarray(np.asarray(axis.device_params(), dtype=dtype)), cp.asarray(nodes), np.int32(axis.size),
                cp.asarray(values), np.int64(values.size), index, weight))
        np.testing.assert_array_equal(to_host(index), expected_index)
        np.testing.assert_allclose(to_host(weight), expected_weight, rtol=0, atol=4 * np.finfo(dtype).eps)


@pytest.mark.parametrize("interpolation", ["trilinear", "quadratic"])
def test_banded_and_plain_point_orders_compute_every_point_of_their_range_once(interpolation: str) -> None:
    """The kernels take a range's points in the banded order (bellman.cu point_of) when it starts and ends on band
    boundaries (the whole grid: 17 x nodes are a band of 16 and one of 1), in plain order otherwise: either way
    each point of the range gets its own Q, the whole sweep's bit for bit."""
    cp = get_namespace("gpu")
    band = 16 * GRID.shape[1] * GRID.shape[2]
    total = int(np.prod(GRID.shape))
    rng = _fresh_rng()
    values = cp.asarray(rng.uniform(5.0, 50.0, GRID.shape))
    controls = cp.asarray(rng.normal(0.0, 2.0, GRID.shape))
    whole = to_host(CudaBellman(MODEL, GRID, 16, cp, interpolation=interpolation).evaluate(values, controls))  # type: ignore[arg-type]
    for first, count in ((0, total), (band, total - band), (0, band), (5, band), (band - 3, 40)):
        operator = CudaBellman(MODEL, GRID, 16, cp, interpolation=interpolation, point_range=(first, count))  # type: ignore[arg-type]
        assert operator._banded == (first % band == 0 and (first + count) in (band, total))
        got = to_host(operator.evaluate(values, controls)).reshape(-1)
        np.testing.assert_array_equal(got[first : first + count], whole.reshape(-1)[first : first + count])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pair_kernel_gives_numpys_curvature_bit_for_bit(dtype: type) -> None:
    """dc_pair's (V, V_xx) pairs = V and grid.x_curvature's second differences, to the bit (the same expressions),
    on the non-uniform x nodes, end planes included."""
    from kernels.dualcontrol.grid import x_curvature

    cp = get_namespace("gpu")
    operator = CudaBellman(MODEL, GRID, 16, cp, dtype=dtype, interpolation="quadratic")  # type: ignore[arg-type]
    values = _fresh_rng().uniform(5.0, 50.0, GRID.shape).astype(dtype)
    paired = to_host(operator._values_arg(cp.asarray(values)))
    assert paired.shape == (*GRID.shape, 2) and paired.dtype == dtype
    np.testing.assert_array_equal(paired[..., 0], values)
    np.testing.assert_array_equal(paired[..., 1], x_curvature(values, GRID.x.nodes().astype(dtype), np))


def _fresh_rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh inputs each run; a failure prints the values it saw


@pytest.mark.parametrize("interpolation", ["trilinear", "quadratic", "residual"])
def test_policy_sweep_kernel_equals_numpy_on_random_values_and_controls(interpolation: str) -> None:
    cp, ref, gpu = _pair(interpolation=interpolation)
    rng = _fresh_rng()
    values = rng.uniform(5.0, 50.0, GRID.shape)
    controls = rng.normal(0.0, 2.0, GRID.shape)  # wide: many nodes fall beyond the cuboid
    expected = ref.evaluate(values, controls)
    got = to_host(gpu.evaluate(cp.asarray(values), cp.asarray(controls)))
    np.testing.assert_allclose(got, expected, rtol=1e-10)


@pytest.mark.parametrize("interpolation", ["trilinear", "quadratic", "residual"])
def test_improvement_kernel_equals_numpy_on_a_smooth_random_value_function(interpolation: str) -> None:
    """A smooth V (a random quadratic-plus-sine surface) so that the golden-section path does not hinge on
    rounding-level ties between the two implementations' objective values."""
    cp, ref, gpu = _pair(minimiser=MinimiserSettings(scan_points=8, golden_iterations=30), interpolation=interpolation)
    rng = _fresh_rng()
    x, mu, s = GRID.mesh(np)
    c = rng.uniform(0.2, 1.0, 6)
    values = np.ascontiguousarray(
        10.0 + c[0] * (x - 1) ** 2 + c[1] * mu**2 + c[2] * s + c[3] * np.sin(x * mu) + c[4] * x * s + c[5] * mu * s
    )
    previous = np.ascontiguousarray(rng.normal(0.0, 1.0, GRID.shape))
    v_ref, u_ref = ref.improve(values, previous)
    v_gpu, u_gpu = (to_host(a) for a in gpu.improve(cp.asarray(values), cp.asarray(previous)))
    np.testing.assert_allclose(v_gpu, v_ref, rtol=1e-10)
    # Controls: where the objective is flat at its minimum, rounding-level differences in Q (FMA, summation
    # order) steer golden section to another point of the same flat bottom; the values above still agree.
    same_control = np.isclose(u_gpu, u_ref, rtol=1e-8, atol=1e-8)
    assert same_control.mean() > 0.95
    assert np.abs(u_gpu - u_ref).max() < 1e-4


@pytest.mark.parametrize(
    ("policy", "interpolation"),
    [
        ("inert", "trilinear"),
        ("myopic", "trilinear"),
        ("optimal", "trilinear"),
        ("myopic", "residual"),
        ("optimal", "quadratic"),
    ],
)
def test_full_solve_on_gpu_equals_numpy(policy: str, interpolation: str) -> None:
    cp = get_namespace("gpu")
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        1e-6,
        quadrature_nodes=12,
        evaluation_sweeps=10,
        coarse_to_fine=True,
        coarsest_size=8,
        interpolation=interpolation,  # type: ignore[arg-type]
    )
    cpu = solve(MODEL, GRID, settings, np)
    gpu = solve(MODEL, GRID, settings, cp)
    assert cpu.converged and gpu.converged
    assert [lv.iterations for lv in cpu.levels] == [lv.iterations for lv in gpu.levels]
    np.testing.assert_allclose(to_host(gpu.value), cpu.value, rtol=1e-10)


@pytest.mark.parametrize(("policy", "tolerance"), [("myopic", 1e-9), ("optimal", 1e-6)])
def test_anderson_evaluation_on_gpu_equals_numpy_to_the_solver_tolerance(policy: str, tolerance: float) -> None:
    """The same solve code with Anderson-mixed evaluation on CuPy (fused kernels, cuBLAS Gram products) and
    NumPy: the mixing coefficients differ at rounding level, so the iterates need not match bit for bit, but
    each run lies within tol/2 of max |V| of the fixed point, taken from a NumPy solve to 1e-11 (the operators
    agree to 1e-10), so the two agree within tol."""
    cp = get_namespace("gpu")
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        tolerance,
        quadrature_nodes=12,
        evaluation_sweeps=20,
        coarse_to_fine=True,
        coarsest_size=8,
        interpolation="quadratic",
        evaluation="anderson",
    )
    cpu = solve(MODEL, GRID, settings, np)
    gpu = solve(MODEL, GRID, settings, cp)
    tight = solve(MODEL, GRID, SolveSettings(**{**settings.__dict__, "tolerance": 1e-11, "evaluation_sweeps": 300}), np)
    assert cpu.converged and gpu.converged and tight.converged
    assert [lv.shape for lv in cpu.levels] == [lv.shape for lv in gpu.levels]
    scale = np.abs(tight.value).max()
    assert np.abs(to_host(gpu.value) - cpu.value).max() <= tolerance * scale
    assert np.abs(to_host(gpu.value) - tight.value).max() <= 0.5 * tolerance * scale


def test_float32_kernel_tracks_float64() -> None:
    cp = get_namespace("gpu")
    settings64 = SolveSettings("myopic", 1e-5, quadrature_nodes=12)
    settings32 = SolveSettings("myopic", 1e-5, quadrature_nodes=12, dtype=np.float32)
    v64 = to_host(solve(MODEL, GRID, settings64, cp).value)
    v32 = to_host(solve(MODEL, GRID, settings32, cp).value)
    assert v32.dtype == np.float32
    np.testing.assert_allclose(v32, v64, rtol=2e-4)


def test_state_evaluator_and_monte_carlo_on_the_gpu_equal_numpy() -> None:
    """The job's Monte Carlo runs its one-step minimisations at paths x states points on the device: the
    evaluator's Q, interpolation and minimiser, and the simulated costs, agree with the host run. A smooth V
    (as above) so that no golden-section path hinges on a rounding-level tie."""
    from kernels.dualcontrol.report import StateEvaluator, simulation_rules
    from kernels.dualcontrol.simulate import simulate_costs

    cp = get_namespace("gpu")
    x, mu, s = GRID.mesh(np)
    values = np.ascontiguousarray(10.0 + 0.5 * (x - 1) ** 2 + 0.3 * mu**2 + 0.7 * s + 0.2 * np.sin(x * mu))
    policy = np.ascontiguousarray(-0.3 * mu * (x - 1.0) / (s + mu * mu + 0.5))
    states = np.array([[1.0, 0.5, 0.5], [0.0, 0.0, 1.5], [3.0, -1.0, 0.2]])
    host = StateEvaluator(MODEL, GRID, values, 12, "quadratic")
    device = StateEvaluator(MODEL, GRID, cp.asarray(values), 12, "quadratic", cp)
    rng = _fresh_rng()
    px, pmu, ps, pu = (rng.uniform(lo, hi, 500) for lo, hi in ((-6, 8), (-3.5, 3.5), (0.03, 2.2), (-2, 2)))
    np.testing.assert_allclose(to_host(device.q(*(cp.asarray(a) for a in (px, pmu, ps, pu)))),
                               host.q(px, pmu, ps, pu), rtol=1e-10)
    control_h, value_h = host.minimise(px, pmu, ps)
    control_d, value_d = device.minimise(*(cp.asarray(a) for a in (px, pmu, ps)))
    np.testing.assert_allclose(to_host(value_d), value_h, rtol=1e-10)
    # the argmin is known to the golden section's last cell (REPORT_MINIMISER: about (hi - lo) / 64 x 0.618^24,
    # ~1e-6 here) where Q is flat; the H100 run found one of 500 states 2.5e-7 apart (its Q equal to 1e-10)
    np.testing.assert_allclose(to_host(control_d), control_h, rtol=0, atol=1e-5)
    runs = {}
    for xp, evaluator, grid_policy in ((np, host, policy), (cp, device, cp.asarray(policy))):
        rules = {name: simulation_rules(MODEL, name, evaluator, grid_policy) for name in ("optimal", "myopic")}
        runs[xp.__name__] = simulate_costs(MODEL, states, {k: v[0] for k, v in rules.items()},
                                           {k: v[1] for k, v in rules.items()}, 64, 40, seed=5, xp=xp)
    # the optimal control is a golden-section argmin (its cell ~1e-8 wide): the two backends' controls differ
    # there at about 1e-9, and the path costs that sum them over 40 periods at 1e-9 (measured on the H100: 1.2e-9)
    np.testing.assert_allclose(runs["cupy"].costs["myopic"].mean, runs["numpy"].costs["myopic"].mean, rtol=1e-10)
    np.testing.assert_allclose(runs["cupy"].costs["optimal"].mean, runs["numpy"].costs["optimal"].mean, rtol=1e-8)
    # the difference (about 0.02) carries the optimal cost's absolute gap (1e-8 at costs near 9; H100: 1.04e-8)
    np.testing.assert_allclose(runs["cupy"].differences[("myopic", "optimal")].mean,
                               runs["numpy"].differences[("myopic", "optimal")].mean, rtol=0, atol=1e-7)


def _device_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


needs_two_gpus = pytest.mark.skipif(_device_count() < 2, reason="needs two or more GPUs")


def _smooth_values(rng: np.random.Generator) -> np.ndarray:
    x, mu, s = GRID.mesh(np)
    c = rng.uniform(0.2, 1.0, 4)
    return np.ascontiguousarray(10.0 + c[0] * (x - 1) ** 2 + c[1] * mu**2 + c[2] * s + c[3] * np.sin(x * mu))


@needs_two_gpus
@pytest.mark.parametrize("interpolation", ["trilinear", "quadratic", "residual"])
def test_sweeps_in_slabs_over_several_gpus_are_the_one_gpu_sweeps_bit_for_bit(interpolation: str) -> None:
    """issue 19: each GPU computes its slab of the grid's points with the one-GPU kernels, so the gathered
    sweeps are the same bits, for every slab count up to the host's GPUs (2,618 points: uneven slabs), and
    chained sweeps (each one's output the next one's input, on the pools' recycled buffers) stay equal."""
    cp = get_namespace("gpu")
    minimiser = MinimiserSettings(scan_points=8, golden_iterations=30)
    one = CudaBellman(MODEL, GRID, 16, cp, minimiser=minimiser, interpolation=interpolation)  # type: ignore[arg-type]
    rng = _fresh_rng()
    values = cp.asarray(_smooth_values(rng))
    policy = cp.asarray(rng.normal(0.0, 2.0, GRID.shape))  # wide: many nodes fall beyond the cuboid
    expected_sweep = one.evaluate(values, policy)
    expected_q, expected_u = one.improve(values, policy)
    expected_first_q, expected_first_u = one.improve(values, None)
    for slabs in range(2, _device_count() + 1):
        many = SlabBellman(MODEL, GRID, 16, cp, minimiser=minimiser, interpolation=interpolation, slabs=slabs)  # type: ignore[arg-type]
        assert many.devices == tuple(range(slabs))
        assert np.array_equal(to_host(many.evaluate(values, policy)), to_host(expected_sweep))
        q, u = many.improve(values, policy)
        assert np.array_equal(to_host(q), to_host(expected_q)) and np.array_equal(to_host(u), to_host(expected_u))
        q, u = many.improve(values, None)
        assert np.array_equal(to_host(q), to_host(expected_first_q))
        assert np.array_equal(to_host(u), to_host(expected_first_u))
        v_one = v_many = values
        for _ in range(30):
            v_one, v_many = one.evaluate(v_one, policy), many.evaluate(v_many, policy)
        assert np.array_equal(to_host(v_many), to_host(v_one))


@needs_two_gpus
@pytest.mark.parametrize(
    ("policy", "interpolation", "dtype"),
    [("optimal", "quadratic", np.float64), ("myopic", "residual", np.float64), ("optimal", "trilinear", np.float32)],
)
def test_solve_over_several_gpus_equals_the_one_gpu_solve(policy: str, interpolation: str, dtype: type) -> None:
    cp = get_namespace("gpu")
    gpus = _device_count()
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        1e-6 if dtype == np.float64 else 1e-4,
        quadrature_nodes=12,
        evaluation_sweeps=10,
        dtype=dtype,
        interpolation=interpolation,  # type: ignore[arg-type]
    )
    one = solve(MODEL, GRID, settings, cp)
    # every level spread, however small (the service keeps 2^18 points per GPU)
    many = solve(MODEL, GRID, replace(settings, gpus=gpus, min_points_per_gpu=1), cp)
    assert many.converged == one.converged and (one.converged or dtype == np.float32)
    assert [lv.gpus for lv in one.levels] == [1] and [lv.gpus for lv in many.levels] == [gpus]
    assert [lv.iterations for lv in many.levels] == [lv.iterations for lv in one.levels]
    assert [h.get("criterion") for h in many.history] == [h.get("criterion") for h in one.history]
    for name in ("value", "policy"):
        got, expected = to_host(getattr(many, name)), to_host(getattr(one, name))
        assert float(np.abs(got - expected).max()) <= 1e-12, name  # the design gives 0: the same bits
        assert np.array_equal(got, expected), name


def test_more_gpus_than_the_host_has_are_refused_before_any_work() -> None:
    cp = get_namespace("gpu")
    asked = _device_count() + 1
    settings = SolveSettings("myopic", 1e-6, quadrature_nodes=12, gpus=asked)
    with pytest.raises(ValueError, match=f"gpus = {asked} spreads the Bellman sweeps over {asked} GPUs"):
        solve(MODEL, GRID, settings, cp)
