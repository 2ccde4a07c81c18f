"""Result fields the ``sccs_fit`` and ``sccs_analyses`` jobs share: relative incidences, and the fields of
empirical calibration (calibrated estimates, intervals and p-values, and the calibration's summary)."""

from __future__ import annotations

import math

import numpy as np

from kernels.sccs import calibration as cal
from kernels.sccs.spec import CalibrationSummary


def relative_incidence(estimate: float) -> float:
    """exp of a log relative incidence (infinite past the float range)."""
    return math.exp(estimate) if estimate < 700 else math.inf


def calibrate_estimates(log_rr: np.ndarray, se: np.ndarray, negative: np.ndarray,
                        positive_true: np.ndarray, level: float) -> cal.Calibration:
    """Empirical calibration of the estimates; a null that cannot be fitted names ``negative_controls``."""
    try:
        return cal.calibrate(log_rr, se, negative, positive_true, level)
    except ValueError as error:
        raise ValueError(f"calibration.negative_controls: {error} (estimates with open intervals are left "
                         "out)") from None


def calibrated_fields(result: cal.Calibration) -> list[dict[str, float | None]]:
    """The calibrated p, estimate and interval of each estimate, as the result's fields."""
    return [{
        "calibrated_p": finite_or_none(p_value),
        "calibrated_estimate": finite_or_none(interval.log_rr),
        "calibrated_ci_lower": finite_or_none(interval.lower),
        "calibrated_ci_upper": finite_or_none(interval.upper),
        "relative_incidence_calibrated_ci_lower": relative_incidence_or_none(finite_or_none(interval.lower)),
        "relative_incidence_calibrated_ci_upper": relative_incidence_or_none(finite_or_none(interval.upper)),
    } for p_value, interval in zip(result.p.tolist(), result.intervals, strict=True)]


def calibration_summary(result: cal.Calibration, level: float) -> CalibrationSummary:
    """The fitted null and systematic error model, as the result reports them."""
    model = result.model
    return CalibrationSummary(
        null_mean=result.null.mean, null_sd=result.null.sd, negative_controls=result.null.n_controls,
        positive_controls=result.positive_controls,
        error_model=[model.mean_intercept, model.mean_slope, model.sd_intercept, model.sd_slope], level=level,
    )


def finite_or_none(value: float) -> float | None:
    """``value``, or None where it is not finite (JSON has no infinity)."""
    return value if math.isfinite(value) else None


def relative_incidence_or_none(value: float | None) -> float | None:
    """The relative incidence of a log relative incidence that may be missing."""
    return None if value is None else relative_incidence(value)
