"""Many single-exposure SCCS analyses in one batch (issue 15, item 4: "500 exposure-outcome pairs sharing one
outcome's era build at N = 115,000: < 60 s, with the CPU time of one pair alongside").

Synthetic Cyclops data of the paper's smallest size with 500 drugs (``kernels/sccs/synthetic.py``, seed 3,
generated on the device it is timed on), then :func:`kernels.sccs.analyses.single_covariate_fits` of all 500
covariates (estimate, 95 % likelihood-ratio interval, p) and of one covariate alone; then the empirical
calibration of the 500 from the first 100 drugs taken as negative controls (host). Each timing is the best of
three after one warm-up run, device-synchronised. Prints ``RESULT {json}`` per backend: NumPy always, CuPy when
a GPU is usable. The era build is not timed here (``bench/sccs_study_eras.py`` times it).

``same_bits_twice`` says whether two runs of the batch gave the same bytes (estimates, interval ends, log-likelihood
ratios): on NumPy always; on the GPU only where every sum is added in a fixed order.

Usage: ``PYTHONPATH=. python3 bench/sccs_analyses_bench.py [--cases 115000] [--drugs 500] [--backends numpy cupy]``
(the SCCS paper's largest size: ``--cases 3600000 --drugs 1428 --min-eras 11 --max-eras 31 --backends cupy``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from scipy import stats

from kernels.backend import device_label
from kernels.sccs import calibration as cal
from kernels.sccs import synthetic
from kernels.sccs.analyses import single_covariate_fits


def _best_of(xp: ModuleType, run: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    result = run()  # warm-up: kernel compiles, pools
    best = float("inf")
    for _ in range(repeats):
        if hasattr(xp, "cuda"):
            xp.cuda.Device().synchronize()
        start = time.perf_counter()
        result = run()
        if hasattr(xp, "cuda"):
            xp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def _bytes(fits: Any) -> bytes:
    return b"".join(np.ascontiguousarray(getattr(fits, name)).tobytes()
                    for name in ("estimate", "lower", "upper", "log_likelihood_ratio"))


def measure(xp: ModuleType, n_cases: int, n_drugs: int, eras: dict[str, int]) -> dict[str, Any]:
    data = synthetic.generate(xp, n_cases, n_drugs, seed=3, effect_share=0.1, **eras).data
    every = np.arange(n_drugs)
    first = single_covariate_fits(data, every)
    batch_seconds, fits = _best_of(xp, lambda: single_covariate_fits(data, every))
    one_seconds, _ = _best_of(xp, lambda: single_covariate_fits(data, every[:1]))
    z = stats.norm.ppf(0.975)
    se = (fits.upper - fits.lower) / (2 * z)
    negative = np.arange(n_drugs) < 100
    calibration_seconds, _ = _best_of(np, lambda: cal.calibrate(fits.estimate, se, negative,
                                                                 np.full(n_drugs, np.nan)))
    return {"device": device_label(xp), "n_cases": n_cases, "n_eras": data.n_eras, "nnz": data.nnz,
            "analyses": n_drugs, "batch_seconds": round(batch_seconds, 4), "one_analysis_seconds":
            round(one_seconds, 4), "calibration_seconds": round(calibration_seconds, 4),
            "infinite_estimates": int(np.isinf(fits.estimate).sum()), "same_bits_twice": _bytes(first) == _bytes(fits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=115_000)
    parser.add_argument("--drugs", type=int, default=500)
    parser.add_argument("--min-eras", type=int, default=None, help="eras per case, least (synthetic's default)")
    parser.add_argument("--max-eras", type=int, default=None, help="eras per case, most")
    parser.add_argument("--backends", nargs="+", choices=["numpy", "cupy"], default=["numpy", "cupy"])
    args = parser.parse_args()
    eras = {name: value for name, value in (("min_eras", args.min_eras), ("max_eras", args.max_eras))
            if value is not None}
    if "numpy" in args.backends:
        print("RESULT " + json.dumps(measure(np, args.cases, args.drugs, eras)), flush=True)
    if "cupy" not in args.backends:
        return
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no usable GPU: NumPy only
        return
    print("RESULT " + json.dumps(measure(cupy, args.cases, args.drugs, eras)), flush=True)


if __name__ == "__main__":
    main()
