"""Argument validation shared by every implementation (CPU, CUDA and fake) of every op.

Checks read metadata only (dtype, device, shape, strides), so they run on the host before any
launch, cost no sync and also run under FakeTensor tracing. Value checks, which need the data,
run only when TORCH_SAMPLING_OPS_DEBUG=1 (see `debug_enabled`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


# Read once, at import: an environment lookup on every call would cost each op call more than its
# whole C++ kernel on a small input. `set_debug_checks` changes it at run time.
_DEBUG = os.environ.get("TORCH_SAMPLING_OPS_DEBUG", "0") == "1"


def debug_enabled() -> bool:
    """True when value checks are on (TORCH_SAMPLING_OPS_DEBUG=1 at import, or `set_debug_checks(True)`): ops
    then also check values, at the cost of host syncs."""
    return _DEBUG


def set_debug_checks(enabled: bool) -> None:
    """Turns the value checks of every op on or off (see `debug_enabled`)."""
    global _DEBUG
    _DEBUG = bool(enabled)
    _sync_cpu_kernels()


def _sync_cpu_kernels() -> None:
    """Tells the C++ CPU kernels (which skip the checks for metadata already checked unless debug
    checks are on) whether they are on."""
    try:
        from ._C import set_debug_checks as set_cpu
    except ImportError:  # not built: the CPU calls go through Python, which reads _DEBUG
        return
    set_cpu(_DEBUG)


_sync_cpu_kernels()


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


# The checks read `t.shape` and `t.stride()` (tuples) rather than `t.size(d)` / `t.stride(d)`:
# torch parses the dimension argument of those (an int or a name) on every call, which costs
# about twice as much as reading the whole tuple.


def check_logits(op: str, logits: torch.Tensor, name: str = "logits") -> tuple[int, int]:
    """Checks a [T, V] logits matrix with unit column stride; returns (T, V)."""
    check_tensor(op, name, logits, LOGITS_DTYPES, ndim=2, device=None)
    T, V = logits.shape
    if V == 0:
        raise ValueError(f"sampling.{op}: '{name}' must have a vocabulary of at least one token, got shape {tuple(logits.shape)}")
    return T, V


def check_tensor(
    op: str,
    name: str,
    t: object,
    dtypes: Sequence[torch.dtype],
    *,
    ndim: int,
    device: torch.device | None,
    shape: Sequence[int | None] = (),
    like: str = "logits",
) -> None:
    """Checks type, dtype, device (that of the argument `like`), rank, sizes (None: any) and a unit last stride."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"sampling.{op}: '{name}' must be a Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"sampling.{op}: '{name}' must be {_dtype_names(dtypes)}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"sampling.{op}: '{name}' must be on {device} like '{like}', got {t.device}")
    sizes = t.shape
    if len(sizes) != ndim:
        raise ValueError(f"sampling.{op}: '{name}' must have {ndim} dimension(s), got shape {tuple(sizes)}")
    for i, want in enumerate(shape):  # shape may name the leading sizes only (ndim of them at most)
        if want is not None and sizes[i] != want:
            expected = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"sampling.{op}: '{name}' must have shape {expected}, got {tuple(sizes)}")
    if sizes[-1] > 1 and t.stride()[-1] != 1:
        raise ValueError(f"sampling.{op}: '{name}' must have unit stride in its last dimension, got strides {tuple(t.stride())}")


def check_no_grad(op: str, names: Sequence[str], args: Sequence[object]) -> None:
    """Under grad mode, checks that no tensor argument (`args`, named by `names`) requires grad: the
    ops are not differentiable."""
    if not torch.is_grad_enabled():
        return
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor) and arg.requires_grad:
            name = names[i]
            raise RuntimeError(
                f"sampling.{op}: '{name}' requires grad, but the op is not differentiable; "
                f"call it under torch.no_grad() or on detached tensors")


def check_rows_do_not_overlap(op: str, name: str, t: torch.Tensor) -> None:
    """Checks that no two elements of a tensor the op writes share memory (as from `expand` or
    overlapping strides, e.g. a [T, V] matrix with row stride < V): its kernels would process them
    several times. Dimensions of size 1 do not count; the others, from the smallest stride up, must
    each step past the whole extent of the smaller ones."""
    sizes, strides = t.shape, t.stride()
    if len(sizes) == 2 and strides[1] == 1 and (sizes[0] <= 1 or strides[0] >= sizes[1]):
        return  # the usual [T, V] matrix with its rows apart: no need for the general rule below
    if t.numel() == 0:
        return
    dims = sorted(((size, abs(stride)) for size, stride in zip(t.shape, t.stride(), strict=True) if size > 1), key=lambda d: d[1])
    extent = 0  # offset of the last element spanned by the dimensions checked so far
    for size, stride in dims:
        if stride <= extent:
            raise ValueError(
                f"sampling.{op}: '{name}' is written in place, so its elements must not share memory "
                f"(an expanded or overlapping view), got shape {tuple(t.shape)} and strides {tuple(t.stride())}")
        extent += stride * (size - 1)


def check_slot_vector(op: str, name: str, t: object, dtypes: Sequence[torch.dtype], device: torch.device) -> int:
    """Checks a per-slot parameter vector [R] (R >= 1, the number of request slots); returns R."""
    check_tensor(op, name, t, dtypes, ndim=1, device=device)
    (R,) = t.shape
    if R < 1:
        raise ValueError(f"sampling.{op}: '{name}' must have R >= 1 request slots, got shape {tuple(t.shape)}")
    return R


def check_ragged_list(
    op: str, ids_name: str, ids: torch.Tensor, num_name: str, num: torch.Tensor, num_slots: int, device: torch.device
) -> None:
    """Checks a ragged per-slot list: ids [R, W] and num [R], integer."""
    check_tensor(op, ids_name, ids, INDEX_DTYPES, ndim=2, device=device, shape=(num_slots, None))
    check_tensor(op, num_name, num, INDEX_DTYPES, ndim=1, device=device, shape=(num_slots,))


def check_values(op: str, name: str, ok: torch.Tensor, expected: str) -> None:
    """Debug-mode value check: raises ValueError unless every element of `ok` is True (syncs)."""
    if not bool(ok.all()):
        raise ValueError(f"sampling.{op}: '{name}' must hold {expected} (TORCH_SAMPLING_OPS_DEBUG check)")


def check_ragged_values(op: str, ids_name: str, ids: torch.Tensor, num: torch.Tensor, vocab_size: int) -> None:
    """Debug-mode check of a ragged list: the listed ids (after clamping the counts) are in [0, V)."""
    listed = torch.arange(ids.size(1), device=ids.device) < num.unsqueeze(1)
    check_values(op, ids_name, ((ids >= 0) & (ids < vocab_size)) | ~listed, f"token ids in [0, {vocab_size})")
