"""A/B of a tunable: one benchmark script's cases timed under each value of a module constant or of
a top_k_top_p setting, in one process, with the output of every value compared against the first.

    python benchmarks/ab_constants.py bench_logit_bias torch_sampling_ops.constraints._PREFETCH_KEPT=True,False
    python benchmarks/ab_constants.py bench_sample settings.gather_in_draw_min_t=128,1 --T 1,32 --cases "k=50"

NAME=V1,V2,...: `module.path.ATTR` (the attribute is reassigned and the call records cleared, as
module constants are read when a record is made) or `settings.FIELD` (the truncation settings,
through `use_settings`). Values are Python literals. For each batch size and case, every value is
timed `--rounds` times, the values alternated round by round (a drift of the machine shows as a
spread within one value): CUDA-graph µs on a GPU (`timing.bench_gpu`, the script's input sets),
else CPU µs. "same" says whether the case's output (the logits it edits in place, or what it
returns) holds the same bits as under the first value, on a copy of the first input set.

`--with NAME2=W1,W2,...` (repeatable) sets another constant or setting alongside, its i-th value
with the i-th of NAME:

    python benchmarks/ab_constants.py bench_speculative torch_sampling_ops.speculative._EXACT_BLOCK_V=1024,512 \
        --with torch_sampling_ops.speculative._EXACT_SKIP=False,True
"""
from __future__ import annotations

import ast
import contextlib
import importlib

from torch_sampling_ops import _call_cache
from torch_sampling_ops.truncation import use_settings

import timing


def parse_spec(spec: str) -> tuple[str, list]:
    """("module.ATTR" or "settings.FIELD", [values]) of NAME=V1,V2,..."""
    name, _, values = spec.partition("=")
    if not values:
        raise SystemExit(f"expected NAME=V1,V2,... got {spec!r}")
    return name, [ast.literal_eval(v) for v in values.split(",")]


@contextlib.contextmanager
def holding(name: str, value):
    """Runs the block with `name` (a module attribute or a truncation setting) set to `value`."""
    if name.startswith("settings."):
        with use_settings(**{name.removeprefix("settings."): value}):
            yield
        return
    module_name, _, attr = name.rpartition(".")
    module = importlib.import_module(module_name)
    old = getattr(module, attr)
    setattr(module, attr, value)
    _call_cache.clear()
    try:
        yield
    finally:
        setattr(module, attr, old)
        _call_cache.clear()


def main():
    parser = timing.ab_parser(__doc__, "spec", "NAME=V1,V2,...", "128,256")
    parser.add_argument("--with", dest="also", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="another constant or setting, its i-th value set with the i-th of spec")
    args = parser.parse_args()
    specs = [parse_spec(spec) for spec in [args.spec, *args.also]]
    if len({len(values) for _, values in specs}) != 1:
        raise SystemExit("every NAME=V1,V2,... needs as many values as the first")
    # each "value" below is the tuple of the specs' i-th values
    values = list(zip(*(values for _, values in specs), strict=True))
    name = " + ".join(name for name, _ in specs)
    cases, device, timer, unit = timing.ab_setup(args.script, args.cases)
    print(f"Environment: {timing.environment()}; {unit}")
    rows = []
    for T in (int(t) for t in args.T.split(",")):
        for case in cases:
            sets = [case.make(T, args.V, device, seed) for seed in range(timing.N_SETS)]
            pristine = case.make(T, args.V, device, 0)  # the timed sets of an in-place op change as it runs
            times = {v: [] for v in values}
            digests = {}
            for _ in range(args.rounds):
                for v in values:
                    with contextlib.ExitStack() as stack:
                        for (spec_name, _), value in zip(specs, v, strict=True):
                            stack.enter_context(holding(spec_name, value))
                        times[v].append(timing.time_ours(case, sets, timer))
                        digests.setdefault(v, timing.output_digest(case, pristine))
            for v in values:
                label = ", ".join(f"{spec_name}={value!r}" for (spec_name, _), value in zip(specs, v, strict=True))
                rows.append([case.name, T, label, " / ".join(f"{us:.1f}" for us in times[v]),
                             "yes" if digests[v] == digests[values[0]] else "NO"])
    timing.print_table(f"A/B of {name}, V = {args.V}", ["case", "T", "value", "µs a round", "same"], rows)


if __name__ == "__main__":
    main()
