"""Sums in a fixed order on the GPU: what makes an SCCS fit on the device give the same bits on every run.

CuPy's ``bincount`` with weights adds with ``atomicAdd``, and cuSPARSE promises bitwise reproducible products only
for some of its algorithms (not the defaults CuPy calls), so the order of a float sum, and with it the sum's last
bits, could change from run to run; a fit's stopping cycle, and so its coefficients, then differ too. The kernels
of ``fixed_sums.cu`` add in an order fixed by the input's sizes alone:

* short segments (a case's eras): one thread per segment, in index order (:func:`segment_sums`,
  :func:`case_sums`);
* long segments (a column's chunks): one block per segment, each thread in index order, then the block's fixed
  tree (:func:`long_segment_sums`); segments of any length (an SCCS analysis's nonzeros): chunks of
  :data:`CHUNK` by one block each, then each segment's chunks in order (:func:`chunked_segment_sums`);
* ``X b`` (:func:`linear_predictor`): one thread per era over its nonzeros in increasing column order, from a
  row-major copy of the design built once per data set (by one sort of unique keys: one order whatever the sort);
* ``X' v`` (:func:`transposed_product`): each column's nonzeros in chunks of :data:`CHUNK`, one block per chunk,
  then each column's chunks as a long segment;
* the totals of an (R, n) array's rows (:func:`row_totals`, :func:`total`): a number of blocks per row that
  depends on ``n`` alone, then those blocks' sums in order, so a row's total never depends on the other rows
  (what keeps a batch member's fit the same whatever else is in its batch).

Integer counts (``bincount`` without weights) are exact in any order and stay CuPy's. The NumPy path does not
come here: it is the reference, in NumPy's own order (``kernels/sccs/model.py``).

CuPy is imported only by the device functions: this module imports on a machine without a GPU.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import cuda
from kernels.backend import array_namespace, is_numpy, to_host
from kernels.sccs.data import SccsData

BLOCK = 256  # threads per block (a power of two: the shared sums halve it)
CHUNK = 8 * BLOCK  # nonzeros of one column per block of X' v
MAX_TOTAL_BLOCKS = 1024  # blocks per row in the first stage of a row total
_SOURCE = cuda.kernel_source(__file__, "fixed_sums.cu", warm_up=[{"BLOCK": BLOCK}])


def _kernel(name: str) -> Any:
    return cuda.function(_SOURCE, name, {"BLOCK": BLOCK})


# -- index arithmetic (host side, NumPy: tested on the CPU) -------------------------------------------------------


def total_blocks(n: int) -> int:
    """Blocks per row of a row total's first stage: by ``n`` alone (at least 1)."""
    return max(1, min(MAX_TOTAL_BLOCKS, math.ceil(n / CHUNK)))


def column_chunks(col_ptr: np.ndarray, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Each column's nonzeros cut into chunks of at most ``chunk``: chunk c holds ``chunk_ptr[c] ..
    chunk_ptr[c + 1]``, column j's chunks are ``column_chunk_ptr[j] .. column_chunk_ptr[j + 1]`` (none for a
    column without nonzeros). Host arrays (int64)."""
    col_ptr = np.asarray(col_ptr, dtype=np.int64)
    counts = np.diff(col_ptr)
    per_column = -(-counts // chunk)  # ceil
    column_chunk_ptr = np.concatenate([[0], np.cumsum(per_column)]).astype(np.int64)
    owner = np.repeat(np.arange(counts.size), per_column)
    within = np.arange(int(column_chunk_ptr[-1])) - column_chunk_ptr[:-1][owner]
    chunk_ptr = np.append(col_ptr[:-1][owner] + within * chunk, col_ptr[-1]).astype(np.int64)
    return chunk_ptr, column_chunk_ptr


@dataclass(frozen=True)
class RowIndex:
    """The design in row-major (CSR) form: era k's nonzeros are ``row_ptr[k] .. row_ptr[k + 1]``, in increasing
    column order (``row_columns``, int32; ``row_values``)."""

    row_ptr: Any
    row_columns: Any
    row_values: Any


def nonzero_keys(xp: ModuleType, col_ptr: Any, col_rows: Any, n_covariates: int) -> Any:
    """``row J + column`` of every nonzero (CSC order): unique, since a column holds an era once."""
    keys = xp.empty(col_rows.shape[0], dtype=xp.int64)
    if keys.shape[0] == 0:
        return keys
    if is_numpy(xp):
        column = np.repeat(np.arange(n_covariates, dtype=np.int64), np.diff(np.asarray(col_ptr)))
        return np.asarray(col_rows, dtype=np.int64) * n_covariates + column
    _kernel("nonzero_keys")((n_covariates,), (BLOCK,), (col_ptr, col_rows, np.int64(n_covariates), keys))
    return keys


def row_index(data: SccsData) -> RowIndex:
    """Build :class:`RowIndex` with the data's namespace: one sort of the nonzeros' unique keys (so one order,
    whichever algorithm sorts), and the rows' counts (integers: exact in any order)."""
    xp, n_cov, n_eras = data.xp, data.n_covariates, data.n_eras
    if n_eras * n_cov >= 2**63:
        raise ValueError(f"{n_eras} eras x {n_cov} covariates overflow the row-major index's int64 keys")
    if data.nnz == 0:
        return RowIndex(xp.zeros(n_eras + 1, dtype=xp.int64), xp.zeros(0, dtype=xp.int32), xp.zeros(0, xp.float64))
    keys = nonzero_keys(xp, data.col_ptr, data.col_rows, n_cov)
    order = xp.argsort(keys)
    row_columns = (keys[order] % n_cov).astype(xp.int32)
    del keys
    row_values = data.col_values[order]
    del order
    counts = xp.bincount(data.col_rows, minlength=n_eras)
    row_ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(counts)]).astype(xp.int64)
    return RowIndex(row_ptr, xp.ascontiguousarray(row_columns), xp.ascontiguousarray(row_values))


# -- the per-data-set index, built once ---------------------------------------------------------------------------


@dataclass
class _Index:
    case_ptr: Any = None
    log_length: Any = None
    rows: RowIndex | None = None
    chunk_ptr: Any = None
    column_chunk_ptr: Any = None


_INDEXES: dict[int, _Index] = {}


def _index(data: SccsData) -> _Index:
    """The data set's index (kept while the data set lives: dropped when it is collected)."""
    key = id(data)
    index = _INDEXES.get(key)
    if index is None:
        index = _INDEXES[key] = _Index()
        weakref.finalize(data, _INDEXES.pop, key, None)
    return index


def case_ptr(data: SccsData) -> Any:
    """Where each case's eras start, (N + 1,) int64 (eras are sorted by case)."""
    index = _index(data)
    if index.case_ptr is None:
        xp = data.xp
        counts = xp.bincount(data.era_case, minlength=data.n_cases)
        index.case_ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(counts)]).astype(xp.int64)
    return index.case_ptr


def log_length(data: SccsData) -> Any:
    """``log L`` per era (K,), made once per data set (every evaluation of the likelihood reads it)."""
    index = _index(data)
    if index.log_length is None:
        index.log_length = data.xp.log(data.era_length)
    return index.log_length


def prepare(data: SccsData) -> None:
    """Build the data set's device index now (the batch engine does, so that a fit's timing and its memory
    planning meet it once, up front): case starts, ``log L``, the row-major design and the columns' chunks."""
    case_ptr(data)
    log_length(data)
    _rows(data)
    _chunks(data)


def _rows(data: SccsData) -> RowIndex:
    index = _index(data)
    if index.rows is None:
        index.rows = row_index(data)
    return index.rows


def _chunks(data: SccsData) -> tuple[Any, Any]:
    index = _index(data)
    if index.chunk_ptr is None:
        chunk_ptr, column_chunk_ptr = column_chunks(to_host(data.col_ptr))
        index.chunk_ptr, index.column_chunk_ptr = data.xp.asarray(chunk_ptr), data.xp.asarray(column_chunk_ptr)
    return index.chunk_ptr, index.column_chunk_ptr


# -- the sums (CuPy arrays in and out) ----------------------------------------------------------------------------


def _float64(cp: ModuleType, values: Any) -> Any:
    return cp.ascontiguousarray(values, dtype=cp.float64)


def segment_sums(ptr: Any, values: Any) -> Any:
    """Per segment ``ptr[i] .. ptr[i + 1]``, the sum of ``values`` in index order (short segments)."""
    cp = array_namespace(values)
    values = _float64(cp, values)
    n_segments = int(ptr.shape[0]) - 1
    out = cp.empty(n_segments, dtype=cp.float64)
    if n_segments > 0:
        _kernel("segment_sums")((math.ceil(n_segments / BLOCK),), (BLOCK,), (ptr, values, out, np.int64(n_segments)))
    return out


def long_segment_sums(ptr: Any, values: Any) -> Any:
    """Per segment ``ptr[i] .. ptr[i + 1]``, the sum of ``values``, one block per segment (long segments)."""
    cp = array_namespace(values)
    values = _float64(cp, values)
    n_segments = int(ptr.shape[0]) - 1
    out = cp.empty(n_segments, dtype=cp.float64)
    if n_segments > 0:
        _kernel("long_segment_sums")((n_segments,), (BLOCK,), (ptr, values, out))
    return out


@dataclass(frozen=True)
class ChunkedSegments:
    """Segments ``ptr[i] .. ptr[i + 1]`` of any length cut into chunks of at most :data:`CHUNK` (device arrays, as
    :func:`column_chunks` gives them): :func:`chunked_segment_sums` adds each chunk by one block, then each
    segment's chunks in order, so a long segment is spread over many blocks and its sum still has one order."""

    chunk_ptr: Any
    segment_chunk_ptr: Any

    @classmethod
    def of(cls, cp: ModuleType, ptr: np.ndarray) -> ChunkedSegments:
        chunk_ptr, segment_chunk_ptr = column_chunks(ptr)
        return cls(cp.asarray(chunk_ptr), cp.asarray(segment_chunk_ptr))


def chunked_segment_sums(segments: ChunkedSegments, values: Any) -> Any:
    """Per segment, the sum of ``values`` over it: each chunk's sum (:func:`long_segment_sums` over the chunks),
    then each segment's chunk sums in order. A segment's sum depends on its own values alone (its chunks start at
    the segment's start)."""
    return long_segment_sums(segments.segment_chunk_ptr, long_segment_sums(segments.chunk_ptr, values))


def case_sums(data: SccsData, values: Any) -> Any:
    """Per case, the sum of ``values`` (K,) over its eras, in era order: (N,) float64."""
    return segment_sums(case_ptr(data), values)


def case_max(data: SccsData, values: Any) -> Any:
    """Per case, the largest of ``values`` (K,) over its eras: (N,) float64 (-inf for a case without eras, NaN
    where a value is NaN). Exact, so the same values as any other order; one thread per case, no atomics."""
    cp = data.xp
    values = _float64(cp, values)
    out = cp.empty(data.n_cases, dtype=cp.float64)
    if data.n_cases > 0:
        _kernel("segment_max")((math.ceil(data.n_cases / BLOCK),), (BLOCK,),
                               (case_ptr(data), values, out, np.int64(data.n_cases)))
    return out


def linear_predictor(data: SccsData, beta: Any) -> Any:
    """``X b`` (K,) float64, each era's terms in increasing column order."""
    cp = data.xp
    out = cp.zeros(data.n_eras, dtype=cp.float64)
    if data.nnz == 0:
        return out
    rows = _rows(data)
    _kernel("row_products")(
        (math.ceil(data.n_eras / BLOCK),),
        (BLOCK,),
        (rows.row_ptr, rows.row_columns, rows.row_values, _float64(cp, beta), out, np.int64(data.n_eras)),
    )
    return out


def transposed_product(data: SccsData, values: Any) -> Any:
    """``X' v`` (J,) float64 for ``v`` (K,): per column, chunk sums then the column's chunks in order."""
    cp = data.xp
    chunk_ptr, column_chunk_ptr = _chunks(data)
    n_chunks = int(chunk_ptr.shape[0]) - 1
    if n_chunks == 0:
        return cp.zeros(data.n_covariates, dtype=cp.float64)
    chunk_sum = cp.empty(n_chunks, dtype=cp.float64)
    _kernel("chunk_products")(
        (n_chunks,), (BLOCK,), (chunk_ptr, data.col_rows, data.col_values, _float64(cp, values), chunk_sum)
    )
    return long_segment_sums(column_chunk_ptr, chunk_sum)


def row_totals(matrix: Any) -> Any:
    """Each row's total of an (R, n) array, (R,) float64: :func:`total_blocks` blocks per row (by ``n`` alone),
    then those blocks' sums in order."""
    cp = array_namespace(matrix)
    matrix = _float64(cp, matrix)
    rows, n = int(matrix.shape[0]), int(matrix.shape[1])
    if rows == 0 or n == 0:
        return cp.zeros(rows, dtype=cp.float64)
    blocks = total_blocks(n)
    partial = cp.empty((rows, blocks), dtype=cp.float64)
    _kernel("strided_sums")((rows, blocks), (BLOCK,), (matrix, np.int64(n), partial))
    if blocks == 1:
        return partial.reshape(rows)
    out = cp.empty((rows, 1), dtype=cp.float64)
    _kernel("strided_sums")((rows, 1), (BLOCK,), (partial, np.int64(blocks), out))
    return out.reshape(rows)


def total(values: Any) -> float:
    """The sum of a vector, as a host float (:func:`row_totals` of one row)."""
    return float(row_totals(values.reshape(1, -1))[0])
