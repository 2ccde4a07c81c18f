"""Spline bases of the SCCS time covariates (age, season, calendar time), on NumPy.

The conventions are SelfControlledCaseSeries' (``docs/sccs.md``, *Age, season and calendar time*):

* age and calendar time: R's ``splines::bs(x, knots = inner, Boundary.knots = (first, last), degree = 2)``, the
  B-spline basis without its intercept column (:func:`bs_basis`);
* season: ``cyclicSplineDesign`` (mgcv's ``cSplineDes``), a periodic B-spline basis whose period is the span of
  its knots (:func:`cyclic_basis`).

Both are built on one Cox-de Boor evaluation of a B-spline basis over any knot vector (:func:`spline_design`,
R's ``splines::splineDesign`` with ``outer.ok = TRUE``); the tests check it against scipy's ``BSpline``.
"""

from __future__ import annotations

import numpy as np


def spline_design(knots: np.ndarray, x: np.ndarray, order: int) -> np.ndarray:
    """B-spline basis of ``order`` (degree + 1) over the non-decreasing knot vector ``knots`` at ``x``.

    ``len(knots) - order`` columns. Intervals are half-open ``[t_i, t_{i+1})`` except that ``x`` equal to the
    last knot belongs to the last non-empty interval (so the basis is left-continuous there, as R's); ``x``
    outside ``[t_0, t_last]`` gets zeros (R's ``outer.ok = TRUE``).
    """
    knots = np.asarray(knots, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    n_intervals = knots.size - 1
    # Order 1: the indicator of each knot interval.
    basis = ((knots[:-1][None, :] <= x[:, None]) & (x[:, None] < knots[1:][None, :])).astype(np.float64)
    nonempty = np.flatnonzero(knots[1:] > knots[:-1])
    if nonempty.size:
        last = int(nonempty[-1])
        basis[x == knots[-1], last] = 1.0
    for k in range(2, order + 1):
        width = n_intervals - k + 1
        left_span = knots[k - 1:k - 1 + width] - knots[:width]
        right_span = knots[k:k + width] - knots[1:1 + width]
        left = np.divide(x[:, None] - knots[:width][None, :], left_span[None, :],
                         out=np.zeros((x.size, width)), where=left_span[None, :] > 0)
        right = np.divide(knots[k:k + width][None, :] - x[:, None], right_span[None, :],
                          out=np.zeros((x.size, width)), where=right_span[None, :] > 0)
        basis = left * basis[:, :width] + right * basis[:, 1:width + 1]
    return basis


def bs_basis(x: np.ndarray, knots: np.ndarray, degree: int) -> np.ndarray:
    """R's ``splines::bs(x, knots = knots[1:-1], Boundary.knots = knots[[0, -1]], degree)`` (no intercept):
    ``len(knots) - 2 + degree`` columns. ``x`` must lie within the boundary knots (callers clamp it)."""
    knots = np.asarray(knots, dtype=np.float64)
    augmented = np.concatenate([np.repeat(knots[0], degree + 1), knots[1:-1], np.repeat(knots[-1], degree + 1)])
    return spline_design(augmented, x, degree + 1)[:, 1:]


def cyclic_basis(x: np.ndarray, knots: np.ndarray, degree: int) -> np.ndarray:
    """mgcv's ``cSplineDes(x, knots, ord = degree + 1)``: the periodic B-spline basis with period
    ``knots[-1] - knots[0]``, ``len(knots) - 1`` columns summing to one. ``x`` within the knots' span."""
    order = degree + 1
    knots = np.sort(np.asarray(knots, dtype=np.float64))
    n_knots = knots.size
    if n_knots < order:
        raise ValueError(f"a cyclic spline of degree {degree} needs at least {order} knots")
    first, period_end = knots[0], knots[-1]
    wrap_from = knots[n_knots - order]
    extended = np.concatenate([first - (period_end - knots[n_knots - order:n_knots - 1]), knots])
    x = np.asarray(x, dtype=np.float64)
    design = spline_design(extended, x, order)
    wrapped = x > wrap_from
    if np.any(wrapped):
        design[wrapped] += spline_design(extended, x[wrapped] - period_end + first, order)
    return design
