// Draws of kernels/philox.cuh for tests/kernels/test_rng_gpu.py (compiled through kernels/cuda.py).
extern "C" __global__ void draw(unsigned long long seed, unsigned long long stream,
                                const unsigned long long* index, int n, double* u, double* z, double* s) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) {
        u[i] = gpuest_uniform(seed, stream, index[i]);
        z[i] = gpuest_normal(seed, stream, index[i]);
        s[i] = gpuest_rademacher(seed, stream, index[i]);
    }
}

// Every registered stream define reaches the source with its number (kernels.rng.STREAMS).
extern "C" __global__ void stream_numbers(unsigned long long* out) {
    out[0] = GPUEST_STREAM_CRVE_WEIGHTS;
    out[1] = GPUEST_STREAM_SCCS_BOOTSTRAP;
    out[2] = GPUEST_STREAM_KS_TEST_IDIOSYNCRATIC;
}
