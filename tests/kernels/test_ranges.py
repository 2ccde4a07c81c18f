"""How a fan-out cuts a run's units into parts (kernels/ranges.py): every unit in exactly one part, in order, parts
of near-equal size or near-equal weight."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels.ranges import even_range, even_ranges, weighted_range


def _cover(parts: list[range], count: int) -> None:
    assert parts[0].start == 0 and parts[-1].stop == count
    assert all(left.stop == right.start for left, right in itertools.pairwise(parts))


@pytest.mark.parametrize(("count", "parts"), [(0, 1), (0, 3), (1, 4), (7, 3), (10, 10), (1428, 8)])
def test_even_ranges_cover_the_units_in_order_with_sizes_one_apart(count: int, parts: int) -> None:
    pieces = [even_range(count, parts, index) for index in range(parts)]
    _cover(pieces, count)
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    assert even_ranges(count, parts) == pieces[: max(1, min(parts, count))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_weighted_ranges_cover_the_units_with_near_equal_weight(seed: int, parts: int) -> None:
    # Weights as uneven as a study's exposures: a few common ones, many rare ones, some zero.
    generator = np.random.default_rng(seed)
    weights = np.floor(generator.pareto(0.8, size=int(generator.integers(1, 400))) * 100)
    pieces = [weighted_range(weights, parts, index) for index in range(parts)]
    _cover(pieces, weights.size)
    share = weights.sum() / parts
    assert all(weights[piece.start:piece.stop].sum() <= share + weights.max() for piece in pieces)


def test_weighted_ranges_of_equal_or_no_weight_are_even_and_a_heavy_unit_stands_alone() -> None:
    assert [weighted_range(np.ones(1428), 2, index) for index in range(2)] == [range(0, 714), range(714, 1428)]
    assert [weighted_range(np.zeros(5), 2, index) for index in range(2)] == [even_range(5, 2, i) for i in range(2)]
    assert [weighted_range([], 3, index) for index in range(3)] == [range(0, 0)] * 3
    # The first unit holds 94 % of the weight (the paper-sized tables' first half of drugs by count held 94 % of
    # the analyses' work): it is a part alone, and the rest share the others.
    pieces = [weighted_range([94.0, 2.0, 2.0, 2.0], 2, index) for index in range(2)]
    assert pieces == [range(0, 1), range(1, 4)]
    assert [weighted_range([100.0, 1.0], 3, index) for index in range(3)] == [range(0, 0), range(0, 1), range(1, 2)]
