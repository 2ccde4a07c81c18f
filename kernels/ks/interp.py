"""Two-dimensional interpolation of a policy table k'(k, K) at scattered points, NumPy/CuPy and CUDA twins.

Tables have shape (planes, k_size, K_size) (K fastest); each point names its plane (the (a, eps) pair).
The CUDA twin of :func:`interpolate` (one point per call, the same operation order) is ``ks_interpolate`` in
``kernels/ks/interp.cuh``, the header the policy and panel kernels share.

* ``bilinear``: linear in physical k and K inside the cell that holds the point (the cell is found through
  the grid coordinate, so no search is needed on the polynomial k grid).
* ``catmull_rom``: the bicubic Catmull-Rom filter of Hatcher & Scheffel (2014), Algorithm A.2, in grid
  coordinates (uniform in t = ((k - k_min)/(k_max - k_min))^(1/theta) and in K), with the weights
  w0 = a(-1/2 + a(1 - a/2)), w1 = 1 + a^2(-5/2 + 3a/2), w2 = a(1/2 + a(2 - 3a/2)), w3 = a^2(-1/2 + a/2),
  the inner filter along K and the outer along k as in the paper, and indices clamped at the edges
  (the texture's clamp addressing mode).

Catmull-Rom reproduces polynomials of degree <= 2 exactly and is third-order accurate; it is *not* exact
on cubic polynomials, not even in the interior, since its node slopes are central differences
(exact for quadratics only). The issue's wish "exact on cubic polynomials in the interior" cannot hold for
the paper's filter. Counter-example: f(x) = x^3 on the nodes -1, 0, 1, 2 (h = 1), at x = 0.25 the weights
(-0.0703125, 0.8671875, 0.2265625, -0.0234375) give 0.109375 instead of 0.015625. In general the interior
error on c x^3 at fraction a of a cell is c h^3 a (1 - a)(1 - 2 a): zero only at the nodes and the cell
midpoints, at most c h^3 sqrt(3)/18 in absolute value (the four-point Lagrange filter would be exact on
cubics, but it is not the paper's Algorithm A.2 and not C^1). tests/kernels/ks/test_ks_numerics.py checks
the quadratic exactness, this exact cubic error term and its eightfold fall per halving of h.

* ``cubic``: the local cubic (four-point Lagrange) interpolant in PHYSICAL k and K: along each axis the
  cubic through the four nodes i-1 .. i+2 around the point's cell i, the stencil shifted inwards at the
  edges (nodes 0..3 in the first cell, n-4..n-1 in the last; all nodes when an axis has fewer than four),
  the point clamped to the grid first. It is a pure pointwise filter (no coefficient solve), exact on
  tensor products of cubics in (k, K), fourth-order accurate, continuous but not C^1 at the nodes. Why not
  Catmull-Rom: on the k grid k_min + (k_max - k_min)(i/(n-1))^7 a policy that is smooth in k is a
  degree-7-like curve in the grid coordinate, where a quadratic-exact filter is poor (its Euler
  errors and slopes far from MMV's, who use MATLAB's cubic spline in physical k). With four K nodes (the
  default) the K filter IS the not-a-knot cubic spline (the one cubic through the four nodes), and along k
  it agrees with the spline to within the spline's own error (docs/ks.md gives the comparison with
  bilinear, Catmull-Rom, a C^1 cubic Hermite with three-point slopes, and SciPy's spline).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Literal

from kernels.ks.grids import Grids, K_coordinate, k_coordinate

Method = Literal["bilinear", "catmull_rom", "cubic"]
METHODS: tuple[str, ...] = ("bilinear", "catmull_rom", "cubic")


def catmull_rom_weights(xp: ModuleType, a: Any) -> tuple[Any, Any, Any, Any]:
    """The four Catmull-Rom weights at fraction a in [0, 1] (Algorithm A.2, catrom_w0a..w3a).

    They reproduce quadratics, not cubics: see the module docstring for the counter-example.
    """
    w0 = a * (-0.5 + a * (1.0 - 0.5 * a))
    w1 = 1.0 + a * a * (-2.5 + 1.5 * a)
    w2 = a * (0.5 + a * (2.0 - 1.5 * a))
    w3 = a * a * (-0.5 + 0.5 * a)
    return w0, w1, w2, w3


def lagrange_weights(x: Any, nodes: list[Any]) -> list[Any]:
    """Lagrange weights at x of the polynomial through ``nodes`` (2 to 4 of them), as in ks_lagrange_weights:
    w_m = prod_{q != m} (x - x_q) / (x_m - x_q), numerator and denominator each multiplied in node order."""
    weights = []
    for m, node in enumerate(nodes):
        numerator, denominator = None, None
        for q, other in enumerate(nodes):
            if q == m:
                continue
            numerator = x - other if numerator is None else numerator * (x - other)
            denominator = node - other if denominator is None else denominator * (node - other)
        weights.append(numerator / denominator)
    return weights


def stencil_start(xp: ModuleType, cell: Any, size: int) -> tuple[Any, int]:
    """First node of the local-cubic stencil of ``cell`` and the stencil's length min(size, 4)."""
    length = min(size, 4)
    return xp.clip(cell - 1, 0, size - length), length


def cell_and_fraction(xp: ModuleType, s: Any, size: int) -> tuple[Any, Any]:
    """Cell index i in [0, size - 2] holding coordinate s, and the fraction s - i in [0, 1]."""
    cell = xp.clip(xp.floor(s), 0, size - 2)
    return cell.astype(xp.int64), s - cell


def interpolate(
    xp: ModuleType,
    table: Any,
    plane: Any,
    k: Any,
    capital: Any,
    grids: Grids,
    method: Method,
    k_nodes: Any | None = None,
) -> Any:
    """Interpolate ``table[plane]`` at (k, K) for arrays plane, k, K of one shape (K may be a scalar).

    ``k_nodes`` is the k grid as an array of the table's namespace (needed by ``bilinear``).
    """
    nk, nK = grids.k_size, grids.K_size
    flat = table.reshape(-1)
    base = plane * (nk * nK)
    s_k = k_coordinate(xp, grids, k)
    s_K = K_coordinate(xp, grids, capital)
    i, f_k = cell_and_fraction(xp, s_k, nk)
    j, f_K = cell_and_fraction(xp, s_K, nK)
    if method == "bilinear":
        if k_nodes is None:
            k_nodes = xp.asarray(grids.k, dtype=table.dtype)
        k_low, k_high = k_nodes[i], k_nodes[i + 1]
        k_clamped = xp.clip(k, grids.k_min, grids.k_max)
        w_k = (k_clamped - k_low) / (k_high - k_low)
        row = base + i * nK + j
        low = (1.0 - f_K) * flat[row] + f_K * flat[row + 1]
        high = (1.0 - f_K) * flat[row + nK] + f_K * flat[row + nK + 1]
        return (1.0 - w_k) * low + w_k * high
    if method == "cubic":
        if k_nodes is None:
            k_nodes = xp.asarray(grids.k, dtype=table.dtype)
        return _local_cubic(xp, flat, base, k_nodes, xp.clip(k, grids.k_min, grids.k_max), s_K, i, j, nk, nK)
    if method != "catmull_rom":
        raise ValueError(f"interpolation must be one of {', '.join(METHODS)}, not {method!r}")
    w_k = catmull_rom_weights(xp, f_k)
    w_K = catmull_rom_weights(xp, f_K)
    result = None
    for di in range(4):
        ii = xp.clip(i + (di - 1), 0, nk - 1)
        row_base = base + ii * nK
        filtered = None
        for dj in range(4):
            jj = xp.clip(j + (dj - 1), 0, nK - 1)
            term = flat[row_base + jj] * w_K[dj]
            filtered = term if filtered is None else filtered + term
        term = filtered * w_k[di]
        result = term if result is None else result + term
    return result



def _local_cubic(xp: ModuleType, flat: Any, base: Any, k_nodes: Any, k: Any, s_K: Any, i: Any, j: Any, nk: int,
                 nK: int) -> Any:
    """The ``cubic`` method: four-point Lagrange along physical k (the clamped k) and along K (the uniform
    grid coordinate s_K, nodes at the integers), inner filter along K, outer along k, as ks_interpolate."""
    first_k, length_k = stencil_start(xp, i, nk)
    first_K, length_K = stencil_start(xp, j, nK)
    w_k = lagrange_weights(k, [k_nodes[first_k + m] for m in range(length_k)])
    w_K = lagrange_weights(s_K, [(first_K + m).astype(s_K.dtype) for m in range(length_K)])
    result = None
    for di in range(length_k):
        row_base = base + (first_k + di) * nK + first_K
        filtered = None
        for dj in range(length_K):
            term = flat[row_base + dj] * w_K[dj]
            filtered = term if filtered is None else filtered + term
        term = filtered * w_k[di]
        result = term if result is None else result + term
    return result
