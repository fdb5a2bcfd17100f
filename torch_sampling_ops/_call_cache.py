"""Eager op calls replayed from a record of their launches.

An op's CUDA body computes its launches from metadata alone (shapes, strides, dtypes, devices,
scalar arguments, the settings in use): no value on the device decides anything on the host. So a
call whose metadata repeats one already made launches the same kernels, with the same grids and
constants, on tensors of the same layouts; only the data pointers differ. The first such call runs
the body while `record` watches it: every launch (through the bound launchers of `_launch`) and
every allocation (`new_empty` / `empty`, seen by a dispatch mode). The record then replays later
calls without the body: it allocates the outputs, puts the workspaces in one buffer, and calls
each launcher with the arguments picked from the call's pointers and the recorded constants.

With the extension and a verified Triton release, a record launches its kernels through one
`_C.LaunchPlan` (csrc/replay.cpp): the CUfunction, grid, block, shared memory and launch attributes
of each launch and its parameters as Triton's launcher would pass them (pointers picked from the
call's pool, the constants packed once), all launched by cuLaunchKernelEx in one call from Python,
which also allocates the call's outputs.
TORCH_SAMPLING_OPS_NATIVE_REPLAY=0 keeps Triton's launchers.

A body is not recorded (its calls keep running it) when it does anything else: a launch that takes
Triton's plain path, an op other than an allocation (a view, a fill, a copy), a launch argument or
a returned tensor that is neither an argument of the call nor one of its allocations.

The caller keys records by everything the body reads: the argument signature the checks use
(`_C.arg_signature`), the launch key of the arguments (`_C.bind_launch_args`: also the alignment of
each data pointer, which Triton specialises on), the current device, and the objects the
registered state functions return (`register_state`: the truncation settings). Module constants
are read when a record is made: code that reassigns one (tests, sweeps) calls `clear()`.
TORCH_SAMPLING_OPS_CALL_RECORDS=0 turns records off (TORCH_SAMPLING_OPS_FAST_LAUNCH=0 turns them off
with the launch cache).
"""
from __future__ import annotations

import operator
import os
import struct
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _launch

_ALLOCATIONS = (torch.ops.aten.new_empty.default, torch.ops.aten.empty.memory_format)
_WORKSPACE_ALIGN = 256  # bytes between workspaces in the shared buffer (Triton specialises on 16)

_ENABLED = os.environ.get("TORCH_SAMPLING_OPS_CALL_RECORDS", "1") != "0"
# Whether a record launches its kernels through one `_C.LaunchPlan` (else each through Triton's launcher).
_NATIVE_ENABLED = os.environ.get("TORCH_SAMPLING_OPS_NATIVE_REPLAY", "1") != "0"
_STATE: list[Callable[[], object]] = []


def register_state(fn: Callable[[], object]) -> None:
    """Adds a function whose result (compared by identity) a body's launches depend on."""
    _STATE.append(fn)


def state() -> tuple:
    """The objects of the registered state functions now."""
    return tuple([fn() for fn in _STATE])


class _Spy(TorchDispatchMode):
    """Collects the tensors a body allocates; counts every other op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first call
        # imports torch._dynamo: seconds of the first eager call that records an allocation. This
        # mode only watches eager launchers; no compiled region ever runs inside it.
        return False

    def __init__(self):
        super().__init__()
        self.allocations: list[torch.Tensor] = []
        self.other_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS and type(out) is torch.Tensor and out.is_contiguous():
            self.allocations.append(out)
        else:
            self.other_ops += 1
        return out


class CallRecord:
    """The launches of one call, replayable on new arguments of the same metadata."""

    __slots__ = ("state", "_device", "_device_index", "_allocations", "_slot_offsets", "_workspace_bytes",
                 "_constants", "_launches", "_returned", "_returns_tuple", "_plan")

    def __init__(self, call_state, device_index, allocations, workspace_bytes, constants, launches, returned,
                 returns_tuple, plan=None):
        self.state = call_state
        self._device_index = device_index
        # (shape, dtype, offset in the workspace buffer or -1 for an output, device) of each allocation
        self._allocations = allocations
        # Each allocation's offset from the workspace's base in the pool (an output's entry, 0, is a
        # placeholder: its pointer is known only once it is allocated)
        self._slot_offsets = [max(offset, 0) for _, _, offset, _ in allocations]
        self._device = next((device for _, _, offset, device in allocations if offset >= 0), None)
        self._workspace_bytes = workspace_bytes
        self._constants = constants
        self._launches = launches
        # Each returned tensor's place among the outputs (the allocations at offset -1, in order)
        self._returned = returned
        self._returns_tuple = returns_tuple
        # The launches as one `_C.LaunchPlan`, which also allocates the outputs; or None: each
        # launch through Triton's launcher
        self._plan = plan

    def replay(self, call: tuple):
        """Launches the recorded kernels on the arguments whose launch arguments are `call`
        (`_C.bind_launch_args`); returns what the body returned."""
        pool = list(call)
        stream = _launch._get_stream(self._device_index)
        base = 0
        if self._workspace_bytes:
            # Referenced until the launches are queued: a buffer of this call's own must not be
            # handed to the outputs' allocations.
            workspace = _workspace(self._device, self._device_index, stream, self._workspace_bytes)
            base = workspace.data_ptr()
        pool.extend([base + offset for offset in self._slot_offsets])
        if self._plan is not None:
            outputs = self._plan.replay(stream, pool)
            if outputs is not None:
                return self._result(outputs)
        outputs = []
        n = len(call)
        for j, (shape, dtype, offset, device) in enumerate(self._allocations):
            if offset < 0:
                out = torch.empty(shape, dtype=dtype, device=device)
                pool[n + j] = out.data_ptr()
                outputs.append(out)
        pool.extend(self._constants)
        for run, function, packed, gx, gy, gz, pick in self._launches:
            run(gx, gy, gz, stream, function, packed, pick(pool))
        return self._result(outputs)

    def _result(self, outputs):
        if self._returns_tuple:
            return tuple([outputs[i] for i in self._returned])
        return outputs[self._returned[0]] if self._returned else None


# A replayed call's workspace of at most _STREAM_WORKSPACE_BYTES comes from one buffer kept per
# (device, stream), grown to the largest such call, so that a call pays no allocation. The calls on
# a stream touch it in stream order: an op's first launch is an ordinary one, or a dependent launch
# whose programs wait (gdc_wait) before touching any workspace, and a dependent launch finishes only
# after the launch before it (docs/design.md); so a call's kernels use the buffer only once the
# previous call's are done with it. Larger workspaces (large batches, where the allocation is small
# against the kernels) and calls under CUDA-graph capture take a buffer of their own from the
# caching allocator: a captured call's workspace then lives in the graph's private pool, so no graph
# shares memory with another graph or with eager calls, whatever streams they are replayed on.
_STREAM_WORKSPACE_BYTES = 8 << 20
_stream_workspaces: dict[tuple[int, int], torch.Tensor] = {}
# A CPU build of torch has no capture to ask about (its records hold the tests' toy launches).
_capturing = torch.cuda.is_current_stream_capturing if torch.backends.cuda.is_built() else (lambda: False)


def _workspace(device, device_index: int, stream: int, nbytes: int) -> torch.Tensor:
    """A buffer of at least nbytes for one call's workspaces on `stream`, in use until the call's
    launches are queued (then reusable in stream order)."""
    if nbytes > _STREAM_WORKSPACE_BYTES or _capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    key = (device_index, stream)
    buffer = _stream_workspaces.get(key)
    if buffer is None or buffer.numel() < nbytes:
        # The old buffer goes back to the caching allocator, which hands it out again only in this
        # stream's order (it was only ever used on this stream).
        buffer = _stream_workspaces[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer


def _aligned(n: int) -> int:
    return -(-n // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN


def _picker(indices: list[int]) -> Callable[[list], tuple]:
    if len(indices) == 1:
        i = indices[0]
        return lambda pool: (pool[i],)
    return operator.itemgetter(*indices)


_BUSY = object()  # `record`: another call was being recorded; nothing is known of this one


def record(body: Callable, args: tuple, call: tuple):
    """Runs body(*args); returns (its result, a CallRecord of the call, None when it cannot be
    replayed, or _BUSY). `call`: the launch arguments of `args` (`_C.bind_launch_args`)."""
    call_state = state()
    device_index = _launch._get_device()
    recorder = _launch.Recorder()
    spy = _Spy()
    with _launch.recording(recorder) as active:
        if active is None:
            return body(*args), _BUSY
        with spy:
            result = body(*args)
    return result, _build(args, call, call_state, device_index, recorder, spy, result)


def _build(args, call, call_state, device_index, recorder, spy, result) -> CallRecord | None:
    if not recorder.complete or spy.other_ops:
        return None
    allocations = spy.allocations
    n, a = len(args), len(allocations)

    def source(t) -> int | None:
        for i, x in enumerate(args):
            if x is t:
                return i
        for j, x in enumerate(allocations):
            if x is t:
                return n + j
        return None

    returns_tuple = isinstance(result, tuple)
    returned = result if returns_tuple else (() if result is None else (result,))
    outputs = []
    for r in returned:
        j = source(r)
        if j is None or j < n:
            return None
        outputs.append(j - n)
    offset = 0
    specs = []
    for j, t in enumerate(allocations):
        if j in outputs:
            specs.append((tuple(t.shape), t.dtype, -1, t.device))
        else:
            specs.append((tuple(t.shape), t.dtype, offset, t.device))
            offset += _aligned(t.numel() * t.element_size())
    constants: list = []
    launches = []
    native = []  # the LaunchPlan's launches, while every launch has a native spec
    for (run, function, packed, tail, _, spec), grid, launch_args in recorder.launches:
        indices = []
        for x in launch_args:
            if isinstance(x, torch.Tensor):
                i = source(x)
                if i is None:
                    return None
                indices.append(i)
            else:
                indices.append(n + a + len(constants))
                constants.append(x)
        for x in tail:
            indices.append(n + a + len(constants))
            constants.append(x)
        g = len(grid)
        gx, gy, gz = grid[0], grid[1] if g > 1 else 1, grid[2] if g > 2 else 1
        launches.append((run, function, packed, gx, gy, gz, _picker(indices)))
        if native is not None:
            params = _native_params(spec, (*launch_args, *tail), indices)
            if params is None:
                native = None
            else:
                function, block, shared, num_ctas, pdl, cooperative, _ = spec
                native.append((function, gx, gy, gz, block, shared, num_ctas, pdl, cooperative, *params))
    outputs_at = [j for j, entry in enumerate(specs) if entry[2] < 0]  # the outputs, in allocation order
    returned = [outputs_at.index(j) for j in outputs]
    plan = _native_plan(native, [(n + j, specs[j][0], specs[j][1], specs[j][3]) for j in outputs_at])
    return CallRecord(call_state, device_index, specs, offset, constants, launches, returned, returns_tuple, plan)


def _native_params(spec, values: tuple, indices: list[int]) -> tuple[list[int], list[int]] | None:
    """A launch's parameters for `_C.LaunchPlan`: (pool index or -1 a parameter, constant bits a
    parameter), Triton's two scratch pointers last (null); None where the launch has no native spec
    or a value does not fit its parameter's type."""
    if spec is None or len(values) != len(spec[6]):
        return None
    sources, bits = [], []
    for value, index, ty in zip(values, indices, spec[6], strict=True):
        if ty == "constexpr":
            continue
        if ty[0] == "*":
            if not isinstance(value, torch.Tensor):
                return None
            sources.append(index)
            bits.append(0)
            continue
        if isinstance(value, float) and ty in _launch.NATIVE_FLOAT_TYPES:
            try:
                word = struct.unpack("<I", struct.pack("<f", value))[0]
            except OverflowError:  # Triton's launcher would pass an infinity
                return None
        elif isinstance(value, int) and ty not in _launch.NATIVE_FLOAT_TYPES:  # bools too
            word = int(value) & 0xFFFFFFFFFFFFFFFF
        else:
            return None
        sources.append(-1)
        bits.append(word)
    return [*sources, -1, -1], [*bits, 0, 0]


def _native_plan(launches, outputs):
    """A `_C.LaunchPlan` of the launches and the outputs it allocates ((pool index, shape, dtype,
    device) each), or None (turned off, no extension, or a launch it cannot take)."""
    if not launches or not _NATIVE_ENABLED:
        return None
    try:
        from ._C import LaunchPlan
    except ImportError:
        return None
    return LaunchPlan(launches, outputs)


class Cache:
    """An op's records, keyed by (argument signature, launch key of the arguments, current device,
    ids of the state objects)."""

    _MAX = 4096  # records an op keeps (then forgotten at once)

    def __init__(self):
        self._records: dict[tuple, CallRecord | None] = {}
        _CACHES.append(self)

    def call(self, body: Callable, args: tuple, signature: bytes):
        """body(*args), replayed from a record when one matches."""
        bound = _launch._bind_args(args)
        # A call made while another is recorded (another thread's, or one inside the recorded body,
        # which the record's dispatch mode sees and refuses) is neither recorded nor remembered.
        if bound is None or _launch._compiling or _launch._hooks_installed():
            return body(*args)
        call_state = state()
        key = (signature, bound[0], _launch._get_device(), *map(id, call_state))
        entry = self._records.get(key, False)
        if entry is not False:
            if entry is None:
                return body(*args)
            if entry.state == call_state:  # the same objects (or equal ones: the same launches)
                return entry.replay(bound[1])
        result, rec = record(body, args, bound[1])
        if rec is not _BUSY:
            if len(self._records) >= self._MAX:
                self._records.clear()
            self._records[key] = rec
        return result

    def clear(self) -> None:
        self._records.clear()

    def __len__(self) -> int:
        return sum(r is not None for r in self._records.values())


_CACHES: list[Cache] = []


def clear() -> None:
    """Forgets every op's records (after reassigning a module constant a body reads) and frees the
    streams' workspace buffers."""
    for cache in _CACHES:
        cache.clear()
    _stream_workspaces.clear()


def enabled() -> bool:
    """Whether eager CUDA calls are recorded and replayed."""
    return _ENABLED and _launch.enabled()
