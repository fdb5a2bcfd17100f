"""Benchmark of the filtering family (temperature, min_p) against the composed-PyTorch baseline
(benchmarks/baselines.py) and the bandwidth floor.

    python benchmarks/bench_filtering.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_filtering.py --out results.md
    python benchmarks/bench_filtering.py --cpu-only

The ops run in place on the same inputs again and again. temperature uses 1.0 in every slot so the
logits stay the same across thousands of repetitions (any other value drives them to 0 or inf after
a few hundred calls); the kernel still divides every token, as for any non-greedy temperature.
min_p (0.05) removes most tokens on the first call and rewrites them as -inf on the next ones: the
traffic per call is the same, since every block is read twice and written whole.
"""
from __future__ import annotations

import baselines
import torch

import torch_sampling_ops as tso

from timing import Case, main


def filter_inputs(T, V, device, value, seed=0):
    """[logits fp32 [T, V], idx_mapping [T] (row t -> slot t), parameter [T] filled with `value`]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, V, generator=g) * 3
    return [logits.to(device), torch.arange(T, dtype=torch.int32).to(device), torch.full((T,), value).to(device)]


CASES = [
    Case("temperature", lambda T, V, dev, s: filter_inputs(T, V, dev, 1.0, seed=s), tso.temperature,
         baselines.temperature),
    Case("min_p (0.05)", lambda T, V, dev, s: filter_inputs(T, V, dev, 0.05, seed=s), tso.min_p,
         baselines.min_p),
]

if __name__ == "__main__":
    main(CASES, __doc__)
