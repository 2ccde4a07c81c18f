"""The only place that compiles CUDA.

Convention (every estimator follows it; see ``kernels/README.md``):

- A kernel's source is a ``.cu`` file beside its NumPy twin (``kernels/sccs/ccd.cu`` next to ``ccd.py``);
  device functions shared by several files are ``.cuh`` headers under ``kernels/`` (``philox.cuh``, the
  Philox generator of :mod:`kernels.rng`). A source names its headers when it is declared, and the loader
  prepends their text: CuPy's on-disk cache keys on the whole text, so an edited header can never leave a
  stale binary behind (an ``#include`` would not be part of that key).
- Everything that varies is a define: the real type (``REAL``: ``double`` or ``float``, see
  :func:`real_define`), sizes (``-DK=4``, ``-DBLOCK=256``), and, for every source that includes
  ``philox.cuh``, the RNG streams registered in :data:`kernels.rng.STREAMS` (``GPUEST_STREAM_<NAME>``).
  No source is edited by string replacement.
- One C++ standard for all: :data:`CXX_STANDARD`.
- A compiled module is cached per (device, source, defines) for the life of the process, and its binary
  in CuPy's on-disk cache (``CUPY_CACHE_DIR``: the worker points it into its data directory with
  :func:`use_disk_cache`), so a restarted worker loads it instead of running NVRTC again.
- Each source declares the variants its jobs commonly use (``warm_up=[{...defines}, ...]``); the worker
  compiles them all at start (:func:`warm_up`), so a fresh worker's first job pays no compile.

CuPy is imported only when something is compiled: this module imports on a machine without a GPU.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernels import rng

CXX_STANDARD = "-std=c++17"
KERNELS_DIR = Path(__file__).resolve().parent
PHILOX_HEADER = "philox.cuh"

DefineValue = int | float | str | bool
Defines = Mapping[str, DefineValue]


@dataclass(frozen=True)
class KernelSource:
    """A ``.cu`` file and the ``.cuh`` headers (paths relative to ``kernels/``) it needs before it."""

    path: Path
    headers: tuple[str, ...] = ()
    warm_up_defines: tuple[tuple[tuple[str, str], ...], ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(KERNELS_DIR)) if self.path.is_relative_to(KERNELS_DIR) else self.path.name

    def text(self) -> str:
        parts = [(KERNELS_DIR / header).read_text() for header in self.headers]
        parts.append(self.path.read_text())
        return "\n".join(parts)

    def uses_rng(self) -> bool:
        return PHILOX_HEADER in self.headers


_SOURCES: dict[Path, KernelSource] = {}
_WARM_UP_HOOKS: list[Callable[[], None]] = []
_LOCK = threading.Lock()
ModuleKey = tuple[int, Path, tuple[tuple[str, str], ...]]  # (device id, source file, normalised defines)
_MODULES: dict[ModuleKey, Any] = {}
_FUNCTIONS: dict[tuple[ModuleKey, str], Any] = {}


def _define_text(value: DefineValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest string that round-trips: the device reads the same double
    return str(value)


def _normalise(defines: Defines | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, _define_text(value)) for name, value in (defines or {}).items()))


def real_define(dtype: Any) -> dict[str, str]:
    """``{"REAL": "double"}`` or ``{"REAL": "float"}`` for a float64 / float32 dtype."""
    kind = np.dtype(dtype)
    if kind == np.float64:
        return {"REAL": "double"}
    if kind == np.float32:
        return {"REAL": "float"}
    raise ValueError(f"CUDA kernels are compiled for float32 or float64, not {kind}")


def kernel_source(
    beside: str, file_name: str, headers: Iterable[str] = (), warm_up: Iterable[Defines] = ()
) -> KernelSource:
    """Declare the ``.cu`` file ``file_name`` in the folder of the module ``beside`` (pass ``__file__``).

    ``warm_up`` lists the define sets :func:`warm_up` compiles at worker start. Declaring the same file
    twice returns the first declaration (module re-imports in tests)."""
    path = (Path(beside).resolve().parent / file_name).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {file_name!r} not found beside {beside}")
    headers = tuple(headers)
    for header in headers:
        if not (KERNELS_DIR / header).is_file():
            raise FileNotFoundError(f"CUDA header {header!r} not found under kernels/")
    source = KernelSource(path, headers, tuple(_normalise(defines) for defines in warm_up))
    known = _SOURCES.setdefault(path, source)
    if (known.headers, known.warm_up_defines) != (source.headers, source.warm_up_defines):
        raise ValueError(f"CUDA source {known.name} declared twice with different headers or warm-up variants")
    return known


def declared_sources() -> tuple[KernelSource, ...]:
    return tuple(_SOURCES.values())


def compile_options(source: KernelSource, defines: Defines | None = None) -> tuple[str, ...]:
    merged = dict(_normalise(defines))
    if source.uses_rng():
        for name, value in rng.cuda_defines().items():
            merged.setdefault(name, value)
    return (CXX_STANDARD, *(f"-D{name}={value}" for name, value in sorted(merged.items())))


def _module_for(cupy: Any, key: ModuleKey, source: KernelSource, defines: Defines | None) -> Any:
    compiled = _MODULES.get(key)  # a plain dict read: the launch path takes no lock once compiled
    if compiled is None:
        with _LOCK:
            compiled = _MODULES.get(key)
            if compiled is None:
                compiled = cupy.RawModule(code=source.text(), options=compile_options(source, defines))
                compiled.compile()  # now, not at the first get_function: compile errors surface here
                _MODULES[key] = compiled
    return compiled


def module(source: KernelSource, defines: Defines | None = None) -> Any:
    """The compiled ``cupy.RawModule`` of ``source`` with ``defines`` on the current device (cached)."""
    import cupy  # only a GPU path calls this

    return _module_for(cupy, (cupy.cuda.Device().id, source.path, _normalise(defines)), source, defines)


def function(source: KernelSource, name: str, defines: Defines | None = None) -> Any:
    """One ``extern "C" __global__`` function of the compiled module, cached: CuPy's ``get_function`` makes a
    new kernel object and asks the driver again on every call, and kernels are launched in loops."""
    import cupy

    key = (cupy.cuda.Device().id, source.path, _normalise(defines))
    kernel = _FUNCTIONS.get((key, name))
    if kernel is None:
        kernel = _module_for(cupy, key, source, defines).get_function(name)
        _FUNCTIONS[(key, name)] = kernel  # a lost race stores an equal kernel: harmless
    return kernel


def on_warm_up(hook: Callable[[], None]) -> Callable[[], None]:
    """Register a device warm-up beyond compiling (e.g. creating a cuSPARSE handle, a CUDA-graph capture
    of a tiny problem): one-off costs a fresh worker should pay before its first job. Usable as a decorator."""
    if hook not in _WARM_UP_HOOKS:
        _WARM_UP_HOOKS.append(hook)
    return hook


def warm_up() -> int:
    """Compile every declared source's warm-up variants on the current device, then run the registered
    warm-up hooks; returns how many modules were compiled (or loaded from the disk cache).

    Kernel modules are imported first (by :func:`kernels.registry.registry`), so their declarations exist.
    """
    count = 0
    for source in declared_sources():
        for defines in source.warm_up_defines:
            module(source, dict(defines))
            count += 1
    failures = []
    for hook in _WARM_UP_HOOKS:
        try:
            hook()
        except Exception as exc:  # one failing hook must not skip the others: run them all, then say which
            failures.append(f"{getattr(hook, '__qualname__', hook)}: {type(exc).__name__}: {exc}")
    if failures:
        raise WarmUpError("; ".join(failures))
    return count


def compile_for_arch(arch: str) -> int:
    """Compile every declared source's warm-up variants with NVRTC to PTX for ``compute_<arch>`` (e.g. ``"90"``)
    without a device or a driver: proves at image build time that NVRTC and the headers it needs are there (a
    CUDA ``-runtime`` image lacks some, cupy#8466). NVRTC is called directly: CuPy's compiler front end asks the
    driver for versions, which a build host does not have. Returns how many variants compiled; raises with
    NVRTC's log on the first that does not."""
    from cupy_backends.cuda.libs import nvrtc  # only a GPU image calls this

    count = 0
    for source in declared_sources():
        for defines in source.warm_up_defines:
            program = nvrtc.createProgram(source.text(), source.name, [], [])
            try:
                nvrtc.compileProgram(program, [*compile_options(source, dict(defines)), f"-arch=compute_{arch}"])
            except Exception as error:
                log = nvrtc.getProgramLog(program).strip()
                raise RuntimeError(f"{source.name} {dict(defines)}: {log.splitlines()[0] if log else error}") from error
            finally:
                nvrtc.destroyProgram(program)
            count += 1
    return count


class WarmUpError(RuntimeError):
    """One or more warm-up hooks failed (after every hook was tried); jobs then pay those costs themselves."""


def use_disk_cache(directory: Path) -> None:
    """Keep CuPy's compiled binaries in ``directory`` (created if missing). Call before the first compile."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["CUPY_CACHE_DIR"] = str(directory.resolve())


def clear_process_cache() -> None:
    """Forget the compiled modules and functions of this process (tests of the cache use it)."""
    with _LOCK:
        _MODULES.clear()
        _FUNCTIONS.clear()
