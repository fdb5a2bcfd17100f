"""The benchmarks' tools run: benchmarks/ab_constants.py and ab_trees.py (on the CPU here)."""
import os
import shutil
import subprocess
import sys

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
