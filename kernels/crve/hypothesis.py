"""Linear restrictions R beta = r written as text: ``"x1 - x2 = 0"``, ``"x1 + 2*x2 = 1"``, ``"2*(x1 - x2) = 0.5"``.

A restriction is one equation between two linear expressions in the coefficients: names of coefficients
(as the coefficient table spells them, e.g. ``x1``, ``Intercept``, ``C(region)[T.b]``), numbers, ``+ - * /``
and parentheses; a product needs a number on one side, a quotient a number below. Several restrictions
(a list) are tested jointly; they must be linearly independent.

Parsing: each coefficient name is replaced by a placeholder wherever it stands as a whole token (longest names
first, so ``x10`` is not read as ``x1`` followed by ``0``), then Python's ``ast`` parses the equation and a
small evaluator turns each side into (coefficient vector, constant). Anything else (an unknown name, a
product of two coefficients, a call) is refused with a message naming it.

Depends on no other CRVE module (see docs/crve.md).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_PLACEHOLDER = "__coef{}__"
_PLACEHOLDER_NAME = re.compile(r"__coef(\d+)__")
# Characters that continue a name: a coefficient name matches only where none of them touches it.
_NAME_CHARS = r"\w.\]"
_NUMBER = re.compile(r"(?<![\w.])(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?(?![\w.])")


@dataclass(frozen=True)
class Restrictions:
    """q restrictions R beta = r on k coefficients."""

    texts: tuple[str, ...]
    matrix: np.ndarray  # R, (q, k)
    rhs: np.ndarray  # r, (q,)

    @property
    def count(self) -> int:
        return int(self.matrix.shape[0])


# Compiled once per name: a formula may have up to 2,000 terms and a family 200 restrictions, far past the
# 512 patterns ``re`` keeps, which would otherwise be compiled again for every restriction.
@functools.lru_cache(maxsize=8192)
def _name_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![{_NAME_CHARS}]){re.escape(name)}(?![{_NAME_CHARS}(\[])")


@functools.lru_cache(maxsize=8192)
def _level_pattern(term: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![{_NAME_CHARS}]){re.escape(term)}\[[^\]]*\]")


def _with_placeholders(text: str, names: Sequence[str]) -> str:
    order = sorted(range(len(names)), key=lambda index: -len(names[index]))
    for index in order:
        if names[index] in text:
            text = _name_pattern(names[index]).sub(_PLACEHOLDER.format(index), text)
    return text


class _Linear:
    """A linear form: coefficients (k,) and a constant."""

    def __init__(self, coefficients: np.ndarray, constant: float) -> None:
        self.coefficients, self.constant = coefficients, constant

    @property
    def is_constant(self) -> bool:
        return not self.coefficients.any()


def _evaluate(node: ast.AST, k: int, text: str) -> _Linear:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return _Linear(np.zeros(k), float(node.value))
    if isinstance(node, ast.Name):
        match = _PLACEHOLDER_NAME.fullmatch(node.id)
        if match is None:
            raise ValueError(f"{text!r}: {node.id!r} is not a coefficient of the model")
        coefficients = np.zeros(k)
        coefficients[int(match.group(1))] = 1.0
        return _Linear(coefficients, 0.0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _evaluate(node.operand, k, text)
        sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
        return _Linear(sign * inner.coefficients, sign * inner.constant)
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, k, text), _evaluate(node.right, k, text)
        if isinstance(node.op, ast.Add | ast.Sub):
            sign = 1.0 if isinstance(node.op, ast.Add) else -1.0
            return _Linear(left.coefficients + sign * right.coefficients, left.constant + sign * right.constant)
        if isinstance(node.op, ast.Mult):
            if not (left.is_constant or right.is_constant):
                raise ValueError(f"{text!r}: a product of two coefficients is not linear")
            number, form = (left, right) if left.is_constant else (right, left)
            return _Linear(number.constant * form.coefficients, number.constant * form.constant)
        if isinstance(node.op, ast.Div):
            if not right.is_constant:
                raise ValueError(f"{text!r}: only division by a number is linear")
            if right.constant == 0.0:
                raise ValueError(f"{text!r}: division by zero")
            return _Linear(left.coefficients / right.constant, left.constant / right.constant)
    raise ValueError(f"{text!r}: only coefficients, numbers, + - * / and parentheses may appear")


def parse_restriction(text: str, names: Sequence[str]) -> tuple[np.ndarray, float]:
    """One restriction as (row of R, r); ValueError (naming the text) when it is not a linear equation."""
    if text.count("=") != 1 or "==" in text:
        raise ValueError(f"{text!r}: a restriction is one equation with a single '=' (e.g. 'x1 - x2 = 0')")
    left_text, right_text = _with_placeholders(text, names).split("=")
    sides = []
    for side_text in (left_text, right_text):
        if not side_text.strip():
            raise ValueError(f"{text!r}: both sides of '=' are needed")
        unknown = _unknown_names(side_text)
        if unknown:
            raise ValueError(f"{text!r}: {unknown[0]!r} is not a coefficient of the model")
        try:
            tree = ast.parse(side_text.strip(), mode="eval")
        except SyntaxError:
            raise ValueError(f"{text!r}: cannot parse {_restore(side_text, names).strip()!r}") from None
        sides.append(_evaluate(tree.body, len(names), text))
    left, right = sides
    row = left.coefficients - right.coefficients
    if not row.any():
        raise ValueError(f"{text!r} restricts no coefficient")
    return row, right.constant - left.constant


def _unknown_names(side: str) -> list[str]:
    """What is left of a side once coefficients, numbers and operators are taken out: unknown names."""
    side = _NUMBER.sub(" ", _PLACEHOLDER_NAME.sub(" ", side))
    tokens = (token.strip("()") for token in re.split(r"[\s+\-*/]+", side))
    return [token for token in tokens if token and not (token.endswith("(") or token.isdigit())]


def _restore(text: str, names: Sequence[str]) -> str:
    return _PLACEHOLDER_NAME.sub(lambda match: names[int(match.group(1))], text)


def parse_restrictions(texts: Sequence[str], names: Sequence[str]) -> Restrictions:
    """Stack the restrictions; refuse linearly dependent ones (a rank-deficient R)."""
    rows, values = zip(*(parse_restriction(text, names) for text in texts), strict=True)
    matrix = np.vstack(rows)
    if np.linalg.matrix_rank(matrix) < matrix.shape[0]:
        raise ValueError(f"the restrictions {list(texts)} are linearly dependent (R has rank below {len(texts)})")
    return Restrictions(texts=tuple(texts), matrix=matrix, rhs=np.asarray(values, dtype=np.float64))


def submission_problems(texts: Sequence[str], terms: Sequence[str]) -> list[str]:
    """What shows without data: each equation's syntax and linearity, names that are not coefficients, and
    dependent restrictions. ``terms``: the formula's term names (``Intercept`` for the constant); a term may
    also stand for its categorical levels, written ``term[...]`` as the coefficient table spells them."""
    names = list(terms)
    for text in texts:
        for term in terms:
            if term not in text:
                continue
            for match in _level_pattern(term).finditer(text):
                if match.group(0) not in names:
                    names.append(match.group(0))
    problems = []
    for text in texts:
        try:
            parse_restriction(text, names)
        except ValueError as error:
            problems.append(str(error))
    if not problems and len(texts) > 1:
        try:
            parse_restrictions(texts, names)
        except ValueError as error:
            problems.append(str(error))
    return problems
