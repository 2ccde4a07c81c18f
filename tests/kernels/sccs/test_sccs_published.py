"""Published SCCS examples reproduced: the MMR / ITP and the MMR / viral meningitis (Oxford) data of Whitaker et al.
(2006), "Tutorial in biostatistics: the self-controlled case series method" (Statistics in Medicine 25, 1768-1797),
as the R package SCCS ships them (tests/data/sccs/README.md), through our sccs_eras and sccs_fit jobs.

The published numbers are the fitted output (Stata ``xtpoisson, fe``: conditional Poisson MLE, Wald intervals
``exp(b +- 1.959964 se)``) that the help of the SSC package ``sccsdta`` prints for these models: "Case 3.1" (the
meningitis example) and "Reproducing Table V in 2005 Whitaker" (ITP): http://fmwww.bc.edu/repec/bocode/s/sccsdta.sthlp
as in the SSC snapshot of 2025-04-30 (github.com/labordynamicsinstitute/ssc-mirror b9a7930f; docs/sccs.md). Ours must
equal them to every printed digit.
An independent fit (statsmodels' Poisson GLM with case dummies and a log interval length offset, on intervals
cut day by day here) must give the same estimates and standard errors.

Model of both (standardsccs' terms: ``adrug`` the vaccination day, ``expogrp`` the risk periods, ``agegrp`` the
age cut points): the time axis is age in days; each case is observed on [sta, end]; the risk periods are days
[vaccination + first, vaccination + last] (inclusive); age groups start at the observation start and at each cut
point; the reference is the time outside the risk periods, in the first age group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from kernels.sccs import precondition
from kernels.sccs.tables import load_tables

DATA = Path(__file__).resolve().parents[2] / "data" / "sccs"
Z_975 = norm.ppf(0.975)  # Stata's invnormal(0.975) = 1.959964; 1.96 would miss the printed intervals
FIRST_WINDOW_ID, FIRST_AGE_ID = 1, 11


@dataclass(frozen=True)
class StandardSccs:
    """One vaccine with risk periods and piecewise-constant age groups (the R package SCCS's standardsccs)."""

    name: str
    file: str  # in tests/data/sccs
    event: str  # the column of the age at the event (one row per event)
    vaccine: str  # the column of the age at vaccination
    windows: tuple[tuple[int, int], ...]  # inclusive days after vaccination of each risk period
    age_cuts: tuple[int, ...]  # first day of each age group after the first
    published: dict[int, tuple[str, str, str]]  # covariateId: printed relative incidence, lower, upper

    def events(self) -> pd.DataFrame:
        return pd.read_csv(DATA / self.file, sep="\t")

    def window_ids(self) -> list[int]:
        return [FIRST_WINDOW_ID + w for w in range(len(self.windows))]

    def age_ids(self) -> list[int]:
        return [FIRST_AGE_ID + g for g in range(len(self.age_cuts))]


# sccsdta.sthlp, "Reproducing Table V in 2005 Whitaker": risk (-1, 14], (14, 28], (28, 42] days after MMR,
# time groups (enter, 426], (426, 487], ..., (670, exit]: standardsccs' expogrp = c(0, 15, 29), aedrug = mmr + 42,
# agegrp = c(427, 488, 549, 610, 671) (its itp.mod3 example).
ITP = StandardSccs(
    name="MMR and ITP",
    file="itpdat.txt",
    event="itp",
    vaccine="mmr",
    windows=((0, 14), (15, 28), (29, 42)),
    age_cuts=(427, 488, 549, 610, 671),
    published={
        1: ("1.308872", ".2992227", "5.725324"),
        2: ("5.953976", "2.519222", "14.07174"),
        3: ("2.600204", ".7453587", "9.07088"),
        11: (".6564854", ".2953778", "1.459057"),
        12: (".21047", ".0594804", ".7447431"),
        13: (".2914526", ".0943224", ".9005775"),
        14: (".3959018", ".1385691", "1.13112"),
        15: (".4015822", ".1404577", "1.148163"),
    },
)
# sccsdta.sthlp, "Case 3.1 in 2005 Whitaker": risk (14, 35] days after MMR, time groups 366-547 and 548-730.
MENINGITIS = StandardSccs(
    name="MMR and viral meningitis (Oxford)",
    file="amdat.txt",
    event="am",
    vaccine="mmr",
    windows=((15, 35),),
    age_cuts=(548,),
    published={1: ("12.03687", "3.002256", "48.25915"), 11: (".2252429", ".0251654", "2.016037")},
)
EXAMPLES = [ITP, MENINGITIS]


def assert_printed(value: float, printed: str, what: str) -> None:
    """``value`` rounds to ``printed`` at its number of decimals (so every printed digit matches)."""
    decimals = len(printed.split(".")[1])
    assert abs(value - float(printed)) <= 0.5 * 10.0**-decimals * (1 + 1e-9), f"{what}: {value!r} vs {printed}"


# -- ours: person-level tables -> sccs_eras -> sccs_fit ---------------------------------------------------


def person_frames(study: StandardSccs) -> dict[str, pd.DataFrame]:
    """The person-level tables of sccs_eras on the age axis: the vaccination a one-day exposure (drugId 1), each
    age group after the first an exposure of its own (drugId = its covariateId) over its days."""
    events = study.events()
    cases = events.drop_duplicates("case")
    last_day = int(cases["end"].max())
    group_ends = [cut - 1 for cut in study.age_cuts[1:]] + [last_day]
    vaccinations = pd.DataFrame(
        {"caseId": cases["case"], "drugId": 1, "start": cases[study.vaccine], "end": cases[study.vaccine]}
    )
    age_groups = pd.DataFrame(
        [
            (case, drug, first, last)
            for case in cases["case"]
            for drug, first, last in zip(study.age_ids(), study.age_cuts, group_ends, strict=True)
        ],
        columns=["caseId", "drugId", "start", "end"],
    )
    return {
        "cases_dataset_id": pd.DataFrame(
            {"caseId": cases["case"], "observationStart": cases["sta"], "observationEnd": cases["end"]}
        ),
        "events_dataset_id": pd.DataFrame({"caseId": events["case"], "day": events[study.event]}),
        "exposures_dataset_id": pd.concat([vaccinations, age_groups], ignore_index=True),
    }


def eras_params(study: StandardSccs) -> dict:
    windows = [
        {
            "label": f"days {first}-{last}",
            "start": first,
            "end": last,
            "end_anchor": "exposure_start",
            "covariate_id": cid,
        }
        for (first, last), cid in zip(study.windows, study.window_ids(), strict=True)
    ]
    age_groups = [
        {"label": f"age from day {cut}", "drug_ids": [cid], "windows": [{"covariate_id": cid}]}
        for cut, cid in zip(study.age_cuts, study.age_ids(), strict=True)
    ]
    return {
        "cases_dataset_id": "c",
        "events_dataset_id": "e",
        "exposures_dataset_id": "x",
        "exposures": [{"label": "vaccine", "drug_ids": [1], "windows": windows}, *age_groups],
    }


def interval_tables(study: StandardSccs) -> dict[str, pd.DataFrame]:
    """sccs_eras' artifacts: outcomes, covariates, names."""
    progress = LocalProgress()
    run_kind(
        get_kind("sccs_eras"),
        eras_params(study),
        local_context("cpu", datasets=person_frames(study), progress=progress),
    )
    return progress.artifacts


FIT_PARAMS = {
    "outcomes_dataset_id": "o",
    "covariates_dataset_id": "c",
    "names_dataset_id": "n",
    "prior": {"type": "none"},
    "tolerance": 1e-12,
    "convergence": "gradient",
    "diagnostics": None,
}


def fit_job(tables: dict[str, pd.DataFrame], device: str = "cpu") -> dict:
    datasets = {
        "outcomes_dataset_id": tables["outcomes"],
        "covariates_dataset_id": tables["covariates"],
        "names_dataset_id": tables["names"],
    }
    return run_kind(get_kind("sccs_fit"), FIT_PARAMS, local_context(device, datasets=datasets))


def wald_intervals(tables: dict[str, pd.DataFrame], beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standard errors from the observed information of the conditional likelihood (our Hessian) and the
    relative-incidence Wald interval (2, J)."""
    data = load_tables(tables["outcomes"], tables["covariates"]).data
    information = precondition.hessian_block(data, beta, np.arange(data.n_covariates))
    se = np.sqrt(np.diag(np.linalg.inv(information)))
    return se, np.exp([beta - Z_975 * se, beta + Z_975 * se])


# -- the independent side: intervals cut day by day, statsmodels ------------------------------------------


def day_by_day_intervals(study: StandardSccs) -> pd.DataFrame:
    """One row per (case, risk period, age group) with its days and events, from a walk over every observed
    day (risk period 0: none; age group 0: the first)."""
    events = study.events()
    rows = []
    for case, own in events.groupby("case", sort=True):
        first = own.iloc[0]
        days = np.arange(int(first["sta"]), int(first["end"]) + 1)
        since = days - int(first[study.vaccine])
        window = np.zeros(days.size, dtype=int)
        for w, (start, stop) in enumerate(study.windows, start=1):
            window[(since >= start) & (since <= stop)] = w
        age_group = np.searchsorted(np.asarray(study.age_cuts), days, side="right")
        count = pd.Series(own[study.event]).value_counts()
        for (w, g), group in pd.DataFrame({"w": window, "g": age_group, "day": days}).groupby(["w", "g"]):
            rows.append((case, w, g, len(group), int(count.reindex(group["day"]).fillna(0).sum())))
    return pd.DataFrame(rows, columns=["case", "window", "age_group", "days", "events"])


def statsmodels_fit(study: StandardSccs) -> tuple[np.ndarray, np.ndarray]:
    """Poisson GLM, case dummies, offset log(days): (estimates, standard errors) in covariateId order."""
    import statsmodels.api as sm  # here, not at the top: the GPU test of this file runs where it may be absent

    rows = day_by_day_intervals(study)
    windows = [(rows["window"] == w).to_numpy(float) for w in range(1, len(study.windows) + 1)]
    ages = [(rows["age_group"] == g).to_numpy(float) for g in range(1, len(study.age_cuts) + 1)]
    dummies = pd.get_dummies(rows["case"]).to_numpy(float)
    design = np.column_stack([*windows, *ages, dummies])
    glm = sm.GLM(
        rows["events"].to_numpy(float),
        design,
        family=sm.families.Poisson(),
        offset=np.log(rows["days"].to_numpy(float)),
    ).fit(tol=1e-14, maxiter=500)
    n = len(windows) + len(ages)
    return np.asarray(glm.params[:n]), np.asarray(glm.bse[:n])


# -- the tests --------------------------------------------------------------------------------------------


def test_itp_data_give_the_published_follow_up_table() -> None:
    # sccsdta's table for Table V: intervals of one row per event (a case with n events counts n times):
    # follow-up ctrl 14282, (-1, 14] 524, (14, 28] 474, (28, 42] 450 days; events 31, 2, 8, 3.
    tables = interval_tables(ITP)
    outcomes, covariates = tables["outcomes"], tables["covariates"]
    events = ITP.events()
    assert len(events) == 44 and events["case"].nunique() == 35
    per_event_days = outcomes["time"] * outcomes["stratumId"].map(outcomes.groupby("stratumId")["y"].sum())
    in_window = {
        cid: outcomes["rowId"].isin(covariates.loc[covariates["covariateId"] == cid, "rowId"])
        for cid in ITP.window_ids()
    }
    control = ~np.logical_or.reduce(list(in_window.values()))
    groups = [control, *in_window.values()]
    assert [per_event_days[m].sum() for m in groups] == [14282, 524, 474, 450]
    assert [outcomes["y"][m].sum() for m in groups] == [31, 2, 8, 3]
    # the day-by-day intervals hold the same days and events
    rows = day_by_day_intervals(ITP)
    assert rows["days"].sum() == outcomes["time"].sum() and rows["events"].sum() == outcomes["y"].sum() == 44


@pytest.mark.parametrize("study", EXAMPLES, ids=lambda s: s.name)
def test_sccs_fit_reproduces_the_published_relative_incidences(study: StandardSccs) -> None:
    tables = interval_tables(study)
    fit = fit_job(tables)
    assert fit["converged"] and fit["gradient_norm"] < 1e-9 and fit["dropped_cases"] == 0
    ids = [c["covariate_id"] for c in fit["coefficients"]]
    assert ids == study.window_ids() + study.age_ids()
    beta = np.array([c["estimate"] for c in fit["coefficients"]])
    _, (lower, upper) = wald_intervals(tables, beta)
    for j, cid in enumerate(ids):
        ri, lo, hi = study.published[cid]
        assert_printed(fit["coefficients"][j]["relative_incidence"], ri, f"{study.name} {cid} relative incidence")
        assert_printed(lower[j], lo, f"{study.name} {cid} lower")
        assert_printed(upper[j], hi, f"{study.name} {cid} upper")


@pytest.mark.parametrize("study", EXAMPLES, ids=lambda s: s.name)
def test_sccs_fit_equals_statsmodels_poisson_with_case_dummies(study: StandardSccs) -> None:
    tables = interval_tables(study)
    beta = np.array([c["estimate"] for c in fit_job(tables)["coefficients"]])
    se, _ = wald_intervals(tables, beta)
    glm_beta, glm_se = statsmodels_fit(study)
    np.testing.assert_allclose(beta, glm_beta, rtol=0, atol=1e-8)
    np.testing.assert_allclose(se, glm_se, rtol=1e-6)
    # The published numbers are the model's, not our code's: the GLM's intervals print the same.
    for j, cid in enumerate(study.window_ids() + study.age_ids()):
        ri, lo, hi = study.published[cid]
        assert_printed(math.exp(glm_beta[j]), ri, f"GLM {cid}")
        assert_printed(math.exp(glm_beta[j] - Z_975 * glm_se[j]), lo, f"GLM {cid} lower")
        assert_printed(math.exp(glm_beta[j] + Z_975 * glm_se[j]), hi, f"GLM {cid} upper")


@pytest.mark.gpu
@pytest.mark.parametrize("study", EXAMPLES, ids=lambda s: s.name)
def test_sccs_fit_on_the_gpu_equals_numpy_on_the_published_data(study: StandardSccs) -> None:
    tables = interval_tables(study)
    host, device = fit_job(tables), fit_job(tables, device="gpu")
    assert device["device"] != "cpu" and device["converged"]
    np.testing.assert_allclose(
        [c["estimate"] for c in device["coefficients"]],
        [c["estimate"] for c in host["coefficients"]],
        rtol=1e-10,
        atol=1e-12,
    )
    for coefficient in device["coefficients"]:
        assert_printed(
            coefficient["relative_incidence"],
            study.published[coefficient["covariate_id"]][0],
            f"GPU {study.name} {coefficient['covariate_id']}",
        )
