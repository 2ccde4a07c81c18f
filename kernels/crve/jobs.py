"""The CRVE job kinds ``crve_bootstrap`` and ``crve_montecarlo``, wired to the registry (see docs/crve.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from kernels.context import RunContext
from kernels.crve import montecarlo as mc
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, BootstrapOutcome, wild_cluster_bootstrap
from kernels.crve.formula import DesignArrays, design_from_formula
from kernels.crve.inference import t_summary
from kernels.crve.spec import BootstrapParams, BootstrapResult, CoefficientRow, MonteCarloParams, MonteCarloResult
from kernels.crve.synthetic import synthetic_columns
from kernels.registry import JobKind, KindExample

# float64 elements one NumPy block of replications may hold (about 64 MB per array).
_NUMPY_BLOCK_ELEMENTS = 8_000_000
# float64 elements of one G x chunk array of bootstrap draws: the GPU takes large chunks, NumPy cache-sized ones.
_GPU_DRAW_BLOCK_ELEMENTS = 64_000_000
_NUMPY_DRAW_BLOCK_ELEMENTS = 4_000_000


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: undefined summaries are null."""
    return float(value) if math.isfinite(value) else None


def _levels(values: dict[float, float]) -> dict[str, float]:
    return {f"{level:.2f}": float(value) for level, value in values.items()}


def run_montecarlo(params: MonteCarloParams, ctx: RunContext) -> MonteCarloResult:
    # test_coefficient < n_regressors < n_obs <= MAX_OBS_PER_REPLICATION: checked by MonteCarloParams.
    design = mc.Design(params.n_clusters, params.cluster_size, params.n_regressors, params.seed)
    bootstrap = params.test == "wild_bootstrap"
    crit = None if bootstrap else mc.critical_values(params.critical_values, params.n_clusters)
    ctx.progress(0.0, "replications 0/" + str(params.replications))
    summary, draws = mc.simulate(
        ctx.xp,
        design,
        replications=params.replications,
        test_coefficient=params.test_coefficient,
        ssc=params.ssc,
        critical=crit,
        bootstrap_reps=params.bootstrap_reps if bootstrap else None,
        weights_type=params.weights_type,
        report=ctx.progress,
        timer=ctx.timer,
        numpy_block_elements=_NUMPY_BLOCK_ELEMENTS,
    )
    return MonteCarloResult(
        test=params.test,
        replications=summary.replications,
        n_clusters=params.n_clusters,
        cluster_size=params.cluster_size,
        n_regressors=params.n_regressors,
        n_obs=design.n_obs,
        test_coefficient=params.test_coefficient,
        true_value=mc.TRUE_COEFFICIENT,
        seed=params.seed,
        rejection_rate=_levels(summary.rejection_rate),
        rejection_rate_se=_levels(summary.rejection_rate_se),
        critical_values=None if crit is None else _levels(crit),
        mean_estimate=summary.mean_estimate,
        sd_estimate=_finite(summary.sd_estimate),
        mean_se=summary.mean_se,
        se_ratio=_finite(summary.mean_se / summary.sd_estimate) if summary.sd_estimate > 0 else None,
        bootstrap_reps=draws if bootstrap else None,
        weights_type=params.weights_type if bootstrap else None,
    )


def _bootstrap_frame(params: BootstrapParams, ctx: RunContext) -> pd.DataFrame:
    """The synthetic dataset (made here, on the host: formula parsing is pandas) or the uploaded one."""
    if params.synthetic is not None:
        spec = params.synthetic
        columns = synthetic_columns(np, spec.n_obs, spec.n_clusters, spec.n_regressors, spec.seed, spec.n_fe)
        return pd.DataFrame(columns)
    return ctx.dataset("dataset_id")


def _device_data(design: DesignArrays, ctx: RunContext) -> BootstrapData:
    def move(array: np.ndarray | None) -> Any:
        return None if array is None else ctx.xp.asarray(array)

    return BootstrapData(
        x=move(design.x),
        y=move(design.y),
        cluster=move(design.cluster),
        n_clusters=design.n_clusters,
        bootcluster=move(design.bootcluster),
        n_boot_clusters=design.n_boot_clusters,
        fe=move(design.fe),
        n_fe=design.n_fe,
        names=design.names,
    )


def _bootstrap_options(params: BootstrapParams, design: DesignArrays, ctx: RunContext) -> BootstrapOptions:
    return BootstrapOptions(
        param=design.names.index(params.param),
        r=params.r,
        reps=params.reps,
        weights_type=params.weights_type,
        impose_null=params.impose_null,
        p_val_type=params.p_val_type,
        conf_int=params.conf_int,
        sign_level=params.sign_level,
        ssc=params.ssc,
        seed=params.seed,
        block_elements=_GPU_DRAW_BLOCK_ELEMENTS if ctx.on_gpu else _NUMPY_DRAW_BLOCK_ELEMENTS,
    )


def _coefficient_rows(outcome: BootstrapOutcome, names: list[str], sign_level: float) -> list[CoefficientRow]:
    """Every coefficient with its CRV1 SE and the analytic t(G-1) test and interval."""
    df = outcome.n_clusters - 1
    critical = float(stats.t.ppf(1 - sign_level / 2, df))
    rows = []
    for index, name in enumerate(names):
        estimate, se = float(outcome.coefficients[index]), float(outcome.standard_errors[index])
        t_stat = estimate / se
        rows.append(
            CoefficientRow(
                name=name,
                estimate=estimate,
                se=se,
                t_stat=t_stat,
                p_value=float(2 * stats.t.sf(abs(t_stat), df)),
                conf_int=[estimate - critical * se, estimate + critical * se],
            )
        )
    return rows


def run_bootstrap(params: BootstrapParams, ctx: RunContext) -> BootstrapResult:
    ctx.progress(0.0, "parsing formula")
    with ctx.stage("formula"):
        design = design_from_formula(_bootstrap_frame(params, ctx), params.formula, params.cluster, params.bootcluster)
    if params.param not in design.names:
        raise ValueError(f"param: {params.param!r} is not a coefficient of the formula; coefficients: {design.names}")
    with ctx.stage("to_device"):
        arrays = _device_data(design, ctx)

    def report(fraction: float, stage: str) -> None:
        ctx.progress(min(1.0, 0.05 + 0.9 * fraction), stage)

    outcome = wild_cluster_bootstrap(ctx.xp, arrays, _bootstrap_options(params, design, ctx), report, ctx.timer)
    with ctx.stage("artifacts"):
        ctx.save_artifact("bootstrap_t", outcome.t_boot)
    fixed_effect = None
    if design.fe_name is not None:
        fixed_effect = {"name": design.fe_name, "levels": design.n_fe, "nested_in_cluster": outcome.fe_nested}
    return BootstrapResult(
        param=params.param,
        r=params.r,
        estimate=outcome.estimate,
        se=outcome.se,
        t_stat=outcome.t_stat,
        p_value=outcome.p_values[params.p_val_type],
        p_value_analytic=outcome.p_values_analytic[params.p_val_type],
        p_values=outcome.p_values,
        p_val_type=params.p_val_type,
        conf_int=None if outcome.conf_int is None else list(outcome.conf_int),
        conf_int_analytic=list(outcome.conf_int_analytic),
        sign_level=params.sign_level,
        reps=params.reps,
        reps_used=outcome.reps_used,
        enumerated=outcome.enumerated,
        weights_type=params.weights_type,
        bootstrap_type="WCR" if params.impose_null else "WCU",
        seed=params.seed,
        ssc=params.ssc,
        ssc_factor=outcome.ssc_factor,
        n_obs=outcome.n_obs,
        n_clusters=outcome.n_clusters,
        n_boot_clusters=outcome.n_boot_clusters,
        n_params_ssc=outcome.n_params_ssc,
        fixed_effect=fixed_effect,
        coefficients=_coefficient_rows(outcome, design.names, params.sign_level),
        bootstrap_t=t_summary(outcome.t_boot),
    )


# The examples run through run_kind on NumPy in CI and on the GPU in the cross-backend test, so each exercises
# its kind's GPU code. crve_bootstrap: a fixed effect crossing the clusters (demeaning, the pair-statistics
# kernel, the fixed-effect correction's sparse products), the weights kernel (B draws, 2^30 > B: no
# enumeration) and the confidence interval. crve_montecarlo: the WCR bootstrap test, which runs both the
# CGM data kernel and the batched weights kernel (the CRV1 test runs only the first).
KINDS = [
    JobKind(
        name="crve_bootstrap",
        params_model=BootstrapParams,
        result_model=BootstrapResult,
        run=run_bootstrap,
        dataset_fields=("dataset_id",),
        summary="Wild cluster bootstrap-t (WCR/WCU, fast-and-wild algorithm) with CRV1 standard errors",
        example=KindExample(
            params={
                "synthetic": {"n_obs": 5_000, "n_clusters": 30, "n_regressors": 3, "n_fe": 8, "seed": 1},
                "formula": "y ~ x1 + x2 + x3 | fe",
                "cluster": "cluster",
                "param": "x1",
                "reps": 9999,
                "seed": 1,
            }
        ),
    ),
    JobKind(
        name="crve_montecarlo",
        params_model=MonteCarloParams,
        result_model=MonteCarloResult,
        run=run_montecarlo,
        summary="Monte Carlo of CRV1 t tests or WCR wild cluster bootstrap tests in the CGM (2008) design",
        example=KindExample(
            params={
                "n_clusters": 20,
                "cluster_size": 10,
                "n_regressors": 3,
                "replications": 500,
                "test": "wild_bootstrap",
                "bootstrap_reps": 199,
                "seed": 1,
            }
        ),
    ),
]
