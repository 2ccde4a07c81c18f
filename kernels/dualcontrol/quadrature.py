"""Gauss-Hermite quadrature for expectations over a normal variable."""

from __future__ import annotations

import math

import numpy as np

# A node whose weight is below this (of the weights' sum, 1) adds less than float64 can hold to a sum of values of
# one magnitude: 32 nodes have four such (1.0e-18 of the weight together), 64 have 20.
NEGLIGIBLE_WEIGHT = 2.0**-60


def normal_quadrature(n_nodes: int, drop_below: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Offsets z and weights w with ``E f(m + s Z) ~= sum_k w_k f(m + s z_k)`` for ``Z ~ N(0, 1)``.

    From the physicists' rule (weight ``exp(-t^2)``) by ``z = sqrt(2) t`` and ``w = w_t / sqrt(pi)``; exact
    for polynomials of degree ``2 n - 1``; the weights sum to one. ``drop_below``: the nodes of smaller weight
    are left out (the outermost ones; the others keep their weights), e.g. :data:`NEGLIGIBLE_WEIGHT`.
    """
    assert n_nodes >= 1, f"need at least one quadrature node, not {n_nodes}"
    t, w = np.polynomial.hermite.hermgauss(n_nodes)
    z, w = math.sqrt(2.0) * t, w / math.sqrt(math.pi)
    keep = w >= drop_below
    return z[keep], w[keep]
