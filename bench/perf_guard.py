"""The performance guard: every headline workload timed in one run and compared with its baseline.

Usage (from the repository root; on the device machine the whole guard fits one call):
    python3 bench/perf_guard.py --json "$OUT/perf_guard.json"        # every workload against bench/baselines.json
    python3 bench/perf_guard.py --only crve_mc_50k ks_panel_10m_x_1000   # some rows (each runs its whole group)
    python3 bench/perf_guard.py --write-baselines bench/baselines.json --commit "$(git rev-parse --short HEAD)"
    python3 bench/perf_guard.py --quick --device cpu                   # small sizes on NumPy: the code paths only
    python3 bench/perf_guard.py --list                                 # the rows and what each one times

Each row is the best of k wall-clock times with the device synchronised, measured through the benchmark
modules' own functions after their warm-ups (kernels compiled, pools filled): the figures bench/RESULTS.md
quotes. The job rows run the real job runner (``kernels.context.run_kind``). The SCCS first-fit rows run in
fresh processes on a fresh data directory (``bench/sccs_first_fit.py``): its CUDA cache starts empty, as a new
worker's does; the rest of the guard then reads its compiled kernels from that cache.

The table gives, per row, the baseline and the present seconds, their ratio and a verdict: ``ok``, ``SLOWER``
(more than ``--tolerance`` above the baseline), ``faster`` (more than ``--tolerance`` below: a baseline to
raise), ``no baseline`` (none recorded for this device: printed, not a failure), or why the row has no time
(``skipped: ...``, ``error: ...``). Only a baseline of the same device name counts (the CUDA device's name,
e.g. "NVIDIA H200"). Exit status 1 when a row is SLOWER or a workload failed, else 0.

Baselines (``bench/baselines.json``): per device name, per row, the seconds and the commit and date they were
measured on::

    {"devices": {"NVIDIA H200": {"crve_mc_50k": {"seconds": 0.048, "commit": "1a2b3c4", "date": "2026-12-07"}}}}

``--write-baselines PATH --commit HASH`` writes this run's rows for this device into PATH (other devices and
rows not run are kept). A baseline is raised only by a commit that says why.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kernels.backend import device_label, get_namespace, is_numpy, synchronize  # noqa: E402

DEFAULT_BASELINES = ROOT / "bench" / "baselines.json"
DEFAULT_TOLERANCE = 0.15
DEFAULT_BUDGET_SECONDS = 540.0


@dataclass(frozen=True)
class Setup:
    """What every workload measures on: the namespace, the size (``quick``: small), a scratch directory."""

    xp: ModuleType
    quick: bool
    workdir: Path

    @property
    def gpu(self) -> bool:
        return not is_numpy(self.xp)


@dataclass
class Measured:
    """A workload's seconds per row, and what else it reports (convergence, iterations) for the JSON."""

    seconds: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """One measurement that gives ``rows`` (several rows share their data and warm-up)."""

    name: str
    rows: tuple[str, ...]
    figure: str
    measure: Callable[[Setup], Measured]
    gpu_only: bool = False  # no NumPy form: skipped on the CPU
    has_quick: bool = True  # a small form for --quick; without one the workload is skipped there
    fresh_process: bool = False  # runs before the others (its own processes, a fresh data directory)


@dataclass(frozen=True)
class Row:
    name: str
    baseline: float | None
    now: float | None
    verdict: str

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.now is None or self.baseline <= 0:
            return None
        return self.now / self.baseline

    @property
    def failed(self) -> bool:
        return self.verdict == "SLOWER" or self.verdict.startswith("error")


def best_of(repeats: int, run: Callable[[], float]) -> float:
    """The smallest of ``repeats`` timings (``run`` returns the seconds of one)."""
    return min(run() for _ in range(max(1, repeats)))


def timed(xp: ModuleType, work: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of ``work`` between two device synchronisations, and its value."""
    synchronize(xp)
    start = time.perf_counter()
    value = work()
    synchronize(xp)
    return time.perf_counter() - start, value


def free_device_memory(xp: ModuleType) -> None:
    """Give the memory pools' cached blocks back between workloads (a fresh-process row needs the room)."""
    gc.collect()
    if not is_numpy(xp):
        xp.get_default_memory_pool().free_all_blocks()
        xp.get_default_pinned_memory_pool().free_all_blocks()


# --- the workloads ------------------------------------------------------------------------------------------


def crve_oneway(setup: Setup) -> Measured:
    from bench import crve_bench

    n_obs, n_clusters, reps, repeats = (20_000, 50, 199, 1) if setup.quick else (10_000_000, 1_000, 9_999, 3)
    result = crve_bench.case_bootstrap(setup.xp, n_obs, n_clusters, 8, reps, repeats)
    return Measured(
        {"crve_wcb_10m_no_ci": result["without_ci"]["seconds"], "crve_wcb_10m_ci": result["with_ci"]["seconds"]},
        {"p_value": float(result["without_ci"]["p_value"]), "conf_int": result["with_ci"]["conf_int"]},
    )


def crve_twofe(setup: Setup) -> Measured:
    from bench import crve_regressions_bench as regressions

    regressions.warm_up(setup.xp)
    n_obs, repeats = (100_000, 1) if setup.quick else (10_000_000, 3)
    result = regressions.case_twofe(setup.xp, n_obs, repeats, weighted=False)
    return Measured(
        {
            "crve_wcb_twofe_10m_no_ci": result["without_ci"]["seconds"],
            "crve_wcb_twofe_10m_ci": result["with_ci"]["seconds"],
        },
        {"p_values": result["without_ci"]["p_values"], "conf_int": result["with_ci"]["conf_int"]},
    )


def crve_iv(setup: Setup) -> Measured:
    from bench import crve_regressions_bench as regressions

    regressions.case_iv(setup.xp, 20_000, 1)  # compiles the IV kernels outside the timing
    n_obs, repeats = (20_000, 1) if setup.quick else (1_000_000, 3)
    result = regressions.case_iv(setup.xp, n_obs, repeats)["result"]
    return Measured({"crve_wcb_iv_1m": result["seconds"]}, {"p_values": result["p_values"]})


def crve_montecarlo(setup: Setup) -> Measured:
    from bench import crve_bench

    replications, repeats = (200, 1) if setup.quick else (50_000, 3)
    runs = [crve_bench.case_montecarlo(setup.xp, replications, 100, 32, 8, None) for _ in range(repeats)]
    best = min(runs, key=lambda run: run["seconds"])
    return Measured({"crve_mc_50k": best["seconds"]}, {"rejection_rate": best["rejection_rate"]})


SCCS_QUICK = {"n_cases": 2_000, "n_drugs": 30, "min_eras": 11, "max_eras": 31}


def sccs_map_largest(setup: Setup) -> Measured:
    from bench import sccs_bench
    from kernels.sccs import ccd
    from kernels.sccs.model import Prior

    data, _ = sccs_bench.generate(setup.xp, SCCS_QUICK if setup.quick else sccs_bench.LARGE)
    if setup.gpu:
        reports = sccs_bench.large_fits(data, "laplace", repeats=3, cycles_only=False)
        best = min(reports, key=lambda report: report["fit_seconds"])
        details = {key: best[key] for key in ("iterations", "converged", "gradient_norm", "engine_build_seconds")}
        seconds = best["fit_seconds"]
    else:
        prior = Prior("laplace", sccs_bench.VARIANCE, np.ones(data.n_covariates, dtype=bool))
        seconds, result = timed(setup.xp, lambda: ccd.fit(data, prior))
        details = {"iterations": result.iterations, "converged": result.converged}
    details |= {"N": data.n_cases, "J": data.n_covariates, "K": data.n_eras}
    return Measured({"sccs_map_largest_laplace": seconds}, details)


def sccs_cv_bootstrap_smallest(setup: Setup) -> Measured:
    from bench import sccs_bench

    data, _ = sccs_bench.generate(setup.xp, SCCS_QUICK if setup.quick else sccs_bench.SMALL)
    runs = [sccs_bench.small_pipeline(data) for _ in range(1 if setup.quick else 2)]
    best = min(runs, key=lambda run: run["total_with_engine_builds"])
    details = {key: best[key] for key in ("chosen_variance", "cv_non_converged", "bootstrap_converged")}
    return Measured({"sccs_cv_bootstrap_smallest": best["total_with_engine_builds"]}, details)


def sccs_study(setup: Setup) -> Measured:
    from bench import sccs_study_bench as study_bench
    from kernels.sccs import cv

    cases, drugs, profiled, folds, variances, replicates = (
        (2_000, 30, 4, 3, 3, 4) if setup.quick else (115_000, 1_224, 20, 10, 10, 200)
    )
    study_bench.run(setup.xp, 600, 12, 2, 2, 2, 2, "b", ("splines",))  # the script's warm-up on tiny data
    tables, _ = study_bench.study_tables(cases, drugs)
    frames = study_bench.fit_frames(tables)
    profiled_ids = np.arange(study_bench.FIRST_DRUG_ID, study_bench.FIRST_DRUG_ID + profiled)
    grid = list(cv.DEFAULT_GRID[:: max(1, len(cv.DEFAULT_GRID) // variances)][:variances])
    params = study_bench.fit_params(tables, profiled_ids, folds, grid, replicates, "splines")
    runs = [study_bench.pipeline(setup.xp, frames, params) for _ in range(1 if setup.quick else 2)]
    best = min(runs, key=lambda run: run["seconds"])
    details = {key: best[key] for key in ("chosen_variance", "cv_non_converged", "bootstrap_converged")}
    return Measured({"sccs_study_cv_bootstrap_splines": best["seconds"]}, details)


def sccs_first_fit(setup: Setup) -> Measured:
    from bench import sccs_first_fit as first_fit

    folder = setup.workdir / "sccs_first_fit"
    shutil.rmtree(folder, ignore_errors=True)
    records = first_fit.run_all(folder, parts=False)
    shutil.rmtree(folder / "prepare-cache", ignore_errors=True)
    for name in folder.glob("*.npy"):
        name.unlink()

    def seconds(step: str, cache: str) -> float:
        for record in records:
            if record.get("step") == step and record.get("cache") == cache and "seconds" in record:
                return float(record["seconds"])
        raise RuntimeError(f"sccs_first_fit gave no {step} with the {cache} cache: {records[-1:]}")

    rows = {
        "sccs_first_fit_fresh_warm_up": seconds("warm_up", "empty"),
        "sccs_first_fit_fresh_first_job": seconds("first_job", "empty"),
        "sccs_first_fit_cached_warm_up": seconds("warm_up", "populated"),
        "sccs_first_fit_cached_first_job": seconds("first_job", "populated"),
    }
    jobs = [r for r in records if r.get("step") in ("first_job", "second_job")]
    return Measured(rows, {"converged": [r.get("converged") for r in jobs]})


def ks_panel(setup: Setup) -> Measured:
    from bench import ks_bench

    agents, periods, repeats = (2_000, 50, 1) if setup.quick else (10_000_000, 1_000, 3)
    args = ks_bench.parse_args(
        ["panel", "--n-agents", str(agents), "--periods", str(periods), "--interpolation", "catmull_rom",
         "--precision", "float64", "--repeats", str(repeats)]
    )  # fmt: skip
    result = ks_bench.bench_panel(args)
    return Measured({"ks_panel_10m_x_1000": result["seconds_best"]}, {"graph": result["graph"]})


def _ks_job(spec: Mapping[str, Any], repeats: int) -> dict[str, Any]:
    from bench import ks_bench

    return ks_bench.bench_job(ks_bench.parse_args(["job", "--repeats", str(repeats), "--spec", json.dumps(spec)]))


KS_QUICK = {"n_agents": 2_000, "periods": 200, "burn_in": 50, "tolerance": 1e-3, "max_iterations": 3,
            "policy_tolerance": 1e-4}  # fmt: skip
KS_STAGED = {"k_grid": {"size": 500}, "K_grid": {"size": 50}, "n_agents": 10_000_000, "coarse_agents": 100_000,
             "alm_update": "anderson"}  # fmt: skip


def ks_staged_solve(setup: Setup) -> Measured:
    spec = {**KS_QUICK, "coarse_agents": 1_000, "alm_update": "anderson"} if setup.quick else KS_STAGED
    result = _ks_job(spec, 1 if setup.quick else 2)
    return Measured(
        {"ks_staged_solve_500x50": result["seconds_best"]},
        {
            "converged": result["converged"],
            "iterations": result["iterations"],
            "first_seconds": result["seconds_first"],
        },
    )


def ks_default_job(setup: Setup) -> Measured:
    result = _ks_job(KS_QUICK if setup.quick else {}, 1 if setup.quick else 3)
    return Measured(
        {"ks_default_job": result["seconds_best"]},
        {
            "converged": result["converged"],
            "iterations": result["iterations"],
            "first_seconds": result["seconds_first"],
        },
    )


def dualcontrol_optimal(setup: Setup) -> Measured:
    """256^3, optimal policy, every other setting the job's default: the solve alone (the benchmark's row) and
    the whole job through the runner (its coarse error grids and state reports included)."""
    from bench import dualcontrol_bench as dual
    from kernels.context import local_context, run_kind
    from kernels.dualcontrol.spec import DualControlParams
    from kernels.registry import get_kind

    defaults = DualControlParams()
    details: dict[str, Any] = {}
    if setup.gpu:
        dual.warm_up(setup.xp, evaluations=(defaults.acceleration.evaluation,))
    size, repeats = (16, 1) if setup.quick else (256, 2)

    def solve_once() -> float:
        row, _ = dual.run_one(
            setup.xp, size, "optimal", "full", defaults.quadrature_nodes, defaults.max_iterations, np.float64,
            defaults.convergence, defaults.interpolation, defaults.acceleration.evaluation,
            defaults.acceleration.anderson_memory, golden_iterations=defaults.minimizer.golden_iterations,
        )  # fmt: skip
        details["solve_converged"], details["solve_iterations"] = row["converged"], row["iterations"]
        return row["seconds"]

    axes = {axis: {**getattr(defaults.grid, axis).model_dump(), "size": size} for axis in ("x", "mu", "sigma")}
    kind = get_kind("dualcontrol_solve")

    def job_once() -> float:
        seconds, result = timed(setup.xp, lambda: run_kind(kind, {"grid": axes}, local_context(xp=setup.xp)))
        details["job_converged"] = result["converged"]
        return seconds

    solve_seconds = best_of(repeats, solve_once)
    job_seconds = best_of(repeats, job_once)
    return Measured(
        {"dualcontrol_optimal_256_solve": solve_seconds, "dualcontrol_optimal_256_job": job_seconds}, details
    )


WORKLOADS: tuple[Workload, ...] = (
    Workload("crve_oneway", ("crve_wcb_10m_no_ci", "crve_wcb_10m_ci"),
             "wild cluster bootstrap, N = 10^7, G = 1,000, k = 8, B = 9,999, without / with the CI", crve_oneway),
    Workload("crve_twofe", ("crve_wcb_twofe_10m_no_ci", "crve_wcb_twofe_10m_ci"),
             "the same with two fixed effects (10^5 firms, 1,000 years), k = 3, without / with the CI", crve_twofe),
    Workload("crve_iv", ("crve_wcb_iv_1m",), "IV by the WRE bootstrap, N = 10^6, G = 1,000, B = 9,999", crve_iv),
    Workload("crve_montecarlo", ("crve_mc_50k",), "CRVE Monte Carlo, R = 50,000 CRV1 t tests, G = 100, m = 32, k = 8",
             crve_montecarlo),
    Workload("sccs_map_largest", ("sccs_map_largest_laplace",),
             "SCCS MAP fit at the largest size (N = 3.6M, J = 1,428), laplace, engine built apart", sccs_map_largest),
    Workload("sccs_cv_bootstrap_smallest", ("sccs_cv_bootstrap_smallest",),
             "SCCS smallest size: 10-fold CV x 10 variances + final fit + 200 bootstrap refits, builds included",
             sccs_cv_bootstrap_smallest, gpu_only=True),
    Workload("sccs_study", ("sccs_study_cv_bootstrap_splines",),
             "sccs_fit with age and season splines (precondition splines): CV + fit + 200 bootstrap, fit stages",
             sccs_study),
    Workload("sccs_first_fit", ("sccs_first_fit_fresh_warm_up", "sccs_first_fit_fresh_first_job",
                                "sccs_first_fit_cached_warm_up", "sccs_first_fit_cached_first_job"),
             "a fresh worker at the largest size: warm-up and first sccs_fit job, empty then filled CUDA cache",
             sccs_first_fit, gpu_only=True, has_quick=False, fresh_process=True),
    Workload("ks_panel", ("ks_panel_10m_x_1000",), "Krusell-Smith panel, N = 10^7, T = 1,000, 100 x 4, Catmull-Rom",
             ks_panel),
    Workload("ks_staged_solve", ("ks_staged_solve_500x50",),
             "ks_solve job, 500 x 50, N = 10^7, coarse_agents 100,000, anderson", ks_staged_solve),
    Workload("ks_default_job", ("ks_default_job",), "ks_solve job with empty params (the defaults)", ks_default_job),
    Workload("dualcontrol_optimal", ("dualcontrol_optimal_256_solve", "dualcontrol_optimal_256_job"),
             "dual control, optimal policy at 256^3, the job's defaults: the solve / the dualcontrol_solve job",
             dualcontrol_optimal),
)  # fmt: skip


# --- comparison, table, baselines ---------------------------------------------------------------------------


def verdict(baseline: float | None, now: float | None, tolerance: float, note: str = "") -> str:
    """The row's verdict (see the module text); ``note`` says why a row has no time."""
    if now is None:
        return note or "skipped"
    if baseline is None:
        return note or "no baseline"
    if now > baseline * (1.0 + tolerance):
        return "SLOWER"
    if now < baseline * (1.0 - tolerance):
        return "faster"
    return "ok"


def compare(
    rows: Iterable[str],
    measured: Mapping[str, float],
    notes: Mapping[str, str],
    baselines: Mapping[str, float] | None,
    tolerance: float,
) -> list[Row]:
    """One row per name: its baseline (``baselines``: this device's seconds per row; None: not compared, as in a
    quick run), the seconds measured now (absent: ``notes`` says why) and the verdict."""
    table = []
    for name in rows:
        baseline = None if baselines is None else baselines.get(name)
        note = notes.get(name, "") or ("quick: not compared" if baselines is None else "")
        table.append(Row(name, baseline, measured.get(name), verdict(baseline, measured.get(name), tolerance, note)))
    return table


def _seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_table(table: Sequence[Row], device: str, tolerance: float) -> str:
    width = max([len("workload"), *(len(row.name) for row in table)])
    lines = [
        f"performance guard on {device}, tolerance {tolerance:.0%}",
        f"{'workload':<{width}}  {'baseline s':>10}  {'now s':>10}  {'ratio':>6}  verdict",
    ]
    for row in table:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        lines.append(
            f"{row.name:<{width}}  {_seconds_text(row.baseline):>10}  {_seconds_text(row.now):>10}  {ratio:>6}  "
            f"{row.verdict}"
        )
    slower = sum(row.verdict == "SLOWER" for row in table)
    errors = sum(row.verdict.startswith("error") for row in table)
    lines.append(f"{'FAIL' if slower or errors else 'PASS'}: {slower} slower, {errors} failed, {len(table)} rows")
    return "\n".join(lines)


def load_baselines(path: Path) -> dict[str, Any]:
    """The baselines file (``{"devices": {}}`` when there is none yet)."""
    if not path.exists():
        return {"devices": {}}
    document = json.loads(path.read_text())
    if not isinstance(document.get("devices"), dict):
        raise ValueError(f"{path}: no 'devices' object")
    return document


def device_baselines(document: Mapping[str, Any], device: str) -> dict[str, float]:
    """This device's seconds per row."""
    return {name: float(entry["seconds"]) for name, entry in document["devices"].get(device, {}).items()}


def with_baselines(
    document: Mapping[str, Any], device: str, measured: Mapping[str, float], commit: str, date: str
) -> dict[str, Any]:
    """The document with this device's ``measured`` rows replaced (its other rows and other devices kept)."""
    devices = {name: dict(rows) for name, rows in document["devices"].items()}
    rows = devices.setdefault(device, {})
    for name, seconds in measured.items():
        rows[name] = {"seconds": round(float(seconds), 6), "commit": commit, "date": date}
    devices[device] = dict(sorted(rows.items()))
    return {**document, "devices": dict(sorted(devices.items()))}


# --- running ------------------------------------------------------------------------------------------------


def select(workloads: Sequence[Workload], only: Sequence[str] | None) -> list[Workload]:
    """The workloads giving the rows (or named as workloads) in ``only``; every one when None."""
    if not only:
        return list(workloads)
    known = {row for w in workloads for row in w.rows} | {w.name for w in workloads}
    unknown = sorted(set(only) - known)
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; known: {sorted(known)}")
    return [w for w in workloads if w.name in only or set(w.rows) & set(only)]


def run_workloads(
    workloads: Sequence[Workload], setup: Setup, budget: float, log: Callable[[str], None] = print
) -> tuple[dict[str, float], dict[str, str], dict[str, Any]]:
    """Measure each workload (the fresh-process ones first); returns the seconds per row, why a row has none,
    and each workload's details. A workload that raises is an error row; once ``budget`` seconds are spent
    the rest are skipped."""
    measured: dict[str, float] = {}
    notes: dict[str, str] = {}
    details: dict[str, Any] = {}
    started = time.perf_counter()
    for workload in sorted(workloads, key=lambda w: not w.fresh_process):
        if workload.gpu_only and not setup.gpu:
            reason = "skipped: needs a GPU"
        elif setup.quick and not workload.has_quick:
            reason = "skipped: no quick form"
        elif time.perf_counter() - started > budget:
            reason = f"skipped: budget of {budget:.0f} s spent"
        else:
            reason = ""
        if reason:
            notes.update(dict.fromkeys(workload.rows, reason))
            log(f"[{workload.name}] {reason}")
            continue
        begin = time.perf_counter()
        try:
            result = workload.measure(setup)
        except Exception as error:
            traceback.print_exc()
            notes.update(dict.fromkeys(workload.rows, f"error: {type(error).__name__}"))
            details[workload.name] = {"error": f"{type(error).__name__}: {error}"}
        else:
            missing = sorted(set(workload.rows) - set(result.seconds))
            notes.update(dict.fromkeys(missing, "error: not measured"))
            measured.update({row: result.seconds[row] for row in workload.rows if row in result.seconds})
            details[workload.name] = result.details
        finally:
            free_device_memory(setup.xp)
        wall = time.perf_counter() - begin
        details.setdefault(workload.name, {})["wall_seconds"] = wall
        got = ", ".join(f"{row} {measured[row]:.4g} s" for row in workload.rows if row in measured)
        log(f"[{workload.name}] {wall:.1f} s: {got or 'no rows'}")
    return measured, notes, details


def current_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these rows or workloads only")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run; never compared)")
    parser.add_argument("--device", choices=["gpu", "cpu"], default=None, help="default: GPUEST_DEVICE (auto)")
    parser.add_argument("--baselines", type=Path, default=DEFAULT_BASELINES)
    parser.add_argument(
        "--write-baselines",
        type=Path,
        default=None,
        metavar="PATH",
        help="write this run's rows as this device's baselines into PATH (needs --commit)",
    )
    parser.add_argument("--commit", default=None, help="the commit the run measures (default: git's HEAD)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="slower by more fails (0.15)")
    parser.add_argument("--json", type=Path, default=None, help="write the table and details here")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_SECONDS,
        help="skip the workloads left once this many seconds are spent",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    return parser


def main(argv: Sequence[str] | None = None, workloads: Sequence[Workload] = WORKLOADS) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        for workload in workloads:
            print(f"{workload.name}: {workload.figure}\n    rows: {', '.join(workload.rows)}")
        return 0
    if args.write_baselines is not None and (args.quick or not args.commit):
        parser.error("--write-baselines needs --commit and a full-size run (not --quick)")
    if not 0.0 < args.tolerance < 10.0:
        parser.error("--tolerance must lie in (0, 10)")
    try:
        selected = select(workloads, args.only)
    except ValueError as error:
        parser.error(str(error))
    if args.device:
        os.environ["GPUEST_DEVICE"] = args.device  # the benchmark modules that open their own context follow it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    xp = get_namespace(args.device)
    device = device_label(xp)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="perf_guard-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not is_numpy(xp):  # the fresh-process rows fill this cache first; the other workloads load from it
        from kernels import cuda

        cuda.use_disk_cache(workdir / "sccs_first_fit" / "cuda-cache")
    baselines_document = load_baselines(args.baselines)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = args.commit or current_commit()
    print(f"device {device}, commit {commit}, {date}, quick={args.quick}", flush=True)
    try:
        measured, notes, details = run_workloads(
            selected, Setup(xp, args.quick, workdir), args.budget, log=lambda line: print(line, flush=True)
        )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = [row for workload in selected for row in workload.rows]
    baselines = None if args.quick else device_baselines(baselines_document, device)
    table = compare(rows, measured, notes, baselines, args.tolerance)
    print("\n" + format_table(table, device, args.tolerance), flush=True)
    if args.json is not None:
        report = {
            "device": device, "commit": commit, "date": date, "quick": args.quick, "tolerance": args.tolerance,
            "rows": [{"name": r.name, "baseline": r.baseline, "now": r.now, "ratio": r.ratio, "verdict": r.verdict}
                     for r in table],
            "details": details,
        }  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1, default=_json_default))
    if args.write_baselines is not None:
        document = load_baselines(args.write_baselines)
        args.write_baselines.write_text(
            json.dumps(with_baselines(document, device, measured, args.commit, date[:10]), indent=2) + "\n"
        )
        print(f"baselines of {device} written to {args.write_baselines}: {len(measured)} rows", flush=True)
        return 1 if any(row.verdict.startswith("error") for row in table) else 0
    return 1 if any(row.failed for row in table) else 0


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
