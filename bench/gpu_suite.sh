#!/bin/bash
# Every GPU test of the repository in one device call (GPU == NumPy agreement on fresh random inputs),
# then the CRVE GPU benchmarks. Usage on the device machine: bash bench/gpu_suite.sh  (logs under $OUT)
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_suite}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)'
echo "== GPU tests =="
timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs \
  tests/kernels/test_rng_gpu.py tests/kernels/*/test_*_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -30
echo "== CRVE GPU benchmarks =="
timeout 120 python3 bench/crve_bench.py --device gpu --cases boot10m boot1m mc mcwcr --json "$OUT/crve_gpu.json" \
  2>&1 | tee "$OUT/crve_bench_gpu.log" | tail -30
