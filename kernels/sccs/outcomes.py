"""Several outcomes in one set of Cyclops interval tables.

SelfControlledCaseSeries builds one set of eras per outcome: the cases of an outcome are the people with an
event of it, and every exposure is analysed against each outcome on that outcome's eras. Here the eras of
several outcomes travel stacked in one outcomes table with an ``outcomeId`` column (``sccs_eras`` writes it
when its events table has one); a stratum is then ``(outcomeId, stratumId)`` — the same person is a case of
each of their outcomes, a separate stratum each time — and ``rowId`` stays unique over the whole table.

``sccs_analyses`` fits every exposure-outcome pair alone by treating the pair as one covariate column:
:func:`pair_columns` renames each covariate entry ``(row, covariateId)`` to the id of the pair
``(outcome of the row, covariateId)`` and makes the strata unique per outcome. The conditional likelihood of
a column involves only the strata it touches, so the pair's fit on the stacked tables is its fit on its
outcome's tables alone (tested against fits of each outcome's tables). ``sccs_fit`` fits one outcome:
:func:`select_outcome` keeps its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernels.sccs.spec import OUTCOME_COLUMN


def outcome_of_rows(outcomes: pd.DataFrame) -> np.ndarray | None:
    """The ``outcomeId`` of every outcomes row (integers), or None when the table has no such column."""
    if OUTCOME_COLUMN not in outcomes.columns:
        return None
    values = outcomes[OUTCOME_COLUMN].to_numpy()
    if values.dtype == object or values.dtype.kind not in "iuf":
        raise ValueError(f"outcomes.{OUTCOME_COLUMN} must be numeric, got dtype {values.dtype}")
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            raise ValueError(f"outcomes.{OUTCOME_COLUMN} must hold integers: row {int(np.flatnonzero(bad)[0]) + 1} "
                             f"holds {values[np.flatnonzero(bad)[0]]!r}")
    return values.astype(np.int64, copy=False)


def select_outcome(outcomes: pd.DataFrame, covariates: pd.DataFrame,
                   outcome_id: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of one outcome (``outcome_id``) of stacked tables, and the covariate entries of those rows.
    Tables without ``outcomeId`` are one outcome already: ``outcome_id`` must then be None. Stacked tables of
    several outcomes need ``outcome_id`` (one fit of several outcomes would share its coefficients across
    them, which is no SCCS model)."""
    owner = outcome_of_rows(outcomes)
    if owner is None:
        if outcome_id is not None:
            raise ValueError(f"outcome_id: the outcomes table has no {OUTCOME_COLUMN} column (it holds one outcome)")
        return outcomes, covariates
    present = np.unique(owner)
    if outcome_id is None:
        if present.size > 1:
            raise ValueError(f"outcome_id: the outcomes table holds {present.size} outcomes ({OUTCOME_COLUMN} "
                             f"{present[:5].tolist()}...); choose one, or analyse them all with sccs_analyses")
        return outcomes, covariates
    if outcome_id not in set(present.tolist()):
        raise ValueError(f"outcome_id: {outcome_id} is not an {OUTCOME_COLUMN} of the outcomes table "
                         f"(it holds {present[:10].tolist()})")
    keep = owner == outcome_id
    rows = outcomes.loc[keep]
    entries = covariates.loc[covariates["rowId"].isin(rows["rowId"])] if "rowId" in covariates.columns else covariates
    return rows.reset_index(drop=True), entries.reset_index(drop=True)


@dataclass(frozen=True)
class PairColumns:
    """The tables' columns with each covariate entry renamed to its exposure-outcome pair and the strata made
    unique per outcome; pair ``p`` is ``(outcome[p], covariate[p])``, pairs sorted by outcome then covariate."""

    columns: dict[str, np.ndarray]
    outcome: np.ndarray
    covariate: np.ndarray


def pair_columns(columns: dict[str, np.ndarray], outcome_of_row: np.ndarray) -> PairColumns:
    """Rename ``columns`` (as :func:`kernels.sccs.tables.table_columns` reads them) for the pairs of stacked
    tables whose row ``i`` belongs to outcome ``outcome_of_row[i]``."""
    row_id = columns["row_id"]
    order = np.argsort(row_id, kind="stable")
    position = np.searchsorted(row_id[order], columns["cov_row_id"])
    position = np.minimum(position, max(row_id.size - 1, 0))
    found = row_id.size > 0
    known = (row_id[order][position] == columns["cov_row_id"]) if found else np.zeros(columns["cov_row_id"].size, bool)
    if not np.all(known):
        missing = columns["cov_row_id"][~known]
        raise ValueError(f"covariates rowId {int(missing[0])} is not a rowId of the outcomes table")
    entry_outcome = outcome_of_row[order][position]
    pair_key = np.stack([entry_outcome, columns["cov_id"]], axis=1)
    pairs, pair_of_entry = np.unique(pair_key, axis=0, return_inverse=True)
    strata = np.stack([outcome_of_row, columns["stratum_id"]], axis=1)
    _, stratum_of_row = np.unique(strata, axis=0, return_inverse=True)
    renamed = {**columns, "stratum_id": stratum_of_row.reshape(-1).astype(np.int64),
               "cov_id": pair_of_entry.reshape(-1).astype(np.int64)}
    return PairColumns(renamed, pairs[:, 0].copy(), pairs[:, 1].copy())
