"""Seconds Triton takes to compile each kernel variant that `warmup(vocab_size)` compiles, for a
Hopper GPU and without one: where a cold start goes, measured on any machine.

    PYTHONPATH=DIR python3 .ci/compile_times.py [--vocab 151936] [--arch 90] [--stages] [--only NAME]

The launchers run as `warmup` runs them (fp32 logits, 256 rows and request slots, the default list
widths, dependent launches as on Hopper), on CPU tensors; each distinct variant, with Triton's
specialisation of the launch's values (`compile_check.kernel_source`), is then compiled one after
the other in this process, into an empty cache. `--stages` adds each compiler stage's seconds.
Triton's C launchers (one a distinct signature, compiled by gcc) are not included.
"""
import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_times_")
atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import triton  # noqa: E402
from compile_check import kernel_source, replace_launches  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402


def warmup_variants(vocab_size: int) -> list:
    """(kernel name, ASTSource, options) of each distinct variant warmup(vocab_size) compiles."""
    from torch_sampling_ops import _warmup
    from torch_sampling_ops.truncation import plan
    plan.uses_dependent_launches = lambda *args, **kwargs: True  # as on a Hopper GPU
    variants = {}

    def record(kernel, grid, *args, **meta):
        source, options = kernel_source(kernel, args, meta, specialise=True)
        key = (source.hash(), repr(sorted(options.items())))  # what Triton's cache tells apart
        variants.setdefault(key, (kernel.fn.__name__, source, options))

    replace_launches(record)
    R = 256
    _warmup._launch_all(vocab_size, (torch.float32,), R, torch.device("cpu"), R, torch.int32, ((1024, 1024, 128),), 4)
    return list(variants.values())


def time_stages():
    """Prints each compiler stage's seconds as it runs."""
    from triton.backends.nvidia.compiler import CUDABackend
    add_stages = CUDABackend.add_stages

    def timed_stages(self, stages, options, *args):
        add_stages(self, stages, options, *args)
        for name, stage in list(stages.items()):
            def timed(src, metadata, stage=stage, name=name):
                start = time.perf_counter()
                out = stage(src, metadata)
                print(f"    {name} {time.perf_counter() - start:.2f}", flush=True)
                return out
            stages[name] = timed

    CUDABackend.add_stages = timed_stages


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--stages", action="store_true", help="also each compiler stage's seconds")
    parser.add_argument("--only", default="", help="only the kernels whose name contains this")
    a = parser.parse_args()
    if a.stages:
        time_stages()
    target = GPUTarget("cuda", a.arch, 32)
    total, count = 0.0, 0
    for name, source, options in warmup_variants(a.vocab):
        if a.only not in name:
            continue
        start = time.perf_counter()
        triton.compile(source, target=target, options=options)
        seconds = time.perf_counter() - start
        total, count = total + seconds, count + 1
        constants = {source.fn.arg_names[i[0]]: v for i, v in source.constants.items() if v is not None}
        print(f"{seconds:6.2f}  {name} {options} {constants}", flush=True)
    print(f"triton {triton.__version__}, sm_{a.arch}, V = {a.vocab}: {count} variants, {total:.1f} s one after the other")


if __name__ == "__main__":
    main()
