"""Constraint steps of logit processing, in place: `logit_bias` (allowed lists, bias, min tokens) and `apply_token_bitmask`.

logit_bias is one launch, grid (T, 1 + chunks): per row, one list program and, for rows with an
allowed list, one fill program per chunk of the row.

Ownership (the invariant that makes the launch free of cross-program hazards): in a row with an
allowed list, the list program alone reads and writes the listed tokens (allowed, bias and stop
ids, each in range); a fill program writes -inf to every other token of its chunk and reads no
logit. In a row without an allowed list the fill programs exit at once and the list program alone
touches the row. So no program ever reads a token that another program writes, and the
row-wide question of min-tokens is answered by the one program that owns every token it reads.

List program, phases separated by CTA barriers (`tl.debug_barrier`); loads of logits or scratch
that other threads of the program wrote earlier bypass L1 (`.cg`):
1. allowed list (if the row has one): the allowed logits are saved, the bias and stop tokens set to
   -inf, the allowed logits written back. Every listed token then holds its value after step 1.
2. bias: every biased logit is read (plus its bias) before any is written, so a duplicated id gets
   one of its biases.
3. min tokens (if active): a finite logit of a token that is not a stop is looked for among the
   allowed tokens (with an allowed list every other token is -inf or NaN) or else along the row
   (the scan stops at the first one, usually in the first block); only if one is found are the
   stops set to -inf. A short stop list is compared against the scanned tokens; a long one is
   instead set to -inf before the scan (values saved) and written back if nothing is found.
Fill program: the listed ids of its chunk are OR-ed into a bit scratch (zeroed first); then -inf is
stored to every token whose bit is clear (a write-only pass).
Lists longer than one register block stage their values in a [T, W] scratch row instead.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import _checks
from ._registry import define_op, launch
from ._triton_helpers import load_slot

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCK_V = 4096  # apply_token_bitmask: tokens per program
# logit_bias. Under TRITON_INTERPRET=1 the tests run small rows: smaller blocks, chunks and register
# blocks make them span several chunks and stage lists through the scratch.
_LB_BLOCK_V = 256 if _INTERPRET else 4096  # tokens per step of a pass over a row or a chunk
_MAX_CHUNK_BLOCKS = 8 if _INTERPRET else 4  # a fill program's chunk: at most this many blocks
# Chunks shrink (down to one block) until a launch has about this many fill programs.
_FILL_PROGRAMS = 4 if _INTERPRET else 1024
_MAX_BLOCK_IDS = 64 if _INTERPRET else 2048  # list ids one program holds in registers
_FEW_STOPS = 32  # stop lists up to this width are compared against the scanned tokens (one compare an entry)


def _ids_block(width: int) -> int:
    return min(max(triton.next_power_of_2(width), 16), _MAX_BLOCK_IDS)


def _chunk_tokens(T: int, V: int) -> int:
    """Tokens per fill program: small rows are spread over many programs, large batches take bigger chunks."""
    blocks = triton.cdiv(V, _LB_BLOCK_V)
    return min(max(T * blocks // _FILL_PROGRAMS, 1), _MAX_CHUNK_BLOCKS) * _LB_BLOCK_V


@triton.jit
def _list_length(num_ptr, slot, width):
    """num[slot] clamped to [0, width], clamped in 64 bits: an int64 count of 2**31 or more is not truncated."""
    return tl.minimum(tl.maximum(tl.load(num_ptr + slot).to(tl.int64), 0), width).to(tl.int32)


@triton.jit
def _load_listed(ids_ptr, k, n, lo, hi):
    """ids[k] and whether entry k is listed (k < n) with an id in [lo, hi)."""
    ids = tl.load(ids_ptr + k, mask=k < n, other=-1)
    return ids, (k < n) & (ids >= lo) & (ids < hi)


@triton.jit
def _save_listed(row_ptr, ids_ptr, n, lo, hi, scratch_ptr, add_ptr, BLOCK: tl.constexpr, HAS_ADD: tl.constexpr):
    """scratch[i] = row[ids[i]] (+ add[i]) for the listed ids in [lo, hi)."""
    for i in range(0, n, BLOCK):
        k = i + tl.arange(0, BLOCK)
        ids, ok = _load_listed(ids_ptr, k, n, lo, hi)
        vals = tl.load(row_ptr + ids, mask=ok, cache_modifier=".cg").to(tl.float32)
        if HAS_ADD:
            vals += tl.load(add_ptr + k, mask=ok, other=0.0)
        tl.store(scratch_ptr + k, vals, mask=ok)


@triton.jit
def _write_listed(row_ptr, ids_ptr, n, lo, hi, scratch_ptr, BLOCK: tl.constexpr, FILL_NEG_INF: tl.constexpr):
    """row[ids[i]] = scratch[i] (or -inf) for the listed ids in [lo, hi)."""
    for i in range(0, n, BLOCK):
        k = i + tl.arange(0, BLOCK)
        ids, ok = _load_listed(ids_ptr, k, n, lo, hi)
        if FILL_NEG_INF:
            vals = tl.full([BLOCK], float("-inf"), tl.float32)
        else:
            vals = tl.load(scratch_ptr + k, mask=ok, cache_modifier=".cg")
        tl.store(row_ptr + ids, vals.to(row_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _mark_listed(words_ptr, ids_ptr, n, lo, hi, BLOCK: tl.constexpr):
    """Sets bit (id - lo) of the chunk's bit scratch for every listed id in [lo, hi)."""
    for i in range(0, n, BLOCK):
        ids, ok = _load_listed(ids_ptr, i + tl.arange(0, BLOCK), n, lo, hi)
        bit = tl.full([BLOCK], 1, tl.int32) << (ids & 31).to(tl.int32)
        tl.atomic_or(words_ptr + ((ids - lo) >> 5), bit, mask=ok, sem="relaxed")


@triton.jit
def _is_listed(ids, list_ptr, n):
    """Whether each of `ids` is among list[:n] (a short list: one compare per entry)."""
    hit = tl.zeros(ids.shape, tl.int1)
    for j in range(0, n):
        hit |= ids == tl.load(list_ptr + j)
    return hit


@triton.jit
def _any_finite_listed(row_ptr, ids_ptr, n, vocab_size, except_ptr, n_except, BLOCK: tl.constexpr):
    """1 if a listed token of the row that is not in except[:n_except] holds a finite logit (NaN is not),
    else 0; stops at the first block with one."""
    found = 0
    i = 0
    while (found == 0) & (i < n):
        ids, ok = _load_listed(ids_ptr, i + tl.arange(0, BLOCK), n, 0, vocab_size)
        vals = tl.load(row_ptr + ids, mask=ok, other=float("-inf"), cache_modifier=".cg").to(tl.float32)
        finite = (tl.abs(vals) < float("inf")) & ~_is_listed(ids, except_ptr, n_except)
        found = tl.max(finite.to(tl.int32), axis=0)
        i += BLOCK
    return found


@triton.jit
def _any_finite_in_row(row_ptr, vocab_size, except_ptr, n_except, BLOCK_V: tl.constexpr):
    """1 if a token of the row that is not in except[:n_except] holds a finite logit (NaN is not), else 0;
    stops at the first block with one."""
    found = 0
    v0 = 0
    while (found == 0) & (v0 < vocab_size):
        offs = v0 + tl.arange(0, BLOCK_V)
        vals = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"), cache_modifier=".cg")
        finite = (tl.abs(vals.to(tl.float32)) < float("inf")) & ~_is_listed(offs, except_ptr, n_except)
        found = tl.max(finite.to(tl.int32), axis=0)
        v0 += BLOCK_V
    return found


@triton.jit
def _apply_lists(
    row_ptr, t, slot, output_lens_ptr,
    allowed_ptr, n_allowed, bias_ids_ptr, bias_values_ptr, n_bias, stop_ptr, n_stop, min_tokens_ptr,
    scratch_row, vocab_size,
    HAS_ALLOWED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STOP: tl.constexpr, FEW_STOPS: tl.constexpr,
    ALLOWED_IN_REGISTERS: tl.constexpr, BIAS_IN_REGISTERS: tl.constexpr, STOP_IN_REGISTERS: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_ALLOWED: tl.constexpr, BLOCK_BIAS: tl.constexpr, BLOCK_STOP: tl.constexpr,
):
    """The list program of a row: steps 1 to 3 on the listed tokens (see the module docstring)."""
    dtype = row_ptr.dtype.element_ty
    neg_inf_stops = tl.full([BLOCK_STOP], float("-inf"), dtype)
    # Lists held in registers are loaded once, up front.
    if HAS_BIAS:
        if BIAS_IN_REGISTERS:
            b_k = tl.arange(0, BLOCK_BIAS)
            b_ids, b_ok = _load_listed(bias_ids_ptr, b_k, n_bias, 0, vocab_size)
            b_add = tl.load(bias_values_ptr + b_k, mask=b_ok, other=0.0)
    if HAS_STOP:
        if STOP_IN_REGISTERS:
            s_ids, s_ok = _load_listed(stop_ptr, tl.arange(0, BLOCK_STOP), n_stop, 0, vocab_size)

    # Step 1: every listed token gets its value after the allowed list (the allowed ones already hold it).
    if HAS_ALLOWED:
        if HAS_BIAS or HAS_STOP:
            if n_allowed > 0:
                if ALLOWED_IN_REGISTERS:
                    a_ids, a_ok = _load_listed(allowed_ptr, tl.arange(0, BLOCK_ALLOWED), n_allowed, 0, vocab_size)
                    a_vals = tl.load(row_ptr + a_ids, mask=a_ok)
                else:
                    _save_listed(row_ptr, allowed_ptr, n_allowed, 0, vocab_size, scratch_row, scratch_row,
                                 BLOCK_ALLOWED, False)
                tl.debug_barrier()
                if HAS_BIAS:
                    if BIAS_IN_REGISTERS:
                        tl.store(row_ptr + b_ids, tl.full([BLOCK_BIAS], float("-inf"), dtype), mask=b_ok)
                    else:
                        _write_listed(row_ptr, bias_ids_ptr, n_bias, 0, vocab_size, scratch_row, BLOCK_BIAS, True)
                if HAS_STOP:
                    if STOP_IN_REGISTERS:
                        tl.store(row_ptr + s_ids, neg_inf_stops, mask=s_ok)
                    else:
                        _write_listed(row_ptr, stop_ptr, n_stop, 0, vocab_size, scratch_row, BLOCK_STOP, True)
                tl.debug_barrier()  # an allowed bias or stop token: the -inf above is overwritten below
                if ALLOWED_IN_REGISTERS:
                    tl.store(row_ptr + a_ids, a_vals, mask=a_ok)
                else:
                    _write_listed(row_ptr, allowed_ptr, n_allowed, 0, vocab_size, scratch_row, BLOCK_ALLOWED, False)
                tl.debug_barrier()

    # Step 2: bias.
    if HAS_BIAS:
        if BIAS_IN_REGISTERS:
            biased = tl.load(row_ptr + b_ids, mask=b_ok, cache_modifier=".cg").to(tl.float32) + b_add
            tl.debug_barrier()  # every biased logit is read before any is written
            tl.store(row_ptr + b_ids, biased.to(dtype), mask=b_ok)
        else:
            _save_listed(row_ptr, bias_ids_ptr, n_bias, 0, vocab_size, scratch_row, bias_values_ptr, BLOCK_BIAS, True)
            tl.debug_barrier()
            _write_listed(row_ptr, bias_ids_ptr, n_bias, 0, vocab_size, scratch_row, BLOCK_BIAS, False)
        tl.debug_barrier()

    # Step 3: min tokens. A short stop list is compared against the tokens scanned for a finite logit,
    # and the stops are masked once one is found; a long one is masked first (values saved), the scan
    # then skips nothing, and the stops get their values back if none is found.
    if HAS_STOP:
        if (n_stop > 0) & (tl.load(output_lens_ptr + t).to(tl.int64) < tl.load(min_tokens_ptr + slot).to(tl.int64)):
            n_except = 0
            if FEW_STOPS:
                n_except = n_stop
            else:
                if STOP_IN_REGISTERS:
                    saved = tl.load(row_ptr + s_ids, mask=s_ok, cache_modifier=".cg")
                    tl.debug_barrier()  # a duplicated stop id must not save another thread's -inf
                    tl.store(row_ptr + s_ids, neg_inf_stops, mask=s_ok)
                else:
                    _save_listed(row_ptr, stop_ptr, n_stop, 0, vocab_size, scratch_row, scratch_row, BLOCK_STOP, False)
                    tl.debug_barrier()
                    _write_listed(row_ptr, stop_ptr, n_stop, 0, vocab_size, scratch_row, BLOCK_STOP, True)
                tl.debug_barrier()
            if n_allowed > 0:  # every unlisted token is -inf, every other listed token -inf or NaN
                found = _any_finite_listed(row_ptr, allowed_ptr, n_allowed, vocab_size, stop_ptr, n_except, BLOCK_ALLOWED)
            else:
                found = _any_finite_in_row(row_ptr, vocab_size, stop_ptr, n_except, BLOCK_V)
            tl.debug_barrier()  # the scan's loads come before the stores below
            if FEW_STOPS:
                if found != 0:
                    tl.store(row_ptr + s_ids, neg_inf_stops, mask=s_ok)
            else:
                if found == 0:  # masking the stops would leave no finite logit: they keep their values
                    if STOP_IN_REGISTERS:
                        tl.store(row_ptr + s_ids, saved, mask=s_ok)
                    else:
                        _write_listed(row_ptr, stop_ptr, n_stop, 0, vocab_size, scratch_row, BLOCK_STOP, False)


@triton.jit
def _fill_unlisted(
    row_ptr, words_ptr, lo, hi, chunk_v,
    allowed_ptr, n_allowed, bias_ids_ptr, n_bias, stop_ptr, n_stop,
    HAS_BIAS: tl.constexpr, HAS_STOP: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_ALLOWED: tl.constexpr, BLOCK_BIAS: tl.constexpr, BLOCK_STOP: tl.constexpr,
):
    """A fill program: -inf to every token of [lo, hi) that no list names; reads no logit."""
    WORDS: tl.constexpr = BLOCK_V // 32
    for w0 in range(0, chunk_v // 32, WORDS):
        tl.store(words_ptr + w0 + tl.arange(0, WORDS), tl.zeros([WORDS], tl.int32))
    tl.debug_barrier()
    _mark_listed(words_ptr, allowed_ptr, n_allowed, lo, hi, BLOCK_ALLOWED)
    if HAS_BIAS:
        _mark_listed(words_ptr, bias_ids_ptr, n_bias, lo, hi, BLOCK_BIAS)
    if HAS_STOP:
        _mark_listed(words_ptr, stop_ptr, n_stop, lo, hi, BLOCK_STOP)
    tl.debug_barrier()
    for v0 in range(lo, hi, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        in_chunk = offs < hi
        word = tl.load(words_ptr + ((offs - lo) >> 5), mask=in_chunk, other=-1, cache_modifier=".cg")
        listed = ((word >> (offs & 31).to(tl.int32)) & 1) != 0
        tl.store(row_ptr + offs, tl.full([BLOCK_V], float("-inf"), row_ptr.dtype.element_ty), mask=in_chunk & ~listed)


@triton.jit
def _logit_bias_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, output_lens_ptr,
    allowed_ids_ptr, allowed_stride, num_allowed_ptr, max_allowed,
    bias_ids_ptr, bias_ids_stride, bias_values_ptr, bias_values_stride, num_bias_ptr, max_bias,
    stop_ids_ptr, stop_stride, num_stop_ptr, max_stop, min_tokens_ptr,
    bits_ptr, chunk_v, scratch_ptr, scratch_stride, num_slots, vocab_size,
    HAS_ALLOWED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STOP: tl.constexpr, FEW_STOPS: tl.constexpr,
    STAGED: tl.constexpr,
    ALLOWED_IN_REGISTERS: tl.constexpr, BIAS_IN_REGISTERS: tl.constexpr, STOP_IN_REGISTERS: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_ALLOWED: tl.constexpr, BLOCK_BIAS: tl.constexpr, BLOCK_STOP: tl.constexpr,
):
    """Program (t, 0): the list program of row t; program (t, 1 + c): the fill program of chunk c."""
    t = tl.program_id(0)
    part = tl.program_id(1)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot >= 0:
        row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
        n_allowed = 0
        if HAS_ALLOWED:
            n_allowed = _list_length(num_allowed_ptr, slot, max_allowed)
        n_bias = 0
        if HAS_BIAS:
            n_bias = _list_length(num_bias_ptr, slot, max_bias)
        n_stop = 0
        if HAS_STOP:
            n_stop = _list_length(num_stop_ptr, slot, max_stop)
        allowed_ptr = allowed_ids_ptr + slot * allowed_stride
        ids_ptr = bias_ids_ptr + slot * bias_ids_stride
        stop_ptr = stop_ids_ptr + slot * stop_stride
        if part == 0:
            scratch_row = scratch_ptr
            if STAGED:
                scratch_row = scratch_ptr + t.to(tl.int64) * scratch_stride
            _apply_lists(
                row_ptr, t, slot, output_lens_ptr,
                allowed_ptr, n_allowed, ids_ptr, bias_values_ptr + slot * bias_values_stride, n_bias,
                stop_ptr, n_stop, min_tokens_ptr,
                scratch_row, vocab_size,
                HAS_ALLOWED, HAS_BIAS, HAS_STOP, FEW_STOPS, ALLOWED_IN_REGISTERS, BIAS_IN_REGISTERS,
                STOP_IN_REGISTERS, BLOCK_V, BLOCK_ALLOWED, BLOCK_BIAS, BLOCK_STOP,
            )
        elif HAS_ALLOWED:
            if n_allowed > 0:
                chunk = part - 1
                lo = chunk.to(tl.int64) * chunk_v
                words_ptr = bits_ptr + (t.to(tl.int64) * (tl.num_programs(1) - 1) + chunk) * (chunk_v // 32)
                _fill_unlisted(
                    row_ptr, words_ptr, lo, tl.minimum(lo + chunk_v, vocab_size), chunk_v,
                    allowed_ptr, n_allowed, ids_ptr, n_bias, stop_ptr, n_stop,
                    HAS_BIAS, HAS_STOP, BLOCK_V, BLOCK_ALLOWED, BLOCK_BIAS, BLOCK_STOP,
                )


@triton.jit
def _token_bitmask_kernel(
    logits_ptr, logits_stride, bitmask_ptr, bitmask_stride, idx_mapping_ptr, num_mask_rows, vocab_size,
    HAS_IDX_MAPPING: tl.constexpr, BLOCK_V: tl.constexpr,
):
    t = tl.program_id(0)
    if HAS_IDX_MAPPING:
        mask_row = load_slot(idx_mapping_ptr, t, num_mask_rows)
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
    R = _checks.check_slot_vector(op, "min_tokens", min_tokens, (torch.int32,), dev)
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
    allowed_w, bias_w, stop_w = allowed_ids.size(1), bias_ids.size(1), stop_ids.size(1)
    if T == 0 or allowed_w == bias_w == stop_w == 0:
        return
    # Scratch: listed-token bits per (row, chunk) for the fill programs; values of lists too long for registers.
    chunk_v = _chunk_tokens(T, V)
    chunks = triton.cdiv(V, chunk_v) if allowed_w > 0 else 0
    bits = logits.new_empty((T * chunks * (chunk_v // 32),), dtype=torch.int32) if chunks > 0 else None
    staged_w = max((w for w in (allowed_w, bias_w, stop_w) if w > _MAX_BLOCK_IDS), default=0)
    scratch = logits.new_empty((T, staged_w), dtype=torch.float32) if staged_w > 0 else None
    launch(
        _logit_bias_kernel, (T, 1 + chunks),
        logits, logits.stride(0), idx_mapping, output_lens,
        allowed_ids, allowed_ids.stride(0), num_allowed, allowed_w,
        bias_ids, bias_ids.stride(0), bias_values, bias_values.stride(0), num_bias, bias_w,
        stop_ids, stop_ids.stride(0), num_stop, stop_w, min_tokens,
        bits, chunk_v, scratch, staged_w, R, V,
        HAS_ALLOWED=allowed_w > 0, HAS_BIAS=bias_w > 0, HAS_STOP=stop_w > 0,
        FEW_STOPS=stop_w <= _FEW_STOPS, STAGED=staged_w > 0,
        ALLOWED_IN_REGISTERS=allowed_w <= _MAX_BLOCK_IDS, BIAS_IN_REGISTERS=bias_w <= _MAX_BLOCK_IDS,
        STOP_IN_REGISTERS=stop_w <= _MAX_BLOCK_IDS,
        BLOCK_V=_LB_BLOCK_V, BLOCK_ALLOWED=_ids_block(allowed_w), BLOCK_BIAS=_ids_block(bias_w),
        BLOCK_STOP=_ids_block(stop_w), num_warps=8,
    )


@define_op(
    mutates_args=("logits",), check=_check_logit_bias, check_values=_check_logit_bias_values, triton=_logit_bias_triton,
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



@define_op(mutates_args=("logits",), check=_check_token_bitmask, triton=_token_bitmask_triton)
def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, idx_mapping: torch.Tensor | None = None) -> None:
    """Sets to -inf, in place, every token whose bit in the row's bitmask is 0.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; modified in place.
        bitmask: int32 ``[rows, ceil(V / 32)]``; bit ``j`` of word ``w`` (LSB first) is token ``32 * w + j``.
            Bits past ``V`` are ignored.
        idx_mapping: ``[T]`` int32/int64 row of ``bitmask`` for each logits row (a row outside
            ``[0, rows)`` is untouched), or None: then ``bitmask`` has ``T`` rows, one per logits row.
    """
