"""Benchmark of the filtering family (temperature, min_p) against the composed-PyTorch baseline
(torch_sampling_ops.reference in float32) and the bandwidth floor.

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

import argparse

import torch

import torch_sampling_ops as tso
from torch_sampling_ops import reference
from timing import bench_cpu, bench_gpu, copy_bandwidth_gbps, environment, print_table

V = 151936
N_SETS = 3  # input sets rotated through, so that no call finds the previous one's data in L2


def filter_inputs(T, V, device, value, seed=0):
    """[logits fp32 [T, V], idx_mapping [T] (row t -> slot t), parameter [T] filled with `value`]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, V, generator=g) * 3
    return [logits.to(device), torch.arange(T, dtype=torch.int32).to(device), torch.full((T,), value).to(device)]


CASES = {
    # name: (inputs, our op, baseline)
    "temperature": (
        lambda T, V, dev, s: filter_inputs(T, V, dev, 1.0, seed=s), tso.temperature,
        lambda *a: reference.temperature(*a, compute_dtype=torch.float32)),
    "min_p (0.05)": (
        lambda T, V, dev, s: filter_inputs(T, V, dev, 0.05, seed=s), tso.min_p,
        lambda *a: reference.min_p(*a, compute_dtype=torch.float32)),
}


def gpu_tables(out):
    bw = copy_bandwidth_gbps()
    out.append(f"Copy bandwidth (read + write): {bw:.0f} GB/s. Floor = (read + write of the fp32 logits) / copy bandwidth.")
    print(out[-1])
    for name, (make, ours, baseline) in CASES.items():
        rows = []
        for T in (1, 32, 256, 1024):
            sets = [make(T, V, "cuda", s) for s in range(N_SETS)]
            eager = bench_gpu(ours, sets)
            graph = bench_gpu(ours, sets, graph=True)
            base = bench_gpu(baseline, sets)
            floor = 2 * T * V * 4 / (bw * 1e9) * 1e6
            rows.append([T, eager, graph, base, base / graph, floor, graph / floor, 2 * T * V * 4 / (graph * 1e-6) / 1e9])
            del sets
        out.append(print_table(f"{name}, V = {V}, fp32, {torch.cuda.get_device_name()} µs (median)",
                               ["T", "ours eager", "ours graph", "PyTorch", "speed-up (graph)", "r+w floor", "ours / floor",
                                "effective GB/s"], rows))


def cpu_table(out):
    T, Vc = 32, 32000
    rows = []
    for name, (make, ours, baseline) in CASES.items():
        sets = [make(T, Vc, "cpu", s) for s in range(N_SETS)]
        ours_us, base_us = bench_cpu(ours, sets), bench_cpu(baseline, sets)
        rows.append([name, ours_us, base_us, base_us / ours_us])
    out.append(print_table(f"CPU, T = {T}, V = {Vc}, fp32, {torch.get_num_threads()} threads, µs (median)",
                           ["op", "C++", "PyTorch", "speed-up"], rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the tables (markdown) to this file")
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU tables even if CUDA is present")
    args = parser.parse_args()
    out = [f"Environment: {environment()}"]
    print(out[0])
    if torch.cuda.is_available() and not args.cpu_only:
        gpu_tables(out)
    cpu_table(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
