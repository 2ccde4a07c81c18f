"""The CRVE kinds' work measures (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK``).

- crve_montecarlo: replications x (observations + clusters x bootstrap_reps), the bootstrap term only for
  test = wild_bootstrap (each replication draws G x B weights).
- crve_bootstrap: reps x rows (the dataset's stored rows, or synthetic.n_obs).
"""

from __future__ import annotations

from kernels.crve.spec import BootstrapParams, MonteCarloParams
from kernels.registry import DatasetRows, Work


def montecarlo_work(params: MonteCarloParams, _rows: DatasetRows) -> Work:
    observations = sum(params.design_sizes or ()) or params.n_clusters * params.cluster_size
    draws = params.n_clusters * params.bootstrap_reps if params.test == "wild_bootstrap" else 0
    return Work(float(params.replications) * (observations + draws),
                "replications x (observations + clusters x bootstrap_reps)", "params.replications")


def bootstrap_work(params: BootstrapParams, rows: DatasetRows) -> Work:
    n_rows = rows.get("dataset_id") or (params.synthetic.n_obs if params.synthetic is not None else 0)
    return Work(float(params.reps) * n_rows, "reps x rows", "params.reps")
