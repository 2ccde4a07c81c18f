"""SCCS study design to eras: several exposures with their own risk windows, restrictions of the study population,
and age, season and calendar time as spline covariates (SelfControlledCaseSeries' ``createStudyPopulation`` and
``createSccsIntervalData``; ``docs/sccs.md``, *Study design*).

Host-side NumPy on top of the vectorised era builder of :mod:`kernels.sccs.data`: the windows of every
exposure become risk windows of their own covariate; month boundaries cut the observation periods when a time
spline is on, and each piece carries one more "rank", its class of equal time-covariate values, so that pieces
merge into one era only when their exposures AND their spline values are equal. The spline values are written
as continuous ``covariateValue`` entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernels.sccs import splines
from kernels.sccs.data import (
    IntervalTables,
    PersonData,
    RiskWindows,
    cut_pieces,
    drug_sets,
    era_tables,
    events_per_piece,
    person_data,
    risk_windows,
)

# SelfControlledCaseSeries' covariate ids: spline components from these offsets, window covariates from 1000.
AGE_ID_OFFSET = 100
SEASON_ID_OFFSET = 200
CALENDAR_TIME_ID_OFFSET = 300
RESERVED_IDS = range(AGE_ID_OFFSET, 400)
FIRST_WINDOW_ID = 1000
DAYS_PER_YEAR = 365.25
# Months are numbered as SelfControlledCaseSeries numbers them: year * 12 + month - 1.
_EPOCH_MONTH = 1970 * 12
_NO_NEXT_ERA = np.iinfo(np.int64).max // 4
# Month boundaries the time splines may add (about 1.6 GB of int64 work arrays): 1.7M cases observed 10 years.
_MAX_MONTH_CUTS = 200_000_000


@dataclass(frozen=True)
class Window:
    """One risk window of an exposure: ``[start_anchor + start, end_anchor + end]`` (inclusive days)."""

    start: int
    start_anchor: str  # "exposure_start" or "exposure_end"
    end: int
    end_anchor: str
    covariate_id: int
    name: str


@dataclass(frozen=True)
class Exposure:
    """Exposure rows of any of ``drug_ids``, merged into eras, with their windows."""

    drug_ids: tuple[int, ...]
    windows: tuple[Window, ...]
    first_occurrence_only: bool = False


@dataclass(frozen=True)
class LegacyWindow:
    """The single window of the original ``sccs_eras`` spec, over every drug (covariateId = drugId)."""

    start: int = 0
    end: int = 0
    start_anchor: str = "exposure_start"
    end_anchor: str = "exposure_end"


@dataclass(frozen=True)
class Population:
    """Restrictions of the observation periods (SelfControlledCaseSeries' ``createStudyPopulation``)."""

    min_age_years: float | None = None
    max_age_years: float | None = None
    min_observation_days: int = 0


@dataclass(frozen=True)
class Spline:
    """A time spline: exact knots, or a count of knots placed from the data (SelfControlledCaseSeries' rules)."""

    knots: tuple[float, ...] | int
    degree: int = 2


@dataclass(frozen=True)
class Design:
    exposures: tuple[Exposure, ...] | None = None  # None: the legacy window over every drug
    legacy: LegacyWindow = field(default_factory=LegacyWindow)
    population: Population = field(default_factory=Population)
    age: Spline | None = None
    season: Spline | None = None
    calendar_time: Spline | None = None

    @property
    def needs_age(self) -> bool:
        return self.age is not None or self.population.min_age_years is not None or (
            self.population.max_age_years is not None)


@dataclass(frozen=True)
class CovariateName:
    covariate_id: int
    name: str
    source: str  # "exposure_window", "drug", "age", "season", "calendar_time"


@dataclass(frozen=True)
class StudyEras:
    tables: IntervalTables
    covariates: list[CovariateName]
    cases_removed: int  # by the population restrictions
    events_inside: int  # events inside the (restricted) observation periods of the kept cases
    knots: dict[str, list[float]]  # the knots used: age in days, season in months, calendar time in months


@dataclass(frozen=True)
class PersonInputs:
    """The person-level tables as arrays (days are integers: dates as days since 1970-01-01)."""

    case_id: np.ndarray
    observation_start: np.ndarray
    observation_end: np.ndarray
    event_case: np.ndarray
    event_day: np.ndarray
    exposure_case: np.ndarray
    exposure_drug: np.ndarray
    exposure_start: np.ndarray
    exposure_end: np.ndarray
    age_at_observation_start: np.ndarray | None = None  # days, per case


# -- the study population ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Population:
    person: PersonData  # restricted periods; removed cases, their events and exposures left out
    original_start: np.ndarray  # observation start before the restriction (the age reference), per kept case
    age_at_start: np.ndarray | None  # ageAtObsStart of each kept case
    removed: int


def _restricted(person: PersonData, age: np.ndarray | None, population: Population) -> _Population:
    """Observation periods cut to the age range and cases below the minimum observation time removed.

    As SelfControlledCaseSeries: the first day kept has age >= min_age_years * 365.25 days, the last one age <=
    round((max_age_years + 1) * 365.25) - 1 days; exposures before the new start still set the exposure status
    after it; events outside the new period are ignored."""
    start, end = person.obs_start.copy(), person.obs_end.copy()
    if population.min_age_years is not None:
        assert age is not None
        start = np.maximum(start, person.obs_start + math.ceil(population.min_age_years * DAYS_PER_YEAR) - age)
    if population.max_age_years is not None:
        assert age is not None
        last_age = round((population.max_age_years + 1) * DAYS_PER_YEAR) - 1
        end = np.minimum(end, person.obs_start + last_age - age)
    keep = end - start + 1 >= max(1, population.min_observation_days)
    new_position = np.cumsum(keep) - 1
    event_kept = keep[person.event_owner]
    exposure_kept = keep[person.exposure_owner]
    restricted = PersonData(
        case_id=person.case_id[keep], obs_start=start[keep], obs_end=end[keep],
        event_owner=new_position[person.event_owner[event_kept]], event_day=person.event_day[event_kept],
        exposure_owner=new_position[person.exposure_owner[exposure_kept]],
        exposure_drug=person.exposure_drug[exposure_kept], exposure_start=person.exposure_start[exposure_kept],
        exposure_end=person.exposure_end[exposure_kept],
    )
    return _Population(restricted, person.obs_start[keep], None if age is None else age[keep],
                       int(np.sum(~keep)))


# -- exposures to risk windows ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Eras:
    """Exposure rows of one exposure merged per case (overlapping or adjacent rows form one era)."""

    owner: np.ndarray
    start: np.ndarray
    end: np.ndarray
    next_start: np.ndarray  # start of the case's next era of this exposure (_NO_NEXT_ERA for the last)


def _merge_eras(owner: np.ndarray, start: np.ndarray, end: np.ndarray, first_only: bool) -> _Eras:
    order = np.lexsort((start, owner))
    owner, start, end = owner[order], start[order], end[order]
    if owner.size == 0:
        return _Eras(owner, start, end, start)
    # The running maximum of the ends within each case: offset by case so one accumulate serves every case.
    base, span = int(end.min()), int(end.max() - end.min()) + 1
    running = np.maximum.accumulate(owner * span + (end - base)) - owner * span + base
    new_case = np.ones(owner.size, dtype=bool)
    new_case[1:] = owner[1:] != owner[:-1]
    new_era = new_case.copy()
    new_era[1:] |= start[1:] > running[:-1] + 1
    first = np.flatnonzero(new_era)
    eras = _Eras(owner[first], start[first], np.maximum.reduceat(end, first), np.empty(first.size, np.int64))
    same_case_next = np.zeros(first.size, dtype=bool)
    same_case_next[:-1] = eras.owner[1:] == eras.owner[:-1]
    eras.next_start[:] = _NO_NEXT_ERA
    eras.next_start[:-1][same_case_next[:-1]] = eras.start[1:][same_case_next[:-1]]
    if first_only:
        is_first = new_case[first]
        return _Eras(eras.owner[is_first], eras.start[is_first], eras.end[is_first],
                     np.full(int(is_first.sum()), _NO_NEXT_ERA, dtype=np.int64))
    return eras


def _exposure_windows(person: PersonData, exposures: tuple[Exposure, ...]) -> RiskWindows:
    """The windows of every exposure's eras, clipped to the observation periods (empty ones dropped).

    As SelfControlledCaseSeries (``addCovariateEras``): a window of an era ends at the latest the day before the
    case's next era of the same exposure starts; with ``first_occurrence_only`` only the case's first era
    counts (the first in the exposures table, whether or not it lies in the observation period)."""
    covariate_ids = np.array([w.covariate_id for e in exposures for w in e.windows], dtype=np.int64)
    sorted_ids = np.sort(covariate_ids)
    by_drug = np.argsort(person.exposure_drug, kind="stable")
    sorted_drugs = person.exposure_drug[by_drug]
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for exposure in exposures:
        drugs = np.unique(np.asarray(exposure.drug_ids, dtype=np.int64))
        lo, hi = np.searchsorted(sorted_drugs, drugs, "left"), np.searchsorted(sorted_drugs, drugs, "right")
        rows = by_drug[np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)] or [np.zeros(0, int)])]
        eras = _merge_eras(person.exposure_owner[rows], person.exposure_start[rows], person.exposure_end[rows],
                           exposure.first_occurrence_only)
        for window in exposure.windows:
            first = eras.start if window.start_anchor == "exposure_start" else eras.end
            last = eras.end if window.end_anchor == "exposure_end" else eras.start
            start = np.maximum(first + window.start, person.obs_start[eras.owner])
            end = np.minimum(np.minimum(last + window.end, eras.next_start - 1), person.obs_end[eras.owner])
            keep = start <= end
            rank = np.full(int(keep.sum()), int(np.searchsorted(sorted_ids, window.covariate_id)), dtype=np.int64)
            parts.append((eras.owner[keep], start[keep], end[keep], rank))
    owner, start, end, rank = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)
                               for i in range(4))
    return RiskWindows(owner, start, end, rank, sorted_ids)


# -- time covariates --------------------------------------------------------------------------------------

def _month_of(days: np.ndarray) -> np.ndarray:
    """Month number since 1970-01 of each day number (days since 1970-01-01)."""
    return np.asarray(days, dtype=np.int64).astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)


def _first_day_of(months: np.ndarray) -> np.ndarray:
    return np.asarray(months, dtype=np.int64).astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)


def _month_cuts(person: PersonData) -> tuple[np.ndarray, np.ndarray]:
    """(case position, day) of the first day of every calendar month after each case's observation start."""
    first, last = _month_of(person.obs_start), _month_of(person.obs_end)
    count = last - first
    if int(count.sum()) > _MAX_MONTH_CUTS:
        raise ValueError(f"the observation periods span {int(count.sum()):,} calendar months in all, more than the "
                         f"{_MAX_MONTH_CUTS:,} the time splines can split into (check observationStart/End)")
    owner = np.repeat(np.arange(person.n_cases, dtype=np.int64), count)
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(count)])
    month = first[owner] + 1 + np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][owner]
    return owner, _first_day_of(month)


@dataclass(frozen=True)
class _TimeBasis:
    """The spline columns of the time covariates: ids, names, and the knots used."""

    ids: list[int] = field(default_factory=list)
    names: list[CovariateName] = field(default_factory=list)
    knots: dict[str, list[float]] = field(default_factory=dict)


def _age_knots(spec: Spline, event_age: np.ndarray, age_range: tuple[int, int]) -> np.ndarray:
    if isinstance(spec.knots, int):
        if event_age.size == 0:
            raise ValueError("age.knots: no event inside the observation periods to place the knots at")
        # SelfControlledCaseSeries: quantiles 1%..99% of the ages at the events (R's default type 7).
        knots = np.unique(np.quantile(event_age.astype(np.float64), np.linspace(0.01, 0.99, spec.knots)))
    else:
        knots = np.asarray(spec.knots, dtype=np.float64)
    _check_knots("age.knots", knots, age_range, "days of age")
    return knots


def _calendar_knots(spec: Spline, person: PersonData, month_range: tuple[int, int]) -> np.ndarray:
    if isinstance(spec.knots, int):
        # SelfControlledCaseSeries: the months where the running count of observed person-months passes
        # 0.5%..99.5% of its total.
        first, last = _month_of(person.obs_start), _month_of(person.obs_end)
        base = int(first.min())
        changes = np.zeros(int(last.max()) - base + 2, dtype=np.int64)
        np.add.at(changes, first - base, 1)
        np.add.at(changes, last - base + 1, -1)
        observed = np.cumsum(changes)[:-1]
        cumulative = np.cumsum(observed)
        cutoffs = cumulative[-1] * np.linspace(0.005, 0.995, spec.knots)
        knots = np.unique(base + np.searchsorted(cumulative, cutoffs, side="left")).astype(np.float64)
    else:
        knots = np.asarray(spec.knots, dtype=np.float64) - _EPOCH_MONTH
    _check_knots("calendar_time.knots", knots, month_range, "months", offset=_EPOCH_MONTH)
    return knots


def _check_knots(name: str, knots: np.ndarray, observed: tuple[int, int], unit: str, offset: int = 0) -> None:
    if knots.size < 2:
        raise ValueError(f"{name}: fewer than 2 distinct knots ({knots.size}) could be placed")
    outside = knots[(knots < observed[0]) | (knots > observed[1])]
    if outside.size:
        raise ValueError(f"{name}: knot {outside[0] + offset:g} lies outside the observed range "
                         f"{observed[0] + offset}-{observed[1] + offset} ({unit})")


def _season_knots(spec: Spline) -> np.ndarray:
    if isinstance(spec.knots, int):
        return 0.5 + np.linspace(0.0, 12.0, spec.knots)  # SelfControlledCaseSeries' even spread over the year
    return np.asarray(spec.knots, dtype=np.float64)


@dataclass(frozen=True)
class _TimeCovariates:
    piece_class: np.ndarray  # per piece: its class of equal time-covariate values
    values: np.ndarray  # (classes, spline columns)
    basis: _TimeBasis


def _time_covariates(design: Design, population: _Population, piece_case: np.ndarray, piece_start: np.ndarray,
                     ) -> _TimeCovariates:
    """Per piece, the month it lies in gives its spline values: age at the month's first observed day, the
    month of the year, the calendar month (SelfControlledCaseSeries' ``addMonthEras``); ages and months beyond
    the boundary knots take the boundary's values."""
    person = population.person
    month = _month_of(piece_start)
    first_observed = np.maximum(_first_day_of(month), person.obs_start[piece_case])
    basis = _TimeBasis()
    columns: list[np.ndarray] = []
    blocks: list = []
    if design.age is not None:
        assert population.age_at_start is not None
        age_of = population.age_at_start - population.original_start  # age = day + this, per case
        age_range = (int(np.min(person.obs_start + age_of)), int(np.max(person.obs_end + age_of)))
        inside = (person.event_day >= person.obs_start[person.event_owner]) & (
            person.event_day <= person.obs_end[person.event_owner])
        event_age = person.event_day[inside] + age_of[person.event_owner[inside]]
        knots = _age_knots(design.age, event_age, age_range)
        columns.append(np.clip(first_observed + age_of[piece_case], knots[0], knots[-1]).astype(np.float64))
        blocks.append(("age", knots, design.age.degree))
    if design.season is not None:
        columns.append((np.mod(month, 12) + 1).astype(np.float64))
        blocks.append(("season", _season_knots(design.season), design.season.degree))
    if design.calendar_time is not None:
        month_range = (int(_month_of(person.obs_start).min()), int(_month_of(person.obs_end).max()))
        knots = _calendar_knots(design.calendar_time, person, month_range)
        columns.append(np.clip(month, knots[0], knots[-1]).astype(np.float64))
        blocks.append(("calendar_time", knots, design.calendar_time.degree))
    keys, piece_class = _distinct_rows(columns)
    values = [_spline_block(source, keys[i], knots, degree, basis) for i, (source, knots, degree)
              in enumerate(blocks)]
    return _TimeCovariates(piece_class, np.concatenate(values, axis=1), basis)


def _distinct_rows(columns: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct rows of the columns (each column's values at them) and each row's number among them: every
    column coded by a 1-d unique, the codes combined into one int64 (far faster than ``np.unique(axis=0)``)."""
    key = np.zeros(columns[0].size, dtype=np.int64)
    levels = []
    for column in columns:
        level, code = np.unique(column, return_inverse=True)
        key = key * level.size + code.reshape(-1)
        levels.append(level)
    distinct, row_class = np.unique(key, return_inverse=True)
    values = []
    for level in reversed(levels):
        values.append(level[distinct % level.size])
        distinct = distinct // level.size
    return values[::-1], row_class.reshape(-1).astype(np.int64)


def _spline_block(source: str, x: np.ndarray, knots: np.ndarray, degree: int, basis: _TimeBasis) -> np.ndarray:
    """The basis columns of one time covariate at ``x``, their ids and names recorded in ``basis``."""
    if source == "season":
        x = knots[0] + np.mod(x - knots[0], knots[-1] - knots[0])  # month of the year inside the knots' cycle
        # The cyclic basis sums to one: the case's own baseline absorbs that, so the first component is the
        # reference and left out (SelfControlledCaseSeries keeps it, leaving the fit one flat direction).
        values = splines.cyclic_basis(x, knots, degree)[:, 1:]
        first_component, offset, label = 2, SEASON_ID_OFFSET + 1, "Seasonality spline component"
        basis.knots["season"] = knots.tolist()
    else:
        values = splines.bs_basis(x, knots, degree)
        first_component = 1
        offset, label = ((AGE_ID_OFFSET, "Age spline component") if source == "age"
                         else (CALENDAR_TIME_ID_OFFSET, "Calendar time spline component"))
        basis.knots[source] = (knots + (_EPOCH_MONTH if source == "calendar_time" else 0)).tolist()
    for i in range(values.shape[1]):
        basis.ids.append(offset + i)
        basis.names.append(CovariateName(offset + i, f"{label} {first_component + i}", source))
    return values


# -- the tables -------------------------------------------------------------------------------------------

def _with_time_values(tables: IntervalTables, time: _TimeCovariates) -> IntervalTables:
    """Replace each row's time-class placeholder entry (a negative id) by its non-zero spline values: within a
    row the window covariates (increasing id), then the spline components (increasing id). Both kinds of entry
    come grouped by row, so each is scattered to its place without a sort."""
    placeholder = tables.cov_id < 0
    n_columns = time.values.shape[1]
    flat = time.values[-1 - tables.cov_id[placeholder]].reshape(-1)
    nonzero = np.flatnonzero(flat)
    spline_rows = tables.cov_row_id[placeholder][nonzero // n_columns]
    window_rows = tables.cov_row_id[~placeholder]
    n_rows = tables.row_id.size
    window_count = np.bincount(window_rows, minlength=n_rows)
    spline_count = np.bincount(spline_rows, minlength=n_rows)
    row_start = np.cumsum(window_count + spline_count) - (window_count + spline_count)
    window_at = row_start[window_rows] + _rank_within_runs(window_rows, window_count)
    spline_at = row_start[spline_rows] + window_count[spline_rows] + _rank_within_runs(spline_rows, spline_count)
    size = window_rows.size + spline_rows.size
    row_id, cov_id, cov_value = (np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.float64))
    row_id[window_at], row_id[spline_at] = window_rows, spline_rows
    cov_id[window_at] = tables.cov_id[~placeholder]
    cov_id[spline_at] = np.asarray(time.basis.ids, dtype=np.int64)[nonzero % n_columns]
    cov_value[window_at], cov_value[spline_at] = tables.cov_value[~placeholder], flat[nonzero]
    return IntervalTables(tables.row_id, tables.stratum_id, tables.time, tables.y, row_id, cov_id, cov_value)


def _rank_within_runs(sorted_rows: np.ndarray, count_per_row: np.ndarray) -> np.ndarray:
    """The position of each entry within its row, for entries sorted by row."""
    first_of_row = np.cumsum(count_per_row) - count_per_row
    return np.arange(sorted_rows.size, dtype=np.int64) - first_of_row[sorted_rows]


def _window_names(design: Design, windows: RiskWindows) -> list[CovariateName]:
    if design.exposures is None:
        return [CovariateName(int(d), f"drug {int(d)}", "drug") for d in windows.drug_ids.tolist()]
    return sorted((CovariateName(w.covariate_id, w.name, "exposure_window") for e in design.exposures
                   for w in e.windows), key=lambda c: c.covariate_id)


def _check_id_clash(names: list[CovariateName], time_ids: list[int]) -> None:
    clash = sorted({c.covariate_id for c in names} & set(time_ids))
    if clash:
        raise ValueError(f"exposures: covariateId {clash[0]} (drugId) is also a spline component's id (100-399 are "
                         "reserved for the age, season and calendar-time splines); give the windows their own ids "
                         "through exposures")


def study_eras(inputs: PersonInputs, design: Design) -> StudyEras:
    """The Cyclops interval tables of a study design (see the module docstring and ``docs/sccs.md``)."""
    person = person_data(inputs.case_id, inputs.observation_start, inputs.observation_end, inputs.event_case,
                          inputs.event_day, inputs.exposure_case, inputs.exposure_drug, inputs.exposure_start,
                          inputs.exposure_end)
    age = None if inputs.age_at_observation_start is None else np.asarray(inputs.age_at_observation_start, np.int64)
    if design.needs_age and age is None:
        raise ValueError("cases.ageAtObsStart is needed for the age spline and the age restrictions")
    population = _restricted(person, age, design.population)
    kept = population.person
    if kept.n_cases == 0:
        raise ValueError("cases table has no rows" if population.removed == 0 else
                         f"study_population: no case is left after the restrictions ({population.removed} removed)")
    if design.exposures is None:
        legacy = design.legacy
        windows = risk_windows(kept, legacy.start, legacy.end, legacy.start_anchor, legacy.end_anchor)
    else:
        windows = _exposure_windows(kept, design.exposures)
    names = _window_names(design, windows)
    n_window_ranks = int(windows.drug_ids.size)
    uses_time = design.age is not None or design.season is not None or design.calendar_time is not None
    pieces = cut_pieces(kept, windows, _month_cuts(kept) if uses_time else None)
    time = _time_covariates(design, population, pieces.case, pieces.start) if uses_time else None
    n_ranks = max(n_window_ranks + (time.values.shape[0] if time else 0), 1)
    sets = drug_sets(pieces, windows, n_ranks, None if time is None else n_window_ranks + time.piece_class)
    rank_ids = windows.drug_ids.astype(np.int64)
    if time is not None:
        _check_id_clash(names, time.basis.ids)
        rank_ids = np.concatenate([rank_ids, -1 - np.arange(time.values.shape[0], dtype=np.int64)])
    tables = era_tables(kept, pieces, sets, rank_ids, events_per_piece(kept, pieces), n_ranks)
    if time is not None:
        tables = _with_time_values(tables, time)
        names = names + time.basis.names
    inside = (kept.event_day >= kept.obs_start[kept.event_owner]) & (kept.event_day <= kept.obs_end[kept.event_owner])
    return StudyEras(tables, names, population.removed, int(inside.sum()), {} if time is None else time.basis.knots)
