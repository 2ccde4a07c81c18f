"""Formula errors at run time: plain text naming the field (never formulaic's terminal escape codes), and the
submission-time column check agreeing with what the runner refuses (issue 14, "Bad input")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernels.context import RunContext, run_kind
from kernels.crve.formula import column_problems, design_from_formula, parse_formula, plain_message
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
