"""The README's configuration table is the one generated from core.settings.Settings."""

from __future__ import annotations

from pathlib import Path

from core import settings_doc
from core.settings import Settings


def test_the_readme_table_is_the_generated_one() -> None:
    block = settings_doc.readme_block(settings_doc.README.read_text())
    assert block is not None, f"README.md lost its settings table markers; put {settings_doc.START_MARKER!r} and " \
        f"{settings_doc.END_MARKER!r} back and run `{settings_doc.REGENERATE}`"
    assert block == settings_doc.settings_block(), (
        f"README.md's configuration table differs from core/settings.py: run `{settings_doc.REGENERATE}`"
    )


def test_every_field_is_a_row_with_its_variables_default_and_description() -> None:
    rows = settings_doc.settings_table().splitlines()[2:]
    assert len(rows) == len(Settings.model_fields)
    by_variable = {row.split(" | ")[0].removeprefix("| "): row for row in rows}
    assert "`DATABASE_URL` (or `GPUEST_DATABASE_URL`)" in by_variable
    assert "`BROKER_URL` (or `REDIS_URL`, `GPUEST_BROKER_URL`)" in by_variable
    assert by_variable["`GPUEST_QUEUE`"] == "| `GPUEST_QUEUE` | `gpu` | " \
        f"{Settings.model_fields['queue'].description} |"
    assert "| `GPUEST_AUTH_ENABLED` | `true` |" in by_variable["`GPUEST_AUTH_ENABLED`"]
    assert "| `GPUEST_RETENTION_DAYS_BY_OWNER` | `{}` |" in by_variable["`GPUEST_RETENTION_DAYS_BY_OWNER`"]
    assert "| `GPUEST_KEY_SECRET` | unset |" in by_variable["`GPUEST_KEY_SECRET`"]


def test_write_replaces_only_the_marked_block(tmp_path: Path) -> None:
    stale = f"# title\n\n{settings_doc.START_MARKER}\n| old | table |\n{settings_doc.END_MARKER}\n\nafter\n"
    readme = tmp_path / "README.md"
    readme.write_text(stale)
    assert settings_doc.write_readme(readme)
    assert readme.read_text() == f"# title\n\n{settings_doc.settings_block()}\n\nafter\n"
    assert not settings_doc.write_readme(readme)
