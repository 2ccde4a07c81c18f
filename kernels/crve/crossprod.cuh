// The per-row products both CRVE reductions sum (pairs.cu per group of rows, montecarlo.cu per cluster):
// NSTAT = K(K+1)/2 + K statistics, the upper triangle of x x' row by row, then x y. Needs the define K.
#define NSTAT (K * (K + 1) / 2 + K)

__device__ __forceinline__ void crve_add_row_products(double* acc, const double* x, double y) {
    int s = 0;
    #pragma unroll
    for (int a = 0; a < K; ++a) {
        #pragma unroll
        for (int b = a; b < K; ++b) acc[s++] += x[a] * x[b];
    }
    #pragma unroll
    for (int a = 0; a < K; ++a) acc[s++] += x[a] * y;
}
