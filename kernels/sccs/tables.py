"""The uploaded tables' columns as NumPy arrays: numeric columns checked by name and type, the Cyclops
interval tables (outcomes, covariates) and their optional names table, and the events' outcomeIds. A refusal
names the table and the column."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pandas as pd

from kernels.sccs.data import BuiltData, build_from_tables
from kernels.sccs.spec import OUTCOME_COLUMN


def numeric_column(frame: pd.DataFrame, table: str, name: str, integer: bool) -> np.ndarray:
    """Column ``name`` of ``table`` as int64 (``integer``: whole numbers only) or float64; refused when it is
    missing or not numeric."""
    if name not in frame.columns:
        raise ValueError(f"{table} table lacks column {name!r} (has {list(frame.columns)[:10]})")
    values = frame[name].to_numpy()
    if values.dtype == object or values.dtype.kind not in "iufb":
        raise ValueError(f"{table}.{name} must be numeric, got dtype {values.dtype}")
    # A real column's missing and non-finite values are refused where the tables are built, on their device
    # (``data.build_from_tables``): no host scan here.
    if integer:
        floats = values.dtype.kind == "f"
        if floats and (not np.all(np.isfinite(values)) or np.any(values != np.round(values))):
            raise ValueError(f"{table}.{name} must hold integers")
        return values.astype(np.int64, copy=False)
    return values.astype(np.float64, copy=False)


def table_columns(outcomes: pd.DataFrame, covariates: pd.DataFrame) -> dict[str, np.ndarray]:
    """The Cyclops tables' columns as NumPy arrays (``covariateValue`` defaults to 1)."""
    cov_value = (
        numeric_column(covariates, "covariates", "covariateValue", integer=False)
        if "covariateValue" in covariates.columns
        else np.ones(len(covariates))
    )
    return {
        "row_id": numeric_column(outcomes, "outcomes", "rowId", integer=True),
        "stratum_id": numeric_column(outcomes, "outcomes", "stratumId", integer=True),
        "time": numeric_column(outcomes, "outcomes", "time", integer=False),
        "y": numeric_column(outcomes, "outcomes", "y", integer=False),
        "cov_row_id": numeric_column(covariates, "covariates", "rowId", integer=True),
        "cov_id": numeric_column(covariates, "covariates", "covariateId", integer=True),
        "cov_value": cov_value,
    }


def load_tables(outcomes: pd.DataFrame, covariates: pd.DataFrame, xp: ModuleType = np) -> BuiltData:
    """Validate the uploaded Cyclops tables and build the analysis data with ``xp`` (on its device)."""
    return build_from_tables(**table_columns(outcomes, covariates), xp=xp)


def covariate_names(frame: pd.DataFrame | None, covariate_ids: np.ndarray) -> list[str | None]:
    """The name of each covariate from the names table (None without one, or for an id it does not list)."""
    if frame is None:
        return [None] * covariate_ids.size
    ids = numeric_column(frame, "names", "covariateId", integer=True)
    if "covariateName" not in frame.columns:
        raise ValueError("names table lacks column 'covariateName'")
    unique, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        repeated = unique[counts > 1]
        raise ValueError(f"names table lists covariateId {int(repeated[0])} more than once "
                         f"(duplicated ids: {repeated[:10].tolist()})")
    lookup = dict(zip(ids.tolist(), frame["covariateName"].astype(str).tolist(), strict=True))
    return [lookup.get(int(c)) for c in covariate_ids.tolist()]


def event_outcomes(events: pd.DataFrame) -> np.ndarray | None:
    """Each event's outcomeId, None when the events table has no such column (events of one outcome)."""
    if OUTCOME_COLUMN not in events.columns:
        return None
    outcome = numeric_column(events, "events", OUTCOME_COLUMN, integer=True)
    if outcome.size == 0:
        raise ValueError(f"events table has no rows (its {OUTCOME_COLUMN} column names no outcome)")
    return outcome
