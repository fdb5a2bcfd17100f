"""What every op owes, driven by the op table (op_table.py): registration, argument validation on
every implementation, debug-mode value checks, autograd and version-counter behaviour, opcheck,
torch.compile(fullgraph=True) and CUDA-graph capture and replay."""
import inspect
import os
import subprocess
import sys

import pytest
import torch
from op_table import BY_NAME, OPS, bad_inputs, clone_args, to_cpu
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_sampling_ops
from torch_sampling_ops import _call_cache, _launch, _registry

from conftest import OP_BACKENDS, device_of

OP_NAMES = [spec.name for spec in OPS]
BAD = [pytest.param(spec.name, bad, id=f"{spec.name}-{bad.arg}-{bad.what}") for spec in OPS for bad in bad_inputs(spec)]
BAD_VALUES = [pytest.param(spec.name, bad, id=f"{spec.name}-{bad.arg}-{bad.what}")
              for spec in OPS for bad in spec.bad_values]


# ----------------------------------------------------------------------------------------------
# Registration


def test_the_table_has_every_op():
    assert set(OP_NAMES) == set(_registry._TRITON_IMPLS)


@pytest.mark.parametrize("name", OP_NAMES)
def test_public_function_has_the_op_signature(name):
    public = getattr(torch_sampling_ops, name)
    assert public.__doc__, f"the public function of {name} has no docstring"
    schema = BY_NAME[name].op._schema
    assert list(inspect.signature(public).parameters) == [a.name for a in schema.arguments]


@pytest.mark.parametrize("name", OP_NAMES)
@pytest.mark.parametrize("key", ["CPU", "CUDA", "Meta"])
def test_op_has_a_kernel_for(name, key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"sampling::{name}", key)


def test_launch_wraps_kernels_only_while_tracing(monkeypatch):
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **meta: calls.append(("raw", grid, args, meta))

    def fake_wrap_triton(kernel):
        class Wrapped:
            def __getitem__(self, grid):
                return lambda *args, **meta: calls.append(("wrapped", grid, args, meta))
        return Wrapped()

    monkeypatch.setattr(_registry, "wrap_triton", fake_wrap_triton)
    _registry.launch(Kernel(), (2,), 1, BLOCK=4)
    with _registry._tracing_triton():
        _registry.launch(Kernel(), (3,), 5, BLOCK=8)
    _registry.launch(Kernel(), (1,), 0)
    assert [c[0] for c in calls] == ["raw", "wrapped", "raw"]
    assert calls[1][1:] == ((3,), (5,), {"BLOCK": 8})


# ----------------------------------------------------------------------------------------------
# Validation


def call_with_bad_input(spec, bad, args, device):
    i = [a.name for a in spec.op._schema.arguments].index(bad.arg)
    call = list(args)
    call[i] = bad.make(args[i], device)
    return call


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("name, bad", BAD)
def test_bad_input_raises_before_anything_runs(backend, name, bad, gen):
    """A TypeError/ValueError (RuntimeError for requires grad) naming the argument, raised before any
    kernel runs; every tensor is left as it was."""
    spec = BY_NAME[name]
    device = device_of(backend)
    args = spec.args(device, gen)
    before = clone_args(args)
    with pytest.raises(bad.error, match=f"'{bad.arg}'"):
        spec.op(*call_with_bad_input(spec, bad, args, device))
    for a, b in zip(args, before):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, "a rejected call modified an argument"


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("name, bad", BAD)
def test_bad_input_raises_after_valid_calls(backend, name, bad, gen):
    """The checks a valid call passed are skipped for calls with the same argument metadata
    (`_registry`): a bad input after valid calls is still rejected, and the valid call still runs."""
    spec = BY_NAME[name]
    device = device_of(backend)
    args = spec.args(device, gen)
    for _ in range(2):
        spec.op(*clone_args(args))
    with pytest.raises(bad.error, match=f"'{bad.arg}'"):
        spec.op(*call_with_bad_input(spec, bad, clone_args(args), device))
    spec.op(*clone_args(args))


def test_cpu_kernels_run_the_checks_once_per_signature(gen, debug_checks):
    """The C++ CPU kernels run the Python checks for metadata they have not seen pass, and on every
    call with debug checks on; a failed check is not remembered."""
    _C = pytest.importorskip("torch_sampling_ops._C")
    spec = BY_NAME["temperature"]
    seen = []

    def counting(*args):
        seen.append(tuple(a.shape for a in args))
        if args[0].shape[1] == 999:
            raise ValueError("sampling.temperature: test rejection")

    mutated = [0]
    _C.register_cpu_checks("temperature", counting, mutated)
    try:
        args = spec.args(torch.device("cpu"), gen)
        for _ in range(3):
            spec.op(*clone_args(args))
        assert len(seen) == 1
        wider = [torch.randn(args[0].shape[0], 999), *args[1:]]
        for _ in range(2):
            with pytest.raises(ValueError, match="test rejection"):
                spec.op(*wider)
        assert len(seen) == 3
        debug_checks(True)
        spec.op(*clone_args(args))
        spec.op(*clone_args(args))
        assert len(seen) == 5
    finally:
        _registry_checks = _registry._cpu_checks["temperature"]
        _C.register_cpu_checks("temperature", _registry_checks, mutated)


def test_arg_signature_tells_apart_what_the_checks_read():
    """The key holds each tensor's dtype, device, sizes, strides and (under grad mode) requires_grad,
    and the other arguments' values; there is none for a tensor subclass or another type."""
    sig = _registry._arg_signature
    if sig is _registry._no_signature:
        pytest.skip("the C++ extension is not built")
    x = torch.zeros(4, 6)
    same = [sig((x, 1, None, 0.5, True)), sig((torch.ones(4, 6), 1, None, 0.5, True))]
    assert same[0] == same[1] and isinstance(same[0], bytes)
    others = [(x.double(), 1, None, 0.5, True), (x[:, :5], 1, None, 0.5, True), (x.t(), 1, None, 0.5, True),
              (torch.zeros(4, 5), 1, None, 0.5, True), (x, 2, None, 0.5, True), (x, 1, x, 0.5, True),
              (x, 1, None, 0.25, True), (x, 1, None, 0.5, False), (x.requires_grad_(True), 1, None, 0.5, True)]
    keys = {sig(a) for a in others}
    assert len(keys) == len(others) and same[0] not in keys
    with torch.no_grad():  # requires_grad counts only under grad mode, as the checks do
        assert sig((x, 1, None, 0.5, True)) == same[0]
    x.requires_grad_(False)
    class Subclass(torch.Tensor):
        pass

    assert sig((x.as_subclass(Subclass),)) is None and sig(([1],)) is None and sig((2**70,)) is None
    assert sig((x.to_sparse(),)) is None


@pytest.mark.parametrize("name, bad", [p for p in BAD if p.values[1].what != "device"])
def test_bad_input_raises_on_fake_tensors(name, bad, gen):
    """The fake implementation (torch.compile, export) rejects the same inputs with the same error."""
    spec = BY_NAME[name]
    device = torch.device("cpu")
    call = call_with_bad_input(spec, bad, spec.args(device, gen), device)
    with FakeTensorMode() as mode:
        call = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in call]
        with pytest.raises(bad.error, match=f"'{bad.arg}'"):
            spec.op(*call)


@pytest.mark.parametrize("name", OP_NAMES)
def test_fake_tensors_trace_valid_calls(name, gen):
    spec = BY_NAME[name]
    args = spec.args(torch.device("cpu"), gen)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = spec.op(*fake)
    if not spec.returns:
        assert out is None
        return
    real = spec.op(*args)  # the fake outputs have the real ones' shapes and dtypes
    flat = lambda x: list(x) if isinstance(x, tuple) else [x]  # noqa: E731
    assert [(o.shape, o.dtype) for o in flat(out)] == [(r.shape, r.dtype) for r in flat(real)]


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("name, bad", BAD_VALUES)
def test_debug_mode_checks_values(backend, name, bad, gen, debug_checks):
    """With TORCH_SAMPLING_OPS_DEBUG=1 a bad value raises a ValueError naming its argument; without, it
    runs (with the documented result) and costs no sync."""
    spec = BY_NAME[name]
    args = spec.args(device_of(backend), gen)
    debug_checks(True)
    spec.op(*clone_args(args))  # valid values pass
    bad_args = clone_args(args)
    bad.spoil(bad_args)
    with pytest.raises(ValueError, match=f"'{bad.arg}'"):
        spec.op(*bad_args)
    debug_checks(False)
    spec.op(*bad_args)


def test_debug_checks_follow_the_environment_at_import_and_set_debug_checks():
    code = ("import torch_sampling_ops as t, torch_sampling_ops._checks as c; a = c.debug_enabled(); "
            "t.set_debug_checks(not a); print(a, c.debug_enabled())")
    for value, expected in (("1", "True False"), ("0", "False True")):
        env = dict(os.environ, TORCH_SAMPLING_OPS_DEBUG=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == expected.split()


# ----------------------------------------------------------------------------------------------
# Autograd and version counters


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("name", OP_NAMES)
def test_in_place_write_bumps_the_version_counter(backend, name, gen):
    spec = BY_NAME[name]
    args = spec.args(device_of(backend), gen)
    version = args[0]._version
    spec.op(*args)
    if spec.returns:  # writes nothing: the logits keep their version
        assert args[0]._version == version
    else:
        assert args[0]._version > version


@pytest.mark.parametrize("name", OP_NAMES)
def test_inference_tensors(name, gen):
    """Under torch.inference_mode (as servers run): tensors made there have no version counter."""
    spec = BY_NAME[name]
    args = spec.args(torch.device("cpu"), gen)
    expected = spec.run(clone_args(args))
    with torch.inference_mode():
        inference = spec.run(clone_args(args))
    torch.testing.assert_close(inference, expected, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("name", OP_NAMES)
def test_inputs_that_require_grad_run_under_no_grad(name, gen):
    """The ops are not differentiable: under grad mode an input that requires grad raises (a bad
    input of the table); under torch.no_grad() it is an ordinary in-place write."""
    spec = BY_NAME[name]
    args = spec.args(torch.device("cpu"), gen)
    if not args[0].is_floating_point():
        pytest.skip("an integer tensor cannot require grad")
    logits = args[0].detach().clone().requires_grad_()
    with torch.no_grad():
        out = spec.run([logits, *args[1:]])
    expected = spec.run(args)
    if not spec.returns:
        out = out.detach()
    torch.testing.assert_close(out, expected, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_with_inputs_that_require_grad_meets_the_error(name, gen):
    """opcheck with an input that requires grad: each of its tests calls the op under grad mode, which
    raises the not-differentiable error by design (a silent wrong gradient otherwise)."""
    spec = BY_NAME[name]
    args = spec.args(torch.device("cpu"), gen)
    if not args[0].is_floating_point():
        pytest.skip("an integer tensor cannot require grad")
    args[0] = args[0].detach().clone().requires_grad_()
    with pytest.raises(Exception, match="not differentiable"):
        torch.library.opcheck(spec.op, args, test_utils="test_autograd_registration")


# ----------------------------------------------------------------------------------------------
# Through the dispatcher: opcheck, torch.compile, CUDA graphs


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck(backend, name, gen):
    spec = BY_NAME[name]
    torch.library.opcheck(spec.op, spec.args(device_of(backend), gen))


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", OP_NAMES)
def test_compile_fullgraph(backend, compile_backend, name, gen, monkeypatch):
    """No graph break, the eager result; on CUDA, Inductor emits the op's Triton kernels in its own
    code instead of calling the op."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    spec = BY_NAME[name]
    traced_kernels, wrap_triton = [], _registry.wrap_triton

    def spy(kernel):  # the kernels the op's launcher hands to torch.compile
        traced_kernels.append(kernel.fn.__name__)
        return wrap_triton(kernel)

    monkeypatch.setattr(_registry, "wrap_triton", spy)
    # A graph found in Inductor's or AOTAutograd's on-disk cache (an earlier process's) is not traced
    # again, and the spy would see no kernel.
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)

    def step(first, *state):
        first = spec.fresh(first)  # a fresh tensor for the op to process in place, as a decode step would
        return spec.run([first, *state])

    args = spec.args(device_of(backend), gen)
    eager = step(*args)
    out, code = run_and_get_code(torch.compile(step, backend=compile_backend, fullgraph=True), *args)
    if backend == "cuda" and compile_backend == "inductor":
        code = "\n".join(code)
        assert traced_kernels and all(k in code for k in traced_kernels), "Inductor did not inline the kernels"
        assert "torch.ops.sampling" not in code, "Inductor calls the op"
    torch.testing.assert_close(out, eager, atol=0, rtol=0, equal_nan=True)
    spec.assert_matches(to_cpu(out), spec.fresh(args[0]).cpu(), to_cpu(args[1:]))


def at_storage_offset(t: torch.Tensor, offset: int = 16) -> torch.Tensor:
    """A copy of t in a storage that begins `offset` elements before it (t's sizes and strides)."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    base = torch.empty(offset + span, dtype=t.dtype, device=t.device)
    view = base.as_strided(t.shape, t.stride(), offset)
    return view.copy_(t)


@pytest.mark.cuda
@pytest.mark.parametrize("name", OP_NAMES)
def test_compile_with_every_argument_a_view_into_its_storage(name, gen):
    """Every tensor argument a view at a nonzero storage offset (a slice of a state buffer, a row
    range of the logits), the logits a graph input written in place: Inductor's result and the
    arguments after the call are eager's, bit for bit."""
    torch._dynamo.reset()
    spec = BY_NAME[name]
    def offset_views(args):
        return [at_storage_offset(a) if isinstance(a, torch.Tensor) else a for a in args]

    args = offset_views(spec.args(torch.device("cuda"), gen))
    eager_args, compiled_args = clone_args(args), offset_views(args)
    eager = spec.run(eager_args)
    compiled = torch.compile(lambda *a: spec.run(list(a)), backend="inductor", fullgraph=True)(*compiled_args)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0, equal_nan=True)
    for i, (a, b) in enumerate(zip(compiled_args, eager_args)):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, atol=0, rtol=0, equal_nan=True, msg=f"argument {i}")


class _GraphStep:
    """One call of an op on static arguments, its logits first restored from `src`: what a graph
    captures."""

    def __init__(self, spec, gen):
        self.spec, self.gen = spec, gen
        args = spec.args(torch.device("cuda"), gen)
        self.logits, self.state = args[0], args[1:]
        self.src = self.logits.clone()

    def __call__(self):
        self.logits.copy_(self.src)
        return self.spec.run([self.logits, *self.state])

    def refresh(self) -> None:
        """New values in the logits and every other tensor argument."""
        fresh = self.spec.args(torch.device("cuda"), self.gen)
        self.src.copy_(fresh[0])
        for static, new in zip(self.state, fresh[1:]):
            if isinstance(static, torch.Tensor):  # Python scalars are frozen at capture
                static.copy_(new)

    def assert_matches(self, result) -> None:
        self.spec.assert_matches(to_cpu(result), self.src.cpu(), to_cpu(self.state))


@pytest.mark.cuda
@pytest.mark.parametrize("name", OP_NAMES)
def test_cuda_graph_replays_with_changed_arguments(name, gen):
    """Captured once, replayed with new logits and new values of every other argument."""
    step = _GraphStep(BY_NAME[name], gen)
    step()  # compile the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    for _ in range(3):
        step.refresh()
        graph.replay()
        step.assert_matches(result)


@pytest.mark.cuda
@pytest.mark.parametrize("name", OP_NAMES)
def test_graph_replays_and_eager_calls_on_two_streams(name, gen):
    """A graph captured after eager calls of the same metadata (replayed from their record, with the
    stream's cached workspace), replayed on a side stream while eager calls run on the main one,
    nothing ordering the two: each result is the reference's."""
    spec = BY_NAME[name]
    step = _GraphStep(spec, gen)
    step()  # recorded
    step()  # replayed
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        result = step()
    for _ in range(3):
        step.refresh()
        eager_args = [spec.args(torch.device("cuda"), gen) for _ in range(4)]
        originals = [a[0].cpu() for a in eager_args]
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            graph.replay()
        eager = [spec.run(a) for a in eager_args]
        torch.cuda.synchronize()
        step.assert_matches(result)
        for out, a, original in zip(eager, eager_args, originals):
            spec.assert_matches(to_cpu(out), original, to_cpu(a[1:]))


@pytest.mark.cuda
@pytest.mark.parametrize("name", OP_NAMES)
def test_a_call_never_waits_for_the_device(name, gen):
    """No op synchronises the host with the GPU (no `.item()`, no data-dependent shape, no blocking
    copy): CUDA's sync debug mode raises on any, from the second call on (the first compiles)."""
    spec = BY_NAME[name]
    args = spec.args(torch.device("cuda"), gen)
    spec.run(clone_args(args))
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        spec.run(clone_args(args))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()


def _same_bits(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same_bits(x, y) for x, y in zip(a, b))
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


@pytest.mark.cuda
@pytest.mark.parametrize("name", OP_NAMES)
def test_repeated_calls_replay_and_match_the_launcher(name, gen, monkeypatch):
    """A call whose metadata repeats an earlier one's is replayed from that call's record (no
    launcher runs) and gives, on new logits, the launcher's result bit for bit."""
    spec = BY_NAME[name]
    device = torch.device("cuda")
    recorded = spec.args(device, gen)
    spec.run(clone_args(recorded))
    real_launch, launched = _launch.launch, []
    for _ in range(2):
        args = clone_args(recorded)
        args[0].copy_(torch.randn(args[0].shape, generator=gen) * 3)
        by_launcher = clone_args(args)
        monkeypatch.setattr(_launch, "launch", lambda *a: (launched.append(a), real_launch(*a))[1])
        replayed = spec.run(args)
        monkeypatch.setattr(_launch, "launch", real_launch)
        assert not launched, f"{name}: the call was not replayed"
        monkeypatch.setattr(_launch, "_ENABLED", False)
        expected = spec.run(by_launcher)
        monkeypatch.setattr(_launch, "_ENABLED", _launch._fast_path_supported())
        assert _same_bits(replayed, expected)
        assert _same_bits(args[0], by_launcher[0])
    if _launch._triton_version() in _launch._NATIVE_TRITON and _call_cache._NATIVE_ENABLED:
        records = [r for cache in _call_cache._CACHES for r in cache._records.values() if r is not None]
        assert records and all(r._plan is not None for r in records), f"{name}: not replayed by a LaunchPlan"


def test_inductor_calls_the_op_on_cpu(gen):
    """On the CPU the op stays one opaque node: Inductor's code calls it."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    spec = BY_NAME["temperature"]

    def step(logits, *state):
        logits = logits * 2.0
        spec.op(logits, *state)
        return logits

    _, code = run_and_get_code(torch.compile(step, fullgraph=True), *spec.args(torch.device("cpu"), gen))
    assert "torch.ops.sampling.temperature" in "\n".join(code)
