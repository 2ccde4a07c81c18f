"""The ``sccs_fit`` job kind: spec validation, result names, artifacts, progress and cancellation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.progress import JobCancelled, LocalProgress
from kernels.registry import get_kind
from kernels.sccs import ccd, fit_job, jobs, synthetic
from kernels.sccs.model import Prior
from kernels.sccs.spec import SccsParams


def _frames(seed: int = 41, n_cases: int = 300, n_drugs: int = 6) -> dict[str, pd.DataFrame]:
    data = synthetic.generate(np, n_cases, n_drugs, seed=seed, effect_share=0.5, min_eras=3, max_eras=8).data
    t = synthetic.to_tables(data)
    outcomes = pd.DataFrame({"rowId": t.row_id, "stratumId": t.stratum_id, "time": t.time, "y": t.y})
    # One case without events: dropped and counted.
    outcomes = pd.concat([outcomes, pd.DataFrame({"rowId": [10**6], "stratumId": [10**6], "time": [30.0],
                                                  "y": [0.0]})], ignore_index=True)
    covariates = pd.DataFrame({"rowId": t.cov_row_id, "covariateId": t.cov_id, "covariateValue": t.cov_value})
    names = pd.DataFrame({"covariateId": np.arange(1, n_drugs + 1), "covariateName": [f"drug {i}" for i in
                                                                                    range(1, n_drugs + 1)]})
    return {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates, "names_dataset_id": names}


KINDS = {kind.name: kind for kind in jobs.KINDS}


def run_fit(params: SccsParams, frames: dict[str, pd.DataFrame], progress: LocalProgress, device: str = "cpu") -> dict:
    """The sccs_fit job through the kit's wrap-up (the result JSON)."""
    return run_kind(KINDS["sccs_fit"], params, local_context(device, datasets=frames, progress=progress))


def run_eras(params: dict, frames: dict[str, pd.DataFrame], progress: LocalProgress) -> dict:
    return run_kind(KINDS["sccs_eras"], params, local_context("cpu", datasets=frames, progress=progress))


def _params(**overrides: object) -> SccsParams:
    spec = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "names_dataset_id": "n"}
    spec.update(overrides)
    return SccsParams.model_validate(spec)


def test_kind_is_registered() -> None:
    kind = get_kind("sccs_fit")
    assert kind.params_model is SccsParams
    assert kind.dataset_ids(_params()) == {"outcomes_dataset_id": "o", "covariates_dataset_id": "c",
                                           "names_dataset_id": "n"}
    assert kind.result_model.__name__ == "SccsResult" and not kind.host_only
    SccsParams.model_validate({**kind.example.params, "outcomes_dataset_id": "o", "covariates_dataset_id": "c"})
    assert get_kind("sccs_eras").host_only


@pytest.mark.parametrize(
    "bad",
    [
        {"prior": {"type": "ridge"}},
        {"prior": {"type": "normal", "variance": 0}},
        {"cross_validation": {"folds": 1}},
        {"cross_validation": {"grid": [-1.0]}},
        {"cross_validation": {"grid": [0.0, 1.0]}},
        {"cross_validation": {"grid": []}},
        {"bootstrap": {"replicates": 100_000}},
        {"tolerance": 0},
        {"max_iterations": 0},
        {"precision": "float16"},
        {"unknown": 1},
    ],
)
def test_spec_refuses_bad_values(bad: dict) -> None:
    with pytest.raises(ValidationError):
        _params(**bad)


def test_full_run_result_names_and_artifacts() -> None:
    frames = _frames()
    params = _params(prior={"type": "laplace", "variance": 1.0, "exclude": [2]},
                     cross_validation={"folds": 3, "grid": [0.05, 0.5]}, bootstrap={"replicates": 8, "seed": 3})
    progress = LocalProgress()
    result = run_fit(params, frames, progress)
    for key in ("coefficients", "log_likelihood", "log_posterior", "variance", "cv_curve", "iterations", "converged",
                "gradient_norm", "device", "timings", "dropped_cases"):
        assert key in result
    assert result["dropped_cases"] == 1 and result["n_cases"] == 300 and result["device"] == "cpu"
    assert result["variance"] in (0.05, 0.5) and len(result["cv_curve"]) == 2
    best = max(result["cv_curve"], key=lambda p: p["predictive_log_likelihood"])
    assert best["variance"] == result["variance"]
    coefficient = result["coefficients"][0]
    assert coefficient["covariate_id"] == 1 and coefficient["name"] == "drug 1"
    assert coefficient["relative_incidence"] == pytest.approx(math.exp(coefficient["estimate"]))
    assert result["kind"] == "sccs_fit"
    for c in result["coefficients"]:
        assert c["ci_lower"] <= c["ci_upper"] and 0.0 <= c["nonzero_share"] <= 1.0
        # the interval on both scales: log (ci_*) and relative incidence (relative_incidence_ci_*)
        assert c["relative_incidence_ci_lower"] == pytest.approx(math.exp(c["ci_lower"]), rel=1e-15)
        assert c["relative_incidence_ci_upper"] == pytest.approx(math.exp(c["ci_upper"]), rel=1e-15)
    assert set(progress.artifacts) == {"cv_predictive_log_likelihood", "bootstrap_estimates", "coefficients"}
    assert progress.artifacts["bootstrap_estimates"]["estimates"].shape == (8, 6)
    assert progress.artifacts["cv_predictive_log_likelihood"]["coefficients"].shape == (3, 2, 6)
    assert progress.reports[-1] == (1.0, "done")
    done = [_fits_done(stage) for _, stage in progress.reports if _fits_done(stage) is not None]
    assert done[-1] == (15, 15)  # 3 folds x 2 variances + 1 + 8
    fractions = [fraction for fraction, _ in progress.reports]
    assert fractions == sorted(fractions)
    # The reported fit is the NumPy fit at the chosen variance (covariate 2 unpenalised).
    penalised = np.array([True, False, True, True, True, True])
    from kernels.sccs.tables import load_tables

    data = load_tables(frames["outcomes_dataset_id"], frames["covariates_dataset_id"]).data
    direct = ccd.fit(data, Prior("laplace", result["variance"], penalised))
    np.testing.assert_allclose([c["estimate"] for c in result["coefficients"]], direct.beta, rtol=0, atol=1e-15)
    assert result["log_posterior"] == pytest.approx(direct.log_posterior, rel=1e-12)


def test_run_without_prior_reports_no_variance() -> None:
    frames = _frames(seed=42)
    result = run_fit(_params(prior={"type": "none"}, tolerance=1e-9, convergence="gradient"), frames,
                     LocalProgress())
    assert result["variance"] is None and result["converged"] and result["gradient_norm"] < 1e-6
    assert result["coefficients"][0]["ci_lower"] is None and result["coefficients"][0]["nonzero_share"] is None


def test_covariate_value_defaults_to_one_and_names_are_optional() -> None:
    frames = _frames(seed=43)
    with_values = run_fit(_params(names_dataset_id=None), {k: v for k, v in frames.items() if k != "names_dataset_id"},
                          LocalProgress())
    frames["covariates_dataset_id"] = frames["covariates_dataset_id"].drop(columns=["covariateValue"])
    without = run_fit(_params(), frames, LocalProgress())
    assert [c["estimate"] for c in without["coefficients"]] == [c["estimate"] for c in with_values["coefficients"]]
    assert with_values["coefficients"][0]["name"] is None and without["coefficients"][0]["name"] == "drug 1"


def test_run_time_errors_name_the_problem() -> None:
    frames = _frames()
    with pytest.raises(ValueError, match=r"prior\.exclude"):
        run_fit(_params(prior={"type": "normal", "exclude": [999]}), frames, LocalProgress())
    with pytest.raises(ValueError, match="cross_validation needs"):
        run_fit(_params(prior={"type": "none"}, cross_validation={}), frames, LocalProgress())
    broken = dict(frames)
    broken["outcomes_dataset_id"] = frames["outcomes_dataset_id"].drop(columns=["time"])
    with pytest.raises(ValueError, match="lacks column 'time'"):
        run_fit(_params(), broken, LocalProgress())
    broken = dict(frames)
    broken["covariates_dataset_id"] = frames["covariates_dataset_id"].assign(rowId=2.5)
    with pytest.raises(ValueError, match=r"covariates\.rowId must hold integers"):
        run_fit(_params(), broken, LocalProgress())


def _fits_done(stage: str | None) -> tuple[int, int] | None:
    """(done, total) of a per-cycle report "<stage>: 3/7 fits done, cycle 2"."""
    if not stage or "fits done" not in stage:
        return None
    done, total = stage.split(": ")[1].split(" ")[0].split("/")
    return int(done), int(total)


class _CancelAt(LocalProgress):
    """Requests the cancel at the ``report``-th per-cycle report of ``stage``."""

    def __init__(self, stage: str, report: int) -> None:
        super().__init__()
        self.stage, self.report, self.seen, self.requested_at = stage, report, 0, None

    def __call__(self, fraction: float, stage: str | None = None) -> None:
        super().__call__(fraction, stage)
        if stage and stage.startswith(self.stage + ":"):
            self.seen += 1
            if self.seen == self.report:
                self.requested_at = len(self.reports)
                self.cancel()


def test_cancel_during_cross_validation() -> None:
    progress = _CancelAt("cross-validation", report=1)
    params = _params(prior={"type": "normal"}, cross_validation={"folds": 3, "grid": [0.1, 1.0]})
    with pytest.raises(JobCancelled):
        run_fit(params, _frames(), progress)
    assert len(progress.reports) == progress.requested_at + 1  # the very next checkpoint raised
    assert _fits_done(progress.reports[-1][1])[0] <= 1  # after one more CCD cycle, not after the batch


def test_cancel_mid_bootstrap_stops_within_a_cycle_and_progress_is_per_cycle() -> None:
    frames = _frames(seed=44)
    params = _params(prior={"type": "laplace", "variance": 0.1}, bootstrap={"replicates": 20, "seed": 2})
    full = LocalProgress()
    run_fit(params, frames, full)
    fractions = [fraction for fraction, _ in full.reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    boot_reports = [_fits_done(stage) for _, stage in full.reports if stage and stage.startswith("bootstrap:")]
    # One report per CCD cycle of every refit, so several per batch of 10 (NumPy chunk).
    assert len(boot_reports) == int(full.artifacts["bootstrap_estimates"]["iterations"].sum())
    first_batch = [done for done, _ in boot_reports if done < 1 + 10]
    assert len(first_batch) > 10

    progress = _CancelAt("bootstrap", report=3)
    with pytest.raises(JobCancelled):
        run_fit(params, frames, progress)
    assert len(progress.reports) == progress.requested_at + 1  # stopped at the next cycle
    assert progress.reports[:-1] == full.reports[:len(progress.reports) - 1]
    done, total = _fits_done(progress.reports[-1][1])
    assert total == 21 and done < 1 + 10  # inside the first bootstrap batch
    assert "bootstrap_estimates" not in progress.artifacts


def test_spec_defaults_are_the_issues() -> None:
    params = SccsParams.model_validate({"outcomes_dataset_id": "o", "covariates_dataset_id": "c"})
    assert params.names_dataset_id is None
    assert params.prior.type == "laplace" and params.prior.variance == 1.0 and params.prior.exclude == []
    assert params.cross_validation is None and params.bootstrap is None
    assert params.tolerance == 5e-4 and params.convergence == "xbeta"
    assert params.max_iterations == 1000 and params.precision == "float64"
    cv = _params(cross_validation={}).cross_validation
    assert cv.folds == 10 and cv.grid == "auto" and len(cv.variances()) == 10
    assert _params(bootstrap={}).bootstrap.replicates == 200
    eras = get_kind("sccs_eras").params_model.model_validate(
        {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x"})
    assert (eras.risk_window_start, eras.start_anchor) == (0, "exposure_start")
    assert (eras.risk_window_end, eras.end_anchor) == (0, "exposure_end")


@pytest.mark.parametrize("kind", ["normal", "none"])
def test_nonzero_share_is_null_without_the_laplace_prior(kind: str) -> None:
    result = run_fit(_params(prior={"type": kind, "variance": 0.03}, bootstrap={"replicates": 6, "seed": 1}),
                     _frames(), LocalProgress())
    assert all(c["nonzero_share"] is None for c in result["coefficients"])
    assert all(c["ci_lower"] is not None for c in result["coefficients"])


def test_nonzero_share_under_laplace_counts_the_nonzero_refits() -> None:
    progress = LocalProgress()
    result = run_fit(_params(prior={"type": "laplace", "variance": 0.03}, bootstrap={"replicates": 20, "seed": 1}),
                     _frames(), progress)
    shares = np.array([c["nonzero_share"] for c in result["coefficients"]])
    estimates = progress.artifacts["bootstrap_estimates"]["estimates"]
    np.testing.assert_array_equal(shares * 20, np.count_nonzero(estimates, axis=0))
    assert np.any((shares > 0) & (shares < 1))  # some drugs enter only some refits
    assert np.all(shares[np.array([c["estimate"] for c in result["coefficients"]]) != 0] > 0)


def test_cv_curve_reports_non_converged_folds() -> None:
    frames = _frames()
    grid = {"folds": 3, "grid": [0.05, 0.5]}
    converged = run_fit(_params(prior={"type": "normal"}, cross_validation=grid), frames, LocalProgress())
    assert [p["non_converged_folds"] for p in converged["cv_curve"]] == [0, 0]
    assert all(1 <= i < 1000 for p in converged["cv_curve"] for i in p["fold_iterations"])
    progress = LocalProgress()
    capped = run_fit(_params(prior={"type": "normal"}, cross_validation=grid, tolerance=1e-12, max_iterations=2),
                     frames, progress)
    assert [p["non_converged_folds"] for p in capped["cv_curve"]] == [3, 3]
    assert [p["fold_iterations"] for p in capped["cv_curve"]] == [[2, 2, 2], [2, 2, 2]]
    assert not progress.artifacts["cv_predictive_log_likelihood"]["converged"].any()
    assert not capped["converged"]


def test_duplicate_names_are_refused_with_the_id() -> None:
    frames = _frames()
    names = frames["names_dataset_id"]
    frames["names_dataset_id"] = pd.concat([names, pd.DataFrame({"covariateId": [4], "covariateName": ["again"]})])
    with pytest.raises(ValueError, match="covariateId 4 more than once"):
        run_fit(_params(), frames, LocalProgress())


def _person_frames(dates: bool) -> dict[str, pd.DataFrame]:
    def day(values: list[int]) -> object:
        return pd.to_datetime(values, unit="D") if dates else values

    return {
        "cases_dataset_id": pd.DataFrame({"caseId": [1, 2, 3], "observationStart": day([0, 100, 0]),
                                          "observationEnd": day([99, 130, 9])}),
        "events_dataset_id": pd.DataFrame({"caseId": [1, 1, 1, 1, 1, 1, 2, 2],
                                           "day": day([5, 12, 16, 16, 50, 150, 101, 120])}),
        "exposures_dataset_id": pd.DataFrame({"caseId": [1, 1, 2], "drugId": [7, 8, 7], "start": day([10, 15, 90]),
                                              "end": day([19, 29, 105])}),
    }


@pytest.mark.parametrize("dates", [False, True])
def test_eras_kind_builds_the_hand_worked_tables(dates: bool) -> None:
    # The case worked by hand in test_sccs_data.py: windows [start + 1, end + 2].
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x", "risk_window_start": 1,
              "risk_window_end": 2}
    progress = LocalProgress()
    result = run_eras(params, _person_frames(dates), progress)
    assert result["device"] == "cpu" and set(result["timings"]) == {"eras", "total"}
    assert result["kind"] == "sccs_eras"
    assert result["n_cases"] == 3 and result["n_cases_with_events"] == 2 and result["n_eras"] == 7
    assert result["events_in_observation"] == 7 and result["events_outside_observation"] == 1
    assert result["n_drugs"] == 2 and result["n_covariate_rows"] == 5
    outcomes = progress.artifacts["outcomes"]
    assert outcomes["time"].tolist() == [79, 5, 6, 10, 8, 23, 10]
    assert outcomes["y"].tolist() == [2, 1, 2, 0, 1, 1, 0]
    # The tables feed sccs_fit directly (case 3 has no events and is dropped there).
    fit = run_fit(_params(names_dataset_id=None, prior={"type": "normal", "variance": 1.0}),
                  {"outcomes_dataset_id": outcomes, "covariates_dataset_id": progress.artifacts["covariates"]},
                  LocalProgress())
    assert fit["dropped_cases"] == 1 and [c["covariate_id"] for c in fit["coefficients"]] == [7, 8]


def test_eras_kind_anchors_the_window_start_at_exposure_end() -> None:
    # Windows [end + 1, end + 10]: case 1 drug 7 [20, 29], drug 8 [30, 39]; case 2 drug 7 [106, 115].
    # Case 1: [0,19] none, [20,29] {7}, [30,39] {8}, [40,99] none; events 5, 12, 16, 16, 50 are all baseline.
    # Case 2: [100,105] none (event 101), [106,115] {7}, [116,130] none (event 120). Case 3: baseline.
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x", "risk_window_start": 1,
              "start_anchor": "exposure_end", "risk_window_end": 10, "end_anchor": "exposure_end"}
    progress = LocalProgress()
    run_eras(params, _person_frames(False), progress)
    outcomes, covariates = progress.artifacts["outcomes"], progress.artifacts["covariates"]
    assert outcomes["stratumId"].tolist() == [1, 1, 1, 2, 2, 3]
    assert outcomes["time"].tolist() == [80, 10, 10, 21, 10, 10]
    assert outcomes["y"].tolist() == [5, 0, 0, 2, 0, 0]
    assert covariates["rowId"].tolist() == [1, 2, 4] and covariates["covariateId"].tolist() == [7, 8, 7]


def test_eras_kind_rejects_events_of_unknown_cases() -> None:
    frames = _person_frames(dates=False)
    frames["events_dataset_id"] = pd.DataFrame({"caseId": [9], "day": [3]})
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x"}
    with pytest.raises(ValueError, match="event_case has cases without an observation period"):
        run_eras(params, frames, LocalProgress())


def test_examples_run_on_numpy() -> None:
    fit = run_fit(KINDS["sccs_fit"].example.params, KINDS["sccs_fit"].example.frames(), LocalProgress())
    assert fit["cv_curve"] and fit["bootstrap_converged"] == 20 and fit["coefficients"][0]["name"] == "drug 1"
    assert {"tables", "build", "cross_validation", "fit", "bootstrap"} <= set(fit["timings"])
    eras = run_eras(KINDS["sccs_eras"].example.params, KINDS["sccs_eras"].example.frames(), LocalProgress())
    assert eras["n_eras"] > eras["n_cases"] > 0 and eras["n_drugs"] == 25


@pytest.mark.gpu
def test_fit_job_on_the_gpu_equals_numpy() -> None:
    # Tables built on the device, CV, final fit and bootstrap in engines of several batch sizes.
    params = _params(prior={"type": "laplace", "variance": 0.3, "exclude": [2]},
                     cross_validation={"folds": 3, "grid": [0.05, 0.5]}, bootstrap={"replicates": 8, "seed": 3})
    frames = _frames()
    host = run_fit(params, frames, LocalProgress())
    device_progress = LocalProgress()
    device = run_fit(params, frames, device_progress, device="gpu")
    assert device["device"] != "cpu" and "engine" in device["timings"]
    np.testing.assert_allclose([c["estimate"] for c in device["coefficients"]],
                               [c["estimate"] for c in host["coefficients"]], rtol=1e-10, atol=1e-13)
    assert device["log_posterior"] == pytest.approx(host["log_posterior"], rel=1e-12)
    assert device["variance"] == host["variance"] and device["dropped_cases"] == host["dropped_cases"] == 1
    assert [p["fold_iterations"] for p in device["cv_curve"]] == [p["fold_iterations"] for p in host["cv_curve"]]
    assert device_progress.reports[-1] == (1.0, "done")


@pytest.mark.gpu
def test_gpu_warm_up_runs_the_tiny_jobs() -> None:
    fit_job.warm_up_fit()  # registered with cuda.on_warm_up: cuda.warm_up() runs it at worker start


def _stored_as_uploaded(frame: pd.DataFrame, as_text: bool) -> pd.DataFrame:
    """The table as the worker reads an upload back: CSV text read by pyarrow (ISO dates become date32) or a
    Parquet file, written and read as Parquet (store/dataset_ingest.py)."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    table = (pa_csv.read_csv(io.BytesIO(frame.to_csv(index=False).encode())) if as_text
             else pa.Table.from_pandas(frame, preserve_index=False))
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return pd.read_parquet(io.BytesIO(sink.getvalue()))


def _as_iso_text(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    out = {}
    for key, frame in frames.items():
        frame = frame.copy()
        for column in frame.columns:
            if column not in ("caseId", "drugId"):
                frame[column] = (pd.Timestamp("2020-01-01") + pd.to_timedelta(frame[column], unit="D")).dt.strftime(
                    "%Y-%m-%d")
        out[key] = frame
    return out


@pytest.mark.parametrize("as_text", [True, False])
def test_eras_kind_reads_iso_dates_of_csv_and_parquet_uploads(as_text: bool) -> None:
    # The issue's failure: a CSV with dates gave "cases.observationStart must be numeric, got dtype object"
    # (pyarrow reads 2020-01-31 as date32, pandas shows it as date objects). Dates must give the day numbers'
    # tables: every interval length and event count equal, the days shifted by the epoch offset only.
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x", "risk_window_start": 1,
              "risk_window_end": 2}
    by_days, by_dates = LocalProgress(), LocalProgress()
    run_eras(params, _person_frames(False), by_days)
    iso_frames = _as_iso_text(_person_frames(False))
    text_frames = {key: _stored_as_uploaded(frame, as_text) for key, frame in iso_frames.items()}
    assert text_frames["cases_dataset_id"]["observationStart"].dtype == object or not as_text
    run_eras(params, text_frames, by_dates)
    for name in ("outcomes", "covariates"):
        pd.testing.assert_frame_equal(by_dates.artifacts[name], by_days.artifacts[name])


@pytest.mark.parametrize(
    ("table", "column", "value", "message"),
    [
        ("cases_dataset_id", "observationEnd", "2020-02-30", r"cases.observationEnd must hold day numbers or dates "
                                                             r"\(YYYY-MM-DD\); row 2 holds '2020-02-30'"),
        ("events_dataset_id", "day", "soon", r"events.day must hold day numbers or dates.*row 2 holds 'soon'"),
        ("exposures_dataset_id", "end", None, r"exposures.end has a missing value at row 2"),
    ],
)
def test_unreadable_dates_are_named_by_row(table: str, column: str, value: object, message: str) -> None:
    frames = _as_iso_text(_person_frames(False))
    frames[table] = frames[table].astype({column: object})
    frames[table].loc[1, column] = value
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x"}
    with pytest.raises(ValueError, match=message):
        run_eras(params, frames, LocalProgress())


def test_inverted_periods_are_named_by_row() -> None:
    frames = _person_frames(False)
    frames["exposures_dataset_id"].loc[2, "end"] = 80  # case 2's exposure [90, 80]
    params = {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x"}
    with pytest.raises(ValueError, match=r"exposure_end must not precede exposure_start: 1 row\(s\) of the "
                                         r"exposures table, the first row 3 \(exposure_end 80 < exposure_start 90"):
        run_eras(params, frames, LocalProgress())
    frames = _person_frames(False)
    frames["cases_dataset_id"].loc[1, "observationEnd"] = 50
    with pytest.raises(ValueError, match=r"observation_end must not precede observation_start: 1 row\(s\) of the "
                                         r"cases table, the first row 2"):
        run_eras(params, frames, LocalProgress())
