"""From a data frame and a Wilkinson formula to the arrays of the bootstrap (pandas + formulaic; job side only).

``"y ~ x1 + x2"`` has an intercept, ``"y ~ x1 + x2 - 1"`` none, ``"y ~ x1 + x2 | fe"`` absorbs the one-way
fixed effect ``fe`` (the intercept then goes into it), as in pyfixest and fixest.

With an absorbed fixed effect the design is built *with* the intercept, so that formulaic encodes
categorical terms such as ``C(region)`` with reduced-rank (treatment) contrasts, one reference level
dropped; then the Intercept column is removed, being spanned by the fixed effect's dummies. Built without
the intercept, ``C(region)`` would get a column for every level, whose sum is the constant: collinear with
the fixed effect once demeaned (pyfixest drops the reference level the same way).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pandas as pd
from formulaic import Formula, model_matrix
from formulaic.utils.variables import Variable

INTERCEPT = "Intercept"  # formulaic's name of the intercept column
# Terminal control sequences (ECMA-48 CSI: ESC [ parameters intermediates final): formulaic colours the
# offending token of a parse error with them (ESC[1;31m ... ESC[0m), which must never reach a JSON message.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def plain_message(error: BaseException | str) -> str:
    """An error's text for a user: terminal escape codes removed and the lines joined into one."""
    text = _ANSI_ESCAPE.sub("", str(error)).replace("\x1b", "")
    return " ".join(text.split())


@dataclass(frozen=True)
class ParsedFormula:
    """A formula split at '|': the model part, the absorbed fixed effect, and the names the model part needs."""

    main: str
    fe_name: str | None
    variables: list[str]  # data columns the model part reads
    functions: list[str]  # names it calls that formulaic does not know (a column cannot be called either)


def parse_formula(formula: str) -> ParsedFormula:
    """Parse without data; raise ValueError starting "formula:" (plain text) when it cannot be parsed."""
    if "~" not in formula:
        raise ValueError(f"formula: {formula!r} has no '~' (expected e.g. 'y ~ x1 + x2')")
    main, _, absorbed = formula.partition("|")
    fe_name = absorbed.strip() or None
    if fe_name is not None and ("+" in fe_name or "^" in fe_name):
        raise ValueError(f"formula: only one absorbed fixed effect is supported, got {fe_name!r}")
    try:
        required = Formula(main).required_variables
    except Exception as error:  # formulaic's parse errors
        raise ValueError(f"formula: cannot parse {main!r}: {plain_message(error)}") from None
    variables = sorted(str(name) for name in required if Variable.Role.CALLABLE not in getattr(name, "roles", ()))
    functions = sorted(str(name) for name in required if Variable.Role.CALLABLE in getattr(name, "roles", ()))
    return ParsedFormula(main=main, fe_name=fe_name, variables=variables, functions=functions)


def column_problems(
    formula: str, cluster: str, bootcluster: str | None, columns: Collection[str]
) -> list[tuple[str, str]]:
    """What a dataset with these ``columns`` lacks for the job, as (params field, message) pairs: the parse
    error, names in the formula (its fixed effect included) and the cluster columns. Empty when it fits.
    Needs only the column names, so the API checks it at submission against a dataset's stored schema."""
    try:
        parsed = parse_formula(formula)
    except ValueError as error:
        return [("formula", str(error).removeprefix("formula: "))]
    problems = []
    absent = [name for name in parsed.variables if name not in columns]
    if parsed.fe_name is not None and parsed.fe_name not in columns:
        absent.append(parsed.fe_name)
    if absent:
        problems.append(("formula", f"columns {absent} are not in the dataset"))
    unknown = [name for name in parsed.functions if name not in columns]
    if unknown:
        problems.append(("formula", f"{unknown} are neither functions formulaic knows nor columns of the dataset"))
    for field, column in (("cluster", cluster), ("bootcluster", bootcluster)):
        if column is not None and column not in columns:
            problems.append((field, f"column {column!r} is not in the dataset"))
    return problems


@dataclass
class DesignArrays:
    x: np.ndarray
    y: np.ndarray
    names: list[str]
    cluster: np.ndarray
    n_clusters: int
    bootcluster: np.ndarray | None
    n_boot_clusters: int | None
    fe: np.ndarray | None
    n_fe: int | None
    fe_name: str | None


def _codes(frame: pd.DataFrame, column: str, role: str) -> tuple[np.ndarray, int]:
    if column not in frame.columns:
        raise ValueError(f"{role}: column {column!r} is not in the dataset (columns: {list(frame.columns)})")
    values = frame[column]
    if values.isna().any():
        raise ValueError(f"{role}: column {column!r} has {int(values.isna().sum())} missing values")
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype(np.int64), len(uniques)


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
    frame: pd.DataFrame, formula: str, cluster: str, bootcluster: str | None = None
) -> DesignArrays:
    """Parse ``formula`` on ``frame``; raise ValueError naming the column or parameter at fault."""
    parsed = parse_formula(formula)
    main, fe_name = parsed.main, parsed.fe_name
    missing = [name for name in parsed.variables if name not in frame.columns]
    if missing:
        raise ValueError(f"formula: columns {missing} are not in the dataset (columns: {list(frame.columns)})")
    unknown = [name for name in parsed.functions if name not in frame.columns]
    if unknown:
        raise ValueError(f"formula: {unknown} are neither functions formulaic knows nor columns of the dataset")
    _check_finite(frame, parsed.variables)
    if fe_name is not None:
        main = main + " + 1"  # reduced-rank contrasts; the Intercept column is dropped below
    try:
        matrices = model_matrix(main, frame, na_action="raise")
    except Exception as error:
        raise ValueError(f"formula: cannot build the design of {formula!r}: {plain_message(error)}") from None
    if not hasattr(matrices, "lhs") or matrices.lhs.shape[1] != 1:
        raise ValueError(f"formula: {formula!r} needs exactly one dependent variable left of '~'")
    x_frame = matrices.rhs
    if fe_name is not None:
        x_frame = x_frame.drop(columns=[INTERCEPT])  # spanned by the fixed effect
    if x_frame.shape[1] == 0:
        raise ValueError(f"formula: {formula!r} has no regressors")
    x = np.ascontiguousarray(x_frame.to_numpy(dtype=np.float64))
    y = np.ascontiguousarray(matrices.lhs.to_numpy(dtype=np.float64)[:, 0])
    cluster_codes, n_clusters = _codes(frame, cluster, "cluster")
    boot_codes = n_boot = None
    if bootcluster is not None and bootcluster != cluster:
        boot_codes, n_boot = _codes(frame, bootcluster, "bootcluster")
    fe_codes = n_fe = None
    if fe_name is not None:
        fe_codes, n_fe = _codes(frame, fe_name, "formula fixed effect")
    return DesignArrays(
        x=x,
        y=y,
        names=[str(name) for name in x_frame.columns],
        cluster=cluster_codes,
        n_clusters=n_clusters,
        bootcluster=boot_codes,
        n_boot_clusters=n_boot,
        fe=fe_codes,
        n_fe=n_fe,
        fe_name=fe_name,
    )
