"""Timing helper shared by every benchmark script.

GPU: `triton.testing.do_bench` medians (warmed up) while rotating over several input sets so
repeated calls do not hit a warm L2, optionally inside a CUDA graph; CPU: medians of wall-clock
repeats. Also the copy bandwidth that the bandwidth floor is computed from, and table printing.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def bench_gpu(fn: Callable, input_sets: Sequence, *, graph: bool = False, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median µs of one `fn(*inputs)` call, rotating over `input_sets`.

    With graph=True, one CUDA graph holds one call per input set and the replay time is divided by
    the number of sets: the launch overhead of eager mode disappears.
    """
    import triton.testing

    for inputs in input_sets:  # compile and warm up before any capture
        fn(*inputs)
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for inputs in input_sets:
                fn(*inputs)
        return triton.testing.do_bench(g.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3 / len(input_sets)
    state = {"i": 0}

    def call():
        fn(*input_sets[state["i"] % len(input_sets)])
        state["i"] += 1

    return triton.testing.do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def bench_cpu(fn: Callable, input_sets: Sequence, *, repeats: int = 15) -> float:
    """Median µs of one `fn(*inputs)` call on the CPU, rotating over `input_sets`, after one warm-up each."""
    for inputs in input_sets:
        fn(*inputs)
    times = []
    for i in range(repeats):
        inputs = input_sets[i % len(input_sets)]
        start = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    us = bench_gpu(lambda: dst.copy_(src), [()])
    return 2 * nbytes / (us * 1e-6) / 1e9


def eager_overhead_us(fn: Callable, calls: int = 2000) -> float:
    """Host µs per call of a tiny `fn()`: what eager mode pays on top of the kernel."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def environment() -> str:
    import triton

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    return f"{dev}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """Prints (and returns) a markdown table."""
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (f"{x:.0f}" if isinstance(x, float) else str(x))

    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
