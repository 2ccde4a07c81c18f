"""The SCCS job kinds: ``sccs_fit`` (Bayesian self-controlled case series on the Cyclops interval tables:
``kernels/sccs/fit_job.py``), ``sccs_analyses`` (many single-exposure analyses: ``kernels/sccs/analyses_job.py``)
and ``sccs_eras`` (person-level observation periods, events and exposures to those tables:
``kernels/sccs/eras_job.py``). Model and conventions: ``docs/sccs.md``.
"""

from __future__ import annotations

from kernels.registry import JobKind, KindExample
from kernels.sccs import ANALYSES_KIND, ERAS_KIND, FIT_KIND
from kernels.sccs.analyses_job import run_analyses
from kernels.sccs.eras_job import run_eras
from kernels.sccs.examples import example_analyses_params as _example_analyses_params
from kernels.sccs.examples import example_fit_tables as _example_fit_tables
from kernels.sccs.examples import example_person_tables as _example_person_tables
from kernels.sccs.fit_job import run_fit
from kernels.sccs.spec import (
    SccsAnalysesParams,
    SccsAnalysesResult,
    SccsErasParams,
    SccsErasResult,
    SccsParams,
    SccsResult,
)
from kernels.sccs.work import analyses_work, eras_work, fit_work

KINDS = [
    JobKind(
        name=FIT_KIND,
        params_model=SccsParams,
        result_model=SccsResult,
        run=run_fit,
        dataset_fields=("outcomes_dataset_id", "covariates_dataset_id", "names_dataset_id", "cases_dataset_id",
                        "events_dataset_id"),
        summary="Bayesian self-controlled case series (Cyclops tables): CCD MAP fit, CV of the prior variance, "
        "bootstrap and profile-likelihood intervals, SCCS diagnostics, empirical calibration from control covariates",
        example=KindExample(
            {
                "outcomes_dataset_id": "<outcomes dataset id>",
                "covariates_dataset_id": "<covariates dataset id>",
                "names_dataset_id": "<names dataset id>",
                "prior": {"type": "laplace", "variance": 0.5, "exclude": []},
                "cross_validation": {"folds": 5, "grid": [0.01, 0.1, 1.0], "seed": 1},
                "bootstrap": {"replicates": 20, "seed": 2},
            },
            datasets=_example_fit_tables,
        ),
        work=fit_work,
        split_module="kernels.sccs.chunks",
        plots_module="plots.sccs",
    ),
    JobKind(
        name=ANALYSES_KIND,
        params_model=SccsAnalysesParams,
        result_model=SccsAnalysesResult,
        run=run_analyses,
        dataset_fields=("outcomes_dataset_id", "covariates_dataset_id", "names_dataset_id"),
        summary="Many SCCS analyses of one or several outcomes' tables (each exposure-outcome pair alone, one batch "
        "on the GPU): conditional MLE, likelihood-ratio intervals and p-values, MDRR, empirical calibration from "
        "controls",
        example=KindExample(_example_analyses_params(), datasets=_example_fit_tables),
        work=analyses_work,
        split_module="kernels.sccs.analyses_chunks",
    ),
    JobKind(
        name=ERAS_KIND,
        params_model=SccsErasParams,
        result_model=SccsErasResult,
        run=run_eras,
        dataset_fields=("cases_dataset_id", "events_dataset_id", "exposures_dataset_id"),
        summary="Person-level observation periods, events and exposures → the SCCS interval tables "
        "(outcomes, covariates, names) as artifacts, ready for sccs_fit: several exposures with their own risk "
        "windows, age and observation-time restrictions, age, season and calendar-time splines",
        example=KindExample(
            {
                "cases_dataset_id": "<cases dataset id>",
                "events_dataset_id": "<events dataset id>",
                "exposures_dataset_id": "<exposures dataset id>",
                "risk_window_start": 1,
                "start_anchor": "exposure_start",
                "risk_window_end": 30,
                "end_anchor": "exposure_start",
            },
            datasets=_example_person_tables,
        ),
        host_only=True,
        work=eras_work,
    ),
]
