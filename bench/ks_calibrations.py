"""Krusell-Smith on the calibrations users bring, side by side with HARK (econ-ark) where it solves the same one.

    python bench/ks_calibrations.py                       # DHJJ 2010 and KS 1998 (ks1998 preset), default sizes
    python bench/ks_calibrations.py --periods 11000 --burn-in 1000 --hark hark_result.json

Each row: ``ks_solve`` (NumPy or the GPU, whatever GPUEST_DEVICE picks) with the EGM policy step, its ALM
ln K' = b0 + b1 ln K per state, mean K, and the same panel's regression in HARK's form ln A_t = c0 + c1 ln M_t
(HARK's KrusellSmithEconomy fits aggregate savings A_t = K_{t+1} on market resources M_t = (1 - delta) K_t + Y_t,
not K' on K). ``--hark FILE`` reads HARK's own numbers (written by bench/ks_hark.py: its AFunc, and ln K' on
ln K and mean K from its simulated history).
Prints a Markdown table, then one JSON line per row.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernels.context import local_context, run_kind
from kernels.ks.jobs import KS_SOLVE
from kernels.ks.model import Calibration
from kernels.ks.spec import KSSolveParams
from kernels.progress import LocalProgress


def hark_form(capital: np.ndarray, states: np.ndarray, cal: Calibration, burn_in: int) -> list[list[float]]:
    """OLS of ln K_{t+1} on ln M_t by the state of t, M_t = (1 - delta) K_t + z_t K_t^alpha L_t^(1 - alpha)."""
    z, labour = cal.productivity[states], cal.labour[states]
    market = (1.0 - cal.delta) * capital + z * capital**cal.alpha * labour ** (1.0 - cal.alpha)
    x, y, s = np.log(market[burn_in:-1]), np.log(capital[burn_in + 1:]), states[burn_in:-1]
    rows = []
    for state in (0, 1):
        slope, intercept = np.polyfit(x[s == state], y[s == state], 1)
        rows.append([float(intercept), float(slope)])
    return rows


def solve_row(name: str, params: dict) -> dict:
    progress = LocalProgress()
    ctx = local_context(progress=progress)
    spec = KSSolveParams.model_validate(params)
    start = time.perf_counter()
    result = run_kind(KS_SOLVE, spec, ctx)
    seconds = time.perf_counter() - start
    path = progress.artifacts["capital_path"]
    cal = spec.calibration.to_calibration()
    return {"row": name, "device": result["device"], "seconds": seconds, "converged": result["converged"],
            "iterations": result["iterations"], "policy_steps": int(sum(result["policy_iterations"])),
            "alm": [[result["alm"][s]["intercept"], result["alm"][s]["slope"]] for s in ("bad", "good")],
            "r2": [result["alm"][s]["r2"] for s in ("bad", "good")], "mean_K": result["mean_capital"],
            "hark_form": hark_form(np.asarray(path["K"]), np.asarray(path["a"]).astype(int), cal, spec.burn_in),
            "n_agents": spec.n_agents, "periods": spec.periods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-agents", type=int, default=10_000)
    parser.add_argument("--periods", type=int, default=1_100)
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interpolation", choices=["bilinear", "catmull_rom", "cubic"], default="catmull_rom")
    parser.add_argument("--hark", help="JSON of HARK's run (AFunc_intercept/slope, K_on_K, mean_K, seconds)")
    args = parser.parse_args()
    common = {"n_agents": args.n_agents, "periods": args.periods, "burn_in": args.burn_in, "seed": args.seed,
              "interpolation": args.interpolation, "policy_method": "egm", "den_haan_periods": 0}
    rows = [solve_row("DHJJ 2010 (defaults), ks_solve", common),
            solve_row("KS 1998 (preset ks1998), ks_solve", {**common, "calibration": {"preset": "ks1998"}})]
    fmt = "{:.4f} + {:.4f} ln x"
    print("| run | ln K' on ln K: bad | good | ln A on ln M (HARK's form): bad | good | mean K | outer it. | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['row']}, N = {row['n_agents']:,}, T = {row['periods']:,} | {fmt.format(*row['alm'][0])} | "
              f"{fmt.format(*row['alm'][1])} | {fmt.format(*row['hark_form'][0])} | {fmt.format(*row['hark_form'][1])} "
              f"| {row['mean_K']:.3f} | {row['iterations']} | {row['seconds']:.1f} |")
    if args.hark:
        with open(args.hark) as handle:
            hark = json.load(handle)
        print(f"| HARK {hark.get('version', '')} KrusellSmithEconomy defaults, N = {hark['AgentCount']:,}, "
              f"T = {hark['act_T']:,} | {fmt.format(*hark['K_on_K']['bad'])} | {fmt.format(*hark['K_on_K']['good'])} | "
              f"{fmt.format(hark['AFunc_intercept'][0], hark['AFunc_slope'][0])} | "
              f"{fmt.format(hark['AFunc_intercept'][1], hark['AFunc_slope'][1])} | {hark['mean_K']:.3f} | "
              f"{hark.get('loops', '')} | {hark['seconds']:.0f} |")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
