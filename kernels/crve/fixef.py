"""Absorbed fixed effects: singletons, demeaning, and the exact projection on their dummies.

D = [D_1 ... D_m] are the dummies of m fixed effects, W the regression weights (the identity without). The
within transformation is M_D z = z - D alpha with alpha solving D'WD alpha = D'Wz: z minus its weighted
projection on the fixed effects. Two ways to compute it (``method``):

- ``"map"``, the method of alternating projections (fixest, pyfixest): subtract each fixed effect's weighted
  group means in turn until no value moves by more than ``tol`` times its column's largest absolute value
  (pyfixest's criterion is the same without the scaling). Converges to M_D z for any number of fixed effects.
- ``"direct"``: D'WD = [[N_1, B], [B', C]] with N_1 the (diagonal) weight sums of the fixed effect with the most
  levels, B its cross-tabulation with the others and C the others' Gram matrix. Eliminating N_1 leaves the Schur
  complement S = C - B' N_1^-1 B, dense of order F_r (the other fixed effects' levels together), inverted by an
  eigendecomposition (pseudo-inverse: S is singular by one per connected component and redundant level).
  [[N_1^-1 + N_1^-1 B S^+ B' N_1^-1, -N_1^-1 B S^+], [-S^+ B' N_1^-1, S^+]] is then a generalized inverse of
  D'WD, so alpha and M_D z are exact to rounding, in one pass over the rows. Only for F_r up to
  ``DIRECT_MAX_LEVELS``; ``"auto"`` takes it when F_r is at most ``AUTO_DIRECT_LEVELS`` and MAP otherwise.

The bootstrap needs the projection P_D = D (D'WD)^- D'W applied to sparse right-hand sides as well (the
correction for fixed effects that cross the variance clusters, :mod:`kernels.crve.bootstrap`): :class:`Gram`
holds N_1, B and S^+ for that.

Singletons (a level with one observation, ``drop_singletons``): their rows are fitted exactly and carry no
information on the slopes; fixest (``fixef.rm = "singleton"``) and pyfixest (default) drop them, repeatedly,
since dropping a row can leave another level with one row. Written against the array namespace ``xp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import is_numpy, to_host
from kernels.crve.ols import cluster_sums

DIRECT_MAX_LEVELS = 10_000  # F_r: the dense Schur complement is F_r^2 float64 (800 MB at the bound)
AUTO_DIRECT_LEVELS = 4_000  # "auto" demeans directly up to here (its eigendecomposition is cheap to this size)
_PINV_RTOL = 1e-11  # eigenvalues of S below this share of the largest are its null space
# A table of sums by two codes (levels x clusters, levels x levels) is built dense, by one bincount, up to this
# many cells on the GPU (1 GB of float64; its products are then dense GEMMs); larger ones, and every one on
# NumPy beyond a million cells, are sparse.
DENSE_TABLE_CELLS_GPU = 125_000_000
DENSE_TABLE_CELLS_NUMPY = 1_000_000


@dataclass
class FixedEffect:
    """One fixed effect's codes (N,) in [0, count) on xp."""

    name: str
    codes: Any
    count: int


@dataclass
class Demeaned:
    values: Any  # (N, m) M_D z
    method: str
    iterations: int
    converged: bool


def _sparse_module(xp: ModuleType) -> ModuleType:
    """scipy.sparse or cupyx.scipy.sparse, as xp is NumPy or CuPy."""
    if is_numpy(xp):
        from scipy import sparse

        return sparse
    from cupyx.scipy import sparse

    return sparse


def sparse_matrix(xp: ModuleType, rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    """A CSR matrix on xp's sparse module; duplicates are summed."""
    return _sparse_module(xp).coo_matrix((values, (rows, cols)), shape=shape).tocsr()


def grouped_table(xp: ModuleType, rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    """The sums of ``values`` by (row code, column code): dense (one bincount) when small, else sparse CSR."""
    cells = shape[0] * shape[1]
    if cells <= (DENSE_TABLE_CELLS_NUMPY if is_numpy(xp) else DENSE_TABLE_CELLS_GPU):
        flat = xp.bincount(rows * shape[1] + cols, weights=values, minlength=cells)
        return flat.reshape(shape)
    return sparse_matrix(xp, rows, cols, values, shape)


def dense(xp: ModuleType, matrix: Any) -> Any:
    """A dense array from a dense or sparse matrix."""
    return matrix.toarray() if hasattr(matrix, "toarray") else xp.asarray(matrix)


def drop_singletons(xp: ModuleType, fixed_effects: list[FixedEffect], keep: Any) -> Any:
    """Rows to keep: ``keep`` (N,) bool minus, repeatedly, the rows of levels with a single kept row."""
    while True:
        before = int(keep.sum())
        for effect in fixed_effects:
            counts = xp.bincount(effect.codes, weights=keep.astype(xp.float64), minlength=effect.count)
            keep = keep & (counts[effect.codes] != 1)
        if int(keep.sum()) == before:
            return keep


def recode(xp: ModuleType, codes: Any) -> tuple[Any, int]:
    """Codes renumbered 0..count-1 over the levels that occur (after rows were dropped)."""
    levels, compact = xp.unique(codes, return_inverse=True)
    return compact.reshape(-1).astype(xp.int64), int(levels.shape[0])


def level_weights(xp: ModuleType, effect: FixedEffect, row_weights: Any | None) -> Any:
    """Each level's weight sum (its count without weights)."""
    if row_weights is None:
        return xp.bincount(effect.codes, minlength=effect.count).astype(xp.float64)
    return xp.bincount(effect.codes, weights=row_weights, minlength=effect.count)


def demean_map(
    xp: ModuleType,
    values: Any,
    fixed_effects: list[FixedEffect],
    row_weights: Any | None,
    tol: float,
    maxiter: int,
) -> Demeaned:
    """Alternating projections (see the module docstring); ``values`` (N, m)."""
    z = values.copy()
    sums = [level_weights(xp, effect, row_weights) for effect in fixed_effects]
    scale = xp.maximum(xp.abs(z).max(axis=0), 1e-300)
    weighted = None if row_weights is None else row_weights[:, None]
    for iteration in range(1, maxiter + 1):
        moved = xp.zeros(z.shape[1], dtype=xp.float64)
        for effect, total in zip(fixed_effects, sums, strict=True):
            means = cluster_sums(xp, z if weighted is None else z * weighted, effect.codes, effect.count)
            means /= total[:, None]
            step = means[effect.codes]
            z -= step
            moved = xp.maximum(moved, xp.abs(step).max(axis=0))
        if len(fixed_effects) == 1 or bool(to_host((moved / scale).max()) <= tol):
            return Demeaned(z, "map", iteration, True)
    return Demeaned(z, "map", maxiter, False)


class Gram:
    """A generalized inverse of D'WD through the Schur complement of its largest diagonal block (see above)."""

    def __init__(self, xp: ModuleType, fixed_effects: list[FixedEffect], row_weights: Any | None) -> None:
        self.xp = xp
        order = sorted(range(len(fixed_effects)), key=lambda index: -fixed_effects[index].count)
        self.first = fixed_effects[order[0]]
        self.rest = [fixed_effects[index] for index in order[1:]]
        self.first_index, self.rest_indices = order[0], order[1:]
        self.offsets = [0]
        for effect in self.rest:
            self.offsets.append(self.offsets[-1] + effect.count)
        self.rest_levels = self.offsets[-1]
        if self.rest_levels > DIRECT_MAX_LEVELS:
            raise ValueError(
                f"formula: the fixed effects other than {self.first.name!r} have {self.rest_levels:,} levels "
                f"together; the exact projection needs at most {DIRECT_MAX_LEVELS:,}"
            )
        self.n_first = level_weights(xp, self.first, row_weights)
        self.rest_codes = [effect.codes + offset for effect, offset in zip(self.rest, self.offsets, strict=False)]
        weights = xp.ones(self.first.codes.shape[0]) if row_weights is None else row_weights
        self.cross = self._cross(weights)  # B (F1 x F_r), sparse
        self.s_pinv = self._schur_pinv(weights) if self.rest_levels else xp.zeros((0, 0))

    def _cross(self, weights: Any) -> Any:
        xp, f_r = self.xp, self.rest_levels
        if not f_r:
            return None
        rows = xp.concatenate([self.first.codes] * len(self.rest))
        cols = xp.concatenate(self.rest_codes)
        return grouped_table(xp, rows, cols, xp.concatenate([weights] * len(self.rest)), (self.first.count, f_r))

    def _schur_pinv(self, weights: Any) -> Any:
        xp, f_r = self.xp, self.rest_levels
        gram_rest = xp.zeros(f_r * f_r, dtype=xp.float64)
        for row_codes in self.rest_codes:
            for col_codes in self.rest_codes:
                gram_rest += xp.bincount(row_codes * f_r + col_codes, weights=weights, minlength=f_r * f_r)
        if hasattr(self.cross, "toarray"):
            absorbed = dense(xp, self.cross.T @ _row_scaled(xp, self.cross, 1.0 / self.n_first))
        else:  # B' N1^-1 B as one GEMM
            scaled = self.cross / xp.sqrt(self.n_first)[:, None]
            absorbed = scaled.T @ scaled
        schur = gram_rest.reshape(f_r, f_r) - absorbed
        schur = 0.5 * (schur + schur.T)
        values, vectors = xp.linalg.eigh(schur)
        keep = values > _PINV_RTOL * float(to_host(values[-1]))
        kept = vectors[:, keep]
        return (kept / values[keep]) @ kept.T

    def normal_rhs(self, z: Any, row_weights: Any | None) -> tuple[Any, Any]:
        """D_1'Wz (F1, m) and the other fixed effects' D'Wz stacked (F_r, m)."""
        xp = self.xp
        weighted = z if row_weights is None else z * row_weights[:, None]
        first = cluster_sums(xp, weighted, self.first.codes, self.first.count)
        rest = xp.zeros((self.rest_levels, z.shape[1]), dtype=xp.float64)
        for codes in self.rest_codes:
            rest += cluster_sums(xp, weighted, codes, self.rest_levels)
        return first, rest

    def solve(self, rhs_first: Any, rhs_rest: Any) -> tuple[Any, Any]:
        """alpha = (D'WD)^- [rhs_first; rhs_rest] split the same way (dense right-hand sides)."""
        scaled = rhs_first / self.n_first[:, None]
        if not self.rest_levels:
            return scaled, rhs_rest
        alpha_rest = self.s_pinv @ (rhs_rest - self.cross.T @ scaled)
        return (rhs_first - self.cross @ alpha_rest) / self.n_first[:, None], alpha_rest

    def demean(self, z: Any, row_weights: Any | None) -> Any:
        alpha_first, alpha_rest = self.solve(*self.normal_rhs(z, row_weights))
        out = z - alpha_first[self.first.codes]
        for codes in self.rest_codes:
            out -= alpha_rest[codes]
        return out


def demean(
    xp: ModuleType,
    values: Any,
    fixed_effects: list[FixedEffect],
    row_weights: Any | None,
    method: str,
    tol: float,
    maxiter: int,
    gram: Gram | None = None,
) -> Demeaned:
    """M_D ``values`` by ``method`` ("auto", "map" or "direct"; see the module docstring)."""
    rest_levels = sum(effect.count for effect in fixed_effects) - max(effect.count for effect in fixed_effects)
    if method == "auto":
        method = "direct" if len(fixed_effects) == 1 or rest_levels <= AUTO_DIRECT_LEVELS else "map"
    if method == "direct":
        gram = gram or Gram(xp, fixed_effects, row_weights)
        return Demeaned(gram.demean(values, row_weights), "direct", 1, True)
    return demean_map(xp, values, fixed_effects, row_weights, tol, maxiter)


def is_nested(xp: ModuleType, inner: Any, n_inner: int, outer: Any) -> bool:
    """Whether every level of ``inner`` (codes 0..n_inner-1) lies within one level of ``outer``: the smallest and
    the largest outer code of each inner level agree (one pass, no sort)."""
    low = xp.full(n_inner, xp.iinfo(xp.int64).max, dtype=xp.int64)
    high = xp.full(n_inner, -1, dtype=xp.int64)
    outer = outer.astype(xp.int64, copy=False)
    if is_numpy(xp):
        np.minimum.at(low, inner, outer)
        np.maximum.at(high, inner, outer)
    else:
        import cupyx

        cupyx.scatter_min(low, inner, outer)
        cupyx.scatter_max(high, inner, outer)
    present = high >= 0
    return bool(to_host((low[present] == high[present]).all()))


def _row_scaled(xp: ModuleType, matrix: Any, scale: Any) -> Any:
    """diag(scale) @ matrix for a sparse matrix."""
    return _sparse_module(xp).diags(scale) @ matrix


