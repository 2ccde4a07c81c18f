"""CRVE benchmarks: the wild cluster bootstrap and the Monte Carlo, GPU and NumPy, with floors and peers.

Usage (from the repository root):
    python bench/crve_bench.py --device gpu --cases boot10m boot1m mc mcwcr --json out.json
    python bench/crve_bench.py --device cpu --cases boot1m_g1000 mc mcwcr_g50 --mc-reps 1000
    python bench/crve_bench.py --device cpu --cases peers        # wildboottest on the same data (CPU)

Cases (issue 3):
- boot10m: N = 10,000,000, k = 8, G = 1,000, B = 9,999, WCR Rademacher, with and without the CI; the time
  of ``wild_cluster_bootstrap`` with the data already on the device, against the floor of one pass over the
  data at the HBM bandwidth plus a dense G x G x B product at the FP64 tensor peak.
- boot1m: N = 1,000,000, k = 8, G in (50, 1,000, 20,000), B = 9,999.
- mc: crve_montecarlo CRV1, R = 50,000, G = 100, m = 32, k = 8 (the paper's Figure 4 case).
- mcwcr: R = 1,000 WCR bootstrap tests with B = 999 at G = 10, 20, 30, 40, 50 (m = 32, k = 8).
- boot1m_g1000, mcwcr_g50, and mc with --mc-reps 1000: the same on NumPy at sizes a CPU finishes (Monte Carlo R
  scaled down: the time per replication is constant, so the R = 50,000 figure is extrapolated linearly and
  labelled so).
- peers: wildboottest (numba, "fast and wild" with a Python double loop over cluster pairs) on N = 1,000,000,
  G = 1,000, B = 9,999, the same data as boot1m, and our NumPy path on it.
- examples: each CRVE job kind's example as the worker runs it (``run_kind`` in a fresh context), the second
  of two runs (the first compiles on a GPU).

Every timed run gets its own run context (``kernels.context.local_context``): its stage timer is the one a job
reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from kernels.backend import is_numpy, synchronize, to_host
from kernels.context import local_context, run_kind
from kernels.crve import montecarlo as mc
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.jobs import KINDS
from kernels.crve.synthetic import synthetic_columns

GENERATE_ON: Any = np  # the namespace that draws the synthetic data (--generate-on-gpu)
H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM5 HBM3 peak
H100_FP64_TENSOR_FLOPS = 67e12  # H100 SXM5 FP64 tensor-core peak


def clustered_data(xp: Any, n_obs: int, n_clusters: int, k: int, seed: int = 1) -> BootstrapData:
    columns = synthetic_columns(xp, n_obs, n_clusters, k - 1, seed)
    x = xp.stack([xp.ones(n_obs)] + [columns[f"x{j}"] for j in range(1, k)], axis=1)
    return BootstrapData(x=x, y=columns["y"], cluster=columns["cluster"], n_clusters=n_clusters)


def time_bootstrap(xp: Any, data: BootstrapData, reps: int, conf_int: bool, repeats: int) -> dict[str, Any]:
    options = BootstrapOptions(param=1, reps=reps, conf_int=conf_int, seed=7, block_elements=64_000_000)
    runs = []
    outcome = None
    for _ in range(repeats):
        ctx = local_context(xp=xp)
        synchronize(xp)
        start = time.perf_counter()
        outcome = wild_cluster_bootstrap(xp, data, options, timer=ctx.timer)
        synchronize(xp)
        runs.append((time.perf_counter() - start, ctx.timer.as_dict()))
    best = min(runs, key=lambda run: run[0])
    return {
        "seconds": best[0],
        "seconds_all": [run[0] for run in runs],
        "stages": best[1],
        "p_value": outcome.p_values["two-tailed"],
        "conf_int": outcome.conf_int,
        "t_stat": outcome.t_stat,
    }


def floor_seconds(n_obs: int, k: int, n_clusters: int, reps: int) -> dict[str, float]:
    one_pass = n_obs * (k + 2) * 8 / H100_HBM_BYTES_PER_S  # x (k), y, int64 cluster codes
    product = 2.0 * n_clusters * n_clusters * reps / H100_FP64_TENSOR_FLOPS
    return {"one_pass": one_pass, "gxgxb_product": product, "total": one_pass + product}


def case_bootstrap(xp: Any, n_obs: int, n_clusters: int, k: int, reps: int, repeats: int) -> dict[str, Any]:
    if not is_numpy(xp) or is_numpy(GENERATE_ON):
        data = clustered_data(xp, n_obs, n_clusters, k)
    else:  # the same numbers, drawn faster on the GPU, then moved to the host
        data = clustered_data(GENERATE_ON, n_obs, n_clusters, k)
        data = BootstrapData(x=to_host(data.x), y=to_host(data.y), cluster=to_host(data.cluster), n_clusters=n_clusters)
    synchronize(xp)
    if not is_numpy(xp):  # compile the kernels once, outside the timing
        wild_cluster_bootstrap(xp, clustered_data(xp, 5000, 50, k), BootstrapOptions(param=1, reps=99))
    result = {"n_obs": n_obs, "n_clusters": n_clusters, "k": k, "reps": reps}
    result["with_ci"] = time_bootstrap(xp, data, reps, True, repeats)
    result["without_ci"] = time_bootstrap(xp, data, reps, False, repeats)
    floor = floor_seconds(n_obs, k, n_clusters, reps)
    result["floor"] = floor
    result["ratio_to_floor_without_ci"] = result["without_ci"]["seconds"] / floor["total"]
    result["ratio_to_floor_with_ci"] = result["with_ci"]["seconds"] / floor["total"]
    return result


def case_montecarlo(xp: Any, replications: int, n_clusters: int, m: int, k: int, bootstrap_reps: int | None) -> dict:
    design = mc.Design(n_clusters, m, k, seed=11)
    crit = None if bootstrap_reps else mc.critical_values("t", n_clusters)

    def once(reps: int) -> tuple[float, Any, dict]:
        ctx = local_context(xp=xp)
        synchronize(xp)
        start = time.perf_counter()
        summary, _ = mc.simulate(
            xp, design, replications=reps, test_coefficient=1, ssc=True, critical=crit,
            bootstrap_reps=bootstrap_reps, weights_type="rademacher", report=ctx.progress, timer=ctx.timer,
        )  # fmt: skip
        synchronize(xp)
        return time.perf_counter() - start, summary, ctx.timer.as_dict()

    if not is_numpy(xp):
        once(min(replications, 64))  # compile
    seconds, summary, stages = once(replications)
    return {
        "replications": replications,
        "n_clusters": n_clusters,
        "m": m,
        "k": k,
        "bootstrap_reps": bootstrap_reps,
        "seconds": seconds,
        "stages": stages,
        "rejection_rate": {f"{a:.2f}": v for a, v in summary.rejection_rate.items()},
        "se_ratio": summary.mean_se / summary.sd_estimate,
    }


def case_peers(n_obs: int = 1_000_000, n_clusters: int = 1_000, reps: int = 9_999) -> dict[str, Any]:
    from wildboottest.wildboottest import WildboottestCL

    data = clustered_data(np, n_obs, n_clusters, 8)
    restriction = np.zeros(8)
    restriction[1] = 1.0
    start = time.perf_counter()
    boot = WildboottestCL(X=data.x, Y=data.y, cluster=data.cluster, R=restriction, B=reps, seed=7)
    boot.get_scores(bootstrap_type="11", impose_null=True)
    boot.get_weights("rademacher")
    boot.get_numer()
    boot.get_denom()
    boot.get_tboot()
    boot.get_vcov()
    boot.get_tstat()
    boot.get_pvalue("two-tailed")
    peer_seconds = time.perf_counter() - start
    ours = time_bootstrap(np, data, reps, False, 1)
    return {
        "n_obs": n_obs,
        "n_clusters": n_clusters,
        "reps": reps,
        "wildboottest_seconds": peer_seconds,
        "wildboottest_p": float(boot.pvalue),
        "numpy_seconds_without_ci": ours["seconds"],
        "numpy_p": ours["p_value"],
    }


def case_examples(xp: Any) -> dict[str, Any]:
    """Each kind's example through ``run_kind``: the seconds of the second run and its stage timings."""
    results = {}
    for kind in KINDS:
        for _ in range(2):
            ctx = local_context(xp=xp, datasets=kind.example.frames())
            start = time.perf_counter()
            result = run_kind(kind, kind.example.params, ctx)
            seconds = time.perf_counter() - start
        results[kind.name] = {"seconds": seconds, "params": dict(kind.example.params), "stages": result["timings"]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--cases", nargs="+", default=["boot10m", "boot1m", "mc", "mcwcr"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mc-reps", type=int, default=50_000, help="R of the mc case")
    parser.add_argument("--json", default=None)
    parser.add_argument("--generate-on-gpu", action="store_true", help="CPU runs: draw the data on the GPU")
    args = parser.parse_args()
    global GENERATE_ON
    if args.generate_on_gpu:
        GENERATE_ON = local_context("gpu").xp
    ctx = local_context(args.device)
    xp = ctx.xp
    report: dict[str, Any] = {"device": ctx.device, "date": time.strftime("%Y-%m-%d"), "cases": {}}
    cases = report["cases"]
    for case in args.cases:
        started = time.perf_counter()
        if case == "boot10m":
            cases[case] = case_bootstrap(xp, 10_000_000, 1_000, 8, 9_999, args.repeats)
        elif case == "boot1m":
            for g in (50, 1_000, 20_000):
                cases[f"boot1m_g{g}"] = case_bootstrap(xp, 1_000_000, g, 8, 9_999, args.repeats)
        elif case == "boot1m_g1000":
            cases[case] = case_bootstrap(xp, 1_000_000, 1_000, 8, 9_999, 1)
        elif case == "mc":
            cases[case] = case_montecarlo(xp, args.mc_reps, 100, 32, 8, None)
        elif case == "mcwcr_g50":
            cases[case] = case_montecarlo(xp, 1_000, 50, 32, 8, 999)
        elif case == "mcwcr":
            for g in (10, 20, 30, 40, 50):
                cases[f"mcwcr_g{g}"] = case_montecarlo(xp, 1_000, g, 32, 8, 999)
        elif case == "peers":
            cases[case] = case_peers()
        elif case == "examples":
            for name, value in case_examples(xp).items():
                cases[f"examples_{name}"] = value
        else:
            raise SystemExit(f"unknown case {case}")
        print(f"[{case}] done in {time.perf_counter() - started:.1f} s", flush=True)
        for name in [name for name in cases if name.startswith(case)]:
            print(name, json.dumps(cases[name], default=float), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1, default=float)
    print(f"\n== CRVE benchmark on {report['device']} ==")
    for name, value in cases.items():
        if "with_ci" in value:
            print(
                f"{name:16s} N={value['n_obs']:>10,d} G={value['n_clusters']:>6,d} B={value['reps']:,d}: "
                f"{value['without_ci']['seconds'] * 1e3:9.2f} ms (no CI), {value['with_ci']['seconds'] * 1e3:9.2f} ms "
                f"(CI); floor {value['floor']['total'] * 1e3:.3f} ms; ratio {value['ratio_to_floor_without_ci']:.1f}x"
                f" / {value['ratio_to_floor_with_ci']:.1f}x"
            )
        elif "params" in value:
            print(f"{name:16s} {value['seconds']:.3f} s {json.dumps(value['params'])}")
        elif "wildboottest_seconds" in value:
            print(
                f"{name:16s} wildboottest {value['wildboottest_seconds']:.2f} s (p={value['wildboottest_p']:.4f}), "
                f"NumPy path {value['numpy_seconds_without_ci']:.2f} s (p={value['numpy_p']:.4f})"
            )
        else:
            print(
                f"{name:16s} R={value['replications']:,d} G={value['n_clusters']} m={value['m']} k={value['k']} "
                f"B={value['bootstrap_reps']}: {value['seconds']:.3f} s, rejection {value['rejection_rate']}"
            )


if __name__ == "__main__":
    main()
