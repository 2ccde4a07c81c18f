"""The README stays true to the code: every job kind and every setting is documented, links resolve."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import AliasChoices

from cli.kinds import kind_rows
from core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def kinds_block() -> str:
    match = re.search(r"<!-- kinds:start -->(.*)<!-- kinds:end -->", README, re.S)
    assert match, "README lost its kinds table markers"
    return match.group(1)


def test_every_registered_kind_is_in_the_readme_with_its_parameter_model() -> None:
    rows = {line.split("|")[1].strip(" `"): line for line in kinds_block().strip().splitlines()[2:]}
    for kind in kind_rows():
        assert kind.name in rows, f"README misses kind {kind.name}: paste `gpuest kinds --markdown`"
        assert f"[`{kind.params_path}`]({kind.spec_doc})" in rows[kind.name]
        summary = kind.summary.replace("|", "/")
        assert summary in rows[kind.name], f"README's {kind.name} row: paste `gpuest kinds --markdown`"
    assert set(rows) == {kind.name for kind in kind_rows()}, "README lists kinds the registry does not have"


def test_relative_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not re.match(r"\w+://", target):
            assert (ROOT / target).exists(), f"README links to missing {target}"


def test_every_setting_is_in_the_configuration_table() -> None:
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        env = alias.choices[0] if isinstance(alias, AliasChoices) else f"GPUEST_{name.upper()}"
        assert f"| `{env}`" in README, f"README's configuration table misses {env}"
