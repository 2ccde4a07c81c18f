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
from dataclasses import dataclass
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

    @property
    def stretch(self) -> float:
        """``sinh(c) / R``: maps a distance from the centre to ``sinh(c z)`` (0 on a uniform axis)."""
        return math.sinh(self.concentration) / self.scale if self.concentration > 0.0 else 0.0

    def nodes(self) -> np.ndarray:
        z = self.z_lo + self.dz * np.arange(self.size, dtype=np.float64)
        if self.concentration > 0.0:
            points = self.centre + self.scale * np.sinh(self.concentration * z) / math.sinh(self.concentration)
        else:
            points = z
        points[0], points[-1] = self.lo, self.hi  # exact ends: "constant beyond" starts exactly there
        return points

    def device_params(self) -> list[float]:
        """The 7 numbers the CUDA locator reads: lo, hi, centre, stretch, concentration, z_lo, 1/dz."""
        return [self.lo, self.hi, self.centre, self.stretch, self.concentration, self.z_lo, 1.0 / self.dz]


def make_axis(lo: float, hi: float, size: int, centre: float | None = None, concentration: float = 0.0) -> Axis:
    if not hi > lo:
        raise ValueError(f"axis max {hi} must exceed min {lo}")
    if size < 2:
        raise ValueError(f"an axis needs at least 2 nodes, not {size}")
    if concentration < 0.0:
        raise ValueError(f"concentration must be non-negative, not {concentration}")
    if concentration == 0.0 or centre is None:
        return Axis(lo, hi, size, 0.5 * (lo + hi), 0.0, 1.0, lo, (hi - lo) / (size - 1))
    scale = max(abs(hi - centre), abs(lo - centre))
    sinh_c = math.sinh(concentration)
    z_lo = math.asinh((lo - centre) / scale * sinh_c) / concentration
    z_hi = math.asinh((hi - centre) / scale * sinh_c) / concentration
    return Axis(lo, hi, size, centre, concentration, scale, z_lo, (z_hi - z_lo) / (size - 1))


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
            *(make_axis(a.lo, a.hi, n, a.centre, a.concentration) for a, n in zip(self.axes, shape, strict=True))
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
) -> StateGrid:
    """Grid denser near x = xbar and mu = 0, uniform in Sigma (paper section 4.1)."""
    if sigma[0] <= 0.0:
        raise ValueError(f"the Sigma axis must stay positive, min is {sigma[0]}")
    return StateGrid(
        make_axis(*x, centre=xbar, concentration=concentration),
        make_axis(*mu, centre=0.0, concentration=concentration),
        make_axis(*sigma),
    )


def locate(axis: Axis, nodes: Any, values: Any, xp: Any) -> tuple[Any, Any]:
    """Cell index i (nodes[i] <= v <= nodes[i+1]) and weight of nodes[i+1], values clamped to the axis.

    Clamping first is what makes the interpolant constant beyond the cuboid.
    """
    v = xp.clip(values, axis.lo, axis.hi)
    z = xp.arcsinh((v - axis.centre) * axis.stretch) / axis.concentration if axis.concentration > 0.0 else v
    t = (z - axis.z_lo) * (1.0 / axis.dz)
    index = xp.clip(xp.floor(t), 0, axis.size - 2).astype(xp.int64)
    left = nodes[index]
    weight = (v - left) / (nodes[index + 1] - left)
    return index, weight


def interpolate(values: Any, grid: StateGrid, nodes: tuple[Any, Any, Any], x: Any, mu: Any, sigma: Any, xp: Any) -> Any:
    """Trilinear interpolation of ``values`` (grid-shaped) at points (x, mu, Sigma) of one broadcast shape."""
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

    return along_mu(base) * (1.0 - wx) + along_mu(base + n_mu * n_s) * wx
