// The CCD fit's kernels on the GPU (the NumPy twin is ccd.py; the engine that launches them is gpu.py).
// Defines: REAL (double or float: the per-era state eta, w and the case sums S), BLOCK (threads per block,
// a power of two: the size of the shared reduction buffers). Sums over eras and blocks accumulate in double.
typedef REAL real;

__device__ __forceinline__ void block_sum2(double* sg, double* sh, double g, double h) {
    sg[threadIdx.x] = g; sh[threadIdx.x] = h;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            sg[threadIdx.x] += sg[threadIdx.x + half];
            sh[threadIdx.x] += sh[threadIdx.x + half];
        }
        __syncthreads();
    }
}

// Listing 2, fused: one thread per (replicate r = blockIdx.y, case touched by column j) sums A = sum w x and
// B = sum w x^2 over the case's nonzeros of the column, forms c n A / S and c n (B / S - (A / S)^2), and each
// block writes its partial sums of the two (the gradient and Hessian parts of the likelihood).
extern "C" __global__ void sccs_grad_hess(
    const long long t_begin, const int m, const int binary,
    const long long* __restrict__ touched_case, const long long* __restrict__ touched_ptr,
    const long long* __restrict__ col_rows, const double* __restrict__ col_values,
    const real* __restrict__ w, const real* __restrict__ sums, const double* __restrict__ weighted_events,
    const int* __restrict__ active, double* __restrict__ partial, const int partial_stride,
    const long long n_eras, const long long n_cases)
{
    __shared__ double sg[BLOCK];
    __shared__ double sh[BLOCK];
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    double g = 0.0, h = 0.0;
    if (t < m && active[r]) {
        const long long slot = t_begin + t;
        const long long c = touched_case[slot];
        const real* wr = w + (long long)r * n_eras;
        double a = 0.0, b = 0.0;
        for (long long p = touched_ptr[slot]; p < touched_ptr[slot + 1]; ++p) {
            const double x = col_values[p];
            const double wx = (double)wr[col_rows[p]] * x;
            a += wx;
            b += wx * x;
        }
        if (binary) b = a;
        const double s = (double)sums[(long long)r * n_cases + c];
        const double ce = weighted_events[(long long)r * n_cases + c];
        const double share = a / s;
        g = ce * share;
        h = ce * (b / s - share * share);
    }
    block_sum2(sg, sh, g, h);
    if (threadIdx.x == 0) {
        double* out = partial + 2 * ((long long)r * partial_stride + blockIdx.x);
        out[0] = sg[0];
        out[1] = sh[0];
    }
}

// One block per replicate: sums the block partials in a fixed order, then takes the bounded Newton step of
// ccd.coordinate_step (prior 0 none, 1 normal, 2 laplace; Genkin's trust region and zero rule) on b_j.
extern "C" __global__ void sccs_step(
    const int j, const int nblocks, const double* __restrict__ partial, const int partial_stride,
    const double* __restrict__ numerator, double* __restrict__ beta, double* __restrict__ trust,
    double* __restrict__ step_out, const int* __restrict__ active, const int kind, const int penalised,
    const double* __restrict__ variance, const int n_cov)
{
    __shared__ double sg[BLOCK];
    __shared__ double sh[BLOCK];
    const int r = blockIdx.x;
    double g = 0.0, h = 0.0;
    for (int b = threadIdx.x; b < nblocks; b += blockDim.x) {
        const double* in = partial + 2 * ((long long)r * partial_stride + b);
        g += in[0];
        h += in[1];
    }
    block_sum2(sg, sh, g, h);
    if (threadIdx.x != 0) return;
    if (!active[r]) { step_out[r] = 0.0; return; }
    const long long at = (long long)r * n_cov + j;
    const double grad = -(numerator[at] - sg[0]);
    const double hess = sh[0];
    const double bj = beta[at];
    const double v = variance[r];
    double step;
    if (kind == 1 && penalised) {
        step = -(grad + bj / v) / (hess + 1.0 / v);
    } else if (kind == 2 && penalised) {
        const double rate = sqrt(2.0 / v);
        if (hess <= 0.0) {
            step = 0.0;
        } else if (bj == 0.0) {
            step = -(grad + rate) / hess;
            if (step <= 0.0) {
                step = -(grad - rate) / hess;
                if (step >= 0.0) step = 0.0;
            }
        } else {
            const double sign = bj > 0.0 ? 1.0 : -1.0;
            step = -(grad + rate * sign) / hess;
            if ((bj + step) * sign < 0.0) step = -bj;
        }
    } else {
        step = hess > 0.0 ? -grad / hess : 0.0;
    }
    const double width = trust[at];
    step = fmin(fmax(step, -width), width);
    trust[at] = fmax(2.0 * fabs(step), 0.5 * width);
    beta[at] = bj + step;
    step_out[r] = step;
}

// Listing 3: one thread per (replicate, touched case) updates eta, w = L exp(eta) and that case's S at the
// column's nonzeros (a thread owns its case: no atomics).
extern "C" __global__ void sccs_update(
    const long long t_begin, const int m,
    const long long* __restrict__ touched_case, const long long* __restrict__ touched_ptr,
    const long long* __restrict__ col_rows, const double* __restrict__ col_values,
    const double* __restrict__ era_length, real* __restrict__ eta, real* __restrict__ w,
    real* __restrict__ sums, const double* __restrict__ step, const long long n_eras, const long long n_cases)
{
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const double d = step[r];
    if (d == 0.0) return;
    const long long slot = t_begin + t;
    const long long c = touched_case[slot];
    real* er = eta + (long long)r * n_eras;
    real* wr = w + (long long)r * n_eras;
    double change = 0.0;
    for (long long p = touched_ptr[slot]; p < touched_ptr[slot + 1]; ++p) {
        const long long k = col_rows[p];
        const real e = er[k] + (real)(d * col_values[p]);
        const real fresh = (real)(era_length[k] * exp((double)e));
        change += (double)fresh - (double)wr[k];
        er[k] = e;
        wr[k] = fresh;
    }
    sums[(long long)r * n_cases + c] += (real)change;
}

// The paper's convergence criterion per replicate: sum_k c |eta_k - eta_start_k| and sum_k c |eta_k| (out[2r],
// out[2r + 1]; the caller zeroes out first).
extern "C" __global__ void sccs_xbeta_change(
    const real* __restrict__ eta, const real* __restrict__ eta_start, const long long* __restrict__ era_case,
    const double* __restrict__ case_weights, const long long n_eras, const long long n_cases,
    double* __restrict__ out)
{
    __shared__ double sg[BLOCK];
    __shared__ double sh[BLOCK];
    const int r = blockIdx.y;
    double change = 0.0, size = 0.0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n_eras; k += stride) {
        const double c = case_weights[(long long)r * n_cases + era_case[k]];
        const double e = (double)eta[(long long)r * n_eras + k];
        change += c * fabs(e - (double)eta_start[(long long)r * n_eras + k]);
        size += c * fabs(e);
    }
    block_sum2(sg, sh, change, size);
    if (threadIdx.x == 0) {
        atomicAdd(out + 2 * r, sg[0]);
        atomicAdd(out + 2 * r + 1, sh[0]);
    }
}
