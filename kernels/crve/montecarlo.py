"""Monte Carlo of cluster-robust inference in the Cameron, Gelbach & Miller (2008) design.

DGP (CGM 2008, section 4): G clusters of m observations, k - 1 regressors and an intercept,
    x_igj = e_igj + e_gj,   y_ig = 1 + sum_j x_igj + u_ig + u_g,   all e, u independent N(0, 1),
so every coefficient is 1. Each replication fits OLS and tests H0: beta_j = 1 for one slope with the CRV1
t statistic (critical values of t(G-1), as Stata, fixest and pyfixest do, or of N(0, 1)), or with a wild
cluster restricted (WCR) bootstrap-t of its own B draws.

Random numbers: every normal is ``kernels.rng.normal(seed, stream, index)`` at a fixed address, so a
chunked run equals a single run and the GPU kernel (``montecarlo.cu``, launched by
:func:`cgm_cluster_statistics_gpu`) draws exactly these numbers in registers without storing them.
Addresses, for replication r, cluster g, observation n = g m + i and regressor j in [0, k - 1) (streams of
``kernels.rng.STREAMS``):
    CRVE_MC_X_CLUSTER (1)     e_gj (cluster part of x)       index (r G + g)(k - 1) + j
    CRVE_MC_U_CLUSTER (2)     u_g                            index r G + g
    CRVE_MC_X_INDIVIDUAL (3)  e_igj (individual part of x)   index (r N + n)(k - 1) + j
    CRVE_MC_U_INDIVIDUAL (4)  u_ig                           index r N + n
    CRVE_WEIGHTS (5)          bootstrap weights              index (r B + b) G + g (replication r its own block)
See docs/crve.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from scipy import stats

from kernels import cuda, rng
from kernels.backend import is_numpy, to_host
from kernels.crve.inference import p_values_from
from kernels.crve.ols import ols_crv1, small_sample_factor
from kernels.crve.weights import enumerated_weights, use_enumeration, weights_at, weights_gpu
from kernels.timing import StageTimer

STREAM_X_CLUSTER = rng.STREAMS["CRVE_MC_X_CLUSTER"]
STREAM_U_CLUSTER = rng.STREAMS["CRVE_MC_U_CLUSTER"]
STREAM_X_INDIVIDUAL = rng.STREAMS["CRVE_MC_X_INDIVIDUAL"]
STREAM_U_INDIVIDUAL = rng.STREAMS["CRVE_MC_U_INDIVIDUAL"]
STREAM_CLUSTER_SIZES = rng.STREAMS["CRVE_MC_CLUSTER_SIZES"]
TRUE_COEFFICIENT = 1.0
LEVELS = (0.01, 0.05, 0.10)
_WARP_BLOCK = 128  # threads per block of cgm_cluster_stats: 4 warps, one per (replication, cluster)

# Compiled per K = n_regressors (2..32). The warm-up compiles K = 2..8: the kind's example has 3, the
# benchmarks and the paper's Figure 4 use 8, and designs of a few regressors are the common ones; a larger K
# compiles at its first job.
_SOURCE = cuda.kernel_source(
    __file__, "montecarlo.cu", headers=[cuda.PHILOX_HEADER, "crve/crossprod.cuh"],
    warm_up=[{"K": k} for k in range(2, 9)],
)


@dataclass(frozen=True)
class Design:
    n_clusters: int
    cluster_size: int  # m; with ``sizes`` the mean size asked for
    n_regressors: int  # including the intercept
    seed: int
    sizes: tuple[int, ...] | None = None  # unbalanced: each cluster's size (None: all m)

    @property
    def cluster_sizes(self) -> np.ndarray:
        if self.sizes is None:
            return np.full(self.n_clusters, self.cluster_size, dtype=np.int64)
        return np.asarray(self.sizes, dtype=np.int64)

    @property
    def offsets(self) -> np.ndarray:
        """Each cluster's first observation within a replication (G + 1 entries, the last N)."""
        return np.concatenate([[0], np.cumsum(self.cluster_sizes)]).astype(np.int64)

    @property
    def n_obs(self) -> int:
        return int(self.cluster_sizes.sum())

    @property
    def largest_cluster(self) -> int:
        return int(self.cluster_sizes.max())


def lognormal_sizes(n_clusters: int, mean_size: int, dispersion: float, seed: int) -> tuple[int, ...]:
    """Unbalanced cluster sizes: m exp(s z_g - s^2 / 2) rounded, at least 1, z_g standard normal from Philox
    (stream CRVE_MC_CLUSTER_SIZES at g): mean about m, coefficient of variation sqrt(exp(s^2) - 1)."""
    z = rng.normal(np, seed, STREAM_CLUSTER_SIZES, np.arange(n_clusters, dtype=np.int64))
    sizes = np.maximum(1, np.rint(mean_size * np.exp(dispersion * z - 0.5 * dispersion**2)))
    return tuple(int(size) for size in sizes)


def cgm_data(xp: ModuleType, design: Design, first_replication: int, n_replications: int) -> tuple[Any, Any]:
    """The regressors X (R, G, m, k) (first column the intercept) and y (R, G, m) of a block of replications.

    The reference generator (and the NumPy path): it materialises the data, so callers keep blocks small.
    """
    g_count, m, k = design.n_clusters, design.largest_cluster, design.n_regressors
    n = design.n_obs
    reps = xp.arange(first_replication, first_replication + n_replications, dtype=xp.int64)
    clusters = xp.arange(g_count, dtype=xp.int64)
    regressors = xp.arange(k - 1, dtype=xp.int64)
    within = xp.arange(m, dtype=xp.int64)
    offsets = xp.asarray(design.offsets[:-1])
    cluster_address = reps[:, None] * g_count + clusters[None, :]  # (R, G)
    e_g = rng.normal(xp, design.seed, STREAM_X_CLUSTER, cluster_address[:, :, None] * (k - 1) + regressors)
    u_g = rng.normal(xp, design.seed, STREAM_U_CLUSTER, cluster_address)
    obs_address = reps[:, None, None] * n + offsets[None, :, None] + within[None, None, :]  # (R, G, m)
    e_i = rng.normal(xp, design.seed, STREAM_X_INDIVIDUAL, obs_address[..., None] * (k - 1) + regressors)
    u_i = rng.normal(xp, design.seed, STREAM_U_INDIVIDUAL, obs_address)
    slopes = e_i + e_g[:, :, None, :]
    y = TRUE_COEFFICIENT * (1.0 + slopes.sum(axis=-1)) + u_i + u_g[:, :, None]
    ones = xp.ones((*slopes.shape[:-1], 1), dtype=xp.float64)
    x = xp.concatenate([ones, slopes], axis=-1)
    if design.sizes is not None:  # rows past a cluster's size are padding: zero rows add nothing to the sums
        present = (within[None, :] < xp.asarray(design.cluster_sizes)[:, None]).astype(xp.float64)  # (G, m)
        x, y = x * present[None, :, :, None], y * present[None, :, :]
    return x, y


def cluster_statistics_numpy(xp: ModuleType, design: Design, first: int, count: int) -> tuple[Any, Any]:
    """X_g'X_g (R, G, k, k) and X_g'y_g (R, G, k) of a block of replications, through ``cgm_data``."""
    x, y = cgm_data(xp, design, first, count)
    return xp.einsum("rgmi,rgmj->rgij", x, x), xp.einsum("rgmi,rgm->rgi", x, y)


@dataclass
class ReplicationStats:
    """Per-replication outcomes of one block."""

    estimate: Any  # (R,) the tested slope
    se: Any  # (R,) its CRV1 standard error
    t_stat: Any  # (R,)
    p_bootstrap: Any | None = None  # (R,) WCR bootstrap p-value when the test is the bootstrap


def crv1_block(xp: ModuleType, xtx_g: Any, xty_g: Any, n_obs: int, coefficient: int, ssc: bool) -> ReplicationStats:
    beta, covariance, _ = ols_crv1(xp, xtx_g, xty_g, n_obs, ssc)
    estimate = beta[:, coefficient]
    se = xp.sqrt(covariance[:, coefficient, coefficient])
    return ReplicationStats(estimate, se, (estimate - TRUE_COEFFICIENT) / se)


def wcr_bootstrap_block(
    xp: ModuleType,
    xtx_g: Any,
    xty_g: Any,
    n_obs: int,
    coefficient: int,
    ssc: bool,
    weights_type: str,
    reps: int,
    seed: int,
    first_replication: int,
) -> ReplicationStats:
    """CRV1 t and the WCR wild cluster bootstrap-t p-value (two-tailed) of each replication of a block.

    The fast-and-wild algebra of ``kernels.crve.bootstrap`` batched over replications (bootstrap clusters =
    variance clusters): numerators c'v and D = diag(c) V - W (S'V), with the null beta_j = 1 imposed.
    Replication r's draw b weights cluster g with the Philox address (r B + b) G + g, so a replication's
    draws do not depend on the blocking; all 2^G sign vectors when Rademacher and 2^G < B.
    """
    n_rep, g_count, k = xty_g.shape
    xtx = xtx_g.sum(axis=1)
    xty = xty_g.sum(axis=1)
    a_full = xp.linalg.inv(xtx)
    a_full = 0.5 * (a_full + xp.swapaxes(a_full, 1, 2))
    beta = xp.einsum("rij,rj->ri", a_full, xty)
    scores = xty_g - xp.einsum("rgij,rj->rgi", xtx_g, beta)
    factor = small_sample_factor(n_obs, g_count, k, ssc)
    a = a_full[:, :, coefficient]
    variance = factor * (xp.einsum("rgi,ri->rg", scores, a) ** 2).sum(axis=1)
    estimate = beta[:, coefficient]
    se = xp.sqrt(variance)
    t_stat = (estimate - TRUE_COEFFICIENT) / se
    shrink = (estimate - TRUE_COEFFICIENT) / a_full[:, coefficient, coefficient]
    beta_restricted = beta - a * shrink[:, None]
    s_g = xty_g - xp.einsum("rgij,rj->rgi", xtx_g, beta_restricted)
    c = xp.einsum("rgi,ri->rg", s_g, a)
    w = xp.einsum("rgij,rj->rgi", xtx_g, a)
    w = xp.einsum("rgi,rij->rgj", w, a_full)
    if use_enumeration(weights_type, g_count, reps):
        n_draws = 2**g_count
        v = xp.broadcast_to(enumerated_weights(xp, g_count, 0, n_draws), (n_rep, g_count, n_draws))
    else:
        n_draws = reps
        v = replication_weights(xp, weights_type, seed, g_count, n_draws, first_replication, n_rep)
    numer = xp.einsum("rg,rgb->rb", c, v)
    d = c[:, :, None] * v - xp.einsum("rgk,rkb->rgb", w, xp.einsum("rgk,rgb->rkb", s_g, v))
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero-variance draw: t* inf or NaN
        t_boot = numer / xp.sqrt(factor * (d * d).sum(axis=1))
    p_value = p_values_from(xp, t_boot, t_stat[:, None])["two-tailed"]
    return ReplicationStats(estimate, se, t_stat, p_value)


def replication_weights(
    xp: ModuleType, weights_type: str, seed: int, g_count: int, n_draws: int, first: int, count: int
) -> Any:
    """Weights (R, G, B) of replications first..first+count-1: draw b of replication r at (r B + b) G + g."""
    if not is_numpy(xp):
        return weights_gpu(
            xp, weights_type, seed, g_count, 0, n_draws,
            first_replication=first, n_replications=count, draws_per_replication=n_draws,
        )  # fmt: skip
    r = xp.arange(first, first + count, dtype=xp.int64)[:, None, None]
    b = xp.arange(n_draws, dtype=xp.int64)[None, None, :]
    g = xp.arange(g_count, dtype=xp.int64)[None, :, None]
    return weights_at(xp, weights_type, seed, (r * n_draws + b) * g_count + g)


def cluster_statistics(xp: ModuleType, design: Design, first: int, count: int) -> tuple[Any, Any]:
    """X_g'X_g, X_g'y_g of a block: generated in registers on the GPU, through ``cgm_data`` on NumPy."""
    if not is_numpy(xp):
        return cgm_cluster_statistics_gpu(xp, design, first, count)
    return cluster_statistics_numpy(xp, design, first, count)


def cgm_cluster_statistics_gpu(cupy: ModuleType, design: Design, first: int, count: int) -> tuple[Any, Any]:
    """X_g'X_g (R, G, k, k) and X_g'y_g (R, G, k) of replications first..first+count-1, the data made in
    registers by ``cgm_cluster_stats`` (twin: :func:`cluster_statistics_numpy`)."""
    k, n_clusters, seed = design.n_regressors, design.n_clusters, design.seed
    xtx = cupy.empty((count, n_clusters, k, k), dtype=cupy.float64)
    xty = cupy.empty((count, n_clusters, k), dtype=cupy.float64)
    warps = count * n_clusters
    blocks = (warps * 32 + _WARP_BLOCK - 1) // _WARP_BLOCK
    cuda.function(_SOURCE, "cgm_cluster_stats", {"K": k})(
        (blocks,), (_WARP_BLOCK,),
        (np.uint64(seed), np.int64(first), np.int64(count), np.int64(n_clusters), np.int64(design.n_obs),
         cupy.asarray(design.offsets), xtx, xty),
    )  # fmt: skip
    return xtx, xty


def bootstrap_draws(weights_type: str, n_clusters: int, reps: int) -> int:
    """Draws per replication: B, or 2^G under full enumeration."""
    return 2**n_clusters if use_enumeration(weights_type, n_clusters, reps) else reps


def critical_values(critical: str, n_clusters: int) -> dict[float, float]:
    if critical == "t":
        return {level: float(stats.t.ppf(1 - level / 2, n_clusters - 1)) for level in LEVELS}
    return {level: float(stats.norm.ppf(1 - level / 2)) for level in LEVELS}


@dataclass
class MonteCarloSummary:
    replications: int
    rejection_rate: dict[float, float]
    rejection_rate_se: dict[float, float]
    mean_estimate: float
    sd_estimate: float
    mean_se: float
    critical_values: dict[float, float] | None


@dataclass(frozen=True)
class BlockPartial:
    """One block's share of the summary: its counts and float64 sums of the estimate about ``shift`` (the first
    block's mean estimate, the same for every block of a run). Adding these in block order is what the
    single run does, so a chunked run (``kernels.crve.montecarlo_chunks``) reduces to the same bits."""

    count: int
    rejections: dict[float, int]
    sum_centred: float
    sum_centred_sq: float
    sum_se: float


def first_block_shift(block: ReplicationStats) -> float:
    """The centre every block's sums are taken about: the first block's mean estimate (a stable variance)."""
    return float(to_host(block.estimate).mean())


def block_partial(block: ReplicationStats, crit: dict[float, float] | None, shift: float) -> BlockPartial:
    estimate = to_host(block.estimate)
    se = to_host(block.se)
    rejections = {}
    for level in LEVELS:
        if block.p_bootstrap is not None:
            rejected = to_host(block.p_bootstrap) < level
        else:
            rejected = np.abs(to_host(block.t_stat)) > crit[level]
        rejections[level] = int(rejected.sum())
    centred = estimate - shift
    return BlockPartial(int(estimate.size), rejections, float(centred.sum()), float((centred**2).sum()),
                        float(se.sum()))


class _Accumulator:
    """Running sums over blocks (float64 on the host), so memory stays bounded for any R."""

    def __init__(self, shift: float | None = None) -> None:
        self.count = 0
        self.rejections = dict.fromkeys(LEVELS, 0)
        self.sum_estimate = 0.0
        self.sum_estimate_sq = 0.0
        self.sum_se = 0.0
        self.shift = shift  # the first block's mean, subtracted for a stable variance

    def add(self, xp: ModuleType, block: ReplicationStats, crit: dict[float, float] | None) -> None:
        if self.shift is None:
            self.shift = first_block_shift(block)
        self.merge(block_partial(block, crit, self.shift))

    def merge(self, partial: BlockPartial) -> None:
        """Add one block's partial sums (blocks must come in order for the single run's bits)."""
        for level in LEVELS:
            self.rejections[level] += partial.rejections[level]
        self.count += partial.count
        self.sum_estimate += partial.sum_centred
        self.sum_estimate_sq += partial.sum_centred_sq
        self.sum_se += partial.sum_se

    def summary(self, crit: dict[float, float] | None) -> MonteCarloSummary:
        r = self.count
        rates = {level: self.rejections[level] / r for level in LEVELS}
        rate_se = {level: math.sqrt(rate * (1 - rate) / r) for level, rate in rates.items()}
        mean_centred = self.sum_estimate / r
        variance = (self.sum_estimate_sq - r * mean_centred**2) / (r - 1) if r > 1 else float("nan")
        return MonteCarloSummary(
            replications=r,
            rejection_rate=rates,
            rejection_rate_se=rate_se,
            mean_estimate=self.shift + mean_centred,
            sd_estimate=math.sqrt(max(variance, 0.0)) if r > 1 else float("nan"),
            mean_se=self.sum_se / r,
            critical_values=crit,
        )


def summarise(shift: float, partials: Sequence[BlockPartial], crit: dict[float, float] | None) -> MonteCarloSummary:
    """The summary of a run from its blocks' partials, in block order (what :func:`run_blocks` accumulates)."""
    accumulator = _Accumulator(shift)
    for partial in partials:
        accumulator.merge(partial)
    return accumulator.summary(crit)


BlockFunction = Callable[[int, int], ReplicationStats]
# float64s of generated data a NumPy block of replications holds (a GPU block: its own, larger budget)
NUMPY_BLOCK_ELEMENTS = 8_000_000


def block_size(design: Design, budget_elements: int, extra_per_replication: int = 0) -> int:
    """Replications per block so that one block's arrays hold about ``budget_elements`` float64s."""
    padded = design.n_clusters * design.largest_cluster  # the NumPy generator pads every cluster to the largest
    per_replication = padded * (design.n_regressors + 2) + extra_per_replication
    return max(1, budget_elements // max(per_replication, 1))


def run_blocks(
    replications: int,
    block: int,
    compute: BlockFunction,
    crit: dict[float, float] | None,
    xp: ModuleType,
    report: Callable[[float, str], None],
) -> MonteCarloSummary:
    """Run ``compute(first, count)`` over blocks of replications, reporting progress after each block."""
    accumulator = _Accumulator()
    done = 0
    while done < replications:
        count = min(block, replications - done)
        accumulator.add(xp, compute(done, count), crit)
        done += count
        report(done / replications, f"replications {done}/{replications}")
    return accumulator.summary(crit)


@dataclass(frozen=True)
class SimulationPlan:
    """How a run of ``replications`` is cut into blocks of ``block`` replications (the last may be shorter),
    and the bootstrap draws per replication (0 for the CRV1 test). The blocks are the unit of the sums: a run
    split over workers must use the plan of the device the single run would use."""

    replications: int
    block: int
    draws: int

    @property
    def n_blocks(self) -> int:
        return -(-self.replications // self.block)

    def bounds(self, index: int) -> tuple[int, int]:
        """(first replication, count) of block ``index``."""
        first = index * self.block
        return first, min(self.block, self.replications - first)


def plan_simulation(
    xp: ModuleType,
    design: Design,
    *,
    replications: int,
    bootstrap_reps: int | None,
    weights_type: str,
    numpy_block_elements: int = NUMPY_BLOCK_ELEMENTS,
    gpu_block_elements: int = 125_000_000,
) -> SimulationPlan:
    """The blocks of a run on ``xp``: on the GPU ``gpu_block_elements`` bounds a block's cluster statistics and
    bootstrap arrays, on NumPy ``numpy_block_elements`` its generated data."""
    draws = bootstrap_draws(weights_type, design.n_clusters, bootstrap_reps) if bootstrap_reps is not None else 0
    if not is_numpy(xp):
        k = design.n_regressors
        per_replication = design.n_clusters * (k * k + k + 3 * draws)
        block = max(1, gpu_block_elements // per_replication)
    else:
        block = block_size(design, numpy_block_elements, extra_per_replication=4 * design.n_clusters * draws)
    return SimulationPlan(replications, block, draws)


def block_function(
    xp: ModuleType,
    design: Design,
    *,
    test_coefficient: int,
    ssc: bool,
    bootstrap_reps: int | None,
    weights_type: str,
    timer: StageTimer,
) -> BlockFunction:
    """``compute(first, count)``: the per-replication outcomes of one block of replications."""

    def compute(first: int, count: int) -> ReplicationStats:
        with timer.stage("generate_and_reduce"):
            xtx_g, xty_g = cluster_statistics(xp, design, first, count)
        if bootstrap_reps is not None:
            with timer.stage("wild_bootstrap"):
                return wcr_bootstrap_block(
                    xp, xtx_g, xty_g, design.n_obs, test_coefficient, ssc,
                    weights_type, bootstrap_reps, design.seed, first,
                )  # fmt: skip
        with timer.stage("crv1"):
            return crv1_block(xp, xtx_g, xty_g, design.n_obs, test_coefficient, ssc)

    return compute


def block_range_partials(
    plan: SimulationPlan,
    compute: BlockFunction,
    crit: dict[float, float] | None,
    shift: float,
    blocks: range,
    report: Callable[[int], None] = lambda _done: None,
) -> list[BlockPartial]:
    """The partials of blocks ``blocks`` of ``plan`` about ``shift``: one chunk of a split run.
    ``report(n)`` after each block, with the number of blocks done."""
    partials = []
    for done, index in enumerate(blocks, start=1):
        partials.append(block_partial(compute(*plan.bounds(index)), crit, shift))
        report(done)
    return partials


def simulate(
    xp: ModuleType,
    design: Design,
    *,
    replications: int,
    test_coefficient: int,
    ssc: bool,
    critical: dict[float, float] | None,
    bootstrap_reps: int | None,
    weights_type: str,
    report: Callable[[float, str], None],
    timer: StageTimer,
    numpy_block_elements: int = NUMPY_BLOCK_ELEMENTS,
    gpu_block_elements: int = 125_000_000,
) -> tuple[MonteCarloSummary, int]:
    """The whole Monte Carlo in blocks of replications; returns the summary and the draws per replication.

    ``bootstrap_reps`` None: the CRV1 t test against ``critical``; else a WCR bootstrap-t of that many draws.
    On the GPU the data are never stored: a block holds only cluster statistics (R G (k^2 + k)) and, when
    bootstrapping, the R x G x B weights and scores; ``gpu_block_elements`` bounds those.
    """
    plan = plan_simulation(xp, design, replications=replications, bootstrap_reps=bootstrap_reps,
                           weights_type=weights_type, numpy_block_elements=numpy_block_elements,
                           gpu_block_elements=gpu_block_elements)
    compute = block_function(xp, design, test_coefficient=test_coefficient, ssc=ssc, bootstrap_reps=bootstrap_reps,
                             weights_type=weights_type, timer=timer)
    return run_blocks(replications, plan.block, compute, critical, xp, report), plan.draws
