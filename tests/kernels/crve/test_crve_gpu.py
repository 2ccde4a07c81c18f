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


@pytest.mark.parametrize(("k", "m", "dispersion"), [(2, 5, 0.0), (8, 32, 0.0), (5, 70, 0.0), (4, 40, 1.2)])
def test_cgm_kernel_equals_the_numpy_generator(cp, k: int, m: int, dispersion: float) -> None:
    seed = _fresh_seed()
    sizes = mc.lognormal_sizes(13, m, dispersion, seed) if dispersion else None  # unbalanced: 1 to ~300 rows
    design = mc.Design(n_clusters=13, cluster_size=m, n_regressors=k, seed=seed, sizes=sizes)
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


def _regression_panel(seed: int, n_obs: int = 3_000) -> dict[str, np.ndarray]:
    rs = np.random.default_rng(seed)
    state = rs.integers(0, 25, n_obs)
    state[:25] = np.arange(25)
    firm = state * 8 + rs.integers(0, 8, n_obs)
    firm[:200] = np.arange(200)
    state[:200] = np.arange(200) // 8
    year = rs.integers(0, 12, n_obs)
    region = rs.integers(0, 7, n_obs)
    x = rs.normal(size=(n_obs, 3)) + rs.normal(size=(25, 3))[state]
    y = x @ [0.5, -0.2, 0.1] + rs.normal(size=200)[firm] + rs.normal(size=12)[year] + rs.normal(size=n_obs)
    return {"x": x, "y": y, "firm": firm, "state": state, "year": year, "region": region,
            "w": rs.uniform(0.2, 3.0, n_obs)}  # fmt: skip


# (fixed effects, cluster dimensions, weighted, restrictions): the configurations of issue 14.
REGRESSION_CASES = {
    "two FE, nested and crossing": (["firm", "year"], ["state"], False, ["x1 = 0.4"]),
    "two FE, map": (["firm", "year"], ["state"], False, ["x1 - x2 = 0.5"]),
    "three FE, weights": (["firm", "year", "region"], ["state"], True, ["x1 + 2*x2 = 0"]),
    "two-way clusters": (["firm", "year"], ["state", "year"], False, ["x2 = -0.1"]),
    "three-way clusters, weights": ([], ["state", "year", "region"], True, ["x1 = 0.5"]),
    "joint": (["firm", "year"], ["state", "region"], True, ["x1 = 0.5", "x2 = -0.2", "x3 = 0"]),
    "heteroskedastic": (["year"], [], True, ["x1 = 0.5"]),
}


@pytest.mark.parametrize("case", list(REGRESSION_CASES))
def test_regressions_of_issue_14_agree_on_gpu(cp, case: str) -> None:
    from kernels.crve.hypothesis import parse_restrictions

    effects, clusters, weighted, hypothesis = REGRESSION_CASES[case]
    columns = _regression_panel(_fresh_seed() % 2**32)
    names = ["x1", "x2", "x3"]
    restrictions = parse_restrictions(hypothesis, names)
    method = "map" if case.endswith("map") else "auto"
    options = BootstrapOptions(restrictions=restrictions, reps=999, weights_type="webb", seed=11,
                               fixef_method=method, fixef_tol=1e-12)  # fmt: skip

    def run(xp):
        def codes(name):
            return xp.asarray(columns[name]), int(columns[name].max()) + 1

        cluster_list = [codes(name) for name in clusters]
        effect_list = [codes(name) for name in effects]
        data = BootstrapData(
            x=xp.asarray(columns["x"]), y=xp.asarray(columns["y"]),
            cluster=cluster_list[0][0] if cluster_list else None,
            n_clusters=cluster_list[0][1] if cluster_list else None,
            fe=effect_list[0][0] if effect_list else None, n_fe=effect_list[0][1] if effect_list else None,
            more_clusters=cluster_list[1:], more_fe=effect_list[1:], names=names,
            weights=xp.asarray(columns["w"]) if weighted else None,
        )  # fmt: skip
        return wild_cluster_bootstrap(xp, data, options)

    try:
        cpu = run(np)
    except ValueError as error:  # a three-way variance can be negative on some draws of the data: refused alike
        assert "not positive" in str(error)
        with pytest.raises(ValueError, match="not positive"):
            run(cp)
        return
    gpu = run(cp)
    np.testing.assert_allclose(gpu.coefficients, cpu.coefficients, rtol=1e-10)
    np.testing.assert_allclose(gpu.covariance, cpu.covariance, rtol=1e-9, atol=1e-12 * np.abs(cpu.covariance).max())
    np.testing.assert_allclose(gpu.t_boot, cpu.t_boot, rtol=1e-8, atol=1e-10)
    assert gpu.p_values == pytest.approx(cpu.p_values, abs=2.0 / 999)  # a draw within rounding of t may flip
    assert gpu.n_singletons == cpu.n_singletons and gpu.n_obs == cpu.n_obs
    if cpu.conf_int is not None:
        np.testing.assert_allclose(gpu.conf_int, cpu.conf_int, rtol=1e-7)


@pytest.mark.parametrize(
    "case", ["two FE, nested and crossing", "three FE, weights", "two-way clusters", "joint", "heteroskedastic"]
)
def test_regressions_with_the_algebra_on_the_device(cp, case: str, monkeypatch) -> None:
    """Many cells keep the operator's algebra on the device: forced here on the small cases."""
    from kernels.crve import bootstrap

    monkeypatch.setattr(bootstrap, "HOST_CELLS", 0)
    test_regressions_of_issue_14_agree_on_gpu(cp, case)


def test_a_family_of_restrictions_agrees_on_gpu(cp) -> None:
    from kernels.crve.bootstrap import wild_bootstrap_family
    from kernels.crve.hypothesis import parse_restrictions
    from kernels.crve.inference import romano_wolf_p_values

    columns = _regression_panel(_fresh_seed() % 2**32)
    names = ["x1", "x2", "x3"]
    family = [parse_restrictions([text], names) for text in ("x1 = 0.5", "x2 = 0", "x1 - x3 = 0.4")]

    def run(xp):
        data = BootstrapData(x=xp.asarray(columns["x"]), y=xp.asarray(columns["y"]),
                             cluster=xp.asarray(columns["state"]), n_clusters=25, fe=xp.asarray(columns["year"]),
                             n_fe=12, names=names)  # fmt: skip
        outcomes = wild_bootstrap_family(xp, data, BootstrapOptions(reps=999, seed=3, conf_int=False), family)
        t_boot = np.column_stack([o.t_boot for o in outcomes])
        return t_boot, romano_wolf_p_values(np.array([o.t_stat for o in outcomes]), t_boot)

    (gpu_boot, gpu_p), (cpu_boot, cpu_p) = run(cp), run(np)
    np.testing.assert_allclose(gpu_boot, cpu_boot, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(gpu_p, cpu_p, atol=2.0 / 1000)  # a draw within rounding of |t| may flip


@pytest.mark.parametrize("host_cells", [10_000, 0])
def test_crv3_agrees_on_gpu(cp, host_cells: int, monkeypatch) -> None:
    from kernels.crve import bootstrap

    monkeypatch.setattr(bootstrap, "HOST_CELLS", host_cells)
    columns = _regression_panel(_fresh_seed() % 2**32)

    def run(xp):
        data = BootstrapData(x=xp.asarray(columns["x"]), y=xp.asarray(columns["y"]),
                             cluster=xp.asarray(columns["state"]), n_clusters=25, fe=xp.asarray(columns["firm"]),
                             n_fe=200, more_clusters=[(xp.asarray(columns["firm"] // 2), 100)])  # fmt: skip
        return wild_cluster_bootstrap(xp, data, BootstrapOptions(param=1, reps=99, conf_int=False, crv3=True))

    gpu, cpu = run(cp), run(np)
    np.testing.assert_allclose(gpu.covariance_crv3, cpu.covariance_crv3, rtol=1e-9)


def test_heteroskedastic_bootstrap_with_many_rows_agrees_on_gpu(cp) -> None:
    """200,000 observations, each its own bootstrap cluster: the split-K contractions and column sums."""
    rs = np.random.default_rng(_fresh_seed() % 2**32)
    n_obs = 200_000
    x = np.column_stack([np.ones(n_obs), rs.normal(size=(n_obs, 2))])
    y = x @ [1.0, 0.3, 0.0] + rs.normal(size=n_obs) * (1 + np.abs(x[:, 1]))
    weights = rs.uniform(0.5, 2.0, n_obs)
    options = BootstrapOptions(param=2, reps=199, seed=4, weights_type="webb")

    def run(xp):
        data = BootstrapData(x=xp.asarray(x), y=xp.asarray(y), cluster=None, weights=xp.asarray(weights))
        return wild_cluster_bootstrap(xp, data, options)

    gpu, cpu = run(cp), run(np)
    np.testing.assert_allclose(gpu.t_boot, cpu.t_boot, rtol=1e-8)
    np.testing.assert_allclose(gpu.standard_errors, cpu.standard_errors, rtol=1e-10)
    np.testing.assert_allclose(gpu.conf_int, cpu.conf_int, rtol=1e-8)


@pytest.mark.parametrize("bootstrap_type", ["13", "31", "33"])
@pytest.mark.parametrize("host_cells", [10_000, 0])
def test_jackknife_variants_agree_on_gpu(cp, bootstrap_type: str, host_cells: int, monkeypatch) -> None:
    from kernels.crve import bootstrap

    monkeypatch.setattr(bootstrap, "HOST_CELLS", host_cells)
    columns = _regression_panel(_fresh_seed() % 2**32)
    options = BootstrapOptions(param=1, r=-0.1, reps=999, seed=6, bootstrap_type=bootstrap_type)

    def run(xp):
        data = BootstrapData(x=xp.asarray(columns["x"]), y=xp.asarray(columns["y"]),
                             cluster=xp.asarray(columns["firm"]), n_clusters=200,
                             bootcluster=xp.asarray(columns["state"]), n_boot_clusters=25,
                             fe=xp.asarray(columns["firm"]), n_fe=200)  # fmt: skip
        return wild_cluster_bootstrap(xp, data, options)

    gpu, cpu = run(cp), run(np)
    np.testing.assert_allclose(gpu.t_boot, cpu.t_boot, rtol=1e-8, atol=1e-10)
    assert gpu.t_stat == pytest.approx(cpu.t_stat, rel=1e-10)
    np.testing.assert_allclose(gpu.conf_int, cpu.conf_int, rtol=1e-7)


def test_iv_wre_bootstrap_agrees_on_gpu(cp) -> None:
    from kernels.crve.iv import IvData, anderson_rubin, iv_wre_bootstrap

    columns = _regression_panel(_fresh_seed() % 2**32)
    x = columns["x"]
    y2 = x[:, 1] + 0.5 * x[:, 2] + 0.3 * columns["y"]
    y = 1.0 + 0.5 * y2 + x[:, 0] + columns["y"]

    def run(xp):
        data = IvData(y=xp.asarray(y), exogenous=xp.asarray(np.column_stack([np.ones(len(y)), x[:, 0]])),
                      endogenous=xp.asarray(y2), instruments=xp.asarray(x[:, 1:]),
                      cluster=xp.asarray(columns["state"]), n_clusters=25)  # fmt: skip
        return iv_wre_bootstrap(xp, data, r=0.4, reps=999, weights_type="webb", seed=2), anderson_rubin(
            xp, data, 0.4, reps=999, weights_type="webb", seed=2)  # fmt: skip

    (gpu, gpu_ar), (cpu, cpu_ar) = run(cp), run(np)
    assert gpu_ar["statistic"] == pytest.approx(cpu_ar["statistic"], rel=1e-9)
    assert gpu_ar["p_value"] == pytest.approx(cpu_ar["p_value"], abs=2.0 / 999)
    np.testing.assert_allclose(gpu.coefficients, cpu.coefficients, rtol=1e-10)
    np.testing.assert_allclose(gpu.t_boot, cpu.t_boot, rtol=1e-8)
    assert gpu.first_stage_f == pytest.approx(cpu.first_stage_f, rel=1e-9)
