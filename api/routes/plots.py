"""/v1/jobs/{id}/plots: the plots a succeeded job offers (by its kind and what it stored) and each one as SVG
or PNG, drawn from the stored result and artifacts (``plots/``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel

from api.deps import JobIdPath, OwnerDep, SessionDep
from api.plot_data import stored_job_data
from api.problems import ProblemError, field_error
from core.status import JobStatus
from plots.registry import (
    MEDIA_TYPES,
    JobData,
    PlotDataMissingError,
    PlotOptionError,
    PlotSpec,
    find_plot,
    plots_for,
    render,
)
from store import jobs as job_store
from store.db import storable_text
from store.models import Job

router = APIRouter(prefix="/v1/jobs", tags=["plots"])
log = structlog.get_logger("gpuest.api")

PlotNamePath = Annotated[str, PathParam(min_length=1, max_length=64, description="plot name (see the list)")]
PlotFormatQuery = Annotated[Literal["svg", "png"], Query(description="svg (default) or png")]


class PlotOptionOut(BaseModel):
    name: str
    description: str


class PlotOut(BaseModel):
    name: str
    title: str
    href: str
    formats: list[str]
    options: list[PlotOptionOut] = []  # numbers the plot's URL takes as query parameters (e.g. ?mu=0.5)


def owned_job(session: Any, job_id: str, owner: str) -> Job:
    """The owner's job, or the same 404 problem as /v1/jobs/{id} (another owner's job reads as missing)."""
    job = job_store.get_job(session, job_id, owner) if storable_text(job_id) else None
    if job is None:
        raise ProblemError(404, f"no job with id {job_id!r}", slug="job-not-found")
    return job


def job_data(job: Job) -> JobData:
    """What a plot may read of a succeeded job (409 problem otherwise, naming its status)."""
    if job.status != JobStatus.SUCCEEDED:
        raise ProblemError(
            409,
            f"job {job.id} is {job.status}; plots exist only once it has succeeded",
            slug="result-not-ready",
            extensions={"job_status": job.status},
        )
    return stored_job_data(job.id, job.kind, job.result, job.artifacts)


def plot_not_found(job: Job, name: str) -> ProblemError:
    return ProblemError(
        404, f"job {job.id} has no plot named {name!r} (GET /v1/jobs/{job.id}/plots lists them)", slug="plot-not-found"
    )


def option_problem(option: str, message: str) -> ProblemError:
    return ProblemError(422, message, slug="invalid-plot-option",
                        errors=[field_error(option, message, type_="plot_option", location="query")])


def chosen_options(spec: PlotSpec, query: Mapping[str, str]) -> dict[str, float]:
    """The plot's options among the query parameters (every parameter but ``format``), as finite numbers."""
    known = {option.name for option in spec.options}
    chosen = {}
    for name, text in query.items():
        if name == "format":
            continue
        if name not in known:
            offered = ", ".join(sorted(known)) or "none"
            raise option_problem(name, f"plot {spec.name!r} has no option {name!r} (its options: {offered})")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise option_problem(name, f"{name} must be a finite number, not {text[:40]!r}")
        chosen[name] = value
    return chosen


def plot_bytes(job: Job, name: str, fmt: str, query: Mapping[str, str]) -> bytes:
    """The rendered plot, or the 404 problem when this job has no such plot (or lacks what it needs), the 422
    problem naming an option the plot does not take or cannot draw, or the 422 plot-unavailable problem when
    drawing fails."""
    data = job_data(job)
    spec = find_plot(data, name)
    if spec is None:
        raise plot_not_found(job, name)
    options = chosen_options(spec, query)  # its own 422 problems, outside the drawing's catch-all below
    try:
        return render(spec, data, fmt, options)  # type: ignore[arg-type]
    except PlotDataMissingError:
        raise plot_not_found(job, name) from None
    except PlotOptionError as error:
        raise option_problem(error.option, str(error)) from None
    except Exception:
        # Stored data a plot cannot draw is this job's plot failing, not the service: a problem the page shows
        # as "plot unavailable", with the cause in the log only.
        log.exception("plot could not be drawn", job_id=job.id, plot=name, format=fmt)
        raise ProblemError(
            422, f"plot {name!r} of job {job.id} could not be drawn from its stored result", slug="plot-unavailable"
        ) from None


PLOT_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such job for this API key, or no such plot for this job"},
    409: {"description": "The job has not succeeded (yet)"},
    422: {"description": "An option the plot does not take, a value it cannot draw, or a plot this job's stored "
          "result cannot draw (plot-unavailable)"},
}


@router.get("/{job_id}/plots", response_model=list[PlotOut], responses=PLOT_RESPONSES, summary="List a job's plots")
def list_plots(job_id: JobIdPath, owner: OwnerDep, session: SessionDep) -> list[PlotOut]:
    """The plots this job's kind offers that its stored result and artifacts can draw."""
    job = owned_job(session, job_id, owner)
    return [
        PlotOut(name=spec.name, title=spec.title, href=f"/v1/jobs/{job.id}/plots/{spec.name}", formats=["svg", "png"],
                options=[PlotOptionOut(name=option.name, description=option.description) for option in spec.options])
        for spec in plots_for(job_data(job))
    ]


@router.get(
    "/{job_id}/plots/{name}",
    response_class=Response,
    responses={**PLOT_RESPONSES, 200: {"content": {"image/svg+xml": {}, "image/png": {}}}},
    summary="Get one plot as SVG or PNG",
)
def get_plot(
    request: Request, job_id: JobIdPath, name: PlotNamePath, owner: OwnerDep, session: SessionDep,
    format: PlotFormatQuery = "svg",
) -> Response:
    """Drawn with matplotlib from the job's stored result and artifacts (never by running the job again). A plot
    with options (the list says which) takes each as a query parameter, e.g. ``?mu=0.5&sigma=0.2``."""
    job = owned_job(session, job_id, owner)
    return Response(
        plot_bytes(job, name, format, request.query_params),
        media_type=MEDIA_TYPES[format],
        headers={"Cache-Control": "private, max-age=3600"},
    )
