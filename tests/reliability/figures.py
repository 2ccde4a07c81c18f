"""The suite's measured figures (fuzz requests, faults survived, jobs lost, latencies), kept in one JSON file.

Each test records its own section; the file is rewritten after every record, so a run that stops half way
still leaves what it measured. ``GPUEST_RELIABILITY_FIGURES`` names the file (default
``var/reliability/figures.json`` in the repository, ignored by git); the session's figures are also printed
at the end of the pytest run (tests/reliability/conftest.py).
"""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
_recorded: dict[str, Any] = {}


def figures_path() -> Path:
    return Path(os.environ.get("GPUEST_RELIABILITY_FIGURES", REPO_ROOT / "var" / "reliability" / "figures.json"))


def record(section: str, **values: Any) -> None:
    """Record (or replace) one section of this session's figures and write the file."""
    # The machine's load when measured: other processes on these two cores stretch every latency.
    _recorded[section] = {**values, "load_average_1min": round(os.getloadavg()[0], 2)}
    path = figures_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
        "figures": _recorded,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def recorded() -> dict[str, Any]:
    return dict(_recorded)
