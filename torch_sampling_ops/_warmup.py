"""`warmup`: compiles, before the first request, every Triton kernel variant the ops will launch.

The variants of a kernel are its constexprs and compile options (which depend on the batch size
for top_k_top_p, see `truncation.plan._launch_plan`, and on the list widths for logit_bias) and Triton's
specialisation of its arguments: the logits dtype, the index dtype, whether each int argument is 1
or divisible by 16 (the vocabulary size, the row stride, the number of request slots R) and whether
each pointer is 16-byte aligned. `warmup` runs each op's launcher on uninitialised tensors of the
given shapes under `_launch.compiling_only()`, so every launch compiles (or loads from Triton's
cache) without running anything.

With `parallel`, the distinct variants are compiled by several processes (Python holds one lock a
process, and Triton's front end and passes hold it while they work): workers forked from this
process, which start at once with its modules imported, and this process, each taking the next
variant from one queue (the heaviest first) and compiling it into Triton's on-disk cache; the
workers never touch the GPU. This process then replays every launch, loading the variants from
the cache (and compiling whatever a failed worker left), and records in the cache that this set
of variants is compiled: a later warm-up of the same set (a restarted server) starts no workers,
whose start would cost more than loading the variants.

`precompile` compiles the same variants without a GPU (a server image's build), for a given CUDA
architecture, into Triton's on-disk cache: Triton's JIT is handed the target instead of asking
the driver, and the launchers run on CPU tensors, which Triton specialises as it does CUDA ones.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import time
import warnings
from collections.abc import Sequence

import torch
import triton
from triton.runtime.cache import get_cache_manager

from . import _launch, _registry
from .constraints import _KEEP_BITS_MIN_T
from .filtering import _GROUP_MIN_T
from .truncation import plan as truncation_plan
from .truncation import settings as truncation_settings


def _truncation_row_counts(vocab_size: int, max_num_tokens: int, pdl: bool) -> list[int]:
    """One batch size per distinct launch plan of top_k_top_p (its own and `sample`'s) and of
    `sample`'s row split, for T in [1, max_num_tokens]."""
    return list(_row_counts(vocab_size, max_num_tokens, pdl, truncation_settings.current_settings()))


@functools.lru_cache(maxsize=8)  # a warm-up asks twice: its variant pass and its replay
def _row_counts(vocab_size: int, max_num_tokens: int, pdl: bool, settings) -> tuple[int, ...]:
    seen, rows = set(), []
    for T in range(1, max_num_tokens + 1):
        plan = tuple((kernel, tuple(sorted(meta.items()))) for for_sample in (False, True) for kernel, _, meta in
                     truncation_plan._launch_plan(T, vocab_size, pdl, settings, group_scan=for_sample,
                                                  draw=for_sample))
        plan += (T >= settings.split_draw_max_t,)
        if plan not in seen:
            seen.add(plan)
            rows.append(T)
    return tuple(rows)


def _launch_all(vocab_size, dtypes, max_num_tokens, device, num_slots, index_dtype, logit_bias_widths, max_spec_len,
                num_logprobs=(0, 20), bad_words_shape=(8, 8, 8)) -> int:
    """Runs every launcher once per variant (under compiling_only); returns the number of op calls."""
    V, R = vocab_size, num_slots
    # Token ids given to logprobs and update_output_counts: the index dtype, and int64 (sample's tokens).
    token_dtypes = sorted({index_dtype, torch.int64}, key=str)
    # Batch sizes of each of Triton's specialisations of an int argument (1, divisible by 16, other),
    # for the kernels that take T as one.
    specialised_rows = [T for T in (1, 2, 16) if T <= max_num_tokens]
    words = (V + 31) // 32
    run = _registry.triton_impl

    def empty(*shape, dtype=index_dtype):
        return torch.empty(shape, dtype=dtype, device=device)

    calls = 0
    pdl = truncation_plan.uses_dependent_launches(device)
    for dtype in dtypes:
        one = empty(1, V, dtype=dtype)
        for T in sorted({1, min(max_num_tokens, _GROUP_MIN_T)}):  # the filters' one-block and grouped programs
            run("temperature")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.float32))
            run("min_p")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.float32))
            calls += 2
        run("apply_token_bitmask")(one, empty(R, words, dtype=torch.int32), empty(1))
        run("apply_token_bitmask")(one, empty(1, words, dtype=torch.int32), None)
        calls += 2
        # logit_bias's allowed lists: save, fill and restore below _KEEP_BITS_MIN_T rows, keep bits from there.
        for T in [1] + ([_KEEP_BITS_MIN_T] if max_num_tokens >= _KEEP_BITS_MIN_T else []):
            for allowed_w, bias_w, stop_w in logit_bias_widths:
                run("logit_bias")(empty(T, V, dtype=dtype), empty(T), empty(T), empty(R, allowed_w), empty(R),
                                  empty(R, bias_w), empty(R, bias_w, dtype=torch.float32), empty(R), empty(R, stop_w),
                                  empty(R), empty(R, dtype=torch.int32))
                calls += 1
        for k in num_logprobs:
            for token_dtype in token_dtypes:
                run("logprobs")(one, empty(1, dtype=token_dtype), k)
                calls += 1
        for T in _truncation_row_counts(V, max_num_tokens, pdl):
            run("top_k_top_p")(empty(T, V, dtype=dtype), empty(T), empty(R, dtype=torch.int32),
                               empty(R, dtype=torch.float32))
            # sample's filtered rows take top_k_top_p's launches in their DRAW form
            f32 = [empty(R, dtype=torch.float32) for _ in range(3)]
            run("sample")(empty(T, V, dtype=dtype), empty(T), f32[0], empty(R, dtype=torch.int32), f32[1], f32[2],
                          empty(R, dtype=torch.int64), empty(T))
            calls += 2
        mask, f32 = empty(R, words, dtype=torch.int32), empty(R, dtype=torch.float32)
        for T in specialised_rows:  # penalties takes T as an argument
            run("penalties")(empty(T, V, dtype=dtype), empty(T), mask, mask, empty(R, V, dtype=torch.int32), f32, f32,
                             f32)
            calls += 1
        W, N, L = bad_words_shape
        run("bad_words")(one, empty(1), empty(R, W), empty(R, N + 1, dtype=torch.int32), empty(R),
                         empty(R, L, dtype=torch.int32), empty(1))
        calls += 1
        # rejection_sample of one request with max_spec_len drafts, with and without draft probabilities
        n = max_spec_len
        for probs in (empty(n, V, dtype=torch.float32), None):
            run("rejection_sample")(empty(n + 1, V, dtype=dtype), empty(n), probs, empty(2, dtype=torch.int32),
                                    empty(1, dtype=torch.float32), empty(1, dtype=torch.int64), empty(1), n)
            calls += 1
    for T in specialised_rows:  # update_output_counts takes T as an argument
        for token_dtype in token_dtypes:
            run("update_output_counts")(empty(R, V, dtype=torch.int32), empty(R, words, dtype=torch.int32), empty(T),
                                        empty(T, dtype=token_dtype))
            calls += 1
    return calls


# Seconds a variant of these kernels takes to compile, roughly (the slower variants of each, on a
# 16-core host while 8 warm-up processes compile; the others take about 1 s or less): the
# processes take the heaviest first, so they end close together.
_COMPILE_WEIGHT = {"_select_kernel": 8, "_rejection_level_kernel": 3, "_scan_segments_kernel": 2,
                   "_draw_kernel": 2, "_logprobs_combine_kernel": 1.5, "_logprobs_segment_kernel": 1.2}


def _variant_key(kernel, args, meta):
    """What tells two launches' compiled variants apart: the kernel, its constants and options, and
    the launch cache's key of the arguments (`_launch._bind_args`: what Triton specialises on).
    Without that key (no extension) every launch of a kernel and meta counts as one variant: the
    final load of `warmup` compiles what the processes miss."""
    bound = _launch._bind_args(args)
    fn = getattr(kernel, "fn", kernel)
    return (fn.__module__, fn.__qualname__, repr(tuple(meta.items())), bound[0] if bound is not None else None)


def _distinct_variants(launch_args) -> list[tuple]:
    """(kernel, positional arguments, meta) of the first launch of each distinct variant that
    `_launch_all(*launch_args)` makes, in launch order (the same in every process); nothing is
    compiled or launched. The arguments hold `_launch_all`'s tensors (uninitialised)."""
    seen: set = set()
    variants: list[tuple] = []

    def first_launch(kernel, args, meta):
        key = _variant_key(kernel, args, meta)
        if key not in seen:
            seen.add(key)
            variants.append((kernel, args, meta))
        return False

    with _launch.compiling_only(first_launch):
        _launch_all(*launch_args)
    return variants


def _kernel_name(kernel) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__name__", "")


def _compile_order(variants: list[tuple]) -> list[int]:
    """Variant indices, the heaviest to compile first (weights _COMPILE_WEIGHT, else 1), then in
    launch order: processes that take the next one as they finish end close together."""
    weights = [_COMPILE_WEIGHT.get(_kernel_name(kernel), 1) for kernel, _, _ in variants]
    return sorted(range(len(variants)), key=lambda i: -weights[i])


def _take(queue: int):
    """The next variant index from the queue pipe (4 bytes a message, written before any read, so
    a read takes one whole message), None when it is empty."""
    data = os.read(queue, 4)
    return int.from_bytes(data, "little") if data else None


def _compile_variants(variants: list[tuple], queue: int, build_launchers: bool) -> None:
    """Compiles the variants whose indices it takes from `queue` into Triton's on-disk cache
    (Triton's `run(..., warmup=True)`: nothing launches, nothing is loaded on the device); with
    `build_launchers`, also builds each one's launcher (Triton 3.6 compiles a C launcher per
    signature, cached on disk too)."""
    launcher_cls = triton.runtime.driver.active.launcher_cls if build_launchers else None
    while (i := _take(queue)) is not None:
        kernel, args, meta = variants[i]
        compiled = kernel.run(*args, grid=(1,), warmup=True, **meta)
        if build_launchers and compiled is not None:
            launcher_cls(compiled.src, compiled.metadata)


def _fork_worker(variants: list[tuple], queue: int, device: torch.device, build_launchers: bool = True) -> int:
    """Forks a process that compiles the variants it takes from `queue` into Triton's cache and
    exits; returns its pid. The child inherits this process's modules and the variants' arguments,
    so it starts at once (a fresh interpreter would take seconds to import torch). It must not
    touch the GPU (a CUDA context does not survive a fork): Triton is told the device, stream and
    target instead of asking the driver, and no module is loaded."""
    active = triton.runtime.driver.active
    target = active.get_current_target()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a process with threads
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        active.get_current_device = lambda: device.index
        active.get_current_stream = lambda *_: 0
        active.get_current_target = lambda: target
        _compile_variants(variants, queue, build_launchers)
        code = 0
    finally:
        os._exit(code)


def _compile_in_processes(variants: list[tuple], workers: int, device: torch.device,
                          build_launchers: bool = True) -> int:
    """Compiles `variants` (`_distinct_variants`) into Triton's cache in `workers` processes (this
    one included, the others forked), each taking the next variant from a shared queue as it
    finishes one; returns the number of processes used (1: none compiled here). The forked ones
    also build each variant's launcher if `build_launchers`."""
    workers = min(workers, len(variants))
    if workers < 2 or not hasattr(os, "fork"):
        return 1
    queue, feed = os.pipe()
    try:
        os.write(feed, b"".join(i.to_bytes(4, "little") for i in _compile_order(variants)))
    finally:
        os.close(feed)
    pids = []
    finished = False
    try:
        for _ in range(workers - 1):
            pids.append(_fork_worker(variants, queue, device, build_launchers))
        # Compiled, not loaded: the final replay of `warmup` loads every variant and builds its launcher.
        _compile_variants(variants, queue, build_launchers=False)
        finished = True
    finally:
        # After an error here (an interrupt included) the workers are killed at once.
        _reap(pids, time.monotonic() + (_WORKER_TIMEOUT_S if finished else 0.0))
        os.close(queue)
    return workers


_MAX_WORKERS = 16  # beyond this the slowest variant alone sets the warm-up's time


def _physical_cores(cpus: Sequence[int] | None = None, sysfs: str = "/sys/devices/system/cpu") -> int:
    """The physical cores of `cpus` (default: those this process may run on): their distinct
    (package, core) pairs in Linux's CPU topology (hyperthread siblings share one core's compile
    throughput); half the logical CPUs where the topology cannot be read."""
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = os.path.join(sysfs, f"cpu{cpu}", "topology")
        try:
            with open(os.path.join(topology, "physical_package_id")) as package, \
                    open(os.path.join(topology, "core_id")) as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            return max(len(cpus) // 2, 1)
    return max(len(cores), 1)


_RECORD_FILE = "torch_sampling_ops_warmup.txt"


def _warmup_record(variants: list[tuple]):
    """The entry of Triton's cache that a parallel warm-up writes once every one of `variants` is
    compiled, so that the next one (a restarted server) loads them without starting workers. It is
    named by a hash of Triton's version, the target and each variant's key and kernel source
    (with the functions it calls): any change names another entry. Returns Triton's cache manager
    of that entry, or None where the cache cannot hold it (a read-only cache directory)."""
    digest = hashlib.sha256(repr((triton.__version__, triton.runtime.driver.active.get_current_target())).encode())
    for kernel, args, meta in variants:
        source = getattr(kernel, "cache_key", None)  # a JITFunction's (none under the interpreter)
        digest.update(repr((_variant_key(kernel, args, meta), source)).encode())
    try:
        return get_cache_manager(digest.hexdigest())  # creates the entry's directory
    except (OSError, RuntimeError):
        return None


# Seconds a worker may take in all. One that takes longer is killed (a lock that another thread held
# at the fork, which the child can never take, would otherwise hang the warm-up): the final replay
# of `warmup` compiles what it left.
_WORKER_TIMEOUT_S = 600.0


def _reap(pids: list[int], deadline: float) -> None:
    """Waits for the workers until `deadline` (time.monotonic()), then kills those still running."""
    for pid in pids:
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)


def _launch_args(vocab_size, dtypes, max_num_tokens, device, num_slots, index_dtype, logit_bias_widths, max_spec_len,
                 num_logprobs, bad_words_shape) -> tuple:
    """`_launch_all`'s arguments from warmup's or precompile's: R defaulted, the lists as tuples."""
    num_slots = max_num_tokens if num_slots is None else num_slots
    return (vocab_size, tuple(dtypes), max_num_tokens, device, num_slots, index_dtype,
            tuple(tuple(w) for w in logit_bias_widths), max_spec_len, tuple(num_logprobs), tuple(bad_words_shape))


@contextlib.contextmanager
def _compiling_for(arch: int):
    """Triton's JIT and the launch plans of this package target CUDA compute capability `arch`
    (e.g. 90) without a GPU: Triton's active driver is replaced by one that only names the target,
    device 0 and stream 0, and `truncation.plan.uses_dependent_launches` answers for `arch`."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    target = GPUTarget("cuda", arch, 32)

    class TargetOnly(CudaDriver):  # what Triton's JIT asks of the driver to compile, nothing else
        def __init__(self):
            self.get_current_device = lambda: 0
            self.get_current_stream = lambda *_: 0
            self.get_current_target = lambda: target

        @classmethod
        def is_active(cls):
            return True

    config = triton.runtime.driver
    previous = config._active
    uses_dependent_launches = truncation_plan.uses_dependent_launches
    config.set_active(TargetOnly())
    truncation_plan.uses_dependent_launches = lambda device, settings=None: arch >= 90
    try:
        yield
    finally:
        truncation_plan.uses_dependent_launches = uses_dependent_launches
        config._active = previous


def precompile(
    vocab_size: int,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    max_num_tokens: int = 256,
    *,
    arch: int = 90,
    num_slots: int | None = None,
    index_dtype: torch.dtype = torch.int32,
    logit_bias_widths: Sequence[tuple[int, int, int]] = ((1024, 1024, 128),),
    num_logprobs: Sequence[int] = (0, 20),
    max_spec_len: int = 4,
    bad_words_shape: tuple[int, int, int] = (8, 8, 8),
    workers: int | None = None,
) -> dict:
    """Compiles, without a GPU, every Triton kernel variant that `warmup` with the same arguments
    compiles on a GPU of compute capability `arch` (90: H100 and H200), into Triton's on-disk cache
    (`TRITON_CACHE_DIR`, default ~/.triton/cache): run it where a server's image is built, and the
    server's `warmup`, with the same Triton, finds the kernels compiled and only loads them (and
    builds Triton's launchers, which need the GPU's driver). Launches nothing, touches no GPU; for
    its duration Triton's active driver is one that only names the target, so no other thread of
    the process should launch Triton kernels meanwhile.

    Args: as `warmup` (`workers`: processes, this one included, default the physical cores), and
        arch: the compute capability, major * 10 + minor.

    Returns ``{"seconds": wall time, "variants": kernel variants compiled or found in the cache,
    "processes": processes that compiled}``. Under the Triton interpreter it raises `RuntimeError`
    (the interpreter compiles nothing).
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("precompile compiles for a GPU: it cannot run under TRITON_INTERPRET=1")
    start = time.perf_counter()
    cpu = torch.device("cpu")
    launch_args = _launch_args(vocab_size, dtypes, max_num_tokens, cpu, num_slots, index_dtype, logit_bias_widths,
                               max_spec_len, num_logprobs, bad_words_shape)
    with _compiling_for(arch):
        variants = _distinct_variants(launch_args)
        workers = min(_MAX_WORKERS, _physical_cores()) if workers is None else workers
        processes = _compile_in_processes(variants, workers, cpu, build_launchers=False)
        if processes == 1:
            for kernel, args, meta in variants:
                kernel.run(*args, grid=(1,), warmup=True, **meta)
    return {"seconds": time.perf_counter() - start, "variants": len(variants), "processes": processes}


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
    bad_words_shape: tuple[int, int, int] = (8, 8, 8),
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
        index_dtype: the dtype of idx_mapping, of output_lens and of the logit_bias lists and
            counts (token ids of logprobs and update_output_counts: this one and int64, the dtype
            of sample's tokens). A call with another dtype there compiles its variant then.
        logit_bias_widths: (allowed, bias, stop) list widths W of the logit_bias calls to prepare.
        num_logprobs: the num_logprobs values of the logprobs calls to prepare (its kernel is
            compiled per power of two >= num_logprobs, and once for 0).
        max_spec_len: the drafts a request proposes at most, for rejection_sample.
        bad_words_shape: (W, N, L) of the bad_words state: ids and sequences a slot, history length.
        parallel: compile the variants in forked worker processes too (where `os.fork` exists),
            unless an earlier parallel warm-up recorded the same variants as compiled; else
            compile them one after the other in this thread.
        workers: processes, this one included (default: the physical cores this process may
            run on, at most 16).

    Returns ``{"seconds": wall time, "calls": op calls made, "processes": processes that compiled}``.
    On the CPU, or under the Triton interpreter (which compiles nothing), it returns at once with
    ``calls == 0``.
    """
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return {"seconds": 0.0, "calls": 0, "processes": 0}
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    launch_args = _launch_args(vocab_size, dtypes, max_num_tokens, device, num_slots, index_dtype, logit_bias_widths,
                               max_spec_len, num_logprobs, bad_words_shape)
    processes = 1
    with torch.cuda.device(device):
        workers = min(_MAX_WORKERS, _physical_cores()) if workers is None else workers
        to_record = None  # the record to write once every variant is loaded
        if parallel and workers > 1:
            variants = _distinct_variants(launch_args)
            record = _warmup_record(variants)
            if record is None or record.get_file(_RECORD_FILE) is None:  # else the final replay only loads
                processes = _compile_in_processes(variants, workers, device)
                to_record = record
        with _launch.compiling_only():  # loads what the workers compiled; compiles anything still missing
            calls = _launch_all(*launch_args)
        if to_record is not None:
            with contextlib.suppress(OSError):  # a cache that takes no new file: no record
                to_record.put(f"{len(variants)} variants\n", _RECORD_FILE, binary=False)
    return {"seconds": time.perf_counter() - start, "calls": calls, "processes": processes}
