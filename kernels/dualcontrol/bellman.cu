// Fused dual-control Bellman kernels: one thread per grid point, V gathered through the read-only cache.
// Arithmetic mirrors bellman.py / minimize.py / grid.py / model.py line for line so that the NumPy twin
// agrees to rounding (the model and the algorithms: docs/dualcontrol.md).
//
// Defines (set by bellman.py through kernels/cuda.py, see kernel_defines there):
//   REAL                  double or float: the precision of every array and of the arithmetic;
//   INVERSE_GOLDEN_RATIO  (sqrt(5) - 1) / 2, minimize.py's constant, so both twins use one literal;
//   QUADRATIC             1: quadratic interpolation in x (grid.interpolate's curvature): V holds, per grid point,
//                         the pair (V, D2) with D2 = d2V/dx2 at the node (grid.x_curvature), so that one corner
//                         of the interpolation is two 16-byte loads (V and D2 at Sigma nodes ks and ks + 1)
//                         rather than four 8-byte loads from two arrays; 0: V alone, linear in x;
//   BAND                  x nodes of a band of the banded point order (point_of).
//
// params layout (see CudaBellman.__init__):
//   0 alpha, 1 gamma, 2 sigma_eps^2, 3 delta, 4 omega, 5 xbar, 6 ubar, 7 A, 8 B, 9 C (inert V0 = A x^2 + B x + C),
//   10 omega*ubar, 11 omega*ubar^2, then per axis (x, mu, Sigma) 7 numbers:
//   lo, hi, centre, stretch = sinh(c)/R, concentration c, z_lo, 1/dz;
//   33 residual: 1 = interpolate V - V0 and add V0 (grid.interpolate's baseline), 0 = plain trilinear.
//
// Both kernels compute the flat points first .. first + count - 1 (C order, x slowest) and read V everywhere:
// (0, nx*nmu*ns) on one device, one slab per device over several (slabs.py). With `banded` (the range starts
// and ends on band boundaries) the threads take the points in the banded order of point_of.

typedef REAL real;

template <typename T> struct Vec2;
template <> struct Vec2<double> { typedef double2 type; };
template <> struct Vec2<float> { typedef float2 type; };
typedef Vec2<real>::type real2;

#if QUADRATIC
#define VALUE_STRIDE 2  // (V, D2) pairs
#else
#define VALUE_STRIDE 1
#endif

struct Axis {
    real lo, hi, centre, stretch, conc, z_lo, inv_dz;
    float guess_scale, guess_shift;  // the cell guess t = asinh(...) * scale - shift (float32; locate)
    int n;
    const real* __restrict__ nodes;
};

struct Model {
    real alpha, gamma, se2, delta, omega, xbar, ubar, a, b, c, omega_ubar, omega_ubar2;
    bool residual;
};

struct Problem {
    Model m;
    Axis ax, amu, as;
    const real* __restrict__ V;  // VALUE_STRIDE reals a grid point
    const real* __restrict__ qz;
    const real* __restrict__ qw;
    int nq;
};

__device__ __forceinline__ Axis load_axis(const real* p, const real* nodes, int n) {
    Axis a;
    a.lo = p[0]; a.hi = p[1]; a.centre = p[2]; a.stretch = p[3]; a.conc = p[4]; a.z_lo = p[5]; a.inv_dz = p[6];
    a.guess_scale = (float)(a.conc > (real)0 ? a.inv_dz / a.conc : a.inv_dz);
    a.guess_shift = (float)(a.z_lo * a.inv_dz);
    a.n = n;
    a.nodes = nodes;
    return a;
}

// asinh's guess in float32 with the SFU's logarithm: the cell index it gives is at most one cell off (an error
// of about n * 1e-6 cells), and locate's comparisons then settle the exact cell.
__device__ __forceinline__ float guess_asinh(float y) {
    const float a = fabsf(y);
    return copysignf(__logf(a + sqrtf(fmaf(a, a, 1.0f))), y);
}

// grid.locate: the cell i with nodes[i] <= v < nodes[i+1] (i = n - 2 at the upper end), the weight of node i + 1
// and the cell's width, v clamped to the axis (constant beyond the cuboid). The spacing law's inverse only guesses
// i (in float64 asinh was a third of an improvement's time, bench/RESULTS.md); comparisons with the nodes make it
// exact, so the index is grid.locate's (a binary search there) whatever the rounding of the guess.
__device__ __forceinline__ int locate(const Axis& a, real v, real& w, real& width) {
    v = fmin(fmax(v, a.lo), a.hi);
    const float z = (a.conc > (real)0) ? guess_asinh((float)((v - a.centre) * a.stretch)) : (float)v;
    const float t = fmaf(z, a.guess_scale, -a.guess_shift);
    int i = (int)fminf(fmaxf(floorf(t), 0.0f), (float)(a.n - 2));
    real left = __ldg(a.nodes + i), right = __ldg(a.nodes + i + 1);
    while (v < left && i > 0) { --i; right = left; left = __ldg(a.nodes + i); }
    while (v >= right && i < a.n - 2) { ++i; left = right; right = __ldg(a.nodes + i + 1); }
    width = right - left;
    w = (v - left) / width;
    return i;
}

__device__ __forceinline__ real q_value(const Problem& P, real u, real x, real mu, real S) {
    const Model& m = P.m;
    const int nmu = P.amu.n, ns = P.as.n;
    real mean = m.alpha + mu * u + m.gamma * x;
    real sd = sqrt(u * u * S + m.se2);
    real S1 = (real)1 / ((real)1 / S + u * u / m.se2);
    real ws;
    real unused_width;
    const int ks = locate(P.as, S1, ws, unused_width);
    const real mu_over_S = mu / S;
    const real mu_u = mu * u;
    real ev = 0;
    for (int k = 0; k < P.nq; ++k) {
        real e = sd * __ldg(P.qz + k);
        real xn = mean + e;
        real y = mu_u + e;
        real mun = S1 * (mu_over_S + u * y / m.se2);
        real wx, wm;
        real h, mu_width;  // h: the x cell's width (the quadratic correction's)
        const int ix = locate(P.ax, xn, wx, h);
        const int jm = locate(P.amu, mun, wm, mu_width);
        const size_t o0 = ((size_t)ix * nmu + jm) * ns + ks;  // corner (ix, jm, ks)
        const size_t o1 = o0 + (size_t)nmu * ns;               // corner (ix + 1, jm, ks)
#if QUADRATIC
        // Each corner's pairs at ks and ks + 1: (V, D2) in .x, .y
        const real2* pv = reinterpret_cast<const real2*>(P.V);
        const real2 p00 = __ldg(pv + o0), q00 = __ldg(pv + o0 + 1);
        const real2 p01 = __ldg(pv + o0 + ns), q01 = __ldg(pv + o0 + ns + 1);
        const real2 p10 = __ldg(pv + o1), q10 = __ldg(pv + o1 + 1);
        const real2 p11 = __ldg(pv + o1 + ns), q11 = __ldg(pv + o1 + ns + 1);
        real s00 = p00.x * ((real)1 - ws) + q00.x * ws;
        real s01 = p01.x * ((real)1 - ws) + q01.x * ws;
        real s10 = p10.x * ((real)1 - ws) + q10.x * ws;
        real s11 = p11.x * ((real)1 - ws) + q11.x * ws;
#else
        const real* v0 = P.V + o0;
        const real* v1 = P.V + o1;
        real s00 = __ldg(v0) * ((real)1 - ws) + __ldg(v0 + 1) * ws;
        real s01 = __ldg(v0 + ns) * ((real)1 - ws) + __ldg(v0 + ns + 1) * ws;
        real s10 = __ldg(v1) * ((real)1 - ws) + __ldg(v1 + 1) * ws;
        real s11 = __ldg(v1 + ns) * ((real)1 - ws) + __ldg(v1 + ns + 1) * ws;
#endif
        real t0 = s00 * ((real)1 - wm) + s01 * wm;
        real t1 = s10 * ((real)1 - wm) + s11 * wm;
        real v = t0 * ((real)1 - wx) + t1 * wx;
#if QUADRATIC
        {  // grid.interpolate's curvature: the same corners of D2, then the x correction
            real d00 = p00.y * ((real)1 - ws) + q00.y * ws;
            real d01 = p01.y * ((real)1 - ws) + q01.y * ws;
            real d10 = p10.y * ((real)1 - ws) + q10.y * ws;
            real d11 = p11.y * ((real)1 - ws) + q11.y * ws;
            real e0 = d00 * ((real)1 - wm) + d01 * wm;
            real e1 = d10 * ((real)1 - wm) + d11 * wm;
            real d2 = e0 * ((real)1 - wx) + e1 * wx;
            v = v - (real)0.5 * d2 * (wx * ((real)1 - wx)) * (h * h);
        }
#endif
        if (m.residual) {  // grid.baseline_correction: V0(x') - linear interpolant of V0 between the x nodes
            const real left = __ldg(P.ax.nodes + ix), right = __ldg(P.ax.nodes + ix + 1);
            const real q_left = (m.a * left + m.b) * left + m.c;
            const real q_right = (m.a * right + m.b) * right + m.c;
            v = v + (((m.a * xn + m.b) * xn + m.c) - (q_left * ((real)1 - wx) + q_right * wx));
        }
        ev += __ldg(P.qw + k) * v;
    }
    real gap = mean - m.xbar;
    real du = u - m.ubar;
    real loss = gap * gap + S * u * u + m.se2 + m.omega * du * du;
    return loss + m.delta * ev;
}

// The point the thread of rank `rank` (0 .. count - 1) computes. Banded: the grid's points in bands of BAND x nodes
// (the last band what is left), a band's (x, mu) rows taken mu-major, x fastest, then Sigma. The threads in flight
// at once (about 10^5 on an H100) then hold BAND x nodes by a few dozen mu nodes rather than one x node by every mu
// node, so their quadrature nodes land in fewer rows of V and more of them hit the L2 cache (an improvement step
// 11 % faster at 256^3, bench/RESULTS.md). The order changes which thread computes a point, never its arithmetic.
__device__ __forceinline__ long long point_of(long long rank, long long first, int banded, int nx, int nmu, int ns) {
    const long long g = first + rank;
    if (!banded) return g;
    const long long band_points = (long long)BAND * nmu * ns;
    const long long band = g / band_points;
    const long long height = min((long long)BAND, (long long)nx - band * BAND);  // x nodes in this band
    const long long in_band = g - band * band_points;
    const long long row = in_band / ns, k = in_band - row * ns;
    const long long jm = row / height, ix = band * BAND + row % height;
    return (ix * nmu + jm) * ns + k;
}

__device__ __forceinline__ Problem load_problem(const real* params, const real* gx, const real* gmu, const real* gs,
                                                const real* qz, const real* qw, int nq, int nx, int nmu, int ns,
                                                const real* V) {
    Problem P;
    P.m.alpha = params[0]; P.m.gamma = params[1]; P.m.se2 = params[2]; P.m.delta = params[3];
    P.m.omega = params[4]; P.m.xbar = params[5]; P.m.ubar = params[6];
    P.m.a = params[7]; P.m.b = params[8]; P.m.c = params[9];
    P.m.omega_ubar = params[10]; P.m.omega_ubar2 = params[11];
    P.m.residual = params[33] != (real)0;
    P.ax = load_axis(params + 12, gx, nx);
    P.amu = load_axis(params + 19, gmu, nmu);
    P.as = load_axis(params + 26, gs, ns);
    P.V = V; P.qz = qz; P.qw = qw; P.nq = nq;
    return P;
}

// Launch bounds (128 threads a block, CudaBellman.block): without them ptxas gave both kernels 114-120
// registers a thread, 4 blocks an SM (25 % occupancy); with 8 and 6 blocks it fits them in 64 and 80 with
// small float64 spills. Same arithmetic; the 256^3 optimal solve 5.73 -> 5.23 s on an H200 (bench/RESULTS.md).
extern "C" __global__ void __launch_bounds__(128, 8) dc_evaluate(const real* params, const real* gx, const real* gmu, const real* gs,
                                       const real* qz, const real* qw, int nq, int nx, int nmu, int ns,
                                       long long first, long long count, int banded,
                                       const real* __restrict__ V, const real* __restrict__ U,
                                       real* __restrict__ V_out) {
    const long long rank = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (rank >= count) return;
    const long long p = point_of(rank, first, banded, nx, nmu, ns);  // flat point (C order)
    const Problem P = load_problem(params, gx, gmu, gs, qz, qw, nq, nx, nmu, ns, V);
    const int ks = (int)(p % ns);
    const int jm = (int)((p / ns) % nmu);
    const int ix = (int)(p / ((long long)ns * nmu));
    V_out[p] = q_value(P, U[p], gx[ix], gmu[jm], gs[ks]);
}

extern "C" __global__ void __launch_bounds__(128, 6) dc_improve(const real* params, const real* gx, const real* gmu, const real* gs,
                                      const real* qz, const real* qw, int nq, int nx, int nmu, int ns,
                                      long long first, long long count, int banded,
                                      const real* __restrict__ V, const real* __restrict__ U_prev, int has_prev,
                                      int n_scan, int n_golden, real* __restrict__ V_out, real* __restrict__ U_out) {
    const long long rank = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (rank >= count) return;
    const long long p = point_of(rank, first, banded, nx, nmu, ns);  // flat point (C order)
    const Problem P = load_problem(params, gx, gmu, gs, qz, qw, nq, nx, nmu, ns, V);
    const Model& m = P.m;
    const int ks = (int)(p % ns);
    const int jm = (int)((p / ns) % nmu);
    const int ix = (int)(p / ((long long)ns * nmu));
    const real x = gx[ix], mu = gmu[jm], S = gs[ks];

    // Inert bounds (model.inert_bounds) with upper = max(closed-form inert cost, current iterate).
    real gap = m.alpha + m.gamma * x - m.xbar;
    real qa = S + mu * mu + m.omega;
    real qb = (real)2 * (mu * gap - m.omega_ubar);
    real qc = gap * gap + m.se2 + m.omega_ubar2;
    real inert = (m.a * x + m.b) * x + m.c;
    real upper = fmax(inert, V[VALUE_STRIDE * p]);
    real centre = -qb / ((real)2 * qa);
    real min_loss = qc - qb * qb / ((real)4 * qa);
    real half = sqrt(fmax(upper - min_loss, (real)0) / qa);
    real lo = centre - half, hi = centre + half;

    // Start candidates (myopic, previous policy), then the scan (minimize.golden_section_minimise).
    real best_u = (m.omega_ubar - mu * gap) / (S + mu * mu + m.omega);
    real best_q = q_value(P, best_u, x, mu, S);
    if (has_prev) {
        real u = U_prev[p];
        real q = q_value(P, u, x, mu, S);
        if (q < best_q) { best_u = u; best_q = q; }
    }
    real step = (hi - lo) / (real)(n_scan - 1);
    for (int j = 0; j < n_scan; ++j) {
        real u = lo + (real)j * step;
        real q = q_value(P, u, x, mu, S);
        if (q < best_q) { best_u = u; best_q = q; }
    }

    const real g = (real)INVERSE_GOLDEN_RATIO;
    // Centre clamped into the bracket (minimize.py): a previous policy outside [lo, hi] must not invert a > b.
    real cell_centre = fmin(fmax(best_u, lo), hi);
    real a = fmax(lo, cell_centre - step);
    real b = fmin(hi, cell_centre + step);
    real c = b - g * (b - a);
    real d = a + g * (b - a);
    real fc = q_value(P, c, x, mu, S);
    real fd = q_value(P, d, x, mu, S);
    for (int it = 0; it < n_golden; ++it) {
        // One Q evaluation per step, outside the branch (the same arithmetic as minimize.py's xp.where lines):
        // the direction differs between neighbouring points, and with a call in each arm a warp whose threads
        // disagreed ran both calls, nearly doubling the cost of golden section.
        const bool left = fc < fd;  // the minimum lies in [a, d]
        if (left) { b = d; d = c; fd = fc; } else { a = c; c = d; fc = fd; }
        const real probe = left ? b - g * (b - a) : a + g * (b - a);
        const real f_probe = q_value(P, probe, x, mu, S);
        if (left) { c = probe; fc = f_probe; } else { d = probe; fd = f_probe; }
    }
    real golden_u = (fc < fd) ? c : d;
    real golden_q = (fc < fd) ? fc : fd;
    if (golden_q < best_q) { best_u = golden_u; best_q = golden_q; }
    V_out[p] = best_q;
    U_out[p] = best_u;
}

// grid.locate on the device for count values along one axis (its 7 numbers as in params): the cell index and
// the weight of its upper node (tests hold it to the NumPy locator).
extern "C" __global__ void dc_locate(const real* axis_params, const real* nodes, int n, const real* values,
                                     long long count, int* index, real* weight) {
    const long long p = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (p >= count) return;
    const Axis a = load_axis(axis_params, nodes, n);
    real w, width;
    index[p] = locate(a, values[p], w, width);
    weight[p] = w;
}

// The QUADRATIC layout's (V, V_xx) pairs in one pass (one thread a point; `plane` = nmu * ns points an x node):
// V_xx is grid.x_curvature's three-point second difference in x on the non-uniform nodes, the end planes taking
// their neighbour's, in the same expressions as the NumPy twin (equal bits). Needs nx >= 3.
extern "C" __global__ void dc_pair(const real* __restrict__ V, const real* __restrict__ gx, int nx, long long plane,
                                   real* __restrict__ out) {
    const long long p = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (p >= (long long)nx * plane) return;
    const int ix = (int)(p / plane);
    const int c = min(max(ix, 1), nx - 2);                // the inner x node whose difference this plane takes
    const long long q = p + (long long)(c - ix) * plane;  // the same (mu, Sigma) point on plane c
    const real h_left = gx[c] - gx[c - 1], h_right = gx[c + 1] - gx[c];
    const real slope_left = (V[q] - V[q - plane]) / h_left;
    const real slope_right = (V[q + plane] - V[q]) / h_right;
    out[2 * p] = V[p];
    out[2 * p + 1] = (real)2 * (slope_right - slope_left) / (h_right + h_left);
}
