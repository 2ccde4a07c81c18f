"""Many SCCS analyses at once: each chosen covariate of one set of interval tables fitted alone (the exposure of
interest without the other covariates, as SelfControlledCaseSeries' ``runSccsAnalyses`` fits one exposure per
analysis), all of them as one batch on the data's device (``docs/sccs.md``).

For covariate j alone the conditional log-likelihood relative to b = 0 is

    LLR_j(b) = b sum_k y_k x_kj - sum_t n_t [log w_t(b) - log L_t],
    w_t(b) = u_t + sum_{k in t, x_kj != 0} L_k e^(b x_kj)

over the cases t the covariate touches (the others contribute nothing), u_t the days of case t without the
covariate and L_t all its days. LLR is concave, so the score is decreasing: the maximum is found by bisection of
the score and each end of the likelihood-ratio interval {b : 2 (LLR(b_hat) - LLR(b)) <= chi2_1(level)} by
bisection on its side, every analysis at once (64 halvings, below float64 resolution). Each halving is a few
element-wise passes and bincounts over the chosen columns' nonzeros, so the batch runs on CuPy as on NumPy. An
estimate beyond +-30 on the log scale (no exposed events, or no unexposed ones) is infinite; an end not reached
within 20 of the estimate (and at least to +-20) is open (NaN), as in ``profile.py``.

Every sum adds one analysis's own terms in a fixed order: NumPy's ``bincount`` in index order; on the GPU the
segment sums of :mod:`kernels.sccs.fixed_sums` (a touched case's nonzeros by one thread; an analysis's cases or
nonzeros by chunks of fixed size, one block each, then its chunks in order), never atomics, whose order varies from
run to run and which contend on a common drug's nonzeros. So an analysis's result does not depend on the other
analyses of its batch: any split of the analyses gives the same bits (``kernels/sccs/analyses_chunks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from kernels.backend import is_numpy, to_host
from kernels.sccs import fixed_sums, model
from kernels.sccs.data import SccsData, repeat_by_counts

LIMIT = 30.0  # |b| beyond this is an infinite estimate
DISTANCE = 20.0  # how far past the estimate an interval's end is searched (and at least to +-DISTANCE)
HALVINGS = 64
_MAX_EXPONENT = 700.0  # exp() of more overflows float64


@dataclass(frozen=True)
class SingleFits:
    """Per analysis (host arrays): the estimate (log scale, +-inf when infinite), the likelihood-ratio interval
    (NaN: open), the log-likelihood ratio against b = 0 at the estimate and its two-sided p-value."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    log_likelihood_ratio: np.ndarray
    p_value: np.ndarray


def _ranges(xp: Any, starts: np.ndarray, counts: np.ndarray) -> tuple[Any, Any]:
    """The concatenation of arange(starts[a], starts[a] + counts[a]) over a, and each element's a."""
    owner = repeat_by_counts(xp, xp.arange(counts.size), xp.asarray(counts))
    begin = xp.asarray(np.cumsum(counts) - counts)
    return xp.asarray(starts)[owner] + (xp.arange(int(counts.sum())) - begin[owner]), owner


class _Batch:
    """The chosen columns' nonzeros and touched cases, gathered once on the data's device."""

    def __init__(self, data: SccsData, columns: np.ndarray) -> None:
        xp = self.xp = data.xp
        col_ptr, touched_col_ptr = (np.asarray(to_host(a), np.int64) for a in (data.col_ptr, data.touched_col_ptr))
        self.size = columns.size
        nz_counts = col_ptr[columns + 1] - col_ptr[columns]
        slot_counts = touched_col_ptr[columns + 1] - touched_col_ptr[columns]
        nz, self.nz_owner = _ranges(xp, col_ptr[columns], nz_counts)
        slot, self.slot_owner = _ranges(xp, touched_col_ptr[columns], slot_counts)
        self.n_slots = int(slot_counts.sum())
        slot_begin = xp.asarray(np.cumsum(slot_counts) - slot_counts)
        self.nz_slot = data.nnz_touched[nz] - xp.asarray(touched_col_ptr[columns])[self.nz_owner] \
            + slot_begin[self.nz_owner]
        # The segments of the sums on the GPU: an analysis's nonzeros and touched cases are contiguous, and a
        # column's nonzeros come in era order, so grouped by case: nz_slot never decreases.
        self.nz_segments = self.slot_segments = self.slot_ptr = None
        if not is_numpy(xp):
            # An analysis's nonzeros or cases may be millions (a common drug) or a handful: summed by chunks of
            # fixed size, each by a block, so one long analysis does not hold the batch up on one block.
            self.nz_segments = fixed_sums.ChunkedSegments.of(xp, np.concatenate([[0], np.cumsum(nz_counts)]))
            self.slot_segments = fixed_sums.ChunkedSegments.of(xp, np.concatenate([[0], np.cumsum(slot_counts)]))
            self.slot_ptr = xp.searchsorted(self.nz_slot, xp.arange(self.n_slots + 1))
        era = data.col_rows[nz]
        self.x = data.col_values[nz]
        self.length = data.era_length[era]
        case = data.touched_case[slot]
        self.events = data.case_events[case]
        self.total = model.case_sums(data, data.era_length)[case]
        self.unexposed = xp.maximum(self.total - self._per_slot(self.length), 0.0)
        self.sum_yx = self._per_analysis(self.nz_owner, self.nz_segments, data.era_events[era] * self.x)

    def _per_slot(self, values: Any) -> Any:
        """Per touched case of an analysis, the sum of ``values`` over its nonzeros."""
        if self.slot_ptr is None:
            return self.xp.bincount(self.nz_slot, weights=values, minlength=self.n_slots)
        return fixed_sums.segment_sums(self.slot_ptr, values)

    def _per_analysis(self, owner: Any, segments: fixed_sums.ChunkedSegments | None, values: Any) -> Any:
        """Per analysis, the sum of ``values`` over its nonzeros or its touched cases (``owner``; ``segments``
        on the GPU)."""
        if segments is None:
            return np.bincount(owner, weights=values, minlength=self.size)
        return fixed_sums.chunked_segment_sums(segments, values)

    def _weighted(self, b: Any) -> tuple[Any, Any]:
        """Per nonzero L_k e^(b x_k), and per touched case w_t(b)."""
        term = self.length * self.xp.exp(self.xp.clip(b[self.nz_owner] * self.x, -_MAX_EXPONENT, _MAX_EXPONENT))
        return term, self.unexposed + self._per_slot(term)

    def log_likelihood_ratio(self, b: Any) -> Any:
        """LLR_a(b_a) for every analysis a."""
        _, w = self._weighted(b)
        drop = self.events * (self.xp.log(w) - self.xp.log(self.total))
        return self.sum_yx * b - self._per_analysis(self.slot_owner, self.slot_segments, drop)

    def score(self, b: Any) -> Any:
        """d LLR_a / d b at b_a for every analysis a (decreasing in b)."""
        term, w = self._weighted(b)
        slope = self._per_slot(term * self.x)
        return self.sum_yx - self._per_analysis(self.slot_owner, self.slot_segments, self.events * slope / w)


def _bisect(xp: Any, positive_below: Any, low: Any, high: Any) -> Any:
    """The point where ``positive_below(b)`` turns False, b in [low, high] (True at low, False at high)."""
    for _ in range(HALVINGS):
        middle = 0.5 * (low + high)
        below = positive_below(middle)
        low, high = xp.where(below, middle, low), xp.where(below, high, middle)
    return 0.5 * (low + high)


def single_covariate_fits(data: SccsData, columns: np.ndarray, level: float = 0.95) -> SingleFits:
    """Each covariate column of ``columns`` fitted alone by conditional maximum likelihood, with its
    likelihood-ratio interval at ``level`` and p-value, as one batch on ``data``'s device."""
    columns = np.asarray(columns, dtype=np.int64)
    if columns.size == 0:  # a chunk of a fanned-out job may hold none
        empty = np.zeros(0)
        return SingleFits(empty, empty.copy(), empty.copy(), empty.copy(), empty.copy())
    batch = _Batch(data, columns)
    xp = batch.xp
    low, high = xp.full(columns.size, -LIMIT), xp.full(columns.size, LIMIT)
    below_limit, above_limit = batch.score(low) < 0, batch.score(high) > 0  # the maximum lies beyond +-LIMIT
    estimate = _bisect(xp, lambda b: batch.score(b) > 0, low, high)
    estimate = xp.where(below_limit, -LIMIT, xp.where(above_limit, LIMIT, estimate))
    top = batch.log_likelihood_ratio(estimate)
    threshold = top - 0.5 * float(stats.chi2.ppf(level, 1))

    def above_threshold(b: Any) -> Any:
        return batch.log_likelihood_ratio(b) > threshold

    far_low = xp.minimum(estimate - DISTANCE, -DISTANCE)
    far_high = xp.maximum(estimate + DISTANCE, DISTANCE)
    lower = _bisect(xp, lambda b: ~above_threshold(b), far_low, estimate)
    upper = _bisect(xp, above_threshold, estimate, far_high)
    lower = xp.where(above_threshold(far_low) | below_limit, xp.nan, lower)
    upper = xp.where(above_threshold(far_high) | above_limit, xp.nan, upper)
    host = {name: np.asarray(to_host(value), np.float64) for name, value in
            (("estimate", estimate), ("lower", lower), ("upper", upper), ("top", top))}
    below, above = np.asarray(to_host(below_limit)), np.asarray(to_host(above_limit))
    host["estimate"] = np.where(below, -np.inf, np.where(above, np.inf, host["estimate"]))
    p_value = stats.chi2.sf(2.0 * np.maximum(host["top"], 0.0), 1)
    return SingleFits(host["estimate"], host["lower"], host["upper"], host["top"], p_value)
