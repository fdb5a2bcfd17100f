"""The composed-PyTorch baselines of the benchmarks (benchmarks/baselines.py) compute the ops'
results on valid inputs, so the speed-ups are measured against working code."""
import os
import sys

import pytest
import torch

from torch_sampling_ops import reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import baselines

T, V, R = 6, 3001, 4


def _inputs(name, gen):
    logits = torch.randn(T, V, generator=gen) * 3
    idx = torch.randint(0, R, (T,), generator=gen, dtype=torch.int32)
    if name == "temperature":
        return [logits, idx, torch.tensor([0.5, 0.0, 2.0, 1.3])]
    if name == "min_p":
        return [logits, idx, torch.tensor([0.05, 0.0, 1.0, 0.3])]
    if name == "top_k_top_p":
        return [logits, idx, torch.tensor([50, 0, V, 1], dtype=torch.int32), torch.tensor([0.9, 0.5, 1.0, 0.3])]
    if name == "apply_token_bitmask":
        bitmask = torch.randint(-2**31, 2**31 - 1, (R, (V + 31) // 32), generator=gen, dtype=torch.int64)
        return [logits, bitmask.to(torch.int32), idx]

    def ids(width):  # unique ids per slot, so duplicated ids (unspecified order) never occur
        return torch.stack([torch.randperm(V, generator=gen)[:width] for _ in range(R)]).to(torch.int32)

    counts = torch.tensor([0, 3, 17, 40], dtype=torch.int32)
    return [logits, idx, torch.randint(0, 6, (T,), generator=gen, dtype=torch.int32),
            ids(40), counts, ids(40), torch.randn(R, 40, generator=gen), counts.flip(0),
            ids(8), torch.tensor([8, 0, 3, 5], dtype=torch.int32), torch.tensor([3, 3, 0, 9], dtype=torch.int32)]


@pytest.mark.parametrize("name", sorted(baselines.BASELINES))
def test_baseline_matches_reference(name, gen):
    args = _inputs(name, gen)
    expected = getattr(reference, name)(args[0].clone(), *args[1:])
    got = args[0].clone()
    baselines.BASELINES[name](got, *args[1:])
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_sample_and_logprobs_baselines(gen):
    """The composed sampler draws inside the filtered set (greedy rows: the argmax); the composed
    logprobs match the reference."""
    logits = torch.randn(T, V, generator=gen) * 3
    idx = torch.arange(T, dtype=torch.int32) % R
    params = [torch.tensor([0.0, 1.0, 0.7, 1.2]), torch.tensor([0, 0, 50, 5], dtype=torch.int32),
              torch.tensor([1.0, 0.9, 1.0, 0.5]), torch.tensor([0.0, 0.0, 0.1, 0.0])]
    seeds, lens = torch.zeros(R, dtype=torch.int64), torch.zeros(T, dtype=torch.int64)
    tokens = baselines.sample(logits, idx, *params, seeds, lens)
    kept = reference.filtered_logits(logits, idx, *params)
    assert bool((kept.gather(1, tokens.unsqueeze(1)) > float("-inf")).all())
    assert torch.equal(tokens[idx == 0], logits[idx == 0].argmax(dim=1))
    ids = torch.randint(0, V, (T,), generator=gen)
    got, expected = baselines.logprobs(logits, ids, 5), reference.logprobs(logits, ids, 5)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[3], expected[3])
    torch.testing.assert_close(got[1].double(), expected[1], atol=1e-5, rtol=1e-5)


def test_rejection_sample_baseline(gen):
    """Greedy requests: the reference's tokens exactly; random requests: padded as the contract says,
    accepted drafts equal to the proposed ones."""
    import test_speculative

    counts = [3, 0, 2, 1, 3]
    args = test_speculative.spec_args(counts, 500, gen, torch.device("cpu"), temperature=torch.zeros(5))
    args[0] = args[0].contiguous()
    tokens, num = baselines.rejection_sample(*args)
    e_tokens, e_num = reference.rejection_sample(*args)
    assert torch.equal(tokens, e_tokens) and torch.equal(num, e_num)
    args[4] = torch.ones(5)
    tokens, num = baselines.rejection_sample(*args)
    cu = args[3]
    for i in range(5):
        k = int(num[i]) - 1  # accepted drafts
        assert tokens[i, :k].tolist() == args[1][int(cu[i]): int(cu[i]) + k].tolist()
        assert bool((tokens[i, k + 1:] == -1).all()) and 0 <= int(tokens[i, k]) < 500
