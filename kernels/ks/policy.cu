// The policy step of kernels/ks/policy.py: the time-iteration step (``euler_update``'s twin) and the two
// halves of the endogenous-grid-method step (``endogenous_capital`` and ``policy_on_grid``). Always double
// precision (the policy step is float64 whatever the panel's precision): compiled with -DREAL=double, the
// ks_real of interp.cuh (prepended by kernels/cuda.py).
static_assert(sizeof(ks_real) == sizeof(double), "policy.cu is compiled with REAL=double only");

// Consumption implied by the Euler equation at the choice kp of grid point (a, eps, K_j): ``euler_consumption``
// of policy.py for one point, the same operations in the same order.
__device__ __forceinline__ double ks_euler_consumption(
        const double* __restrict__ policy, const double* __restrict__ k_nodes, double kp, double Kn,
        const double* __restrict__ r_next, const double* __restrict__ w_next, const double* __restrict__ prob,
        const double* __restrict__ income_factor, const ks_grid_params& g, int ae, int a, int j, int method,
        double one_minus_delta, double beta, double gamma, double floor_c) {
    const int nK = g.nK;
    double expectation = 0.0;
    for (int a_next = 0; a_next < 2; ++a_next) {
        double r = r_next[(a * 2 + a_next) * nK + j];
        double w = w_next[(a * 2 + a_next) * nK + j];
        for (int e_next = 0; e_next < 2; ++e_next) {
            double k2 = ks_interpolate(policy, k_nodes, 2 * a_next + e_next, kp, Kn, g, method);
            double income = (r + one_minus_delta) * kp + income_factor[2 * a_next + e_next] * w;
            double c = income - k2;
            c = c > 0.0 ? c : floor_c;
            expectation += prob[ae * 4 + 2 * a_next + e_next] * ((one_minus_delta + r) * pow(c, -gamma));
        }
    }
    return pow(beta * expectation, -1.0 / gamma);
}

// One damped Euler step at every grid point; thread index = ((a * 2 + eps) * nk + i) * nK + j.
extern "C" __global__ void ks_euler_step(
        const double* __restrict__ policy, double* __restrict__ policy_out, double* __restrict__ change,
        const double* __restrict__ k_nodes, const double* __restrict__ wealth_now,
        const double* __restrict__ capital_next,   // [a][j]
        const double* __restrict__ r_next,         // [a][a'][j]
        const double* __restrict__ w_next,         // [a][a'][j]
        const double* __restrict__ prob,           // 4 x 4 joint transition, row (a, eps)
        const double* __restrict__ income_factor,  // [a'][eps']
        int nk, int nK, double k_min, double k_max, double inv_power, double K_min, double K_max,
        int method, double one_minus_delta, double beta, double gamma, double damping, double floor_c) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    const int total = 4 * nk * nK;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int j = idx % nK;
    int ae = idx / (nk * nK);
    int a = ae / 2;
    double kp = policy[idx];
    double consumption = ks_euler_consumption(policy, k_nodes, kp, capital_next[a * nK + j], r_next, w_next, prob,
                                              income_factor, g, ae, a, j, method, one_minus_delta, beta, gamma,
                                              floor_c);
    double k_new = ks_clip(wealth_now[idx] - consumption, g.k_min, g.k_max);
    change[idx] = fabs(k_new - kp);
    policy_out[idx] = damping * k_new + (1.0 - damping) * kp;
}

// EGM, first half: the current k at which the choice k' = k_i is optimal, at every (a, eps, i, j) (same index).
extern "C" __global__ void ks_egm_endogenous(
        const double* __restrict__ policy, double* __restrict__ k_end,
        const double* __restrict__ k_nodes,
        const double* __restrict__ gross_now,      // [a][j]: r(K_j, a) + 1 - delta
        const double* __restrict__ income_now,     // [a][eps][j]: labour income at K_j
        const double* __restrict__ capital_next, const double* __restrict__ r_next,
        const double* __restrict__ w_next, const double* __restrict__ prob,
        const double* __restrict__ income_factor,
        int nk, int nK, double k_min, double k_max, double inv_power, double K_min, double K_max,
        int method, double one_minus_delta, double beta, double gamma, double floor_c) {
    const ks_grid_params g = {nk, nK, k_min, k_max, inv_power, K_min, K_max};
    const int total = 4 * nk * nK;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int j = idx % nK;
    int i = (idx / nK) % nk;
    int ae = idx / (nk * nK);
    int a = ae / 2;
    double kp = k_nodes[i];
    double consumption = ks_euler_consumption(policy, k_nodes, kp, capital_next[a * nK + j], r_next, w_next, prob,
                                              income_factor, g, ae, a, j, method, one_minus_delta, beta, gamma,
                                              floor_c);
    k_end[idx] = (consumption + kp - income_now[ae * nK + j]) / gross_now[a * nK + j];
}

// EGM, second half: one thread per column (a, eps, K_j) = (ae, j). The endogenous points are made
// non-decreasing by a running maximum (in place), then the column is walked with the k nodes in increasing
// order: cell p = last endogenous point <= k_i, clamped to [0, nk - 2] (np.searchsorted(side="right") - 1 on
// the NumPy side), k' = k_p + w (k_{p+1} - k_p), w = (k_i - e_p) / (e_{p+1} - e_p) (0 where the span is 0),
// clipped to [k_min, k_max]; then the damped update and the change, as in ks_euler_step.
extern "C" __global__ void ks_egm_onto_grid(
        const double* __restrict__ policy, double* __restrict__ policy_out, double* __restrict__ change,
        double* __restrict__ k_end, const double* __restrict__ k_nodes, int nk, int nK, double k_min,
        double k_max, double damping) {
    int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= 4 * nK) return;
    int ae = column / nK;
    int j = column % nK;
    double* e = k_end + (long long)ae * nk * nK + j;  // e[m * nK]: endogenous point of choice m
    double running = e[0];
    for (int m = 1; m < nk; ++m) {
        double v = e[(long long)m * nK];
        running = v > running ? v : running;  // NaN-free inputs: the same as np.maximum
        e[(long long)m * nK] = running;
    }
    int p = 0;
    for (int i = 0; i < nk; ++i) {
        double k = k_nodes[i];
        while (p + 1 <= nk - 2 && e[(long long)(p + 1) * nK] <= k) ++p;
        double low = e[(long long)p * nK], high = e[(long long)(p + 1) * nK];
        double span = high - low;
        double weight = span > 0.0 ? (k - low) / span : 0.0;
        double k_new = ks_clip(k_nodes[p] + weight * (k_nodes[p + 1] - k_nodes[p]), k_min, k_max);
        long long idx = ((long long)ae * nk + i) * nK + j;
        double kp = policy[idx];
        change[idx] = fabs(k_new - kp);
        policy_out[idx] = damping * k_new + (1.0 - damping) * kp;
    }
}
