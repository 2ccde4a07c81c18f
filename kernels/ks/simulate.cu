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
// capital to K_{t+1} (clamped mean) with a deterministic two-level sum.
extern "C" __global__ void ks_panel_step(
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
    const ks_real capital = (ks_real)capital_path[t];
    const unsigned long long offset = (unsigned long long)t * (unsigned long long)n;
    double local = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned char e = employed[i];
        ks_real next = ks_interpolate(table, k_nodes, 2 * a_now + e, k[i], capital, g, method);
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
