"""OLS and CRV1 standard errors from cluster-level sufficient statistics, batched over replications.

Everything here works on stacks of cluster statistics ``XtX_g`` (..., G, k, k) and ``Xty_g`` (..., G, k):
the sums of x x' and x y over each cluster's rows. The full-sample normal equations are their sums over
g, and the cluster score X_g'u_g = X_g'y_g - X_g'X_g beta needs no second pass over the rows. That is the
"collapse to cluster statistics" of Roodman, MacKinnon, Nielsen & Webb (2019).

Written once against the array namespace ``xp`` (NumPy or CuPy).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kernels.backend import is_numpy


def small_sample_factor(n_obs: int, n_clusters: int, n_params: int, ssc: bool) -> float:
    """CRV1's G/(G-1) * (N-1)/(N-k) (Stata, fixest, pyfixest, wildboottest), or 1 with ``ssc=False``."""
    if not ssc:
        return 1.0
    return n_clusters / (n_clusters - 1) * (n_obs - 1) / (n_obs - n_params)


def cluster_sums(xp: ModuleType, values: Any, codes: Any, n_groups: int) -> Any:
    """Sum the rows of ``values`` (N, ...) by integer group code (N,) in [0, n_groups): shape (n_groups, ...).

    A segmented reduction by cluster: one pass over the N rows.
    """
    flat = values.reshape(values.shape[0], -1)
    out = xp.zeros((n_groups, flat.shape[1]), dtype=flat.dtype)
    if is_numpy(xp):
        # np.add.at is slow; a bincount per column is a fast single pass in C.
        for column in range(flat.shape[1]):
            out[:, column] = xp.bincount(codes, weights=flat[:, column], minlength=n_groups)
    else:
        import cupyx

        cupyx.scatter_add(out, codes, flat)
    return out.reshape((n_groups, *values.shape[1:]))


def ols_crv1(xp: ModuleType, xtx_g: Any, xty_g: Any, n_obs: int, ssc: bool) -> tuple[Any, Any, Any]:
    """Batched OLS and CRV1 covariance from cluster statistics.

    ``xtx_g``: (..., G, k, k), ``xty_g``: (..., G, k). Returns ``beta`` (..., k), the covariance (..., k, k)
    and the cluster scores (..., G, k).
    """
    n_clusters, n_params = xtx_g.shape[-3], xtx_g.shape[-1]
    xtx = xtx_g.sum(axis=-3)
    xty = xty_g.sum(axis=-2)
    xtx_inv = xp.linalg.inv(xtx)
    xtx_inv = 0.5 * (xtx_inv + xp.swapaxes(xtx_inv, -1, -2))
    beta = xp.einsum("...ij,...j->...i", xtx_inv, xty)
    scores = xty_g - xp.einsum("...gij,...j->...gi", xtx_g, beta)
    meat = xp.einsum("...gi,...gj->...ij", scores, scores)
    factor = small_sample_factor(n_obs, n_clusters, n_params, ssc)
    covariance = factor * (xtx_inv @ meat @ xtx_inv)
    return beta, covariance, scores
