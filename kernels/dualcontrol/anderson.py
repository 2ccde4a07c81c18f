"""Anderson acceleration of a fixed-point iteration ``x <- g(x)`` on arrays of any namespace (NumPy, CuPy).

Type II (Walker & Ni 2011): with the residual ``f = g(x) - x`` and the last ``m`` differences of residuals
``dF`` and of map values ``dG``, the next iterate is ``g(x_k) - dG gamma`` where ``gamma`` minimises
``|| f_k - dF gamma ||_2``. On an affine map (policy evaluation ``T_u V = c_u + delta P_u V``) it is
equivalent to GMRES on ``(I - delta P_u) V = c_u`` (Walker & Ni, Theorem 2.2) without forming the matrix or
storing a Krylov basis beyond the ``2 m`` difference arrays: each step needs only ``g``, one sweep.

Why here: the plain sweep contracts at about the discount rate delta (0.95) along the slowly mixing beliefs
(the line mu = 0, where nothing is learnt, is nearly invariant), and the MacQueen-Porteus bounds only remove
the constant mode. Anderson resolves those modes in a few tens of sweeps instead of hundreds.

The caller keeps the convergence check: it measures ``g(x) - x`` itself at every step (the same statistic as a
plain sweep), so the accelerated iterate changes only *which* x is swept next, never what counts as converged.
Only an ``m x m`` Gram matrix and ``m`` numbers cross to the host per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.backend import to_host


class AndersonMixer:
    """Ring buffers of the last ``memory`` residual and map differences; :meth:`mix` returns the next iterate.

    ``restart_growth``: when a residual's 2-norm exceeds this many times the smallest seen since the last
    restart, the history is dropped and the plain step ``g(x)`` taken (a safeguard against stagnation, and
    against mixing across a change of the map).
    """

    def __init__(self, memory: int, xp: Any, restart_growth: float = 10.0, ridge: float = 1e-12) -> None:
        assert memory >= 1, f"Anderson memory must be at least 1, not {memory}"
        self.memory, self.xp = memory, xp
        self.restart_growth, self.ridge = restart_growth, ridge
        self._d_residual: Any = None  # (memory, N) ring buffer of f_{j+1} - f_j, allocated on first use
        self._d_value: Any = None  # (memory, N) ring buffer of g_{j+1} - g_j
        self._gram = np.zeros((memory, memory))  # <dF_i, dF_j> by ring slot, host, float64
        self.reset()

    def reset(self) -> None:
        """Forget the history (a new map: another policy); the buffers are kept for reuse."""
        self._clear()
        self.restarts = 0

    def mix(self, x: Any, g: Any) -> Any:
        """The next iterate after ``x`` given ``g = g(x)`` (arrays of one shape; ``x`` is not modified)."""
        xp = self.xp
        f = (g - x).reshape(-1)
        g_flat = g.reshape(-1)
        norm = float(xp.sqrt(xp.vdot(f, f)))
        if norm > self.restart_growth * self._best_norm:
            self._clear()
            self.restarts += 1
        self._best_norm = min(self._best_norm, norm)
        if self._last_residual is not None:
            self._store(f - self._last_residual, g_flat - self._last_value)
        self._last_residual, self._last_value = f, g_flat
        if self._count == 0:
            return g
        weights = np.zeros(self.memory)  # per ring slot; empty slots hold zeros and get weight 0
        weights[self._slots()] = self._coefficients(f)
        step = xp.asarray(weights, dtype=g.dtype) @ self._d_value
        return (g_flat - step).reshape(g.shape)

    def _clear(self) -> None:
        if self._d_residual is not None:  # stale differences must not leak into whole-buffer products
            self._d_residual.fill(0.0)
            self._d_value.fill(0.0)
        self._gram[:] = 0.0
        self._count = 0  # differences stored (<= memory)
        self._next = 0  # ring slot the next difference goes to
        self._last_residual: Any = None
        self._last_value: Any = None
        self._best_norm = np.inf

    def _slots(self) -> np.ndarray:
        """Ring slots holding differences, oldest first (the Gram matrix is indexed by slot)."""
        if self._count < self.memory:
            return np.arange(self._count)
        return (self._next + np.arange(self.memory)) % self.memory

    def _store(self, d_residual: Any, d_value: Any) -> None:
        xp = self.xp
        if self._d_residual is None or self._d_residual.shape[1] != d_residual.size:
            # zeros, not empty: whole-buffer products below read unfilled slots (their weight is 0)
            self._d_residual = xp.zeros((self.memory, d_residual.size), dtype=d_residual.dtype)
            self._d_value = xp.zeros_like(self._d_residual)
        slot = self._next
        self._d_residual[slot] = d_residual
        self._d_value[slot] = d_value
        self._next = (slot + 1) % self.memory
        self._count = min(self._count + 1, self.memory)
        row = np.asarray(to_host(self._d_residual @ d_residual), dtype=np.float64)  # one gemv, one transfer
        self._gram[slot, :] = row
        self._gram[:, slot] = row

    def _coefficients(self, f: Any) -> np.ndarray:
        """``argmin || f - dF gamma ||`` by the normal equations with a small ridge (relative to the diagonal):
        differences become nearly collinear as the iteration converges, and the ridge keeps gamma bounded
        there instead of amplifying rounding (in float32 the products themselves carry ~1e-7 relative error,
        so the ridge is at least 100 machine epsilons of the arrays' type)."""
        slots = self._slots()
        gram = self._gram[np.ix_(slots, slots)]
        rhs = np.asarray(to_host(self._d_residual @ f), dtype=np.float64)[slots]
        scale = float(np.max(np.diag(gram)))
        if not scale > 0.0:
            return np.zeros(slots.size)
        ridge = max(self.ridge, 100.0 * float(np.finfo(self._d_residual.dtype).eps))
        regularised = gram + ridge * scale * np.eye(slots.size)
        return np.linalg.lstsq(regularised, rhs, rcond=None)[0]
