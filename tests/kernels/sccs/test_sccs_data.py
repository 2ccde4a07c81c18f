"""Building SCCS data: the Cyclops tables (validation, dropped cases, CSC + case index) and raw → eras."""

from __future__ import annotations

import itertools
from types import ModuleType

import numpy as np
import pytest

from kernels.backend import is_numpy, to_host
from kernels.sccs import data as sccs_data
from kernels.sccs import synthetic
from kernels.sccs.data import IntervalTables, build_from_tables, eras_from_person_data, from_coo
from kernels.sccs.examples import cyclops_frames
from kernels.sccs.tables import load_tables


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
        ("cov_row_id", np.array([1, 2, 2, 7, 3]), "not present in outcomes"),  # inside the rowIds' span
        ("cov_row_id", np.array([0, 2, 2, 7, 9]), "not present in outcomes"),  # below it
        ("cov_id", np.array([100, 100, 100, 100, 200]), "duplicate"),
        ("cov_value", np.array([1.0, np.nan, 2.5, 1.0, 1.0]), "non-finite"),
        ("stratum_id", np.array([1.5, 10, 10, 20, 20, 30]), "integers"),
    ],
)
def test_build_rejects_bad_tables(field: str, value: np.ndarray, message: str, xp: ModuleType) -> None:
    tables = _tables()
    tables[field] = value
    with pytest.raises(ValueError, match=message):
        build_from_tables(**tables, xp=xp)


@pytest.mark.parametrize(("table", "column"), [("outcomes", "time"), ("outcomes", "y"),
                                             ("covariates", "covariateValue")])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_uploaded_real_column_with_a_missing_value_is_refused_by_name(
    table: str, column: str, bad: float, xp: ModuleType
) -> None:
    # The uploaded frames' real columns are checked where the tables are built, on their device (the job's
    # reading of the columns no longer scans them on the host first).
    frames = cyclops_frames(n_cases=60, n_drugs=4, seed=2)
    tables = {"outcomes": frames["outcomes_dataset_id"].copy(), "covariates": frames["covariates_dataset_id"].copy()}
    tables[table].loc[len(tables[table]) // 2, column] = bad
    with pytest.raises(ValueError, match=f"^{table}.{column} has missing or non-finite values$"):
        load_tables(tables["outcomes"], tables["covariates"], xp=xp)


def test_build_rejects_data_without_events(xp: ModuleType) -> None:
    tables = _tables()
    tables["y"] = np.zeros(6)
    with pytest.raises(ValueError, match="no case has an event"):
        build_from_tables(**tables, xp=xp)


_DATA_ARRAYS = ("era_case", "era_length", "era_events", "case_events", "col_ptr", "col_rows", "col_values",
                "touched_col_ptr", "touched_case", "touched_ptr", "nnz_touched")


def test_build_gives_the_same_data_on_every_backend(xp: ModuleType) -> None:
    # Shuffled rows, scattered ids, non-binary values, a zero value and cases without events: the device build
    # (sorts, gathers and integer counts) must equal the host build exactly.
    data = synthetic.generate(np, 500, 12, seed=3).data
    t = synthetic.to_tables(data)
    g = np.random.default_rng(4)
    row_perm, cov_perm = g.permutation(t.row_id.size), g.permutation(t.cov_row_id.size)
    stratum = np.where(t.stratum_id % 7 == 0, 10**9 + t.stratum_id, 3 * t.stratum_id)[row_perm]
    y = t.y[row_perm] * (t.stratum_id[row_perm] % 11 != 0)  # every 11th case without events
    values = np.round(g.uniform(0.5, 2.0, t.cov_value.size), 2)
    values[::97] = 0.0
    tables = {"row_id": 5 * t.row_id[row_perm] + 1, "stratum_id": stratum, "time": t.time[row_perm], "y": y,
              "cov_row_id": 5 * t.cov_row_id[cov_perm] + 1, "cov_id": 1000 - 3 * t.cov_id[cov_perm],
              "cov_value": values[cov_perm]}
    host = build_from_tables(**tables)
    assert host.dropped_cases > 0 and not host.data.binary
    if is_numpy(xp):
        return  # the host build is the reference: the comparison below is the device build's
    built = build_from_tables(**tables, xp=xp)
    assert (built.dropped_cases, built.dropped_eras, built.data.binary) == (host.dropped_cases, host.dropped_eras,
                                                                          host.data.binary)
    np.testing.assert_array_equal(built.case_ids, host.case_ids)
    np.testing.assert_array_equal(built.data.covariate_ids, host.data.covariate_ids)
    for name in _DATA_ARRAYS:
        got, expected = to_host(getattr(built.data, name)), getattr(host.data, name)
        assert got.dtype == expected.dtype, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def _shortcut_tables(entry_order: str, dropped: bool) -> dict[str, np.ndarray]:
    """Synthetic tables (rowIds 0..K-1, covariateIds 1..J: dense spans) with the outcome rows shuffled and the
    covariate entries by column (as written), by row (as sccs_eras writes them) or shuffled."""
    t = synthetic.to_tables(synthetic.generate(np, 600, 15, seed=7).data)
    g = np.random.default_rng(8)
    rows = g.permutation(t.row_id.size)
    y = t.y[rows] * (t.stratum_id[rows] % 9 != 0) if dropped else t.y[rows]
    values = np.where(np.arange(t.cov_value.size) % 50 == 0, 0.0, 1.5) if dropped else t.cov_value
    entries = {"by_column": np.arange(t.cov_row_id.size), "by_row": np.lexsort((t.cov_id, t.cov_row_id)),
               "shuffled": g.permutation(t.cov_row_id.size)}[entry_order]
    return {"row_id": t.row_id[rows], "stratum_id": t.stratum_id[rows], "time": t.time[rows], "y": y,
            "cov_row_id": t.cov_row_id[entries], "cov_id": t.cov_id[entries], "cov_value": values[entries]}


@pytest.mark.parametrize("dropped", [False, True])
@pytest.mark.parametrize("entry_order", ["by_column", "by_row", "shuffled"])
def test_build_shortcuts_give_the_general_paths_data(monkeypatch: pytest.MonkeyPatch, entry_order: str,
                                                     dropped: bool, xp: ModuleType) -> None:
    # The dense-table lookups of rowIds and covariateIds, the skipped duplicate sort and nonzero sort of entries
    # listed in order, the radix sort of entries listed by row and the unmasked arrays when nothing is dropped
    # must build (on either backend) exactly what the binary search and the sorts build on the host.
    tables = _shortcut_tables(entry_order, dropped)
    calls: dict[str, int] = {"_positions_in": 0, "_has_duplicates": 0}
    for name in calls:
        original = getattr(sccs_data, name)

        def counted(*args: object, _name: str = name, _original: object = original) -> object:
            calls[_name] += 1
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(sccs_data, name, counted)
    fast = build_from_tables(**tables, xp=xp)
    assert calls == {"_positions_in": 1, "_has_duplicates": int(entry_order == "shuffled")}
    assert (fast.dropped_cases > 0) == dropped and fast.data.binary != dropped
    monkeypatch.setattr(sccs_data, "_DENSE_SPAN_FACTOR", 0)  # binary search of rowIds, sort of covariateIds
    monkeypatch.setattr(sccs_data, "_strictly_increasing", lambda xp, values: False)  # every sort runs
    monkeypatch.setattr(sccs_data, "_non_decreasing", lambda xp, values: False)  # the comparison sort of entries
    general = build_from_tables(**tables)
    assert calls["_positions_in"] == 1 and calls["_has_duplicates"] == 1 + int(entry_order == "shuffled")
    assert (fast.dropped_cases, fast.dropped_eras, fast.data.binary) == (general.dropped_cases, general.dropped_eras,
                                                                         general.data.binary)
    np.testing.assert_array_equal(fast.case_ids, general.case_ids)
    for name in (*_DATA_ARRAYS, "covariate_ids"):
        got, expected = getattr(fast.data, name), getattr(general.data, name)
        assert got.dtype == expected.dtype and got.flags.c_contiguous, name  # contiguous: the GPU kernels' input
        np.testing.assert_array_equal(to_host(got), expected, err_msg=name)


@pytest.mark.parametrize("span", ["dense", "sparse"])
def test_unique_with_inverse_is_numpys(span: str) -> None:
    values = np.random.default_rng(9).integers(-40, 40, 500) * (1 if span == "dense" else 10**12)
    unique, inverse = sccs_data._unique_with_inverse(np, values)
    expected_unique, expected_inverse = np.unique(values, return_inverse=True)
    assert unique.dtype == values.dtype and inverse.dtype == np.int64
    np.testing.assert_array_equal(unique, expected_unique)
    np.testing.assert_array_equal(inverse, expected_inverse)


def test_design_matrix_is_built_once_and_is_x() -> None:
    built = build_from_tables(**_tables())
    data = built.data
    design = data.design
    assert design is data.design and design.has_canonical_format
    np.testing.assert_array_equal(design.toarray(), [[1, 0], [1, 2.5], [0, 0], [0, 1]])


def person_data(**window: object):
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
    tables = person_data(risk_window_start=1, risk_window_end=2)
    assert _eras(tables) == [
        (1, 79, 2, ()), (1, 5, 1, (7,)), (1, 6, 2, (7, 8)), (1, 10, 0, (8,)),
        (2, 8, 1, (7,)), (2, 23, 1, ()),
        (3, 10, 0, ()),
    ]


def test_raw_to_eras_anchor_at_exposure_start() -> None:
    # Windows [start + 0, start + 3]: case 1 drug 7 [10, 13], drug 8 [15, 18]; case 2 drug 7 [90, 93] (outside).
    # Case 1 events: 5, 50 baseline; 12 drug 7; 16, 16 drug 8.
    tables = person_data(risk_window_start=0, risk_window_end=3, end_anchor="exposure_start")
    assert _eras(tables)[:3] == [(1, 92, 2, ()), (1, 4, 1, (7,)), (1, 4, 2, (8,))]
    assert _eras(tables)[3:] == [(2, 31, 2, ()), (3, 10, 0, ())]


def test_raw_to_eras_anchor_window_start_at_exposure_end() -> None:
    # SCCS' startAnchor = "era end": windows [end + 1, end + 10]: case 1 drug 7 [20, 29], drug 8 [30, 39];
    # case 2 drug 7 [106, 115]. Case 1: [0,19] + [40,99] none (events 5, 12, 16, 16, 50), [20,29] {7},
    # [30,39] {8}; case 2: [100,105] + [116,130] none (events 101, 120), [106,115] {7}; case 3 baseline.
    tables = person_data(risk_window_start=1, risk_window_end=10, start_anchor="exposure_end")
    assert _eras(tables) == [
        (1, 80, 5, ()), (1, 10, 0, (7,)), (1, 10, 0, (8,)),
        (2, 21, 2, ()), (2, 10, 0, (7,)),
        (3, 10, 0, ()),
    ]
    # Both anchors at the exposure start: windows [start - 2, start + 1], drug 7 [8, 11], drug 8 [13, 16]
    # (events 5, 12, 50 baseline, 16, 16 drug 8);
    # case 2's window [88, 91] lies before its observation period.
    tables = person_data(risk_window_start=-2, risk_window_end=1, end_anchor="exposure_start")
    assert _eras(tables) == [
        (1, 92, 3, ()), (1, 4, 0, (7,)), (1, 4, 2, (8,)),
        (2, 31, 2, ()),
        (3, 10, 0, ()),
    ]
    # A window that ends before it starts (start anchored at the end, end at the start) is empty.
    tables = person_data(risk_window_start=1, end_anchor="exposure_start", start_anchor="exposure_end")
    assert _eras(tables) == [(1, 100, 5, ()), (2, 31, 2, ()), (3, 10, 0, ())]
    with pytest.raises(ValueError, match="start_anchor"):
        person_data(start_anchor="era_start")


def _random_person_data(seed: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    n = int(g.integers(1, 60))
    case_id = g.permutation(np.arange(1000, 1000 + 3 * n))[:n]  # unique, unordered, not consecutive
    obs_start = g.integers(-50, 50, n)
    obs_end = obs_start + g.integers(0, 120, n)
    n_events = int(g.integers(0, 4 * n))
    n_exposures = int(g.integers(0, 5 * n))
    exposure_start = g.integers(-80, 200, n_exposures)
    return {
        "case_id": case_id, "observation_start": obs_start, "observation_end": obs_end,
        "event_case": g.choice(case_id, n_events), "event_day": g.integers(-80, 200, n_events),
        "exposure_case": g.choice(case_id, n_exposures), "exposure_drug": g.integers(1, 9, n_exposures) * 11,
        "exposure_start": exposure_start, "exposure_end": exposure_start + g.integers(0, 40, n_exposures),
    }


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_eras_equal_the_per_case_loop(seed: int) -> None:
    inputs = _random_person_data(seed)
    g = np.random.default_rng(100 + seed)
    window = {"risk_window_start": int(g.integers(-10, 10)), "risk_window_end": int(g.integers(-10, 30)),
              "start_anchor": ["exposure_start", "exposure_end"][seed % 2],
              "end_anchor": ["exposure_end", "exposure_start"][(seed // 2) % 2]}
    got = eras_from_person_data(**inputs, **window)
    expected = reference_eras(**inputs, **window)
    assert expected.row_id.size > 0
    for field in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id", "cov_value"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)
        assert getattr(got, field).dtype == getattr(expected, field).dtype, field


def test_vectorised_eras_equal_the_per_case_loop_at_scale() -> None:
    # 3,000 cases with many overlapping exposures of 40 drugs (repeated drug sets within a case).
    g = np.random.default_rng(7)
    n, m = 3000, 20000
    case_id = np.arange(1, n + 1)
    inputs = {
        "case_id": case_id, "observation_start": np.zeros(n, dtype=np.int64),
        "observation_end": g.integers(100, 730, n), "event_case": g.choice(case_id, 2 * n),
        "event_day": g.integers(0, 731, 2 * n), "exposure_case": g.choice(case_id, m),
        "exposure_drug": g.integers(0, 40, m), "exposure_start": (start := g.integers(0, 700, m)),
        "exposure_end": start + g.integers(0, 60, m),
    }
    got = eras_from_person_data(**inputs, risk_window_start=1, risk_window_end=30)
    expected = reference_eras(**inputs, risk_window_start=1, risk_window_end=30)
    for field in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id", "cov_value"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)


@pytest.mark.parametrize("collide", ["drugs", "drugs and cases"])
def test_hash_collisions_are_detected_and_redrawn(monkeypatch: pytest.MonkeyPatch, collide: str) -> None:
    # With the first Philox key every drug (and case) gets the same hash, so pieces with different drug sets of
    # one size (and of different cases) collide: the exact comparison must notice and redraw; the tables
    # stay the loop's.
    from kernels import rng
    from kernels.sccs import data as data_module

    keys: list[int] = []
    philox = rng.philox4x32

    def colliding(xp, seed, stream, index):
        keys.append(seed)
        words = philox(xp, seed, stream, index)
        drug_stream = stream == data_module.DRUG_HASH_STREAM
        return tuple(w * 0 + 1 for w in words) if seed == 0 and (drug_stream or collide != "drugs") else words

    monkeypatch.setattr(data_module.rng, "philox4x32", colliding)
    # The hand-worked case (case 1 has the one-drug sets {7} and {8}).
    assert _eras(person_data(risk_window_start=1, risk_window_end=2)) == [
        (1, 79, 2, ()), (1, 5, 1, (7,)), (1, 6, 2, (7, 8)), (1, 10, 0, (8,)),
        (2, 8, 1, (7,)), (2, 23, 1, ()),
        (3, 10, 0, ()),
    ]
    assert 0 in keys and 1 in keys
    keys.clear()
    inputs = _random_person_data(3)
    got = eras_from_person_data(**inputs, risk_window_end=5)
    expected = reference_eras(**inputs, risk_window_end=5)
    assert 0 in keys and (1 in keys or collide == "drugs")
    for field in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)


def test_raw_to_eras_without_exposures_or_events() -> None:
    tables = eras_from_person_data(np.array([5, 3]), np.array([0, 10]), np.array([9, 10]),
                                   np.array([], dtype=np.int64), np.array([], dtype=np.int64),
                                   np.array([], dtype=np.int64), np.array([], dtype=np.int64),
                                   np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert _eras(tables) == [(5, 10, 0, ()), (3, 1, 0, ())]


def test_raw_to_eras_feeds_the_builder_and_drops_the_eventless_case() -> None:
    tables = person_data(risk_window_start=1, risk_window_end=2)
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
    # The issue: a few drugs at 25-50% of cases, most rare, ~20 eras per case, sparse true effects; at the
    # paper's J = 1,428 drugs.
    sim = synthetic.generate(np, 20_000, 1428, seed=3)
    data = sim.data
    eras_per_case = np.bincount(data.era_case)
    assert eras_per_case.min() >= 10 and eras_per_case.max() <= 30
    assert abs(eras_per_case.mean() - 20) < 0.5
    # Share of cases taking each drug, counted from the design itself (not from the generator's curve).
    share = np.array([np.unique(data.era_case[data.col_rows[data.col_ptr[j]:data.col_ptr[j + 1]]]).size
                      for j in range(data.n_covariates)]) / data.n_cases
    common = np.flatnonzero((share >= 0.25) & (share <= 0.5))
    assert 3 <= common.size <= 5 and {0, 1, 2} <= set(common.tolist())
    assert share.max() <= 0.5 and np.all(share[5:] < 0.25)
    assert np.mean(share < 0.01) > 0.9  # most drugs are rare
    assert 4 < share.sum() < 7  # drugs per case
    assert np.all(data.case_events >= 1) and data.binary
    nonzero_share = np.mean(sim.true_beta != 0)
    assert 0.02 < nonzero_share < 0.08  # sparse effects: 5% of drugs by default
    again = synthetic.generate(np, 20_000, 1428, seed=3).data
    np.testing.assert_array_equal(again.era_events, data.era_events)
    np.testing.assert_array_equal(again.col_rows, data.col_rows)


def reference_eras(case_id, observation_start, observation_end, event_case, event_day, exposure_case,
                   exposure_drug, exposure_start, exposure_end, risk_window_start=0, risk_window_end=0,
                   end_anchor="exposure_end", start_anchor="exposure_start") -> IntervalTables:
    """The former per-case loop (kept here as the reference of the vectorised builder)."""
    obs_start = np.asarray(observation_start, dtype=np.int64)
    obs_end = np.asarray(observation_end, dtype=np.int64)
    index_of_case = {int(c): i for i, c in enumerate(np.asarray(case_id).tolist())}
    first_day = np.asarray(exposure_start if start_anchor == "exposure_start" else exposure_end, dtype=np.int64)
    last_day = np.asarray(exposure_end if end_anchor == "exposure_end" else exposure_start, dtype=np.int64)
    window_start, window_end = first_day + risk_window_start, last_day + risk_window_end
    events_by_case: dict[int, list[int]] = {}
    for c, d in zip(np.asarray(event_case).tolist(), np.asarray(event_day).tolist(), strict=True):
        events_by_case.setdefault(index_of_case[int(c)], []).append(d)
    windows_by_case: dict[int, list[tuple[int, int, int]]] = {}
    for c, drug, s, e in zip(np.asarray(exposure_case).tolist(), np.asarray(exposure_drug).tolist(),
                             window_start.tolist(), window_end.tolist(), strict=True):
        windows_by_case.setdefault(index_of_case[int(c)], []).append((drug, s, e))
    rows: list[tuple[int, int, int]] = []  # (case, length, events)
    entries: list[tuple[int, int]] = []  # (row, drug)
    for i, cid in enumerate(np.asarray(case_id).tolist()):
        lo, hi = int(obs_start[i]), int(obs_end[i])
        clipped = [(drug, max(s, lo), min(e, hi)) for drug, s, e in windows_by_case.get(i, []) if s <= hi and e >= lo
                   and max(s, lo) <= min(e, hi)]
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
        row_id=np.arange(rows_array.shape[0], dtype=np.int64), stratum_id=rows_array[:, 0],
        time=rows_array[:, 1].astype(np.float64), y=rows_array[:, 2].astype(np.float64),
        cov_row_id=entries_array[:, 0], cov_id=entries_array[:, 1],
        cov_value=np.ones(entries_array.shape[0], dtype=np.float64),
    )


@pytest.mark.parametrize("n_covariates", [3, 70_000])  # a radix sort by column, or a sort of (column, era) keys
def test_from_coo_refuses_an_era_column_pair_given_twice(n_covariates: int) -> None:
    """The GPU's coordinate kernels read a case's eras of a column before writing any: a repeated pair would
    lose an update there, so the design refuses it (given out of order: no fast path skips the check)."""
    era_case = np.array([0, 0, 0, 1, 1])
    length, events = np.ones(5), np.array([1.0, 0.0, 0.0, 0.0, 1.0])
    rows, cols = np.array([0, 1, 1, 4]), np.array([1, 0, 0, 0])  # eras in order, columns not: (1, 0) twice
    data = from_coo(era_case, length, events, rows[[0, 1, 3]], cols[[0, 1, 3]], np.ones(3), n_covariates)
    assert data.nnz == 3
    with pytest.raises(ValueError, match="pair of the design may appear once"):
        from_coo(era_case, length, events, rows, cols, np.ones(4), n_covariates)
