"""The embedded stack: migrations, then uvicorn and a real Celery worker as two supervised processes.

Both children get the same environment: the data directory, the database and broker URLs (SQLite and
kombu's SQLAlchemy transport over SQLite under the data directory unless DATABASE_URL / BROKER_URL say
otherwise) and the auth switch. A supervisor thread restarts a child that dies (a worker killed with
``kill -9`` comes back and the reaper re-runs its job). Children run in their own session so a terminal's
Ctrl-C reaches only this process, which then stops them in order: SIGTERM, a grace period, SIGKILL (and
says so). On SIGTERM the worker hands a running job back to the queue at the job's next progress
checkpoint (worker/tasks.py hands it back), so the job runs again first thing when the stack comes back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
from pydantic_settings import EnvSettingsSource

from core.settings import Settings
from store.migrate import upgrade_to_head

STOP_GRACE_SECONDS = 10.0
STARTUP_TIMEOUT_SECONDS = 60.0
MAX_RESTART_DELAY_SECONDS = 10.0
STABLE_RUN_SECONDS = 60.0
LOOPBACK_NETWORKS = '["127.0.0.0/8", "::1/128"]'
_PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once in the parent: the function run between fork and exec must do nothing but the syscall.
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the thread that started us dies (no orphaned worker)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Settings as a child started with ``env`` will read them.

    ``env`` is this process's environment plus overrides, so the overrides passed as inputs are what differ.
    """
    inputs: dict[str, object] = {}
    source = EnvSettingsSource(Settings)
    for name, value in env.items():
        upper = name.upper()
        if upper in {"DATABASE_URL", "BROKER_URL", "REDIS_URL", "GPUEST_DATABASE_URL", "GPUEST_BROKER_URL"}:
            inputs[upper] = value
        elif upper.startswith("GPUEST_"):
            key = upper.removeprefix("GPUEST_").lower()
            model_field = Settings.model_fields.get(key)
            # JSON-valued settings (dicts and lists) are decoded as the child's environment source decodes them
            complex_value = model_field is not None and value and source.field_is_complex(model_field)
            inputs[key] = source.decode_complex_value(key, model_field, value) if complex_value else value
    return Settings.model_validate(inputs)


class StackStartError(RuntimeError):
    """The embedded stack could not start; the message says why."""


def ensure_port_free(host: str, port: int) -> None:
    """Fail before starting anything if the port is taken (else another server could answer our health probe)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise StackStartError(f"cannot listen on {host}:{port}: {error.strerror}; choose another --port") from None


def stack_environment(data_dir: Path, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment both children share; explicit URLs so that API and worker cannot disagree."""
    env = dict(os.environ)
    env.update(overrides or {})
    env["GPUEST_DATA_DIR"] = str(data_dir.resolve())
    # Embedded default: no auth (a local, single-user service); GPUEST_AUTH_ENABLED=true turns it on.
    env.setdefault("GPUEST_AUTH_ENABLED", "false")
    settings = settings_from_env(env)
    env["DATABASE_URL"] = settings.resolved_database_url()
    env["BROKER_URL"] = settings.resolved_broker_url()
    if env["GPUEST_AUTH_ENABLED"].strip().lower() not in {"1", "true", "yes", "on"}:
        # A local, single-user service: its webhook receiver is usually on this machine too.
        env.setdefault("GPUEST_WEBHOOK_ALLOWED_NETWORKS", LOOPBACK_NETWORKS)
    # The repository root on the path, so `python -m celery -A worker...` finds the packages from any cwd.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class ManagedProcess:
    """One child process the stack starts, watches and restarts."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path | None
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        if self.log_path is not None and self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log is not None else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # only the prctl syscall runs between fork and exec
        )
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> bool:
        """SIGTERM, then SIGKILL if it is still running after ``grace`` seconds; True when it had to be killed."""
        process = self.process
        killed = False
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=grace)
                killed = True
        if self._log is not None:
            self._log.close()
            self._log = None
        return killed

    def log_tail(self, characters: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-characters:].decode(errors="replace")


@dataclass
class EmbeddedStack:
    """A running embedded stack: the API's ``base_url``, its supervised children (the API, the first worker
    and ``more_workers``: one per GPU with ``--gpus``, or ``--cpu-workers`` of them), and its settings."""

    base_url: str
    data_dir: Path
    env: dict[str, str]
    api: ManagedProcess
    worker: ManagedProcess
    say: Callable[[str], None]
    more_workers: list[ManagedProcess] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)

    @property
    def workers(self) -> list[ManagedProcess]:
        return [self.worker, *self.more_workers]

    @property
    def auth_enabled(self) -> bool:
        return self.env.get("GPUEST_AUTH_ENABLED", "").strip().lower() in {"1", "true", "yes", "on"}

    @property
    def worker_pid(self) -> int | None:
        return self.worker.pid

    def supervise(self, poll_seconds: float = 0.5) -> None:
        """Restart whichever child exits while the stack is meant to run (with a growing delay)."""
        delays = {id(child): 0.5 for child in (self.api, *self.workers)}
        while not self._stopping.wait(poll_seconds):
            for child in (*self.workers, self.api):
                code = child.exit_code()
                if code is None or self._stopping.is_set():
                    continue
                if time.monotonic() - child.started_at > STABLE_RUN_SECONDS:
                    delays[id(child)] = 0.5  # it had been running fine: a crash, not a crash loop
                delay = delays[id(child)]
                self.say(f"gpuest: the {child.name} process (pid {child.pid}) exited with code {code}; "
                         f"restarting it in {delay:.1f} s")
                if self._stopping.wait(delay):
                    return
                child.restarts += 1
                child.start()
                self.say(f"gpuest: {child.name} restarted (pid {child.pid})")
                delays[id(child)] = min(delay * 2, MAX_RESTART_DELAY_SECONDS)

    def start_supervisor(self) -> None:
        self._supervisor = threading.Thread(target=self.supervise, name="gpuest-supervisor", daemon=True)
        self._supervisor.start()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop supervising, then the API (no new jobs), then the worker (it finishes or is killed)."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=grace)
        for child in (self.api, *self.workers):
            if child.stop(grace):
                # Silence here would hide why a job re-ran: a killed worker's job waits for the reaper.
                self.say(self.killed_message(child, grace))

    @staticmethod
    def killed_message(child: ManagedProcess, grace: float) -> str:
        message = f"gpuest: the {child.name} process (pid {child.pid}) did not stop within {grace:g} s; killed it"
        if child.name.startswith("worker"):
            message += " (a job it was running stays 'running' until a worker's reaper re-queues it)"
        return message


def worker_argv(queue: str, name: str | None = None) -> list[str]:
    # Gossip, mingle and the event heartbeat talk to other workers over broadcast exchanges: one worker per
    # GPU needs none of it, and skipping mingle saves a second at start.
    argv = [
        sys.executable, "-m", "celery", "-A", "worker.tasks:celery_app", "worker",
        "-Q", queue, "--pool", "solo", "--concurrency", "1", "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    return argv if name is None else [*argv, "-n", f"{name}@%h"]


def visible_gpu_count() -> int:
    """GPUs CuPy can use in this process's environment (0 without CuPy or a driver)."""
    try:
        import cupy  # optional extra

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # ImportError, no driver, no device: none usable either way
        return 0


def worker_environments(
    gpus: int = 0, cpu_workers: int | None = None, gpu_count: Callable[[], int] = visible_gpu_count
) -> list[dict[str, str]]:
    """What each worker process adds to the shared environment: with ``gpus`` one worker per GPU, pinned to
    it with ``CUDA_VISIBLE_DEVICES`` (a number of the parent's own list when that is set) and refusing to
    compute on anything else; with ``cpu_workers`` that many workers on the CPU; else one worker on the
    configured device. Raises :class:`StackStartError` with one line when the GPUs are not there."""
    if gpus and cpu_workers:
        raise StackStartError("--gpus and --cpu-workers exclude each other: the workers of one queue compute on "
                              "one kind of device (a fanned-out job's chunks are summed as one run's)")
    if gpus:
        found = gpu_count()
        if found == 0:
            raise StackStartError(f"--gpus {gpus}: no GPU is usable through CuPy on this machine (no CuPy, driver "
                                  "or device); run CPU workers with --cpu-workers N")
        if gpus > found:
            raise StackStartError(f"--gpus {gpus}: this machine has {found} usable GPU(s)")
        inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        devices = [item.strip() for item in inherited.split(",")] if inherited else [str(i) for i in range(found)]
        return [{"CUDA_VISIBLE_DEVICES": device, "GPUEST_DEVICE": "gpu"} for device in devices[:gpus]]
    if cpu_workers:
        return [{"GPUEST_DEVICE": "cpu"} for _ in range(cpu_workers)]
    return [{}]


def api_argv(host: str, port: int, workers: int = 1) -> list[str]:
    argv = [sys.executable, "-m", "uvicorn", "api.app:app", "--host", host, "--port", str(port), "--no-access-log",
            "--http", "api.http_protocol:ProblemHttpToolsProtocol"]  # malformed requests answered as problem+json
    # More than one: uvicorn's supervisor process forks that many servers sharing the socket.
    return argv if workers == 1 else [*argv, "--workers", str(workers)]


def prepare_broker(broker_url: str, queue: str) -> None:
    """Declare the queue once so the SQLAlchemy transport creates its tables before two processes race to."""
    if not broker_url.startswith("sqla+"):
        return
    from kombu import Connection

    with warnings.catch_warnings():
        # kombu's transport uses a loader option SQLAlchemy 2.1 deprecates; nothing for us to act on.
        warnings.simplefilter("ignore", DeprecationWarning)
        with Connection(broker_url) as connection:
            connection.default_channel.queue_declare(queue=queue, durable=True)


def prepare_result_backend(backend_url: str) -> None:
    """Create the SQLite result backend's tables once (the chords of fanned-out jobs count their parts there)
    before several processes race to create them at their first send."""
    if not backend_url.startswith("db+"):
        return
    from celery import Celery

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        app = Celery("gpuest-prepare", backend=backend_url)
        app.backend  # noqa: B018 - building the database backend creates its tables
        app.close()


def wait_until_healthy(base_url: str, api: ManagedProcess, timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.exit_code() is not None:
            raise StackStartError(f"the API process exited with code {api.exit_code()} at start:\n{api.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/healthz", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise StackStartError(f"the API did not answer /healthz within {timeout:.0f} s:\n{api.log_tail()}")


@contextmanager
def embedded_stack(
    data_dir: Path,
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
    cwd: Path | None = None,
    api_workers: int = 1,
    gpus: int = 0,
    cpu_workers: int | None = None,
) -> Iterator[EmbeddedStack]:
    """Run the embedded stack until the block exits; yields it once ``/healthz`` answers.

    ``port=None`` picks a free port; ``env`` adds or overrides environment variables for every child;
    ``log_dir`` sends their output to ``api.log`` / ``worker.log`` (``worker-1.log`` ...) there instead of
    this terminal; ``api_workers`` > 1 runs that many uvicorn server processes; ``gpus`` runs one worker per
    GPU, ``cpu_workers`` that many CPU workers (:func:`worker_environments`). With several workers, a
    splittable job is fanned out into one chunk per worker unless ``GPUEST_FANOUT_CHUNKS`` says otherwise.
    """
    say = say or (lambda message: print(message, file=sys.stderr, flush=True))
    placements = worker_environments(gpus, cpu_workers)
    if port:
        ensure_port_free(host, port)
    data_dir.mkdir(parents=True, exist_ok=True)
    child_env = stack_environment(data_dir, env)
    if len(placements) > 1:
        child_env.setdefault("GPUEST_FANOUT_CHUNKS", str(len(placements)))
    settings = settings_from_env(child_env)
    queue = settings.queue
    upgrade_to_head(child_env["DATABASE_URL"])
    prepare_broker(child_env["BROKER_URL"], queue)
    prepare_result_backend(settings.resolved_result_backend_url())
    port = port or free_port(host)
    base_url = f"http://{host}:{port}"
    workdir = cwd or data_dir.resolve()

    def worker_process(index: int) -> ManagedProcess:
        name, log_name = ("worker", "worker.log") if index == 0 else (f"worker-{index}", f"worker-{index}.log")
        return ManagedProcess(
            name, worker_argv(queue, name if len(placements) > 1 else None), {**child_env, **placements[index]},
            workdir, log_dir and log_dir / log_name,
        )  # fmt: skip

    stack = EmbeddedStack(
        base_url=base_url,
        data_dir=data_dir.resolve(),
        env=child_env,
        api=ManagedProcess(
            "API", api_argv(host, port, api_workers), child_env, workdir, log_dir and log_dir / "api.log"
        ),
        worker=worker_process(0),
        say=say,
        more_workers=[worker_process(index) for index in range(1, len(placements))],
    )
    try:
        for worker in stack.workers:
            worker.start()
        stack.api.start()
        wait_until_healthy(base_url, stack.api)
        stack.start_supervisor()
        yield stack
    finally:
        stack.stop()


def _raise_keyboard_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def serve_forever(
    host: str, port: int, data_dir: Path, say: Callable[[str], None], *, api_workers: int = 1, gpus: int = 0,
    cpu_workers: int | None = None,
) -> None:
    """``gpuest serve``: run the stack in the foreground until Ctrl-C or SIGTERM, then stop both children."""
    # Installed explicitly: a shell starts background jobs with SIGINT ignored, and Python then never
    # raises KeyboardInterrupt.
    stop_signals = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, _raise_keyboard_interrupt) for signum in stop_signals}
    try:
        with embedded_stack(data_dir, port, host=host, say=say, api_workers=api_workers, gpus=gpus,
                            cpu_workers=cpu_workers) as stack:
            for line in banner(stack):
                say(line)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
            say("gpuest: stopping the API and the worker(s) ...")
    except KeyboardInterrupt:
        say("gpuest: interrupted during start-up; stopped")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    say("gpuest: stopped")


def _workers_line(stack: EmbeddedStack) -> str:
    def where(worker: ManagedProcess) -> str:
        gpu = worker.env.get("CUDA_VISIBLE_DEVICES") if worker.env.get("GPUEST_DEVICE") == "gpu" else None
        return f"{worker.pid} (GPU {gpu})" if gpu is not None else f"{worker.pid}"

    if len(stack.workers) == 1:
        return f"worker pid {where(stack.worker)}"
    chunks = stack.env.get("GPUEST_FANOUT_CHUNKS", "0")
    return (f"{len(stack.workers)} workers, pids {', '.join(where(worker) for worker in stack.workers)} "
            f"(a crve_montecarlo job of 4 blocks or more is fanned out into {chunks} chunks)")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a broker URL SQLAlchemy cannot parse: show only its scheme
        return url.split("://", 1)[0] + "://..."


def banner(stack: EmbeddedStack) -> list[str]:
    auth = (
        "auth: ON (send 'Authorization: Bearer <key>'; create one with "
        f"`gpuest keys --data-dir {shlex.quote(str(stack.data_dir))} create OWNER`)"
        if stack.auth_enabled
        else "auth: OFF (WARNING) — no API key needed, every request acts as the local owner; "
        "set GPUEST_AUTH_ENABLED=true to require keys"
    )
    header = ' -H "Authorization: Bearer $GPUEST_API_KEY"' if stack.auth_enabled else ""
    return [
        f"gpuest is running at {stack.base_url}  (API docs: {stack.base_url}/docs)",
        f"data directory: {stack.data_dir}",
        f"database: {_redact(stack.env['DATABASE_URL'])}",
        f"broker:   {_redact(stack.env['BROKER_URL'])}",
        _workers_line(stack) + f", API pid {stack.api.pid}",
        auth,
        "submit a job:",
        f"  curl -s -X POST {stack.base_url}/v1/jobs{header} -H 'Content-Type: application/json' \\",
        "    -d '{\"kind\": \"crve_montecarlo\", \"params\": {\"n_clusters\": 20, \"cluster_size\": 10, "
        "\"n_regressors\": 2, \"replications\": 200, \"seed\": 1}}'",
        "Ctrl-C stops the API and the worker (a running job goes back to the queue).",
    ]
