"""Small SCCS problems and independent references (scipy.optimize) shared by the SCCS tests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
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


# -- drugs with a systematic error (calibration) --------------------------------------------------------

BIAS = 0.5  # the systematic error every drug of the simulation carries (as if confounded), log scale
NEGATIVES, POSITIVES, BIASED_ONLY, REAL = list(range(1, 11)), [11, 12, 13], 14, 15


def biased_study_tables(n_cases: int = 3000, seed: int = 21) -> dict:
    """Interval tables of simulated cases with systematic error (test_sccs_calibration, test_sccs_analyses):
    cases observed 365 days; each of 15 drugs taken by half the cases for 30-60 days; one event per case with
    log relative incidence BIAS in every drug's window, plus log 2 for the positive controls and log 3 for the
    drug with a real effect; the interval tables built day by day."""
    generator = np.random.default_rng(seed)
    drugs = np.arange(1, 16)
    log_rr = np.full(drugs.size, BIAS) + np.isin(drugs, POSITIVES) * math.log(2) + (drugs == REAL) * math.log(3)
    taken = generator.random((n_cases, drugs.size)) < 0.5
    start = generator.integers(0, 320, (n_cases, drugs.size))
    stop = start + generator.integers(30, 61, (n_cases, drugs.size))
    day = np.arange(365)
    active = taken[:, None, :] & (day[None, :, None] >= start[:, None, :]) & (day[None, :, None] < stop[:, None, :])
    weight = np.exp(active @ log_rr)
    cumulative = np.cumsum(weight, axis=1)
    event_day = (cumulative < generator.random(n_cases)[:, None] * cumulative[:, -1:]).sum(axis=1)
    mask = active @ (1 << np.arange(drugs.size))
    key = np.arange(n_cases)[:, None].astype(np.int64) * (1 << drugs.size) + mask
    events = np.zeros((n_cases, 365))
    events[np.arange(n_cases), event_day] = 1.0
    unique, era = np.unique(key.ravel(), return_inverse=True)
    outcomes = pd.DataFrame({"rowId": np.arange(unique.size) + 1, "stratumId": unique >> drugs.size,
                             "time": np.bincount(era), "y": np.bincount(era, weights=events.ravel())})
    row, bit = np.nonzero((unique[:, None] & (1 << np.arange(drugs.size))) > 0)
    covariates = pd.DataFrame({"rowId": row + 1, "covariateId": drugs[bit]})
    return {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates}
