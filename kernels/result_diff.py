"""Leaf-by-leaf comparison of two result JSONs: the check behind "the same result on NumPy and on the GPU"
(``tests/kernels/test_kinds_examples.py``) and "the same result before and after a change"
(``bench/results_snapshot.py``)."""

from __future__ import annotations

import math
from typing import Any

# Wall-clock seconds and the device name differ by nature; artifacts are names of files.
SKIPPED_KEYS = frozenset({"timings", "device", "artifacts", "seconds"})


def compare_leaves(left: Any, right: Any, path: str = "") -> list[tuple[float, str]]:
    """(relative difference, path) for every numeric leaf of two result JSONs; asserts equal structure and
    equal non-numeric leaves. Keys in ``SKIPPED_KEYS`` are not compared."""
    if isinstance(left, dict):
        assert isinstance(right, dict) and set(left) == set(right), f"{path}: keys differ"
        return [
            leaf
            for key in left
            if key not in SKIPPED_KEYS
            for leaf in compare_leaves(left[key], right[key], f"{path}.{key}")
        ]
    if isinstance(left, list):
        assert isinstance(right, list) and len(left) == len(right), f"{path}: lengths differ"
        return [leaf for i, (a, b) in enumerate(zip(left, right, strict=True)) for leaf in
                compare_leaves(a, b, f"{path}[{i}]")]
    if isinstance(left, float) or isinstance(right, float):
        assert isinstance(left, int | float) and isinstance(right, int | float), f"{path}: {left!r} vs {right!r}"
        if math.isnan(left) or math.isnan(right):
            assert math.isnan(left) and math.isnan(right), f"{path}: {left} vs {right}"
            return []
        return [(0.0 if left == right else abs(left - right) / max(abs(left), abs(right)), path)]
    assert left == right, f"{path}: {left!r} vs {right!r}"
    return []
