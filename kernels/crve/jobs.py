"""The CRVE job kinds ``crve_bootstrap`` and ``crve_montecarlo``, wired to the registry (see docs/crve.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.crve import BOOTSTRAP_KIND, MONTECARLO_KIND
from kernels.crve import montecarlo as mc
from kernels.crve.bootstrap import (
    BootstrapData,
    BootstrapOptions,
    BootstrapOutcome,
    wild_bootstrap_family,
    wild_cluster_bootstrap,
)
from kernels.crve.formula import DesignArrays, design_from_formula
from kernels.crve.hypothesis import Restrictions, parse_restrictions
from kernels.crve.inference import romano_wolf_p_values, t_summary, westfall_young_p_values
from kernels.crve.iv import IvData, anderson_rubin, iv_wre_bootstrap
from kernels.crve.spec import (
    BootstrapParams,
    BootstrapResult,
    ClusterDimension,
    CoefficientRow,
    FamilyRow,
    FixedEffectInfo,
    MonteCarloParams,
    MonteCarloResult,
    RestrictionRow,
)
from kernels.crve.synthetic import synthetic_columns
from kernels.crve.work import (
    DEFAULT_BOOTSTRAP_CPU_MAX_WORK,
    DEFAULT_MONTECARLO_CPU_MAX_WORK,
    bootstrap_work,
    montecarlo_work,
)
from kernels.registry import JobKind, KindExample
from kernels.spec import settings_from

# float64 elements one NumPy block of replications may hold (about 64 MB per array).
NUMPY_BLOCK_ELEMENTS = 8_000_000
# float64 elements of one G x chunk array of bootstrap draws: the GPU takes large chunks, NumPy cache-sized ones.
_GPU_DRAW_BLOCK_ELEMENTS = 64_000_000
_NUMPY_DRAW_BLOCK_ELEMENTS = 4_000_000


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: undefined summaries are null."""
    return float(value) if math.isfinite(value) else None


def _levels(values: dict[float, float]) -> dict[str, float]:
    return {f"{level:.2f}": float(value) for level, value in values.items()}


def montecarlo_design(params: MonteCarloParams) -> mc.Design:
    # test_coefficient < n_regressors < n_obs <= MAX_OBS_PER_REPLICATION: checked by MonteCarloParams.
    return settings_from(mc.Design, params, sizes=params.design_sizes)


def montecarlo_critical_values(params: MonteCarloParams) -> dict[float, float] | None:
    """The CRV1 test's critical values; None for the wild bootstrap (each replication has its own p-value)."""
    if params.test == "wild_bootstrap":
        return None
    return mc.critical_values(params.critical_values, params.n_clusters)


def run_montecarlo(params: MonteCarloParams, ctx: RunContext) -> MonteCarloResult:
    design = montecarlo_design(params)
    bootstrap = params.test == "wild_bootstrap"
    crit = montecarlo_critical_values(params)
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
        numpy_block_elements=NUMPY_BLOCK_ELEMENTS,
    )
    return montecarlo_result(params, design, summary, draws, crit)


def montecarlo_result(
    params: MonteCarloParams, design: mc.Design, summary: mc.MonteCarloSummary, draws: int,
    crit: dict[float, float] | None,
) -> MonteCarloResult:
    """The kind's result from the run's summary (a single run's or a split run's reduction)."""
    bootstrap = params.test == "wild_bootstrap"
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
        cluster_sizes=None if design.sizes is None else _size_summary(design.cluster_sizes),
    )


def _size_summary(sizes: np.ndarray) -> dict[str, float]:
    mean = float(sizes.mean())
    return {"min": float(sizes.min()), "max": float(sizes.max()), "mean": mean, "cv": float(sizes.std() / mean)}


def _bootstrap_frame(params: BootstrapParams, ctx: RunContext) -> pd.DataFrame:
    """The synthetic dataset (made here, on the host: formula parsing is pandas) or the uploaded one."""
    if params.synthetic is not None:
        return pd.DataFrame(synthetic_columns(np, **params.synthetic.model_dump()))
    return ctx.dataset("dataset_id")


def device_data(design: DesignArrays, xp: Any) -> BootstrapData:
    """The design's arrays on ``xp`` as the bootstrap takes them."""

    def move(array: np.ndarray | None) -> Any:
        return None if array is None else xp.asarray(array)

    clusters = [(move(c.codes), c.count) for c in design.clusters]
    effects = [(move(e.codes), e.count) for e in design.fixed_effects]
    boot = design.bootcluster
    return BootstrapData(
        x=move(design.x),
        y=move(design.y),
        cluster=clusters[0][0] if clusters else None,
        n_clusters=clusters[0][1] if clusters else None,
        bootcluster=None if boot is None else move(boot.codes),
        n_boot_clusters=None if boot is None else boot.count,
        fe=effects[0][0] if effects else None,
        n_fe=effects[0][1] if effects else None,
        names=design.names,
        more_clusters=clusters[1:],
        more_fe=effects[1:],
        weights=move(design.weights),
        cluster_names=[c.name for c in design.clusters],
        fe_names=[e.name for e in design.fixed_effects],
    )


def _restrictions(params: BootstrapParams, texts: list[str], names: list[str]) -> Restrictions:
    field = "param" if params.param is not None else "family" if params.family is not None else "hypothesis"
    if params.param is not None and params.param not in names:
        raise ValueError(f"param: {params.param!r} is not a coefficient of the formula; coefficients: {names}")
    try:
        return parse_restrictions(texts, names)
    except ValueError as error:
        raise ValueError(f"{field}: {error}; coefficients: {names}") from None


def draw_block_elements(on_gpu: bool) -> int:
    """The bound on a chunk of draws' G x chunk arrays (the draw chunks of a run follow from it)."""
    return _GPU_DRAW_BLOCK_ELEMENTS if on_gpu else _NUMPY_DRAW_BLOCK_ELEMENTS


def bootstrap_options(params: BootstrapParams, restrictions: Restrictions, ctx: RunContext) -> BootstrapOptions:
    return BootstrapOptions.from_params(
        params,
        restrictions=restrictions,
        conf_int=params.conf_int and restrictions.count == 1 and params.family is None,
        block_elements=draw_block_elements(ctx.on_gpu),
        drop_singletons=params.fixef_rm == "singleton",
        crv3=params.vcov_type == "CRV3",
    )


def _coefficient_rows(outcome: BootstrapOutcome, names: list[str], sign_level: float) -> list[CoefficientRow]:
    """Every coefficient with its CRV1 (CRV3, HC1) SE and the analytic t(df_t) test and interval."""
    df = outcome.df_t
    critical = float(stats.t.ppf(1 - sign_level / 2, df))
    crv3 = outcome.covariance_crv3
    standard_errors = outcome.standard_errors if crv3 is None else np.sqrt(np.diag(crv3))
    rows = []
    for index, name in enumerate(names):
        estimate, se = float(outcome.coefficients[index]), float(standard_errors[index])
        t_stat = estimate / se if se > 0 else float("nan")
        rows.append(
            CoefficientRow(
                name=name,
                estimate=estimate,
                se=se,
                t_stat=_finite(t_stat) if math.isfinite(t_stat) else 0.0,
                p_value=float(2 * stats.t.sf(abs(t_stat), df)) if se > 0 else 1.0,
                conf_int=[estimate - critical * se, estimate + critical * se],
            )
        )
    return rows


def _restriction_rows(restrictions: Restrictions, outcome: BootstrapOutcome, names: list[str]) -> list[RestrictionRow]:
    return [
        RestrictionRow(
            text=text,
            coefficients={name: float(value) for name, value in zip(names, row, strict=True) if value != 0},
            rhs=float(rhs),
            estimate=float(estimate),
        )
        for text, row, rhs, estimate in zip(
            restrictions.texts, restrictions.matrix, restrictions.rhs, outcome.restriction_estimate, strict=True
        )
    ]


@dataclass(frozen=True)
class DesignLabels:
    """The names a result gives its design's parts: the coefficients, the variance cluster dimensions and the
    fixed effects."""

    names: list[str]
    cluster_names: list[str]
    fe_names: list[str]

    @classmethod
    def of(cls, design: DesignArrays) -> DesignLabels:
        return cls(list(design.names), [c.name for c in design.clusters], [e.name for e in design.fixed_effects])


def _model_fields(params: BootstrapParams, labels: DesignLabels, outcome: BootstrapOutcome) -> dict[str, Any]:
    """The result's fields that describe the fitted model (shared by every kind of test)."""
    effects = [
        FixedEffectInfo(name=name, levels=levels, nested_in_cluster=nested)
        for name, levels, nested in zip(labels.fe_names, outcome.fe_levels, outcome.fe_nested_all, strict=True)
    ]
    return {
        "param": params.param,
        "r": params.r if params.param is not None else None,
        "sign_level": params.sign_level,
        "reps": params.reps,
        "reps_used": outcome.reps_used,
        "enumerated": outcome.enumerated,
        "weights_type": params.weights_type,
        "bootstrap_type": "WCR" if params.impose_null else "WCU",
        "bootstrap_variant": params.bootstrap_type,
        "vcov_type": params.vcov_type if labels.cluster_names else "HC1",
        "seed": params.seed,
        "ssc": params.ssc,
        "ssc_factor": outcome.ssc_factor,
        "df_t": outcome.df_t,
        "n_obs": outcome.n_obs,
        "n_singletons": outcome.n_singletons,
        "n_clusters": outcome.n_clusters,
        "clusters": [
            ClusterDimension(name=name, count=count)
            for name, count in zip(labels.cluster_names, outcome.cluster_counts, strict=False)
        ],
        "n_boot_clusters": outcome.n_boot_clusters,
        "bootcluster": params.bootcluster or outcome.bootcluster_name,
        "weights": params.weights,
        "eigen_fixed": outcome.eigen_fixed,
        "n_params_ssc": outcome.n_params_ssc,
        "fixed_effect": effects[0].model_dump() if effects else None,
        "fixed_effects": effects,
        "demeaning": outcome.demeaning,
        "coefficients": _coefficient_rows(outcome, labels.names, params.sign_level),
    }


def bootstrap_design(params: BootstrapParams, ctx: RunContext) -> DesignArrays:
    """The design's arrays from the job's dataset and formula (on the host)."""
    ctx.progress(0.0, "parsing formula")
    with ctx.stage("formula"):
        return design_from_formula(
            _bootstrap_frame(params, ctx), params.parsed_formula, params.cluster_columns, params.bootcluster,
            params.weights,
        )


def single_restrictions(params: BootstrapParams, names: list[str]) -> Restrictions:
    """The hypothesis of a job testing one restriction or several jointly (not a family)."""
    return _restrictions(params, params.restriction_texts, names)


def to_device(design: DesignArrays, ctx: RunContext) -> BootstrapData:
    with ctx.stage("to_device"):
        return device_data(design, ctx.xp)


def draw_report(ctx: RunContext) -> Callable[[float, str], None]:
    """The bootstrap's report of its share of draws done, as the job's progress (0.05 to 0.95)."""

    def report(fraction: float, stage: str) -> None:
        ctx.progress(min(1.0, 0.05 + 0.9 * fraction), stage)

    return report


def run_bootstrap(params: BootstrapParams, ctx: RunContext) -> BootstrapResult:
    design = bootstrap_design(params, ctx)
    if design.endogenous is not None:
        return run_iv(params, design, ctx)
    if params.family is not None:
        members = [_restrictions(params, [text], design.names) for text in params.family]
        restrictions = members[0]
    else:
        restrictions = single_restrictions(params, design.names)
    arrays = to_device(design, ctx)
    options = bootstrap_options(params, restrictions, ctx)
    if params.family is not None:
        outcomes = wild_bootstrap_family(ctx.xp, arrays, options, members, draw_report(ctx), ctx.timer)
        return _family_result(params, design, members, outcomes, ctx)
    outcome = wild_cluster_bootstrap(ctx.xp, arrays, options, draw_report(ctx), ctx.timer)
    return bootstrap_test_result(params, restrictions, DesignLabels.of(design), outcome, ctx)


def bootstrap_test_result(
    params: BootstrapParams,
    restrictions: Restrictions,
    labels: DesignLabels,
    outcome: BootstrapOutcome,
    ctx: RunContext,
) -> BootstrapResult:
    """The result of a test of one restriction or several jointly, its draws saved as the ``bootstrap_t``
    artifact."""
    with ctx.stage("artifacts"):
        ctx.save_artifact("bootstrap_t", outcome.t_boot)
    joint = restrictions.count > 1
    test_key = "wald" if joint else params.p_val_type
    return BootstrapResult(
        hypothesis=list(restrictions.texts),
        restrictions=_restriction_rows(restrictions, outcome, labels.names),
        test="wald" if joint else "t",
        estimate=None if joint else outcome.estimate,
        se=None if joint else outcome.se,
        t_stat=None if joint else outcome.t_stat,
        wald_stat=outcome.wald_stat,
        p_value=outcome.p_values[test_key],
        p_value_analytic=outcome.p_values_analytic[test_key],
        p_values=outcome.p_values,
        p_val_type="wald" if joint else params.p_val_type,
        conf_int=None if outcome.conf_int is None else list(outcome.conf_int),
        conf_int_analytic=None if outcome.conf_int_analytic is None else list(outcome.conf_int_analytic),
        reps_undefined=outcome.reps_undefined,
        family=None,
        family_method=None,
        bootstrap_t=t_summary(outcome.t_boot),
        **_model_fields(params, labels, outcome),
    )


def _family_result(
    params: BootstrapParams,
    design: DesignArrays,
    members: list[Restrictions],
    outcomes: list[BootstrapOutcome],
    ctx: RunContext,
) -> BootstrapResult:
    """A family's members, their adjusted p-values, and the draws (B x S) as the artifact."""
    t_stats = np.array([outcome.t_stat for outcome in outcomes])
    t_boot = np.column_stack([outcome.t_boot for outcome in outcomes])
    df = outcomes[0].df_t
    analytic = 2 * stats.t.sf(np.abs(t_stats), df)
    if params.family_method == "romano-wolf":
        adjusted = romano_wolf_p_values(t_stats, t_boot)
    else:
        adjusted = westfall_young_p_values(analytic, 2 * stats.t.sf(np.abs(t_boot), df))
    with ctx.stage("artifacts"):
        ctx.save_artifact("bootstrap_t", t_boot)
    rows = [
        FamilyRow(
            text=member.texts[0],
            estimate=outcome.estimate,
            se=outcome.se,
            t_stat=outcome.t_stat,
            p_value=outcome.p_values["two-tailed"],
            p_value_analytic=float(p_analytic),
            p_value_adjusted=float(p_adjusted),
        )
        for member, outcome, p_analytic, p_adjusted in zip(members, outcomes, analytic, adjusted, strict=True)
    ]
    restriction_rows = [
        row for member, outcome in zip(members, outcomes, strict=True)
        for row in _restriction_rows(member, outcome, design.names)
    ]  # fmt: skip
    largest = np.fmax.reduce(np.abs(t_boot), axis=1)
    return BootstrapResult(
        hypothesis=list(params.family or []),
        restrictions=restriction_rows,
        test="family",
        estimate=None,
        se=None,
        t_stat=None,
        wald_stat=None,
        p_value=float(adjusted.min()),
        p_value_analytic=float(min(1.0, len(members) * analytic.min())),
        p_values={params.family_method: float(adjusted.min())},
        p_val_type="two-tailed",
        conf_int=None,
        conf_int_analytic=None,
        reps_undefined=int(np.isnan(t_boot).any(axis=1).sum()),
        family=rows,
        family_method=params.family_method,
        bootstrap_t=t_summary(largest),
        **_model_fields(params, DesignLabels.of(design), outcomes[0]),
    )


def run_iv(params: BootstrapParams, design: DesignArrays, ctx: RunContext) -> BootstrapResult:
    """2SLS with the WRE bootstrap (kernels/crve/iv.py): fixed effects nested in the clusters are partialled out
    of every variable first; singletons dropped as for OLS."""
    xp = ctx.xp
    cluster = design.clusters[0]
    with ctx.stage("demean"):
        arrays, n_obs_used, n_singletons = _iv_arrays_on_device(params, design, xp)
    ctx.progress(0.05, "bootstrap draws")
    with ctx.stage("bootstrap"):
        outcome = iv_wre_bootstrap(xp, arrays, params.r, params.reps, params.weights_type, params.seed,
                                   sign_level=params.sign_level, ssc=params.ssc)  # fmt: skip
        weak_robust = anderson_rubin(xp, arrays, params.r, params.reps, params.weights_type, params.seed, params.ssc)
    with ctx.stage("artifacts"):
        ctx.save_artifact("bootstrap_t", outcome.t_boot)
    names = [*design.names, design.endogenous_name or ""]
    df = cluster.count - 1
    critical = float(stats.t.ppf(1 - params.sign_level / 2, df))
    coefficient_rows = []
    for index, name in enumerate(names):
        estimate, se = float(outcome.coefficients[index]), float(np.sqrt(outcome.covariance[index, index]))
        t_value = estimate / se
        coefficient_rows.append(CoefficientRow(name=name, estimate=estimate, se=se, t_stat=t_value,
                                               p_value=float(2 * stats.t.sf(abs(t_value), df)),
                                               conf_int=[estimate - critical * se, estimate + critical * se]))
    effects = [FixedEffectInfo(name=e.name, levels=e.count, nested_in_cluster=True) for e in design.fixed_effects]
    text = f"{params.param} = {params.r!r}"
    return BootstrapResult(
        param=params.param, r=params.r, hypothesis=[text],
        restrictions=[RestrictionRow(text=text, coefficients={params.param or "": 1.0}, rhs=params.r,
                                     estimate=outcome.estimate)],
        test="t", estimate=outcome.estimate, se=outcome.se, t_stat=outcome.t_stat, wald_stat=None,
        p_value=outcome.p_values[params.p_val_type], p_value_analytic=outcome.p_values_analytic[params.p_val_type],
        p_values=outcome.p_values, p_val_type=params.p_val_type, conf_int=None,
        conf_int_analytic=list(outcome.conf_int_analytic), sign_level=params.sign_level, reps=params.reps,
        reps_used=outcome.reps_used, reps_undefined=int(np.isnan(outcome.t_boot).sum()),
        enumerated=outcome.enumerated, weights_type=params.weights_type, bootstrap_type="WCR",
        bootstrap_variant="WRE", vcov_type="CRV1", seed=params.seed, ssc=params.ssc, ssc_factor=outcome.ssc_factor,
        df_t=df, n_obs=n_obs_used, n_singletons=n_singletons, n_clusters=cluster.count,
        clusters=[ClusterDimension(name=cluster.name, count=cluster.count)], n_boot_clusters=cluster.count,
        bootcluster=cluster.name, weights=None, eigen_fixed=False, n_params_ssc=outcome.n_params_ssc,
        fixed_effect=effects[0].model_dump() if effects else None, fixed_effects=effects, demeaning=None,
        coefficients=coefficient_rows, family=None, family_method=None,
        iv={"endogenous": design.endogenous_name, "instruments": design.instrument_names,
            "first_stage_f": outcome.first_stage_f, "effective_f": outcome.effective_f,
            "anderson_rubin": weak_robust},
        bootstrap_t=t_summary(outcome.t_boot),
    )  # fmt: skip


def _iv_arrays_on_device(params: BootstrapParams, design: DesignArrays, xp: Any) -> tuple[IvData, int, int]:
    """The IV variables on xp with nested fixed effects partialled out and singletons dropped."""
    from kernels.crve.fixef import FixedEffect, demean, drop_singletons, is_nested, recode

    cluster = design.clusters[0]
    columns = [design.y[:, None], design.x, design.endogenous[:, None], design.instruments]
    values = xp.asarray(np.concatenate(columns, axis=1))
    codes = xp.asarray(cluster.codes)
    effects = [FixedEffect(e.name, xp.asarray(e.codes), e.count) for e in design.fixed_effects]
    n_obs = values.shape[0]
    keep = xp.ones(n_obs, dtype=bool)
    if effects and params.fixef_rm == "singleton":
        keep = drop_singletons(xp, effects, keep)
    n_kept = int(keep.sum())
    if n_kept < n_obs:
        values = values[keep]
        codes, _ = recode(xp, codes[keep])
        effects = [FixedEffect(e.name, *recode(xp, e.codes[keep])) for e in effects]
    n_clusters = int(to_host(codes.max())) + 1
    for effect in effects:
        if not is_nested(xp, effect.codes, effect.count, codes):
            raise ValueError(
                f"formula: with an IV formula the fixed effect {effect.name!r} must be nested in the clusters (the "
                "WRE bootstrap partials it out); add a crossing one as C(column)"
            )
    if effects:
        values = demean(xp, values, effects, None, params.fixef_method, params.fixef_tol, params.fixef_maxiter).values
    kx = design.x.shape[1]
    data = IvData(y=values[:, 0], exogenous=values[:, 1 : 1 + kx], endogenous=values[:, 1 + kx],
                  instruments=values[:, 2 + kx :], cluster=codes, n_clusters=n_clusters,
                  n_absorbed=1 if effects else 0)  # fmt: skip
    return data, n_kept, n_obs - n_kept


# The examples run through run_kind on NumPy in CI and on the GPU in the cross-backend test, so each exercises
# its kind's GPU code. crve_bootstrap: a fixed effect crossing the clusters (demeaning, the pair-statistics
# kernel, the fixed-effect correction's sparse products), the weights kernel (B draws, 2^30 > B: no
# enumeration) and the confidence interval. crve_montecarlo: the WCR bootstrap test, which runs both the
# CGM data kernel and the batched weights kernel (the CRV1 test runs only the first).
KINDS = [
    JobKind(
        name=BOOTSTRAP_KIND,
        params_model=BootstrapParams,
        result_model=BootstrapResult,
        run=run_bootstrap,
        dataset_fields=("dataset_id",),
        summary="Wild (cluster) bootstrap tests of linear restrictions (WCR/WCU, fast and wild): several fixed "
        "effects, multiway CRV1 or HC1, weights; bootstrap-t with CI by inversion, or bootstrap Wald",
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
        work=bootstrap_work,
        cpu_max_work=DEFAULT_BOOTSTRAP_CPU_MAX_WORK,
        split_module="kernels.crve.bootstrap_chunks",
        plots_module="plots.crve",
    ),
    JobKind(
        name=MONTECARLO_KIND,
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
        work=montecarlo_work,
        cpu_max_work=DEFAULT_MONTECARLO_CPU_MAX_WORK,
        split_module="kernels.crve.montecarlo_chunks",
        plots_module="plots.crve",
    ),
]
