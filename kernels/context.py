"""The run context a job's runner computes in, and the one wrap-up of every run.

A runner is ``run(params, ctx) -> <its result model>``: only maths. What is the same for every kind lives
here, made once by whoever runs the job (the worker, a test, a benchmark):

- ``ctx.xp``: the array namespace (NumPy or CuPy), chosen for the job before it starts;
- ``ctx.stage(name)``: a device-synchronised stage timer (``ctx.timer``);
- ``ctx.progress(fraction, stage)``: progress and the cancel point (it raises ``JobCancelled``, or the
  worker's stop signal, when the job must end);
- ``ctx.dataset(field)``: the uploaded table a params field names, loaded on first use;
- ``ctx.save_artifact(name, value)``: a large output kept beside the result;
- ``ctx.reuse(key, make)``: a value built once per job in this process (:class:`JobCache`).

:func:`run_kind` runs the kind on its validated params, checks the result type, reports "done", and stamps
the device and the stage timings on the result: no runner sets ``device`` or ``timings`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from kernels.backend import DeviceChoice, device_label, get_namespace, is_numpy
from kernels.progress import LocalProgress, Progress
from kernels.spec import JobParams, ResultModel
from kernels.timing import StageTimer

if TYPE_CHECKING:
    import pandas as pd

    from kernels.registry import JobKind

DatasetLoader = Callable[[str], "pd.DataFrame"]
T = TypeVar("T")


class MissingDatasetError(ValueError):
    """A runner asked for a dataset field the job did not set."""


class JobCache:
    """What one job's runs in this process share: a fanned-out job's chunk reads and builds its tables, and the finish,
    when the same worker claims it, would build them again, in the job's serial time. One job at a time: entering
    another job's run drops the values of the last (a worker owns its GPU, so no one else needs that memory
    meanwhile), and a worker drops them when the job ends. Values must be what a fresh build gives: the runner asks
    only for inputs it never changes."""

    def __init__(self) -> None:
        self._job_id: str | None = None
        self._values: dict[Hashable, Any] = {}

    def enter(self, job_id: str) -> JobCache:
        """This cache for a run of ``job_id``: kept if it was ``job_id``'s, emptied otherwise."""
        if job_id != self._job_id:
            self.clear()
            self._job_id = job_id
        return self

    def clear(self) -> None:
        self._job_id = None
        self._values.clear()

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        if key not in self._values:
            self._values[key] = make()  # nothing is kept when make raises
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)


class RunContext:
    """Everything a runner may use besides its params (see the module docstring)."""

    def __init__(
        self,
        xp: ModuleType,
        progress: Progress,
        load_dataset: DatasetLoader | None = None,
        dataset_fields: Iterable[str] = (),
        cache: JobCache | None = None,
    ) -> None:
        self.xp = xp
        self.timer = StageTimer(xp)
        self._progress = progress
        self._load_dataset = load_dataset
        self._dataset_fields = frozenset(dataset_fields)
        self._frames: dict[str, pd.DataFrame] = {}
        self._cache = cache

    @property
    def on_gpu(self) -> bool:
        return not is_numpy(self.xp)

    @property
    def device(self) -> str:
        return device_label(self.xp)

    def stage(self, name: str) -> AbstractContextManager[None]:
        """Time a stage (seconds after device synchronisation; a stage entered twice adds up)."""
        return self.timer.stage(name)

    def progress(self, fraction: float, stage: str | None = None) -> None:
        """Report progress in [0, 1]: also the cancel point (may raise to stop the job)."""
        self._progress(fraction, stage)

    def save_artifact(self, name: str, value: Any) -> None:
        """Keep a NumPy array, a dict of arrays, or a pandas DataFrame beside the result."""
        self._progress.save_artifact(name, value)

    def reuse(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, or the value it gave an earlier run of this job in this process (a fanned-out job's
        chunk, then its finish) when the worker keeps a :class:`JobCache`; ``key`` names the value within the
        job (with the namespace: a job's runs may be placed on different devices)."""
        if self._cache is None:
            return make()
        return self._cache.get_or_make((self.xp.__name__, key), make)

    def has_dataset(self, field: str) -> bool:
        return field in self._frames or field in self._dataset_fields

    def dataset(self, field: str) -> pd.DataFrame:
        """The table the params field ``field`` names (loaded once)."""
        if field not in self._frames:
            if self._load_dataset is None or field not in self._dataset_fields:
                raise MissingDatasetError(f"{field}: no dataset was given for this field")
            self._frames[field] = self._load_dataset(field)
        return self._frames[field]

    def optional_dataset(self, field: str) -> pd.DataFrame | None:
        return self.dataset(field) if self.has_dataset(field) else None


def local_context(
    device: DeviceChoice | None = None,
    datasets: Mapping[str, pd.DataFrame] | None = None,
    progress: Progress | None = None,
    xp: ModuleType | None = None,
    cache: JobCache | None = None,
) -> RunContext:
    """A context for tests, benchmarks and library use: in-memory datasets (params field -> DataFrame) and a
    :class:`LocalProgress` unless ``progress`` is given (pass your own to read its reports and artifacts);
    ``cache`` as a worker keeps one for a job's runs (none: every run builds its own inputs)."""
    frames = dict(datasets or {})
    namespace = xp if xp is not None else get_namespace(device)
    return RunContext(namespace, progress or LocalProgress(), frames.__getitem__, tuple(frames), cache=cache)


def namespace_for(kind: JobKind, device: DeviceChoice | None = None) -> ModuleType:
    """The namespace a job of ``kind`` runs on: NumPy for a host-only kind, else the device choice's."""
    return np if kind.host_only else get_namespace(device)


def run_kind(kind: JobKind, params: JobParams | Mapping[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Run one job of ``kind`` in ``ctx`` and return its result JSON (device and timings stamped). ``params``:
    the kind's params model, as the worker builds it once per run; a mapping (tests, benchmarks, library
    use) is validated here, once."""
    spec = params if isinstance(params, JobParams) else kind.params_model.model_validate(params)
    if not isinstance(spec, kind.params_model):
        raise TypeError(f"{kind.name}: params are a {type(spec).__name__}, not {kind.params_model.__name__}")
    result = kind.run(spec, ctx)
    if not isinstance(result, kind.result_model):
        raise TypeError(f"{kind.name}: the runner returned {type(result).__name__}, not {kind.result_model.__name__}")
    ctx.progress(1.0, "done")
    # Through JSON text: a NaN or an infinity (an undefined statistic) becomes null, so every stored result
    # is valid JSON (Postgres refuses NaN in a JSON column, and the result route sends the stored JSON as is).
    return json.loads(stamp(result, ctx).model_dump_json())


def stamp(result: ResultModel, ctx: RunContext) -> ResultModel:
    """The result with the context's device and stage timings (the only place that sets them)."""
    return result.model_copy(update={"device": ctx.device, "timings": ctx.timer.as_dict()})
