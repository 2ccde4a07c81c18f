"""Panel simulation: N agents for T periods under the policy k' = g(k, K, a, eps).

Per period t: K_t = clip(mean k_t, K_min, K_max); every agent moves to k_{t+1} = clip(g(k_t, K_t, a_t, eps_t))
and draws eps_{t+1} from the employment transition conditional on (a_t, a_{t+1}, eps_t). The uniform for
agent i in period t is Philox (seed, stream, t N + i) from :mod:`kernels.rng`, so no N x T shock matrix is
ever stored and the GPU kernel draws in registers exactly the numbers of the array code.

On the GPU one CUDA kernel per period (``ks_panel_step`` in ``kernels/ks/simulate.cu``) moves every agent, draws
its shock and reduces the new capital deterministically (per-block partial sums, then the last block to finish
sums them in a fixed order and writes K_{t+1} to device memory). :class:`CudaPanel` owns the device buffers of
one panel configuration (fixed N, shock path, seed and stream): they keep their addresses, so the period loop is
captured once as CUDA graphs (one per ``periods_per_graph`` periods) and replayed on every call with the policy,
k_0 and eps_0 copied in place - the solve's outer iterations replay the same graphs. Nothing in the loop needs
the host: K_t is read by the kernel from device memory, the per-period scalars (t, a_t and the conditional
employment probabilities) are fixed by the shock path, the buffers are allocated before capture, and the host
only waits, at most two chunks behind, to report progress. Where capture fails, the same kernels are launched
per period on the same stream (identical arithmetic, hence identical bits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels import cuda, rng
from kernels.backend import is_numpy, to_host
from kernels.ks.grids import Grids
from kernels.ks.interp import Method, interpolate
from kernels.ks.model import Calibration, aggregate_transition, conditional_employment
from kernels.ks.policy import grid_args, method_code
from kernels.progress import Pacer

# Philox streams (the key is the job's seed): one per independent family of draws, registered (with their
# fixed numbers) in kernels.rng.STREAMS.
STREAM_AGGREGATE = rng.STREAMS["KS_AGGREGATE"]
STREAM_IDIOSYNCRATIC = rng.STREAMS["KS_IDIOSYNCRATIC"]
STREAM_INITIAL_EMPLOYMENT = rng.STREAMS["KS_INITIAL_EMPLOYMENT"]
STREAM_TEST_AGGREGATE = rng.STREAMS["KS_TEST_AGGREGATE"]  # the fresh path of the Den Haan accuracy test
STREAM_TEST_IDIOSYNCRATIC = rng.STREAMS["KS_TEST_IDIOSYNCRATIC"]

_THREADS = 256  # the kernel's block size (its THREADS define)
_MAX_BLOCKS = 1024  # fixed, so the reduction order (and every bit of K) does not depend on the device


def aggregate_path(cal: Calibration, seed: int, periods: int, stream: int = STREAM_AGGREGATE,
                   first_state: int = 0) -> np.ndarray:
    """a_0 .. a_{periods-1} (0 bad, 1 good); a_0 = ``first_state`` (MMV start in the bad state)."""
    transition = aggregate_transition(cal)
    draws = rng.uniform(np, seed, stream, np.arange(max(periods - 1, 0), dtype=np.uint64))
    path = np.empty(periods, dtype=np.int8)
    path[0] = first_state
    for t in range(1, periods):
        path[t] = 0 if draws[t - 1] < transition[path[t - 1], 0] else 1
    return path


def initial_employment(xp: ModuleType, cal: Calibration, seed: int, n_agents: int, first_state: int) -> Any:
    """eps_0: unemployed with probability u_{a_0} (uint8, 1 = employed)."""
    u = rng.uniform(xp, seed, STREAM_INITIAL_EMPLOYMENT, xp.arange(n_agents, dtype=xp.uint64))
    return (u >= cal.unemployment[first_state]).astype(xp.uint8)


@dataclass
class PanelResult:
    capital_path: np.ndarray  # K_0 .. K_{T-1} (clamped means), host float64
    k: Any  # k_T on xp
    employed: Any  # eps_T on xp


Checkpoint = Callable[[int], None]


def simulate_panel(
    xp: ModuleType,
    cal: Calibration,
    grids: Grids,
    method: Method,
    policy: Any,
    k0: Any,
    employed0: Any,
    a_path: np.ndarray,
    seed: int,
    stream: int = STREAM_IDIOSYNCRATIC,
    checkpoint: Checkpoint | None = None,
    checkpoint_every: int = 100,
    use_kernel: bool | None = None,
    use_graph: bool = False,
) -> PanelResult:
    """Simulate len(a_path) - 1 periods from (k0, employed0); returns K_0..K_{T-1} and the final panel.

    ``a_path`` holds a_0 .. a_T (T + 1 states: the last one only drives eps_T). ``k0`` fixes the precision
    (float64 or float32; means are accumulated in float64). Inputs are not modified.

    On the GPU this builds a one-off :class:`CudaPanel`; ``use_graph`` captures its loop first (worth it only
    when the panel is simulated again: keep the engine and call :meth:`CudaPanel.simulate`, as the solve does).
    """
    if use_kernel is None:
        use_kernel = not is_numpy(xp)
    if use_kernel:
        engine = CudaPanel(xp, cal, grids, method, k0.dtype, k0.shape[0], a_path, seed, stream,
                           use_graph=use_graph, periods_per_graph=checkpoint_every)
        return engine.simulate(policy, k0, employed0, checkpoint)
    periods = len(a_path) - 1
    dtype = k0.dtype
    table = xp.asarray(policy, dtype=dtype).reshape(4, grids.k_size, grids.K_size)
    k_nodes = xp.asarray(grids.k, dtype=dtype)
    emp_prob = conditional_employment(cal)
    n = k0.shape[0]
    agents = xp.arange(n, dtype=xp.uint64)
    k, employed = k0, employed0
    path = np.empty(periods)
    capital = float(np.clip(float(xp.mean(k, dtype=xp.float64)), grids.K_min, grids.K_max))
    pacer = Pacer()
    for t in range(periods):
        path[t] = capital
        a_now, a_next = int(a_path[t]), int(a_path[t + 1])
        plane = 2 * a_now + employed.astype(xp.int64)
        k = xp.clip(interpolate(xp, table, plane, k, dtype.type(capital), grids, method, k_nodes),
                    grids.k_min, grids.k_max).astype(dtype, copy=False)
        u = rng.uniform(xp, seed, stream, agents + np.uint64(t * n))
        p_emp = xp.where(employed == 1, emp_prob[a_now, a_next, 1], emp_prob[a_now, a_next, 0])
        employed = (u < p_emp).astype(xp.uint8)
        capital = float(np.clip(float(xp.mean(k, dtype=xp.float64)), grids.K_min, grids.K_max))
        if checkpoint is not None and ((t + 1) % checkpoint_every == 0 or pacer.due()):
            checkpoint(t + 1)
    return PanelResult(path, k, employed)


def panel_defines(dtype: Any) -> dict[str, cuda.DefineValue]:
    """The compile-time constants of the panel kernel for a panel of ``dtype`` (float64 or float32)."""
    return {**cuda.real_define(dtype), "THREADS": _THREADS}


# Both precisions the job offers, compiled at worker start.
_PANEL_SOURCE = cuda.kernel_source(__file__, "simulate.cu", headers=[cuda.PHILOX_HEADER, "ks/interp.cuh"],
                                   warm_up=[panel_defines(np.float64), panel_defines(np.float32)])


def _panel_kernel(dtype: Any, name: str = "ks_panel_step") -> Any:
    return cuda.function(_PANEL_SOURCE, name, defines=panel_defines(dtype))


class CudaPanel:
    """Device buffers, the panel kernel and (where capture works) the captured period loop of one panel.

    Fixed at construction: the model, grids, method, precision, N, the aggregate path a_0 .. a_T, the seed
    and the Philox stream. Each :meth:`simulate` copies the policy, k_0 and eps_0 into the buffers in place
    and replays the loop, on a private non-blocking stream ordered after the caller's stream by events.
    """

    def __init__(self, xp: ModuleType, cal: Calibration, grids: Grids, method: Method, dtype: Any, n_agents: int,
                 a_path: np.ndarray, seed: int, stream: int = STREAM_IDIOSYNCRATIC, use_graph: bool = True,
                 periods_per_graph: int = 100) -> None:
        if periods_per_graph < 1:
            raise ValueError(f"periods_per_graph must be positive, not {periods_per_graph}")
        self.xp, self.grids = xp, grids
        self.dtype = np.dtype(dtype)
        self.periods = len(a_path) - 1
        self.n = int(n_agents)
        self.kernel = _panel_kernel(self.dtype)
        # zeros, not empty: the warm-up launch before capture reads them (NaN garbage would index out of range)
        self.table = xp.zeros((4, grids.k_size, grids.K_size), dtype=self.dtype)
        self.k_nodes = xp.asarray(grids.k, dtype=self.dtype)
        self.k = xp.zeros(self.n, dtype=self.dtype)
        self.employed = xp.zeros(self.n, dtype=xp.uint8)
        self.blocks = min((self.n + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
        self.shared_bytes = 3 * grids.k_size * self.dtype.itemsize  # the kernel's filtered planes and k nodes
        self.partial = xp.zeros(self.blocks, dtype=xp.float64)
        self.ticket = xp.zeros(1, dtype=xp.uint32)  # the kernel's atomicInc leaves it at 0 after every period
        self.capital_path = xp.zeros(self.periods + 1, dtype=xp.float64)
        emp_prob = conditional_employment(cal)
        grid = grid_args(grids, self.dtype)
        code = np.int32(method_code(method))
        # every kernel argument of every period, fixed once: device pointers of the buffers and host scalars
        self._args = [
            (self.table, self.k_nodes, self.k, self.employed, self.capital_path, self.partial, self.ticket,
             np.int64(self.n), np.int32(t), np.int32(a_path[t]),
             np.float64(emp_prob[a_path[t], a_path[t + 1], 0]), np.float64(emp_prob[a_path[t], a_path[t + 1], 1]),
             np.uint64(seed), np.uint64(stream), *grid, code)
            for t in range(self.periods)
        ]
        self.chunks = [(t, min(t + periods_per_graph, self.periods)) for t in range(0, self.periods, periods_per_graph)]
        self.stream = xp.cuda.Stream(non_blocking=True)
        self.graphs: list[Any] | None = None
        self.graph_used = False
        if use_graph and self.periods > 0:
            try:
                self._capture()
                self.graph_used = True
            except Exception:  # capture unsupported here: launch per period instead (the same kernels)
                self.graphs = None

    def _launch(self, first: int, stop: int) -> None:
        for t in range(first, stop):
            self.kernel((self.blocks,), (_THREADS,), self._args[t], shared_mem=self.shared_bytes)

    def _capture(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()  # the buffers were zeroed on the caller's stream
        with self.stream:
            # one launch outside capture so that nothing is loaded lazily while capturing; it works on the
            # buffers' current (meaningless) contents and is overwritten by every simulate
            self._launch(0, 1)
        self.stream.synchronize()
        graphs = []
        with self.stream:
            for first, stop in self.chunks:
                self.stream.begin_capture()
                try:
                    self._launch(first, stop)
                finally:
                    graph = self.stream.end_capture()
                graphs.append(graph)
        self.graphs = graphs

    def _run_chunk(self, index: int) -> None:
        if self.graphs is not None:
            self.graphs[index].launch(self.stream)
        else:
            with self.stream:
                self._launch(*self.chunks[index])

    def simulate(self, policy: Any, k0: Any, employed0: Any, checkpoint: Checkpoint | None = None) -> PanelResult:
        """As :func:`simulate_panel` for this configuration; ``checkpoint(t)`` after each chunk has run."""
        xp = self.xp
        if k0.shape != (self.n,) or np.dtype(k0.dtype) != self.dtype:
            raise ValueError(f"k0 must be {self.dtype} of shape ({self.n},), not {k0.dtype} {k0.shape}")
        caller = xp.cuda.get_current_stream()
        inputs_ready = xp.cuda.Event(disable_timing=True)
        inputs_ready.record(caller)  # the policy and the start panel were written on the caller's stream
        self.stream.wait_event(inputs_ready)
        with self.stream:
            self.table[...] = xp.asarray(policy, dtype=self.dtype).reshape(self.table.shape)
            self.k[...] = k0
            self.employed[...] = employed0
            self.capital_path[0] = xp.clip(xp.mean(self.k, dtype=xp.float64), self.grids.K_min, self.grids.K_max)
        pending: list[tuple[int, Any]] = []
        for index in range(len(self.chunks)):
            self._run_chunk(index)
            if checkpoint is not None:
                done = xp.cuda.Event(disable_timing=True)
                done.record(self.stream)
                pending.append((self.chunks[index][1], done))
                if len(pending) == 2:  # keep one chunk queued behind the one the host waits for
                    period, event = pending.pop(0)
                    event.synchronize()
                    checkpoint(period)
        finished = xp.cuda.Event(disable_timing=True)
        finished.record(self.stream)
        caller.wait_event(finished)
        for period, event in pending:
            event.synchronize()
            checkpoint(period)  # type: ignore[misc]
        # copies on the caller's stream: the next simulate (ordered after them) may overwrite the buffers
        return PanelResult(to_host(self.capital_path[: self.periods]), self.k.copy(), self.employed.copy())


@dataclass
class _Slice:
    """One device's agents of a :class:`MultiGpuPanel`: panel agents ``first .. first + n - 1``."""

    device: int
    first: int
    n: int
    blocks: int
    kernel: Any
    table: Any
    k_nodes: Any
    k: Any
    employed: Any
    slice_sum: Any
    partial: Any
    ticket: Any


MIN_AGENTS_PER_GPU = 1_000  # the fewest agents a slice of a multi-GPU panel holds (params ``gpus``)


class MultiGpuPanel:
    """One panel spread over several GPUs of the host: the agents in contiguous slices, one per
    device, each moved by ``ks_panel_slice_step`` (the single-device kernel's agent loop and block sums) with
    the single-device panel's Philox counters, so every agent draws the same numbers whatever the split. Per
    period the host launches every slice, reads each slice's sum (8 bytes per device) and adds them in device
    order: K_{t+1} is the single-device K up to the summation order (1e-16 relative), and the same for a given
    split on every run. The host round trip (tens of microseconds a period) is why this pays only at large N.

    Same interface as :class:`CudaPanel`: fixed configuration at construction, :meth:`simulate` per call; the
    inputs and the returned final panel live on the caller's device.
    """

    def __init__(self, xp: ModuleType, cal: Calibration, grids: Grids, method: Method, dtype: Any, n_agents: int,
                 a_path: np.ndarray, seed: int, stream: int = STREAM_IDIOSYNCRATIC,
                 devices: tuple[int, ...] = (0, 1), checkpoint_every: int = 100) -> None:
        if len(devices) < 2 or len(set(devices)) != len(devices):
            raise ValueError(f"a multi-GPU panel needs two or more distinct devices, not {devices}")
        available = xp.cuda.runtime.getDeviceCount()
        if max(devices) >= available or min(devices) < 0:
            raise ValueError(f"the panel asks for GPUs {list(devices)} but this worker sees {available}")
        assert n_agents >= MIN_AGENTS_PER_GPU * len(devices), f"{n_agents:,} agents over {len(devices)} GPUs"
        self.xp, self.grids, self.dtype = xp, grids, np.dtype(dtype)
        self.n, self.periods, self.checkpoint_every = int(n_agents), len(a_path) - 1, checkpoint_every
        self.shared_bytes = 3 * grids.k_size * self.dtype.itemsize
        emp_prob = conditional_employment(cal)
        self._grid = grid_args(grids, self.dtype)
        self._code = np.int32(method_code(method))
        self._period = [(np.int32(t), np.int32(a_path[t]), np.float64(emp_prob[a_path[t], a_path[t + 1], 0]),
                         np.float64(emp_prob[a_path[t], a_path[t + 1], 1])) for t in range(self.periods)]
        self._seed, self._stream = np.uint64(seed), np.uint64(stream)
        bounds = [self.n * i // len(devices) for i in range(len(devices) + 1)]
        self.slices: list[_Slice] = []
        for device, first, stop in zip(devices, bounds[:-1], bounds[1:], strict=True):
            with xp.cuda.Device(device):
                n = stop - first
                blocks = min((n + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
                self.slices.append(_Slice(
                    device=device, first=first, n=n, blocks=blocks,
                    kernel=_panel_kernel(self.dtype, "ks_panel_slice_step"),
                    table=xp.zeros((4, grids.k_size, grids.K_size), dtype=self.dtype),
                    k_nodes=xp.asarray(grids.k, dtype=self.dtype), k=xp.zeros(n, dtype=self.dtype),
                    employed=xp.zeros(n, dtype=xp.uint8), slice_sum=xp.zeros(self.periods + 1, dtype=xp.float64),
                    partial=xp.zeros(blocks, dtype=xp.float64), ticket=xp.zeros(1, dtype=xp.uint32),
                ))

    def _launch(self, piece: _Slice, t: int, capital: float) -> None:
        period, a_now, p_unemployed, p_employed = self._period[t]
        piece.kernel((piece.blocks,), (_THREADS,), (
            piece.table, piece.k_nodes, piece.k, piece.employed, piece.slice_sum, piece.partial, piece.ticket,
            np.int64(piece.n), np.int64(piece.first), np.int64(self.n), np.float64(capital), period, a_now,
            p_unemployed, p_employed, self._seed, self._stream, *self._grid, self._code,
        ), shared_mem=self.shared_bytes)

    def simulate(self, policy: Any, k0: Any, employed0: Any, checkpoint: Checkpoint | None = None) -> PanelResult:
        """As :func:`simulate_panel` for this configuration (up to the summation order of K)."""
        xp = self.xp
        if k0.shape != (self.n,) or np.dtype(k0.dtype) != self.dtype:
            raise ValueError(f"k0 must be {self.dtype} of shape ({self.n},), not {k0.dtype} {k0.shape}")
        home = xp.cuda.Device()
        table = xp.asarray(policy, dtype=self.dtype).reshape(4, self.grids.k_size, self.grids.K_size)
        capital = float(np.clip(float(xp.mean(k0, dtype=xp.float64)), self.grids.K_min, self.grids.K_max))
        home.synchronize()
        for piece in self.slices:
            with xp.cuda.Device(piece.device):  # ndarray.copy() copies onto the current device
                piece.table[...] = table.copy()
                piece.k[...] = k0[piece.first: piece.first + piece.n].copy()
                piece.employed[...] = employed0[piece.first: piece.first + piece.n].copy()
        path = np.empty(self.periods)
        for t in range(self.periods):
            path[t] = capital
            for piece in self.slices:  # every device starts its slice before the host waits for any
                with xp.cuda.Device(piece.device):
                    self._launch(piece, t, capital)
            total = 0.0
            for piece in self.slices:  # in device order: the same sum on every run
                with xp.cuda.Device(piece.device):
                    total += float(piece.slice_sum[t + 1])
            capital = float(np.clip(total / self.n, self.grids.K_min, self.grids.K_max))
            if checkpoint is not None and (t + 1) % self.checkpoint_every == 0:
                checkpoint(t + 1)
        with home:
            k = xp.concatenate([piece.k.copy() for piece in self.slices])
            employed = xp.concatenate([piece.employed.copy() for piece in self.slices])
        return PanelResult(path, k, employed)
