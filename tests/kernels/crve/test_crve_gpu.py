"""GPU path == NumPy path on fresh random inputs (float64, relative 1e-10). Imports numerics modules only."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kernels.backend import is_numpy
from kernels.crve import montecarlo as mc
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.pairs import pair_statistics
from kernels.crve.weights import draw_weights

pytestmark = pytest.mark.gpu


def _fresh_seed() -> int:
    seed = int.from_bytes(os.urandom(8), "little") >> 1
    print(f"fresh seed {seed}")  # shown on failure, to reproduce
    return seed


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("weights_type", ["rademacher", "webb", "mammen", "norm"])
def test_weights_kernel_draws_the_numpy_numbers(cp, weights_type: str) -> None:
    seed = _fresh_seed()
    gpu = cp.asnumpy(draw_weights(cp, weights_type, seed, 37, 1000, 257, base=12345))
    cpu = draw_weights(np, weights_type, seed, 37, 1000, 257, base=12345)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-14, atol=0)
    batched = cp.asnumpy(mc.replication_weights(cp, weights_type, seed, 11, 99, 5, 3))
    np.testing.assert_allclose(batched, mc.replication_weights(np, weights_type, seed, 11, 99, 5, 3), rtol=1e-14)
    if weights_type != "norm":
        np.testing.assert_array_equal(gpu, cpu)


@pytest.mark.parametrize(("k", "m"), [(2, 5), (8, 32), (5, 70)])
def test_cgm_kernel_equals_the_numpy_generator(cp, k: int, m: int) -> None:
    design = mc.Design(n_clusters=13, cluster_size=m, n_regressors=k, seed=_fresh_seed())
    xtx_gpu, xty_gpu = mc.cluster_statistics(cp, design, 7, 6)
    xtx_cpu, xty_cpu = mc.cluster_statistics_numpy(np, design, 7, 6)
    np.testing.assert_allclose(cp.asnumpy(xtx_gpu), xtx_cpu, rtol=1e-10, atol=1e-10 * np.abs(xtx_cpu).max())
    np.testing.assert_allclose(cp.asnumpy(xty_gpu), xty_cpu, rtol=1e-10, atol=1e-10 * np.abs(xty_cpu).max())


def test_monte_carlo_blocks_agree(cp) -> None:
    design = mc.Design(n_clusters=20, cluster_size=16, n_regressors=4, seed=_fresh_seed())
    gpu = mc.crv1_block(cp, *mc.cluster_statistics(cp, design, 0, 50), design.n_obs, 1, True)
    cpu = mc.crv1_block(np, *mc.cluster_statistics_numpy(np, design, 0, 50), design.n_obs, 1, True)
    np.testing.assert_allclose(cp.asnumpy(gpu.t_stat), cpu.t_stat, rtol=1e-10)
    np.testing.assert_allclose(cp.asnumpy(gpu.se), cpu.se, rtol=1e-10)
    for weights_type in ("rademacher", "webb"):
        g_stats = mc.cluster_statistics(cp, design, 3, 20)
        c_stats = mc.cluster_statistics_numpy(np, design, 3, 20)
        gpu_b = mc.wcr_bootstrap_block(cp, *g_stats, design.n_obs, 2, True, weights_type, 199, design.seed, 3)
        cpu_b = mc.wcr_bootstrap_block(np, *c_stats, design.n_obs, 2, True, weights_type, 199, design.seed, 3)
        np.testing.assert_array_equal(cp.asnumpy(gpu_b.p_bootstrap), cpu_b.p_bootstrap)


@pytest.mark.parametrize(("n_obs", "n_groups", "k", "sort"), [(50_000, 37, 3, False), (20_000, 2000, 8, True)])
def test_pair_statistics_kernel(cp, n_obs: int, n_groups: int, k: int, sort: bool) -> None:
    rs = np.random.default_rng(_fresh_seed())
    x = rs.normal(size=(n_obs, k)) + 3.0
    y = rs.normal(size=n_obs)
    codes = rs.integers(0, n_groups, n_obs)
    if sort:
        codes.sort()
    xtx_gpu, xty_gpu = pair_statistics(cp, cp.asarray(x), cp.asarray(y), cp.asarray(codes), n_groups + 3)
    xtx_cpu, xty_cpu = pair_statistics(np, x, y, codes, n_groups + 3)
    np.testing.assert_allclose(cp.asnumpy(xtx_gpu), xtx_cpu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cp.asnumpy(xty_gpu), xty_cpu, rtol=1e-10, atol=1e-10 * np.abs(xty_cpu).max())


@pytest.mark.parametrize(
    ("case", "impose_null", "weights_type"),
    [("plain", True, "rademacher"), ("plain", False, "norm"), ("bootcluster", True, "webb"), ("fe", True, "mammen")],
)
def test_bootstrap_gpu_equals_numpy(cp, case: str, impose_null: bool, weights_type: str) -> None:
    rs = np.random.default_rng(_fresh_seed())
    n_obs, g_count, k = 30_000, 60, 4
    cluster = np.sort(rs.integers(0, g_count, n_obs))
    cluster[:g_count] = np.arange(g_count)
    x = np.column_stack([np.ones(n_obs), rs.normal(size=(n_obs, k - 1)) + rs.normal(size=(g_count, k - 1))[cluster]])
    y = x @ np.full(k, 0.5) + rs.normal(size=n_obs) + rs.normal(size=g_count)[cluster]
    bootcluster = n_boot = fe = n_fe = None
    if case == "bootcluster":
        bootcluster, n_boot = cluster // 4, 15
    if case == "fe":
        fe = rs.integers(0, 9, n_obs)
        fe[:9] = np.arange(9)
        n_fe, x = 9, x[:, 1:]
    options = BootstrapOptions(param=1, r=0.4, reps=2999, weights_type=weights_type, impose_null=impose_null, seed=3)

    def run(xp):
        move = (lambda a: a) if is_numpy(xp) else (lambda a: None if a is None else xp.asarray(a))
        data = BootstrapData(
            move(x), move(y), move(cluster), g_count, move(bootcluster), n_boot, move(fe), n_fe, names=[]
        )
        return wild_cluster_bootstrap(xp, data, options)

    gpu, cpu = run(cp), run(np)
    np.testing.assert_allclose(gpu.coefficients, cpu.coefficients, rtol=1e-10)
    np.testing.assert_allclose(gpu.standard_errors, cpu.standard_errors, rtol=1e-10)
    np.testing.assert_allclose(gpu.t_boot, cpu.t_boot, rtol=1e-10, atol=1e-12)
    assert gpu.p_values == cpu.p_values
    np.testing.assert_allclose(gpu.conf_int, cpu.conf_int, rtol=1e-10)
