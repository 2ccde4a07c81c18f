// CUDA twin of kernels/ks/interp.py's ``interpolate`` for one point, same operation order as the array code.
// Prepended by kernels/cuda.py to policy.cu and simulate.cu (declared with headers=["ks/interp.cuh"]); every
// such source is compiled with -DREAL=double or -DREAL=float (cuda.real_define), the type of the policy table,
// of k and of K. The typedef sits here, not in the .cu files, because the loader puts headers first.
#ifndef REAL
#error "kernels/ks/interp.cuh needs REAL (double or float): compile with cuda.real_define(dtype)"
#endif
typedef REAL ks_real;

__device__ __forceinline__ void ks_catrom_weights(ks_real a, ks_real* w) {
    w[0] = a * ((ks_real)-0.5 + a * ((ks_real)1.0 - (ks_real)0.5 * a));
    w[1] = (ks_real)1.0 + a * a * ((ks_real)-2.5 + (ks_real)1.5 * a);
    w[2] = a * ((ks_real)0.5 + a * ((ks_real)2.0 - (ks_real)1.5 * a));
    w[3] = a * a * ((ks_real)-0.5 + (ks_real)0.5 * a);
}

__device__ __forceinline__ ks_real ks_clip(ks_real x, ks_real lo, ks_real hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

__device__ __forceinline__ int ks_cell(ks_real s, int size, ks_real* frac) {
    ks_real c = floor(s);
    c = c < (ks_real)0 ? (ks_real)0 : (c > (ks_real)(size - 2) ? (ks_real)(size - 2) : c);
    *frac = s - c;
    return (int)c;
}

struct ks_grid_params {
    int nk, nK;
    ks_real k_min, k_max, inv_power, K_min, K_max;
};

__device__ __forceinline__ ks_real ks_k_coordinate(const ks_grid_params& g, ks_real k) {
    ks_real unit = ks_clip((k - g.k_min) / (g.k_max - g.k_min), (ks_real)0, (ks_real)1);
    return pow(unit, g.inv_power) * (ks_real)(g.nk - 1);
}

__device__ __forceinline__ ks_real ks_K_coordinate(const ks_grid_params& g, ks_real K) {
    ks_real unit = ks_clip((K - g.K_min) / (g.K_max - g.K_min), (ks_real)0, (ks_real)1);
    return unit * (ks_real)(g.nK - 1);
}

// Lagrange weights at x of the polynomial through nodes[0 .. n-1] (2 <= n <= 4); numerator and denominator
// each multiplied in node order, as interp.py's lagrange_weights. The loops run to 4 with guards, so that
// they unroll and the small arrays stay in registers.
__device__ __forceinline__ void ks_lagrange_weights(ks_real x, const ks_real* nodes, int n, ks_real* w) {
    #pragma unroll
    for (int m = 0; m < 4; ++m) {
        ks_real numerator = (ks_real)1.0, denominator = (ks_real)1.0;
        bool first = true;
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (q == m || q >= n) continue;
            if (first) {
                numerator = x - nodes[q];
                denominator = nodes[m] - nodes[q];
                first = false;
            } else {
                numerator = numerator * (x - nodes[q]);
                denominator = denominator * (nodes[m] - nodes[q]);
            }
        }
        w[m] = m < n ? numerator / denominator : (ks_real)0;
    }
}

// method 2 ("cubic"): four-point Lagrange along physical k and along the K coordinate, the stencil
// i-1 .. i+2 shifted inwards at the edges (min(size, 4) nodes), inner filter along K, outer along k.
__device__ __forceinline__ ks_real ks_local_cubic(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes, long long base,
        ks_real k, ks_real s_K, int i, int j, int nk, int nK) {
    const int length_k = nk < 4 ? nk : 4, length_K = nK < 4 ? nK : 4;
    const int first_k = min(max(i - 1, 0), nk - length_k);
    const int first_K = min(max(j - 1, 0), nK - length_K);
    ks_real nodes_k[4], nodes_K[4], w_k[4], w_K[4];
    #pragma unroll
    for (int m = 0; m < 4; ++m) {
        nodes_k[m] = m < length_k ? k_nodes[first_k + m] : (ks_real)0;
        nodes_K[m] = (ks_real)(first_K + m);
    }
    ks_lagrange_weights(k, nodes_k, length_k, w_k);
    ks_lagrange_weights(s_K, nodes_K, length_K, w_K);
    ks_real result = (ks_real)0;
    #pragma unroll
    for (int di = 0; di < 4; ++di) {
        if (di >= length_k) continue;
        const long long row_base = base + (long long)(first_k + di) * nK + first_K;
        ks_real filtered = (ks_real)0;
        #pragma unroll
        for (int dj = 0; dj < 4; ++dj) {
            if (dj < length_K) filtered += table[row_base + dj] * w_K[dj];
        }
        result += filtered * w_k[di];
    }
    return result;
}

// method 0: bilinear (linear in physical k, K); method 1: Catmull-Rom in grid coordinates; method 2: local
// cubic (four-point Lagrange) in physical k and K. Codes from kernels/ks/policy.py's method_code.
__device__ __forceinline__ ks_real ks_interpolate(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes, int plane,
        ks_real k, ks_real K, const ks_grid_params& g, int method) {
    const int nk = g.nk, nK = g.nK;
    const long long base = (long long)plane * nk * nK;
    ks_real f_k, f_K;
    const ks_real s_K = ks_K_coordinate(g, K);
    int i = ks_cell(ks_k_coordinate(g, k), nk, &f_k);
    int j = ks_cell(s_K, nK, &f_K);
    if (method == 2) {
        return ks_local_cubic(table, k_nodes, base, ks_clip(k, g.k_min, g.k_max), s_K, i, j, nk, nK);
    }
    if (method == 0) {
        ks_real k_low = k_nodes[i], k_high = k_nodes[i + 1];
        ks_real w_k = (ks_clip(k, g.k_min, g.k_max) - k_low) / (k_high - k_low);
        long long row = base + (long long)i * nK + j;
        ks_real low = ((ks_real)1.0 - f_K) * table[row] + f_K * table[row + 1];
        ks_real high = ((ks_real)1.0 - f_K) * table[row + nK] + f_K * table[row + nK + 1];
        return ((ks_real)1.0 - w_k) * low + w_k * high;
    }
    ks_real w_k[4], w_K[4];
    ks_catrom_weights(f_k, w_k);
    ks_catrom_weights(f_K, w_K);
    ks_real result = (ks_real)0;
    #pragma unroll
    for (int di = 0; di < 4; ++di) {
        int ii = min(max(i + di - 1, 0), nk - 1);
        long long row_base = base + (long long)ii * nK;
        ks_real filtered = (ks_real)0;
        #pragma unroll
        for (int dj = 0; dj < 4; ++dj) {
            int jj = min(max(j + dj - 1, 0), nK - 1);
            filtered += table[row_base + jj] * w_K[dj];
        }
        result += filtered * w_k[di];
    }
    return result;
}
