"""Constraint steps of logit processing, in place: `logit_bias` (allowed lists, bias, min tokens) and `apply_token_bitmask`.

logit_bias is two launches. In each, a program reads and overwrites logits only in a part of
the row that it alone owns, and orders its own phases with CTA barriers (`tl.debug_barrier`);
loads of data that other threads of the program wrote earlier bypass L1 (`.cg`).

1. `_allowed_and_bias_kernel`, one program per (row, chunk of 16384 tokens; 8192 under keep bits):
   - allowed list, in one of two forms (the same results), by batch size:
     - below `_KEEP_BITS_MIN_T` rows, save, fill and restore: the chunk's listed logits are read
       (into registers, or a scratch for long lists), a barrier, -inf is stored over the whole
       chunk (written, never read), a barrier, the listed logits are stored back. No other program
       touches the chunk, so no thread stores -inf over a listed token after its value is back;
     - from `_KEEP_BITS_MIN_T` rows, keep bits: the program zeroes its own bit words for the chunk,
       sets a bit for each listed id of the chunk (atomics; the kept logits' lines are prefetched
       into L1 meanwhile), a barrier, and then writes every token once, by the thread that reads
       it (if kept), the chunk in one step. Fewer steps a token, but a longer chain of dependent
       steps a program, which the small batches, with few programs to overlap them, pay for. A
       token's store is its thread's one vector store: storing `-inf` over the sectors without a
       kept token in a store of its own, which waits for no load, was slower, and so was a program
       a whole row (docs/notes/constraints-tuning.md);
   - bias: the bias lists are requested first (their latency passes under the allowed list);
     the listed logits of the chunk are all read (plus bias), a barrier, then written back, so a
     duplicated id gets one of its biases. Under keep bits only the kept ones are read, before
     the fill (which stores them unchanged); the others are -inf after it and stay -inf, or
     become NaN where the bias is +inf or NaN, which is stored without a read.
2. `_min_tokens_kernel`, one program per row with active min-tokens: the stop logits are saved and
   set to -inf, the row is scanned for a finite logit (the scan stops at the first one, usually in
   the first block), and if there is none the saved stop logits are written back. On Hopper and
   later it is a programmatic dependent launch: its programs read their settings and stop ids
   while the first launch drains, then wait for it (`gdc_wait`) before touching the logits.
Bias and stop lists longer than one register block (2048 ids), and allowed lists as long under
save, fill and restore, stage their values in a [T, W] scratch instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import _checks
from ._launch import cdiv, next_power_of_2
from ._registry import define_op, launch
from ._triton_helpers import load_slot, prefetch_l1, prefetch_l2_evict_last
from .truncation import plan as truncation_plan

_BLOCK_V = 4096  # tokens per step of a pass over the row
_CHUNK_V = 4 * _BLOCK_V  # tokens per program of _allowed_and_bias_kernel (save, fill and restore)
_KEEP_BITS_MIN_T = 80  # rows from which the allowed lists go through keep bits
_MAX_BLOCK_IDS = 2048  # list ids one program holds in registers
_WARPS = 8
_KEEP_CHUNK_V = 2 * _BLOCK_V  # tokens per program of _allowed_and_bias_kernel under keep bits, filled in one step
_PREFETCH_KEPT = True  # under keep bits, the kept logits' lines prefetched into L1 as their bits are set
# Under keep bits, a launch before the fill asks the L2 for every kept logit's line (to be evicted
# last), and the fill's stores are marked to be evicted first: the scattered reads then happen
# before the fill's write stream instead of amid it (an A/B form: docs/notes/constraints-tuning.md).
_KEPT_LINES_FIRST = False
# From this many rows (instead of keep bits), a launch of its own saves the allowed logits into the
# scratch before the chunk programs, which then fill and restore from it: the scattered reads then
# all happen before the write stream, and the chunk programs' restores read the L2 (an A/B form:
# docs/notes/constraints-tuning.md; off at 2**62).
_SAVE_LAUNCH_MIN_T = 2**62
_ALLOWED_LINES_BLOCK = 1024  # list entries a program of the launch of either form


def _ids_block(width: int) -> int:
    return min(max(next_power_of_2(width), 16), _MAX_BLOCK_IDS)


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
def _fill_kept(row_ptr, keep_bits_ptr, lo, hi, BLOCK_V: tl.constexpr, STREAM_STORES: tl.constexpr):
    """row[v] for v in [lo, hi): its logit where its bit (bit v - lo of keep_bits) is set, else -inf.

    A block is a [BLOCK_V / 32, 32] tile: row w of the tile is one bit word, so a thread loads the
    words of its tile rows once and shifts them, instead of loading a word per token. The thread
    that stores a token is the one that read it, and only kept tokens are read. STREAM_STORES marks
    the stores' lines to be evicted from the L2 first.
    """
    WORDS: tl.constexpr = BLOCK_V // 32
    w = tl.arange(0, WORDS)
    j = tl.arange(0, 32)
    for v0 in range(lo, hi, BLOCK_V):
        words = tl.load(keep_bits_ptr + (v0 - lo) // 32 + w, cache_modifier=".cg")
        offs = v0 + w[:, None] * 32 + j[None, :]
        in_chunk = offs < hi
        keep = ((words[:, None] >> j[None, :]) & 1) != 0
        vals = tl.load(row_ptr + offs, mask=in_chunk & keep, other=float("-inf"))
        if STREAM_STORES:
            tl.store(row_ptr + offs, vals, mask=in_chunk, eviction_policy="evict_first")
        else:
            tl.store(row_ptr + offs, vals, mask=in_chunk)


@triton.jit
def _allowed_lines_kernel(logits_ptr, logits_stride, idx_mapping_ptr, allowed_ids_ptr, allowed_stride,
                          num_allowed_ptr, max_allowed, scratch_ptr, scratch_stride, allowed_scratch_offset,
                          num_slots, vocab_size, BLOCK: tl.constexpr, SAVE: tl.constexpr, PDL: tl.constexpr):
    """Program (row, block of BLOCK list entries), before the chunk launch, over the row's allowed
    logits. SAVE (`_SAVE_LAUNCH_MIN_T`): saves them, entry k's at scratch[t, allowed_scratch_offset
    + k]. Else (`_KEPT_LINES_FIRST`): asks the L2 for their lines, a hint that reads nothing back and
    writes nothing, so the launch after it needs no ordering against it to be exact. PDL: the chunk
    launch is a programmatic dependent one, whose programs wait for this launch before they store."""
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    n_allowed = _list_length(num_allowed_ptr, slot, max_allowed)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ids, ok = _load_listed(allowed_ids_ptr + slot * allowed_stride, k, n_allowed, 0, vocab_size)
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    if SAVE:
        vals = tl.load(row_ptr + ids, mask=ok)
        tl.store(scratch_ptr + t.to(tl.int64) * scratch_stride + allowed_scratch_offset + k, vals.to(tl.float32),
                 mask=ok)
    else:
        prefetch_l2_evict_last(row_ptr + ids, ok)


@triton.jit
def _set_bits(bits_ptr, rel, ok):
    """Sets bit rel of bits_ptr's words where ok (relaxed atomics: a barrier orders them)."""
    tl.atomic_or(bits_ptr + (rel >> 5), 1 << (rel & 31), mask=ok, sem="relaxed", scope="cta")


@triton.jit
def _restore_allowed(row_ptr, ids_ptr, n_allowed, lo, hi, allowed_scratch, IN_REGISTERS: tl.constexpr,
                     SAVED: tl.constexpr, BLOCK_ALLOWED: tl.constexpr, BLOCK_V: tl.constexpr):
    """The allowed list over [lo, hi) by save, fill and restore: the listed logits are read (into
    registers, or allowed_scratch for long lists), a barrier, -inf is stored over the whole chunk
    (written, never read), a barrier, the listed logits are stored back. SAVED: the save launch
    has already copied them into allowed_scratch, which the restore reads instead of the row."""
    if IN_REGISTERS:
        ids, ok = _load_listed(ids_ptr, tl.arange(0, BLOCK_ALLOWED), n_allowed, lo, hi)
        if SAVED:
            kept = tl.load(allowed_scratch + tl.arange(0, BLOCK_ALLOWED), mask=ok, cache_modifier=".cg")
            kept = kept.to(row_ptr.dtype.element_ty)
        else:
            kept = tl.load(row_ptr + ids, mask=ok)
    elif not SAVED:
        _save_listed(row_ptr, ids_ptr, n_allowed, lo, hi, allowed_scratch, allowed_scratch, BLOCK_ALLOWED, False)
    tl.debug_barrier()
    neg_inf = tl.full([BLOCK_V], float("-inf"), row_ptr.dtype.element_ty)
    for v0 in range(lo, hi, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        tl.store(row_ptr + offs, neg_inf, mask=offs < hi)
    tl.debug_barrier()
    if IN_REGISTERS:
        tl.store(row_ptr + ids, kept, mask=ok)
    else:
        _write_listed(row_ptr, ids_ptr, n_allowed, lo, hi, allowed_scratch, BLOCK_ALLOWED, False)


@triton.jit
def _set_keep_bits(row_ptr, ids_ptr, n_allowed, lo, hi, bits_ptr, BLOCK_ALLOWED: tl.constexpr, CHUNK_V: tl.constexpr,
                   PREFETCH: tl.constexpr):
    """The keep bits of the allowed list over [lo, hi): the chunk's bit words (the program's own) are
    zeroed, a barrier, a bit is set for each listed id of the chunk, a barrier. With PREFETCH the
    kept logits' lines are prefetched into L1 as the bits are set: the fill's loads of them, which
    its stores wait for, then find them there instead of in device memory."""
    # The first block of ids is requested before the zeroing: its latency passes under the barrier.
    ids, ok = _load_listed(ids_ptr, tl.arange(0, BLOCK_ALLOWED), n_allowed, lo, hi)
    tl.store(bits_ptr + tl.arange(0, CHUNK_V // 32), tl.zeros([CHUNK_V // 32], tl.int32))
    tl.debug_barrier()
    if PREFETCH:
        prefetch_l1(row_ptr + ids, ok)
    _set_bits(bits_ptr, ids - lo, ok)
    for i in range(BLOCK_ALLOWED, n_allowed, BLOCK_ALLOWED):  # lists wider than a register block
        ids, ok = _load_listed(ids_ptr, i + tl.arange(0, BLOCK_ALLOWED), n_allowed, lo, hi)
        if PREFETCH:
            prefetch_l1(row_ptr + ids, ok)
        _set_bits(bits_ptr, ids - lo, ok)
    tl.debug_barrier()


@triton.jit
def _allowed_and_bias_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr,
    allowed_ids_ptr, allowed_stride, num_allowed_ptr, max_allowed,
    bias_ids_ptr, bias_ids_stride, bias_values_ptr, bias_values_stride, num_bias_ptr, max_bias,
    keep_bits_ptr, keep_bits_stride, scratch_ptr, scratch_stride, allowed_scratch_offset, num_slots, vocab_size,
    HAS_ALLOWED: tl.constexpr, KEEP_BITS: tl.constexpr, ALLOWED_IN_REGISTERS: tl.constexpr, SAVED: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_IN_REGISTERS: tl.constexpr,
    BLOCK_V: tl.constexpr, CHUNK_V: tl.constexpr, BLOCK_ALLOWED: tl.constexpr,
    BLOCK_BIAS: tl.constexpr, PREFETCH_KEPT: tl.constexpr, STREAM_STORES: tl.constexpr, PDL: tl.constexpr,
    WAIT: tl.constexpr,
):
    """PDL: the min-tokens launch that follows is a programmatic dependent one, placed once every
    program here has started. SAVED: the allowed logits are in the scratch, saved by the launch
    before this one; WAIT: this launch is a programmatic dependent one of that launch, and its
    programs wait for it before they touch the logits."""
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    lo = chunk * CHUNK_V
    hi = tl.minimum(lo + CHUNK_V, vocab_size)

    if HAS_BIAS:
        n_bias = _list_length(num_bias_ptr, slot, max_bias)
        bias_ids_row = bias_ids_ptr + slot * bias_ids_stride
        bias_values_row = bias_values_ptr + slot * bias_values_stride
        if BIAS_IN_REGISTERS:  # requested now: their latency passes while the allowed list is applied
            k_bias = tl.arange(0, BLOCK_BIAS)
            bias_ids, bias_ok = _load_listed(bias_ids_row, k_bias, n_bias, lo, hi)
            bias_add = tl.load(bias_values_row + k_bias, mask=bias_ok, other=0.0)
            kept = bias_ok  # the biased tokens whose logit is read
            touched = bias_ok  # the biased tokens stored
    if WAIT:
        gdc_wait()

    if HAS_ALLOWED:
        n_allowed = _list_length(num_allowed_ptr, slot, max_allowed)
        ids_ptr = allowed_ids_ptr + slot * allowed_stride
        if KEEP_BITS:
            bits_ptr = keep_bits_ptr + t.to(tl.int64) * keep_bits_stride + chunk * (CHUNK_V // 32)
        if n_allowed > 0:
            if KEEP_BITS:
                _set_keep_bits(row_ptr, ids_ptr, n_allowed, lo, hi, bits_ptr, BLOCK_ALLOWED, CHUNK_V, PREFETCH_KEPT)
                if HAS_BIAS and BIAS_IN_REGISTERS:
                    # After the fill only the kept tokens hold a logit: a biased token without a bit
                    # is -inf, and stays -inf unless its bias is +inf or NaN (-inf + bias is NaN).
                    rel = bias_ids - lo
                    words = tl.load(bits_ptr + (rel >> 5), mask=bias_ok, other=0, cache_modifier=".cg")
                    kept = bias_ok & (((words >> (rel & 31)) & 1) != 0)
                    touched = kept | (bias_ok & ((bias_add == float("inf")) | (bias_add != bias_add)))
            else:
                allowed_scratch = scratch_ptr  # None where the list fits in registers and is not saved
                if SAVED or not ALLOWED_IN_REGISTERS:
                    allowed_scratch = scratch_ptr + t.to(tl.int64) * scratch_stride + allowed_scratch_offset
                _restore_allowed(row_ptr, ids_ptr, n_allowed, lo, hi, allowed_scratch, ALLOWED_IN_REGISTERS,
                                 SAVED, BLOCK_ALLOWED, BLOCK_V)
                tl.debug_barrier()

    if HAS_BIAS and BIAS_IN_REGISTERS:
        # Under keep bits, read before the fill: it stores every kept logit unchanged (so these are
        # the values it leaves), and their latency passes under it.
        biased = tl.load(row_ptr + bias_ids, mask=kept, other=float("-inf"), cache_modifier=".cg")
        biased = biased.to(tl.float32) + bias_add
    if HAS_ALLOWED and KEEP_BITS:
        if n_allowed > 0:
            _fill_kept(row_ptr, bits_ptr, lo, hi, CHUNK_V, STREAM_STORES)

    if HAS_BIAS:
        tl.debug_barrier()  # the fill's stores, and every read of a biased logit, before the bias's stores
        if BIAS_IN_REGISTERS:
            tl.store(row_ptr + bias_ids, biased.to(logits_ptr.dtype.element_ty), mask=touched)
        else:
            scratch_row = scratch_ptr + t.to(tl.int64) * scratch_stride
            _save_listed(row_ptr, bias_ids_row, n_bias, lo, hi, scratch_row, bias_values_row, BLOCK_BIAS, True)
            tl.debug_barrier()
            _write_listed(row_ptr, bias_ids_row, n_bias, lo, hi, scratch_row, BLOCK_BIAS, False)


@triton.jit
def _min_tokens_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, output_lens_ptr,
    stop_ids_ptr, stop_stride, num_stop_ptr, max_stop, min_tokens_ptr,
    scratch_ptr, scratch_stride, num_slots, vocab_size,
    STOP_IN_REGISTERS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_STOP: tl.constexpr, PDL: tl.constexpr,
):
    """PDL: a programmatic dependent launch after `_allowed_and_bias_kernel`. A program reads its
    row's settings and stop ids (inputs no launch of the op writes), then waits for that launch
    before it touches the logits; every program waits, so this launch ends after that one."""
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    in_batch = slot >= 0
    slot = tl.maximum(slot, 0)  # num_slots >= 1: in bounds; the settings of a row off the slots are not used
    n_stop = _list_length(num_stop_ptr, slot, max_stop)
    skip = ~in_batch | (n_stop == 0) | (tl.load(output_lens_ptr + t) >= tl.load(min_tokens_ptr + slot))
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    ids_ptr = stop_ids_ptr + slot * stop_stride
    if STOP_IN_REGISTERS:
        ids, ok = _load_listed(ids_ptr, tl.arange(0, BLOCK_STOP), tl.where(skip, 0, n_stop), 0, vocab_size)
    if PDL:
        gdc_wait()
    if skip:
        return
    if not STOP_IN_REGISTERS:
        scratch_row = scratch_ptr + t.to(tl.int64) * scratch_stride

    if STOP_IN_REGISTERS:
        saved = tl.load(row_ptr + ids, mask=ok, cache_modifier=".cg")
        tl.debug_barrier()  # a duplicated stop id must not save another thread's -inf
        tl.store(row_ptr + ids, tl.full([BLOCK_STOP], float("-inf"), logits_ptr.dtype.element_ty), mask=ok)
    else:
        _save_listed(row_ptr, ids_ptr, n_stop, 0, vocab_size, scratch_row, scratch_row, BLOCK_STOP, False)
        tl.debug_barrier()
        _write_listed(row_ptr, ids_ptr, n_stop, 0, vocab_size, scratch_row, BLOCK_STOP, True)
    tl.debug_barrier()

    found = 0
    v0 = 0
    while (found == 0) & (v0 < vocab_size):
        offs = v0 + tl.arange(0, BLOCK_V)
        vals = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"), cache_modifier=".cg")
        found = tl.max((tl.abs(vals.to(tl.float32)) < float("inf")).to(tl.int32), axis=0)
        v0 += BLOCK_V
    if found == 0:  # masking the stops would leave no finite logit: they keep their values
        if STOP_IN_REGISTERS:
            tl.store(row_ptr + ids, saved, mask=ok)
        else:
            _write_listed(row_ptr, ids_ptr, n_stop, 0, vocab_size, scratch_row, BLOCK_STOP, False)


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
    # Every token is written (masked stores of scattered tokens would leave partly written sectors,
    # which cost the memory system more than rewriting them whole); only the allowed ones are read,
    # so a sparse mask reads only the sectors that hold an allowed token.
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    tl.store(row_ptr + offs, tl.load(row_ptr + offs, mask=in_row & allowed, other=float("-inf")), mask=in_row)


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
    if T == 0:
        return
    # From _KEEP_BITS_MIN_T rows the allowed lists go through keep bits (a word per 32 tokens, each
    # chunk's words its own); below, where a program's chain of dependent steps bounds the time,
    # through save, fill and restore. Scratch per row for the values of lists too long for
    # registers: the bias's or the stops' (one launch after the other) from word 0, then (save,
    # fill and restore only) the allowed list's: all chunks of a row stage their allowed and their
    # biased logits at the same time, in disjoint entries of each list.
    saved = allowed_w > 0 and T >= _SAVE_LAUNCH_MIN_T
    keep_bits = allowed_w > 0 and T >= _KEEP_BITS_MIN_T and not saved
    chunk_v = _KEEP_CHUNK_V if keep_bits else _CHUNK_V
    chunks = cdiv(V, chunk_v)
    staged_w = max(bias_w, stop_w) if max(bias_w, stop_w) > _MAX_BLOCK_IDS else 0
    allowed_staged_w = allowed_w if saved or (allowed_w > _MAX_BLOCK_IDS and not keep_bits) else 0
    scratch_stride = staged_w + allowed_staged_w
    scratch = logits.new_empty((T, scratch_stride), dtype=torch.float32) if scratch_stride > 0 else None
    bits_stride = chunks * chunk_v // 32
    bits = logits.new_empty((T, bits_stride), dtype=torch.int32) if keep_bits else None
    first = allowed_w > 0 or bias_w > 0
    # On Hopper and later the min-tokens launch, after that one, is placed while it drains.
    pdl = first and truncation_plan.uses_dependent_launches(logits.device)
    lines_first = keep_bits and _KEPT_LINES_FIRST
    if lines_first or saved:
        launch(_allowed_lines_kernel, (T, cdiv(allowed_w, _ALLOWED_LINES_BLOCK)),
               logits, logits.stride(0), idx_mapping, allowed_ids, allowed_ids.stride(0), num_allowed, allowed_w,
               scratch, scratch_stride, staged_w, R, V, BLOCK=_ALLOWED_LINES_BLOCK, SAVE=saved, PDL=saved and pdl,
               num_warps=4)
    if first:
        launch(
            _allowed_and_bias_kernel, (T, chunks),
            logits, logits.stride(0), idx_mapping,
            allowed_ids, allowed_ids.stride(0), num_allowed, allowed_w,
            bias_ids, bias_ids.stride(0), bias_values, bias_values.stride(0), num_bias, bias_w,
            bits, bits_stride, scratch, scratch_stride, staged_w, R, V,
            HAS_ALLOWED=allowed_w > 0, KEEP_BITS=keep_bits, ALLOWED_IN_REGISTERS=allowed_w <= _MAX_BLOCK_IDS,
            SAVED=saved, HAS_BIAS=bias_w > 0, BIAS_IN_REGISTERS=bias_w <= _MAX_BLOCK_IDS, BLOCK_V=_BLOCK_V, CHUNK_V=chunk_v,
            BLOCK_ALLOWED=_ids_block(allowed_w), BLOCK_BIAS=_ids_block(bias_w), PREFETCH_KEPT=_PREFETCH_KEPT,
            STREAM_STORES=lines_first, PDL=pdl, WAIT=saved and pdl,
            num_warps=_WARPS, launch_pdl=saved and pdl,
        )
    if stop_w > 0:
        launch(
            _min_tokens_kernel, (T,),
            logits, logits.stride(0), idx_mapping, output_lens,
            stop_ids, stop_ids.stride(0), num_stop, stop_w, min_tokens,
            scratch, scratch_stride, R, V,
            STOP_IN_REGISTERS=stop_w <= _MAX_BLOCK_IDS, BLOCK_V=_BLOCK_V, BLOCK_STOP=_ids_block(stop_w), PDL=pdl,
            num_warps=8, launch_pdl=pdl,
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
        _token_bitmask_kernel, (T, cdiv(V, _BLOCK_V)),
        # num_mask_rows only bounds idx_mapping's slots: without it, a constant, so that the kernel
        # variant (Triton specialises ints equal to 1 or divisible by 16) does not depend on T.
        logits, logits.stride(0), bitmask, bitmask.stride(0), idx_mapping,
        bitmask.size(0) if idx_mapping is not None else 1, V, HAS_IDX_MAPPING=idx_mapping is not None, BLOCK_V=_BLOCK_V, num_warps=8,
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
