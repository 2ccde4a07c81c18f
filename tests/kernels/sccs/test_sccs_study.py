"""SCCS study design to eras (kernels/sccs/study.py, splines.py): against a per-day brute force, the spline bases
against scipy, the conditional-Poisson fit with spline terms against statsmodels' Poisson GLM with case dummies,
and a simulated age effect recovered."""

from __future__ import annotations

import datetime
import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError
from scipy.interpolate import BSpline

from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import ccd, eras_job, splines
from kernels.sccs import study as st
from kernels.sccs.ccd import FitOptions
from kernels.sccs.data import IntervalTables, build_from_tables, eras_from_person_data
from kernels.sccs.model import Prior

TIGHT = FitOptions(tolerance=1e-10, convergence="gradient", max_iterations=5000)
EPOCH = datetime.date(1970, 1, 1)
DAY_2015 = (datetime.date(2015, 1, 1) - EPOCH).days


# -- the spline bases -----------------------------------------------------------------------------------

@pytest.mark.parametrize("degree", [1, 2, 3])
def test_bs_basis_is_scipys_bspline_without_its_first_column(degree: int) -> None:
    knots = np.array([100.0, 400.0, 450.0, 1200.0, 2000.0])
    x = np.concatenate([np.linspace(100, 2000, 397), knots, [399.999, 1999.5]])
    augmented = np.r_[[knots[0]] * (degree + 1), knots[1:-1], [knots[-1]] * (degree + 1)]
    expected = BSpline.design_matrix(x, augmented, degree).toarray()[:, 1:]
    got = splines.bs_basis(x, knots, degree)
    assert got.shape == (x.size, knots.size - 2 + degree)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-14)


def _periodic_reference(x: np.ndarray, knots: np.ndarray, degree: int) -> np.ndarray:
    """The periodic B-spline basis by its definition: B-splines on the knots repeated every period, each wrapped
    (summed over its shifts by whole periods)."""
    period = knots[-1] - knots[0]
    n = knots.size - 1
    repeated = np.concatenate([knots[:-1] + m * period for m in range(-2, 3)] + [[knots[-1] + 2 * period]])
    basis = np.zeros((x.size, n))
    for i in range(2 * n, 3 * n):  # one function per knot of the central period, wrapped by the shifts below
        local = repeated[i:i + degree + 2]
        element = BSpline.basis_element(local, extrapolate=False)  # NaN outside its support
        basis[:, i - 2 * n] = sum(np.nan_to_num(element(x + m * period)) for m in range(-2, 3))
    return basis


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_cyclic_basis_is_the_periodic_bspline_basis(degree: int) -> None:
    knots = np.array([0.5, 2.0, 5.5, 6.0, 9.0, 12.5])
    x = np.linspace(0.5, 12.5, 241)[:-1]
    got = splines.cyclic_basis(x, knots, degree)
    expected = _periodic_reference(x, knots, degree)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-14)  # a partition of unity, as the docs say
    # The same functions, possibly in another column order.
    matched = [int(np.argmin(np.abs(expected - got[:, [j]]).max(axis=0))) for j in range(got.shape[1])]
    assert sorted(matched) == list(range(got.shape[1]))
    np.testing.assert_allclose(got, expected[:, matched], rtol=0, atol=1e-13)
    # Periodic: the ends of the cycle agree.
    np.testing.assert_allclose(splines.cyclic_basis(np.array([0.5]), knots, degree),
                               splines.cyclic_basis(np.array([12.5]), knots, degree), atol=1e-15)


# -- random person data and the per-day brute force -------------------------------------------------------

def _random_inputs(seed: int, n_max: int = 30) -> st.PersonInputs:
    g = np.random.default_rng(seed)
    n = int(g.integers(2, n_max))
    case_id = g.permutation(np.arange(500, 500 + 3 * n))[:n]
    obs_start = DAY_2015 + g.integers(-60, 300, n)
    obs_end = obs_start + g.integers(0, 420, n)
    n_events, n_exposures = int(g.integers(1, 4 * n)), int(g.integers(0, 6 * n))
    exposure_start = DAY_2015 + g.integers(-120, 720, n_exposures)
    return st.PersonInputs(
        case_id=case_id, observation_start=obs_start, observation_end=obs_end,
        event_case=g.choice(case_id, n_events), event_day=DAY_2015 + g.integers(-80, 760, n_events),
        exposure_case=g.choice(case_id, n_exposures), exposure_drug=g.integers(1, 6, n_exposures),
        exposure_start=exposure_start, exposure_end=exposure_start + g.integers(0, 50, n_exposures),
        age_at_observation_start=g.integers(0, 30_000, n),
    )


def _random_design(seed: int, inputs: st.PersonInputs, time: bool = True) -> st.Design:
    g = np.random.default_rng(1000 + seed)
    anchors = ("exposure_start", "exposure_end")
    exposures = (
        st.Exposure((1, 2), (  # pre-exposure, on treatment, washout: disjoint for every exposure length
            st.Window(-int(g.integers(5, 40)), "exposure_start", -1, "exposure_start", 1000, "pre"),
            st.Window(0, "exposure_start", 0, "exposure_end", 1001, "on"),
            st.Window(1, "exposure_end", int(g.integers(1, 40)), "exposure_end", 1002, "washout"),
        ), first_occurrence_only=bool(seed % 2)),
        st.Exposure((3,), (st.Window(int(g.integers(-5, 5)), anchors[seed % 2], int(g.integers(5, 30)),
                                     anchors[(seed // 2) % 2], 1003, "risk"),), first_occurrence_only=seed % 3 == 0),
        st.Exposure((4, 5, 3), (st.Window(0, "exposure_start", 14, "exposure_start", 7, "two weeks"),)),
    )
    population = st.Population(
        min_age_years=float(g.uniform(0, 40)) if seed % 3 else None,
        max_age_years=float(g.uniform(45, 80)) if seed % 4 else None,
        min_observation_days=int(g.integers(0, 60)),
    )
    if not time:
        return st.Design(exposures=exposures, population=population)
    low, high = _kept_age_range(inputs, population)
    age_knots = np.sort(g.choice(np.arange(low, high + 1), 4, replace=False)).astype(float)
    month_low = 2015 * 12 + 1
    calendar_knots = (float(month_low), float(month_low + 7), float(month_low + 13))
    return st.Design(
        exposures=exposures, population=population,
        age=st.Spline(tuple(age_knots.tolist()), degree=int(g.integers(1, 4))),
        season=st.Spline(tuple((0.7 + np.array([0, 2.5, 6, 8, 12])).tolist()), degree=2),
        calendar_time=st.Spline(calendar_knots, degree=2) if seed % 2 else None,
    )


def _kept_days(inputs: st.PersonInputs, population: st.Population, i: int) -> list[int]:
    """The days of case i that the age restrictions keep (none if fewer than the minimum observation time)."""
    age0 = int(inputs.age_at_observation_start[i]) - int(inputs.observation_start[i])  # age on day d: d + age0
    days = [d for d in range(int(inputs.observation_start[i]), int(inputs.observation_end[i]) + 1)
            if (population.min_age_years is None or d + age0 >= population.min_age_years * 365.25)
            and (population.max_age_years is None or d + age0 <= round((population.max_age_years + 1) * 365.25) - 1)]
    return days if len(days) >= max(1, population.min_observation_days) else []


def _kept_age_range(inputs: st.PersonInputs, population: st.Population) -> tuple[int, int]:
    ages = [d + int(inputs.age_at_observation_start[i]) - int(inputs.observation_start[i])
            for i in range(inputs.case_id.size) for d in _kept_days(inputs, population, i)]
    return (min(ages), max(ages)) if ages else (0, 10)


def _merged_eras(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _day_windows(exposure: st.Exposure, spans: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(covariate, first day, last day) of every window of every era of the exposure, before clipping."""
    eras = _merged_eras(spans)
    if exposure.first_occurrence_only:
        eras = eras[:1]
    out = []
    for j, (start, end) in enumerate(eras):
        for w in exposure.windows:
            first = (start if w.start_anchor == "exposure_start" else end) + w.start
            last = (end if w.end_anchor == "exposure_end" else start) + w.end
            if j + 1 < len(eras):
                last = min(last, eras[j + 1][0] - 1)
            out.append((w.covariate_id, first, last))
    return out


def _date(day: int) -> datetime.date:
    return EPOCH + datetime.timedelta(days=day)


def _time_values(design: st.Design, knots: dict[str, list[float]], day: int, start: int, age_at_day0: int,
                 ) -> dict[int, float]:
    """The spline values of one day, straight from the definitions: the day's calendar month, the age on its
    first observed day, clamped to the boundary knots."""
    date = _date(day)
    month_start = (date.replace(day=1) - EPOCH).days
    values: dict[int, float] = {}
    if design.age is not None:
        k = np.asarray(knots["age"])
        age = min(max(age_at_day0 + max(month_start, start), k[0]), k[-1])
        row = splines.bs_basis(np.array([float(age)]), k, design.age.degree)[0]
        values.update({100 + i: v for i, v in enumerate(row)})
    if design.season is not None:
        k = np.asarray(knots["season"])
        x = k[0] + (date.month - k[0]) % 12
        row = splines.cyclic_basis(np.array([x]), k, design.season.degree)[0, 1:]
        values.update({201 + i: v for i, v in enumerate(row)})
    if design.calendar_time is not None:
        k = np.asarray(knots["calendar_time"])
        month = min(max(date.year * 12 + date.month - 1, k[0]), k[-1])
        row = splines.bs_basis(np.array([float(month)]), k, design.calendar_time.degree)[0]
        values.update({300 + i: v for i, v in enumerate(row)})
    return {i: v for i, v in values.items() if v != 0.0}


def reference_study_eras(inputs: st.PersonInputs, design: st.Design, knots: dict[str, list[float]],
                         ) -> list[tuple[int, int, int, tuple[tuple[int, float], ...]]]:
    """Day by day: each kept day of each kept case gets its covariates; days with equal covariates merge."""
    rows = []
    case_ids = inputs.case_id.tolist()
    for i, case in enumerate(case_ids):
        age0 = int(inputs.age_at_observation_start[i]) - int(inputs.observation_start[i])  # age on day d: d + age0
        kept_days = _kept_days(inputs, design.population, i)
        if not kept_days:
            continue
        start, end = kept_days[0], kept_days[-1]
        mine = np.flatnonzero(inputs.exposure_case == case)
        windows: list[tuple[int, int, int]] = []
        for exposure in design.exposures or ():
            spans = [(int(inputs.exposure_start[r]), int(inputs.exposure_end[r])) for r in mine
                     if int(inputs.exposure_drug[r]) in exposure.drug_ids]
            windows += _day_windows(exposure, spans)
        event_days = inputs.event_day[inputs.event_case == case].tolist()
        eras: dict[tuple, list[int]] = {}
        by_month: dict[tuple[int, int], dict[int, float]] = {}  # the time values are constant within a month
        for d in range(start, end + 1):
            covariates = {c: 1.0 for c, lo, hi in windows if lo <= d <= hi}
            month = (_date(d).year, _date(d).month)
            if month not in by_month:
                by_month[month] = _time_values(design, knots, d, start, age0)
            # A row lists its window covariates, then its spline components, each by increasing id.
            key = tuple(sorted(covariates.items())) + tuple(sorted(by_month[month].items()))
            era = eras.setdefault(key, [0, 0])
            era[0] += 1
            era[1] += event_days.count(d)
        rows += [(int(case), length, events, key) for key, (length, events) in eras.items()]
    return rows


def _rows(tables: IntervalTables) -> list[tuple[int, int, int, tuple[tuple[int, float], ...]]]:
    entries: dict[int, list[tuple[int, float]]] = {}
    for row, cid, value in zip(tables.cov_row_id.tolist(), tables.cov_id.tolist(), tables.cov_value.tolist(),
                               strict=True):
        entries.setdefault(row, []).append((cid, value))
    return [(int(s), int(t), int(y), tuple(entries.get(int(r), [])))
            for r, s, t, y in zip(tables.row_id, tables.stratum_id, tables.time, tables.y, strict=True)]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("time", [False, True])
def test_study_eras_equal_the_per_day_brute_force(seed: int, time: bool) -> None:
    inputs = _random_inputs(seed)
    design = _random_design(seed, inputs, time)
    built = st.study_eras(inputs, design)
    expected = reference_study_eras(inputs, design, built.knots)
    assert _rows(built.tables) == expected  # exact: lengths, counts, ids and values
    np.testing.assert_array_equal(built.tables.row_id, np.arange(len(expected)))
    kept = {r[0] for r in expected}
    assert built.cases_removed == inputs.case_id.size - len(kept)


def test_study_eras_without_new_options_equal_the_original_builder() -> None:
    for seed in range(6):
        inputs = _random_inputs(seed)
        legacy = st.LegacyWindow(start=seed - 3, end=10 + seed, start_anchor="exposure_end" if seed % 2 else
                                 "exposure_start")
        built = st.study_eras(inputs, st.Design(legacy=legacy))
        original = eras_from_person_data(inputs.case_id, inputs.observation_start, inputs.observation_end,
                                         inputs.event_case, inputs.event_day, inputs.exposure_case,
                                         inputs.exposure_drug, inputs.exposure_start, inputs.exposure_end,
                                         legacy.start, legacy.end, legacy.end_anchor, legacy.start_anchor)
        assert _rows(built.tables) == _rows(original)


def test_hand_worked_windows_and_sccs_censoring() -> None:
    # One case observed days 0..99, drug 1 taken on [10, 19] and [22, 24] (two eras: 20 < 19 + 1 + 1 is false),
    # and [25, 30] (touches [22, 24]: merged into [22, 30]). Windows: pre [-5, -1] of the start, risk [0, end],
    # washout [end + 1, end + 10] cut the day before the next era starts (SelfControlledCaseSeries).
    # Era [10, 19]: pre [5, 9], risk [10, 19], washout [20, 21] (cut at 22 - 1); era [22, 30]: pre [17, 21]
    # (overlapping the first washout and risk: other covariates), risk [22, 30], washout [31, 40].
    inputs = st.PersonInputs(
        case_id=np.array([9]), observation_start=np.array([0]), observation_end=np.array([99]),
        event_case=np.array([9, 9, 9]), event_day=np.array([5, 18, 35]),
        exposure_case=np.array([9, 9, 9]), exposure_drug=np.array([1, 1, 1]),
        exposure_start=np.array([10, 22, 25]), exposure_end=np.array([19, 24, 30]),
    )
    windows = (st.Window(-5, "exposure_start", -1, "exposure_start", 1000, "pre"),
               st.Window(0, "exposure_start", 0, "exposure_end", 1001, "risk"),
               st.Window(1, "exposure_end", 10, "exposure_end", 1002, "washout"))
    built = st.study_eras(inputs, st.Design(exposures=(st.Exposure((1,), windows),)))
    assert _rows(built.tables) == [
        (9, 5 + 59, 0, ()),  # days 0-4 and 41-99
        (9, 5, 1, ((1000, 1.0),)),  # 5-9
        (9, 7 + 9, 0, ((1001, 1.0),)),  # 10-16 and 22-30
        (9, 3, 1, ((1000, 1.0), (1001, 1.0))),  # 17-19
        (9, 2, 0, ((1000, 1.0), (1002, 1.0))),  # 20-21
        (9, 10, 1, ((1002, 1.0),)),  # 31-40
    ]
    first_only = st.study_eras(inputs, st.Design(exposures=(st.Exposure((1,), windows, True),)))
    # Only the era [10, 19]: washout [20, 29] is no longer cut.
    assert _rows(first_only.tables) == [(9, 75, 1, ()), (9, 5, 1, ((1000, 1.0),)), (9, 10, 1, ((1001, 1.0),)),
                                        (9, 10, 0, ((1002, 1.0),))]


def test_age_restrictions_follow_sccs_day_rules() -> None:
    # Age 10 years on day 0 = 3,652 days; min_age 10.5 years keeps days with age >= ceil(3835.125) = 3836, i.e.
    # from day 184; max_age 10.9 keeps age <= round(11.9 * 365.25) - 1 = 4345, i.e. up to day 693.
    inputs = st.PersonInputs(
        case_id=np.array([1, 2]), observation_start=np.array([0, 0]), observation_end=np.array([999, 100]),
        event_case=np.array([1, 1, 1, 2]), event_day=np.array([183, 184, 693, 50]),
        exposure_case=np.zeros(0, np.int64), exposure_drug=np.zeros(0, np.int64),
        exposure_start=np.zeros(0, np.int64), exposure_end=np.zeros(0, np.int64),
        age_at_observation_start=np.array([3652, 3652]),
    )
    design = st.Design(exposures=(st.Exposure((1,), (st.Window(0, "exposure_start", 0, "exposure_end", 1000,
                                                                "x"),)),),
                       population=st.Population(min_age_years=10.5, max_age_years=10.9, min_observation_days=20))
    built = st.study_eras(inputs, design)
    assert _rows(built.tables) == [(1, 693 - 184 + 1, 2, ())]
    assert built.cases_removed == 1 and built.events_inside == 2  # case 2 keeps no day (it ends at age 3752)


def test_automatic_knots_follow_sccs_placement() -> None:
    inputs = _random_inputs(3, n_max=200)
    design = st.Design(exposures=_random_design(3, inputs, False).exposures, age=st.Spline(5), season=st.Spline(4),
                       calendar_time=st.Spline(4))
    built = st.study_eras(inputs, design)
    # Age: quantiles 1%..99% of the ages at the events inside the observation periods (numpy's default = R's 7).
    position = {int(c): i for i, c in enumerate(inputs.case_id.tolist())}
    ages = [d - inputs.observation_start[position[c]] + inputs.age_at_observation_start[position[c]]
            for c, d in zip(inputs.event_case.tolist(), inputs.event_day.tolist(), strict=True)
            if inputs.observation_start[position[c]] <= d <= inputs.observation_end[position[c]]]
    np.testing.assert_allclose(built.knots["age"], np.quantile(ages, [0.01, 0.255, 0.5, 0.745, 0.99]))
    assert built.knots["season"] == [0.5, 4.5, 8.5, 12.5]
    # Calendar time: the first month where the running count of observed person-months reaches each cut-off.
    months: dict[int, int] = {}
    for s, e in zip(inputs.observation_start.tolist(), inputs.observation_end.tolist(), strict=True):
        first, last = _date(s), _date(e)
        for m in range(first.year * 12 + first.month - 1, last.year * 12 + last.month):
            months[m] = months.get(m, 0) + 1
    ordered = sorted(months)
    running = np.cumsum([months[m] for m in ordered])
    expected = sorted({ordered[int(np.argmax(running >= c))] for c in running[-1] * np.linspace(0.005, 0.995, 4)})
    assert built.knots["calendar_time"] == [float(m) for m in expected]


def test_knots_outside_the_observed_ages_name_the_field() -> None:
    inputs = _random_inputs(4)
    too_old = float(inputs.age_at_observation_start.max() + 5_000)
    with pytest.raises(ValueError, match=r"^age\.knots: knot .* lies outside the observed range"):
        st.study_eras(inputs, st.Design(age=st.Spline((1000.0, too_old))))
    with pytest.raises(ValueError, match=r"^calendar_time\.knots: knot 24000 lies outside"):
        st.study_eras(inputs, st.Design(calendar_time=st.Spline((2015 * 12.0, 24000.0))))
    no_age = st.PersonInputs(**{**inputs.__dict__, "age_at_observation_start": None})
    with pytest.raises(ValueError, match="ageAtObsStart"):
        st.study_eras(no_age, st.Design(age=st.Spline(3)))


def test_drug_ids_clashing_with_spline_ids_are_refused() -> None:
    inputs = _random_inputs(5)
    clashing = st.PersonInputs(**{**inputs.__dict__, "exposure_drug": inputs.exposure_drug + 200})
    with pytest.raises(ValueError, match=r"^exposures: covariateId 20\d .*reserved"):
        st.study_eras(clashing, st.Design(season=st.Spline(5)))


# -- the fit with spline terms ------------------------------------------------------------------------------

def _glm_person_inputs(seed: int, n_cases: int) -> st.PersonInputs:
    g = np.random.default_rng(seed)
    obs_start = DAY_2015 + g.integers(0, 200, n_cases)
    obs_end = obs_start + g.integers(300, 700, n_cases)
    events_per_case = g.integers(2, 6, n_cases)
    event_case = np.repeat(np.arange(n_cases), events_per_case)
    event_day = obs_start[event_case] + (g.random(event_case.size) * (obs_end - obs_start)[event_case]).astype(int)
    n_exposures = 3 * n_cases
    exposure_start = DAY_2015 + g.integers(0, 800, n_exposures)
    return st.PersonInputs(
        case_id=np.arange(n_cases), observation_start=obs_start, observation_end=obs_end, event_case=event_case,
        event_day=event_day, exposure_case=g.integers(0, n_cases, n_exposures),
        exposure_drug=g.integers(1, 3, n_exposures), exposure_start=exposure_start,
        exposure_end=exposure_start + g.integers(0, 40, n_exposures),
        age_at_observation_start=g.integers(20 * 365, 60 * 365, n_cases),
    )


@pytest.mark.slow
def test_fit_with_spline_terms_equals_statsmodels_poisson_with_case_dummies() -> None:
    import statsmodels.api as sm  # here, not at the top: the GPU test of this file runs where it is absent

    inputs = _glm_person_inputs(31, 120)
    exposures = (
        st.Exposure((1,), (st.Window(-20, "exposure_start", -1, "exposure_start", 1000, "pre"),
                           st.Window(0, "exposure_start", 0, "exposure_end", 1001, "on"),
                           st.Window(1, "exposure_end", 30, "exposure_end", 1002, "washout"))),
        st.Exposure((2,), (st.Window(0, "exposure_start", 14, "exposure_start", 1003, "risk"),)),
    )
    design = st.Design(exposures=exposures, age=st.Spline((8000.0, 12000.0, 16000.0, 21000.0)), season=st.Spline(5))
    built = st.study_eras(inputs, design)
    data = build_from_tables(built.tables.row_id, built.tables.stratum_id, built.tables.time, built.tables.y,
                             built.tables.cov_row_id, built.tables.cov_id, built.tables.cov_value).data
    assert not data.binary and {100, 101, 102, 103, 201, 202, 203} <= set(data.covariate_ids.tolist())
    fit = ccd.fit(data, Prior("none", 1.0, np.ones(data.n_covariates, dtype=bool)), TIGHT)
    assert fit.converged

    # The independent side: the per-day brute force's eras as a dense design, case dummies, log length offset.
    rows = reference_study_eras(inputs, design, built.knots)
    ids = data.covariate_ids.tolist()
    dense = np.zeros((len(rows), len(ids)))
    for r, (_, _, _, entries) in enumerate(rows):
        for cid, value in entries:
            dense[r, ids.index(cid)] = value
    cases = np.unique([r[0] for r in rows], return_inverse=True)[1]
    dummies = (cases[:, None] == np.arange(cases.max() + 1)[None, :]).astype(float)
    glm = sm.GLM(np.array([r[2] for r in rows], float), np.hstack([dense, dummies]), family=sm.families.Poisson(),
                 offset=np.log([r[1] for r in rows])).fit(tol=1e-13, maxiter=300)
    np.testing.assert_allclose(fit.beta, glm.params[:len(ids)], rtol=0, atol=1e-6)


def _simulate_age_effect(seed: int, n_cases: int, knots: np.ndarray, age_coefficients: np.ndarray,
                         log_ri: float) -> st.PersonInputs:
    """Events day by day from the model: rate = base_i exp(f(age) + log_ri * exposed), f the age spline at the
    age on the first observed day of the month (the builder's definition), one exposure of 30 days each."""
    g = np.random.default_rng(seed)
    obs_start = DAY_2015 + g.integers(0, 365, n_cases)
    obs_end = obs_start + 729
    age0 = g.integers(int(knots[0]) - 400, int(knots[-1]) - 300, n_cases)
    exposure_start = obs_start + g.integers(0, 700, n_cases)
    event_case, event_day = [], []
    for i in range(n_cases):
        days = np.arange(obs_start[i], obs_end[i] + 1)
        month_start = days.astype("datetime64[D]").astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
        age = np.clip(np.maximum(month_start, obs_start[i]) - obs_start[i] + age0[i], knots[0], knots[-1])
        log_rate = splines.bs_basis(age.astype(float), knots, 2) @ age_coefficients
        exposed = (days >= exposure_start[i]) & (days <= exposure_start[i] + 29)
        rate = math.exp(g.normal(-6.0, 0.5)) * np.exp(log_rate + log_ri * exposed)
        counts = g.poisson(rate)
        event_case += [i] * int(counts.sum())
        event_day += np.repeat(days, counts).tolist()
    return st.PersonInputs(
        case_id=np.arange(n_cases), observation_start=obs_start, observation_end=obs_end,
        event_case=np.asarray(event_case), event_day=np.asarray(event_day), exposure_case=np.arange(n_cases),
        exposure_drug=np.ones(n_cases, np.int64), exposure_start=exposure_start, exposure_end=exposure_start + 29,
        age_at_observation_start=age0,
    )


def test_simulated_age_effect_is_recovered() -> None:
    knots = np.array([10_000.0, 11_000.0, 12_500.0, 14_000.0])
    true_age = np.array([0.6, 1.4, 0.4, -0.5])  # log relative incidence of the spline components
    log_ri = math.log(2.0)
    inputs = _simulate_age_effect(7, 3000, knots, true_age, log_ri)
    design = st.Design(exposures=(st.Exposure((1,), (st.Window(0, "exposure_start", 0, "exposure_end", 1000,
                                                                "risk"),)),),
                       age=st.Spline(tuple(knots.tolist())))
    built = st.study_eras(inputs, design)
    data = build_from_tables(built.tables.row_id, built.tables.stratum_id, built.tables.time, built.tables.y,
                             built.tables.cov_row_id, built.tables.cov_id, built.tables.cov_value).data
    fit = ccd.fit(data, Prior("none", 1.0, np.ones(data.n_covariates, dtype=bool)),
                  FitOptions(tolerance=1e-8, convergence="gradient", max_iterations=5000))
    estimate = dict(zip(data.covariate_ids.tolist(), fit.beta.tolist(), strict=True))
    age_hat = np.array([estimate[100 + i] for i in range(4)])
    grid = np.linspace(knots[0], knots[-1], 50)
    curve_hat = splines.bs_basis(grid, knots, 2) @ age_hat
    curve_true = splines.bs_basis(grid, knots, 2) @ true_age
    assert np.max(np.abs(curve_hat - curve_true)) < 0.15  # about 3 standard errors with ~13,000 events
    assert abs(estimate[1000] - log_ri) < 0.1
    # The curve's shape: its peak is found where the true one is.
    assert grid[np.argmax(curve_hat)] == pytest.approx(grid[np.argmax(curve_true)], abs=600)


# -- the sccs_eras job with a study design ------------------------------------------------------------------

def _job(params: dict, frames: dict[str, pd.DataFrame], progress: LocalProgress | None = None) -> dict:
    return run_kind(get_kind("sccs_eras"), params, local_context("cpu", datasets=frames,
                                                                 progress=progress or LocalProgress()))


def _frames_of(inputs: st.PersonInputs, as_text_dates: bool) -> dict[str, pd.DataFrame]:
    def day(values: np.ndarray) -> object:
        return [str(_date(int(v))) for v in values] if as_text_dates else values

    return {
        "cases_dataset_id": pd.DataFrame({"caseId": inputs.case_id, "observationStart": day(inputs.observation_start),
                                          "observationEnd": day(inputs.observation_end),
                                          "ageAtObsStart": inputs.age_at_observation_start}),
        "events_dataset_id": pd.DataFrame({"caseId": inputs.event_case, "day": day(inputs.event_day)}),
        "exposures_dataset_id": pd.DataFrame({"caseId": inputs.exposure_case, "drugId": inputs.exposure_drug,
                                              "start": day(inputs.exposure_start), "end": day(inputs.exposure_end)}),
    }


STUDY_PARAMS = {
    "cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x",
    "exposures": [
        {"label": "drug one", "drug_ids": [1], "windows": [
            {"label": "pre-exposure", "start": -20, "end": -1, "end_anchor": "exposure_start"},
            {"label": "on treatment"},
            {"label": "washout", "start": 1, "start_anchor": "exposure_end", "end": 30}]},
        {"drug_ids": [2], "first_occurrence_only": True,
         "windows": [{"start": 0, "end": 14, "end_anchor": "exposure_start", "covariate_id": 5000}]},
    ],
    "study_population": {"min_age_years": 21, "min_observation_days": 400},
    "age": {"knots": [8000, 12000, 16000, 21000]},
    "season": {"knots": 5},
}


@pytest.mark.parametrize("as_text_dates", [False, True])
def test_eras_job_with_a_study_design_feeds_sccs_fit(as_text_dates: bool) -> None:
    inputs = _glm_person_inputs(31, 120)
    progress = LocalProgress()
    result = _job(STUDY_PARAMS, _frames_of(inputs, as_text_dates), progress)
    params = get_kind("sccs_eras").params_model.model_validate(STUDY_PARAMS)
    expected = st.study_eras(inputs, eras_job._study_design(params))
    covariates = progress.artifacts["covariates"]
    np.testing.assert_array_equal(covariates["covariateValue"], expected.tables.cov_value)
    np.testing.assert_array_equal(progress.artifacts["outcomes"]["time"], expected.tables.time)
    names = progress.artifacts["names"]
    assert names["covariateId"].tolist() == [1000, 1001, 1002, 5000, 100, 101, 102, 103, 201, 202, 203]
    assert names["covariateName"].tolist()[:4] == ["drug one: pre-exposure", "drug one: on treatment",
                                                   "drug one: washout", "drug 2: days +0 from exposure start to "
                                                   "+14 from exposure start"]
    assert names["covariateName"].tolist()[4] == "Age spline component 1"
    assert names["covariateName"].tolist()[-1] == "Seasonality spline component 4"
    assert [c["source"] for c in result["covariates"]][3:6] == ["exposure_window", "age", "age"]
    assert result["knots"]["age"] == [8000, 12000, 16000, 21000]
    assert result["knots"]["season"] == [0.5, 3.5, 6.5, 9.5, 12.5]
    assert result["n_drugs"] == 4 and result["cases_removed"] == expected.cases_removed > 0
    assert result["events_in_observation"] + result["events_outside_observation"] == inputs.event_case.size
    # The three artifacts are sccs_fit's three tables; the splines stay out of the prior.
    fit = run_kind(get_kind("sccs_fit"), {
        "outcomes_dataset_id": "o", "covariates_dataset_id": "c", "names_dataset_id": "n",
        "prior": {"type": "normal", "variance": 1.0, "exclude": [100, 101, 102, 103, 201, 202, 203]},
    }, local_context("cpu", datasets={"outcomes_dataset_id": progress.artifacts["outcomes"],
                                      "covariates_dataset_id": covariates, "names_dataset_id": names}))
    assert {c["name"] for c in fit["coefficients"]} >= {"drug one: washout", "Age spline component 4"}


def test_old_eras_params_keep_their_output() -> None:
    # A job stored with the original fields validates and gives the original tables, counts and no new fields.
    inputs = _random_inputs(2)
    frames = _frames_of(inputs, False)
    old = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x", "risk_window_start": 1,
           "start_anchor": "exposure_start", "risk_window_end": 30, "end_anchor": "exposure_start"}
    progress = LocalProgress()
    result = _job(old, frames, progress)
    original = eras_from_person_data(inputs.case_id, inputs.observation_start, inputs.observation_end,
                                     inputs.event_case, inputs.event_day, inputs.exposure_case, inputs.exposure_drug,
                                     inputs.exposure_start, inputs.exposure_end, 1, 30, "exposure_start",
                                     "exposure_start")
    np.testing.assert_array_equal(progress.artifacts["covariates"]["covariateId"], original.cov_id)
    np.testing.assert_array_equal(progress.artifacts["outcomes"]["y"], original.y)
    assert set(progress.artifacts) == {"outcomes", "covariates"}
    assert result["covariates"] is None and result["cases_removed"] is None and result["knots"] is None


def _errors(params: dict) -> list[tuple[tuple, str]]:
    with pytest.raises(ValidationError) as caught:
        get_kind("sccs_eras").params_model.model_validate({"cases_dataset_id": "c", "events_dataset_id": "e",
                                                           "exposures_dataset_id": "x", **params})
    return [(error["loc"], error["msg"]) for error in caught.value.errors()]


@pytest.mark.parametrize(("params", "loc", "message"), [
    ({"exposures": [{"drug_ids": [1], "windows": [{"end": 10, "end_anchor": "exposure_start"}, {"start": 5}]}]},
     ("exposures", 0, "windows"), "windows 0 and 1 of one exposure overlap"),
    ({"exposures": [{"drug_ids": [1], "windows": [{}, {"start_anchor": "exposure_end", "end": 30}]}]},
     ("exposures", 0, "windows"), "windows 0 and 1 of one exposure overlap"),
    ({"exposures": [{"drug_ids": [1], "windows": [{"start": 3, "end": 1, "end_anchor": "exposure_start"}]}]},
     ("exposures", 0, "windows"), "window 0 is always empty"),
    ({"exposures": [{"drug_ids": [1]}], "risk_window_end": 30}, ("exposures",), "risk_window_end applies only"),
    ({"exposures": [{"drug_ids": [1], "windows": [{"covariate_id": 250}]}]}, ("exposures",),
     "exposures.0.windows.0.covariate_id: 250 is in 100-399"),
    ({"exposures": [{"drug_ids": [1], "windows": [{"covariate_id": 7}]}, {"drug_ids": [2], "windows": [
        {"covariate_id": 7}]}]}, ("exposures",), "exposures.1.windows.0.covariate_id: 7 is also exposures.0"),
    ({"exposures": [{"drug_ids": []}]}, ("exposures", 0, "drug_ids"), "at least 1 item"),
    ({"age": {"knots": [9000, 8000]}}, ("age", "knots"), "strictly increasing"),
    ({"season": {"knots": [1, 4, 8, 12]}}, ("season",), "must span one year"),
    ({"calendar_time": {"knots": ["2015-07", "2015-02"]}}, ("calendar_time", "knots"), "strictly increasing"),
    ({"study_population": {"min_age_years": 50, "max_age_years": 40}}, ("study_population",), "below"),
])
def test_bad_study_params_name_the_field(params: dict, loc: tuple, message: str) -> None:
    errors = _errors(params)
    assert any(error_loc[:len(loc)] == loc and message in text for error_loc, text in errors), errors


def test_windows_that_never_share_a_day_are_accepted() -> None:
    get_kind("sccs_eras").params_model.model_validate({**STUDY_PARAMS, "exposures": [{"drug_ids": [1], "windows": [
        {"start": -30, "end": -1, "end_anchor": "exposure_start"}, {"start": 0, "end": 0},
        {"start": 1, "start_anchor": "exposure_end", "end": 30}, {"start": 31, "start_anchor": "exposure_end",
                                                                  "end": 60}]}]})


def test_age_column_is_required_at_submission_when_ages_are_used() -> None:
    params = get_kind("sccs_eras").params_model.model_validate(STUDY_PARAMS)
    problems = params.dataset_column_problems({"cases_dataset_id": ["caseId", "observationStart", "observationEnd"],
                                               "events_dataset_id": ["caseId", "day"],
                                               "exposures_dataset_id": ["caseId", "drugId", "start", "end"]})
    assert problems and problems[0][0] == "cases_dataset_id" and "'ageAtObsStart'" in problems[0][1]
    season_only = get_kind("sccs_eras").params_model.model_validate({**STUDY_PARAMS, "age": None,
                                                                     "study_population": None})
    assert season_only.dataset_column_problems({"cases_dataset_id": ["caseId", "observationStart",
                                                                     "observationEnd"]}) == []


def test_data_errors_of_a_study_name_the_field_and_row() -> None:
    inputs = _glm_person_inputs(31, 40)
    frames = _frames_of(inputs, False)
    too_old = {**STUDY_PARAMS, "age": {"knots": [8000, 40000]}}
    with pytest.raises(ValueError, match=r"^age\.knots: knot 40000 lies outside the observed range"):
        _job(too_old, frames)
    negative = {**frames, "cases_dataset_id": frames["cases_dataset_id"].assign(
        ageAtObsStart=lambda f: np.where(np.arange(len(f)) == 6, -3, f["ageAtObsStart"]))}
    with pytest.raises(ValueError, match=r"cases\.ageAtObsStart must be >= 0 \(days of age\): row 7 holds -3"):
        _job(STUDY_PARAMS, negative)
    inverted = {**frames, "exposures_dataset_id": frames["exposures_dataset_id"].assign(
        end=lambda f: np.where(np.arange(len(f)) == 4, f["start"] - 1, f["end"]))}
    with pytest.raises(ValueError, match=r"exposure_end must not precede exposure_start: 1 row\(s\) of the "
                                         r"exposures table, the first row 5"):
        _job(STUDY_PARAMS, inverted)
    nobody = {**STUDY_PARAMS, "study_population": {"min_observation_days": 5000}}
    with pytest.raises(ValueError, match=r"^study_population: no case is left"):
        _job(nobody, frames)


@pytest.mark.gpu
def test_fit_of_study_tables_on_the_gpu_equals_numpy() -> None:
    # The era builder is host-side; the fit of its tables (continuous spline values, unpenalised spline columns)
    # runs on the GPU and must give NumPy's numbers.
    progress = LocalProgress()
    _job(STUDY_PARAMS, _frames_of(_glm_person_inputs(31, 400), False), progress)
    frames = {"outcomes_dataset_id": progress.artifacts["outcomes"],
              "covariates_dataset_id": progress.artifacts["covariates"],
              "names_dataset_id": progress.artifacts["names"]}
    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "names_dataset_id": "n",
              "prior": {"type": "normal", "variance": 0.5, "exclude": [100, 101, 102, 103, 201, 202, 203]},
              "bootstrap": {"replicates": 6, "seed": 4}}
    host = run_kind(get_kind("sccs_fit"), params, local_context("cpu", datasets=frames))
    device = run_kind(get_kind("sccs_fit"), params, local_context("gpu", datasets=frames))
    assert device["device"] != "cpu"
    np.testing.assert_allclose([c["estimate"] for c in device["coefficients"]],
                               [c["estimate"] for c in host["coefficients"]], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose([c["ci_lower"] for c in device["coefficients"]],
                               [c["ci_lower"] for c in host["coefficients"]], rtol=1e-9, atol=1e-12)
