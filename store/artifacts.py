"""Files beside the database: uploaded datasets (Parquet) and job artifacts (.npy / .npz / .parquet)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from core.settings import get_settings
from kernels.backend import to_host

ARTIFACT_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def dataset_path(dataset_id: str) -> Path:
    return get_settings().datasets_dir / f"{dataset_id}.parquet"


def job_artifact_dir(job_id: str) -> Path:
    return get_settings().artifacts_dir / job_id


def atomic_target(final: Path) -> Path:
    """A new empty temporary file beside ``final`` (same filesystem): write it, then ``os.replace`` it onto
    ``final``, so a reader never sees a half-written file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    os.close(handle)
    return Path(name)


def save_artifact(job_id: str, name: str, value: Any) -> dict[str, Any]:
    """Write one artifact atomically; returns its reference ``{file, media_type, bytes}``.

    NumPy arrays become ``.npy``, dicts of arrays ``.npz``, pandas DataFrames ``.parquet``, other
    JSON-able values ``.json``.
    """
    if not name or set(name) - ARTIFACT_NAME_CHARS:
        raise ValueError(f"artifact name {name!r} must be letters, digits, '_', '-' or '.'")
    directory = job_artifact_dir(job_id)
    if hasattr(value, "to_parquet"):
        final, media_type = directory / f"{name}.parquet", "application/vnd.apache.parquet"
        temporary = atomic_target(final)
        value.to_parquet(temporary, index=False)
    elif isinstance(value, dict) and value and all(hasattr(v, "shape") for v in value.values()):
        final, media_type = directory / f"{name}.npz", "application/octet-stream"
        temporary = atomic_target(final)
        with temporary.open("wb") as handle:
            np.savez_compressed(handle, **{key: to_host(array) for key, array in value.items()})
    elif hasattr(value, "shape"):
        final, media_type = directory / f"{name}.npy", "application/octet-stream"
        temporary = atomic_target(final)
        with temporary.open("wb") as handle:
            np.save(handle, to_host(value))
    else:
        final, media_type = directory / f"{name}.json", "application/json"
        temporary = atomic_target(final)
        temporary.write_text(json.dumps(value))
    os.replace(temporary, final)
    return {"file": final.name, "media_type": media_type, "bytes": final.stat().st_size}


# -- outcomes computed but not yet stored ------------------------------------------------------------------
# A finished job's outcome (status, result, error, artifact references) is written here before the database
# update that records it, and removed once that update is committed. When the database stays unreachable
# past the worker's retries, the job is left running for the reaper; whichever worker claims it next finds
# its outcome here and stores it instead of computing it again.


def pending_outcome_path(job_id: str) -> Path:
    return get_settings().data_dir / "pending-outcomes" / f"{job_id}.json"


def save_pending_outcome(job_id: str, outcome: dict[str, Any]) -> Path:
    """Write the outcome atomically (a reader never sees half of it); returns its path."""
    final = pending_outcome_path(job_id)
    temporary = atomic_target(final)
    temporary.write_text(json.dumps(outcome))
    os.replace(temporary, final)
    return final


def load_pending_outcome(job_id: str) -> dict[str, Any] | None:
    """The outcome an earlier run of this job computed but could not store, or None."""
    try:
        text = pending_outcome_path(job_id).read_text()
    except FileNotFoundError:
        return None
    try:
        outcome = json.loads(text)
    except ValueError:  # not written by save_pending_outcome (which replaces atomically): run the job again
        return None
    return outcome if isinstance(outcome, dict) else None


def discard_pending_outcome(job_id: str) -> None:
    pending_outcome_path(job_id).unlink(missing_ok=True)


def delete_job_files(job_id: str) -> None:
    """A deleted job's artifacts directory and any kept outcome (nothing if there are none)."""
    import shutil

    shutil.rmtree(job_artifact_dir(job_id), ignore_errors=True)
    discard_pending_outcome(job_id)


# -- temporary files left by a killed process --------------------------------------------------------------


def remove_stale_parts(
    directories: Iterable[Path], older_than_seconds: float, now: float | None = None
) -> dict[Path, int]:
    """Remove the temporary files (``.*.part``, as :func:`atomic_target` and upload receiving make them) in
    ``directories`` whose last write is more than ``older_than_seconds`` ago; returns those removed, with their sizes.

    A process killed while writing one never removes it; one still being written is younger (its writer
    touches it as it goes) and is kept, so this is safe while other processes upload."""
    cutoff = (time.time() if now is None else now) - older_than_seconds
    removed: dict[Path, int] = {}
    for directory in directories:
        for path in directory.glob(".*.part"):
            try:
                status = path.stat()
                if path.is_file() and status.st_mtime < cutoff:
                    path.unlink()
                    removed[path] = status.st_size
            except FileNotFoundError:  # removed meanwhile by its own writer, or by another process's cleanup
                continue
    return removed
