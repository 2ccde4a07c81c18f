// ks_interpolate (kernels/ks/interp.cuh, prepended by kernels/cuda.py) at scattered points, one thread per
// point, for tests/kernels/ks/test_ks_interp_cubic.py: the CUDA twin of kernels/ks/interp.py's interpolate.
extern "C" __global__ void ks_interp_points(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes, const int* __restrict__ plane,
        const ks_real* __restrict__ k, const ks_real* __restrict__ K, ks_real* __restrict__ out, int n,
        int nk, int nK, ks_real k_min, ks_real k_max, ks_real inv_power, ks_real K_min, ks_real K_max,
        int method) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n) out[p] = ks_interpolate(table, k_nodes, plane[p], k[p], K[p], g, method);
}
