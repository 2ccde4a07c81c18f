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

One cycle over all coordinates (3 J launches) is captured once into a CUDA graph and replayed per cycle;
the host only reads the per-replicate convergence criterion after each cycle, and then reports progress
through the batch's ``on_cycle`` callback (which may raise ``JobCancelled``: the cancel point, between two
cycles of the whole batch). A batch of ``R`` fits (CV folds, bootstrap replicates) shares the design and the
case index; each replicate has its own case weights, variance, ``b``, ``eta``, ``w`` and ``S`` (row ``r`` of
(R, .) arrays), and a replicate that has converged is frozen, so each replicate's result is the single fit's.
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
from kernels.sccs import model
from kernels.sccs.ccd import (
    INITIAL_TRUST_REGION,
    BatchFitter,
    CycleCallback,
    FitOptions,
    FitResult,
    finish,
    offset_callback,
)
from kernels.sccs.data import SccsData
from kernels.sccs.model import Prior
from kernels.timing import StageTimer

BLOCK = 256  # threads per block of every kernel (a power of two: the shared reductions halve it)
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
    """The four kernels of ``ccd.cu`` compiled for one precision (cached by :mod:`kernels.cuda`)."""

    grad_hess: Any
    step: Any
    update: Any
    xbeta_change: Any

    @classmethod
    def load(cls, precision: str) -> _Kernels:
        module = cuda.module(_CCD, {**cuda.real_define(_REAL[precision]), "BLOCK": BLOCK})
        return cls(*(module.get_function(name) for name in
                     ("sccs_grad_hess", "sccs_step", "sccs_update", "sccs_xbeta_change")))


@dataclass(frozen=True)
class _Column:
    """One coordinate with nonzeros: its touched-case slots ``first .. first + cases - 1``."""

    j: int
    first: int
    cases: int

    @property
    def blocks(self) -> int:
        return math.ceil(self.cases / BLOCK)


class BatchEngine:
    """Device buffers, kernels and the captured cycle graph for fits of ``capacity`` replicates at once."""

    def __init__(self, data: SccsData, prior: Prior, options: FitOptions, capacity: int, use_graph: bool = True):
        cp = _cupy()
        if is_numpy(array_namespace(data.era_case)):
            data = data.to(cp)
        self.cp, self.data, self.prior, self.options, self.capacity = cp, data, prior, options, capacity
        self.real = _REAL[options.precision]
        self._kernels = _Kernels.load(options.precision)
        touched_ptr = to_host(data.touched_col_ptr)
        self._columns = [
            _Column(j, int(touched_ptr[j]), int(touched_ptr[j + 1] - touched_ptr[j]))
            for j in range(data.n_covariates)
            if touched_ptr[j + 1] > touched_ptr[j]
        ]
        self._max_blocks = max([column.blocks for column in self._columns], default=1)
        self._penalised = prior.penalised.astype(bool)
        self._allocate()
        self._numerator_matrix = self._case_numerators()
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
        self.xbeta_out = cp.zeros((r, 2), dtype=cp.float64)

    def _case_numerators(self) -> Any:
        """Per touched case, ``sum_k y_k x_kj`` over its nonzeros of column j, as a sparse (J x N) matrix: the
        batch's numerators ``t_j = sum_i c_i q_ij`` are then one product with the case weights.

        The case index is this matrix in CSR form already (column j's touched cases, increasing, one slot per
        (column, case)), so it is built without a sort and declared canonical."""
        import cupyx.scipy.sparse as cusparse

        cp, d = self.cp, self.data
        q = cp.bincount(d.nnz_touched, weights=d.era_events[d.col_rows] * d.col_values,
                        minlength=int(d.touched_case.shape[0]))
        matrix = cusparse.csr_matrix((q, d.touched_case, d.touched_col_ptr), shape=(d.n_covariates, d.n_cases))
        matrix.has_canonical_format = True
        return matrix

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
                 self.trust, self.step, self.active, kind, i32(1 if self._penalised[column.j] else 0),
                 self.variance, n_cov),
            )
            k.update(
                (blocks, r), (BLOCK,),
                (first, cases, d.touched_case, d.touched_ptr, d.col_rows, d.col_values, d.era_length, self.eta,
                 self.w, self.sums, self.step, n_eras, n_cases),
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
    ) -> list[FitResult]:
        """Fit ``len(variances)`` replicates at once; ``on_cycle(finished, cycle)`` after every cycle.

        ``finished`` counts the replicates that have converged (or all of them once ``max_iterations`` is
        reached); the callback may raise (``JobCancelled``) to abandon the batch between two cycles.
        ``last_timings`` then holds the batch's device-synchronised seconds (setup, cycles, finish).
        """
        count = len(variances)
        if not 1 <= count <= self.capacity:
            raise ValueError(f"batch of {count} fits does not fit the engine's capacity {self.capacity}")
        timer = StageTimer(self.cp)
        with timer.stage("setup"):
            active = self._set_up(variances, case_weights, beta0)
        with timer.stage("cycles"):
            iterations, converged, criterion = self._cycle_until_converged(active, count, on_cycle)
        with timer.stage("finish"):
            results = self._results(variances, iterations, converged, criterion)
        self.last_timings = dict(timer.seconds)
        return results

    def _set_up(self, variances: np.ndarray, case_weights: Any, beta0: Any) -> np.ndarray:
        """Load the batch's weights, starting points and variances; return which rows are active."""
        cp, d = self.cp, self.data
        count = len(variances)
        weights = cp.zeros((self.capacity, d.n_cases), dtype=cp.float64)
        weights[:count] = cp.asarray(case_weights, dtype=cp.float64).reshape(count, d.n_cases)
        betas = cp.zeros((self.capacity, d.n_covariates), dtype=cp.float64)
        betas[:count] = cp.asarray(beta0, dtype=cp.float64).reshape(count, d.n_covariates)
        self.case_weights[...] = weights
        self.weighted_events[...] = weights * d.case_events[None, :]
        self.numerator[...] = (self._numerator_matrix @ cp.ascontiguousarray(weights.T)).T
        self.beta[...] = betas
        self.trust.fill(INITIAL_TRUST_REGION)
        var = np.ones(self.capacity)
        var[:count] = np.asarray(variances, dtype=np.float64) if self.prior.kind != "none" else 1.0
        self.variance[...] = cp.asarray(var)
        self._set_up_case_state(betas)
        active = np.zeros(self.capacity, dtype=bool)
        active[:count] = True
        self.active[...] = cp.asarray(active.astype(np.int32))
        return active

    def _set_up_case_state(self, betas: Any) -> None:
        """``eta = X b``, ``w = L exp(eta)`` and the case sums ``S``, row by row.

        The (R, K) arrays are the batch's largest, so the only temporaries here are (K,) vectors and never an
        (R, K) float64 array (bytes_per_replicate counts the buffers alone). ``w`` is computed in float64 of
        the stored ``eta``, then rounded to the precision, as in the NumPy twin.
        """
        cp, d = self.cp, self.data
        design = model.design_matrix(d) if d.nnz else None
        warm = to_host(cp.any(betas != 0.0, axis=1))
        for r in range(self.capacity):
            if design is not None and warm[r]:
                self.eta[r] = design @ betas[r]
            else:  # cold start: X b = 0
                self.eta[r] = 0.0
            self.w[r] = d.era_length * cp.exp(self.eta[r].astype(cp.float64))
        for r in range(self.capacity):
            self.sums[r] = cp.bincount(d.era_case, weights=self.w[r], minlength=d.n_cases).astype(self.real)

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

    def _results(self, variances: np.ndarray, iterations: np.ndarray, converged: np.ndarray,
                 criterion: np.ndarray) -> list[FitResult]:
        """Each replicate's log-likelihood, log-posterior and KKT residual, evaluated from scratch."""
        beta_host = to_host(self.beta[:len(variances)])
        results = []
        for r in range(len(variances)):
            prior_r = self.prior.with_variance(float(variances[r])) if self.prior.kind != "none" else self.prior
            results.append(
                finish(self.data, prior_r, self.case_weights[r], beta_host[r], int(iterations[r]),
                       bool(converged[r]), float(criterion[r]))
            )
        return results

    def _criterion(self, live: np.ndarray) -> np.ndarray:
        """The convergence criterion of the live replicates after a cycle (see :mod:`kernels.sccs.ccd`)."""
        if self.options.convergence == "xbeta":
            return self._xbeta_criterion(live)
        d = self.data
        beta_host = to_host(self.beta)
        values = []
        for r in live.tolist():
            prior_r = self.prior
            if self.prior.kind != "none":
                prior_r = self.prior.with_variance(float(to_host(self.variance[r])))
            grad = to_host(model.gradient(d, beta_host[r], self.case_weights[r]))
            values.append(float(np.max(model.kkt_residual(beta_host[r], grad, prior_r), initial=0.0)))
        return np.asarray(values)

    def _xbeta_criterion(self, live: np.ndarray) -> np.ndarray:
        d = self.data
        self.xbeta_out.fill(0.0)
        blocks = min(1024, max(1, math.ceil(d.n_eras / BLOCK / 8)))
        self._kernels.xbeta_change(
            (blocks, self.capacity), (BLOCK,),
            (self.eta, self.eta_start, d.era_case, self.case_weights, np.int64(d.n_eras), np.int64(d.n_cases),
             self.xbeta_out),
        )
        out = to_host(self.xbeta_out)
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


def bytes_per_replicate(data: SccsData, precision: str) -> int:
    """Peak device bytes one more replicate of a batch costs (engine buffers + batch temporaries).

    * per era (K): ``eta``, ``eta_start``, ``w`` in ``precision`` (the set-up works row by row, so its
      float64 temporaries are (K,) vectors whatever the batch size);
    * per case (N): ``sums`` in ``precision``; ``case_weights`` and ``weighted_events`` (float64); while a
      batch starts, (R, N) float64 temporaries: the bootstrap's resample counts (drawn one replicate at a
      time, so the Philox temporaries are (N,) vectors), the padded weights, their transpose and the
      weighted-events product, counted as 6 float64 to leave room for the memory pool's rounding;
    * per covariate (J): ``numerator``, ``beta``, ``trust`` (float64) and the step partials.
    """
    real = 4 if precision == "float32" else 8
    per_era = 3 * real
    per_case = real + 2 * 8 + 6 * 8
    per_covariate = 3 * 8
    partials = 2 * 8 * max(1, math.ceil(data.max_touched() / BLOCK)) + 8 + 8 + 4 + 2 * 8
    return data.n_eras * per_era + data.n_cases * per_case + data.n_covariates * per_covariate + partials


def capacity_for(data: SccsData, precision: str, replicates: int, memory_bytes: int) -> int:
    """How many replicates fit in ``memory_bytes`` of device memory (at least 1, at most ``replicates``)."""
    return max(1, min(replicates, memory_bytes // max(bytes_per_replicate(data, precision), 1)))
