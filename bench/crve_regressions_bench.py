"""Benchmarks of issue 14: several fixed effects, multiway clusters, joint hypotheses, weights, HC.

Usage (from the repository root):
    python bench/crve_regressions_bench.py --device gpu --cases twofe10m twoway1m joint10m wls10m hc10m
    python bench/crve_regressions_bench.py --device cpu --cases twofe10m --n-obs 1000000   # NumPy, smaller
    python bench/crve_regressions_bench.py --cases pyfixest --n-obs 1000000                   # the peer, CPU

Cases (the issue's speed goals; time of ``wild_cluster_bootstrap`` with the data on the device, B = 9,999, WCR
Rademacher, the second of --repeats runs after a warm-up that compiles the kernels):
- twofe10m: y ~ x1 + x2 + x3 | firm + year, N = 10^7, 10^5 firms nested in G = 1,000 clusters (states), 1,000
  years crossing them; goal < 50 ms including demeaning. Without and with the confidence interval.
- twoway1m: y ~ x1 + x2 + x3, N = 10^6, clusters state (1,000) and year (50), bootstrap by year; goal < 20 ms.
- joint10m: y ~ x1 + ... + x4, N = 10^7, G = 1,000, H0: x1 = 0, x2 = 0, x3 = 0 by the bootstrap Wald; < 20 ms.
- wls10m: twofe10m with regression weights.
- rwolf1m: Romano-Wolf over 20 hypotheses x_j = 0 of y ~ x1 + ... + x20, N = 10^6, G = 1,000 (issue 18's
  goal: < 200 ms), the family on shared draws and the stepdown adjustment.
- wcr33_10m: WCR33 (jackknife residuals, CRV3 in t and t*; also WCR31 and WCR13), N = 10^7, G = 1,000,
  B = 9,999 (issue 18's goal: < 50 ms).
- iv1m: IV by the WRE bootstrap, y ~ w1 | y2 ~ z1 + z2, N = 10^6, G = 1,000, B = 9,999 (issue 18: < 50 ms).
- hc10m: y ~ x1 + x2 + x3 with weights, no clusters (the heteroskedastic wild bootstrap), N = 10^7, B = 999.
- peers18: pyfixest on this machine's CPU beside issue 18's cases: feols IV (2SLS + CRV1) and its wild
  bootstrap WCR31 (wildboottest underneath) on OLS, N = --n-obs (default 10^6), G = 1,000, B = 9,999.
- pyfixest: pyfixest's feols (demeaning and CRV1 only: its wild bootstrap takes the fixed effects as dummy
  columns, 101,000 of them here) on the twofe data at --n-obs, on this machine's CPU (the second of two calls),
  and our NumPy bootstrap on the same data.
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

from kernels.backend import synchronize, to_host
from kernels.context import local_context
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.hypothesis import parse_restrictions


def panel(xp: Any, n_obs: int, n_firms: int, n_states: int, n_years: int, k: int, seed: int = 1) -> dict[str, Any]:
    """Firms nested in states, years crossing; x and y with firm, year and state effects."""
    rs = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random.RandomState(seed)
    firm = xp.arange(n_obs, dtype=xp.int64) % n_firms
    state = firm * n_states // n_firms
    year = rs.integers(0, n_years, n_obs).astype(xp.int64) if hasattr(rs, "integers") else rs.randint(0, n_years, n_obs)
    x = rs.standard_normal((n_obs, k)) + rs.standard_normal((n_states, k))[state]
    y = x @ xp.linspace(0.0, 1.0, k) + rs.standard_normal(n_firms)[firm] + rs.standard_normal(n_years)[year]
    y += rs.standard_normal(n_obs) + rs.standard_normal(n_states)[state]
    weights = 0.5 + rs.random(n_obs)
    return {"x": xp.ascontiguousarray(x), "y": y, "firm": firm, "state": state, "year": year, "weights": weights}


def timed(xp: Any, data: BootstrapData, options: BootstrapOptions, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        ctx = local_context(xp=xp)
        synchronize(xp)
        start = time.perf_counter()
        outcome = wild_cluster_bootstrap(xp, data, options, timer=ctx.timer)
        synchronize(xp)
        runs.append((time.perf_counter() - start, ctx.timer.as_dict(), outcome))
    best = min(runs, key=lambda run: run[0])
    outcome = best[2]
    return {
        "seconds": best[0],
        "seconds_all": [run[0] for run in runs],
        "stages": best[1],
        "p_values": outcome.p_values,
        "statistic": outcome.wald_stat if outcome.wald_stat is not None else outcome.t_stat,
        "conf_int": outcome.conf_int,
        "demeaning": outcome.demeaning,
        "n_obs": outcome.n_obs,
        "reps_used": outcome.reps_used,
    }


def with_and_without_ci(xp: Any, data: BootstrapData, repeats: int) -> dict[str, Any]:
    """The test of x2 = 0 timed without and with the confidence interval by inversion."""
    out = {}
    for label, conf_int in (("without_ci", False), ("with_ci", True)):
        options = BootstrapOptions(param=1, reps=9_999, conf_int=conf_int, seed=7, block_elements=64_000_000)
        out[label] = timed(xp, data, options, repeats)
    return out


def names(k: int) -> list[str]:
    return [f"x{j + 1}" for j in range(k)]


def case_twofe(xp: Any, n_obs: int, repeats: int, weighted: bool) -> dict[str, Any]:
    k = 3
    columns = panel(xp, n_obs, n_obs // 100, 1_000, 1_000, k)
    data = BootstrapData(
        x=columns["x"], y=columns["y"], cluster=columns["state"], n_clusters=1_000,
        fe=columns["firm"], n_fe=n_obs // 100, more_fe=[(columns["year"], 1_000)], names=names(k),
        weights=columns["weights"] if weighted else None, fe_names=["firm", "year"],
    )  # fmt: skip
    out = {"n_obs": n_obs, "firms": n_obs // 100, "states": 1_000, "years": 1_000, "k": k, "reps": 9_999}
    return out | with_and_without_ci(xp, data, repeats)


def case_twoway(xp: Any, n_obs: int, repeats: int) -> dict[str, Any]:
    k = 3
    columns = panel(xp, n_obs, 1_000, 1_000, 50, k)
    data = BootstrapData(
        x=columns["x"], y=columns["y"], cluster=columns["state"], n_clusters=1_000,
        more_clusters=[(columns["year"], 50)], names=names(k), cluster_names=["state", "year"],
    )  # fmt: skip
    out = {"n_obs": n_obs, "clusters": [1_000, 50], "bootcluster": "year", "k": k, "reps": 9_999}
    return out | with_and_without_ci(xp, data, repeats)


def case_joint(xp: Any, n_obs: int, repeats: int) -> dict[str, Any]:
    k = 4
    columns = panel(xp, n_obs, 1_000, 1_000, 10, k)
    data = BootstrapData(x=columns["x"], y=columns["y"], cluster=columns["state"], n_clusters=1_000, names=names(k))
    restrictions = parse_restrictions(["x1 = 0", "x2 = 0", "x3 = 0"], names(k))
    options = BootstrapOptions(restrictions=restrictions, reps=9_999, seed=7, block_elements=64_000_000)
    return {"n_obs": n_obs, "clusters": 1_000, "k": k, "restrictions": 3, "reps": 9_999,
            "result": timed(xp, data, options, repeats)}  # fmt: skip


def case_rwolf(xp: Any, n_obs: int, repeats: int) -> dict[str, Any]:
    """Romano-Wolf over 20 hypotheses (issue 18): 20 regressors, one-way clusters, the family on shared draws."""
    from kernels.context import local_context as context
    from kernels.crve.bootstrap import wild_bootstrap_family
    from kernels.crve.inference import romano_wolf_p_values

    k = 20
    columns = panel(xp, n_obs, 1_000, 1_000, 10, k)
    data = BootstrapData(x=columns["x"], y=columns["y"], cluster=columns["state"], n_clusters=1_000, names=names(k))
    family = [parse_restrictions([f"x{j + 1} = 0"], names(k)) for j in range(k)]
    options = BootstrapOptions(reps=9_999, seed=7, conf_int=False, block_elements=64_000_000)
    runs = []
    for _ in range(repeats):
        ctx = context(xp=xp)
        synchronize(xp)
        start = time.perf_counter()
        outcomes = wild_bootstrap_family(xp, data, options, family, timer=ctx.timer)
        adjusted = romano_wolf_p_values(np.array([o.t_stat for o in outcomes]),
                                        np.column_stack([o.t_boot for o in outcomes]))  # fmt: skip
        runs.append((time.perf_counter() - start, ctx.timer.as_dict(), adjusted))
    best = min(runs, key=lambda run: run[0])
    return {"n_obs": n_obs, "clusters": 1_000, "k": k, "hypotheses": k, "reps": 9_999,
            "result": {"seconds": best[0], "seconds_all": [run[0] for run in runs], "stages": best[1],
                       "p_values": {"romano-wolf min": float(best[2].min()), "max": float(best[2].max())}}}


def case_wcr33(xp: Any, n_obs: int, repeats: int) -> dict[str, Any]:
    """WCR33 (issue 18): jackknife residuals and CRV3 in t and t*, N = 10^7, G = 1,000, k = 3, B = 9,999."""
    k = 3
    columns = panel(xp, n_obs, 1_000, 1_000, 10, k)
    data = BootstrapData(x=columns["x"], y=columns["y"], cluster=columns["state"], n_clusters=1_000, names=names(k))
    out = {"n_obs": n_obs, "clusters": 1_000, "k": k, "reps": 9_999}
    for variant in ("33", "31", "13"):
        options = BootstrapOptions(param=1, reps=9_999, seed=7, conf_int=False, bootstrap_type=variant,
                                   block_elements=64_000_000)  # fmt: skip
        out["result" if variant == "33" else f"wcr{variant}"] = timed(xp, data, options, repeats)
    return out


def case_iv(xp: Any, n_obs: int, repeats: int) -> dict[str, Any]:
    """IV by the WRE bootstrap (issue 18): y ~ w1 | y2 ~ z1 + z2, N = 10^6, G = 1,000, B = 9,999; < 50 ms."""
    from kernels.crve.iv import IvData, iv_wre_bootstrap

    columns = panel(xp, n_obs, 1_000, 1_000, 10, 4)
    x = columns["x"]
    y2 = x[:, 2] + 0.5 * x[:, 3] + 0.3 * columns["y"]  # endogenous: correlated with y's error
    y = 1.0 + 0.5 * y2 + x[:, 1] + columns["y"]
    exogenous = xp.stack([xp.ones(n_obs), x[:, 1]], axis=1)
    data = IvData(y=y, exogenous=exogenous, endogenous=y2, instruments=x[:, 2:], cluster=columns["state"],
                  n_clusters=1_000)  # fmt: skip
    runs = []
    for _ in range(repeats):
        synchronize(xp)
        start = time.perf_counter()
        outcome = iv_wre_bootstrap(xp, data, r=0.5, reps=9_999, weights_type="rademacher", seed=7)
        synchronize(xp)
        runs.append((time.perf_counter() - start, outcome))
    best = min(runs, key=lambda run: run[0])
    return {"n_obs": n_obs, "clusters": 1_000, "instruments": 2, "reps": 9_999,
            "result": {"seconds": best[0], "seconds_all": [run[0] for run in runs], "stages": {},
                       "p_values": best[1].p_values, "first_stage_f": best[1].first_stage_f}}  # fmt: skip


def case_hc(xp: Any, n_obs: int, repeats: int, reps: int) -> dict[str, Any]:
    k = 3
    columns = panel(xp, n_obs, 1_000, 1_000, 10, k)
    data = BootstrapData(x=columns["x"], y=columns["y"], cluster=None, names=names(k), weights=columns["weights"])
    options = BootstrapOptions(param=1, reps=reps, seed=7, conf_int=False, block_elements=64_000_000)
    return {"n_obs": n_obs, "k": k, "reps": reps, "result": timed(xp, data, options, repeats)}


def case_pyfixest(n_obs: int) -> dict[str, Any]:
    import warnings

    import pandas as pd
    import pyfixest

    columns = panel(np, n_obs, n_obs // 100, 1_000, 1_000, 3)
    frame = pd.DataFrame(columns["x"], columns=names(3))
    frame["y"], frame["firm"], frame["year"], frame["state"] = (columns[c] for c in ("y", "firm", "year", "state"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds = []
        for _ in range(2):  # the second call is timed: the first pays one-time set-up
            start = time.perf_counter()
            fit = pyfixest.feols("y ~ x1 + x2 + x3 | firm + year", data=frame, vcov={"CRV1": "state"})
            seconds.append(time.perf_counter() - start)
    ours = case_twofe(np, n_obs, 1, False)["without_ci"]
    return {"n_obs": n_obs, "pyfixest_feols_seconds": seconds[-1], "pyfixest_feols_first_seconds": seconds[0],
            "pyfixest_version": pyfixest.__version__, "pyfixest_se_x2": float(fit.se()["x2"]),
            "numpy_bootstrap_seconds": ours["seconds"], "numpy_stages": ours["stages"],
            "cores": os.cpu_count()}  # fmt: skip


def _pyfixest_rwolf(pyfixest: Any, frame: Any) -> Any:
    """pyfixest's rwolf adjusts one parameter over several models: 20 outcomes y_j = y + j e, each on w1 + z1,
    param z1 (the closest it comes to 20 hypotheses in one job), B = 9,999 shared draws."""
    models = []
    for j in range(20):
        frame[f"y_{j}"] = frame["y"] + 0.1 * j * frame["e"]
        models.append(pyfixest.feols(f"y_{j} ~ w1 + z1", data=frame, vcov={"CRV1": "g"}))
    return pyfixest.rwolf(models, "z1", reps=9_999, seed=7)


def case_peers18(n_obs: int) -> dict[str, Any]:
    """pyfixest on the CPU beside issue 18's cases: feols IV (2SLS + CRV1) and its wild bootstrap WCR31 on OLS."""
    import warnings

    import pandas as pd
    import pyfixest

    columns = panel(np, n_obs, 1_000, 1_000, 10, 4)
    x = columns["x"]
    frame = pd.DataFrame({"y2": x[:, 2] + 0.5 * x[:, 3] + 0.3 * columns["y"], "w1": x[:, 1], "z1": x[:, 2],
                          "z2": x[:, 3], "g": columns["state"], "e": columns["y"]})  # fmt: skip
    frame["y"] = 1.0 + 0.5 * frame["y2"] + frame["w1"] + frame["e"]
    out: dict[str, Any] = {"n_obs": n_obs, "pyfixest_version": pyfixest.__version__, "cores": os.cpu_count()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, run in (
            ("feols_iv_seconds", lambda: pyfixest.feols("y ~ w1 | y2 ~ z1 + z2", data=frame, vcov={"CRV1": "g"})),
            ("wildboottest_31_seconds", lambda: pyfixest.feols("y ~ w1 + z1", data=frame, vcov={"CRV1": "g"})
             .wildboottest(param="z1", reps=9_999, seed=7, bootstrap_type="31")),
            ("rwolf_20_models_seconds", lambda: _pyfixest_rwolf(pyfixest, frame)),
        ):  # fmt: skip
            run()  # the first call pays one-time set-up
            start = time.perf_counter()
            run()
            out[label] = time.perf_counter() - start
    return out


def warm_up(xp: Any) -> None:
    """Compile the kernels outside the timing: a tiny bootstrap with two fixed effects and two-way clusters."""
    warm = panel(xp, 20_000, 200, 20, 30, 3)
    wild_cluster_bootstrap(xp, BootstrapData(warm["x"], warm["y"], warm["state"], 20, fe=warm["firm"], n_fe=200,
                                             more_fe=[(warm["year"], 30)], more_clusters=[(warm["year"], 30)]),
                           BootstrapOptions(param=1, reps=99))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--cases", nargs="+", default=["twofe10m", "twoway1m", "joint10m"])
    parser.add_argument("--n-obs", type=int, default=None, help="override N of the 10^7 cases")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cases": {}}
    if not set(args.cases) <= {"pyfixest", "peers18"}:
        ctx = local_context(args.device)
        xp = ctx.xp
        report["device"] = ctx.device
        warm_up(xp)
    big = args.n_obs or 10_000_000
    for case in args.cases:
        started = time.perf_counter()
        if case == "twofe10m":
            result = case_twofe(xp, big, args.repeats, weighted=False)
        elif case == "wls10m":
            result = case_twofe(xp, big, args.repeats, weighted=True)
        elif case == "twoway1m":
            result = case_twoway(xp, args.n_obs or 1_000_000, args.repeats)
        elif case == "joint10m":
            result = case_joint(xp, big, args.repeats)
        elif case == "rwolf1m":
            result = case_rwolf(xp, args.n_obs or 1_000_000, args.repeats)
        elif case == "wcr33_10m":
            result = case_wcr33(xp, big, args.repeats)
        elif case == "iv1m":
            result = case_iv(xp, args.n_obs or 1_000_000, args.repeats)
        elif case == "hc10m":
            result = case_hc(xp, big, args.repeats, 999)
        elif case == "peers18":
            result = case_peers18(args.n_obs or 1_000_000)
        elif case == "pyfixest":
            result = case_pyfixest(args.n_obs or 1_000_000)
        else:
            raise SystemExit(f"unknown case {case}")
        result["case_wall_seconds"] = time.perf_counter() - started
        report["cases"][case] = result
        print(json.dumps({case: result}, default=lambda o: to_host(o).tolist() if hasattr(o, "shape") else str(o)))
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
