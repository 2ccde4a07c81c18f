"""Wild bootstrap weights drawn from Philox at fixed addresses, and the full Rademacher enumeration.

Draw b's weight for bootstrap cluster h is a pure function of ``(seed, STREAM_WEIGHTS, base + b H + h)``, so
a chunk of draws equals the same draws of a single pass, and CPU and GPU draw the same weights: on CuPy one
kernel (``weights.cu``) computes them at the same addresses (twin: :func:`weights_at`). A Monte Carlo
replication r of B draws is its own block (``kernels.crve.montecarlo.replication_weights``).

Distributions (mean 0, variance 1), as in Roodman et al. (2019), fwildclusterboot and wildboottest:
- ``rademacher``: +1 or -1, each with probability 1/2;
- ``webb``: +-sqrt(1/2), +-1, +-sqrt(3/2), each with probability 1/6 (Webb 2014);
- ``mammen``: -(sqrt5 - 1)/2 with probability (sqrt5 + 1)/(2 sqrt5), else (sqrt5 + 1)/2 (Mammen 1993);
- ``norm``: standard normal.

This module depends on no other CRVE module (see docs/crve.md).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from kernels import cuda, rng
from kernels.backend import is_numpy

STREAM_WEIGHTS = rng.STREAMS["CRVE_WEIGHTS"]
WEIGHT_TYPES = ("rademacher", "webb", "mammen", "norm")
_SQRT5 = math.sqrt(5.0)
MAMMEN_LOW = -(_SQRT5 - 1.0) / 2.0
MAMMEN_HIGH = (_SQRT5 + 1.0) / 2.0
MAMMEN_P_LOW = (_SQRT5 + 1.0) / (2.0 * _SQRT5)
WEBB_VALUES = (-math.sqrt(1.5), -1.0, -math.sqrt(0.5), math.sqrt(0.5), 1.0, math.sqrt(1.5))

# The kernel's code per weights type (``kind`` in weights.cu) and its one variant: Mammen's two values and
# their probability are passed from here, so the kernel draws exactly the numbers of weights_at.
_KERNEL_CODES = {"rademacher": 0, "webb": 1, "mammen": 2, "norm": 3}
_KERNEL_DEFINES: dict[str, cuda.DefineValue] = {
    "MAMMEN_LOW": MAMMEN_LOW,
    "MAMMEN_HIGH": MAMMEN_HIGH,
    "MAMMEN_P_LOW": MAMMEN_P_LOW,
}
_KERNEL_THREADS = 256
_SOURCE = cuda.kernel_source(__file__, "weights.cu", headers=[cuda.PHILOX_HEADER], warm_up=[_KERNEL_DEFINES])


def draw_weights(
    xp: ModuleType, weights_type: str, seed: int, n_boot_clusters: int, first_draw: int, n_draws: int, base: int = 0
) -> Any:
    """Weights (H, n_draws) of draws ``first_draw .. first_draw + n_draws - 1`` (on CuPy: one kernel)."""
    if not is_numpy(xp):
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


def weights_gpu(
    cupy: ModuleType,
    weights_type: str,
    seed: int,
    n_boot_clusters: int,
    first_draw: int,
    n_draws: int,
    base: int = 0,
    first_replication: int = 0,
    n_replications: int | None = None,
    draws_per_replication: int = 0,
) -> Any:
    """Weights (H, n_draws), or (R, H, n_draws) for ``n_replications`` Monte Carlo replications whose draw b
    sits at address ((r0 + r) B + first + b) H + h + base, B = ``draws_per_replication`` (twin: weights_at)."""
    if weights_type not in _KERNEL_CODES:
        raise ValueError(f"weights_type must be one of {WEIGHT_TYPES}, not {weights_type!r}")
    reps = 1 if n_replications is None else n_replications
    out = cupy.empty((reps, n_boot_clusters, n_draws), dtype=cupy.float64)
    total = out.size
    if total:
        blocks = (total + _KERNEL_THREADS - 1) // _KERNEL_THREADS
        cuda.function(_SOURCE, "crve_weights", _KERNEL_DEFINES)(
            (blocks,), (_KERNEL_THREADS,),
            (np.int64(n_boot_clusters), np.int64(n_draws), np.int64(first_draw), np.int64(base),
             np.int64(first_replication), np.int64(draws_per_replication),
             np.uint64(seed), np.int32(_KERNEL_CODES[weights_type]), np.int64(total), out),
        )  # fmt: skip
    return out[0] if n_replications is None else out


def enumerated_weights(xp: ModuleType, n_boot_clusters: int, first_draw: int, n_draws: int) -> Any:
    """Rademacher sign vectors number ``first_draw ..`` of all 2^H: bit h of the draw number is cluster h's sign."""
    h = xp.arange(n_boot_clusters, dtype=xp.int64)[:, None]
    b = xp.arange(first_draw, first_draw + n_draws, dtype=xp.int64)[None, :]
    return 1.0 - 2.0 * ((b >> h) & 1).astype(xp.float64)


def use_enumeration(weights_type: str, n_boot_clusters: int, reps: int) -> bool:
    """Enumerate all 2^H Rademacher sign vectors when there are fewer than B of them (the peers' rule)."""
    return weights_type == "rademacher" and n_boot_clusters < 63 and 2**n_boot_clusters < reps
