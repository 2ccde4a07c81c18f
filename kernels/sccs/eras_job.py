"""The ``sccs_eras`` job: person-level observation periods, events and exposures to the Cyclops interval
tables (outcomes, covariates and, with a study design, names), saved as artifacts, with their counts; with
``outcomeId`` in the events, one era build per outcome, stacked."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernels.context import RunContext
from kernels.sccs import study
from kernels.sccs.data import IntervalTables, eras_from_person_data
from kernels.sccs.dates import day_column
from kernels.sccs.spec import AGE_COLUMN, OUTCOME_COLUMN, EraCovariate, EraOutcome, SccsErasParams, SccsErasResult
from kernels.sccs.tables import event_outcomes, numeric_column


def _events_inside(case_id: np.ndarray, obs_start: np.ndarray, obs_end: np.ndarray, event_case: np.ndarray,
                   event_day: np.ndarray) -> int:
    """How many events fall inside their case's observation period."""
    position = pd.Series(np.arange(case_id.size), index=case_id)
    owner = position.loc[event_case].to_numpy() if event_case.size else np.zeros(0, dtype=np.int64)
    return int(np.sum((event_day >= obs_start[owner]) & (event_day <= obs_end[owner])))


def _study_design(params: SccsErasParams) -> study.Design:
    """The kernel's description of an ``sccs_eras`` spec that uses exposures, restrictions or time splines."""
    exposures = None
    if params.exposures is not None:
        exposures = tuple(
            study.Exposure(
                drug_ids=tuple(exposure.drug_ids),
                windows=tuple(study.Window(w.start, w.start_anchor, w.end, w.end_anchor, covariate_id,
                                           f"{exposure.describe()}: {w.describe()}")
                              for w, covariate_id in zip(exposure.windows, ids, strict=True)),
                first_occurrence_only=exposure.first_occurrence_only,
            )
            for exposure, ids in zip(params.exposures, params.window_covariate_ids(), strict=True)
        )
    population = params.study_population
    return study.Design(
        exposures=exposures,
        legacy=study.LegacyWindow(params.risk_window_start, params.risk_window_end, params.start_anchor,
                                  params.end_anchor),
        population=study.Population() if population is None else study.Population(
            population.min_age_years, population.max_age_years, population.min_observation_days),
        age=None if params.age is None else study.Spline(
            params.age.knots if isinstance(params.age.knots, int) else tuple(params.age.knots), params.age.degree),
        season=None if params.season is None else study.Spline(
            params.season.knots if isinstance(params.season.knots, int) else tuple(params.season.knots),
            params.season.degree),
        calendar_time=None if params.calendar_time is None else study.Spline(
            params.calendar_time.knots if isinstance(params.calendar_time.knots, int) else tuple(
                float(params.calendar_time.month_number(k)) for k in params.calendar_time.knots),
            params.calendar_time.degree),
    )


def _uses_study_design(params: SccsErasParams) -> bool:
    return any(getattr(params, name) is not None for name in ("exposures", "study_population", "age", "season",
                                                              "calendar_time"))


def _age_column(cases: pd.DataFrame) -> np.ndarray:
    """``ageAtObsStart`` in whole days, not negative (a bad row is named, data rows counted from 1)."""
    age = numeric_column(cases, "cases", AGE_COLUMN, integer=True)
    negative = np.flatnonzero(age < 0)
    if negative.size:
        raise ValueError(f"cases.{AGE_COLUMN} must be >= 0 (days of age): row {int(negative[0]) + 1} holds "
                         f"{int(age[negative[0]])}")
    return age


def _save_tables(ctx: RunContext, tables: IntervalTables, outcome: np.ndarray | None = None) -> None:
    outcomes = {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time,
                "y": tables.y.astype(np.int64)}
    if outcome is not None:
        outcomes[OUTCOME_COLUMN] = outcome
    ctx.save_artifact("outcomes", pd.DataFrame(outcomes))
    ctx.save_artifact("covariates", pd.DataFrame({
        "rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value,
    }))


def _cases_with_events(tables: IntervalTables) -> int:
    if tables.row_id.size == 0:
        return 0
    events_per_case = np.bincount(np.unique(tables.stratum_id, return_inverse=True)[1], weights=tables.y)
    return int(np.sum(events_per_case > 0))


def _eras_of(params: SccsErasParams, inputs: study.PersonInputs) -> tuple[IntervalTables, study.StudyEras | None]:
    """The tables of one outcome's events: the one-window spec's (``eras_from_person_data``), or the study
    design's (with what it reports)."""
    if not _uses_study_design(params):
        tables = eras_from_person_data(
            inputs.case_id, inputs.observation_start, inputs.observation_end, inputs.event_case,
            inputs.event_day, inputs.exposure_case, inputs.exposure_drug, inputs.exposure_start,
            inputs.exposure_end, params.risk_window_start, params.risk_window_end, params.end_anchor,
            params.start_anchor,
        )
        return tables, None
    built = study.study_eras(inputs, _study_design(params))
    return built.tables, built


def _of_outcome(inputs: study.PersonInputs, events: np.ndarray) -> study.PersonInputs:
    """The person-level inputs of one outcome: its events, and only the cases that have one (the others have
    no likelihood contribution: SelfControlledCaseSeries' cases of an outcome are the people with its event)."""
    cases = np.isin(inputs.case_id, inputs.event_case[events])
    exposures = np.isin(inputs.exposure_case, inputs.case_id[cases])
    age = inputs.age_at_observation_start
    return study.PersonInputs(
        inputs.case_id[cases], inputs.observation_start[cases], inputs.observation_end[cases],
        inputs.event_case[events], inputs.event_day[events], inputs.exposure_case[exposures],
        inputs.exposure_drug[exposures], inputs.exposure_start[exposures], inputs.exposure_end[exposures],
        None if age is None else age[cases],
    )


def _stacked(parts: list[IntervalTables]) -> IntervalTables:
    """Tables of several outcomes one after the other, rowIds renumbered to stay unique."""
    offsets = np.cumsum([0] + [part.row_id.size for part in parts])
    return IntervalTables(*(
        np.concatenate([getattr(part, name) + (offset if name in ("row_id", "cov_row_id") else 0)
                        for part, offset in zip(parts, offsets[:-1].tolist(), strict=True)])
        for name in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id", "cov_value")
    ))


def _eras_by_outcome(params: SccsErasParams, inputs: study.PersonInputs, event_outcome: np.ndarray, ctx: RunContext,
                     ) -> tuple[IntervalTables, np.ndarray, list[EraOutcome], study.StudyEras | None]:
    """Each outcome's tables (one era build per outcome), stacked, with each row's outcomeId."""
    parts, summaries, first_built = [], [], None
    outcome_ids = np.unique(event_outcome)
    for number, outcome_id in enumerate(outcome_ids.tolist()):
        ctx.progress(number / outcome_ids.size, f"eras of outcome {outcome_id} ({number + 1}/{outcome_ids.size})")
        events = event_outcome == outcome_id
        tables, built = _eras_of(params, _of_outcome(inputs, events))
        first_built = first_built or built
        inside = built.events_inside if built is not None else _events_inside(
            inputs.case_id, inputs.observation_start, inputs.observation_end, inputs.event_case[events],
            inputs.event_day[events])
        parts.append(tables)
        summaries.append(EraOutcome(
            outcome_id=outcome_id, n_cases_with_events=_cases_with_events(tables), n_eras=int(tables.row_id.size),
            events_in_observation=inside, events_outside_observation=int(events.sum() - inside),
            cases_removed=None if built is None else built.cases_removed,
            knots=None if built is None else (built.knots or None),
        ))
    stacked = _stacked(parts)
    outcome = np.repeat(outcome_ids, [part.row_id.size for part in parts])
    return stacked, outcome, summaries, first_built


def run_eras(params: SccsErasParams, ctx: RunContext) -> SccsErasResult:
    """The ``sccs_eras`` job: the Cyclops tables of person-level data, saved as artifacts, and their counts;
    with ``outcomeId`` in the events, one era build per outcome, stacked."""
    ctx.progress(0.0, "building eras")
    cases, events, exposures = (ctx.dataset("cases_dataset_id"), ctx.dataset("events_dataset_id"),
                                ctx.dataset("exposures_dataset_id"))
    with ctx.stage("eras"):
        obs_start = day_column(cases, "cases", "observationStart")
        obs_end = day_column(cases, "cases", "observationEnd")
        case_id = numeric_column(cases, "cases", "caseId", integer=True)
        event_case = numeric_column(events, "events", "caseId", integer=True)
        event_day = day_column(events, "events", "day")
        event_outcome = event_outcomes(events)
        inputs = study.PersonInputs(
            case_id, obs_start, obs_end, event_case, event_day,
            numeric_column(exposures, "exposures", "caseId", integer=True),
            numeric_column(exposures, "exposures", "drugId", integer=True),
            day_column(exposures, "exposures", "start"), day_column(exposures, "exposures", "end"),
            _age_column(cases) if params.needs_age() else None,
        )
        outcome, summaries = None, None
        if event_outcome is None:
            tables, built = _eras_of(params, inputs)
        else:
            tables, outcome, summaries, built = _eras_by_outcome(params, inputs, event_outcome, ctx)
    _save_tables(ctx, tables, outcome)
    counts = {"n_cases": int(case_id.size), "n_cases_with_events": _cases_with_events(tables) if summaries is None
              else sum(part.n_cases_with_events for part in summaries),
              "n_eras": int(tables.row_id.size), "n_covariate_rows": int(tables.cov_row_id.size), "outcomes": summaries}
    if summaries is not None:
        inside = sum(part.events_in_observation for part in summaries)
    elif built is None:
        inside = _events_inside(case_id, obs_start, obs_end, event_case, event_day)
    else:
        inside = built.events_inside
    counts |= {"events_in_observation": inside, "events_outside_observation": int(event_case.size - inside)}
    if built is None:
        return SccsErasResult(n_drugs=int(np.unique(tables.cov_id).size), **counts)
    ctx.save_artifact("names", pd.DataFrame({"covariateId": [c.covariate_id for c in built.covariates],
                                             "covariateName": [c.name for c in built.covariates]}))
    window_ids = [c.covariate_id for c in built.covariates if c.source in ("exposure_window", "drug")]
    removed = built.cases_removed if summaries is None else sum(part.cases_removed or 0 for part in summaries)
    return SccsErasResult(
        n_drugs=int(np.isin(np.unique(tables.cov_id), window_ids).sum()),
        covariates=[EraCovariate(covariate_id=c.covariate_id, name=c.name, source=c.source)
                    for c in built.covariates],
        cases_removed=removed, knots=(built.knots or None) if summaries is None else None, **counts,
    )
