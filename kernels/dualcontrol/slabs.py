"""One dual-control solve's Bellman sweeps spread over several GPUs of one host.

The grid's flat points (C order, x slowest) are cut into contiguous slabs, one per device, at the boundaries of
the kernels' point bands (bellman.band_points: 16 x planes; sizes differ by at most one band), or at any point
on a grid of fewer bands than devices (sizes one point apart; the kernels then take the points in plain order).
Every device holds the whole value array, since a point's quadrature nodes land anywhere in the grid, and
computes ``Q`` (a policy sweep) or ``min_u Q`` (a Bellman sweep) at its own slab's points only, with the
single-device kernels of ``bellman.cu`` launched over those points (``CudaBellman(point_range=...)``); the slabs
are then copied into the home device's output.
Every point's arithmetic is the single-device kernel's, so the result is the one-GPU result bit for bit,
whatever the split (on GPUs of one model, which run the same compiled code).

Per sweep the home device's values are copied to every other device (peer copies over NVLink or PCIe where
the devices can reach each other's memory, which CuPy enables on the first copy; staged through the host
otherwise), with the policy's slab for a policy sweep and the whole previous policy for a Bellman sweep (a
Bellman sweep costs about 70 policy sweeps, so that copy is noise, and the minimiser may read any warm start);
then each device's slab comes back. Ordering is by CUDA events, never by waiting on the host: each device's
stream waits for the home stream's inputs, the home stream waits for each device's slab before copying it,
so the home stream (where the caller goes on) is ordered after everything and the memory pools may reuse
the buffers of a call as soon as the next one starts.

On NumPy the same slabs run through the array twin (:class:`ArraySlab`: ``ArrayBellman`` computing ``Q``
only at its slab's points), the reference the tests compare slab by slab with the whole sweep. The service
refuses ``gpus > 1`` on a CPU worker (:func:`check_gpus`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from kernels.backend import is_numpy
from kernels.dualcontrol.bellman import (
    ArrayBellman,
    CudaBellman,
    Interpolation,
    MinimiserSettings,
    band_points,
)
from kernels.dualcontrol.grid import StateGrid
from kernels.dualcontrol.model import ModelParams

# A level is spread over at most (its points / this) GPUs. At 2^18 points (64^3) a policy sweep takes about
# 0.2 ms on an H100 (13 ms at 256^3, bench/RESULTS.md) against tens of microseconds of launches, events and
# copies per extra device; a guess at where a second GPU starts to pay, not a measurement. The split never
# changes the result, only the time.
MIN_POINTS_PER_GPU = 1 << 18


def slab_bounds(n_points: int, slabs: int, unit: int = 1) -> list[tuple[int, int]]:
    """``(first, count)`` of ``slabs`` contiguous slabs covering the flat points ``0 .. n_points - 1``, cut at
    multiples of ``unit`` (bands of the kernels' banded order: bellman.band_points) while there are at least as
    many units as slabs (sizes then differ by at most one unit), else at any point (by at most one point)."""
    if not 1 <= slabs <= n_points:
        raise ValueError(f"{n_points} grid points cannot be cut into {slabs} slabs (1 to {n_points})")
    units = -(-n_points // unit) if unit >= 1 else 0
    if units < slabs:
        units, unit = n_points, 1
    edges = [min(n_points, (units * i // slabs) * unit) for i in range(slabs + 1)]
    return [(first, stop - first) for first, stop in pairwise(edges)]


def level_gpus(n_points: int, gpus: int, min_points_per_gpu: int = MIN_POINTS_PER_GPU) -> int:
    """How many of ``gpus`` a level of ``n_points`` points is spread over: all of them once each keeps
    ``min_points_per_gpu`` points, fewer (down to one) on smaller, coarse-to-fine or error-estimate, grids."""
    return max(1, min(gpus, n_points // max(min_points_per_gpu, 1)))


def host_devices(gpus: int, xp: Any) -> tuple[int, ...]:
    """GPUs 0 .. gpus - 1 of the host, the current (home) device first: it holds the solve's arrays."""
    home = xp.cuda.Device().id
    if home >= gpus:
        raise ValueError(f"gpus = {gpus} spreads the sweeps over GPUs 0 .. {gpus - 1}, but the job runs on GPU {home}")
    return (home, *(d for d in range(gpus) if d != home))


def check_gpus(gpus: int, xp: Any, fused: bool | None = None) -> None:
    """Refuse ``gpus > 1`` where it cannot run: on NumPy (a CPU worker), without the CUDA kernels, or on a
    worker that sees fewer GPUs (the messages name the job's field)."""
    if gpus <= 1:
        return
    if is_numpy(xp):
        raise ValueError(f"gpus = {gpus} spreads the Bellman sweeps over GPUs: it needs a GPU worker")
    if fused is False:
        raise ValueError(f"gpus = {gpus} spreads the fused CUDA kernels over GPUs: fused=False has none")
    available = int(xp.cuda.runtime.getDeviceCount())
    if gpus > available:
        raise ValueError(f"gpus = {gpus} spreads the Bellman sweeps over {gpus} GPUs, but this worker sees {available}")


def peer_access(devices: Sequence[int], xp: Any) -> bool:
    """Whether the home device (the first) and every other one can read each other's memory directly (the
    copies then go over NVLink or PCIe peer to peer; otherwise CUDA stages them through the host)."""
    home, *others = devices
    runtime = xp.cuda.runtime
    return all(runtime.deviceCanAccessPeer(home, d) and runtime.deviceCanAccessPeer(d, home) for d in others)


class ArraySlab(ArrayBellman):
    """The array twin computing ``Q`` at the flat points ``first .. first + count - 1`` only; elsewhere
    :meth:`q_values` gives ``u^2``, a smooth stand-in that keeps any point-wise minimiser well defined there
    and that :class:`SlabBellman` discards. :meth:`evaluate` and :meth:`improve` are inherited: the minimiser
    works point by point, so its answer at a slab's point does not depend on what the others hold."""

    def __init__(self, *args: Any, point_range: tuple[int, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.point_range = point_range

    def q_values(self, values: Any, u: Any) -> Any:
        first, count = self.point_range
        u_flat = self.xp.asarray(u, dtype=self.dtype).reshape(-1)
        out = u_flat * u_flat
        for start in range(first, first + count, self.chunk):
            part = slice(start, min(start + self.chunk, first + count))
            out[part] = self.q_at_points(values, *(p[part] for p in self.points), u_flat[part])
            if self.heartbeat is not None:
                self.heartbeat()
        return out.reshape(self.grid.shape)


@dataclass(frozen=True)
class Slab:
    device: int | None  # None on NumPy
    first: int
    count: int
    operator: ArrayBellman  # built on ``device``, computing only this slab's points

    def of(self, array: Any) -> Any:
        """The slab's points of a grid-shaped (contiguous) array, as a flat view."""
        return array.reshape(-1)[self.first : self.first + self.count]


class SlabBellman:
    """A :class:`~kernels.dualcontrol.bellman.BellmanOperator` over ``slabs`` contiguous slabs of the grid's
    points: on CuPy one per GPU of the host (the current device first; arrays in and out live on it), on NumPy
    all on the host (the reference). See the module text."""

    def __init__(
        self,
        model: ModelParams,
        grid: StateGrid,
        quadrature_nodes: int,
        xp: Any,
        dtype: Any = np.float64,
        minimiser: MinimiserSettings | None = None,
        interpolation: Interpolation = "trilinear",
        slabs: int = 2,
    ) -> None:
        self.grid, self.xp, self.dtype = grid, xp, np.dtype(dtype)
        bounds = slab_bounds(int(np.prod(grid.shape)), slabs, band_points(grid.shape))
        common = (model, grid, quadrature_nodes, xp, self.dtype, minimiser)
        if is_numpy(xp):
            self.devices: tuple[int, ...] = ()
            self.slabs = [
                Slab(None, first, count, ArraySlab(*common, interpolation=interpolation, point_range=(first, count)))
                for first, count in bounds
            ]
        else:
            check_gpus(slabs, xp)
            self.devices = host_devices(slabs, xp)
            self.slabs = []
            for device, (first, count) in zip(self.devices, bounds, strict=True):
                with xp.cuda.Device(device):  # its arrays and its compiled kernels on that device
                    operator = CudaBellman(*common, interpolation=interpolation, point_range=(first, count))
                self.slabs.append(Slab(device, first, count, operator))
        self._heartbeat: Callable[[], None] | None = None

    @property
    def heartbeat(self) -> Callable[[], None] | None:
        return self._heartbeat

    @heartbeat.setter
    def heartbeat(self, hook: Callable[[], None] | None) -> None:  # the array twin calls it between chunks
        self._heartbeat = hook
        for slab in self.slabs:
            slab.operator.heartbeat = hook

    def evaluate(self, values: Any, policy: Any) -> Any:
        if is_numpy(self.xp):
            (out,) = self._assemble([(slab.operator.evaluate(values, policy),) for slab in self.slabs])
            return out
        values, policy = self._home(values), self._home(policy)
        pending = self._spread(
            values,
            # a policy sweep reads the policy at its own points only
            lambda slab, replica, stream: (slab.operator.evaluate(replica, _replica(self.xp, policy, stream, slab)),),
        )
        out = self.slabs[0].operator.evaluate(values, policy)
        self._gather(pending, (out,))
        return out

    def improve(self, values: Any, previous_policy: Any | None) -> tuple[Any, Any]:
        if is_numpy(self.xp):
            q, u = self._assemble([slab.operator.improve(values, previous_policy) for slab in self.slabs])
            return q, u
        values = self._home(values)
        previous = None if previous_policy is None else self._home(previous_policy)
        pending = self._spread(
            values,
            lambda slab, replica, stream: slab.operator.improve(
                replica, None if previous is None else _replica(self.xp, previous, stream)
            ),
        )
        q, u = self.slabs[0].operator.improve(values, previous)
        self._gather(pending, (q, u))
        return q, u

    def _home(self, array: Any) -> Any:
        return self.xp.ascontiguousarray(array, dtype=self.dtype)

    def _assemble(self, parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        """NumPy: each output's points from the slab that computed them."""
        outputs = tuple(self.xp.empty(self.grid.shape, dtype=self.dtype) for _ in parts[0])
        for slab, part in zip(self.slabs, parts, strict=True):
            for out, piece in zip(outputs, part, strict=True):
                slab.of(out)[...] = slab.of(piece)
        return outputs

    def _spread(
        self, values: Any, launch: Callable[[Slab, Any, Any], tuple[Any, ...]]
    ) -> list[tuple[Slab, tuple[Any, ...], Any]]:
        """On every device but home, after the home stream's work so far: a copy of ``values`` and ``launch``
        (its slab's kernels); returns each slab's outputs with the event that marks them done. Queued only:
        all devices compute at once (home's own slab is launched by the caller after this)."""
        xp = self.xp
        ready = _mark(xp)
        pending = []
        for slab in self.slabs[1:]:
            with xp.cuda.Device(slab.device):
                stream = xp.cuda.get_current_stream()
                stream.wait_event(ready)
                outputs = launch(slab, _replica(xp, values, stream), stream)
                pending.append((slab, outputs, _mark(xp)))
        return pending

    def _gather(self, pending: list[tuple[Slab, tuple[Any, ...], Any]], targets: tuple[Any, ...]) -> None:
        """Each device's slab of its outputs into the home arrays ``targets``, on the home stream."""
        stream = self.xp.cuda.get_current_stream()
        for slab, outputs, done in pending:
            stream.wait_event(done)
            for target, part in zip(targets, outputs, strict=True):
                _copy(slab.of(target), slab.of(part), stream)


def _mark(xp: Any) -> Any:
    """An event recorded on the current device's current stream."""
    event = xp.cuda.Event(disable_timing=True)
    event.record(xp.cuda.get_current_stream())
    return event


def _copy(target: Any, source: Any, stream: Any) -> None:
    """``target[...] = source`` (contiguous, equal sizes, possibly on two devices), queued on ``stream``."""
    target.data.copy_from_device_async(source.data, source.nbytes, stream)


def _replica(xp: Any, source: Any, stream: Any, slab: Slab | None = None) -> Any:
    """A copy of the home array ``source`` on the current device: all of it, or only ``slab``'s points (the
    rest left unwritten: the slab's kernels do not read them)."""
    replica = xp.empty(source.shape, dtype=source.dtype)
    if slab is None:
        _copy(replica, source, stream)
    else:
        _copy(slab.of(replica), slab.of(source), stream)
    return replica
