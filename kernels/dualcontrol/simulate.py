"""Monte Carlo cost of each policy from exact states: an off-grid check of the solved values.

Each path draws the unknown response ``beta ~ N(mu0, Sigma0)`` (the prior at the start state) once and a
shock ``eps_t ~ N(0, sigma_eps^2)`` per period, then runs the model with the policy's control at the exact
simulated state and the Bayes update of the beliefs; the cost is the discounted sum over ``horizon`` periods
plus ``delta^horizon`` times the policy's grid value at the last state (the tail; ``horizon`` is chosen
so that its weight is small). Every policy sees the same draws (common random numbers, from the Philox
streams ``DUALCONTROL_SIM_BETA`` and ``DUALCONTROL_SIM_SHOCK``), so differences between policies, the value
of experimentation above all, are far more precise than the costs themselves.

Control variate: the inert policy (u = 0) run on the same shocks has the known mean ``V0(x0)`` (with its
tail ``delta^horizon V0(x_T)`` the identity is exact), so each estimate ``mean(C - b (C_inert - V0(x0)))``
with the regression coefficient ``b`` removes the part of the noise the shocks explain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import rng
from kernels.backend import to_host
from kernels.dualcontrol.model import ModelParams, inert_value
from kernels.progress import Pacer

StateFunction = Callable[[Any, Any, Any], Any]  # (x, mu, Sigma) flat arrays -> one number per state


@dataclass
class Estimate:
    mean: np.ndarray  # one per start state
    standard_error: np.ndarray


@dataclass
class SimulationResult:
    costs: dict[str, Estimate]
    differences: dict[tuple[str, str], Estimate]  # (a, b): cost of a minus cost of b, common random numbers
    n_paths: int
    horizon: int


def horizon_for(delta: float, tail_weight: float = 1e-3) -> int:
    """Periods after which the discount weight ``delta^T`` falls below ``tail_weight``."""
    if delta <= 0.0:
        return 1
    return max(1, math.ceil(math.log(tail_weight) / math.log(delta)))


def _with_control_variate(cost: np.ndarray, inert_cost: np.ndarray, inert_mean: np.ndarray) -> Estimate:
    """Per start state (rows), the control-variate mean and its standard error over paths (columns)."""
    centred = inert_cost - inert_cost.mean(axis=1, keepdims=True)
    deviation = cost - cost.mean(axis=1, keepdims=True)
    variance = (centred * centred).sum(axis=1)
    coefficient = np.where(variance > 0.0, (deviation * centred).sum(axis=1) / np.maximum(variance, 1e-300), 0.0)
    adjusted = cost - coefficient[:, None] * (inert_cost - inert_mean[:, None])
    n = cost.shape[1]
    return Estimate(adjusted.mean(axis=1), adjusted.std(axis=1, ddof=1) / math.sqrt(n))


def simulate_costs(
    model: ModelParams,
    states: np.ndarray,
    controls: Mapping[str, StateFunction],
    tails: Mapping[str, StateFunction],
    n_paths: int,
    horizon: int,
    seed: int,
    xp: Any = np,
    checkpoint: Callable[[float, str], None] | None = None,
) -> SimulationResult:
    """Discounted cost of every policy in ``controls`` from each row ``[x, mu, Sigma]`` of ``states``.

    ``controls[name]`` gives the policy's control and ``tails[name]`` its cost-to-go (for the tail term) at
    flat arrays of states; both run on ``xp``. ``checkpoint(fraction, stage)`` about every second (progress in
    [0, 1] of the simulation, cancellation: a period of many paths may take seconds).
    """
    pacer, steps = Pacer(), horizon * (1 + len(controls))

    def period_done(step: int, name: str, t: int) -> None:
        if checkpoint is not None and pacer.due():
            checkpoint(step / steps, f"simulating {name}: period {t + 1}/{horizon}")

    assert n_paths >= 2, f"need at least two paths for a standard error, not {n_paths}"
    n_states = states.shape[0]
    size = n_states * n_paths
    path_index = xp.arange(size, dtype=xp.int64)
    x0, mu0, s0 = (xp.repeat(xp.asarray(states[:, i], dtype=xp.float64), n_paths) for i in range(3))
    beta = mu0 + xp.sqrt(s0) * rng.normal(xp, seed, rng.STREAMS["DUALCONTROL_SIM_BETA"], path_index)

    def shock(t: int) -> Any:
        """Period t's shocks, drawn again for every policy (counter-based: the same numbers, none stored)."""
        return model.sigma_eps * rng.normal(xp, seed, rng.STREAMS["DUALCONTROL_SIM_SHOCK"], path_index * horizon + t)

    inert_x, inert_cost = x0, xp.zeros(size)
    for t in range(horizon):
        inert_x = model.alpha + model.gamma * inert_x + shock(t)
        inert_cost = inert_cost + model.delta**t * ((inert_x - model.xbar) ** 2 + model.omega * model.ubar**2)
        period_done(t, "the inert control variate", t)
    inert_cost = inert_cost + model.delta**horizon * inert_value(model, inert_x)

    path_costs: dict[str, np.ndarray] = {}
    for index, (name, control) in enumerate(controls.items(), start=1):
        x, mu, s, cost = x0, mu0, s0, xp.zeros(size)
        for t in range(horizon):
            u = control(x, mu, s)
            x_next = model.alpha + beta * u + model.gamma * x + shock(t)
            cost = cost + model.delta**t * ((x_next - model.xbar) ** 2 + model.omega * (u - model.ubar) ** 2)
            s_next = 1.0 / (1.0 / s + u * u / model.sigma_eps2)
            mu = s_next * (mu / s + u * (x_next - model.alpha - model.gamma * x) / model.sigma_eps2)
            x, s = x_next, s_next
            period_done(index * horizon + t, name, t)
        cost = cost + model.delta**horizon * tails[name](x, mu, s)
        path_costs[name] = to_host(cost).reshape(n_states, n_paths)

    inert_paths = to_host(inert_cost).reshape(n_states, n_paths)
    inert_mean = inert_value(model, np.asarray(states[:, 0], dtype=np.float64))
    costs = {name: _with_control_variate(c, inert_paths, inert_mean) for name, c in path_costs.items()}
    differences = {
        (a, b): _with_control_variate(path_costs[a] - path_costs[b], inert_paths, inert_mean)
        for a in path_costs
        for b in path_costs
        if a < b
    }
    return SimulationResult(costs, differences, n_paths, horizon)
