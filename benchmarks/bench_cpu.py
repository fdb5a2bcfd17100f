"""CPU benchmark of every op (C++ kernels) against the composed-PyTorch baselines (baselines.py),
with one thread and with all threads, and the cost of a call on a tiny input against a plain
in-place torch op.

    python benchmarks/bench_cpu.py [--T 32] [--V 32000] [--repeats 101] [--out results.md]

Medians of many runs: on a shared VM with two threads a run swings by 10x when a vCPU is
descheduled inside a parallel region, so the one-thread table is the stable one.
"""
from __future__ import annotations

import argparse
import timeit

import bench_filtering
import bench_history
import bench_logit_bias
import bench_sample
import bench_speculative
import bench_truncation
import torch

from timing import N_SETS, _time_ours, bench_cpu, environment, print_table

CASES = (bench_filtering.CASES + bench_truncation.CASES + bench_logit_bias.CASES + bench_history.CASES
         + bench_sample.CASES + bench_speculative.CASES)


def ops_table(T: int, V: int, threads: int, repeats: int) -> str:
    torch.set_num_threads(threads)
    rows = []
    for case in CASES:
        sets = [case.make(T, V, "cpu", seed) for seed in range(N_SETS)]
        def timer(fn, s):
            return bench_cpu(fn, s, repeats=repeats)

        ours = _time_ours(case, sets, timer, lambda fn, base, s: bench_cpu(fn, s, repeats=repeats, base=base))
        base = timer(case.baseline, [[s[0].clone()] + list(s[1:]) for s in sets])
        rows.append([case.name, ours, base, base / ours])
    return print_table(f"CPU, T = {T}, V = {V}, fp32, {threads} thread(s), µs (median of {repeats})",
                       ["op", "C++", "composed PyTorch", "speed-up"], rows)


def call_cost_table(repeats: int) -> str:
    """µs per call on a [1, 2048] input (the lists of the logit_bias cases fit), the minimum over repeats of
    1000-call loops, and its ratio to x.mul_(1.0). The VM's speed drifts within a run: the baseline is
    timed again before every case and its minimum over the run taken."""
    torch.set_num_threads(1)
    T, V = 1, 2048
    x = torch.randn(T, V)

    def per_call(fn):
        return min(timeit.repeat(fn, number=1000, repeat=repeats)) / 1000 * 1e6

    base = per_call(lambda: x.mul_(1.0))
    timed = []
    for case in CASES:
        inputs = case.make(T, V, "cpu", 0)
        base = min(base, per_call(lambda: x.mul_(1.0)))
        timed.append((case.name, per_call(lambda case=case, inputs=inputs: case.ours(*inputs))))
    rows = [["x.mul_(1.0)", base, 1.0]] + [[name, us, us / base] for name, us in timed]
    return print_table(f"CPU call cost on a [{T}, {V}] input, 1 thread, µs per call (best of {repeats} x 1000 calls)",
                       ["call", "µs", "x mul_"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, default=32)
    parser.add_argument("--V", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--out")
    args = parser.parse_args()
    all_threads = torch.get_num_threads()
    out = [f"Environment: {environment()}"]
    print(out[0])
    out.append(call_cost_table(min(args.repeats, 25)))
    out.append(ops_table(args.T, args.V, 1, args.repeats))
    if all_threads > 1:
        out.append(ops_table(args.T, args.V, all_threads, args.repeats))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
