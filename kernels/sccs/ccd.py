"""MAP fit by cyclic coordinate descent with the Genkin et al. (2007) trust region (the paper's Algorithm 1).

We minimise ``f(b) = -LL(b) - log p(b)`` one coordinate at a time. For coordinate ``j`` with the current
``eta = X b``, ``w_k = L_k exp(eta_k)``, ``S_i = sum_{k in i} w_k`` and per touched case
``A_ij = sum_{k in i} w_k x_kj``, ``B_ij = sum_{k in i} w_k x_kj^2``:

    G_j = -(t_j - sum_i c_i n_i A_ij / S_i),   t_j = sum_k c_i(k) y_k x_kj   (constant within a fit)
    H_j =  sum_i c_i n_i (B_ij / S_i - (A_ij / S_i)^2)  >= 0

(the paper's N'W and N'[W(1-W)] for binary X: the fused reduction of Listing 2). The Newton step of
eq. 4 with the prior's derivatives is bounded by the per-coordinate trust region ``delta_j`` (start 1,
then ``max(2 |step|, delta_j / 2)``); under the Laplace prior a coefficient never jumps over 0 in one step
and leaves 0 only when ``|G_j| > lambda`` (Genkin's rule). After a step, ``eta``, ``w`` and ``S`` are
updated only at the column's nonzeros (Listing 3).

Convergence, checked once per cycle over all coordinates:

* ``"xbeta"`` (the paper's, Genkin's): ``sum_k c |delta eta_k| / (1 + sum_k c |eta_k|) <= tolerance``
  over the cycle (default tolerance 5e-4);
* ``"gradient"``: the largest KKT residual of the log-posterior (see :func:`model.kkt_residual`)
  ``<= tolerance`` (absolute, in log-likelihood units).

The final KKT residual's max-norm is reported either way. This module is the NumPy path and the
reference for :mod:`kernels.sccs.gpu` (which runs the same arithmetic per coordinate on the device, with
the kernels of ``ccd.cu``). The model and its conventions: ``docs/sccs.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kernels.backend import is_numpy, to_host
from kernels.sccs import model
from kernels.sccs.data import SccsData
from kernels.sccs.model import Prior
from kernels.spec import settings_from

if TYPE_CHECKING:
    from pydantic import BaseModel

CONVERGENCE_RULES = ("xbeta", "gradient")
INITIAL_TRUST_REGION = 1.0


@dataclass(frozen=True)
class FitOptions:
    tolerance: float = 5e-4
    max_iterations: int = 1000
    convergence: str = "xbeta"
    precision: str = "float64"

    @classmethod
    def from_params(cls, params: BaseModel, **settings: Any) -> FitOptions:
        """The options of a job's validated params, copied by name (:func:`kernels.spec.settings_from`);
        ``settings`` over those."""
        return settings_from(cls, params, **settings)

    def __post_init__(self) -> None:
        if self.convergence not in CONVERGENCE_RULES:
            raise ValueError(f"convergence must be one of {CONVERGENCE_RULES}, not {self.convergence!r}")
        if self.precision not in ("float64", "float32"):
            raise ValueError(f"precision must be 'float64' or 'float32', not {self.precision!r}")
        if not self.tolerance > 0:
            raise ValueError("tolerance must be positive")
        if self.max_iterations < 1:
            raise ValueError("max_iterations must be at least 1")


@dataclass(frozen=True)
class FitResult:
    beta: np.ndarray  # (J,)
    iterations: int  # full cycles over the coordinates
    converged: bool
    log_likelihood: float
    log_posterior: float
    gradient_norm: float  # max-norm of the final KKT residual
    criterion: float  # the convergence criterion's last value
    # d LL / d b at ``beta`` (J,) where the fit evaluated it from scratch (``finish``); None where it did not. What
    # maps the KKT residual of a fit in other coordinates back (kernels/sccs/precondition.py).
    loglik_gradient: np.ndarray | None = None


def coordinate_step(
    gradient: float, hessian: float, beta_j: float, trust: float, kind: str, penalised: bool, variance: float
) -> tuple[float, float]:
    """The bounded Newton step on ``f`` for one coordinate and the new trust-region width.

    ``gradient``/``hessian`` are ``G_j``/``H_j`` of the negative log-likelihood (``H_j >= 0``).
    """
    if kind == "normal" and penalised:
        step = -(gradient + beta_j / variance) / (hessian + 1.0 / variance)
    elif kind == "laplace" and penalised:
        rate = math.sqrt(2.0 / variance)
        if hessian <= 0.0:
            step = 0.0
        elif beta_j == 0.0:
            step = -(gradient + rate) / hessian
            if step <= 0.0:
                step = -(gradient - rate) / hessian
                if step >= 0.0:
                    step = 0.0
        else:
            sign = 1.0 if beta_j > 0 else -1.0
            step = -(gradient + rate * sign) / hessian
            if (beta_j + step) * sign < 0.0:
                step = -beta_j
    else:
        step = -gradient / hessian if hessian > 0.0 else 0.0
    step = min(max(step, -trust), trust)
    return step, max(2.0 * abs(step), 0.5 * trust)


class _CaseState:
    """``eta``, ``w = L exp(eta)`` and ``S`` for one set of case weights (NumPy)."""

    def __init__(self, data: SccsData, beta: np.ndarray, dtype: type) -> None:
        self.eta = model.linear_predictor(data, beta).astype(dtype)
        self.w = (data.era_length * np.exp(self.eta.astype(np.float64))).astype(dtype)
        self.sums = np.bincount(data.era_case, weights=self.w, minlength=data.n_cases).astype(dtype)


def fit(
    data: SccsData,
    prior: Prior,
    options: FitOptions = FitOptions(),
    case_weights: np.ndarray | None = None,
    beta0: np.ndarray | None = None,
    on_cycle: Callable[[int, bool], None] | None = None,
    fixed_column: int | None = None,
) -> FitResult:
    """One MAP fit on the host (NumPy).

    ``on_cycle(cycle, finished)`` runs after every cycle (``finished``: the fit stops after this cycle,
    converged or at ``max_iterations``); it may raise (e.g. ``JobCancelled``) to abandon the fit.
    ``fixed_column``: that coefficient is held at its ``beta0`` value (a constrained refit of the profile
    likelihood): the cycles skip it, and the KKT residual (criterion and ``gradient_norm``) leaves it out.
    """
    if not is_numpy(data.xp):
        raise TypeError("ccd.fit is the NumPy path; use kernels.sccs.gpu for CuPy data")
    n_cov = data.n_covariates
    if prior.penalised.shape != (n_cov,):
        raise ValueError(f"prior.penalised must have shape ({n_cov},)")
    weights = model.case_weights_or_ones(data, case_weights)
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("case weights must be finite and non-negative")
    dtype = np.float32 if options.precision == "float32" else np.float64
    beta = np.zeros(n_cov) if beta0 is None else np.array(beta0, dtype=np.float64)
    if beta.shape != (n_cov,):
        raise ValueError(f"beta0 must have shape ({n_cov},)")
    if fixed_column is not None and not 0 <= fixed_column < n_cov:
        raise ValueError(f"fixed_column must be a column index below {n_cov}, got {fixed_column}")

    state = _CaseState(data, beta, dtype)
    weighted_events = weights * data.case_events  # c_i n_i
    era_weight = weights[data.era_case]
    numerator = np.bincount(
        np.repeat(np.arange(n_cov), np.diff(data.col_ptr)),
        weights=era_weight[data.col_rows] * data.era_events[data.col_rows] * data.col_values,
        minlength=n_cov,
    )
    trust = np.full(n_cov, INITIAL_TRUST_REGION)
    col_ptr, touched_col_ptr = data.col_ptr.tolist(), data.touched_col_ptr.tolist()

    converged = False
    criterion = math.inf
    iterations = 0
    for iterations in range(1, options.max_iterations + 1):
        eta_start = state.eta.copy() if options.convergence == "xbeta" else None
        for j in range(n_cov):
            start, stop = col_ptr[j], col_ptr[j + 1]
            t_start, t_stop = touched_col_ptr[j], touched_col_ptr[j + 1]
            if start == stop or j == fixed_column:
                continue
            rows = data.col_rows[start:stop]
            values = data.col_values[start:stop]
            local = data.nnz_touched[start:stop] - t_start
            cases = data.touched_case[t_start:t_stop]
            m = t_stop - t_start
            w_rows = state.w[rows].astype(np.float64)
            a = np.bincount(local, weights=w_rows * values, minlength=m)
            b = a if data.binary else np.bincount(local, weights=w_rows * values * values, minlength=m)
            share = a / state.sums[cases]
            ce = weighted_events[cases]
            grad = -(numerator[j] - np.sum(ce * share))
            hess = float(np.sum(ce * (b / state.sums[cases] - share * share)))
            step, trust[j] = coordinate_step(
                float(grad), hess, float(beta[j]), float(trust[j]), prior.kind, bool(prior.penalised[j]),
                prior.variance,
            )
            if step == 0.0:
                continue
            beta[j] += step
            new_eta = state.eta[rows] + (step * values).astype(dtype)
            new_w = (data.era_length[rows] * np.exp(new_eta.astype(np.float64))).astype(dtype)
            state.sums[cases] += np.bincount(local, weights=new_w.astype(np.float64) - w_rows, minlength=m).astype(
                dtype
            )
            state.eta[rows] = new_eta
            state.w[rows] = new_w
        if options.convergence == "xbeta":
            change = float(np.sum(era_weight * np.abs(state.eta.astype(np.float64) - eta_start)))
            criterion = change / (1.0 + float(np.sum(era_weight * np.abs(state.eta.astype(np.float64)))))
        else:
            criterion = kkt_max(beta, model.gradient(data, beta, weights), prior, fixed_column)
        converged = criterion <= options.tolerance
        if on_cycle is not None:
            on_cycle(iterations, converged or iterations == options.max_iterations)
        if converged:
            break
    return finish(data, prior, weights, beta, iterations, converged, criterion, fixed_column)


def kkt_max(beta: np.ndarray, loglik_gradient: object, prior: Prior, fixed_column: int | None = None) -> float:
    """The max-norm of the KKT residual (:func:`model.kkt_residual`), without the held coefficient's."""
    residual = model.kkt_residual(beta, to_host(loglik_gradient), prior)
    if fixed_column is not None:
        residual[fixed_column] = 0.0
    return float(np.max(residual, initial=0.0))


def finish(
    data: SccsData, prior: Prior, weights: object, beta: np.ndarray, iterations: int, converged: bool,
    criterion: float, fixed_column: int | None = None,
) -> FitResult:
    """Evaluate the fit's log-likelihood, log-posterior and KKT residual from scratch (on data's device).

    With a held coefficient (``fixed_column``) the log-posterior still includes its prior term, ``log p(b_j)``
    at the held value: what the profile likelihood of a penalised coefficient is."""
    beta_host = np.asarray(beta, dtype=np.float64)
    ll, grad = model.log_likelihood_and_gradient(data, beta_host, weights)
    grad_host = np.asarray(to_host(grad), dtype=np.float64)
    return FitResult(
        beta=beta_host.copy(),
        iterations=iterations,
        converged=converged,
        log_likelihood=ll,
        log_posterior=ll + model.log_prior(beta_host, prior),
        gradient_norm=kkt_max(beta_host, grad_host, prior, fixed_column),
        criterion=float(criterion),
        loglik_gradient=grad_host,
    )


# Progress of a batch: on_cycle(finished, cycle) runs after every cycle of the batch with the number of its
# fits that have finished (converged or stopped at max_iterations; never decreases, ends at the batch size)
# and the cycle just done. It may raise (JobCancelled) to abandon the batch: that is the cancel point.
CycleCallback = Callable[[int, int], None]
# A batch fitter: (variances (R,), case weights (R, N), starting betas (R, J), on_cycle) -> R results.
BatchFitter = Callable[[np.ndarray, np.ndarray, np.ndarray, CycleCallback | None], list[FitResult]]


def offset_callback(on_cycle: CycleCallback | None, before: int) -> CycleCallback | None:
    """A batch's callback that also counts ``before`` fits of earlier batches as finished."""
    if on_cycle is None:
        return None

    def report(finished: int, cycle: int) -> None:
        on_cycle(before + finished, cycle)

    return report


def numpy_batch_fitter(data: SccsData, prior: Prior, options: FitOptions) -> BatchFitter:
    """Fits of the same data with many case-weight vectors, one after another on the host."""

    def fit_batch(
        variances: np.ndarray, case_weights: np.ndarray, beta0: np.ndarray, on_cycle: CycleCallback | None
    ) -> list[FitResult]:
        results = []
        for r in range(len(variances)):
            report = None
            if on_cycle is not None:
                def report(cycle: int, finished: bool, r: int = r) -> None:
                    on_cycle(r + int(finished), cycle)
            results.append(fit(data, prior.with_variance(float(variances[r])) if prior.kind != "none" else prior,
                               options, case_weights[r], beta0[r], report))
        return results

    return fit_batch
