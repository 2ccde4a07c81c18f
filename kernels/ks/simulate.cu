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

// One period for the agents of this launch: interpolate the policy, draw the next employment state, and return
// this thread's sum of the new capital. Every agent of the period shares K, so each block first applies the K
// filter to every row of the period's two planes (employed, unemployed) in shared memory: an agent then reads a
// k stencil of one filtered row (2-4 values) instead of gathering 4-16 entries of the whole table, the same sums
// in the same order as ks_interpolate. Dynamic shared memory: 3 nk ks_reals (the two filtered planes, then the k
// nodes). Agent i of the launch is agent first + i of the panel (its Philox counter: t n_total + first + i).
__device__ __forceinline__ double ks_move_agents(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes,
        ks_real* __restrict__ k, unsigned char* __restrict__ employed, long long n, long long first,
        long long n_total, int t, int a_now, double p_emp_unemployed, double p_emp_employed,
        unsigned long long seed, unsigned long long stream, const ks_grid_params& g, ks_real capital, int method) {
    extern __shared__ __align__(16) unsigned char ks_dynamic_shared[];
    const int nk = g.nk, nK = g.nK;
    ks_real* rows = reinterpret_cast<ks_real*>(ks_dynamic_shared);  // [unemployed plane | employed plane]
    ks_real* nodes = rows + 2 * nk;
    const ks_stencil along_K = ks_K_stencil(g, capital, method);
    for (int r = threadIdx.x; r < 2 * nk; r += THREADS) {
        const int e = r / nk, row = r - e * nk;
        rows[r] = ks_apply(table + ((long long)(2 * a_now + e) * nk + row) * nK, along_K);
    }
    for (int r = threadIdx.x; r < nk; r += THREADS) nodes[r] = k_nodes[r];
    __syncthreads();
    const unsigned long long offset = (unsigned long long)t * (unsigned long long)n_total + (unsigned long long)first;
    double local = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned char e = employed[i];
        const ks_stencil along_k = ks_k_stencil(nodes, k[i], g, method);
        ks_real next = ks_apply(rows + e * nk, along_k);
        next = ks_clip(next, g.k_min, g.k_max);
        k[i] = next;
        const double u = gpuest_uniform(seed, stream, offset + (unsigned long long)i);
        employed[i] = u < (e ? p_emp_employed : p_emp_unemployed) ? 1 : 0;
        local += (double)next;
    }
    return local;
}

// The launch's sum of the new capital in a fixed order: the block's tree sum into partial[blockIdx.x], then the
// last block to finish sums the partials in block order. Returns true in thread 0 of that last block, whose
// *total holds the sum (the ticket is left at 0 for the next period).
__device__ __forceinline__ bool ks_launch_sum(double local, double* __restrict__ partial,
                                              unsigned int* __restrict__ ticket, double* total) {
    __shared__ double sums[THREADS];
    __shared__ bool last_block;
    ks_block_sum(sums, local);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sums[0];
        __threadfence();
        // atomicInc wraps to 0 after gridDim.x - 1: the counter is reset for the next period
        last_block = atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return false;
    double s = 0.0;
    for (int b = threadIdx.x; b < gridDim.x; b += THREADS) s += ((volatile double*)partial)[b];
    ks_block_sum(sums, s);
    *total = sums[0];
    return threadIdx.x == 0;
}

// One period of the whole panel on one device; K_t read from and K_{t+1} (the clamped mean) written to device
// memory, so a captured loop of periods needs no host. At most 64 registers (4 blocks per SM): the unbounded
// compile took 94 and ran 26 % slower on the H100 at N = 10^7 (too few warps to hide latency).
extern "C" __global__ void __launch_bounds__(THREADS, 4) ks_panel_step(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes,
        ks_real* __restrict__ k, unsigned char* __restrict__ employed,
        double* __restrict__ capital_path, double* __restrict__ partial, unsigned int* __restrict__ ticket,
        long long n, int t, int a_now, double p_emp_unemployed, double p_emp_employed,
        unsigned long long seed, unsigned long long stream,
        int nk, int nK, ks_real k_min, ks_real k_max, ks_real inv_power, ks_real K_min, ks_real K_max,
        int method) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    const double local = ks_move_agents(table, k_nodes, k, employed, n, 0, n, t, a_now, p_emp_unemployed,
                                        p_emp_employed, seed, stream, g, (ks_real)capital_path[t], method);
    double total;
    if (ks_launch_sum(local, partial, ticket, &total)) {
        const double mean = total / (double)n;
        capital_path[t + 1] = mean < (double)K_min ? (double)K_min : (mean > (double)K_max ? (double)K_max : mean);
    }
}

// One period of one slice of the panel (agents first .. first + n - 1 of n_total) on one of several devices:
// K_t comes as an argument (the host combines the slices' sums), the slice's sum of the new capital goes to
// slice_sum[t + 1].
extern "C" __global__ void __launch_bounds__(THREADS, 4) ks_panel_slice_step(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes,
        ks_real* __restrict__ k, unsigned char* __restrict__ employed,
        double* __restrict__ slice_sum, double* __restrict__ partial, unsigned int* __restrict__ ticket,
        long long n, long long first, long long n_total, double capital, int t, int a_now,
        double p_emp_unemployed, double p_emp_employed, unsigned long long seed, unsigned long long stream,
        int nk, int nK, ks_real k_min, ks_real k_max, ks_real inv_power, ks_real K_min, ks_real K_max,
        int method) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    const double local = ks_move_agents(table, k_nodes, k, employed, n, first, n_total, t, a_now,
                                        p_emp_unemployed, p_emp_employed, seed, stream, g, (ks_real)capital,
                                        method);
    double total;
    if (ks_launch_sum(local, partial, ticket, &total)) slice_sum[t + 1] = total;
}
