"""Pair statistics: X_p'X_p and X_p'y_p of each group p of rows, the one pass of the bootstrap over the N rows.

The groups are the pairs (variance cluster g, bootstrap cluster h) that occur in the data (the variance
clusters themselves when the two coincide); everything the fast-and-wild bootstrap needs follows from these
(P, k, k) and (P, k) sums (see docs/crve.md).

Two implementations of one segmented reduction:
- NumPy (:func:`pair_statistics_numpy`): groups of many rows take one BLAS product each over the rows sorted
  by group; many small groups take a bincount per entry of x x' and x y.
- CuPy (:func:`pair_sums_gpu`, ``pairs.cu``): rows sorted by group (sorted once if they are not) are cut into
  tiles of at most ``TILE_ROWS`` rows of one group; a block accumulates its tile's k(k+1)/2 + k sums in
  registers and reduces them across the block, and a second kernel adds each group's tiles in order, so the
  result is deterministic (no floating-point atomics).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from kernels import cuda
from kernels.backend import is_numpy, to_host
from kernels.crve.ols import cluster_sums

TILE_ROWS = 2048
_THREADS = 256  # tile_crossprod's block: 8 warps reduce each tile
_GROUP_THREADS = 256


def _kernel_defines(k: int) -> dict[str, cuda.DefineValue]:
    return {"K": k, "THREADS": _THREADS}


# K is the formula's regressor count (after absorbing fixed effects): compiled per K. Regressions with 2 to 8
# regressors are the common ones (the job kind's example has 3, the benchmarks 8) and each variant is one small
# kernel pair, so a fresh worker compiles these seven at start rather than at a job; another K compiles at its
# first job (then it is in the disk cache).
_SOURCE = cuda.kernel_source(
    __file__, "pairs.cu", headers=["crve/crossprod.cuh"], warm_up=[_kernel_defines(k) for k in range(2, 9)]
)


def pair_statistics(xp: ModuleType, x: Any, y: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """X_p'X_p (P, k, k) and X_p'y_p (P, k) for the groups of ``codes`` (int64 in [0, n_groups)) on ``xp``."""
    if not is_numpy(xp):
        return assemble_statistics(xp, pair_sums_gpu(xp, x, y, codes, n_groups), x.shape[1])
    return pair_statistics_numpy(x, y, codes, n_groups)


def pair_statistics_host(xp: ModuleType, x: Any, y: Any, codes: Any, n_groups: int) -> tuple[Any, Any]:
    """``pair_statistics`` delivered as NumPy arrays (one small device-to-host copy of the sums on CuPy)."""
    if is_numpy(xp):
        return pair_statistics_numpy(x, y, codes, n_groups)
    return assemble_statistics(np, to_host(pair_sums_gpu(xp, x, y, codes, n_groups)), x.shape[1])


def pair_statistics_numpy(x: np.ndarray, y: np.ndarray, codes: np.ndarray, n_groups: int) -> tuple[Any, Any]:
    """The NumPy twin of :func:`pair_sums_gpu` (see the module docstring for its two paths)."""
    n_obs, k = x.shape
    if n_groups * 64 <= n_obs:
        if n_obs > 1 and not bool((codes[1:] >= codes[:-1]).all()):
            order = np.argsort(codes, kind="stable")
            x, y, codes = x[order], y[order], codes[order]
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=n_groups))])
        xtx = np.empty((n_groups, k, k))
        xty = np.empty((n_groups, k))
        for group in range(n_groups):
            rows = slice(bounds[group], bounds[group + 1])
            xtx[group] = x[rows].T @ x[rows]
            xty[group] = x[rows].T @ y[rows]
        return xtx, xty
    upper_i, upper_j = np.triu_indices(k)
    products = np.empty((n_obs, len(upper_i) + k), dtype=np.float64)
    for column, (i, j) in enumerate(zip(upper_i, upper_j, strict=True)):
        products[:, column] = x[:, i] * x[:, j]
    products[:, len(upper_i) :] = x * y[:, None]
    return assemble_statistics(np, cluster_sums(np, products, codes, n_groups), k)


def assemble_statistics(xp: ModuleType, sums: Any, k: int) -> tuple[Any, Any]:
    """(P, k, k) and (P, k) from the rows (P, k(k+1)/2 + k) of sums: upper triangle of x x' row by row, then x y."""
    upper_i, upper_j = np.triu_indices(k)
    xtx = xp.empty((sums.shape[0], k, k), dtype=xp.float64)
    xtx[:, upper_i, upper_j] = sums[:, : len(upper_i)]
    xtx[:, upper_j, upper_i] = sums[:, : len(upper_i)]
    return xtx, sums[:, len(upper_i) :]


def _tile_layout(counts: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tiles of at most TILE_ROWS rows of one group over rows sorted by group: (first_tile, n_tiles) per group,
    (tile_start, tile_end) per tile."""
    group_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_tiles = (counts + TILE_ROWS - 1) // TILE_ROWS
    first_tile = np.concatenate([[0], np.cumsum(n_tiles)[:-1]])
    tile_group = np.repeat(np.arange(n_groups), n_tiles)
    tile_start = group_start[tile_group] + (np.arange(tile_group.size) - first_tile[tile_group]) * TILE_ROWS
    tile_end = np.minimum(tile_start + TILE_ROWS, group_start[tile_group] + counts[tile_group])
    return first_tile, n_tiles, tile_start, tile_end


def pair_sums_gpu(cupy: ModuleType, x: Any, y: Any, codes: Any, n_groups: int) -> Any:
    """Per group, the k(k+1)/2 + k sums of x x' (upper triangle, row by row) and x y: (P, k(k+1)/2 + k).

    One device-to-host copy of the group sizes (and whether the rows are sorted; unsorted rows take a second, with
    their sort) lays out the tiles on the host; the rows themselves are read once, by ``tile_crossprod``.
    """
    n_obs, k = x.shape
    codes = codes.astype(cupy.int64, copy=False)
    # Rows sorted by group (the usual layout): the group sizes from a binary search per group bound, which are
    # right only when the rows are sorted; else from a count over the rows.
    bounds = cupy.searchsorted(codes, cupy.arange(n_groups + 1, dtype=cupy.int64))
    unsorted = (codes[1:] < codes[:-1]).any() if n_obs > 1 else cupy.zeros((), dtype=bool)
    summary = to_host(cupy.concatenate([cupy.diff(bounds), unsorted.astype(cupy.int64).reshape(1)]))
    counts_host, needs_sort = summary[:-1], bool(summary[-1])
    if needs_sort:
        counts_host = to_host(cupy.bincount(codes, minlength=n_groups))
        order = cupy.argsort(codes)  # CUB radix sort: stable
        x, y = x[order], y[order]
    x = cupy.ascontiguousarray(x, dtype=cupy.float64)
    y = cupy.ascontiguousarray(y, dtype=cupy.float64)
    first_tile, n_tiles, tile_start, tile_end = _tile_layout(counts_host, n_groups)
    n_stat = k * (k + 1) // 2 + k
    tile_out = cupy.empty((max(tile_start.size, 1), n_stat), dtype=cupy.float64)
    defines = _kernel_defines(k)
    if tile_start.size:
        cuda.function(_SOURCE, "tile_crossprod", defines)(
            (tile_start.size,), (_THREADS,),
            (x, y, cupy.asarray(tile_start, dtype=cupy.int64), cupy.asarray(tile_end, dtype=cupy.int64), tile_out),
        )  # fmt: skip
    sums = cupy.empty((n_groups, n_stat), dtype=cupy.float64)
    blocks = (n_groups * n_stat + _GROUP_THREADS - 1) // _GROUP_THREADS
    cuda.function(_SOURCE, "group_tiles", defines)(
        (blocks,), (_GROUP_THREADS,),
        (tile_out, cupy.asarray(first_tile, dtype=cupy.int64), cupy.asarray(n_tiles, dtype=cupy.int64),
         np.int64(n_groups), sums),
    )  # fmt: skip
    return sums
