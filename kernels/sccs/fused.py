"""Element-wise expressions of :mod:`kernels.sccs.model` in one pass over the eras on the GPU.

One CuPy ufunc per operation reads and writes a (K,) temporary each time (75.6M eras, 0.6 GB, at the paper's
largest size), and each fit's final evaluation and each CV score ran several of them. These kernels
(``cupy.ElementwiseKernel``) do the same operations, in the same order, as the NumPy expressions they replace
(named in each docstring); no product there feeds an addition, so the compiler has no multiply-add to fuse and
every element gets the same bits as from the separate ufuncs. ``tests/kernels/sccs/test_sccs_fixed_sums.py``
compares them with those expressions byte for byte.

CuPy is imported only when a kernel is first used: this module imports on a machine without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _shifted_exp() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "float64 eta_l, raw float64 shift, int64 owner", "float64 out", "out = exp(eta_l - shift[owner])",
        "gpuest_sccs_shifted_exp",
    )


@functools.cache
def _residual() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "float64 y, float64 scaled, raw float64 weights, raw float64 events, raw float64 sums, int64 owner",
        "float64 out",
        "out = weights[owner] * (y - events[owner] * scaled / sums[owner])",
        "gpuest_sccs_residual",
    )


def shifted_exp(eta_l: Any, shift: Any, era_case: Any) -> Any:
    """``exp(eta_l - shift[era_case])`` per era."""
    return _shifted_exp()(eta_l, shift, era_case)


def residual(era_events: Any, scaled: Any, weights: Any, case_events: Any, sums: Any, era_case: Any) -> Any:
    """``weights[era_case] * (era_events - case_events[era_case] * scaled / sums[era_case])`` per era."""
    return _residual()(era_events, scaled, weights, case_events, sums, era_case)
