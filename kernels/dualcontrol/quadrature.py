"""Gauss-Hermite quadrature for expectations over a normal variable."""

from __future__ import annotations

import math

import numpy as np


def normal_quadrature(n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets z and weights w with ``E f(m + s Z) ~= sum_k w_k f(m + s z_k)`` for ``Z ~ N(0, 1)``.

    From the physicists' rule (weight ``exp(-t^2)``) by ``z = sqrt(2) t`` and ``w = w_t / sqrt(pi)``; exact
    for polynomials of degree ``2 n - 1``; the weights sum to one.
    """
    if n_nodes < 1:
        raise ValueError(f"need at least one quadrature node, not {n_nodes}")
    t, w = np.polynomial.hermite.hermgauss(n_nodes)
    return math.sqrt(2.0) * t, w / math.sqrt(math.pi)
