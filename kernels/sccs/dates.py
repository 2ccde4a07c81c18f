"""Day columns of the person-level tables: integer days, or dates read as days since 1970-01-01."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernels.sccs.tables import numeric_column


def day_column(frame: pd.DataFrame, table: str, name: str) -> np.ndarray:
    """Integer days, or dates as days since 1970-01-01: datetime columns (Parquet timestamps), date objects
    (Parquet date32) and ISO 8601 text (CSV, e.g. 2020-01-31), whose unreadable or missing entries are named
    by their row (counting data rows from 1)."""
    if name not in frame.columns:
        return numeric_column(frame, table, name, integer=True)  # its message names the missing column
    values = frame[name]
    if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        return numeric_column(frame, table, name, integer=True)
    if not pd.api.types.is_datetime64_any_dtype(values):
        values = _parse_dates(values, table, name)
    elif values.isna().any():
        raise ValueError(f"{table}.{name} has a missing date at row {int(np.flatnonzero(values.isna())[0]) + 1}")
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    return values.to_numpy().astype("datetime64[D]").astype(np.int64)


def _parse_dates(values: pd.Series, table: str, name: str) -> pd.Series:
    """Dates in text or date objects; anything else is refused naming the first row that is not a date."""
    missing = values.isna().to_numpy()
    if missing.any():
        raise ValueError(f"{table}.{name} has a missing value at row {int(np.flatnonzero(missing)[0]) + 1}")
    parsed = pd.to_datetime(values.astype(str), format="ISO8601", errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        shown = str(values.iloc[row])[:40]
        raise ValueError(f"{table}.{name} must hold day numbers or dates (YYYY-MM-DD); row {row + 1} holds {shown!r}")
    return parsed
