"""Backends every op test runs on, and shared input builders.

Backends: "cpu" (the C++ kernels through torch.ops.sampling), "interpret" (the Triton kernels on
CPU tensors under TRITON_INTERPRET=1, set here when no GPU is present, before triton is imported),
and "cuda" (the Triton kernels through torch.ops.sampling, marked `cuda`: `pytest -m cuda`). Tests
marked `cuda` or `interpret` are skipped where that backend is missing. Also here: the shared
backend x dtype x shape matrix, and the tolerance table.
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

import pytest  # noqa: E402

import torch_sampling_ops  # noqa: E402,F401  (registers the ops)
from torch_sampling_ops import _call_cache  # noqa: E402
from torch_sampling_ops._registry import triton_impl  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The one place the `cuda` and `interpret` markers turn into skips."""
    skips = {"cuda": (HAS_CUDA, "needs CUDA"), "interpret": (INTERPRET, "needs TRITON_INTERPRET=1 (no GPU)")}
    for item in items:
        for marker, (available, reason) in skips.items():
            if not available and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))


BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("interpret", id="interpret", marks=pytest.mark.interpret),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]
# Backends that go through the dispatcher (opcheck, torch.compile, CUDA graphs).
OP_BACKENDS = [p for p in BACKENDS if p.values[0] != "interpret"]
# Backends that run the Triton kernels.
TRITON_BACKENDS = [p for p in BACKENDS if p.values[0] != "cpu"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROWS = [1, 3, 37]
VOCABS = [1000, 4096, 5003]  # below, at and past one 4096-token block


def over_backends_dtypes_and_shapes(test):
    """Parametrizes `test(backend, dtype, T, V, ...)` over the shared matrix: BACKENDS x DTYPES x ROWS x VOCABS."""
    for name, values in [("V", VOCABS), ("T", ROWS), ("dtype", DTYPES), ("backend", BACKENDS)]:
        test = pytest.mark.parametrize(name, values, ids=str if name == "dtype" else None)(test)
    return test


# (atol, rtol) of a result computed in float32 and rounded to the logits dtype, against the float64
# reference, which rounds once.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCE[dtype]


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


@pytest.fixture(autouse=True)
def _fresh_call_records():
    """Each test starts without recorded calls: tests reassign module constants that the ops'
    launchers read when a call is recorded (`torch_sampling_ops._call_cache`)."""
    _call_cache.clear()
    yield
    _call_cache.clear()


@pytest.fixture
def debug_checks():
    """`debug_checks(enabled)` turns the ops' value checks on or off for this test (the C++ CPU
    kernels follow `set_debug_checks`, not a reassigned `_checks._DEBUG`)."""
    from torch_sampling_ops import _checks
    previous = _checks.debug_enabled()
    yield _checks.set_debug_checks
    _checks.set_debug_checks(previous)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
