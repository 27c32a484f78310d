"""CUDA C compiled at run time with NVRTC and launched on torch's current stream.

Why: Triton chooses the thread layout of every reduction itself, and for a batch-1 recurrence that choice costs
a dozen shared-memory round trips per step (bench/README.md, "triton_asm.py"). A few kernels are therefore
written in CUDA C, where the layout is ours. NVRTC ships with every CUDA build of torch (a pip dependency of
it), so no CUDA toolkit, compiler or CUDA_HOME is needed: the production image is a CUDA *runtime* image.

Launches go through the driver API (cuLaunchKernel) on torch's current stream, so they are recorded by CUDA
graph capture like any other kernel, and they work inside a torch.library custom op under torch.compile.
`compile_cubin` needs no GPU (the tests use it to check that the sources compile and fit in registers).
"""

from __future__ import annotations

import base64
import ctypes
import glob
import hashlib
import json
import os
import sys
import threading
from concurrent.futures import Future
from functools import cache

import torch

from alpha_core import compile_cache
from alpha_core.atomic import atomic_write_json


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library or no CUDA driver: callers fall back to their Triton kernels."""


def _nvrtc_candidates() -> list[str]:
    """Names and paths to try for libnvrtc: the soname torch's CUDA build links against, then any copy in a
    pip `nvidia` package (cu12: nvidia/cuda_nvrtc/lib, cu13: nvidia/cu13/lib)."""
    names = []
    if torch.version.cuda:
        names.append(f"libnvrtc.so.{torch.version.cuda.split('.')[0]}")
    names += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for entry in sys.path:
        names += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libnvrtc.so.*[0-9]")), reverse=True)
    return names


@cache
def _nvrtc() -> ctypes.CDLL:
    for name in _nvrtc_candidates():
        try:
            if os.sep in name:  # NVRTC opens its builtins by name at compile time: load the one beside it first
                for builtins in glob.glob(os.path.join(os.path.dirname(name), "libnvrtc-builtins.so.*[0-9]")):
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcUnavailable("no NVRTC library found (libnvrtc.so.*, normally installed with CUDA torch)")


@cache
def _driver() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise NvrtcUnavailable(f"no CUDA driver: {exc}") from exc
    lib.cuLaunchKernel.argtypes = [
        ctypes.c_void_p,
        *[ctypes.c_uint] * 7,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    return lib


def _check_nvrtc(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"NVRTC {what}: {_nvrtc().nvrtcGetErrorString(code).decode()}")


def _check_driver(code: int, what: str) -> None:
    if code != 0:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(code, ctypes.byref(text))
        raise RuntimeError(f"CUDA {what}: {(text.value or b'unknown error').decode()}")


def compile_cubin(source: str, names: list[str], arch: str, options: tuple[str, ...] = ()) -> tuple[bytes, dict, str]:
    """Compile `source` for `arch` (e.g. "sm_90"). `names` are the kernels to export, template arguments
    included ("cfc_fwd<64, 128, 256, true>"). Returns (cubin, {name: lowered symbol}, compiler log)."""
    lib = _nvrtc()
    program = ctypes.c_void_p()
    _check_nvrtc(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"alpha.cu", 0, None, None), "create")
    try:
        for name in names:
            _check_nvrtc(lib.nvrtcAddNameExpression(program, name.encode()), "name")
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        array = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(program, len(opts), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        if status != 0:
            raise RuntimeError(f"NVRTC compile failed for {arch}:\n{log.value.decode(errors='replace')}")
        _check_nvrtc(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib.nvrtcGetCUBIN(program, cubin), "cubin")
        lowered = {}
        for name in names:
            symbol = ctypes.c_char_p()
            _check_nvrtc(lib.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(symbol)), "lowered name")
            lowered[name] = symbol.value.decode()
        return cubin.raw, lowered, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


@cache
def _primary_context(index: int) -> int:
    """Torch's context on device `index` (the runtime's primary context; torch holds its own reference)."""
    driver = _driver()
    device, context = ctypes.c_int(), ctypes.c_void_p()
    _check_driver(driver.cuDeviceGet(ctypes.byref(device), index), "device")
    _check_driver(driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "primary context")
    driver.cuDevicePrimaryCtxRelease(device)
    return context.value


def _make_current(context: int) -> None:
    """A driver-API call needs the context current on this thread; the runtime makes it current lazily, so a
    fresh thread (the autograd engine's, say) may not have it yet."""
    current = ctypes.c_void_p()
    _check_driver(_driver().cuCtxGetCurrent(ctypes.byref(current)), "current context")
    if current.value != context:
        _check_driver(_driver().cuCtxSetCurrent(ctypes.c_void_p(context)), "set context")


def _argument(value) -> ctypes._SimpleCData | ctypes.Structure:
    if isinstance(value, torch.Tensor):
        return ctypes.c_void_p(value.data_ptr())
    return value if isinstance(value, ctypes.Structure) else ctypes.c_int(value)


class Kernel:
    """One compiled kernel on one device: `kernel(grid, block, *args)` launches on the current stream.
    Arguments are tensors (passed as device pointers), ints (C int) or ctypes structures (passed by value)."""

    def __init__(self, function: ctypes.c_void_p, device: torch.device) -> None:
        self.function = function
        self.device = device
        self.context = _primary_context(device.index)

    def __call__(self, grid: int, block: int, *args) -> None:
        values = [_argument(a) for a in args]
        params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        _make_current(self.context)
        _check_driver(_driver().cuLaunchKernel(self.function, grid, 1, 1, block, 1, 1, 0, stream, params, None), "launch")


def cubin_for(source: str, names: tuple[str, ...], arch: str) -> tuple[bytes, dict]:
    """`compile_cubin`'s cubin and lowered names, kept in the process's compile cache (`compile_cache.use`:
    `<folder>/nvrtc/<hash>.json`, written atomically) so that a pod after the first of its run loads the kernels
    instead of compiling them; the hash covers the source, the names and the architecture (the folder's key the
    torch build, and so NVRTC). A cache file that cannot be read is compiled again and replaced."""
    folder = compile_cache.active()
    if folder is None:
        return compile_cubin(source, list(names), arch)[:2]
    digest = hashlib.sha256(json.dumps([source, list(names), arch]).encode()).hexdigest()[:32]
    path = folder / "nvrtc" / f"{digest}.json"
    try:
        kept = json.loads(path.read_text())
        return base64.b64decode(kept["cubin"]), kept["lowered"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cubin, lowered, _ = compile_cubin(source, list(names), arch)
    atomic_write_json(path, {"arch": arch, "names": list(names), "lowered": lowered, "cubin": base64.b64encode(cubin).decode()})
    return cubin, lowered


_LOCK = threading.Lock()
_LOADED: dict[tuple, dict[str, Kernel]] = {}
_PENDING: dict[tuple, Future] = {}  # `prefetch`es not yet taken by `load`


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def compile_in_background(source: str, names: tuple[str, ...], arch: str) -> Future:
    """`cubin_for` on a thread of its own: NVRTC runs without the GIL, so the compile overlaps whatever this process
    does meanwhile. The future holds (cubin, lowered names), or the error `cubin_for` raised."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(cubin_for(source, names, arch))
        except BaseException as exc:  # handed to whoever takes the result, as a direct call would raise it
            future.set_exception(exc)

    threading.Thread(target=run, name="nvrtc-compile", daemon=True).start()
    return future


def prefetch(source: str, names: tuple[str, ...], device: torch.device) -> None:
    """Start compiling what `load` will ask for: a cold process (no cached cubin) then compiles its kernels while
    torch.compile traces and lowers the model, instead of after the compiled forward first reaches them."""
    index = _index(device)
    key = (source, names, index)
    with _LOCK:
        if key not in _LOADED and key not in _PENDING:
            _PENDING[key] = compile_in_background(source, names, _arch(index))


def load(source: str, names: tuple[str, ...], device: torch.device) -> dict[str, Kernel]:
    """The kernels `names` of `source`, compiled together (one NVRTC run) for `device`'s architecture once per
    process (or taken from `prefetch`) and loaded into its context."""
    index = _index(device)
    key = (source, names, index)
    with _LOCK:
        if key not in _LOADED:
            pending = _PENDING.pop(key, None)
            cubin, lowered = pending.result() if pending is not None else cubin_for(source, names, _arch(index))
            _make_current(_primary_context(index))
            module = ctypes.c_void_p()
            _check_driver(_driver().cuModuleLoadData(ctypes.byref(module), cubin), "module load")
            kernels = {}
            for name in names:
                function = ctypes.c_void_p()
                _check_driver(_driver().cuModuleGetFunction(ctypes.byref(function), module, lowered[name].encode()), "function")
                kernels[name] = Kernel(function, torch.device("cuda", index))
            _LOADED[key] = kernels
        return _LOADED[key]
