"""A stored job as the plots see it: its result JSON and its artifacts read back from the job's folder
(``store.artifacts``), each file proven to lie inside that folder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from plots.registry import JobData, PlotDataMissingError
from store.artifacts import ARTIFACT_NAME_CHARS, job_artifact_dir


def _safe(name: str) -> bool:
    return bool(name) and not set(name) - ARTIFACT_NAME_CHARS and not name.startswith(".")


def load_artifact(job_id: str, references: Mapping[str, Any], name: str) -> Any:
    """Artifact ``name``: .npy an array, .npz a dict of arrays, .parquet a DataFrame."""
    reference = references.get(name) if _safe(name) else None
    file_name = str(reference.get("file", "")) if isinstance(reference, dict) else ""
    directory = job_artifact_dir(job_id).resolve()
    path = (directory / file_name).resolve()
    if not _safe(file_name) or not path.is_relative_to(directory) or not path.is_file():
        raise PlotDataMissingError(f"artifact {name!r} is not stored")
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    raise PlotDataMissingError(f"artifact {name!r} is not an array")


def stored_job_data(
    job_id: str, kind: str, result: Mapping[str, Any] | None, artifacts: Mapping[str, Any] | None
) -> JobData:
    references = dict(artifacts or {})
    return JobData(
        kind=kind,
        result=dict(result or {}),
        artifact_names=frozenset(references),
        load_artifact=lambda name: load_artifact(job_id, references, name),
    )
