"""Closed forms of the dual-control model against independent computations."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.dualcontrol.model import (
    ModelParams,
    inert_bounds,
    inert_value,
    loss_coefficients,
    myopic_policy,
    one_period_loss,
)
from kernels.dualcontrol.quadrature import NEGLIGIBLE_WEIGHT, normal_quadrature

MODEL = ModelParams(alpha=0.3, gamma=0.6, sigma_eps=0.8, delta=0.9, omega=0.5, xbar=1.0, ubar=0.2)


def test_quadrature_integrates_normal_moments() -> None:
    z, w = normal_quadrature(10)
    assert w.sum() == pytest.approx(1.0, abs=1e-14)
    # E Z^2k = (2k-1)!!, exact for degree <= 19.
    for power, moment in ((1, 0.0), (2, 1.0), (4, 3.0), (6, 15.0), (8, 105.0)):
        assert (w * z**power).sum() == pytest.approx(moment, abs=1e-10)


@pytest.mark.parametrize(("nodes", "kept"), [(16, 16), (32, 28), (64, 44)])
def test_dropping_negligible_nodes_keeps_the_rule_to_float64_resolution(nodes: int, kept: int) -> None:
    """The operators drop the outermost nodes of weight < 2^-60 (1e-18 of the weight at 32 nodes): the others keep
    their weights, and the expectation of values of one magnitude (a value function's: bounded, here between 1
    and 99) moves by no more than rounding."""
    z_all, w_all = normal_quadrature(nodes)
    z, w = normal_quadrature(nodes, drop_below=NEGLIGIBLE_WEIGHT)
    kept_mask = np.isin(z_all, z)
    assert z.size == kept and kept_mask.sum() == kept
    np.testing.assert_array_equal(w, w_all[kept_mask])
    assert kept == nodes or np.abs(z_all[~kept_mask]).min() > np.abs(z).max()  # the outermost went
    assert w_all[~kept_mask].sum() < 2e-18
    rng = np.random.default_rng(nodes)
    for a, b, c in rng.uniform(-1.0, 1.0, (20, 3)):
        kept_sum = (w * (50.0 + 49.0 * np.sin(a * z + b) * np.cos(c * z))).sum()
        full_sum = (w_all * (50.0 + 49.0 * np.sin(a * z_all + b) * np.cos(c * z_all))).sum()
        assert kept_sum == pytest.approx(full_sum, rel=4e-16)


@pytest.mark.parametrize("model", [MODEL, ModelParams(-0.5, -0.8, 1.3, 0.97, 0.0, -2.0, 1.0)])
def test_inert_closed_form_solves_its_recursion(model: ModelParams) -> None:
    """V0(x) = (alpha + gamma x - xbar)^2 + sigma^2 + omega ubar^2 + delta E V0(alpha + gamma x + eps)."""
    x = np.linspace(-7.0, 9.0, 33)
    coef_a, coef_b, coef_c = model.inert_coefficients()
    mean = model.alpha + model.gamma * x
    expected_next = coef_a * (mean**2 + model.sigma_eps2) + coef_b * mean + coef_c  # exact Gaussian moments
    rhs = (mean - model.xbar) ** 2 + model.sigma_eps2 + model.omega * model.ubar**2 + model.delta * expected_next
    np.testing.assert_allclose(inert_value(model, x), rhs, rtol=1e-13)


def test_inert_closed_form_equals_discounted_simulation_sum() -> None:
    """Independent of the algebra: the discounted sum of expected losses along the AR(1) path, u = 0."""
    m, x0 = MODEL, 2.5
    total, mean, var = 0.0, x0, 0.0
    for t in range(600):
        mean, var = m.alpha + m.gamma * mean, m.gamma**2 * var + m.sigma_eps2
        total += m.delta**t * ((mean - m.xbar) ** 2 + var + m.omega * m.ubar**2)
    assert inert_value(m, x0) == pytest.approx(total, rel=1e-12)


def test_one_period_loss_matches_two_dimensional_quadrature() -> None:
    """E over beta ~ N(mu, Sigma) and eps of (alpha + beta u + gamma x + eps - xbar)^2 + omega (u - ubar)^2."""
    z, w = normal_quadrature(8)
    x, mu, sigma = 1.7, -0.6, 0.45
    for u in (-2.0, -0.3, 0.0, 0.9, 3.1):
        beta = mu + np.sqrt(sigma) * z[:, None]
        eps = MODEL.sigma_eps * z[None, :]
        x_next = MODEL.alpha + beta * u + MODEL.gamma * x + eps
        expected = (w[:, None] * w[None, :] * (x_next - MODEL.xbar) ** 2).sum() + MODEL.omega * (u - MODEL.ubar) ** 2
        assert one_period_loss(MODEL, x, mu, sigma, u) == pytest.approx(expected, rel=1e-12)
        a, b, c = loss_coefficients(MODEL, x, mu, sigma)
        assert a * u * u + b * u + c == pytest.approx(expected, rel=1e-12)


def test_myopic_policy_minimises_the_one_period_loss() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        x, mu, sigma = rng.uniform(-5, 5), rng.uniform(-2, 2), rng.uniform(0.01, 2)
        u_star = myopic_policy(MODEL, x, mu, sigma)
        scan = np.linspace(u_star - 3.0, u_star + 3.0, 60_001)  # spacing 1e-4
        losses = one_period_loss(MODEL, x, mu, sigma, scan)
        assert abs(scan[np.argmin(losses)] - u_star) <= 1e-4
        assert one_period_loss(MODEL, x, mu, sigma, u_star) <= losses.min() + 1e-12


def test_inert_bounds_are_centred_on_myopic_and_bound_the_loss() -> None:
    rng = np.random.default_rng(8)
    x, mu, sigma = rng.uniform(-5, 5, 50), rng.uniform(-2, 2, 50), rng.uniform(0.01, 2, 50)
    upper = inert_value(MODEL, x)
    lo, hi = inert_bounds(MODEL, x, mu, sigma, upper, np)
    np.testing.assert_allclose(0.5 * (lo + hi), myopic_policy(MODEL, x, mu, sigma), atol=1e-12)
    np.testing.assert_allclose(one_period_loss(MODEL, x, mu, sigma, lo), upper, rtol=1e-10)
    np.testing.assert_allclose(one_period_loss(MODEL, x, mu, sigma, hi), upper, rtol=1e-10)


def test_model_asserts_its_domain() -> None:
    # A job's ModelSpec refuses these at submission (within tighter bounds); the model asserts its domain.
    with pytest.raises(AssertionError, match="gamma"):
        ModelParams(0.0, 1.0, 1.0, 0.9, 1.0, 0.0, 0.0)
    with pytest.raises(AssertionError, match="delta"):
        ModelParams(0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 0.0)
    with pytest.raises(AssertionError, match="sigma_eps"):
        ModelParams(0.0, 0.5, 0.0, 0.9, 1.0, 0.0, 0.0)
