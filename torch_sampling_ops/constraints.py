"""Constraint steps of logit processing, in place: `logit_bias` (allowed lists, bias, min tokens) and `apply_token_bitmask`.

logit_bias is one launch, one program per row. The program owns its row, so the phases below
read and overwrite the same logits only in program order: each phase ends with a CTA barrier
(`tl.debug_barrier`), and every load of data another thread wrote earlier bypasses L1 (`.cg`).

1. allowed list: the ids are OR-ed into a per-row bit scratch (zeroed first), then one pass over
   the row writes each token's fate: its old logit where listed (read only there), -inf elsewhere.
   No logit is saved, filled with -inf and restored.
2. bias: every listed logit plus its bias is gathered into a per-row scratch, then written back,
   so a duplicated id gets one of its biases.
3. min tokens: the stop logits are saved to the scratch and set to -inf; the row is scanned for a
   finite logit (the scan stops at the first one, usually in the first block); if there is none,
   the saved stop logits are written back.
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

# Vocabulary tokens one program handles per step.
_BLOCK_V = 4096
# Largest chunk of list ids one program holds at once.
_MAX_BLOCK_IDS = 2048


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
def _gather_to_scratch(row_ptr, ids_ptr, n, scratch_ptr, vocab_size, add_ptr, BLOCK: tl.constexpr, HAS_ADD: tl.constexpr):
    """scratch[i] = row[ids[i]] (+ add[i]) for i < n; ids outside [0, V) are skipped."""
    for i in range(0, n, BLOCK):
        k = i + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + k, mask=k < n, other=-1)
        ok = (k < n) & (ids >= 0) & (ids < vocab_size)
        vals = tl.load(row_ptr + ids, mask=ok, cache_modifier=".cg").to(tl.float32)
        if HAS_ADD:
            vals += tl.load(add_ptr + k, mask=ok, other=0.0)
        tl.store(scratch_ptr + k, vals, mask=ok)


@triton.jit
def _scatter_from_scratch(row_ptr, ids_ptr, n, scratch_ptr, vocab_size, BLOCK: tl.constexpr, FILL_NEG_INF: tl.constexpr):
    """row[ids[i]] = scratch[i] (or -inf) for i < n; ids outside [0, V) are skipped."""
    for i in range(0, n, BLOCK):
        k = i + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + k, mask=k < n, other=-1)
        ok = (k < n) & (ids >= 0) & (ids < vocab_size)
        if FILL_NEG_INF:
            vals = tl.full([BLOCK], float("-inf"), tl.float32)
        else:
            vals = tl.load(scratch_ptr + k, mask=ok, cache_modifier=".cg")
        tl.store(row_ptr + ids, vals.to(row_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _logit_bias_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, output_lens_ptr,
    allowed_ids_ptr, allowed_stride, num_allowed_ptr, max_allowed,
    bias_ids_ptr, bias_ids_stride, bias_values_ptr, bias_values_stride, num_bias_ptr, max_bias,
    stop_ids_ptr, stop_stride, num_stop_ptr, max_stop, min_tokens_ptr,
    bits_ptr, scratch_ptr, scratch_stride,
    num_slots, vocab_size,
    BLOCK_V: tl.constexpr, BLOCK_ALLOWED: tl.constexpr, BLOCK_BIAS: tl.constexpr, BLOCK_STOP: tl.constexpr,
):
    t = tl.program_id(0)
    slot = _load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    scratch_ptr += t.to(tl.int64) * scratch_stride

    n_allowed = _list_length(num_allowed_ptr, slot, max_allowed)
    if n_allowed > 0:
        words = (vocab_size + 31) // 32
        bits_row_ptr = bits_ptr + t.to(tl.int64) * words
        for w in range(0, words, BLOCK_V):
            offs = w + tl.arange(0, BLOCK_V)
            tl.store(bits_row_ptr + offs, tl.zeros([BLOCK_V], tl.int32), mask=offs < words)
        tl.debug_barrier()
        ids_ptr = allowed_ids_ptr + slot * allowed_stride
        for i in range(0, n_allowed, BLOCK_ALLOWED):
            k = i + tl.arange(0, BLOCK_ALLOWED)
            ids = tl.load(ids_ptr + k, mask=k < n_allowed, other=-1)
            ok = (k < n_allowed) & (ids >= 0) & (ids < vocab_size)
            tl.atomic_or(bits_row_ptr + (ids >> 5), tl.full([BLOCK_ALLOWED], 1, tl.int32) << (ids & 31), mask=ok, sem="relaxed")
        tl.debug_barrier()
        for v0 in range(0, vocab_size, BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            in_row = offs < vocab_size
            word = tl.load(bits_row_ptr + (offs >> 5), mask=in_row, other=0, cache_modifier=".cg")
            keep = ((word >> (offs & 31)) & 1) != 0
            kept = tl.load(row_ptr + offs, mask=keep & in_row)
            tl.store(row_ptr + offs, tl.where(keep, kept, float("-inf")), mask=in_row)
        tl.debug_barrier()

    n_bias = _list_length(num_bias_ptr, slot, max_bias)
    if n_bias > 0:
        bias_ids_row = bias_ids_ptr + slot * bias_ids_stride
        _gather_to_scratch(row_ptr, bias_ids_row, n_bias, scratch_ptr, vocab_size,
                           bias_values_ptr + slot * bias_values_stride, BLOCK_BIAS, True)
        tl.debug_barrier()
        _scatter_from_scratch(row_ptr, bias_ids_row, n_bias, scratch_ptr, vocab_size, BLOCK_BIAS, False)
        tl.debug_barrier()

    n_stop = _list_length(num_stop_ptr, slot, max_stop)
    if (n_stop > 0) & (tl.load(output_lens_ptr + t) < tl.load(min_tokens_ptr + slot)):
        stop_ids_row = stop_ids_ptr + slot * stop_stride
        _gather_to_scratch(row_ptr, stop_ids_row, n_stop, scratch_ptr, vocab_size, scratch_ptr, BLOCK_STOP, False)
        tl.debug_barrier()
        _scatter_from_scratch(row_ptr, stop_ids_row, n_stop, scratch_ptr, vocab_size, BLOCK_STOP, True)
        tl.debug_barrier()
        found = 0
        v0 = 0
        while (found == 0) & (v0 < vocab_size):
            offs = v0 + tl.arange(0, BLOCK_V)
            vals = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"), cache_modifier=".cg")
            found = tl.max((tl.abs(vals.to(tl.float32)) < float("inf")).to(tl.int32), axis=0)
            v0 += BLOCK_V
        if found == 0:  # masking the stops would leave no finite logit: they keep their values
            _scatter_from_scratch(row_ptr, stop_ids_row, n_stop, scratch_ptr, vocab_size, BLOCK_STOP, False)


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
    allowed = ((words >> (offs & 31)) & 1) != 0
    # A full read and write of the row: masked stores of scattered tokens would leave partly written
    # sectors, which cost the memory system more than rewriting them whole.
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    vals = tl.load(row_ptr + offs, mask=in_row)
    tl.store(row_ptr + offs, tl.where(allowed, vals, float("-inf")), mask=in_row)


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
    if T == 0 or (allowed_ids.size(1) == 0 and bias_ids.size(1) == 0 and stop_ids.size(1) == 0):
        return
    # Per-row scratch: allowed-token bits, and the gathered bias / stop logits.
    bits = logits.new_empty((T, (V + 31) // 32) if allowed_ids.size(1) > 0 else (1,), dtype=torch.int32)
    scratch = logits.new_empty((T, max(bias_ids.size(1), stop_ids.size(1), 1)), dtype=torch.float32)
    launch(
        _logit_bias_kernel, (T,),
        logits, logits.stride(0), idx_mapping, output_lens,
        allowed_ids, allowed_ids.stride(0), num_allowed, allowed_ids.size(1),
        bias_ids, bias_ids.stride(0), bias_values, bias_values.stride(0), num_bias, bias_ids.size(1),
        stop_ids, stop_ids.stride(0), num_stop, stop_ids.size(1), min_tokens,
        bits, scratch, scratch.stride(0),
        min_tokens.size(0), V,
        BLOCK_V=_BLOCK_V, BLOCK_ALLOWED=_ids_block(allowed_ids.size(1)), BLOCK_BIAS=_ids_block(bias_ids.size(1)),
        BLOCK_STOP=_ids_block(stop_ids.size(1)), num_warps=8,
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
