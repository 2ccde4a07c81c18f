"""Bootstrap p-values, the tie rule, and the confidence interval by test inversion (see docs/crve.md).

Conventions as the peers (wildboottest, fwildclusterboot, pyfixest): over the B draws, the original draw not
added, two-tailed p = share of draws with |t*| > |t|; equal-tailed 2 min(P(t* > t), P(t* < t)); ">" P(t* > t);
"<" P(t* < t). "Strict" is read in exact arithmetic: a draw whose t* equals t up to rounding (relative
TIE_RTOL) is a tie and does not count (see ``_exceed``).

Confidence interval: {r : p(r) > sign_level} by test inversion (:class:`PValueCurve`), for every p-value type
and level: [lower, upper] for two- and equal-tailed, [lower, inf) for ">", (-inf, upper] for "<" (at a level
above about 1/2 a one-sided set lies beyond the estimate).

Used by the bootstrap (:mod:`kernels.crve.bootstrap`) and the Monte Carlo (:mod:`kernels.crve.montecarlo`);
depends on no other CRVE module.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np
from scipy import optimize, special

P_VALUE_TYPES = ("two-tailed", "equal-tailed", ">", "<")
T_QUANTILES = (0.005, 0.025, 0.05, 0.10, 0.25, 0.5, 0.75, 0.90, 0.95, 0.975, 0.995)
# Draws whose t* (|t*|) equals t (|t|) up to this relative rounding are ties, not exceedances (see _exceed).
TIE_RTOL = 1e-12


def _exceed(xp: ModuleType, boot: Any, stat: Any) -> Any:
    """boot > stat, strictly, read in exact arithmetic: a draw within rounding of the statistic is a tie.

    Ties count as *not* exceeding: boot exceeds stat only when boot > stat + TIE_RTOL max(|stat|, |boot|, 1).
    Under WCR the all-ones draw reproduces the sample exactly (t* = t in exact arithmetic, at every null
    value) and, with Rademacher weights, the all-minus-ones draw gives t* = -t; computed, they differ from
    +-t by rounding only, which must not decide whether they count. The floor 1 makes t = 0 (the null at
    the estimate) no exception: there a draw with t* = 0 in exact arithmetic computes to rounding noise.
    """
    scale = xp.maximum(xp.maximum(xp.abs(stat), xp.abs(boot)), 1.0)
    return boot > stat + TIE_RTOL * scale


def _exceed_statistic(t_boot: np.ndarray, t_stat: float, tail: str) -> np.ndarray:
    """The draws that exceed a scalar statistic in ``tail`` ("two": |t*| > |t|, "above": t* > t, "below":
    t* < t), by the tie rule of :func:`_exceed` and with its rounding: the scale max(|t|, |t*|, 1) is
    max(|t*|, max(|t|, 1)), and -t* > -t + e is t* < t - e exactly."""
    magnitude = np.abs(t_boot)
    threshold = np.maximum(magnitude, max(abs(t_stat), 1.0))
    threshold *= TIE_RTOL
    if tail == "two":
        threshold += abs(t_stat)
        return magnitude > threshold
    if tail == "above":
        threshold += t_stat
        return t_boot > threshold
    np.subtract(t_stat, threshold, out=threshold)
    return t_boot < threshold


def _share(xp: ModuleType, flags: Any, defined: Any) -> Any:
    """The share of the defined draws (t* not NaN) that are flagged."""
    return flags.sum(axis=-1) / xp.maximum(defined.sum(axis=-1), 1)


def p_values_from(xp: ModuleType, t_boot: Any, t_stat: Any) -> dict[str, Any]:
    """All four bootstrap p-value types; ``t_stat`` may be an array broadcast against ``t_boot``'s last axis.
    A draw without a t* (NaN: its variance was not positive, as multiway clustering allows) is left out."""
    defined = ~xp.isnan(t_boot)
    above = _share(xp, _exceed(xp, t_boot, t_stat), defined)
    below = _share(xp, _exceed(xp, -t_boot, -t_stat), defined)
    two = _share(xp, _exceed(xp, xp.abs(t_boot), xp.abs(t_stat)), defined)
    return {"two-tailed": two, "equal-tailed": 2 * xp.minimum(above, below), ">": above, "<": below}


def analytic_p_values(t_stat: float, df: int) -> dict[str, float]:
    """p-values of the t statistic against t(df) (df = G - 1, as Stata and fixest). The distribution's special
    functions directly (what ``scipy.stats.t`` evaluates, without its argument checks per call)."""
    two = float(2 * special.stdtr(df, -abs(t_stat)))
    return {
        "two-tailed": two,
        "equal-tailed": two,
        ">": float(special.stdtr(df, -t_stat)),
        "<": float(special.stdtr(df, t_stat)),
    }


def t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of t(df) (``scipy.stats.t.ppf``'s special function)."""
    return float(special.stdtrit(df, probability))


class EmptyConfidenceSet(ValueError):
    """No null value has a bootstrap p-value above the level: the confidence set is empty."""


# The two ends of the confidence set {r : p(r) > level} per p-value type: (tail, share of the level) of the
# lower and of the upper bound, None where that end is unbounded. "two": |t*| > |t|; "above": t* > t (p_>
# rises with r); "below": t* < t (p_< falls with r). Equal-tailed: 2 min(p_>, p_<) > level exactly when
# p_> > level / 2 and p_< > level / 2 (halving is exact in binary floating point), so its lower end is
# where p_> crosses level / 2 and its upper end where p_< does.
_CI_TAILS: dict[str, tuple[tuple[str, float] | None, tuple[str, float] | None]] = {
    "two-tailed": (("two", 1.0), ("two", 1.0)),
    "equal-tailed": (("above", 0.5), ("below", 0.5)),
    ">": (("above", 1.0), None),
    "<": (None, ("below", 1.0)),
}


class PValueCurve:
    """The bootstrap p-value as a function of the null value r, from five numbers per draw.

    The confidence set is {r : p(r) > level} (the null values the test does not reject), inverted tail by
    tail (``_CI_TAILS``). p(r) is a step function of r: it changes only where one draw's comparison with
    the statistic flips, t*_b(r) = t(r) (or |t*_b(r)| = |t(r)|), and each bound is such a crossing, solved
    to machine precision.
    """

    def __init__(
        self,
        estimate: float,
        se: float,
        r0: float,
        factor: float,
        numer: np.ndarray,
        sumsq: np.ndarray,
        numer1: np.ndarray | None,
        cross: np.ndarray | None,
        sumsq1: np.ndarray | None,
        p_val_type: str,
        signed_variance: bool = False,
    ) -> None:
        """``signed_variance``: the variance is a signed sum (multiway), so a negative value is real (the draw
        has no t*) rather than rounding below zero."""
        self.estimate, self.se, self.r0, self.factor = estimate, se, r0, factor
        self.signed_variance = signed_variance
        self.numer, self.sumsq = numer, sumsq
        self.numer1, self.cross, self.sumsq1 = numer1, cross, sumsq1
        self.p_val_type = p_val_type

    def t_boot(self, r: float) -> np.ndarray:
        """t*_b(r) of every draw. Evaluated many times per bound, so in place over two buffers; the same
        operations as (numer - d numer1) / sqrt(f (sumsq - 2 d cross + d^2 sumsq1)), rounded alike."""
        if self.numer1 is None:  # WCU: the bootstrap distribution does not depend on r
            numer, sumsq = self.numer.copy(), self.factor * self.sumsq
        else:
            d = r - self.r0
            numer = np.multiply(self.numer1, -d)
            numer += self.numer
            sumsq = np.multiply(self.cross, 2 * d)
            np.subtract(self.sumsq, sumsq, out=sumsq)
            sumsq += np.multiply(self.sumsq1, d * d)
            if not self.signed_variance:
                np.maximum(sumsq, 0.0, out=sumsq)
            sumsq *= self.factor
        with np.errstate(divide="ignore", invalid="ignore"):
            np.sqrt(sumsq, out=sumsq)
            return np.divide(numer, sumsq, out=numer)

    def _draw_t(self, r: float, b: int) -> float:
        if self.numer1 is None:
            numer, sumsq = self.numer[b], self.sumsq[b]
        else:
            d = r - self.r0
            numer = self.numer[b] - d * self.numer1[b]
            sumsq = self.sumsq[b] - 2 * d * self.cross[b] + d * d * self.sumsq1[b]
            if not self.signed_variance:
                sumsq = max(sumsq, 0.0)
        if sumsq < 0:
            return math.nan
        return numer / math.sqrt(self.factor * sumsq) if sumsq > 0 else math.copysign(math.inf, numer)

    def _tail(self, tail: str, r: float) -> tuple[float, np.ndarray]:
        """The tail's p-value at r and the per-draw comparisons it counts."""
        t_boot, t_stat = self.t_boot(r), (self.estimate - r) / self.se
        flags = _exceed_statistic(t_boot, t_stat, tail)
        defined = t_boot.size - np.count_nonzero(np.isnan(t_boot))
        return np.count_nonzero(flags) / max(defined, 1), flags

    def _crossing(self, tail: str, b: int, inside: float, outside: float) -> float | None:
        """Where draw b's comparison with the statistic flips between ``inside`` and ``outside`` (a root)."""

        def gap(r: float) -> float:
            t_stat, t_b = (self.estimate - r) / self.se, self._draw_t(r, b)
            return abs(t_stat) - abs(t_b) if tail == "two" else t_stat - t_b

        low, high = gap(inside), gap(outside)
        if not (math.isfinite(low) and math.isfinite(high)) or low * high > 0:
            return None
        return float(optimize.brentq(gap, inside, outside, xtol=1e-15 * max(abs(inside), abs(outside), 1.0)))

    def _bound(self, tail: str, level: float, direction: float, step: float) -> float | None:
        """The end of {r : p_tail(r) > level} on the ``direction`` side (-1 lower, +1 upper); None: unbounded.

        From the estimate, doubling steps bracket the crossing: outwards while p_tail > level there (the
        usual case), inwards while p_tail <= level there (a one-sided tail at a level above its p-value at
        the estimate, about 1/2: the confidence set then lies beyond the estimate). Bisection narrows the
        bracket until a single draw's comparison flips inside it; that draw's crossing is the bound.
        """
        p_start, flags_start = self._tail(tail, self.estimate)
        accepted_at_start = p_start > level
        if not accepted_at_start and tail == "two":
            # |t| = 0 at the estimate: p_two is the share of draws with t* != 0, its largest value.
            raise EmptyConfidenceSet(
                f"conf_int: the bootstrap p-value is {p_start:.6g} <= sign_level={level:g} even at the estimate, "
                "so no null value is accepted (too few distinct bootstrap draws for this level); lower "
                "sign_level or set conf_int to false"
            )
        march = direction if accepted_at_start else -direction
        last, flags_last = self.estimate, flags_start
        found = None
        for doubling in range(64):
            candidate = self.estimate + march * step * 2.0**doubling
            p_candidate, flags_candidate = self._tail(tail, candidate)
            if (p_candidate > level) != accepted_at_start:
                found = candidate, flags_candidate
                break
            last, flags_last = candidate, flags_candidate
        if found is None:
            if accepted_at_start:
                return None  # accepted however far out: unbounded on this side
            raise EmptyConfidenceSet(
                f"conf_int: no null value has a bootstrap p-value ({tail} tail) above {level:g}; lower sign_level "
                "or set conf_int to false"
            )
        if accepted_at_start:
            (inside, flags_inside), (outside, flags_outside) = (last, flags_last), found
        else:
            (inside, flags_inside), (outside, flags_outside) = found, (last, flags_last)
        for _ in range(200):
            flipped = np.flatnonzero(flags_inside != flags_outside)
            if flipped.size == 1:
                root = self._crossing(tail, int(flipped[0]), inside, outside)
                if root is not None:
                    return root
            middle = 0.5 * (inside + outside)
            if middle in (inside, outside):
                break
            p_middle, flags_middle = self._tail(tail, middle)
            if p_middle <= level:
                outside, flags_outside = middle, flags_middle
            else:
                inside, flags_inside = middle, flags_middle
        return 0.5 * (inside + outside)

    def confidence_interval(self, level: float, critical: float) -> tuple[float | None, float | None]:
        """[lower, upper] of {r : p(r) > level}; None: unbounded on that side."""
        step = max(critical, 1.0) * self.se
        ends = []
        for spec, direction in zip(_CI_TAILS[self.p_val_type], (-1.0, 1.0), strict=True):
            ends.append(None if spec is None else self._bound(spec[0], spec[1] * level, direction, step))
        lower, upper = ends
        if lower is not None and upper is not None and lower > upper:
            raise EmptyConfidenceSet(
                f"conf_int: the equal-tailed confidence set at sign_level={level:g} is empty (lower end {lower:.6g} "
                f"above upper end {upper:.6g}); lower sign_level or set conf_int to false"
            )
        return lower, upper


def romano_wolf_p_values(t_stats: np.ndarray, t_boot: np.ndarray) -> np.ndarray:
    """Romano-Wolf (2005, 2016) stepdown adjusted p-values from S statistics and their B x S bootstrap draws
    (shared draws), as pyfixest's ``rwolf``: hypotheses in decreasing |t|; step s compares |t_(s)| with the
    draws' largest |t*| over the hypotheses not yet stepped past, p_s = (#{max >= |t_(s)|} + 1) / (B + 1),
    then the running maximum makes them monotone. A draw without a t* (NaN) does not count as a maximum."""
    size = np.abs(np.asarray(t_stats, dtype=np.float64))
    draws = np.abs(np.asarray(t_boot, dtype=np.float64))
    reps = draws.shape[0]
    order = np.argsort(size)[::-1]
    initial = np.empty(size.size)
    for step, hypothesis in enumerate(order):
        remaining = draws[:, order[step:]]
        largest = np.fmax.reduce(remaining, axis=1)
        initial[step] = min(1.0, (np.sum(largest >= size[hypothesis]) + 1) / (reps + 1))
    adjusted = np.maximum.accumulate(initial)
    out = np.empty(size.size)
    out[order] = adjusted
    return out


def westfall_young_p_values(p_values: np.ndarray, p_boot: np.ndarray) -> np.ndarray:
    """Westfall-Young (1993) stepdown minP adjusted p-values from S p-values and their B x S bootstrap
    counterparts, as pyfixest's ``wyoung`` (there the p-values are analytic t(df) ones of t and of each t*):
    hypotheses in increasing p; step s counts the draws whose smallest p* over the hypotheses from s on is at
    most p_(s); the running maximum makes them monotone."""
    p_values = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p_values)
    smallest_from = np.fmin.accumulate(np.asarray(p_boot)[:, order[::-1]], axis=1)[:, ::-1]  # NaN: no draw
    initial = np.mean(smallest_from <= p_values[order], axis=0)
    out = np.empty(p_values.size)
    out[order] = np.maximum.accumulate(initial)
    return out


def t_summary(t_boot: np.ndarray) -> dict[str, Any]:
    """Quantiles, mean and standard deviation of the finite bootstrap t statistics (null where undefined)."""
    finite = t_boot[np.isfinite(t_boot)]
    if finite.size == 0:
        return {"quantiles": {}, "mean": None, "sd": None, "non_finite": int(t_boot.size)}
    values = np.quantile(finite, T_QUANTILES)
    return {
        "quantiles": {f"{q:g}": float(v) for q, v in zip(T_QUANTILES, values, strict=True)},
        "mean": float(finite.mean()),
        "sd": float(finite.std(ddof=1)) if finite.size > 1 else None,
        "non_finite": int(t_boot.size - finite.size),
    }
