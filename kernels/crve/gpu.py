"""CuPy kernels of the CRVE estimators, each with its NumPy twin named in its docstring.

- ``pair_statistics_gpu``: the one pass over the N rows, X_p'X_p and X_p'y_p per group (twin:
  ``bootstrap.pair_statistics``). Rows sorted by group (sorted once if they are not) are cut into tiles
  of at most ``TILE_ROWS`` rows of one group; a block accumulates its tile's k(k+1)/2 + k sums in
  registers, reduces them across the block, and a second pass adds each group's tiles in order, so the
  result is deterministic (no floating-point atomics).
- ``cgm_cluster_statistics_gpu``: the Monte Carlo's data generated in registers from Philox, one warp per
  (replication, cluster), reduced to X_g'X_g, X_g'y_g at once; the R x G x m data never touch memory
  (twin: ``montecarlo.cluster_statistics_numpy``).
- ``weights_gpu``: bootstrap weights at their Philox addresses in one kernel (twin: ``weights.weights_at``).

CuPy is imported inside the functions; this module imports with NumPy alone.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from kernels.rng import PHILOX_CUDA_SOURCE

TILE_ROWS = 2048
_THREADS = 256
_WEIGHT_CODES = {"rademacher": 0, "webb": 1, "mammen": 2, "norm": 3}

_CROSSPROD_SOURCE = r"""
#define NSTAT (K * (K + 1) / 2 + K)
#define WARPS (THREADS / 32)

extern "C" __global__ void __launch_bounds__(THREADS) tile_crossprod(
        const double* __restrict__ x, const double* __restrict__ y,
        const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
        double* __restrict__ tile_out) {
    const long long start = tile_start[blockIdx.x], end = tile_end[blockIdx.x];
    double acc[NSTAT];
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) acc[s] = 0.0;
    for (long long i = start + threadIdx.x; i < end; i += THREADS) {
        double xi[K];
        #pragma unroll
        for (int a = 0; a < K; ++a) xi[a] = x[i * K + a];
        const double yi = y[i];
        int s = 0;
        #pragma unroll
        for (int a = 0; a < K; ++a) {
            #pragma unroll
            for (int b = a; b < K; ++b) acc[s++] += xi[a] * xi[b];
        }
        #pragma unroll
        for (int a = 0; a < K; ++a) acc[s++] += xi[a] * yi;
    }
    __shared__ double partial[WARPS][NSTAT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) {
        double v = acc[s];
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) partial[warp][s] = v;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < NSTAT; s += THREADS) {
        double total = 0.0;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) total += partial[w][s];
        tile_out[(long long)blockIdx.x * NSTAT + s] = total;
    }
}

// Each group's tiles are consecutive: add them in order (deterministic).
extern "C" __global__ void group_tiles(
        const double* __restrict__ tile_out, const long long* __restrict__ first_tile,
        const long long* __restrict__ n_tiles, long long n_groups, double* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_groups * NSTAT) return;
    const long long g = idx / NSTAT, s = idx % NSTAT;
    double total = 0.0;
    for (long long t = first_tile[g]; t < first_tile[g] + n_tiles[g]; ++t) total += tile_out[t * NSTAT + s];
    out[idx] = total;
}
"""

_CGM_SOURCE = r"""
#define KM1 (K - 1)
#define NSTAT (K * (K + 1) / 2 + K)

// One warp per (replication, cluster). Philox addresses as in kernels/crve/montecarlo.py.
extern "C" __global__ void cgm_cluster_stats(
        unsigned long long seed, long long first_rep, long long n_rep, long long n_clusters, long long m,
        double* __restrict__ xtx_out, double* __restrict__ xty_out) {
    const long long warp_id = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp_id >= n_rep * n_clusters) return;  // whole warps leave together
    const long long r = first_rep + warp_id / n_clusters, g = warp_id % n_clusters;
    const long long cluster_address = r * n_clusters + g;
    double mine = 0.0;
    if (lane < KM1) mine = gpuest_normal(seed, 1ull, (unsigned long long)(cluster_address * KM1 + lane));
    else if (lane == KM1) mine = gpuest_normal(seed, 2ull, (unsigned long long)cluster_address);
    double e_g[KM1];
    #pragma unroll
    for (int j = 0; j < KM1; ++j) e_g[j] = __shfl_sync(0xffffffffu, mine, j);
    const double u_g = __shfl_sync(0xffffffffu, mine, KM1);

    double acc[NSTAT];
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) acc[s] = 0.0;
    const long long n_obs = n_clusters * m;
    for (long long i = lane; i < m; i += 32) {
        const long long obs = r * n_obs + g * m + i;
        double x[K];
        x[0] = 1.0;
        double slope_sum = 0.0;
        #pragma unroll
        for (int j = 0; j < KM1; ++j) {
            x[j + 1] = gpuest_normal(seed, 3ull, (unsigned long long)(obs * KM1 + j)) + e_g[j];
            slope_sum += x[j + 1];
        }
        const double y = (1.0 + slope_sum) + gpuest_normal(seed, 4ull, (unsigned long long)obs) + u_g;
        int s = 0;
        #pragma unroll
        for (int a = 0; a < K; ++a) {
            #pragma unroll
            for (int b = a; b < K; ++b) acc[s++] += x[a] * x[b];
        }
        #pragma unroll
        for (int a = 0; a < K; ++a) acc[s++] += x[a] * y;
    }
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) {
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc[s] += __shfl_down_sync(0xffffffffu, acc[s], offset);
    }
    if (lane == 0) {
        double* xtx = xtx_out + warp_id * K * K;
        double* xty = xty_out + warp_id * K;
        int s = 0;
        #pragma unroll
        for (int a = 0; a < K; ++a) {
            #pragma unroll
            for (int b = a; b < K; ++b) { xtx[a * K + b] = acc[s]; xtx[b * K + a] = acc[s]; ++s; }
        }
        #pragma unroll
        for (int a = 0; a < K; ++a) xty[a] = acc[s++];
    }
}
"""

_WEIGHTS_BODY = r"""
const long long per_rep = n_h * n_b;
const long long rep = i / per_rep, rest = i % per_rep;
const long long h = rest / n_b, b = rest % n_b;
const unsigned long long index =
    (unsigned long long)(base + ((rep0 + rep) * draws_per_rep + first + b) * n_h + h);
if (kind == 0) {
    v = gpuest_rademacher(seed, 5ull, index);
} else if (kind == 3) {
    v = gpuest_normal(seed, 5ull, index);
} else {
    gpuest_u32x4 w = gpuest_philox4x32(seed, 5ull, index);
    const double u = gpuest_unit_interval(w.x, w.y);
    if (kind == 1) {
        long long pick = (long long)floor(u * 6.0);
        if (pick > 5) pick = 5;
        const double table[6] = {-1.2247448713915889, -1.0, -0.7071067811865476,
                                 0.7071067811865476, 1.0, 1.2247448713915889};
        v = table[pick];
    } else {
        v = (u < MAMMEN_P_LOW) ? MAMMEN_LOW : MAMMEN_HIGH;
    }
}
"""


@functools.cache
def _crossprod_module(k: int) -> Any:
    import cupy

    return cupy.RawModule(code=_CROSSPROD_SOURCE, options=("-std=c++17", f"-DK={k}", f"-DTHREADS={_THREADS}"))


@functools.cache
def _cgm_module(k: int) -> Any:
    import cupy

    return cupy.RawModule(code=PHILOX_CUDA_SOURCE + _CGM_SOURCE, options=("-std=c++17", f"-DK={k}"))


@functools.cache
def _weights_kernel() -> Any:
    import cupy

    from kernels.crve import weights

    constants = (
        f"#define MAMMEN_LOW ({weights.MAMMEN_LOW!r})\n"
        f"#define MAMMEN_HIGH ({weights.MAMMEN_HIGH!r})\n"
        f"#define MAMMEN_P_LOW ({weights.MAMMEN_P_LOW!r})\n"
    )
    return cupy.ElementwiseKernel(
        "int64 n_h, int64 n_b, int64 first, int64 base, int64 rep0, int64 draws_per_rep, uint64 seed, int32 kind",
        "float64 v",
        _WEIGHTS_BODY,
        "gpuest_crve_weights",
        preamble=PHILOX_CUDA_SOURCE + constants,
    )


def weights_gpu(
    cupy: Any,
    weights_type: str,
    seed: int,
    n_boot_clusters: int,
    first_draw: int,
    n_draws: int,
    base: int = 0,
    first_replication: int = 0,
    n_replications: int | None = None,
    draws_per_replication: int = 0,
) -> Any:
    """Weights (H, n_draws), or (R, H, n_draws) for ``n_replications`` Monte Carlo replications whose draw b
    sits at address ((r0 + r) B + first + b) H + h + base, B = ``draws_per_replication``."""
    reps = 1 if n_replications is None else n_replications
    out = cupy.empty((reps, n_boot_clusters, n_draws), dtype=cupy.float64)
    _weights_kernel()(
        np.int64(n_boot_clusters), np.int64(n_draws), np.int64(first_draw), np.int64(base),
        np.int64(first_replication), np.int64(draws_per_replication),
        np.uint64(seed), np.int32(_WEIGHT_CODES[weights_type]), out,
    )  # fmt: skip
    return out[0] if n_replications is None else out


def pair_sums_gpu(cupy: Any, x: Any, y: Any, codes: Any, n_groups: int) -> Any:
    """Per group, the k(k+1)/2 + k sums of x x' (upper triangle, row by row) and x y: (P, k(k+1)/2 + k).

    One device-to-host copy of the group sizes (and whether the rows are sorted) lays out the tiles on the
    host; the rows themselves are read once, by ``tile_crossprod``.
    """
    n_obs, k = x.shape
    codes = codes.astype(cupy.int64, copy=False)
    counts = cupy.bincount(codes, minlength=n_groups)
    unsorted = (codes[1:] < codes[:-1]).any() if n_obs > 1 else cupy.zeros((), dtype=bool)
    summary = cupy.concatenate([counts, unsorted.astype(cupy.int64).reshape(1)]).get()
    counts_host, needs_sort = summary[:-1], bool(summary[-1])
    if needs_sort:
        order = cupy.argsort(codes)  # CUB radix sort: stable
        x, y = x[order], y[order]
    x = cupy.ascontiguousarray(x, dtype=cupy.float64)
    y = cupy.ascontiguousarray(y, dtype=cupy.float64)
    group_start = np.concatenate([[0], np.cumsum(counts_host)[:-1]])
    n_tiles = (counts_host + TILE_ROWS - 1) // TILE_ROWS
    first_tile = np.concatenate([[0], np.cumsum(n_tiles)[:-1]])
    tile_group = np.repeat(np.arange(n_groups), n_tiles)
    tile_start = group_start[tile_group] + (np.arange(tile_group.size) - first_tile[tile_group]) * TILE_ROWS
    tile_end = np.minimum(tile_start + TILE_ROWS, group_start[tile_group] + counts_host[tile_group])
    n_stat = k * (k + 1) // 2 + k
    tile_out = cupy.empty((max(tile_group.size, 1), n_stat), dtype=cupy.float64)
    module = _crossprod_module(k)
    if tile_group.size:
        module.get_function("tile_crossprod")(
            (tile_group.size,), (_THREADS,),
            (x, y, cupy.asarray(tile_start, dtype=cupy.int64), cupy.asarray(tile_end, dtype=cupy.int64), tile_out),
        )  # fmt: skip
    sums = cupy.empty((n_groups, n_stat), dtype=cupy.float64)
    threads = 256
    blocks = (n_groups * n_stat + threads - 1) // threads
    module.get_function("group_tiles")(
        (blocks,), (threads,),
        (tile_out, cupy.asarray(first_tile, dtype=cupy.int64), cupy.asarray(n_tiles, dtype=cupy.int64),
         np.int64(n_groups), sums),
    )  # fmt: skip
    return sums


def pair_statistics_gpu(cupy: Any, x: Any, y: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """X_p'X_p (P, k, k) and X_p'y_p (P, k) of the groups ``codes`` (twin: ``bootstrap.pair_statistics``)."""
    from kernels.crve.bootstrap import assemble_statistics

    return assemble_statistics(cupy, pair_sums_gpu(cupy, x, y, codes, n_groups), x.shape[1])


def cgm_cluster_statistics_gpu(
    cupy: Any, seed: int, n_clusters: int, cluster_size: int, n_regressors: int, first: int, count: int
) -> tuple[Any, Any]:
    """X_g'X_g (R, G, k, k) and X_g'y_g (R, G, k) of replications first..first+count-1, data made in registers."""
    k = n_regressors
    xtx = cupy.empty((count, n_clusters, k, k), dtype=cupy.float64)
    xty = cupy.empty((count, n_clusters, k), dtype=cupy.float64)
    warps = count * n_clusters
    threads = 128
    blocks = (warps * 32 + threads - 1) // threads
    _cgm_module(k).get_function("cgm_cluster_stats")(
        (blocks,), (threads,),
        (cupy.uint64(seed), cupy.int64(first), cupy.int64(count), cupy.int64(n_clusters), cupy.int64(cluster_size),
         xtx, xty),
    )  # fmt: skip
    return xtx, xty
