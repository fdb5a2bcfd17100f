"""Constraint steps of logit processing, in place: `logit_bias` (allowed lists, bias, min tokens) and `apply_token_bitmask`.

logit_bias runs as two launches, so that no thread ever reads a logit another thread of the same
step is about to overwrite:

1. `_allowed_tokens_kernel` (rows with an allowed list only): one pass that decides each token's
   fate from a per-block histogram of the allowed ids and writes the whole row once; the old
   logit is read only where it is kept. No save / fill -inf / restore, so no phases to order.
2. `_bias_and_min_tokens_kernel` (one program per row): the bias scatter (all listed logits are
   read, then a barrier, then written), a barrier, then the min-tokens check, which scans the row
   for a finite logit outside the stop list (usually ending in the first block) and, if there is
   one, writes -inf over the stop ids.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._registry import define_op, launch

try:
    from . import _C
except ImportError:  # the C++ extension is not built: the CPU implementation raises when called
    _C = None

# Vocabulary tokens handled by one program of the dense kernels.
_BLOCK_V = 4096
# Largest chunk of list ids one program holds at once.
_MAX_BLOCK_IDS = 4096


def _ids_block(width: int) -> int:
    return min(max(triton.next_power_of_2(width), 16), _MAX_BLOCK_IDS)


@triton.jit
def _load_slot(idx_mapping_ptr, t, num_slots):
    """The request slot of row t, or -1 when it lies outside [0, num_slots)."""
    slot = tl.load(idx_mapping_ptr + t).to(tl.int64)
    return tl.where((slot >= 0) & (slot < num_slots), slot, -1)


@triton.jit
def _list_length(num_ptr, slot, width):
    return tl.minimum(tl.maximum(tl.load(num_ptr + slot).to(tl.int32), 0), width)


@triton.jit
def _listed_in_block(ids_row_ptr, n, v0, BLOCK_V: tl.constexpr, BLOCK_IDS: tl.constexpr):
    """Mask over tokens [v0, v0 + BLOCK_V): which of them appear in ids_row_ptr[:n]."""
    counts = tl.zeros([BLOCK_V], dtype=tl.int32)
    for i in range(0, n, BLOCK_IDS):
        k = i + tl.arange(0, BLOCK_IDS)
        local = tl.load(ids_row_ptr + k, mask=k < n, other=-1).to(tl.int64) - v0
        in_block = (k < n) & (local >= 0) & (local < BLOCK_V)
        counts += tl.histogram(tl.where(in_block, local, 0).to(tl.int32), BLOCK_V, mask=in_block)
    return counts > 0


@triton.jit
def _allowed_tokens_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, allowed_ids_ptr, allowed_stride, num_allowed_ptr,
    num_slots, vocab_size, max_allowed,
    BLOCK_V: tl.constexpr, BLOCK_IDS: tl.constexpr,
):
    t = tl.program_id(0)
    slot = _load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    n = _list_length(num_allowed_ptr, slot, max_allowed)
    if n == 0:
        return
    v0 = tl.program_id(1) * BLOCK_V
    keep = _listed_in_block(allowed_ids_ptr + slot * allowed_stride, n, v0, BLOCK_V, BLOCK_IDS)
    offs = v0 + tl.arange(0, BLOCK_V)
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    in_row = offs < vocab_size
    kept = tl.load(row_ptr + offs, mask=keep & in_row)
    tl.store(row_ptr + offs, tl.where(keep, kept, float("-inf")), mask=in_row)


@triton.jit
def _bias_and_min_tokens_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, output_lens_ptr,
    bias_ids_ptr, bias_ids_stride, bias_values_ptr, bias_values_stride, num_bias_ptr, max_bias,
    stop_ids_ptr, stop_stride, num_stop_ptr, max_stop, min_tokens_ptr,
    num_slots, vocab_size,
    BLOCK_V: tl.constexpr, BLOCK_BIAS: tl.constexpr, BLOCK_STOP: tl.constexpr,
):
    t = tl.program_id(0)
    slot = _load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride

    n_bias = _list_length(num_bias_ptr, slot, max_bias)
    for i in range(0, n_bias, BLOCK_BIAS):
        k = i + tl.arange(0, BLOCK_BIAS)
        ids = tl.load(bias_ids_ptr + slot * bias_ids_stride + k, mask=k < n_bias, other=-1)
        ok = (k < n_bias) & (ids >= 0) & (ids < vocab_size)
        bias = tl.load(bias_values_ptr + slot * bias_values_stride + k, mask=ok, other=0.0)
        biased = tl.load(row_ptr + ids, mask=ok).to(tl.float32) + bias
        # Read every listed logit before writing any: a duplicated id then gets one bias, not two.
        tl.debug_barrier()
        tl.store(row_ptr + ids, biased.to(logits_ptr.dtype.element_ty), mask=ok)
        tl.debug_barrier()

    n_stop = _list_length(num_stop_ptr, slot, max_stop)
    min_tokens = tl.load(min_tokens_ptr + slot)
    if (n_stop > 0) & (tl.load(output_lens_ptr + t) < min_tokens):
        # Mask the stop ids only if a finite logit outside the stop list survives.
        stop_row_ptr = stop_ids_ptr + slot * stop_stride
        found = 0
        v0 = 0
        while (found == 0) & (v0 < vocab_size):
            offs = v0 + tl.arange(0, BLOCK_V)
            vals = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            is_stop = _listed_in_block(stop_row_ptr, n_stop, v0, BLOCK_V, BLOCK_STOP)
            found = tl.max(((tl.abs(vals) < float("inf")) & ~is_stop).to(tl.int32), axis=0)
            v0 += BLOCK_V
        if found != 0:
            for i in range(0, n_stop, BLOCK_STOP):
                k = i + tl.arange(0, BLOCK_STOP)
                ids = tl.load(stop_row_ptr + k, mask=k < n_stop, other=-1)
                ok = (k < n_stop) & (ids >= 0) & (ids < vocab_size)
                tl.store(row_ptr + ids, tl.full([BLOCK_STOP], float("-inf"), logits_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _token_bitmask_kernel(
    logits_ptr, logits_stride, bitmask_ptr, bitmask_stride, idx_mapping_ptr, num_mask_rows, vocab_size,
    HAS_IDX_MAPPING: tl.constexpr, BLOCK_V: tl.constexpr,
):
    t = tl.program_id(0)
    if HAS_IDX_MAPPING:
        mask_row = _load_slot(idx_mapping_ptr, t, num_mask_rows)
    else:
        mask_row = t.to(tl.int64)
    if mask_row < 0:
        return
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = offs < vocab_size
    words = tl.load(bitmask_ptr + mask_row * bitmask_stride + (offs >> 5), mask=in_row, other=-1)
    banned = ((words >> (offs & 31)) & 1) == 0
    # Write-only: the logits of banned tokens are overwritten without being read.
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    tl.store(row_ptr + offs, tl.full([BLOCK_V], float("-inf"), logits_ptr.dtype.element_ty), mask=in_row & banned)


# ----------------------------------------------------------------------------------------------
# logit_bias


def _check_logit_bias(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values,
                      num_bias, stop_ids, num_stop, min_tokens) -> None:
    op = "logit_bias"
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    _checks.check_tensor(op, "output_lens", output_lens, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    _checks.check_tensor(op, "min_tokens", min_tokens, (torch.int32,), ndim=1, device=dev)
    R = min_tokens.size(0)
    if R < 1:
        raise ValueError(f"sampling.{op}: the state tensors must have R >= 1 request slots, got 'min_tokens' of shape {tuple(min_tokens.shape)}")
    _checks.check_ragged_list(op, "allowed_ids", allowed_ids, "num_allowed", num_allowed, R, dev)
    _checks.check_ragged_list(op, "bias_ids", bias_ids, "num_bias", num_bias, R, dev)
    _checks.check_tensor(op, "bias_values", bias_values, (torch.float32,), ndim=2, device=dev, shape=tuple(bias_ids.shape))
    _checks.check_ragged_list(op, "stop_ids", stop_ids, "num_stop", num_stop, R, dev)


def _check_logit_bias_values(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values,
                             num_bias, stop_ids, num_stop, min_tokens) -> None:
    op, V = "logit_bias", logits.size(1)
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_ragged_values(op, "allowed_ids", allowed_ids, num_allowed, V)
    _checks.check_ragged_values(op, "bias_ids", bias_ids, num_bias, V)
    _checks.check_ragged_values(op, "stop_ids", stop_ids, num_stop, V)


def _logit_bias_triton(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values,
                       num_bias, stop_ids, num_stop, min_tokens) -> None:
    T, V = logits.shape
    R = min_tokens.size(0)
    if T == 0:
        return
    if allowed_ids.size(1) > 0:
        launch(
            _allowed_tokens_kernel, (T, triton.cdiv(V, _BLOCK_V)),
            logits, logits.stride(0), idx_mapping, allowed_ids, allowed_ids.stride(0), num_allowed,
            R, V, allowed_ids.size(1),
            BLOCK_V=_BLOCK_V, BLOCK_IDS=_ids_block(allowed_ids.size(1)), num_warps=8,
        )
    if bias_ids.size(1) > 0 or stop_ids.size(1) > 0:
        launch(
            _bias_and_min_tokens_kernel, (T,),
            logits, logits.stride(0), idx_mapping, output_lens,
            bias_ids, bias_ids.stride(0), bias_values, bias_values.stride(0), num_bias, bias_ids.size(1),
            stop_ids, stop_ids.stride(0), num_stop, stop_ids.size(1), min_tokens,
            R, V,
            BLOCK_V=_BLOCK_V, BLOCK_BIAS=_ids_block(bias_ids.size(1)), BLOCK_STOP=_ids_block(stop_ids.size(1)),
            num_warps=8,
        )


def _logit_bias_cpu(*args) -> None:
    _C.logit_bias(*args)


logit_bias_op = define_op(
    "logit_bias(Tensor(a!) logits, Tensor idx_mapping, Tensor output_lens, Tensor allowed_ids, Tensor num_allowed, "
    "Tensor bias_ids, Tensor bias_values, Tensor num_bias, Tensor stop_ids, Tensor num_stop, Tensor min_tokens) -> ()",
    check=_check_logit_bias,
    check_values=_check_logit_bias_values,
    triton=_logit_bias_triton,
    cpu=_logit_bias_cpu,
)


def logit_bias(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    output_lens: torch.Tensor,
    allowed_ids: torch.Tensor,
    num_allowed: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    num_bias: torch.Tensor,
    stop_ids: torch.Tensor,
    num_stop: torch.Tensor,
    min_tokens: torch.Tensor,
) -> None:
    """Applies allowed-token lists, additive logit bias and min-tokens stop masking, in place.

    Per row ``t`` with request slot ``r = idx_mapping[t]``, in this order:

    1. if ``num_allowed[r] > 0``, every token not in ``allowed_ids[r, :num_allowed[r]]`` becomes -inf;
    2. ``logits[t, bias_ids[r, i]] += bias_values[r, i]`` for ``i < num_bias[r]``;
    3. if ``output_lens[t] < min_tokens[r]``, the tokens ``stop_ids[r, :num_stop[r]]`` become -inf,
       unless no finite logit would be left in the row.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride (any row stride); modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row. A row whose slot is outside ``[0, R)`` is untouched.
        output_lens: ``[T]`` int32/int64, tokens generated by the row's request before this row.
        allowed_ids, bias_ids, stop_ids: ``[R, W]`` int32/int64 ragged lists (any width ``W``, 0 included);
            ids outside ``[0, V)`` are ignored.
        num_allowed, num_bias, num_stop: ``[R]`` int32/int64 list lengths, clamped to ``[0, W]``.
        bias_values: ``[R, W_bias]`` float32. A duplicated bias id gets one of its biases.
        min_tokens: ``[R]`` int32.

    Arithmetic is float32; results are stored in the logits dtype. NaN logits stay NaN and count as not finite.
    """
    torch.ops.sampling.logit_bias(
        logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values, num_bias,
        stop_ids, num_stop, min_tokens,
    )


# ----------------------------------------------------------------------------------------------
# apply_token_bitmask


def _check_token_bitmask(logits, bitmask, idx_mapping=None) -> None:
    op = "apply_token_bitmask"
    T, V = _checks.check_logits(op, logits)
    dev = logits.device
    words = (V + 31) // 32
    rows = None if idx_mapping is not None else T
    _checks.check_tensor(op, "bitmask", bitmask, (torch.int32,), ndim=2, device=dev, shape=(rows, words))
    if idx_mapping is not None:
        _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))


def _token_bitmask_triton(logits, bitmask, idx_mapping=None) -> None:
    T, V = logits.shape
    if T == 0:
        return
    launch(
        _token_bitmask_kernel, (T, triton.cdiv(V, _BLOCK_V)),
        logits, logits.stride(0), bitmask, bitmask.stride(0), idx_mapping, bitmask.size(0), V,
        HAS_IDX_MAPPING=idx_mapping is not None, BLOCK_V=_BLOCK_V, num_warps=8,
    )


def _token_bitmask_cpu(logits, bitmask, idx_mapping=None) -> None:
    _C.apply_token_bitmask(logits, bitmask, idx_mapping)


apply_token_bitmask_op = define_op(
    "apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor? idx_mapping=None) -> ()",
    check=_check_token_bitmask,
    triton=_token_bitmask_triton,
    cpu=_token_bitmask_cpu,
)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, idx_mapping: torch.Tensor | None = None) -> None:
    """Sets to -inf, in place, every token whose bit in the row's bitmask is 0.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; modified in place.
        bitmask: int32 ``[rows, ceil(V / 32)]``; bit ``j`` of word ``w`` (LSB first) is token ``32 * w + j``.
            Bits past ``V`` are ignored.
        idx_mapping: ``[T]`` int32/int64 row of ``bitmask`` for each logits row (a row outside
            ``[0, rows)`` is untouched), or None: then ``bitmask`` has ``T`` rows, one per logits row.
    """
    torch.ops.sampling.apply_token_bitmask(logits, bitmask, idx_mapping)
