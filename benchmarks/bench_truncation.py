"""Benchmark of top_k_top_p against the sort-based composed-PyTorch baseline
(benchmarks/baselines.py) and the bandwidth floor.

    python benchmarks/bench_truncation.py [--out results.md] [--cpu-only]

The op's work depends on the logits it finds, so every timed call first copies the original
logits (randn * 3) into a work buffer; the copy's own time is measured alone and subtracted.
"""
from __future__ import annotations

import contextlib
import functools

import baselines
import torch

import torch_sampling_ops as tso
from torch_sampling_ops.truncation.plan import _compiled_kernels

from timing import Case, launch_table, main


def truncation_inputs(T, V, device, top_k, top_p, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, V, generator=g) * 3).to(device), torch.arange(T, dtype=torch.int32, device=device),
            torch.full((T,), top_k, dtype=torch.int32, device=device), torch.full((T,), top_p, device=device)]


def _case(name, top_k, top_p):
    return Case(f"top_k_top_p ({name}), fp32", lambda T, V, dev, s: truncation_inputs(T, V, dev, top_k, top_p, seed=s),
                tso.top_k_top_p, baselines.top_k_top_p, fresh_logits=True)


SETTINGS = [("k=50, p=0.9", 50, 0.9), ("p=0.9", 0, 0.9), ("k=50", 50, 1.0)]
CASES = [_case(*s) for s in SETTINGS]


def launch_breakdown(V=151936, Ts=(1, 256), device="cuda") -> str:
    """Device µs of each of the op's launches, per setting and batch size."""
    runs = [(T, [name], functools.partial(truncation_inputs, T, V, device, top_k, top_p), contextlib.nullcontext)
            for T in Ts for name, top_k, top_p in SETTINGS]
    return launch_table(f"top_k_top_p launches, fp32, V = {V}, device µs per call (torch.profiler)", "top_k_top_p",
                        tso.top_k_top_p, runs, V, ["setting"], KERNELS)


KERNELS = list(dict.fromkeys(kernel.fn.__name__ for kernel, _ in _compiled_kernels(151936)))

if __name__ == "__main__":
    main(CASES, __doc__, extra_gpu=launch_breakdown)
