"""Service settings from the environment (pydantic-settings): one place for every knob.

The embedded default needs no server: SQLite for the database and kombu's SQLAlchemy transport over a
second SQLite file as the Celery broker, both under ``GPUEST_DATA_DIR``.
"""

from __future__ import annotations

import ipaddress
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path("var")
# Older per-kind fan-out settings -> the fanout_min_work entry each stands for.
FORMER_FANOUT_THRESHOLDS = {
    "fanout_min_bootstrap_weights": "crve_bootstrap",
    "fanout_min_analysis_rows": "sccs_analyses",
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUEST_", extra="ignore")

    data_dir: Path = Field(DEFAULT_DATA_DIR, description="Datasets, artifacts and the embedded SQLite files")
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "GPUEST_DATABASE_URL"),
        description="SQLAlchemy URL, e.g. `postgresql+psycopg://user:pw@host/db`; default "
        "`sqlite:///<data_dir>/gpuest.sqlite3`",
    )
    broker_url: str | None = Field(
        None,
        validation_alias=AliasChoices("BROKER_URL", "REDIS_URL", "GPUEST_BROKER_URL"),
        description="Celery broker URL, e.g. `redis://host:6379/0`; default `sqla+sqlite:///<data_dir>/broker.sqlite3`",
    )
    auth_enabled: bool = Field(
        True, description="Require `Authorization: Bearer <api key>` (`gpuest serve` sets it to false unless it is set)"
    )
    local_owner: str = Field("local", description="Owner of every job and dataset when auth is off")
    cookie_secure: Literal["auto", "true", "false"] = Field(
        "auto", description="Mark the dashboard's session and CSRF cookies `Secure`: `true` always (the service is "
        "reached over HTTPS only), `false` never, `auto` when the request arrived over HTTPS (behind a TLS proxy "
        "only if uvicorn trusts its `X-Forwarded-Proto`: `FORWARDED_ALLOW_IPS`)"
    )
    max_upload_bytes: int = Field(
        512 * 1024 * 1024, ge=1, description="Largest dataset upload accepted, counted as sent and again once "
        "decompressed (a gzipped CSV, a Parquet file's columns)"
    )
    heartbeat_seconds: float = Field(2.0, gt=0, description="How often a running job writes its heartbeat")
    stale_after_seconds: float = Field(
        30.0, gt=0, description="A running job silent this long is reaped (re-queued or failed)"
    )
    reaper_interval_seconds: float = Field(5.0, gt=0, description="How often the worker looks for stale jobs")
    max_attempts: int = Field(3, ge=1, description="Runs a job gets before a lost worker fails it")
    visibility_timeout_seconds: int = Field(
        43_200, ge=60, description="Redis redelivery delay (longer than the longest job)"
    )
    queue: str = Field("gpu", description="Celery queue the API sends to and the worker consumes")
    # One job fanned out over the workers of its queue as a Celery chord (worker/fanout.py, docs/scaling.md)
    fanout_chunks: int = Field(
        0, ge=0, le=1024,
        description="Chunks a splittable job (crve_montecarlo; sccs_fit's CV or bootstrap; sccs_analyses; a large "
        "crve_bootstrap) is fanned out into, for "
        "the workers of its queue; "
        "0 or 1: every job runs whole on one worker (`gpuest serve --gpus/--workers N` sets N)",
    )
    fanout_min_blocks: int = Field(
        4, ge=2, description="Fan out only a job of at least this many blocks of replications (a block is the "
        "unit its single run sums; for sccs_fit: variances of the CV grid, or bootstrap replicates / 10; smaller "
        "jobs run whole)",
    )
    fanout_min_work: dict[str, float] = Field(
        default_factory=dict, description="Per kind, the least work of a job worth fanning out, as JSON in the "
        'units its split compares with: {"crve_bootstrap": 3e10, "sccs_analyses": 2e8} (the defaults: bootstrap '
        "weights, bootstrap clusters x B; covariate rows). Below it a part's set-up and hand-overs outweigh the "
        "work it takes off the others (docs/scaling.md); kinds not named keep their own default",
    )
    fanout_min_bootstrap_weights: float | None = Field(
        None, ge=0, description="The crve_bootstrap entry of fanout_min_work (an older name, used where that "
        "entry is not set)",
    )
    fanout_min_analysis_rows: int | None = Field(
        None, ge=1, description="The sccs_analyses entry of fanout_min_work (an older name, used where that entry "
        "is not set)",
    )
    extra_kind_modules: list[str] = Field(
        default_factory=list, description='Modules beyond the product\'s whose KINDS the API and the workers '
        'serve too, as JSON: ["tests.kinds.echo"] (kernels/README.md, "Adding a fifth estimator")',
    )
    result_backend_url: str | None = Field(
        None, description="Celery result backend the chords of fanned-out jobs count their parts in; default: "
        "the broker's Redis, else `db+sqlite:///<data_dir>/celery-results.sqlite3`",
    )
    worker_alive_file: Path | None = Field(
        None, description="File the worker touches after each reaper pass; `python -m worker.health` checks its age "
        "(a container healthcheck)"
    )
    key_secret: SecretStr | None = Field(
        None, min_length=16,
        description="Server secret of the API keys' keyed hash (HMAC-SHA256); default: generated once into "
        "`<data_dir>/key_secret` (mode 0600, never logged). Every API process and `gpuest keys` must share it (set "
        "it where they do not share a data dir); changing it invalidates every key",
    )
    metrics_token: SecretStr | None = Field(
        None, min_length=16,
        description="`Authorization: Bearer <token>` on `/metrics` adds every owner's job counts, queue depth and "
        "run times; on `/readyz`, the driver's reason a check failed (host, port)",
    )
    expose_details: bool = Field(
        False, description="Show those `/metrics` and `/readyz` details without the token (trusted networks; always "
        "shown with auth off)"
    )
    retention_days: float = Field(
        0.0, ge=0, description="Finished jobs, with their results and artifacts, are deleted this many days "
        "after they finished (by the workers' reaper); 0 keeps them until their owner deletes them "
        "(`DELETE /v1/jobs/{id}`)"
    )
    retention_days_by_owner: dict[str, float] = Field(
        default_factory=dict, description='Per-owner retention in days, as JSON: {"alice": 30, "ci": 1}; '
        "0 keeps that owner's jobs; owners not named get retention_days"
    )
    max_active_jobs_per_owner: int = Field(
        0, ge=0, description="Queued plus running jobs an owner may have at once; a submission beyond it is "
        "answered 429 with `Retry-After` (a replayed POST is never refused); 0: no limit"
    )
    max_stored_bytes_per_owner: int = Field(
        0, ge=0, description="Bytes of stored datasets an owner may keep; an upload beyond it is answered 429 "
        "and nothing is stored; 0: no limit"
    )
    quota_retry_after_seconds: int = Field(30, ge=1, description="`Retry-After` of a 429 for the running-jobs quota")
    max_group_jobs: int = Field(
        10_000, ge=1, le=100_000, description="Most member jobs one job group (sweep) may create; a larger grid "
        "or list of specs is answered 422"
    )
    max_group_params_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Most bytes (compact JSON) a job group's members' specs may total "
        "once expanded: each member's base plus its grid values or spec, computed before the grid is expanded; a "
        "larger group is answered 422"
    )
    admin_key: SecretStr | None = Field(
        None,  # its form is checked where it is used (a clear one-line error, not a settings traceback)
        description="An API key (`gpe_` and at least 32 characters; e.g. `gpe_$(openssl rand -hex 24)`) that "
        "`gpuest db upgrade` (the compose stack's migrate service) registers for admin_owner if it is not "
        "registered yet: the first key of a stack without `docker compose exec`; a revoked one stays revoked",
    )
    admin_key_file: Path | None = Field(
        None, description="File holding admin_key (a Docker/Compose secret, e.g. `/run/secrets/gpuest_admin_key`)"
    )
    admin_owner: str = Field("admin", min_length=1, description="Owner the admin key acts as")
    # webhooks: store/webhooks.py signs, worker/webhooks.py delivers
    webhook_secret: SecretStr | None = Field(
        None, min_length=16,
        description="Server secret the per-owner webhook signing secrets are derived from (HMAC-SHA256); "
        "default: generated once into `<data_dir>/webhook_secret` (mode 0600). API and workers must see the same one",
    )
    webhook_allow_http: bool = Field(
        False, description="Accept plain-http `callback_url` targets on any host (default: https, or http to a "
        "loopback address only)"
    )
    webhook_http_hosts: list[str] = Field(
        default_factory=list, description='Hosts that may be called over plain http besides loopback, as JSON: '
        '["receiver.internal"]'
    )
    webhook_allowed_networks: list[str] = Field(
        default_factory=list, description='Networks webhook targets may resolve to although they are not public '
        '(private, loopback, link-local, reserved), as JSON CIDRs: ["10.20.0.0/16", "::1/128"]; a cloud metadata '
        'address only when listed as itself (a /32 or /128). `gpuest serve` with auth off sets loopback unless this '
        "is set"
    )
    webhook_max_attempts: int = Field(8, ge=1, le=30, description="Delivery attempts before a webhook is given up")
    webhook_backoff_seconds: float = Field(
        10.0, gt=0, description="Wait after the first failed delivery; doubled after each further failure"
    )
    webhook_backoff_max_seconds: float = Field(3600.0, gt=0, description="Longest wait between two attempts")
    webhook_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="Total deadline of one delivery attempt: connect, TLS, the request and the "
        "response's status line and headers together (redirects are never followed, the body is never read)"
    )
    webhook_concurrency: int = Field(
        8, ge=1, le=64, description="Delivery attempts one worker makes at once"
    )
    webhook_owner_concurrency: int = Field(
        2, ge=1, le=64, description="Delivery attempts of one owner's webhooks one worker makes at once (a slow "
        "receiver holds at most this many of the worker's webhook_concurrency)"
    )
    webhook_interval_seconds: float = Field(
        1.0, gt=0, description="How often a worker looks for finished jobs and groups with a webhook to deliver"
    )
    public_url: str | None = Field(
        None, description="Base URL of the API as clients reach it (e.g. https://gpuest.example.org): webhook "
        "bodies carry absolute links under it; unset, they carry paths such as `/v1/jobs/ID/result`",
    )
    # work per job on CPU workers (kernels/work.py defines each kind's measure)
    cpu_max_work: dict[str, float] = Field(
        default_factory=dict, description='Largest work per job on a CPU worker, per kind, as JSON: '
        '{"crve_montecarlo": 2e9, "ks_solve": 5e10} (units in kernels/work.py; 0: no cap); a kind not named keeps '
        "its default cap (README: CPU work cap). Refused at submission (422) where the API knows jobs run on CPU "
        "(`GPUEST_DEVICE=cpu`, or the embedded stack without a GPU), else failed by the CPU worker before it "
        "computes",
    )
    cpu_max_job_bytes: int = Field(
        8 * 1024**3, ge=0, description="Largest memory estimate of one job on a CPU worker (each kind's estimate, "
        "kernels/<family>/work.py); refused and failed as GPUEST_CPU_MAX_WORK; 0: no memory cap",
    )
    # datasets are read by memory-mapping a decoded copy rather than decoding their Parquet file each run
    decoded_dir: Path | None = Field(
        None, description="Where workers keep Arrow IPC copies of the datasets they read (memory-mapped: a run "
        "reads its tables without decoding them); default `<data_dir>/decoded`; a disk of the GPU host where the "
        "data directory is shared (docs/scaling.md)",
    )
    decoded_max_bytes: int = Field(
        32 * 1024**3, ge=0, description="Most bytes of decoded copies kept (least recently read go first); 0: "
        "none, every run decodes the dataset's Parquet file",
    )
    max_upload_rows: int = Field(20_000_000, ge=1, description="Most data rows a dataset upload may hold")
    max_upload_columns: int = Field(1_000, ge=1, description="Most columns a dataset upload may hold")
    max_upload_memory_bytes: int = Field(
        256 * 1024 * 1024, ge=1024 * 1024, description="Memory an upload's conversion may take for its table "
        "(decoded batches, a dictionary-encoded column's decoded values); a file that would need more at once (a "
        "row wider than it) is answered 413 naming it",
    )
    stale_part_seconds: float = Field(
        3600.0, gt=0, description="At an API process's start, temporary files of uploads and datasets (`.*.part` "
        "under `<data_dir>/uploads` and `<data_dir>/datasets`) untouched this long are removed: left by a process "
        "killed mid-upload; a live upload of another process writes its file and stays younger",
    )
    worker_retry_seconds: float = Field(
        15.0, gt=0, description="How long a worker retries a database or broker call (claim, dataset read) before "
        "leaving the job to the reaper"
    )
    worker_result_retry_seconds: float = Field(
        120.0, gt=0, description="How long a worker retries storing a finished job's outcome (kept on disk meanwhile) "
        "before leaving it to the job's next run"
    )
    # a time limit per job (worker/time_limit.py): a hung kernel frees its device
    time_limit_factor: float = Field(
        10.0, ge=0, description="A job's soft time limit is this many times its estimated run time (its kind's "
        "work estimate, kernels/work.py, over the kind's throughput); past it the job's next progress checkpoint "
        "fails it with error code time_limit; 0: no time limits",
    )
    time_limit_work_per_second: dict[str, float] = Field(
        default_factory=dict, description='Work units a second a worker computes, per kind, as JSON: '
        '{"crve_montecarlo": 1e9} (units in kernels/work.py); kinds not named use '
        "time_limit_default_work_per_second",
    )
    time_limit_default_work_per_second: float = Field(
        1e7, gt=0, description="Work units a second assumed for a kind not in time_limit_work_per_second (a slow "
        "CPU's pace, so that the soft limit errs long)",
    )
    time_limit_min_seconds: float = Field(
        1800.0, gt=0, description="Shortest soft time limit of a job (a small job's estimate is noise)"
    )
    time_limit_max_seconds: float = Field(
        43_200.0, gt=0, description="Longest soft time limit of a job, and the limit of a kind without a work "
        "estimate",
    )
    time_limit_grace_seconds: float = Field(
        60.0, gt=0, description="The hard time limit follows the soft one by this much: a job that reached no "
        "progress checkpoint by then is failed with error code time_limit and its worker process exits (freeing "
        "the device; its supervisor restarts it)",
    )

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        """Each entry a CIDR (host bits may be set: ``10.1.2.3/8`` means 10.0.0.0/8), kept in normal form."""
        return [str(ipaddress.ip_network(entry.strip(), strict=False)) for entry in value]

    @model_validator(mode="after")
    def _former_fanout_thresholds(self) -> Settings:
        for field, kind in FORMER_FANOUT_THRESHOLDS.items():
            value = getattr(self, field)
            if value is not None:
                self.fanout_min_work.setdefault(kind, float(value))
        return self

    def resolved_admin_key(self) -> str | None:
        """admin_key, or the first line of admin_key_file; None when neither is set (or the file is empty)."""
        if self.admin_key is not None and self.admin_key.get_secret_value().strip():  # "": unset (compose's ${...:-})
            return self.admin_key.get_secret_value().strip()
        if self.admin_key_file is not None:
            text = self.admin_key_file.read_text().strip()
            return text.splitlines()[0].strip() if text else None
        return None

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'gpuest.sqlite3').resolve()}"

    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.data_dir / 'broker.sqlite3').resolve()}"

    def resolved_result_backend_url(self) -> str:
        if self.result_backend_url:
            return self.result_backend_url
        broker = self.resolved_broker_url()
        if broker.startswith(("redis://", "rediss://")):
            return broker
        return f"db+sqlite:///{(self.data_dir / 'celery-results.sqlite3').resolve()}"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def resolved_decoded_dir(self) -> Path:
        return self.decoded_dir or self.data_dir / "decoded"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"


@cache
def get_settings() -> Settings:
    return Settings()
