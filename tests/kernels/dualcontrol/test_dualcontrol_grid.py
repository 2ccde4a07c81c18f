"""Non-uniform axes and trilinear interpolation (constant beyond the cuboid)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator

from kernels.dualcontrol.grid import interpolate, locate, make_axis, make_state_grid, x_curvature


@pytest.mark.parametrize("concentration", [0.0, 1.0, 3.0])
def test_axis_nodes_increase_hit_the_ends_and_concentrate_at_the_centre(concentration: float) -> None:
    axis = make_axis(-4.0, 10.0, 41, centre=1.0, concentration=concentration)
    nodes = axis.nodes()
    assert nodes[0] == -4.0 and nodes[-1] == 10.0
    gaps = np.diff(nodes)
    assert (gaps > 0).all()
    centre_gap = gaps[np.argmin(np.abs(nodes[:-1] - 1.0))]
    if concentration == 0.0:
        np.testing.assert_allclose(gaps, gaps[0], rtol=1e-12)
    else:
        # spacing at the centre is 1/cosh(c) of the spacing at the farther end (|z| = 1)
        assert centre_gap / gaps[-1] == pytest.approx(1.0 / math.cosh(concentration), rel=0.1)


def test_locate_brackets_every_point_and_clamps() -> None:
    axis = make_axis(-3.0, 5.0, 17, centre=0.5, concentration=2.0)
    nodes = axis.nodes()
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.uniform(-6, 8, 2000), nodes])  # points beyond the ends and exactly on nodes
    index, weight = locate(axis, nodes, values, np)
    clamped = np.clip(values, -3.0, 5.0)
    assert ((weight >= -1e-12) & (weight <= 1 + 1e-12)).all()
    np.testing.assert_allclose(nodes[index] + weight * (nodes[index + 1] - nodes[index]), clamped, atol=1e-12)


@pytest.mark.parametrize("anchor", [None, 0.0])
def test_locate_picks_the_cell_the_nodes_bound_even_on_a_node(anchor: float | None) -> None:
    """nodes[i] <= v < nodes[i+1] exactly (i = size - 2 at the top end) for values on the nodes, one ulp either
    side of them and at the anchor (mu = 0), where the spacing law's inverse rounds to either neighbour: the
    rule bellman.cu's locator settles by the same comparisons."""
    axis = make_axis(-3.0, 5.0, 33, centre=0.5, concentration=2.0, anchor=anchor)
    nodes = axis.nodes()
    values = np.concatenate([nodes, np.nextafter(nodes, -np.inf), np.nextafter(nodes, np.inf), [0.0, 5.0, 9.0]])
    index, weight = locate(axis, nodes, values, np)
    clamped = np.clip(values, -3.0, 5.0)
    top = index == axis.size - 2
    assert (nodes[index] <= clamped).all()
    assert ((clamped < nodes[index + 1]) | (top & (clamped == 5.0))).all()
    assert ((weight >= 0.0) & (weight <= 1.0)).all()
    on_node = np.isin(clamped, nodes[:-1])
    np.testing.assert_array_equal(weight[on_node], 0.0)  # a value on a node is that node's, weight 0


def _grid():
    return make_state_grid((-4.0, 6.0, 13), (-2.0, 3.0, 11), (0.05, 2.0, 9), xbar=1.0, concentration=2.0)


def test_trilinear_functions_are_reproduced_exactly() -> None:
    grid = _grid()
    x, mu, s = grid.mesh(np)

    def f(x, mu, s):
        return 1.0 + 2.0 * x - mu + 0.5 * s + 0.3 * x * mu - 0.7 * mu * s + 0.2 * x * s + 0.1 * x * mu * s

    rng = np.random.default_rng(2)
    px, pmu, ps = rng.uniform(-4, 6, 500), rng.uniform(-2, 3, 500), rng.uniform(0.05, 2.0, 500)
    got = interpolate(f(x, mu, s), grid, grid.node_arrays(np), px, pmu, ps, np)
    np.testing.assert_allclose(got, f(px, pmu, ps), rtol=1e-12, atol=1e-12)


def test_interpolation_matches_scipy_inside_and_is_constant_beyond() -> None:
    grid = _grid()
    rng = np.random.default_rng(3)
    values = rng.normal(size=grid.shape)
    nodes = grid.node_arrays(np)
    reference = RegularGridInterpolator(nodes, values, method="linear")
    p = np.column_stack([rng.uniform(-7, 9, 3000), rng.uniform(-4, 5, 3000), rng.uniform(-1, 3, 3000)])
    clamped = np.column_stack([np.clip(p[:, i], nodes[i][0], nodes[i][-1]) for i in range(3)])
    got = interpolate(values, grid, nodes, p[:, 0], p[:, 1], p[:, 2], np)
    np.testing.assert_allclose(got, reference(clamped), rtol=1e-12, atol=1e-12)


def test_quadratic_correction_reproduces_a_quadratic_in_x_exactly() -> None:
    """``interpolate(..., curvature=x_curvature(V))``: exact for V quadratic in x times multilinear in (mu,
    Sigma), on a concentrated (non-uniform) x axis; plain trilinear overstates such a V between x nodes."""
    grid = _grid()
    x, mu, s = grid.mesh(np)

    def f(x, mu, s):
        return (1.0 + 0.3 * mu - 0.2 * s + 0.1 * mu * s) * (2.0 * x * x - x + 3.0) + mu * s

    values = np.ascontiguousarray(f(x, mu, s))
    curvature = x_curvature(values, grid.x.nodes(), np)
    np.testing.assert_allclose(curvature[1:-1], 4.0 * (1.0 + 0.3 * mu - 0.2 * s + 0.1 * mu * s)[1:-1], rtol=1e-10)
    rng = np.random.default_rng(4)
    p = rng.uniform(-4, 6, 800), rng.uniform(-2, 3, 800), rng.uniform(0.05, 2.0, 800)
    nodes = grid.node_arrays(np)
    got = interpolate(values, grid, nodes, *p, np, None, curvature)
    np.testing.assert_allclose(got, f(*p), rtol=1e-12, atol=1e-11)
    assert np.abs(interpolate(values, grid, nodes, *p, np) - f(*p)).max() > 0.1
