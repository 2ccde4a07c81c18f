"""Accuracy tests of a Krusell-Smith solution: Den Haan's (2010) ALM test and Euler-equation errors.

Two tests of the aggregate law of motion (ALM), both a dynamic forecast (``K^ALM_0 = K_0``,
``ln K^ALM_{t+1} = b0_{a_t} + b1_{a_t} ln K^ALM_t``) compared with the capital that the individual policy
implies along the same aggregate shocks:

* the ``panel`` test (in :mod:`kernels.ks.solve`) - a fresh aggregate path from the solve's final panel,
  simulated with ``N`` agents and drawn employment (its ``K_t`` carries the panel's sampling noise).
* :func:`histogram_test` - the test of the Den Haan-Judd-Juillard (2010) comparison: the cross-section is a
  histogram over a fixed capital grid for each employment state, moved *non-stochastically* along a given
  aggregate path (the comparison's 10,000-period ``agshock``, :mod:`kernels.ks.inputs`), so ``K_t`` holds no
  idiosyncratic sampling noise at all. Each period (Young 2010's lottery): the mass at node ``k_j`` of state
  ``eps`` moves to ``k' = g(k_j, K_t, a_t, eps)``, split between the two nodes around ``k'`` in proportion to
  the distance (so the mean moves exactly as the policy says); then the employment transition of
  ``(a_t, a_{t+1})`` mixes the two conditional distributions with exact fractions. ``K_t = u_{a_t} m_u +
  (1 - u_{a_t}) m_e`` with the conditional means ``m_u, m_e``: the unemployed share is exactly ``u(a_t)``,
  as in the comparison's test program (Maliar, Maliar & Valli's ``TEST.m``, which inverts the policy
  instead of splitting mass; both are first-order schemes on the same grid).

It also reports Euler-equation errors ``|c / c_Euler - 1|`` (unit free; ``log10`` of their mean and maximum,
as the comparison's literature reports them): on a grid of ``(k, K)`` points on and off the policy's nodes,
with ``K'`` from the ALM, and along one agent's path through the test (the comparison's ``idshock``, from
``k = 43``), with the realised ``K_{t+1}`` of the histogram (``TEST.m`` section 9). ``c_Euler`` is the
consumption the Euler equation gives at the policy's own next-period choices; where it would take ``k'``
below the borrowing limit it is cut back to the budget at the limit (``TEST.m``), and points where both the
policy and the Euler equation sit at the limit (the Euler equation holds as an inequality) are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.backend import to_host
from kernels.ks import alm as alm_mod
from kernels.ks.grids import Grids
from kernels.ks.inputs import AccuracyInputs
from kernels.ks.interp import Method, interpolate
from kernels.ks.model import (
    Calibration,
    conditional_employment,
    interest_rate,
    labour_income_factor,
    wage,
)
from kernels.ks.policy import next_aggregate_capital
from kernels.progress import Pacer

CONSUMPTION_FLOOR = 1e-10  # as in the policy step: a non-positive future consumption is replaced by this


# ---------------------------------------------------------------------------------------------------------
# The non-stochastic histogram (Young 2010 lottery)


def lottery(k_nodes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower node index i and the weight of node i + 1 that split mass at ``values`` between k_i and k_{i+1}
    so that the mean is kept (values are first clamped to the nodes' range)."""
    clamped = np.clip(values, k_nodes[0], k_nodes[-1])
    low = np.clip(np.searchsorted(k_nodes, clamped, side="right") - 1, 0, k_nodes.size - 2)
    weight_high = (clamped - k_nodes[low]) / (k_nodes[low + 1] - k_nodes[low])
    return low, weight_high


def move_mass(k_nodes: np.ndarray, mass: np.ndarray, destinations: np.ndarray) -> np.ndarray:
    """Each row's mass at node j moved to ``destinations[row, j]`` by the lottery (rows independent)."""
    size = k_nodes.size
    moved = np.empty_like(mass)
    for row in range(mass.shape[0]):
        low, weight_high = lottery(k_nodes, destinations[row])
        moved[row] = (np.bincount(low, mass[row] * (1.0 - weight_high), minlength=size)
                      + np.bincount(low + 1, mass[row] * weight_high, minlength=size))
    return moved


def mix_employment(cal: Calibration, conditional: np.ndarray, a_now: int, a_next: int) -> np.ndarray:
    """Conditional distributions (unemployed, employed) after the employment transition of (a_now, a_next).

    Joint mass of eps -> eps' is share_eps(a_now) P(eps' | a_now, a_next, eps); each new row is normalised
    (its total is u(a_next) or 1 - u(a_next) up to the published matrix's rounding).
    """
    emp = conditional_employment(cal)[a_now, a_next]  # P(employed' | eps), eps = u, e
    u_now = cal.unemployment[a_now]
    share = np.array([u_now, 1.0 - u_now])
    joint = share[:, None] * np.stack([1.0 - emp, emp], axis=1)  # [eps, eps']
    mixed = joint.T @ conditional  # [eps', node]
    return mixed / joint.sum(axis=0)[:, None]


def aggregate_capital(cal: Calibration, k_nodes: np.ndarray, conditional: np.ndarray, a: int) -> float:
    u = cal.unemployment[a]
    means = conditional @ k_nodes
    return float(u * means[0] + (1.0 - u) * means[1])


@dataclass
class HistogramPath:
    capital: np.ndarray  # K_t, t = 0 .. T-1 (the histogram's mean; not clamped to the K grid)
    distribution: np.ndarray  # (2, J) conditional distributions at T - 1


def policy_table(policy: Any, grids: Grids) -> np.ndarray:
    return np.asarray(to_host(policy), dtype=np.float64).reshape(4, grids.k_size, grids.K_size)


def histogram_path(cal: Calibration, grids: Grids, method: Method, policy: Any, inputs: AccuracyInputs,
                   periods: int | None = None, checkpoint: Callable[[int], None] | None = None) -> HistogramPath:
    """Move the histogram of ``inputs`` along its aggregate path for ``periods`` periods (default: all);
    ``checkpoint(t)`` about every second (progress, cancellation)."""
    table = policy_table(policy, grids)
    k_nodes = np.asarray(inputs.k_nodes, dtype=np.float64)
    a_path = inputs.a_path
    periods = a_path.size if periods is None else periods
    conditional = np.array(inputs.distribution, dtype=np.float64)
    planes = np.arange(2).reshape(2, 1)
    points = np.broadcast_to(k_nodes, (2, k_nodes.size))
    capital = np.empty(periods)
    pacer = Pacer()
    for t in range(periods):
        if checkpoint is not None and pacer.due():
            checkpoint(t)
        a = int(a_path[t])
        capital[t] = aggregate_capital(cal, k_nodes, conditional, a)
        if t == periods - 1:
            break
        choice = interpolate(np, table, 2 * a + planes, points, capital[t], grids, method, grids.k)
        choice = np.clip(choice, grids.k_min, grids.k_max)
        conditional = mix_employment(cal, move_mass(k_nodes, conditional, choice), a, int(a_path[t + 1]))
    return HistogramPath(capital, conditional)


# ---------------------------------------------------------------------------------------------------------
# Euler-equation errors


def euler_consumption(cal: Calibration, grids: Grids, method: Method, table: np.ndarray, a: np.ndarray,
                      eps: np.ndarray, k_next: np.ndarray, capital_next: np.ndarray) -> np.ndarray:
    """c from the Euler equation at the choice k' (arrays of one shape), with next-period aggregate capital
    ``capital_next[a']`` (shape (2,) + k'.shape: the same K' for both a' when it is the realised one)."""
    p = cal.transition_matrix.reshape(2, 2, 2, 2)[a, eps]  # [..., a', eps']
    expectation = np.zeros_like(k_next)
    for a_next in range(2):
        r = interest_rate(np, cal, capital_next[a_next], a_next)
        w = wage(np, cal, capital_next[a_next], a_next)
        gross = 1.0 - cal.delta + r
        for e_next in range(2):
            k_next2 = np.clip(interpolate(np, table, np.full(k_next.shape, 2 * a_next + e_next), k_next,
                                          capital_next[a_next], grids, method, grids.k), grids.k_min, grids.k_max)
            c_next = gross * k_next + labour_income_factor(cal, a_next, e_next) * w - k_next2
            c_next = np.where(c_next > 0.0, c_next, CONSUMPTION_FLOOR)
            expectation += p[..., a_next, e_next] * gross * c_next ** (-cal.gamma)
    return (cal.beta * expectation) ** (-1.0 / cal.gamma)


def cash_on_hand(cal: Calibration, k: np.ndarray, capital: np.ndarray, a: np.ndarray, eps: np.ndarray) -> np.ndarray:
    z = cal.productivity[a]
    labour = cal.labour[a]
    r = cal.alpha * z * (capital / labour) ** (cal.alpha - 1.0)
    w = (1.0 - cal.alpha) * z * (capital / labour) ** cal.alpha
    factor = np.where(eps == 1, (1.0 - cal.tax[a]) * cal.l_bar, cal.mu)
    return (1.0 - cal.delta + r) * k + factor * w


@dataclass(frozen=True)
class EulerErrors:
    mean_log10: float  # log10 of the mean |c / c_Euler - 1| over the points where the Euler equation binds
    max_log10: float
    points: int  # points counted (both at the borrowing limit: left out)


def euler_errors(cal: Calibration, grids: Grids, method: Method, table: np.ndarray, a: np.ndarray,
                 eps: np.ndarray, k: np.ndarray, capital: np.ndarray,
                 capital_next: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|c / c_Euler - 1|, counted) at states (a, eps, k, K) with next-period capital ``capital_next[a']``."""
    cash = cash_on_hand(cal, k, capital, a, eps)
    choice = np.clip(interpolate(np, table, 2 * a + eps, k, capital, grids, method, grids.k), grids.k_min, grids.k_max)
    consumption = cash - choice
    c_euler = euler_consumption(cal, grids, method, table, a, eps, choice, capital_next)
    euler_binds = cash - c_euler < grids.k_min  # the Euler equation would need k' below the limit
    c_euler = np.where(euler_binds, cash - grids.k_min, c_euler)
    counted = ~(euler_binds & (choice <= grids.k_min))
    return np.abs(consumption / c_euler - 1.0), counted


def summarise(errors: np.ndarray, counted: np.ndarray) -> EulerErrors:
    kept = errors[counted]
    if kept.size == 0:
        return EulerErrors(float("nan"), float("nan"), 0)
    with np.errstate(divide="ignore"):  # an exact zero is -inf in log10 units
        return EulerErrors(float(np.log10(kept.mean())), float(np.log10(kept.max())), int(kept.size))


def euler_grid_points(grids: Grids, k_points: np.ndarray, per_cell: int = 4) -> tuple[np.ndarray, ...]:
    """(a, eps, k, K) over every state, ``k_points``, and K at the policy's nodes and ``per_cell - 1``
    points inside each K cell (off the nodes)."""
    capital = np.linspace(grids.K_min, grids.K_max, per_cell * (grids.K_size - 1) + 1)
    a, eps, k, big_k = np.meshgrid(np.arange(2), np.arange(2), k_points, capital, indexing="ij")
    return a, eps, k, big_k


def euler_errors_on_grid(cal: Calibration, grids: Grids, method: Method, policy: Any, alm: np.ndarray,
                         k_points: np.ndarray) -> EulerErrors:
    """Euler errors on ``k_points`` x K (nodes and between them), every (a, eps), K' from the ALM."""
    table = policy_table(policy, grids)
    a, eps, k, capital = euler_grid_points(grids, k_points)
    capital_next = next_aggregate_capital(cal, grids, alm, capital)  # [a, ...] for the current a
    capital_next = np.take_along_axis(capital_next, a[None], axis=0)[0]
    both = np.broadcast_to(capital_next, (2, *capital_next.shape))  # the same K' whichever a' comes
    return summarise(*euler_errors(cal, grids, method, table, a, eps, k, capital, both))


@dataclass
class IndividualPath:
    k: np.ndarray  # k_t, t = 0 .. T-1
    errors: EulerErrors


def individual_path(cal: Calibration, grids: Grids, method: Method, policy: Any, capital: np.ndarray,
                    a_path: np.ndarray, employed: np.ndarray, k0: float) -> IndividualPath:
    """One agent through the test (TEST.m sections 5 and 9): k_{t+1} = g(k_t, K_t, a_t, eps_t), and the
    Euler errors at t = 0 .. T-2 with the realised K_{t+1} of the histogram."""
    table = policy_table(policy, grids)
    periods = capital.size
    a = np.asarray(a_path[:periods], dtype=np.int64)
    eps = np.asarray(employed[:periods], dtype=np.int64)
    k = np.empty(periods)
    k[0] = k0
    for t in range(periods - 1):
        nxt = interpolate(np, table, np.array([2 * a[t] + eps[t]]), np.array([k[t]]), capital[t], grids, method,
                          grids.k)
        k[t + 1] = min(max(float(nxt[0]), grids.k_min), grids.k_max)
    now = slice(0, periods - 1)
    realised = np.broadcast_to(capital[1:], (2, periods - 1))
    errors, counted = euler_errors(cal, grids, method, table, a[now], eps[now], k[now], capital[now], realised)
    return IndividualPath(k, summarise(errors, counted))


# ---------------------------------------------------------------------------------------------------------
# The whole JEDC-style test


@dataclass
class HistogramTest:
    name: str  # "jedc" or "dataset"
    max_pct: float
    mean_pct: float
    capital: np.ndarray  # K_t of the histogram
    capital_alm: np.ndarray  # K^ALM_t
    a_path: np.ndarray
    mean_capital: float
    euler_grid: EulerErrors
    euler_path: EulerErrors | None
    individual_k: np.ndarray | None


def histogram_test(cal: Calibration, grids: Grids, method: Method, policy: Any, alm: np.ndarray,
                   inputs: AccuracyInputs, periods: int | None = None,
                   checkpoint: Callable[[int], None] | None = None) -> HistogramTest:
    """Den Haan's statistics on the histogram path of ``inputs``, the mean of K along it, and the Euler
    errors on the grid (k at the histogram's nodes) and along the individual path (when ``inputs`` has one)."""
    periods = inputs.periods if periods is None else periods
    if not 2 <= periods <= inputs.periods:
        raise ValueError(f"the accuracy test's path has {inputs.periods} periods; {periods} were asked for")
    path = histogram_path(cal, grids, method, policy, inputs, periods, checkpoint)
    a_path = inputs.a_path[:periods]
    max_gap, mean_gap, implied = alm_mod.den_haan_errors(path.capital, a_path, alm)
    grid_errors = euler_errors_on_grid(cal, grids, method, policy, alm, inputs.k_nodes)
    individual = None
    if inputs.employed_path is not None:
        individual = individual_path(cal, grids, method, policy, path.capital, a_path, inputs.employed_path,
                                     inputs.individual_k0)
    return HistogramTest(inputs.name, max_gap, mean_gap, path.capital, implied, a_path,
                         float(path.capital.mean()), grid_errors,
                         individual.errors if individual is not None else None,
                         individual.k if individual is not None else None)
