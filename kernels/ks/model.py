"""The Krusell-Smith economy (Den Haan, Judd & Juillard 2010 calibration): shocks, prices, incomes.

Conventions: aggregate state a in {0: bad, 1: good} with productivity 1 -/+ Delta_a; idiosyncratic state
eps in {0: unemployed, 1: employed}. The 4 x 4 transition matrix has rows and columns ordered
(bad, u), (bad, e), (good, u), (good, e), i.e. index 2 a + eps. Labour input is l_bar (1 - u_a) (= 1 in the
bad state), the tax is tau_a = mu u_a / (l_bar (1 - u_a)), the unemployed receive mu w. The model facts and
conventions of the whole estimator are collected in docs/ks.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

# Den Haan, Judd & Juillard (2010); verified: each row sums to one and the conditional chains reproduce the
# unemployment rates (the Hatcher-Scheffel OCR prints 0.859604 in the last cell).
DHJJ_TRANSITION: tuple[tuple[float, ...], ...] = (
    (0.525, 0.35, 0.03125, 0.09375),
    (0.038889, 0.836111, 0.002083, 0.122917),
    (0.09375, 0.03125, 0.291667, 0.583333),
    (0.009115, 0.115885, 0.024306, 0.850694),
)


@dataclass(frozen=True)
class Calibration:
    beta: float = 0.99
    gamma: float = 1.0
    alpha: float = 0.36
    delta: float = 0.025
    l_bar: float = 1.0 / 0.9
    mu: float = 0.15
    delta_a: float = 0.01
    u_bad: float = 0.10
    u_good: float = 0.04
    transition: tuple[tuple[float, ...], ...] = field(default=DHJJ_TRANSITION)

    @property
    def transition_matrix(self) -> np.ndarray:
        return np.asarray(self.transition, dtype=np.float64)

    @property
    def productivity(self) -> np.ndarray:
        return np.array([1.0 - self.delta_a, 1.0 + self.delta_a])

    @property
    def unemployment(self) -> np.ndarray:
        return np.array([self.u_bad, self.u_good])

    @property
    def labour(self) -> np.ndarray:
        """Aggregate labour input l_bar (1 - u_a) per aggregate state."""
        return self.l_bar * (1.0 - self.unemployment)

    @property
    def tax(self) -> np.ndarray:
        return self.mu * self.unemployment / self.labour

    @property
    def steady_state_ratio(self) -> float:
        """Deterministic steady-state capital per unit of labour: ((1/beta - 1 + delta) / alpha)^(1/(alpha - 1))."""
        return ((1.0 / self.beta - (1.0 - self.delta)) / self.alpha) ** (1.0 / (self.alpha - 1.0))

    @property
    def steady_state_capital(self) -> float:
        """Deterministic steady state at the bad state's labour input (MMV's starting point for every agent):
        (K / L) l_bar (1 - u_bad), which is K / L itself in the DHJJ calibration (labour 1 in the bad state)."""
        return self.steady_state_ratio * float(self.labour[0])


# Named calibrations (``calibration: {"preset": ...}``): the fields that differ from the DHJJ defaults and a K grid
# that holds the economy's ergodic set. KS 1998 has no unemployment insurance (mu = 0); its labour endowment
# l_bar = 0.3271 is HARK's (KrusellSmithEconomy's LbrInd, "got indirectly from KS"), the rest is the DHJJ
# calibration (same shocks and transition matrix). With mu = 0 the economy is homogeneous of degree one in
# l_bar, so its K grid is DHJJ's [30, 50] scaled by 0.3271 / (1 / 0.9).
CALIBRATION_PRESETS: dict[str, dict[str, float]] = {
    "dhjj2010": {},
    "ks1998": {"mu": 0.0, "l_bar": 0.3271},
}
PRESET_K_GRID: dict[str, tuple[float, float]] = {
    "dhjj2010": (30.0, 50.0),
    "ks1998": (8.8, 14.8),
}


def aggregate_transition(cal: Calibration) -> np.ndarray:
    """P[a, a'] summed over eps' from the joint matrix (the same for eps = u and eps = e in a valid matrix)."""
    p = cal.transition_matrix.reshape(2, 2, 2, 2)  # a, eps, a', eps'
    return p[:, 0, :, :].sum(axis=2)


def conditional_employment(cal: Calibration) -> np.ndarray:
    """E[a, a', eps] = P(eps' = employed | a, a', eps) = pi[(a, eps), (a', e)] / P(a -> a')."""
    p = cal.transition_matrix.reshape(2, 2, 2, 2)
    pa = aggregate_transition(cal)
    out = np.empty((2, 2, 2))
    for a in range(2):
        for a_next in range(2):
            for eps in range(2):
                out[a, a_next, eps] = p[a, eps, a_next, 1] / pa[a, a_next]
    return out


def validate_calibration(cal: Calibration, atol: float = 1e-5) -> None:
    """Raise ValueError when the matrix is not a Markov matrix consistent with u_bad and u_good.

    ``atol`` allows for the six printed decimals of the published matrix.
    """
    p = cal.transition_matrix
    if p.shape != (4, 4) or np.any(p < 0.0):
        raise ValueError("calibration.transition must be a 4 x 4 matrix of non-negative probabilities")
    if np.max(np.abs(p.sum(axis=1) - 1.0)) > atol:
        raise ValueError("calibration.transition rows must sum to one")
    blocks = p.reshape(2, 2, 2, 2)[:, :, :, :].sum(axis=3)  # a, eps, a'
    if np.max(np.abs(blocks[:, 0, :] - blocks[:, 1, :])) > atol:
        raise ValueError("calibration.transition: the aggregate transition must not depend on employment")
    if np.any(aggregate_transition(cal) <= 0.0):
        raise ValueError("calibration.transition: every aggregate transition (bad/good -> bad/good) needs a "
                         "positive probability")
    if not 0.0 < cal.u_good < 1.0 or not 0.0 < cal.u_bad < 1.0:
        raise ValueError("calibration: unemployment rates must lie in (0, 1)")
    implied = implied_unemployment(cal)
    target = cal.unemployment
    if np.max(np.abs(implied - target[None, :])) > 10 * atol:
        raise ValueError(
            "calibration.transition does not reproduce u_bad/u_good: implied next-period rates "
            f"{np.round(implied, 6).tolist()} for targets {target.tolist()}"
        )


def implied_unemployment(cal: Calibration) -> np.ndarray:
    """u'[a, a'] = u_a P(u'|a,a',u) + (1 - u_a) P(u'|a,a',e): equals u_{a'} for a consistent matrix."""
    emp = conditional_employment(cal)
    u = cal.unemployment
    out = np.empty((2, 2))
    for a in range(2):
        for a_next in range(2):
            out[a, a_next] = u[a] * (1.0 - emp[a, a_next, 0]) + (1.0 - u[a]) * (1.0 - emp[a, a_next, 1])
    return out


def interest_rate(xp: ModuleType, cal: Calibration, capital: Any, a: int) -> Any:
    """Rental rate r = alpha a (K / L_a)^(alpha - 1)."""
    return cal.alpha * cal.productivity[a] * (capital / cal.labour[a]) ** (cal.alpha - 1.0)


def wage(xp: ModuleType, cal: Calibration, capital: Any, a: int) -> Any:
    return (1.0 - cal.alpha) * cal.productivity[a] * (capital / cal.labour[a]) ** cal.alpha


def labour_income_factor(cal: Calibration, a: int, eps: int) -> float:
    """Non-capital income per unit wage: (1 - tau_a) l_bar if employed, mu if unemployed."""
    return (1.0 - cal.tax[a]) * cal.l_bar if eps == 1 else cal.mu


def wealth(xp: ModuleType, cal: Calibration, k: Any, capital: Any, a: int, eps: int) -> Any:
    """Cash on hand r k + income w + (1 - delta) k at individual capital k and aggregate capital K."""
    r = interest_rate(xp, cal, capital, a)
    w = wage(xp, cal, capital, a)
    return (r + (1.0 - cal.delta)) * k + labour_income_factor(cal, a, eps) * w
