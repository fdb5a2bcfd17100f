"""A/B of two trees of the package: one benchmark script's cases timed with the installed package
and with another tree of it (the commit before a change, say), in fresh processes alternated round
by round, with each case's output compared against the installed tree's.

    git archive HEAD~1 torch_sampling_ops | tar -x -C /tmp/before
    python benchmarks/ab_trees.py bench_truncation /tmp/before --T 1,32,256 --cases "p=0.9"

For a change that no module constant can switch (ab_constants.py's case). The other tree is
imported through PYTHONPATH; a tree without the compiled extension gets a copy of the installed
one (so the two trees must share their C++ sources). Each process compiles its own kernels (Triton's
cache keeps them between rounds). CUDA-graph µs on a GPU, else CPU µs; "same" says whether the
case's output holds the same bits under both trees, on the first input set.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

_RESULT = "AB_TREES_RESULT "


def measure(script: str, Ts: list[int], V: int, cases: str) -> dict:
    """{"case T=..": [µs, output digest]} of the package this process imports."""

    import timing

    selected, device, timer, _ = timing.ab_setup(script, cases)
    results = {}
    for T in Ts:
        for case in selected:
            sets = [case.make(T, V, device, seed) for seed in range(timing.N_SETS)]
            pristine = case.make(T, V, device, 0)  # the timed sets of an in-place op change as it runs
            results[f"{case.name}, T = {T}"] = [timing.time_ours(case, sets, timer), timing.output_digest(case, pristine)]
    return results


def with_extension(tree: str) -> str:
    """`tree`, its package given a copy of the installed compiled extension if it has none."""
    import torch_sampling_ops

    package = os.path.join(tree, "torch_sampling_ops")
    if not os.path.isdir(package):
        raise SystemExit(f"{tree} holds no torch_sampling_ops package")
    if not glob.glob(os.path.join(package, "_C*")):
        for built in glob.glob(os.path.join(os.path.dirname(torch_sampling_ops.__file__), "_C*")):
            shutil.copy2(built, package)
    return tree


def run_tree(args, tree: str | None) -> dict:
    """measure() in a fresh process importing `tree` (None: the installed package); checks that the
    process imported the package from that tree."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(tree), env.get("PYTHONPATH")]))
    command = [sys.executable, os.path.abspath(__file__), args.script, args.tree, "--worker", "--T", args.T,
               "--V", str(args.V), "--cases", args.cases]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    lines = [line for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the process of tree {tree or 'installed'} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    run = json.loads(lines[0].removeprefix(_RESULT))
    if tree is not None and os.path.realpath(run["package"]) != os.path.realpath(os.path.join(tree, "torch_sampling_ops")):
        raise SystemExit(f"the process of tree {tree} imported {run['package']}")
    return run["results"]


def main():
    import timing

    parser = timing.ab_parser(__doc__, "tree", "a directory holding the other tree's torch_sampling_ops package", "1,32,256")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import torch_sampling_ops

        results = measure(args.script, [int(t) for t in args.T.split(",")], args.V, args.cases)
        print(_RESULT + json.dumps({"package": os.path.dirname(torch_sampling_ops.__file__), "results": results}))
        return
    import torch

    other = with_extension(args.tree)
    runs = {"installed": [], "other": []}
    for _ in range(args.rounds):
        runs["installed"].append(run_tree(args, None))
        runs["other"].append(run_tree(args, other))
    print(f"Environment: {timing.environment()}; installed tree against {os.path.abspath(other)}")
    rows = [[key, " / ".join(f"{run[key][0]:.1f}" for run in runs["installed"]),
             " / ".join(f"{run[key][0]:.1f}" for run in runs["other"]),
             "yes" if runs["other"][0][key][1] == value[1] else "NO"]
            for key, value in runs["installed"][0].items()]
    unit = "CUDA graph µs" if torch.cuda.is_available() else "CPU µs"
    timing.print_table(f"A/B of two trees, V = {args.V}, {unit} a round", ["case", "installed", "other", "same"], rows)


if __name__ == "__main__":
    main()
