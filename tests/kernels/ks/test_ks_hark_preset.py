"""The ``ks1998`` preset is HARK's Krusell-Smith economy (econ-ark 0.17.2, ``HARK/ConsumptionSaving/
ConsAggShockModel.py``): the same parameters, the same 4 x 4 matrix and the same prices.

Reference numbers are copied from HARK's source (``init_KS_economy``, ``init_KS_agents``) or were computed by
HARK itself (``KrusellSmithEconomy.calc_R_and_W``, ``make_MrkvArray``) and are written out here; HARK is not a
dependency. Why HARK's own solve reports a different answer (mean K 6.68 against 11.5) is a HARK bug, not a
model difference: see docs/ks.md, "Calibrations".
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.ks import model
from kernels.ks.spec import CalibrationSpec

# init_KS_economy / init_KS_agents (econ-ark 0.17.2)
HARK_ECONOMY = {"DiscFac": 0.99, "CRRA": 1.0, "LbrInd": 0.3271, "ProdB": 0.99, "ProdG": 1.01, "CapShare": 0.36,
                "DeprRte": 0.025, "DurMeanB": 8.0, "DurMeanG": 8.0, "SpellMeanB": 2.5, "SpellMeanG": 1.5,
                "UrateB": 0.10, "UrateG": 0.04, "RelProbBG": 0.75, "RelProbGB": 1.25}

# KrusellSmithEconomy().MrkvIndArray, printed by HARK (order BU, BE, GU, GE)
HARK_MRKV_IND = np.array([
    [0.525, 0.35, 0.03125, 0.09375],
    [0.03888888888888889, 0.8361111111111111, 0.00208333333333333, 0.12291666666666666],
    [0.09375, 0.03125, 0.2916666666666667, 0.5833333333333334],
    [0.00911458333333333, 0.11588541666666667, 0.02430555555555556, 0.8506944444444444],
])

# KrusellSmithEconomy.calc_R_and_W at aggregate capital K in macro state s: (K, s, Rnow, Wnow, Mnow), where
# Rnow = 1 + r - delta is the gross return on savings and Mnow = Rnow K + Wnow L aggregate market resources.
HARK_PRICES = [
    (6.68, 0, 1.0233271866595532, 1.9494962125725281, 7.409737796905041),
    (11.5, 0, 1.0091351512739886, 2.3705771385704755, 12.30292844347463),
    (11.5, 1, 1.0112932946105007, 2.362924963601325, 12.371869133390991),
]


def hark_mrkv_ind_array(p: dict[str, float]) -> np.ndarray:
    """KrusellSmithEconomy.make_MrkvArray, line for line: the matrix from durations, spells and relative odds."""
    prob_bg, prob_gb = 1.0 / p["DurMeanB"], 1.0 / p["DurMeanG"]
    prob_bb, prob_gg = 1.0 - prob_bg, 1.0 - prob_gb
    m = np.zeros((4, 4))
    m[0, 1] = prob_bb / p["SpellMeanB"]
    m[0, 0] = prob_bb * (1 - 1.0 / p["SpellMeanB"])
    m[1, 0] = p["UrateB"] / (1.0 - p["UrateB"]) * m[0, 1]
    m[1, 1] = prob_bb - m[1, 0]
    m[2, 3] = prob_gg / p["SpellMeanG"]
    m[2, 2] = prob_gg * (1 - 1.0 / p["SpellMeanG"])
    m[3, 2] = p["UrateG"] / (1.0 - p["UrateG"]) * m[2, 3]
    m[3, 3] = prob_gg - m[3, 2]
    m[0, 2] = p["RelProbBG"] * m[2, 2] / prob_gg * prob_bg
    m[0, 3] = prob_bg - m[0, 2]
    m[1, 2] = (prob_bg * p["UrateG"] - p["UrateB"] * m[0, 2]) / (1.0 - p["UrateB"])
    m[1, 3] = prob_bg - m[1, 2]
    m[2, 0] = p["RelProbGB"] * m[0, 0] / prob_bb * prob_gb
    m[2, 1] = prob_gb - m[2, 0]
    m[3, 0] = (prob_gb * p["UrateB"] - p["UrateG"] * m[2, 0]) / (1.0 - p["UrateG"])
    m[3, 1] = prob_gb - m[3, 0]
    return m


@pytest.fixture(scope="module")
def ks1998() -> model.Calibration:
    return CalibrationSpec.model_validate({"preset": "ks1998"}).to_calibration()


def test_ks1998_preset_has_harks_parameters(ks1998: model.Calibration) -> None:
    h = HARK_ECONOMY
    assert ks1998.beta == h["DiscFac"]
    assert ks1998.gamma == h["CRRA"]
    assert ks1998.alpha == h["CapShare"]
    assert ks1998.delta == h["DeprRte"]
    assert ks1998.l_bar == h["LbrInd"]
    assert ks1998.productivity.tolist() == pytest.approx([h["ProdB"], h["ProdG"]], abs=1e-15)
    assert ks1998.unemployment.tolist() == [h["UrateB"], h["UrateG"]]
    # HARK's unemployed have labour income 0 (lNext is LbrInd only in the employed columns) and no tax
    assert ks1998.mu == 0.0
    assert model.labour_income_factor(ks1998, 0, 0) == 0.0
    assert model.labour_income_factor(ks1998, 1, 1) == h["LbrInd"]


def test_ks1998_transition_is_harks_matrix(ks1998: model.Calibration) -> None:
    built = hark_mrkv_ind_array(HARK_ECONOMY)
    np.testing.assert_allclose(built, HARK_MRKV_IND, rtol=0, atol=1e-15)  # the re-implementation is HARK's
    # the preset holds the DHJJ matrix printed to six decimals: HARK's exact one rounded
    np.testing.assert_allclose(ks1998.transition_matrix, HARK_MRKV_IND, rtol=0, atol=5e-7)
    exact = model.Calibration(**{**ks1998.__dict__, "transition": tuple(map(tuple, HARK_MRKV_IND))})
    np.testing.assert_allclose(model.implied_unemployment(exact), [[0.10, 0.04], [0.10, 0.04]], atol=1e-15)


@pytest.mark.parametrize(("capital", "state", "hark_r", "hark_w", "hark_m"), HARK_PRICES)
def test_prices_equal_harks(ks1998: model.Calibration, capital: float, state: int, hark_r: float, hark_w: float,
                            hark_m: float) -> None:
    """HARK's K is the mean of last period's end-of-period assets, the same capital stock as ours."""
    r = model.interest_rate(np, ks1998, capital, state)
    w = model.wage(np, ks1998, capital, state)
    assert 1.0 + r - ks1998.delta == pytest.approx(hark_r, rel=1e-14)
    assert w == pytest.approx(hark_w, rel=1e-14)
    assert (1.0 + r - ks1998.delta) * capital + w * ks1998.labour[state] == pytest.approx(hark_m, rel=1e-14)
    # an employed agent's cash on hand: HARK's Rnow a + Wnow LbrInd
    cash = model.wealth(np, ks1998, 2.0, capital, state, 1)
    assert cash == pytest.approx(hark_r * 2.0 + hark_w * HARK_ECONOMY["LbrInd"], rel=1e-14)


def test_harks_mean_capital_is_not_stationary(ks1998: model.Calibration) -> None:
    """At HARK's reported mean K 6.68 the return beats the discount rate in both states (beta R > 1), so it is not
    a stationary equilibrium; HARK's own price function (HARK_PRICES) gives the same R."""
    for state in (0, 1):
        gross = 1.0 + model.interest_rate(np, ks1998, 6.68, state) - ks1998.delta
        assert ks1998.beta * gross > 1.013
    assert ks1998.beta * HARK_PRICES[0][2] > 1.013


def test_steady_state_conventions(ks1998: model.Calibration) -> None:
    """Same K/L in the deterministic steady state (HARK's KtoLSS = 37.989...); HARK starts every agent at
    KtoLSS LbrInd = 12.43, we at KtoLSS LbrInd (1 - u_bad) = 11.18 (a starting point, not part of the answer)."""
    assert ks1998.steady_state_ratio == pytest.approx(37.98925353815222, rel=1e-14)
    assert ks1998.steady_state_ratio * ks1998.l_bar == pytest.approx(12.426284832329591, rel=1e-14)
    assert ks1998.steady_state_capital == pytest.approx(12.426284832329591 * 0.9, rel=1e-14)
