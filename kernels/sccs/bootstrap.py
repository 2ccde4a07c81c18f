"""Non-parametric bootstrap over cases (the paper's section 2.5): percentile intervals, non-zero shares.

Replicate ``b`` resamples the N cases with replacement (Philox draws keyed by the seed, so any chunking
or device gives the same replicates); a case drawn m times gets case weight m, which is exactly a fit to
the resampled dataset. Every replicate starts from the full-data estimate (a warm start). Intervals are
the 2.5% and 97.5% quantiles of the replicate estimates (linear interpolation, NumPy's default); under the
Laplace prior ``nonzero_share`` is the share of replicates with a non-zero estimate (the paper's p_j).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import rng
from kernels.sccs.ccd import BatchFitter, CycleCallback, offset_callback

BOOTSTRAP_STREAM = rng.STREAMS["SCCS_BOOTSTRAP"]


def case_weights(xp: ModuleType, n_cases: int, first: int, count: int, seed: int) -> Any:
    """Case multiplicities (count, N) of replicates ``first .. first+count-1`` (identical on every backend).

    Replicate ``b`` draws case ``floor(u * N)`` with Philox counter ``b * N + i`` for its ``i``-th draw. One
    replicate at a time: the Philox rounds make a dozen temporaries the size of the counters, which for a
    whole batch at once would cost far more device memory than the batch itself.
    """
    counts = xp.zeros((count, n_cases), dtype=xp.float64)
    offsets = xp.arange(n_cases, dtype=xp.int64)
    for row in range(count):
        draws = rng.integers(xp, seed, BOOTSTRAP_STREAM, (first + row) * n_cases + offsets, n_cases)
        counts[row] = xp.bincount(draws, minlength=n_cases)
    return counts


@dataclass(frozen=True)
class BootstrapResult:
    estimates: np.ndarray  # (B, J)
    ci_lower: np.ndarray  # (J,)
    ci_upper: np.ndarray  # (J,)
    nonzero_share: np.ndarray  # (J,)
    iterations: np.ndarray  # (B,)
    converged: np.ndarray  # (B,)
    gradient_norm: np.ndarray  # (B,) max KKT residual of each refit


def percentile_intervals(estimates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval per coefficient."""
    return np.quantile(estimates, 0.025, axis=0), np.quantile(estimates, 0.975, axis=0)


@dataclass(frozen=True)
class ReplicateFits:
    """The refits of some replicates, in replicate order."""

    estimates: np.ndarray  # (n, J)
    iterations: np.ndarray  # (n,) int64
    converged: np.ndarray  # (n,) bool
    gradient_norm: np.ndarray  # (n,)


def replicate_fits(
    xp: ModuleType,
    n_cases: int,
    fitter: BatchFitter,
    variance: float,
    beta_hat: np.ndarray,
    replicates: int,
    chosen: range,
    seed: int,
    batch: int,
    on_cycle: CycleCallback | None = None,
) -> ReplicateFits:
    """The refits of replicates ``chosen`` (of ``replicates``), ``batch`` at a time from the range's first. A
    refit's bits depend only on its own case weights (Philox by the replicate's index), start and variance, not
    on the others of its batch, so a range gives the single run's refits however it is batched (a chunk of a
    fanned-out job fits its own range in batches of its own).

    ``on_cycle(finished, cycle)`` runs after every cycle of every batch with the number of these refits
    finished so far (progress, and the cancel point: it may raise).
    """
    estimates = np.zeros((len(chosen), beta_hat.size))
    iterations = np.zeros(len(chosen), dtype=np.int64)
    converged = np.zeros(len(chosen), dtype=bool)
    gradient_norm = np.zeros(len(chosen))
    if chosen.start < 0 or chosen.stop > replicates:
        raise ValueError(f"replicates {chosen.start} .. {chosen.stop - 1} are not among the {replicates}")
    for first in range(chosen.start, chosen.stop, batch):
        count = min(batch, chosen.stop - first)
        weights = case_weights(xp, n_cases, first, count, seed)
        results = fitter(np.full(count, variance), weights, np.tile(beta_hat, (count, 1)),
                         offset_callback(on_cycle, first - chosen.start))
        for row, result in enumerate(results):
            at = first - chosen.start + row
            estimates[at] = result.beta
            iterations[at] = result.iterations
            converged[at] = result.converged
            gradient_norm[at] = result.gradient_norm
    return ReplicateFits(estimates, iterations, converged, gradient_norm)


def summarise(fits: ReplicateFits) -> BootstrapResult:
    """Percentile intervals and non-zero shares from every replicate's refit, in replicate order."""
    lower, upper = percentile_intervals(fits.estimates)
    return BootstrapResult(fits.estimates, lower, upper, np.mean(fits.estimates != 0.0, axis=0), fits.iterations,
                           fits.converged, fits.gradient_norm)


def bootstrap(
    xp: ModuleType,
    n_cases: int,
    fitter: BatchFitter,
    variance: float,
    beta_hat: np.ndarray,
    replicates: int,
    seed: int,
    chunk: int,
    on_cycle: CycleCallback | None = None,
) -> BootstrapResult:
    """``replicates`` case-resampled refits, ``chunk`` at a time (one batch each).

    ``on_cycle(finished, cycle)`` runs after every cycle of every batch with the number of refits finished
    so far (progress, and the cancel point: it may raise).
    """
    if replicates < 2:
        raise ValueError("bootstrap needs at least 2 replicates")
    return summarise(replicate_fits(xp, n_cases, fitter, variance, beta_hat, replicates,
                                    range(replicates), seed, chunk, on_cycle))
