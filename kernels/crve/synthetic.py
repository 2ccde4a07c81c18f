"""Synthetic clustered regression data for demos, benchmarks and the ``synthetic`` dataset of crve_bootstrap.

Columns: ``y``, ``x1 .. xK``, ``cluster`` (G clusters of near-equal size, rows sorted by cluster) and, with
``n_fe > 0``, ``fe`` (a fixed effect crossing the clusters: row i has level i mod n_fe). DGP, in the CGM
(2008) style: x_j = e_ij + e_gj, y = 1 + 0 x1 + x2 + ... + xK + alpha_fe + u_i + u_g, all N(0, 1), so the
default hypothesis beta_x1 = 0 holds. Drawn from Philox (``kernels.rng``): the same data on every backend.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kernels import rng

_STREAM_X = rng.STREAMS["CRVE_SYNTHETIC_X"]
_STREAM_X_CLUSTER = rng.STREAMS["CRVE_SYNTHETIC_X_CLUSTER"]
_STREAM_U = rng.STREAMS["CRVE_SYNTHETIC_U"]
_STREAM_U_CLUSTER = rng.STREAMS["CRVE_SYNTHETIC_U_CLUSTER"]
_STREAM_FE = rng.STREAMS["CRVE_SYNTHETIC_FE"]


def synthetic_columns(
    xp: ModuleType, n_obs: int, n_clusters: int, n_regressors: int, seed: int, n_fe: int = 0
) -> dict[str, Any]:
    """The columns as arrays of ``xp`` (float64; ``cluster`` and ``fe`` int64)."""
    if n_clusters > n_obs:
        raise ValueError(f"synthetic: n_clusters={n_clusters} exceeds n_obs={n_obs}")
    rows = xp.arange(n_obs, dtype=xp.int64)
    cluster = (rows * n_clusters) // n_obs
    columns: dict[str, Any] = {}
    y = 1.0 + rng.normal(xp, seed, _STREAM_U, rows) + rng.normal(xp, seed, _STREAM_U_CLUSTER, cluster)
    for j in range(n_regressors):
        x = rng.normal(xp, seed, _STREAM_X, rows * n_regressors + j)
        x += rng.normal(xp, seed, _STREAM_X_CLUSTER, cluster * n_regressors + j)
        if j > 0:
            y += x
        columns[f"x{j + 1}"] = x
    if n_fe > 0:
        fe = rows % n_fe
        y += rng.normal(xp, seed, _STREAM_FE, fe)
        columns["fe"] = fe
    columns["y"] = y
    columns["cluster"] = cluster
    return columns
