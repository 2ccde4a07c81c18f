#!/usr/bin/env bash
# One device call for the SCCS work of issue 4: GPU = NumPy tests, then the benchmarks; logs under $OUT.
# Usage on the lent machine: bash bench/sccs_device.sh [modes...]   (default: tests gpu-small gpu-large)
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/sccs_out}
mkdir -p "$OUT"
nvidia-smi -L
python3 -c 'import cupy, numpy, scipy; print("cupy", cupy.__version__, "numpy", numpy.__version__, "scipy", scipy.__version__)'
lscpu | grep -m1 'Model name'
modes=${*:-tests gpu-small gpu-large}
for mode in $modes; do
    start=$(date +%s)
    case $mode in
        tests) timeout 240 python3 -m pytest tests/kernels/sccs/test_sccs_gpu.py -q -p no:cacheprovider -rfEs \
                   -o addopts="" --durations=5 2>&1 | tee "$OUT/gpu_tests.log" ;;
        numpy-large) timeout 260 python3 bench/sccs_bench.py "$mode" 2>&1 | tee "$OUT/bench_$mode.log" ;;
        *) timeout 140 python3 bench/sccs_bench.py "$mode" 2>&1 | tee "$OUT/bench_$mode.log" ;;
    esac
    echo "== $mode rc=$? wall=$(( $(date +%s) - start ))s"
done
echo "== summary"
grep -h "passed\|failed\|error" "$OUT/gpu_tests.log" 2>/dev/null | tail -3
grep -h "^RESULT" "$OUT"/bench_*.log 2>/dev/null | cut -c1-400
