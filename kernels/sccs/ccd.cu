// The CCD fit's kernels on the GPU (the NumPy twin is ccd.py; the engine that launches them is gpu.py).
// Defines: REAL (double or float: the per-era state eta, w and the case sums S), BLOCK (threads per block,
// a power of two: the size of the shared reduction buffers). Sums over eras and blocks accumulate in double, and
// none uses atomics: block partials go to arrays that are added in a fixed order, so every sum has the same bits
// on every run, and a replicate's never depend on the other rows of its batch.
typedef REAL real;

// Nonzeros of a (case, column) slot handled as one group by the per-case loops of the two coordinate kernels: the
// group's indices and values are loaded first, then the per-era state they point at, then the arithmetic in the
// nonzeros' order. A case's nonzeros were otherwise a chain of dependent loads (index, then state, then the store
// the next iteration's load may not pass), and the loops ran far below the memory's speed: issue 19's profile,
// `bench/sccs_cv_split_bench.py`. The sums are added in the same order as one nonzero at a time (the same bits);
// a slot has 4.8 nonzeros on average in the paper-sized tables (at most 15).
#ifndef SLOT_GROUP
#define SLOT_GROUP 8
#endif

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
    const long long slot = t_begin + t;
    const long long c = t < m ? touched_case[slot] : 0;
    // A case of weight 0 in this replicate (a bootstrap case not drawn, a held-out fold) adds exactly 0: its
    // nonzeros are not read (a third of a bootstrap replicate's cases).
    const double ce = t < m ? weighted_events[(long long)r * n_cases + c] : 0.0;
    if (t < m && active[r] && ce != 0.0) {
        const real* wr = w + (long long)r * n_eras;
        double a = 0.0, b = 0.0;
        const long long end = touched_ptr[slot + 1];
        for (long long first = touched_ptr[slot]; first < end; first += SLOT_GROUP) {
            long long k[SLOT_GROUP];
            double x[SLOT_GROUP];
            real wk[SLOT_GROUP];
            #pragma unroll
            for (int q = 0; q < SLOT_GROUP; ++q) {
                if (first + q < end) { k[q] = col_rows[first + q]; x[q] = col_values[first + q]; }
            }
            #pragma unroll
            for (int q = 0; q < SLOT_GROUP; ++q) {
                if (first + q < end) wk[q] = wr[k[q]];
            }
            #pragma unroll
            for (int q = 0; q < SLOT_GROUP; ++q) {
                if (first + q < end) {
                    const double wx = (double)wk[q] * x[q];
                    a += wx;
                    b += wx * x[q];
                }
            }
        }
        if (binary) b = a;
        const double s = (double)sums[(long long)r * n_cases + c];
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
// ccd.coordinate_step (prior 0 none, 1 normal, 2 laplace; Genkin's trust region and zero rule) on b_j. A
// replicate whose held coefficient is j (fixed[r] == j: a constrained refit of the profile) does not move it.
extern "C" __global__ void sccs_step(
    const int j, const int nblocks, const double* __restrict__ partial, const int partial_stride,
    const double* __restrict__ numerator, double* __restrict__ beta, double* __restrict__ trust,
    double* __restrict__ step_out, const int* __restrict__ active, const int* __restrict__ fixed, const int kind,
    const int penalised, const double* __restrict__ variance, const int n_cov)
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
    if (!active[r] || fixed[r] == j) { step_out[r] = 0.0; return; }
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
// column's nonzeros (a thread owns its case: no atomics). A case of weight 0 in the replicate is left as it is:
// nothing of the replicate reads its state with a nonzero weight (gradient, criterion, log-likelihood).
extern "C" __global__ void sccs_update(
    const long long t_begin, const int m,
    const long long* __restrict__ touched_case, const long long* __restrict__ touched_ptr,
    const long long* __restrict__ col_rows, const double* __restrict__ col_values,
    const double* __restrict__ era_length, real* __restrict__ eta, real* __restrict__ w,
    real* __restrict__ sums, const double* __restrict__ step, const double* __restrict__ case_weights,
    const long long n_eras, const long long n_cases)
{
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const double d = step[r];
    if (d == 0.0) return;
    const long long slot = t_begin + t;
    const long long c = touched_case[slot];
    if (case_weights[(long long)r * n_cases + c] == 0.0) return;
    real* er = eta + (long long)r * n_eras;
    real* wr = w + (long long)r * n_eras;
    double change = 0.0;
    const long long end = touched_ptr[slot + 1];
    // A slot's eras are distinct (a column has one nonzero per era), so the group's loads may all precede its
    // stores.
    for (long long first = touched_ptr[slot]; first < end; first += SLOT_GROUP) {
        long long k[SLOT_GROUP];
        double x[SLOT_GROUP], length[SLOT_GROUP];
        real e0[SLOT_GROUP], w0[SLOT_GROUP];
        #pragma unroll
        for (int q = 0; q < SLOT_GROUP; ++q) {
            if (first + q < end) { k[q] = col_rows[first + q]; x[q] = col_values[first + q]; }
        }
        #pragma unroll
        for (int q = 0; q < SLOT_GROUP; ++q) {
            if (first + q < end) { e0[q] = er[k[q]]; w0[q] = wr[k[q]]; length[q] = era_length[k[q]]; }
        }
        #pragma unroll
        for (int q = 0; q < SLOT_GROUP; ++q) {
            if (first + q < end) {
                const real e = e0[q] + (real)(d * x[q]);
                const real fresh = (real)(length[q] * exp((double)e));
                change += (double)fresh - (double)w0[q];
                er[k[q]] = e;
                wr[k[q]] = fresh;
            }
        }
    }
    sums[(long long)r * n_cases + c] += (real)change;
}

// The paper's convergence criterion per replicate r = blockIdx.y (0 for a row not active): the block partials of
// sum_k c |eta_k - eta_start_k| and of sum_k c |eta_k|, written to partial[2r, blockIdx.x] and partial[2r + 1, blockIdx.x] (a
// (2R, gridDim.x) array; fixed_sums.row_totals then adds each row in a fixed order: no atomics, so the criterion,
// and the cycle a fit stops at, are the same on every run).
extern "C" __global__ void sccs_xbeta_change(
    const real* __restrict__ eta, const real* __restrict__ eta_start, const long long* __restrict__ era_case,
    const double* __restrict__ case_weights, const int* __restrict__ active, const long long n_eras,
    const long long n_cases, double* __restrict__ partial)
{
    __shared__ double sg[BLOCK];
    __shared__ double sh[BLOCK];
    const int r = blockIdx.y;
    double change = 0.0, size = 0.0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    // A frozen or unused row's criterion is not read: its blocks write 0 without reading its eras.
    const long long n_read = active[r] ? n_eras : 0;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n_read; k += stride) {
        const double c = case_weights[(long long)r * n_cases + era_case[k]];
        const double e = (double)eta[(long long)r * n_eras + k];
        change += c * fabs(e - (double)eta_start[(long long)r * n_eras + k]);
        size += c * fabs(e);
    }
    block_sum2(sg, sh, change, size);
    if (threadIdx.x == 0) {
        partial[2LL * r * gridDim.x + blockIdx.x] = sg[0];
        partial[(2LL * r + 1) * gridDim.x + blockIdx.x] = sh[0];
    }
}

__device__ __forceinline__ void block_sum(double* s, double value) {
    s[threadIdx.x] = value;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
        __syncthreads();
    }
}

// The log-likelihood's gradient from the batch's state (the gradient criterion of a profile engine), part 1:
// per (chunk c = blockIdx.x of one column's nonzeros, replicate r = blockIdx.y) the chunk's sum of
// c_i n_i w_k x_kj / S_i (i the case of era k), written to chunk_sum[r, c]; 0 for a frozen replicate.
extern "C" __global__ void sccs_gradient_chunks(
    const long long* __restrict__ chunk_ptr, const long long* __restrict__ col_rows,
    const double* __restrict__ col_values, const long long* __restrict__ era_case, const real* __restrict__ w,
    const real* __restrict__ sums, const double* __restrict__ weighted_events, const int* __restrict__ active,
    double* __restrict__ chunk_sum, const long long n_chunks, const long long n_eras, const long long n_cases)
{
    __shared__ double s[BLOCK];
    const int r = blockIdx.y;
    const long long c = blockIdx.x;
    double total = 0.0;
    if (active[r]) {
        const real* wr = w + (long long)r * n_eras;
        const real* sr = sums + (long long)r * n_cases;
        const double* er = weighted_events + (long long)r * n_cases;
        for (long long p = chunk_ptr[c] + threadIdx.x; p < chunk_ptr[c + 1]; p += blockDim.x) {
            const long long k = col_rows[p];
            const long long i = era_case[k];
            total += er[i] * (double)wr[k] * col_values[p] / (double)sr[i];
        }
    }
    block_sum(s, total);
    if (threadIdx.x == 0) chunk_sum[(long long)r * n_chunks + c] = s[0];
}

// Part 2: one thread per (covariate j, replicate r = blockIdx.y) sums column j's chunks in order, forms the
// gradient g_j = t_j - sum and the KKT residual of model.kkt_residual (prior 0 none, 1 normal, 2 laplace);
// 0 for the held coefficient (fixed[r] == j) and for a frozen replicate.
extern "C" __global__ void sccs_kkt_residual(
    const long long* __restrict__ column_chunk_ptr, const double* __restrict__ chunk_sum, const long long n_chunks,
    const double* __restrict__ numerator, const double* __restrict__ beta, const int* __restrict__ penalised,
    const int kind, const double* __restrict__ variance, const int* __restrict__ fixed,
    const int* __restrict__ active, const int n_cov, double* __restrict__ residual)
{
    const int r = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_cov) return;
    const long long at = (long long)r * n_cov + j;
    if (!active[r] || fixed[r] == j) { residual[at] = 0.0; return; }
    double sum = 0.0;
    const double* row = chunk_sum + (long long)r * n_chunks;
    for (long long c = column_chunk_ptr[j]; c < column_chunk_ptr[j + 1]; ++c) sum += row[c];
    const double g = numerator[at] - sum;
    const double b = beta[at];
    double value = fabs(g);
    if (kind == 1 && penalised[j]) {
        value = fabs(g - b / variance[r]);
    } else if (kind == 2 && penalised[j]) {
        const double rate = sqrt(2.0 / variance[r]);
        value = b != 0.0 ? fabs(g - (b > 0.0 ? rate : -rate)) : fmax(fabs(g) - rate, 0.0);
    }
    residual[at] = value;
}

// The log-likelihood from the batch's state (a profile engine's results): one thread per (case i, replicate
// r = blockIdx.y) forms c_i (sum_k y_k (eta_k + log L_k) - n_i log S_i) over the case's eras
// (case_ptr[i] .. case_ptr[i + 1]: eras are sorted by case), S_i summed afresh from w; each block writes its
// partial sum to partial[r, blockIdx.x].
extern "C" __global__ void sccs_case_loglik(
    const long long* __restrict__ case_ptr, const double* __restrict__ era_events,
    const double* __restrict__ log_length, const real* __restrict__ eta, const real* __restrict__ w,
    const double* __restrict__ case_events, const double* __restrict__ case_weights, double* __restrict__ partial,
    const long long n_eras, const long long n_cases)
{
    __shared__ double s[BLOCK];
    const int r = blockIdx.y;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    double value = 0.0;
    if (i < n_cases) {
        const double c = case_weights[(long long)r * n_cases + i];
        if (c != 0.0) {
            const real* er = eta + (long long)r * n_eras;
            const real* wr = w + (long long)r * n_eras;
            double numerator = 0.0, total = 0.0;
            for (long long k = case_ptr[i]; k < case_ptr[i + 1]; ++k) {
                numerator += era_events[k] * ((double)er[k] + log_length[k]);
                total += (double)wr[k];
            }
            value = c * (numerator - case_events[i] * log(total));
        }
    }
    block_sum(s, value);
    if (threadIdx.x == 0) partial[(long long)r * gridDim.x + blockIdx.x] = s[0];
}

// The batch's numerators t_j = sum_i c_i q_ij (q_ij = sum_k y_k x_kj over case i's nonzeros of column j, one per
// touched slot): one block per (covariate j = blockIdx.x, replicate r = blockIdx.y) adds q times the replicate's
// case weight over the column's touched slots (touched_col_ptr[j] .. touched_col_ptr[j + 1]) in a fixed order, so
// a replicate's numerators never depend on the run or on the other rows of its batch.
extern "C" __global__ void sccs_numerators(
    const long long* __restrict__ touched_col_ptr, const long long* __restrict__ touched_case,
    const double* __restrict__ touched_events, const double* __restrict__ case_weights,
    double* __restrict__ numerator, const long long n_cases, const int n_cov)
{
    __shared__ double s[BLOCK];
    const int j = blockIdx.x;
    const int r = blockIdx.y;
    const double* c = case_weights + (long long)r * n_cases;
    double total = 0.0;
    for (long long t = touched_col_ptr[j] + threadIdx.x; t < touched_col_ptr[j + 1]; t += blockDim.x) {
        total += touched_events[t] * c[touched_case[t]];
    }
    block_sum(s, total);
    if (threadIdx.x == 0) numerator[(long long)r * n_cov + j] = s[0];
}
