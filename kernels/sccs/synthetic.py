"""Synthetic SCCS data with the structure of claims-database analyses, generated on NumPy or CuPy.

* Drug prevalence is skewed: drug ``j`` (0-based) is taken by a share ``p_j = 0.47 (1 + j / 7)^-1.6`` of
  cases (0.47, 0.38, 0.31, 0.27, then 0.23, 0.20, ...), so about four drugs are taken by 25-50% of cases,
  drugs from j = 71 on by under 1% (95% of them at J = 1,428) and a case takes about 5.5 drugs.
* Each case has 10-30 eras (20 on average) of 1-60 days; each drug a case takes is active on a
  contiguous run of up to half its eras.
* True effects are sparse: a share ``effect_share`` of drugs has a log relative incidence drawn from
  N(0, effect_sd^2), the rest 0. Each case has ``1 + Geometric`` events (80% have one), placed on its eras
  with probabilities ``L_k exp(x_k' b) / S_i`` (the model's own multinomial).

Every draw comes from the counter-based Philox generator keyed by ``seed``, so NumPy and CuPy produce the
same dataset, and sizes up to the paper's largest (N = 3.6M, J = 1,428, K about 72M) are built on the GPU
in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from kernels import rng
from kernels.backend import to_host
from kernels.sccs.data import IntervalTables, SccsData, from_coo, repeat_by_counts

_STREAM_ERAS = rng.STREAMS["SCCS_SYNTHETIC_ERAS"]
_STREAM_LENGTH = rng.STREAMS["SCCS_SYNTHETIC_LENGTH"]
_STREAM_PAIR_CASE = rng.STREAMS["SCCS_SYNTHETIC_PAIR_CASE"]
_STREAM_RUN_START = rng.STREAMS["SCCS_SYNTHETIC_RUN_START"]
_STREAM_RUN_LENGTH = rng.STREAMS["SCCS_SYNTHETIC_RUN_LENGTH"]
_STREAM_EFFECT_ON = rng.STREAMS["SCCS_SYNTHETIC_EFFECT_ON"]
_STREAM_EFFECT = rng.STREAMS["SCCS_SYNTHETIC_EFFECT"]
_STREAM_EVENTS = rng.STREAMS["SCCS_SYNTHETIC_EVENTS"]
_STREAM_EVENT_ERA = rng.STREAMS["SCCS_SYNTHETIC_EVENT_ERA"]


@dataclass(frozen=True)
class SyntheticSccs:
    data: SccsData
    true_beta: np.ndarray  # (J,) on the host


PREVALENCE_TOP, PREVALENCE_SCALE, PREVALENCE_POWER = 0.47, 7.0, 1.6


def drug_prevalence(n_drugs: int) -> np.ndarray:
    """Share of cases taking drug ``j``: ``0.47 (1 + j / 7)^-1.6``."""
    j = np.arange(n_drugs, dtype=np.float64)
    return PREVALENCE_TOP * np.power(1.0 + j / PREVALENCE_SCALE, -PREVALENCE_POWER)


def generate(
    xp: ModuleType,
    n_cases: int,
    n_drugs: int,
    seed: int = 0,
    effect_share: float = 0.05,
    effect_sd: float = 0.5,
    min_eras: int = 10,
    max_eras: int = 30,
) -> SyntheticSccs:
    if n_cases < 1 or n_drugs < 1 or not 1 <= min_eras <= max_eras:
        raise ValueError("need n_cases >= 1, n_drugs >= 1 and 1 <= min_eras <= max_eras")
    # Eras: count per case, lengths.
    cases = xp.arange(n_cases, dtype=xp.int64)
    eras_per_case = min_eras + rng.integers(xp, seed, _STREAM_ERAS, cases, max_eras - min_eras + 1)
    case_start = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(eras_per_case)])
    n_eras = int(case_start[-1])
    era_case = repeat_by_counts(xp, cases, eras_per_case)
    era_index = xp.arange(n_eras, dtype=xp.int64)
    era_length = (1 + rng.integers(xp, seed, _STREAM_LENGTH, era_index, 60)).astype(xp.float64)

    # (case, drug) exposure pairs: drug j drawn m_j times uniformly over the cases, duplicates merged; with
    # m_j = -N log(1 - p_j) draws a case is missed with probability (1 - 1/N)^m_j ~ 1 - p_j, so the share of
    # cases taking drug j is p_j in expectation.
    per_drug = np.maximum(np.round(-np.log1p(-drug_prevalence(n_drugs)) * n_cases).astype(np.int64), 1)
    pair_drug = xp.asarray(np.repeat(np.arange(n_drugs, dtype=np.int64), per_drug))
    pair_case = rng.integers(xp, seed, _STREAM_PAIR_CASE, xp.arange(pair_drug.shape[0], dtype=xp.int64), n_cases)
    key = xp.unique(pair_case * n_drugs + pair_drug)
    pair_case, pair_drug = key // n_drugs, key % n_drugs
    n_pairs = int(key.shape[0])
    pair_index = xp.arange(n_pairs, dtype=xp.int64)
    n_case_eras = eras_per_case[pair_case]
    run_start = rng.integers(xp, seed, _STREAM_RUN_START, pair_index, 1 << 30) % n_case_eras
    max_run = xp.maximum(n_case_eras // 2, 1)
    run_length = 1 + rng.integers(xp, seed, _STREAM_RUN_LENGTH, pair_index, 1 << 30) % max_run
    run_length = xp.minimum(run_length, n_case_eras - run_start)
    # Expand runs to nonzeros (era, drug).
    offsets = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(run_length)])
    nnz = int(offsets[-1])
    owner = repeat_by_counts(xp, pair_index, run_length)
    within = xp.arange(nnz, dtype=xp.int64) - offsets[:-1][owner]
    nz_era = case_start[pair_case[owner]] + run_start[owner] + within
    nz_drug = pair_drug[owner]

    # Sparse true effects and the linear predictor.
    drugs = xp.arange(n_drugs, dtype=xp.int64)
    has_effect = rng.uniform(xp, seed, _STREAM_EFFECT_ON, drugs) < effect_share
    true_beta = xp.where(has_effect, effect_sd * rng.normal(xp, seed, _STREAM_EFFECT, drugs), 0.0)
    eta = xp.bincount(nz_era, weights=true_beta[nz_drug], minlength=n_eras)
    weight = era_length * xp.exp(eta)

    # Events: 1 + Geometric(0.8) per case, placed by inverting each case's cumulative era weights.
    u_count = rng.uniform(xp, seed, _STREAM_EVENTS, cases)
    events_per_case = 1 + xp.floor(xp.log(u_count) / np.log(0.2)).astype(xp.int64)
    n_events = int(xp.sum(events_per_case))
    event_case = repeat_by_counts(xp, cases, events_per_case)
    cumulative = xp.cumsum(weight)
    before = xp.concatenate([xp.zeros(1, dtype=xp.float64), cumulative])[case_start[:-1]]
    case_total = cumulative[case_start[1:] - 1] - before
    u_era = rng.uniform(xp, seed, _STREAM_EVENT_ERA, xp.arange(n_events, dtype=xp.int64))
    target = before[event_case] + u_era * case_total[event_case]
    event_era = xp.searchsorted(cumulative, target, side="right")
    # Guard against rounding at case boundaries: keep each event inside its own case's eras.
    event_era = xp.clip(event_era, case_start[:-1][event_case], case_start[1:][event_case] - 1)
    era_events = xp.bincount(event_era, minlength=n_eras).astype(xp.float64)

    data = from_coo(era_case, era_length, era_events, nz_era, nz_drug, xp.ones(nnz, dtype=xp.float64), n_drugs,
                    covariate_ids=np.arange(1, n_drugs + 1, dtype=np.int64))
    return SyntheticSccs(data=data, true_beta=np.asarray(to_host(true_beta), dtype=np.float64))


def to_tables(data: SccsData) -> IntervalTables:
    """The Cyclops interval tables of ``data`` (``rowId`` = era number, ``stratumId`` = case number)."""
    col_ptr = to_host(data.col_ptr)
    return IntervalTables(
        row_id=np.arange(data.n_eras, dtype=np.int64),
        stratum_id=to_host(data.era_case).astype(np.int64),
        time=to_host(data.era_length),
        y=to_host(data.era_events),
        cov_row_id=to_host(data.col_rows).astype(np.int64),
        cov_id=np.repeat(data.covariate_ids, np.diff(col_ptr)),
        cov_value=to_host(data.col_values),
    )
