"""Every op through the dispatcher: torch.library.opcheck, and torch.compile(fullgraph=True) with
aot_eager and inductor, against the reference. Each op family's test module supplies the inputs."""
import pytest
import test_constraints
import test_filtering
import test_penalties
import test_truncation
import torch
from conftest import OP_BACKENDS, device_of

from torch_sampling_ops import reference

EXAMPLES = {
    "logit_bias": lambda device, gen: test_constraints.example_args("logit_bias", device, gen),
    "apply_token_bitmask": lambda device, gen: test_constraints.example_args("apply_token_bitmask", device, gen),
    "temperature": lambda device, gen: test_filtering.example_args("temperature", device, gen),
    "min_p": lambda device, gen: test_filtering.example_args("min_p", device, gen),
    "top_k_top_p": lambda device, gen: test_truncation.example_args(device, gen),
}


def test_every_op_has_an_example():
    from torch_sampling_ops._registry import _TRITON_IMPLS

    # The penalties family has its own opcheck and compile tests (update_output_counts mutates state, not logits).
    assert set(EXAMPLES) | set(test_penalties.OPS) == set(_TRITON_IMPLS)


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("op", sorted(EXAMPLES))
def test_opcheck(backend, op, gen):
    torch.library.opcheck(getattr(torch.ops.sampling, op).default, EXAMPLES[op](device_of(backend), gen))


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("op", sorted(EXAMPLES))
def test_compile_fullgraph(backend, compile_backend, op, gen):
    torch._dynamo.reset()
    fn = getattr(torch.ops.sampling, op)

    def step(logits, *state):
        logits = logits / 0.7  # a fresh tensor for the op to process in place, as a decode step would
        fn(logits, *state)
        return logits

    args = EXAMPLES[op](device_of(backend), gen)
    expected = getattr(reference, op)((args[0] / 0.7).cpu(), *[a.cpu() for a in args[1:]])
    compiled = torch.compile(step, backend=compile_backend, fullgraph=True)
    torch.testing.assert_close(compiled(*args).cpu().double(), expected, atol=1e-5, rtol=1e-5)
