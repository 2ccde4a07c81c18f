"""The BSCCS model: conditional Poisson log-likelihood (eq. 2), priors as Cyclops parametrises them, KKT.

Conditional on case ``i``'s event total ``n_i``, its events fall into its eras multinomially with
probabilities ``L_k exp(x_k' b) / S_i``, ``S_i = sum_{k in i} L_k exp(x_k' b)``. With case weights ``c_i``
(1 for a plain fit, 0 for a held-out fold, bootstrap multiplicities), the log-likelihood is

    LL(b) = sum_i c_i [ sum_{k in i} y_k (x_k' b + log L_k) - n_i log S_i ]

(the multinomial log-probability without its combinatorial constant, which does not depend on ``b``).
Priors on the penalised coefficients (``exclude`` ones are flat), with variance ``v`` = sigma^2:

* normal: ``b ~ N(0, v)``: log p = -b^2 / (2 v) - log(2 pi v) / 2;
* laplace: density ``(lambda/2) exp(-lambda |b|)`` with ``lambda = sqrt(2 / v)`` (variance v):
  log p = log(lambda / 2) - lambda |b|;
* none: the conditional Poisson MLE.

All functions work on NumPy or CuPy arrays (the namespace of ``data``). On CuPy every float sum (case sums,
``X b``, ``X' r``, the total) runs in a fixed order (:mod:`kernels.sccs.fixed_sums`: the same bits on every run);
on NumPy in NumPy's own order (the reference). See ``docs/sccs.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.backend import is_numpy
from kernels.sccs import fixed_sums
from kernels.sccs.data import SccsData

PRIOR_KINDS = ("normal", "laplace", "none")


@dataclass(frozen=True)
class Prior:
    """The prior on ``b``: kind, variance sigma^2 and which coefficients it applies to."""

    kind: str
    variance: float
    penalised: np.ndarray  # (J,) bool on the host; False for the excluded covariates

    def __post_init__(self) -> None:
        if self.kind not in PRIOR_KINDS:
            raise ValueError(f"prior kind must be one of {PRIOR_KINDS}, not {self.kind!r}")
        if self.kind != "none" and not (self.variance > 0 and math.isfinite(self.variance)):
            raise ValueError(f"prior variance must be positive and finite, got {self.variance}")

    def with_variance(self, variance: float) -> Prior:
        return Prior(self.kind, float(variance), self.penalised)

    @property
    def laplace_rate(self) -> float:
        return math.sqrt(2.0 / self.variance)


def design_matrix(data: SccsData) -> Any:
    """``X`` as a (K x J) CSC sparse matrix of the data's namespace (built once per data set)."""
    return data.design


def linear_predictor(data: SccsData, beta: Any) -> Any:
    """``X b`` (K,)."""
    xp = data.xp
    beta = xp.asarray(beta, dtype=xp.float64)
    if data.nnz == 0:
        return xp.zeros(data.n_eras, dtype=xp.float64)
    if not is_numpy(xp):
        return fixed_sums.linear_predictor(data, beta)
    return design_matrix(data) @ beta


def case_weights_or_ones(data: SccsData, case_weights: Any | None) -> Any:
    xp = data.xp
    if case_weights is None:
        return xp.ones(data.n_cases, dtype=xp.float64)
    weights = xp.asarray(case_weights, dtype=xp.float64)
    if weights.shape != (data.n_cases,):
        raise ValueError(f"case_weights must have shape ({data.n_cases},), got {weights.shape}")
    return weights


def case_max(data: SccsData, values: Any) -> Any:
    """Per case, the largest of ``values`` over its eras (the shift that keeps log-sum-exp finite)."""
    xp = data.xp
    if not is_numpy(xp):
        return fixed_sums.case_max(data, values)
    top = xp.full(data.n_cases, -xp.inf)
    xp.maximum.at(top, data.era_case, values)
    return top


def case_sums(data: SccsData, values: Any) -> Any:
    """Per case, the sum of ``values`` (K,) over its eras (N,) float64; on the GPU in a fixed order."""
    if not is_numpy(data.xp):
        return fixed_sums.case_sums(data, values)
    return np.bincount(data.era_case, weights=values, minlength=data.n_cases)


def _case_terms(data: SccsData, eta: Any) -> tuple[Any, Any, Any, Any]:
    """``eta + log L``, the per-case shift ``m_i``, ``L exp(eta - m)`` per era and its per-case sums
    ``S_i e^-m_i``."""
    xp = data.xp
    eta_l = eta + (xp.log(data.era_length) if is_numpy(xp) else fixed_sums.log_length(data))
    shift = case_max(data, eta_l)
    scaled = xp.exp(eta_l - shift[data.era_case])
    return eta_l, shift, scaled, case_sums(data, scaled)


def _log_likelihood(data: SccsData, eta_l: Any, weights: Any, shift: Any, sums: Any) -> float:
    xp = data.xp
    log_s = xp.log(sums) + shift
    numerator = case_sums(data, data.era_events * eta_l)
    terms = weights * (numerator - data.case_events * log_s)
    return float(np.sum(terms)) if is_numpy(xp) else fixed_sums.total(terms)


def _gradient(data: SccsData, weights: Any, scaled: Any, sums: Any) -> Any:
    xp = data.xp
    if data.nnz == 0:
        return xp.zeros(data.n_covariates, dtype=xp.float64)
    residual = weights[data.era_case] * (
        data.era_events - data.case_events[data.era_case] * scaled / sums[data.era_case]
    )
    if not is_numpy(xp):
        return fixed_sums.transposed_product(data, residual)
    return design_matrix(data).T @ residual


def era_shares(data: SccsData, beta: Any) -> Any:
    """``p_k = L_k e^(eta_k) / S_i`` per era (K,) at ``beta``: era k's share of its case's expected events (the
    Hessian's weights: :func:`kernels.sccs.precondition.hessian_block`, the profile's first guesses)."""
    _, _, scaled, sums = _case_terms(data, linear_predictor(data, beta))
    return scaled / sums[data.era_case]


def log_likelihood(data: SccsData, beta: Any, case_weights: Any | None = None) -> float:
    """The weighted conditional Poisson log-likelihood ``LL(b)`` above."""
    weights = case_weights_or_ones(data, case_weights)
    eta_l, shift, _, sums = _case_terms(data, linear_predictor(data, beta))
    return _log_likelihood(data, eta_l, weights, shift, sums)


def gradient(data: SccsData, beta: Any, case_weights: Any | None = None) -> Any:
    """``d LL / d b`` (J,) = X' r with ``r_k = c_i (y_k - n_i L_k exp(eta_k) / S_i)``."""
    weights = case_weights_or_ones(data, case_weights)
    _, _, scaled, sums = _case_terms(data, linear_predictor(data, beta))
    return _gradient(data, weights, scaled, sums)


def log_likelihood_and_gradient(data: SccsData, beta: Any, case_weights: Any | None = None) -> tuple[float, Any]:
    """Both of the above from one evaluation of ``X b`` and the case sums."""
    weights = case_weights_or_ones(data, case_weights)
    eta_l, shift, scaled, sums = _case_terms(data, linear_predictor(data, beta))
    return _log_likelihood(data, eta_l, weights, shift, sums), _gradient(data, weights, scaled, sums)


def log_prior(beta: Any, prior: Prior) -> float:
    """``log p(b)`` with its normalising constants (0 under ``none`` and for excluded coefficients)."""
    if prior.kind == "none":
        return 0.0
    b = np.asarray(beta, dtype=np.float64)[prior.penalised]
    if prior.kind == "normal":
        return float(-0.5 * np.sum(b * b) / prior.variance - 0.5 * b.size * math.log(2 * math.pi * prior.variance))
    rate = prior.laplace_rate
    return float(b.size * math.log(rate / 2) - rate * np.sum(np.abs(b)))


def kkt_residual(beta: Any, loglik_gradient: Any, prior: Prior) -> np.ndarray:
    """Per coefficient, how far ``b`` is from optimality of the log-posterior (0 at the MAP).

    Smooth parts: ``|d/db (LL + log p)|``. Laplace at ``b_j = 0``: the subgradient condition
    ``|g_j| <= lambda`` gives the residual ``max(|g_j| - lambda, 0)``.
    """
    b = np.asarray(beta, dtype=np.float64)
    g = np.asarray(loglik_gradient, dtype=np.float64).copy()
    pen = prior.penalised
    if prior.kind == "normal":
        g[pen] -= b[pen] / prior.variance
        return np.abs(g)
    if prior.kind == "laplace":
        rate = prior.laplace_rate
        residual = np.abs(g)
        nonzero = pen & (b != 0)
        residual[nonzero] = np.abs(g[nonzero] - rate * np.sign(b[nonzero]))
        at_zero = pen & (b == 0)
        residual[at_zero] = np.maximum(np.abs(g[at_zero]) - rate, 0.0)
        return residual
    return np.abs(g)
