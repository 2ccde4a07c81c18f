"""Shared test fixtures: the ``gpu`` marker skips without a usable CUDA device."""

from __future__ import annotations

import pytest

from kernels.backend import gpu_available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA device usable through CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
