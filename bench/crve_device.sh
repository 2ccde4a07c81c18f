#!/bin/bash
# The CRVE device run (issue 3): GPU == NumPy tests, GPU benchmarks, and the NumPy path on the same
# machine's CPU for ratios from one run. Usage on the device: bash bench/crve_device.sh  (logs under $OUT)
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/crve_out}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import cupy, numpy, scipy; print("cupy", cupy.__version__, "numpy", numpy.__version__, "scipy", scipy.__version__)'
nproc; lscpu | grep 'Model name'
echo "== GPU tests =="
timeout 100 python3 -m pytest tests/kernels/crve/test_crve_gpu.py -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
echo "== GPU benchmarks =="
timeout 150 python3 bench/crve_bench.py --device gpu --cases ${CRVE_GPU_CASES:-boot10m boot1m mc mcwcr} --json "$OUT/crve_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log" | tail -40
echo "== NumPy path on this machine's CPU =="
timeout ${CRVE_CPU_TIMEOUT:-110} python3 bench/crve_bench.py --device cpu --generate-on-gpu --repeats 1 --cases ${CRVE_CPU_CASES:-boot1m_g1000 mc mcwcr_g50 boot10m} --mc-reps 1000 --json "$OUT/crve_cpu.json" 2>&1 | tee "$OUT/bench_cpu.log" | tail -12
