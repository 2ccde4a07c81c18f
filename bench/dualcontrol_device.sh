#!/usr/bin/env bash
# Dual-control GPU validation and benchmarks on the lent machine, in one call:
#   bash bench/dualcontrol_device.sh validate   # GPU==NumPy tests, then 64^3/128^3/256^3 timings
#   bash bench/dualcontrol_device.sh bench      # timings only, with and without acceleration
#   bash bench/dualcontrol_device.sh paper      # optimal policy at 64^3 and 128^3 under the paper's stopping
#                                               # rule (delta/(1-delta) sup-norm): plain VI (the paper's
#                                               # algorithm) and full acceleration
#   bash bench/dualcontrol_device.sh anderson   # 256^3, every policy, plain sweeps (the reference) against
#                                               # Anderson-accelerated evaluation, with their V/u distances
#                                               # from each other and from a solve to 1e-8
# Logs and JSON go to $OUT; a summary table is printed last. Needs only numpy and cupy (the GPU tests and the
# benchmark import the numerics modules, not the job's pydantic models); the CUDA kernels are compiled by
# kernels/cuda.py (model and algorithms: docs/dualcontrol.md).
set -u -o pipefail
MODE=${1:-validate}
OUT=${OUT:-/tmp/dualcontrol_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUEST_DEVICE=gpu
nvidia-smi -L
python3 -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)'
B=bench/dualcontrol_bench.py
if [ "$MODE" = validate ]; then
  timeout 150 python3 -m pytest tests/kernels/dualcontrol/test_dualcontrol_gpu.py -m gpu -q -p no:cacheprovider \
    -o addopts="" 2>&1 \
    | tee "$OUT/dc_gpu_tests.log" | tail -25
  timeout 110 python3 $B --device gpu --sizes 64 128 --policies inert myopic optimal --json "$OUT/dc_small.json" \
    2>&1 | tee "$OUT/dc_small.log" | grep -v '^{'
  timeout 140 python3 $B --device gpu --sizes 256 --policies optimal inert myopic --json "$OUT/dc_256.json" \
    2>&1 | tee "$OUT/dc_256.log" | grep -v '^{'
elif [ "$MODE" = anderson ]; then
  timeout 150 python3 $B --device gpu --sizes 256 --policies optimal myopic inert --evaluation sweeps anderson \
    --fixed-point 1e-8 \
    --json "$OUT/dc_256_anderson.json" 2>&1 | tee "$OUT/dc_256_anderson.log" | grep -v '^{'
elif [ "$MODE" = paper ]; then
  timeout 240 python3 $B --device gpu --sizes 64 128 --policies optimal --acceleration none full \
    --criterion sup_norm --json "$OUT/dc_paper_rule.json" 2>&1 | tee "$OUT/dc_paper_rule.log" | grep -v '^{'
else
  ALL="--acceleration full mpi c2f none"
  timeout 45 python3 $B --device gpu --sizes 64 --policies inert myopic optimal $ALL --json "$OUT/dc_64.json" \
    2>&1 | tee "$OUT/dc_64.log" | grep -v '^{'
  timeout 75 python3 $B --device gpu --sizes 128 --policies inert myopic optimal $ALL --json "$OUT/dc_128.json" \
    2>&1 | tee "$OUT/dc_128.log" | grep -v '^{'
  timeout 60 python3 $B --device gpu --sizes 256 --policies optimal inert myopic --acceleration full mpi \
    --json "$OUT/dc_256.json" 2>&1 | tee "$OUT/dc_256.log" | grep -v '^{'
  timeout 25 python3 $B --device gpu --sizes 256 --policies optimal --precision float32 \
    --json "$OUT/dc_256_f32.json" 2>&1 | tee "$OUT/dc_256_f32.log" | grep -v '^{'
  # plain value iteration, cold start (the paper's iteration, but the MacQueen-Porteus stopping rule; the
  # paper's own sup-norm rule: mode paper) at 256^3, last: it takes the remaining time
  timeout 200 python3 $B --device gpu --sizes 256 --policies optimal --acceleration none \
    --json "$OUT/dc_256_plain.json" 2>&1 | tee "$OUT/dc_256_plain.log" | grep -v '^{'
fi
