"""Building SCCS data: the Cyclops tables (validation, dropped cases, CSC + case index) and raw → eras."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.sccs import synthetic
from kernels.sccs.data import build_from_tables, eras_from_person_data


def _tables() -> dict[str, np.ndarray]:
    # Case 10: eras 0,1,2 (2 events); case 20: eras 3,4 (no events, dropped); case 30: era 5 (1 event).
    return {
        "row_id": np.array([5, 1, 2, 7, 8, 9]),
        "stratum_id": np.array([10, 10, 10, 20, 20, 30]),
        "time": np.array([10.0, 20.0, 5.0, 3.0, 4.0, 8.0]),
        "y": np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        "cov_row_id": np.array([1, 2, 2, 7, 9]),
        "cov_id": np.array([100, 100, 200, 100, 200]),
        "cov_value": np.array([1.0, 1.0, 2.5, 1.0, 1.0]),
    }


def test_build_orders_eras_by_case_and_row_and_drops_eventless_cases() -> None:
    built = build_from_tables(**_tables())
    data = built.data
    assert built.dropped_cases == 1 and built.dropped_eras == 2
    np.testing.assert_array_equal(built.case_ids, [10, 30])
    # Eras sorted by (case, rowId): rows 1, 2, 5 of case 10, then row 9 of case 30.
    np.testing.assert_array_equal(data.era_case, [0, 0, 0, 1])
    np.testing.assert_array_equal(data.era_length, [20.0, 5.0, 10.0, 8.0])
    np.testing.assert_array_equal(data.era_events, [0.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(data.case_events, [2.0, 1.0])
    np.testing.assert_array_equal(data.covariate_ids, [100, 200])
    dense = np.zeros((4, 2))
    for j in range(2):
        sl = slice(data.col_ptr[j], data.col_ptr[j + 1])
        dense[data.col_rows[sl], j] = data.col_values[sl]
    np.testing.assert_array_equal(dense, [[1, 0], [1, 2.5], [0, 0], [0, 1]])
    assert not data.binary


def test_case_index_matches_the_nonzeros() -> None:
    data = synthetic.generate(np, 400, 12, seed=11).data
    for j in range(data.n_covariates):
        rows = data.col_rows[data.col_ptr[j]:data.col_ptr[j + 1]]
        t0, t1 = data.touched_col_ptr[j], data.touched_col_ptr[j + 1]
        np.testing.assert_array_equal(data.touched_case[t0:t1], np.unique(data.era_case[rows]))
        for t in range(t0, t1):
            seg = slice(data.touched_ptr[t], data.touched_ptr[t + 1])
            assert np.all(data.era_case[data.col_rows[seg]] == data.touched_case[t])
            assert np.all(data.nnz_touched[seg] == t)
    assert data.touched_ptr[-1] == data.nnz


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time", np.array([10.0, 0.0, 5.0, 3.0, 4.0, 8.0]), "time must be > 0"),
        ("y", np.array([1.0, 0.5, 1.0, 0.0, 0.0, 1.0]), "non-negative integer"),
        ("y", np.array([1.0, -1.0, 1.0, 0.0, 0.0, 1.0]), "non-negative integer"),
        ("row_id", np.array([5, 1, 1, 7, 8, 9]), "rowId must be unique"),
        ("cov_row_id", np.array([1, 2, 2, 7, 99]), "not present in outcomes"),
        ("cov_id", np.array([100, 100, 100, 100, 200]), "duplicate"),
        ("cov_value", np.array([1.0, np.nan, 2.5, 1.0, 1.0]), "non-finite"),
        ("stratum_id", np.array([1.5, 10, 10, 20, 20, 30]), "integers"),
    ],
)
def test_build_rejects_bad_tables(field: str, value: np.ndarray, message: str) -> None:
    tables = _tables()
    tables[field] = value
    with pytest.raises(ValueError, match=message):
        build_from_tables(**tables)


def test_build_rejects_data_without_events() -> None:
    tables = _tables()
    tables["y"] = np.zeros(6)
    with pytest.raises(ValueError, match="no case has an event"):
        build_from_tables(**tables)


def _person_data(**window: object):
    return eras_from_person_data(
        case_id=np.array([1, 2, 3]),
        observation_start=np.array([0, 100, 0]),
        observation_end=np.array([99, 130, 9]),
        event_case=np.array([1, 1, 1, 1, 1, 1, 2, 2]),
        event_day=np.array([5, 12, 16, 16, 50, 150, 101, 120]),
        exposure_case=np.array([1, 1, 2]),
        exposure_drug=np.array([7, 8, 7]),
        exposure_start=np.array([10, 15, 90]),
        exposure_end=np.array([19, 29, 105]),
        **window,
    )


def _eras(tables) -> list[tuple[int, int, int, tuple[int, ...]]]:
    drugs: dict[int, list[int]] = {}
    for row, drug in zip(tables.cov_row_id.tolist(), tables.cov_id.tolist(), strict=True):
        drugs.setdefault(row, []).append(drug)
    return [
        (int(s), int(t), int(y), tuple(sorted(drugs.get(int(r), []))))
        for r, s, t, y in zip(tables.row_id, tables.stratum_id, tables.time, tables.y, strict=True)
    ]


def test_raw_to_eras_hand_worked_window_offsets() -> None:
    # Risk windows [start + 1, end + 2]: case 1 drug 7 [11, 21], drug 8 [16, 31]; case 2 drug 7 [91, 107].
    # Case 1 pieces: [0,10] none, [11,15] {7}, [16,21] {7,8}, [22,31] {8}, [32,99] none (merged with [0,10]).
    # Events 5 and 50 -> none; 12 -> {7}; 16, 16 -> {7,8}; 150 is outside the observation period.
    # Case 2: [100,107] {7} with event 101; [108,130] none with event 120. Case 3: one baseline era.
    tables = _person_data(risk_window_start=1, risk_window_end=2)
    assert _eras(tables) == [
        (1, 79, 2, ()), (1, 5, 1, (7,)), (1, 6, 2, (7, 8)), (1, 10, 0, (8,)),
        (2, 8, 1, (7,)), (2, 23, 1, ()),
        (3, 10, 0, ()),
    ]


def test_raw_to_eras_anchor_at_exposure_start() -> None:
    # Windows [start + 0, start + 3]: case 1 drug 7 [10, 13], drug 8 [15, 18]; case 2 drug 7 [90, 93] (outside).
    # Case 1 events: 5, 50 baseline; 12 drug 7; 16, 16 drug 8.
    tables = _person_data(risk_window_start=0, risk_window_end=3, end_anchor="exposure_start")
    assert _eras(tables)[:3] == [(1, 92, 2, ()), (1, 4, 1, (7,)), (1, 4, 2, (8,))]
    assert _eras(tables)[3:] == [(2, 31, 2, ()), (3, 10, 0, ())]


def test_raw_to_eras_feeds_the_builder_and_drops_the_eventless_case() -> None:
    tables = _person_data(risk_window_start=1, risk_window_end=2)
    built = build_from_tables(tables.row_id, tables.stratum_id, tables.time, tables.y, tables.cov_row_id,
                              tables.cov_id, tables.cov_value)
    assert built.dropped_cases == 1 and built.data.n_cases == 2 and built.data.n_eras == 6
    np.testing.assert_array_equal(built.data.covariate_ids, [7, 8])


def test_raw_to_eras_rejects_unknown_cases() -> None:
    with pytest.raises(ValueError, match="without an observation period"):
        eras_from_person_data(np.array([1]), np.array([0]), np.array([9]), np.array([2]), np.array([3]),
                              np.array([], dtype=np.int64), np.array([], dtype=np.int64),
                              np.array([], dtype=np.int64), np.array([], dtype=np.int64))


def test_synthetic_structure() -> None:
    sim = synthetic.generate(np, 4000, 200, seed=3)
    data = sim.data
    eras_per_case = np.bincount(data.era_case)
    assert eras_per_case.min() >= 10 and eras_per_case.max() <= 30
    assert abs(eras_per_case.mean() - 20) < 0.5
    cases_per_drug = np.diff(data.touched_col_ptr) / data.n_cases
    assert 0.3 < cases_per_drug[0] < 0.5  # the most prevalent drug: 45% minus duplicate draws
    assert np.median(cases_per_drug) < 0.01  # most drugs are rare
    assert np.all(data.case_events >= 1) and data.binary
    nonzero_share = np.mean(sim.true_beta != 0)
    assert 0.01 < nonzero_share < 0.12
    again = synthetic.generate(np, 4000, 200, seed=3).data
    np.testing.assert_array_equal(again.era_events, data.era_events)
    np.testing.assert_array_equal(again.col_rows, data.col_rows)
