"""The ``gpuest`` command: submit and follow jobs, manage datasets, run the embedded stack, admin tasks."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.client import DEFAULT_URL, ApiError, GpuestClient, Job, page_items
from core.status import JobStatus

app = typer.Typer(help="gpuest: GPU estimation jobs as a web service.", no_args_is_help=True)
jobs_app = typer.Typer(help="List jobs.", no_args_is_help=True)
datasets_app = typer.Typer(help="Upload and list datasets.", no_args_is_help=True)
keys_app = typer.Typer(help="Admin: API keys (writes to the configured database directly).", no_args_is_help=True)
db_app = typer.Typer(help="Admin: the database schema.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(datasets_app, name="datasets")
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")

# Job stages, error messages and file names are data, never rich markup: only err's "[red]error:" is markup.
out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, soft_wrap=True)

UrlOption = Annotated[str, typer.Option("--url", envvar="GPUEST_URL", help="Base URL of the gpuest API.")]
KeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="GPUEST_API_KEY", help="API key (sent as a Bearer token).")
]


@contextmanager
def api_client(url: str, api_key: str | None) -> Iterator[GpuestClient]:
    """A client whose API errors end the command with the problem's text and exit code 1."""
    try:
        with GpuestClient(url, api_key) as client:
            yield client
    except ApiError as error:
        err.print(f"[red]error:[/red] {escape(error.describe())}", highlight=False)
        raise typer.Exit(1) from None
    except httpx.TransportError as error:
        err.print(f"[red]error:[/red] cannot reach {escape(url)}: {escape(str(error))}", highlight=False)
        raise typer.Exit(1) from None


def print_json(value: Any) -> None:
    out.print_json(json.dumps(value))


# Exit code of a spec file that cannot be used (missing, unreadable, not a {kind, params} object): distinct from
# 2 (the job failed) and 3 (cancelled), which --wait reports, and from 1 (the API refused the request).
EXIT_BAD_SPEC_FILE = 4


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-4`` and ``5E3`` are numbers (YAML 1.1, PyYAML's
    default, wants a dot in the mantissa and reads them as strings, which a numeric field then refuses)."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec file: the create body ``{kind, params}``, JSON for ``.json`` files, YAML (1.2 numbers)
    otherwise. A file that cannot be used ends the command with :data:`EXIT_BAD_SPEC_FILE`."""
    try:
        text = path.read_text()
        # _Yaml12Loader is a SafeLoader: no Python tags
        spec = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=_Yaml12Loader)
    except (OSError, ValueError, yaml.YAMLError) as error:
        _bad_spec_file(f"cannot read {path}: {error}")
    if not isinstance(spec, dict) or "kind" not in spec:
        _bad_spec_file(f"{path} must hold an object with 'kind' and 'params'")
    return spec


def _bad_spec_file(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(EXIT_BAD_SPEC_FILE)


def job_line(job: Job) -> str:
    progress = job.get("progress") or 0.0
    text = f"{job.get('id')}  {job.get('kind')}  {job.get('status')}  {progress:.0%}"
    if job.get("stage"):
        text += f"  {job.get('stage')}"
    if job.get("device"):
        text += f"  device={job.get('device')}"
    return text


def follow(client: GpuestClient, job: Job, poll_interval: float) -> Job:
    """Wait for a job with a progress bar; returns the terminal job object."""
    with Progress(
        TextColumn("[bold]{task.fields[status]}[/bold]"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[stage]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}", markup=False),
        console=err,
        transient=False,
    ) as bar:
        task = bar.add_task("job", total=1.0, status=job.get("status", ""), stage="", eta="")

        def on_progress(current: Job) -> None:
            bar.update(
                task,
                completed=float(current.get("progress") or 0.0),
                status=current.get("status", ""),
                stage=current.get("stage") or "",
                eta=eta_text(current.get("eta_seconds")),
            )

        return client.wait(job["id"], on_progress, poll_interval=poll_interval)


def eta_text(seconds: Any) -> str:
    """The job's ETA for the bar ("about 3 min left"), or nothing when the API has none."""
    if not isinstance(seconds, int | float):
        return ""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s left"
    if seconds < 5400:
        return f"about {round(seconds / 60)} min left"
    return f"about {seconds / 3600:.1f} h left"


def report_final(job: Job) -> None:
    status = job.get("status")
    if status == JobStatus.SUCCEEDED:
        out.print(f"job {job['id']} succeeded on {job.get('device') or '?'}")
        return
    error = job.get("error") or {}
    message = f": {error.get('type')}: {error.get('message')}" if error else ""
    out.print(f"job {job['id']} {status}{message}", highlight=False)
    raise typer.Exit(2 if status == JobStatus.FAILED else 3)


@app.command()
def submit(
    spec_file: Annotated[Path, typer.Argument(help="JSON or YAML file with the create body {kind, params} "
                                              "(and an optional callback_url for a webhook).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job with a progress bar until it ends.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Idempotency-Key header (default: a fresh UUID, safe to retry)")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls with --wait.")] = 0.5,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Submit a job; prints its id. With --wait, follows it and exits 0 if it succeeded, 2 failed, 3 cancelled;
    1 if the API refused the request, 4 if the spec file cannot be used."""
    spec = load_spec(spec_file)
    with api_client(url, api_key) as client:
        job = client.submit(spec["kind"], spec.get("params") or {}, idempotency_key or str(uuid.uuid4()),
                            callback_url=spec.get("callback_url"))
        out.print(job["id"], highlight=False)
        if wait:
            report_final(follow(client, job, poll_interval))


def load_group_spec(path: Path) -> dict[str, Any]:
    """A sweep file: the body of POST /v1/job-groups (``base`` and ``grid``, or ``specs``), JSON or YAML."""
    try:
        text = path.read_text()
        spec = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=_Yaml12Loader)
    except (OSError, ValueError, yaml.YAMLError) as error:
        _bad_spec_file(f"cannot read {path}: {error}")
    if not isinstance(spec, dict) or not ({"grid", "specs"} & set(spec)):
        _bad_spec_file(f"{path} must hold an object with 'base' and 'grid', or 'specs'")
    return spec


def group_line(group: dict[str, Any]) -> str:
    counts = ", ".join(f"{count} {status}" for status, count in (group.get("counts") or {}).items() if count)
    return f"{group.get('id')}  {group.get('status')}  {float(group.get('progress') or 0.0):.0%}  ({counts})"


@app.command()
def sweep(
    spec_file: Annotated[Path, typer.Argument(help="JSON or YAML: {base, grid} or {base?, specs}, optional name "
                                              "and priority (POST /v1/job-groups).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the group until every member has ended.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Idempotency-Key header (default: a fresh UUID, safe to retry)")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls with --wait.")] = 2.0,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Submit a sweep (job group); prints its id. With --wait, follows it and exits 0 if every member
    succeeded, 2 if one failed, 3 if it was cancelled; 1 if the API refused it, 4 if the file cannot be used."""
    body = load_group_spec(spec_file)
    with api_client(url, api_key) as client:
        group = client.submit_group(body, idempotency_key or str(uuid.uuid4()))
        out.print(group["id"], highlight=False)
        if not wait:
            return
        with Progress(TextColumn("[bold]{task.fields[status]}[/bold]"), BarColumn(), TaskProgressColumn(),
                      TextColumn("{task.fields[counts]}", markup=False), TimeElapsedColumn(), console=err) as bar:
            task = bar.add_task("group", total=1.0, status=group["status"], counts="")
            while group["status"] in (JobStatus.QUEUED, JobStatus.RUNNING):
                time.sleep(poll_interval)
                group = client.get_group(group["id"])
                bar.update(task, completed=float(group["progress"]), status=group["status"],
                           counts=group_line(group).split("  ", 3)[-1])
    out.print(group_line(group), highlight=False)
    if group["status"] != JobStatus.SUCCEEDED:
        raise typer.Exit(2 if group["status"] == JobStatus.FAILED else 3)


@app.command()
def group(
    group_id: str,
    results: Annotated[Path | None, typer.Option("--results", help="Write the results table here (.parquet: "
                                                 "Parquet, else CSV).")] = None,
    fields: Annotated[str | None, typer.Option(help="Result fields of the table, comma-separated (dotted paths); "
                                               "default: every top-level number or text")] = None,
    cancel: Annotated[bool, typer.Option("--cancel", help="Cancel the group's queued and running members.")]
    = False,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the finished group with its members, their "
                                         "results and artifacts (refused while a member is queued or running).")]
    = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Show a job group (status, progress, members per status); with --results, save its results table;
    --cancel or --delete it."""
    with api_client(url, api_key) as client:
        if cancel:
            print_json(client.cancel_group(group_id))
            return
        if delete:
            client.delete_group(group_id)
            err.print(f"deleted group {group_id}", markup=False)
            return
        if results is None:
            print_json(client.get_group(group_id))
            return
        fmt = "parquet" if results.suffix.lower() == ".parquet" else "csv"
        results.write_bytes(client.group_results(group_id, fields=fields, fmt=fmt))
    err.print(f"wrote {results}", markup=False)


@app.command()
def status(job_id: str, url: UrlOption = DEFAULT_URL, api_key: KeyOption = None) -> None:
    """Show a job object (status, progress, stage, device, timings, error)."""
    with api_client(url, api_key) as client:
        print_json(client.get_job(job_id))


@app.command()
def result(
    job_id: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the result JSON here.")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Fetch a finished job's result JSON (to stdout, or to -o FILE)."""
    with api_client(url, api_key) as client:
        value = client.result(job_id)
    if output is None:
        print_json(value)
    else:
        output.write_text(json.dumps(value, indent=2) + "\n")
        err.print(f"wrote {output}", markup=False)


@app.command()
def events(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print every event as the API's objects (a JSON list).")]
    = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """A job's log, oldest first: submitted, started, stages, re-queues, retries, webhook deliveries, its end."""
    items: list[dict[str, Any]] = []
    with api_client(url, api_key) as client:
        while True:  # every page (200 events a page)
            page = client.job_events(job_id, offset=len(items))
            items += page_items(page)
            if not page.get("next") or not page_items(page):
                break
    if as_json:
        print_json(items)
        return
    for event in items:
        out.print(f"{_short_time(event.get('at'))}  {event.get('level', ''):<7}  {event.get('type', ''):<16}  "
                  f"{event.get('message', '')}", highlight=False, markup=False)


@app.command()
def cancel(job_id: str, url: UrlOption = DEFAULT_URL, api_key: KeyOption = None) -> None:
    """Cancel a job: a queued one never runs; a running one stops at its next checkpoint."""
    with api_client(url, api_key) as client:
        out.print(job_line(client.cancel(job_id)), highlight=False)


@app.command()
def artifact(
    job_id: str,
    name: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Destination (default: NAME).")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Download one artifact of a job."""
    with api_client(url, api_key) as client:
        path = client.download_artifact(job_id, name, output or Path(name))
    err.print(f"wrote {path}", markup=False)


PLOT_FORMATS = ("svg", "png")


@app.command()
def plot(
    job_id: str,
    name: Annotated[str | None, typer.Argument(help="Plot name; leave out to list the job's plots.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Destination (default: NAME.svg).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="svg or png (default: from -o's suffix, else svg).")]
    = None,
    option: Annotated[list[str] | None, typer.Option(
        "--option", help="NAME=NUMBER, a plot option (the list shows them), e.g. --option mu=0.5; repeatable.")]
    = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Save one plot of a succeeded job as SVG or PNG (drawn by the service), or list its plots."""
    with api_client(url, api_key) as client:
        if name is None:
            for entry in client.plots(job_id):
                options = "".join(f"  [--option {o['name']}=...]" for o in entry.get("options") or [])
                out.print(f"{entry['name']}  {entry['title']}{options}", highlight=False, markup=False)
            return
        chosen = fmt or (output.suffix.lstrip(".").lower() if output is not None else "svg")
        if chosen not in PLOT_FORMATS:
            err.print(f"error: --format must be svg or png, not {chosen!r} (from the -o suffix or --format)",
                      markup=False)
            raise typer.Exit(1)
        path = client.download_plot(job_id, name, output or Path(f"{name}.{chosen}"), chosen,
                                    _plot_options(option or []))
    err.print(f"wrote {path}", markup=False)


def _plot_options(pairs: list[str]) -> dict[str, float]:
    """``NAME=NUMBER`` pairs as a mapping; a malformed one exits 1 with one line (the service checks the names)."""
    options = {}
    for pair in pairs:
        option_name, _, text = pair.partition("=")
        try:
            options[option_name.strip()] = float(text)
        except ValueError:
            err.print(f"error: --option wants NAME=NUMBER, not {pair!r}", markup=False)
            raise typer.Exit(1) from None
    return options


@jobs_app.command("list")
def jobs_list(
    kind: Annotated[str | None, typer.Option(help="Only this job kind.")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's list object.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """List your jobs, newest first."""
    with api_client(url, api_key) as client:
        page = client.list_jobs(kind=kind, status=status, limit=limit, offset=offset)
    if as_json:
        print_json(page)
        return
    table = Table("id", "kind", "status", "progress", "device", "created", box=box.SIMPLE)
    table.columns[0].no_wrap = True  # ids are what users copy: never truncated or folded
    for job in page_items(page):
        table.add_row(
            job.get("id"), job.get("kind"), job.get("status"), f"{job.get('progress') or 0:.0%}",
            job.get("device") or "", _short_time(job.get("created_at")),
        )
    print_table(table)
    out.print(f"{len(page_items(page))} of {page.get('total')} jobs", highlight=False)


def print_table(table: Table) -> None:
    # Piped output gets rich's 80 columns; a row of ids and kinds needs more to stay unabbreviated.
    Console(file=out.file, width=max(out.width, 120), markup=False).print(table)


def _short_time(value: str | None) -> str:
    return (value or "")[:19].replace("T", " ")


@datasets_app.command("upload")
def datasets_upload(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A .csv or .parquet")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole dataset object.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Upload a dataset; prints its id (use it in a job's params)."""
    with api_client(url, api_key) as client:
        dataset = client.upload_dataset(file)
    if as_json:
        print_json(dataset)
    else:
        out.print(dataset["id"], highlight=False)


@datasets_app.command("from-artifact")
def datasets_from_artifact(
    job_id: Annotated[str, typer.Argument(help="A succeeded job of yours")],
    artifact: Annotated[str, typer.Argument(help="One of its table artifacts, e.g. outcomes")],
    name: Annotated[str | None, typer.Option("--name", help="The dataset's name")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole dataset object.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Register a job's table artifact as a dataset (nothing downloaded); prints its id."""
    with api_client(url, api_key) as client:
        dataset = client.dataset_from_artifact(job_id, artifact, name)
    if as_json:
        print_json(dataset)
    else:
        out.print(dataset["id"], highlight=False)


@datasets_app.command("list")
def datasets_list(
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's list object.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """List your datasets."""
    with api_client(url, api_key) as client:
        page = client.list_datasets(limit=limit, offset=offset)
    if as_json:
        print_json(page)
        return
    table = Table("id", "name", "rows", "columns", "created", box=box.SIMPLE)
    table.columns[0].no_wrap = True
    for dataset in page_items(page):
        columns = ", ".join(f"{c.get('name')}:{c.get('dtype')}" for c in dataset.get("columns") or [])
        table.add_row(
            dataset.get("id"), dataset.get("name"), str(dataset.get("n_rows")), columns,
            _short_time(dataset.get("created_at")),
        )
    print_table(table)
    out.print(f"{len(page_items(page))} of {page.get('total')} datasets", highlight=False)


@datasets_app.command("delete")
def datasets_delete(dataset_id: str, url: UrlOption = DEFAULT_URL, api_key: KeyOption = None) -> None:
    """Delete a dataset and its stored file."""
    with api_client(url, api_key) as client:
        client.delete_dataset(dataset_id)
    err.print(f"deleted {dataset_id}", markup=False)


@app.command()
def kinds(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the README's job-kinds table.")] = False,
) -> None:
    """List the job kinds this installation can run (from the job registry), with their parameter models."""
    from cli.kinds import kind_rows, markdown_table

    if markdown:
        out.print(markdown_table(), highlight=False, markup=False)
        return
    table = Table("kind", "parameters", "dataset fields", "summary", box=box.SIMPLE)
    table.columns[0].no_wrap = table.columns[1].no_wrap = True
    for row in kind_rows():
        table.add_row(row.name, row.params_path, ", ".join(row.dataset_fields), row.summary)
    print_table(table)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface for the API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port for the API.")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory (default: GPUEST_DATA_DIR or ./var).")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="uvicorn server processes for the API.")] = 1,
    gpus: Annotated[int, typer.Option(min=0, max=64, help="Celery workers, one per GPU (GPUs 0 .. N-1, pinned "
                                      "with CUDA_VISIBLE_DEVICES); a splittable job fans out over them.")] = 0,
    cpu_workers: Annotated[int | None, typer.Option(min=1, max=64, help="Celery workers computing on the CPU "
                                                    "(instead of --gpus); a splittable job fans out over them.")]
    = None,
) -> None:
    """Run the embedded stack: migrations, the API and real Celery workers; Ctrl-C stops them."""
    from cli.serve import StackStartError, serve_forever
    from core.settings import get_settings

    try:
        serve_forever(
            host,
            port,
            data_dir or get_settings().data_dir,
            say=lambda line: err.print(line, highlight=False, markup=False),
            api_workers=workers,
            gpus=gpus,
            cpu_workers=cpu_workers,
        )
    except StackStartError as error:
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        raise typer.Exit(1) from None


@app.command("compose-gpus")
def compose_gpus(
    gpus: Annotated[int, typer.Argument(min=1, max=64, help="GPUs of the host: one worker service each.")],
    base: Annotated[Path, typer.Option(help="The compose file to copy.")] = Path("docker-compose.yml"),
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    """Print a compose file with one GPU worker per GPU (worker, worker-1, ...; each reserving its GPU by id)
    and splittable jobs fanned out over them; run it with `docker compose -f FILE up --build`."""
    from cli.compose import render

    if not base.is_file():
        err.print(f"[red]error:[/red] no compose file at {escape(str(base))} (run from the repository, or --base)")
        raise typer.Exit(2)
    try:
        text = render(base, gpus)
    except (ValueError, yaml.YAMLError) as error:
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        raise typer.Exit(2) from None
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        err.print(f"wrote {escape(str(output))}: {gpus} GPU worker(s)", markup=False)


@db_app.command("upgrade")
def db_upgrade(
    wait: Annotated[float, typer.Option(min=0, help="Seconds to keep retrying while the database refuses "
                                                    "connections (a server still starting).")] = 0.0,
) -> None:
    """Migrate the configured database (DATABASE_URL, default SQLite under the data dir) to the newest schema.
    A failure is one line on stderr and exit status 1 (no traceback)."""
    from sqlalchemy.exc import OperationalError, SQLAlchemyError

    from core.settings import get_settings
    from store.migrate import upgrade_to_head

    where = _redact(get_settings().resolved_database_url())
    deadline = time.monotonic() + wait
    while True:
        try:
            upgrade_to_head()
            break
        except OperationalError as error:  # refused, unknown host, not accepting connections yet
            if time.monotonic() >= deadline:
                _db_failed(where, error)
            time.sleep(1.0)
        except SQLAlchemyError as error:
            _db_failed(where, error)
    err.print(f"database at head: {where}", markup=False)
    _register_admin_key()


def _register_admin_key() -> None:
    """GPUEST_ADMIN_KEY / GPUEST_ADMIN_KEY_FILE: the first key of a stack, registered once."""
    from core.settings import get_settings
    from store.db import session_scope
    from store.keys import register_key

    settings = get_settings()
    try:
        secret = settings.resolved_admin_key()
    except OSError as error:
        err.print(f"error: cannot read GPUEST_ADMIN_KEY_FILE: {error.strerror}", markup=False)
        raise typer.Exit(1) from None
    if secret is None:
        return
    try:
        with session_scope() as session:
            added = register_key(session, settings.admin_owner, secret)
    except ValueError as error:
        err.print(f"error: GPUEST_ADMIN_KEY: {error}", markup=False)
        raise typer.Exit(1) from None
    state = "registered" if added else "already registered (or revoked: it stays so)"
    err.print(f"admin API key {secret[:8]}... for {settings.admin_owner!r} {state}", markup=False)


def _db_failed(where: str, error: Exception) -> NoReturn:
    reason = str(getattr(error, "orig", None) or error).strip().splitlines()
    err.print(f"error: cannot migrate the database at {where}: {type(error).__name__}: "
              f"{reason[0] if reason else ''}", markup=False, highlight=False)
    raise typer.Exit(1)


def _require_migrated_database() -> None:
    from store.migrate import SchemaNotMigratedError, ensure_migrated

    try:
        ensure_migrated()
    except SchemaNotMigratedError as error:
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        raise typer.Exit(1) from None


@keys_app.callback()
def keys_options(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="The server's data directory (as given to `gpuest serve --data-dir`): its database and "
                          "key secret. Default: GPUEST_DATA_DIR or ./var."),
    ] = None,
) -> None:
    """Admin: API keys (writes to the configured database directly)."""
    if data_dir is not None:
        # before any setting is read: the database URL and the key secret both derive from the data directory
        os.environ["GPUEST_DATA_DIR"] = str(data_dir.resolve())
        from core.settings import get_settings

        get_settings.cache_clear()


@keys_app.command("create")
def keys_create(owner: Annotated[str, typer.Argument(help="Owner name the key acts as.")]) -> None:
    """Create an API key for OWNER and print its secret (shown only this once; stored as a keyed hash)."""
    from store.db import session_scope
    from store.keys import create_key

    _require_migrated_database()
    try:
        with session_scope() as session:
            secret = create_key(session, owner)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    out.print(secret, highlight=False, soft_wrap=True)
    err.print(f"API key for {owner!r} created; it is shown only this once.", markup=False)


@keys_app.command("list")
def keys_list(
    owner: Annotated[str | None, typer.Option(help="Only this owner's keys.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Leave out revoked keys.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List API keys: id, owner, prefix (the key's first characters), created and revoked times. Never a secret."""
    from store.db import session_scope
    from store.keys import list_keys

    _require_migrated_database()
    with session_scope() as session:
        rows = [_key_row(row) for row in list_keys(session, owner=owner, include_revoked=not active)]
    if as_json:
        print_json(rows)
        return
    table = Table("id", "owner", "prefix", "created", "revoked", box=box.SIMPLE)
    table.columns[0].no_wrap = table.columns[2].no_wrap = True
    for row in rows:
        table.add_row(row["id"], row["owner"], row["prefix"], _short_time(row["created_at"]),
                      _short_time(row["revoked_at"]) or "-")
    print_table(table)
    out.print(f"{len(rows)} keys, {sum(row['revoked_at'] is None for row in rows)} active", highlight=False)


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key's id, or its prefix as `gpuest keys list` shows it.")],
) -> None:
    """Revoke an API key (by id or prefix). API processes stop accepting it within 10 s (their key cache)."""
    from store.db import session_scope
    from store.keys import KeyNotFoundError, revoke_key

    _require_migrated_database()
    try:
        with session_scope() as session:
            row, revoked_now = revoke_key(session, key)
            described = f"API key {row.id} ({row.prefix}..., owner {row.owner!r})"
    except KeyNotFoundError as error:
        err.print(f"[red]error:[/red] {escape(str(error.args[0]))}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"{described} {'revoked' if revoked_now else 'was already revoked'}", markup=False)


def _key_row(row: Any) -> dict[str, Any]:
    return {
        "id": row.id, "owner": row.owner, "prefix": row.prefix,
        "created_at": _iso(row.created_at), "revoked_at": _iso(row.revoked_at),
    }


def _iso(moment: Any) -> str | None:
    return None if moment is None else moment.isoformat()


def _redact(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)


if __name__ == "__main__":  # pragma: no cover - `python -m cli.main`
    sys.exit(app())
