"""Compiles, for a Hopper GPU and without one, every Triton kernel variant the ops launch on the op
table's example arguments: catches a kernel that the installed Triton cannot compile (a compiler
failure shows only where the kernel is first launched, on the GPU otherwise).

    PYTHONPATH=DIR python3 .ci/compile_check.py [--arch 90]   # DIR: `pip install --target DIR triton==X`

Each op's Triton launcher runs on CPU tensors (no interpreter) with `launch` replaced by a compile
of the kernel, its signature taken from the arguments (pointer dtypes, int widths) and its
constexprs and options from the launch. Triton's specialisation of int arguments equal to 1 or
divisible by 16 is not reproduced.
"""
import argparse
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")
POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int32: "*i32",
           torch.int64: "*i64", torch.uint8: "*u8", torch.bool: "*i1"}


def _type_of(value):
    if isinstance(value, torch.Tensor):
        return POINTER[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(type(value))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90)
    arch = parser.parse_args().arch
    import op_table

    from torch_sampling_ops import _registry
    compiled, failed = set(), []

    def compile_only(kernel, grid, *args, **meta):
        names = kernel.arg_names
        constants = {k: v for k, v in meta.items() if k not in OPTIONS}
        options = {k: v for k, v in meta.items() if k in OPTIONS}
        constexprs = {(names.index(k),): v for k, v in constants.items()}
        signature, positional = {}, iter(args)
        for i, name in enumerate(names):
            if (i,) in constexprs:
                signature[name] = "constexpr"
                continue
            value = next(positional)
            if value is None:  # an absent optional pointer: a constexpr None, as Triton specialises it
                signature[name], constexprs[(i,)] = "constexpr", None
            else:
                signature[name] = _type_of(value)
        key = (kernel.fn.__name__, tuple(sorted(signature.items())), tuple(sorted(map(str, meta.items()))))
        if key in compiled:
            return
        compiled.add(key)
        try:
            triton.compile(ASTSource(kernel, signature, constexprs=constexprs),
                           target=GPUTarget("cuda", arch, 32), options=options)
        except Exception as e:  # report every failing variant, then fail
            failed.append(f"{kernel.fn.__name__} {signature} {constants}: {str(e).splitlines()[-1][:200]}")

    _registry_launch = _registry.launch
    modules = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("torch_sampling_ops") and getattr(m, "launch", None)
               is _registry_launch]
    for module in modules:
        module.launch = compile_only
    gen = torch.Generator().manual_seed(0)
    for spec in op_table.OPS:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            args = spec.args(torch.device("cpu"), gen)
            if args[0].is_floating_point():
                args[0] = args[0].to(dtype)
            _registry.triton_impl(spec.name)(*args)
    print(f"triton {triton.__version__}, sm_{arch}: {len(compiled)} kernel variants compiled, {len(failed)} failed")
    for line in failed:
        print("FAILED", line)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
