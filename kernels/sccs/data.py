"""SCCS data on the host or device: eras grouped by case, a CSC design and the per-column case index.

Layout (the paper's section 2.3, in the Cyclops interval format; see ``docs/sccs.md``):

* eras ``k = 0..K-1`` sorted by case; ``era_case[k]`` is the case of era ``k``, ``era_length`` its length in
  days (``L``), ``era_events`` its event count (``y``); ``case_events[i] = n_i`` sums them per case.
* the design ``X`` in compressed sparse column form: column ``j`` holds the eras ``col_rows[col_ptr[j]:
  col_ptr[j+1]]`` (increasing, so grouped by case) with values ``col_values[...]``.
* the case index of each column (what lets one thread own one case, so the sparse update of Listing 3
  needs no atomics): column ``j`` touches the cases ``touched_case[touched_col_ptr[j]:touched_col_ptr[j+1]]``,
  and touched case ``t`` owns the nonzeros ``touched_ptr[t]:touched_ptr[t+1]``. ``nnz_touched`` maps each
  nonzero back to its touched-case slot (the host path uses it for ``bincount``).

Everything is built with the array namespace ``xp`` (NumPy or CuPy), so synthetic data of the paper's
largest size can be assembled directly on the GPU, and the uploaded tables are sorted and indexed on the
device a job runs on. Also here: the table builder for the Cyclops/SelfControlledCaseSeries
``outcomes``/``covariates`` tables with its validation, and the conversion of raw person-level data
(observation period, events, exposures, risk window) into those tables.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import rng
from kernels.backend import array_namespace, is_numpy, to_host
from kernels.sccs.transfer import to_device

# The two hashes that group pieces of equal (case, drug set) in eras_from_person_data.
DRUG_HASH_STREAM = rng.STREAMS["SCCS_ERAS_DRUG_HASH"]
CASE_HASH_STREAM = rng.STREAMS["SCCS_ERAS_CASE_HASH"]

# Integer ids spanning fewer than this many times their count are looked up in a dense table of the span (a
# scatter and a gather, exact) instead of a binary search or a sort: the table is at most twice their memory.
_DENSE_SPAN_FACTOR = 2
# Columns numbered in 16 bits: sorted by a (stable) radix sort.
_RADIX_COLUMNS = 1 << 16

_DESIGN_ARRAYS = (
    "era_case", "era_length", "era_events", "case_events", "col_ptr", "col_rows", "col_values",
    "touched_col_ptr", "touched_case", "touched_ptr", "nnz_touched",
)


@dataclass(frozen=True)
class SccsData:
    """One SCCS analysis: eras, design and case index on one device (all arrays in the same namespace)."""

    era_case: Any  # (K,) int64, non-decreasing
    era_length: Any  # (K,) float64 > 0
    era_events: Any  # (K,) float64 >= 0
    case_events: Any  # (N,) float64, > 0 for every case kept
    col_ptr: Any  # (J+1,) int64
    col_rows: Any  # (nnz,) int64
    col_values: Any  # (nnz,) float64
    touched_col_ptr: Any  # (J+1,) int64
    touched_case: Any  # (T,) int64
    touched_ptr: Any  # (T+1,) int64
    nnz_touched: Any  # (nnz,) int64
    covariate_ids: np.ndarray  # (J,) int64 on the host: the user's covariateId of each column
    binary: bool  # every nonzero equals 1 (then sum x^2 w = sum x w)

    @property
    def xp(self) -> ModuleType:
        """The namespace the arrays live in."""
        return array_namespace(self.era_case)

    @property
    def n_cases(self) -> int:
        return int(self.case_events.shape[0])

    @property
    def n_eras(self) -> int:
        return int(self.era_case.shape[0])

    @property
    def n_covariates(self) -> int:
        return int(self.col_ptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        return int(self.col_rows.shape[0])

    def max_touched(self) -> int:
        """The largest number of cases one column touches (sizes the GPU's per-column launch)."""
        ptr = to_host(self.touched_col_ptr)
        return int(np.max(np.diff(ptr))) if ptr.size > 1 else 0

    @functools.cached_property
    def design(self) -> Any:
        """``X`` as a (K x J) CSC sparse matrix of the data's namespace, built once per data set.

        The CSC arrays are canonical by construction (:func:`from_coo`: rows increase within a column, one
        entry per (era, column)), and the matrix says so: otherwise CuPy checks it before every product with
        one thread per column scanning that column's rows (a large share of a fit at the paper's largest size).
        """
        xp = self.xp
        if is_numpy(xp):
            import scipy.sparse as sparse
        else:
            import cupyx.scipy.sparse as sparse
        matrix = sparse.csc_matrix((self.col_values, self.col_rows, self.col_ptr), shape=(self.n_eras,
                                                                                         self.n_covariates))
        matrix.has_canonical_format = True
        return matrix

    def to(self, xp: ModuleType) -> SccsData:
        """The same data with every array moved to ``xp`` (NumPy or CuPy)."""
        convert = to_host if is_numpy(xp) else functools.partial(to_device, xp)
        moved = {name: convert(getattr(self, name)) for name in _DESIGN_ARRAYS}
        return SccsData(**moved, covariate_ids=self.covariate_ids, binary=self.binary)


def repeat_by_counts(xp: ModuleType, values: Any, counts: Any) -> Any:
    """``values[i]`` repeated ``counts[i]`` times (``np.repeat``; CuPy's repeat takes no array of counts)."""
    if is_numpy(xp):
        return np.repeat(values, counts)
    counts = xp.asarray(counts, dtype=xp.int64)
    total = int(counts.sum())
    if total == 0:
        return values[:0]
    nonempty = xp.flatnonzero(counts > 0)
    starts = (xp.cumsum(counts) - counts)[nonempty]
    marker = xp.zeros(total, dtype=xp.int64)
    marker[starts] = 1
    return values[nonempty[xp.cumsum(marker) - 1]]


def from_coo(
    era_case: Any,
    era_length: Any,
    era_events: Any,
    nz_era: Any,
    nz_col: Any,
    nz_value: Any,
    n_covariates: int,
    covariate_ids: np.ndarray | None = None,
) -> SccsData:
    """Assemble :class:`SccsData` from eras sorted by case and design nonzeros in any order.

    ``era_case`` must be non-decreasing, numbered ``0..N-1`` with every case present and carrying at least
    one event; each ``(era, column)`` pair may appear once (a repeat is refused). Arrays may be NumPy or CuPy
    (not mixed).
    """
    xp = array_namespace(era_case)
    era_case = xp.asarray(era_case, dtype=xp.int64)
    era_length = xp.asarray(era_length, dtype=xp.float64)
    era_events = xp.asarray(era_events, dtype=xp.float64)
    n_eras = int(era_case.shape[0])
    n_cases = int(era_case[-1]) + 1 if n_eras else 0
    case_events = xp.bincount(era_case, weights=era_events, minlength=n_cases).astype(xp.float64)

    nz_era = xp.asarray(nz_era, dtype=xp.int64)
    nz_col = xp.asarray(nz_col, dtype=xp.int64)
    nz_value = xp.asarray(nz_value, dtype=xp.float64)
    # Sort nonzeros by (column, era): eras are sorted by case, so each column's nonzeros come grouped by case.
    key = nz_col * max(n_eras, 1) + nz_era
    if _strictly_increasing(xp, key):
        # Given in that order already (tables written column by column): the keys are unique, so the sort's
        # order is the identity and the arrays are used as given (contiguous for the GPU's kernels), not gathered.
        col_rows, col_sorted, col_values = (xp.ascontiguousarray(a) for a in (nz_era, nz_col, nz_value))
    else:
        if n_covariates <= _RADIX_COLUMNS and _non_decreasing(xp, nz_era):
            # Given era by era (tables written row by row, as sccs_eras writes them): a stable sort by column
            # alone gives the one order of the unique keys, and on 16-bit column numbers it is a radix sort.
            order = xp.argsort(nz_col.astype(xp.uint16), kind="stable")
        else:
            order = xp.argsort(key)
        ordered = key[order]
        # The GPU's coordinate kernels read a column's eras of a case before writing any (ccd.cu's SLOT_GROUP):
        # a pair given twice would lose an update there, so it is refused here (sorted, repeats are neighbours).
        if ordered.shape[0] > 1 and bool(xp.any(ordered[1:] == ordered[:-1])):
            raise ValueError("each (era, column) pair of the design may appear once")
        col_rows = nz_era[order]
        col_sorted = nz_col[order]
        col_values = nz_value[order]
    counts = xp.bincount(col_sorted, minlength=n_covariates)
    col_ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(counts)]).astype(xp.int64)

    nnz = int(col_rows.shape[0])
    nz_case = era_case[col_rows]
    if nnz:
        key = col_sorted * max(n_cases, 1) + nz_case
        starts = xp.concatenate([xp.ones(1, dtype=xp.bool_), key[1:] != key[:-1]])
    else:
        starts = xp.zeros(0, dtype=xp.bool_)
    start_positions = xp.flatnonzero(starts).astype(xp.int64)
    touched_case = nz_case[start_positions]
    touched_ptr = xp.concatenate([start_positions, xp.asarray([nnz], dtype=xp.int64)])
    nnz_touched = (xp.cumsum(starts.astype(xp.int64)) - 1).astype(xp.int64)
    touched_counts = xp.bincount(col_sorted[start_positions], minlength=n_covariates)
    touched_col_ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(touched_counts)]).astype(xp.int64)

    ids = np.arange(n_covariates, dtype=np.int64) if covariate_ids is None else np.asarray(covariate_ids, np.int64)
    binary = bool(xp.all(col_values == 1.0)) if nnz else True
    return SccsData(
        era_case=era_case, era_length=era_length, era_events=era_events, case_events=case_events,
        col_ptr=col_ptr, col_rows=col_rows, col_values=col_values, touched_col_ptr=touched_col_ptr,
        touched_case=touched_case, touched_ptr=touched_ptr, nnz_touched=nnz_touched,
        covariate_ids=ids, binary=binary,
    )


@dataclass(frozen=True)
class BuiltData:
    data: SccsData
    case_ids: np.ndarray  # (N,) the stratumId of each kept case (on the host)
    dropped_cases: int  # cases without any event (no likelihood contribution)
    dropped_eras: int


@dataclass(frozen=True)
class _Tables:
    """The Cyclops interval tables as arrays of one namespace (validated by :func:`_validated_tables`)."""

    row_id: Any
    stratum_id: Any
    time: Any
    y: Any
    cov_row_id: Any
    cov_id: Any
    cov_value: Any


def _require_finite(xp: ModuleType, name: str, values: Any) -> None:
    if not bool(xp.all(xp.isfinite(values))):
        raise ValueError(f"{name} has missing or non-finite values")


def _run_starts(xp: ModuleType, sorted_values: Any) -> Any:
    """Per element of a sorted array, whether it starts a run of equal values."""
    starts = xp.ones(sorted_values.shape[0], dtype=bool)
    starts[1:] = sorted_values[1:] != sorted_values[:-1]
    return starts


def _has_duplicates(xp: ModuleType, values: Any) -> bool:
    """Whether an integer array holds a value twice (by one sort: NumPy's hash-based unique is slow here)."""
    ordered = xp.sort(values)
    return bool(xp.any(ordered[1:] == ordered[:-1]))


def _strictly_increasing(xp: ModuleType, values: Any) -> bool:
    """Whether every element is larger than the one before (then no value repeats, and a sort is the identity)."""
    return bool(xp.all(values[1:] > values[:-1]))


def _non_decreasing(xp: ModuleType, values: Any) -> bool:
    return bool(xp.all(values[1:] >= values[:-1]))


def _dense_span(values: Any) -> tuple[int, int] | None:
    """The smallest and largest value of a non-empty integer array whose values span few enough integers for a
    dense table (``_DENSE_SPAN_FACTOR``); None otherwise."""
    if values.shape[0] == 0:
        return None
    first, last = int(values.min()), int(values.max())
    return (first, last) if last - first < _DENSE_SPAN_FACTOR * values.shape[0] else None


def _positions_in(xp: ModuleType, keys: Any, first: int, last: int, queries: Any) -> tuple[Any, Any]:
    """Each query's position in ``keys`` (unique integers in ``[first, last]``) read from a dense table of that
    span, and whether the query is one of the keys."""
    table = xp.full(last - first + 1, -1, dtype=xp.int64)
    table[keys - first] = xp.arange(keys.shape[0], dtype=xp.int64)
    inside = (queries >= first) & (queries <= last)
    position = table[xp.where(inside, queries - first, 0)]  # outside the span: any slot, then marked not found
    return position, inside & (position >= 0)


def _unique_with_inverse(xp: ModuleType, values: Any) -> tuple[Any, Any]:
    """``np.unique(values, return_inverse=True)`` of an integer array on either backend: from a dense table of
    the values present when they span few integers (covariate ids 1..J), else by one stable sort."""
    span = _dense_span(values)
    if span is not None:  # one scatter, one count and one gather instead of a sort of every entry
        offset = values - span[0]
        present = xp.zeros(span[1] - span[0] + 1, dtype=bool)
        present[offset] = True
        rank = (xp.cumsum(present) - 1).astype(xp.int64, copy=False)
        return (xp.flatnonzero(present) + span[0]).astype(values.dtype, copy=False), rank[offset]
    order = xp.argsort(values, kind="stable")
    ordered = values[order]
    starts = _run_starts(xp, ordered)
    inverse = xp.empty(values.shape[0], dtype=xp.int64)
    inverse[order] = xp.cumsum(starts) - 1
    return ordered[starts], inverse


def _validated_tables(xp: ModuleType, row_id: Any, stratum_id: Any, time: Any, y: Any, cov_row_id: Any,
                      cov_id: Any, cov_value: Any) -> _Tables:
    """The tables moved to ``xp`` and checked (see :func:`build_from_tables`)."""

    def real(values: Any) -> Any:
        return to_device(xp, values).astype(xp.float64, copy=False)

    tables = _Tables(
        row_id=to_device(xp, row_id), stratum_id=to_device(xp, stratum_id), time=real(time), y=real(y),
        cov_row_id=to_device(xp, cov_row_id), cov_id=to_device(xp, cov_id), cov_value=real(cov_value),
    )
    if tables.row_id.size == 0:
        raise ValueError("outcomes table has no rows")
    for name, values in (("outcomes.time", tables.time), ("outcomes.y", tables.y),
                         ("covariates.covariateValue", tables.cov_value)):
        _require_finite(xp, name, values)
    for name, values in (("outcomes.rowId", tables.row_id), ("outcomes.stratumId", tables.stratum_id),
                         ("covariates.rowId", tables.cov_row_id), ("covariates.covariateId", tables.cov_id)):
        if values.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got dtype {values.dtype}")
    not_positive = int(xp.sum(tables.time <= 0))
    if not_positive:
        raise ValueError(f"outcomes.time must be > 0 (era length in days); {not_positive} rows are not")
    if bool(xp.any(tables.y < 0)) or bool(xp.any(tables.y != xp.round(tables.y))):
        raise ValueError("outcomes.y must hold non-negative integer event counts")
    return tables


def _kept(values: Any, keep: Any, everything: bool) -> Any:
    """``values[keep]``; ``values`` itself when ``keep`` is all True (``everything``)."""
    return values if everything else values[keep]


def _era_positions(xp: ModuleType, tables: _Tables) -> tuple[Any, Any]:
    """The eras' order by (case, rowId), and each covariate entry's era position in that order.

    Two stable sorts: by rowId (which also finds repeated rowIds and looks up the covariates' rows), then
    by case; with unique rowIds this is the one order by (stratumId, rowId)."""
    by_row = xp.argsort(tables.row_id, kind="stable")
    sorted_rows = tables.row_id[by_row]
    if bool(xp.any(sorted_rows[1:] == sorted_rows[:-1])):
        raise ValueError("outcomes.rowId must be unique")
    era_order = by_row[xp.argsort(tables.stratum_id[by_row], kind="stable")]
    first, last = int(sorted_rows[0]), int(sorted_rows[-1])
    if last - first < _DENSE_SPAN_FACTOR * sorted_rows.size:
        # Row ids of a small span (Cyclops numbers them 1..K): a dense table of the rows in era order gives each
        # entry's era directly; the binary search below is most of a host build at the paper's sizes.
        cov_era, found = _positions_in(xp, tables.row_id[era_order], first, last, tables.cov_row_id)
    else:
        era_of_row = xp.empty(era_order.shape[0], dtype=xp.int64)
        era_of_row[era_order] = xp.arange(era_order.shape[0], dtype=xp.int64)  # row (table position) -> era
        position = xp.minimum(xp.searchsorted(sorted_rows, tables.cov_row_id), sorted_rows.size - 1)
        found = sorted_rows[position] == tables.cov_row_id
        cov_era = era_of_row[by_row[position]]
    if not bool(xp.all(found)):
        missing = tables.cov_row_id[~found][:5].tolist()
        raise ValueError(f"covariates.rowId values not present in outcomes.rowId, e.g. {missing}")
    return era_order, cov_era


def build_from_tables(
    row_id: Any,
    stratum_id: Any,
    time: Any,
    y: Any,
    cov_row_id: Any,
    cov_id: Any,
    cov_value: Any,
    xp: ModuleType = np,
) -> BuiltData:
    """Validate the Cyclops interval tables and build :class:`SccsData` with ``xp`` (on its device).

    outcomes: ``rowId`` (unique), ``stratumId`` (the case), ``time`` (era length in days, > 0), ``y``
    (event count, a non-negative integer); covariates: ``rowId`` (must exist in outcomes),
    ``covariateId``, ``covariateValue`` (finite; at most one entry per ``(rowId, covariateId)``). Cases
    without events are dropped and counted; covariates keep their column even when no kept era has them.
    Every step is a sort, a gather or an integer count, so each backend builds the same data.
    """
    tables = _validated_tables(xp, row_id, stratum_id, time, y, cov_row_id, cov_id, cov_value)
    era_order, cov_era = _era_positions(xp, tables)

    # Cases: the sorted strata numbered 0, 1, ...; those without events dropped.
    strata_sorted = tables.stratum_id[era_order]
    case_starts = _run_starts(xp, strata_sorted)
    unique_strata = strata_sorted[case_starts]
    case_of_era = xp.cumsum(case_starts) - 1
    events_per_case = xp.bincount(case_of_era, weights=tables.y[era_order], minlength=unique_strata.size)
    keep_case = events_per_case > 0
    keep_era = keep_case[case_of_era]

    covariate_ids, cov_col = _unique_with_inverse(xp, tables.cov_id)
    pair_key = cov_era.astype(xp.int64) * max(covariate_ids.size, 1) + cov_col
    # Entries listed row by row (sccs_eras writes them so) or column by column (Cyclops', the synthetic tables)
    # have increasing keys in that order: then no pair repeats and the sort that looks for a repeat is skipped.
    listed_in_order = _strictly_increasing(xp, pair_key) or _strictly_increasing(
        xp, cov_col * max(tables.row_id.size, 1) + cov_era)
    if not listed_in_order and _has_duplicates(xp, pair_key):
        raise ValueError("covariates has duplicate (rowId, covariateId) pairs")
    keep_entry = keep_era[cov_era] & (tables.cov_value != 0.0)
    # Usually every case has an event and no value is 0: then nothing is dropped, the renumbering of the kept
    # cases and eras is the identity, and the arrays go on without it and without the masked copies.
    every_era, every_entry = bool(xp.all(keep_era)), bool(xp.all(keep_entry))
    era_case, nz_era = case_of_era, _kept(cov_era, keep_entry, every_entry)
    if not every_era:  # the kept cases and eras numbered 0, 1, ...
        era_case = (xp.cumsum(keep_case) - 1)[case_of_era[keep_era]]
        nz_era = (xp.cumsum(keep_era) - 1)[nz_era]

    data = from_coo(
        era_case=era_case,
        era_length=_kept(tables.time[era_order], keep_era, every_era),
        era_events=_kept(tables.y[era_order], keep_era, every_era),
        nz_era=nz_era,
        nz_col=_kept(cov_col, keep_entry, every_entry),
        nz_value=_kept(tables.cov_value, keep_entry, every_entry),
        n_covariates=int(covariate_ids.size),
        covariate_ids=to_host(covariate_ids).astype(np.int64),
    )
    if data.n_cases == 0:
        raise ValueError("no case has an event (outcomes.y is zero everywhere): nothing to fit")
    return BuiltData(
        data=data,
        case_ids=to_host(unique_strata[keep_case]),
        dropped_cases=int(xp.sum(~keep_case)),
        dropped_eras=int(xp.sum(~keep_era)),
    )


@dataclass(frozen=True)
class IntervalTables:
    """The Cyclops interval tables as plain arrays (``rowId`` numbered from 0)."""

    row_id: np.ndarray
    stratum_id: np.ndarray
    time: np.ndarray
    y: np.ndarray
    cov_row_id: np.ndarray
    cov_id: np.ndarray
    cov_value: np.ndarray


RISK_WINDOW_ANCHORS = ("exposure_start", "exposure_end")


def _index_of_cases(name: str, cases: np.ndarray, sorted_ids: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Position in ``case_id`` of each entry of ``cases`` (every one must have an observation period)."""
    if cases.size == 0:
        return np.zeros(0, dtype=np.int64)
    if sorted_ids.size == 0:
        found = np.zeros(cases.size, dtype=bool)
        position = np.zeros(cases.size, dtype=np.int64)
    elif sorted_ids.dtype.kind in "iu" and cases.dtype.kind in "iu" and (
        int(sorted_ids[-1]) - int(sorted_ids[0]) == sorted_ids.size - 1
    ):  # consecutive ids (unique, so every one present): direct lookup
        offset = cases.astype(np.int64) - int(sorted_ids[0])
        found = (offset >= 0) & (offset < sorted_ids.size)
        position = np.where(found, offset, 0)
    else:
        position = np.minimum(np.searchsorted(sorted_ids, cases), sorted_ids.size - 1)
        found = sorted_ids[position] == cases
    if not np.all(found):
        unknown = np.unique(cases[~found])[:5].tolist()
        raise ValueError(f"{name} has cases without an observation period, e.g. {unknown}")
    return order[position].astype(np.int64)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of an integer array by one sort (faster here than NumPy's hash-based unique)."""
    values = np.sort(values)
    keep = np.ones(values.size, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _segment_sums_u64(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Per segment ``ptr[i]:ptr[i+1]``, the sum of ``values`` modulo 2^64."""
    cumulative = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(values, dtype=np.uint64)])
    return cumulative[ptr[1:]] - cumulative[ptr[:-1]]


def _group_equal_sets(
    piece_case: np.ndarray, set_size: np.ndarray, pair_ptr: np.ndarray, pair_rank: np.ndarray, n_ranks: int,
    n_cases: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Group the pieces by (case, set of drugs): the group of each piece and the first piece of each group.

    A piece's key is a Philox-drawn 64-bit hash of its case plus those of its drugs (modulo 2^64); after
    sorting by key, pieces with equal keys are compared exactly (case, set size, drug by drug), and the
    rare collision is redrawn with another Philox key, so the grouping is exact.
    """
    n_pieces = piece_case.size
    for attempt in range(16):
        drug_words = rng.philox4x32(np, attempt, DRUG_HASH_STREAM, np.arange(n_ranks, dtype=np.int64))
        case_words = rng.philox4x32(np, attempt, CASE_HASH_STREAM, np.arange(n_cases, dtype=np.int64))
        drug_hash = (drug_words[0].astype(np.uint64) << np.uint64(32)) | drug_words[1].astype(np.uint64)
        case_hash = (case_words[0].astype(np.uint64) << np.uint64(32)) | case_words[1].astype(np.uint64)
        key = _segment_sums_u64(drug_hash[pair_rank], pair_ptr) + case_hash[piece_case]
        order = np.argsort(key)
        sorted_key = key[order]
        starts = np.ones(n_pieces, dtype=bool)
        starts[1:] = sorted_key[1:] != sorted_key[:-1]
        # Exact check: each piece equals the previous one of its group (case, size, then drug by drug).
        same = np.flatnonzero(~starts)
        first, second = order[same - 1], order[same]
        if np.any(piece_case[first] != piece_case[second]) or np.any(set_size[first] != set_size[second]):
            continue
        length = set_size[first]
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(length)])
        owner = np.repeat(np.arange(same.size), length)
        within = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][owner]
        if not np.array_equal(pair_rank[pair_ptr[first][owner] + within],
                              pair_rank[pair_ptr[second][owner] + within]):
            continue
        group_of_piece = np.empty(n_pieces, dtype=np.int64)
        group_of_piece[order] = np.cumsum(starts) - 1
        return group_of_piece, np.minimum.reduceat(order, np.flatnonzero(starts))
    raise RuntimeError("could not separate the drug sets by hashing (16 keys collided)")


@dataclass(frozen=True)
class PersonData:
    """Person-level inputs as int64 arrays, events and exposures located by their case's position."""

    case_id: np.ndarray
    obs_start: np.ndarray
    obs_end: np.ndarray
    event_owner: np.ndarray  # position in case_id of each event's case
    event_day: np.ndarray
    exposure_owner: np.ndarray
    exposure_drug: np.ndarray
    exposure_start: np.ndarray
    exposure_end: np.ndarray

    @property
    def n_cases(self) -> int:
        return int(self.case_id.size)


@dataclass(frozen=True)
class RiskWindows:
    """Risk windows clipped to their case's observation period (empty ones dropped), inclusive days."""

    owner: np.ndarray  # case position
    start: np.ndarray
    end: np.ndarray
    rank: np.ndarray  # drug rank: the drug is drug_ids[rank]
    drug_ids: np.ndarray  # sorted distinct drugs of the kept windows


@dataclass(frozen=True)
class _DayKeys:
    """``(case, day)`` as one sortable int64: ``case * span + (day - base)``."""

    base: int
    span: int

    def of(self, case: np.ndarray, day: np.ndarray) -> np.ndarray:
        return case * self.span + (day - self.base)


@dataclass(frozen=True)
class _Pieces:
    """Each case cut into pieces of constant exposure: the cuts (sorted keys) and the pieces between them."""

    keys: _DayKeys
    cut_key: np.ndarray
    cut_case: np.ndarray
    case: np.ndarray  # case position of each piece
    start: np.ndarray  # first day of each piece
    length: np.ndarray  # days
    window_first: np.ndarray  # first piece of each risk window
    window_stop: np.ndarray  # one past its last piece

    @property
    def count(self) -> int:
        return int(self.case.size)


@dataclass(frozen=True)
class _DrugSets:
    """The set of drugs of each piece: ranks ``rank[ptr[p]:ptr[p+1]]`` (increasing), ``size[p]`` of them."""

    rank: np.ndarray
    size: np.ndarray
    ptr: np.ndarray


def _check_ordered(late_name: str, late: np.ndarray, early_name: str, early: np.ndarray, table: str) -> None:
    """late >= early row by row; otherwise the count and the first offending row (data rows counted from 1)."""
    inverted = np.flatnonzero(late < early)
    if inverted.size:
        row = int(inverted[0])
        raise ValueError(f"{late_name} must not precede {early_name}: {inverted.size:,} row(s) of the {table} table, "
                         f"the first row {row + 1} ({late_name} {int(late[row])} < {early_name} {int(early[row])}, "
                         "in days)")


def person_data(
    case_id: np.ndarray, observation_start: np.ndarray, observation_end: np.ndarray, event_case: np.ndarray,
    event_day: np.ndarray, exposure_case: np.ndarray, exposure_drug: np.ndarray, exposure_start: np.ndarray,
    exposure_end: np.ndarray,
) -> PersonData:
    """Check the person-level inputs and locate each event and exposure's case."""
    case_id = np.asarray(case_id)
    obs_start = np.asarray(observation_start, dtype=np.int64)
    obs_end = np.asarray(observation_end, dtype=np.int64)
    if _sorted_unique(case_id).size != case_id.size:
        raise ValueError("case_id must be unique (one observation period per case)")
    _check_ordered("observation_end", obs_end, "observation_start", obs_start, "cases")
    exposure_start = np.asarray(exposure_start, dtype=np.int64)
    exposure_end = np.asarray(exposure_end, dtype=np.int64)
    _check_ordered("exposure_end", exposure_end, "exposure_start", exposure_start, "exposures")
    case_order = np.argsort(case_id, kind="stable")
    sorted_ids = case_id[case_order]
    return PersonData(
        case_id=case_id, obs_start=obs_start, obs_end=obs_end,
        event_owner=_index_of_cases("event_case", np.asarray(event_case), sorted_ids, case_order),
        event_day=np.asarray(event_day, dtype=np.int64),
        exposure_owner=_index_of_cases("exposure_case", np.asarray(exposure_case), sorted_ids, case_order),
        exposure_drug=np.asarray(exposure_drug, dtype=np.int64), exposure_start=exposure_start,
        exposure_end=exposure_end,
    )


def risk_windows(person: PersonData, risk_window_start: int, risk_window_end: int, start_anchor: str,
                  end_anchor: str) -> RiskWindows:
    first_day = person.exposure_start if start_anchor == "exposure_start" else person.exposure_end
    last_day = person.exposure_end if end_anchor == "exposure_end" else person.exposure_start
    owner = person.exposure_owner
    start = np.maximum(first_day + risk_window_start, person.obs_start[owner])
    end = np.minimum(last_day + risk_window_end, person.obs_end[owner])
    keep = start <= end
    drug_ids, rank = np.unique(person.exposure_drug[keep], return_inverse=True)
    return RiskWindows(owner[keep], start[keep], end[keep], rank.astype(np.int64), drug_ids)


def cut_pieces(person: PersonData, windows: RiskWindows, extra_cuts: tuple[np.ndarray, np.ndarray] | None = None,
                ) -> _Pieces:
    """The days where the set of drugs can change (observation start, window starts, the day after window
    ends, the day after observation end) cut each case into pieces; ``extra_cuts`` (case positions, days inside
    their observation periods) adds more cuts, such as the first days of calendar months of the time splines."""
    n_cases = person.n_cases
    base = int(person.obs_start.min())
    span = int(person.obs_end.max()) + 2 - base
    if n_cases * span >= 2**62:
        raise ValueError("observation periods cover too many days for the era builder")
    keys = _DayKeys(base, span)
    cases = np.arange(n_cases, dtype=np.int64)
    n_windows = windows.owner.size
    all_keys = np.concatenate([
        keys.of(cases, person.obs_start), keys.of(cases, person.obs_end + 1), keys.of(windows.owner, windows.start),
        keys.of(windows.owner, windows.end + 1),
        *([] if extra_cuts is None else [keys.of(*extra_cuts)]),
    ])
    # One sort gives the distinct cuts and the rank (cut position) of every key.
    order = np.argsort(all_keys)
    sorted_keys = all_keys[order]
    is_new = np.ones(sorted_keys.size, dtype=bool)
    is_new[1:] = sorted_keys[1:] != sorted_keys[:-1]
    cut_key = sorted_keys[is_new]
    rank = np.empty(sorted_keys.size, dtype=np.int64)
    rank[order] = np.cumsum(is_new) - 1
    cut_case = cut_key // span
    cut_day = cut_key % span + base
    # Piece p starts at every cut but each case's last; p = (cut position) - (case number).
    is_piece = np.zeros(cut_key.size, dtype=bool)
    is_piece[:-1] = cut_case[1:] == cut_case[:-1]
    return _Pieces(
        keys=keys, cut_key=cut_key, cut_case=cut_case, case=cut_case[is_piece], start=cut_day[is_piece],
        length=(cut_day[1:] - cut_day[:-1])[is_piece[:-1]],
        window_first=rank[2 * n_cases:2 * n_cases + n_windows] - windows.owner,
        window_stop=rank[2 * n_cases + n_windows:2 * n_cases + 2 * n_windows] - windows.owner,
    )


def drug_sets(pieces: _Pieces, windows: RiskWindows, n_ranks: int, piece_rank: np.ndarray | None = None,
               ) -> _DrugSets:
    """(piece, drug) pairs: window w covers the pieces [its first piece, its stop piece). ``piece_rank`` adds one
    more rank to every piece (the time-covariate class of :mod:`kernels.sccs.study`, so that pieces merge into
    one era only when their time covariates are equal too)."""
    covered = pieces.window_stop - pieces.window_first
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(covered)])
    owner = np.repeat(np.arange(windows.owner.size), covered)
    pair_piece = pieces.window_first[owner] + np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][owner]
    if pieces.count * n_ranks >= 2**63:
        raise ValueError("too many (era, drug) combinations for the era builder")
    pair_key = pair_piece * n_ranks + windows.rank[owner]
    if piece_rank is not None:
        pair_key = np.concatenate([pair_key, np.arange(pieces.count, dtype=np.int64) * n_ranks + piece_rank])
    pair_key = _sorted_unique(pair_key)  # merges overlapping windows of a drug
    pair_piece, pair_rank = pair_key // n_ranks, pair_key % n_ranks
    set_size = np.bincount(pair_piece, minlength=pieces.count).astype(np.int64)
    return _DrugSets(rank=pair_rank, size=set_size, ptr=np.concatenate([np.zeros(1, dtype=np.int64),
                                                                        np.cumsum(set_size)]))


def events_per_piece(person: PersonData, pieces: _Pieces) -> np.ndarray:
    """Events inside their case's observation period, counted per piece (the others are ignored)."""
    owner, day = person.event_owner, person.event_day
    inside = (day >= person.obs_start[owner]) & (day <= person.obs_end[owner])
    event_key = np.sort(pieces.keys.of(owner[inside], day[inside]))  # sorted queries: only the counts matter
    event_cut = np.searchsorted(pieces.cut_key, event_key, side="right") - 1
    return np.bincount(event_cut - pieces.cut_case[event_cut], minlength=pieces.count)


def era_tables(person: PersonData, pieces: _Pieces, sets: _DrugSets, drug_ids: np.ndarray,
                piece_events: np.ndarray, n_ranks: int) -> IntervalTables:
    """Merge pieces of equal (case, drug set) into eras, numbered by first occurrence."""
    group_of_piece, group_first_piece = _group_equal_sets(pieces.case, sets.size, sets.ptr, sets.rank, n_ranks,
                                                          person.n_cases)
    row_of_group = np.empty(group_first_piece.size, dtype=np.int64)
    row_of_group[np.argsort(group_first_piece)] = np.arange(group_first_piece.size)
    row_of_piece = row_of_group[group_of_piece]
    n_rows = group_first_piece.size
    row_piece = np.sort(group_first_piece)  # the first piece of each row, in row order
    # Integer sums by bincount: exact in float64 below 2^53 days or events.
    row_length = np.rint(np.bincount(row_of_piece, weights=pieces.length, minlength=n_rows)).astype(np.int64)
    row_events = np.rint(np.bincount(row_of_piece, weights=piece_events, minlength=n_rows)).astype(np.int64)

    entry_count = sets.size[row_piece]
    entry_offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(entry_count)])
    entry_row = np.repeat(np.arange(n_rows, dtype=np.int64), entry_count)
    entry_within = np.arange(int(entry_offsets[-1]), dtype=np.int64) - entry_offsets[:-1][entry_row]
    entry_drug = drug_ids[sets.rank[sets.ptr[row_piece][entry_row] + entry_within]].astype(np.int64)
    return IntervalTables(
        row_id=np.arange(n_rows, dtype=np.int64),
        stratum_id=person.case_id[pieces.case[row_piece]].astype(np.int64),
        time=row_length.astype(np.float64),
        y=row_events.astype(np.float64),
        cov_row_id=entry_row,
        cov_id=entry_drug,
        cov_value=np.ones(entry_row.size, dtype=np.float64),
    )


def _empty_tables() -> IntervalTables:
    empty = np.zeros(0, dtype=np.int64)
    return IntervalTables(empty, empty, empty.astype(np.float64), empty.astype(np.float64), empty, empty,
                          empty.astype(np.float64))


def eras_from_person_data(
    case_id: np.ndarray,
    observation_start: np.ndarray,
    observation_end: np.ndarray,
    event_case: np.ndarray,
    event_day: np.ndarray,
    exposure_case: np.ndarray,
    exposure_drug: np.ndarray,
    exposure_start: np.ndarray,
    exposure_end: np.ndarray,
    risk_window_start: int = 0,
    risk_window_end: int = 0,
    end_anchor: str = "exposure_end",
    start_anchor: str = "exposure_start",
) -> IntervalTables:
    """Split each case's observation period into constant-exposure eras and count events per era.

    Days are integers and every interval is inclusive. Exposure ``(drug, start, end)`` puts the case at risk
    of that drug on ``[start_anchor + risk_window_start, end_anchor + risk_window_end]``, each anchor being
    the exposure's ``start`` or ``end`` (as SelfControlledCaseSeries' ``startAnchor``/``endAnchor``; defaults
    exposure start and exposure end). A window that ends before it starts is empty. Risk windows are
    clipped to the observation period; overlapping windows of one drug merge. As in SelfControlledCaseSeries,
    periods with the same set of drugs within a case form ONE era (lengths and events summed; the
    conditional likelihood is unchanged by this), and the era without any drug is the baseline. Events
    outside the observation period are ignored. Cases without events are kept here (the table builder drops
    them and counts them). Rows come case by case (in the order of ``case_id``), within a case in the order
    the drug set first occurs; each row's drugs are listed in increasing id.

    Vectorised: the days where the set can change (observation start, window starts, the day after window
    ends, the day after observation end) cut each case into pieces; a window covers a contiguous run of its
    case's pieces; pieces with equal (case, drug set) merge into one era.
    """
    for name, anchor in (("start_anchor", start_anchor), ("end_anchor", end_anchor)):
        if anchor not in RISK_WINDOW_ANCHORS:
            raise ValueError(f"{name} must be 'exposure_start' or 'exposure_end', not {anchor!r}")
    person = person_data(case_id, observation_start, observation_end, event_case, event_day, exposure_case,
                          exposure_drug, exposure_start, exposure_end)
    if person.n_cases == 0:
        return _empty_tables()
    windows = risk_windows(person, risk_window_start, risk_window_end, start_anchor, end_anchor)
    pieces = cut_pieces(person, windows)
    n_ranks = max(int(windows.drug_ids.size), 1)
    sets = drug_sets(pieces, windows, n_ranks)
    return era_tables(person, pieces, sets, windows.drug_ids, events_per_piece(person, pieces), n_ranks)
