// The CGM (2008) Monte Carlo data generated in registers and reduced at once to cluster statistics
// X_g'X_g (K x K) and X_g'y_g (K) (NumPy twin: montecarlo.cluster_statistics_numpy). Define: K (regressors,
// the intercept included); NSTAT and the per-row products come from crve/crossprod.cuh. One warp per (replication, cluster); the R x N data never touch memory. Cluster sizes
// may differ (unbalanced designs): offsets (G + 1) give each cluster's first observation.
// Philox addresses as in kernels/crve/montecarlo.py and docs/crve.md (streams GPUEST_STREAM_CRVE_MC_*).

#define KM1 (K - 1)

extern "C" __global__ void cgm_cluster_stats(
        unsigned long long seed, long long first_rep, long long n_rep, long long n_clusters, long long n_obs,
        const long long* __restrict__ offsets, double* __restrict__ xtx_out, double* __restrict__ xty_out) {
    const long long warp_id = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp_id >= n_rep * n_clusters) return;  // whole warps leave together
    const long long r = first_rep + warp_id / n_clusters, g = warp_id % n_clusters;
    const long long cluster_address = r * n_clusters + g;
    double mine = 0.0;
    if (lane < KM1) {
        mine = gpuest_normal(seed, GPUEST_STREAM_CRVE_MC_X_CLUSTER, (unsigned long long)(cluster_address * KM1 + lane));
    } else if (lane == KM1) {
        mine = gpuest_normal(seed, GPUEST_STREAM_CRVE_MC_U_CLUSTER, (unsigned long long)cluster_address);
    }
    double e_g[KM1];
    #pragma unroll
    for (int j = 0; j < KM1; ++j) e_g[j] = __shfl_sync(0xffffffffu, mine, j);
    const double u_g = __shfl_sync(0xffffffffu, mine, KM1);

    double acc[NSTAT];
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) acc[s] = 0.0;
    // Cluster g holds observations offsets[g] .. offsets[g + 1] - 1 of each replication (m each when balanced).
    const long long first_obs = offsets[g], size = offsets[g + 1] - first_obs;
    for (long long i = lane; i < size; i += 32) {
        const long long obs = r * n_obs + first_obs + i;
        double x[K];
        x[0] = 1.0;
        double slope_sum = 0.0;
        #pragma unroll
        for (int j = 0; j < KM1; ++j) {
            x[j + 1] = gpuest_normal(seed, GPUEST_STREAM_CRVE_MC_X_INDIVIDUAL, (unsigned long long)(obs * KM1 + j))
                       + e_g[j];
            slope_sum += x[j + 1];
        }
        const double y =
            (1.0 + slope_sum) + gpuest_normal(seed, GPUEST_STREAM_CRVE_MC_U_INDIVIDUAL, (unsigned long long)obs) + u_g;
        crve_add_row_products(acc, x, y);
    }
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) {
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc[s] += __shfl_down_sync(0xffffffffu, acc[s], offset);
    }
    if (lane == 0) {
        double* xtx = xtx_out + warp_id * K * K;
        double* xty = xty_out + warp_id * K;
        int s = 0;
        #pragma unroll
        for (int a = 0; a < K; ++a) {
            #pragma unroll
            for (int b = a; b < K; ++b) { xtx[a * K + b] = acc[s]; xtx[b * K + a] = acc[s]; ++s; }
        }
        #pragma unroll
        for (int a = 0; a < K; ++a) xty[a] = acc[s++];
    }
}
