// Wild bootstrap weights at their Philox addresses, one thread per weight (NumPy twin: weights.weights_at).
// Defines: MAMMEN_LOW, MAMMEN_HIGH, MAMMEN_P_LOW (from kernels/crve/weights.py, one source of the numbers);
// GPUEST_STREAM_CRVE_WEIGHTS and the Philox functions come from kernels/philox.cuh via the loader.
// Output (n_rep, n_h, n_b) row-major: weight (rep, h, b) sits at the address
// base + ((rep0 + rep) draws_per_rep + first + b) n_h + h  (draws_per_rep = 0 outside a Monte Carlo).
// kind: 0 rademacher, 1 webb, 2 mammen, 3 norm.

extern "C" __global__ void crve_weights(
        long long n_h, long long n_b, long long first, long long base, long long rep0, long long draws_per_rep,
        unsigned long long seed, int kind, long long total, double* __restrict__ out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long per_rep = n_h * n_b;
    const long long rep = i / per_rep, rest = i % per_rep;
    const long long h = rest / n_b, b = rest % n_b;
    const unsigned long long index =
        (unsigned long long)(base + ((rep0 + rep) * draws_per_rep + first + b) * n_h + h);
    double v;
    if (kind == 0) {
        v = gpuest_rademacher(seed, GPUEST_STREAM_CRVE_WEIGHTS, index);
    } else if (kind == 3) {
        v = gpuest_normal(seed, GPUEST_STREAM_CRVE_WEIGHTS, index);
    } else {
        gpuest_u32x4 w = gpuest_philox4x32(seed, GPUEST_STREAM_CRVE_WEIGHTS, index);
        const double u = gpuest_unit_interval(w.x, w.y);
        if (kind == 1) {
            long long pick = (long long)floor(u * 6.0);
            if (pick > 5) pick = 5;
            const double table[6] = {-1.2247448713915889, -1.0, -0.7071067811865476,
                                     0.7071067811865476, 1.0, 1.2247448713915889};
            v = table[pick];
        } else {
            v = (u < MAMMEN_P_LOW) ? MAMMEN_LOW : MAMMEN_HIGH;
        }
    }
    out[i] = v;
}
