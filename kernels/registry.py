"""Job kinds: name -> parameter model, runner and the parameter fields that hold dataset ids.

A new estimator is one folder in ``kernels/`` whose ``jobs`` module defines ``KINDS`` (a list of
:class:`JobKind`), plus one line in :data:`_KIND_MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kernels.progress import Progress
from kernels.spec import JobParams

Runner = Callable[[Any, Mapping[str, Any], Progress], dict[str, Any]]

_KIND_MODULES: tuple[str, ...] = (
    "kernels.crve.jobs",
    "kernels.dualcontrol.jobs",
    "kernels.sccs.jobs",
    "kernels.ks.jobs",
)


@dataclass(frozen=True)
class JobKind:
    """One job kind.

    ``run(params, data, progress)`` gets the validated params, ``data`` mapping each name in
    ``dataset_fields`` that the params set to a ``pandas.DataFrame`` of that dataset, and the
    progress channel; it returns the JSON-serialisable result (per-stage seconds under ``"timings"``,
    the device under ``"device"``).
    """

    name: str
    params_model: type[JobParams]
    run: Runner
    dataset_fields: tuple[str, ...] = ()
    summary: str = ""
    example: Mapping[str, Any] = field(default_factory=dict)

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
