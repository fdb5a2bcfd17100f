"""Benchmark of `Sampler.step`, a whole decode step through the ops, against the same step composed
of PyTorch ops, eagerly and in a CUDA graph.

    python benchmarks/bench_sampler.py [--out FILE] [--cpu-only]     # BENCH_T=1,32,256 picks the sizes

T requests, each in its own slot, of four kinds in turn, each with a 1024-token prompt:
- greedy with a repetition penalty (1.1);
- temperature 0.8, top-k 50, top-p 0.9, frequency and presence penalties (0.2, 0.1);
- top-p 0.9 with 16 biased tokens, 4 bad-word sequences and min-tokens 4 with 2 stop ids;
- temperature 1.0 restricted to 1024 allowed tokens (a structured-output list).
Cases: no logprobs, and 20 logprobs a row. The step mutates the logits, so each timed call first
copies fresh logits (the copy's time is subtracted); the sampler's output lengths advance with every
call, as in a decode loop (its history is recorded up to max_model_len = 4096).

The composed-PyTorch step: the logit bias, sample and logprobs baselines of baselines.py, bad_words
and penalties as reference.py's dense float32 forms (as bench_history), and the tokens recorded with
`index_put_` (counts, output-mask words, history) and an add (output lengths).
"""
from __future__ import annotations

import baselines
import torch

import torch_sampling_ops as tso
from torch_sampling_ops import reference

from timing import Case, main

KINDS = (
    dict(temperature=0.0, repetition_penalty=1.1),
    dict(temperature=0.8, top_k=50, top_p=0.9, frequency_penalty=0.2, presence_penalty=0.1),
    dict(top_p=0.9, min_tokens=4),
    dict(temperature=1.0),
)


def make_sampler(T: int, V: int, device, seed: int, num_logprobs: int | None) -> tso.Sampler:
    """A sampler of T slots holding the four kinds of requests in turn."""
    g = torch.Generator().manual_seed(seed)
    sampler = tso.Sampler(T, V, device, max_num_logprobs=num_logprobs, seed=seed)

    def ids(n):
        return torch.randperm(V, generator=g)[:n].tolist()

    for slot in range(T):
        kind = dict(KINDS[slot % len(KINDS)], seed=seed * 1000 + slot, logprobs=num_logprobs)
        if slot % 4 == 2:
            kind.update(logit_bias=dict.fromkeys(ids(16), 2.0), stop_token_ids=ids(2),
                        bad_words=[ids(n) for n in (1, 2, 3, 4)])
        if slot % 4 == 3:
            kind.update(allowed_token_ids=ids(1024))
        sampler.add_request(slot, tso.SamplingParams(**kind), torch.randint(0, V, (1024,), generator=g))
    return sampler


def step_inputs(num_logprobs):
    def make(T, V, device, seed):
        logits = torch.randn(T, V, generator=torch.Generator().manual_seed(seed)).mul_(3).to(device)
        idx_mapping = torch.arange(T, dtype=torch.int32, device=device)
        # Separate samplers for ours and for the composed step: each records its own tokens.
        return [logits, idx_mapping, make_sampler(T, V, device, seed, num_logprobs),
                make_sampler(T, V, device, seed, num_logprobs)]
    return make


def ours(logits, idx_mapping, sampler, _):
    return sampler.step(logits, idx_mapping)


def composed_step(logits, idx_mapping, _, s):
    """The step of `s`'s requests in PyTorch ops, recording into `s`'s state."""
    f32 = torch.float32
    slots = idx_mapping.long()
    output_lens = s.output_lens[slots]
    raw = logits.clone() if s.max_num_logprobs is not None else None
    baselines.logit_bias(logits, idx_mapping, output_lens, s.allowed_ids, s.num_allowed, s.bias_ids, s.bias_values,
                         s.num_bias, s.stop_ids, s.num_stop, s.min_tokens)
    x = reference.bad_words(logits, idx_mapping, s.bad_word_ids, s.bad_word_offsets, s.num_bad_words, s.history,
                            output_lens.clamp(max=s.max_model_len), compute_dtype=f32)
    x = reference.penalties(x, idx_mapping, s.prompt_mask, s.output_mask, s.output_counts, s.repetition_penalty,
                            s.frequency_penalty, s.presence_penalty, compute_dtype=f32)
    tokens = baselines.sample(x, idx_mapping, s.temperature, s.top_k, s.top_p, s.min_p, s.seeds, output_lens)
    out = baselines.logprobs(raw, tokens, s.max_num_logprobs) if raw is not None else None
    s.output_counts.index_put_((slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
    words = s.output_mask[slots, tokens // 32] | torch.bitwise_left_shift(1, tokens % 32).to(torch.int32)
    s.output_mask.index_put_((slots, tokens // 32), words)
    s.history.index_put_((slots, output_lens.long().clamp(max=s.max_model_len - 1)), tokens.to(torch.int32))
    s.output_lens.add_(1)
    return tokens, out


CASES = [
    Case("Sampler.step (four kinds of requests)", step_inputs(None), ours, composed_step, fresh_logits=True),
    Case("Sampler.step (four kinds, 20 logprobs)", step_inputs(20), ours, composed_step, fresh_logits=True),
]


if __name__ == "__main__":
    main(CASES, __doc__, sizes="1,32,256")
