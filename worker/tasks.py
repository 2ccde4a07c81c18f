"""The worker's Celery entry points: the tasks (a job, a chunk of a fanned-out job, a chord's reduction) and
the worker's start, ready and warm-shutdown hooks. Start a worker with
``celery -A worker.tasks:celery_app worker ...``.

What the tasks run lives below: the execute path of a job (worker/execute.py), of a chunk and the reduction
(worker/fanout.py), the reaper (worker/reaper.py), the device warm-up (worker/warm_up.py).
"""

from __future__ import annotations

import sys
import threading
import traceback
from typing import Any

import structlog
from celery.signals import worker_init, worker_ready, worker_shutting_down
from sqlalchemy.exc import SQLAlchemyError

import core.queue
from core.logging import configure_worker_logging
from core.queue import RUN_JOB_TASK
from core.settings import get_settings
from kernels import backend
from kernels.backend import GPUUnavailableError
from kernels.registry import add_kind_modules, registry
from store.migrate import SchemaNotMigratedError, ensure_migrated
from worker import fanout, reaper
from worker.device import worker_device
from worker.execute import WORKER_ID, execute_job
from worker.health import touch
from worker.progress import worker_stopping
from worker.warm_up import CUDA_CACHE_DIR_NAME, warm_up_gpu
from worker.webhooks import webhook_loop

log = structlog.get_logger("gpuest.worker")


celery_app = core.queue.get_celery_app()


# Exit status of a worker that refuses to start (EX_CONFIG of sysexits.h: a configuration problem).
EXIT_NOT_READY = 78


@celery_app.task(name=RUN_JOB_TASK)
def run_job(job_id: str) -> str | None:
    reaper.activity.started()
    try:
        status = execute_job(job_id)
        return None if status is None else status.value
    finally:
        reaper.activity.finished()


@celery_app.task(name=fanout.RUN_CHUNK_TASK, ignore_result=False)
def run_chunk(job_id: str, chunk_id: str) -> str:
    """A part of a fanned-out job's chord (worker/fanout.py). The chord counts a part when its task returns,
    so the task returns only once the chunk has ended (the database says how); a chunk handed back, left to
    the reaper or run by another worker ends with ``Ignore`` (no result, not counted): the run that ends it,
    under the same task id, is the part that counts."""
    from celery.exceptions import Ignore

    reaper.activity.started()
    try:
        fanout.execute_chunk(chunk_id, WORKER_ID)
    except Exception:  # never fail the chord part: the reaper and the chunk's row take it from here
        log.error("chunk task failed", job_id=job_id, chunk_id=chunk_id, traceback=traceback.format_exc())
    finally:
        reaper.activity.finished()
    if not fanout.chunk_ended(chunk_id):
        raise Ignore()
    return chunk_id


@celery_app.task(name=fanout.REDUCE_TASK)
def reduce_chunks(job_id: str) -> None:
    """The chord's callback: reduce the chunks into the job's result (a reaper does it if this is lost)."""
    fanout.settle(job_id)


def refuse_to_start(reason: str) -> None:
    """One line on the real stderr (Celery has not redirected it yet) and a non-zero exit."""
    print(f"gpuest worker: refusing to start: {reason}", file=sys.__stderr__, flush=True)
    raise SystemExit(EXIT_NOT_READY)


@worker_init.connect
def _prepare_worker(**_kwargs: Any) -> None:
    """In the worker's main process before it consumes: logging, the schema check, the kernel modules."""
    configure_worker_logging()
    try:
        ensure_migrated()
    except SchemaNotMigratedError as exc:
        refuse_to_start(str(exc))
    except SQLAlchemyError as exc:
        refuse_to_start(f"cannot read the database schema: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    try:
        backend.get_namespace()
    except (GPUUnavailableError, ValueError) as exc:
        # A worker that reports healthy and then fails every job helps no one: GPUEST_DEVICE=gpu
        # on a host where CuPy sees no GPU (no driver, no device passed to the container) stops here.
        refuse_to_start(f"{exc} (set GPUEST_DEVICE=cpu or auto to compute on the CPU)")
    # Import every kernel module now rather than inside the first job (seconds of SciPy and pandas imports
    # that would otherwise count as that job's run time, in stage "starting"). Declaring a CUDA source
    # compiles nothing, so the disk cache below is still in place before the first compile.
    add_kind_modules(*get_settings().extra_kind_modules)
    registry()
    warm_up_gpu(get_settings().data_dir / CUDA_CACHE_DIR_NAME)


@worker_shutting_down.connect
def _stop_running_job(**_kwargs: Any) -> None:
    # Runs in the signal handler of the main process (the solo pool's job thread): only set a flag, which
    # the job's next progress checkpoint turns into WorkerStopping.
    worker_stopping.set()


@worker_ready.connect
def _start_reaper(**_kwargs: Any) -> None:
    settings = get_settings()
    if settings.worker_alive_file is not None:
        touch(settings.worker_alive_file)
    threading.Thread(
        target=reaper.reaper_loop, args=(settings.reaper_interval_seconds, settings.worker_alive_file),
        name="gpuest-reaper", daemon=True,
    ).start()
    # Webhook deliveries in their own thread: a slow receiver must not hold up the reaper's rescues.
    threading.Thread(target=webhook_loop, args=(settings.webhook_interval_seconds,), name="gpuest-webhooks",
                     daemon=True).start()
    log.info("worker ready", worker=WORKER_ID, device=_default_device(), queue=settings.queue)


def _default_device() -> str:
    try:
        return worker_device(backend.get_namespace())
    except (GPUUnavailableError, ValueError):
        return "unavailable"
