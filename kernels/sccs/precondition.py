"""New coordinates for the dense, unpenalised columns of an SCCS design (age, season and calendar-time splines),
in which cyclic coordinate descent converges in a few cycles.

Spline components are dense (every era has a value) and, within a case, nearly collinear (a case sees a short
stretch of age), so their block of the Hessian is ill-conditioned (condition numbers of 1e3-1e4 for 5-knot age
and season splines) and CCD, one coordinate at a time, gains about a decade every 10 cycles: a refit to a KKT
residual of 1e-8 takes 60-100 cycles where the design without splines takes 3-5. With ``H_ss = L L'`` the
block's Hessian of the negative log-likelihood at a point near the maximum, the block's columns ``X_s`` are
replaced by ``X_s L^-T`` and its coefficients by ``gamma = L' b_s``: ``X_s b_s = (X_s L^-T) gamma``, so the
linear predictor, the likelihood and (the block being unpenalised) the posterior are the same functions of
the other coefficients, while the block's Hessian in ``gamma`` is the identity there.

Used by the batched profile (:mod:`kernels.sccs.profile`): the profile ``max over the others`` does not depend
on how the others are parametrised, so its intervals are unchanged (tested), and each constrained refit takes
a few cycles. And by ``sccs_fit`` with ``precondition: splines`` (:class:`FitCoordinates`): its CV, final and
bootstrap fits run in the new coordinates made at ``b = 0``, and every fit is mapped back before anything reads
it. Works on NumPy or CuPy data (array operations and :func:`kernels.sccs.data.from_coo`); the D x D
factorisation runs on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.backend import to_host
from kernels.sccs import model
from kernels.sccs.ccd import BatchFitter, CycleCallback, FitResult, kkt_max
from kernels.sccs.data import SccsData, from_coo
from kernels.sccs.model import Prior

DENSE_SHARE = 0.1  # a column with nonzeros in at least this share of the eras is dense
MAX_BLOCK = 64  # more dense columns than this: no new coordinates (the (K, D) work arrays would be large)
MIN_RECIPROCAL_CONDITION = 1e-12  # a block flatter than this in some direction is left as it is


@dataclass(frozen=True)
class DenseBlock:
    """The block's columns (indices) and ``H_ss = L L'``: ``gamma = L' b_s``, ``b_s = L^-T gamma``."""

    columns: np.ndarray
    hessian: np.ndarray  # H_ss (D, D), positive definite

    @functools.cached_property
    def factor(self) -> np.ndarray:
        """``L``, lower triangular."""
        return np.linalg.cholesky(self.hessian)

    def without(self, column: int) -> DenseBlock | None:
        """The block less one of its columns (the Hessian's row and column dropped); None under two columns."""
        keep = self.columns != column
        if keep.sum() < 2:
            return None
        return DenseBlock(self.columns[keep], self.hessian[np.ix_(keep, keep)])

    @functools.cached_property
    def inverse_transpose(self) -> np.ndarray:
        """``L^-T``: the new columns are ``X_s L^-T``."""
        return np.linalg.inv(self.factor).T

    def to_new(self, beta: np.ndarray) -> np.ndarray:
        """Coefficients in the new coordinates (``gamma`` in the block, the others as they are)."""
        out = np.array(beta, dtype=np.float64)
        out[self.columns] = self.factor.T @ out[self.columns]
        return out

    def to_original(self, gamma: np.ndarray) -> np.ndarray:
        out = np.array(gamma, dtype=np.float64)
        out[self.columns] = self.inverse_transpose @ out[self.columns]
        return out


def dense_unpenalised_columns(data: SccsData, prior: Prior) -> np.ndarray:
    """The columns that qualify: unpenalised and dense (see ``DENSE_SHARE``)."""
    counts = np.diff(np.asarray(to_host(data.col_ptr), dtype=np.int64))
    flat = np.ones(data.n_covariates, dtype=bool) if prior.kind == "none" else ~prior.penalised.astype(bool)
    return np.flatnonzero(flat & (counts >= DENSE_SHARE * max(data.n_eras, 1)))


def _dense(data: SccsData, columns: np.ndarray) -> Any:
    """The columns as a dense (K, D) array of the data's namespace."""
    xp = data.xp
    block = xp.zeros((data.n_eras, columns.size), dtype=xp.float64)
    col_ptr = np.asarray(to_host(data.col_ptr), dtype=np.int64)
    for a, j in enumerate(columns.tolist()):
        start, stop = int(col_ptr[j]), int(col_ptr[j + 1])
        block[data.col_rows[start:stop], a] = data.col_values[start:stop]
    return block


def hessian_block(data: SccsData, beta: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``-d^2 LL / d b_s d b_s'`` at ``beta`` (case weights 1): ``sum_i n_i (sum_k p_k x_k x_k' - a_i a_i')`` with
    ``p_k = L_k e^(eta_k) / S_i`` and ``a_i = sum_{k in i} p_k x_k`` (host array). The same bits on every run on
    the GPU too (what lets a fanned-out job's chunks make the single run's coordinates): the case sums in a fixed
    order (:func:`model.case_sums`), the two products by cuBLAS, bitwise reproducible on one GPU model."""
    xp = data.xp
    share = model.era_shares(data, beta)
    block = _dense(data, columns)
    events = data.case_events
    first = (block * (events[data.era_case] * share)[:, None]).T @ block
    case_sums = xp.stack([model.case_sums(data, share * block[:, a]) for a in range(columns.size)], axis=1)
    second = (case_sums * events[:, None]).T @ case_sums
    hessian = np.asarray(to_host(first - second), dtype=np.float64)
    return 0.5 * (hessian + hessian.T)


def dense_block(data: SccsData, prior: Prior, beta: np.ndarray) -> DenseBlock | None:
    """The new coordinates of the dense unpenalised columns at ``beta`` (near the maximum), or None when there
    are fewer than two such columns, more than ``MAX_BLOCK``, or the block's Hessian is (nearly) singular."""
    columns = dense_unpenalised_columns(data, prior)
    if not 2 <= columns.size <= MAX_BLOCK:
        return None
    hessian = hessian_block(data, np.asarray(beta, dtype=np.float64), columns)
    eigenvalues = np.linalg.eigvalsh(hessian)
    if not eigenvalues[0] > MIN_RECIPROCAL_CONDITION * eigenvalues[-1]:
        return None
    return DenseBlock(columns, hessian)


def case_means(data: SccsData, values: Any) -> Any:
    """Per case, the length-weighted mean of each column of ``values`` (K, D) over its eras: (N, D)."""
    xp = data.xp
    total = model.case_sums(data, data.era_length)
    return xp.stack([model.case_sums(data, data.era_length * values[:, a]) / total for a in range(values.shape[1])],
                    axis=1)  # fmt: skip


def apply(data: SccsData, block: DenseBlock, centred: bool = False) -> SccsData:
    """The data with the block's columns replaced by ``X_s L^-T`` (same column order and ids). ``centred``: by
    ``(X_s - M) L^-T`` instead, ``M`` each case's length-weighted mean of the block's columns (:func:`case_means`):
    a per-case constant, which the conditional likelihood does not see (it shifts ``x_k' b`` by the same amount
    on every era of the case), so the likelihood of every ``b`` is unchanged while ``X b`` is not."""
    xp = data.xp
    counts = np.diff(np.asarray(to_host(data.col_ptr), dtype=np.int64))
    column_of_nz = xp.asarray(np.repeat(np.arange(data.n_covariates), counts))
    keep = ~xp.isin(column_of_nz, xp.asarray(block.columns))
    dense = _dense(data, block.columns)
    if centred:
        dense = dense - case_means(data, dense)[data.era_case]
    new_values = dense @ xp.asarray(block.inverse_transpose)
    rows, within = xp.nonzero(new_values)
    return from_coo(
        data.era_case,
        data.era_length,
        data.era_events,
        xp.concatenate([data.col_rows[keep], rows]),
        xp.concatenate([column_of_nz[keep], xp.asarray(block.columns)[within]]),
        xp.concatenate([data.col_values[keep], new_values[rows, within]]),
        data.n_covariates,
        data.covariate_ids,
    )


@dataclass(frozen=True)
class FitCoordinates:
    """Where ``sccs_fit`` fits with ``precondition: splines``: ``data`` is the job's data with the block's columns
    centred within cases and whitened, ``(X_s - M) L^-T`` (:func:`apply`). A batch fitter of ``data`` wrapped by
    :meth:`fitter` takes its starting points and returns its fits in the original coordinates: the coefficients
    ``b = (b_other, L^-T gamma)``, the KKT residual from the original gradient (``d LL / d b_s = L d LL / d gamma``;
    the centring changes no gradient: a case's residuals ``y_k - n_i p_k`` sum to 0), and the log-likelihood and
    log-posterior as they are (the same functions of ``b``: the centring shifts ``x_k' b`` by a constant per case,
    which the conditional likelihood does not see, and the block is unpenalised).

    Why centred: a whitened spline block has directions that are nearly constant within every case (the B-spline
    components sum to about 1 over a case's short stretch of age) scaled up by ``L^-T`` (values up to ~10); a fit
    from ``b = 0`` moves along them in steps that scale each case's ``S_i`` by large factors, and the incremental
    updates of ``S_i`` then lose relative precision (1e-10 measured on a 400-case study), a floor on the KKT
    residual (~5e-9 there) that the gradient rule at 1e-8 cannot pass: such fits cycled to ``max_iterations``.
    Centred, the columns hold only their within-case variation: no floor was met down to a tolerance of 1e-10, and
    the X b rule took the same cycles (tests/kernels/sccs/test_sccs_fit_precondition.py).

    The convergence rule is evaluated where the fit runs. The X b rule sees this design's ``X b`` (the original's
    less a constant per case in the block's part). The gradient rule's block residuals are
    ``|d LL / d gamma| = |L^-1 d LL / d b_s|``: the gradient in the metric of the block's curvature at ``b = 0``,
    scale-free (the reported ``gradient_norm`` is the original coordinates' KKT residual)."""

    block: DenseBlock
    data: SccsData
    prior: Prior

    def prior_at(self, variance: float) -> Prior:
        return self.prior.with_variance(variance) if self.prior.kind != "none" else self.prior

    def original_gradient(self, gradient: np.ndarray) -> np.ndarray:
        """``d LL / d b`` from ``d LL / d gamma``: the block's entries times ``L``, the others as they are."""
        out = np.array(gradient, dtype=np.float64)
        out[self.block.columns] = self.block.factor @ out[self.block.columns]
        return out

    def to_original(self, fit: FitResult, variance: float, case_weights: Any) -> FitResult:
        """A fit in the new coordinates as the same fit in the original ones (``case_weights``: the fit's, read
        only when it did not keep its gradient). Its criterion stays the value the convergence rule compared with
        the tolerance, in the new coordinates (the X b criterion is the same number in both)."""
        gradient = fit.loglik_gradient
        if gradient is None:
            gradient = to_host(model.gradient(self.data, fit.beta, case_weights))
        beta = self.block.to_original(fit.beta)
        original = self.original_gradient(np.asarray(gradient, dtype=np.float64))
        return dataclasses.replace(
            fit, beta=beta, gradient_norm=kkt_max(beta, original, self.prior_at(variance)), loglik_gradient=original
        )

    def fitter(self, inner: BatchFitter) -> BatchFitter:
        """``inner`` (a batch fitter of ``data``) taking starting points and giving fits in the original
        coordinates. Each row is mapped alone (a matrix-vector product per row), so a fit's bits do not depend on
        the other members of its batch (``kernels/sccs/chunks.py``)."""

        def fit_batch(
            variances: np.ndarray, case_weights: Any, beta0: np.ndarray, on_cycle: CycleCallback | None
        ) -> list[FitResult]:
            starts = np.stack([self.block.to_new(row) for row in np.asarray(beta0, dtype=np.float64)])
            fits = inner(variances, case_weights, starts, on_cycle)
            return [self.to_original(fit, float(variances[r]), case_weights[r]) for r, fit in enumerate(fits)]

        return fit_batch


def fit_coordinates(data: SccsData, prior: Prior) -> FitCoordinates | None:
    """``sccs_fit``'s coordinates with ``precondition: splines``: the block made at ``b = 0`` (a function of the
    data and of which columns the prior leaves flat, so every chunk of a fanned-out job makes the same one), or
    None when there is no block (:func:`dense_block`): the fits then run in the original coordinates."""
    block = dense_block(data, prior, np.zeros(data.n_covariates))
    return None if block is None else FitCoordinates(block, apply(data, block, centred=True), prior)
