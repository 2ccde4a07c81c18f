"""Inputs of the accuracy test: the standard ones of the Den Haan-Judd-Juillard (2010) comparison, or a user's.

The comparison's file ``Inputs_for_test.mat`` (here ``data/djj2010_inputs_for_test.mat``, MATLAB v5, data only)
holds three arrays, read as the comparison's own test program reads them (Maliar, Maliar & Valli's
``TEST.m``, the program that computes the statistics of Den Haan 2010 from a solution):

* ``agshock`` (10,000 x 1, uint8): the aggregate state, 1 = bad (productivity 1 - Delta_a), 2 = good;
  ``TEST.m``: ``prod_ag = (agshock==1)*a(1) + (agshock==2)*a(2)`` with ``a(1) = 1 - delta_a``.
* ``idshock`` (10,000 x 1, uint8): one agent's employment path, 1 = unemployed, 2 = employed (``TEST.m``
  pays ``(idshock-1) l_bar w`` of labour income, i.e. only when ``idshock = 2``). It drives the individual
  path of the Euler-equation tests, which starts at ``k = 43`` (``TEST.m``: ``k_ind(1,1) = 43``).
* ``kdist`` (1,001 x 2): the initial cross-section, column 1 the unemployed, column 2 the employed, each a
  distribution *conditional* on the employment state (each column sums to one) over the capital grid
  ``linspace(0, 100, 1001)`` (``TEST.m``: ``kvalues = linspace(kvalues_min = 0, kvalues_max = 100, J = 1001)``).
  The printed masses are rounded; ``TEST.m`` puts the rounding deficit on the last node
  (``kdistu(1, J) = 1 - sum(kdist(1:end-1, 1))``), and so does :func:`jedc_inputs`.

Here the states are coded as everywhere else in ``kernels/ks``: ``a`` 0 = bad, 1 = good; ``employed`` 0/1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

JEDC_FILE = Path(__file__).with_name("data") / "djj2010_inputs_for_test.mat"
JEDC_K_NODES = (0.0, 100.0, 1001)  # the histogram grid of kdist: linspace(0, 100, 1001)
JEDC_INDIVIDUAL_K0 = 43.0  # TEST.m: the individual path's starting capital
JEDC_PERIODS = 10_000  # length of agshock and idshock
MIN_PATH_PERIODS = 10


@dataclass(frozen=True)
class AccuracyInputs:
    """A shock path and a starting cross-section for the non-stochastic accuracy test."""

    a_path: np.ndarray  # (T,) int8, 0 bad / 1 good
    k_nodes: np.ndarray  # (J,) increasing capital nodes of the histogram
    distribution: np.ndarray  # (2, J): row 0 the unemployed, row 1 the employed; each row sums to one
    employed_path: np.ndarray | None = None  # (T,) uint8: one agent's employment (the Euler path test)
    individual_k0: float = JEDC_INDIVIDUAL_K0
    name: str = "jedc"

    @property
    def periods(self) -> int:
        return int(self.a_path.size)


def _states(values: np.ndarray, low: int, name: str) -> np.ndarray:
    values = np.asarray(values).ravel()
    if not np.isin(values, (low, low + 1)).all():
        raise ValueError(f"{name} must hold only {low} and {low + 1}")
    return (values - low).astype(np.int8)


def jedc_inputs(path: Path = JEDC_FILE) -> AccuracyInputs:
    """The comparison's standard inputs (see the module docstring for the codings)."""
    from scipy.io import loadmat  # SciPy is a dependency; imported here so that importing the kind stays light

    data = loadmat(path)
    a_path = _states(data["agshock"], 1, "agshock")
    employed = _states(data["idshock"], 1, "idshock").astype(np.uint8)
    kdist = np.asarray(data["kdist"], dtype=np.float64)
    if kdist.shape != (JEDC_K_NODES[2], 2):
        raise ValueError(f"kdist must be {JEDC_K_NODES[2]} x 2, not {kdist.shape}")
    distribution = kdist.T.copy()
    distribution[:, -1] = 1.0 - distribution[:, :-1].sum(axis=1)  # TEST.m's normalisation
    return AccuracyInputs(a_path, np.linspace(*JEDC_K_NODES), distribution, employed, JEDC_INDIVIDUAL_K0, "jedc")


def path_from_frame(frame: pd.DataFrame, field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """An uploaded shock path: column ``a`` (0 bad, 1 good), optional column ``employed`` (0/1: one agent's
    employment, for the Euler-equation test along the path). ValueError messages name ``field``."""
    if "a" not in frame.columns:
        raise ValueError(f"{field}: the dataset needs a column 'a' (aggregate state, 0 = bad, 1 = good)")
    if len(frame) < MIN_PATH_PERIODS:
        raise ValueError(f"{field}: the path needs at least {MIN_PATH_PERIODS} periods, not {len(frame)}")
    a_path = _states(np.asarray(frame["a"]), 0, f"{field}: column 'a'")
    employed = None
    if "employed" in frame.columns:
        employed = _states(np.asarray(frame["employed"]), 0, f"{field}: column 'employed'").astype(np.uint8)
    return a_path, employed


def distribution_from_frame(frame: pd.DataFrame, field: str, k_min: float,
                            k_max: float) -> tuple[np.ndarray, np.ndarray]:
    """An uploaded starting cross-section as a histogram: column ``k`` (strictly increasing nodes in
    [k_min, k_max]) and columns ``unemployed`` and ``employed`` (non-negative masses at the nodes, each
    normalised to sum to one: the distribution conditional on the employment state)."""
    missing = [name for name in ("k", "unemployed", "employed") if name not in frame.columns]
    if missing:
        raise ValueError(f"{field}: the dataset needs the columns k, unemployed and employed (missing: "
                         f"{', '.join(missing)})")
    k = np.asarray(frame["k"], dtype=np.float64)
    masses = np.vstack([np.asarray(frame["unemployed"], dtype=np.float64),
                        np.asarray(frame["employed"], dtype=np.float64)])
    if k.size < 2 or not np.all(np.isfinite(k)) or not np.all(np.diff(k) > 0.0):
        raise ValueError(f"{field}: column 'k' must hold at least two finite, strictly increasing nodes")
    if k[0] < k_min or k[-1] > k_max:
        raise ValueError(f"{field}: column 'k' must lie in [k_grid.min, k_grid.max] = [{k_min}, {k_max}]")
    if not np.all(np.isfinite(masses)) or np.any(masses < 0.0):
        raise ValueError(f"{field}: columns 'unemployed' and 'employed' must be finite and non-negative")
    totals = masses.sum(axis=1, keepdims=True)
    if np.any(totals <= 0.0):
        raise ValueError(f"{field}: columns 'unemployed' and 'employed' each need a positive total mass")
    return k, masses / totals
