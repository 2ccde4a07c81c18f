"""Backend choice and dispatch, progress channel, stage timer, run context and wrap-up, CUDA loader
conventions that hold without a GPU, RNG stream registry, and registry invariants."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kernels import backend, context, cuda, rng
from kernels.progress import JobCancelled, LocalProgress
from kernels.registry import JobKind, KindExample, registry
from kernels.spec import JobParams, ResultModel
from kernels.timing import StageTimer


def test_cpu_choice_gives_numpy_and_bad_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    assert backend.get_namespace() is np and backend.device_label(np) == "cpu"
    monkeypatch.setenv("GPUEST_DEVICE", "tpu")
    with pytest.raises(ValueError, match="GPUEST_DEVICE"):
        backend.get_namespace()


def test_demanding_a_missing_gpu_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    with pytest.raises(backend.GPUUnavailableError):
        backend.get_namespace()
    monkeypatch.setenv("GPUEST_DEVICE", "auto")
    assert backend.get_namespace() is np


def test_local_progress_records_and_cancels() -> None:
    progress = LocalProgress()
    progress(0.25, "first")
    progress.save_artifact("grid", np.arange(3))
    progress.cancel()
    with pytest.raises(JobCancelled):
        progress(0.5)
    with pytest.raises(ValueError):
        progress(1.5)
    assert progress.reports == [(0.25, "first"), (0.5, None)] and list(progress.artifacts) == ["grid"]


def test_stage_timer_accumulates_and_totals() -> None:
    timer = StageTimer(np)
    for _ in range(2):
        with timer.stage("a"):
            sum(range(10_000))
    with timer.stage("b"):
        pass
    timings = timer.as_dict()
    assert set(timings) == {"a", "b", "total"} and timings["total"] == pytest.approx(timings["a"] + timings["b"])


def test_every_registered_kind_is_strict_and_bounded() -> None:
    kinds = registry()
    assert "crve_montecarlo" in kinds
    for kind in kinds.values():
        assert issubclass(kind.params_model, JobParams)
        assert kind.params_model.model_config.get("extra") == "forbid"
        assert issubclass(kind.result_model, ResultModel) and kind.result_model is not ResultModel
        assert {"device", "timings"} <= set(kind.result_model.model_fields)
        kind.params_model.model_validate(dict(kind.example.params))
        for name in kind.dataset_fields:
            assert name in kind.params_model.model_fields, f"{kind.name}: dataset field {name} is not a param"


def _unbounded_integers(schema: dict, definitions: dict, path: str) -> list[str]:
    if "$ref" in schema:
        return _unbounded_integers(definitions[schema["$ref"].split("/")[-1]], definitions, path)
    found: list[str] = []
    if schema.get("type") == "integer":
        has_low = "minimum" in schema or "exclusiveMinimum" in schema
        has_high = "maximum" in schema or "exclusiveMaximum" in schema
        if not (has_low and has_high):
            found.append(path)
    for name, sub in schema.get("properties", {}).items():
        found += _unbounded_integers(sub, definitions, f"{path}.{name}")
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            found += _unbounded_integers(sub, definitions, path)
    return found  # list items are identifiers (covariate ids, states), not sizes


def test_every_integer_size_parameter_has_both_bounds() -> None:
    for kind in registry().values():
        schema = kind.params_model.model_json_schema()
        assert _unbounded_integers(schema, schema.get("$defs", {}), kind.name) == []


# -- dispatch ------------------------------------------------------------------------------------------

def test_numpy_arrays_and_scalars_live_in_numpy() -> None:
    assert backend.array_namespace(np.zeros(2), None, 3.0) is np and backend.array_namespace() is np
    assert backend.is_numpy(np) and backend.device_label(np) == "cpu"
    host = np.arange(3)
    assert backend.to_host(host) is host and backend.to_host([1, 2]).tolist() == [1, 2]
    import pandas as pd

    assert backend.to_host(pd.Series([4.0, 5.0])).tolist() == [4.0, 5.0]  # a Series' .get is not CuPy's


# -- run context and wrap-up ---------------------------------------------------------------------------

class _EchoParams(JobParams):
    value: float = 1.0


class _EchoResult(ResultModel):
    doubled: float
    rows: int | None = None


def _echo(params: _EchoParams, ctx: context.RunContext) -> _EchoResult:
    with ctx.stage("double"):
        doubled = float(ctx.xp.asarray(params.value) * 2)
    ctx.progress(0.5, "half")
    ctx.save_artifact("values", np.arange(3))
    table = ctx.optional_dataset("table_id")
    return _EchoResult(doubled=doubled, rows=None if table is None else len(table))


def _echo_kind(**overrides: object) -> JobKind:
    fields = {
        "name": "echo", "params_model": _EchoParams, "result_model": _EchoResult, "run": _echo,
        "example": KindExample({"value": 2.0}), "dataset_fields": ("table_id",),
    }
    return JobKind(**{**fields, **overrides})  # type: ignore[arg-type]


def test_run_kind_validates_runs_reports_done_and_stamps_device_and_timings() -> None:
    import pandas as pd

    progress = LocalProgress()
    ctx = context.local_context(device="cpu", datasets={"table_id": pd.DataFrame({"a": [1, 2]})}, progress=progress)
    result = context.run_kind(_echo_kind(), {"value": 2.5}, ctx)
    assert result["doubled"] == 5.0 and result["rows"] == 2 and result["device"] == "cpu"
    assert set(result["timings"]) == {"double", "total"} and result["timings"]["double"] >= 0
    assert progress.reports == [(0.5, "half"), (1.0, "done")] and list(progress.artifacts) == ["values"]
    with pytest.raises(ValidationError):
        context.run_kind(_echo_kind(), {"value": "two"}, context.local_context(device="cpu"))


def test_a_runner_returning_another_type_is_refused() -> None:
    def wrong(params: _EchoParams, ctx: context.RunContext) -> dict:
        return {"doubled": 1.0}

    with pytest.raises(TypeError, match="not _EchoResult"):
        context.run_kind(_echo_kind(run=wrong), {}, context.local_context(device="cpu"))


def test_a_dataset_the_job_did_not_give_is_a_clear_error() -> None:
    ctx = context.local_context(device="cpu")
    assert ctx.optional_dataset("table_id") is None and not ctx.has_dataset("table_id")
    with pytest.raises(context.MissingDatasetError, match="table_id: no dataset"):
        ctx.dataset("table_id")


def test_datasets_are_loaded_once_and_only_when_asked() -> None:
    import pandas as pd

    loads: list[str] = []

    def load(field: str) -> pd.DataFrame:
        loads.append(field)
        return pd.DataFrame({"a": [1]})

    ctx = context.RunContext(np, LocalProgress(), load, ("table_id", "other_id"))
    assert loads == []
    ctx.dataset("table_id")
    ctx.dataset("table_id")
    assert loads == ["table_id"]


def test_host_only_kinds_run_on_numpy_whatever_the_device_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "auto")
    assert context.namespace_for(_echo_kind(host_only=True), "gpu") is np
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    assert context.namespace_for(_echo_kind()) is np


def test_cancel_at_the_final_report_still_cancels() -> None:
    progress = LocalProgress()
    progress.cancel()

    def quiet(params: _EchoParams, ctx: context.RunContext) -> _EchoResult:
        return _EchoResult(doubled=0.0)

    with pytest.raises(JobCancelled):
        context.run_kind(_echo_kind(run=quiet), {}, context.local_context(device="cpu", progress=progress))


# -- CUDA loader conventions (no GPU needed) -------------------------------------------------------------

def test_every_kernel_file_is_declared_and_names_the_headers_it_uses() -> None:
    """Every .cu under kernels/ is declared through the loader (so it is warmed up and cached), includes
    nothing itself (the loader prepends headers, keeping the disk-cache key the whole text), and a source
    that calls the Philox functions or uses a stream define declares philox.cuh."""
    registry()  # imports every kernel module, so every source is declared
    declared = {source.path: source for source in cuda.declared_sources()}
    for path in cuda.KERNELS_DIR.rglob("*.cu"):
        assert path in declared, f"{path.relative_to(cuda.KERNELS_DIR)} is not declared with cuda.kernel_source"
        body = path.read_text()
        assert "#include" not in body, f"{path.name}: name headers in kernel_source(headers=...) instead"
        needs_rng = "gpuest_" in body or "GPUEST_STREAM_" in body
        assert needs_rng == declared[path].uses_rng(), f"{path.name}: philox.cuh declared iff used"
        assert declared[path].warm_up_defines, f"{path.name}: no warm-up variant: its first job would compile"


class _FakeCupy:
    """Stands in for CuPy's compile API only (no GPU here): counts compiles and function look-ups."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, ...]] = []
        self.lookups: list[str] = []
        self.device_id = 0
        fake = self

        class Device:
            @property
            def id(self) -> int:
                return fake.device_id

        class RawModule:
            def __init__(self, code: str, options: tuple[str, ...]) -> None:
                self.options = options

            def compile(self) -> None:
                fake.compiled.append(self.options)

            def get_function(self, name: str) -> tuple[str, tuple[str, ...]]:
                fake.lookups.append(name)
                return (name, self.options)

        self.RawModule = RawModule
        self.cuda = type("cuda", (), {"Device": Device})


def test_modules_compile_once_per_device_and_defines_and_functions_are_looked_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    cuda.clear_process_cache()
    source = cuda.kernel_source(__file__, "rng_draw.cu", headers=[cuda.PHILOX_HEADER])
    try:
        first = cuda.function(source, "draw", {"K": 3})
        assert cuda.function(source, "draw", {"K": 3}) is first
        assert cuda.module(source, {"K": 3}) is cuda.module(source, {"K": 3})
        assert cuda.function(source, "stream_numbers", {"K": 3})[0] == "stream_numbers"
        assert len(fake.compiled) == 1 and fake.lookups == ["draw", "stream_numbers"]
        assert "-DK=3" in fake.compiled[0] and fake.compiled[0][0] == cuda.CXX_STANDARD
        cuda.function(source, "draw", {"K": 4})
        fake.device_id = 1
        cuda.function(source, "draw", {"K": 3})
        assert len(fake.compiled) == 3, "another define set or another device compiles its own module"
    finally:
        cuda.clear_process_cache()


def test_a_source_declared_twice_differently_is_refused() -> None:
    cuda.kernel_source(__file__, "rng_draw.cu", headers=[cuda.PHILOX_HEADER])
    with pytest.raises(ValueError, match="declared twice"):
        cuda.kernel_source(__file__, "rng_draw.cu")


def test_a_failing_warm_up_hook_does_not_skip_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("no cuSPARSE")

    def fine() -> None:
        ran.append("fine")

    monkeypatch.setattr(cuda, "_WARM_UP_HOOKS", [broken, fine])
    monkeypatch.setattr(cuda, "_SOURCES", {})
    with pytest.raises(cuda.WarmUpError, match="broken: RuntimeError: no cuSPARSE"):
        cuda.warm_up()
    assert ran == ["broken", "fine"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_every_declared_variant_compiles_without_a_gpu(tmp_path: Path) -> None:
    """The loader's text and options, compiled to PTX by nvcc: a kernel that does not compile fails here,
    on a machine without a GPU, rather than at a worker's warm-up."""
    registry()
    failures = []
    for source in cuda.declared_sources():
        if not source.path.is_relative_to(cuda.KERNELS_DIR):
            continue  # sources declared by tests (compiled on the GPU by their own tests)
        code = tmp_path / source.path.name
        code.write_text(source.text())
        for defines in source.warm_up_defines or ((),):
            options = cuda.compile_options(source, dict(defines))
            done = subprocess.run(["nvcc", "--ptx", "-arch=sm_90", *options, str(code), "-o", os.devnull],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                failures.append(f"{source.name} {dict(defines)}: {done.stderr.strip()[:300]}")
    assert failures == []


def test_defines_are_written_so_the_device_reads_the_same_values() -> None:
    source = cuda.kernel_source(__file__, "rng_draw.cu", headers=[cuda.PHILOX_HEADER])
    options = cuda.compile_options(source, {"TOL": 0.1, "FLAG": True, "K": 7, "REAL": "double"})
    assert {"-DTOL=0.1", "-DFLAG=1", "-DK=7", "-DREAL=double"} <= set(options)
    assert cuda.real_define(np.float32) == {"REAL": "float"} and cuda.real_define("float64") == {"REAL": "double"}
    with pytest.raises(ValueError, match="float32 or float64"):
        cuda.real_define(np.int32)


def test_a_missing_source_or_header_is_refused_at_declaration() -> None:
    with pytest.raises(FileNotFoundError):
        cuda.kernel_source(cuda.__file__, "no_such_kernel.cu")
    with pytest.raises(FileNotFoundError):
        cuda.kernel_source(__file__, "rng_draw.cu", headers=["no_such_header.cuh"])


def test_only_the_loader_compiles() -> None:
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.glob("kernels/**/*.py"), *root.glob("bench/*.py"), *root.glob("worker/**/*.py")]:
        if path.name == "cuda.py" and path.parent.name == "kernels":
            continue
        text = path.read_text()
        for construct in ("RawModule(", "RawKernel(", "ElementwiseKernel(", "ReductionKernel(", "compile_with_cache"):
            if construct in text:
                offenders.append(f"{path.relative_to(root)}: {construct}")
    assert offenders == []


# -- RNG streams ---------------------------------------------------------------------------------------

def test_stream_numbers_are_fixed_and_reach_cuda_as_unsigned_literals() -> None:
    # The numbers are part of every stored job's draws: this table may only grow.
    fixed = {"CRVE_MC_X_CLUSTER": 1, "CRVE_WEIGHTS": 5, "CRVE_SYNTHETIC_FE": 15, "SCCS_CV_FOLDS": 0x5CC50001,
             "SCCS_BOOTSTRAP": 0x5CC50002, "SCCS_ERAS_CASE_HASH": 0x5CC50004, "KS_AGGREGATE": 1,
             "KS_TEST_IDIOSYNCRATIC": 12, "SCCS_SYNTHETIC_EVENT_ERA": 9}
    assert {name: rng.STREAMS[name] for name in fixed} == fixed
    defines = rng.cuda_defines()
    assert defines["GPUEST_STREAM_CRVE_WEIGHTS"] == "5ull" and len(defines) == len(rng.STREAMS)
    with pytest.raises(TypeError):
        rng.STREAMS["NEW"] = 99  # type: ignore[index]
