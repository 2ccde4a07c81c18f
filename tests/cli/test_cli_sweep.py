"""gpuest sweep and gpuest group (issue 16) against the real embedded stack: a YAML sweep file runs to the
end with --wait, `group ID` shows it, `group ID --results` saves its table (CSV or Parquet), a bad grid exits
1 naming the field, and a file without grid or specs exits 4."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pandas as pd
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.serve import EmbeddedStack
from tests.cli.cli_helpers import TINY_PARAMS

runner = CliRunner()


def gpuest(stack: EmbeddedStack, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, [*args, "--url", stack.base_url])
    return result.exit_code, result.stdout, result.stderr


def sweep_file(path: Path, grid: dict[str, list[object]]) -> Path:
    base = {"kind": "crve_montecarlo", "params": {k: v for k, v in TINY_PARAMS.items() if k != "seed"}}
    path.write_text(yaml.safe_dump({"name": "cli sweep", "base": base, "grid": grid}, sort_keys=False))
    return path


def test_sweep_wait_group_and_results(stack: EmbeddedStack, tmp_path: Path) -> None:
    spec = sweep_file(tmp_path / "sweep.yaml", {"params.seed": [1, 2, 3], "params.replications": [20, 40]})
    code, stdout, stderr = gpuest(stack, "sweep", str(spec), "--wait", "--poll-interval", "0.3")
    assert code == 0, stdout + stderr
    group_id = stdout.splitlines()[0].strip()
    uuid.UUID(group_id)
    assert stdout.splitlines()[-1] == f"{group_id}  succeeded  100%  (6 succeeded)"

    code, stdout, _ = gpuest(stack, "group", group_id)
    group = json.loads(stdout)
    assert code == 0 and group["member_count"] == 6 and group["varying"] == ["params.seed", "params.replications"]

    csv, parquet = tmp_path / "results.csv", tmp_path / "results.parquet"
    assert gpuest(stack, "group", group_id, "--results", str(csv), "--fields", "replications,mean_se")[0] == 0
    assert gpuest(stack, "group", group_id, "--results", str(parquet))[0] == 0
    table = pd.read_csv(csv)
    assert table["replications"].tolist() == table["params.replications"].tolist() == [20, 40] * 3
    assert table["params.seed"].tolist() == [1, 1, 2, 2, 3, 3]
    assert pd.read_parquet(parquet)["mean_se"].tolist() == table["mean_se"].tolist()

    with httpx.Client(base_url=stack.base_url) as http:
        members = [job["id"] for job in http.get("/v1/jobs", params={"group_id": group_id}).json()["items"]]
    assert len(members) == 6
    code, _, stderr = gpuest(stack, "group", group_id, "--delete")
    assert code == 0 and stderr.strip() == f"deleted group {group_id}"
    assert gpuest(stack, "group", group_id)[0] == 1  # gone, with its members
    assert all(gpuest(stack, "status", member)[0] == 1 for member in members)


def test_a_bad_grid_exits_1_naming_the_field_and_a_file_without_a_grid_exits_4(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    code, _, stderr = gpuest(stack, "sweep", str(sweep_file(tmp_path / "bad.yaml", {"params.seed": [1, -1]})))
    assert code == 1 and "members.1.params.seed" in stderr
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"kind": "crve_montecarlo", "params": TINY_PARAMS}))
    code, _, stderr = gpuest(stack, "sweep", str(tmp_path / "job.yaml"))
    assert code == 4 and "'grid', or 'specs'" in stderr
