"""Cold start: what the first calls of a process cost in Triton JIT, and what `warmup()` removes.

    python benchmarks/bench_cold_start.py [--V 151936] [--max-num-tokens 256] [--out results.md]
    python benchmarks/bench_cold_start.py --runs 0,1,4   # a subset of the processes below (by index)
    python benchmarks/bench_cold_start.py --offline [--arch 90] [--only NAME] [--stages]   # compile times, no GPU

Every measurement runs in a fresh subprocess with its own TRITON_CACHE_DIR: empty ("cold"), filled
by an earlier subprocess ("cache filled"), or by `precompile` in a subprocess that sees no GPU
("precompiled"). Measured:
- the first call of each op (fp32, T = 1), then top_k_top_p's first call at T = 256 and in bf16;
- warmup(V, (fp32,)) serial and shared out among processes, then the same first calls (now loading nothing);
- warmup(V, (fp32, bf16)) shared out among processes;
- with the cache filled: warmup() and the first calls without warmup;
- precompile(V) for the GPU's architecture without a GPU, then warmup() and the first calls, and the
  kernel variants the GPU's process still compiled itself (none where precompile matched them).

With --offline, every fp32 variant that warmup(V) compiles is compiled one after the other for the
given CUDA architecture, with an empty cache and no GPU (Triton is handed the target instead of
asking the driver), and timed: which kernels set the cold start, on any machine.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _inputs(name, T, V, dtype, R, device="cuda"):
    """The first call's arguments: T rows against R request slots (as a server's slot table, and as
    warmup(num_slots=R) prepares; Triton specialises R == 1 apart from R > 1)."""
    import bench_filtering
    import bench_logit_bias
    import bench_truncation
    import torch

    if name == "apply_token_bitmask":  # no slots: one mask row a logits row
        args = bench_logit_bias.bitmask_inputs(T, V, device)
    else:
        if name == "temperature":
            args = bench_filtering.filter_inputs(R, V, device, 1.0)
        elif name == "min_p":
            args = bench_filtering.filter_inputs(R, V, device, 0.05)
        elif name == "top_k_top_p":
            args = bench_truncation.truncation_inputs(R, V, device, 50, 0.9)
        else:
            args = bench_logit_bias.logit_bias_inputs(R, V, device, stops=LOGIT_BIAS_WIDTHS[2])
        rows = 3 if name == "logit_bias" else 2  # logits, idx_mapping (and output_lens): the first T rows
        args[:rows] = [a[:T].contiguous() for a in args[:rows]]
        if name == "logit_bias":  # output_lens in warmup's index dtype, as a server that warms up passes it
            args[2] = args[2].to(torch.int32)
    args[0] = args[0].to(dtype)
    return args


LOGIT_BIAS_WIDTHS = (1024, 1024, 8)  # allowed, bias and stop list widths of the logit_bias call
FIRST_CALLS = [("temperature", 1, "float32"), ("min_p", 1, "float32"), ("apply_token_bitmask", 1, "float32"),
               ("logit_bias", 1, "float32"), ("top_k_top_p", 1, "float32"), ("top_k_top_p", 256, "float32"),
               ("top_k_top_p", 1, "bfloat16")]


def worker(V: int, max_num_tokens: int, warmup: str, workers: int | None) -> dict:
    """Runs in the subprocess: optional warmup, then the first calls; seconds of each."""
    import torch

    import torch_sampling_ops as tso
    from torch_sampling_ops import _warmup

    torch.cuda.init()
    torch.empty(1, device="cuda")
    result = {}
    if warmup != "none":
        dtypes = (torch.float32, torch.bfloat16) if warmup.endswith("+bf16") else (torch.float32,)
        compile_in_processes = _warmup._compile_in_processes

        def timed_workers(*args, **kwargs):  # the warm-up's forked phase, apart from its final load
            start = time.perf_counter()
            try:
                return compile_in_processes(*args, **kwargs)
            finally:
                result["warmup: forked phase"] = time.perf_counter() - start

        _warmup._compile_in_processes = timed_workers
        start = time.perf_counter()
        tso.warmup(V, dtypes=dtypes, max_num_tokens=max_num_tokens, logit_bias_widths=(LOGIT_BIAS_WIDTHS,),
                   parallel=warmup.startswith("parallel"), workers=workers)
        result["warmup"] = time.perf_counter() - start
    for name, T, dtype in FIRST_CALLS:
        args = _inputs(name, T, V, getattr(torch, dtype), max_num_tokens)
        torch.cuda.synchronize()
        start = time.perf_counter()
        getattr(torch.ops.sampling, name)(*args)
        torch.cuda.synchronize()
        result[f"{name} T={T} {dtype}"] = time.perf_counter() - start
    return result


def run(V: int, max_num_tokens: int, warmup: str, cache_dir: str, workers: int | None, precompile_arch: int = 0) -> dict:
    """One fresh process's `worker` (with TRITON_CACHE_DIR=cache_dir); with precompile_arch, first a
    process that sees no GPU precompiles for that architecture into the same cache."""
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    sizes = ["--V", str(V), "--max-num-tokens", str(max_num_tokens)]
    result = {}
    if precompile_arch:
        command = [sys.executable, __file__, "--precompile-worker", "--arch", str(precompile_arch)] + sizes
        out = subprocess.run(command, env=dict(env, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
                             check=True)
        result.update(json.loads(out.stdout.strip().splitlines()[-1]))
        precompiled = compiled_kernels(cache_dir)
    command = [sys.executable, __file__, "--worker", "--warmup", warmup] + sizes + (
        ["--workers", str(workers)] if workers else [])
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result.update(json.loads(out.stdout.strip().splitlines()[-1]))
    if precompile_arch:  # what the GPU's process still compiled: none if precompile matched its variants
        result["compiled after precompile"] = sorted(name for _, name in compiled_kernels(cache_dir) - precompiled)
    return result


def compiled_kernels(cache_dir: str) -> set[tuple[str, str]]:
    """(cache entry, kernel name) of every compiled kernel in a Triton cache directory."""
    paths = glob.glob(os.path.join(glob.escape(cache_dir), "*", "*.cubin"))
    return {(os.path.basename(os.path.dirname(p)), os.path.basename(p).removesuffix(".cubin")) for p in paths}


def _time_compiler_stages() -> None:
    """Makes Triton's CUDA backend print each compiler stage's seconds (ttir, ttgir, llir, ptx, cubin)."""
    from triton.backends.nvidia.compiler import CUDABackend
    add_stages = CUDABackend.add_stages

    def timed_stages(self, stages, options, *args):
        add_stages(self, stages, options, *args)
        for name, stage in list(stages.items()):
            def timed(src, metadata, stage=stage, name=name):
                start = time.perf_counter()
                out = stage(src, metadata)
                print(f"    {name} {time.perf_counter() - start:.2f} s", flush=True)
                return out
            stages[name] = timed

    CUDABackend.add_stages = timed_stages


def offline_compile_times(V: int, max_num_tokens: int, arch: int, only: str = "", stages: bool = False) -> list[list]:
    """[kernel, its constexprs that differ between variants, seconds] of each fp32 variant of
    warmup(V) (of the kernels whose name contains `only`), compiled one after the other for
    sm_<arch> in a fresh Triton cache, without a GPU; with `stages`, each compiler stage's seconds
    printed as it runs."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    import torch

    from torch_sampling_ops import _warmup

    # precompile's defaults, with this benchmark's logit_bias widths
    launch_args = _warmup._launch_args(V, (torch.float32,), max_num_tokens, torch.device("cpu"), None, torch.int32,
                                       (LOGIT_BIAS_WIDTHS,), 4, (0, 20), (8, 8, 8))
    if stages:
        _time_compiler_stages()
    rows = []
    with _warmup._compiling_for(arch):  # what precompile(V) compiles, one variant at a time
        for kernel, args, meta in _warmup._distinct_variants(launch_args):
            if only not in _warmup._kernel_name(kernel):
                continue
            start = time.perf_counter()
            kernel.run(*args, grid=(1,), warmup=True, **meta)
            flags = {k: v for k, v in meta.items() if k.isupper() and isinstance(v, bool)}
            rows.append([_warmup._kernel_name(kernel), str(flags), time.perf_counter() - start])
    return rows


def precompile_worker(V: int, max_num_tokens: int, arch: int) -> dict:
    """Runs in a subprocess that sees no GPU: `precompile` into its TRITON_CACHE_DIR; its seconds."""
    import torch_sampling_ops as tso

    info = tso.precompile(V, max_num_tokens=max_num_tokens, arch=arch, logit_bias_widths=(LOGIT_BIAS_WIDTHS,))
    return {"precompile": info["seconds"]}


def _gpu_arch() -> int:
    """The compute capability of the GPU, as precompile takes it (major * 10 + minor), asked in a
    subprocess so that this process holds no CUDA context."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(*torch.cuda.get_device_capability())"],
                         capture_output=True, text=True, check=True)
    major, minor = out.stdout.split()
    return int(major) * 10 + int(minor)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--V", type=int, default=151936)
    parser.add_argument("--max-num-tokens", type=int, default=256)
    parser.add_argument("--warmup", default="none")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--precompile-worker", action="store_true")
    parser.add_argument("--workers", type=int, help="warm-up processes (default: warmup's)")
    parser.add_argument("--runs", help="comma-separated indices of the processes to run (default: all)")
    parser.add_argument("--offline", action="store_true", help="per-variant compile times, no GPU needed")
    parser.add_argument("--arch", type=int, default=90, help="CUDA architecture of --offline")
    parser.add_argument("--only", default="", help="--offline: only the kernels whose name contains this")
    parser.add_argument("--stages", action="store_true", help="--offline: also each compiler stage's seconds")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.offline:
        from timing import print_table

        rows = offline_compile_times(args.V, args.max_num_tokens, args.arch, args.only, args.stages)
        rows.append(["all, one after the other", "", sum(r[2] for r in rows)])
        table = print_table(f"Compile time of each fp32 variant of warmup({args.V}), sm_{args.arch}, seconds",
                            ["kernel", "boolean constants", "s"], rows)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table + "\n")
        return
    if args.worker:
        print(json.dumps(worker(args.V, args.max_num_tokens, args.warmup, args.workers)))
        return
    if args.precompile_worker:
        print(json.dumps(precompile_worker(args.V, args.max_num_tokens, args.arch)))
        return
    from timing import environment, print_table

    processes = [  # (label, warmup, cache dir): the "cache filled" ones reuse an earlier one's cache
        ("cold, no warmup", "none", "a"),
        ("cold, warmup serial", "serial", "b"),
        ("cold, warmup parallel", "parallel", "c"),
        ("cold, warmup parallel fp32+bf16", "parallel+bf16", "d"),
        ("cache filled, no warmup", "none", "a"),
        ("cache filled, warmup parallel", "parallel", "c"),
        ("precompiled without a GPU, warmup parallel", "parallel", "e"),  # precompile(arch of the GPU) first
    ]
    if args.runs:
        processes = [processes[int(i)] for i in args.runs.split(",")]
    runs = {}
    with tempfile.TemporaryDirectory() as root:
        for label, warmup, cache in processes:
            arch = _gpu_arch() if label.startswith("precompiled") else 0
            runs[label] = run(args.V, args.max_num_tokens, warmup, os.path.join(root, cache), args.workers, arch)
            print(label, runs[label], flush=True)
    columns = ["precompile", "warmup", "warmup: forked phase"] + [f"{n} T={t} {d}" for n, t, d in FIRST_CALLS]
    rows = [[label] + [r.get(c, float("nan")) for c in columns] for label, r in runs.items()]
    out = [f"Environment: {environment()}",
           print_table(f"Cold start, V = {args.V}, max_num_tokens = {args.max_num_tokens}, seconds",
                       ["process"] + [c.replace(" float32", "").replace("bfloat16", "bf16") for c in columns], rows)]
    for label, r in runs.items():
        if "compiled after precompile" in r:
            names = r["compiled after precompile"]
            out.append(f"{label}: the GPU's process compiled {len(names)} kernel variants itself"
                       + (f" ({', '.join(names)})" if names else "") + "\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
