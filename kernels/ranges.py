"""Contiguous ranges of near-equal size (or near-equal weight): how a run's units (blocks, folds, replicates, draw
chunks, analyses) are cut into the chunks of a fan-out (worker/fanout.py), one rule for every kind."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def even_range(count: int, parts: int, index: int) -> range:
    """Part ``index`` of ``0 .. count - 1`` cut into ``parts`` contiguous ranges whose sizes differ by one at
    most, in order (a part is empty when there are fewer units than parts)."""
    size, extra = divmod(count, parts)
    start = index * size + min(index, extra)
    return range(start, start + size + (1 if index < extra else 0))


def even_ranges(count: int, parts: int) -> list[range]:
    """``0 .. count - 1`` in at most ``parts`` contiguous ranges whose sizes differ by one at most, in order
    (never more ranges than units, and one range, maybe empty, when there are none)."""
    parts = max(1, min(parts, count))
    return [even_range(count, parts, index) for index in range(parts)]


def weighted_range(weights: Sequence[float] | np.ndarray, parts: int, index: int) -> range:
    """Part ``index`` of the units ``0 .. len(weights) - 1`` cut into ``parts`` contiguous ranges of near-equal
    total weight (units of unequal work: an analysis's nonzeros), in order: part i holds the units whose
    cumulative weight, counted at the unit's middle, lies in [i, i + 1) / parts of the total. Parts may be empty
    (a unit heavier than a part's share, or fewer units than parts); equal weights give near-equal counts."""
    values = np.asarray(weights, dtype=np.float64)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0) or values.sum() <= 0:
        return even_range(int(values.size), parts, index)
    middle = (np.cumsum(values) - 0.5 * values) / values.sum()  # each unit's centre of weight in (0, 1)
    bounds = np.searchsorted(middle, np.arange(parts + 1) / parts, side="left")
    bounds[-1] = values.size
    return range(int(bounds[index]), int(bounds[index + 1]))
