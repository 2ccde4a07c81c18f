"""The learning-and-control model: parameters and the closed forms that anchor the numerics.

Model (Morozov & Mathur 2011, section 3; Beck & Wieland 2002 without drift):
``x' = alpha + beta u + gamma x + eps``, ``eps ~ N(0, sigma_eps^2)``, ``beta`` unknown with belief
``N(mu, Sigma)``. Cost counted from next period: ``V(S) = min_u E[(x' - xbar)^2 + omega (u - ubar)^2 +
delta V(S')]``. Every closed form here is written against an array namespace so that the same lines serve
NumPy, CuPy and the grid-wide bracket computation of the minimiser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelParams:
    alpha: float
    gamma: float
    sigma_eps: float
    delta: float
    omega: float
    xbar: float
    ubar: float

    def __post_init__(self) -> None:
        # The model's domain: a job's ModelSpec bounds each within it (kernels/dualcontrol/spec.py).
        assert 0.0 <= self.delta < 1.0, f"delta must lie in [0, 1), not {self.delta}"
        assert -1.0 < self.gamma < 1.0, f"gamma must lie in (-1, 1), not {self.gamma}"
        assert self.sigma_eps > 0.0, f"sigma_eps must be positive, not {self.sigma_eps}"
        assert self.omega >= 0.0, f"omega must be non-negative, not {self.omega}"

    @property
    def sigma_eps2(self) -> float:
        return self.sigma_eps * self.sigma_eps

    def inert_coefficients(self) -> tuple[float, float, float]:
        """(A, B, C) of the inert (u = 0) cost-to-go ``V0(x) = A x^2 + B x + C`` (docs/dualcontrol.md).

        Derivation: with u = 0 beliefs never move and ``x' = alpha + gamma x + eps``; matching the x^2, x
        and constant terms of ``V0(x) = (alpha + gamma x - xbar)^2 + sigma_eps^2 + omega ubar^2 +
        delta E V0(x')`` gives the three coefficients below.
        """
        a, g, d = self.alpha, self.gamma, self.delta
        coef_a = g * g / (1.0 - d * g * g)
        coef_b = 2.0 * g * (a - self.xbar + d * coef_a * a) / (1.0 - d * g)
        coef_c = (
            (a - self.xbar) ** 2
            + self.sigma_eps2
            + self.omega * self.ubar**2
            + d * (coef_a * (a * a + self.sigma_eps2) + coef_b * a)
        ) / (1.0 - d)
        return coef_a, coef_b, coef_c


def inert_value(model: ModelParams, x: Any) -> Any:
    """Closed-form cost-to-go of the inert policy u = 0 (independent of the beliefs)."""
    coef_a, coef_b, coef_c = model.inert_coefficients()
    return (coef_a * x + coef_b) * x + coef_c


def loss_coefficients(model: ModelParams, x: Any, mu: Any, sigma: Any) -> tuple[Any, Any, Any]:
    """(a, b, c) of the one-period expected loss ``L(u) = a u^2 + b u + c``.

    ``L(u) = (alpha + mu u + gamma x - xbar)^2 + Sigma u^2 + sigma_eps^2 + omega (u - ubar)^2``: the
    predictive second moment of ``x' - xbar`` plus the control cost.
    """
    gap = model.alpha + model.gamma * x - model.xbar
    a = sigma + mu * mu + model.omega
    b = 2.0 * (mu * gap - model.omega * model.ubar)
    c = gap * gap + model.sigma_eps2 + model.omega * model.ubar**2
    return a, b, c


def one_period_loss(model: ModelParams, x: Any, mu: Any, sigma: Any, u: Any) -> Any:
    """Expected next-period loss of control u at state (x, mu, Sigma), in the direct (unexpanded) form."""
    mean_gap = model.alpha + mu * u + model.gamma * x - model.xbar
    du = u - model.ubar
    return mean_gap * mean_gap + sigma * u * u + model.sigma_eps2 + model.omega * du * du


def myopic_policy(model: ModelParams, x: Any, mu: Any, sigma: Any) -> Any:
    """Cautionary myopic control (paper eq. 11): the minimiser of the one-period loss."""
    return (model.omega * model.ubar - mu * (model.alpha + model.gamma * x - model.xbar)) / (
        sigma + mu * mu + model.omega
    )


def inert_bounds(model: ModelParams, x: Any, mu: Any, sigma: Any, upper: Any, xp: Any) -> tuple[Any, Any]:
    """Interval of controls u with ``L(u) <= upper`` (paper eq. 9 with ``upper`` >= the optimal cost).

    Any optimal control satisfies ``L(u*) <= V*(S) <= V0(S)`` because costs are non-negative, so with
    ``upper = V0`` the interval brackets every minimiser; it is centred on the myopic control.
    """
    a, b, c = loss_coefficients(model, x, mu, sigma)
    centre = -b / (2.0 * a)
    min_loss = c - b * b / (4.0 * a)
    half_width = xp.sqrt(xp.maximum(upper - min_loss, 0.0) / a)
    return centre - half_width, centre + half_width
