"""The benchmarks' tools run: benchmarks/ab_constants.py and ab_trees.py (on the CPU here)."""
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ab_constants_times_each_value_and_compares_the_outputs():
    """A row a value of the constant, each with its output compared against the first value's."""
    spec = "torch_sampling_ops.constraints._KEEP_BITS_MIN_T=80,1"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_constants.py"), "bench_logit_bias", spec,
                           "--T", "2", "--V", "3001", "--rounds", "1", "--cases", "no allowed list"],
                          capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| logit_bias")]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows), done.stdout


def test_ab_constants_sets_a_second_constant_alongside():
    """--with: a row per pair of values, the second constant's i-th value with the first's i-th."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_constants.py"), "bench_logit_bias",
                           "torch_sampling_ops.constraints._KEEP_BITS_MIN_T=80,1", "--with",
                           "torch_sampling_ops.constraints._PREFETCH_KEPT=True,False", "--T", "2", "--V", "3001",
                           "--rounds", "1", "--cases", "1024 allowed"],
                          capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| logit_bias")]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows), done.stdout
    assert "_KEEP_BITS_MIN_T=1, torch_sampling_ops.constraints._PREFETCH_KEPT=False" in rows[1]


def test_ab_trees_times_both_trees_and_compares_the_outputs(tmp_path):
    """A row a case, timed under the installed package and under a copy of its tree (given the
    installed compiled extension), which gives the same bits."""
    import torch_sampling_ops
    package = os.path.dirname(torch_sampling_ops.__file__)
    shutil.copytree(package, tmp_path / "torch_sampling_ops", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_trees.py"), "bench_logit_bias",
                           str(tmp_path), "--T", "2", "--V", "3001", "--rounds", "1", "--cases", "no allowed list"],
                          capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(tmp_path) in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| logit_bias")]
    assert len(rows) == 1 and rows[0].endswith("| yes |"), done.stdout


def test_sample_launch_breakdown_tables_each_case_with_and_without_dependent_launches(monkeypatch):
    """bench_sample's per-launch table: a row per case and launch mode, a column per kernel seen, each
    time recorded (the profiler faked: it needs a GPU)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import bench_sample

    from torch_sampling_ops.truncation.settings import current_settings

    import timing

    def fake_breakdown(fn, inputs, restore):
        # sample only reads its logits: no restoring copy (its write-back can land in the first launch)
        assert fn is bench_sample.tso.sample and inputs[0].shape == (1, 64) and not restore
        times = {"_draw_kernel": 1.0, "_scan_segments_kernel": 2.0}
        if current_settings().dependent_launches:
            times["_select_kernel"] = 4.0
        return times

    recorded = []
    monkeypatch.setattr(timing, "kernel_breakdown", fake_breakdown)
    monkeypatch.setattr(timing, "record", lambda *args: recorded.append(args))
    table = bench_sample.launch_breakdown(V=64, Ts=(1,), device="cpu")
    rows = [line for line in table.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 12  # six sample cases, each with and without dependent launches
    assert "| T | setting | launches | draw | scan_segments | select | sum |" in table
    assert rows[0] == "| 1 | greedy | dependent | 1 | 2 | 4 | 7 |" and rows[1] == "| 1 | greedy | alone | 1 | 2 | 0 | 3 |"
    assert len(recorded) == 30 and recorded[0][:2] == ("sample", "greedy; _draw_kernel; dependent")


def test_truncation_launch_breakdown_tables_each_setting(monkeypatch):
    """bench_truncation's per-launch table (the same helper): the plan's kernels as columns in order,
    a row a setting and batch size (the profiler faked)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import bench_truncation

    import timing

    def fake_breakdown(fn, inputs, restore):
        assert fn is bench_truncation.tso.top_k_top_p and inputs[0].shape == (2, 64) and restore  # edits them
        return {bench_truncation.KERNELS[-1]: 3.0, bench_truncation.KERNELS[0]: 1.0}

    recorded = []
    monkeypatch.setattr(timing, "kernel_breakdown", fake_breakdown)
    monkeypatch.setattr(timing, "record", lambda *args: recorded.append(args))
    table = bench_truncation.launch_breakdown(V=64, Ts=(2,), device="cpu")
    names = [k.strip("_").removesuffix("_kernel") for k in bench_truncation.KERNELS]
    assert f"| T | setting | {' | '.join(names)} | sum |" in table
    rows = [line for line in table.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == len(bench_truncation.SETTINGS)
    assert rows[0] == "| 2 | k=50, p=0.9 | 1 | " + "0 | " * (len(names) - 2) + "3 | 4 |"
    assert len(recorded) == 2 * len(bench_truncation.SETTINGS)


def test_launch_means_keys_a_kernel_launched_several_times_by_its_rank(monkeypatch):
    """kernel_breakdown's launches to means: one key a launch of a call, a repeated kernel's launches
    ranked (rejection_sample's levels), and calls that launch differently refused."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import timing

    first = [("_draw_kernel", 1.0), ("_level_kernel", 2.0), ("_level_kernel", 4.0)]
    second = [("_draw_kernel", 3.0), ("_level_kernel", 6.0), ("_level_kernel", 8.0)]
    means = timing.launch_means(first + second, 2)
    assert list(means.items()) == [("_draw_kernel", 2.0), ("_level_kernel #1", 4.0), ("_level_kernel #2", 6.0)]
    assert [timing._launch_column(k) for k in means] == ["draw", "level #1", "level #2"]
    with pytest.raises(ValueError, match="equal calls"):
        timing.launch_means(first + second[:2], 2)
    with pytest.raises(ValueError, match="launched"):
        timing.launch_means(first + second[::-1], 2)


def test_speculative_launch_breakdown_tables_each_level(monkeypatch):
    """bench_speculative's per-launch table: a column a level (the profiler faked), a row per case,
    batch size and launch mode."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import bench_speculative

    import timing

    def fake_breakdown(fn, inputs, restore):
        assert fn is bench_speculative.tso.rejection_sample and inputs[0].shape == (2 * 4, 64) and not restore
        return {f"_rejection_level_kernel #{k}": float(k) for k in range(1, 6)}

    recorded = []
    monkeypatch.setattr(timing, "kernel_breakdown", fake_breakdown)
    monkeypatch.setattr(timing, "record", lambda *args: recorded.append(args))
    table = bench_speculative.launch_breakdown(V=64, Bs=(2,), device="cpu")
    levels = " | ".join(f"rejection_level #{k}" for k in range(1, 6))
    assert f"| B | case | launches | {levels} | sum |" in table
    rows = [line for line in table.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 2 * len(bench_speculative.CASES)
    assert rows[0] == "| 2 | probs, accept 0.7 | dependent | 1 | 2 | 3 | 4 | 5 | 15 |"
    assert recorded[0][:2] == ("rejection_sample", "probs, accept 0.7; _rejection_level_kernel #1; dependent")


@pytest.mark.interpret
def test_logit_bias_must_move_table_times_each_form(monkeypatch):
    """bench_logit_bias's floor table: at each batch size the write floor and seven timed forms, each
    recorded (timer and copy bandwidth faked); its probe kernel saves the listed logits it read and
    writes -inf over the rows (with WRITE); the op's rows are not ones the probes filled with -inf."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    monkeypatch.setenv("BENCH_T", "1,2")
    import bench_logit_bias
    import torch

    import torch_sampling_ops as tso

    recorded = []

    def bench_gpu(fn, sets, graph):
        if fn is tso.logit_bias:
            assert all(torch.isfinite(inputs[0]).any(dim=1).all() for inputs in sets)
        fn(*sets[0])
        return 2.0

    monkeypatch.setattr(bench_logit_bias, "bench_gpu", bench_gpu)
    monkeypatch.setattr(bench_logit_bias, "copy_bandwidth_gbps", lambda: 1000.0)
    monkeypatch.setattr(bench_logit_bias, "record", lambda *args: recorded.append(args))
    table = bench_logit_bias.must_move_table(V=3001, chunk=1024, device="cpu")
    rows = [line for line in table.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 16 and rows[0] == "| 1 | write floor (the rows over the copy bandwidth) | 0.012 |"
    assert len(recorded) == 14 and recorded[0][:3] == ("logit_bias", "must move: fill_ (torch)", 1)

    logits = torch.randn(2, 3001)
    ids = torch.stack([torch.randperm(3001)[:40] for _ in range(2)]).to(torch.int32)
    expected = torch.gather(logits, 1, ids.long())
    saved = torch.full((2, 40), 7.0)
    # one chunk a row, so that the program's reads come before its own stores
    untouched = logits.clone()
    bench_logit_bias._fill_beside_reads_kernel[(2, 1)](logits, ids, saved, 3001, 40, CHUNK=4096, BLOCK=1024,
                                                         IDS_A_PROGRAM=64, READ=True, WRITE=False,
                                                         KEEP_READ_LINES=True)
    assert torch.equal(logits, untouched) and torch.equal(saved, expected)
    saved.fill_(7.0)
    bench_logit_bias._fill_beside_reads_kernel[(2, 1)](logits, ids, saved, 3001, 40, CHUNK=4096, BLOCK=1024,
                                                         IDS_A_PROGRAM=64, READ=True, STREAM_WRITES=True)
    assert torch.isneginf(logits).all() and torch.equal(saved, expected)


def test_host_cost_busy_times_calls_queued_behind_a_sleep(monkeypatch):
    """timing.host_cost_busy_us: each round queues a sleep long enough for its calls, then times the
    calls alone; a round whose sleep ended before its last call makes the figure NaN (the CUDA calls
    faked)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import torch

    import timing

    slept_cycles, done = [], {"value": False}

    class FakeEvent:
        def __init__(self, **kwargs):
            pass

        def record(self):
            pass

        def query(self):
            return done["value"]

    monkeypatch.setattr(torch.cuda, "_sleep", slept_cycles.append)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "_sleep_cycles_per_us", lambda: 2000.0)
    calls = []
    us = timing.host_cost_busy_us(lambda: calls.append(1), calls=10, rounds=3, budget_us=50.0)
    assert 0 < us < 1e4 and len(calls) == 20 + 3 * 10
    assert slept_cycles == [10 * 50 * 2000] * 3
    done["value"] = True
    assert math.isnan(timing.host_cost_busy_us(lambda: None, calls=10, rounds=3))


def test_cold_start_names_the_kernels_compiled_after_precompile(monkeypatch, tmp_path):
    """bench_cold_start's precompiled run lists the kernel variants the GPU's process added to the
    cache that precompile filled (the subprocesses faked: each adds a compiled kernel)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import json

    import bench_cold_start

    cache = tmp_path / "cache"

    def fake_run(command, env, **kwargs):
        assert env["TRITON_CACHE_DIR"] == str(cache)
        precompiling = "--precompile-worker" in command
        assert (env.get("CUDA_VISIBLE_DEVICES") == "") == precompiling
        entry = cache / ("A" if precompiling else "B")
        entry.mkdir(parents=True)
        (entry / ("_select_kernel.cubin" if precompiling else "_draw_kernel.cubin")).write_bytes(b"")
        (entry / "_draw_kernel.json").write_text("{}")  # not a compiled kernel's binary
        out = {"precompile": 1.0} if precompiling else {"warmup": 2.0}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(out) + "\n", stderr="")

    monkeypatch.setattr(bench_cold_start.subprocess, "run", fake_run)
    result = bench_cold_start.run(1000, 4, "parallel", str(cache), None, precompile_arch=90)
    assert result == {"precompile": 1.0, "warmup": 2.0, "compiled after precompile": ["_draw_kernel"]}
    assert bench_cold_start.compiled_kernels(str(cache)) == {("A", "_select_kernel"), ("B", "_draw_kernel")}
    assert bench_cold_start.compiled_kernels(str(tmp_path / "missing")) == set()


def test_cold_start_first_calls_are_variants_warmup_compiles(monkeypatch):
    """bench_cold_start's first fp32 calls after warmup launch only variants that warmup (with the
    benchmark's logit_bias widths) compiles, so that they time a warmed-up server's first request
    (their launches recorded on CPU tensors against warmup's variant keys; nothing compiles)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import bench_cold_start
    import torch

    from torch_sampling_ops import _launch, _warmup
    from torch_sampling_ops._registry import triton_impl

    V, R = 4099, 8
    launch_args = _warmup._launch_args(V, (torch.float32,), R, torch.device("cpu"), None, torch.int32,
                                       (bench_cold_start.LOGIT_BIAS_WIDTHS,), 4, (0, 20), (8, 8, 8))
    warm = {_warmup._variant_key(*variant) for variant in _warmup._distinct_variants(launch_args)}
    missing, calls = [], 0

    def note(kernel, args, meta):
        if _warmup._variant_key(kernel, args, meta) not in warm:
            missing.append((name, _warmup._kernel_name(kernel)))
        return False

    for name, T, dtype in bench_cold_start.FIRST_CALLS:
        if dtype == "float32":
            args = bench_cold_start._inputs(name, min(T, R), V, torch.float32, R, device="cpu")
            with _launch.compiling_only(note):
                triton_impl(name)(*args)
            calls += 1
    assert calls == 6 and not missing
