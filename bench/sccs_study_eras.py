"""The era builder of a study design (``kernels/sccs/study.py``, host NumPy) at the paper's smallest size:
N = 115,000 cases observed 300-1,100 days, 1.15M exposure rows of 20 drugs, 230,000 events; each drug an
exposure with a pre-exposure, an on-treatment and a washout window (60 covariates). Three designs: the windows
only; the windows with age (5 knots at the event ages' quantiles) and season (5 knots) splines; the original
one-window spec over every drug. Prints ``RESULT {json}`` lines (seconds of ``study_eras``, table sizes).

Usage: ``PYTHONPATH=. python3 bench/sccs_study_eras.py``.
"""

from __future__ import annotations

import json
import time

import numpy as np

from kernels.sccs import study as st

N_CASES, N_DRUGS = 115_000, 20
DAY_2015 = 16_436


def person_inputs(seed: int = 0) -> st.PersonInputs:
    g = np.random.default_rng(seed)
    n, m = N_CASES, 10 * N_CASES
    obs_start = DAY_2015 + g.integers(0, 365, n)
    obs_end = obs_start + g.integers(300, 1100, n)
    event_case = g.integers(0, n, 2 * n)
    exposure_start = DAY_2015 + g.integers(-100, 1500, m)
    return st.PersonInputs(
        case_id=np.arange(n), observation_start=obs_start, observation_end=obs_end, event_case=event_case,
        event_day=obs_start[event_case] + g.integers(0, 1000, event_case.size),
        exposure_case=g.integers(0, n, m), exposure_drug=g.integers(1, N_DRUGS + 1, m),
        exposure_start=exposure_start, exposure_end=exposure_start + g.integers(0, 60, m),
        age_at_observation_start=g.integers(0, 25_000, n),
    )


def windows(first_id: int) -> tuple[st.Window, ...]:
    return (st.Window(-30, "exposure_start", -1, "exposure_start", first_id, "pre-exposure"),
            st.Window(0, "exposure_start", 0, "exposure_end", first_id + 1, "on treatment"),
            st.Window(1, "exposure_end", 30, "exposure_end", first_id + 2, "washout"))


def main() -> None:
    inputs = person_inputs()
    exposures = tuple(st.Exposure((d,), windows(1000 + 3 * d)) for d in range(1, N_DRUGS + 1))
    designs = {
        "windows": st.Design(exposures=exposures),
        "windows_age_season": st.Design(exposures=exposures, age=st.Spline(5), season=st.Spline(5)),
        "one_window_spec": st.Design(legacy=st.LegacyWindow(0, 30)),
    }
    for name, design in designs.items():
        start = time.perf_counter()
        built = st.study_eras(inputs, design)
        seconds = time.perf_counter() - start
        print("RESULT " + json.dumps({"design": name, "seconds": round(seconds, 2), "cases": N_CASES,
                                      "eras": int(built.tables.row_id.size),
                                      "entries": int(built.tables.cov_id.size)}))


if __name__ == "__main__":
    main()
