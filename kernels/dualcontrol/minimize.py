"""Vectorised safeguarded minimisation of a univariate objective at every grid point at once.

Per point: the objective is evaluated at the start candidates (the myopic control, the previous policy)
and at ``scan_points`` equally spaced controls across the bracket (the restarts that guard against the
non-convexity of the dual-control objective); golden-section search then refines inside the scan cell
around the best point so far (clamped into the bracket), for a fixed number of steps so that all points
move in lockstep (the CUDA kernel in bellman.cu runs the same sequence per thread). The answer is never
worse than the best point evaluated: that is the safeguard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

INVERSE_GOLDEN_RATIO = 0.6180339887498949  # (sqrt(5) - 1) / 2, the same literal as in bellman.cu


def golden_section_minimise(
    objective: Callable[[Any], Any],
    lo: Any,
    hi: Any,
    starts: Sequence[Any],
    scan_points: int,
    golden_iterations: int,
    xp: Any,
) -> tuple[Any, Any]:
    """(argmin, min) of ``objective`` per point, searched in ``[lo, hi]`` (arrays of one shape).

    ``objective(u)`` maps an array of controls (one per point) to the objective at each point.
    """
    assert scan_points >= 2, f"scan_points must be at least 2, not {scan_points}"
    best_u = starts[0]
    best_q = objective(best_u)

    def keep_better(u: Any) -> None:
        nonlocal best_u, best_q
        q = objective(u)
        better = q < best_q
        best_u = xp.where(better, u, best_u)
        best_q = xp.where(better, q, best_q)

    for u in starts[1:]:
        keep_better(u)
    step = (hi - lo) / (scan_points - 1)
    for j in range(scan_points):
        keep_better(lo + float(j) * step)

    # The golden-section cell is centred on the best point so far, clamped into the bracket first: a start
    # candidate (the previous policy) may lie outside [lo, hi] when the bracket has moved since, and beyond
    # hi + step (or lo - step) an unclamped centre would give an inverted cell a > b that searches outside
    # the bracket. The candidate itself stays in the running through best_u/best_q (the safeguard).
    centre = xp.minimum(xp.maximum(best_u, lo), hi)
    a = xp.maximum(lo, centre - step)
    b = xp.minimum(hi, centre + step)
    g = INVERSE_GOLDEN_RATIO
    c = b - g * (b - a)
    d = a + g * (b - a)
    fc = objective(c)
    fd = objective(d)
    for _ in range(golden_iterations):
        left = fc < fd  # the minimum lies in [a, d]
        a = xp.where(left, a, c)
        b = xp.where(left, d, b)
        new_point = xp.where(left, b - g * (b - a), a + g * (b - a))
        f_new = objective(new_point)
        c, d, fc, fd = (
            xp.where(left, new_point, d),
            xp.where(left, c, new_point),
            xp.where(left, f_new, fd),
            xp.where(left, fc, f_new),
        )
    take_c = fc < fd
    golden_u = xp.where(take_c, c, d)
    golden_q = xp.where(take_c, fc, fd)
    better = golden_q < best_q
    return xp.where(better, golden_u, best_u), xp.where(better, golden_q, best_q)
