"""Contiguous ranges of near-equal size: how a run's units (blocks, folds, replicates, draw chunks) are cut
into the chunks of a fan-out (worker/fanout.py), one rule for every kind."""

from __future__ import annotations


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
