"""Smoke check of a GPU worker image: every kernel compiles, with or without a GPU.

    python -m worker.compile_check            # the image build runs this (no GPU there): NVRTC to PTX
    python -m worker.compile_check --device   # on a GPU host: also compile and load on the device, and run
                                              # one CuPy elementwise kernel (CuPy's own headers)

One line per check on stdout; exit status 0 when every check passed, 1 otherwise (with the failing check's
one-line reason), so a broken image stops at build time instead of failing its first job.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="90", help="compute capability to compile for without a device")
    parser.add_argument("--device", action="store_true", help="also compile, load and run on the current GPU")
    args = parser.parse_args(argv)
    from kernels import cuda
    from kernels.registry import registry

    registry()  # imports every kernel module: their sources are declared
    try:
        count = cuda.compile_for_arch(args.arch)
        print(f"compiled {count} kernel variants for compute_{args.arch} (NVRTC, no device)")
        if args.device:
            import cupy

            loaded = cuda.warm_up()
            name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
            print(f"compiled and loaded {loaded} kernel modules on {name}")
            value = float((cupy.arange(4, dtype=cupy.float64) * 2.5).sum())  # CuPy's own elementwise + reduction
            print(f"CuPy elementwise kernel ran: {value}")
    except Exception as exc:  # every failure is the image's: one line, then a non-zero status
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"compile check failed: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
