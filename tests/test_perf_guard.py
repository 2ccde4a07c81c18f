"""The performance guard (bench/perf_guard.py): its verdicts, exit status, table, baselines file and registry.

Fast and NumPy only: the workloads are fakes with fixed seconds except two small real ones run with --quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import perf_guard
from bench.perf_guard import Measured, Workload

DEVICE = "cpu"  # what device_label gives on NumPy: the name fake baselines are kept under

# Every headline workload the guard must time (the list), as rows of the registry.
HEADLINES = {
    "crve_wcb_10m_no_ci",
    "crve_wcb_10m_ci",
    "crve_wcb_twofe_10m_no_ci",
    "crve_wcb_iv_1m",
    "crve_mc_50k",
    "sccs_map_largest_laplace",
    "sccs_study_cv_bootstrap_splines",
    "sccs_first_fit_fresh_first_job",
    "ks_panel_10m_x_1000",
    "ks_staged_solve_500x50",
    "ks_default_job",
    "dualcontrol_optimal_256_job",
}


def fake(name: str, seconds: dict[str, float]) -> Workload:
    return Workload(name, tuple(seconds), "a fake", lambda setup: Measured(dict(seconds)))


def failing(name: str) -> Workload:
    def measure(setup: perf_guard.Setup) -> Measured:
        raise RuntimeError("the kernel broke")

    return Workload(name, (f"{name}_row",), "fails", measure)


def baselines_file(tmp_path: Path, rows: dict[str, float], device: str = DEVICE) -> Path:
    path = tmp_path / "baselines.json"
    entries = {name: {"seconds": s, "commit": "abc1234", "date": "2026-12-07"} for name, s in rows.items()}
    path.write_text(json.dumps({"devices": {device: entries}}))
    return path


def run(tmp_path: Path, workloads: list[Workload], baselines: Path, *extra: str) -> int:
    argv = ["--device", "cpu", "--baselines", str(baselines), "--workdir", str(tmp_path / "work"), *extra]
    return perf_guard.main(argv, workloads)


@pytest.mark.parametrize(
    ("now", "expected"),
    [(1.0, "ok"), (1.149, "ok"), (1.151, "SLOWER"), (0.86, "ok"), (0.84, "faster"), (None, "skipped")],
)
def test_verdict_at_the_15_percent_threshold(now: float | None, expected: str) -> None:
    assert perf_guard.verdict(1.0, now, 0.15) == expected


def test_a_row_without_a_baseline_is_printed_not_failed() -> None:
    (row,) = perf_guard.compare(["a"], {"a": 2.0}, {}, {}, 0.15)
    assert (row.baseline, row.now, row.ratio, row.verdict, row.failed) == (None, 2.0, None, "no baseline", False)


def test_ratio_is_now_over_baseline() -> None:
    (row,) = perf_guard.compare(["a"], {"a": 0.3}, {}, {"a": 0.2}, 0.15)
    assert row.ratio == pytest.approx(1.5)
    assert row.failed


def test_exit_status_1_on_a_slower_row_and_0_within_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    workloads = [fake("w", {"fast_row": 1.10, "slow_row": 1.20})]
    assert run(tmp_path, workloads, baselines_file(tmp_path, {"fast_row": 1.0, "slow_row": 1.0})) == 1
    out = capsys.readouterr().out
    assert "SLOWER" in out and "FAIL: 1 slower" in out
    assert run(tmp_path, workloads, baselines_file(tmp_path, {"fast_row": 1.0, "slow_row": 1.1})) == 0
    assert "PASS: 0 slower, 0 failed, 2 rows" in capsys.readouterr().out


def test_another_devices_baseline_is_ignored(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    baselines = baselines_file(tmp_path, {"row": 0.1}, device="NVIDIA H200")
    assert run(tmp_path, [fake("w", {"row": 5.0})], baselines) == 0
    assert "no baseline" in capsys.readouterr().out


def test_a_failing_workload_fails_the_guard_and_the_others_still_run(tmp_path: Path) -> None:
    json_path = tmp_path / "guard.json"
    status = run(
        tmp_path, [failing("broken"), fake("w", {"row": 1.0})], tmp_path / "none.json", "--json", str(json_path)
    )
    assert status == 1
    rows = {row["name"]: row for row in json.loads(json_path.read_text())["rows"]}
    assert rows["broken_row"]["verdict"] == "error: RuntimeError"
    assert rows["row"]["now"] == 1.0


def test_budget_skips_the_rest_without_failing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run(tmp_path, [fake("a", {"a": 1.0}), fake("b", {"b": 1.0})], tmp_path / "none.json", "--budget", "-1") == 0
    assert capsys.readouterr().out.count("skipped: budget") == 4  # the progress line and the table's, per row


def test_table_format() -> None:
    rows = perf_guard.compare(["crve_mc_50k", "x"], {"crve_mc_50k": 0.0552}, {"x": "skipped: needs a GPU"},
                              {"crve_mc_50k": 0.048}, 0.15)  # fmt: skip
    lines = perf_guard.format_table(rows, "NVIDIA H200", 0.15).splitlines()
    assert lines[0] == "performance guard on NVIDIA H200, tolerance 15%"
    assert lines[1].split() == ["workload", "baseline", "s", "now", "s", "ratio", "verdict"]
    assert lines[2].split() == ["crve_mc_50k", "0.048", "0.0552", "1.15", "ok"]
    assert lines[3].split() == ["x", "-", "-", "-", "skipped:", "needs", "a", "GPU"]
    assert lines[4] == "PASS: 0 slower, 0 failed, 2 rows"


def test_write_baselines_keeps_other_devices_and_rows(tmp_path: Path) -> None:
    path = baselines_file(tmp_path, {"kept": 2.0, "row": 9.0})
    document = json.loads(path.read_text())
    document["devices"]["NVIDIA H200"] = {"row": {"seconds": 0.5, "commit": "old", "date": "2026-12-01"}}
    path.write_text(json.dumps(document))
    assert run(tmp_path, [fake("w", {"row": 1.25})], path, "--write-baselines", str(path), "--commit", "f00d") == 0
    written = json.loads(path.read_text())["devices"]
    assert written[DEVICE]["row"] == {"seconds": 1.25, "commit": "f00d", "date": written[DEVICE]["row"]["date"]}
    assert written[DEVICE]["kept"]["seconds"] == 2.0
    assert written["NVIDIA H200"]["row"]["commit"] == "old"


def test_write_baselines_needs_a_commit_and_a_full_run(tmp_path: Path) -> None:
    for extra in (["--write-baselines", "b.json"], ["--write-baselines", "b.json", "--commit", "x", "--quick"]):
        with pytest.raises(SystemExit) as stopped:
            run(tmp_path, [fake("w", {"row": 1.0})], tmp_path / "none.json", *extra)
        assert stopped.value.code == 2


def test_only_selects_by_row_or_workload_and_refuses_unknown_names() -> None:
    workloads = [fake("a", {"a1": 1.0, "a2": 1.0}), fake("b", {"b1": 1.0})]
    assert [w.name for w in perf_guard.select(workloads, ["a2"])] == ["a"]
    assert [w.name for w in perf_guard.select(workloads, ["b"])] == ["b"]
    with pytest.raises(ValueError, match="unknown workloads"):
        perf_guard.select(workloads, ["c"])


def test_every_headline_workload_is_registered_once() -> None:
    rows = [row for workload in perf_guard.WORKLOADS for row in workload.rows]
    assert len(rows) == len(set(rows))
    assert set(rows) >= HEADLINES


def test_the_baselines_file_in_the_repository_is_valid() -> None:
    assert perf_guard.DEFAULT_BASELINES.exists()
    document = perf_guard.load_baselines(perf_guard.DEFAULT_BASELINES)
    rows = {row for workload in perf_guard.WORKLOADS for row in workload.rows}
    for device, entries in document["devices"].items():
        assert device.startswith("NVIDIA "), device
        assert set(entries) <= rows, sorted(set(entries) - rows)
        for name, entry in entries.items():
            assert set(entry) == {"seconds", "commit", "date"}, name
            assert 0.0 < entry["seconds"] < 600.0 and entry["commit"] and entry["date"][:2] == "20", (name, entry)


def test_quick_run_of_two_real_workloads_on_numpy(tmp_path: Path) -> None:
    json_path = tmp_path / "guard.json"
    status = run(tmp_path, list(perf_guard.WORKLOADS), tmp_path / "none.json", "--quick", "--json", str(json_path),
                 "--only", "crve_oneway", "sccs_map_largest")  # fmt: skip
    assert status == 0
    report = json.loads(json_path.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert set(rows) == {"crve_wcb_10m_no_ci", "crve_wcb_10m_ci", "sccs_map_largest_laplace"}
    assert all(row["now"] > 0 and row["verdict"] == "quick: not compared" for row in rows.values())
    assert 0.0 <= report["details"]["crve_oneway"]["p_value"] <= 1.0
    assert report["details"]["sccs_map_largest"]["converged"] is True
    assert report["quick"] and report["device"] == DEVICE and np.isfinite(report["tolerance"])


def test_first_fit_records_are_read_from_each_process_and_a_failure_is_recorded() -> None:
    from bench import sccs_first_fit

    script = 'import sys; print(\'RESULT {"step": "warm_up", "seconds": 1.5}\'); print(\'other\'); sys.exit(3)'
    command = [sys.executable, "-c", script, "measure", "--label", "empty"]
    records = sccs_first_fit.result_records(command, dict(os.environ), check=False)
    assert records == [{"step": "warm_up", "seconds": 1.5}, {"step": "measure", "cache": "empty", "failed": 3}]
    with pytest.raises(subprocess.CalledProcessError):
        sccs_first_fit.result_records(command, dict(os.environ), check=True)
