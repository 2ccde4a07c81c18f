"""The small-sample count k of an absorbed fixed effect, nested in or crossing the variance clusters, against
pyfixest and fixest's rule (docs/crve.md, "CRV1 and the small-sample factor").

fixest's default (``ssc(fixef.K = "nested")``, ``K.fixef = "nonnested"`` since fixest 0.13) drops the levels of
a fixed effect nested in the clusters from k but, when every fixed effect is dropped, keeps one parameter for
the constant they absorbed (lrberge/fixest R/VCOV.R: "All FEs are removed, we add 1 for the intercept"):
k = k_x + 1. A crossing fixed effect counts all its F levels: k = k_x + F.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import statsmodels.api as sm
from statsmodels.datasets import grunfeld

from kernels.backend import to_host
from kernels.crve.bootstrap import BootstrapOptions, BootstrapOutcome, wild_cluster_bootstrap
from kernels.crve.formula import design_from_formula
from kernels.crve.jobs import device_data

# pyfixest 0.60.0 (PyPI; statsmodels 0.15.0's grunfeld, 220 rows, 11 firms, 20 years), produced by
#     import pyfixest as pf; from statsmodels.datasets import grunfeld
#     df = grunfeld.load_pandas().data
#     pf.feols("invest ~ value + capital | firm", data=df, vcov={"CRV1": "firm"}).se()
#     pf.feols("invest ~ value + capital | year", data=df, vcov={"CRV1": "firm"}).se()
# pyfixest's default ssc(k_fixef="nonnested") counts k_x + 1 for the fully nested firm effect (citing
# fixest #554), k_x + 20 for the crossing year effect. Before the fix ours gave SE(value) 0.0150736 (k = 2).
PYFIXEST_NESTED_SE = {"value": 0.015108266998570095, "capital": 0.05247240439197664}
PYFIXEST_NESTED_FACTOR = 1.11013825  # printed to 8 decimals: 11/10 * 219/217
PYFIXEST_CROSSING_SE = {"value": 0.01812458975693308, "capital": 0.10131988989890775}
PYFIXEST_COEFFICIENTS = {
    "firm": {"value": 0.11012911902575984, "capital": 0.31003344187500403},
    "year": {"value": 0.11578408226872637, "capital": 0.21662951224913876},
}


def _grunfeld_fit(xp: ModuleType, fe: str, ssc: bool = True) -> tuple[BootstrapOutcome, list[str]]:
    frame = grunfeld.load_pandas().data
    design = design_from_formula(frame, f"invest ~ value + capital | {fe}", ["firm"])
    data = device_data(design, xp)
    outcome = wild_cluster_bootstrap(xp, data, BootstrapOptions(param=0, reps=99, conf_int=False, ssc=ssc, seed=3))
    return outcome, design.names


def test_nested_fixed_effect_counts_one_parameter_as_fixest_and_pyfixest(xp: ModuleType) -> None:
    outcome, names = _grunfeld_fit(xp, "firm")
    assert names == ["value", "capital"]
    assert outcome.fe_nested is True
    assert outcome.n_params_ssc == 2 + 1  # k_x + 1: the constant the nested levels absorbed
    assert outcome.ssc_factor == pytest.approx(11 / 10 * 219 / 217, rel=1e-14)
    assert outcome.ssc_factor == pytest.approx(PYFIXEST_NESTED_FACTOR, abs=1e-8)
    np.testing.assert_allclose(outcome.coefficients, list(PYFIXEST_COEFFICIENTS["firm"].values()), rtol=1e-10)
    np.testing.assert_allclose(outcome.standard_errors, list(PYFIXEST_NESTED_SE.values()), rtol=1e-10)
    assert outcome.se == pytest.approx(PYFIXEST_NESTED_SE["value"], rel=1e-10)
    assert abs(outcome.se - 0.0150736) > 3e-5  # the old count (k = k_x) is measurably different


def test_crossing_fixed_effect_counts_every_level(xp: ModuleType) -> None:
    outcome, _ = _grunfeld_fit(xp, "year")
    assert outcome.fe_nested is False
    assert outcome.n_params_ssc == 2 + 20
    np.testing.assert_allclose(outcome.coefficients, list(PYFIXEST_COEFFICIENTS["year"].values()), rtol=1e-10)
    np.testing.assert_allclose(outcome.standard_errors, list(PYFIXEST_CROSSING_SE.values()), rtol=1e-10)


def test_nested_count_against_the_statsmodels_dummy_regression() -> None:
    """An independent route: OLS on explicit firm dummies (statsmodels counts all K = k_x + F columns), rescaled
    from (N - 1)/(N - k_x - F) to fixest's (N - 1)/(N - k_x - 1)."""
    frame = grunfeld.load_pandas().data
    dummies = (frame["firm"].to_numpy()[:, None] == np.unique(frame["firm"])).astype(float)
    x = frame[["value", "capital"]].to_numpy(dtype=float)
    groups = np.unique(frame["firm"], return_inverse=True)[1]
    fit = sm.OLS(frame["invest"].to_numpy(float), np.column_stack([x, dummies])).fit(
        cov_type="cluster", cov_kwds={"groups": groups}
    )
    n_obs, k_x, n_fe = len(frame), 2, dummies.shape[1]
    expected = fit.bse[:k_x] * np.sqrt((n_obs - k_x - n_fe) / (n_obs - k_x - 1))
    outcome, _ = _grunfeld_fit(np, "firm")
    np.testing.assert_allclose(outcome.standard_errors, expected, rtol=1e-10)


def test_without_ssc_the_count_does_not_matter() -> None:
    nested, _ = _grunfeld_fit(np, "firm", ssc=False)
    assert nested.ssc_factor == 1.0
    np.testing.assert_allclose(
        nested.standard_errors, np.array(list(PYFIXEST_NESTED_SE.values())) / np.sqrt(11 / 10 * 219 / 217), rtol=1e-10
    )


def test_the_bootstrap_t_uses_the_same_factor(xp: ModuleType) -> None:
    """t and every t* carry the same s: with the nested count the t statistic is the pyfixest SE's."""
    outcome, _ = _grunfeld_fit(xp, "firm")
    assert outcome.t_stat == pytest.approx(PYFIXEST_COEFFICIENTS["firm"]["value"] / PYFIXEST_NESTED_SE["value"],
                                           rel=1e-10)
    unscaled, _ = _grunfeld_fit(xp, "firm", ssc=False)
    np.testing.assert_allclose(to_host(outcome.t_boot) * np.sqrt(outcome.ssc_factor), to_host(unscaled.t_boot),
                               rtol=1e-10)
