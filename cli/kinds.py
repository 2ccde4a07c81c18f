"""The job kinds as users see them: name, parameter model, spec document; the README's table is made here."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from kernels.registry import registry

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class KindRow:
    name: str
    params_path: str  # dotted path of the pydantic parameter model
    spec_doc: str  # repository-relative file documenting the parameters
    dataset_fields: tuple[str, ...]
    summary: str


def spec_doc_for(name: str, params_model: type) -> str:
    """``docs/<kind>.md`` when the kind has a page, else the module defining its parameter model."""
    page = REPO_ROOT / "docs" / f"{name}.md"
    if page.exists():
        return page.relative_to(REPO_ROOT).as_posix()
    source = Path(inspect.getsourcefile(params_model) or "")
    return source.resolve().relative_to(REPO_ROOT).as_posix()


def kind_rows() -> list[KindRow]:
    return [
        KindRow(
            name=kind.name,
            params_path=f"{kind.params_model.__module__}.{kind.params_model.__qualname__}",
            spec_doc=spec_doc_for(kind.name, kind.params_model),
            dataset_fields=tuple(kind.dataset_fields),
            summary=kind.summary,
        )
        for kind in sorted(registry().values(), key=lambda kind: kind.name)
    ]


def markdown_table() -> str:
    lines = [
        "| kind | parameters (spec) | dataset id fields | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for row in kind_rows():
        fields = ", ".join(f"`{field}`" for field in row.dataset_fields) or "—"
        lines.append(
            f"| `{row.name}` | [`{row.params_path}`]({row.spec_doc}) | {fields} | {row.summary.replace('|', '/')} |"
        )
    return "\n".join(lines)
