"""The in-worker GPU harness: device facts, guarded buffers, cubin loading and launches.

A GPU worker calls :func:`init_device` once; the device stages (:class:`~fitness.Correctness`,
:class:`~fitness.Timing`) then reach the GPU only through a :class:`Backend` kept in the
worker's scratch dict (key :data:`BACKEND_KEY`). :class:`CupyBackend` is the real one;
tests put a numpy backend there to run the gate logic on the CPU.

Fault model:

* A launch the driver refuses (block too large for the kernel's registers, too much
  shared memory, a grid that does not fit the compiled cluster shape, an entry point
  missing from the cubin) raises :class:`LaunchConfigError`: the candidate is a
  RUNTIME_ERROR and the worker carries on.
* An error raised while the kernel ran (illegal address, misaligned access, trap,
  illegal instruction, ...) poisons the CUDA context: :class:`~fitness.CudaFault` is
  raised and the worker must exit after reporting it.

Every buffer is its own allocation with a guard region on both sides filled with a
canary derived from the secret seed (:class:`GuardedBuffer`); a kernel that writes past
either end of a buffer is found by :meth:`GuardedBuffer.check` even when the write
raised no CUDA error.

cupy is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import logging
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evo.types import ArgSpec, DeviceInfo, Launch
from fitness._dtypes import storage_dtype
from fitness._stage import CudaFault, Job

__all__ = [
    "BACKEND_KEY",
    "GUARD_BYTES",
    "Backend",
    "CupyBackend",
    "GuardedBuffer",
    "KernelHandle",
    "LaunchConfigError",
    "allocate_buffers",
    "gpu_available",
    "init_device",
    "scalar_args",
]

log = logging.getLogger(__name__)

#: Scratch key under which a worker keeps its :class:`Backend`.
BACKEND_KEY = "fitness.backend"
#: Bytes of guard region before and after every buffer (a multiple of 256).
GUARD_BYTES = 64 * 1024
#: Modules kept loaded per worker (least recently used are unloaded first).
MODULE_CACHE_SIZE = 16

# CUresult / cudaError_t codes (the two enums agree on these values).
_STICKY = {
    700: "illegal memory address",
    702: "launch timed out",
    710: "device-side assert triggered",
    714: "hardware stack error",
    715: "illegal instruction",
    716: "misaligned address",
    717: "invalid address space",
    718: "invalid program counter",
    719: "unspecified launch failure",
    999: "unknown CUDA error",
}
_CONFIG = {
    1: "invalid launch configuration (block, grid or shared memory out of range)",
    200: "the cubin is not a valid image",
    209: "the cubin has no code for this GPU (check the compile target)",
    218: "the cubin was built for another GPU or PTX version",
    500: "the kernel entry point was not found in the cubin",
    701: "too many resources requested for launch (registers x threads per block)",
    720: "cooperative launch too large",
    912: "invalid cluster size",
}

_ATTR_MAX_THREADS = 0
_ATTR_SHARED_STATIC = 1
_ATTR_LOCAL = 3
_ATTR_REGS = 4
_ATTR_MAX_DYN_SHARED = 8
_ATTR_CLUSTER_W, _ATTR_CLUSTER_H, _ATTR_CLUSTER_D = 11, 12, 13
_ATTR_NON_PORTABLE_CLUSTER = 14

_SCALAR_TYPES = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "float32": np.float32,
                 "uint64": np.uint64, "float64": np.float64}


class LaunchConfigError(RuntimeError):
    """The driver refused to load or launch the kernel; the CUDA context is still usable."""


def cuda_status(exc: BaseException) -> int | None:
    """The numeric CUDA status carried by a cupy CUDA exception, if any."""
    status = getattr(exc, "status", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def _is_cuda_error(exc: BaseException) -> bool:
    return type(exc).__name__ in ("CUDARuntimeError", "CUDADriverError") or cuda_status(exc) is not None


def gpu_available() -> bool:
    """True when cupy imports, sees a CUDA device and can allocate on it.

    The probe really touches the device (a tiny allocation and a synchronise), so a
    machine with cupy installed but no usable GPU answers ``False``.
    """
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        a = cupy.arange(4, dtype=cupy.float32)
        ok = float(a.sum()) == 6.0
        cupy.cuda.runtime.deviceSynchronize()
        return ok
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False


def scalar_args(scalars: Sequence[tuple[str, int | float]]) -> list[Any]:
    """Problem scalars ``(ctype, value)`` as numpy scalars of that C type.

    Raises:
        ValueError: an unknown ctype (the message lists the known ones).
    """
    out: list[Any] = []
    for ctype, value in scalars:
        try:
            out.append(_SCALAR_TYPES[ctype](value))
        except KeyError:
            raise ValueError(f"scalar ctype {ctype!r} unknown; use one of {sorted(_SCALAR_TYPES)}") from None
    return out


# --------------------------------------------------------------------------- guarded buffers


def _ptr(a: Any) -> int:
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    return int(a.ctypes.data)


@dataclass
class GuardedBuffer:
    """One kernel buffer inside its own allocation, with canary guards on both sides.

    Layout of :attr:`raw` (uint8): ``guard`` canary bytes, the buffer's ``nbytes``, then
    ``guard`` canary bytes.

    Attributes:
        spec: The argument it backs.
        raw: The whole allocation (uint8).
        guard: Guard bytes per side.
        canary: ``2 * guard`` expected guard bytes (before, then after).
    """

    spec: ArgSpec
    raw: Any
    guard: int
    canary: Any

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    @property
    def array(self) -> Any:
        """The buffer as a flat array of its storage dtype (a view into :attr:`raw`)."""
        return self.raw[self.guard:self.guard + self.nbytes].view(storage_dtype(self.spec.dtype))

    def check(self, xp: Any) -> str | None:
        """``None`` if both guards are intact, else a sentence naming the corruption."""
        g = self.guard
        before = self.raw[:g]
        after = self.raw[g + self.nbytes:]
        problems = []
        for label, region, expect in (("before", before, self.canary[:g]), ("after", after, self.canary[g:])):
            diff = region != expect
            n = int(xp.count_nonzero(diff))
            if n:
                idx = xp.nonzero(diff)[0]
                if label == "before":
                    nearest = g - int(idx[-1])
                    far = g - int(idx[0])
                    where = f"{nearest} to {far} bytes before its start"
                else:
                    where = f"{int(idx[0])} to {int(idx[-1])} bytes past its end"
                problems.append(f"out-of-bounds write {label} buffer {self.spec.name!r}: {n} guard bytes changed, "
                                f"{where} (buffer holds {self.spec.numel} x {self.spec.dtype})")
        return "; ".join(problems) or None


def make_canary(seed: int, guard: int, xp: Any) -> Any:
    """``2 * guard`` pseudo-random bytes derived from ``seed`` (never all one value)."""
    host = np.random.default_rng(np.random.SeedSequence([int(seed) & (2**63 - 1), 0xCA7A27])).integers(
        0, 256, size=2 * guard, dtype=np.uint8)
    host[0] = 0xA5  # never a constant fill such as all-zeros or all-ones
    host[-1] = 0x5A
    return xp.asarray(host)


def allocate_buffers(specs: Sequence[ArgSpec], canary: Any, xp: Any, guard: int = GUARD_BYTES) -> dict[str, GuardedBuffer]:
    """One guarded allocation per buffer, guards filled with ``canary``.

    Args:
        specs: The kernel's buffer arguments.
        canary: ``2 * guard`` bytes from :func:`make_canary`.
        xp: ``numpy`` or ``cupy``.
        guard: Guard bytes per side; a multiple of 256 keeps the buffer 256-byte aligned.

    Returns:
        name -> buffer, in argument order. Buffer contents are undefined.
    """
    if guard % 256:
        raise ValueError(f"guard must be a multiple of 256 bytes, got {guard}")
    out: dict[str, GuardedBuffer] = {}
    for spec in specs:
        raw = xp.empty(spec.nbytes + 2 * guard, dtype=xp.uint8)
        raw[:guard] = canary[:guard]
        raw[guard + spec.nbytes:] = canary[guard:]
        if xp.__name__ == "cupy" and _ptr(raw) % 256:
            raise RuntimeError(f"allocation for {spec.name!r} is not 256-byte aligned ({_ptr(raw):#x})")
        out[spec.name] = GuardedBuffer(spec, raw, guard, canary)
    return out


# --------------------------------------------------------------------------- backends


@dataclass
class KernelHandle:
    """A loaded kernel and the attributes the launcher checks against.

    Attributes:
        function: Backend-specific callable (a cupy ``Function`` on the GPU).
        name: Entry-point name.
        max_threads: Most threads per block this kernel can launch with.
        static_shared: Static shared memory bytes.
        registers: Registers per thread.
        local_bytes: Local (stack/spill) memory per thread.
        cluster: Cluster shape compiled into the kernel (``__cluster_dims__``) or ``None``.
        dyn_shared_set: The dynamic shared memory limit set on the function so far (0: the
            default, 48 KB less the static shared memory).
        resident: CTAs that fit at once, per (block, shared memory, cluster) asked so far
            (``None``: the driver could not be asked).
    """

    function: Any
    name: str
    max_threads: int = 1024
    static_shared: int = 0
    registers: int = 0
    local_bytes: int = 0
    cluster: tuple[int, int, int] | None = None
    dyn_shared_set: int = 0
    module: Any = None
    resident: dict[Any, int | None] = dataclasses.field(default_factory=dict)


class Backend:
    """What the device stages need from a GPU (or a CPU stand-in in tests).

    Attributes:
        xp: The array module (``cupy`` on the GPU).
    """

    xp: Any = np

    def device_info(self, scratch: dict[str, Any]) -> DeviceInfo:  # pragma: no cover - interface
        raise NotImplementedError

    def load(self, job: Job, scratch: dict[str, Any], build: str = "") -> KernelHandle:  # pragma: no cover
        """The kernel of ``job`` (its build ``build``, a key of ``job.data["cubins"]``, when the
        Problem builds per dtype; ``""`` is the single build)."""
        raise NotImplementedError

    def launch(self, kernel: KernelHandle, launch: Launch, args: Sequence[Any],
               device: DeviceInfo) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def resident_blocks(self, kernel: KernelHandle, launch: Launch, device: DeviceInfo) -> int | None:
        """CTAs of ``launch`` that can run on the device at once; ``None``: unknown (a
        resident launch then keeps its grid)."""
        return None

    def fit(self, kernel: KernelHandle, launch: Launch, device: DeviceInfo) -> Launch:
        """The launch to run for ``launch``: a ``resident`` one capped at what fits at once
        (:func:`fit_resident`); any other unchanged."""
        if not launch.resident:
            return launch
        return fit_resident(launch, self.resident_blocks(kernel, launch, device))

    def capture(self, kernel: KernelHandle, launch: Launch, arg_lists: Sequence[Sequence[Any]],
                device: DeviceInfo) -> Any:
        """Record ``len(arg_lists)`` launches as one replayable batch, or ``None``.

        The result's ``launch()`` enqueues the whole batch at once (a CUDA graph on the
        GPU), so short kernels run back to back instead of waiting on the host's launch
        rate. ``None`` means the backend cannot record batches; callers then launch one
        by one.
        """
        return None

    def synchronize(self) -> None:
        """Wait for all device work; raise :class:`~fitness.CudaFault` on a sticky error."""

    def rng(self, seed: int) -> Any:
        """A Generator of :attr:`xp` seeded with ``seed``."""
        return self.xp.random.default_rng(int(seed))

    def event(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def elapsed_ms(self, start: Any, end: Any) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def free_bytes(self) -> int:
        """Device bytes still available for buffers."""
        return 1 << 34

    def release(self) -> None:
        """Return cached device memory (between evaluations)."""

    def hold_busy(self, ms: float) -> float:
        """Keep the device under a steady memory-bound load for about ``ms`` milliseconds.

        Run before timing, so the first timed case does not start from an idle card's
        clock and power state. Returns the milliseconds spent (0 where there is no device).
        """
        return 0.0


DEFAULT_BLOCK_SHARED = 48 * 1024
"""Static plus dynamic shared memory a CTA may use without the opt-in attribute (bytes)."""


def needs_dyn_shared_optin(kernel: KernelHandle, launch: Launch) -> bool:
    """True when ``launch`` needs a higher dynamic shared memory limit than ``kernel`` has.

    Without the attribute, a CTA may use 48 KB of shared memory in all, static included, so
    48 KB of dynamic memory on a kernel with any static array already needs it.
    """
    need = int(launch.shared_mem)
    if need <= kernel.dyn_shared_set:
        return False
    return kernel.static_shared + need > DEFAULT_BLOCK_SHARED


def validate_launch(kernel: KernelHandle, launch: Launch, device: DeviceInfo) -> None:
    """Reject a launch the driver would refuse, with a message that says what to change.

    Raises:
        LaunchConfigError: block over the kernel's limit, grid out of range, too much
            shared memory, or a grid that is not a whole number of clusters.
    """
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if threads > kernel.max_threads:
        raise LaunchConfigError(
            f"block {launch.block} has {threads} threads but kernel {kernel.name!r} can launch at most "
            f"{kernel.max_threads} (it uses {kernel.registers} registers per thread): use fewer threads "
            "per block or fewer registers (__launch_bounds__)")
    gx, gy, gz = launch.grid
    if gx > 2**31 - 1 or gy > 65535 or gz > 65535:
        raise LaunchConfigError(f"grid {launch.grid} out of range (x < 2^31, y and z <= 65535)")
    limit = device.shared_per_block_optin
    if limit and kernel.static_shared + launch.shared_mem > limit:
        raise LaunchConfigError(
            f"kernel {kernel.name!r} needs {kernel.static_shared} B static + {launch.shared_mem} B dynamic shared "
            f"memory per block, more than the {limit} B this GPU allows")
    declared = launch.cluster if launch.cluster and launch.cluster != (1, 1, 1) else None
    compiled = kernel.cluster
    if declared and compiled is None:
        raise LaunchConfigError(
            f"the launch asks for cluster {declared} but kernel {kernel.name!r} declares none: add "
            f"__cluster_dims__({declared[0]}, {declared[1]}, {declared[2]}) to the kernel")
    if declared and compiled and tuple(declared) != tuple(compiled):
        raise LaunchConfigError(f"the launch says cluster {declared} but the kernel declares __cluster_dims__{compiled}")
    shape = compiled or declared
    if shape:
        if any(g % c for g, c in zip(launch.grid, shape, strict=True)):
            raise LaunchConfigError(f"grid {launch.grid} is not a whole number of clusters {shape}")
        if shape[0] * shape[1] * shape[2] > 16:
            raise LaunchConfigError(f"cluster {shape} has more than 16 blocks (the Hopper limit)")


def fit_resident(launch: Launch, resident_blocks: int | None) -> Launch:
    """The launch to run: a ``resident`` launch's grid capped at ``resident_blocks`` CTAs.

    Whole clusters, and never below one cluster (or CTA): a kernel that fits nowhere then
    fails at its launch with the driver's own error. Unchanged when the launch is not
    resident, ``resident_blocks`` is ``None`` (unknown) or the grid already fits.
    """
    if not launch.resident or resident_blocks is None:
        return launch
    c = launch.cluster[0] if launch.cluster is not None else 1
    cap = max(c, int(resident_blocks) // c * c)
    if launch.grid[0] <= cap:
        return launch
    return dataclasses.replace(launch, grid=(cap, 1, 1))


class _CULaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` of the CUDA driver API (no stream, no launch attributes)."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


_LIBCUDA: Any = None


def _libcuda() -> Any:
    global _LIBCUDA
    if _LIBCUDA is None:
        _LIBCUDA = ctypes.CDLL("libcuda.so.1")
    return _LIBCUDA


def resident_blocks(function_ptr: int, launch: Launch, sm_count: int) -> int:
    """CTAs of ``launch`` that the current device can run at once (the driver's occupancy
    calculator): with a cluster, ``cuOccupancyMaxActiveClusters`` times the cluster size (the
    clusters of one GPC share its SMs, so this can be well below CTAs per SM times SMs);
    without, CTAs per SM times ``sm_count``. The function's dynamic shared memory limit and
    non-portable cluster permission must already be set (they change the answer).

    Raises:
        LaunchConfigError: the driver refused the query (the message carries its CUDA error).
    """
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if launch.cluster is not None and math.prod(launch.cluster) > 1:
        cfg = _CULaunchConfig(launch.grid[0], launch.grid[1], launch.grid[2], launch.block[0], launch.block[1],
                              launch.block[2], int(launch.shared_mem), None, None, 0)
        n = ctypes.c_int(0)
        rc = _libcuda().cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(int(function_ptr)),
                                                     ctypes.byref(cfg))
        if rc != 0:
            raise LaunchConfigError(f"cuOccupancyMaxActiveClusters refused block {launch.block}, "
                                    f"{launch.shared_mem} B shared, cluster {launch.cluster}: CUDA error {rc}")
        return int(n.value) * math.prod(launch.cluster)
    import cupy

    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(int(function_ptr), threads,
                                                                         int(launch.shared_mem))
    return int(per_sm) * int(sm_count)


class CupyBackend(Backend):
    """The real backend: cupy on the current CUDA device."""

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.xp = cupy
        # A stream of our own (graphs cannot be captured on the legacy default stream); it
        # is made current so the gate's array work is ordered with the launches.
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()

    # -- device -----------------------------------------------------------------------

    def device_info(self, scratch: dict[str, Any]) -> DeviceInfo:
        cached = scratch.get("fitness.device_info")
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        cp = self.cupy
        dev = cp.cuda.runtime.getDevice()
        props = cp.cuda.runtime.getDeviceProperties(dev)
        name = props["name"]
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        index = dev
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible.strip().isdigit():
            index = int(visible.strip())
        info = DeviceInfo(
            name=str(name),
            compute_capability=f"{props['major']}.{props['minor']}",
            sm_count=int(props["multiProcessorCount"]),
            l2_bytes=int(props["l2CacheSize"]),
            shared_per_block_optin=int(props.get("sharedMemPerBlockOptin", props.get("sharedMemPerBlock", 0))),
            copy_gbps=self.measure_copy_gbps(),
            index=int(index),
        )
        scratch["fitness.device_info"] = info
        log.info("device %s cc %s: %d SMs, L2 %d B, copy %.0f GB/s", info.name, info.compute_capability,
                 info.sm_count, info.l2_bytes, info.copy_gbps)
        return info

    def measure_copy_gbps(self, nbytes: int = 1 << 30, repeats: int = 9) -> float:
        """Device-to-device copy bandwidth: (bytes read + written) / time, median of ``repeats``."""
        cp = self.cupy
        rt = cp.cuda.runtime
        free = self.free_bytes()
        n = int(min(nbytes, max(1 << 24, free // 4)))
        n -= n % 256
        src = cp.empty(n, dtype=cp.uint8)
        dst = cp.empty(n, dtype=cp.uint8)
        src.fill(1)
        times = []
        try:
            for i in range(repeats + 2):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(self.stream)
                rt.memcpyAsync(dst.data.ptr, src.data.ptr, n, rt.memcpyDeviceToDevice, self.stream.ptr)
                end.record(self.stream)
                end.synchronize()
                if i >= 2:
                    times.append(cp.cuda.get_elapsed_time(start, end))
        finally:
            del src, dst
            cp.get_default_memory_pool().free_all_blocks()
        ms = statistics.median(times)
        return 2.0 * n / (ms * 1e-3) / 1e9

    def free_bytes(self) -> int:
        cp = self.cupy
        free, _total = cp.cuda.runtime.memGetInfo()
        return int(free) + int(cp.get_default_memory_pool().free_bytes())

    def release(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def hold_busy(self, ms: float, nbytes: int = 64 << 20) -> float:
        if ms <= 0:
            return 0.0
        cp = self.cupy
        rt = cp.cuda.runtime
        src = cp.empty(nbytes, dtype=cp.uint8)
        dst = cp.empty(nbytes, dtype=cp.uint8)
        t0 = time.perf_counter()
        try:
            while (time.perf_counter() - t0) * 1e3 < ms:
                for _ in range(8):  # about 0.25 ms of copies per check on an H200
                    rt.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, rt.memcpyDeviceToDevice, self.stream.ptr)
                self.stream.synchronize()
        finally:
            del src, dst
        return (time.perf_counter() - t0) * 1e3

    # -- kernels ----------------------------------------------------------------------

    def _attr(self, attr: int, fptr: int) -> int:
        try:
            return int(self.cupy.cuda.driver.funcGetAttribute(attr, fptr))
        except Exception:  # noqa: BLE001 - attribute unknown to this driver
            return 0

    def load(self, job: Job, scratch: dict[str, Any], build: str = "") -> KernelHandle:
        """Load ``job.data["cubin"]``, or with several builds ``job.data["cubins"][build]``
        (cached per genome and build in ``scratch``), and find the entry.

        Raises:
            LaunchConfigError: the image does not load or lacks the entry point.
            CudaFault: the context is already poisoned.
        """
        cubins = job.data.get("cubins")
        if cubins:
            if build not in cubins:
                raise RuntimeError(f"job.data['cubins'] has no build {build!r} (builds: {sorted(cubins)})")
            cubin = cubins[build]
        else:
            cubin = job.data.get("cubin")
        if not isinstance(cubin, (bytes, bytearray)):
            raise RuntimeError("job.data['cubin'] is missing: put a Compile stage before the device stages")
        cache: collections.OrderedDict[str, KernelHandle] = scratch.setdefault(
            "fitness.modules", collections.OrderedDict())
        key = f"{job.genome.id}:{job.genome.entry}:{build}"
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        cp = self.cupy
        module = cp.cuda.function.Module()
        try:
            module.load(bytes(cubin))
            fn = module.get_function(job.genome.entry)
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, f"loading kernel {job.genome.entry!r}") from exc
        p = fn.ptr
        w, h, d = (self._attr(a, p) for a in (_ATTR_CLUSTER_W, _ATTR_CLUSTER_H, _ATTR_CLUSTER_D))
        handle = KernelHandle(
            function=fn, name=job.genome.entry, module=module,
            max_threads=self._attr(_ATTR_MAX_THREADS, p) or 1024,
            static_shared=self._attr(_ATTR_SHARED_STATIC, p),
            registers=self._attr(_ATTR_REGS, p),
            local_bytes=self._attr(_ATTR_LOCAL, p),
            cluster=(w, h or 1, d or 1) if w > 0 else None,
        )
        if handle.cluster and math.prod(handle.cluster) > 8:
            cp.cuda.driver.funcSetAttribute(p, _ATTR_NON_PORTABLE_CLUSTER, 1)
        cache[key] = handle
        while len(cache) > MODULE_CACHE_SIZE:
            cache.popitem(last=False)
        return handle

    def _translate(self, exc: BaseException, what: str) -> BaseException:
        status = cuda_status(exc)
        if status in _STICKY:
            return CudaFault(f"CUDA error {status} ({_STICKY[status]}) while {what}: {exc}")
        if status in _CONFIG or (status is not None and status < 700) or status in (701, 720, 912):
            if self._context_ok():
                return LaunchConfigError(f"{what}: {_CONFIG.get(status, 'CUDA error')} [{status}: {exc}]")
            return CudaFault(f"CUDA error {status} while {what}, and the context is no longer usable: {exc}")
        if _is_cuda_error(exc):
            return CudaFault(f"CUDA error {status} while {what}: {exc}")
        return exc

    def _context_ok(self) -> bool:
        try:
            self.cupy.cuda.runtime.deviceSynchronize()
            probe = self.cupy.zeros(1, dtype=self.cupy.int32) + 1
            return int(probe[0]) == 1
        except Exception:  # noqa: BLE001
            return False

    def _allow_dyn_shared(self, kernel: KernelHandle, launch: Launch) -> None:
        """Raise the function's dynamic shared memory limit when the launch needs more."""
        if needs_dyn_shared_optin(kernel, launch):
            self.cupy.cuda.driver.funcSetAttribute(kernel.function.ptr, _ATTR_MAX_DYN_SHARED, int(launch.shared_mem))
            kernel.dyn_shared_set = int(launch.shared_mem)

    def resident_blocks(self, kernel: KernelHandle, launch: Launch, device: DeviceInfo) -> int | None:
        """The driver's occupancy answer for ``launch`` (cached on the kernel per block, shared
        memory and cluster)."""
        key = (launch.block, int(launch.shared_mem), launch.cluster)
        if key not in kernel.resident:
            validate_launch(kernel, launch, device)
            try:
                self._allow_dyn_shared(kernel, launch)
                kernel.resident[key] = resident_blocks(kernel.function.ptr, launch, device.sm_count)
            except LaunchConfigError:
                raise
            except Exception as exc:  # noqa: BLE001
                err = self._translate(exc, f"asking how many CTAs of {kernel.name!r} block={launch.block} "
                                           f"shared={launch.shared_mem} fit at once")
                if err is not exc:
                    raise err from exc
                # not a CUDA error (no driver library or symbol): the grid is an upper bound the
                # kernel is correct with, so it stays
                log.warning("cannot ask the driver how many CTAs fit (%s: %s); resident launches keep their grid",
                            type(exc).__name__, exc)
                kernel.resident[key] = None
        return kernel.resident[key]

    def launch(self, kernel: KernelHandle, launch: Launch, args: Sequence[Any], device: DeviceInfo) -> None:
        """Launch asynchronously on the current stream (no synchronise).

        Raises:
            LaunchConfigError: a configuration the kernel or GPU cannot run.
            CudaFault: a sticky error surfaced at launch time.
        """
        validate_launch(kernel, launch, device)
        fn = kernel.function
        try:
            self._allow_dyn_shared(kernel, launch)
            fn(launch.grid, launch.block, tuple(args), shared_mem=int(launch.shared_mem), stream=self.stream)
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, f"launching {kernel.name!r} grid={launch.grid} block={launch.block} "
                                       f"shared={launch.shared_mem}") from exc

    def capture(self, kernel: KernelHandle, launch: Launch, arg_lists: Sequence[Sequence[Any]],
                device: DeviceInfo) -> Any:
        """A CUDA graph of the launches (``None`` if this driver or cupy cannot capture).

        Raises:
            LaunchConfigError: a configuration the kernel or GPU cannot run.
        """
        validate_launch(kernel, launch, device)
        if not arg_lists or not hasattr(self.stream, "begin_capture"):
            return None
        fn = kernel.function
        self._allow_dyn_shared(kernel, launch)
        self.synchronize()
        graph = None
        try:
            self.stream.begin_capture()
            try:
                for args in arg_lists:
                    fn(launch.grid, launch.block, tuple(args), shared_mem=int(launch.shared_mem), stream=self.stream)
            finally:
                graph = self.stream.end_capture()
            graph.upload(self.stream)
        except Exception as exc:  # noqa: BLE001 - capture unsupported: plain launches instead
            log.debug("graph capture failed (%s: %s); timing plain launches", type(exc).__name__, exc)
            if not self._context_ok():
                raise CudaFault(f"CUDA context lost while capturing {kernel.name!r}: {exc}") from exc
            return None
        return _Graph(graph, self.stream)

    def synchronize(self) -> None:
        try:
            self.cupy.cuda.runtime.deviceSynchronize()
        except Exception as exc:  # noqa: BLE001
            err = self._translate(exc, "running the kernel")
            if isinstance(err, LaunchConfigError):  # an asynchronous error is never benign
                err = CudaFault(str(err))
            raise err from exc

    def event(self) -> Any:
        ev = self.cupy.cuda.Event()
        ev.record(self.stream)
        return ev

    def elapsed_ms(self, start: Any, end: Any) -> float:
        end.synchronize()
        return float(self.cupy.cuda.get_elapsed_time(start, end))


class _Graph:
    """A captured batch of launches, replayed on its stream."""

    def __init__(self, graph: Any, stream: Any) -> None:
        self.graph = graph
        self.stream = stream

    def launch(self) -> None:
        self.graph.launch(self.stream)


def get_backend(scratch: dict[str, Any]) -> Backend:
    """The worker's backend: the one in ``scratch[BACKEND_KEY]``, else a new :class:`CupyBackend`."""
    backend = scratch.get(BACKEND_KEY)
    if backend is None:
        backend = CupyBackend()
        scratch[BACKEND_KEY] = backend
    return backend  # type: ignore[no-any-return]


def init_device(scratch: dict[str, Any]) -> DeviceInfo:
    """Initialise the worker's GPU once and describe it (cached in ``scratch``).

    Creates the CUDA context on the current device, reads its properties and measures
    the device-to-device copy bandwidth (median of several 1 GiB copies), the ceiling
    that :class:`~fitness.Timing` reports fractions against.

    Args:
        scratch: The worker's per-process dict; the backend and the DeviceInfo are kept in it.

    Returns:
        The device, with ``copy_gbps`` measured.
    """
    t0 = time.perf_counter()
    backend = get_backend(scratch)
    info = backend.device_info(scratch)
    if not scratch.get("fitness.warmed"):
        warm_array_kernels(backend.xp)
        scratch["fitness.warmed"] = True
    scratch.setdefault("fitness.init_seconds", time.perf_counter() - t0)
    return info


def warm_array_kernels(xp: Any) -> None:
    """Run the gate's array code once on tiny arrays.

    cupy compiles each elementwise/reduction kernel on first use (seconds on a fresh
    machine); doing it here moves that cost into worker start-up instead of the first
    candidate's device time.
    """
    from evo.types import Case
    from fitness._dtypes import checksum, from_storage, poison, storage_dtype, store_into, to_storage, upcast
    from fitness._gate import compare

    case = Case({"M": 2, "N": 3}, "float32")
    for dtype in ("float32", "bfloat16", "float16"):
        vals = xp.linspace(-2.0, 2.0, 6, dtype=xp.float32)
        stored = to_storage(vals, dtype, xp)
        store_into(xp.empty(6, dtype=storage_dtype(dtype).name), vals, dtype, xp)
        checksum(stored, xp)
        wide = from_storage(stored, dtype, xp)
        upcast(stored, dtype, xp)
        compare("warm", wide, vals, 1e-2, xp, row_len=case["N"])
        bad = wide.copy()
        poison(bad, xp)
        compare("warm", bad, vals, 1e-2, xp, row_len=case["N"])


def describe_kernel(kernel: KernelHandle) -> Mapping[str, Any]:
    """Kernel attributes as plain values (for resources/metrics)."""
    return {"registers": kernel.registers, "static_shared": kernel.static_shared, "local_bytes": kernel.local_bytes,
            "max_threads": kernel.max_threads, "cluster": list(kernel.cluster) if kernel.cluster else None}
