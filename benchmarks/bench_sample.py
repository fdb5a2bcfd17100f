"""Benchmark of the sampling family (sample, logprobs) against the composed-PyTorch sampler
(benchmarks/baselines.py: temperature, min_p, sort-based top-k/top-p, softmax and an exponential
race; log_softmax + topk for logprobs).

    python benchmarks/bench_sample.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_sample.py --out results.md
    BENCH_T=1,32,256 python benchmarks/bench_sample.py

Inputs: fp32 logits randn * 3, V = 151936, one slot per row. Cases: greedy (temperature 0), a plain
draw (temperature 1, no filter), k = 50 with p = 0.9, p = 0.9 alone, min_p = 0.1 at temperature 0.7,
k = 50 with p = 0.9 in one row of eight and plain draws in the others (a serving batch's mix),
and logprobs with 20 top entries and the rank of a random token. The ops only read the logits, so
the "r+w floor" column of the tables (a read and a write of the logits) is twice the read floor of
these ops. On a GPU, last, the device time of each of sample's launches at T = 1 and 256
(torch.profiler), with dependent launches and each alone.
"""
from __future__ import annotations

import functools

import baselines
import torch

import torch_sampling_ops as tso
from torch_sampling_ops.truncation.settings import use_settings

from timing import Case, launch_table, main, split_name


def sample_inputs(T, V, device, seed, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, filtered_every=1):
    """[logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens], row t in slot t;
    with filtered_every = n, only rows t % n == 0 take top_k and top_p (the others neither)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, V, generator=g) * 3
    filtered = torch.arange(T) % filtered_every == 0
    args = [logits, torch.arange(T, dtype=torch.int32), torch.full((T,), temperature),
            torch.where(filtered, top_k, 0).to(torch.int32), torch.where(filtered, top_p, 1.0),
            torch.full((T,), min_p), torch.randint(0, 2**62, (T,), generator=g),
            torch.randint(0, 4096, (T,), generator=g)]
    return [a.to(device) for a in args]


def logprobs_inputs(T, V, device, seed, k=20):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, V, generator=g) * 3).to(device), torch.randint(0, V, (T,), generator=g).to(device), k]


CASES = [
    Case("sample (greedy)", lambda T, V, dev, s: sample_inputs(T, V, dev, s, temperature=0.0), tso.sample,
         baselines.sample),
    Case("sample (plain)", lambda T, V, dev, s: sample_inputs(T, V, dev, s), tso.sample, baselines.sample),
    Case("sample (k=50, p=0.9)", lambda T, V, dev, s: sample_inputs(T, V, dev, s, top_k=50, top_p=0.9), tso.sample,
         baselines.sample),
    Case("sample (p=0.9)", lambda T, V, dev, s: sample_inputs(T, V, dev, s, top_p=0.9), tso.sample,
         baselines.sample),
    Case("sample (T=0.7, min_p=0.1)", lambda T, V, dev, s: sample_inputs(T, V, dev, s, temperature=0.7, min_p=0.1),
         tso.sample, baselines.sample),
    Case("sample (k=50, p=0.9 in 1 row of 8, plain others)",
         lambda T, V, dev, s: sample_inputs(T, V, dev, s, top_k=50, top_p=0.9, filtered_every=8), tso.sample,
         baselines.sample),
    Case("logprobs (k=20)", logprobs_inputs, tso.logprobs, baselines.logprobs),
]


def launch_breakdown(V=151936, Ts=(1, 256), device="cuda") -> str:
    """Device µs of each of `sample`'s launches (torch.profiler), per case and batch size: with
    programmatic dependent launches, as the op runs on Hopper (a launch's time then includes its wait
    for the one before), and each launch alone (`dependent_launches=False`)."""
    runs = [(T, [split_name(case.name)[1], how], functools.partial(case.make, T, V, device, 0),
             functools.partial(use_settings, dependent_launches=how == "dependent"))
            for T in Ts for case in CASES if case.ours is tso.sample for how in ("dependent", "alone")]
    return launch_table(f"sample launches, fp32, V = {V}, device µs per call (torch.profiler)", "sample", tso.sample,
                        runs, V, ["setting", "launches"], restore=False)


if __name__ == "__main__":
    main(CASES, __doc__, extra_gpu=launch_breakdown)
