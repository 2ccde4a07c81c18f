"""Wild bootstrap weights drawn from Philox at fixed addresses, and the full Rademacher enumeration.

Draw b's weight for bootstrap cluster h is a pure function of ``(seed, STREAM, base + b H + h)``, so a
chunk of draws equals the same draws of a single pass, and CPU and GPU draw the same weights.

Distributions (mean 0, variance 1), as in Roodman et al. (2019), fwildclusterboot and wildboottest:
- ``rademacher``: +1 or -1, each with probability 1/2;
- ``webb``: +-sqrt(1/2), +-1, +-sqrt(3/2), each with probability 1/6 (Webb 2014);
- ``mammen``: -(sqrt5 - 1)/2 with probability (sqrt5 + 1)/(2 sqrt5), else (sqrt5 + 1)/2 (Mammen 1993);
- ``norm``: standard normal.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

from kernels import rng

STREAM_WEIGHTS = 5
WEIGHT_TYPES = ("rademacher", "webb", "mammen", "norm")
_SQRT5 = math.sqrt(5.0)
MAMMEN_LOW = -(_SQRT5 - 1.0) / 2.0
MAMMEN_HIGH = (_SQRT5 + 1.0) / 2.0
MAMMEN_P_LOW = (_SQRT5 + 1.0) / (2.0 * _SQRT5)
WEBB_VALUES = (-math.sqrt(1.5), -1.0, -math.sqrt(0.5), math.sqrt(0.5), 1.0, math.sqrt(1.5))


def draw_weights(
    xp: ModuleType, weights_type: str, seed: int, n_boot_clusters: int, first_draw: int, n_draws: int, base: int = 0
) -> Any:
    """Weights (H, n_draws) of draws ``first_draw .. first_draw + n_draws - 1`` (on CuPy: one fused kernel)."""
    if xp.__name__ != "numpy":
        from kernels.crve.gpu import weights_gpu

        return weights_gpu(xp, weights_type, seed, n_boot_clusters, first_draw, n_draws, base)
    h = xp.arange(n_boot_clusters, dtype=xp.int64)[:, None]
    b = xp.arange(first_draw, first_draw + n_draws, dtype=xp.int64)[None, :]
    return weights_at(xp, weights_type, seed, base + b * n_boot_clusters + h)


def weights_at(xp: ModuleType, weights_type: str, seed: int, index: Any) -> Any:
    """The weights at Philox addresses ``index`` (any shape)."""
    if weights_type == "rademacher":
        return rng.rademacher(xp, seed, STREAM_WEIGHTS, index)
    if weights_type == "norm":
        return rng.normal(xp, seed, STREAM_WEIGHTS, index)
    if weights_type == "webb":
        table = xp.asarray(WEBB_VALUES, dtype=xp.float64)
        return table[rng.integers(xp, seed, STREAM_WEIGHTS, index, 6)]
    if weights_type == "mammen":
        low = rng.uniform(xp, seed, STREAM_WEIGHTS, index) < MAMMEN_P_LOW
        return xp.where(low, MAMMEN_LOW, MAMMEN_HIGH)
    raise ValueError(f"weights_type must be one of {WEIGHT_TYPES}, not {weights_type!r}")


def enumerated_weights(xp: ModuleType, n_boot_clusters: int, first_draw: int, n_draws: int) -> Any:
    """Rademacher sign vectors number ``first_draw ..`` of all 2^H: bit h of the draw number is cluster h's sign."""
    h = xp.arange(n_boot_clusters, dtype=xp.int64)[:, None]
    b = xp.arange(first_draw, first_draw + n_draws, dtype=xp.int64)[None, :]
    return 1.0 - 2.0 * ((b >> h) & 1).astype(xp.float64)


def use_enumeration(weights_type: str, n_boot_clusters: int, reps: int) -> bool:
    """Enumerate all 2^H Rademacher sign vectors when there are fewer than B of them (the peers' rule)."""
    return weights_type == "rademacher" and n_boot_clusters < 63 and 2**n_boot_clusters < reps
