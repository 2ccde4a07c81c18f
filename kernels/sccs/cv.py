"""Cross-validation of the prior variance (the paper's section 2.5).

Cases are split into ``folds`` near-equal folds by a seeded random permutation (Philox). For each fold the
model is fitted on the other folds (held-out cases get case weight 0) over the variance grid from the
smallest to the largest variance, each fit warm-started from the fold's previous one; the fit is scored by
the held-out cases' conditional log-likelihood (the predictive log-likelihood). The curve is the mean over
folds per variance; the chosen variance maximises it. All folds of one variance form one batch of fits
(one device launch sequence on the GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import rng
from kernels.backend import is_numpy
from kernels.sccs import model
from kernels.sccs.ccd import BatchFitter, CycleCallback, offset_callback
from kernels.sccs.data import SccsData

FOLD_STREAM = rng.STREAMS["SCCS_CV_FOLDS"]
# Cyclops' default grid (createControl: lowerLimit 0.01, upperLimit 20, gridSteps 10), computed as its
# GridSearchCrossValidationDriver::computeGridPoint does: exp(log(lower) + step (log(upper) - log(lower)) / 9).
_GRID_LOWER, _GRID_UPPER, _GRID_STEPS = 0.01, 20.0, 10
DEFAULT_GRID = tuple(
    math.exp(math.log(_GRID_LOWER) + step * (math.log(_GRID_UPPER) - math.log(_GRID_LOWER)) / (_GRID_STEPS - 1))
    for step in range(_GRID_STEPS)
)


def fold_of_case(n_cases: int, folds: int, seed: int, xp: ModuleType = np) -> Any:
    """Fold number (0..folds-1) of each case: a seeded random permutation dealt round-robin, as an array of
    ``xp``. The same folds on every backend: the Philox uniforms are the same bits, and the order is by uniform
    then by case (a stable sort on the host, a two-key sort on the device), so ties fall the same way."""
    if not 2 <= folds <= n_cases:
        raise ValueError(f"cross-validation needs 2 <= folds <= number of cases ({n_cases}), got {folds}")
    cases = xp.arange(n_cases, dtype=xp.int64)
    draws = rng.uniform(xp, seed, FOLD_STREAM, cases)
    order = np.argsort(draws, kind="stable") if is_numpy(xp) else xp.lexsort(xp.stack([cases, draws]))
    fold = xp.empty(n_cases, dtype=xp.int64)
    fold[order] = cases % folds
    return fold


@dataclass(frozen=True)
class CvResult:
    variances: np.ndarray  # (V,) ascending
    fold_loglik: np.ndarray  # (folds, V) held-out log-likelihood
    mean_loglik: np.ndarray  # (V,)
    chosen_variance: float
    iterations: np.ndarray  # (folds, V) cycles per fit
    converged: np.ndarray  # (folds, V)
    coefficients: np.ndarray  # (folds, V, J) the training fits
    gradient_norm: np.ndarray  # (folds, V) max KKT residual of each training fit


def variance_grid(variances: list[float] | tuple[float, ...]) -> np.ndarray:
    """The variances to cross-validate, ascending (the order of the warm starts)."""
    grid = np.sort(np.asarray(variances, dtype=np.float64))
    if grid.size == 0 or np.any(grid <= 0):
        raise ValueError("cross-validation variances must be a non-empty list of positive numbers")
    return grid


@dataclass(frozen=True)
class FoldFits:
    """The CV fits of some folds (rows, in fold order) over the whole grid (columns)."""

    fold_loglik: np.ndarray  # (n, V) held-out log-likelihood
    iterations: np.ndarray  # (n, V) int64
    converged: np.ndarray  # (n, V) bool
    coefficients: np.ndarray  # (n, V, J)
    gradient_norm: np.ndarray  # (n, V)


def fold_fits(
    data: SccsData,
    fitter: BatchFitter,
    grid: np.ndarray,
    folds: int,
    seed: int,
    chosen: range,
    on_cycle: CycleCallback | None = None,
) -> FoldFits:
    """The fits of folds ``chosen`` (of ``folds``) over the ascending ``grid``, each fold warm-started from its
    fit at the previous variance; the folds of one variance are one batch. A fold's fits depend on nothing but
    the fold, so any split of the folds reproduces :func:`cross_validate` (on the GPU with each fold kept in its
    row of the all-folds batch: ``kernels/sccs/chunks.py``).

    ``on_cycle(finished, cycle)`` runs after every cycle of every batch with the number of these folds' fits
    finished so far (progress, and the cancel point: it may raise).
    """
    xp = data.xp
    fold = fold_of_case(data.n_cases, folds, seed, xp)
    members = xp.arange(chosen.start, chosen.stop)
    # (n, N) case weights on the data's device, once: each batch's set-up and each score read them there.
    held_out = (fold[None, :] == members[:, None]).astype(xp.float64)
    training = 1.0 - held_out
    beta = np.zeros((members.size, data.n_covariates))
    scores = np.zeros((members.size, grid.size))
    iterations = np.zeros((members.size, grid.size), dtype=np.int64)
    converged = np.zeros((members.size, grid.size), dtype=bool)
    coefficients = np.zeros((members.size, grid.size, data.n_covariates))
    gradient_norm = np.zeros((members.size, grid.size))
    for v, variance in enumerate(grid.tolist()):
        report = offset_callback(on_cycle, v * members.size)
        results = fitter(np.full(members.size, variance), training, beta, report)
        for f, result in enumerate(results):
            beta[f] = result.beta
            coefficients[f, v] = result.beta
            scores[f, v] = model.log_likelihood(data, result.beta, held_out[f])
            iterations[f, v] = result.iterations
            converged[f, v] = result.converged
            gradient_norm[f, v] = result.gradient_norm
    return FoldFits(scores, iterations, converged, coefficients, gradient_norm)


def summarise(grid: np.ndarray, fits: FoldFits) -> CvResult:
    """The CV curve (the mean over folds per variance) and the variance that maximises it, from every fold's
    fits in fold order."""
    mean = fits.fold_loglik.mean(axis=0)
    return CvResult(grid, fits.fold_loglik, mean, float(grid[int(np.argmax(mean))]), fits.iterations, fits.converged,
                    fits.coefficients, fits.gradient_norm)


def cross_validate(
    data: SccsData,
    fitter: BatchFitter,
    variances: list[float] | tuple[float, ...],
    folds: int,
    seed: int,
    on_cycle: CycleCallback | None = None,
) -> CvResult:
    """K-fold CV over ``variances``, warm-starting each fold from its fit at the previous variance.

    ``on_cycle(finished, cycle)`` runs after every cycle of every batch (all folds of one variance) with the
    number of CV fits finished so far (progress, and the cancel point: it may raise).
    """
    grid = variance_grid(variances)
    return summarise(grid, fold_fits(data, fitter, grid, folds, seed, range(folds), on_cycle))
