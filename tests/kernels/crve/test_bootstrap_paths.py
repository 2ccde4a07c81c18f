"""The bootstrap's special cases are taken, and each gives what the general path gives.

Special cases of :mod:`kernels.crve.bootstrap`: rows used as given without weights or fixed effects (no demeaning,
no copy), one cell per cluster when the variance clusters are the bootstrap clusters (no cell codes, no sums by
cluster), the diagonal operator by broadcasting, and the inference's t distribution through its special
functions. Each is compared with the general path it replaces: the same numbers, on NumPy bit for bit, and on a
GPU (marked ``gpu``) to 1e-10.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from scipy import stats

from kernels.crve import bootstrap, inference
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.hypothesis import Restrictions
from kernels.crve.iv import IvData, anderson_rubin


def _design(n_obs: int, n_clusters: int, k: int, seed: int, unbalanced: bool = False) -> BootstrapData:
    rng = np.random.default_rng(seed)
    if unbalanced:  # cluster sizes from 1 to about 6 N / G rows
        sizes = rng.integers(1, 6 * n_obs // n_clusters, n_clusters)
        cluster = np.repeat(np.arange(n_clusters), sizes)
        rng.shuffle(cluster)
    else:
        cluster = np.sort(rng.integers(0, n_clusters, n_obs))
    cluster = np.unique(cluster, return_inverse=True)[1].astype(np.int64)
    n_obs, n_clusters = cluster.size, int(cluster.max()) + 1
    x = np.column_stack([np.ones(n_obs)] + [rng.normal(size=n_obs) + rng.normal(size=n_clusters)[cluster]
                                            for _ in range(k - 1)])  # fmt: skip
    y = x @ np.r_[1.0, 0.0, np.ones(k - 2)] + rng.normal(size=n_obs) + rng.normal(size=n_clusters)[cluster]
    return BootstrapData(x=x, y=y, cluster=cluster, n_clusters=n_clusters)


def _with_fixed_effects(data: BootstrapData, levels: list[int], seed: int) -> BootstrapData:
    """The design without its intercept column and with crossing fixed effects of ``levels`` levels."""
    rng = np.random.default_rng(seed)
    codes = [rng.integers(0, count, data.y.size).astype(np.int64) for count in levels]
    y = data.y + sum(rng.normal(size=count)[code] for code, count in zip(codes, levels, strict=True))
    return dataclasses.replace(data, x=data.x[:, 1:], y=y, fe=codes[0], n_fe=levels[0],
                               more_fe=list(zip(codes[1:], levels[1:], strict=True)))  # fmt: skip


def _options(**changes: Any) -> BootstrapOptions:
    return BootstrapOptions(**{"param": 1, "reps": 499, "seed": 11, "conf_int": True, **changes})


def _configurations() -> dict[str, tuple[BootstrapData, BootstrapOptions]]:
    plain = _design(1_500, 30, 4, seed=1)
    weights = np.random.default_rng(2).uniform(0.2, 3.0, plain.y.size)
    weights[:7] = 0.0
    two_fe = dataclasses.replace(_with_fixed_effects(plain, [25, 9], seed=4), weights=weights)
    no_clusters = dataclasses.replace(_design(400, 20, 3, seed=7), cluster=None, n_clusters=None)
    joint = Restrictions(("x1 = 0", "x2 = 1"), np.eye(4)[[1, 2]], np.array([0.0, 1.0]))
    return {
        "one-way": (plain, _options()),
        "one-way, webb, WCU": (plain, _options(weights_type="webb", impose_null=False)),
        "weights": (dataclasses.replace(plain, weights=weights), _options()),
        "one fixed effect": (_with_fixed_effects(plain, [25], seed=3), _options(param=0)),
        "two fixed effects, weights": (two_fe, _options(param=0)),
        "joint test": (plain, _options(restrictions=joint, conf_int=False)),
        "unbalanced clusters": (_design(1_200, 40, 3, seed=5, unbalanced=True), _options()),
        "two clusters (enumerated)": (_design(300, 2, 3, seed=6), _options(conf_int=False)),
        "jackknife WCR33": (plain, _options(bootstrap_type="33")),
        "heteroskedastic": (no_clusters, _options(reps=199)),
    }


CONFIGURATIONS = _configurations()


def _fields(outcome: Any) -> dict[str, Any]:
    return {item.name: getattr(outcome, item.name) for item in dataclasses.fields(outcome)}


def _assert_same(fast: Any, general: Any, rtol: float, name: str = "outcome") -> None:
    """The same fields: numbers equal (``rtol`` 0) or within ``rtol``, everything else equal."""
    if isinstance(fast, dict):
        assert fast.keys() == general.keys(), name
        for key, value in fast.items():
            _assert_same(value, general[key], rtol, f"{name}.{key}")
        return
    if isinstance(fast, (list, tuple)) and not isinstance(fast, np.ndarray):
        assert len(fast) == len(general), name
        for index, (value, other) in enumerate(zip(fast, general, strict=True)):
            _assert_same(value, other, rtol, f"{name}[{index}]")
        return
    if fast is None or isinstance(fast, (str, bool)):
        assert fast == general, name
        return
    left, right = np.asarray(fast, dtype=np.float64), np.asarray(general, dtype=np.float64)
    if rtol == 0:
        np.testing.assert_array_equal(left, right, err_msg=name)
        return
    rtol = max(rtol, 1e-7) if name.startswith("outcome.conf_int") else rtol  # a crossing of two curves in r
    scale = float(np.nanmax(np.abs(right), initial=0.0))  # entries near zero against the array's size
    np.testing.assert_allclose(left, right, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=name)


class _Spy:
    """Counts the calls of a function it wraps."""

    def __init__(self, function: Any) -> None:
        self.function, self.calls = function, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(*args, **kwargs)


def _general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell through cell codes and sums by cluster, as when clusters hold several cells."""
    monkeypatch.setattr(bootstrap, "_cells_are_clusters", lambda rows: False)


def test_rows_without_weights_or_fixed_effects_are_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    data, options = CONFIGURATIONS["one-way"]

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("demeaning or dropping singletons without fixed effects")

    monkeypatch.setattr(bootstrap, "demean", refuse)
    monkeypatch.setattr(bootstrap, "drop_singletons", refuse)
    rows = bootstrap._prepare_rows(np, data, options)
    assert rows.x is data.x and rows.y is data.y  # no copy of the N rows
    assert rows.n_singletons == 0 and rows.demeaning is None


@pytest.mark.parametrize("name", ["one-way", "heteroskedastic", "jackknife WCR33"])
def test_one_cell_per_cluster_sums_nothing_by_cluster(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data, options = CONFIGURATIONS[name]
    sums, labels = _Spy(bootstrap.cluster_sums), _Spy(bootstrap._cell_labels)
    monkeypatch.setattr(bootstrap, "cluster_sums", sums)
    monkeypatch.setattr(bootstrap, "_cell_labels", labels)
    setup = bootstrap.bootstrap_setup(np, data, options)
    assert sums.calls == 0 and labels.calls == 0
    assert all(block.diagonal for block in setup.operator.blocks)


def test_the_inference_calls_no_distribution_object(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("scipy.stats distribution method in the inference")

    data, options = CONFIGURATIONS["one-way"]
    setup = bootstrap.bootstrap_setup(np, data, options)
    draws = bootstrap.bootstrap_draws(np, setup, options, None, lambda fraction, stage: None, None)
    for method in ("ppf", "sf", "cdf"):
        monkeypatch.setattr(stats.t, method, refuse)
    monkeypatch.setattr(stats.f, "sf", refuse)
    outcome = bootstrap.bootstrap_inference(setup.inference, draws, options)
    assert outcome.conf_int is not None


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_the_special_cases_give_the_general_paths_numbers(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data, options = CONFIGURATIONS[name]
    fast = _fields(wild_cluster_bootstrap(np, data, options))
    _general_path(monkeypatch)
    _assert_same(fast, _fields(wild_cluster_bootstrap(np, data, options)), rtol=0)


def test_unit_weights_give_the_unweighted_numbers() -> None:
    """Weights of one take the general rows (a mask, sqrt(w) products): exactly the rows as given."""
    data, options = CONFIGURATIONS["one-way"]
    weighted = dataclasses.replace(data, weights=np.ones(data.y.size))
    _assert_same(_fields(wild_cluster_bootstrap(np, data, options)),
                 _fields(wild_cluster_bootstrap(np, weighted, options)), rtol=0)  # fmt: skip


def test_no_demeaning_equals_absorbing_a_one_level_fixed_effect() -> None:
    """The intercept as a regressor (no demeaning) against the same model with the intercept absorbed as a fixed
    effect of one level (demeaned, with its correction in the bootstrap): the same test (Frisch-Waugh-Lovell)."""
    data, options = CONFIGURATIONS["one-way"]
    absorbed = dataclasses.replace(data, x=data.x[:, 1:], fe=np.zeros(data.y.size, dtype=np.int64), n_fe=1)
    plain = wild_cluster_bootstrap(np, data, options)
    demeaned = wild_cluster_bootstrap(np, absorbed, dataclasses.replace(options, param=0))
    np.testing.assert_allclose(demeaned.coefficients, plain.coefficients[1:], rtol=1e-9)
    np.testing.assert_allclose(demeaned.t_boot, plain.t_boot, rtol=1e-8, atol=1e-10)
    assert demeaned.p_values == pytest.approx(plain.p_values, abs=1e-12)
    np.testing.assert_allclose(demeaned.conf_int, plain.conf_int, rtol=1e-8)
    assert demeaned.demeaning is not None and plain.demeaning is None


def test_anderson_rubin_takes_the_special_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """IV's weak-instrument test is a joint bootstrap Wald test on one-way clusters: one cell per cluster."""
    rng = np.random.default_rng(8)
    plain = _design(1_000, 25, 3, seed=9)
    instruments = rng.normal(size=(plain.y.size, 2))
    endogenous = instruments @ np.array([0.8, 0.5]) + rng.normal(size=plain.y.size)
    data = IvData(plain.y + 0.5 * endogenous, plain.x[:, :2], endogenous, instruments, plain.cluster,
                  plain.n_clusters)  # fmt: skip
    fast = anderson_rubin(np, data, 0.5, 499, "rademacher", 3)
    sums = _Spy(bootstrap.cluster_sums)
    monkeypatch.setattr(bootstrap, "cluster_sums", sums)
    assert anderson_rubin(np, data, 0.5, 499, "rademacher", 3) == fast
    assert sums.calls == 0
    _general_path(monkeypatch)
    assert anderson_rubin(np, data, 0.5, 499, "rademacher", 3) == fast


def test_analytic_p_values_and_quantile_are_the_distributions() -> None:
    for df in (1, 2, 9, 49, 999, 10**6):
        for t_stat in (-40.0, -2.5, -1e-9, 0.0, 0.7, 3.1, np.inf):
            values = inference.analytic_p_values(t_stat, df)
            assert values["two-tailed"] == 2 * stats.t.sf(abs(t_stat), df)
            assert values[">"] == stats.t.sf(t_stat, df) and values["<"] == stats.t.cdf(t_stat, df)
        for probability in (0.5, 0.9, 0.95, 0.975, 0.995):
            assert inference.t_quantile(probability, df) == stats.t.ppf(probability, df)


def _reference_t_boot(curve: inference.PValueCurve, r: float) -> np.ndarray:
    d = r - curve.r0
    numer = curve.numer - d * curve.numer1
    sumsq = curve.sumsq - 2 * d * curve.cross + d * d * curve.sumsq1
    if not curve.signed_variance:
        sumsq = np.maximum(sumsq, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return numer / np.sqrt(curve.factor * sumsq)


@pytest.mark.parametrize("signed", [False, True])
def test_the_curves_draws_and_comparisons_round_as_written(signed: bool) -> None:
    rng = np.random.default_rng(10)
    reps = 2_000
    numer, numer1, cross = rng.normal(size=reps), rng.normal(size=reps), rng.normal(size=reps)
    sumsq, sumsq1 = rng.uniform(0.5, 2.0, reps), rng.uniform(0.5, 2.0, reps)
    sumsq[:5] = 0.0  # a draw without variance (0 / 0, NaN) and a few with a negative signed sum
    numer[:2] = 0.0
    cross[:5] = 3.0
    curve = inference.PValueCurve(0.3, 0.1, 0.0, 1.02, numer, sumsq, numer1, cross, sumsq1, "two-tailed", signed)
    for r in (-0.7, 0.0, 0.05, 0.3, 1.9):
        t_boot = curve.t_boot(r)
        np.testing.assert_array_equal(t_boot, _reference_t_boot(curve, r))
        t_stat = (curve.estimate - r) / curve.se
        ties = np.concatenate([t_boot, [t_stat, -t_stat, t_stat * (1 + 1e-13), np.nan]])
        expected = {
            "two": inference._exceed(np, np.abs(ties), abs(t_stat)),
            "above": inference._exceed(np, ties, t_stat),
            "below": inference._exceed(np, -ties, -t_stat),
        }
        for tail, flags in expected.items():
            np.testing.assert_array_equal(inference._exceed_statistic(ties, t_stat, tail), flags)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["one-way", "weights", "two fixed effects, weights", "joint test", "heteroskedastic"])
def test_the_special_cases_on_a_gpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """On CuPy: the special cases against the general path and against NumPy, relative 1e-10."""
    cp = pytest.importorskip("cupy")
    data, options = CONFIGURATIONS[name]
    on_device = BootstrapData(**{item.name: _to_device(cp, getattr(data, item.name))
                                 for item in dataclasses.fields(data)})  # fmt: skip
    fast = _fields(wild_cluster_bootstrap(cp, on_device, options))
    _assert_same(fast, _fields(wild_cluster_bootstrap(np, data, options)), rtol=1e-10)
    _general_path(monkeypatch)
    _assert_same(fast, _fields(wild_cluster_bootstrap(cp, on_device, options)), rtol=1e-10)


def _to_device(cp: Any, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return cp.asarray(value)
    if isinstance(value, list):
        return [tuple(_to_device(cp, item) for item in pair) if isinstance(pair, tuple) else pair for pair in value]
    return value
