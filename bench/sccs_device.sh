#!/usr/bin/env bash
# One device call for the SCCS work: GPU = NumPy tests, a fresh worker's first fit, the benchmarks; logs under $OUT.
# Usage on the lent machine: bash bench/sccs_device.sh [modes...]   (default: tests first-fit gpu-small gpu-large)
# The tests need pydantic and pytest (carried as wheels: see kernels/README.md); test_sccs_fit.py and
# test_sccs_cv_bootstrap.py are NumPy-only and need statsmodels, so they are not run here.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/sccs_out}
mkdir -p "$OUT"
nvidia-smi -L
python3 -c 'import cupy, numpy, scipy; print("cupy", cupy.__version__, "numpy", numpy.__version__, "scipy", scipy.__version__)'
lscpu | grep -m1 'Model name'
modes=${*:-tests first-fit gpu-small gpu-large}
for mode in $modes; do
    start=$(date +%s)
    case $mode in
        tests) timeout 240 python3 -m pytest tests/kernels/sccs/test_sccs_gpu.py tests/kernels/sccs/test_sccs_data.py \
                   tests/kernels/sccs/test_sccs_jobs.py -m gpu -q -p no:cacheprovider -rfEs -o addopts="" \
                   --durations=5 2>&1 | tee "$OUT/gpu_tests.log" ;;
        first-fit) timeout 240 python3 bench/sccs_first_fit.py all 2>&1 | tee "$OUT/first_fit.log" ;;
        numpy-large) timeout 260 python3 bench/sccs_bench.py "$mode" 2>&1 | tee "$OUT/bench_$mode.log" ;;
        *) timeout 140 python3 bench/sccs_bench.py "$mode" 2>&1 | tee "$OUT/bench_$mode.log" ;;
    esac
    echo "== $mode rc=$? wall=$(( $(date +%s) - start ))s"
done
echo "== summary"
grep -h "passed\|failed\|error" "$OUT/gpu_tests.log" 2>/dev/null | tail -3
grep -h "^RESULT" "$OUT"/first_fit.log "$OUT"/bench_*.log 2>/dev/null | cut -c1-600
