// X_p'X_p and X_p'y_p per group in one pass over the rows (NumPy twin: pairs.pair_statistics_numpy).
// Defines: K (regressors), THREADS (block size of tile_crossprod); crve/crossprod.cuh (NSTAT and the
// per-row products) is prepended by kernels/cuda.py. Rows are sorted by group and cut into tiles of one group
// each; a block sums its tile's NSTAT products in registers and reduces them across the block; group_tiles
// then adds each group's tiles in order: deterministic, no atomics.

#define WARPS (THREADS / 32)

extern "C" __global__ void __launch_bounds__(THREADS) tile_crossprod(
        const double* __restrict__ x, const double* __restrict__ y,
        const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
        double* __restrict__ tile_out) {
    const long long start = tile_start[blockIdx.x], end = tile_end[blockIdx.x];
    double acc[NSTAT];
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) acc[s] = 0.0;
    for (long long i = start + threadIdx.x; i < end; i += THREADS) {
        double xi[K];
        #pragma unroll
        for (int a = 0; a < K; ++a) xi[a] = x[i * K + a];
        crve_add_row_products(acc, xi, y[i]);
    }
    __shared__ double partial[WARPS][NSTAT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) {
        double v = acc[s];
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) partial[warp][s] = v;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < NSTAT; s += THREADS) {
        double total = 0.0;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) total += partial[w][s];
        tile_out[(long long)blockIdx.x * NSTAT + s] = total;
    }
}

// Each group's tiles are consecutive: add them in order (deterministic).
extern "C" __global__ void group_tiles(
        const double* __restrict__ tile_out, const long long* __restrict__ first_tile,
        const long long* __restrict__ n_tiles, long long n_groups, double* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_groups * NSTAT) return;
    const long long g = idx / NSTAT, s = idx % NSTAT;
    double total = 0.0;
    for (long long t = first_tile[g]; t < first_tile[g] + n_tiles[g]; ++t) total += tile_out[t * NSTAT + s];
    out[idx] = total;
}
