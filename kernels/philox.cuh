// Philox4x32-10 and the transforms of kernels/rng.py, as CUDA device functions: the same numbers.
// Prepended by kernels/cuda.py to every source declared with headers=("philox.cuh",); the loader also
// defines GPUEST_STREAM_<NAME> for every stream of kernels.rng.STREAMS.
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
