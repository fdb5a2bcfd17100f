"""The registration helper: every op gets its CPU, CUDA and fake kernels, the functional rule that
lets Inductor see the Triton kernels, and a Triton body callable under the interpreter."""
import pytest
import torch
from conftest import HAS_CUDA

import torch_sampling_ops
from torch_sampling_ops import _registry

OPS = sorted(_registry._TRITON_IMPLS)


def test_every_public_op_is_registered():
    assert {"logit_bias", "apply_token_bitmask"} <= set(OPS)
    for name in OPS:
        assert hasattr(torch.ops.sampling, name)
        assert callable(getattr(torch_sampling_ops, name)), f"no Python wrapper for {name}"
        assert getattr(torch_sampling_ops, name).__doc__, f"the wrapper of {name} has no docstring"


@pytest.mark.parametrize("name", OPS)
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


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_inductor_sees_the_triton_kernels():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    V = 1000

    def step(logits, bitmask):
        logits = logits * 2.0
        torch.ops.sampling.apply_token_bitmask(logits, bitmask)
        return logits

    logits = torch.randn(4, V, device="cuda")
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, (V + 31) // 32), dtype=torch.int32, device="cuda")
    out, code = run_and_get_code(torch.compile(step, fullgraph=True), logits, bitmask)
    assert "_token_bitmask_kernel" in "\n".join(code), "Inductor did not inline the Triton kernel"
    expected = torch_sampling_ops.reference.apply_token_bitmask((logits * 2).cpu(), bitmask.cpu())
    torch.testing.assert_close(out.cpu().double(), expected)
