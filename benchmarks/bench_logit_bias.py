"""Benchmark of the constraints family (logit_bias, apply_token_bitmask) against the composed-PyTorch
baseline (benchmarks/baselines.py) and the bandwidth floor.

    python benchmarks/bench_logit_bias.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_logit_bias.py --out results.md
"""
from __future__ import annotations

import baselines
import torch

import torch_sampling_ops as tso
from torch_sampling_ops import constraints

from timing import Case, eager_overhead_us, main, print_table, record


def logit_bias_inputs(T, V, device, *, allowed=1024, bias=1024, stops=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    R = T

    def unique_ids(n):
        return torch.stack([torch.randperm(V, generator=g)[:n] for _ in range(R)]).to(torch.int32)

    state = [
        torch.arange(T, dtype=torch.int32),                      # idx_mapping
        torch.zeros(T, dtype=torch.int64),                       # output_lens
        unique_ids(allowed), torch.full((R,), allowed, dtype=torch.int32),
        unique_ids(bias), torch.randn(R, bias, generator=g), torch.full((R,), bias, dtype=torch.int32),
        unique_ids(stops), torch.full((R,), stops, dtype=torch.int32),
        torch.full((R,), 4, dtype=torch.int32),                  # min_tokens: active in every row
    ]
    logits = torch.randn(T, V, generator=g) * 3
    return [logits.to(device)] + [s.to(device) for s in state]


def bitmask_inputs(T, V, device, seed=0, allowed=None):
    """Random bits (half set), or `allowed` random tokens a row allowed (a grammar's narrow mask)."""
    g = torch.Generator().manual_seed(seed)
    words = (V + 31) // 32
    if allowed is None:
        bitmask = torch.randint(-2**31, 2**31 - 1, (T, words), generator=g, dtype=torch.int64).to(torch.int32)
    else:
        bits = torch.zeros(T, words * 32, dtype=torch.bool)
        for t in range(T):
            bits[t, torch.randperm(V, generator=g)[:allowed]] = True
        packed = (bits.view(T, words, 32).long() << torch.arange(32)).sum(-1)
        bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return [(torch.randn(T, V, generator=g) * 3).to(device), bitmask.to(device)]


CASES = [
    Case("logit_bias (1024 allowed, 1024 bias, 8 stops), fp32", lambda T, V, dev, s: logit_bias_inputs(T, V, dev, seed=s),
         tso.logit_bias, baselines.logit_bias),
    Case("logit_bias (1024 bias, 8 stops, no allowed list), fp32",
         lambda T, V, dev, s: logit_bias_inputs(T, V, dev, allowed=0, seed=s), tso.logit_bias, baselines.logit_bias),
    Case("apply_token_bitmask, fp32", lambda T, V, dev, s: bitmask_inputs(T, V, dev, seed=s), tso.apply_token_bitmask,
         baselines.apply_token_bitmask),
    Case("apply_token_bitmask (1024 allowed tokens), fp32",
         lambda T, V, dev, s: bitmask_inputs(T, V, dev, seed=s, allowed=1024), tso.apply_token_bitmask,
         baselines.apply_token_bitmask),
]


def overhead_table():
    logits, bitmask = bitmask_inputs(1, 1000, "cuda")
    kernel_args = (logits, logits.stride(0), bitmask, bitmask.stride(0), None, 1, 1000)

    def raw():
        constraints._token_bitmask_kernel[(1, 1)](*kernel_args, HAS_IDX_MAPPING=False, BLOCK_V=4096, num_warps=8)

    rows = [
        ["raw Triton launch", eager_overhead_us(raw)],
        ["torch.ops.sampling.apply_token_bitmask",
         eager_overhead_us(lambda: torch.ops.sampling.apply_token_bitmask(logits, bitmask))],
        ["torch_sampling_ops.apply_token_bitmask", eager_overhead_us(lambda: tso.apply_token_bitmask(logits, bitmask))],
    ]
    state = logit_bias_inputs(1, 1000, "cuda", allowed=16, bias=16, stops=2)
    rows.append(["torch.ops.sampling.logit_bias (2 launches)",
                 eager_overhead_us(lambda: torch.ops.sampling.logit_bias(*state))])
    for call, us in rows:
        op = "logit_bias" if "logit_bias" in call else "apply_token_bitmask"
        record(op, "host cost per call", 1, 1000, logits.dtype, "host", call, us)
    return print_table("Eager host cost per call (µs), T = 1, V = 1000", ["call", "µs / call"], rows)


if __name__ == "__main__":
    main(CASES, __doc__, extra_gpu=overhead_table)
