"""Builds torch_sampling_ops and its C++ CPU kernels (csrc/) against the installed torch.

Install without build isolation so the extension is compiled for the torch you run:
    pip install --no-build-isolation -e ".[test]"
"""
import glob

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# at::parallel_for expands OpenMP pragmas in our translation units: without -fopenmp it runs serially.
cpu_kernels = CppExtension(
    name="torch_sampling_ops._C",
    sources=sorted(glob.glob("csrc/*.cpp")),
    extra_compile_args={"cxx": ["-O3", "-fopenmp"]},
    extra_link_args=["-fopenmp"],
)

setup(
    name="torch_sampling_ops",
    version="0.1.0",
    description="LLM sampling steps as torch.library custom ops: Triton on CUDA, C++ on CPU",
    packages=find_packages(include=["torch_sampling_ops", "torch_sampling_ops.*"]),
    ext_modules=[cpu_kernels],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.11", "triton>=3.6"],
    extras_require={"test": ["pytest", "numpy"]},
)
