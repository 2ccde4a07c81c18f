"""``gpuest plot`` against a running embedded stack: list a succeeded job's plots, save one as PNG and SVG."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.client import GpuestClient
from cli.main import app
from cli.serve import EmbeddedStack
from tests.cli.cli_helpers import TINY_PARAMS

runner = CliRunner()


def test_plot_lists_and_saves_png_and_svg(stack: EmbeddedStack, tmp_path: Path) -> None:
    with GpuestClient(stack.base_url) as client:
        job = client.wait(client.submit("crve_montecarlo", TINY_PARAMS)["id"], timeout=120)
    assert job["status"] == "succeeded"
    listed = runner.invoke(app, ["plot", job["id"], "--url", stack.base_url])
    assert listed.exit_code == 0 and listed.stdout.startswith("rejection_rates  Rejection rates")

    png = tmp_path / "rates.png"
    saved = runner.invoke(app, ["plot", job["id"], "rejection_rates", "-o", str(png), "--url", stack.base_url])
    assert saved.exit_code == 0, saved.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    svg = tmp_path / "rates.svg"
    assert (
        runner.invoke(app, ["plot", job["id"], "rejection_rates", "-o", str(svg), "--url", stack.base_url]).exit_code
        == 0
    )
    assert b"rejection rate (%)" in svg.read_bytes()

    unknown = runner.invoke(app, ["plot", job["id"], "forest", "--url", stack.base_url])
    assert unknown.exit_code == 1 and "no plot named 'forest'" in unknown.stderr

    not_an_option = runner.invoke(app, ["plot", job["id"], "rejection_rates", "--option", "mu=0.5", "--url",
                                        stack.base_url])
    assert not_an_option.exit_code == 1 and "has no option 'mu'" in not_an_option.stderr
    malformed = runner.invoke(app, ["plot", job["id"], "rejection_rates", "--option", "mu", "--url", stack.base_url])
    assert malformed.exit_code == 1 and "--option wants NAME=NUMBER, not 'mu'" in malformed.stderr
