// One period of the panel simulation of kernels/ks/simulate.py (``simulate_panel``'s twin). Compiled with
// -DREAL=double or -DREAL=float (the panel's precision, ks_real of interp.cuh) and -DTHREADS (the block size,
// a power of two: the tree reductions halve it); philox.cuh and interp.cuh are prepended by kernels/cuda.py.
// The Philox stream is an argument, not a GPUEST_STREAM_KS_* define: the same kernel draws the solve's
// idiosyncratic shocks (KS_IDIOSYNCRATIC) and the Den Haan test's (KS_TEST_IDIOSYNCRATIC).
#ifndef THREADS
#error "simulate.cu needs THREADS (the block size)"
#endif

// The block's tree sum of one value per thread, left in sums[0] (the same order on every run).
__device__ __forceinline__ void ks_block_sum(double* sums, double value) {
    sums[threadIdx.x] = value;
    __syncthreads();
    for (int width = THREADS / 2; width > 0; width >>= 1) {
        if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
        __syncthreads();
    }
}

// One period for every agent: interpolate the policy, draw the next employment state, and reduce the new
// capital to K_{t+1} (clamped mean) with a deterministic two-level sum. Every agent of the period shares K,
// so each block first applies the K filter to every row of the period's two planes (employed, unemployed) in
// shared memory: an agent then reads a k stencil of one filtered row (2-4 values) instead of gathering 4-16
// entries of the whole table, the same sums in the same order as ks_interpolate. Dynamic shared memory:
// 3 nk ks_reals (the two filtered planes, then the k nodes). At most 64 registers (4 blocks per SM): the
// unbounded compile took 94 and ran 26 % slower on the H100 at N = 10^7 (too few warps to hide latency).
extern "C" __global__ void __launch_bounds__(THREADS, 4) ks_panel_step(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes,
        ks_real* __restrict__ k, unsigned char* __restrict__ employed,
        double* __restrict__ capital_path, double* __restrict__ partial, unsigned int* __restrict__ ticket,
        long long n, int t, int a_now, double p_emp_unemployed, double p_emp_employed,
        unsigned long long seed, unsigned long long stream,
        int nk, int nK, ks_real k_min, ks_real k_max, ks_real inv_power, ks_real K_min, ks_real K_max,
        int method) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    __shared__ double sums[THREADS];
    __shared__ bool last_block;
    extern __shared__ __align__(16) unsigned char ks_dynamic_shared[];
    ks_real* rows = reinterpret_cast<ks_real*>(ks_dynamic_shared);  // [unemployed plane | employed plane]
    ks_real* nodes = rows + 2 * nk;
    const ks_real capital = (ks_real)capital_path[t];
    const ks_stencil along_K = ks_K_stencil(g, capital, method);
    for (int r = threadIdx.x; r < 2 * nk; r += THREADS) {
        const int e = r / nk, row = r - e * nk;
        rows[r] = ks_apply(table + ((long long)(2 * a_now + e) * nk + row) * nK, along_K);
    }
    for (int r = threadIdx.x; r < nk; r += THREADS) nodes[r] = k_nodes[r];
    __syncthreads();
    const unsigned long long offset = (unsigned long long)t * (unsigned long long)n;
    double local = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned char e = employed[i];
        const ks_stencil along_k = ks_k_stencil(nodes, k[i], g, method);
        ks_real next = ks_apply(rows + e * nk, along_k);
        next = ks_clip(next, k_min, k_max);
        k[i] = next;
        const double u = gpuest_uniform(seed, stream, offset + (unsigned long long)i);
        employed[i] = u < (e ? p_emp_employed : p_emp_unemployed) ? 1 : 0;
        local += (double)next;
    }
    ks_block_sum(sums, local);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sums[0];
        __threadfence();
        // atomicInc wraps to 0 after gridDim.x - 1: the counter is reset for the next period
        last_block = atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;
    double s = 0.0;
    for (int b = threadIdx.x; b < gridDim.x; b += THREADS) s += ((volatile double*)partial)[b];
    ks_block_sum(sums, s);
    if (threadIdx.x == 0) {
        double mean = sums[0] / (double)n;
        capital_path[t + 1] = mean < (double)K_min ? (double)K_min : (mean > (double)K_max ? (double)K_max : mean);
    }
}
