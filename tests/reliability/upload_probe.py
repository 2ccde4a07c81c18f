"""Convert one upload in this process and print, as one JSON line, what came of it, the peak RSS growth over
the conversion (Linux's VmHWM, reset after the imports) and its seconds.

    python -m tests.reliability.upload_probe UPLOAD csv|parquet '{"max_columns": 1000}'

Limits not given are the settings' defaults."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from store.dataset_ingest import DatasetError, convert_upload, default_limits


def peak_kib() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmHWM:")[1].split()[0])


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def main() -> None:
    upload, source_format, overrides = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    limits = dataclasses.replace(default_limits(), **overrides)
    with tempfile.TemporaryDirectory() as directory:
        reset_peak()
        before, started = peak_kib(), time.perf_counter()
        try:
            stored = convert_upload(upload, source_format, Path(directory) / "out.parquet", limits)
            outcome: dict[str, object] = {"rows": stored.n_rows, "types": [str(field.type) for field in stored.schema]}
        except DatasetError as error:
            outcome = {
                "error": type(error).__name__,
                "setting": getattr(error, "setting", None),
                "message": str(error)[:300],
            }
        seconds = time.perf_counter() - started
        growth = peak_kib() - before
    print(json.dumps({**outcome, "peak_growth_mib": round(growth / 1024, 1), "seconds": round(seconds, 2)}))


if __name__ == "__main__":
    main()
