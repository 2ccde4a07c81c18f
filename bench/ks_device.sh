#!/usr/bin/env bash
# Krusell-Smith on the lent GPU; logs under $OUT.
#   bash bench/ks_device.sh          # GPU-vs-NumPy tests, then the full benchmark list (as in bench/RESULTS.md)
#   bash bench/ks_device.sh solvers  # GPU tests, the solve with EGM / Anderson against the damped time iteration,
#                                    # (CALIBRATIONS=1: and bench/ks_calibrations.py, DHJJ and KS 1998, T = 11,000)
#   GPU_TESTS="egm or full_solve" bash bench/ks_device.sh solvers   # only the GPU tests named by -k
#   bash bench/ks_device.sh graph    # GPU tests, then before/after of the CUDA-graph panel loop and of the
#                                    # Euler convergence check every 10 steps (--no-graph --check-every 1 = before)
# The GPU tests need numpy, cupy and pytest; the benchmarks also pydantic (they run through
# kernels.context.local_context, and `example` through run_kind), installed from the wheel folder .whl when it
# is carried along. The CUDA kernels are compiled by kernels/cuda.py (model and conventions: docs/ks.md).
set -o pipefail
MODE=${1:-all}
OUT=${OUT:-/tmp/ks_out}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import cupy; print("cupy", cupy.__version__)'
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
lscpu | grep -m1 'Model name'
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl pydantic pydantic-settings pytest pytest-timeout
fi
timeout 300 python3 -m pytest tests/kernels/ks -m gpu -q -rs -p no:cacheprovider -o addopts="" ${GPU_TESTS:+-k "$GPU_TESTS"} 2>&1 \
  | tee "$OUT/ks_gpu_tests.log"
B="python3 bench/ks_bench.py"
$B example 2>&1 | tee "$OUT/ks_example.log"  # the kind's example, NumPy vs GPU (worst relative gap)
if [ "$MODE" = solvers ]; then  # issue 12: EGM and the Anderson ALM update against the damped time iteration
  {
    S="$B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom"
    $S                                   # before: damped time iteration, 30 outer iterations on 10^7 agents
    $S --alm-update anderson
    $S --coarse-agents 100000
    $S --coarse-agents 100000 --alm-update anderson
    $S --coarse-agents 1000000 --alm-update anderson
    $S --coarse-agents 100000 --alm-update anderson --coarse-first-step 1
    $S --coarse-agents 300000 --alm-update anderson --coarse-first-step 1
    $B solve --k-size 100 --K-size 4 --n-agents 10000 --interpolation catmull_rom --policy-method egm
  } 2>&1 | tee "$OUT/ks_solvers_bench.log"
  if [ -n "$CALIBRATIONS" ]; then
    python3 bench/ks_calibrations.py --n-agents 10000 --periods 11000 --burn-in 1000 2>&1 | tee "$OUT/ks_calibrations.log"
  fi
  echo "== summary"; python3 bench/ks_bench.py summary --log "$OUT/ks_solvers_bench.log"
  tail -3 "$OUT/ks_gpu_tests.log"
  exit 0
fi
if [ "$MODE" = graph ]; then
  {
    for G in --graph --no-graph; do
      $B panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom --precision float64 $G
      $B panel --n-agents 1000000 --periods 1000 --interpolation catmull_rom --precision float64 $G
      $B panel --n-agents 10000 --periods 1000 --interpolation catmull_rom --precision float64 $G
    done
    $B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom
    $B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom --no-graph --check-every 1
    $B solve --k-size 100 --K-size 4 --n-agents 10000 --interpolation catmull_rom
    $B solve --k-size 100 --K-size 4 --n-agents 10000 --interpolation catmull_rom --no-graph --check-every 1
  } 2>&1 | tee "$OUT/ks_graph_bench.log"
  echo "== summary"; python3 bench/ks_bench.py summary --log "$OUT/ks_graph_bench.log"
  tail -3 "$OUT/ks_gpu_tests.log"
  exit 0
fi
{
  $B panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom --precision float64
  $B panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom --precision float32
  $B panel --n-agents 10000000 --periods 1000 --interpolation bilinear --precision float64
  $B panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom --k-size 500 --K-size 50
  $B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom
  $B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation bilinear
  $B solve --k-size 500 --K-size 50 --n-agents 10000000 --interpolation catmull_rom --precision float32
  $B solve --k-size 100 --K-size 4 --n-agents 10000000 --interpolation catmull_rom
  $B solve --k-size 100 --K-size 4 --n-agents 10000 --interpolation catmull_rom
  $B solve --k-size 100 --K-size 4 --n-agents 10000 --interpolation bilinear
  GPUEST_DEVICE=cpu $B panel --n-agents 1000000 --periods 10 --repeats 1 --interpolation catmull_rom
} 2>&1 | tee "$OUT/ks_bench.log"
echo "== summary"; python3 bench/ks_bench.py summary --log "$OUT/ks_bench.log"
tail -3 "$OUT/ks_gpu_tests.log"
