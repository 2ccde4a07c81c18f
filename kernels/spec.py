"""Base model for job parameters: strict types, unknown fields refused, every size bounded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class JobParams(BaseModel):
    """Parameters of one job kind. Subclasses bound every size parameter with ``Field(ge=..., le=...)``.

    Choices are ``Literal`` strings (they validate from JSON under strict mode); lists, not tuples.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ResultModel(BaseModel):
    """A job's result object; runners return ``model_dump(mode="json")`` of a subclass."""

    model_config = ConfigDict(extra="forbid")
