"""CLI failures that need no server (issue 16): the spec file of ``gpuest submit`` is read with YAML 1.2's numbers
and one that cannot be used ends the command with its own exit code (4; 2 means "the job failed"), before any
request; ``gpuest db upgrade`` fails in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import EXIT_BAD_SPEC_FILE, app, load_spec


def test_yaml_exponent_floats_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("kind: ks_solve\nparams:\n  tolerance: 1e-4\n  policy_tolerance: 5E-9\n  damping: .3\n"
                    "  n_agents: 20000\n  note: '1e-4'\n  label: 1e\n")
    params = load_spec(path)["params"]
    assert params["tolerance"] == 1e-4 and isinstance(params["tolerance"], float)
    assert params["policy_tolerance"] == 5e-9 and params["damping"] == 0.3
    assert params["n_agents"] == 20000 and isinstance(params["n_agents"], int)
    assert params["note"] == "1e-4" and params["label"] == "1e"  # quoted, or not a number: strings still


def test_yaml_loader_stays_safe(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("kind: !!python/object/apply:os.system ['true']\n")
    result = CliRunner().invoke(app, ["submit", str(path), "--url", "http://127.0.0.1:9"])
    assert result.exit_code == EXIT_BAD_SPEC_FILE == 4
    assert "cannot read" in result.output


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("nope.yaml", None, "cannot read"),
        ("list.yaml", "- 1\n- 2\n", "must hold an object with 'kind' and 'params'"),
        ("broken.json", "{\"kind\": ", "cannot read"),
    ],
)
def test_an_unusable_spec_file_exits_4_before_any_request(tmp_path: Path, name: str, text: str | None,
                                                          says: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    # a URL nothing listens on: the command must stop at the file, not at the connection (exit 1)
    result = CliRunner().invoke(app, ["submit", str(path), "--url", "http://127.0.0.1:9"])
    assert result.exit_code == EXIT_BAD_SPEC_FILE, result.output
    assert says in result.output


def test_db_upgrade_failing_is_one_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 16: the migrate service printed a 40-line traceback box when the database was not up yet
    from core.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://nobody:secret@127.0.0.1:9/none")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["db", "upgrade", "--wait", "1.5"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot migrate the database at postgresql+psycopg://")
    assert "secret" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("seconds", "text"), [(None, ""), (12.3, "about 12 s left"), (0.2, "about 1 s left"),
                                               (600, "about 10 min left"), (7200, "about 2.0 h left")])
def test_the_progress_bar_shows_the_apis_eta(seconds: float | None, text: str) -> None:
    from cli.main import eta_text

    assert eta_text(seconds) == text


def test_eta_is_the_average_rate_so_far_for_running_jobs_only() -> None:
    from datetime import UTC, datetime, timedelta

    from api.schemas import eta_seconds
    from store.models import Job

    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    job = Job(status="running", progress=0.25, started_at=now - timedelta(seconds=30))
    assert eta_seconds(job, now) == 90.0  # 30 s for a quarter: 90 s for the rest
    assert eta_seconds(Job(status="running", progress=0.01, started_at=now), now) is None  # start-up only
    assert eta_seconds(Job(status="queued", progress=0.5, started_at=None), now) is None
    assert eta_seconds(Job(status="succeeded", progress=1.0, started_at=now), now) is None
