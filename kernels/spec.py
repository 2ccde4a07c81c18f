"""Base model for job parameters: strict types, unknown fields refused, every size bounded."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Hashable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo

Settings = TypeVar("Settings")
Parsed = TypeVar("Parsed")

# The key of a validation context's memo (``validate_python(..., context={PARSE_MEMO: {}})``): validators
# that parse text (a formula) keep each distinct text's parse there, so the members of a job group that share
# a formula cost one parse between them.
PARSE_MEMO = "parse_memo"


def memoized_parse(info: ValidationInfo, key: Hashable, parse: Callable[[], Parsed]) -> Parsed:
    """``parse()``, or what it gave for ``key`` earlier under the same validation context's memo (its
    ValueError included: a bad text shared by many members is parsed once too). Without a memo, ``parse()``."""
    memo = info.context.get(PARSE_MEMO) if isinstance(info.context, Mapping) else None
    if not isinstance(memo, dict):
        return parse()
    if key not in memo:
        try:
            memo[key] = (True, parse())
        except ValueError as error:
            memo[key] = (False, str(error))
    succeeded, value = memo[key]
    if not succeeded:
        raise ValueError(value)
    return value


class JobParams(BaseModel):
    """Parameters of one job kind. Subclasses bound every size parameter with ``Field(ge=..., le=...)``.

    Choices are ``Literal`` strings (they validate from JSON under strict mode); lists, not tuples.
    """

    # allow_inf_nan=False: JSON bodies may carry NaN, Infinity or 1e400 (Python's parser reads them as
    # floats); no parameter means anything with them.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    def dataset_column_problems(self, columns: Mapping[str, Collection[str]]) -> list[tuple[str, str]]:
        """(params field, message) for each column these params name that their datasets lack. ``columns``:
        dataset field -> the stored dataset's column names (the API checks at submission). A kind whose params
        name columns overrides this; by default there is nothing to check."""
        return []


class ResultPart(BaseModel):
    """A record nested inside a result (a coefficient row, a state report): strict, and without the
    ``device`` / ``timings`` that only the top-level :class:`ResultModel` carries."""

    model_config = ConfigDict(extra="forbid")


class ResultModel(BaseModel):
    """A job's result object. Runners return an instance of their kind's subclass and leave ``device`` and
    ``timings`` alone: :func:`kernels.context.run_kind` stamps both, once, for every kind."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field("", description='"cpu" or the GPU\'s name, e.g. "NVIDIA H100 80GB HBM3"')
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds per stage of the run (after device synchronisation), and total"
    )


def settings_from(
    settings_type: type[Settings], params: BaseModel, *sections: str, prefix: str = "", exclude: Collection[str] = (),
    **settings: Any,
) -> Settings:
    """A kernel's settings dataclass made from a job's validated params by name: each field named like a params
    field (``prefix`` + its name, e.g. "policy_" for a policy step's settings), or like a field of one of the
    nested ``sections`` (e.g. "acceleration"), takes that field's value, so a setting added to both needs no
    code; ``exclude``: fields whose params namesakes mean something else; ``settings``: the rest (what the params
    hold under another name, or what the run derives), over those. Other fields keep their defaults."""
    names = {item.name for item in dataclasses.fields(settings_type)} - set(exclude)  # type: ignore[arg-type]
    dumped = params.model_dump()
    values = {name: dumped[prefix + name] for name in names if prefix + name in dumped}
    for section in sections:
        values.update({name: value for name, value in dumped[section].items() if name in names})
    return settings_type(**{**values, **settings})
