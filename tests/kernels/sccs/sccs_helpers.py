"""Small SCCS problems and independent references (scipy.optimize) shared by the SCCS tests."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from kernels.sccs import model, synthetic
from kernels.sccs.data import IntervalTables, SccsData, build_from_tables
from kernels.sccs.model import Prior


def small_problem(seed: int, n_cases: int = 300, n_drugs: int = 8, effect_share: float = 0.5) -> SccsData:
    return synthetic.generate(np, n_cases, n_drugs, seed=seed, effect_share=effect_share, min_eras=3,
                              max_eras=8).data


def build(tables: IntervalTables) -> SccsData:
    return build_from_tables(tables.row_id, tables.stratum_id, tables.time, tables.y, tables.cov_row_id,
                             tables.cov_id, tables.cov_value).data


def negative_log_posterior(data: SccsData, prior: Prior, beta: np.ndarray) -> float:
    return -(model.log_likelihood(data, beta) + model.log_prior(beta, prior))


def scipy_map(data: SccsData, prior: Prior) -> np.ndarray:
    """The MAP by L-BFGS-B: smooth priors directly; Laplace by splitting b = p - q with p, q >= 0."""
    n = data.n_covariates
    pen = prior.penalised
    if prior.kind != "laplace":
        def objective(b: np.ndarray) -> tuple[float, np.ndarray]:
            grad = -model.gradient(data, b)
            value = -model.log_likelihood(data, b)
            if prior.kind == "normal":
                value += 0.5 * np.sum(b[pen] ** 2) / prior.variance
                grad[pen] += b[pen] / prior.variance
            return value, grad

        result = minimize(objective, np.zeros(n), jac=True, method="L-BFGS-B",
                          options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 20000, "maxcor": 30})
        return result.x
    rate = prior.laplace_rate

    def split_objective(z: np.ndarray) -> tuple[float, np.ndarray]:
        b = z[:n] - z[n:]
        g = -model.gradient(data, b)
        value = -model.log_likelihood(data, b) + rate * np.sum(z[:n][pen] + z[n:][pen])
        penalty = np.where(pen, rate, 0.0)
        return value, np.concatenate([g + penalty, -g + penalty])

    bounds = [(0.0, None)] * (2 * n)
    result = minimize(split_objective, np.zeros(2 * n), jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 20000, "maxcor": 30})
    return result.x[:n] - result.x[n:]
