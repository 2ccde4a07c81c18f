#!/bin/bash
# Issue 19's scaling runs in one device call on a machine of several GPUs (nvidia-h100-x4 / -x8).
# The web stack (FastAPI, Celery, SQLAlchemy, ...) comes as wheels in .whl/ (see bench/gpu_suite.sh for the
# pip download line; add: fastapi "uvicorn[standard]" python-multipart "celery[redis,sqlalchemy]" sqlalchemy alembic httpx
# typer rich pyyaml prometheus-client matplotlib jinja2 swagger-ui-bundle, numpy's wheel removed; the device image
# has matplotlib, pillow, fonttools, kiwisolver, contourpy, uvloop, pygments and pyyaml: their wheels may be removed
# too, which keeps .whl and .stack together under the carry's 64 MiB).
# Usage on the device machine: bash bench/scaling_device.sh [section ...]   (sections: crve ks dc sccs sccsboot
# sccsanalyses crveboot dcbounds; default crve ks dc sccs). STACK=pgredis runs the jobs on PostgreSQL + Redis started from .stack/
# (carried; `bash bench/stack_services.sh pack` fills it) instead of the embedded SQLite stack.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/scaling}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --find-links .whl pydantic pydantic-settings structlog pytest pytest-timeout \
  fastapi "uvicorn[standard]" python-multipart "celery[redis,sqlalchemy]" sqlalchemy alembic httpx typer rich pyyaml \
  prometheus-client matplotlib jinja2 swagger-ui-bundle 2>&1 | grep -v -i warning | tail -3
if [ "${STACK:-}" = pgredis ]; then  # the production stack instead of the embedded SQLite one (bench/stack_services.sh)
  python3 -m pip install -q --no-index --find-links .whl "psycopg[binary]" 2>&1 | grep -v -i warning | tail -3
  source bench/stack_services.sh start || exit 1
fi
nvidia-smi -L; nvidia-smi topo -m | head -8
GPUS=$(nvidia-smi -L | wc -l); COUNTS="1 2"; [ "$GPUS" -ge 4 ] && COUNTS="1 2 4"; [ "$GPUS" -ge 8 ] && COUNTS="1 2 4 8"
SECTIONS=${*:-crve ks dc sccs}
for section in $SECTIONS; do
  case $section in
  crve)
    echo "== crve_montecarlo R = 10^7 through the stack: $COUNTS =="
    timeout 420 python3 bench/scaling_bench.py --gpus $COUNTS --repeats 2 --data-dir /tmp/scaling-crve \
      2> "$OUT/crve_stack.log" | tee "$OUT/crve_table.md"
    tail -5 "$OUT/crve_stack.log" ;;
  ks)
    echo "== KS panel N = 10^8, T = 1,000: $COUNTS =="
    for g in $COUNTS; do
      timeout 120 python3 bench/ks_bench.py panel --n-agents 100000000 --periods 1000 --interpolation catmull_rom \
        --repeats 2 --gpus "$g" | tail -1
    done
    echo "== KS solve N = 10^8 (job) on each GPU count: $COUNTS =="
    for g in $COUNTS; do
      timeout 150 python3 bench/ks_bench.py job --repeats 0 --spec "{\"k_grid\": {\"size\": 500}, \"K_grid\": {\"size\": 50}, \"n_agents\": 100000000, \"coarse_agents\": 100000, \"alm_update\": \"anderson\", \"gpus\": $g}" | tail -1
    done ;;
  dc)
    echo "== dual control GPU tests (kernels, slabs over the GPUs) =="
    timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEs --timeout 200 -m gpu \
      tests/kernels/dualcontrol/ tests/kernels/test_kinds_examples.py -k "dualcontrol or slab or gpus or several" \
      2>&1 | tail -8
    echo "== dual control optimal 256^3 (Anderson evaluation): 28 / 16 golden steps, then over the GPUs =="
    timeout 120 python3 bench/dualcontrol_bench.py --device gpu --sizes 256 --policies optimal --evaluation anderson \
      --golden-iterations 28 16 --json "$OUT/dc256_golden.json" | grep -v '^{' | tail -6
    for g in ${COUNTS#1 }; do
      timeout 90 python3 bench/dualcontrol_bench.py --device gpu --sizes 256 --policies optimal --evaluation anderson \
        --golden-iterations 16 --gpus "$g" --json "$OUT/dc256_g$g.json" | grep -v '^{' | tail -2
    done
    echo "== dual control optimal 512^3 (Anderson, 16 golden steps): $COUNTS =="
    for g in $COUNTS; do
      timeout 150 python3 bench/dualcontrol_bench.py --device gpu --sizes 512 --policies optimal --evaluation anderson \
        --golden-iterations 16 --gpus "$g" --json "$OUT/dc512_g$g.json" | grep -v '^{' | tail -2
    done ;;
  dcbounds)
    echo "== dual control 256^3 with __launch_bounds__ (a copy of the tree) =="
    rm -rf /tmp/bounds && mkdir -p /tmp/bounds && cp -r kernels bench /tmp/bounds/ && (cd /tmp/bounds && \
      sed -i 's/void dc_evaluate(/void __launch_bounds__(128, 8) dc_evaluate(/; s/void dc_improve(/void __launch_bounds__(128, 6) dc_improve(/' \
        kernels/dualcontrol/bellman.cu && PYTHONPATH=/tmp/bounds CUPY_CACHE_DIR=/tmp/bounds/cache timeout 120 \
      python3 bench/dualcontrol_bench.py --device gpu --sizes 256 --policies optimal --evaluation anderson \
      --golden-iterations 16 --json "$OUT/dc256_bounds.json" | grep -v '^{' | tail -3) ;;
  crveboot)
    echo "== crve_bootstrap GPU tests (draw ranges, chunks) =="
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfEs --timeout 150 \
      tests/kernels/crve/test_bootstrap_chunks.py tests/kernels/crve/test_crve_gpu.py \
      tests/kernels/crve/test_crve_ssc_nested.py 2>&1 | tail -6
    echo "== crve_bootstrap heteroskedastic N = 10^7, B = 9,999 through the stack: $COUNTS =="
    timeout 380 python3 bench/scaling_bench.py --kind crve_bootstrap_hc --gpus $COUNTS --repeats 2 \
      --data-dir var/scaling-hc 2> "$OUT/hc_stack.log" | tee "$OUT/hc_table.md"
    tail -6 "$OUT/hc_stack.log" ;;
  sccs)
    # The tables (N = 3.6M) are generated and uploaded once into var/ (kept between device calls on a warm
    # machine): a second call after a timeout starts at the jobs.
    echo "== sccs_fit 10-fold CV x 10 variances at N = 3.6M through the stack: $COUNTS =="
    # Best of 2: a worker's first read of a dataset writes its decoded copy (store/datasets.py), and the stacks
    # share one data directory: every row is timed with the copies in place (the first job's time is logged).
    timeout 590 python3 bench/scaling_bench.py --kind sccs_cv --gpus $COUNTS --repeats 2 --data-dir var/scaling-sccs \
      2> "$OUT/sccs_stack.log" | tee "$OUT/sccs_table.md"
    grep -E "a job:|worker\(s\)" "$OUT/sccs_stack.log" | cut -c1-400 ;;
  sccsboot)
    echo "== sccs_fit 200 bootstrap replicates at N = 3.6M through the stack: $COUNTS =="
    timeout 590 python3 bench/scaling_bench.py --kind sccs_bootstrap --gpus $COUNTS --repeats 2 \
      --data-dir var/scaling-sccs 2> "$OUT/sccsboot_stack.log" | tee "$OUT/sccsboot_table.md"
    grep -E "a job:|worker\(s\)" "$OUT/sccsboot_stack.log" | cut -c1-400 ;;
  sccsanalyses)
    echo "== sccs_analyses GPU tests (fixed-order sums, any group of analyses) =="
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfEs --timeout 150 \
      tests/kernels/sccs/test_sccs_analyses_gpu.py 2>&1 | tail -4
    echo "== sccs_analyses of all 1,428 drugs at N = 3.6M through the stack: $COUNTS =="
    # The default GPUEST_FANOUT_MIN_ANALYSIS_ROWS (2 x 10^8) keeps these 95M-row tables whole: split them anyway to
    # time the split itself.
    GPUEST_FANOUT_MIN_ANALYSIS_ROWS=1 timeout 400 python3 bench/scaling_bench.py --kind sccs_analyses --gpus $COUNTS --repeats 2 \
      --data-dir var/scaling-sccs 2> "$OUT/sccsanalyses_stack.log" | tee "$OUT/sccsanalyses_table.md"
    grep -E "a job:|worker\(s\)" "$OUT/sccsanalyses_stack.log" | cut -c1-400 ;;
  esac
done
