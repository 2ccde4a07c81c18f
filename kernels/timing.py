"""Per-stage wall-clock timings measured after device synchronisation."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from kernels.backend import synchronize


class StageTimer:
    """Accumulates seconds per named stage; a stage entered twice adds up."""

    def __init__(self, xp: ModuleType) -> None:
        self._xp = xp
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        synchronize(self._xp)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self._xp)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        result = dict(self.seconds)
        result["total"] = sum(self.seconds.values())
        return result
