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

// The interpolation is separable: an inner filter along K (the same columns and weights for every point that
// shares K: all agents of a panel period) applied to the rows of a stencil along k, combined with the k
// weights. Codes from kernels/ks/policy.py's method_code: 0 bilinear (linear in physical k, K), 1 Catmull-Rom
// in grid coordinates (indices clamped at the ends), 2 local cubic (four-point Lagrange in physical k and in
// the K coordinate, the stencil i-1 .. i+2 shifted inwards at the edges: min(size, 4) nodes). Each sum starts
// from zero and runs in stencil order, as interp.py's array code.
struct ks_stencil {
    int index[4];
    ks_real weight[4];
    int count;
};

// One axis of the separable stencil, the same rule on k and on K: ``cell`` and ``frac`` place the point in grid
// coordinates; ``linear`` is the bilinear method's weight of the upper node (physical on k, the grid fraction on
// K); the local cubic evaluates its Lagrange filter at ``x`` over ``nodes`` (nullptr: the grid coordinates
// themselves, as on K), the stencil cell-1 .. cell+2 shifted inwards at the edges (min(size, 4) nodes).
__device__ __forceinline__ ks_stencil ks_axis_stencil(int cell, ks_real frac, int size, int method, ks_real linear,
                                                      ks_real x, const ks_real* nodes) {
    ks_stencil st;
    if (method == 0) {
        st.count = 2;
        st.index[0] = cell; st.index[1] = cell + 1; st.index[2] = cell; st.index[3] = cell;
        st.weight[0] = (ks_real)1.0 - linear; st.weight[1] = linear; st.weight[2] = (ks_real)0;
        st.weight[3] = (ks_real)0;
    } else if (method == 1) {
        st.count = 4;
        ks_catrom_weights(frac, st.weight);
        #pragma unroll
        for (int d = 0; d < 4; ++d) st.index[d] = min(max(cell + d - 1, 0), size - 1);
    } else {
        const int length = size < 4 ? size : 4;
        const int first = min(max(cell - 1, 0), size - length);
        ks_real at[4];
        #pragma unroll
        for (int d = 0; d < 4; ++d) {
            st.index[d] = d < length ? first + d : first;
            at[d] = nodes == nullptr ? (ks_real)(first + d) : nodes[st.index[d]];
        }
        ks_lagrange_weights(x, at, length, st.weight);
        st.count = length;
    }
    return st;
}

// The K side: which columns of a row and their weights.
__device__ __forceinline__ ks_stencil ks_K_stencil(const ks_grid_params& g, ks_real K, int method) {
    ks_real f_K;
    const ks_real s_K = ks_K_coordinate(g, K);
    const int j = ks_cell(s_K, g.nK, &f_K);
    return ks_axis_stencil(j, f_K, g.nK, method, f_K, s_K, nullptr);
}

// The k side at one point: which rows and their weights (k_nodes: the k grid, in global or shared memory).
__device__ __forceinline__ ks_stencil ks_k_stencil(const ks_real* k_nodes, ks_real k, const ks_grid_params& g,
                                                   int method) {
    ks_real f_k;
    const int i = ks_cell(ks_k_coordinate(g, k), g.nk, &f_k);
    const ks_real clipped = ks_clip(k, g.k_min, g.k_max);
    const ks_real linear = method == 0 ? (clipped - k_nodes[i]) / (k_nodes[i + 1] - k_nodes[i]) : (ks_real)0;
    return ks_axis_stencil(i, f_k, g.nk, method, linear, clipped, k_nodes);
}

// Sum over a stencil of values[index] * weight, from zero in stencil order.
__device__ __forceinline__ ks_real ks_apply(const ks_real* __restrict__ values, const ks_stencil& st) {
    ks_real sum = (ks_real)0;
    #pragma unroll
    for (int d = 0; d < 4; ++d) {
        if (d < st.count) sum += values[st.index[d]] * st.weight[d];
    }
    return sum;
}

// The policy table[plane] at (k, K): the K filter of each row of the k stencil, combined along k.
__device__ __forceinline__ ks_real ks_interpolate(
        const ks_real* __restrict__ table, const ks_real* __restrict__ k_nodes, int plane,
        ks_real k, ks_real K, const ks_grid_params& g, int method) {
    const ks_stencil along_K = ks_K_stencil(g, K, method);
    const ks_stencil along_k = ks_k_stencil(k_nodes, k, g, method);
    const long long base = (long long)plane * g.nk * g.nK;
    ks_real result = (ks_real)0;
    #pragma unroll
    for (int d = 0; d < 4; ++d) {
        if (d < along_k.count) {
            result += ks_apply(table + base + (long long)along_k.index[d] * g.nK, along_K) * along_k.weight[d];
        }
    }
    return result;
}
