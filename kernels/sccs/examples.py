"""Seeded example tables of the SCCS kinds: synthetic Cyclops tables (``sccs_fit``, ``sccs_analyses``) and
person-level tables (``sccs_eras``), and the ``sccs_analyses`` example's params."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernels.sccs import synthetic


def cyclops_frames(n_cases: int, n_drugs: int, seed: int, names: bool = False) -> dict[str, pd.DataFrame]:
    """Synthetic Cyclops tables (:mod:`kernels.sccs.synthetic`) as the ``sccs_fit`` datasets."""
    tables = synthetic.to_tables(synthetic.generate(np, n_cases=n_cases, n_drugs=n_drugs, seed=seed).data)
    frames = {
        "outcomes_dataset_id": pd.DataFrame(
            {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y}
        ),
        "covariates_dataset_id": pd.DataFrame(
            {"rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value}
        ),
    }
    if names:
        ids = np.arange(1, n_drugs + 1)
        frames["names_dataset_id"] = pd.DataFrame({"covariateId": ids, "covariateName": [f"drug {i}" for i in ids]})
    return frames


def example_fit_tables() -> dict[str, pd.DataFrame]:
    """3,000 synthetic cases, 40 drugs, with their names (the ``sccs_fit`` and ``sccs_analyses`` examples)."""
    return cyclops_frames(n_cases=3_000, n_drugs=40, seed=5, names=True)


def example_person_tables() -> dict[str, pd.DataFrame]:
    """400 cases observed for 1-2 years, 1-4 events each, 1,200 exposures of 25 drugs (seeded, deterministic)."""
    generator = np.random.default_rng(2013)
    n_cases, n_exposures = 400, 1_200
    case_id = np.arange(1, n_cases + 1)
    observation_end = generator.integers(365, 731, n_cases)
    events_per_case = generator.integers(1, 5, n_cases)
    event_case = np.repeat(case_id, events_per_case)
    exposure_start = generator.integers(0, 700, n_exposures)
    return {
        "cases_dataset_id": pd.DataFrame({"caseId": case_id, "observationStart": np.zeros(n_cases, dtype=np.int64),
                                          "observationEnd": observation_end}),
        "events_dataset_id": pd.DataFrame({"caseId": event_case,
                                           "day": generator.integers(0, 731, event_case.size)}),
        "exposures_dataset_id": pd.DataFrame({"caseId": generator.integers(1, n_cases + 1, n_exposures),
                                              "drugId": generator.integers(1, 26, n_exposures),
                                              "start": exposure_start,
                                              "end": exposure_start + generator.integers(0, 60, n_exposures)}),
    }


def example_analyses_params() -> dict:
    """The sccs_analyses example: the fit example's tables, every drug alone, drugs 11-30 as negative controls."""
    return {"outcomes_dataset_id": "<outcomes dataset id>", "covariates_dataset_id": "<covariates dataset id>",
            "names_dataset_id": "<names dataset id>", "negative_controls": list(range(11, 31)), "level": 0.95}
