"""Compiles the top_k_top_p kernels for a Hopper GPU with the installed Triton, without a GPU, and
prints what decides their speed: registers, spills, block barriers and SASS size. A barrier inside a
streaming loop usually means Triton laid a reduction or scan out across warps.

    python3 .ci/inspect_kernels.py [--arch 90] [--sass-dir DIR]

With --sass-dir, each kernel's SASS is also written to DIR, one instruction a line without
addresses or encodings, so that two trees' kernels compare with `diff -r`. The package is imported
from the path: with PYTHONPATH=<tree> to inspect a given checkout rather than an installed copy.

Uses the ptxas and cuobjdump bundled with Triton's NVIDIA backend. Layouts differ between Triton
versions (3.6 and 3.9 laid the multi-warp scan out differently), so check with the version the
GPU runs: `pip install --target DIR triton==X` and run with PYTHONPATH=DIR.
"""
import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from torch_sampling_ops.truncation.plan import _compiled_kernels

ARGS = {"logits_ptr": "*fp32", "logits_stride": "i32", "idx_mapping_ptr": "*i32", "top_k_ptr": "*i32",
        "top_p_ptr": "*fp32", "ws_ptr": "*fp32", "ws_stride": "i32", "num_slots": "i32", "vocab_size": "i32",
        "num_segments": "i32"}
ALIGNED = ["logits_ptr", "logits_stride", "idx_mapping_ptr", "top_k_ptr", "top_p_ptr", "ws_ptr", "ws_stride",
           "vocab_size"]  # as at V = 151936: Triton specialises arguments divisible by 16
OPTIONS = ("num_warps", "maxnreg", "launch_pdl")  # compile options among a launch's keywords; the rest are constants


def inspect(kernel, constants, options, arch, tools, workdir, sass_dir=None, index=0):
    names = kernel.arg_names
    signature = {name: ARGS.get(name, "constexpr") for name in names}
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in ALIGNED}
    source = ASTSource(kernel, signature, constexprs={(names.index(c),): v for c, v in constants.items()}, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    name = kernel.fn.__name__
    ptx, cubin = os.path.join(workdir, name + ".ptx"), os.path.join(workdir, name + ".cubin")
    # The bundled ptxas may be older than the PTX ISA Triton writes; the kernels use nothing newer.
    with open(ptx, "w") as f:
        f.write(re.sub(r"^\.version \d+\.\d+", ".version 8.7", compiled.asm["ptx"], flags=re.M))
    built = subprocess.run([tools["ptxas"], "-v", f"--gpu-name=sm_{arch}a", ptx, "-o", cubin], capture_output=True,
                           text=True)
    usage = re.search(r"Used (\d+) registers", built.stderr)
    spills = re.search(r"(\d+) bytes spill stores", built.stderr)
    sass = subprocess.run([tools["cuobjdump"], "-sass", cubin], capture_output=True, text=True).stdout
    instructions = re.findall(r"/\*[0-9a-f]{4,6}\*/\s+(.*?);", sass)
    barriers = sum("BAR.SYNC" in i for i in instructions)
    label = " ".join([name] + [f"{key}={value}" for key, value in constants.items() if isinstance(value, bool)])
    if sass_dir:
        stem = f"{index:02d}_{name}"  # in the order of _compiled_kernels
        with open(os.path.join(sass_dir, stem + ".sass"), "w") as f:
            f.write("\n".join(re.sub(r"\s+", " ", i).strip() for i in instructions) + "\n")
    print(f"{label:38s} warps {options['num_warps']}  registers {usage.group(1) if usage else '?':>3s}  "
          f"spill bytes {spills.group(1) if spills else '?':>4s}  barriers {barriers:3d}  SASS {len(instructions)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--sass-dir", help="also write each kernel's SASS there, without addresses")
    args = parser.parse_args()
    arch = args.arch
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    tools = {tool: os.path.join(bin_dir, tool) for tool in ("ptxas", "cuobjdump")}
    print(f"triton {triton.__version__}, sm_{arch}")
    with tempfile.TemporaryDirectory() as workdir:
        for index, (kernel, meta) in enumerate(_compiled_kernels(151936)):  # as the op launches them at V = 151936
            options = {key: value for key, value in meta.items() if key in OPTIONS}
            constants = {key: value for key, value in meta.items() if key not in OPTIONS}
            inspect(kernel, constants, options, arch, tools, workdir, args.sass_dir, index)


if __name__ == "__main__":
    main()
