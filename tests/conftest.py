"""Backends every op test runs on, and shared input builders.

Backends: "cpu" (the C++ kernels through torch.ops.sampling), "interpret" (the Triton kernels on
CPU tensors under TRITON_INTERPRET=1, set here when no GPU is present, before triton is imported),
and "cuda" (the Triton kernels through torch.ops.sampling, marked `cuda`: `pytest -m cuda`).
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

import pytest  # noqa: E402

import torch_sampling_ops  # noqa: E402,F401  (registers the ops)
from torch_sampling_ops._registry import triton_impl  # noqa: E402

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("interpret", id="interpret", marks=[
        pytest.mark.interpret, pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (no GPU)")]),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]),
]
# Backends that go through the dispatcher (opcheck, torch.compile, CUDA graphs).
OP_BACKENDS = [p for p in BACKENDS if p.values[0] != "interpret"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
PAD = 7  # extra columns past V in every logits buffer: row stride > V, and they must stay untouched
SENTINEL = 1234.5


def device_of(backend: str) -> torch.device:
    return torch.device("cuda" if backend == "cuda" else "cpu")


def run_op(backend: str, name: str, *args):
    """Calls op `name` on `backend`: the dispatcher for cpu/cuda, the Triton body for interpret."""
    if backend == "interpret":
        return triton_impl(name)(*args)
    return getattr(torch.ops.sampling, name)(*args)


def make_logits(T: int, V: int, dtype: torch.dtype, device, *, generator=None, scale: float = 3.0):
    """Random logits [T, V] viewed in a [T, V + PAD] buffer whose pad columns hold SENTINEL."""
    buf = torch.full((T, V + PAD), SENTINEL, dtype=dtype)
    buf[:, :V] = (torch.randn(T, V, generator=generator) * scale).to(dtype)
    buf = buf.to(device)
    return buf[:, :V]


def logits_past_2_pow_31(V: int = 151936) -> torch.Tensor:
    """Random fp16 CUDA logits [T, V] with T * V > 2**31: the last rows lie past 32-bit element offsets."""
    return torch.randn(2**31 // V + 2, V, device="cuda", dtype=torch.float16)


def assert_pad_untouched(logits: torch.Tensor) -> None:
    """Checks the columns past V of a make_logits buffer were not written."""
    T, V = logits.shape
    full = logits.as_strided((T, V + PAD), (logits.stride(0), 1))
    assert bool((full[:, V:] == SENTINEL).all()), "an op wrote past the end of a logits row"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
