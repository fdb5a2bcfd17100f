"""Host cost of the ops' eager calls on the GPU, and eager against CUDA-graph time.

    python benchmarks/bench_launch.py [--out results.md] [--V 151936] [--T 1,32,256]

1. Host µs per call (a loop of 2000 calls on a tiny input, wall time per call, synchronised at the
   end) of: a bare Triton launch of an empty kernel, one of our kernels through `kernel[grid]`, the
   same kernel through the bound launcher of `_launch`, every op replayed from its call record
   (`_call_cache`: its workspace from the stream's buffer, or allocated per call; its launches from
   C++ or through Triton's launchers), through its launcher with the launch cache, and with plain
   Triton launches, and `torch.empty` of the workspace sizes the launchers allocate. Where the
   device is slower than the host that loop times the device: "device busy" rows time the calls
   queued behind a sleep kernel (`timing.host_cost_busy_us`), the host's cost alone.
2. Device µs per call of every op (V = 151936 fp32), eager and replayed from a CUDA graph, at
   T = 1, 32, 256 (`timing.bench_gpu`: do_bench medians rotating over input sets).
"""
from __future__ import annotations

import argparse
import functools

import bench_filtering
import bench_history
import bench_logit_bias
import bench_sample
import bench_sampler
import bench_speculative
import bench_truncation
import torch
import triton
import triton.language as tl

from torch_sampling_ops import _call_cache, _launch, constraints, truncation
from torch_sampling_ops.truncation.workspace import _workspace_words

from timing import (
    N_SETS,
    bench_gpu,
    eager_overhead_us,
    environment,
    host_cost_busy_us,
    print_table,
    time_ours,
)

CASES = (bench_filtering.CASES + bench_truncation.CASES + bench_logit_bias.CASES + bench_history.CASES
         + bench_sample.CASES + bench_speculative.CASES + bench_sampler.CASES)


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def host_cost_table(calls: int = 2000) -> str:
    rows = []
    workspace_bytes = _call_cache._STREAM_WORKSPACE_BYTES
    x = torch.empty(16, device="cuda")
    rows.append(["bare Triton launch, empty kernel (kernel[grid])",
                 eager_overhead_us(lambda: _empty_kernel[(1,)](x, 16, BLOCK=16), calls)])
    rows.append(["bare launch, empty kernel, bound launcher (_launch)",
                 eager_overhead_us(lambda: _launch.launch(_empty_kernel, (1,), (x, 16), {"BLOCK": 16}), calls)])
    rows.append(["bare Triton launch, empty kernel (kernel[grid]), device busy",
                 host_cost_busy_us(lambda: _empty_kernel[(1,)](x, 16, BLOCK=16))])
    logits, bitmask = bench_logit_bias.bitmask_inputs(1, 1000, "cuda")
    kernel_args = (logits, logits.stride(0), bitmask, bitmask.stride(0), None, 1, 1000)
    meta = {"HAS_IDX_MAPPING": False, "BLOCK_V": 4096, "num_warps": 8}
    rows.append(["_token_bitmask_kernel, kernel[grid]",
                 eager_overhead_us(lambda: constraints._token_bitmask_kernel[(1, 1)](*kernel_args, **meta), calls)])
    rows.append(["_token_bitmask_kernel, bound launcher",
                 eager_overhead_us(lambda: _launch.launch(constraints._token_bitmask_kernel, (1, 1), kernel_args, meta),
                                   calls)])
    for case in CASES:
        inputs = case.make(1, 4096 if "logit_bias" in case.name or "penalties" in case.name else 1000, "cuda", 0)
        for mode, launch_cache, records, native, stream_workspace in (
                ("call records", True, True, True, True),
                ("call records, a workspace allocated per call", True, True, True, False),
                ("call records, Triton's launchers", True, True, False, True),
                ("launch cache", True, False, False, False), ("plain Triton launches", False, False, False, False)):
            _launch._ENABLED = launch_cache and _launch._fast_path_supported()
            _call_cache._ENABLED = records
            _call_cache._NATIVE_ENABLED = native
            _call_cache._STREAM_WORKSPACE_BYTES = workspace_bytes if stream_workspace else 0
            _call_cache.clear()
            us = eager_overhead_us(lambda case=case, inputs=inputs: case.ours(*inputs), calls)
            rows.append([f"{case.name}, T = 1, {mode}", us])
            if mode == "call records":  # the host's own time, where the loop above is the device's
                rows.append([f"{case.name}, T = 1, call records, device busy",
                             host_cost_busy_us(lambda case=case, inputs=inputs: case.ours(*inputs))])
    _launch._ENABLED = _launch._fast_path_supported()
    _call_cache._ENABLED = _call_cache._NATIVE_ENABLED = True
    _call_cache._STREAM_WORKSPACE_BYTES = workspace_bytes
    _call_cache.clear()
    # The allocations the launchers make per call (caching allocator, warm).
    V = 151936
    settings = truncation.current_settings()
    ws_words = _workspace_words(triton.cdiv(V, settings.segment), settings)
    for T in (1, 256):
        rows.append([f"torch.empty of top_k_top_p's workspace [{T}, {ws_words}] fp32",
                     eager_overhead_us(lambda T=T: torch.empty((T, ws_words), device="cuda"), calls)])
    rows.append(["torch.empty of min_p's partial maxima [1, 38] fp32",
                 eager_overhead_us(lambda: torch.empty((1, 38), device="cuda"), calls)])
    return print_table(f"Host cost per eager call (µs; loop of {calls} calls, wall time, tiny inputs)",
                       ["call", "µs / call"], rows)


def eager_vs_graph_table(V: int, Ts=(1, 32, 256)) -> str:
    rows = []
    for case in CASES:
        for T in Ts:
            sets = [case.make(T, V, "cuda", seed) for seed in range(N_SETS)]
            eager = time_ours(case, sets, bench_gpu)
            graph = time_ours(case, sets, functools.partial(bench_gpu, graph=True))
            rows.append([case.name, T, eager, graph, eager - graph])
            del sets
    return print_table(f"Eager against CUDA graph, V = {V}, µs per call (median)",
                       ["op", "T", "eager", "graph", "eager - graph"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--V", type=int, default=151936)
    parser.add_argument("--T", default="1,32,256", help="batch sizes of the eager / graph table")
    parser.add_argument("--out")
    args = parser.parse_args()
    out = [f"Environment: {environment()}; launch cache: {'on' if _launch.enabled() else 'off'}; "
           f"call records: {'on' if _call_cache.enabled() else 'off'}"]
    print(out[0])
    out.append(host_cost_table())
    out.append(eager_vs_graph_table(args.V, tuple(int(t) for t in args.T.split(","))))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
