"""SCCS diagnostics (issue 15, item 3) against their published definitions (SelfControlledCaseSeries 6.x and
Musonda, Farrington & Whitaker 2006) and independent references:

- the MDRR: the SRL1 power written independently (A as twice the Kullback-Leibler divergence of the binomial
  share of events in the risk window, B from its variance) equals the target at the reported MDRR, and the
  exact binomial likelihood-ratio test simulated at that relative risk has the power asked for;
- the exposure statistics against a pandas group-by of the tables;
- the monthly expected counts against a day-by-day loop over the calendar; the time-stability ratio against a
  dense grid of the mixture likelihood written with Poisson probabilities (not their logs); the test passes
  data simulated with a constant rate and fails data with a winter peak;
- the pre-exposure and end-of-observation checks through a whole sccs_fit job on person-level data simulated
  with and without reverse causation (the event triggers the exposure) and event-dependent observation end
  (observation stops within 30 days of the event): each violation fails, each null passes.
"""

from __future__ import annotations

import calendar
import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest
from scipy import special, stats

from kernels.context import local_context, run_kind
from kernels.registry import get_kind
from kernels.sccs import diagnostics as diag
from kernels.sccs.examples import cyclops_frames
from kernels.sccs.tables import load_tables

# -- MDRR --------------------------------------------------------------------------------------------------


def _power_from_divergence(rr: float, r: float, n: float, z: float) -> float:
    """Musonda's expression 7 rewritten: per event, the share in the risk period is pi = rho r / (rho r + 1 - r);
    A = 2 KL(Bernoulli(pi) || Bernoulli(r)) is the expected log likelihood ratio of one event, and B = b^2
    pi (1 - pi) / A."""
    pi = rr * r / (rr * r + 1 - r)
    a = 2 * float(special.rel_entr(pi, r) + special.rel_entr(1 - pi, 1 - r))
    b = math.log(rr) ** 2 * pi * (1 - pi) / a
    return float(stats.norm.cdf((math.sqrt(n * a) - z) / math.sqrt(b)))


@pytest.mark.parametrize(("r", "n", "two_sided"), [(0.1, 100, True), (0.02, 40, True), (0.3, 15, False),
                                                   (0.5, 1000, True), (0.01, 7, False)])
def test_mdrr_is_where_the_srl1_power_reaches_the_target(r: float, n: float, two_sided: bool) -> None:
    mdrr = float(diag.minimum_detectable_relative_risk(np.array([r]), np.array([n]), 0.05, 0.8, two_sided)[0])
    z = stats.norm.ppf(1 - (0.025 if two_sided else 0.05))
    assert 1 < mdrr < math.exp(10)
    assert _power_from_divergence(mdrr, r, n, z) == pytest.approx(0.8, abs=1e-9)
    assert _power_from_divergence(mdrr * 0.99, r, n, z) < 0.8 < _power_from_divergence(mdrr * 1.01, r, n, z)


def test_mdrr_hand_computed_value() -> None:
    """r = 0.1, n = 100, two-sided 5 %, power 80 %: the SRL1 MDRR is 2.19584, bracketed with the divergence form
    of expression 7 above: power(2.1958) = 0.799982 < 0.8 < power(2.1959) = 0.800032, and power(2.19584) =
    0.800002."""
    z = stats.norm.ppf(0.975)
    assert _power_from_divergence(2.1958, 0.1, 100, z) < 0.8 < _power_from_divergence(2.1959, 0.1, 100, z)
    assert diag.minimum_detectable_relative_risk(np.array([0.1]), np.array([100.0]))[0] == pytest.approx(2.19584,
                                                                                                       abs=1e-5)


def test_mdrr_gives_the_power_asked_for_to_the_exact_binomial_test() -> None:
    """At the MDRR, 200 events each in the risk period with probability pi: the likelihood-ratio test of pi = r
    rejects (two-sided 5 %) in about 80 % of 20,000 simulated studies (the SRL1 formula is asymptotic: 0.03)."""
    r, n = 0.1, 200
    mdrr = float(diag.minimum_detectable_relative_risk(np.array([r]), np.array([float(n)]))[0])
    pi = mdrr * r / (mdrr * r + 1 - r)
    exposed = np.random.default_rng(2006).binomial(n, pi, size=20_000)
    share = exposed / n
    lr = 2 * n * (special.rel_entr(share, r) + special.rel_entr(1 - share, 1 - r))
    rejected = (lr > stats.chi2.ppf(0.95, 1)) & (share > r)
    assert rejected.mean() == pytest.approx(0.8, abs=0.03)


def test_mdrr_edges_are_infinite_and_more_events_detect_less() -> None:
    mdrr = diag.minimum_detectable_relative_risk(np.array([0.1, 0.1, 0.0, 1.0, 0.1, 0.1, 0.1]),
                                                 np.array([0.0, 0.5, 50, 50, 1.0, 50, 5000]))
    assert np.all(np.isinf(mdrr[:4]))  # no events, under one event, nothing or everything exposed
    assert 1000 < mdrr[4] < math.exp(10)  # one event: the asymptotic formula still answers, with a huge MDRR
    unreachable = diag.minimum_detectable_relative_risk(np.array([0.1]), np.array([1.0]), power=0.99)
    assert np.isinf(unreachable[0])  # 99 % power from one event is not reached by RR e^10
    assert 1 < mdrr[6] < mdrr[5] < math.exp(10)
    one_sided = diag.minimum_detectable_relative_risk(np.array([0.1]), np.array([50.0]), two_sided=False)
    assert 1 < one_sided[0] < mdrr[5]


def test_exposure_statistics_match_a_group_by_of_the_tables() -> None:
    frames = cyclops_frames(n_cases=400, n_drugs=12, seed=9)
    outcomes, covariates = frames["outcomes_dataset_id"], frames["covariates_dataset_id"]
    statistics = diag.exposure_statistics(load_tables(outcomes, covariates).data)
    totals = outcomes.groupby("stratumId").agg(days=("time", "sum"), events=("y", "sum"))
    kept = totals[totals.events > 0]
    joined = covariates.merge(outcomes, on="rowId")
    joined = joined[joined.stratumId.isin(kept.index)]
    for j, (covariate, group) in enumerate(joined.groupby("covariateId")):
        cases = group.stratumId.unique()
        assert covariate == j + 1
        assert statistics.exposed_cases[j] == cases.size
        assert statistics.time_exposed[j] == group.time.sum()
        assert statistics.time_total[j] == kept.loc[cases, "days"].sum()
        assert statistics.events[j] == kept.loc[cases, "events"].sum()


# -- time stability ----------------------------------------------------------------------------------------

EPOCH = dt.date(1970, 1, 1)


def _day(date: dt.date) -> int:
    return (date - EPOCH).days


def _expected_by_day_loop(starts: list[int], ends: list[int], events: list[int]) -> dict[tuple[int, int], float]:
    """Each observed day of case i weighs 1 / (days of its month); rate_i = n_i / its total weight."""
    expected: dict[tuple[int, int], float] = {}
    for start, end, n in zip(starts, ends, events, strict=True):
        days = [EPOCH + dt.timedelta(days=d) for d in range(start, end + 1)]
        weights = [1 / calendar.monthrange(day.year, day.month)[1] for day in days]
        rate = n / sum(weights)
        for day, weight in zip(days, weights, strict=True):
            expected[(day.year, day.month)] = expected.get((day.year, day.month), 0.0) + rate * weight
    return expected


def test_monthly_expected_counts_match_a_day_by_day_calendar_loop() -> None:
    generator = np.random.default_rng(4)
    starts = [_day(dt.date(2019, 11, 17)) + int(d) for d in generator.integers(0, 200, 40)]
    ends = [s + int(length) for s, length in zip(starts, generator.integers(0, 500, 40), strict=True)]
    events = [int(k) for k in generator.integers(1, 4, 40)]
    event_days = np.concatenate([generator.integers(s, e + 1, k) for s, e, k in zip(starts, ends, events,
                                                                                    strict=True)])
    counts = diag.monthly_counts(np.array(starts), np.array(ends), np.array(events, float), event_days)
    reference = _expected_by_day_loop(starts, ends, events)
    as_keys = [(1970 + int(m) // 12, int(m) % 12 + 1) for m in counts.month]
    np.testing.assert_allclose(counts.expected, [reference.get(key, 0.0) for key in as_keys], rtol=1e-12,
                               atol=1e-15)
    assert counts.observed.sum() == sum(events) and counts.expected.sum() == pytest.approx(sum(events), rel=1e-12)
    month_of_event = [((EPOCH + dt.timedelta(days=int(d))).year, (EPOCH + dt.timedelta(days=int(d))).month)
                      for d in event_days]
    assert counts.observed.tolist() == [month_of_event.count(key) for key in as_keys]


def _seasonal_cases(winter_factor: float, seed: int, n_cases: int = 4000):
    """Cases observed 1-2 years from a start in 2010-2013, two events each, placed on days with weight
    ``winter_factor`` in December-February and 1 otherwise."""
    generator = np.random.default_rng(seed)
    start = _day(dt.date(2010, 1, 1)) + generator.integers(0, 4 * 365, n_cases)
    end = start + generator.integers(365, 731, n_cases)
    event_days = []
    for s, e in zip(start, end, strict=True):
        days = np.arange(s, e + 1)
        months = days.astype("datetime64[D]").astype("datetime64[M]").astype(int) % 12  # 0 = January
        weight = np.where(np.isin(months, [11, 0, 1]), winter_factor, 1.0)
        event_days.append(generator.choice(days, size=2, p=weight / weight.sum()))
    return start, end, np.full(n_cases, 2.0), np.concatenate(event_days)


def test_time_stability_passes_a_constant_rate_and_fails_a_winter_peak() -> None:
    null = diag.monthly_counts(*_seasonal_cases(1.0, seed=1))
    stable = diag.time_stability(null.observed, null.expected)
    assert stable.passed and stable.ratio < 1.10 and stable.p > 0.05
    peak = diag.monthly_counts(*_seasonal_cases(3.0, seed=2))
    unstable = diag.time_stability(peak.observed, peak.expected)
    assert not unstable.passed and unstable.ratio > 1.3 and unstable.p < 1e-6


def test_time_stability_ratio_and_p_match_a_grid_of_the_mixture_likelihood() -> None:
    counts = diag.monthly_counts(*_seasonal_cases(1.6, seed=3, n_cases=1500))
    o, e = counts.observed, counts.expected
    result = diag.time_stability(o, e, max_ratio=1.10)

    def likelihood(x: float) -> float:  # as SelfControlledCaseSeries writes it: log(dpois + dpois)
        return float(np.sum(np.log(stats.poisson.pmf(o, e * x) + stats.poisson.pmf(o, e / x))))

    grid = np.arange(1.0, 3.0, 1e-4)
    values = np.array([likelihood(x) for x in grid])
    assert result.ratio == pytest.approx(grid[np.argmax(values)], abs=2e-4)
    statistic = 2 * (likelihood(max(result.ratio, 1.1)) - likelihood(min(result.ratio, 1.1)))
    assert result.p == pytest.approx(stats.chi2.sf(statistic, 1), rel=1e-6, abs=1e-300)


def test_time_stability_edges() -> None:
    assert diag.time_stability(np.array([3.0]), np.array([3.0])).passed  # one month: nothing to test
    below = diag.time_stability(np.array([10.0, 10.0, 10.0]), np.array([10.0, 10.0, 10.0]))
    assert below.p == 1.0 and below.passed and below.ratio == pytest.approx(1.0, abs=1e-3)


# -- pre-exposure and end-of-observation windows in a fit --------------------------------------------------

RISK, PRE, PROBE = 1, 2, 99


def _interval_tables(end: np.ndarray, exposure_start: np.ndarray, event_day: np.ndarray) -> dict[str, pd.DataFrame]:
    """The Cyclops tables of cases observed on days 0..end, one exposure each: risk window [s, s + 29]
    (covariate 1), pre-exposure window [s - 30, s - 1] (2) and the probe [end - 29, end] (99), built day by day."""
    case = np.repeat(np.arange(end.size), end + 1)
    day = np.arange(case.size) - np.repeat(np.cumsum(end + 1) - (end + 1), end + 1)
    s, last = exposure_start[case], end[case]
    mask = ((day >= s) & (day <= s + 29)) * 1 + ((day >= s - 30) & (day < s)) * 2 + (day > last - 30) * 4
    first_row = np.cumsum(end + 1) - (end + 1)
    events = np.bincount(first_row + event_day, minlength=case.size).astype(np.float64)
    key, era = np.unique(case * 8 + mask, return_inverse=True)
    outcomes = pd.DataFrame({"rowId": np.arange(key.size) + 1, "stratumId": key // 8,
                             "time": np.bincount(era), "y": np.bincount(era, weights=events)})
    rows = [(row + 1, covariate) for row, k in enumerate(key) for bit, covariate in ((1, RISK), (2, PRE), (4, PROBE))
            if (k % 8) & bit]
    covariates = pd.DataFrame(rows, columns=["rowId", "covariateId"])
    return {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates}


def _simulate(n_cases: int, seed: int, reverse_causation: bool, dependent_end: bool) -> dict[str, pd.DataFrame]:
    """One event per case over a year, twice as likely in the risk window. Reverse causation: for 60 % of the
    cases the exposure starts 1-30 days after the event. Dependent end: for 60 %, observation stops 0-29 days
    after the event (as after a fatal event)."""
    generator = np.random.default_rng(seed)
    end = np.full(n_cases, 364)
    exposure_start = generator.integers(60, 300, n_cases)
    event_day = np.empty(n_cases, dtype=np.int64)
    for i in range(n_cases):
        days = np.arange(365)
        weight = np.where((days >= exposure_start[i]) & (days <= exposure_start[i] + 29), 2.0, 1.0)
        event_day[i] = generator.choice(days, p=weight / weight.sum())
    triggered = generator.random(n_cases) < 0.6
    if reverse_causation:
        exposure_start = np.where(triggered, np.minimum(event_day + generator.integers(1, 31, n_cases), 364),
                                  exposure_start)
    if dependent_end:
        end = np.where(triggered, np.minimum(event_day + generator.integers(0, 30, n_cases), 364), end)
    return _interval_tables(end, exposure_start, event_day)


def _fit_diagnostics(frames: dict[str, pd.DataFrame]) -> dict:
    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "prior": {"type": "none"},
              "diagnostics": {"pre_exposure_covariates": [PRE], "end_of_observation_covariate": PROBE},
              "profile": {"covariates": [PRE, PROBE]}}
    return run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))


@pytest.mark.parametrize(("reverse_causation", "dependent_end"), [(False, False), (True, False), (False, True)])
def test_window_checks_detect_each_violation_and_pass_the_null(reverse_causation: bool, dependent_end: bool) -> None:
    result = _fit_diagnostics(_simulate(1500, seed=11, reverse_causation=reverse_causation,
                                        dependent_end=dependent_end))
    diagnostics = result["diagnostics"]
    (pre,), probe = diagnostics["pre_exposure"], diagnostics["end_of_observation"]
    assert pre["passed"] is not reverse_causation and probe["passed"] is not dependent_end
    if reverse_causation:
        assert pre["ci_lower"] > 1.25
    if dependent_end:
        assert probe["ci_lower"] > 2.0
    risk = next(c for c in result["coefficients"] if c["covariate_id"] == RISK)
    if not reverse_causation and not dependent_end:
        assert risk["relative_incidence"] == pytest.approx(2.0, rel=0.2)
    by_id = {c["covariate_id"]: c for c in result["coefficients"]}
    for check, covariate in ((pre, PRE), (probe, PROBE)):  # the checks' intervals are the 95% profile intervals
        # the check's ratio is the profile's maximum (refitted to a KKT residual of 1e-8), the coefficient the fit's
        # at its own tolerance (5e-4 on the change of X b)
        assert check["ratio"] == pytest.approx(by_id[covariate]["relative_incidence"], rel=1e-4)
        assert check["ci_lower"] == pytest.approx(by_id[covariate]["relative_incidence_profile_ci_lower"], rel=1e-5)
        assert check["ci_upper"] == pytest.approx(by_id[covariate]["relative_incidence_profile_ci_upper"], rel=1e-5)


def test_interval_check_rule_and_open_ends() -> None:
    assert diag.interval_check(0.0, -0.1, 0.1, (0.8, 1.25)).passed
    assert not diag.interval_check(1.0, math.log(1.3), 1.2, (0.8, 1.25)).passed
    assert diag.interval_check(1.0, math.log(1.25), 1.2, (0.8, 1.25)).passed  # touching counts
    assert not diag.interval_check(-3.0, None, math.log(0.7), (0.8, 1.25)).passed
    open_check = diag.interval_check(2.0, None, None, (0.8, 1.25))
    assert open_check.passed and open_check.lower is None and open_check.upper is None


def test_unknown_window_covariate_names_the_field() -> None:
    frames = cyclops_frames(n_cases=200, n_drugs=4, seed=2)
    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c",
              "diagnostics": {"pre_exposure_covariates": [77]}}
    with pytest.raises(ValueError, match=r"diagnostics.pre_exposure_covariates: covariateId 77"):
        run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))


def test_default_diagnostics_give_every_covariates_mdrr_and_null_turns_them_off() -> None:
    frames = cyclops_frames(n_cases=300, n_drugs=5, seed=4)
    base = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c"}
    result = run_kind(get_kind("sccs_fit"), base, local_context(device="cpu", datasets=frames))
    rows = result["diagnostics"]["mdrr"]
    assert [row["covariate_id"] for row in rows] == [c["covariate_id"] for c in result["coefficients"]]
    share = np.array([row["time_exposed"] / row["time_total"] for row in rows])
    expected = diag.minimum_detectable_relative_risk(share, np.array([row["events"] for row in rows]))
    assert [row["mdrr"] for row in rows] == [None if math.isinf(v) else pytest.approx(v, rel=1e-12) for v in expected]
    assert result["diagnostics"]["time_stability"] is None and result["diagnostics"]["pre_exposure"] == []
    off = run_kind(get_kind("sccs_fit"), {**base, "diagnostics": None}, local_context(device="cpu", datasets=frames))
    assert off["diagnostics"] is None


def test_time_stability_in_a_fit_reads_the_person_tables_with_dates() -> None:
    start, end, _, event_days = _seasonal_cases(3.0, seed=5, n_cases=600)
    case_id = np.arange(1, start.size + 1)
    as_date = lambda days: pd.to_datetime(days, unit="D").strftime("%Y-%m-%d")  # noqa: E731 - ISO text as a CSV holds
    frames = {**cyclops_frames(n_cases=200, n_drugs=3, seed=6),
              "cases_dataset_id": pd.DataFrame({"caseId": case_id, "observationStart": as_date(start),
                                                "observationEnd": as_date(end)}),
              "events_dataset_id": pd.DataFrame({"caseId": np.append(np.repeat(case_id, 2), 10_000),
                                                 "day": as_date(np.append(event_days, event_days[0])).tolist()})}
    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "cases_dataset_id": "a",
              "events_dataset_id": "e"}
    result = run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))
    stability = result["diagnostics"]["time_stability"]
    direct = diag.time_stability(*_monthly(start, end, event_days))
    assert stability["events"] == 1200  # the event of an unknown case is not counted
    assert stability["ratio"] == pytest.approx(direct.ratio, rel=1e-12) and stability["passed"] is False


def _monthly(start: np.ndarray, end: np.ndarray, event_days: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = diag.monthly_counts(start, end, np.full(start.size, 2.0), event_days)
    return counts.observed, counts.expected
