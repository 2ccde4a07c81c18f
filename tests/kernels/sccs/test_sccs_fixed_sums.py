"""The fixed-order sums of the SCCS GPU path (``kernels/sccs/fixed_sums.py``, ``fixed_sums.cu`` and the sums of
``ccd.cu``): every sum is made twice on adversarial input (many blocks, terms of mixed magnitude and sign, so
that the order of the additions shows in the last bits) and must give the same bytes; it must equal NumPy's sum to
1e-12 relative; and the kernels that only add (no products, so no fused multiply-adds) must equal, bit for bit, a
NumPy emulation of their thread and block arithmetic. The CPU tests check that arithmetic itself: each term is
added exactly once, in the order the emulation says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels.backend import to_host
from kernels.sccs import ccd, fixed_sums, model, synthetic
from kernels.sccs.data import SccsData, from_coo
from kernels.sccs.model import Prior

BLOCK = fixed_sums.BLOCK


def mixed_magnitude(generator: np.random.Generator, size: int, signed: bool = True) -> np.ndarray:
    """Terms between 1e-8 and 1e8 (log-uniform), random signs: sums whose bits depend on the order."""
    values = 10.0 ** generator.uniform(-8.0, 8.0, size)
    return values * generator.choice([-1.0, 1.0], size) if signed else values


def design(seed: int, n_cases: int, n_drugs: int, min_eras: int = 3, max_eras: int = 30) -> SccsData:
    """Synthetic data with real covariate values of mixed magnitude (not 0/1: products round)."""
    data = synthetic.generate(
        np, n_cases, n_drugs, seed=seed, effect_share=0.3, min_eras=min_eras, max_eras=max_eras
    ).data
    values = mixed_magnitude(np.random.default_rng(seed), data.nnz, signed=False) ** 0.25  # 1e-2 .. 1e2
    column = np.repeat(np.arange(n_drugs), np.diff(data.col_ptr))
    return from_coo(data.era_case, data.era_length, data.era_events, data.col_rows, column, values, n_drugs)


# -- NumPy emulations of the kernels' order of additions ---------------------------------------------------------


def sequential(values: np.ndarray) -> float:
    """``total = 0; total += v`` in index order (np.add.accumulate adds left to right)."""
    return float(np.add.accumulate(values)[-1]) if values.size else 0.0


def block_total(per_thread: np.ndarray) -> float:
    """The kernels' shared tree: ``s[t] += s[t + half]`` for ``t < half``, halving from BLOCK / 2."""
    s = np.array(per_thread, dtype=np.float64)
    half = BLOCK // 2
    while half > 0:
        s[:half] = s[:half] + s[half : 2 * half]
        half //= 2
    return float(s[0])


def emulate_strided_stage(row: np.ndarray, blocks: int, covered: np.ndarray | None = None) -> np.ndarray:
    """``strided_sums`` for one row: block b, thread t adds elements b BLOCK + t, stepping by blocks BLOCK."""
    out = np.empty(blocks)
    for b in range(blocks):
        per_thread = np.zeros(BLOCK)
        for t in range(BLOCK):
            index = np.arange(b * BLOCK + t, row.size, blocks * BLOCK)
            per_thread[t] = sequential(row[index])
            if covered is not None:
                covered[index] += 1
        out[b] = block_total(per_thread)
    return out


def emulate_row_total(row: np.ndarray, covered: np.ndarray | None = None) -> float:
    """``fixed_sums.row_totals`` for one row: the first stage, then (more than one block) the second."""
    blocks = fixed_sums.total_blocks(row.size)
    partial = emulate_strided_stage(row, blocks, covered)
    return float(partial[0]) if blocks == 1 else float(emulate_strided_stage(partial, 1)[0])


def emulate_long_segment_sums(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``long_segment_sums``: one block per segment, thread t adds elements ptr[i] + t, + BLOCK, ..."""
    out = np.empty(ptr.size - 1)
    for i in range(ptr.size - 1):
        segment = values[ptr[i] : ptr[i + 1]]
        out[i] = block_total(np.asarray([sequential(segment[t::BLOCK]) for t in range(BLOCK)]))
    return out


def emulate_segment_sums(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``segment_sums``: one thread per segment, in index order."""
    return np.asarray([sequential(values[ptr[i] : ptr[i + 1]]) for i in range(ptr.size - 1)])


def segments(generator: np.random.Generator, count: int, longest: int) -> np.ndarray:
    """Segment pointers with empty, short and long segments (the last one empty)."""
    lengths = generator.integers(0, longest, count)
    lengths[:: max(1, count // 7)] = 0
    lengths[-1] = 0
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def numpy_segment_sums(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """NumPy's sums of the segments (the reference)."""
    owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    return np.bincount(owner, weights=values, minlength=ptr.size - 1)


# -- CPU: the index arithmetic -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 255, 2048, 2049, 100_003])
def test_a_row_total_adds_every_term_once_and_equals_numpy(n: int) -> None:
    generator = np.random.default_rng(n)
    row = mixed_magnitude(generator, n, signed=False)
    covered = np.zeros(n, dtype=np.int64)
    emulated = emulate_row_total(row, covered)
    assert np.all(covered == 1)
    assert abs(emulated - np.sum(row)) <= 1e-12 * np.sum(row)
    assert abs(emulated - math.fsum(row)) <= 1e-12 * np.sum(row)


def test_the_blocks_of_a_row_total_depend_on_its_length_alone_and_fit_a_grid() -> None:
    assert [fixed_sums.total_blocks(n) for n in (1, 2048, 2049, 2048 * 1024, 10**10)] == [1, 1, 2, 1024, 1024]
    assert fixed_sums.MAX_TOTAL_BLOCKS <= 65_535  # the blocks of a row are the grid's y dimension


def test_column_chunks_cover_each_columns_nonzeros_in_order() -> None:
    counts = np.asarray([0, 1, 2047, 2048, 2049, 0, 5000, 0, 3])
    col_ptr = np.concatenate([[0], np.cumsum(counts)])
    chunk_ptr, column_chunk_ptr = fixed_sums.column_chunks(col_ptr)
    assert np.all(np.diff(chunk_ptr) > 0) and np.all(np.diff(chunk_ptr) <= fixed_sums.CHUNK)
    assert chunk_ptr[0] == 0 and chunk_ptr[-1] == col_ptr[-1]
    for j in range(counts.size):
        first, last = column_chunk_ptr[j], column_chunk_ptr[j + 1]
        assert last - first == -(-counts[j] // fixed_sums.CHUNK)
        if counts[j]:
            assert chunk_ptr[first] == col_ptr[j] and chunk_ptr[last] == col_ptr[j + 1]


def test_the_row_index_is_the_designs_csr_form_and_its_products_are_x_b() -> None:
    data = design(seed=5, n_cases=400, n_drugs=9)
    rows = fixed_sums.row_index(data)
    csr = data.design.tocsr()
    csr.sort_indices()
    np.testing.assert_array_equal(rows.row_ptr, csr.indptr)
    np.testing.assert_array_equal(rows.row_columns, csr.indices)
    np.testing.assert_array_equal(rows.row_values, csr.data)
    assert rows.row_columns.dtype == np.int32 and rows.row_ptr.dtype == np.int64
    beta = np.random.default_rng(5).normal(size=data.n_covariates)
    emulated = np.asarray(
        [
            sequential(rows.row_values[a:b] * beta[rows.row_columns[a:b]])
            for a, b in zip(rows.row_ptr[:-1], rows.row_ptr[1:], strict=True)
        ]
    )
    np.testing.assert_allclose(emulated, model.linear_predictor(data, beta), rtol=1e-12, atol=1e-12)


def test_touched_slot_numerators_equal_the_numpy_fits_numerators() -> None:
    """The batch engine's numerators: q per touched slot (segment_sums over touched_ptr), then per (column, row)
    the slots' q times the case weights (sccs_numerators' loop), against ccd.fit's formula."""
    data = design(seed=6, n_cases=500, n_drugs=7)
    generator = np.random.default_rng(6)
    weights = generator.integers(0, 4, data.n_cases).astype(np.float64)
    q = emulate_segment_sums(data.touched_ptr, data.era_events[data.col_rows] * data.col_values)
    ptr = data.touched_col_ptr
    emulated = np.asarray([
        block_total(np.asarray([sequential(q[ptr[j] + t : ptr[j + 1] : BLOCK]
                                           * weights[data.touched_case[ptr[j] + t : ptr[j + 1] : BLOCK]])
                                for t in range(BLOCK)]))
        for j in range(data.n_covariates)
    ])  # fmt: skip
    column = np.repeat(np.arange(data.n_covariates), np.diff(data.col_ptr))
    reference = np.bincount(column, weights=weights[data.era_case[data.col_rows]] * data.era_events[data.col_rows]
                            * data.col_values, minlength=data.n_covariates)  # fmt: skip
    np.testing.assert_allclose(emulated, reference, rtol=1e-12)


def test_the_emulated_segment_sums_equal_numpy() -> None:
    generator = np.random.default_rng(7)
    ptr = segments(generator, 300, 3000)
    values = mixed_magnitude(generator, int(ptr[-1]), signed=False)
    reference = numpy_segment_sums(ptr, values)
    for emulated in (emulate_segment_sums(ptr, values), emulate_long_segment_sums(ptr, values)):
        np.testing.assert_allclose(emulated, reference, rtol=1e-12)


# -- GPU: the same bytes twice, NumPy's sums, the emulated order ---------------------------------------------------


def host(array: object) -> np.ndarray:
    return np.asarray(to_host(array))


def _twice(function, *args):  # type: ignore[no-untyped-def]
    """The function's result made twice: the same bytes (returned on the host)."""
    first, second = host(function(*args)), host(function(*args))
    assert first.tobytes() == second.tobytes(), function.__name__
    return first


def _adversarial(values: np.ndarray) -> None:
    """The input makes the order matter: two orders of NumPy's additions give different bits."""
    assert sequential(values) != sequential(values[::-1]) or np.sum(values) != sequential(values)


@pytest.mark.gpu
def test_gpu_segment_and_row_sums_give_the_same_bytes_twice_in_the_emulated_order() -> None:
    cp = pytest.importorskip("cupy")
    generator = np.random.default_rng()
    ptr = segments(generator, 4000, 5000)  # about 10M terms: long and short segments, many blocks
    values = mixed_magnitude(generator, int(ptr[-1]))
    _adversarial(values)
    ptr_device, values_device = cp.asarray(ptr), cp.asarray(values)
    short = _twice(fixed_sums.segment_sums, ptr_device, values_device)
    long = _twice(fixed_sums.long_segment_sums, ptr_device, values_device)
    scale = numpy_segment_sums(ptr, np.abs(values))
    reference = numpy_segment_sums(ptr, values)
    for sums in (short, long):
        assert np.all(np.abs(sums - reference) <= 1e-12 * scale)
    picked = generator.choice(ptr.size - 1, 40, replace=False)  # the emulation is slow: some segments
    for i in picked.tolist():
        one = np.asarray([0, ptr[i + 1] - ptr[i]])
        segment = values[ptr[i] : ptr[i + 1]]
        assert short[i] == emulate_segment_sums(one, segment)[0]
        assert long[i] == emulate_long_segment_sums(one, segment)[0]

    rows = np.stack([mixed_magnitude(generator, 3_000_017) for _ in range(3)])  # 1024 blocks a row, 2 stages
    rows[2] = mixed_magnitude(generator, rows.shape[1], signed=False)
    totals = _twice(fixed_sums.row_totals, cp.asarray(rows))
    for r in range(3):
        assert abs(totals[r] - np.sum(rows[r])) <= 1e-12 * np.sum(np.abs(rows[r]))
        assert host(fixed_sums.row_totals(cp.asarray(rows[r : r + 1]))).tobytes() == totals[r : r + 1].tobytes()
    assert totals[0] == emulate_row_total(rows[0])
    assert abs(fixed_sums.total(cp.asarray(rows[2])) - np.sum(rows[2])) <= 1e-12 * np.sum(rows[2])


def emulate_chunked_segment_sums(length: int, segment: np.ndarray) -> float:
    """``chunked_segment_sums`` of one segment: its chunks of CHUNK by long_segment_sums, then its chunk sums."""
    chunk_ptr, _ = fixed_sums.column_chunks(np.asarray([0, length]))
    chunk_sums = emulate_long_segment_sums(chunk_ptr, segment)
    return float(emulate_long_segment_sums(np.asarray([0, chunk_sums.size]), chunk_sums)[0])


@pytest.mark.gpu
def test_gpu_chunked_segment_sums_give_the_same_bytes_twice_alone_or_among_others() -> None:
    # Segments of every length, up to many chunks (an SCCS analysis of a common drug has millions of nonzeros):
    # the same bytes twice, NumPy's sums to 1e-12, the emulated order, and a segment's sum alone equals its sum
    # among the others (what lets a fanned-out sccs_analyses job's parts give the single run's bits).
    cp = pytest.importorskip("cupy")
    generator = np.random.default_rng()
    chunk = fixed_sums.CHUNK
    lengths = [0, 1, chunk - 1, chunk, chunk + 1, 10 * chunk + 3, 0, 3_000_001, *generator.integers(0, 5000, 300)]
    ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = mixed_magnitude(generator, int(ptr[-1]))
    _adversarial(values)
    segments = fixed_sums.ChunkedSegments.of(cp, ptr)
    sums = _twice(lambda: fixed_sums.chunked_segment_sums(segments, cp.asarray(values)))
    reference, scale = numpy_segment_sums(ptr, values), numpy_segment_sums(ptr, np.abs(values))
    assert np.all(np.abs(sums - reference) <= 1e-12 * scale)
    assert sums[0] == 0.0 and sums[6] == 0.0
    for i in [1, 2, 3, 4, 5, 7, *generator.choice(range(8, len(lengths)), 10, replace=False).tolist()]:
        segment = values[ptr[i] : ptr[i + 1]]
        alone = fixed_sums.chunked_segment_sums(fixed_sums.ChunkedSegments.of(cp, np.asarray([0, segment.size])),
                                                cp.asarray(segment))
        assert host(alone).tobytes() == sums[i : i + 1].tobytes()
        if segment.size <= 10 * chunk + 3:  # the emulation is slow
            assert sums[i] == emulate_chunked_segment_sums(segment.size, segment)


@pytest.mark.gpu
def test_gpu_model_sums_give_the_same_bytes_twice_and_equal_numpy() -> None:
    """X b, X' v, the case sums and the log-likelihood and gradient on the device (what every fit's finish, the
    CV scores and the gradient criterion use)."""
    cp = pytest.importorskip("cupy")
    data = design(seed=11, n_cases=60_000, n_drugs=25)  # a few dense columns: chunks of many blocks
    device = data.to(cp)
    generator = np.random.default_rng()
    beta = generator.normal(0.0, 0.3, data.n_covariates)
    era_values = mixed_magnitude(generator, data.n_eras)
    _adversarial(era_values)
    eta = _twice(fixed_sums.linear_predictor, device, cp.asarray(beta))
    np.testing.assert_allclose(eta, data.design @ beta, rtol=1e-12, atol=1e-12 * np.max(np.abs(eta)))
    product = _twice(fixed_sums.transposed_product, device, cp.asarray(era_values))
    scale = np.abs(data.design).T @ np.abs(era_values)
    assert np.all(np.abs(product - data.design.T @ era_values) <= 1e-12 * scale)
    sums = _twice(fixed_sums.case_sums, device, cp.asarray(era_values))
    case_scale = np.bincount(data.era_case, weights=np.abs(era_values), minlength=data.n_cases)
    reference = np.bincount(data.era_case, weights=era_values, minlength=data.n_cases)
    assert np.all(np.abs(sums - reference) <= 1e-12 * case_scale)

    weights = generator.integers(0, 3, data.n_cases).astype(np.float64)
    runs = [model.log_likelihood_and_gradient(device, beta, cp.asarray(weights)) for _ in range(2)]
    assert runs[0][0] == runs[1][0] and host(runs[0][1]).tobytes() == host(runs[1][1]).tobytes()
    ll, grad = model.log_likelihood_and_gradient(data, beta, weights)
    assert abs(runs[0][0] - ll) <= 1e-10 * abs(ll)
    np.testing.assert_allclose(host(runs[0][1]), grad, rtol=1e-10, atol=1e-10 * np.max(np.abs(grad)))


@pytest.mark.gpu
def test_gpu_engine_sums_give_the_same_bytes_twice_alone_or_in_a_batch() -> None:
    """ccd.cu's sums outside the coordinate steps: the X b criterion's block partials (1024 blocks per
    replicate, no atomics) and the batch's numerators, on mixed-magnitude state."""
    cp = pytest.importorskip("cupy")
    from kernels.sccs import gpu

    data = design(seed=12, n_cases=120_000, n_drugs=12, min_eras=15, max_eras=25)  # 2.4M eras
    assert gpu.xbeta_blocks(data.n_eras) == 1024
    generator = np.random.default_rng()
    replicates = 3
    weights = generator.integers(0, 4, (replicates, data.n_cases)).astype(np.float64)
    prior = Prior("normal", 0.5, np.ones(data.n_covariates, dtype=bool))
    engines = [gpu.BatchEngine(data, prior, ccd.FitOptions(), capacity, use_graph=False) for capacity in (3, 1)]
    eta = mixed_magnitude(generator, replicates * data.n_eras).reshape(replicates, data.n_eras)
    eta_start = eta * (1.0 + 1e-3 * generator.standard_normal(eta.shape))
    criteria, numerators = [], []
    for engine, count in zip(engines, (3, 1), strict=True):
        engine._set_up(np.full(count, 0.5), weights[:count], np.zeros((count, data.n_covariates)))
        engine.eta[...] = cp.asarray(eta[:count])
        engine.eta_start[...] = cp.asarray(eta_start[:count])
        criteria.append(_twice(engine._xbeta_criterion, np.arange(count)))
        first = host(engine.numerator)
        engine._load_numerators()
        assert host(engine.numerator).tobytes() == first.tobytes()
        numerators.append(first)
    assert criteria[1].tobytes() == criteria[0][:1].tobytes()  # replicate 0 alone = in a batch of 3
    assert numerators[1].tobytes() == numerators[0][:1].tobytes()
    era_weights = weights[:, data.era_case]
    change = np.sum(era_weights * np.abs(eta - eta_start), axis=1)
    size = np.sum(era_weights * np.abs(eta), axis=1)
    np.testing.assert_allclose(criteria[0], change / (1.0 + size), rtol=1e-12)
    column = np.repeat(np.arange(data.n_covariates), np.diff(data.col_ptr))
    for r in range(replicates):
        reference = np.bincount(
            column,
            weights=weights[r, data.era_case[data.col_rows]] * data.era_events[data.col_rows] * data.col_values,
            minlength=data.n_covariates,
        )
        np.testing.assert_allclose(numerators[0][r], reference, rtol=1e-12)


@pytest.mark.gpu
def test_gpu_case_max_equals_numpy_exactly() -> None:
    """The log-sum-exp shift per case: NumPy's maximum, bit for bit. (CuPy's ``maximum.at``, used before, rounded
    float64 values to float32: this input has most values between two float32 numbers.)"""
    cp = pytest.importorskip("cupy")
    data = design(seed=13, n_cases=20_000, n_drugs=10)
    device = data.to(cp)
    generator = np.random.default_rng()
    values = generator.normal(0.0, 3.0, data.n_eras)
    assert np.any(values.astype(np.float32).astype(np.float64) != values)
    reference = np.full(data.n_cases, -np.inf)
    np.maximum.at(reference, data.era_case, values)
    assert host(fixed_sums.case_max(device, cp.asarray(values))).tobytes() == reference.tobytes()
    assert host(model.case_max(device, cp.asarray(values))).tobytes() == reference.tobytes()
    # A NaN anywhere in a case is its maximum (as NumPy's); -inf and +inf are values like any other.
    values[data.era_case == 3] = -np.inf
    values[np.flatnonzero(data.era_case == 5)[-1]] = np.nan
    values[np.flatnonzero(data.era_case == 7)[0]] = np.inf
    reference = np.full(data.n_cases, -np.inf)
    with np.errstate(invalid="ignore"):  # NumPy warns of the NaN it keeps
        np.maximum.at(reference, data.era_case, values)
    result = host(fixed_sums.case_max(device, cp.asarray(values)))
    assert np.isnan(result[5]) and result[3] == -np.inf and result[7] == np.inf
    np.testing.assert_array_equal(result, reference)
