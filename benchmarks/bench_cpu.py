"""CPU benchmark of every op (C++ kernels) against the composed-PyTorch baselines (baselines.py),
with one thread and with all threads, and the cost of a call on a tiny input against a plain
in-place torch op: one table, a row an op.

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
import bench_sampler
import bench_speculative
import bench_truncation
import torch

from timing import N_SETS, bench_cpu, environment, print_table, time_ours

CASES = (bench_filtering.CASES + bench_truncation.CASES + bench_logit_bias.CASES + bench_history.CASES
         + bench_sample.CASES + bench_speculative.CASES + bench_sampler.CASES)


def ops_rows(T: int, V: int, threads: int, repeats: int) -> dict:
    """op -> [C++ µs, composed PyTorch µs, speed-up] with `threads` threads (medians of `repeats` runs)."""
    torch.set_num_threads(threads)
    rows = {}
    for case in CASES:
        sets = [case.make(T, V, "cpu", seed) for seed in range(N_SETS)]
        def timer(fn, s):
            return bench_cpu(fn, s, repeats=repeats)

        ours = time_ours(case, sets, timer, lambda fn, base, s: bench_cpu(fn, s, repeats=repeats, base=base))
        base = timer(case.baseline, [[s[0].clone()] + list(s[1:]) for s in sets])
        rows[case.name] = [ours, base, base / ours]
        print(f"{threads} thread(s): {case.name} {ours:.4g} / {base:.4g} µs", flush=True)
    return rows


def call_cost_rows(repeats: int) -> tuple[float, dict]:
    """(x.mul_(1.0)'s µs, op -> [µs, ratio to it]) per call on a [1, 2048] input (the lists of the
    logit_bias cases fit), the minimum over repeats of 1000-call loops. The VM's speed drifts within
    a run: the baseline is timed again before every case and its minimum over the run taken."""
    torch.set_num_threads(1)
    x = torch.randn(1, 2048)

    def per_call(fn):
        return min(timeit.repeat(fn, number=1000, repeat=repeats)) / 1000 * 1e6

    base = per_call(lambda: x.mul_(1.0))
    timed = {}
    for case in CASES:
        inputs = case.make(1, 2048, "cpu", 0)
        base = min(base, per_call(lambda: x.mul_(1.0)))
        timed[case.name] = per_call(lambda case=case, inputs=inputs: case.ours(*inputs))
    return base, {name: [us, us / base] for name, us in timed.items()}


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
    mul, calls = call_cost_rows(min(args.repeats, 25))
    one = ops_rows(args.T, args.V, 1, args.repeats)
    both = ops_rows(args.T, args.V, all_threads, args.repeats) if all_threads > 1 else {}
    header = ["op", "one thread: C++", "composed PyTorch", "speed-up"]
    if both:
        header += [f"{all_threads} threads: C++", "composed PyTorch", "speed-up"]
    header += ["call on [1, 2048]", "x `mul_`"]
    rows = [[name, *one[name], *both.get(name, []), *calls[name]] for name in one]
    out.append(print_table(f"CPU, T = {args.T}, V = {args.V}, fp32, µs (medians of {args.repeats} runs); calls on "
                           f"[1, 2048], 1 thread, µs (best of {min(args.repeats, 25)} x 1000; x.mul_(1.0): {mul:.3g})",
                           header, rows))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
