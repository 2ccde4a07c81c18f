"""Non-parametric bootstrap over cases (the paper's section 2.5): percentile intervals, non-zero shares.

Replicate ``b`` resamples the N cases with replacement (Philox draws keyed by the seed, so any chunking
or device gives the same replicates); a case drawn m times gets case weight m, which is exactly a fit to
the resampled dataset. Every replicate starts from the full-data estimate (a warm start). Intervals are
the 2.5% and 97.5% quantiles of the replicate estimates (linear interpolation, NumPy's default); under the
Laplace prior ``nonzero_share`` is the share of replicates with a non-zero estimate (the paper's p_j).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import rng
from kernels.sccs.ccd import BatchFitter

BOOTSTRAP_STREAM = 0x5CC5_0002


def case_weights(xp: ModuleType, n_cases: int, first: int, count: int, seed: int) -> Any:
    """Case multiplicities (count, N) of replicates ``first .. first+count-1`` (identical on every backend)."""
    index = first * n_cases + xp.arange(count * n_cases, dtype=xp.int64)
    draws = rng.integers(xp, seed, BOOTSTRAP_STREAM, index, n_cases)
    replicate = xp.arange(count * n_cases, dtype=xp.int64) // n_cases
    counts = xp.bincount(replicate * n_cases + draws, minlength=count * n_cases)
    return counts.reshape(count, n_cases).astype(xp.float64)


@dataclass(frozen=True)
class BootstrapResult:
    estimates: np.ndarray  # (B, J)
    ci_lower: np.ndarray  # (J,)
    ci_upper: np.ndarray  # (J,)
    nonzero_share: np.ndarray  # (J,)
    iterations: np.ndarray  # (B,)
    converged: np.ndarray  # (B,)


def percentile_intervals(estimates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval per coefficient."""
    return np.quantile(estimates, 0.025, axis=0), np.quantile(estimates, 0.975, axis=0)


def bootstrap(
    xp: ModuleType,
    n_cases: int,
    fitter: BatchFitter,
    variance: float,
    beta_hat: np.ndarray,
    replicates: int,
    seed: int,
    chunk: int,
    on_fit: Callable[[], None] | None = None,
) -> BootstrapResult:
    """``replicates`` case-resampled refits, ``chunk`` at a time; ``on_fit`` runs after every fit."""
    if replicates < 2:
        raise ValueError("bootstrap needs at least 2 replicates")
    estimates = np.zeros((replicates, beta_hat.size))
    iterations = np.zeros(replicates, dtype=np.int64)
    converged = np.zeros(replicates, dtype=bool)
    for first in range(0, replicates, chunk):
        count = min(chunk, replicates - first)
        weights = case_weights(xp, n_cases, first, count, seed)
        results = fitter(np.full(count, variance), weights, np.tile(beta_hat, (count, 1)),
                         None if on_fit is None else (lambda _r: on_fit()))
        for row, result in enumerate(results):
            estimates[first + row] = result.beta
            iterations[first + row] = result.iterations
            converged[first + row] = result.converged
    lower, upper = percentile_intervals(estimates)
    return BootstrapResult(estimates, lower, upper, np.mean(estimates != 0.0, axis=0), iterations, converged)
