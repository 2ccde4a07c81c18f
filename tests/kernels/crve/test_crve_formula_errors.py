"""Formula errors at run time: plain text naming the field (never formulaic's terminal escape codes), and the
submission-time column check agreeing with what the runner refuses (issue 14, "Bad input")."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from formulaic import Formula
from hypothesis import given, reject, seed, settings
from hypothesis import strategies as st

from kernels.context import RunContext, run_kind
from kernels.crve.formula import (
    MAX_FORMULA_TERMS,
    column_problems,
    design_from_formula,
    expansion_bounds,
    expansion_problem,
    parse_formula,
    plain_message,
)
from kernels.progress import LocalProgress
from kernels.registry import get_kind

FRAME = pd.DataFrame(
    {"y": np.arange(12.0), "x1": np.arange(12.0) ** 1.5, "x2": np.arange(12.0) % 5, "g": np.arange(12) % 3}
)


def test_plain_message_strips_escape_codes_and_joins_lines() -> None:
    coloured = "Operator `+` is misplaced.\n\ny ~ x1 \u29db\x1b[1;31m+\x1b[0m\u29da"
    assert plain_message(coloured) == "Operator `+` is misplaced. y ~ x1 \u29db+\u29da"
    assert plain_message(ValueError("a\x1b[0;32;1mb\x1b[K c")) == "ab c"


@pytest.mark.parametrize("formula", ["y ~ x1 +", "y ~ x1 + (x2", "y ~ log(x1", "y ~ x1 **", "y ~ C(x1"])
def test_parse_errors_are_plain_and_name_the_formula(formula: str) -> None:
    with pytest.raises(ValueError, match=r"^formula: cannot parse") as raised:
        parse_formula(formula)
    assert "\x1b" not in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ValueError) as from_design:
        design_from_formula(FRAME, formula, ["g"])
    assert str(from_design.value) == str(raised.value)


def test_design_errors_from_formulaic_are_plain() -> None:
    # bs() is a transform formulaic knows, so its argument is not a required variable: the build fails instead.
    with pytest.raises(ValueError, match=r"^formula: cannot build the design") as raised:
        design_from_formula(FRAME, "y ~ bs(x7, df=3)", ["g"])
    assert "\x1b" not in str(raised.value) and "x7" in str(raised.value)


def test_unknown_functions_are_not_called_missing_columns() -> None:
    with pytest.raises(ValueError, match=r"\['foo'\] are neither functions formulaic knows nor columns"):
        design_from_formula(FRAME, "y ~ foo(x1)", ["g"])
    assert parse_formula("y ~ np.log(x1) + C(g) + center(x2)").functions == []


@pytest.mark.parametrize(
    ("formula", "cluster", "bootcluster", "fields"),
    [
        ("y ~ x1 + x2", "g", None, []),
        ("y ~ x1 | g", "g", "g", []),
        ("y ~ x1 + x9", "g", None, ["formula"]),
        ("y ~ x1 | fe", "g", None, ["formula"]),
        ("y ~ x1", "county", None, ["cluster"]),
        ("y ~ x1", "g", "state", ["bootcluster"]),
        ("y ~ x1 +", "county", None, ["formula"]),  # an unparseable formula stops the check
    ],
)
def test_column_check_agrees_with_the_runner(formula: str, cluster: str, bootcluster: str | None,
                                             fields: list[str]) -> None:
    named = {"cluster": [cluster]} | ({} if bootcluster is None else {"bootcluster": [bootcluster]})
    problems = column_problems(formula, named, list(FRAME.columns))
    assert [field for field, _ in problems] == fields
    if fields:  # what submission refuses, the runner refuses too, naming the same field first
        with pytest.raises(ValueError, match=rf"^{fields[0]}"):
            design_from_formula(FRAME, formula, [cluster], bootcluster)
    else:
        design_from_formula(FRAME, formula, [cluster], bootcluster)


def test_a_job_on_synthetic_data_fails_with_a_message_naming_the_field() -> None:
    """Synthetic data has no stored schema: the job fails when it runs, its message naming the field."""
    kind = get_kind("crve_bootstrap")
    params = {"synthetic": {"n_obs": 200, "n_clusters": 10, "seed": 1}, "formula": "y ~ x1 + x9",
              "cluster": "cluster", "param": "x1", "reps": 99}
    with pytest.raises(ValueError, match=r"^formula: columns \['x9'\] are not in the dataset"):
        run_kind(kind, params, RunContext(np, LocalProgress()))
    # A level of a categorical term is known only with the data: the runner names the field.
    with pytest.raises(ValueError, match=r"^hypothesis: .*'C\(cluster\)\[T.99\]' is not a coefficient"):
        run_kind(kind, {**params, "formula": "y ~ x1 + C(cluster)", "param": None,
                        "hypothesis": "C(cluster)[T.99] = 0"}, RunContext(np, LocalProgress()))


def _product(operator: str, count: int, name: str = "v") -> str:
    return operator.join(f"{name}{i}" for i in range(count))


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        (f"y ~ {_product('*', 11)}", "interaction of more than 10 factors"),  # 2,047 terms formulaic would make
        (f"y ~ {_product(':', 11)}", "interaction of more than 10 factors"),
        (f"y ~ ({_product('+', 70)})**2", "more than 2,000 terms"),
        (f"y ~ ({_product('+', 50)}):({_product('+', 50, 'w')})", "more than 2,000 terms"),
        ("y ~ (a + b)**18", "more than 100,000 term products"),  # 2^18 products for 3 distinct terms
        ("y ~ x**1000000000", "more than 100,000 term products"),
        (f"y ~ x | d ~ {_product('*', 12, 'z')}", "instrument part"),
    ],
)
def test_a_formula_that_would_explode_is_refused_before_formulaic_expands_it(formula: str, words: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"^formula: ") as raised:
        parse_formula(formula)
    assert words in str(raised.value) and time.perf_counter() - started < 0.5


def test_the_bound_checks_an_exponential_formula_in_a_millisecond_budget() -> None:
    formula = f"y ~ {_product('*', 16)}"  # 57 characters, 65,535 terms once expanded
    started = time.perf_counter()
    problem = expansion_problem(formula)
    assert problem is not None and "factors" in problem
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    "formula",
    [
        "y ~ x1 + x2",
        "y ~ x1 * x2 * C(g)",
        f"y ~ {_product('*', 10)}",
        f"y ~ ({_product('+', 60)})**2",
        "y ~ (a + b + c)**3 - a:b",
        "y ~ a / (b + c)",
        "y ~ (a + b):(c + d) + {x**2} + np.log(z) - 1",
        "y ~ b %in% a",
    ],
)
def test_formulas_within_the_bounds_parse_and_the_bound_holds(formula: str) -> None:
    assert expansion_problem(formula) is None
    parsed = parse_formula(formula)
    terms = list(Formula(formula).rhs)
    assert len(parsed.terms) == len(terms) <= MAX_FORMULA_TERMS
    assert max(len(term.factors) for term in terms) <= 10


RIGHT_HAND_SIDES = st.recursive(
    st.sampled_from(["a", "b", "c", "d", "C(g)", "1"]),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" + ", " - ", ":", "*", "/", " %in% "]), inner).map(
            lambda parts: f"({parts[0]}{parts[1]}{parts[2]})"
        ),
        st.tuples(inner, st.integers(1, 3)).map(lambda parts: f"({parts[0]})**{parts[1]}"),
    ),
    max_leaves=6,
)


@seed(20261207)
@settings(max_examples=300, deadline=None)
@given(rhs=RIGHT_HAND_SIDES)
def test_the_expansion_bounds_never_fall_below_what_formulaic_makes(rhs: str) -> None:
    formula = f"y ~ {rhs}"
    bounds = expansion_bounds(formula)
    assert bounds is not None
    try:
        parsed = Formula(formula)
        terms = [*parsed.lhs, *parsed.rhs]
    except Exception:  # formulaic refuses some of these (e.g. a term seen twice with different scalings)
        reject()
    assert bounds.terms >= len(terms), formula
    assert bounds.factors >= max((len(term.factors) for term in terms), default=0), formula
