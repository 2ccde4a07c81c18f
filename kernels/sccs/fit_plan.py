"""The fits of an ``sccs_fit`` job: its inputs (the tables built on the job's device, the names, the prior),
the plan that makes their batch fitters and reports their progress, and the three kinds of fit: the
cross-validation of the prior variance, the final MAP fit and the case bootstrap."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kernels.backend import is_numpy
from kernels.context import RunContext
from kernels.sccs import bootstrap as boot
from kernels.sccs import ccd, gpu, precondition, transfer
from kernels.sccs import cv as crossval
from kernels.sccs.data import BuiltData, SccsData, build_from_tables
from kernels.sccs.model import Prior
from kernels.sccs.outcomes import select_outcome
from kernels.sccs.spec import BootstrapSpec, CrossValidationSpec, SccsParams
from kernels.sccs.tables import covariate_names, table_columns

# Share of the GPU's free memory a bootstrap batch may take.
_GPU_MEMORY_SHARE = 0.6
# Bootstrap refits per batch on NumPy (one after another there; the batch only sets the progress steps).
_NUMPY_BOOTSTRAP_CHUNK = 10


def _prior(params: SccsParams, covariate_ids: np.ndarray) -> Prior:
    excluded = np.asarray(params.prior.exclude, dtype=np.int64)
    unknown = np.setdiff1d(excluded, covariate_ids)
    if unknown.size:
        raise ValueError(f"prior.exclude names covariateIds absent from the covariates table: {unknown[:10].tolist()}")
    penalised = ~np.isin(covariate_ids, excluded)
    return Prior(params.prior.type, params.prior.variance, penalised)


@dataclass(frozen=True)
class FitInputs:
    """What an ``sccs_fit`` job fits: the tables built on its device, the covariates' names and the prior."""

    built: BuiltData
    names: list[str | None]
    prior: Prior

    @property
    def data(self) -> SccsData:
        return self.built.data


def load_inputs(params: SccsParams, ctx: RunContext) -> FitInputs:
    """The tables' columns read (host), copied to the job's device, sorted, indexed and checked there; the names
    and the prior."""
    built, names = _load_tables(ctx, params.outcome_id)
    return FitInputs(built, names, _prior(params, built.data.covariate_ids))


def _load_tables(ctx: RunContext, outcome_id: int | None) -> tuple[BuiltData, list[str | None]]:
    """The interval tables (of ``outcome_id`` when they stack several outcomes) built on the job's device, and
    the covariates' names (None without a names table). Built once per job and worker process: a fanned-out
    job's finish reuses what its chunk built on the same worker (no fit changes them)."""
    return ctx.reuse(("sccs tables", outcome_id), lambda: _build_tables(ctx, outcome_id))


def _build_tables(ctx: RunContext, outcome_id: int | None) -> tuple[BuiltData, list[str | None]]:
    with ctx.stage("tables"):
        outcomes, covariates = select_outcome(ctx.dataset("outcomes_dataset_id"),
                                              ctx.dataset("covariates_dataset_id"), outcome_id)
        columns = table_columns(outcomes, covariates)
    if not is_numpy(ctx.xp):
        with ctx.stage("to_device"):
            columns = {name: transfer.to_device(ctx.xp, values) for name, values in columns.items()}
    with ctx.stage("build"):
        built = build_from_tables(**columns, xp=ctx.xp)
    return built, covariate_names(ctx.optional_dataset("names_dataset_id"), built.data.covariate_ids)


class FitPlan:
    """The job's fits in order (CV, final, bootstrap): their batch fitters and per-cycle progress (also what a
    fanned-out job's chunks fit with: ``kernels/sccs/chunks.py``)."""

    def __init__(self, params: SccsParams, ctx: RunContext, inputs: FitInputs) -> None:
        self.ctx, self.data, self.prior = ctx, inputs.data, inputs.prior
        self.options = ccd.FitOptions.from_params(params)
        self.whiten_splines = params.precondition == "splines"
        cv_spec, boot_spec = params.cross_validation, params.bootstrap
        if cv_spec is not None and cv_spec.folds > self.data.n_cases:
            raise ValueError(f"cross_validation.folds={cv_spec.folds} exceeds the {self.data.n_cases} cases with "
                             "events")
        self.cv_fits = cv_spec.folds * len(cv_spec.variances()) if cv_spec else 0
        self.total_fits = self.cv_fits + 1 + (boot_spec.replicates if boot_spec else 0)

    @classmethod
    def load(cls, params: SccsParams, ctx: RunContext) -> FitPlan:
        """The plan of ``params`` on the tables of ``ctx`` (read, built on its device and checked)."""
        return cls(params, ctx, load_inputs(params, ctx))

    def reporter(self, stage: str, before: int) -> ccd.CycleCallback:
        """Progress after every CCD cycle of every batch (the cancel point: progress may raise)."""

        def report(finished: int, cycle: int) -> None:
            done = before + finished
            self.ctx.progress(min(done / self.total_fits, 0.99),
                              f"{stage}: {done}/{self.total_fits} fits done, cycle {cycle}")

        return report

    @functools.cached_property
    def coordinates(self) -> precondition.FitCoordinates | None:
        """The whitened coordinates the fits run in (``precondition: splines`` and a dense unpenalised block in
        the data), made on first use (timed as "precondition"): a fanned-out job's finish that fits nothing
        makes none."""
        if not self.whiten_splines:
            return None
        with self.ctx.stage("precondition"):
            return precondition.fit_coordinates(self.data, self.prior)

    @property
    def fit_data(self) -> SccsData:
        """The data the fits run on (the whitened columns with ``precondition: splines``)."""
        return self.data if self.coordinates is None else self.coordinates.data

    def fitter(self, capacity: int) -> ccd.BatchFitter:
        """A batch fitter: NumPy fits one by one, or a GPU engine of ``capacity`` replicates (timed as "engine":
        buffers and the CUDA-graph capture, once per batch size). With ``precondition: splines`` it fits in the
        whitened coordinates and takes and gives coefficients in the original ones."""
        coordinates, data = self.coordinates, self.fit_data
        if is_numpy(self.ctx.xp):
            fitter = ccd.numpy_batch_fitter(data, self.prior, self.options)
        else:
            with self.ctx.stage("engine"):
                fitter = gpu.batch_fitter(data, self.prior, self.options, capacity)
        return fitter if coordinates is None else coordinates.fitter(fitter)

    def bootstrap_chunk(self, replicates: int) -> int:
        if is_numpy(self.ctx.xp):
            return _NUMPY_BOOTSTRAP_CHUNK
        data = self.fit_data  # first: whitened data (made now if not yet) takes device memory
        # Free device memory: the driver's, and the blocks CuPy's pool holds free (the table build leaves some).
        free_bytes = self.ctx.xp.cuda.Device().mem_info[0] + self.ctx.xp.get_default_memory_pool().free_bytes()
        return gpu.capacity_for(data, self.options.precision, replicates, int(free_bytes * _GPU_MEMORY_SHARE))


def fit_cross_validation(plan: FitPlan, spec: CrossValidationSpec,
                         computed: crossval.CvResult | None = None) -> crossval.CvResult:
    result = computed
    if result is None:
        fitter = plan.fitter(spec.folds)
        with plan.ctx.stage("cross_validation"):
            result = crossval.cross_validate(plan.data, fitter, spec.variances(), spec.folds, spec.seed,
                                             plan.reporter("cross-validation", 0))
    plan.ctx.save_artifact("cv_predictive_log_likelihood", {
        "variance": result.variances, "fold_log_likelihood": result.fold_loglik,
        "iterations": result.iterations, "converged": result.converged,
        "gradient_norm": result.gradient_norm, "coefficients": result.coefficients,
        "covariate_id": plan.data.covariate_ids,
    })
    return result


def final_fit(plan: FitPlan, variance: float) -> ccd.FitResult:
    """The MAP fit of every case at ``variance`` (from 0, alone in its batch)."""
    fitter = plan.fitter(1)
    with plan.ctx.stage("fit"):
        data = plan.data
        return fitter(np.asarray([variance]), np.ones((1, data.n_cases)), np.zeros((1, data.n_covariates)),
                      plan.reporter("fit", plan.cv_fits))[0]


def fit_bootstrap(plan: FitPlan, spec: BootstrapSpec, variance: float, beta_hat: np.ndarray,
                  computed: boot.BootstrapResult | None = None) -> boot.BootstrapResult:
    result = computed
    if result is None:
        chunk = plan.bootstrap_chunk(spec.replicates)
        fitter = plan.fitter(chunk)
        with plan.ctx.stage("bootstrap"):
            result = boot.bootstrap(plan.ctx.xp, plan.data.n_cases, fitter, variance, beta_hat, spec.replicates,
                                    spec.seed, chunk, plan.reporter("bootstrap", plan.cv_fits + 1))
    plan.ctx.save_artifact("bootstrap_estimates", {
        "covariate_id": plan.data.covariate_ids, "estimates": result.estimates,
        "iterations": result.iterations, "converged": result.converged,
        "gradient_norm": result.gradient_norm,
    })
    return result
