"""Expected cost-to-go of a control at every grid point, and the two operators built on it.

``Q(u; S, V) = L(S, u) + delta E[V(x', mu', Sigma')]`` where, given S = (x, mu, Sigma) and control u,
``x' ~ N(alpha + mu u + gamma x, u^2 Sigma + sigma_eps^2)`` (a Gauss-Hermite sum over x') and the beliefs
are Bayes-updated at each node: ``Sigma' = 1 / (1/Sigma + u^2/sigma_eps^2)``,
``mu' = Sigma' (mu/Sigma + u y / sigma_eps^2)`` with ``y = x' - alpha - gamma x`` (docs/dualcontrol.md). V
between nodes is the trilinear interpolant, constant beyond the cuboid; with ``interpolation="residual"``
that of ``V - V0`` (``V0`` the inert closed form, a quadratic in x) plus ``V0``, so the residual is what is
held constant beyond the cuboid and the inert cost-to-go is reproduced exactly.

Two implementations of one interface (``evaluate``: apply a fixed policy; ``improve``: minimise over u):
``ArrayBellman`` is written against the array namespace (NumPy, or CuPy as a slow reference), and
``CudaBellman`` runs the same arithmetic, one thread per grid point, in a fused CUDA kernel
(bellman.cu, compiled by :mod:`kernels.cuda` with the real type and the golden-section constant as defines)
with the whole minimisation in registers, so that no (points x nodes) temporaries touch memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Protocol

import numpy as np

from kernels import cuda
from kernels.backend import is_numpy
from kernels.dualcontrol.grid import StateGrid, interpolate, x_curvature
from kernels.dualcontrol.minimize import INVERSE_GOLDEN_RATIO, golden_section_minimise
from kernels.dualcontrol.model import ModelParams, inert_bounds, inert_value, myopic_policy
from kernels.dualcontrol.quadrature import NEGLIGIBLE_WEIGHT, normal_quadrature

# x nodes of a band of the kernels' banded point order (bellman.cu point_of): 8, 16 and 32 measured alike at 256^3.
BAND = 16


def kernel_defines(dtype: Any, quadratic: bool = False) -> dict[str, cuda.DefineValue]:
    """The defines bellman.cu is compiled with for arrays of ``dtype`` (float64 or float32); ``quadratic``: the
    values come as (V, d2V/dx2) pairs (quadratic interpolation in x)."""
    return {**cuda.real_define(dtype), "INVERSE_GOLDEN_RATIO": INVERSE_GOLDEN_RATIO, "QUADRATIC": quadratic,
            "BAND": BAND}


def band_points(shape: tuple[int, int, int]) -> int:
    """Grid points of one full band of the banded order (a slab that starts and ends on multiples of it, or at
    the grid's end, runs banded)."""
    return BAND * shape[1] * shape[2]


# Both precisions the job kind offers (``precision``: float64, float32), with and without the quadratic
# interpolation's value pairs, are compiled at worker start.
_SOURCE = cuda.kernel_source(
    __file__, "bellman.cu",
    warm_up=[kernel_defines(dtype, quadratic) for dtype in (np.float64, np.float32) for quadratic in (False, True)],
)


Interpolation = Literal["trilinear", "quadratic", "residual"]


@dataclass(frozen=True)
class MinimiserSettings:
    scan_points: int = 8
    golden_iterations: int = 28


class BellmanOperator(Protocol):
    grid: StateGrid
    heartbeat: Callable[[], None] | None

    def evaluate(self, values: Any, policy: Any) -> Any:
        """``Q(policy(S); S, values)`` at every grid point (policy evaluation sweep)."""

    def improve(self, values: Any, previous_policy: Any | None) -> tuple[Any, Any]:
        """``(min_u Q(u; S, values), argmin)`` at every grid point (Bellman operator)."""


# Points x nodes per chunk of the NumPy operator: about 25 temporaries of this many entries live at once.
CHUNK_ENTRIES = 1 << 20


class ArrayBellman:
    """Vectorised over grid points in chunks (bounded temporaries); NumPy twin of :class:`CudaBellman`."""

    def __init__(
        self,
        model: ModelParams,
        grid: StateGrid,
        quadrature_nodes: int,
        xp: Any,
        dtype: Any = np.float64,
        minimiser: MinimiserSettings | None = None,
        chunk_entries: int = CHUNK_ENTRIES,
        interpolation: Interpolation = "trilinear",
    ) -> None:
        self.model, self.grid, self.xp, self.dtype = model, grid, xp, np.dtype(dtype)
        self.interpolation = interpolation
        self.baseline = model.inert_coefficients() if interpolation == "residual" else None
        self._curvature_of: Any = None  # the values array whose x curvature is cached (quadratic interpolation)
        self._curvature: Any = None
        self.minimiser = minimiser or MinimiserSettings()
        # The outermost nodes of a many-node rule weigh less than float64 resolves (the kernels' cost is per node)
        z, w = normal_quadrature(quadrature_nodes, drop_below=NEGLIGIBLE_WEIGHT)
        self.quad_z = xp.asarray(z, dtype=self.dtype)
        self.quad_w = xp.asarray(w, dtype=self.dtype)
        self.nodes = grid.node_arrays(xp, self.dtype)
        self.chunk = max(1, chunk_entries // quadrature_nodes)
        # called after every chunk: on a CPU one sweep of a large grid takes minutes, and the job's progress
        # channel (cancellation) must hear from it every few seconds
        self.heartbeat: Callable[[], None] | None = None

    @cached_property
    def points(self) -> tuple[Any, Any, Any]:
        """Flat coordinates of every grid point (built on first use: an operator that only evaluates Q at a
        few states, the exact-state report's, never needs them)."""
        return tuple(self.xp.ascontiguousarray(c).reshape(-1) for c in self.grid.mesh(self.xp, self.dtype))  # type: ignore[return-value]

    def curvature(self, values: Any) -> Any | None:
        """``d2V/dx2`` on the grid for quadratic interpolation (None otherwise), computed once per ``values``."""
        if self.interpolation != "quadratic":
            return None
        if self._curvature_of is not values:
            self._curvature = x_curvature(values, self.nodes[0], self.xp)
            self._curvature_of = values
        return self._curvature

    def q_at_points(self, values: Any, x: Any, mu: Any, sigma: Any, u: Any) -> Any:
        """Q at arbitrary states (flat arrays x, mu, sigma, u of one length), V interpolated from the grid."""
        m, xp = self.model, self.xp
        se2 = m.sigma_eps2
        mean = m.alpha + mu * u + m.gamma * x
        sd = xp.sqrt(u * u * sigma + se2)
        sigma_next = 1.0 / (1.0 / sigma + u * u / se2)
        e = sd[:, None] * self.quad_z[None, :]
        x_next = mean[:, None] + e
        y = (mu * u)[:, None] + e
        mu_next = sigma_next[:, None] * (mu[:, None] / sigma[:, None] + u[:, None] * y / se2)
        v_next = interpolate(
            values,
            self.grid,
            self.nodes,
            x_next,
            mu_next,
            xp.broadcast_to(sigma_next[:, None], x_next.shape),
            xp,
            self.baseline,
            self.curvature(values),
        )
        # a sum along each point's row, not a BLAS gemv: OpenBLAS's dgemv gives a row a different rounding
        # depending on where the batch starts (measured: 99 of 200 random row slices differed in the last bit),
        # and the NumPy slabs of slabs.SlabBellman must reproduce the whole sweep bit for bit
        expected = (v_next * self.quad_w).sum(axis=1)
        gap = mean - m.xbar
        du = u - m.ubar
        loss = gap * gap + sigma * u * u + se2 + m.omega * du * du
        return loss + m.delta * expected

    def q_values(self, values: Any, u: Any) -> Any:
        """Q at every grid point for the control array ``u`` (grid-shaped or flat)."""
        xp = self.xp
        u_flat = xp.asarray(u, dtype=self.dtype).reshape(-1)
        out = xp.empty_like(u_flat)
        for start in range(0, u_flat.size, self.chunk):
            part = slice(start, start + self.chunk)
            out[part] = self.q_at_points(values, *(p[part] for p in self.points), u_flat[part])
            if self.heartbeat is not None:
                self.heartbeat()
        return out.reshape(self.grid.shape)

    def evaluate(self, values: Any, policy: Any) -> Any:
        return self.q_values(values, policy)

    def brackets(self, values: Any) -> tuple[Any, Any]:
        """Inert bounds on the optimal control at every grid point (see :func:`inert_bounds`).

        The upper cost is the larger of the closed-form inert cost and the current iterate: on the truncated
        cuboid the inert cost differs slightly from the closed form, and the current iterate tends to the
        optimal cost, which also bounds the one-period loss of the optimal control.
        """
        xp = self.xp
        x, mu, sigma = (p.reshape(self.grid.shape) for p in self.points)
        upper = xp.maximum(inert_value(self.model, x), values)
        return inert_bounds(self.model, x, mu, sigma, upper, xp)

    def improve(self, values: Any, previous_policy: Any | None) -> tuple[Any, Any]:
        x, mu, sigma = (p.reshape(self.grid.shape) for p in self.points)
        lo, hi = self.brackets(values)
        starts = [myopic_policy(self.model, x, mu, sigma)]
        if previous_policy is not None:
            starts.append(previous_policy)
        u, q = golden_section_minimise(
            lambda u: self.q_values(values, u),
            lo,
            hi,
            starts,
            self.minimiser.scan_points,
            self.minimiser.golden_iterations,
            self.xp,
        )
        return q, u


class CudaBellman(ArrayBellman):
    """The fused CUDA kernels; inherits the array set-up and keeps :meth:`q_values` as the reference.

    ``point_range = (first, count)``: the kernels compute only the flat grid points first .. first + count - 1
    (C order; the arrays :meth:`evaluate` and :meth:`improve` return are grid-shaped, the other points left
    unwritten), one device's slab of :class:`kernels.dualcontrol.slabs.SlabBellman`; default all of them.
    """

    block = 128  # the kernels' __launch_bounds__ (bellman.cu) assume at most 128 threads a block

    def __init__(self, *args: Any, point_range: tuple[int, int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        xp, m = self.xp, self.model
        coef_a, coef_b, coef_c = m.inert_coefficients()
        params = [m.alpha, m.gamma, m.sigma_eps2, m.delta, m.omega, m.xbar, m.ubar, coef_a, coef_b, coef_c]
        params.append(m.omega * m.ubar)
        params.append(m.omega * m.ubar**2)
        for axis in self.grid.axes:
            params.extend(axis.device_params())
        params.append(1.0 if self.baseline is not None else 0.0)  # residual interpolation (V - V0) on/off
        self.params = xp.asarray(np.asarray(params, dtype=self.dtype))
        defines = kernel_defines(self.dtype, self.interpolation == "quadratic")
        self._evaluate = cuda.function(_SOURCE, "dc_evaluate", defines)
        self._improve = cuda.function(_SOURCE, "dc_improve", defines)
        self._pair = cuda.function(_SOURCE, "dc_pair", defines)
        self._paired_of: Any = None  # the values array whose (V, d2V/dx2) pairs are cached (quadratic)
        self._paired: Any = None
        self.n_points = int(np.prod(self.grid.shape))
        self.point_range = point_range or (0, self.n_points)
        first, count = self.point_range
        if first < 0 or count < 1 or first + count > self.n_points:
            raise ValueError(f"point_range {self.point_range} is not a range of the grid's {self.n_points} points")
        band = band_points(self.grid.shape)
        stop = first + count
        self._banded = first % band == 0 and (stop % band == 0 or stop == self.n_points)

    def _common_args(self) -> tuple[Any, ...]:
        nx, n_mu, n_s = self.grid.shape
        return (
            self.params,
            *self.nodes,
            self.quad_z,
            self.quad_w,
            np.int32(self.quad_z.size),
            np.int32(nx),
            np.int32(n_mu),
            np.int32(n_s),
            np.int64(self.point_range[0]),
            np.int64(self.point_range[1]),
            np.int32(self._banded),
        )

    def _launch_shape(self) -> tuple[tuple[int], tuple[int]]:
        return ((self.point_range[1] + self.block - 1) // self.block,), (self.block,)

    def evaluate(self, values: Any, policy: Any) -> Any:
        xp = self.xp
        values = xp.ascontiguousarray(values, dtype=self.dtype)
        policy = xp.ascontiguousarray(policy, dtype=self.dtype)
        out = xp.empty_like(values)
        self._evaluate(*self._launch_shape(), (*self._common_args(), self._values_arg(values), policy, out))
        return out

    def _values_arg(self, values: Any) -> Any:
        """The kernels' V argument: ``values`` itself, or with quadratic interpolation each point's pair
        ``(V, d2V/dx2)`` (bellman.cu's QUADRATIC layout), built once per ``values`` array."""
        if self.interpolation != "quadratic":
            return values
        if self._paired_of is not values:
            xp = self.xp
            paired = xp.empty((*values.shape, 2), dtype=self.dtype)
            nx, plane = values.shape[0], values.shape[1] * values.shape[2]
            if nx >= 3:  # dc_pair: one pass (x_curvature's arrays cost a sweep a few milliseconds at 256^3)
                self._pair(((values.size + self.block - 1) // self.block,), (self.block,),
                           (values, self.nodes[0], np.int32(nx), np.int64(plane), paired))
            else:
                paired[..., 0] = values
                paired[..., 1] = x_curvature(values, self.nodes[0], xp)
            self._paired, self._paired_of = paired, values
        return self._paired

    def improve(self, values: Any, previous_policy: Any | None) -> tuple[Any, Any]:
        xp = self.xp
        values = xp.ascontiguousarray(values, dtype=self.dtype)
        has_previous = previous_policy is not None
        previous = xp.ascontiguousarray(previous_policy, dtype=self.dtype) if has_previous else values
        out_v = xp.empty_like(values)
        out_u = xp.empty_like(values)
        args = (
            *self._common_args(),
            self._values_arg(values),
            previous,
            np.int32(has_previous),
            np.int32(self.minimiser.scan_points),
            np.int32(self.minimiser.golden_iterations),
            out_v,
            out_u,
        )
        self._improve(*self._launch_shape(), args)
        return out_v, out_u


def make_operator(
    model: ModelParams,
    grid: StateGrid,
    quadrature_nodes: int,
    xp: Any,
    dtype: Any = np.float64,
    minimiser: MinimiserSettings | None = None,
    fused: bool | None = None,
    interpolation: Interpolation = "trilinear",
) -> BellmanOperator:
    """The CUDA kernels on a GPU namespace (unless ``fused=False``), the array twin otherwise."""
    use_cuda = not is_numpy(xp) if fused is None else fused
    cls = CudaBellman if use_cuda else ArrayBellman
    return cls(model, grid, quadrature_nodes, xp, dtype, minimiser, interpolation=interpolation)
