"""Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) that NumPy and CuPy draw identically.

Every value is a pure function of ``(seed, stream, index)``: the key is the 64-bit seed, the counter is
``(index_lo, index_hi, stream_lo, stream_hi)``. A chunked, re-run or multi-GPU computation therefore draws
exactly the numbers of the single run, and a CUDA kernel can generate its own numbers in registers (see
``kernels/philox.cuh``, the same algorithm as CUDA device functions) without ever storing them.

The functions below are written once against the array namespace ``xp``; integer draws (bits,
Rademacher signs, indices) are bit-identical across backends, floating-point ones agree to the last
ulp or so of the transcendental functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_TWO_POW_M53 = 1.0 / 9007199254740992.0


def _mulhilo(xp: ModuleType, multiplier: int, value: Any) -> tuple[Any, Any]:
    product = value.astype(xp.uint64) * xp.uint64(multiplier)
    return (product >> xp.uint64(32)).astype(xp.uint32), (product & xp.uint64(_MASK32)).astype(xp.uint32)


def philox4x32(xp: ModuleType, seed: int, stream: int, index: Any) -> tuple[Any, Any, Any, Any]:
    """Four independent uint32 words per element of ``index`` (a non-negative integer array)."""
    index = xp.asarray(index).astype(xp.uint64)
    c0 = (index & xp.uint64(_MASK32)).astype(xp.uint32)
    c1 = (index >> xp.uint64(32)).astype(xp.uint32)
    c2 = xp.full(index.shape, stream & _MASK32, dtype=xp.uint32)
    c3 = xp.full(index.shape, (stream >> 32) & _MASK32, dtype=xp.uint32)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for round_number in range(10):
        if round_number:
            k0 = (k0 + PHILOX_W0) & _MASK32
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(xp, PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(xp, PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ xp.uint32(k0), lo1, hi0 ^ c3 ^ xp.uint32(k1), lo0
    return c0, c1, c2, c3


def _unit_interval(xp: ModuleType, high: Any, low: Any) -> Any:
    """A float64 in the open interval (0, 1) from 53 random bits of two words."""
    bits = (high.astype(xp.uint64) >> xp.uint64(5)) * xp.uint64(67108864) + (low.astype(xp.uint64) >> xp.uint64(6))
    return (bits.astype(xp.float64) + 0.5) * _TWO_POW_M53


def uniform(xp: ModuleType, seed: int, stream: int, index: Any) -> Any:
    """Uniform(0, 1) float64, one per element of ``index``."""
    w0, w1, _, _ = philox4x32(xp, seed, stream, index)
    return _unit_interval(xp, w0, w1)


def normal(xp: ModuleType, seed: int, stream: int, index: Any) -> Any:
    """Standard normal float64 by Box-Muller, one per element of ``index``."""
    w0, w1, w2, w3 = philox4x32(xp, seed, stream, index)
    radius = xp.sqrt(-2.0 * xp.log(_unit_interval(xp, w0, w1)))
    return radius * xp.cos(2.0 * xp.pi * _unit_interval(xp, w2, w3))


def rademacher(xp: ModuleType, seed: int, stream: int, index: Any) -> Any:
    """+1.0 or -1.0 with equal probability (bit-identical on every backend)."""
    w0, _, _, _ = philox4x32(xp, seed, stream, index)
    return 1.0 - 2.0 * (w0 & xp.uint32(1)).astype(xp.float64)


def integers(xp: ModuleType, seed: int, stream: int, index: Any, high: int) -> Any:
    """Integers uniform on [0, high) (int64), bias below 2**-53 * high."""
    if high < 1:
        raise ValueError("high must be positive")
    w0, w1, _, _ = philox4x32(xp, seed, stream, index)
    draws = xp.floor(_unit_interval(xp, w0, w1) * high).astype(xp.int64)
    return xp.minimum(draws, high - 1)


# Every family of random draws in the code base, by name: the stream number is part of each draw's address,
# so a number here can never change (stored jobs would no longer reproduce) and a new family takes a new
# name. Numbers may repeat across estimators (each job keys Philox with its own seed) but never inside one.
# CUDA sources that include philox.cuh see each as GPUEST_STREAM_<NAME> (an unsigned long long literal).
STREAMS: Mapping[str, int] = MappingProxyType({
    # CRVE Monte Carlo (kernels/crve/montecarlo.py and its CUDA twin): the CGM (2008) design.
    "CRVE_MC_X_CLUSTER": 1,
    "CRVE_MC_U_CLUSTER": 2,
    "CRVE_MC_X_INDIVIDUAL": 3,
    "CRVE_MC_U_INDIVIDUAL": 4,
    "CRVE_MC_CLUSTER_SIZES": 6,  # unbalanced designs: each cluster's lognormal size factor, drawn once
    # CRVE bootstrap weights (kernels/crve/weights.py and its CUDA twin).
    "CRVE_WEIGHTS": 5,
    # CRVE synthetic data sets (kernels/crve/synthetic.py).
    "CRVE_SYNTHETIC_X": 11,
    "CRVE_SYNTHETIC_X_CLUSTER": 12,
    "CRVE_SYNTHETIC_U": 13,
    "CRVE_SYNTHETIC_U_CLUSTER": 14,
    "CRVE_SYNTHETIC_FE": 15,
    # SCCS synthetic data (kernels/sccs/synthetic.py).
    "SCCS_SYNTHETIC_ERAS": 1,
    "SCCS_SYNTHETIC_LENGTH": 2,
    "SCCS_SYNTHETIC_PAIR_CASE": 3,
    "SCCS_SYNTHETIC_RUN_START": 4,
    "SCCS_SYNTHETIC_RUN_LENGTH": 5,
    "SCCS_SYNTHETIC_EFFECT_ON": 6,
    "SCCS_SYNTHETIC_EFFECT": 7,
    "SCCS_SYNTHETIC_EVENTS": 8,
    "SCCS_SYNTHETIC_EVENT_ERA": 9,
    # SCCS cross-validation folds, bootstrap resamples, and the two hashes of person-data-to-eras.
    "SCCS_CV_FOLDS": 0x5CC5_0001,
    "SCCS_BOOTSTRAP": 0x5CC5_0002,
    "SCCS_ERAS_DRUG_HASH": 0x5CC5_0003,
    "SCCS_ERAS_CASE_HASH": 0x5CC5_0004,
    # Krusell-Smith shocks (kernels/ks/simulate.py and its CUDA twin).
    "KS_AGGREGATE": 1,
    "KS_IDIOSYNCRATIC": 2,
    "KS_INITIAL_EMPLOYMENT": 3,
    "KS_TEST_AGGREGATE": 11,  # the fresh path of the Den Haan accuracy test
    "KS_TEST_IDIOSYNCRATIC": 12,
    # Dual-control Monte Carlo of each policy's cost (kernels/dualcontrol/simulate.py): the unknown response
    # drawn once per path from the prior, and the shock of every period (common to all policies).
    "DUALCONTROL_SIM_BETA": 1,
    "DUALCONTROL_SIM_SHOCK": 2,
})


def _check_streams() -> None:
    by_family: dict[str, dict[int, str]] = {}
    for name, number in STREAMS.items():
        if not 0 <= number < 2**64:
            raise ValueError(f"RNG stream {name} = {number} is not a 64-bit unsigned integer")
        family = by_family.setdefault(name.split("_", 1)[0], {})
        if number in family:
            raise ValueError(f"RNG streams {family[number]} and {name} share the number {number}")
        family[number] = name


_check_streams()


def cuda_defines() -> dict[str, str]:
    """``GPUEST_STREAM_<NAME>`` -> ``<number>ull`` for every registered stream (see :mod:`kernels.cuda`)."""
    return {f"GPUEST_STREAM_{name}": f"{number}ull" for name, number in STREAMS.items()}
