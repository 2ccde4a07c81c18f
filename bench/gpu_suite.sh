#!/bin/bash
# Every GPU test of the repository in one device call (GPU == NumPy on fresh random inputs, and every job
# kind's example through run_kind on NumPy and on the GPU, compared leaf by leaf), then the headline
# benchmarks of each estimator. Usage on the device machine: bash bench/gpu_suite.sh  (logs under $OUT)
# The device's python has NumPy, SciPy, pandas, CuPy; pydantic and pytest come as wheels in .whl/
# (pip download --python-version 3.12 --only-binary=:all: -d .whl pydantic pydantic-settings structlog pytest pytest-timeout).
# Test modules that need statsmodels or wildboottest (NumPy-only reference checks) are left out here.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_suite}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl pydantic pydantic-settings structlog pytest pytest-timeout
fi
nvidia-smi -L; python3 -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)'
MODE=${1:-all}
echo "== GPU tests =="
mapfile -t files < <(ls tests/kernels/test_*.py tests/kernels/*/test_*.py \
  | grep -v -e test_crve_bootstrap_job -e test_crve_bootstrap_numerics -e test_crve_montecarlo -e test_sccs_fit)
timeout "${TEST_SECONDS:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfEs --timeout 120 \
  --durations=10 "${files[@]}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
[ "$MODE" = tests ] && exit 0
echo "== benchmarks =="
{
  timeout 60 python3 bench/crve_bench.py --device gpu --cases boot10m mc
  timeout 40 python3 bench/ks_bench.py panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom --precision float64
  timeout 60 python3 bench/ks_bench.py solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom
  timeout 60 python3 bench/dualcontrol_bench.py --device gpu --sizes 128 --policies optimal myopic inert --acceleration full
  timeout 90 python3 bench/sccs_bench.py gpu-large
} 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -60
