"""Timing helper shared by every benchmark script.

GPU: `triton.testing.do_bench` medians (warmed up) while rotating over several input sets so
repeated calls do not hit a warm L2, optionally inside a CUDA graph; CPU: medians of wall-clock
repeats. Also the copy bandwidth that the bandwidth floor is computed from, table printing, a CSV
of every timed row (`record`): benchmarks/results/<script>.csv, appended to, one line a figure, and
the A/B scripts' arguments and output digests.
"""
from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import importlib
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

N_SETS = 3  # input sets rotated through, so that no call finds the previous one's data in L2


CSV_COLUMNS = ["op", "setting", "T", "V", "dtype", "mode", "provider", "median_us", "device", "torch", "triton",
               "commit", "timestamp"]
RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def bench_gpu(fn: Callable, input_sets: Sequence, *, graph: bool = False, warmup_ms: int = 25,
              rep_ms: int = 100) -> float:
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
        replay_ms = triton.testing.do_bench(g.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        return replay_ms * 1e3 / len(input_sets)
    state = {"i": 0}

    def call():
        fn(*input_sets[state["i"] % len(input_sets)])
        state["i"] += 1

    return triton.testing.do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def bench_cpu(fn: Callable, input_sets: Sequence, *, repeats: int = 15, base: Callable | None = None) -> float:
    """Median µs of one `fn(*inputs)` call on the CPU, rotating over `input_sets`, after one warm-up each;
    with `base`, the median of fn's time minus base's, the two timed back to back in each repeat (a
    drift of the VM's speed cancels out)."""
    calls = (fn,) if base is None else (fn, base)
    for inputs in input_sets:
        for call in calls:
            call(*inputs)
    times = []
    for i in range(repeats):
        inputs = input_sets[i % len(input_sets)]
        start = time.perf_counter()
        fn(*inputs)
        middle = time.perf_counter()
        if base is not None:
            base(*inputs)
        times.append((middle - start) - (time.perf_counter() - middle if base is not None else 0.0))
    return statistics.median(times) * 1e6


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    us = bench_gpu(lambda: dst.copy_(src), [()])
    record("copy", f"{nbytes >> 20} MiB fp32", 1, nbytes // 4, "float32", "eager", "torch", us)
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


@functools.cache
def _sleep_cycles_per_us() -> float:
    """GPU clock cycles a µs of `torch.cuda._sleep` (timed once with events)."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles // 10)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


def host_cost_busy_us(fn: Callable, calls: int = 100, rounds: int = 21, budget_us: float = 250.0) -> float:
    """Host µs per call of a tiny `fn()` with the device kept busy: a sleep kernel of `budget_us` a
    call is queued before each round of `calls` calls, so that no call waits for the device and the
    time is the host's alone (eager_overhead_us's loop is the device's time wherever the device is
    slower). The median over rounds; NaN if in some round the sleep ended before its last call was
    queued (the host waited for the device, or the queue of pending launches filled), so that one
    such call leaves a hole in a table rather than ending the run."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_round = []
    for _ in range(rounds):
        torch.cuda._sleep(int(calls * budget_us * _sleep_cycles_per_us()))
        slept = torch.cuda.Event()
        slept.record()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if slept.query():
            torch.cuda.synchronize()
            return float("nan")
        torch.cuda.synchronize()
        per_round.append(elapsed / calls * 1e6)
    return statistics.median(per_round)


def kernel_breakdown(fn: Callable, inputs: Sequence, calls: int = 5, restore: bool = True) -> dict[str, float]:
    """Mean device µs per call of each Triton kernel launch of `fn(*inputs)` (torch.profiler), keyed
    as `launch_means` keys them. With `restore` (an op that edits its logits) the logits are restored
    from a copy before every call. The copy is not counted, but the write-back of its last lines can
    fall into the first launch's time, so a read-only op is timed without it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    original = inputs[0].clone() if restore else None

    def call():
        if restore:
            inputs[0].copy_(original)
        fn(*inputs)

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA
                      and e.name.startswith("_") and e.name.endswith("_kernel")), key=lambda e: e.time_range.start)
    return launch_means([(e.name, e.device_time) for e in kernels], calls)


def launch_means(launches: Sequence[tuple[str, float]], calls: int) -> dict[str, float]:
    """{launch: mean µs} of `calls` calls' kernel launches, (name, µs) in launch order, each call the
    same sequence: a kernel launched once a call is keyed by its name, one launched n times a call
    (the levels of rejection_sample) by its name and rank, "NAME #1" to "NAME #n"."""
    per_call = len(launches) // calls
    if per_call * calls != len(launches):
        raise ValueError(f"{len(launches)} launches do not split into {calls} equal calls")
    names = [name for name, _ in launches[:per_call]]
    keys, seen = [], {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        keys.append(f"{name} #{seen[name]}" if names.count(name) > 1 else name)
    means = dict.fromkeys(keys, 0.0)
    for i, (name, us) in enumerate(launches):
        if name != names[i % per_call]:
            raise ValueError(f"call {i // per_call} launched {name} where the first launched {names[i % per_call]}")
        means[keys[i % per_call]] += us / calls
    return means


def _launch_column(key: str) -> str:
    """A launch table's column name of a `launch_means` key: "_draw_kernel" -> "draw",
    "_rejection_level_kernel #2" -> "rejection_level #2"."""
    name, _, rank = key.partition(" #")
    name = name.strip("_").removesuffix("_kernel")
    return f"{name} #{rank}" if rank else name


def launch_table(title: str, op: str, fn: Callable, runs: Sequence, V: int, label_names: Sequence[str],
                 kernels: Sequence[str] = (), size_name: str = "T", restore: bool = True) -> str:
    """A table of the device µs of each launch of `fn` (kernel_breakdown, `restore` passed on), a row
    a run. `runs`: (T, labels, make_inputs, context) tuples, `context()` a context manager the call
    runs in. Columns: the batch size (headed `size_name`), the labels, `kernels` then any other launch
    seen, the sum; each time recorded as a profiler row of `op`, setting "first label; kernel; other
    labels"."""
    results, seen = [], dict.fromkeys(kernels)
    for T, labels, make_inputs, context in runs:
        with context():
            times = kernel_breakdown(fn, make_inputs(), restore=restore)
        for kernel, us in times.items():
            record(op, "; ".join([labels[0], kernel, *labels[1:]]), T, V, torch.float32, "profiler", "ours", us)
        seen.update(dict.fromkeys(times))
        results.append((T, labels, times))
    names = list(seen)
    rows = [[T, *labels] + [times.get(k, 0.0) for k in names] + [sum(times.values())] for T, labels, times in results]
    return print_table(title, [size_name, *label_names] + [_launch_column(k) for k in names] + ["sum"], rows)


def environment() -> str:
    import triton

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    return f"{dev}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}"


@functools.cache
def _run_fields() -> dict:
    """The CSV fields shared by every row of this run: machine, versions, commit, start time."""
    import triton

    # BENCH_COMMIT names the commit where the tree was copied without its git history (a lent GPU).
    commit = os.environ.get("BENCH_COMMIT", "")
    try:
        commit = commit or subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                                          capture_output=True, text=True, cwd=RESULTS_DIR.parent,
                                          timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"torch": torch.__version__, "triton": triton.__version__, "commit": commit,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def split_name(name: str) -> tuple[str, str]:
    """(op, setting) of a case name such as "top_k_top_p (k=50, p=0.9), fp32" or "temperature"."""
    match = re.match(r"([\w.]+)\s*(?:\((.*)\))?", name)
    return match.group(1), match.group(2) or ""


def record(op: str, setting: str, T: int, V: int, dtype, mode: str, provider: str, median_us: float,
           device: str | None = None) -> None:
    """Appends one timed row to benchmarks/results/<script>.csv (header written with the file). mode: eager,
    graph, cpu, host (host time per eager call) or profiler (device time of one launch)."""
    if device is None:
        device = (torch.cuda.get_device_name() if mode != "cpu" and torch.cuda.is_available()
                  else f"CPU ({torch.get_num_threads()} threads)")
    row = {"op": op, "setting": setting, "T": T, "V": V, "dtype": str(dtype).removeprefix("torch."), "mode": mode,
           "provider": provider, "median_us": f"{median_us:.3f}", "device": device, **_run_fields()}
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{pathlib.Path(sys.argv[0]).stem or 'benchmark'}.csv"
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """Prints (and returns) a markdown table."""
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (f"{x:.0f}" if isinstance(x, float) else str(x))

    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


@dataclass
class Case:
    """One benchmarked step: `make(T, V, device, seed)` builds the inputs (logits first), `ours` is the
    in-place op, `baseline` the composed-PyTorch version. With `fresh_logits`, each timed call of ours
    first copies the original logits into a work buffer (its result depends on the data it finds), and
    the copy's own time is subtracted."""
    name: str
    make: Callable[[int, int, str, int], list]
    ours: Callable
    baseline: Callable
    fresh_logits: bool = False


def ab_parser(description: str, what: str, what_help: str, batch_sizes: str) -> argparse.ArgumentParser:
    """The arguments of an A/B script: a benchmark script, what it compares, batch sizes, V, the
    cases to time and the rounds."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", help="a benchmark script's module name, e.g. bench_logit_bias (its CASES)")
    parser.add_argument(what, help=what_help)
    parser.add_argument("--T", default=batch_sizes, help="batch sizes")
    parser.add_argument("--V", type=int, default=151936)
    parser.add_argument("--cases", default="", help="only the cases whose name contains this")
    parser.add_argument("--rounds", type=int, default=2)
    return parser


def ab_setup(script: str, cases: str) -> tuple[list, str, Callable, str]:
    """(the cases of benchmark module `script` whose name contains `cases`, the device, the timer,
    its unit) of an A/B script: CUDA-graph µs on a GPU, else CPU µs."""
    selected = [c for c in importlib.import_module(script).CASES if cases in c.name]
    if torch.cuda.is_available():
        return selected, "cuda", functools.partial(bench_gpu, graph=True), "CUDA graph µs"
    return selected, "cpu", bench_cpu, "CPU µs"


def output_digest(case: Case, inputs: list) -> str:
    """A hash of what `case.ours` writes or returns on a copy of `inputs` (the A/B scripts compare
    two forms' outputs by it)."""
    inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    result = case.ours(*inputs)
    outputs = [inputs[0]] if result is None else (list(result) if isinstance(result, (tuple, list)) else [result])
    h = hashlib.sha1()
    for t in outputs:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


def time_ours(case: Case, sets: list, timer: Callable, difference: Callable | None = None) -> float:
    """µs of one call of case.ours by `timer(fn, sets)`; with fresh_logits, each call first copies the
    original logits into a work buffer, and the copy's own time is subtracted (by
    `difference(fn, copy, sets)` if given: the two timed together)."""
    if not case.fresh_logits:
        return timer(case.ours, sets)
    work = [[torch.empty_like(s[0])] + list(s) for s in sets]

    def copy(work_logits, src, *rest):
        work_logits.copy_(src)

    def copy_and_run(work_logits, src, *rest):
        work_logits.copy_(src)
        case.ours(work_logits, *rest)

    if difference is not None:
        return difference(copy_and_run, copy, work)
    return timer(copy_and_run, work) - timer(copy, work)


def time_case(case: Case, T: int, V: int) -> tuple[list, float, float, float]:
    """Times `case` on the GPU at T rows: (one of its input sets, for the floors; µs of ours eager, of
    ours in a CUDA graph, of the baseline), each time also recorded in the CSV."""
    sets = [case.make(T, V, "cuda", seed) for seed in range(N_SETS)]
    eager = time_ours(case, sets, bench_gpu)
    graph = time_ours(case, sets, functools.partial(bench_gpu, graph=True))
    base = bench_gpu(case.baseline, sets)
    op, setting = split_name(case.name)
    for mode, provider, us in (("eager", "ours", eager), ("graph", "ours", graph), ("eager", "pytorch", base)):
        record(op, setting, T, V, sets[0][0].dtype, mode, provider, us)
    return sets[0], eager, graph, base


def gpu_table(case: Case, V: int, bandwidth_gbps: float, Ts=(1, 32, 256, 1024)) -> str:
    rows = []
    for T in Ts:
        inputs, eager, graph, base = time_case(case, T, V)
        nbytes = 2 * T * V * inputs[0].element_size()
        floor = nbytes / (bandwidth_gbps * 1e9) * 1e6
        rows.append([T, eager, graph, base, base / graph, floor, graph / floor, nbytes / (graph * 1e-6) / 1e9])
    return print_table(f"{case.name}, V = {V}, {torch.cuda.get_device_name()}, µs (median)",
                       ["T", "ours eager", "ours graph", "PyTorch", "speed-up (graph)", "r+w floor", "ours / floor",
                        "effective GB/s"], rows)


def cpu_table(cases: Sequence[Case], T: int = 32, V: int = 32000) -> str:
    rows = []
    for case in cases:
        sets = [case.make(T, V, "cpu", seed) for seed in range(N_SETS)]
        ours_us, base_us = time_ours(case, sets, bench_cpu), bench_cpu(case.baseline, sets)
        op, setting = split_name(case.name)
        for provider, us in (("ours", ours_us), ("pytorch", base_us)):
            record(op, setting, T, V, sets[0][0].dtype, "cpu", provider, us)
        rows.append([case.name, ours_us, base_us, base_us / ours_us])
    return print_table(f"CPU, T = {T}, V = {V}, fp32, {torch.get_num_threads()} threads, µs (median)",
                       ["op", "C++", "PyTorch", "speed-up"], rows)


def main(cases: Sequence[Case], description: str, *, V: int = 151936,
         extra_gpu: Callable[[], str] | None = None, table: Callable[..., str] | None = None,
         sizes: str = "1,32,256,1024"):
    """Command line of every benchmark script: GPU tables when CUDA is present (`table(case, V,
    bandwidth, Ts)`, gpu_table by default, at the batch sizes BENCH_T or `sizes`), then the CPU tables
    at one thread and at all threads (on a shared VM a parallel region waits whenever a vCPU is
    descheduled, so one thread is the stable figure)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the tables (markdown) to this file")
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU tables even if CUDA is present")
    args = parser.parse_args()
    out = [f"Environment: {environment()}"]
    print(out[0])
    if torch.cuda.is_available() and not args.cpu_only:
        bw = copy_bandwidth_gbps()
        out.append(f"Copy bandwidth (read + write): {bw:.0f} GB/s. "
                   "Floor = (read + write of the logits) / copy bandwidth.")
        print(out[-1])
        Ts = tuple(int(t) for t in os.environ.get("BENCH_T", sizes).split(","))
        out += [(table or gpu_table)(case, V, bw, Ts) for case in cases]
        if extra_gpu is not None:
            out.append(extra_gpu())
    threads = torch.get_num_threads()
    for n in sorted({1, threads}) if os.environ.get("BENCH_CPU", "1") != "0" else ():  # BENCH_CPU=0: GPU only
        torch.set_num_threads(n)
        out.append(cpu_table(cases))
    torch.set_num_threads(threads)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
