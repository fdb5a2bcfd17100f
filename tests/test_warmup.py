"""torch_sampling_ops.warmup: it reaches every kernel variant the ops launch, and (on CUDA) the ops
then compile nothing more."""
import os
import time
import types

import pytest
import torch
import triton
from triton.runtime.jit import JITFunction

import torch_sampling_ops
from torch_sampling_ops import _launch, _warmup, constraints, filtering, history, sampling, speculative
from torch_sampling_ops.truncation import plan, scan, select

from conftest import HAS_CUDA, INTERPRET


def _record_launches(monkeypatch):
    launched = []
    monkeypatch.setattr(_launch, "launch", lambda kernel, grid, args, meta: launched.append((kernel, meta)))
    return launched


def test_warmup_is_a_no_op_without_a_gpu_compiler():
    if INTERPRET or not HAS_CUDA:
        assert torch_sampling_ops.warmup(1000, device="cpu")["calls"] == 0


def test_warmup_covers_every_top_k_top_p_variant(monkeypatch):
    launched = _record_launches(monkeypatch)
    V = 1000
    _warmup._launch_all(V, (torch.float32, torch.bfloat16), 256, torch.device("cpu"), 4, torch.int32, ((8, 6, 3),), 3)
    seen = {(kernel, tuple(sorted(meta.items()))) for kernel, meta in launched}
    for kernel, meta in plan._compiled_kernels(V, pdl=False):
        assert (kernel, tuple(sorted(meta.items()))) in seen, kernel
    kernels = {kernel for kernel, _ in launched}
    for module in (constraints, filtering, history, sampling, speculative, scan, select):
        for name, obj in vars(module).items():
            if name in ("_random_stream_kernel", "_gumbel_noise_kernel"):
                continue  # kernels of the tests only
            if name == "_allowed_lines_kernel" and not constraints._KEPT_LINES_FIRST \
                    and constraints._SAVE_LAUNCH_MIN_T > 2**31:
                continue  # the launch of two A/B forms that are off
            if name.endswith("_kernel") and hasattr(obj, "run"):
                assert obj in kernels, f"warmup never launches {name}"


def test_warmup_launches_every_variant_the_ops_launch():
    """Each variant the ops launch at batch sizes across the large-batch thresholds and across
    Triton's specialisations of an int (1, divisible by 16, other) is one that warmup launches: the
    kernel, its constants and the specialisation of its arguments (warmup's variant key; launches
    recorded, nothing compiles or runs)."""
    V, R, dtype = 3001, 4, torch.float16
    launch_args = (V, (dtype,), 300, torch.device("cpu"), R, torch.int32, ((8, 6, 3),), 4)
    warm = {_warmup._variant_key(*variant) for variant in _warmup._distinct_variants(launch_args)}
    missing = set()

    def note(kernel, args, meta):
        if _warmup._variant_key(kernel, args, meta) not in warm:
            missing.add((_warmup._kernel_name(kernel), T))
        return False

    run = torch_sampling_ops._registry.triton_impl
    words = (V + 31) // 32
    i32 = dict(dtype=torch.int32)
    f32, slots_i32, mask = torch.full((R,), 0.5), torch.zeros(R, **i32), torch.zeros(R, words, **i32)
    for T in (1, 2, 16, 31, 32, 40, 63, 64, 127, 128, 130, 200, 256, 300):
        x, idx = torch.randn(T, V).to(dtype), torch.zeros(T, **i32)
        with _launch.compiling_only(note):
            run("temperature")(x, idx, f32)
            run("min_p")(x, idx, f32)
            run("top_k_top_p")(x, idx, torch.full((R,), 20, **i32), f32)
            run("sample")(x, idx, f32, torch.full((R,), 20, **i32), f32, f32, torch.arange(R), torch.arange(T, **i32))
            for tokens in (idx, idx.long()):  # token ids as given, and as sample returns them
                run("logprobs")(x, tokens, 20)
                run("update_output_counts")(torch.zeros(R, V, **i32), mask.clone(), idx, tokens)
            run("apply_token_bitmask")(x, mask, idx)
            run("apply_token_bitmask")(x, torch.zeros(T, words, **i32), None)
            run("logit_bias")(x, idx, idx, torch.zeros(R, 8, **i32), slots_i32, torch.zeros(R, 6, **i32),
                              torch.zeros(R, 6), slots_i32, torch.zeros(R, 3, **i32), slots_i32, slots_i32)
            run("penalties")(x, idx, mask, mask, torch.zeros(R, V, **i32), f32, f32, f32)
            run("bad_words")(x, idx, torch.zeros(R, 8, **i32), torch.zeros(R, 9, **i32), slots_i32,
                             torch.zeros(R, 8, **i32), idx)
    assert not missing, sorted(missing)


def test_small_batches_skip_large_batch_variants(monkeypatch):
    rows = _warmup._truncation_row_counts(1000, 8, pdl=False)
    assert rows == [1]
    rows = _warmup._truncation_row_counts(1000, 1024, pdl=False)
    assert rows[0] == 1 and len(rows) == len(set(rows)) >= 3


_LAUNCH_ARGS = (3001, (torch.float32, torch.bfloat16), 300, torch.device("cpu"), 4, torch.int32, ((8, 6, 3),), 4,
                (0, 20))


def test_variants_are_distinct_and_the_heavy_ones_go_first():
    variants = _warmup._distinct_variants(_LAUNCH_ARGS)
    names = [_warmup._kernel_name(kernel) for kernel, _, _ in variants]
    assert len(names) > 20
    keys = [_warmup._variant_key(*variant) for variant in variants]
    assert len(set(keys)) == len(keys)
    order = _warmup._compile_order(variants)
    assert sorted(order) == list(range(len(variants)))
    weights = [_warmup._COMPILE_WEIGHT.get(names[i], 1) for i in order]
    assert weights[0] == max(_warmup._COMPILE_WEIGHT.values()) and weights == sorted(weights, reverse=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers need os.fork")
def test_forked_workers_compile_every_variant_once(monkeypatch, tmp_path):
    """Every variant is compiled once, by one of the processes (this one and the forked workers,
    taking them from one queue), and the workers also build their variants' launchers; Triton is
    asked nothing of the device."""
    log = tmp_path / "compiled"

    def note(what):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")

    def run(self, *args, grid, warmup, **meta):
        assert warmup
        note(f"compile {_warmup._variant_key(self, args, meta)!r}")
        time.sleep(0.02)  # a compile
        return types.SimpleNamespace(src=None, metadata=None)

    monkeypatch.setattr(type(sampling._draw_kernel), "run", run)  # JITFunction, or interpreted
    driver = types.SimpleNamespace(launcher_cls=lambda src, metadata: note("launcher"), get_current_target=lambda: "sm")
    monkeypatch.setattr(triton.runtime.driver, "_active", driver)
    assert _warmup._compile_in_processes(_warmup._distinct_variants(_LAUNCH_ARGS), 4, torch.device("cpu")) == 4
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    compiled = [(line[0], line[2]) for line in lines if line[1] == "compile"]
    keys = [_warmup._variant_key(*variant) for variant in _warmup._distinct_variants(_LAUNCH_ARGS)]
    assert sorted(key for _, key in compiled) == sorted(repr(key) for key in keys)
    pids = {pid for pid, _ in compiled}
    assert len(pids) >= 2  # workers took some (how many each gets depends on the scheduler)
    launchers = [line[0] for line in lines if line[1] == "launcher"]
    assert sorted(launchers) == sorted(pid for pid, _ in compiled if pid != str(os.getpid()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers need os.fork")
def test_a_stuck_worker_is_killed_and_its_variants_left_to_the_caller(monkeypatch):
    """A worker that never finishes (a lock another thread held at the fork) is killed at the
    deadline; the warm-up goes on (its final replay compiles what the worker left)."""
    parent = os.getpid()

    def run(self, *args, grid, warmup, **meta):
        if os.getpid() != parent:
            time.sleep(60)
        return None

    monkeypatch.setattr(type(sampling._draw_kernel), "run", run)
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(
        launcher_cls=lambda src, metadata: None, get_current_target=lambda: "sm"))
    monkeypatch.setattr(_warmup, "_WORKER_TIMEOUT_S", 1.0)
    start = time.monotonic()
    assert _warmup._compile_in_processes(_warmup._distinct_variants(_LAUNCH_ARGS), 3, torch.device("cpu")) == 3
    assert time.monotonic() - start < 30


def test_the_warmup_record_names_the_variants_and_their_sources(monkeypatch, tmp_path):
    """The record's cache entry is the same for the same variants, and another one when a variant
    is missing, or a kernel's source or the target differs."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    target = types.SimpleNamespace(get_current_target=lambda: "sm_90")
    monkeypatch.setattr(triton.runtime.driver, "_active", target)
    variants = _warmup._distinct_variants(_LAUNCH_ARGS)
    name = _warmup._warmup_record(variants).cache_dir
    assert _warmup._warmup_record(_warmup._distinct_variants(_LAUNCH_ARGS)).cache_dir == name
    assert _warmup._warmup_record(variants[1:]).cache_dir != name
    kernel = variants[0][0]
    if isinstance(kernel, JITFunction):  # compiled kernels (the interpreter's have no source hash)
        monkeypatch.setattr(kernel, "hash", "another source")
        assert _warmup._warmup_record(variants).cache_dir != name
    monkeypatch.undo()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(get_current_target=lambda: "sm_100"))
    assert _warmup._warmup_record(variants).cache_dir != name


def test_no_record_where_the_cache_takes_no_entry(monkeypatch):
    """A cache directory that cannot take the record's entry (read-only) leaves the warm-up without
    a record: it compiles in processes as before."""
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(get_current_target=lambda: "sm_90"))

    def read_only(key):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_warmup, "get_cache_manager", read_only)
    assert _warmup._warmup_record(_warmup._distinct_variants(_LAUNCH_ARGS)) is None


def _all_kernels():
    return [obj for module in (constraints, filtering, history, sampling, speculative, scan, select) for obj in vars(module).values()
            if isinstance(obj, JITFunction)]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_after_warmup_the_ops_compile_nothing(gen, parallel):
    from test_constraints import logit_bias_state

    V, R, dtype = 3000 + (1 if parallel else 0), 4, torch.float16
    info = torch_sampling_ops.warmup(V, dtypes=(dtype,), max_num_tokens=300, num_slots=R,
                                     index_dtype=torch.int32, logit_bias_widths=((8, 6, 3),), parallel=parallel)
    assert info["calls"] > 0
    device = torch.cuda.current_device()
    cached = {k: len(k.device_caches[device][0]) for k in _all_kernels()}
    for T in (1, 31, 40, 130, 200, 300):
        logits = torch.randn(T, V, device="cuda", dtype=dtype)
        idx = torch.randint(0, R, (T,), device="cuda", dtype=torch.int32)
        torch_sampling_ops.temperature(logits, idx, torch.rand(R, device="cuda") + 0.5)
        torch_sampling_ops.min_p(logits, idx, torch.full((R,), 0.05, device="cuda"))
        bitmask = torch.full((R, (V + 31) // 32), -1, dtype=torch.int32, device="cuda")
        torch_sampling_ops.apply_token_bitmask(logits, bitmask, idx)
        torch_sampling_ops.apply_token_bitmask(logits, bitmask[:1].expand(T, -1).contiguous())
        state = logit_bias_state(T, V, R, gen, allowed_w=8, bias_w=6, stop_w=3)
        state = [s.to(device="cuda", dtype=torch.int32 if not s.is_floating_point() else s.dtype) for s in state]
        torch_sampling_ops.logit_bias(logits, *state)
        torch_sampling_ops.top_k_top_p(logits, idx, torch.full((R,), 20, dtype=torch.int32, device="cuda"),
                                       torch.full((R,), 0.9, device="cuda"))
        params = [torch.full((R,), 0.8, device="cuda"), torch.full((R,), 20, dtype=torch.int32, device="cuda"),
                  torch.full((R,), 0.9, device="cuda"), torch.full((R,), 0.05, device="cuda"),
                  torch.arange(R, device="cuda"), torch.arange(T, dtype=torch.int32, device="cuda")]
        torch_sampling_ops.sample(logits, idx, *params[:5], params[5])
        torch_sampling_ops.logprobs(logits, idx, 20)
        # rejection_sample: T requests with 0 .. 4 drafts (warmup's max_spec_len), N == 0 at T == 1
        counts = torch.randint(0, 5, (T,), generator=gen) * (T > 1)
        N = int(counts.sum())
        cu = torch.zeros(T + 1, dtype=torch.int32)
        cu[1:] = counts.cumsum(0)
        target = torch.randn(N + T, V, device="cuda", dtype=dtype)
        drafts = torch.randint(0, V, (N,), dtype=torch.int32, device="cuda")
        for probs in (torch.rand(N, V, device="cuda"), None):
            torch_sampling_ops.rejection_sample(target, drafts, probs, cu.cuda(), torch.ones(T, device="cuda"),
                                                torch.arange(T, device="cuda"),
                                                torch.zeros(T, dtype=torch.int32, device="cuda"), 4)
    torch.cuda.synchronize()
    after = {k: len(k.device_caches[device][0]) for k in _all_kernels()}
    assert after == cached, {k.fn.__name__: (cached[k], after[k]) for k in after if after[k] != cached[k]}


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_a_second_parallel_warmup_of_the_same_variants_starts_no_workers(monkeypatch):
    """The first parallel warm-up records its variants as compiled; the next one of the same
    variants (a restarted server) only loads them."""
    args = dict(vocab_size=2000, dtypes=(torch.float16,), max_num_tokens=40, num_slots=4,
                logit_bias_widths=((8, 6, 3),), parallel=True, workers=2)
    torch_sampling_ops.warmup(**args)  # compiles, or finds the record of an earlier run

    def no_workers(*_):
        raise AssertionError("a recorded set of variants started workers")

    monkeypatch.setattr(_warmup, "_compile_in_processes", no_workers)
    info = torch_sampling_ops.warmup(**args)
    assert info["processes"] == 1 and info["calls"] > 0


def test_default_workers_count_physical_cores(tmp_path):
    """warmup's default process count reads the CPU topology: hyperthread siblings (the same package
    and core id) count once, and without a readable topology half the logical CPUs count."""
    for cpu, (package, core) in {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (1, 0), 5: (1, 0)}.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert _warmup._physical_cores([0, 1, 2, 3, 5], str(tmp_path)) == 3
    assert _warmup._physical_cores([0, 1, 2, 3, 6], str(tmp_path)) == 2  # cpu 6 unreadable: 5 logical CPUs // 2
    assert 1 <= _warmup._physical_cores() <= (os.cpu_count() or 1)


_PRECOMPILE = """
import json, sys
from triton.backends.nvidia.compiler import CUDABackend
import torch_sampling_ops as tso
from torch_sampling_ops import _warmup
distinct_variants = _warmup._distinct_variants
_warmup._distinct_variants = lambda launch_args: distinct_variants(launch_args)[:12]  # the first few: seconds
compiles = []
add_stages = CUDABackend.add_stages
def counted(self, *args):
    compiles.append(1)
    return add_stages(self, *args)
CUDABackend.add_stages = counted  # Triton builds a compile's stages only for a variant not in its cache
info = tso.precompile(4096, max_num_tokens=2, workers=int(sys.argv[1]))
print(json.dumps(dict(info, compiles=len(compiles))))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the precompile's workers need os.fork")
def test_precompile_fills_the_cache_so_a_later_process_compiles_nothing(tmp_path):
    """precompile, with no GPU (and no interpreter), compiles the variants warmup makes for sm_90
    (the first dozen, for time) into TRITON_CACHE_DIR in two processes; a second process's
    precompile of the same variants finds each in the cache and compiles none."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    runs = []
    for workers in (2, 1):
        done = subprocess.run([sys.executable, "-c", _PRECOMPILE, str(workers)], env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["variants"] == second["variants"] == 12 and first["processes"] == 2
    assert 0 < first["compiles"] <= first["variants"]  # this process's share; the worker compiled the rest
    assert second["compiles"] == 0 and second["processes"] == 1


def test_precompile_refuses_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        torch_sampling_ops.precompile(1000)
