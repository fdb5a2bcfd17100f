"""`warmup`: compiles, before the first request, every Triton kernel variant the ops will launch.

The variants of a kernel are its constexprs and compile options (which depend on the batch size
for top_k_top_p, see `truncation.plan._launch_plan`, and on the list widths for logit_bias) and Triton's
specialisation of its arguments: the logits dtype, the index dtype, whether each int argument is 1
or divisible by 16 (the vocabulary size, the row stride, the number of request slots R) and whether
each pointer is 16-byte aligned. `warmup` runs each op's launcher on uninitialised tensors of the
given shapes under `_launch.compiling_only()`, so every launch compiles (or loads from Triton's
cache) without running anything.

With `parallel`, the compilations run in forked child processes: one Python process compiles one
kernel at a time (Triton's front end and passes hold the interpreter lock). Triton's
`AsyncCompileMode` hands each distinct compilation (by Triton's cache key) to an executor as a
closure; `_ForkedCompiles` records them, forks children that inherit them (nothing is pickled or
imported again), each running its share, weighed by kernel, into Triton's on-disk cache, and
exits. This process then replays every launch, loading the variants from the cache (and compiling
any a failed child left). A child runs Triton's compiler alone: MLIR passes and `ptxas`, no CUDA
call, so the parent's CUDA context and threads are never used in it.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Executor, Future

import torch
import triton

from . import _launch, _registry, sampling
from .filtering import _GROUP_MIN_T, blocks_per_program
from .truncation import plan as truncation_plan


def _truncation_row_counts(vocab_size: int, max_num_tokens: int, pdl: bool) -> list[int]:
    """One batch size per distinct launch plan of top_k_top_p (its own and `sample`'s) and blocks per
    program of the filter passes, for T in [1, max_num_tokens]."""
    seen, rows = set(), []
    for T in range(1, max_num_tokens + 1):
        plan = tuple((kernel, tuple(sorted(meta.items()))) for group_scan in (False, True) for kernel, _, meta in
                     truncation_plan._launch_plan(T, vocab_size, pdl, group_scan=group_scan))
        plan += (blocks_per_program(T),)
        if plan not in seen:
            seen.add(plan)
            rows.append(T)
    return rows


def _launch_all(vocab_size, dtypes, max_num_tokens, device, num_slots, index_dtype, logit_bias_widths, max_spec_len,
                num_logprobs=(0, 20)) -> int:
    """Runs every launcher once per variant (under compiling_only); returns the number of op calls."""
    V, R = vocab_size, num_slots
    words = (V + 31) // 32
    run = _registry.triton_impl

    def empty(*shape, dtype=index_dtype):
        return torch.empty(shape, dtype=dtype, device=device)

    calls = 0
    pdl = truncation_plan._uses_pdl(device)
    for dtype in dtypes:
        one = empty(1, V, dtype=dtype)
        for T in sorted({1, min(max_num_tokens, _GROUP_MIN_T)}):  # the filters' one-block and grouped programs
            run("temperature")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.float32))
            run("min_p")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.float32))
            calls += 2
        run("apply_token_bitmask")(one, empty(R, words, dtype=torch.int32), empty(1))
        run("apply_token_bitmask")(one, empty(1, words, dtype=torch.int32), None)
        calls += 2
        for allowed_w, bias_w, stop_w in logit_bias_widths:
            run("logit_bias")(one, empty(1), empty(1), empty(R, allowed_w), empty(R), empty(R, bias_w),
                              empty(R, bias_w, dtype=torch.float32), empty(R), empty(R, stop_w), empty(R),
                              empty(R, dtype=torch.int32))
            calls += 1
        for k in num_logprobs:
            run("logprobs")(one, empty(1), k)
            calls += 1
        for T in _truncation_row_counts(V, max_num_tokens, pdl):
            run("top_k_top_p")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.int32),
                               empty(R, dtype=torch.float32))
            # sample runs min_p and top_k_top_p on a float32 [T, V] workspace of its own
            f32 = [empty(R, dtype=torch.float32) for _ in range(3)]
            run("sample")(empty(T, V, dtype=dtype), empty(T), f32[0], empty(R, dtype=torch.int32), f32[1], f32[2],
                          empty(R, dtype=torch.int64), empty(T))
            calls += 2
        if max_num_tokens >= sampling._SPLIT_MAX_T:  # sample's draw without the row split
            T = sampling._SPLIT_MAX_T
            f32 = [empty(R, dtype=torch.float32) for _ in range(3)]
            run("sample")(empty(T, V, dtype=dtype), empty(T), f32[0], empty(R, dtype=torch.int32), f32[1], f32[2],
                          empty(R, dtype=torch.int64), empty(T))
            calls += 1
        mask, f32 = empty(R, words, dtype=torch.int32), empty(R, dtype=torch.float32)
        run("penalties")(one, empty(1), mask, mask, empty(R, V, dtype=torch.int32), f32, f32, f32)
        run("bad_words")(one, empty(1), empty(R, 8), empty(R, 9, dtype=torch.int32), empty(R),
                         empty(R, 8, dtype=torch.int32), empty(1))
        calls += 2
        # rejection_sample of one request with max_spec_len drafts, with and without draft probabilities
        n = max_spec_len
        for probs in (empty(n, V, dtype=torch.float32), None):
            run("rejection_sample")(empty(n + 1, V, dtype=dtype), empty(n), probs, empty(2, dtype=torch.int32),
                                    empty(1, dtype=torch.float32), empty(1, dtype=torch.int64), empty(1), n)
            calls += 1
    run("update_output_counts")(empty(R, V, dtype=torch.int32), empty(R, words, dtype=torch.int32), empty(1), empty(1))
    return calls + 1


# Kernels that take several times as long as the others to compile (top_k_top_p's selection: its
# sort and its threshold search), weighed so when the compilations are shared out.
_COMPILE_WEIGHT = {"_select_kernel": 8}


def _share_out(weights: list[int], shares: int) -> list[list[int]]:
    """Job indices split into `shares` lists of about equal total weight: the heaviest job first,
    each to the lightest share so far."""
    loads = [0] * shares
    out = [[] for _ in range(shares)]
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        j = loads.index(min(loads))
        out[j].append(i)
        loads[j] += weights[i]
    return [sorted(share) for share in out if share]


class _CompiledElsewhere(Exception):
    """The result of a recorded compilation: it ran in a child, and its kernel is in the disk cache."""


class _ForkedCompiles(Executor):
    """An executor for `triton.AsyncCompileMode` that records each compilation submitted (with the
    weight of the kernel being launched, `kernel_name`), then `run` forks children that execute
    them, a share each, and resolves every future to `_CompiledElsewhere` (the mode, opened with
    `ignore_errors=True`, then keeps no kernel: this process loads them from the cache)."""

    def __init__(self):
        self.jobs: list[tuple] = []
        self.kernel_name = ""

    def submit(self, fn, /, *args, **kwargs):
        future = Future()
        self.jobs.append((fn, args, kwargs, future, _COMPILE_WEIGHT.get(self.kernel_name, 1)))
        return future

    def run(self, workers: int) -> int:
        """Runs the recorded jobs in up to `workers` children; returns the number of children."""
        shares = _share_out([job[4] for job in self.jobs], max(1, min(workers, len(self.jobs))))
        children = []
        for share in shares if len(self.jobs) > 0 else []:
            with warnings.catch_warnings():  # "multi-threaded process": the child uses no thread of this one
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                status = 0
                try:
                    for i in share:
                        fn, args, kwargs = self.jobs[i][:3]
                        fn(*args, **kwargs)
                except BaseException:  # this process's replay compiles whatever is missing
                    status = 1
                os._exit(status)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        for job in self.jobs:
            job[3].set_exception(_CompiledElsewhere())
        return len(children)


def _compile_in_children(launch_args, workers: int) -> int:
    """Records every compilation the launches need, runs them in forked children; returns their number."""
    jobs = _ForkedCompiles()

    def name_kernel(kernel, args, meta):
        jobs.kernel_name = getattr(kernel, "fn", kernel).__name__
        return True

    with _launch.compiling_only(name_kernel), triton.AsyncCompileMode(jobs, ignore_errors=True):
        _launch_all(*launch_args)
        return jobs.run(workers)

def warmup(
    vocab_size: int,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    max_num_tokens: int = 256,
    device: torch.device | str | None = None,
    *,
    num_slots: int | None = None,
    index_dtype: torch.dtype = torch.int32,
    logit_bias_widths: Sequence[tuple[int, int, int]] = ((1024, 1024, 128),),
    num_logprobs: Sequence[int] = (0, 20),
    max_spec_len: int = 4,
    parallel: bool = True,
    workers: int | None = None,
) -> dict:
    """Compiles every Triton kernel variant the ops launch for this vocabulary, so that a server pays
    Triton's JIT (or its disk cache load) before its first request. Launches nothing.

    Args:
        vocab_size: V, the logits width (contiguous logits rows: row stride V).
        dtypes: the logits dtypes that will be used.
        max_num_tokens: the largest batch (rows T) of one call; top_k_top_p picks its launch plan by T.
        device: the CUDA device (default: the current one).
        num_slots: R, the number of request slots of the per-slot tensors (default: max_num_tokens;
            Triton compiles R == 1 apart from R > 1).
        index_dtype: the dtype of idx_mapping and of the logit_bias lists and counts.
        logit_bias_widths: (allowed, bias, stop) list widths W of the logit_bias calls to prepare.
        num_logprobs: the num_logprobs values of the logprobs calls to prepare (its kernel is
            compiled per power of two >= num_logprobs, and once for 0).
        max_spec_len: the drafts a request proposes at most, for rejection_sample.
        parallel: compile in forked child processes (POSIX only; else one after the other here).
        workers: child processes at most (default: the CPU count, at most 32).

    Returns ``{"seconds": wall time, "calls": op calls made, "processes": child processes that
    compiled (0 without `parallel`)}``. On the CPU, or under the Triton interpreter (which compiles
    nothing), it returns at once with ``calls == 0``.
    """
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return {"seconds": 0.0, "calls": 0, "processes": 0}
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    num_slots = max_num_tokens if num_slots is None else num_slots
    start = time.perf_counter()
    launch_args = (vocab_size, tuple(dtypes), max_num_tokens, device, num_slots, index_dtype,
                   tuple(tuple(w) for w in logit_bias_widths), max_spec_len, tuple(num_logprobs))
    processes = 0
    with torch.cuda.device(device):
        workers = min(32, os.cpu_count() or 1) if workers is None else workers
        if parallel and workers > 1 and hasattr(os, "fork") and hasattr(triton, "AsyncCompileMode"):
            processes = _compile_in_children(launch_args, workers)
        with _launch.compiling_only():  # loads what the children compiled; compiles anything still missing
            calls = _launch_all(*launch_args)
    return {"seconds": time.perf_counter() - start, "calls": calls, "processes": processes}
