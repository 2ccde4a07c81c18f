"""The ``sccs_analyses`` job: many single-exposure analyses of one or several outcomes' tables, each
exposure-outcome pair alone (``kernels/sccs/analyses.py``), with their MDRRs and, given controls, empirical
calibration over all the pairs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kernels.backend import is_numpy, to_host
from kernels.context import RunContext
from kernels.sccs import diagnostics as diag
from kernels.sccs import transfer
from kernels.sccs.analyses import SingleFits, single_covariate_fits
from kernels.sccs.data import BuiltData, build_from_tables
from kernels.sccs.outcomes import outcome_of_rows, pair_columns
from kernels.sccs.result_fields import (
    calibrate_estimates,
    calibrated_fields,
    calibration_summary,
    finite_or_none,
    relative_incidence,
    relative_incidence_or_none,
)
from kernels.sccs.spec import AnalysisRow, SccsAnalysesParams, SccsAnalysesResult
from kernels.sccs.tables import covariate_names, table_columns


@dataclass(frozen=True)
class AnalysesData:
    """The tables built for the analyses: per column of ``built.data`` its covariateId, its outcomeId (None
    for tables of one outcome) and its name."""

    built: BuiltData
    covariate: np.ndarray
    outcome: np.ndarray | None
    names: list[str | None]


def load_analyses(params: SccsAnalysesParams, ctx: RunContext) -> tuple[AnalysesData, np.ndarray]:
    """The analyses' tables, built on the job's device once per job and worker process (a fanned-out job's finish
    reuses what its chunk built on the same worker: ``kernels/sccs/analyses_chunks.py``), and the columns to
    analyse in the result's order."""
    tables = ctx.reuse(("sccs analyses tables",), lambda: _load_analyses_data(ctx))
    return tables, _analysis_columns(params, tables)


def _load_analyses_data(ctx: RunContext) -> AnalysesData:
    """Tables of one outcome as ``sccs_fit`` reads them; stacked tables (``outcomeId``) with one column per
    exposure-outcome pair (``kernels/sccs/outcomes.py``)."""
    with ctx.stage("tables"):
        outcomes_frame, covariates_frame = ctx.dataset("outcomes_dataset_id"), ctx.dataset("covariates_dataset_id")
        owner = outcome_of_rows(outcomes_frame)
        columns = table_columns(outcomes_frame, covariates_frame)
        pairs = None if owner is None else pair_columns(columns, owner)
        if pairs is not None:
            columns = pairs.columns
    if not is_numpy(ctx.xp):
        with ctx.stage("to_device"):
            columns = {name: transfer.to_device(ctx.xp, values) for name, values in columns.items()}
    with ctx.stage("build"):
        built = build_from_tables(**columns, xp=ctx.xp)
    column_ids = np.asarray(to_host(built.data.covariate_ids), dtype=np.int64)
    covariate = column_ids if pairs is None else pairs.covariate[column_ids]
    outcome = None if pairs is None else pairs.outcome[column_ids]
    return AnalysesData(built, covariate, outcome, covariate_names(ctx.optional_dataset("names_dataset_id"), covariate))


def _analysis_columns(params: SccsAnalysesParams, tables: AnalysesData) -> np.ndarray:
    """The columns to analyse, in the result's order: the pairs as given, or by outcome and then exposure."""
    covariate, outcome = tables.covariate.tolist(), tables.outcome
    outcomes = [None] if outcome is None else sorted(set(outcome.tolist()))
    if outcome is None and params.outcome_ids is not None:
        raise ValueError("outcome_ids: the outcomes table has no outcomeId column (it holds one outcome)")
    column_of = {(c, None if outcome is None else int(outcome[j])): j for j, c in enumerate(covariate)}
    if params.pairs is not None:
        chosen = []
        for i, pair in enumerate(params.pairs):
            if outcome is None and pair.outcome_id is not None:
                raise ValueError(f"pairs.{i}.outcome_id: the outcomes table has no outcomeId column")
            candidates = outcomes if pair.outcome_id is None else [pair.outcome_id]
            found = [column_of[(pair.covariate_id, o)] for o in candidates if (pair.covariate_id, o) in column_of]
            if not found:
                where = "" if pair.outcome_id is None else f" with outcome {pair.outcome_id}"
                raise ValueError(f"pairs.{i}: covariateId {pair.covariate_id} has no era{where} in the tables")
            chosen.extend(found)
        return np.asarray(chosen, dtype=np.int64)
    if params.outcome_ids is not None:
        unknown = sorted(set(params.outcome_ids) - set(outcomes))
        if unknown:
            raise ValueError(f"outcome_ids: {unknown[0]} is not an outcomeId of the outcomes table")
        outcomes = sorted(params.outcome_ids)
    wanted = list(dict.fromkeys(covariate)) if params.exposures is None else params.exposures
    unknown = sorted(set(wanted) - set(covariate))
    if unknown:
        raise ValueError(f"exposures: covariateId {unknown[0]} is not a covariate of the tables "
                         f"(unknown: {unknown[:10]})")
    return np.asarray([column_of[(c, o)] for o in outcomes for c in wanted if (c, o) in column_of], dtype=np.int64)


def run_analyses(params: SccsAnalysesParams, ctx: RunContext, computed: SingleFits | None = None) -> SccsAnalysesResult:
    """The ``sccs_analyses`` job: every exposure alone on each outcome's tables, one batch on the job's device
    (kernels/sccs/analyses.py), then the MDRRs and, with controls, empirical calibration over all the pairs.
    ``computed``: the analyses' fits in the result's order, computed by a fanned-out job's chunks."""
    ctx.progress(0.0, "loading tables")
    tables, columns = load_analyses(params, ctx)
    data = tables.built.data
    pair_covariate = tables.covariate[columns]
    pair_outcome = [None] * columns.size if tables.outcome is None else tables.outcome[columns].tolist()
    if computed is None:
        ctx.progress(0.2, f"fitting {columns.size} analyses")
        with ctx.stage("analyses"):
            fits = single_covariate_fits(data, columns, params.level)
    elif computed.estimate.size != columns.size:
        raise ValueError(f"the chunks fitted {computed.estimate.size} analyses and this job has {columns.size}")
    else:
        fits = computed
    with ctx.stage("diagnostics"):
        statistics = diag.exposure_statistics(data)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(statistics.time_total > 0, statistics.time_exposed / statistics.time_total, 0.0)
        mdrr = diag.minimum_detectable_relative_risk(share[columns], statistics.events[columns])
    z = float(stats.norm.ppf((1.0 + params.level) / 2.0))
    se = (fits.upper - fits.lower) / (2.0 * z)  # NaN for an open interval: not calibrated, not in the null
    negative = np.array([any(pair.matches(int(c), o) for pair in params.negative_pairs())
                         for c, o in zip(pair_covariate.tolist(), pair_outcome, strict=True)], dtype=bool)
    positive_true = np.array([_positive_effect(params, int(c), o)
                              for c, o in zip(pair_covariate.tolist(), pair_outcome, strict=True)])
    rows = [_analysis_row(a, int(column), fits, statistics, mdrr[a], tables, bool(negative[a]), positive_true[a])
            for a, column in enumerate(columns.tolist())]
    summary = None
    if params.negative_controls:
        if int(negative.sum()) < 2:
            raise ValueError(f"negative_controls: {int(negative.sum())} analysed pair(s) match them; the null needs "
                             "at least 2")
        with ctx.stage("calibration"):
            result = calibrate_estimates(np.where(np.isfinite(fits.estimate), fits.estimate, np.nan), se,
                                         negative, np.log(positive_true), params.level)
        rows = [row.model_copy(update=update) for row, update in zip(rows, calibrated_fields(result), strict=True)]
        summary = calibration_summary(result, params.level)
    ctx.save_artifact("analyses", pd.DataFrame([row.model_dump() for row in rows]))
    n_outcomes = None if tables.outcome is None else int(np.unique(tables.outcome).size)
    return SccsAnalysesResult(analyses=rows, calibration=summary, level=params.level, n_cases=data.n_cases,
                              n_eras=data.n_eras, n_outcomes=n_outcomes, dropped_cases=tables.built.dropped_cases)


def _positive_effect(params: SccsAnalysesParams, covariate_id: int, outcome_id: int | None) -> float:
    """The known relative risk of a positive-control pair, NaN for any other pair."""
    for control in params.positive_controls:
        if control.covariate_id == covariate_id and control.outcome_id in (None, outcome_id):
            return control.true_relative_risk
    return math.nan


def _analysis_row(a: int, column: int, fits: SingleFits, statistics: diag.ExposureStatistics, mdrr: float,
                  tables: AnalysesData, negative: bool, true_relative_risk: float) -> AnalysisRow:
    estimate = float(fits.estimate[a])
    lower, upper = finite_or_none(float(fits.lower[a])), finite_or_none(float(fits.upper[a]))
    positive = not math.isnan(true_relative_risk)
    return AnalysisRow(
        covariate_id=int(tables.covariate[column]),
        outcome_id=None if tables.outcome is None else int(tables.outcome[column]),
        name=tables.names[column], control="negative" if negative else ("positive" if positive else None),
        true_relative_risk=true_relative_risk if positive else None,
        estimate=finite_or_none(estimate),
        relative_incidence=0.0 if estimate == -math.inf else finite_or_none(relative_incidence(estimate)),
        ci_lower=lower, ci_upper=upper,
        relative_incidence_ci_lower=relative_incidence_or_none(lower),
        relative_incidence_ci_upper=relative_incidence_or_none(upper),
        p=float(fits.p_value[a]), log_likelihood_ratio=float(fits.log_likelihood_ratio[a]),
        exposed_cases=int(statistics.exposed_cases[column]), events=float(statistics.events[column]),
        mdrr=finite_or_none(float(mdrr)),
    )
