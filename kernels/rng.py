"""Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) that NumPy and CuPy draw identically.

Every value is a pure function of ``(seed, stream, index)``: the key is the 64-bit seed, the counter is
``(index_lo, index_hi, stream_lo, stream_hi)``. A chunked, re-run or multi-GPU computation therefore draws
exactly the numbers of the single run, and a CUDA kernel can generate its own numbers in registers (see
:data:`PHILOX_CUDA_SOURCE`, the same algorithm as device functions) without ever storing them.

The functions below are written once against the array namespace ``xp``; integer draws (bits,
Rademacher signs, indices) are bit-identical across backends, floating-point ones agree to the last
ulp or so of the transcendental functions.
"""

from __future__ import annotations

from types import ModuleType
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


PHILOX_CUDA_SOURCE = r"""
// Philox4x32-10 and the transforms of kernels/rng.py, as CUDA device functions: same numbers.
struct gpuest_u32x4 { unsigned int x, y, z, w; };

__device__ __forceinline__ gpuest_u32x4 gpuest_philox4x32(
        unsigned long long seed, unsigned long long stream, unsigned long long index) {
    unsigned int c0 = (unsigned int)(index & 0xFFFFFFFFull), c1 = (unsigned int)(index >> 32);
    unsigned int c2 = (unsigned int)(stream & 0xFFFFFFFFull), c3 = (unsigned int)(stream >> 32);
    unsigned int k0 = (unsigned int)(seed & 0xFFFFFFFFull), k1 = (unsigned int)(seed >> 32);
    #pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    gpuest_u32x4 out = {c0, c1, c2, c3};
    return out;
}

__device__ __forceinline__ double gpuest_unit_interval(unsigned int high, unsigned int low) {
    unsigned long long bits = ((unsigned long long)(high >> 5)) * 67108864ull + (unsigned long long)(low >> 6);
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

__device__ __forceinline__ double gpuest_uniform(
        unsigned long long seed, unsigned long long stream, unsigned long long index) {
    gpuest_u32x4 w = gpuest_philox4x32(seed, stream, index);
    return gpuest_unit_interval(w.x, w.y);
}

__device__ __forceinline__ double gpuest_normal(
        unsigned long long seed, unsigned long long stream, unsigned long long index) {
    gpuest_u32x4 w = gpuest_philox4x32(seed, stream, index);
    double radius = sqrt(-2.0 * log(gpuest_unit_interval(w.x, w.y)));
    return radius * cos(2.0 * 3.141592653589793 * gpuest_unit_interval(w.z, w.w));
}

__device__ __forceinline__ double gpuest_rademacher(
        unsigned long long seed, unsigned long long stream, unsigned long long index) {
    gpuest_u32x4 w = gpuest_philox4x32(seed, stream, index);
    return 1.0 - 2.0 * (double)(w.x & 1u);
}
"""
