"""Benchmark of rejection_sample (speculative decoding's verification step) against a composed-PyTorch
version (benchmarks/baselines.py: softmax of every target row, the acceptance test and a residual draw
at every draft position, a cumulative product for the first rejection).

    python benchmarks/bench_speculative.py            # GPU table if CUDA is present, CPU tables always
    BENCH_T=64,256 python benchmarks/bench_speculative.py

Inputs: B requests x 3 drafts, fp32 target logits randn * 3 with V = 151936 (CPU: 32 requests, V =
32000). Each draft is its row's argmax, with its target probability p(x) set to 0.7 (its logit raised);
the draft probabilities put 0.999 on the draft token and 0.001 spread as p, so a random request
accepts each draft with probability about 0.7 (0.7 / 0.9997). Also: all accepted (q = p), all
rejected (the draft's target logit -inf), without draft probabilities (a proposal of probability 1:
accepted with probability p(x) = 0.7), and greedy requests with 70% of the drafts equal to the argmax.
The "all rows" floor is one read of every target row (and every draft row when given): what a kernel
that reads everything pays; ours reads a row only once its request reaches it. On a GPU, also each
launch's device time (the levels one by one) at B = 32 and 256, with dependent launches and alone.
"""
from __future__ import annotations

import functools
import math

import baselines
import torch

import torch_sampling_ops as tso
from torch_sampling_ops.truncation.settings import use_settings

from timing import Case, launch_table, main, print_table, split_name, time_case

SPEC = 3  # drafts a request


def spec_inputs(B, V, device, seed, *, mode="accept", with_probs=True, greedy=False):
    """[target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds, output_lens, 3]."""
    g = torch.Generator().manual_seed(seed)
    N = B * SPEC
    logits = torch.randn(N + B, V, generator=g) * 3
    cu = torch.arange(B + 1, dtype=torch.int32) * SPEC
    rows = torch.arange(N) + torch.arange(N) // SPEC  # the target row of each draft
    drafts = logits[rows].argmax(dim=1)
    # p(draft) = 0.7: its logit = logsumexp of the others + log(0.7 / 0.3)
    others = logits[rows].scatter(1, drafts.unsqueeze(1), float("-inf")).logsumexp(dim=1)
    logits[rows, drafts] = others + math.log(0.7 / 0.3)
    p = logits[rows].softmax(dim=1)
    if mode == "all_accepted":
        q = p
    else:
        q = p * 0.001
        q[torch.arange(N), drafts] += 0.999
    if mode == "all_rejected":
        logits[rows, drafts] = float("-inf")
    if greedy:
        wrong = torch.rand(N, generator=g) >= 0.7
        drafts[wrong] = (drafts[wrong] + 1) % V
    temperature = torch.full((B,), 0.0 if greedy else 1.0)
    args = [logits, drafts, q if with_probs else None, cu, temperature, torch.randint(0, 2**62, (B,), generator=g),
            torch.randint(0, 4096, (B,), generator=g)]
    return [None if a is None else a.to(device) for a in args] + [SPEC]


def _case(name, **kw):
    return Case(f"rejection_sample ({name})", lambda B, V, dev, s: spec_inputs(B, V, dev, s, **kw),
                tso.rejection_sample, baselines.rejection_sample)


CASES = [
    _case("probs, accept 0.7"),
    _case("probs, all accepted", mode="all_accepted"),
    _case("probs, all rejected", mode="all_rejected"),
    _case("no probs, accept 0.7", with_probs=False),
    _case("greedy, match 0.7", with_probs=False, greedy=True),
]


def spec_table(case: Case, V: int, bandwidth_gbps: float, Ts) -> str:
    """GPU table: B requests x 3 drafts, eager and CUDA-graph timings against the PyTorch baseline."""
    rows = []
    for B in Ts:
        inputs, eager, graph, base = time_case(case, B, V)
        nbytes = inputs[0].numel() * 4 + (inputs[2].numel() * 4 if inputs[2] is not None else 0)
        floor = nbytes / (bandwidth_gbps * 1e9) * 1e6
        rows.append([B, eager, graph, base, base / graph, floor, graph / floor])
    return print_table(f"{case.name}, {SPEC} drafts a request, V = {V}, {torch.cuda.get_device_name()}, µs (median)",
                       ["B", "ours eager", "ours graph", "PyTorch", "speed-up (graph)", "all rows floor",
                        "ours / floor"], rows)


def launch_breakdown(V=151936, Bs=(32, 256), device="cuda") -> str:
    """Device µs of each of rejection_sample's launches (torch.profiler): levels 0 to 3 (`#1` to `#4`:
    position j's softmax or argmax pass, the residual of a position rejected at the level before,
    the bonus row's draw) and the final launch (`#5`), per case and batch size, with programmatic
    dependent launches (a launch's time then includes its wait for the one before) and alone. The
    first input set: a level whose chunk falls back to scoring every token exactly shows it here."""
    runs = [(B, [split_name(case.name)[1], how], functools.partial(case.make, B, V, device, 0),
             functools.partial(use_settings, dependent_launches=how == "dependent"))
            for B in Bs for case in CASES for how in ("dependent", "alone")]
    return launch_table(f"rejection_sample launches, {SPEC} drafts a request, V = {V}, device µs per call "
                        "(torch.profiler)", "rejection_sample", tso.rejection_sample, runs, V, ["case", "launches"],
                        size_name="B", restore=False)


if __name__ == "__main__":
    main(CASES, __doc__, table=spec_table, sizes="256", extra_gpu=launch_breakdown)
