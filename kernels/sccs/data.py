"""SCCS data on the host or device: eras grouped by case, a CSC design and the per-column case index.

Layout (the paper's section 2.3, in the Cyclops interval format):

* eras ``k = 0..K-1`` sorted by case; ``era_case[k]`` is the case of era ``k``, ``era_length`` its length in
  days (``L``), ``era_events`` its event count (``y``); ``case_events[i] = n_i`` sums them per case.
* the design ``X`` in compressed sparse column form: column ``j`` holds the eras ``col_rows[col_ptr[j]:
  col_ptr[j+1]]`` (increasing, so grouped by case) with values ``col_values[...]``.
* the case index of each column (what lets one thread own one case, so the sparse update of Listing 3
  needs no atomics): column ``j`` touches the cases ``touched_case[touched_col_ptr[j]:touched_col_ptr[j+1]]``,
  and touched case ``t`` owns the nonzeros ``touched_ptr[t]:touched_ptr[t+1]``. ``nnz_touched`` maps each
  nonzero back to its touched-case slot (the host path uses it for ``bincount``).

Everything is built with the array namespace ``xp`` (NumPy or CuPy), so synthetic data of the paper's
largest size can be assembled directly on the GPU. Also here: the table builder for the
Cyclops/SelfControlledCaseSeries ``outcomes``/``covariates`` tables with its validation, and the
conversion of raw person-level data (observation period, events, exposures, risk window) into those tables.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


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
        ptr = np.asarray(_host(self.touched_col_ptr))
        return int(np.max(np.diff(ptr))) if ptr.size > 1 else 0

    def to(self, xp: ModuleType) -> SccsData:
        """The same data with every array moved to ``xp`` (NumPy or CuPy)."""
        convert = _host if xp is np else xp.asarray
        moved = {
            name: convert(getattr(self, name))
            for name in (
                "era_case", "era_length", "era_events", "case_events", "col_ptr", "col_rows", "col_values",
                "touched_col_ptr", "touched_case", "touched_ptr", "nnz_touched",
            )
        }
        return SccsData(**moved, covariate_ids=self.covariate_ids, binary=self.binary)


def _host(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)
    return get() if callable(get) else np.asarray(array)


def _xp_of(array: Any) -> ModuleType:
    if isinstance(array, np.ndarray):
        return np
    import cupy

    return cupy


def repeat_by_counts(xp: ModuleType, values: Any, counts: Any) -> Any:
    """``values[i]`` repeated ``counts[i]`` times (``np.repeat``; CuPy's repeat takes no array of counts)."""
    if xp is np:
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
    one event; each ``(era, column)`` pair may appear once. Arrays may be NumPy or CuPy (not mixed).
    """
    xp = _xp_of(era_case)
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
    order = xp.argsort(nz_col * max(n_eras, 1) + nz_era)
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
    case_ids: np.ndarray  # (N,) the stratumId of each kept case
    dropped_cases: int  # cases without any event (no likelihood contribution)
    dropped_eras: int


def _require_finite(name: str, values: np.ndarray) -> None:
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} has missing or non-finite values")


def build_from_tables(
    row_id: np.ndarray,
    stratum_id: np.ndarray,
    time: np.ndarray,
    y: np.ndarray,
    cov_row_id: np.ndarray,
    cov_id: np.ndarray,
    cov_value: np.ndarray,
) -> BuiltData:
    """Validate the Cyclops interval tables and build :class:`SccsData` on the host.

    outcomes: ``rowId`` (unique), ``stratumId`` (the case), ``time`` (era length in days, > 0), ``y``
    (event count, a non-negative integer); covariates: ``rowId`` (must exist in outcomes),
    ``covariateId``, ``covariateValue`` (finite; at most one entry per ``(rowId, covariateId)``). Cases
    without events are dropped and counted; covariates keep their column even when no kept era has them.
    """
    row_id = np.asarray(row_id)
    stratum_id = np.asarray(stratum_id)
    time = np.asarray(time, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    cov_row_id = np.asarray(cov_row_id)
    cov_id = np.asarray(cov_id)
    cov_value = np.asarray(cov_value, dtype=np.float64)
    if row_id.size == 0:
        raise ValueError("outcomes table has no rows")
    for name, values in (("outcomes.time", time), ("outcomes.y", y), ("covariates.covariateValue", cov_value)):
        _require_finite(name, values)
    for name, values in (("outcomes.rowId", row_id), ("outcomes.stratumId", stratum_id),
                         ("covariates.rowId", cov_row_id), ("covariates.covariateId", cov_id)):
        if values.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got dtype {values.dtype}")
    if np.any(time <= 0):
        raise ValueError(f"outcomes.time must be > 0 (era length in days); {int(np.sum(time <= 0))} rows are not")
    if np.any(y < 0) or np.any(y != np.round(y)):
        raise ValueError("outcomes.y must hold non-negative integer event counts")
    if np.unique(row_id).size != row_id.size:
        raise ValueError("outcomes.rowId must be unique")

    # Eras sorted by (case, rowId); map rowIds to their position.
    era_order = np.lexsort((row_id, stratum_id))
    sorted_rows = row_id[era_order]
    row_lookup = np.argsort(sorted_rows, kind="stable")
    position_of_sorted = np.searchsorted(sorted_rows, cov_row_id, sorter=row_lookup)
    position_of_sorted = np.minimum(position_of_sorted, sorted_rows.size - 1)
    found = sorted_rows[row_lookup[position_of_sorted]] == cov_row_id
    if not np.all(found):
        missing = cov_row_id[~found][:5].tolist()
        raise ValueError(f"covariates.rowId values not present in outcomes.rowId, e.g. {missing}")
    cov_era = row_lookup[position_of_sorted]  # era position (in era_order) of each covariate entry

    strata_sorted = stratum_id[era_order]
    unique_strata, case_of_era = np.unique(strata_sorted, return_inverse=True)
    events_per_case = np.bincount(case_of_era, weights=y[era_order], minlength=unique_strata.size)
    keep_case = events_per_case > 0
    keep_era = keep_case[case_of_era]
    new_case_number = np.cumsum(keep_case) - 1
    new_era_number = np.cumsum(keep_era) - 1

    covariate_ids, cov_col = np.unique(cov_id, return_inverse=True)
    pair_key = cov_era.astype(np.int64) * max(covariate_ids.size, 1) + cov_col
    if np.unique(pair_key).size != pair_key.size:
        raise ValueError("covariates has duplicate (rowId, covariateId) pairs")
    keep_entry = keep_era[cov_era] & (cov_value != 0.0)

    data = from_coo(
        era_case=new_case_number[case_of_era[keep_era]],
        era_length=time[era_order][keep_era],
        era_events=y[era_order][keep_era],
        nz_era=new_era_number[cov_era[keep_entry]],
        nz_col=cov_col[keep_entry],
        nz_value=cov_value[keep_entry],
        n_covariates=covariate_ids.size,
        covariate_ids=covariate_ids.astype(np.int64),
    )
    if data.n_cases == 0:
        raise ValueError("no case has an event (outcomes.y is zero everywhere): nothing to fit")
    return BuiltData(
        data=data,
        case_ids=unique_strata[keep_case],
        dropped_cases=int(np.sum(~keep_case)),
        dropped_eras=int(np.sum(~keep_era)),
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
) -> IntervalTables:
    """Split each case's observation period into constant-exposure eras and count events per era.

    Days are integers and every interval is inclusive. Exposure ``(drug, start, end)`` puts the case at risk
    of that drug on ``[start + risk_window_start, anchor + risk_window_end]`` where ``anchor`` is the
    exposure's ``end`` (``end_anchor="exposure_end"``, SelfControlledCaseSeries' default) or its ``start``.
    Risk windows are clipped to the observation period; overlapping windows of one drug merge. As in
    SelfControlledCaseSeries, periods with the same set of drugs within a case form ONE era (lengths and
    events summed; the conditional likelihood is unchanged by this), and the era without any drug is the
    baseline. Events outside the observation period are ignored. Cases without events are kept here (the
    table builder drops them and counts them).
    """
    if end_anchor not in ("exposure_end", "exposure_start"):
        raise ValueError("end_anchor must be 'exposure_end' or 'exposure_start'")
    case_id = np.asarray(case_id)
    obs_start = np.asarray(observation_start, dtype=np.int64)
    obs_end = np.asarray(observation_end, dtype=np.int64)
    if np.unique(case_id).size != case_id.size:
        raise ValueError("case_id must be unique (one observation period per case)")
    if np.any(obs_end < obs_start):
        raise ValueError("observation_end must not precede observation_start")
    exposure_start = np.asarray(exposure_start, dtype=np.int64)
    exposure_end = np.asarray(exposure_end, dtype=np.int64)
    if np.any(exposure_end < exposure_start):
        raise ValueError("exposure_end must not precede exposure_start")
    event_case = np.asarray(event_case)
    event_day = np.asarray(event_day, dtype=np.int64)
    exposure_case = np.asarray(exposure_case)
    exposure_drug = np.asarray(exposure_drug, dtype=np.int64)
    index_of_case = {int(c): i for i, c in enumerate(case_id.tolist())}
    for name, cases in (("event_case", event_case), ("exposure_case", exposure_case)):
        unknown = [c for c in np.unique(cases).tolist() if int(c) not in index_of_case]
        if unknown:
            raise ValueError(f"{name} has cases without an observation period, e.g. {unknown[:5]}")

    window_start = exposure_start + risk_window_start
    anchor = exposure_end if end_anchor == "exposure_end" else exposure_start
    window_end = anchor + risk_window_end
    events_by_case: dict[int, list[int]] = {}
    for c, d in zip(event_case.tolist(), event_day.tolist(), strict=True):
        events_by_case.setdefault(index_of_case[int(c)], []).append(d)
    windows_by_case: dict[int, list[tuple[int, int, int]]] = {}
    for c, drug, s, e in zip(exposure_case.tolist(), exposure_drug.tolist(), window_start.tolist(),
                             window_end.tolist(), strict=True):
        windows_by_case.setdefault(index_of_case[int(c)], []).append((drug, s, e))

    rows: list[tuple[int, int, int]] = []  # (case, length, events)
    entries: list[tuple[int, int]] = []  # (row, drug)
    for i, cid in enumerate(case_id.tolist()):
        lo, hi = int(obs_start[i]), int(obs_end[i])
        clipped = [(drug, max(s, lo), min(e, hi)) for drug, s, e in windows_by_case.get(i, []) if s <= hi and e >= lo
                   and max(s, lo) <= min(e, hi)]
        # Boundaries where the active set can change: window starts and the day after window ends.
        cuts = sorted({lo, hi + 1} | {s for _, s, _ in clipped} | {e + 1 for _, _, e in clipped})
        events = np.sort(np.asarray(events_by_case.get(i, []), dtype=np.int64))
        eras: dict[tuple[int, ...], list[int]] = {}
        order: list[tuple[int, ...]] = []
        for a, b_next in itertools.pairwise(cuts):
            b = b_next - 1  # piece [a, b]
            active = tuple(sorted({drug for drug, s, e in clipped if s <= a and e >= b}))
            n_events = int(np.searchsorted(events, b, side="right") - np.searchsorted(events, a, side="left"))
            if active not in eras:
                eras[active] = [0, 0]
                order.append(active)
            eras[active][0] += b - a + 1
            eras[active][1] += n_events
        for active in order:
            length, n_events = eras[active]
            row = len(rows)
            rows.append((int(cid), length, n_events))
            entries.extend((row, drug) for drug in active)

    rows_array = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    entries_array = np.asarray(entries, dtype=np.int64).reshape(-1, 2)
    return IntervalTables(
        row_id=np.arange(rows_array.shape[0], dtype=np.int64),
        stratum_id=rows_array[:, 0],
        time=rows_array[:, 1].astype(np.float64),
        y=rows_array[:, 2].astype(np.float64),
        cov_row_id=entries_array[:, 0],
        cov_id=entries_array[:, 1],
        cov_value=np.ones(entries_array.shape[0], dtype=np.float64),
    )
