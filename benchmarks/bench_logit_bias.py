"""Benchmark of the constraints family (logit_bias, apply_token_bitmask) against the composed-PyTorch
baseline (torch_sampling_ops.reference in float32) and the bandwidth floor.

    python benchmarks/bench_logit_bias.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_logit_bias.py --out results.md
"""
from __future__ import annotations

import argparse

import torch
import triton

import torch_sampling_ops as tso
from torch_sampling_ops import constraints, reference
from timing import bench_cpu, bench_gpu, copy_bandwidth_gbps, eager_overhead_us, environment, print_table

V = 151936
N_SETS = 3  # input sets rotated through, so that no call finds the previous one's data in L2


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


def bitmask_inputs(T, V, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = (V + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (T, words), generator=g, dtype=torch.int64).to(torch.int32)
    return [(torch.randn(T, V, generator=g) * 3).to(device), bitmask.to(device)]


CASES = {
    # name: (inputs, our op, baseline)
    "logit_bias (1024 allowed, 1024 bias, 8 stops)": (
        lambda T, dev, s: logit_bias_inputs(T, V, dev, seed=s), tso.logit_bias,
        lambda *a: reference.logit_bias(*a, compute_dtype=torch.float32)),
    "logit_bias (1024 bias, 8 stops, no allowed list)": (
        lambda T, dev, s: logit_bias_inputs(T, V, dev, allowed=0, seed=s), tso.logit_bias,
        lambda *a: reference.logit_bias(*a, compute_dtype=torch.float32)),
    "apply_token_bitmask": (
        lambda T, dev, s: bitmask_inputs(T, V, dev, seed=s), tso.apply_token_bitmask,
        lambda *a: reference.apply_token_bitmask(*a, compute_dtype=torch.float32)),
}


def gpu_tables(out):
    bw = copy_bandwidth_gbps()
    out.append(f"Copy bandwidth (read + write): {bw:.0f} GB/s. Floor = (read + write of the fp32 logits) / copy bandwidth.")
    print(out[-1])
    for name, (make, ours, baseline) in CASES.items():
        rows = []
        for T in (1, 32, 256, 1024):
            sets = [make(T, "cuda", s) for s in range(N_SETS)]
            eager = bench_gpu(ours, sets)
            graph = bench_gpu(ours, sets, graph=True)
            base = bench_gpu(baseline, sets)
            floor = 2 * T * V * 4 / (bw * 1e9) * 1e6
            rows.append([T, eager, graph, base, base / graph, floor, graph / floor, 2 * T * V * 4 / (graph * 1e-6) / 1e9])
            del sets
        out.append(print_table(f"{name}, V = {V}, fp32, H200 µs (median)",
                               ["T", "ours eager", "ours graph", "PyTorch", "speed-up (graph)", "r+w floor", "ours / floor",
                                "effective GB/s"], rows))


def overhead_table(out):
    logits, bitmask = bitmask_inputs(1, 1000, "cuda")
    kernel_args = (logits, logits.stride(0), bitmask, bitmask.stride(0), None, 1, 1000)

    def raw():
        constraints._token_bitmask_kernel[(1, 1)](*kernel_args, HAS_IDX_MAPPING=False, BLOCK_V=4096, num_warps=8)

    rows = [
        ["raw Triton launch", eager_overhead_us(raw)],
        ["torch.ops.sampling.apply_token_bitmask", eager_overhead_us(lambda: torch.ops.sampling.apply_token_bitmask(logits, bitmask))],
        ["torch_sampling_ops.apply_token_bitmask", eager_overhead_us(lambda: tso.apply_token_bitmask(logits, bitmask))],
    ]
    state = logit_bias_inputs(1, 1000, "cuda", allowed=16, bias=16, stops=2)
    rows.append(["torch.ops.sampling.logit_bias (2 launches)", eager_overhead_us(lambda: torch.ops.sampling.logit_bias(*state))])
    out.append(print_table("Eager host cost per call (µs), T = 1, V = 1000", ["call", "µs / call"], rows))


def cpu_table(out):
    T, Vc = 32, 32000
    rows = []
    for name, make, ours, baseline in [
        ("logit_bias (1024 allowed, 1024 bias, 8 stops)", lambda s: logit_bias_inputs(T, Vc, "cpu", seed=s), tso.logit_bias,
         lambda *a: reference.logit_bias(*a, compute_dtype=torch.float32)),
        ("apply_token_bitmask", lambda s: bitmask_inputs(T, Vc, "cpu", seed=s), tso.apply_token_bitmask,
         lambda *a: reference.apply_token_bitmask(*a, compute_dtype=torch.float32)),
    ]:
        sets = [make(s) for s in range(N_SETS)]
        ours_us, base_us = bench_cpu(ours, sets), bench_cpu(baseline, sets)
        rows.append([name, ours_us, base_us, base_us / ours_us])
    out.append(print_table(f"CPU, T = {T}, V = {Vc}, fp32, {torch.get_num_threads()} threads, µs (median)",
                           ["op", "C++", "PyTorch", "speed-up"], rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="also write the tables (markdown) to this file")
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args()
    out = [f"Environment: {environment()}"]
    print(out[0])
    if torch.cuda.is_available() and not args.cpu_only:
        gpu_tables(out)
        overhead_table(out)
    cpu_table(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
