"""Bad arguments raise a TypeError/ValueError naming the argument, before any kernel runs, on every
implementation (cpu, cuda and fake), and leave every tensor untouched. With
TORCH_SAMPLING_OPS_DEBUG=1 the ops also check values."""
import pytest
import torch
from conftest import HAS_CUDA, OP_BACKENDS, device_of, make_logits
from test_constraints import logit_bias_state, random_bitmask
from torch._subclasses.fake_tensor import FakeTensorMode

V, T, R = 300, 4, 3


def valid_args(op, device, gen):
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    if op == "logit_bias":
        return [logits] + [s.to(device) for s in logit_bias_state(T, V, R, gen)]
    return [logits, random_bitmask(R, V, gen).to(device), torch.zeros(T, dtype=torch.int32, device=device) + 1]


NAMES = {
    "logit_bias": ["logits", "idx_mapping", "output_lens", "allowed_ids", "num_allowed", "bias_ids", "bias_values",
                   "num_bias", "stop_ids", "num_stop", "min_tokens"],
    "apply_token_bitmask": ["logits", "bitmask", "idx_mapping"],
}


# Arguments whose sizes define T, V or R: a wrong length there is reported on the arguments that disagree.
ANCHORS = {"logit_bias": {0, 10}, "apply_token_bitmask": {0, 1}}


def corruptions(op, args):
    """(argument index, bad value, exception type) triples, each breaking one rule."""
    out = []
    for i, a in enumerate(args):
        wrong_dtype = a.to(torch.float64) if a.is_floating_point() else a.to(torch.float32)
        out.append((i, wrong_dtype, TypeError))
        out.append((i, a.unsqueeze(0), ValueError))  # wrong rank
        if i not in ANCHORS[op]:
            out.append((i, a[:1], ValueError))  # wrong length
        if a.dim() == 2 and a.size(1) > 1:
            out.append((i, a.t().contiguous().t(), ValueError))  # column stride != 1
    out.append((0, args[0][:, :0], ValueError))  # empty vocabulary
    return [(i, bad, exc) for i, bad, exc in out if not (i == 0 and bad is args[0])]


@pytest.mark.parametrize("backend", OP_BACKENDS + ["fake"])
@pytest.mark.parametrize("op", ["logit_bias", "apply_token_bitmask"])
def test_bad_arguments_raise_before_anything_runs(backend, op, gen):
    args = valid_args(op, device_of(backend), gen)
    names = NAMES[op]
    for i, bad, exc in corruptions(op, args):
        if isinstance(bad, torch.Tensor) and bad.shape == args[i].shape and bad.dtype == args[i].dtype and \
                bad.stride() == args[i].stride():
            continue  # the corruption is a no-op for this argument (e.g. a [1]-long vector of length 1)
        call = list(args)
        call[i] = bad
        before = [a.clone() for a in args]
        if backend == "fake":
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                call = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in call]
                with pytest.raises(exc, match=names[i]):
                    getattr(torch.ops.sampling, op)(*call)
            continue
        with pytest.raises(exc, match=names[i]):
            getattr(torch.ops.sampling, op)(*call)
        for a, b in zip(args, before):
            assert torch.equal(a, b), f"a rejected call modified an argument ({names[i]} corrupted)"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.cuda
@pytest.mark.parametrize("op", ["logit_bias", "apply_token_bitmask"])
def test_argument_on_another_device_raises(op, gen):
    args = valid_args(op, "cuda", gen)
    for i in range(1, len(args)):
        call = list(args)
        call[i] = args[i].cpu()
        with pytest.raises(ValueError, match=NAMES[op][i]):
            getattr(torch.ops.sampling, op)(*call)


def test_argument_on_another_device_raises_cpu(gen):
    args = valid_args("logit_bias", "cpu", gen)
    args[3] = args[3].to("meta")
    with pytest.raises(ValueError, match="allowed_ids"):
        torch.ops.sampling.logit_bias(*args)


def test_mismatched_slot_counts_raise(gen):
    args = valid_args("logit_bias", "cpu", gen)
    args[4] = torch.zeros(R + 1, dtype=torch.int32)  # num_allowed has R + 1 slots
    with pytest.raises(ValueError, match="num_allowed"):
        torch.ops.sampling.logit_bias(*args)
    args = valid_args("apply_token_bitmask", "cpu", gen)
    args[1] = args[1][:, :-1]  # too few words for V
    with pytest.raises(ValueError, match="bitmask"):
        torch.ops.sampling.apply_token_bitmask(*args)


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_debug_mode_checks_values(backend, gen, monkeypatch):
    monkeypatch.setenv("TORCH_SAMPLING_OPS_DEBUG", "1")
    args = valid_args("logit_bias", device_of(backend), gen)
    torch.ops.sampling.logit_bias(*[a.clone() for a in args])  # valid values pass
    bad = [a.clone() for a in args]
    bad[3][0, 0] = V  # a listed allowed id out of range
    bad[4][0] = bad[3].size(1)
    with pytest.raises(ValueError, match="allowed_ids"):
        torch.ops.sampling.logit_bias(*bad)
    bad = [a.clone() for a in args]
    bad[0][1, 2] = float("nan")
    with pytest.raises(ValueError, match="logits"):
        torch.ops.sampling.logit_bias(*bad)
