"""Tensor-product state grid (x, mu, Sigma) and trilinear interpolation, constant beyond the cuboid.

A concentrated axis places its nodes at ``g(z) = centre + R sinh(c z) / sinh(c)`` for z uniform on
``[z_lo, z_hi]`` (``R`` the larger distance from the centre to an end, so the farther end sits at
``|z| = 1``): spacing at the centre is ``1 / cosh(c)`` times the spacing at ``|z| = 1``; ``c = 0`` is the
uniform grid. Because ``g`` is inverted in closed form (``asinh``), locating a point costs O(1) with no
search: the CUDA kernel (bellman.cu) uses the same formula, so both paths pick the same cell up to a
rounding tie, where linear interpolation is continuous anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Axis:
    lo: float
    hi: float
    size: int
    centre: float
    concentration: float
    scale: float  # R: the larger distance from the centre to an end
    z_lo: float
    dz: float
    anchor: float | None = None  # a value that is a node (mu = 0: the non-learning line), None for none

    @property
    def stretch(self) -> float:
        """``sinh(c) / R``: maps a distance from the centre to ``sinh(c z)`` (0 on a uniform axis)."""
        return math.sinh(self.concentration) / self.scale if self.concentration > 0.0 else 0.0

    def to_z(self, value: float) -> float:
        """The lattice coordinate of a value (the inverse of the spacing law)."""
        if self.concentration > 0.0:
            return math.asinh((value - self.centre) * self.stretch) / self.concentration
        return value

    def nodes(self) -> np.ndarray:
        z = self.z_lo + self.dz * np.arange(self.size, dtype=np.float64)
        if self.concentration > 0.0:
            points = self.centre + self.scale * np.sinh(self.concentration * z) / math.sinh(self.concentration)
        else:
            points = z
        points[0], points[-1] = self.lo, self.hi  # exact ends: "constant beyond" starts exactly there
        if self.anchor is not None:
            points[round((self.to_z(self.anchor) - self.z_lo) / self.dz)] = self.anchor  # exact, not g(g^-1)
        return points

    def device_params(self) -> list[float]:
        """The 7 numbers the CUDA locator reads: lo, hi, centre, stretch, concentration, z_lo, 1/dz."""
        return [self.lo, self.hi, self.centre, self.stretch, self.concentration, self.z_lo, 1.0 / self.dz]


def make_axis(
    lo: float,
    hi: float,
    size: int,
    centre: float | None = None,
    concentration: float = 0.0,
    anchor: float | None = None,
) -> Axis:
    """An axis from lo to hi with ``size`` nodes, denser near ``centre`` by ``concentration``.

    ``anchor`` (inside ``(lo, hi)``) becomes a node: the uniform z lattice is shifted by at most half a step
    (more only for an anchor within half a step of an end: it then becomes the second or last-but-one node)
    so that one of its points maps to the anchor, and the end nodes stay at the exact ends (the two end cells
    are then about half to one and a half steps wide in z). Locating is unchanged: it reads ``z_lo``.
    """
    assert hi > lo, f"axis max {hi} must exceed min {lo}"
    assert size >= 2, f"an axis needs at least 2 nodes, not {size}"
    assert concentration >= 0.0, f"concentration must be non-negative, not {concentration}"
    if concentration == 0.0 or centre is None:
        axis = Axis(lo, hi, size, 0.5 * (lo + hi), 0.0, 1.0, lo, (hi - lo) / (size - 1))
    else:
        scale = max(abs(hi - centre), abs(lo - centre))
        sinh_c = math.sinh(concentration)
        z_lo = math.asinh((lo - centre) / scale * sinh_c) / concentration
        z_hi = math.asinh((hi - centre) / scale * sinh_c) / concentration
        axis = Axis(lo, hi, size, centre, concentration, scale, z_lo, (z_hi - z_lo) / (size - 1))
    return _anchored(axis, anchor)


def _anchored(axis: Axis, anchor: float | None) -> Axis:
    """The axis with its z lattice shifted so that ``anchor`` is a node (see :func:`make_axis`)."""
    if anchor is None or not axis.lo < anchor < axis.hi or axis.size < 3:
        return replace(axis, anchor=None)
    z_anchor = axis.to_z(anchor)
    steps = min(max(round((z_anchor - axis.z_lo) / axis.dz), 1), axis.size - 2)  # never onto an end node
    return replace(axis, z_lo=z_anchor - steps * axis.dz, anchor=anchor)


@dataclass(frozen=True)
class StateGrid:
    x: Axis
    mu: Axis
    sigma: Axis

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.x.size, self.mu.size, self.sigma.size)

    @property
    def axes(self) -> tuple[Axis, Axis, Axis]:
        return (self.x, self.mu, self.sigma)

    def with_shape(self, shape: tuple[int, int, int]) -> StateGrid:
        """Same cuboid and spacing law with other sizes (coarse-to-fine levels)."""
        return StateGrid(
            *(
                make_axis(a.lo, a.hi, n, a.centre, a.concentration, a.anchor)
                for a, n in zip(self.axes, shape, strict=True)
            )
        )

    def node_arrays(self, xp: Any, dtype: Any = np.float64) -> tuple[Any, Any, Any]:
        return tuple(xp.asarray(a.nodes(), dtype=dtype) for a in self.axes)  # type: ignore[return-value]

    def mesh(self, xp: Any, dtype: Any = np.float64) -> tuple[Any, Any, Any]:
        """Coordinates of every grid point, each of the grid's shape (C order: x slowest, Sigma fastest)."""
        gx, gmu, gs = self.node_arrays(xp, dtype)
        return (
            xp.broadcast_to(gx[:, None, None], self.shape),
            xp.broadcast_to(gmu[None, :, None], self.shape),
            xp.broadcast_to(gs[None, None, :], self.shape),
        )


def make_state_grid(
    x: tuple[float, float, int],
    mu: tuple[float, float, int],
    sigma: tuple[float, float, int],
    xbar: float,
    concentration: float,
    mu_concentration: float | None = None,
    mu_node_at_zero: bool = True,
) -> StateGrid:
    """Grid denser near x = xbar and mu = 0, uniform in Sigma (paper section 4.1).

    ``mu_concentration`` (default: ``concentration``) sets the mu axis apart: the value function has a cusp
    along the non-learning line mu = 0, which wants denser nodes there than x does near xbar. With
    ``mu_node_at_zero`` a node sits exactly at mu = 0 (when 0 lies inside the mu range), so the non-learning
    line is on the grid rather than interpolated from neighbours where learning does happen.
    """
    assert sigma[0] > 0.0, f"the Sigma axis must stay positive, min is {sigma[0]}"
    mu_c = concentration if mu_concentration is None else mu_concentration
    return StateGrid(
        make_axis(*x, centre=xbar, concentration=concentration),
        make_axis(*mu, centre=0.0, concentration=mu_c, anchor=0.0 if mu_node_at_zero else None),
        make_axis(*sigma),
    )


def locate(axis: Axis, nodes: Any, values: Any, xp: Any) -> tuple[Any, Any]:
    """Cell index i (nodes[i] <= v < nodes[i+1], i = size - 2 at the upper end) and weight of nodes[i+1],
    values clamped to the axis.

    Clamping first is what makes the interpolant constant beyond the cuboid. The index comes from comparisons
    with the nodes themselves (not from the spacing law's inverse, whose rounding can put a value on a node in
    either neighbouring cell): bellman.cu's locator guesses with the inverse and settles by the same comparisons,
    so both twins pick the same cell for every value.
    """
    v = xp.clip(values, axis.lo, axis.hi)
    index = xp.clip(xp.searchsorted(nodes, v, side="right") - 1, 0, axis.size - 2)
    left = nodes[index]
    weight = (v - left) / (nodes[index + 1] - left)
    return index, weight


def interpolate(
    values: Any,
    grid: StateGrid,
    nodes: tuple[Any, Any, Any],
    x: Any,
    mu: Any,
    sigma: Any,
    xp: Any,
    baseline: tuple[float, float, float] | None = None,
    curvature: Any | None = None,
) -> Any:
    """Trilinear interpolation of ``values`` (grid-shaped) at points (x, mu, Sigma) of one broadcast shape.

    With ``baseline = (A, B, C)`` the interpolant is that of the residual ``values - (A x^2 + B x + C)``
    plus the quadratic itself at the (unclamped) point: the quadratic in x is then reproduced exactly, inside
    the cuboid and beyond it in x (where only the residual is held constant). The dual-control value is the
    inert cost-to-go (a quadratic in x) minus the gain from control, so the residual is what is interpolated.

    With ``curvature`` (grid-shaped ``d2V/dx2`` at the nodes, :func:`x_curvature`) the linear interpolant in x
    gets the quadratic correction ``-(1/2) V'' (x - x_i)(x_{i+1} - x)``, ``V''`` interpolated like V: a
    function quadratic in x (times multilinear in mu, Sigma) is then reproduced exactly inside the cuboid.
    """
    ix, wx = locate(grid.x, nodes[0], x, xp)
    jm, wm = locate(grid.mu, nodes[1], mu, xp)
    ks, ws = locate(grid.sigma, nodes[2], sigma, xp)
    _, n_mu, n_s = grid.shape
    flat = values.reshape(-1)
    base = (ix * n_mu + jm) * n_s + ks

    def along_sigma(offset: Any) -> Any:
        return flat[offset] * (1.0 - ws) + flat[offset + 1] * ws

    def along_mu(offset: Any) -> Any:
        return along_sigma(offset) * (1.0 - wm) + along_sigma(offset + n_s) * wm

    out = along_mu(base) * (1.0 - wx) + along_mu(base + n_mu * n_s) * wx
    if curvature is not None:
        flat_c = curvature.reshape(-1)

        def curv_sigma(offset: Any) -> Any:
            return flat_c[offset] * (1.0 - ws) + flat_c[offset + 1] * ws

        def curv_mu(offset: Any) -> Any:
            return curv_sigma(offset) * (1.0 - wm) + curv_sigma(offset + n_s) * wm

        d2 = curv_mu(base) * (1.0 - wx) + curv_mu(base + n_mu * n_s) * wx
        h = nodes[0][ix + 1] - nodes[0][ix]
        out = out - 0.5 * d2 * (wx * (1.0 - wx)) * (h * h)
    if baseline is None:
        return out
    return out + baseline_correction(baseline, nodes[0][ix], nodes[0][ix + 1], wx, x)


def x_curvature(values: Any, x_nodes: Any, xp: Any) -> Any:
    """``d2V/dx2`` at every node by the three-point formula on the (non-uniform) x nodes, exact for a quadratic
    in x; the end nodes take their neighbour's value (a grid-shaped array like ``values``)."""
    h = x_nodes[1:] - x_nodes[:-1]
    slope = (values[1:] - values[:-1]) / h[:, None, None]
    inner = 2.0 * (slope[1:] - slope[:-1]) / (h[1:] + h[:-1])[:, None, None]
    return xp.ascontiguousarray(xp.concatenate([inner[:1], inner, inner[-1:]], axis=0))


def baseline_correction(baseline: tuple[float, float, float], left: Any, right: Any, weight: Any, x: Any) -> Any:
    """``q(x) - [(1 - w) q(left) + w q(right)]`` for the quadratic ``q = A x^2 + B x + C``: what turns the
    linear interpolant in x of ``V`` into that of ``V - q`` plus ``q`` (bellman.cu: the same lines)."""
    a, b, c = baseline
    q_left = (a * left + b) * left + c
    q_right = (a * right + b) * right + c
    return ((a * x + b) * x + c) - (q_left * (1.0 - weight) + q_right * weight)
