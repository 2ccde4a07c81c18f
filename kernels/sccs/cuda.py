"""The CCD fit on the GPU: the whole coordinate loop on the device, batched over case-weight vectors.

Per coordinate ``j`` three kernels run, with nothing crossing to the host:

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
cycles of the whole batch). A batch of ``R`` fits
(CV folds, bootstrap replicates) shares the design and the case index; each replicate has its own case
weights, variance, ``b``, ``eta``, ``w`` and ``S`` (row ``r`` of (R, .) arrays), and a replicate that has
converged is frozen, so each replicate's result is the single fit's. :mod:`kernels.sccs.ccd` is the NumPy
twin (same per-coordinate arithmetic; sums differ in order only).
"""

from __future__ import annotations

import math
import time
from types import ModuleType
from typing import Any

import numpy as np

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
from kernels.sccs.data import SccsData, repeat_by_counts
from kernels.sccs.model import Prior

BLOCK = 256
_PRIOR_CODE = {"none": 0, "normal": 1, "laplace": 2}

_SOURCE = r"""
typedef REAL real;

__device__ __forceinline__ void block_sum2(double* sg, double* sh, double g, double h) {
    sg[threadIdx.x] = g; sh[threadIdx.x] = h;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            sg[threadIdx.x] += sg[threadIdx.x + half];
            sh[threadIdx.x] += sh[threadIdx.x + half];
        }
        __syncthreads();
    }
}

extern "C" __global__ void sccs_grad_hess(
    const long long t_begin, const int m, const int binary,
    const long long* __restrict__ touched_case, const long long* __restrict__ touched_ptr,
    const long long* __restrict__ col_rows, const double* __restrict__ col_values,
    const real* __restrict__ w, const real* __restrict__ sums, const double* __restrict__ weighted_events,
    const int* __restrict__ active, double* __restrict__ partial, const int partial_stride,
    const long long n_eras, const long long n_cases)
{
    __shared__ double sg[BLOCKSIZE];
    __shared__ double sh[BLOCKSIZE];
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    double g = 0.0, h = 0.0;
    if (t < m && active[r]) {
        const long long slot = t_begin + t;
        const long long c = touched_case[slot];
        const real* wr = w + (long long)r * n_eras;
        double a = 0.0, b = 0.0;
        for (long long p = touched_ptr[slot]; p < touched_ptr[slot + 1]; ++p) {
            const double x = col_values[p];
            const double wx = (double)wr[col_rows[p]] * x;
            a += wx;
            b += wx * x;
        }
        if (binary) b = a;
        const double s = (double)sums[(long long)r * n_cases + c];
        const double ce = weighted_events[(long long)r * n_cases + c];
        const double share = a / s;
        g = ce * share;
        h = ce * (b / s - share * share);
    }
    block_sum2(sg, sh, g, h);
    if (threadIdx.x == 0) {
        double* out = partial + 2 * ((long long)r * partial_stride + blockIdx.x);
        out[0] = sg[0];
        out[1] = sh[0];
    }
}

extern "C" __global__ void sccs_step(
    const int j, const int nblocks, const double* __restrict__ partial, const int partial_stride,
    const double* __restrict__ numerator, double* __restrict__ beta, double* __restrict__ trust,
    double* __restrict__ step_out, const int* __restrict__ active, const int kind, const int penalised,
    const double* __restrict__ variance, const int n_cov)
{
    __shared__ double sg[BLOCKSIZE];
    __shared__ double sh[BLOCKSIZE];
    const int r = blockIdx.x;
    double g = 0.0, h = 0.0;
    for (int b = threadIdx.x; b < nblocks; b += blockDim.x) {
        const double* in = partial + 2 * ((long long)r * partial_stride + b);
        g += in[0];
        h += in[1];
    }
    block_sum2(sg, sh, g, h);
    if (threadIdx.x != 0) return;
    if (!active[r]) { step_out[r] = 0.0; return; }
    const long long at = (long long)r * n_cov + j;
    const double grad = -(numerator[at] - sg[0]);
    const double hess = sh[0];
    const double bj = beta[at];
    const double v = variance[r];
    double step;
    if (kind == 1 && penalised) {
        step = -(grad + bj / v) / (hess + 1.0 / v);
    } else if (kind == 2 && penalised) {
        const double rate = sqrt(2.0 / v);
        if (hess <= 0.0) {
            step = 0.0;
        } else if (bj == 0.0) {
            step = -(grad + rate) / hess;
            if (step <= 0.0) {
                step = -(grad - rate) / hess;
                if (step >= 0.0) step = 0.0;
            }
        } else {
            const double sign = bj > 0.0 ? 1.0 : -1.0;
            step = -(grad + rate * sign) / hess;
            if ((bj + step) * sign < 0.0) step = -bj;
        }
    } else {
        step = hess > 0.0 ? -grad / hess : 0.0;
    }
    const double width = trust[at];
    step = fmin(fmax(step, -width), width);
    trust[at] = fmax(2.0 * fabs(step), 0.5 * width);
    beta[at] = bj + step;
    step_out[r] = step;
}

extern "C" __global__ void sccs_update(
    const long long t_begin, const int m,
    const long long* __restrict__ touched_case, const long long* __restrict__ touched_ptr,
    const long long* __restrict__ col_rows, const double* __restrict__ col_values,
    const double* __restrict__ era_length, real* __restrict__ eta, real* __restrict__ w,
    real* __restrict__ sums, const double* __restrict__ step, const long long n_eras, const long long n_cases)
{
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const double d = step[r];
    if (d == 0.0) return;
    const long long slot = t_begin + t;
    const long long c = touched_case[slot];
    real* er = eta + (long long)r * n_eras;
    real* wr = w + (long long)r * n_eras;
    double change = 0.0;
    for (long long p = touched_ptr[slot]; p < touched_ptr[slot + 1]; ++p) {
        const long long k = col_rows[p];
        const real e = er[k] + (real)(d * col_values[p]);
        const real fresh = (real)(era_length[k] * exp((double)e));
        change += (double)fresh - (double)wr[k];
        er[k] = e;
        wr[k] = fresh;
    }
    sums[(long long)r * n_cases + c] += (real)change;
}

extern "C" __global__ void sccs_xbeta_change(
    const real* __restrict__ eta, const real* __restrict__ eta_start, const long long* __restrict__ era_case,
    const double* __restrict__ case_weights, const long long n_eras, const long long n_cases,
    double* __restrict__ out)
{
    __shared__ double sg[BLOCKSIZE];
    __shared__ double sh[BLOCKSIZE];
    const int r = blockIdx.y;
    double change = 0.0, size = 0.0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n_eras; k += stride) {
        const double c = case_weights[(long long)r * n_cases + era_case[k]];
        const double e = (double)eta[(long long)r * n_eras + k];
        change += c * fabs(e - (double)eta_start[(long long)r * n_eras + k]);
        size += c * fabs(e);
    }
    block_sum2(sg, sh, change, size);
    if (threadIdx.x == 0) {
        atomicAdd(out + 2 * r, sg[0]);
        atomicAdd(out + 2 * r + 1, sh[0]);
    }
}
"""


class _Clock:
    """Device-synchronised lap times (seconds since the previous lap)."""

    def __init__(self, cp: ModuleType) -> None:
        self._cp = cp
        cp.cuda.Device().synchronize()
        self._last = time.perf_counter()

    def lap(self) -> float:
        self._cp.cuda.Device().synchronize()
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        return seconds


def _cupy() -> ModuleType:
    import cupy

    return cupy


class BatchEngine:
    """Device buffers, kernels and the captured cycle graph for fits of ``capacity`` replicates at once."""

    def __init__(self, data: SccsData, prior: Prior, options: FitOptions, capacity: int, use_graph: bool = True):
        cp = _cupy()
        if isinstance(data.era_case, np.ndarray):
            data = data.to(cp)
        self.cp, self.data, self.prior, self.options, self.capacity = cp, data, prior, options, capacity
        self.real = cp.float32 if options.precision == "float32" else cp.float64
        source = _SOURCE.replace("REAL", "float" if self.real == cp.float32 else "double").replace(
            "BLOCKSIZE", str(BLOCK)
        )
        module = cp.RawModule(code=source, options=("--std=c++17",))
        self._grad_hess = module.get_function("sccs_grad_hess")
        self._step = module.get_function("sccs_step")
        self._update = module.get_function("sccs_update")
        self._xbeta = module.get_function("sccs_xbeta_change")

        n_eras, n_cases, n_cov = data.n_eras, data.n_cases, data.n_covariates
        touched_ptr = data.touched_col_ptr.get()
        self._columns = [
            (j, int(touched_ptr[j]), int(touched_ptr[j + 1] - touched_ptr[j]))
            for j in range(n_cov)
            if touched_ptr[j + 1] > touched_ptr[j]
        ]
        self._max_blocks = max([math.ceil(m / BLOCK) for _, _, m in self._columns], default=1)
        self._penalised = prior.penalised.astype(bool)
        r = capacity
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
        # Per touched case: sum_k y_k x_kj over its nonzeros (t_j = sum_i c_i q_ij), as a sparse (J x N) matrix.
        q = cp.bincount(data.nnz_touched, weights=data.era_events[data.col_rows] * data.col_values,
                        minlength=int(data.touched_case.shape[0]))
        touched_col = repeat_by_counts(cp, cp.arange(n_cov, dtype=cp.int64), cp.diff(data.touched_col_ptr))
        import cupyx.scipy.sparse as cusparse

        self._numerator_matrix = cusparse.coo_matrix(
            (q, (touched_col, data.touched_case)), shape=(n_cov, n_cases)
        ).tocsr()
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

    # -- one cycle -------------------------------------------------------------------------------------
    def _launch_cycle(self) -> None:
        cp, d = self.cp, self.data
        r = self.capacity
        i64, i32 = np.int64, np.int32
        n_eras, n_cases, n_cov = i64(d.n_eras), i64(d.n_cases), i32(d.n_covariates)
        kind = i32(_PRIOR_CODE[self.prior.kind])
        binary = i32(1 if d.binary else 0)
        for j, t_begin, m in self._columns:
            blocks = math.ceil(m / BLOCK)
            self._grad_hess(
                (blocks, r), (BLOCK,),
                (i64(t_begin), i32(m), binary, d.touched_case, d.touched_ptr, d.col_rows, d.col_values, self.w,
                 self.sums, self.weighted_events, self.active, self.partial, i32(self._max_blocks), n_eras, n_cases),
            )
            self._step(
                (r,), (BLOCK,),
                (i32(j), i32(blocks), self.partial, i32(self._max_blocks), self.numerator, self.beta, self.trust,
                 self.step, self.active, kind, i32(1 if self._penalised[j] else 0), self.variance, n_cov),
            )
            self._update(
                (blocks, r), (BLOCK,),
                (i64(t_begin), i32(m), d.touched_case, d.touched_ptr, d.col_rows, d.col_values, d.era_length,
                 self.eta, self.w, self.sums, self.step, n_eras, n_cases),
            )
        del cp

    def _capture(self) -> None:
        cp = self.cp
        # Load the module's kernels before capture (a launch that does no work).
        self.active.fill(0)
        self._launch_cycle()
        cp.cuda.Device().synchronize()
        with self._stream:
            self._stream.begin_capture()
            try:
                self._launch_cycle()
            finally:
                graph = self._stream.end_capture()
        self._graph = graph

    def _run_cycle(self) -> None:
        # The cycle runs on a non-blocking stream: first let the default stream's writes (state set-up,
        # the convergence snapshot) finish.
        self.cp.cuda.Device().synchronize()
        if self._graph is not None:
            self._graph.launch(self._stream)
            self._stream.synchronize()
        else:
            with self._stream:
                self._launch_cycle()
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
        """
        cp, d, options = self.cp, self.data, self.options
        count = len(variances)
        if not 1 <= count <= self.capacity:
            raise ValueError(f"batch of {count} fits does not fit the engine's capacity {self.capacity}")
        clock = _Clock(cp)
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
        # Set-up row by row: the (R, K) arrays are the batch's largest, so the only temporaries here are (K,)
        # vectors and never an (R, K) float64 array (bytes_per_replicate counts the buffers alone).
        # w = L exp(eta) in float64 of the stored eta, then rounded to the precision, as the NumPy twin.
        design = model.design_matrix(d) if d.nnz else None
        warm = cp.any(betas != 0.0, axis=1).get()
        for r in range(self.capacity):
            if design is not None and warm[r]:
                self.eta[r] = design @ betas[r]
            else:  # cold start: X b = 0
                self.eta[r] = 0.0
            self.w[r] = d.era_length * cp.exp(self.eta[r].astype(cp.float64))
        for r in range(self.capacity):
            self.sums[r] = cp.bincount(d.era_case, weights=self.w[r], minlength=d.n_cases).astype(self.real)
        active = np.zeros(self.capacity, dtype=bool)
        active[:count] = True
        self.active[...] = cp.asarray(active.astype(np.int32))
        iterations = np.zeros(count, dtype=np.int64)
        converged = np.zeros(count, dtype=bool)
        criterion = np.full(count, math.inf)
        timings = {"setup": clock.lap()}
        for cycle in range(1, options.max_iterations + 1):
            if options.convergence == "xbeta":
                self.eta_start[...] = self.eta
            self._run_cycle()
            live = np.flatnonzero(active[:count])
            iterations[live] = cycle
            values = self._criterion(live)
            criterion[live] = values
            done = live[values <= options.tolerance]
            converged[done] = True
            active[done] = False
            if done.size:
                self.active[...] = cp.asarray(active.astype(np.int32))
            if on_cycle is not None:
                finished = count if cycle == options.max_iterations else count - int(active[:count].sum())
                on_cycle(finished, cycle)
            if not active.any():
                break
        timings["cycles"] = clock.lap()
        results = []
        beta_host = self.beta[:count].get()
        for r in range(count):
            prior_r = self.prior.with_variance(float(variances[r])) if self.prior.kind != "none" else self.prior
            results.append(
                finish(d, prior_r, self.case_weights[r], beta_host[r], int(iterations[r]), bool(converged[r]),
                       float(criterion[r]))
            )
        timings["finish"] = clock.lap()
        self.last_timings = timings
        return results

    def _criterion(self, live: np.ndarray) -> np.ndarray:
        cp, d = self.cp, self.data
        if self.options.convergence == "xbeta":
            self.xbeta_out.fill(0.0)
            blocks = min(1024, max(1, math.ceil(d.n_eras / BLOCK / 8)))
            self._xbeta(
                (blocks, self.capacity), (BLOCK,),
                (self.eta, self.eta_start, d.era_case, self.case_weights, np.int64(d.n_eras), np.int64(d.n_cases),
                 self.xbeta_out),
            )
            out = self.xbeta_out.get()
            return out[live, 0] / (1.0 + out[live, 1])
        beta_host = self.beta.get()
        values = []
        for r in live.tolist():
            prior_r = self.prior
            if self.prior.kind != "none":
                prior_r = self.prior.with_variance(float(self.variance[r].get()))
            grad = model.gradient(d, beta_host[r], self.case_weights[r]).get()
            values.append(float(np.max(model.kkt_residual(beta_host[r], grad, prior_r), initial=0.0)))
        del cp
        return np.asarray(values)


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
