"""Eager launches of Triton kernels at a small host cost.

`kernel[grid](*args, **meta)` binds every argument again on each call: Triton specialises each
argument, builds a cache key from the specialisation and the options (a string of the options
dict), checks the kernel's globals, builds launch metadata for the launch hooks, and its launcher
asks the driver to validate every pointer argument. Here each kernel specialisation is bound once:
the first call of a specialisation goes through `kernel[grid]`, which compiles (or loads) it and
returns the compiled kernel, whose launcher and CUfunction are kept under a key that is at least
as fine as Triton's specialisation. Later calls with the same key build the key, then call that
launcher directly with the tensors' data pointers as integers (which the launcher passes through
without a driver query); on the Triton releases read for it, the C launch function under the
launcher is called directly (`_direct_launch`). The key of a call is computed in C++
(`bind_launch_args` of the extension, csrc/launch_args.cpp); without the extension every launch
takes the plain path.

The key: the kernel, the current device, `meta` (constexprs and compile options, in call order)
and per positional argument what Triton specialises on:
- a tensor: its dtype, its device and whether its data pointer is 16-byte aligned;
- an int: its type class (int32, int64, uint64 range), whether it equals 1 (specialised to a
  constexpr) and whether it is divisible by 16;
- a bool, a float, None: their type.

Anything else takes the plain `kernel[grid](...)` path on every call: a kernel that is not a
`triton.JITFunction` (TRITON_INTERPRET=1 gives `InterpretedFunction`s; autotuners), an argument
type outside the list above (tensor subclasses included), a callable grid, a non-constexpr
parameter passed by keyword, pre-run hooks, launch enter/exit hooks installed in
`triton.knobs.runtime` (a profiler), and a Triton version outside the verified range
(`_VERIFIED_TRITON`, whose `CompiledKernel.run` launchers take `(grid x, y, z, stream, function,
packed metadata, launch metadata, enter hook, exit hook, *all parameters)`).
TORCH_SAMPLING_OPS_FAST_LAUNCH=0 turns the cache off.

Like Triton, the launch goes to the current device's current stream, so it is captured by
`torch.cuda.graph`. Global knobs that Triton reads on each call (`knobs.runtime.debug`, the
instrumentation mode) are assumed not to change after a specialisation's first launch, and the
kernels' globals not to be reassigned. The cache is a dict: concurrent first calls of one key may
both take the plain path and store equal entries; lookups need no lock.
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch

try:
    import triton
    from triton import knobs as _knobs
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - triton is a dependency; guard the fast path only
    triton = None

# Triton releases whose JITFunction.run / CompiledKernel.run / launcher signatures were read.
_VERIFIED_TRITON = ((3, 6), (3, 9))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of two ints, for grids and sizes on the host. (`triton.cdiv` and
    `triton.next_power_of_2` are constexpr functions: each host call goes through Triton's call
    machinery, several times the cost of the arithmetic, and the ops compute a few a call.)"""
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1), on the host."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _triton_version() -> tuple[int, int] | None:
    try:
        major, minor = triton.__version__.split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return None


def _fast_path_supported() -> bool:
    if triton is None or os.environ.get("TORCH_SAMPLING_OPS_FAST_LAUNCH", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    version = _triton_version()
    if version is None or not (_VERIFIED_TRITON[0] <= version <= _VERIFIED_TRITON[1]):
        return False
    runtime = getattr(_knobs, "runtime", None)
    return runtime is not None and hasattr(torch._C, "_cuda_getDevice") and hasattr(torch._C, "_cuda_getCurrentRawStream")


_ENABLED = _fast_path_supported()
_Tensor = torch.Tensor
if _ENABLED:
    _runtime_knobs = _knobs.runtime
    _HookChain = getattr(_knobs, "HookChain", None)
    _get_device = torch._C._cuda_getDevice
    _get_stream = torch._C._cuda_getCurrentRawStream

# key -> an `_entry` tuple (launch function, CUfunction handle, packed metadata, constexpr values
# after the positional arguments, the kernel), or _PLAIN: this key always takes the plain path.
_BOUND: dict[tuple, tuple | None] = {}
_PLAIN = None

def _native_binder():
    """The argument binder of csrc/launch_args.cpp: args -> (key of the positional arguments, launcher
    arguments), or None for an argument type it does not handle. Without the extension (which the
    CPU kernels need anyway) every launch takes the plain path."""
    try:
        from ._C import bind_launch_args
    except ImportError:
        return lambda args: None
    return bind_launch_args


_bind_args = _native_binder()


def _hooks_installed() -> bool:
    """Whether Triton's launch enter/exit hooks are set (then only the plain path calls them)."""
    for hook in (_runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook):
        if hook is None:
            continue
        if _HookChain is not None and type(hook) is _HookChain and not hook.calls:
            continue
        return True
    return False


def _direct_launch(launcher, version):
    """A function (grid x, y, z, stream, function, packed metadata, arguments) that calls the C
    launch function under `launcher` itself, skipping the Python `CudaLauncher.__call__` (which
    only allocates Triton's global and profile scratch, none here); None for another launcher."""
    if type(launcher).__name__ != "CudaLauncher" or getattr(launcher, "global_scratch_size", 1) != 0:
        return None
    if getattr(launcher, "profile_scratch_size", 1) != 0:
        return None
    c_launch = launcher.launch
    coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    if version == (3, 6):
        # CudaLauncher.__call__: launch(gx, gy, gz, stream, function, coop, pdl, global scratch,
        # profile scratch, packed metadata, launch metadata, enter hook, exit hook, *arguments)
        def direct(gx, gy, gz, stream, function, packed, args):
            c_launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None, *args)
        return direct
    if version == (3, 9) and not getattr(launcher, "gsan_enabled", True):
        # launch(gx, gy, gz, stream, function, coop, pdl, packed metadata, launch metadata, enter
        # hook, exit hook, global scratch, profile scratch, annotations, kernel signature, arguments)
        annotations, signature = launcher.arg_annotations, launcher.kernel_signature

        def direct(gx, gy, gz, stream, function, packed, args):
            c_launch(gx, gy, gz, stream, function, coop, pdl, packed, None, None, None, None, None, annotations,
                     signature, args)
        return direct
    return None


# Parameter types whose values a LaunchPlan passes (as 64-bit slots whose first bytes the kernel
# reads): pointers, integers and float32; a kernel with another type keeps Triton's launcher.
_NATIVE_INT_TYPES = frozenset(("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"))
NATIVE_FLOAT_TYPES = frozenset(("fp32", "f32"))
_NATIVE_TRITON = ((3, 6),)  # releases whose kernel parameters (the arguments, then two scratch pointers) were read


def _native_spec(compiled, launcher, nparams: int):
    """What `_C.LaunchPlan` needs to launch `compiled` itself: (function, threads a block, shared bytes,
    CTAs a cluster, PDL, cooperative, the type of each of the kernel's `nparams` parameters in order,
    "constexpr" for those compiled in), or None where only Triton's launcher may launch it. The
    kernel's parameters are its non-constexpr arguments, then Triton's global and profile scratch
    pointers (null: `_direct_launch` admits no scratch)."""
    if _triton_version() not in _NATIVE_TRITON or _direct_launch(launcher, _triton_version()) is None:
        return None
    try:
        md = compiled.metadata
        types = tuple(compiled.src.signature.values())
        spec = (compiled.function, 32 * md.num_warps, md.shared, md.num_ctas, bool(md.launch_pdl),
                bool(md.launch_cooperative_grid), types)
    except AttributeError:
        return None
    if len(types) != nparams or not all(isinstance(t, str) for t in types):
        return None
    if any(t != "constexpr" and t[0] != "*" and t not in _NATIVE_INT_TYPES and t not in NATIVE_FLOAT_TYPES for t in types):
        return None
    return spec


def _entry(kernel, compiled, nargs: int, meta: dict):
    """The cache entry for `compiled`, the kernel `kernel[grid](*args, **meta)` launched, or _PLAIN:
    (launch(gx, gy, gz, stream, function, packed metadata, arguments), function, packed metadata,
    constexpr values after the positional arguments, the kernel, its `_native_spec` or None)."""
    if not isinstance(kernel, JITFunction) or kernel.pre_run_hooks:
        return _PLAIN
    if compiled is None or getattr(compiled, "function", None) is None:
        return _PLAIN
    try:
        launcher = compiled.run
        packed = compiled.packed_metadata
    except AttributeError:
        return _PLAIN
    tail = []
    for param in kernel.params[nargs:]:
        if not param.is_constexpr:  # a runtime argument by keyword: not kept in the key
            return _PLAIN
        name = param.name
        if name in meta:
            tail.append(meta[name])
        elif param.has_default:
            tail.append(param.default)
        else:
            return _PLAIN
    run = _direct_launch(launcher, _triton_version())
    if run is None:
        def run(gx, gy, gz, stream, function, packed, args):
            launcher(gx, gy, gz, stream, function, packed, None, None, None, *args)
    native = _native_spec(compiled, launcher, len(kernel.params))
    return (run, compiled.function, packed, tuple(tail), kernel, native)


# Set by `compiling_only` for one thread: its launches compile their kernel and launch nothing.
_compiling = False
_compiling_thread: int | None = None
_compile_filter = None


@contextlib.contextmanager
def compiling_only(compile_filter=None):
    """In this thread, `launch` compiles (Triton's `run(..., warmup=True)`) instead of launching;
    with `compile_filter(kernel, args, meta)`, only the launches it returns True for."""
    global _compiling, _compiling_thread, _compile_filter
    if _compiling:
        raise RuntimeError("torch_sampling_ops: compiling_only() is already active")
    _compiling, _compiling_thread, _compile_filter = True, threading.get_ident(), compile_filter
    try:
        yield
    finally:
        _compiling, _compiling_thread, _compile_filter = False, None, None


class Recorder:
    """The launches of one call, for `_call_cache`: (cache entry, grid, positional arguments) each;
    `complete` turns False when a launch took the plain path (nothing to replay it with)."""

    __slots__ = ("launches", "complete")

    def __init__(self):
        self.launches: list[tuple] = []
        self.complete = True


# Set by `recording` for one thread: its launches are also appended to the recorder.
_recorder: Recorder | None = None
_recorder_thread: int | None = None
_recording_lock = threading.Lock()


@contextlib.contextmanager
def recording(recorder: Recorder):
    """In this thread, every launch is also appended to `recorder`; yields it, or None (and records
    nothing) while another call is being recorded."""
    global _recorder, _recorder_thread
    if not _recording_lock.acquire(blocking=False):
        yield None
        return
    _recorder, _recorder_thread = recorder, threading.get_ident()
    try:
        yield recorder
    finally:
        _recorder, _recorder_thread = None, None
        _recording_lock.release()


def _record(entry, grid, args) -> None:
    """Appends a launch to this thread's recorder, if it records; a plain launch (entry _PLAIN)
    leaves the record incomplete."""
    if _recorder is not None and _recorder_thread == threading.get_ident():
        if entry is _PLAIN:
            _recorder.complete = False
        else:
            _recorder.launches.append((entry, grid, args))


def _plain(kernel, grid, args, meta):
    _record(_PLAIN, grid, args)
    return kernel[grid](*args, **meta)


def launch(kernel, grid, args: tuple, meta: dict):
    """`kernel[grid](*args, **meta)`, through the cached launcher when the specialisation was bound."""
    if _compiling and _compiling_thread == threading.get_ident():
        if _compile_filter is not None and not _compile_filter(kernel, args, meta):
            return None
        compiled = kernel.run(*args, grid=grid, warmup=True, **meta)
        # Load the module and build its launcher now (Triton does both at the first launch, and
        # compiles the launcher's C source, which it caches on disk, the first time).
        init_handles = getattr(compiled, "_init_handles", None)
        if init_handles is not None:
            init_handles()
        return compiled
    if not _ENABLED or type(grid) is not tuple or _hooks_installed():
        return _plain(kernel, grid, args, meta)
    bound = _bind_args(args)
    if bound is None:
        return _plain(kernel, grid, args, meta)
    args_key, call = bound
    device = _get_device()
    try:
        key = (id(kernel), device, tuple(meta.items()), args_key)
        entry = _BOUND.get(key, False)
    except TypeError:  # an unhashable meta value
        return _plain(kernel, grid, args, meta)
    if entry is False:  # first call of this specialisation: Triton compiles or loads it
        compiled = kernel[grid](*args, **meta)
        entry = _BOUND[key] = _entry(kernel, compiled, len(args), meta)
        _record(entry, grid, args)
        return compiled
    if entry is _PLAIN:
        return _plain(kernel, grid, args, meta)
    _record(entry, grid, args)
    run, function, packed, tail = entry[:4]
    n = len(grid)
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _get_stream(device), function, packed, call + tail)
    return None


def enabled() -> bool:
    """Whether launches go through the cache (CUDA, a verified Triton, not interpreting)."""
    return _ENABLED


def cache_size() -> int:
    """Bound specialisations (for tests and benchmarks)."""
    return sum(entry is not _PLAIN for entry in _BOUND.values())


def clear_cache() -> None:
    _BOUND.clear()
