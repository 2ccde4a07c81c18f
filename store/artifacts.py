"""Files beside the database: uploaded datasets (Parquet) and job artifacts (.npy / .npz / .parquet)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from store.settings import get_settings

ARTIFACT_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def dataset_path(dataset_id: str) -> Path:
    return get_settings().datasets_dir / f"{dataset_id}.parquet"


def job_artifact_dir(job_id: str) -> Path:
    return get_settings().artifacts_dir / job_id


def _atomic_target(final: Path) -> Path:
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
        temporary = _atomic_target(final)
        value.to_parquet(temporary, index=False)
    elif isinstance(value, dict) and value and all(hasattr(v, "shape") for v in value.values()):
        final, media_type = directory / f"{name}.npz", "application/octet-stream"
        temporary = _atomic_target(final)
        with temporary.open("wb") as handle:
            np.savez_compressed(handle, **{key: _host(array) for key, array in value.items()})
    elif hasattr(value, "shape"):
        final, media_type = directory / f"{name}.npy", "application/octet-stream"
        temporary = _atomic_target(final)
        with temporary.open("wb") as handle:
            np.save(handle, _host(value))
    else:
        final, media_type = directory / f"{name}.json", "application/json"
        temporary = _atomic_target(final)
        temporary.write_text(json.dumps(value))
    os.replace(temporary, final)
    return {"file": final.name, "media_type": media_type, "bytes": final.stat().st_size}


def _host(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)
    return get() if callable(get) else np.asarray(array)
