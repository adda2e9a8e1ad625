# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: measure and verify GPU peer-to-peer copies through the CUDA driver API (libcuda.so.1) with ctypes.

The target host needs only the NVIDIA driver: no PyTorch, no CUDA toolkit. No
Ansible imports. ``measure`` runs every pair, and each GPU's copies to and from
pinned host memory (its PCIe link, measured), in a child process under a
watchdog, so a copy that never returns (the classic broken-ACS hang) costs one
``timeout`` and is reported as ``hang`` instead of hanging the play. Tests load
a stand-in libcuda built from tests/fakes/libcuda.c; the code is the same.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os

MIB = 1024 * 1024
CU_EVENT_DEFAULT = 0
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


class Driver:
    """The few driver entry points the measurement needs, checked on every call."""

    def __init__(self, path: str = "libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise CudaError(f"cannot load {path}: {exc}") from exc

    def __call__(self, name: str, *args, allow: tuple[int, ...] = ()) -> int:
        result = getattr(self.lib, name)(*args)
        if result != 0 and result not in allow:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise CudaError(f"{name} failed: {result} ({(text.value or b'').decode(errors='replace')})")
        return result


class Gpu:
    """One device with its primary context, a stream and two events."""

    def __init__(self, cuda: Driver, ordinal: int):
        self.cuda, self.ordinal = cuda, ordinal
        self.device = ctypes.c_int()
        cuda("cuDeviceGet", ctypes.byref(self.device), ordinal)
        self.context = ctypes.c_void_p()
        cuda("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self.use()
        self.stream = ctypes.c_void_p()
        cuda("cuStreamCreate", ctypes.byref(self.stream), 0)
        bus = ctypes.create_string_buffer(32)
        cuda("cuDeviceGetPCIBusId", bus, 32, self.device)
        self.pci_bus_id = bus.value.decode().lower()

    def use(self) -> None:
        self.cuda("cuCtxSetCurrent", self.context)

    def alloc(self, size: int) -> ctypes.c_uint64:
        self.use()
        pointer = ctypes.c_uint64()
        self.cuda("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        return pointer

    def free(self, pointer: ctypes.c_uint64) -> None:
        self.use()
        self.cuda("cuMemFree_v2", pointer)

    def can_access(self, other: Gpu) -> bool:
        can = ctypes.c_int()
        self.cuda("cuDeviceCanAccessPeer", ctypes.byref(can), self.device, other.device)
        return bool(can.value)

    def peer_access(self, other: Gpu, enabled: bool) -> None:
        self.use()
        if enabled:
            self.cuda("cuCtxEnablePeerAccess", other.context, 0, allow=(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,))
        else:
            self.cuda("cuCtxDisablePeerAccess", other.context, allow=(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,))


def _copy(cuda: Driver, dst: Gpu, dst_ptr, src: Gpu, src_ptr, size: int, stream) -> None:
    cuda("cuMemcpyPeerAsync", dst_ptr, dst.context, src_ptr, src.context, ctypes.c_size_t(size), stream)


def _copies(cuda: Driver, dst: Gpu, dst_ptr, src: Gpu, src_ptr, size: int, stream, count: int) -> None:
    for _index in range(count):
        _copy(cuda, dst, dst_ptr, src, src_ptr, size, stream)


def _timed(cuda: Driver, gpu: Gpu, work) -> float:
    """Seconds that ``work()`` takes on ``gpu``'s stream, by CUDA events."""
    gpu.use()
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    cuda("cuEventCreate", ctypes.byref(start), CU_EVENT_DEFAULT)
    cuda("cuEventCreate", ctypes.byref(end), CU_EVENT_DEFAULT)
    try:
        cuda("cuEventRecord", start, gpu.stream)
        work()
        cuda("cuEventRecord", end, gpu.stream)
        cuda("cuEventSynchronize", end)
        elapsed = ctypes.c_float()
        cuda("cuEventElapsedTime", ctypes.byref(elapsed), start, end)
        return max(elapsed.value / 1e3, 1e-9)
    finally:
        cuda("cuEventDestroy_v2", start)
        cuda("cuEventDestroy_v2", end)


def _pattern(size: int, seed: int) -> bytes:
    """A pattern no stuck bit, dropped block or shifted copy reproduces."""
    block = bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(4096))
    return (block * (size // len(block) + 1))[:size]


def measure_pair(cuda: Driver, src: Gpu, dst: Gpu, settings: dict) -> dict:
    """Bandwidth (uni- and bidirectional, peer access on and off), latency and a bit-exact check for src -> dst."""
    size, reps, small = settings["bandwidth_bytes"], settings["repetitions"], settings["verify_small_bytes"]
    result = {"can_access_peer": src.can_access(dst) and dst.can_access(src)}
    a, b = src.alloc(size), dst.alloc(size)
    back_a, back_b = src.alloc(size), dst.alloc(size)
    try:
        for peer in (True, False):
            if result["can_access_peer"]:
                src.peer_access(dst, peer)
                dst.peer_access(src, peer)
            key = "enabled" if peer else "disabled"
            # Warm both GPUs: idle links drop to Gen1 and the first copies set up mappings.
            _copies(cuda, dst, b, src, a, size, src.stream, settings["warmup"])
            cuda("cuStreamSynchronize", src.stream)
            seconds = _timed(cuda, src, lambda: _copies(cuda, dst, b, src, a, size, src.stream, reps))
            result[f"unidirectional_p2p_{key}"] = size * reps / seconds / 1e9

            def both_ways():
                for _index in range(reps):
                    _copy(cuda, dst, b, src, a, size, src.stream)
                    _copy(cuda, src, back_a, dst, back_b, size, dst.stream)
                cuda("cuStreamSynchronize", dst.stream)

            seconds = _timed(cuda, src, both_ways)
            result[f"bidirectional_p2p_{key}"] = 2 * size * reps / seconds / 1e9
            seconds = _timed(cuda, src, lambda: _copies(cuda, dst, b, src, a, 4, src.stream, reps * 10))
            result[f"latency_gpu_p2p_{key}_us"] = seconds / (reps * 10) * 1e6
        if result["can_access_peer"]:
            src.peer_access(dst, True)
            dst.peer_access(src, True)
        result["verified"], result["verify_detail"] = _verify(cuda, src, dst, a, b, size, small)
    finally:
        for gpu, pointer in ((src, a), (dst, b), (src, back_a), (dst, back_b)):
            gpu.free(pointer)
    return result


def measure_host(cuda: Driver, gpu: Gpu, settings: dict) -> dict:
    """One GPU's link: host-to-device and device-to-host bandwidth from pinned memory, and a bit-exact round trip."""
    size, reps = settings["bandwidth_bytes"], settings["repetitions"]
    gpu.use()
    host, back = ctypes.c_void_p(), ctypes.c_void_p()
    cuda("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(size))
    cuda("cuMemAllocHost_v2", ctypes.byref(back), ctypes.c_size_t(size))
    device = gpu.alloc(size)
    result: dict = {}

    def to_device() -> None:
        cuda("cuMemcpyHtoDAsync_v2", device, host, ctypes.c_size_t(size), gpu.stream)

    def to_host(target=host) -> None:
        cuda("cuMemcpyDtoHAsync_v2", target, device, ctypes.c_size_t(size), gpu.stream)

    try:
        for key, copy in (("host_to_device", to_device), ("device_to_host", to_host)):
            for _index in range(settings["warmup"]):
                copy()
            cuda("cuStreamSynchronize", gpu.stream)
            seconds = _timed(cuda, gpu, lambda copy=copy: [copy() for _index in range(reps)])
            result[f"{key}_gbps"] = size * reps / seconds / 1e9
        expected = _pattern(size, 3)
        ctypes.memmove(host, expected, size)
        ctypes.memset(back, 0, size)
        to_device()
        to_host(back)
        cuda("cuStreamSynchronize", gpu.stream)
        got = ctypes.string_at(back, size)
        result["verified"] = got == expected
        if result["verified"]:
            result["verify_detail"] = f"a {size}-byte round trip arrived bit for bit"
        else:
            bad = sum(1 for x, y in zip(got, expected, strict=True) if x != y)
            result["verify_detail"] = f"{size}-byte round trip: {bad} bytes differ"
    finally:
        gpu.free(device)
        cuda("cuMemFreeHost", host)
        cuda("cuMemFreeHost", back)
    return result


def _verify(cuda: Driver, src: Gpu, dst: Gpu, a, b, size: int, small: int) -> tuple[bool, str]:
    for length, seed in ((small, 1), (size, 2)):
        expected = _pattern(length, seed)
        src.use()
        cuda("cuMemcpyHtoD_v2", a, expected, ctypes.c_size_t(length))
        dst.use()
        cuda("cuMemcpyHtoD_v2", b, bytes(length), ctypes.c_size_t(length))
        _copy(cuda, dst, b, src, a, length, src.stream)
        cuda("cuStreamSynchronize", src.stream)
        got = ctypes.create_string_buffer(length)
        dst.use()
        cuda("cuMemcpyDtoH_v2", got, b, ctypes.c_size_t(length))
        if got.raw != expected:
            bad = sum(1 for x, y in zip(got.raw, expected, strict=True) if x != y)
            what = "nothing arrived" if got.raw == bytes(length) else f"{bad} of {length} bytes differ"
            return False, f"{length}-byte copy: {what}"
    return True, f"{small}- and {size}-byte copies arrived bit for bit"


def _worker(library: str, jobs: list[tuple[int, ...]], settings: dict, connection) -> None:
    """Child process: open the driver, announce each job before measuring it, send its result after.

    A job is ``(i, j)``, the pair GPU i -> GPU j, or ``(i,)``, GPU i's copies to and from the host.
    """
    try:
        cuda = Driver(library)
        cuda("cuInit", 0)
        count = ctypes.c_int()
        cuda("cuDeviceGetCount", ctypes.byref(count))
        gpus = [Gpu(cuda, i) for i in range(count.value)]
        connection.send(("devices", [g.pci_bus_id for g in gpus]))
        for job in jobs:
            connection.send(("start", job))
            if len(job) == 2:
                result = measure_pair(cuda, gpus[job[0]], gpus[job[1]], settings)
            else:
                result = measure_host(cuda, gpus[job[0]], settings)
            connection.send(("result", (job, result)))
        connection.send(("done", None))
    except CudaError as exc:
        connection.send(("error", str(exc)))
    finally:
        connection.close()


def _session(library: str, jobs: list[tuple[int, ...]], settings: dict, timeout: float) -> dict:
    """One child process over ``jobs``; stops at the first message that does not come within ``timeout``."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_worker, args=(library, jobs, settings, child), daemon=True)
    process.start()
    child.close()
    session: dict = {"devices": None, "results": {}, "stuck": None, "error": None}
    current = "starting the driver"
    try:
        while True:
            if not parent.poll(timeout):
                session["stuck"] = current
                return session
            try:
                kind, payload = parent.recv()
            except EOFError:
                session["error"] = f"the measuring process ended while {current}"
                return session
            if kind == "devices":
                session["devices"] = payload
            elif kind == "start":
                current = tuple(payload)
            elif kind == "result":
                job, result = payload
                session["results"][tuple(job)] = result
                current = "between measurements"
            elif kind == "error":
                session["error"] = payload
                return session
            else:  # done
                return session
    finally:
        _stop(process)


def measure(library: str, settings: dict, timeout: float, pairs: list[tuple[int, int]] | None = None) -> dict:
    """Measure each GPU's host link, then ordered GPU pairs (all of them by default), each under a watchdog of ``timeout`` s.

    Returns ``devices`` (PCI bus ids), ``host`` (GPU index -> its host link's result),
    ``pairs`` (``(i, j)`` -> the pair's result), either result ``{"hang": True, ...}`` for a
    copy that did not return, and ``error`` (a driver error that stopped the run, else None).
    """
    out: dict = {"devices": [], "host": {}, "pairs": {}, "error": None}
    first = _session(library, [], settings, timeout)
    if first["error"] or first["devices"] is None:
        out["error"] = first["error"] or f"the driver did not answer within {timeout} s ({first['stuck']})"
        return out
    out["devices"] = first["devices"]
    count = len(out["devices"])
    todo: list[tuple[int, ...]] = [(i,) for i in range(count)]
    todo += list(pairs) if pairs is not None else [(i, j) for i in range(count) for j in range(count) if i != j]
    while todo:
        session = _session(library, todo, settings, timeout)
        for job, result in session["results"].items():
            _file(out, job, result)
            todo.remove(job)
        if session["error"]:
            out["error"] = session["error"]
            break
        if isinstance(session["stuck"], tuple):
            _file(out, session["stuck"], {"hang": True, "timeout_s": timeout})
            todo.remove(session["stuck"])
        elif session["stuck"]:
            out["error"] = f"the driver did not answer within {timeout} s ({session['stuck']})"
            break
    return out


def _file(out: dict, job: tuple[int, ...], result: dict) -> None:
    if len(job) == 2:
        out["pairs"][job] = result
    else:
        out["host"][job[0]] = result


def _stop(process) -> None:
    """End a child; one stuck in the driver (D state) may ignore even SIGKILL, so wait at most 2 s and abandon it."""
    if process.is_alive():
        process.kill()
    process.join(2)


def default_settings() -> dict:
    return {"bandwidth_bytes": 64 * MIB, "repetitions": 10, "warmup": 3, "verify_small_bytes": 4096}


def library_path(option: str | None) -> str:
    return option or os.environ.get("GPUBOX_LIBCUDA") or "libcuda.so.1"
