"""The Philox4x32-10 generator against Random123's published known-answer vectors, and its transforms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kernels import rng


@pytest.mark.parametrize(
    ("key", "counter", "expected"),
    [
        # Random123 kat_vectors: philox4x32_10, counter (c0..c3), key (k0, k1) -> output words.
        ((0, 0), (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0xA4093822, 0x299F31D0),
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_matches_random123_known_answers(
    key: tuple[int, int], counter: tuple[int, int, int, int], expected: tuple[int, int, int, int]
) -> None:
    seed = key[0] | (key[1] << 32)
    stream = counter[2] | (counter[3] << 32)
    index = np.array([counter[0] | (counter[1] << 32)], dtype=np.uint64)
    words = rng.philox4x32(np, seed, stream, index)
    assert tuple(int(word[0]) for word in words) == expected


def test_draws_depend_only_on_seed_stream_and_index() -> None:
    whole = rng.normal(np, 42, 3, np.arange(10_000))
    pieces = np.concatenate(
        [rng.normal(np, 42, 3, np.arange(start, start + 2_500)) for start in range(0, 10_000, 2_500)]
    )
    assert np.array_equal(whole, pieces)
    assert not np.array_equal(whole, rng.normal(np, 42, 4, np.arange(10_000)))
    assert not np.array_equal(whole, rng.normal(np, 43, 3, np.arange(10_000)))


def test_transforms_have_the_right_distributions() -> None:
    index = np.arange(200_000)
    uniforms = rng.uniform(np, 7, 0, index)
    assert uniforms.min() > 0.0 and uniforms.max() < 1.0
    assert stats.kstest(uniforms, "uniform").pvalue > 1e-4
    assert stats.kstest(rng.normal(np, 7, 1, index), "norm").pvalue > 1e-4
    signs = rng.rademacher(np, 7, 2, index)
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(signs.mean()) < 5 * 200_000**-0.5
    draws = rng.integers(np, 7, 3, index, 6)
    counts = np.bincount(draws, minlength=6)
    assert draws.min() == 0 and draws.max() == 5
    assert stats.chisquare(counts).pvalue > 1e-4
