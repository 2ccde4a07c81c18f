"""Does a ``crve_bootstrap`` part's ``formula`` stage slow down when several workers parse at once (issue 19)?

On 4 GPUs each part of a fanned-out heteroskedastic bootstrap spent 1.5 s in ``formula`` against 0.45-0.6 s alone
(``bench/RESULTS.md``). This times ``design_from_formula`` on a 10^7-row frame (``hc10m``'s design: y ~ x1 + x2 +
x3 with weights, no clusters; ``PROBE_N`` rows) in 1 and in 4 processes started together, with the BLAS/OpenMP
threads left at their defaults, limited to cores / 4, or to 1 (the oversubscription hypothesis); best of 3 per
process, and each process's CPU seconds.

    PYTHONPATH=$PWD python3 bench/crve_formula_contention.py driver
"""
import json
import os
import subprocess
import sys
import time

N = int(os.environ.get("PROBE_N", 10_000_000))


def child() -> None:
    import numpy as np
    import pandas as pd

    sys.path.insert(0, os.getcwd())
    from kernels.crve.formula import design_from_formula

    rng = np.random.default_rng(int(sys.argv[2]))
    frame = pd.DataFrame({name: rng.normal(size=N) for name in ("x1", "x2", "x3")})
    frame["w"] = rng.uniform(0.5, 2.0, size=N)
    frame["y"] = frame["x1"] * 0.0 + frame["x2"] + rng.normal(size=N)
    design_from_formula(frame, "y ~ x1 + x2 + x3", [], None, "w")  # warm (imports, caches)
    print("ready", flush=True)
    sys.stdin.readline()
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        design_from_formula(frame, "y ~ x1 + x2 + x3", [], None, "w")
        seconds.append(time.perf_counter() - started)
    cpu = time.process_time()
    print(json.dumps({"seconds": seconds, "cpu": cpu}), flush=True)


def run(procs: int, env_extra: dict) -> list[dict]:
    env = {**os.environ, **env_extra}
    children = [subprocess.Popen([sys.executable, __file__, "child", str(i)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env) for i in range(procs)]
    for c in children:
        assert c.stdout.readline().strip() == "ready"
    for c in children:
        c.stdin.write("go\n")
        c.stdin.flush()
    return [json.loads(c.stdout.readline()) for c in children]


def driver() -> None:
    cores = os.cpu_count()
    print(f"cores {cores}")
    for procs in (1, 4):
        for label, extra in (("default threads", {}),
                             (f"{max(1, cores // 4)} threads", {k: str(max(1, cores // 4)) for k in (
                                 "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}),
                             ("1 thread", {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                           "MKL_NUM_THREADS")})):
            out = run(procs, extra)
            best = [min(o["seconds"]) for o in out]
            print(f"| {procs} | {label} | " + ", ".join(f"{b:.3f}" for b in best) + " | cpu "
                  + ", ".join(f"{o['cpu']:.1f}" for o in out) + " |", flush=True)


if __name__ == "__main__":
    child() if sys.argv[1] == "child" else driver()
