"""Builds torch_sampling_ops and its C++ CPU kernels (csrc/) against the installed torch.

Install without build isolation so the extension is compiled for the torch you run:
    pip install --no-build-isolation -e ".[test]"
"""
import glob
import os
import platform
import re

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The one place the version is written is the package's __init__.py; read it without importing the package
# (that would import torch_sampling_ops._C, which this script builds).
with open("torch_sampling_ops/__init__.py") as f:
    version = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

# A C++ extension loads only into the torch whose headers and ABI it was compiled against, so the package
# requires that torch's major.minor: `pip` then refuses to pair this build with another torch instead of
# the import failing with undefined symbols. The wheel's metadata names it (Requires-Dist: torch==2.11.*);
# any local build suffix (+cpu, +cu130) is ignored by the match.
torch_major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])



def _simd_flags() -> list[str]:
    """AVX2, FMA and F16C for ATen's vector types (at::vec) when the building x86-64 CPU has them: without
    them at::vec falls back to scalar loops. The extension is built from source where it runs; set
    TORCH_SAMPLING_OPS_AVX2=0 to build for an older CPU. -ffp-contract=off keeps the scalar code's
    rounding (no fused multiply-adds the kernels do not write), as the CPU/CUDA agreement expects."""
    if os.environ.get("TORCH_SAMPLING_OPS_AVX2", "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
    except (OSError, AttributeError):
        return []
    wanted = {"avx2", "fma", "f16c"}  # ATen's AVX2 path converts halves with F16C
    return ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-ffp-contract=off"] if wanted <= flags else []


# at::parallel_for expands OpenMP pragmas in our translation units: without -fopenmp it runs serially.
# -g0 overrides the -g that Python's build flags add: the debug information is about 99% of the library.
cpu_kernels = CppExtension(
    name="torch_sampling_ops._C",
    sources=sorted(glob.glob("csrc/*.cpp")),
    extra_compile_args={"cxx": ["-O3", "-g0", "-fopenmp", *_simd_flags()]},
    extra_link_args=["-fopenmp", "-s"],
)

setup(
    name="torch_sampling_ops",
    version=version,
    description="LLM sampling steps as torch.library custom ops: Triton on CUDA, C++ on CPU",
    license="Apache-2.0",
    packages=find_packages(include=["torch_sampling_ops", "torch_sampling_ops.*"]),
    ext_modules=[cpu_kernels],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
    install_requires=[f"torch=={torch_major_minor}.*", "triton>=3.6"],
    extras_require={"test": ["pytest", "pytest-xdist", "numpy", "ruff~=0.17.0"]},
)
