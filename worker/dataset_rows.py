"""The stored rows of a job's datasets (params field -> rows), for what a kind computes from them before it
runs: its work measure (the CPU cap) and its fan-out planner."""

from __future__ import annotations

from collections.abc import Mapping

from core.settings import get_settings
from store.datasets import get_dataset
from store.db import session_scope
from worker.infra import retry_infrastructure


def dataset_rows(dataset_ids: Mapping[str, str]) -> dict[str, int]:
    """params field -> the stored rows of the dataset it names; a dataset gone is left out. Retried while the
    database is out of reach (raises :class:`~worker.infra.InfrastructureUnavailable` after the worker's
    budget)."""
    if not dataset_ids:
        return {}

    def read() -> dict[str, int]:
        with session_scope() as session:
            found = {field: get_dataset(session, dataset_id) for field, dataset_id in dataset_ids.items()}
            return {field: int(dataset.n_rows) for field, dataset in found.items() if dataset is not None}

    return retry_infrastructure(read, what="read a dataset", budget_seconds=get_settings().worker_retry_seconds)
