// Sums in a fixed order on the GPU (launched by fixed_sums.py). No atomics: which thread adds which terms, and
// in what order, depends only on the sizes of the input, never on thread scheduling, so every sum has the same
// bits on every run. Defines: BLOCK (threads per block, a power of two: the size of the shared buffers; every
// launch uses BLOCK threads).

// The block's sum of one value per thread by halving (a fixed tree), returned to every thread.
__device__ __forceinline__ double block_total(double* s, double value) {
    s[threadIdx.x] = value;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
        __syncthreads();
    }
    return s[0];
}

// Short segments (each case's eras): one thread per segment i adds values[ptr[i]] .. values[ptr[i + 1] - 1] in
// index order.
extern "C" __global__ void segment_sums(
    const long long* __restrict__ ptr, const double* __restrict__ values, double* __restrict__ out,
    const long long n_segments)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_segments) return;
    double total = 0.0;
    for (long long k = ptr[i]; k < ptr[i + 1]; ++k) total += values[k];
    out[i] = total;
}

// Short segments' maxima (each case's eras): one thread per segment, -inf for an empty one, NaN if any value is
// NaN (as NumPy's maximum). A maximum is exact in any order: this only replaces an atomic scatter (CuPy's
// maximum.at, a compare-and-swap loop contended by a case's eras) with one pass, with the same values.
extern "C" __global__ void segment_max(
    const long long* __restrict__ ptr, const double* __restrict__ values, double* __restrict__ out,
    const long long n_segments)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_segments) return;
    double top = __longlong_as_double((long long)0xfff0000000000000ULL);  // -inf
    for (long long k = ptr[i]; k < ptr[i + 1]; ++k) {
        const double v = values[k];
        if (v > top || v != v) top = v;
        if (top != top) break;  // NaN: the maximum stays NaN
    }
    out[i] = top;
}

// Long segments (each column's chunks): one block per segment i = blockIdx.x; thread t adds the elements
// ptr[i] + t, ptr[i] + t + BLOCK, ... in order, then the block adds the threads' sums by its fixed tree.
extern "C" __global__ void long_segment_sums(
    const long long* __restrict__ ptr, const double* __restrict__ values, double* __restrict__ out)
{
    __shared__ double s[BLOCK];
    const long long i = blockIdx.x;
    double total = 0.0;
    for (long long k = ptr[i] + threadIdx.x; k < ptr[i + 1]; k += blockDim.x) total += values[k];
    const double sum = block_total(s, total);
    if (threadIdx.x == 0) out[i] = sum;
}

// X' v, part 1: one block per chunk c = blockIdx.x of one column's nonzeros (chunk_ptr[c] .. chunk_ptr[c + 1])
// adds x_kj v_k over the chunk as long_segment_sums does; part 2 is long_segment_sums over each column's chunks.
extern "C" __global__ void chunk_products(
    const long long* __restrict__ chunk_ptr, const long long* __restrict__ col_rows,
    const double* __restrict__ col_values, const double* __restrict__ v, double* __restrict__ chunk_sum)
{
    __shared__ double s[BLOCK];
    const long long c = blockIdx.x;
    double total = 0.0;
    for (long long p = chunk_ptr[c] + threadIdx.x; p < chunk_ptr[c + 1]; p += blockDim.x) {
        total += col_values[p] * v[col_rows[p]];
    }
    const double sum = block_total(s, total);
    if (threadIdx.x == 0) chunk_sum[c] = sum;
}

// X b: one thread per era (row) k adds x_kj b_j over the row's nonzeros in increasing column order (the row-major
// copy of the design: row_ptr, row_columns, row_values).
extern "C" __global__ void row_products(
    const long long* __restrict__ row_ptr, const int* __restrict__ row_columns,
    const double* __restrict__ row_values, const double* __restrict__ beta, double* __restrict__ out,
    const long long n_rows)
{
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_rows) return;
    double total = 0.0;
    for (long long p = row_ptr[k]; p < row_ptr[k + 1]; ++p) total += row_values[p] * beta[row_columns[p]];
    out[k] = total;
}

// One stage of each row's total of a C-contiguous (R, n) array: row r = blockIdx.x, block b = blockIdx.y of
// gridDim.y; thread t adds the row's elements b BLOCK + t, stepping by gridDim.y BLOCK, in order, then the block
// adds the threads' sums by its fixed tree into out[r, b] (an (R, gridDim.y) array). The number of blocks per row
// is fixed by n alone (fixed_sums.row_totals), so a row's total does not depend on the other rows.
extern "C" __global__ void strided_sums(
    const double* __restrict__ values, const long long n, double* __restrict__ out)
{
    __shared__ double s[BLOCK];
    const double* row = values + (long long)blockIdx.x * n;
    const long long stride = (long long)gridDim.y * blockDim.x;
    double total = 0.0;
    for (long long i = (long long)blockIdx.y * blockDim.x + threadIdx.x; i < n; i += stride) total += row[i];
    const double sum = block_total(s, total);
    if (threadIdx.x == 0) out[(long long)blockIdx.x * gridDim.y + blockIdx.y] = sum;
}

// The row-major index's sort keys (fixed_sums.row_index): keys[p] = col_rows[p] n_cov + j for every nonzero p of
// column j = blockIdx.x (unique: a column holds an era once).
extern "C" __global__ void nonzero_keys(
    const long long* __restrict__ col_ptr, const long long* __restrict__ col_rows, const long long n_cov,
    long long* __restrict__ keys)
{
    const long long j = blockIdx.x;
    for (long long p = col_ptr[j] + threadIdx.x; p < col_ptr[j + 1]; p += blockDim.x) {
        keys[p] = col_rows[p] * n_cov + j;
    }
}
