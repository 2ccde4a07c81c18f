"""The CRVE kinds' work measures (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK`` and
``GPUEST_CPU_MAX_JOB_BYTES``).

- crve_montecarlo: replications x (observations + clusters x bootstrap_reps), the bootstrap term only for
  test = wild_bootstrap (each replication draws G x B weights); memory: one NumPy block of replications (its
  generated data and bootstrap arrays; at least one replication).
- crve_bootstrap: reps x rows (the dataset's stored rows, or synthetic.n_obs); memory: the rows' columns and
  their per-row temporaries.
"""

from __future__ import annotations

from kernels.crve.montecarlo import NUMPY_BLOCK_ELEMENTS
from kernels.crve.spec import BootstrapParams, MonteCarloParams
from kernels.registry import DatasetRows, Work

# Default CPU caps (JobKind.cpu_max_work): about ten minutes of a CPU core's pace.
DEFAULT_MONTECARLO_CPU_MAX_WORK = 2e10
DEFAULT_BOOTSTRAP_CPU_MAX_WORK = 2e10
# Copies of a block's float64s alive at once (the data, the cluster sums, their temporaries).
_BLOCK_COPIES = 3
# Bytes per dataset row of a bootstrap: the model's columns and the per-row temporaries of a draw chunk.
_BOOTSTRAP_BYTES_PER_ROW = 256


def montecarlo_work(params: MonteCarloParams, _rows: DatasetRows) -> Work:
    observations = sum(params.design_sizes or ()) or params.n_clusters * params.cluster_size
    draws = params.n_clusters * params.bootstrap_reps if params.test == "wild_bootstrap" else 0
    largest = max(params.design_sizes or (params.cluster_size,))
    one_replication = params.n_clusters * largest * (params.n_regressors + 2) + 4 * draws
    return Work(
        float(params.replications) * (observations + draws),
        "replications x (observations + clusters x bootstrap_reps)",
        "params.replications",
        8.0 * _BLOCK_COPIES * max(NUMPY_BLOCK_ELEMENTS, one_replication),
        "one block of replications' float64s (at least one replication's data and bootstrap draws)",
        "params.cluster_size",
    )


def bootstrap_work(params: BootstrapParams, rows: DatasetRows) -> Work:
    n_rows = rows.get("dataset_id") or (params.synthetic.n_obs if params.synthetic is not None else 0)
    return Work(
        float(params.reps) * n_rows,
        "reps x rows",
        "params.reps",
        float(n_rows) * _BOOTSTRAP_BYTES_PER_ROW,
        f"rows x {_BOOTSTRAP_BYTES_PER_ROW} bytes",
        "params.dataset_id" if params.synthetic is None else "params.synthetic.n_obs",
    )
