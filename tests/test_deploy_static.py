"""Static checks of the Dockerfile and docker-compose.yml (no Docker engine runs on our machines).

Every reference must resolve: build targets to Dockerfile stages, commands to real console scripts and
importable modules, environment names to settings the code reads, volumes to declared volumes,
``depends_on`` conditions to services that can satisfy them, and every COPY source to a file in the repo
that .dockerignore does not drop from the build context.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import shlex
import tomllib
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
# Variables read outside Settings: the CUDA runtime picks the GPU from the first, kernels.backend the
# array library from the second, uvicorn its number of server processes from the third and the proxies whose
# X-Forwarded-* headers it trusts from the fourth.
EXTERNAL_ENV = {"CUDA_VISIBLE_DEVICES", "GPUEST_DEVICE", "WEB_CONCURRENCY", "FORWARDED_ALLOW_IPS"}


# -- loading ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def instructions() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(DOCKERFILE))


def global_args(commands: tuple[dockerfile.Command, ...]) -> dict[str, str]:
    """ARGs before the first FROM, with their defaults (what ${NAME} in a FROM line expands to)."""
    args: dict[str, str] = {}
    for command in commands:
        if command.cmd == "FROM":
            break
        if command.cmd == "ARG":
            for value in command.value:
                name, _, default = value.partition("=")
                args[name] = default
    return args


def stages(commands: tuple[dockerfile.Command, ...]) -> dict[str, str]:
    """Stage name -> base image (ARG defaults expanded)."""
    args = global_args(commands)
    found: dict[str, str] = {}
    for command in commands:
        if command.cmd == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda match: args[match.group(1)], command.value[0])
            assert len(command.value) == 3 and command.value[1].upper() == "AS", f"unnamed stage: {command.original}"
            found[command.value[2]] = image
    return found


def stage_commands(commands: tuple[dockerfile.Command, ...]) -> Iterator[tuple[str, dockerfile.Command]]:
    current = ""
    for command in commands:
        if command.cmd == "FROM":
            current = command.value[2]
        elif current:
            yield current, command


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored_by_docker(relative: str, patterns: list[str]) -> bool:
    parts = Path(relative).parts
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


def our_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run this repository's images (built from the Dockerfile)."""
    return {name: service for name, service in compose["services"].items() if "build" in service}


def settings_env_names() -> set[str]:
    from pydantic import AliasChoices

    from core.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    names: set[str] = set()
    for field_name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names


# -- command resolution -----------------------------------------------------------------------------

def console_scripts() -> set[str]:
    return {entry.name for entry in entry_points(group="console_scripts")}


def resolve_object(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def check_gpuest_command(argv: list[str]) -> None:
    import typer.main

    from cli.main import app

    # Typer ships its own click; walk the command tree through the group's ``commands`` mapping down to the
    # command, then let it parse the rest (its options and their values) as it would at run time.
    command: Any = typer.main.get_command(app)
    words = argv[1:]
    while getattr(command, "commands", None) is not None:
        word = next((w for w in words if not w.startswith("-")), None)
        assert word is not None, f"`{' '.join(argv)}`: {command.name} needs a subcommand"
        assert word in command.commands, f"`{' '.join(argv)}`: no gpuest command {word!r}"
        command, words = command.commands[word], words[words.index(word) + 1:]
    command.make_context(command.name, list(words))  # raises on an unknown option or a bad value


def check_command(argv: list[str], env: dict[str, str]) -> None:
    """The program is a console script we install and its module references import."""
    program = argv[0]
    assert program in console_scripts() | {"python", "python3"}, f"{program!r} is not an installed console script"
    if program == "gpuest":
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        assert scripts["gpuest"] == "cli.main:app"
        check_gpuest_command(argv)
    elif program == "celery":
        from celery import Celery

        app_reference = argv[argv.index("-A") + 1]
        assert isinstance(resolve_object(app_reference), Celery), f"{app_reference} is not a Celery app"
        assert "worker" in argv
        queue = argv[argv.index("-Q") + 1]
        assert queue == env.get("GPUEST_QUEUE", "gpu"), "the worker must consume the queue the API sends to"
        assert argv[argv.index("--concurrency") + 1] == "1", "one job at a time per GPU"
    elif program == "uvicorn":
        from fastapi import FastAPI

        app_reference = next(word for word in argv[1:] if ":" in word)
        assert isinstance(resolve_object(app_reference), FastAPI), f"{app_reference} is not the FastAPI app"


def command_argv(command: Any) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


# -- Dockerfile -------------------------------------------------------------------------------------

def test_dockerfile_has_the_api_and_gpu_worker_stages(instructions: tuple[dockerfile.Command, ...]) -> None:
    found = stages(instructions)
    assert {"base", "api", "worker-gpu"} <= set(found)
    assert found["base"].startswith("python:3.1") and "slim" in found["base"]
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu\d+\.\d+", found["worker-gpu"]), found["worker-gpu"]


def test_every_from_names_an_image_or_an_earlier_stage(instructions: tuple[dockerfile.Command, ...]) -> None:
    seen: set[str] = set()
    for name, image in stages(instructions).items():
        assert image in seen or re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"stage {name}: untagged base {image}"
        seen.add(name)


def test_every_copy_source_exists_and_is_in_the_build_context(instructions: tuple[dockerfile.Command, ...]) -> None:
    patterns = dockerignore_patterns()
    known_stages: list[str] = []
    copies = 0
    for stage, command in stage_commands(instructions):
        if stage not in known_stages:
            known_stages.append(stage)
        if command.cmd not in {"COPY", "ADD"}:
            continue
        sources = command.value[:-1]
        from_stage = next((flag.split("=", 1)[1] for flag in command.flags if flag.startswith("--from=")), None)
        if from_stage is not None:
            assert from_stage in known_stages[:-1], f"{command.original}: --from names no earlier stage"
            continue
        for source in sources:
            copies += 1
            path = ROOT / source
            assert path.exists(), f"{command.original}: {source} does not exist"
            assert not ignored_by_docker(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
    assert copies >= 5


def test_the_gpu_image_installs_the_cupy_extra(instructions: tuple[dockerfile.Command, ...]) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("cupy-cuda13x") for requirement in extras["gpu"])
    runs = [" ".join(c.value) for stage, c in stage_commands(instructions) if stage == "worker-gpu" and c.cmd == "RUN"]
    assert any("pip install" in run and ".[gpu]" in run for run in runs)


def test_dockerfile_default_commands_resolve(instructions: tuple[dockerfile.Command, ...]) -> None:
    commands = {stage: list(c.value) for stage, c in stage_commands(instructions) if c.cmd == "CMD"}
    assert set(commands) == {"api", "worker-gpu"}
    for argv in commands.values():
        check_command(argv, {})


def test_dockerfile_healthcheck_probes_healthz(instructions: tuple[dockerfile.Command, ...]) -> None:
    (check,) = [c for _, c in stage_commands(instructions) if c.cmd == "HEALTHCHECK"]
    assert "/healthz" in check.original
    assert "/healthz" in resolve_object("api.app:app").openapi()["paths"]


# -- docker-compose.yml ------------------------------------------------------------------------------

def test_compose_has_the_six_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "api", "worker", "worker-cpu"}


def test_build_targets_are_dockerfile_stages(compose: dict[str, Any], instructions: tuple[Any, ...]) -> None:
    known = set(stages(instructions))
    for name, service in our_services(compose).items():
        build = service["build"]
        assert (ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
        assert build["target"] in known, f"{name}: no Dockerfile stage {build['target']!r}"
    assert our_services(compose)["worker"]["build"]["target"] == "worker-gpu"


def test_external_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if "build" not in service:
            image = service["image"]
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin a tag, not {image!r}"


def test_service_commands_resolve(compose: dict[str, Any]) -> None:
    for name, service in our_services(compose).items():
        assert "command" in service, f"{name}: say what runs"
        try:
            check_command(command_argv(service["command"]), service.get("environment") or {})
        except AssertionError as error:
            raise AssertionError(f"service {name}: {error}") from error
    assert command_argv(compose["services"]["migrate"]["command"])[:3] == ["gpuest", "db", "upgrade"]


def test_environment_names_are_settings_the_code_reads(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.settings import Settings

    readable = settings_env_names() | EXTERNAL_ENV
    for name, service in our_services(compose).items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        unknown = set(env) - readable
        assert not unknown, f"{name}: environment names no setting reads: {sorted(unknown)}"
        # The values must validate too (a typo'd boolean or URL fails here, not at container start).
        for variable in readable:
            monkeypatch.delenv(variable, raising=False)
        for variable, value in env.items():
            monkeypatch.setenv(variable, str(value))
        settings = Settings()
        assert settings.resolved_database_url().startswith("postgresql+psycopg://")
        assert settings.resolved_broker_url().startswith("redis://")
        assert settings.auth_enabled, f"{name}: a networked deployment must require API keys"


def test_the_api_names_the_proxies_it_trusts(compose: dict[str, Any]) -> None:
    # Without it uvicorn trusts only 127.0.0.1, so behind a proxy in another container every request reads as
    # http and the dashboard's cookies are not Secure; "*" would let any client claim https.
    env = compose["services"]["api"]["environment"]
    assert env.get("FORWARDED_ALLOW_IPS") and "*" not in env["FORWARDED_ALLOW_IPS"]
    assert env.get("GPUEST_COOKIE_SECURE") in ("auto", "true")


def test_named_volumes_resolve(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for name, service in compose["services"].items():
        for mount in service.get("volumes") or []:
            source = mount.split(":", 1)[0] if isinstance(mount, str) else mount["source"]
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source!r} is not declared"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {sorted(declared - used)}"
    api_mounts, worker_mounts = (set(compose["services"][s]["volumes"]) for s in ("api", "worker"))
    assert "gpuest-data:/data" in api_mounts & worker_mounts, "API and worker must share the data directory"


def test_depends_on_conditions_are_satisfiable(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: use depends_on with conditions"
        for target, rule in depends.items():
            assert target in services, f"{name} depends on unknown service {target}"
            condition = rule["condition"]
            assert condition in DEPENDS_ON_CONDITIONS, f"{name}: bad condition {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy: no healthcheck"
            if condition == "service_completed_successfully":
                assert services[target].get("restart", "no") == "no", f"{target} must be one-shot"
    for name in ("api", "worker", "worker-cpu"):
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }


def test_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name for name, service in services.items() if "healthcheck" in service} == {
        "postgres", "redis", "api", "worker", "worker-cpu"
    }, "every long-running service has a healthcheck"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    api_check = services["api"]["healthcheck"]["test"]
    assert api_check[:3] == ["CMD", "python", "-c"]
    compile(api_check[3], "<healthcheck>", "exec")
    argv = command_argv(services["api"]["command"])
    port = argv[argv.index("--port") + 1]
    assert f"127.0.0.1:{port}/healthz" in api_check[3]
    assert any(str(mapping).endswith(f":{port}") for mapping in services["api"]["ports"])


def test_worker_reserves_one_nvidia_gpu(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == 1 and "gpu" in device["capabilities"]
    assert worker["environment"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_worker_demands_the_gpu(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.backend import requested_device

    monkeypatch.setenv("GPUEST_DEVICE", compose["services"]["worker"]["environment"]["GPUEST_DEVICE"])
    assert requested_device() == "gpu"


def test_worker_healthcheck_checks_the_alive_file_the_worker_touches(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from core.settings import Settings

    worker = compose["services"]["worker"]
    check = worker["healthcheck"]["test"]
    assert check[:4] == ["CMD", "python", "-m", "worker.health"], check
    assert importlib.util.find_spec("worker.health") is not None
    max_age = float(check[check.index("--max-age") + 1])
    # The file the worker writes is per container (not on the shared data volume, where workers would
    # vouch for each other), and the age limit leaves room for several reaper passes.
    for variable in settings_env_names():
        monkeypatch.delenv(variable, raising=False)
    for variable, value in worker["environment"].items():
        monkeypatch.setenv(variable, str(value))
    settings = Settings()
    assert settings.worker_alive_file is not None
    assert not settings.worker_alive_file.is_relative_to(settings.data_dir)
    assert max_age >= 4 * settings.reaper_interval_seconds
    assert worker["healthcheck"]["start_period"] and worker["healthcheck"]["retries"] >= 1


# -- issue 16: builds that run anywhere ---------------------------------------------------------------

UBUNTU_PYTHON = {"ubuntu24.04": "3.12", "ubuntu22.04": "3.10"}  # each release's python3


def test_no_syntax_line_that_needs_docker_hub_at_build_time() -> None:
    assert not any(line.lstrip().lower().startswith("# syntax=")
                   for line in (ROOT / "Dockerfile").read_text().splitlines())


def test_one_python_version_in_both_images(instructions: tuple[dockerfile.Command, ...]) -> None:
    found = stages(instructions)
    api_python = re.match(r"python:(\d+\.\d+)", found["base"])
    assert api_python is not None, found["base"]
    release = re.search(r"(ubuntu\d+\.\d+)$", found["worker-gpu"])
    assert release is not None and UBUNTU_PYTHON[release[1]] == api_python[1], (found["base"], found["worker-gpu"])


def test_the_gpu_image_gets_nvrtc_headers_and_compiles_every_kernel_at_build(
    instructions: tuple[dockerfile.Command, ...]
) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("cupy-cuda13x[ctk]") for requirement in extras["gpu"])
    runs = [" ".join(c.value) for stage, c in stage_commands(instructions) if stage == "worker-gpu" and c.cmd == "RUN"]
    assert any("python -m worker.compile_check" in run for run in runs)
    from worker import compile_check

    assert callable(compile_check.main)


def test_postgres_health_is_checked_over_tcp_and_compose_v2_is_named(compose: dict[str, Any]) -> None:
    test = " ".join(compose["services"]["postgres"]["healthcheck"]["test"])
    assert "pg_isready -h 127.0.0.1" in test  # the socket answers before TCP on a first start
    assert "Compose v2" in (ROOT / "docker-compose.yml").read_text().split("services:")[0]


# -- issue 16: the CPU profile ------------------------------------------------------------------------------

def enabled_services(compose: dict[str, Any], profiles: set[str]) -> set[str]:
    """What `docker compose up` starts with these profiles active: services without profiles always, the others
    when one of theirs is active (the Compose specification's rule)."""
    return {name for name, service in compose["services"].items()
            if not service.get("profiles") or profiles & set(service["profiles"])}


def default_profiles() -> set[str]:
    """COMPOSE_PROFILES from the project's .env: what a plain `docker compose up` activates (a --profile flag
    replaces it: compose-go's WithDefaultProfiles reads the variable only when no flag is given)."""
    values = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#"))
    return {profile.strip() for profile in values["COMPOSE_PROFILES"].split(",") if profile.strip()}


def test_the_gpu_worker_is_the_default_and_the_cpu_profile_swaps_it_for_a_cpu_worker(compose: dict[str, Any]) -> None:
    core = {"postgres", "redis", "migrate", "api"}
    assert default_profiles() == {"gpu"}
    assert enabled_services(compose, default_profiles()) == core | {"worker"}
    assert enabled_services(compose, {"cpu"}) == core | {"worker-cpu"}
    assert "--profile cpu up" in COMPOSE_FILE.read_text().split("services:")[0]


def test_the_cpu_worker_reserves_no_device_and_computes_with_numpy(
    compose: dict[str, Any], instructions: tuple[dockerfile.Command, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.settings import Settings
    from kernels.backend import requested_device

    gpu, cpu = compose["services"]["worker"], compose["services"]["worker-cpu"]
    assert "deploy" not in cpu and "CUDA_VISIBLE_DEVICES" not in cpu["environment"]
    assert cpu["build"]["target"] == "api" and stages(instructions)["api"] == "base"  # python-slim, no CUDA
    assert command_argv(cpu["command"]) == command_argv(gpu["command"])  # same queue, one job at a time
    assert cpu["healthcheck"] == gpu["healthcheck"] and cpu["volumes"] == gpu["volumes"]
    for variable in settings_env_names() | EXTERNAL_ENV:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in cpu["environment"].items():
        monkeypatch.setenv(variable, str(value))
    assert requested_device() == "cpu"
    settings = Settings()
    assert settings.worker_alive_file is not None and not settings.worker_alive_file.is_relative_to(settings.data_dir)


# -- issue 16: reproducible installs ------------------------------------------------------------------------

def constraint_pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, separator, version = line.partition("==")
            assert separator and version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_every_direct_dependency_within_pyproject(
    instructions: tuple[dockerfile.Command, ...]
) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = constraint_pins()
    for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {name} (pyproject: {text}); regenerate it"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {text}")
    installs = [" ".join(c.value) for _, c in stage_commands(instructions) if c.cmd == "RUN" and "pip install" in
                " ".join(c.value)]
    assert installs and all("-c constraints.txt" in run for run in installs), installs
    assert "-c constraints.txt" in (ROOT / ".ci" / "run").read_text()


def test_the_images_hold_every_package_the_project_installs(instructions: tuple[dockerfile.Command, ...]) -> None:
    # A package left out of the source stage installs as missing: the API would fail at import (plots/ was).
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in patterns}
    copied = {source.rstrip("/") for stage, command in stage_commands(instructions)
              if stage == "source" and command.cmd == "COPY" for source in command.value[:-1]}
    assert packages <= copied, f"not copied into the images: {sorted(packages - copied)}"


def test_pip_takes_a_private_index_and_ca_bundle_as_build_arguments(
    instructions: tuple[dockerfile.Command, ...], compose: dict[str, Any]
) -> None:
    names = ("GPUEST_PIP_INDEX_URL", "GPUEST_PIP_CA_BUNDLE")
    assert all(global_args(instructions).get(name) == '""' for name in names)  # empty by default: PyPI
    for stage in ("base", "worker-gpu"):
        commands = [command for name, command in stage_commands(instructions) if name == stage]
        declared = {value for command in commands if command.cmd == "ARG" for value in command.value}
        assert set(names) <= declared, f"{stage} does not take {names}"
        install = next(" ".join(c.value) for c in commands if c.cmd == "RUN" and "pip install" in " ".join(c.value))
        assert '${GPUEST_PIP_INDEX_URL:+--index-url "$GPUEST_PIP_INDEX_URL"}' in install
        assert '${GPUEST_PIP_CA_BUNDLE:+--cert "docker/certs/$GPUEST_PIP_CA_BUNDLE"}' in install
    assert (ROOT / "docker" / "certs" / "README.md").exists()
    for name, service in compose["services"].items():
        if "build" in service:
            assert service["build"]["args"] == {key: f"${{{key}:-}}" for key in names}, name


# -- one worker per GPU: `gpuest compose-gpus N` (cli/compose.py) ------------------------------------------

@pytest.mark.parametrize("gpus", [1, 4])
def test_compose_gpus_writes_one_worker_per_gpu_id(gpus: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.compose import render

    text = render(COMPOSE_FILE, gpus)
    assert text.startswith(f"# Generated by `gpuest compose-gpus {gpus}`")
    generated = yaml.safe_load(text)
    base = yaml.safe_load(COMPOSE_FILE.read_text())
    workers = [name for name in generated["services"] if name == "worker" or (name.startswith("worker-")
               and name != "worker-cpu")]
    assert workers == ["worker"] + [f"worker-{gpu}" for gpu in range(1, gpus)]
    assert set(generated["services"]) - set(workers) == set(base["services"]) - {"worker"}
    reserved = []
    for name in workers:
        worker = generated["services"][name]
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "count" not in device and "gpu" in device["capabilities"]
        reserved += device["device_ids"]
        assert worker["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert worker["environment"].get("GPUEST_FANOUT_CHUNKS") == (str(gpus) if gpus > 1 else None)
        # Everything but the reservation and the fan-out setting is the base worker's.
        same = {key: value for key, value in worker.items() if key not in ("deploy", "environment")}
        assert same == {key: value for key, value in base["services"]["worker"].items()
                        if key not in ("deploy", "environment")}
    assert reserved == [str(gpu) for gpu in range(gpus)]
    # The generated file passes the checks the repository's own compose file passes.
    test_service_commands_resolve(generated)
    test_environment_names_are_settings_the_code_reads(generated, monkeypatch)
    test_named_volumes_resolve(generated)
    test_depends_on_conditions_are_satisfiable(generated)  # (the healthcheck is the base worker's: `same` above)


def test_compose_gpus_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    target = tmp_path / "docker-compose.gpus.yml"
    done = runner.invoke(app, ["compose-gpus", "2", "--base", str(COMPOSE_FILE), "--output", str(target)])
    assert done.exit_code == 0, done.output
    assert list(yaml.safe_load(target.read_text())["services"]).count("worker-1") == 1
    missing = runner.invoke(app, ["compose-gpus", "2", "--base", str(tmp_path / "none.yml")])
    assert missing.exit_code == 2 and "no compose file" in missing.output
    assert runner.invoke(app, ["compose-gpus", "0", "--base", str(COMPOSE_FILE)]).exit_code == 2
