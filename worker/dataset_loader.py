"""The datasets a job (or a chunk) names, as the worker reads them: loaded when its runner first asks, and
their stored rows (what its work estimate counts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from core.settings import get_settings
from kernels.context import DatasetLoader
from store.datasets import get_dataset
from store.db import session_scope
from store.decoded import load_frame
from worker.infra import retry_infrastructure

if TYPE_CHECKING:
    import pandas as pd


def dataset_loader(dataset_ids: Mapping[str, str]) -> DatasetLoader:
    """Loads the dataset a params field names, when the runner first asks for it (``ctx.dataset(field)``)."""

    def dataset_file(dataset_id: str) -> str | None:
        with session_scope() as session:
            dataset = get_dataset(session, dataset_id)
            return None if dataset is None else dataset.path  # read while the session is open

    def load(field: str) -> pd.DataFrame:
        dataset_id = dataset_ids[field]
        path = retry_infrastructure(lambda: dataset_file(dataset_id), what="read a dataset",
                                    budget_seconds=get_settings().worker_retry_seconds)
        if path is None:
            raise ValueError(f"{field}: dataset {dataset_id} no longer exists")
        return load_frame(path)

    return load


def dataset_rows(dataset_ids: Mapping[str, str]) -> dict[str, int]:
    """The stored rows of the datasets a job names (params field -> rows; a dataset gone is left out)."""

    def read() -> dict[str, int]:
        with session_scope() as session:
            found = {field: get_dataset(session, dataset_id) for field, dataset_id in dataset_ids.items()}
            return {field: int(dataset.n_rows) for field, dataset in found.items() if dataset is not None}

    if not dataset_ids:
        return {}
    return retry_infrastructure(read, what="read a dataset", budget_seconds=get_settings().worker_retry_seconds)
