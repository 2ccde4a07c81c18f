"""The plots each job kind offers, and their rendering to SVG or PNG.

A plot reads only what a finished job stored: its result JSON and its artifacts (``JobData``). A kind names the
module that lists its plots (``JobKind.plots_module``, whose ``PLOTS`` holds :class:`PlotSpec` s naming the kinds
each draws for); :func:`plots_for` answers which of them a given job can draw (a Monte Carlo
without a CV curve has no CV plot), :func:`render` draws one. Drawing uses matplotlib's object API on its own
``Figure`` (no pyplot state), so concurrent requests in the API's thread pool never share a figure.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: no display on a server

from matplotlib import rc_context
from matplotlib.figure import Figure

from kernels.registry import registry

PlotFormat = Literal["svg", "png"]
MEDIA_TYPES: dict[str, str] = {"svg": "image/svg+xml", "png": "image/png"}

# Text stays text in SVG (searchable, selectable, and what the browser tests read); a fixed hash salt keeps the
# element ids, and so the file, the same from one rendering to the next. Labels come from user text (covariate,
# parameter and column names, hypotheses): with math parsing off, a "$" in them is drawn as typed, never read as
# mathtext (which fails on an unknown command such as "$\foo$"), for every text of every plot.
_STYLE = {
    "text.parse_math": False,
    "text.usetex": False,
    "svg.fonttype": "none",
    "svg.hashsalt": "gpuest",
    "font.size": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
PNG_DPI = 110


class PlotDataMissingError(LookupError):
    """The job lacks an artifact or result field the plot needs (e.g. a job stored before it was saved)."""


class PlotOptionError(ValueError):
    """A plot option's value this job cannot draw (e.g. a state outside its grid); ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class PlotOption:
    """A number a user may choose for a plot (a query parameter of the plot's URL, ``--option`` in the CLI)."""

    name: str
    description: str


@dataclass(frozen=True)
class JobData:
    """What a plot may read: the job's kind, its result JSON and its artifacts (by name, loaded on demand)."""

    kind: str
    result: Mapping[str, Any]
    artifact_names: frozenset[str]
    load_artifact: Callable[[str], Any]

    def artifact(self, name: str) -> Any:
        if name not in self.artifact_names:
            raise PlotDataMissingError(f"this job has no {name!r} artifact")
        return self.load_artifact(name)


@dataclass(frozen=True)
class PlotSpec:
    """One plot: ``draw(figure, data, **chosen)`` fills the figure, ``chosen`` holding a value for some of its
    ``options``; ``available(data)`` says whether this job has what it needs (default: every artifact in
    ``artifacts``)."""

    name: str
    title: str
    kinds: tuple[str, ...]
    draw: Callable[..., None]
    artifacts: tuple[str, ...] = ()
    needs: Callable[[JobData], bool] | None = None
    size: tuple[float, float] = (7.0, 4.2)
    options: tuple[PlotOption, ...] = ()

    def available(self, data: JobData) -> bool:
        if not set(self.artifacts) <= data.artifact_names:
            return False
        return self.needs is None or self.needs(data)


def all_plots() -> dict[str, tuple[PlotSpec, ...]]:
    """kind -> its plots (those of its plots module that name it), in the order the module lists them; a kind
    without plots is left out."""
    by_kind: dict[str, tuple[PlotSpec, ...]] = {}
    for kind in registry().values():
        if kind.plots_module:
            specs = tuple(spec for spec in importlib.import_module(kind.plots_module).PLOTS if kind.name in spec.kinds)
            if specs:
                by_kind[kind.name] = specs
    return by_kind


def plots_for(data: JobData) -> list[PlotSpec]:
    """The plots this job can draw."""
    return [spec for spec in all_plots().get(data.kind, ()) if spec.available(data)]


def find_plot(data: JobData, name: str) -> PlotSpec | None:
    return next((spec for spec in plots_for(data) if spec.name == name), None)


def render(spec: PlotSpec, data: JobData, fmt: PlotFormat, chosen: Mapping[str, float] | None = None) -> bytes:
    """The plot as an SVG document or a PNG image; ``chosen``: values of some of the spec's options (names
    checked here)."""
    chosen = dict(chosen or {})
    known = {option.name for option in spec.options}
    for name in chosen:
        if name not in known:
            offered = ", ".join(sorted(known)) or "none"
            raise PlotOptionError(name, f"plot {spec.name!r} has no option {name!r} (its options: {offered})")
    with rc_context(_STYLE):
        figure = Figure(figsize=spec.size, layout="constrained")
        spec.draw(figure, data, **chosen)
        buffer = io.BytesIO()
        metadata = {"Date": None} if fmt == "svg" else {}  # no timestamp: the same job gives the same file
        figure.savefig(buffer, format=fmt, dpi=PNG_DPI, metadata=metadata)
    return buffer.getvalue()
