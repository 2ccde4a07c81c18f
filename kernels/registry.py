"""Job kinds: everything a kind declares about itself — name, params model, result model, runner, dataset
fields, a runnable example, its work measure, its fan-out split, its plots.

A new estimator is one folder in ``kernels/`` whose ``jobs`` module defines ``KINDS`` (a list of
:class:`JobKind`), plus one line in :data:`KIND_MODULES` (see ``kernels/README.md``). Modules outside the
product (a test's kind) are registered the same way with :func:`add_kind_modules`; the API and the worker
register those of ``GPUEST_EXTRA_KIND_MODULES`` at start.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from kernels.fanout import Split
from kernels.spec import JobParams, ResultModel

if TYPE_CHECKING:
    import pandas as pd

    from kernels.context import RunContext

Runner = Callable[[Any, "RunContext"], ResultModel]

# The product's kinds: one line per estimator's jobs module.
KIND_MODULES: tuple[str, ...] = (
    "kernels.crve.jobs",
    "kernels.dualcontrol.jobs",
    "kernels.sccs.jobs",
    "kernels.ks.jobs",
)
_extra_kind_modules: list[str] = []

DatasetRows = Mapping[str, int]  # params field -> the stored rows of the dataset it names


@dataclass(frozen=True)
class Work:
    """A job's work, the formula that gave it (for the message) and the params field to shrink first; its
    peak memory on NumPy in bytes, with its formula and the field that drives it."""

    units: float
    formula: str
    field: str
    bytes: float = 0.0
    bytes_formula: str = ""
    bytes_field: str = ""


# A kind's work measure: its job's size (what GPUEST_CPU_MAX_WORK and GPUEST_CPU_MAX_JOB_BYTES cap), from its
# validated params and its datasets' stored rows. ``units`` counts the element operations of every loop that
# costs time, each iterative loop at its iteration cap (the worst case the params allow: a cap admits no job
# that could run longer than it says); ``bytes`` estimates the largest arrays alive at once. Units differ
# between kinds, hence one work cap per kind.
WorkMeasure = Callable[[Any, DatasetRows], Work]


@dataclass(frozen=True)
class KindExample:
    """One small job of the kind that runs in seconds on NumPy: shown in the API's OpenAPI document and the
    CLI, and run on every backend by the cross-backend test.

    ``params`` may name dataset fields with placeholder ids; ``datasets`` then makes the tables those
    fields stand for (params field -> DataFrame), deterministically."""

    params: Mapping[str, Any]
    datasets: Callable[[], dict[str, pd.DataFrame]] | None = None

    def frames(self) -> dict[str, pd.DataFrame]:
        return self.datasets() if self.datasets is not None else {}


@dataclass(frozen=True)
class JobKind:
    """One job kind.

    ``run(params, ctx)`` gets the validated params and the :class:`~kernels.context.RunContext` and returns
    an instance of ``result_model`` (device and timings are stamped by :func:`kernels.context.run_kind`).
    ``dataset_fields`` are the params fields that hold dataset ids; ``host_only`` kinds always run on NumPy
    (their work is table manipulation a GPU would not speed up), and say ``"device": "cpu"``.

    ``work``: the kind's work measure (a kind without one is never capped); ``cpu_max_work``: the kind's cap on
    it for a job that runs on a CPU when the operator names none (``GPUEST_CPU_MAX_WORK``), None for no such
    default. ``split_module``: the module whose
    ``SPLIT`` (a :class:`~kernels.fanout.Split`) fans the kind's jobs out over several workers; empty for a
    kind that always runs whole. ``plots_module``: the module whose ``PLOTS`` lists the kind's plots
    (``plots/registry.py``); empty for none. Both are named, not imported: a split builds on the runner (it
    imports the kind's module), and plots need matplotlib, which no kernel imports.
    """

    name: str
    params_model: type[JobParams]
    result_model: type[ResultModel]
    run: Runner
    example: KindExample
    dataset_fields: tuple[str, ...] = ()
    summary: str = ""
    host_only: bool = False
    work: WorkMeasure | None = None
    cpu_max_work: float | None = None
    split_module: str = ""
    plots_module: str = ""

    def dataset_ids(self, params: JobParams) -> dict[str, str]:
        ids = {name: getattr(params, name, None) for name in self.dataset_fields}
        return {name: str(value) for name, value in ids.items() if value is not None}

    @property
    def split(self) -> Split | None:
        """The kind's fan-out split, None for a kind that always runs whole."""
        if not self.split_module:
            return None
        split = importlib.import_module(self.split_module).SPLIT
        if not isinstance(split, Split):
            raise TypeError(f"{self.split_module}.SPLIT of kind {self.name!r} is not a Split")
        return split


def add_kind_modules(*module_names: str) -> None:
    """Register the kinds of modules outside :data:`KIND_MODULES` (each defines ``KINDS``), as a test's kind
    is; a module already registered is left as it is."""
    new = [name for name in module_names if name not in KIND_MODULES and name not in _extra_kind_modules]
    if new:
        _extra_kind_modules.extend(new)
        registry.cache_clear()


def remove_kind_modules(*module_names: str) -> None:
    """Forget modules :func:`add_kind_modules` registered (a test's kind, after the test)."""
    _extra_kind_modules[:] = [name for name in _extra_kind_modules if name not in module_names]
    registry.cache_clear()


def kind_modules() -> tuple[str, ...]:
    """The modules whose ``KINDS`` make the registry: the product's, then those added."""
    return (*KIND_MODULES, *_extra_kind_modules)


@cache
def registry() -> dict[str, JobKind]:
    kinds: dict[str, JobKind] = {}
    for module_name in kind_modules():
        for kind in importlib.import_module(module_name).KINDS:
            if kind.name in kinds:
                raise RuntimeError(f"job kind {kind.name!r} registered twice")
            kinds[kind.name] = kind
    return kinds


def get_kind(name: str) -> JobKind:
    try:
        return registry()[name]
    except KeyError:
        raise KeyError(f"unknown job kind {name!r}; known kinds: {sorted(registry())}") from None


def result_models() -> tuple[type[ResultModel], ...]:
    """Every kind's result model (the result endpoint's schema is their union)."""
    return tuple(dict.fromkeys(kind.result_model for kind in registry().values()))


class _Splits(Mapping[str, Split]):
    """kind name -> its split, for the kinds that split, read from the registry at each look-up."""

    def __getitem__(self, name: str) -> Split:
        kind = registry().get(name)
        split = None if kind is None else kind.split
        if split is None:
            raise KeyError(name)
        return split

    def __iter__(self) -> Iterator[str]:
        return (name for name, kind in registry().items() if kind.split_module)

    def __len__(self) -> int:
        return sum(1 for _ in self)


SPLITS: Mapping[str, Split] = _Splits()
