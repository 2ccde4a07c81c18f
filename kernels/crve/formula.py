"""From a data frame and a Wilkinson formula to the arrays of the bootstrap (pandas + formulaic; job side only).

``"y ~ x1 + x2"`` has an intercept, ``"y ~ x1 + x2 - 1"`` none, ``"y ~ x1 + x2 | fe"`` absorbs the
fixed effect ``fe`` (the intercept then goes into it), ``"y ~ x | firm + year"`` two (up to
``MAX_FIXED_EFFECTS``), and ``firm^year`` the interaction of two columns as one fixed effect, as in pyfixest
and fixest.

With absorbed fixed effects the design is built *with* the intercept, so that formulaic encodes
categorical terms such as ``C(region)`` with reduced-rank (treatment) contrasts, one reference level
dropped; then the Intercept column is removed, being spanned by the fixed effect's dummies. Built without
the intercept, ``C(region)`` would get a column for every level, whose sum is the constant: collinear with
the fixed effect once demeaned (pyfixest drops the reference level the same way).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from formulaic import Formula, model_matrix
from formulaic.parser import DefaultFormulaParser
from formulaic.parser.types import ASTNode, Token
from formulaic.utils.variables import Variable

INTERCEPT = "Intercept"  # formulaic's name of the intercept column
# Terminal control sequences (ECMA-48 CSI: ESC [ parameters intermediates final): formulaic colours the
# offending token of a parse error with them (ESC[1;31m ... ESC[0m), which must never reach a JSON message.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def plain_message(error: BaseException | str) -> str:
    """An error's text for a user: terminal escape codes removed and the lines joined into one."""
    text = _ANSI_ESCAPE.sub("", str(error)).replace("\x1b", "")
    return " ".join(text.split())


MAX_FIXED_EFFECTS = 4
# formulaic expands products of sums into every interaction (a*b*c: 7 terms; n factors: 2^n - 1) and a power
# (a+b)**k by forming all 2^k products: the bounds below are checked on the formula's syntax tree, whose
# size is linear in the text, before formulaic expands anything.
MAX_INTERACTION_FACTORS = 10
MAX_FORMULA_TERMS = 2000
MAX_EXPANSION_PRODUCTS = 100_000
_SATURATED = 10**12  # every count saturates here: the bounds are far below, and no integer grows huge


@dataclass(frozen=True)
class Expansion:
    """Upper bounds on what formulaic makes of a subtree: its terms, the factors of its largest term and the
    term products formed on the way."""

    terms: int
    factors: int
    products: int


def _capped(value: int) -> int:
    return min(value, _SATURATED)


def _power_exponent(node: Any) -> int:
    """The integer right of ``**``; 1 where it is none (formulaic then refuses the formula itself)."""
    if isinstance(node, Token) and node.kind is Token.Kind.VALUE:
        try:
            value = ast.literal_eval(node.token)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return 1
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return _capped(value)
    return 1


def _power(base: Expansion, exponent: int, operand_products: int) -> Expansion:
    n = base.terms
    enumerated = 1 if n <= 1 else _SATURATED if exponent * math.log(n) > math.log(_SATURATED) else n**exponent
    distinct, choose = 0, 1  # distinct products: at most sum over j <= exponent of C(n, j)
    for j in range(1, min(n, exponent) + 1):
        choose = choose * (n - j + 1) // j
        distinct = _capped(distinct + choose)
        if distinct >= _SATURATED:
            break
    return Expansion(
        terms=max(min(distinct, enumerated), 1),
        factors=_capped(base.factors * min(exponent, max(n, 1))),
        products=_capped(operand_products + enumerated * exponent),
    )


def _combine(symbol: str, arity: int, args: list[Expansion], raw_args: list[Any]) -> Expansion:
    products = _capped(sum(arg.products for arg in args))
    if not args:  # "." (the unused columns): one term per column, refused without data anyway
        return Expansion(1, 1, products)
    if arity == 1:
        return Expansion(0 if symbol == "-" else args[0].terms, args[0].factors, products)
    left, right = args[0], args[-1]
    if symbol in ("~", "|", "+"):
        return Expansion(_capped(left.terms + right.terms), max(left.factors, right.factors), products)
    if symbol == "-":
        return Expansion(left.terms, left.factors, products)
    if symbol in ("**", "^"):
        return _power(left, _power_exponent(raw_args[-1]), products)
    if symbol in ("/", "in"):
        parents, nested = (left, right) if symbol == "/" else (right, left)
        factors = _capped(parents.terms * parents.factors + nested.factors)
        return Expansion(_capped(parents.terms + nested.terms), factors, _capped(products + nested.terms))
    # ":" (every product of a left and a right term), "*" (those and both sides' terms) and, conservatively,
    # any other operator.
    crossed = _capped(left.terms * right.terms)
    terms = crossed if symbol == ":" else _capped(left.terms + right.terms + crossed)
    return Expansion(terms, _capped(left.factors + right.factors), _capped(products + crossed))


def _expansion(tree: Any) -> Expansion:
    """Bounds of a whole syntax tree, evaluated without recursion (parentheses may nest thousands deep)."""
    done: dict[int, Expansion] = {}
    stack: list[tuple[Any, bool]] = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if not isinstance(node, ASTNode):
            done[id(node)] = Expansion(1, 1, 0)
        elif not expanded:
            stack.append((node, True))
            stack.extend((arg, False) for arg in node.args)
        else:
            args = list(node.args)
            bounds = [done[id(arg)] for arg in args]
            done[id(node)] = _combine(node.operator.symbol, node.operator.arity, bounds, args)
    return done[id(tree)]


def expansion_bounds(text: str) -> Expansion | None:
    """Upper bounds on formulaic's expansion of ``text`` (a formula or a right-hand side), from its syntax tree;
    None where formulaic cannot even read it into one (its parse then fails with formulaic's own message)."""
    try:
        tree = DefaultFormulaParser().get_ast(text)
    except Exception:
        return None
    return None if tree is None else _expansion(tree)


def expansion_problem(text: str) -> str | None:
    """Why formulaic must not expand ``text``, as a phrase ("has ...", "would ..."), or None."""
    bounds = expansion_bounds(text)
    if bounds is None:
        return None
    if bounds.factors > MAX_INTERACTION_FACTORS:
        return f"has an interaction of more than {MAX_INTERACTION_FACTORS} factors (at most {MAX_INTERACTION_FACTORS})"
    if bounds.terms > MAX_FORMULA_TERMS:
        return f"would expand to more than {MAX_FORMULA_TERMS:,} terms (at most {MAX_FORMULA_TERMS:,})"
    if bounds.products > MAX_EXPANSION_PRODUCTS:
        return f"would form more than {MAX_EXPANSION_PRODUCTS:,} term products (at most {MAX_EXPANSION_PRODUCTS:,})"
    return None


@dataclass(frozen=True)
class ParsedFormula:
    """A formula split at '|': the model part, the absorbed fixed effects, and the names the model part needs."""

    text: str  # the formula as written
    main: str
    fe_names: list[str]  # each a column or "a^b" (the interaction of columns a and b)
    variables: list[str]  # data columns the model part reads
    functions: list[str]  # names it calls that formulaic does not know (a column cannot be called either)
    terms: list[str]  # the model part's term names, "Intercept" for the constant (coefficient names of plain terms)
    iv: IvPart | None = None

    @property
    def fe_columns(self) -> list[str]:
        """The data columns the fixed effects read."""
        return [column for name in self.fe_names for column in name.split("^")]


def parse_formula(formula: str) -> ParsedFormula:
    """Parse without data; raise ValueError starting "formula:" (plain text) when it cannot be parsed."""
    if "~" not in formula:
        raise ValueError(f"formula: {formula!r} has no '~' (expected e.g. 'y ~ x1 + x2')")
    parts = formula.split("|")
    iv = None
    if len(parts) > 1 and "~" in parts[-1]:  # "y ~ exog | endog ~ instruments" or "y ~ exog | fe | endog ~ ..."
        iv = _iv_part(parts.pop())
    if len(parts) > 2:
        raise ValueError(f"formula: {formula!r} has too many '|' (y ~ x | fixed effects | endogenous ~ instruments)")
    main, absorbed = parts[0], parts[1] if len(parts) > 1 else ""
    fe_names = _fixed_effect_names(absorbed)
    problem = expansion_problem(main)
    if problem is not None:
        raise ValueError(f"formula: {main.strip()[:200]!r} {problem}")
    try:
        parsed = Formula(main)
        required = parsed.required_variables
    except Exception as error:  # formulaic's parse errors
        raise ValueError(f"formula: cannot parse {main!r}: {plain_message(error)}") from None
    variables = sorted(str(name) for name in required if Variable.Role.CALLABLE not in getattr(name, "roles", ()))
    functions = sorted(str(name) for name in required if Variable.Role.CALLABLE in getattr(name, "roles", ()))
    terms = [INTERCEPT if str(term) == "1" else str(term) for term in getattr(parsed, "rhs", [])]
    if iv is not None:
        variables = sorted({*variables, iv.endogenous, *iv.instrument_variables})
        terms = [*terms, iv.endogenous]
    return ParsedFormula(text=formula, main=main, fe_names=fe_names, variables=variables, functions=functions,
                         terms=terms, iv=iv)


class FormulaText(str):
    """A formula's text that carries its parse: what the params' validator makes of a formula it has parsed, so
    the later validators, the API's column check and the run read that one parse (``BootstrapParams.parsed_formula``).
    A plain ``str`` everywhere else (JSON, equality, hashing)."""

    parsed: ParsedFormula

    @classmethod
    def of(cls, parsed: ParsedFormula) -> FormulaText:
        text = cls(parsed.text)
        text.parsed = parsed
        return text


def parse_of(formula: str | ParsedFormula) -> ParsedFormula:
    """The parse of ``formula``: the one it carries (a :class:`ParsedFormula`, a :class:`FormulaText`), or
    :func:`parse_formula`'s of plain text."""
    if isinstance(formula, ParsedFormula):
        return formula
    if isinstance(formula, FormulaText):
        return formula.parsed
    return parse_formula(formula)


@dataclass(frozen=True)
class IvPart:
    """The "endogenous ~ instruments" part of an IV formula (one endogenous regressor)."""

    endogenous: str
    instruments: str  # a formulaic right-hand side
    instrument_variables: list[str]


def _iv_part(text: str) -> IvPart:
    left, _, right = text.partition("~")
    endogenous = left.strip()
    if not re.fullmatch(r"[A-Za-z_][\w.]*", endogenous):
        raise ValueError(
            f"formula: the IV part {text.strip()!r} needs one endogenous column left of '~' (one endogenous "
            "regressor is supported)"
        )
    problem = expansion_problem(right)
    if problem is not None:
        raise ValueError(f"formula: the instrument part {right.strip()[:200]!r} {problem}")
    try:
        required = Formula(right + " - 1").required_variables
    except Exception as error:
        raise ValueError(f"formula: cannot parse the instruments {right.strip()!r}: {plain_message(error)}") from None
    variables = sorted(str(name) for name in required if Variable.Role.CALLABLE not in getattr(name, "roles", ()))
    if not variables:
        raise ValueError(f"formula: the IV part {text.strip()!r} names no instrument (under-identified)")
    if endogenous in variables:
        raise ValueError(f"formula: {endogenous!r} cannot instrument itself")
    return IvPart(endogenous=endogenous, instruments=right.strip(), instrument_variables=variables)


def _fixed_effect_names(absorbed: str) -> list[str]:
    if not absorbed.strip():
        return []
    names = [" ^ ".join(part.strip() for part in name.split("^")).replace(" ^ ", "^") for name in absorbed.split("+")]
    for name in names:
        parts = name.split("^")
        if any(not part or not re.fullmatch(r"[^\s()+*:~|]+", part) for part in parts) or len(parts) > 2:
            raise ValueError(
                f"formula: fixed effect {name!r} must be a column or the interaction 'a^b' of two columns"
            )
    if len(set(names)) < len(names):
        raise ValueError(f"formula: a fixed effect is named twice in {names}")
    if len(names) > MAX_FIXED_EFFECTS:
        raise ValueError(f"formula: at most {MAX_FIXED_EFFECTS} absorbed fixed effects, got {len(names)}")
    return names


def column_problems(
    formula: str | ParsedFormula, named_columns: dict[str, list[str]], columns: Collection[str]
) -> list[tuple[str, str]]:
    """What a dataset with these ``columns`` lacks for the job, as (params field, message) pairs: the parse
    error, names in the formula (its fixed effects included) and the columns other fields name
    (``named_columns``: field -> columns, e.g. {"cluster": ["firm", "year"]}). Empty when it fits.
    Needs only the column names, so the API checks it at submission against a dataset's stored schema."""
    try:
        parse = parse_of(formula)
    except ValueError as error:
        return [("formula", str(error).removeprefix("formula: "))]
    problems = []
    absent = [name for name in [*parse.variables, *parse.fe_columns] if name not in columns]
    if absent:
        problems.append(("formula", f"columns {absent} are not in the dataset"))
    unknown = [name for name in parse.functions if name not in columns]
    if unknown:
        problems.append(("formula", f"{unknown} are neither functions formulaic knows nor columns of the dataset"))
    for field, names in named_columns.items():
        missing = [column for column in names if column not in columns]
        if missing:
            listed = ", ".join(map(repr, missing))
            message = f"columns {listed} are not" if len(missing) > 1 else f"column {listed} is not"
            problems.append((field, f"{message} in the dataset"))
    return problems


@dataclass
class Codes:
    """A categorical column as integer codes in [0, count), with its name."""

    name: str
    codes: np.ndarray
    count: int


@dataclass
class DesignArrays:
    x: np.ndarray
    y: np.ndarray
    names: list[str]
    clusters: list[Codes]  # the variance clusters (one per dimension); empty: heteroskedasticity-robust
    bootcluster: Codes | None  # None: the bootstrap clusters are chosen from the variance clusters
    fixed_effects: list[Codes]
    weights: np.ndarray | None
    endogenous: np.ndarray | None = None  # IV: the endogenous regressor (its name is the last of ``names``)
    instruments: np.ndarray | None = None  # IV: the excluded instruments (N, l2)
    instrument_names: list[str] | None = None
    endogenous_name: str | None = None


def _codes(frame: pd.DataFrame, name: str, role: str) -> Codes:
    """Codes of a column, or of the interaction "a^b" of two."""
    columns = name.split("^")
    for column in columns:
        if column not in frame.columns:
            raise ValueError(f"{role}: column {column!r} is not in the dataset (columns: {list(frame.columns)})")
        missing = int(frame[column].isna().sum())
        if missing:
            raise ValueError(f"{role}: column {column!r} has {missing} missing values")
    if len(columns) == 1:
        codes, uniques = pd.factorize(frame[columns[0]], sort=True)
        return Codes(name, codes.astype(np.int64), len(uniques))
    first, _ = pd.factorize(frame[columns[0]], sort=True)
    second, second_levels = pd.factorize(frame[columns[1]], sort=True)
    codes, uniques = pd.factorize(first.astype(np.int64) * len(second_levels) + second, sort=True)
    return Codes(name, codes.astype(np.int64), len(uniques))


def _weights(frame: pd.DataFrame, column: str) -> np.ndarray:
    if column not in frame.columns:
        raise ValueError(f"weights: column {column!r} is not in the dataset (columns: {list(frame.columns)})")
    values = frame[column]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise ValueError(f"weights: column {column!r} is not numeric")
    weights = values.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(weights)
    if bad.any():
        raise ValueError(f"weights: column {column!r} has {int(bad.sum())} missing, NaN or infinite values")
    negative = weights < 0
    if negative.any():
        raise ValueError(f"weights: column {column!r} has {int(negative.sum())} negative values")
    return np.ascontiguousarray(weights)


def _check_finite(frame: pd.DataFrame, columns: list[str]) -> None:
    for column in columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            as_float = values.to_numpy(dtype=np.float64, na_value=np.nan)
            bad = ~np.isfinite(as_float)
            if bad.any():
                raise ValueError(f"formula: column {column!r} has {int(bad.sum())} NaN or infinite values")
        elif values.isna().any():
            raise ValueError(f"formula: column {column!r} has {int(values.isna().sum())} missing values")


def design_from_formula(
    frame: pd.DataFrame,
    formula: str | ParsedFormula,
    cluster: list[str],
    bootcluster: str | None = None,
    weights: str | None = None,
) -> DesignArrays:
    """The design of ``formula`` (text, parsed here, or its parse) on ``frame``; raise ValueError naming the
    column or parameter at fault.

    ``cluster``: the variance cluster columns (empty: heteroskedasticity-robust)."""
    parse = parse_of(formula)
    formula = parse.text
    main = parse.main
    missing = [name for name in parse.variables if name not in frame.columns]
    if missing:
        raise ValueError(f"formula: columns {missing} are not in the dataset (columns: {list(frame.columns)})")
    unknown = [name for name in parse.functions if name not in frame.columns]
    if unknown:
        raise ValueError(f"formula: {unknown} are neither functions formulaic knows nor columns of the dataset")
    _check_finite(frame, parse.variables)
    if parse.fe_names:
        main = main + " + 1"  # reduced-rank contrasts; the Intercept column is dropped below
    try:
        matrices = model_matrix(main, frame, na_action="raise")
    except Exception as error:
        raise ValueError(f"formula: cannot build the design of {formula!r}: {plain_message(error)}") from None
    if not hasattr(matrices, "lhs") or matrices.lhs.shape[1] != 1:
        raise ValueError(f"formula: {formula!r} needs exactly one dependent variable left of '~'")
    x_frame = matrices.rhs
    if parse.fe_names:
        x_frame = x_frame.drop(columns=[INTERCEPT])  # spanned by the fixed effects
    if x_frame.shape[1] == 0:
        raise ValueError(f"formula: {formula!r} has no regressors")
    boot = None if bootcluster is None else _codes(frame, bootcluster, "bootcluster")
    endogenous = instruments = instrument_names = None
    if parse.iv is not None:
        endogenous, instruments, instrument_names = _iv_arrays(frame, parse.iv, x_frame.columns)
    return DesignArrays(
        x=np.ascontiguousarray(x_frame.to_numpy(dtype=np.float64)),
        y=np.ascontiguousarray(matrices.lhs.to_numpy(dtype=np.float64)[:, 0]),
        names=[str(name) for name in x_frame.columns],
        clusters=[_codes(frame, name, "cluster") for name in cluster],
        bootcluster=boot,
        fixed_effects=[_codes(frame, name, "formula fixed effect") for name in parse.fe_names],
        weights=None if weights is None else _weights(frame, weights),
        endogenous=endogenous,
        instruments=instruments,
        instrument_names=instrument_names,
        endogenous_name=None if parse.iv is None else parse.iv.endogenous,
    )


def _iv_arrays(frame: pd.DataFrame, iv: IvPart, exogenous: Any) -> tuple[np.ndarray, np.ndarray, list[str]]:
    values = frame[iv.endogenous]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise ValueError(f"formula: the endogenous column {iv.endogenous!r} is not numeric")
    if iv.endogenous in exogenous:
        raise ValueError(f"formula: {iv.endogenous!r} is both exogenous and endogenous")
    try:
        matrix = model_matrix(iv.instruments + " - 1", frame, na_action="raise")
    except Exception as error:
        raise ValueError(f"formula: cannot build the instruments {iv.instruments!r}: {plain_message(error)}") from None
    names = [str(name) for name in matrix.columns]
    return (np.ascontiguousarray(values.to_numpy(dtype=np.float64)),
            np.ascontiguousarray(matrix.to_numpy(dtype=np.float64)), names)  # fmt: skip
