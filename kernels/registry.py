"""Job kinds: name -> params model, result model, runner, dataset fields and a runnable example.

A new estimator is one folder in ``kernels/`` whose ``jobs`` module defines ``KINDS`` (a list of
:class:`JobKind`), plus one line in :data:`_KIND_MODULES` (see ``kernels/README.md``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from kernels.spec import JobParams, ResultModel

if TYPE_CHECKING:
    import pandas as pd

    from kernels.context import RunContext

Runner = Callable[[Any, "RunContext"], ResultModel]

_KIND_MODULES: tuple[str, ...] = (
    "kernels.crve.jobs",
    "kernels.dualcontrol.jobs",
    "kernels.sccs.jobs",
    "kernels.ks.jobs",
)


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
    """

    name: str
    params_model: type[JobParams]
    result_model: type[ResultModel]
    run: Runner
    example: KindExample
    dataset_fields: tuple[str, ...] = ()
    summary: str = ""
    host_only: bool = False

    def dataset_ids(self, params: JobParams) -> dict[str, str]:
        ids = {name: getattr(params, name, None) for name in self.dataset_fields}
        return {name: str(value) for name, value in ids.items() if value is not None}


@cache
def registry() -> dict[str, JobKind]:
    kinds: dict[str, JobKind] = {}
    for module_name in _KIND_MODULES:
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
