"""The eager launch cache (`torch_sampling_ops._launch`): which calls reuse a bound launcher, which
take Triton's plain path, and (on CUDA) that both paths give the same results, in and out of graphs."""
import subprocess
import sys
import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from torch_sampling_ops import _call_cache, _launch

from conftest import HAS_CUDA


def _toy_kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr, FLAG: tl.constexpr = True):
    pass  # never compiled: the tests replace JITFunction.run


class _TensorSubclass(torch.Tensor):
    pass


class _Compiled:
    """What `kernel[grid](...)` returns: a compiled kernel with its launcher."""

    def __init__(self, launches):
        self.function = 0xF00
        self.packed_metadata = (4, 1, 0)
        self.run = lambda *a: launches.append(a)


@pytest.fixture
def toy(monkeypatch):
    """A JITFunction whose plain path records its calls, with the cache enabled as on CUDA and the
    C++ argument binder."""
    pytest.importorskip("torch_sampling_ops._C")
    monkeypatch.setattr(_launch, "_bind_args", _launch._native_binder())
    kernel = JITFunction(_toy_kernel)
    plain, launches = [], []

    def run(*args, grid, warmup, **kwargs):
        plain.append((grid, args, kwargs))
        return _Compiled(launches)

    monkeypatch.setattr(kernel, "run", run)
    monkeypatch.setattr(_launch, "_ENABLED", True)
    monkeypatch.setattr(_launch, "_get_device", lambda: 0, raising=False)
    monkeypatch.setattr(_launch, "_get_stream", lambda device: 77, raising=False)
    monkeypatch.setattr(_launch, "_runtime_knobs", triton.knobs.runtime, raising=False)
    monkeypatch.setattr(_launch, "_HookChain", getattr(triton.knobs, "HookChain", None), raising=False)
    monkeypatch.setattr(_launch, "_BOUND", {})
    return kernel, plain, launches


def test_second_call_uses_the_bound_launcher(toy):
    kernel, plain, launches = toy
    x, y = torch.empty(64), torch.empty(64, dtype=torch.int32)
    _launch.launch(kernel, (3, 2), (x, 100, y), {"BLOCK": 128, "num_warps": 4})
    assert len(plain) == 1 and not launches
    _launch.launch(kernel, (3, 2), (x, 100, y), {"BLOCK": 128, "num_warps": 4})
    assert len(plain) == 1
    # grid padded to 3 dims, current stream, handle, metadata, no launch metadata or hooks, pointers
    # as integers, then the constexprs (FLAG from its default).
    assert launches == [(3, 2, 1, 77, 0xF00, (4, 1, 0), None, None, None, x.data_ptr(), 100, y.data_ptr(), 128, True)]
    assert _launch.cache_size() == 1


def test_new_specialisations_take_the_plain_path_once(toy):
    kernel, plain, launches = toy
    x = torch.empty(64)
    y = torch.empty(64, dtype=torch.int32)
    variants = [
        ((x, 100, y), {"BLOCK": 128}),
        ((x, 100, y), {"BLOCK": 256}),  # constexpr
        ((x, 100, y), {"BLOCK": 128, "num_warps": 8}),  # compile option
        ((x[1:], 100, y), {"BLOCK": 128}),  # pointer not 16-byte aligned
        ((x.half(), 100, y), {"BLOCK": 128}),  # dtype
        ((x, 96, y), {"BLOCK": 128}),  # divisible by 16
        ((x, 1, y), {"BLOCK": 128}),  # == 1: a constexpr for Triton
        ((x, 2**40, y), {"BLOCK": 128}),  # int64
        ((x, 2**40 + 1, y), {"BLOCK": 128}),
        ((x, 2**63 + 16, y), {"BLOCK": 128}),  # uint64
        ((x, 100, None), {"BLOCK": 128}),  # None
        ((x, 100, y.view(torch.float32)), {"BLOCK": 128}),  # dtype of another pointer
        ((x, 0.5, y), {"BLOCK": 128}),  # float
        ((x, True, y), {"BLOCK": 128}),  # bool
    ]
    for args, meta in variants:
        _launch.launch(kernel, (1,), args, meta)
    assert len(plain) == len(variants) and not launches
    for args, meta in variants:
        _launch.launch(kernel, (1,), args, meta)
    assert len(plain) == len(variants) and len(launches) == len(variants)
    # Same specialisation, other values: the bound launcher with the new values.
    _launch.launch(kernel, (5,), (x[4:], 113, y), {"BLOCK": 128})
    assert len(plain) == len(variants)
    assert launches[-1][:1] == (5,) and launches[-1][9:12] == (x[4:].data_ptr(), 113, y.data_ptr())


@pytest.mark.parametrize("case", ["subclass", "callable grid", "keyword argument", "hook", "not a JITFunction",
                                  "pre-run hook"])
def test_plain_path_on_every_call(toy, monkeypatch, case):
    kernel, plain, launches = toy
    x, y = torch.empty(64), torch.empty(64, dtype=torch.int32)
    args, meta, grid = (x, 100, y), {"BLOCK": 128}, (1,)
    if case == "subclass":
        args = (x.as_subclass(_TensorSubclass), 100, y)
    elif case == "callable grid":
        def grid(meta):
            return (1,)
    elif case == "keyword argument":
        args, meta = (x, 100), {"y_ptr": y, "BLOCK": 128}
    elif case == "hook":
        monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    elif case == "not a JITFunction":
        jit = kernel

        class Wrapped:
            def __getitem__(self, grid):
                return lambda *a, **k: jit.run(*a, grid=grid, warmup=False, **k)
        kernel = Wrapped()
    elif case == "pre-run hook":
        kernel.pre_run_hooks.append(lambda *a, **k: None)
    for _ in range(3):
        _launch.launch(kernel, grid, args, meta)
    assert len(plain) == 3 and not launches


def test_concurrent_first_calls(toy):
    kernel, plain, launches = toy
    x, y = torch.empty(64), torch.empty(64, dtype=torch.int32)
    errors = []

    def work():
        try:
            for i in range(200):
                _launch.launch(kernel, (1,), (x, 100 + 16 * (i % 4), y), {"BLOCK": 128})
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(plain) + len(launches) == 800 and len(plain) <= 8  # one key, at most a first call per thread


def test_host_grid_helpers_match_triton():
    """_launch.cdiv and next_power_of_2 (plain ints for the launchers' grids) agree with Triton's."""
    for n in [*range(1, 2100), 151936, 2**31 - 1, 2**31, 2**40 + 3]:
        assert _launch.next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 1024, 4096):
            assert _launch.cdiv(n, d) == triton.cdiv(n, d)
    assert _launch.cdiv(0, 7) == 0


def test_disabled_under_the_interpreter():
    from conftest import INTERPRET
    if INTERPRET:
        assert not _launch.enabled()


# ----------------------------------------------------------------------------------------------
# CUDA: the bound launchers against Triton's plain path, op by op.


def _op_examples(device, gen):
    """Valid arguments of every op of the op table that writes logits (its first argument)."""
    from op_table import OPS
    return {spec.name: spec.args(device, gen) for spec in OPS if spec.op._schema.arguments[0].name == "logits"}


def _logits_copy(logits, aligned: bool):
    """A copy of logits, starting 16-byte aligned or 4 bytes past (another specialisation)."""
    T, V = logits.shape
    shift = 0 if aligned else 4 // logits.element_size()
    buf = torch.empty(T, V + 8, dtype=logits.dtype, device=logits.device)
    out = buf[:, shift:shift + V]
    out.copy_(logits)
    assert (out.data_ptr() % 16 == 0) == aligned
    return out


def _run_all(examples, graph: bool, aligned: bool):
    outs = {}
    for name, args in examples.items():
        args = [_logits_copy(args[0], aligned)] + [a.clone() if isinstance(a, torch.Tensor) else a for a in args[1:]]
        op = getattr(torch.ops.sampling, name)
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                op(*args)
            g.replay()
        else:
            op(*args)
        outs[name] = args[0]
    torch.cuda.synchronize()
    return outs


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
def test_bound_launch_matches_plain_launch(monkeypatch, gen, graph, aligned):
    assert _launch.enabled()
    examples = _op_examples(torch.device("cuda"), gen)
    with monkeypatch.context() as m:
        m.setattr(_launch, "_ENABLED", False)
        expected = _run_all(examples, graph=False, aligned=aligned)
    _launch.clear_cache()
    first = _run_all(examples, graph=False, aligned=aligned)  # binds each specialisation
    bound = _launch.cache_size()
    assert bound > 0
    again = _run_all(examples, graph=graph, aligned=aligned)  # through the bound launchers
    assert _launch.cache_size() == bound
    for name in examples:
        assert torch.equal(first[name], expected[name]), name
        assert torch.equal(again[name], expected[name]), name


# ----------------------------------------------------------------------------------------------
# Whole calls replayed from a record (`_call_cache`)


def _toy_body(kernel, extra_op=None):
    """An op body: a workspace and an output allocated, two launches, the output returned."""
    bodies = []

    def body(x, n):
        bodies.append(n)
        ws = x.new_empty((16,), dtype=torch.float32)
        out = x.new_empty((2, 3), dtype=torch.int64)
        if extra_op is not None:
            extra_op(x)
        _launch.launch(kernel, (4,), (x, n, ws), {"BLOCK": 128})
        _launch.launch(kernel, (2, 3), (ws, 7, out), {"BLOCK": 64})
        return out
    return body, bodies


def test_repeated_call_replays_its_launches(toy):
    kernel, plain, launches = toy
    body, bodies = _toy_body(kernel)
    cache = _call_cache.Cache()
    x = torch.empty(64)
    first = cache.call(body, (x, 100), b"sig")
    assert len(bodies) == 1 and len(cache) == 1
    launches.clear()
    x2 = torch.empty(64)
    out = cache.call(body, (x2, 100), b"sig")
    assert len(bodies) == 1, "the body ran again"
    assert out.shape == first.shape == (2, 3) and out.dtype == torch.int64 and out.data_ptr() != first.data_ptr()
    (a, b) = launches
    assert a[:6] == (4, 1, 1, 77, 0xF00, (4, 1, 0)) and b[:3] == (2, 3, 1)
    ws_ptr = a[11]
    assert a[9:] == (x2.data_ptr(), 100, ws_ptr, 128, True)
    assert b[9:] == (ws_ptr, 7, out.data_ptr(), 64, True)
    assert ws_ptr % 16 == 0


def test_a_replayed_call_returns_its_outputs_in_the_bodys_order(toy):
    """Outputs allocated around a workspace and returned in another order come back in that order."""
    kernel, plain, launches = toy

    def body(x, n):
        first = x.new_empty((3,), dtype=torch.int32)
        ws = x.new_empty((16,), dtype=torch.float32)
        second = x.new_empty((5,), dtype=torch.int64)
        _launch.launch(kernel, (1,), (x, n, ws), {"BLOCK": 128})
        _launch.launch(kernel, (1,), (ws, n, first), {"BLOCK": 64})
        _launch.launch(kernel, (1,), (ws, n, second), {"BLOCK": 64})
        return second, first

    cache = _call_cache.Cache()
    cache.call(body, (torch.empty(64), 100), b"sig")
    launches.clear()
    second, first = cache.call(body, (torch.empty(64), 100), b"sig")
    assert (second.shape, second.dtype, first.shape, first.dtype) == ((5,), torch.int64, (3,), torch.int32)
    assert [launch[11] for launch in launches[1:]] == [first.data_ptr(), second.data_ptr()]


def test_replayed_calls_take_their_streams_workspace_outside_capture(toy, monkeypatch):
    """Replayed calls on one stream share one workspace buffer; a call under CUDA-graph capture, or
    one whose workspace is above the cached size, allocates its own."""
    kernel, plain, launches = toy
    monkeypatch.setattr(_call_cache, "_stream_workspaces", {})
    body, bodies = _toy_body(kernel)
    cache = _call_cache.Cache()
    cache.call(body, (torch.empty(64), 100), b"sig")
    pointers = []
    for capturing in (False, False, True, False):
        monkeypatch.setattr(_call_cache, "_capturing", lambda c=capturing: c)
        launches.clear()
        cache.call(body, (torch.empty(64), 100), b"sig")
        pointers.append(launches[0][11])
    assert len(bodies) == 1
    assert pointers[0] == pointers[1] == pointers[3] != pointers[2]
    assert list(_call_cache._stream_workspaces) == [(0, 77)]  # the fixture's device and stream
    monkeypatch.setattr(_call_cache, "_STREAM_WORKSPACE_BYTES", 8)
    monkeypatch.setattr(_call_cache, "_capturing", lambda: False)
    _call_cache._stream_workspaces.clear()
    cache.call(body, (torch.empty(64), 100), b"sig")
    assert not _call_cache._stream_workspaces


def test_native_parameters_are_packed_per_type():
    """A LaunchPlan's parameters: pointers from the pool, constants as the bits the kernel reads
    (float32, two's complement), constexprs left out, Triton's two scratch pointers last."""
    x = torch.empty(4)
    spec = (0xF00, 128, 0, 1, True, False, ("*fp32", "fp32", "i64", "i32", "i1", "constexpr"))
    sources, bits = _call_cache._native_params(spec, (x, 1.5, -1, 7, True, 64), [3, 9, 10, 11, 12, 13])
    assert sources == [3, -1, -1, -1, -1, -1, -1]
    assert bits == [0, 0x3FC00000, 0xFFFFFFFFFFFFFFFF, 7, 1, 0, 0]
    assert _call_cache._native_params(spec, (x, 1.5, -1, 7, True), [3, 9, 10, 11, 12]) is None  # too few
    assert _call_cache._native_params(spec, (1, 1.5, -1, 7, True, 64), [3, 9, 10, 11, 12, 13]) is None  # no tensor
    assert _call_cache._native_params(spec, (x, 1e39, -1, 7, True, 64), [3, 9, 10, 11, 12, 13]) is None
    assert _call_cache._native_params(None, (x,), [3]) is None


@pytest.mark.skipif(HAS_CUDA, reason="the toy kernel's function handle must not reach a driver")
def test_native_plan_without_a_driver_falls_back_to_the_launchers(toy, monkeypatch):
    kernel, plain, launches = toy
    spec = (0xF00, 128, 0, 1, True, False, ("*fp32", "i32", "*fp32", "constexpr", "constexpr"))
    monkeypatch.setattr(_launch, "_native_spec", lambda compiled, launcher, nparams: spec)
    body, bodies = _toy_body(kernel)
    cache = _call_cache.Cache()
    cache.call(body, (torch.empty(64), 100), b"sig")
    (record,) = cache._records.values()
    assert record._plan is not None and len(record._plan) == 2
    launches.clear()
    x2 = torch.empty(64)
    out = cache.call(body, (x2, 100), b"sig")
    assert len(bodies) == 1 and len(launches) == 2  # no libcuda here: Triton's launchers ran
    assert launches[0][9] == x2.data_ptr() and launches[1][11] == out.data_ptr()


@pytest.mark.parametrize("case", ["other value", "other signature", "misaligned pointer", "other state"])
def test_call_with_other_metadata_is_recorded_again(toy, monkeypatch, case):
    kernel, plain, launches = toy
    body, bodies = _toy_body(kernel)
    holder = [object()]
    monkeypatch.setattr(_call_cache, "_STATE", [lambda: holder[0]])
    from torch_sampling_ops._C import arg_signature
    cache = _call_cache.Cache()
    x = torch.empty(64)
    cache.call(body, (x, 100), arg_signature((x, 100)))
    args, sig = (x, 100), arg_signature((x, 100))
    if case == "other value":  # scalars' values are in the argument signature
        args = (x, 101)
        sig = arg_signature(args)
    elif case == "other signature":
        sig = b"other"
    elif case == "misaligned pointer":  # the signature is the same: the launch key tells
        x2 = torch.empty(65)
        args = (x2[1:], 100)
        assert arg_signature(args) == sig
    else:
        holder[0] = object()
    cache.call(body, args, sig)
    assert len(bodies) == 2
    cache.call(body, args, sig)
    assert len(bodies) == 2


@pytest.mark.parametrize("case", ["view", "fill", "plain launch", "unknown tensor", "returns an argument"])
def test_calls_that_cannot_be_replayed_run_the_body(toy, case):
    kernel, plain, launches = toy
    stray = torch.empty(8)
    if case == "view":
        body, bodies = _toy_body(kernel, lambda x: x[:4])
    elif case == "fill":
        body, bodies = _toy_body(kernel, lambda x: x.fill_(1.0))
    else:
        bodies = []

        def body(x, n):
            bodies.append(n)
            if case == "plain launch":
                _launch.launch(kernel, lambda meta: (1,), (x, n, x), {"BLOCK": 128})
            elif case == "unknown tensor":
                _launch.launch(kernel, (1,), (x, n, stray), {"BLOCK": 128})
            else:
                _launch.launch(kernel, (1,), (x, n, x), {"BLOCK": 128})
                return x
    cache = _call_cache.Cache()
    x = torch.empty(64)
    for _ in range(3):
        cache.call(body, (x, 100), b"sig")
    assert len(bodies) == 3 and len(cache) == 0


def test_a_call_made_while_another_is_recorded_runs_its_body(toy):
    """Only one call is recorded at a time (the recorder is global): a call made meanwhile, from
    another thread or from inside the recorded body, runs its body and is not recorded."""
    kernel, plain, launches = toy
    inner_body, inner_bodies = _toy_body(kernel)
    inner = _call_cache.Cache()
    outer_bodies = []

    def outer_body(x, n):
        outer_bodies.append(n)
        thread = threading.Thread(target=lambda: inner.call(inner_body, (x, n), b"inner"))
        thread.start()
        thread.join()
        _launch.launch(kernel, (1,), (x, n, x), {"BLOCK": 128})

    outer = _call_cache.Cache()
    x = torch.empty(64)
    outer.call(outer_body, (x, 100), b"outer")
    assert len(inner_bodies) == 1 and len(inner) == 0
    inner.call(inner_body, (x, 100), b"inner")  # now recorded
    inner.call(inner_body, (x, 100), b"inner")
    assert len(inner_bodies) == 2 and len(inner) == 1


def test_recording_a_call_imports_no_compiler():
    """The first recorded call of a process pays no import of torch._dynamo (seconds): the spy's
    dispatch mode is not wrapped in torch._disable_dynamo. Run in a fresh interpreter."""
    code = ("import sys, torch, torch_sampling_ops\n"
            "from torch_sampling_ops import _call_cache\n"
            "x = torch.empty(8)\n"
            "with _call_cache._Spy() as spy:\n"
            "    x.new_empty((2,), dtype=torch.int64)\n"
            "assert len(spy.allocations) == 1\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
