"""A count of the crve formulas parsed, wherever crve code parses one (the validate-once tests of both edges)."""

from __future__ import annotations

import pytest

import kernels.crve.formula
import kernels.crve.spec
from kernels.crve.formula import ParsedFormula, parse_formula


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The list the formulas parsed from here on are appended to."""
    seen: list[str] = []

    def counting(formula: str) -> ParsedFormula:
        seen.append(str(formula))
        return parse_formula(formula)

    monkeypatch.setattr(kernels.crve.spec, "parse_formula", counting)
    monkeypatch.setattr(kernels.crve.formula, "parse_formula", counting)
    return seen
