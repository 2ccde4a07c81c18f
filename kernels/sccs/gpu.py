"""The CCD fit on the GPU: the whole coordinate loop on the device, batched over case-weight vectors.

Per coordinate ``j`` three kernels of ``ccd.cu`` run, with nothing crossing to the host:

1. ``sccs_grad_hess`` (the fused reduction of Listing 2): one thread per (replicate, case touched by
   column j) sums ``A = sum w x`` and ``B = sum w x^2`` over the case's nonzeros of the column, forms
   ``c n A / S`` and ``c n (B/S - (A/S)^2)`` and reduces them per block;
2. ``sccs_step``: one block per replicate sums the block partials in a fixed order and applies the prior,
   Genkin's trust region and the Laplace zero rule (the same arithmetic as :func:`ccd.coordinate_step`),
   updating ``b_j`` and the trust width on the device;
3. ``sccs_update`` (Listing 3): one thread per (replicate, touched case) updates ``eta``,
   ``w = L exp(eta)`` and that case's ``S`` — a thread owns its case, so no atomics are needed.

Both per-case loops take the case's nonzeros of the column in groups (``SLOT_GROUP`` of ``ccd.cu``): loads first,
then the arithmetic in the nonzeros' order, so the loads overlap and the bits are those of one at a time.

A case of weight 0 in a replicate (a bootstrap case not drawn, a held-out fold) is skipped by both per-column
kernels: it adds exactly 0 to the sums, and nothing reads its per-era state with a nonzero weight.

One cycle over all coordinates (3 J launches) is captured once into a CUDA graph and replayed per cycle;
the host only reads the per-replicate convergence criterion after each cycle, and then reports progress
through the batch's ``on_cycle`` callback (which may raise ``JobCancelled``: the cancel point, between two
cycles of the whole batch). A batch of ``R`` fits (CV folds, bootstrap replicates) shares the design and the
case index; each replicate has its own case weights, variance, ``b``, ``eta``, ``w`` and ``S`` (row ``r`` of
(R, .) arrays), and a replicate that has converged is frozen, so each replicate's result is the single fit's.

Constrained refits (the profile likelihood, :mod:`kernels.sccs.profile`): replicate ``r`` may hold one
coefficient ``c_r`` at its starting value (``fixed_columns``): ``sccs_step`` leaves it, so its linear predictor
keeps ``b_{c_r} x_{c_r}``. :meth:`BatchEngine.refit_moved` then moves each replicate's held value and refits
from the replicate's own state (a warm start: the move is the sparse update of one CCD step). A profile engine
(``state_gradient``) evaluates the gradient criterion, and its results' log-likelihood and KKT residual, from
the batch's own state on the device (``sccs_gradient_chunks``, ``sccs_kkt_residual``, ``sccs_case_loglik``:
a few launches for the whole batch) rather than from scratch replicate by replicate.
Every float sum of the engine runs in a fixed order (no atomics: block partials go to arrays, and a case's or a
column's terms are added by one thread or one block in order; :mod:`kernels.sccs.fixed_sums` for the sums outside
the cycle), and a replicate's sums never depend on the other rows of its batch: a fit gives the same bits on every
run, alone or in any batch.
:mod:`kernels.sccs.ccd` is the NumPy twin (same per-coordinate arithmetic; sums differ in order only); the
model and its conventions are in ``docs/sccs.md``.

CuPy is imported only when an engine is built: this module imports on a machine without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import cuda
from kernels.backend import array_namespace, is_numpy, to_host
from kernels.sccs import fixed_sums, model
from kernels.sccs.ccd import (
    INITIAL_TRUST_REGION,
    BatchFitter,
    CycleCallback,
    FitOptions,
    FitResult,
    finish,
    kkt_max,
    offset_callback,
)
from kernels.sccs.data import SccsData
from kernels.sccs.model import Prior
from kernels.timing import StageTimer

BLOCK = 256  # threads per block of every kernel (a power of two: the shared reductions halve it)
GRADIENT_CHUNK = 8 * BLOCK  # nonzeros of one column per block of the state gradient (sccs_gradient_chunks)
XBETA_ITEMS = 8  # eras per thread of the X b criterion's blocks (sccs_xbeta_change; at most 1024 blocks)
_PRIOR_CODE = {"none": 0, "normal": 1, "laplace": 2}
_REAL = {"float64": np.float64, "float32": np.float32}
_CCD = cuda.kernel_source(
    __file__, "ccd.cu", warm_up=[{**cuda.real_define(real), "BLOCK": BLOCK} for real in _REAL.values()]
)


def _cupy() -> ModuleType:
    import cupy

    return cupy


@dataclass(frozen=True)
class _Kernels:
    """The kernels of ``ccd.cu`` compiled for one precision (cached by :mod:`kernels.cuda`)."""

    grad_hess: Any
    step: Any
    update: Any
    xbeta_change: Any
    gradient_chunks: Any
    kkt_residual: Any
    case_loglik: Any
    numerators: Any

    @classmethod
    def load(cls, precision: str, defines: dict[str, int] | None = None) -> _Kernels:
        """``defines``: more compile-time constants of ``ccd.cu`` (a test's ``SLOT_GROUP``)."""
        module = cuda.module(_CCD, {**cuda.real_define(_REAL[precision]), "BLOCK": BLOCK, **(defines or {})})
        return cls(*(module.get_function(name) for name in
                     ("sccs_grad_hess", "sccs_step", "sccs_update", "sccs_xbeta_change", "sccs_gradient_chunks",
                      "sccs_kkt_residual", "sccs_case_loglik", "sccs_numerators")))


@dataclass(frozen=True)
class _Column:
    """One coordinate with nonzeros: its touched-case slots ``first .. first + cases - 1``."""

    j: int
    first: int
    cases: int

    @property
    def blocks(self) -> int:
        return math.ceil(self.cases / BLOCK)


@dataclass(frozen=True)
class _StateIndex:
    """What the state gradient and log-likelihood need beyond the design: each column's nonzeros cut into chunks
    of at most ``GRADIENT_CHUNK`` (chunk c holds ``chunk_ptr[c] .. chunk_ptr[c + 1]``, column j's chunks are
    ``column_chunk_ptr[j] .. column_chunk_ptr[j + 1]``), each case's eras (``case_ptr``) and ``log L``."""

    chunk_ptr: Any
    column_chunk_ptr: Any
    case_ptr: Any
    log_length: Any

    @property
    def n_chunks(self) -> int:
        return int(self.chunk_ptr.shape[0] - 1)

    @classmethod
    def build(cls, cp: ModuleType, data: SccsData) -> _StateIndex:
        chunk_ptr, column_chunk_ptr = fixed_sums.column_chunks(to_host(data.col_ptr), GRADIENT_CHUNK)
        return cls(cp.asarray(chunk_ptr), cp.asarray(column_chunk_ptr), fixed_sums.case_ptr(data),
                   fixed_sums.log_length(data))


class BatchEngine:
    """Device buffers, kernels and the captured cycle graph for fits of ``capacity`` replicates at once.

    ``state_gradient`` (a profile engine; ``gradient`` convergence in float64 only): the criterion, and the
    results' log-likelihood and KKT residual, from the batch's state on the device (see the module docstring).
    """

    def __init__(self, data: SccsData, prior: Prior, options: FitOptions, capacity: int, use_graph: bool = True,
                 state_gradient: bool = False):
        cp = _cupy()
        if is_numpy(array_namespace(data.era_case)):
            data = data.to(cp)
        if state_gradient and (options.convergence != "gradient" or options.precision != "float64"):
            raise ValueError("a state-gradient engine needs the gradient criterion in float64")
        self.cp, self.data, self.prior, self.options, self.capacity = cp, data, prior, options, capacity
        fixed_sums.prepare(data)  # the data set's index for the fixed-order sums, once, before the batch's buffers
        self._state = _StateIndex.build(cp, data) if state_gradient else None
        self.real = _REAL[options.precision]
        self._kernels = _Kernels.load(options.precision)
        touched_ptr = to_host(data.touched_col_ptr)
        self._columns = [
            _Column(j, int(touched_ptr[j]), int(touched_ptr[j + 1] - touched_ptr[j]))
            for j in range(data.n_covariates)
            if touched_ptr[j + 1] > touched_ptr[j]
        ]
        self._column_of = {column.j: column for column in self._columns}
        self._max_blocks = max([column.blocks for column in self._columns], default=1)
        self._xbeta_blocks = xbeta_blocks(data.n_eras)
        self._penalised = prior.penalised.astype(bool)
        self._fixed_host = np.full(capacity, -1, dtype=np.int64)  # the held coefficient of each row (-1: none)
        self._held_values = np.zeros(capacity)
        self._count = 0  # replicates of the last batch
        self._variance_host = np.ones(capacity)
        self._allocate()
        self._touched_events = self._case_numerators()
        self._stream = cp.cuda.Stream(non_blocking=True)
        self._graph: Any = None
        self.graph_used = False
        self.last_timings: dict[str, float] = {}
        if use_graph:
            try:
                self._capture()
                self.graph_used = True
            except Exception:  # capture unsupported here: launch per cycle instead (same kernels)
                self._graph = None

    def _allocate(self) -> None:
        """The (R, .) state of the batch: per era, per case and per covariate."""
        cp, d, r = self.cp, self.data, self.capacity
        n_eras, n_cases, n_cov = d.n_eras, d.n_cases, d.n_covariates
        self.eta = cp.zeros((r, n_eras), dtype=self.real)
        self.eta_start = cp.zeros((r, n_eras), dtype=self.real)
        self.w = cp.zeros((r, n_eras), dtype=self.real)
        self.sums = cp.zeros((r, n_cases), dtype=self.real)
        self.case_weights = cp.zeros((r, n_cases), dtype=cp.float64)
        self.weighted_events = cp.zeros((r, n_cases), dtype=cp.float64)
        self.numerator = cp.zeros((r, n_cov), dtype=cp.float64)
        self.beta = cp.zeros((r, n_cov), dtype=cp.float64)
        self.trust = cp.zeros((r, n_cov), dtype=cp.float64)
        self.step = cp.zeros(r, dtype=cp.float64)
        self.variance = cp.ones(r, dtype=cp.float64)
        self.active = cp.zeros(r, dtype=cp.int32)
        self.partial = cp.zeros((r, self._max_blocks, 2), dtype=cp.float64)
        self.xbeta_partial = cp.zeros((2 * r, self._xbeta_blocks), dtype=cp.float64)
        self.fixed = cp.full(r, -1, dtype=cp.int32)
        if self._state is not None:
            self.chunk_sum = cp.zeros((r, max(self._state.n_chunks, 1)), dtype=cp.float64)
            self.residual = cp.zeros((r, n_cov), dtype=cp.float64)
            self.loglik_partial = cp.zeros((r, max(1, math.ceil(n_cases / BLOCK))), dtype=cp.float64)
            self.penalised_device = cp.asarray(self._penalised.astype(np.int32))

    def _case_numerators(self) -> Any:
        """Per touched slot (column j, case i), ``q_ij = sum_k y_k x_kj`` over the case's nonzeros of the column,
        added in order (the slot's nonzeros are ``touched_ptr[t] .. touched_ptr[t + 1]``): the batch's numerators
        ``t_j = sum_i c_i q_ij`` are then one launch of ``sccs_numerators`` per batch."""
        d = self.data
        return fixed_sums.segment_sums(d.touched_ptr, d.era_events[d.col_rows] * d.col_values)

    def _load_numerators(self) -> None:
        """``t_j = sum_i c_i q_ij`` of every row (one block per (column, row): a fixed order)."""
        d = self.data
        if d.n_covariates == 0:
            return
        self._kernels.numerators(
            (d.n_covariates, self.capacity), (BLOCK,),
            (d.touched_col_ptr, d.touched_case, self._touched_events, self.case_weights, self.numerator,
             np.int64(d.n_cases), np.int32(d.n_covariates)),
        )

    # -- one cycle -------------------------------------------------------------------------------------
    def _launch_cycle(self, columns: list[_Column]) -> None:
        d, k, r = self.data, self._kernels, self.capacity
        i64, i32 = np.int64, np.int32
        n_eras, n_cases, n_cov = i64(d.n_eras), i64(d.n_cases), i32(d.n_covariates)
        kind = i32(_PRIOR_CODE[self.prior.kind])
        binary = i32(1 if d.binary else 0)
        for column in columns:
            first, cases, blocks = i64(column.first), i32(column.cases), column.blocks
            k.grad_hess(
                (blocks, r), (BLOCK,),
                (first, cases, binary, d.touched_case, d.touched_ptr, d.col_rows, d.col_values, self.w,
                 self.sums, self.weighted_events, self.active, self.partial, i32(self._max_blocks), n_eras, n_cases),
            )
            k.step(
                (r,), (BLOCK,),
                (i32(column.j), i32(blocks), self.partial, i32(self._max_blocks), self.numerator, self.beta,
                 self.trust, self.step, self.active, self.fixed, kind, i32(1 if self._penalised[column.j] else 0),
                 self.variance, n_cov),
            )
            k.update(
                (blocks, r), (BLOCK,),
                (first, cases, d.touched_case, d.touched_ptr, d.col_rows, d.col_values, d.era_length, self.eta,
                 self.w, self.sums, self.step, self.case_weights, n_eras, n_cases),
            )

    def _capture(self) -> None:
        cp = self.cp
        # Load the kernels before capture: one launch of each that does no work (no replicate is active, so
        # the partials and steps are zeroed and nothing else is written; every batch sets its state anew).
        self.active.fill(0)
        self._launch_cycle(self._columns[:1])
        cp.cuda.Device().synchronize()
        with self._stream:
            self._stream.begin_capture()
            try:
                self._launch_cycle(self._columns)
            finally:
                graph = self._stream.end_capture()
        self._graph = graph

    def run_cycle(self) -> None:
        """One cycle over all coordinates for the active replicates (the graph's replay)."""
        # The cycle runs on a non-blocking stream: first let the default stream's writes (state set-up,
        # the convergence snapshot) finish.
        self.cp.cuda.Device().synchronize()
        if self._graph is not None:
            self._graph.launch(self._stream)
        else:
            with self._stream:
                self._launch_cycle(self._columns)
        self._stream.synchronize()

    # -- a batch of fits -------------------------------------------------------------------------------
    def fit_batch(
        self,
        variances: np.ndarray,
        case_weights: Any,
        beta0: Any,
        on_cycle: CycleCallback | None = None,
        fixed_columns: np.ndarray | None = None,
    ) -> list[FitResult]:
        """Fit ``len(variances)`` replicates at once; ``on_cycle(finished, cycle)`` after every cycle.

        ``finished`` counts the replicates that have converged (or all of them once ``max_iterations`` is
        reached); the callback may raise (``JobCancelled``) to abandon the batch between two cycles.
        ``last_timings`` then holds the batch's device-synchronised seconds (setup, cycles, finish).
        ``fixed_columns[r]`` (optional, -1 for none): the coefficient replicate r holds at its ``beta0`` value
        (as ``ccd.fit(..., fixed_column=...)``).
        """
        count = len(variances)
        if not 1 <= count <= self.capacity:
            raise ValueError(f"batch of {count} fits does not fit the engine's capacity {self.capacity}")
        timer = StageTimer(self.cp)
        with timer.stage("setup"):
            active = self._set_up(variances, case_weights, beta0, fixed_columns)
        with timer.stage("cycles"):
            iterations, converged, criterion = self._cycle_until_converged(active, count, on_cycle)
        with timer.stage("finish"):
            results = self._results(np.arange(count), iterations, converged, criterion)
        self.last_timings = dict(timer.seconds)
        return results

    def refit_moved(self, values: np.ndarray, on_cycle: CycleCallback | None = None) -> list[FitResult | None]:
        """Refit the last batch's replicates whose held coefficient gets a new value (``values[r]``; NaN: this
        replicate stays frozen), each from its own state: the held coefficient moves by the sparse update of a
        CCD step (``eta``, ``w`` and ``S`` at its column's nonzeros), the trust region starts afresh, and cycles
        run until the moved replicates converge. Results of the moved replicates, None for the others."""
        count = self._count
        values = np.asarray(values, dtype=np.float64)
        moved = ~np.isnan(values)
        if values.shape != (count,) or np.any(self._fixed_host[:count][moved] < 0):  # (shape first: `or` stops)
            raise ValueError("refit_moved needs one value per replicate of the last batch, each holding a column")
        timer = StageTimer(self.cp)
        with timer.stage("setup"):
            self._move_held(np.flatnonzero(moved), values)
            active = np.zeros(self.capacity, dtype=bool)
            active[:count] = moved
            self.trust.fill(INITIAL_TRUST_REGION)  # a new fit for the moved rows; the frozen ones do not step
            self.active[...] = self.cp.asarray(active.astype(np.int32))
        with timer.stage("cycles"):
            iterations, converged, criterion = self._cycle_until_converged(active, count, on_cycle)
        with timer.stage("finish"):
            results = self._results(np.flatnonzero(moved), iterations, converged, criterion)
        self.last_timings = dict(timer.seconds)
        by_row: list[FitResult | None] = [None] * count
        for r, result in zip(np.flatnonzero(moved).tolist(), results, strict=True):
            by_row[r] = result
        return by_row

    def _move_held(self, rows: np.ndarray, values: np.ndarray) -> None:
        """``b_c = value`` for each row's held column c, with ``eta``, ``w`` and ``S`` updated at the column's
        nonzeros by ``sccs_update`` (one launch per distinct column, the other rows' steps zero)."""
        cp, d = self.cp, self.data
        columns = self._fixed_host[rows]
        delta = values[rows] - self._held_values[rows]
        distinct = np.unique(columns)
        steps = np.zeros((distinct.size, self.capacity))
        steps[np.searchsorted(distinct, columns), rows] = delta
        steps_device = cp.asarray(steps)
        for i, j in enumerate(distinct.tolist()):
            column = self._column_of.get(j)
            if column is None:  # no nonzeros: the linear predictor does not depend on b_j
                continue
            self._kernels.update(
                (column.blocks, self.capacity), (BLOCK,),
                (np.int64(column.first), np.int32(column.cases), d.touched_case, d.touched_ptr, d.col_rows,
                 d.col_values, d.era_length, self.eta, self.w, self.sums, steps_device[i], self.case_weights,
                 np.int64(d.n_eras), np.int64(d.n_cases)),
            )
        self.beta[cp.asarray(rows), cp.asarray(columns)] = cp.asarray(values[rows])
        self._held_values[rows] = values[rows]

    def _set_up(self, variances: np.ndarray, case_weights: Any, beta0: Any,
                fixed_columns: np.ndarray | None = None) -> np.ndarray:
        """Load the batch's weights, starting points, variances and held columns; return which rows are active."""
        cp, d = self.cp, self.data
        count = len(variances)
        self._set_up_fixed(count, beta0, fixed_columns)
        weights = cp.zeros((self.capacity, d.n_cases), dtype=cp.float64)
        weights[:count] = cp.asarray(case_weights, dtype=cp.float64).reshape(count, d.n_cases)
        betas = cp.zeros((self.capacity, d.n_covariates), dtype=cp.float64)
        betas[:count] = cp.asarray(beta0, dtype=cp.float64).reshape(count, d.n_covariates)
        self.case_weights[...] = weights
        self.weighted_events[...] = weights * d.case_events[None, :]
        self._load_numerators()
        self.beta[...] = betas
        self.trust.fill(INITIAL_TRUST_REGION)
        var = np.ones(self.capacity)
        var[:count] = np.asarray(variances, dtype=np.float64) if self.prior.kind != "none" else 1.0
        self.variance[...] = cp.asarray(var)
        self._variance_host = var
        self._set_up_case_state(betas, count)
        active = np.zeros(self.capacity, dtype=bool)
        active[:count] = True
        self.active[...] = cp.asarray(active.astype(np.int32))
        return active

    def _set_up_fixed(self, count: int, beta0: Any, fixed_columns: np.ndarray | None) -> None:
        """The held column of each row (-1: none) and its value (from ``beta0``), on the host and the device."""
        self._count = count
        self._fixed_host.fill(-1)
        self._held_values.fill(0.0)
        if fixed_columns is not None:
            fixed = np.asarray(fixed_columns, dtype=np.int64).reshape(count)
            if np.any((fixed < -1) | (fixed >= self.data.n_covariates)):
                raise ValueError(f"fixed_columns must be -1 or column indices below {self.data.n_covariates}")
            self._fixed_host[:count] = fixed
            held = np.flatnonzero(fixed >= 0)
            starts = np.asarray(to_host(beta0), dtype=np.float64).reshape(count, self.data.n_covariates)
            self._held_values[held] = starts[held, fixed[held]]
        self.fixed[...] = self.cp.asarray(self._fixed_host.astype(np.int32))

    def _set_up_case_state(self, betas: Any, count: int) -> None:
        """``eta = X b``, ``w = L exp(eta)`` and the case sums ``S``, row by row, for the batch's ``count`` rows
        (the rows beyond are inactive: no kernel reads their state with a nonzero weight or step).

        The (R, K) arrays are the batch's largest, so the only temporaries here are (K,) vectors and never an
        (R, K) float64 array (bytes_per_replicate counts the buffers alone). ``w`` is computed in float64 of
        the stored ``eta``, then rounded to the precision, as in the NumPy twin.
        """
        cp, d = self.cp, self.data
        warm = to_host(cp.any(betas != 0.0, axis=1))
        for r in range(count):
            if d.nnz and warm[r]:
                self.eta[r] = model.linear_predictor(d, betas[r])
            else:  # cold start: X b = 0
                self.eta[r] = 0.0
            self.w[r] = d.era_length * cp.exp(self.eta[r].astype(cp.float64))
        for r in range(count):
            self.sums[r] = fixed_sums.case_sums(d, self.w[r]).astype(self.real)

    def _cycle_until_converged(
        self, active: np.ndarray, count: int, on_cycle: CycleCallback | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replay cycles until every replicate has converged or ``max_iterations`` is reached."""
        options = self.options
        iterations = np.zeros(count, dtype=np.int64)
        converged = np.zeros(count, dtype=bool)
        criterion = np.full(count, math.inf)
        for cycle in range(1, options.max_iterations + 1):
            if options.convergence == "xbeta":
                self.eta_start[...] = self.eta
            self.run_cycle()
            live = np.flatnonzero(active[:count])
            iterations[live] = cycle
            values = self._criterion(live)
            criterion[live] = values
            done = live[values <= options.tolerance]
            converged[done] = True
            active[done] = False
            if done.size:
                self.active[...] = self.cp.asarray(active.astype(np.int32))
            if on_cycle is not None:
                finished = count if cycle == options.max_iterations else count - int(active[:count].sum())
                on_cycle(finished, cycle)
            if not active.any():
                break
        return iterations, converged, criterion

    def _prior_of(self, r: int) -> Prior:
        return self.prior.with_variance(float(self._variance_host[r])) if self.prior.kind != "none" else self.prior

    def _fixed_of(self, r: int) -> int | None:
        return int(self._fixed_host[r]) if self._fixed_host[r] >= 0 else None

    def _results(self, rows: np.ndarray, iterations: np.ndarray, converged: np.ndarray,
                 criterion: np.ndarray) -> list[FitResult]:
        """The rows' log-likelihood, log-posterior and KKT residual: from scratch, or from the batch's state (a
        profile engine: its last criterion is the KKT residual of the returned coefficients)."""
        beta_host = to_host(self.beta)
        if self._state is not None:
            log_likelihood = self._state_log_likelihood(rows)
            return [FitResult(beta=beta_host[r].copy(), iterations=int(iterations[r]), converged=bool(converged[r]),
                              log_likelihood=float(log_likelihood[r]),
                              log_posterior=float(log_likelihood[r]) + model.log_prior(beta_host[r], self._prior_of(r)),
                              gradient_norm=float(criterion[r]), criterion=float(criterion[r]))
                    for r in rows.tolist()]
        return [finish(self.data, self._prior_of(r), self.case_weights[r], beta_host[r], int(iterations[r]),
                       bool(converged[r]), float(criterion[r]), self._fixed_of(r))
                for r in rows.tolist()]

    def _state_log_likelihood(self, rows: np.ndarray) -> np.ndarray:
        """The log-likelihood of every row from its ``eta`` and ``w`` (``sccs_case_loglik``; rows not asked for
        are skipped and read 0), as a (capacity,) host array."""
        cp, d, state = self.cp, self.data, self._state
        assert state is not None
        wanted = np.zeros(self.capacity)
        wanted[rows] = 1.0
        weights = self.case_weights * cp.asarray(wanted)[:, None]  # a row not asked for: weights 0, skipped
        self._kernels.case_loglik(
            (self.loglik_partial.shape[1], self.capacity), (BLOCK,),
            (state.case_ptr, d.era_events, state.log_length, self.eta, self.w, d.case_events, weights,
             self.loglik_partial, np.int64(d.n_eras), np.int64(d.n_cases)),
        )
        return to_host(fixed_sums.row_totals(self.loglik_partial))

    def _criterion(self, live: np.ndarray) -> np.ndarray:
        """The convergence criterion of the live replicates after a cycle (see :mod:`kernels.sccs.ccd`)."""
        if self.options.convergence == "xbeta":
            return self._xbeta_criterion(live)
        if self._state is not None:
            return self._state_kkt(live)
        d = self.data
        beta_host = to_host(self.beta)
        return np.asarray([kkt_max(beta_host[r], model.gradient(d, beta_host[r], self.case_weights[r]),
                                   self._prior_of(r), self._fixed_of(r)) for r in live.tolist()])

    def _state_kkt(self, live: np.ndarray) -> np.ndarray:
        """The KKT residual's max-norm of the live (active) rows from the batch's state: two launches."""
        cp, d, state = self.cp, self.data, self._state
        assert state is not None
        if state.n_chunks:
            self._kernels.gradient_chunks(
                (state.n_chunks, self.capacity), (BLOCK,),
                (state.chunk_ptr, d.col_rows, d.col_values, d.era_case, self.w, self.sums, self.weighted_events,
                 self.active, self.chunk_sum, np.int64(self.chunk_sum.shape[1]), np.int64(d.n_eras),
                 np.int64(d.n_cases)),
            )
        else:
            self.chunk_sum.fill(0.0)
        self._kernels.kkt_residual(
            (math.ceil(d.n_covariates / BLOCK), self.capacity), (BLOCK,),
            (state.column_chunk_ptr, self.chunk_sum, np.int64(self.chunk_sum.shape[1]), self.numerator, self.beta,
             self.penalised_device, np.int32(_PRIOR_CODE[self.prior.kind]), self.variance, self.fixed, self.active,
             np.int32(d.n_covariates), self.residual),
        )
        return to_host(cp.max(self.residual, axis=1))[live] if d.n_covariates else np.zeros(live.size)

    def _xbeta_criterion(self, live: np.ndarray) -> np.ndarray:
        """The paper's criterion: block partials per row (``sccs_xbeta_change``), each row added in a fixed order."""
        d = self.data
        self._kernels.xbeta_change(
            (self._xbeta_blocks, self.capacity), (BLOCK,),
            (self.eta, self.eta_start, d.era_case, self.case_weights, self.active, np.int64(d.n_eras),
             np.int64(d.n_cases), self.xbeta_partial),
        )
        out = to_host(fixed_sums.row_totals(self.xbeta_partial)).reshape(self.capacity, 2)
        return out[live, 0] / (1.0 + out[live, 1])


def fit(
    data: SccsData,
    prior: Prior,
    options: FitOptions = FitOptions(),  # noqa: B008 - frozen dataclass, safe default
    case_weights: Any | None = None,
    beta0: Any | None = None,
    use_graph: bool = True,
) -> FitResult:
    """One MAP fit on the GPU (the batch engine with one replicate)."""
    cp = _cupy()
    engine = BatchEngine(data, prior, options, capacity=1, use_graph=use_graph)
    d = engine.data
    weights = cp.ones(d.n_cases) if case_weights is None else cp.asarray(case_weights, dtype=cp.float64)
    start = cp.zeros(d.n_covariates) if beta0 is None else cp.asarray(beta0, dtype=cp.float64)
    return engine.fit_batch(np.asarray([prior.variance]), weights[None, :], start[None, :])[0]


def batch_fitter(data: SccsData, prior: Prior, options: FitOptions, capacity: int) -> BatchFitter:
    """A :data:`ccd.BatchFitter` running up to ``capacity`` fits at once on the GPU (larger batches in chunks)."""
    engine = BatchEngine(data, prior, options, capacity)

    def fit_batch(
        variances: np.ndarray, case_weights: np.ndarray, beta0: np.ndarray, on_cycle: CycleCallback | None
    ) -> list[FitResult]:
        results: list[FitResult] = []
        for first in range(0, len(variances), capacity):
            last = min(first + capacity, len(variances))
            chunk = engine.fit_batch(
                np.asarray(variances[first:last]), case_weights[first:last], beta0[first:last],
                offset_callback(on_cycle, first),
            )
            results.extend(chunk)
        return results

    return fit_batch


def xbeta_blocks(n_eras: int) -> int:
    """Blocks per replicate of the X b criterion (by the number of eras alone: the same in every batch)."""
    return min(1024, max(1, math.ceil(n_eras / (BLOCK * XBETA_ITEMS))))


def bytes_per_replicate(data: SccsData, precision: str, state_gradient: bool = False) -> int:
    """Peak device bytes one more replicate of a batch costs (engine buffers + batch temporaries).

    * per era (K): ``eta``, ``eta_start``, ``w`` in ``precision`` (the set-up works row by row, so its
      float64 temporaries are (K,) vectors whatever the batch size);
    * per case (N): ``sums`` in ``precision``; ``case_weights`` and ``weighted_events`` (float64); while a
      batch starts, (R, N) float64 temporaries: the bootstrap's resample counts (drawn one replicate at a
      time, so the Philox temporaries are (N,) vectors), the padded weights, their transpose and the
      weighted-events product, counted as 6 float64 to leave room for the memory pool's rounding; and
      cross-validation's training and held-out weights of each fold (2 float64), on the device for the whole grid;
    * per covariate (J): ``numerator``, ``beta``, ``trust`` (float64) and the step partials; the X b
      criterion's block partials;
    * a profile engine (``state_gradient``) adds its gradient chunks' sums, the KKT residuals (J), the
      log-likelihood's block partials and its masked case weights (N, float64).
    """
    real = 4 if precision == "float32" else 8
    per_era = 3 * real
    per_case = real + 2 * 8 + 8 * 8
    per_covariate = 3 * 8
    partials = 2 * 8 * max(1, math.ceil(data.max_touched() / BLOCK)) + 8 + 8 + 4 + 4 + 2 * 8
    partials += 2 * 8 * xbeta_blocks(data.n_eras)
    if state_gradient:
        chunks = data.nnz // GRADIENT_CHUNK + data.n_covariates + 1
        per_case += 8
        per_covariate += 8
        partials += 8 * chunks + 8 * math.ceil(data.n_cases / BLOCK)
    return data.n_eras * per_era + data.n_cases * per_case + data.n_covariates * per_covariate + partials


def capacity_for(data: SccsData, precision: str, replicates: int, memory_bytes: int,
                 state_gradient: bool = False) -> int:
    """How many replicates fit in ``memory_bytes`` of device memory (at least 1, at most ``replicates``)."""
    per_replicate = max(bytes_per_replicate(data, precision, state_gradient), 1)
    return max(1, min(replicates, memory_bytes // per_replicate))
