// The policy step of kernels/ks/policy.py (``euler_update``'s twin): one damped Euler-equation step at every
// grid point. Always double precision (the policy step is float64 whatever the panel's precision): compiled
// with -DREAL=double, the ks_real of interp.cuh (prepended by kernels/cuda.py).
static_assert(sizeof(ks_real) == sizeof(double), "policy.cu is compiled with REAL=double only");

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
    double Kn = capital_next[a * nK + j];
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
    double consumption = pow(beta * expectation, -1.0 / gamma);
    double k_new = ks_clip(wealth_now[idx] - consumption, g.k_min, g.k_max);
    change[idx] = fabs(k_new - kp);
    policy_out[idx] = damping * k_new + (1.0 - damping) * kp;
}
