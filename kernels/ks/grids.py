"""Grids for individual capital k (polynomially spaced) and aggregate capital K (uniform), and the map from
a value to its fractional grid coordinate (Hatcher & Scheffel 2014, Algorithm A.2, lines 58-61).

k_i = k_min + (k_max - k_min) (i / (n - 1))^theta, so the coordinate of k is
s(k) = ((k - k_min) / (k_max - k_min))^(1 / theta) (n - 1): the grid is uniform in s.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Grids:
    k_size: int = 100
    k_min: float = 0.0
    k_max: float = 1000.0
    spacing_power: float = 7.0
    K_size: int = 4
    K_min: float = 30.0
    K_max: float = 50.0

    def __post_init__(self) -> None:
        if self.k_size < 2 or self.K_size < 2:
            raise ValueError("k_grid.size and K_grid.size must be at least 2")
        if not self.k_max > self.k_min >= 0.0:
            raise ValueError("k_grid needs 0 <= min < max")
        if not self.K_max > self.K_min > 0.0:
            raise ValueError("K_grid needs 0 < min < max")
        if self.spacing_power <= 0.0:
            raise ValueError("k_grid.spacing_power must be positive")

    @property
    def k(self) -> np.ndarray:
        t = np.linspace(0.0, 1.0, self.k_size)
        return self.k_min + (self.k_max - self.k_min) * t**self.spacing_power

    @property
    def K(self) -> np.ndarray:
        return np.linspace(self.K_min, self.K_max, self.K_size)


def k_coordinate(xp: ModuleType, grids: Grids, k: Any) -> Any:
    """Fractional index of individual capital on the polynomial grid (k clamped to the grid's range)."""
    span = grids.k_max - grids.k_min
    unit = xp.clip((k - grids.k_min) / span, 0.0, 1.0)
    return unit ** (1.0 / grids.spacing_power) * (grids.k_size - 1)


def K_coordinate(xp: ModuleType, grids: Grids, capital: Any) -> Any:
    """Fractional index of aggregate capital on the uniform grid (K clamped to the grid's range)."""
    unit = xp.clip((capital - grids.K_min) / (grids.K_max - grids.K_min), 0.0, 1.0)
    return unit * (grids.K_size - 1)
