"""History-dependent steps of logit processing: `penalties` and `bad_words` (in place on the logits)
and `update_output_counts` (in place on the per-slot output state).

penalties touches only the tokens a request has seen. Its state is two token bitmasks per slot
(prompt and output, int32 [R, ceil(V/32)], 19 KB a row at V = 151936) and the output counts
(int32 [R, V]). One launch, a program for each row and block of BLOCK_WORDS mask words, so that a
small T still spreads over the GPU: each program loads its block's two mask words and the row's
parameters together. With `most` the largest number of set bits in one word of the block: a
block with none costs its two mask loads; with up to DENSE_POPCOUNT, each of ceil(most / 2) steps
takes the 2 lowest remaining set bits of every word (its 4 loads issued together) and reads and
writes logits, and reads counts, only there, so the instructions, like the traffic, follow the
history rather than the 32 bits of every word; with more (a dense history, where nearly every
sector of the row holds a seen token), DENSE_WORDS words at a time are one tile, accessed by
whole 32-byte sectors with vector loads and stores: its logits read whole and the sectors holding
a seen token written back (an unseen token there stored with the bits it was read with: its value
never changes), its counts read in the sectors holding an output token, the next tile's loads
issued before this one's stores. Traffic is the two mask rows plus the sectors holding a seen
token (in a dense block, all its logits are read), so the cost grows with the history, not with
V. A row whose three penalties are off reads its mask words and no logit; with the repetition
penalty at 1.0 the prompt tokens are left alone (x / 1.0 and x * 1.0 are exact, so skipping them
changes no bit).

Arithmetic is float32: the repetition step's quotient is the IEEE one (the C++ kernel's `x / p`):
`tl.math.div_rn` (Triton's `/` may lower to an approximate divide), or in the dense tiles the same
bits from a reciprocal computed once a row and two correction steps (`_divide_fast`, which states
its ranges and proof; a tile holding a logit outside them is stored again, divided exactly). The
frequency and presence term is one fused multiply-add (`fma(frequency, count, presence)`,
`std::fma` in C++), so CPU and CUDA agree bitwise in float32 (NaN payloads aside).

update_output_counts is one launch over the rows: an atomic add on the count and an atomic OR on
the mask word per row, so rows that name the same slot and token (speculative decoding) all count.

bad_words is one launch, one program per row: the slot's banned sequences are compared, a block of
BLOCK_BAD_WORDS sequences at a time, BLOCK_PREFIX tokens at a time, with the end of the row's
history; a matching sequence's last token becomes -inf. Every offset, count and length is clamped
in 64 bits before it addresses memory.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._launch import cdiv
from ._registry import define_op, launch
from ._triton_helpers import ON_GPU, load_slot

# Mask words (2048 tokens) one penalties program covers: 75 programs a row at V = 151936. The kernel
# waits on dependent accesses (slot, then mask words and parameters, then the scattered logits and
# counts), so many small programs keep the most of them in flight: one warp each (its block maximum
# needs no barrier). An SM holds at most 32 one-warp programs (the block limit), so 64 registers a
# thread cost no occupancy.
_BLOCK_WORDS = 64
_PENALTIES_WARPS = 1
_PENALTIES_MAX_REGISTERS = 64
_MAX_GRID_Y = 65535  # CUDA's limit on a grid's second and third axes
_DENSE_POPCOUNT = 12  # above this many set bits in a word of the block, read and write it whole
_DENSE_WORDS = 4  # words one such whole tile covers; two tiles' accesses are in flight
_BLOCK_ROWS = 128  # rows one update_output_counts program handles
_BLOCK_BAD_WORDS = 128  # banned sequences one step of a bad_words program compares
_BLOCK_PREFIX = 8  # prefix tokens one step of that comparison covers


def mask_words(vocab_size: int) -> int:
    """Words of a token bitmask row: ceil(V / 32)."""
    return (vocab_size + 31) // 32


# ----------------------------------------------------------------------------------------------
# Triton kernels


@triton.jit
def _popcount(x):
    """Set bits of each int32 (SWAR: no libdevice call, so the interpreter runs it too)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return (x * 0x01010101) >> 24


@triton.jit
def _divide_fast(x, rep, inv_rep):
    """x / rep as the IEEE division rounds it, from inv_rep = RN(1 / rep) in 5 float instructions,
    for rep in [1, 2**16] and x in [2**-80, 2**100] (`_fast_division_holds`).

    q = RN(x * inv_rep) is within 2 ulp of x / rep; one step RN(q + RN(x - q * rep) * inv_rep) makes
    it faithful (its error stays far below half an ulp); with q faithful the remainder x - q * rep
    is exact in a fused multiply-add, and the same step rounds correctly (Markstein's theorem:
    inv_rep within half an ulp of 1 / rep, q within one ulp). The ranges keep every step clear of
    overflow and underflow, which the proof needs. GPU only: the interpreter's fma is not fused."""
    q = x * inv_rep
    q = tl.fma(tl.fma(-q, rep, x), inv_rep, q)
    return tl.fma(tl.fma(-q, rep, x), inv_rep, q)


@triton.jit
def _fast_division_holds(x, rep):
    """Whether `_divide_fast` is exact for every x > 0 of the [words, 32] tile x: rep in [1, 2**16]
    and each x > 0 in [2**-80, 2**100] (so not infinite). The word axis is reduced first (a lane
    holds its bit of every word: no shuffle), then one flag a lane. The maxima skip NaN (which the
    division never meets: it is not > 0)."""
    largest = tl.max(x, axis=0)
    smallest_positive = tl.min(tl.where(x > 0, x, 1.0), axis=0)
    outside = (largest > 1.2676506002282294e30) | (smallest_positive < 8.271806125530277e-25)
    return (tl.max(outside.to(tl.int32), axis=0) == 0) & (rep >= 1.0) & (rep <= 65536.0)


@triton.jit
def _penalized(x, count, output, rep, inv_rep, freq, pres, FAST: tl.constexpr):
    """The penalised float32 logits: repetition (x / rep where x > 0, else x * rep), then frequency
    and presence where `output`. FAST (GPU only): the division by `_divide_fast`."""
    if FAST:
        q = _divide_fast(x, rep, inv_rep)
    else:
        q = tl.math.div_rn(x, rep)
    x = tl.where(x > 0, q, x * rep)
    return tl.where(output, x - tl.fma(freq, count, pres), x)


@triton.jit
def _any_bit_of_groups(words, bit, G: tl.constexpr):
    """[DENSE_WORDS, 32]: whether the group of G tokens (a power of two up to 16) holding token
    `bit` of each word has a bit set. Constant over each group, so accesses masked by it vectorize."""
    return ((words[:, None] >> (bit // G * G)[None, :]) & ((1 << G) - 1)) != 0


@triton.jit
def _dense_tile_bits(out_d, seen_d, word, vocab_size, DENSE_WORDS: tl.constexpr, SECTOR_TOKENS: tl.constexpr):
    """Masks of a [DENSE_WORDS, 32] tile of mask words (output words out_d, seen words seen_d) from
    `word`: (tokens from the tile's first, the logit sectors to read and write (those holding a seen
    token, SECTOR_TOKENS logits each), the count sectors to read (those holding an output token),
    seen, output). Row i holds word i's 32 tokens, contiguous, so the tile is one coalesced access
    at constant offsets from its first token."""
    bit = tl.arange(0, 32)
    local = tl.arange(0, DENSE_WORDS)[:, None] * 32 + bit[None, :]
    lane_bit = (1 << bit)[None, :]
    in_vocab = local < vocab_size - word * 32  # word * 32 < 2**31: V is an int32 token id range
    logit_sectors = _any_bit_of_groups(seen_d, bit, SECTOR_TOKENS) & in_vocab
    count_sectors = _any_bit_of_groups(out_d, bit, 8) & in_vocab
    seen = ((seen_d[:, None] & lane_bit) != 0) & in_vocab
    output = ((out_d[:, None] & lane_bit) != 0) & in_vocab
    return local, logit_sectors, count_sectors, seen, output


@triton.jit
def _load_tile_words(output_row, prompt_row, word, num_words, rep, DENSE_WORDS: tl.constexpr):
    """(output words, seen words) of the dense tile of DENSE_WORDS mask words from `word`. Words
    past the row read its last one (their tokens lie past V: masked)."""
    wd = tl.minimum(word + tl.arange(0, DENSE_WORDS), num_words - 1)
    out_d = tl.load(output_row + wd)
    if rep != 1.0:
        seen_d = out_d | tl.load(prompt_row + wd)
    else:
        seen_d = out_d
    return out_d, seen_d


@triton.jit
def _load_tile_data(row_ptr, counts_row, out_d, seen_d, word, vocab_size, DENSE_WORDS: tl.constexpr,
                    SECTOR_TOKENS: tl.constexpr):
    """(the tile's logits as stored, output counts) of the dense tile of words (out_d, seen_d) from
    `word`. The logits are read whole (vector loads that need no mask word: their latency starts
    before the words arrive), the counts by whole 32-byte sectors holding an output token."""
    local, _, count_sectors, _, _ = _dense_tile_bits(out_d, seen_d, word, vocab_size, DENSE_WORDS, SECTOR_TOKENS)
    # Each logit and count is used once: evict-first loads (and streaming stores) leave the caches
    # to the stores still being written back and to the mask words.
    x = tl.load(row_ptr + word * 32 + local, mask=local < vocab_size - word * 32, eviction_policy="evict_first")
    count = tl.load(counts_row + word * 32 + local, mask=count_sectors, other=0, eviction_policy="evict_first")
    return x, count


@triton.jit
def _store_dense_tile(out_d, seen_d, x, count, row_ptr, word, vocab_size, rep, inv_rep, freq, pres,
                      DENSE_WORDS: tl.constexpr, SECTOR_TOKENS: tl.constexpr):
    """Stores the 32-byte sectors of a tile that hold a seen token: the penalised logits where seen,
    elsewhere the bits `_load_tile_data` read (the masks recomputed from the words, so no predicate
    stays live in between)."""
    local, logit_sectors, _, seen, output = _dense_tile_bits(out_d, seen_d, word, vocab_size, DENSE_WORDS,
                                                             SECTOR_TOKENS)
    tile_ptr = row_ptr + word * 32
    xf = x.to(tl.float32)
    count = count.to(tl.float32)
    fast = _penalized(xf, count, output, rep, inv_rep, freq, pres, FAST=ON_GPU)
    tl.store(tile_ptr + local, tl.where(seen, fast.to(x.dtype), x), mask=logit_sectors, cache_modifier=".cs")
    if ON_GPU:
        if not _fast_division_holds(tl.where(seen, xf, 1.0), rep):  # rare: stored again, divided exactly
            exact = _penalized(xf, count, output, rep, inv_rep, freq, pres, FAST=False)
            tl.store(tile_ptr + local, tl.where(seen, exact.to(x.dtype), x), mask=logit_sectors)


@triton.jit
def _next_bit(rest, out_words, w, vocab_size):
    """Takes the lowest set bit of every word of `rest`: (rest without it, its token, seen, output)."""
    low = rest & (0 - rest)  # 0 when no bit is left
    # its index: the exponent of the power of two as a float (exact; -2**31 for bit 31)
    j = ((low.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    tok = w * 32 + j
    seen = (low != 0) & (tok < vocab_size)
    return rest ^ low, tl.where(seen, tok, 0), seen, seen & ((out_words & low) != 0)


@triton.jit
def _penalties_kernel(logits_ptr, logits_stride, idx_mapping_ptr,
                      prompt_mask_ptr, prompt_stride, output_mask_ptr, output_stride, counts_ptr, counts_stride,
                      repetition_ptr, frequency_ptr, presence_ptr, num_rows, num_slots, vocab_size, num_words,
                      BLOCK_WORDS: tl.constexpr, DENSE_WORDS: tl.constexpr, DENSE_POPCOUNT: tl.constexpr,
                      SECTOR_TOKENS: tl.constexpr):
    # Grid (blocks, rows): a row's blocks are consecutive programs, and the rows go last to first,
    # so the rows a preceding full write of the logits (the model's, or the op before) left in the L2
    # come first. Rows past the grid's second axis continue on the third. Every index comes from the
    # program ids (no division whose result would hold a register through the dense tiles).
    row_from_end = tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)
    if row_from_end >= num_rows:
        return
    t = num_rows - 1 - row_from_end
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    first = tl.program_id(0) * BLOCK_WORDS
    w = first + tl.arange(0, BLOCK_WORDS)
    in_row = w < num_words
    prompt_row = prompt_mask_ptr + slot * prompt_stride
    output_row = output_mask_ptr + slot * output_stride
    # The mask words are requested with the parameters (one round trip fewer before the scattered
    # accesses), the prompt words even where repetition is off.
    out_words = tl.load(output_row + w, mask=in_row, other=0)
    prompt_words = tl.load(prompt_row + w, mask=in_row, other=0)
    rep = tl.load(repetition_ptr + slot)
    freq = tl.load(frequency_ptr + slot)
    pres = tl.load(presence_ptr + slot)
    if (rep == 1.0) & (freq == 0.0) & (pres == 0.0):  # all three off: no logit is read
        return
    inv_rep = tl.math.div_rn(1.0, rep)  # RN(1 / rep): the dense tiles' division
    # Repetition off: only output tokens change (x / 1.0 and x * 1.0 are exact: skipping the prompt
    # tokens changes no bit).
    seen_words = tl.where(rep != 1.0, out_words | prompt_words, out_words)
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    counts_row = counts_ptr + slot * counts_stride
    most = tl.max(_popcount(seen_words), axis=0)  # 0: no token of the block is touched
    if most > DENSE_POPCOUNT:
        # Many bits a word: DENSE_WORDS words at a time. The next tile's data and the words of the
        # one after it are requested before this tile's stores (distinct tokens: no hazard), so
        # two tiles' accesses are in flight and no data load waits on a word load of its own.
        out_d, seen_d = _load_tile_words(output_row, prompt_row, first, num_words, rep, DENSE_WORDS)
        out_n, seen_n = _load_tile_words(output_row, prompt_row, first + DENSE_WORDS, num_words, rep, DENSE_WORDS)
        x, count = _load_tile_data(row_ptr, counts_row, out_d, seen_d, first, vocab_size, DENSE_WORDS, SECTOR_TOKENS)
        for d in range(DENSE_WORDS, BLOCK_WORDS, DENSE_WORDS):
            out_a, seen_a = _load_tile_words(output_row, prompt_row, first + d + DENSE_WORDS, num_words, rep,
                                             DENSE_WORDS)
            x_n, count_n = _load_tile_data(row_ptr, counts_row, out_n, seen_n, first + d, vocab_size, DENSE_WORDS,
                                           SECTOR_TOKENS)
            _store_dense_tile(out_d, seen_d, x, count, row_ptr, first + d - DENSE_WORDS, vocab_size, rep, inv_rep,
                              freq, pres, DENSE_WORDS, SECTOR_TOKENS)
            out_d, seen_d, x, count = out_n, seen_n, x_n, count_n
            out_n, seen_n = out_a, seen_a
        _store_dense_tile(out_d, seen_d, x, count, row_ptr, first + BLOCK_WORDS - DENSE_WORDS, vocab_size, rep,
                          inv_rep, freq, pres, DENSE_WORDS, SECTOR_TOKENS)
    else:
        # Few bits a word: the lowest 2 set bits of every word a step, `ceil(most / 2)` steps,
        # so the work follows the history rather than the 32 bits of a word (a realistic history
        # has at most 2 bits in most words of a block). The 4 loads of a step are issued before
        # its stores: their latencies overlap.
        rest = seen_words
        dtype = row_ptr.dtype.element_ty
        for _ in range(0, most, 2):
            rest, tok0, seen0, out0 = _next_bit(rest, out_words, w, vocab_size)
            rest, tok1, seen1, out1 = _next_bit(rest, out_words, w, vocab_size)
            x0 = tl.load(row_ptr + tok0, mask=seen0, other=0.0).to(tl.float32)
            x1 = tl.load(row_ptr + tok1, mask=seen1, other=0.0).to(tl.float32)
            c0 = tl.load(counts_row + tok0, mask=out0, other=0).to(tl.float32)
            c1 = tl.load(counts_row + tok1, mask=out1, other=0).to(tl.float32)
            # Distinct bits of a word are distinct tokens: no store overwrites another's load.
            y0 = _penalized(x0, c0, out0, rep, inv_rep, freq, pres, FAST=False)
            y1 = _penalized(x1, c1, out1, rep, inv_rep, freq, pres, FAST=False)
            tl.store(row_ptr + tok0, y0.to(dtype), mask=seen0)
            tl.store(row_ptr + tok1, y1.to(dtype), mask=seen1)


@triton.jit
def _update_output_counts_kernel(counts_ptr, counts_stride, mask_ptr, mask_stride, idx_mapping_ptr, token_ids_ptr,
                                 num_rows, num_slots, vocab_size, BLOCK_ROWS: tl.constexpr):
    t = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_batch = t < num_rows
    slot = tl.load(idx_mapping_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    tok = tl.load(token_ids_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    ok = in_batch & (slot >= 0) & (slot < num_slots) & (tok >= 0) & (tok < vocab_size)
    slot = tl.where(ok, slot, 0)
    tok = tl.where(ok, tok, 0)
    tl.atomic_add(counts_ptr + slot * counts_stride + tok, tl.full([BLOCK_ROWS], 1, tl.int32), mask=ok, sem="relaxed")
    word_bit = tl.full([BLOCK_ROWS], 1, tl.int32) << (tok & 31).to(tl.int32)
    tl.atomic_or(mask_ptr + slot * mask_stride + (tok >> 5), word_bit, mask=ok, sem="relaxed")


@triton.jit
def _bad_words_kernel(logits_ptr, logits_stride, idx_mapping_ptr,
                      ids_ptr, ids_stride, ids_width, offsets_ptr, offsets_stride, max_words, num_words_ptr,
                      history_ptr, history_stride, history_width, history_lens_ptr, num_slots, vocab_size,
                      BLOCK_BAD_WORDS: tl.constexpr, BLOCK_PREFIX: tl.constexpr):
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    n_words = tl.minimum(tl.maximum(tl.load(num_words_ptr + slot).to(tl.int64), 0), max_words)
    hist_len = tl.minimum(tl.maximum(tl.load(history_lens_ptr + t).to(tl.int64), 0), history_width)
    ids_row = ids_ptr + slot * ids_stride
    offsets_row = offsets_ptr + slot * offsets_stride
    history_row = history_ptr + slot * history_stride
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    for i in range(0, n_words, BLOCK_BAD_WORDS):
        k = i + tl.arange(0, BLOCK_BAD_WORDS)
        listed = k < n_words
        start = tl.load(offsets_row + k, mask=listed, other=0).to(tl.int64)
        end = tl.load(offsets_row + k + 1, mask=listed, other=0).to(tl.int64)
        start = tl.minimum(tl.maximum(start, 0), ids_width)
        end = tl.minimum(tl.maximum(end, 0), ids_width)
        prefix = end - start - 1  # tokens to match; < 0 for an empty sequence
        # A sequence longer than the history + 1 cannot match.
        live = listed & (prefix >= 0) & (prefix <= hist_len)
        last = tl.load(ids_row + tl.where(live, end - 1, 0), mask=live, other=-1).to(tl.int64)
        live = live & (last >= 0) & (last < vocab_size)
        longest = tl.max(tl.where(live, prefix, 0), axis=0)
        # The inner loop works on [words, 1] columns and gathers mismatches in a [words, prefix]
        # tile reduced after it (1-D vectors carried into or through the loop made Triton 3.6's
        # layout pass fail).
        live_col = live[:, None]
        prefix_col = prefix[:, None]
        word_at = start[:, None]
        history_at = hist_len - prefix_col  # >= 0 where live
        mismatches = tl.zeros([BLOCK_BAD_WORDS, BLOCK_PREFIX], tl.int32)
        for j in range(0, longest, BLOCK_PREFIX):
            p = j + tl.arange(0, BLOCK_PREFIX)[None, :]
            compared = live_col & (p < prefix_col)
            word_tok = tl.load(ids_row + tl.where(compared, word_at + p, 0), mask=compared, other=0)
            hist_tok = tl.load(history_row + tl.where(compared, history_at + p, 0), mask=compared, other=0)
            mismatches |= (compared & (word_tok.to(tl.int64) != hist_tok.to(tl.int64))).to(tl.int32)
        live = live & (tl.max(mismatches, axis=1) == 0)
        tl.store(row_ptr + tl.where(live, last, 0), tl.full([BLOCK_BAD_WORDS], float("-inf"), tl.float32)
                 .to(row_ptr.dtype.element_ty), mask=live)


# ----------------------------------------------------------------------------------------------
# penalties


def _check_penalties(logits, idx_mapping, prompt_mask, output_mask, output_counts, repetition_penalty,
                     frequency_penalty, presence_penalty) -> None:
    op = "penalties"
    T, V = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    R = _checks.check_slot_vector(op, "repetition_penalty", repetition_penalty, (torch.float32,), dev)
    for name, t in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        _checks.check_tensor(op, name, t, (torch.float32,), ndim=1, device=dev, shape=(R,))
    words = mask_words(V)
    for name, t in (("prompt_mask", prompt_mask), ("output_mask", output_mask)):
        _checks.check_tensor(op, name, t, (torch.int32,), ndim=2, device=dev, shape=(R, words))
    _checks.check_tensor(op, "output_counts", output_counts, (torch.int32,), ndim=2, device=dev, shape=(R, V))


def _check_penalties_values(logits, idx_mapping, prompt_mask, output_mask, output_counts, repetition_penalty,
                            frequency_penalty, presence_penalty) -> None:
    op = "penalties"
    _checks.check_values(op, "repetition_penalty", torch.isfinite(repetition_penalty) & (repetition_penalty > 0),
                         "finite values > 0")
    _checks.check_values(op, "frequency_penalty", torch.isfinite(frequency_penalty), "finite values")
    _checks.check_values(op, "presence_penalty", torch.isfinite(presence_penalty), "finite values")


def _penalties_triton(logits, idx_mapping, prompt_mask, output_mask, output_counts, repetition_penalty,
                      frequency_penalty, presence_penalty) -> None:
    T, V = logits.shape
    if T == 0:
        return
    words = mask_words(V)
    launch(
        _penalties_kernel, (cdiv(words, _BLOCK_WORDS), min(T, _MAX_GRID_Y), cdiv(T, _MAX_GRID_Y)),
        logits, logits.stride(0), idx_mapping,
        prompt_mask, prompt_mask.stride(0), output_mask, output_mask.stride(0), output_counts, output_counts.stride(0),
        repetition_penalty, frequency_penalty, presence_penalty, T, repetition_penalty.size(0), V, words,
        BLOCK_WORDS=_BLOCK_WORDS, DENSE_WORDS=min(_DENSE_WORDS, _BLOCK_WORDS), DENSE_POPCOUNT=_DENSE_POPCOUNT,
        SECTOR_TOKENS=32 // logits.element_size(), num_warps=_PENALTIES_WARPS, maxnreg=_PENALTIES_MAX_REGISTERS,
    )


@define_op(
    mutates_args=("logits",), check=_check_penalties, check_values=_check_penalties_values,
    triton=_penalties_triton,
)
def penalties(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_mask: torch.Tensor,
    output_counts: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
) -> None:
    """Applies repetition, frequency and presence penalties in place, to the seen tokens only.

    Per row ``t`` with slot ``r = idx_mapping[t]`` and per token with ``seen`` = its bit in
    ``prompt_mask[r]`` or in ``output_mask[r]`` and ``c = output_counts[r, token]``:

    1. repetition (``1.0`` is off): if ``seen``, a logit ``> 0`` is divided by the penalty, any other
       multiplied by it;
    2. then, if its ``output_mask`` bit is set, ``logit -= fma(frequency, c, presence)`` (``0.0`` is off).

    A token with neither bit set keeps its exact bits (the CUDA kernel never reads or writes it);
    a token whose output bit is 0 counts 0, whatever ``output_counts`` holds there (the count is
    read only where the bit is set). A row whose three penalties are off is not read; penalties of
    ``1.0`` / ``0.0`` change no bit.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride (any row stride); modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row. A row whose slot is outside ``[0, R)`` is untouched.
        prompt_mask, output_mask: int32 ``[R, ceil(V / 32)]`` token bitmasks (bit ``j`` of word ``w`` is
            token ``32 * w + j``; bits past ``V`` are ignored).
        output_counts: int32 ``[R, V]``, how often each token was generated.
        repetition_penalty: float32 ``[R]``, ``> 0``; frequency_penalty, presence_penalty: float32 ``[R]``
            (checked with TORCH_SAMPLING_OPS_DEBUG=1).

    Arithmetic is float32 (IEEE division, one fused multiply-add), stored in the logits dtype. NaN stays NaN.
    """


# ----------------------------------------------------------------------------------------------
# update_output_counts


def _check_update_output_counts(output_counts, output_mask, idx_mapping, token_ids) -> None:
    op = "update_output_counts"
    _checks.check_tensor(op, "output_counts", output_counts, (torch.int32,), ndim=2, device=None)
    R, V = output_counts.shape
    dev = output_counts.device
    if R < 1 or V < 1:
        raise ValueError(f"sampling.{op}: 'output_counts' must have R >= 1 slots and V >= 1 tokens, "
                         f"got shape {tuple(output_counts.shape)}")
    _checks.check_tensor(op, "output_mask", output_mask, (torch.int32,), ndim=2, device=dev, shape=(R, mask_words(V)),
                         like="output_counts")
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev,
                         like="output_counts")
    T = idx_mapping.size(0)
    _checks.check_tensor(op, "token_ids", token_ids, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,),
                         like="output_counts")


def _check_update_output_counts_values(output_counts, output_mask, idx_mapping, token_ids) -> None:
    V = output_counts.size(1)
    _checks.check_values("update_output_counts", "token_ids", (token_ids >= -1) & (token_ids < V),
                         f"token ids in [0, {V}) or -1")


def _update_output_counts_triton(output_counts, output_mask, idx_mapping, token_ids) -> None:
    T = idx_mapping.size(0)
    if T == 0:
        return
    R, V = output_counts.shape
    launch(
        _update_output_counts_kernel, (cdiv(T, _BLOCK_ROWS),),
        output_counts, output_counts.stride(0), output_mask, output_mask.stride(0), idx_mapping, token_ids,
        T, R, V, BLOCK_ROWS=_BLOCK_ROWS, num_warps=4,
    )


@define_op(
    mutates_args=("output_counts", "output_mask"), check=_check_update_output_counts,
    check_values=_check_update_output_counts_values,
    triton=_update_output_counts_triton,
)
def update_output_counts(
    output_counts: torch.Tensor, output_mask: torch.Tensor, idx_mapping: torch.Tensor, token_ids: torch.Tensor
) -> None:
    """Records the tokens generated this step, in place: counts and the output bitmask.

    For every row ``t`` with slot ``r = idx_mapping[t]`` in ``[0, R)`` and ``token_ids[t]`` in
    ``[0, V)``: ``output_counts[r, token] += 1`` and the token's bit of ``output_mask[r]`` is set.
    Several rows may name the same slot and token (speculative decoding): each counts. A ``-1`` (a
    rejected or invalid row) or any id or slot out of range counts nothing. Starting from zeroed
    state, ``output_mask`` stays equal to ``output_counts > 0``.

    Args:
        output_counts: int32 ``[R, V]``; modified in place.
        output_mask: int32 ``[R, ceil(V / 32)]`` token bitmask; modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row.
        token_ids: ``[T]`` int32/int64, the token each row generated, or ``-1``.
    """


# ----------------------------------------------------------------------------------------------
# bad_words


def _check_bad_words(logits, idx_mapping, bad_word_ids, bad_word_offsets, num_bad_words, history,
                     history_lens) -> None:
    op = "bad_words"
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    R = _checks.check_slot_vector(op, "num_bad_words", num_bad_words, _checks.INDEX_DTYPES, dev)
    _checks.check_tensor(op, "bad_word_ids", bad_word_ids, _checks.INDEX_DTYPES, ndim=2, device=dev, shape=(R, None))
    _checks.check_tensor(op, "bad_word_offsets", bad_word_offsets, (torch.int32,), ndim=2, device=dev, shape=(R, None))
    if bad_word_offsets.size(1) < 1:
        raise ValueError(f"sampling.{op}: 'bad_word_offsets' must have shape (R, N + 1) with N >= 0, "
                         f"got {tuple(bad_word_offsets.shape)}")
    _checks.check_tensor(op, "history", history, (torch.int32,), ndim=2, device=dev, shape=(R, None))
    _checks.check_tensor(op, "history_lens", history_lens, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))


def _check_bad_words_values(logits, idx_mapping, bad_word_ids, bad_word_offsets, num_bad_words, history,
                            history_lens) -> None:
    op = "bad_words"
    W, N, L = bad_word_ids.size(1), bad_word_offsets.size(1) - 1, history.size(1)
    offsets = bad_word_offsets.long()
    used = torch.arange(N + 1, device=offsets.device) <= num_bad_words.long().clamp(0, N).unsqueeze(1)
    ordered = torch.ones_like(used)
    ordered[:, 1:] = offsets[:, 1:] >= offsets[:, :-1]
    _checks.check_values(op, "bad_word_offsets", ((offsets >= 0) & (offsets <= W) & ordered) | ~used,
                         f"non-decreasing offsets in [0, {W}]")
    _checks.check_values(op, "history_lens", (history_lens >= 0) & (history_lens <= L), f"lengths in [0, {L}]")


def _bad_words_triton(logits, idx_mapping, bad_word_ids, bad_word_offsets, num_bad_words, history,
                      history_lens) -> None:
    T, V = logits.shape
    W, N, L = bad_word_ids.size(1), bad_word_offsets.size(1) - 1, history.size(1)
    if T == 0 or W == 0 or N == 0:  # no sequence can be listed
        return
    # An empty history is never read (only one-token sequences can match); any int32 tensor stands in for its pointer.
    history_arg = history if history.numel() > 0 else bad_word_offsets
    launch(
        _bad_words_kernel, (T,),
        logits, logits.stride(0), idx_mapping,
        bad_word_ids, bad_word_ids.stride(0), W, bad_word_offsets, bad_word_offsets.stride(0), N, num_bad_words,
        history_arg, history.stride(0), L, history_lens, num_bad_words.size(0), V,
        BLOCK_BAD_WORDS=_BLOCK_BAD_WORDS, BLOCK_PREFIX=_BLOCK_PREFIX, num_warps=4,
    )


@define_op(
    mutates_args=("logits",), check=_check_bad_words, check_values=_check_bad_words_values,
    triton=_bad_words_triton,
)
def bad_words(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    bad_word_ids: torch.Tensor,
    bad_word_offsets: torch.Tensor,
    num_bad_words: torch.Tensor,
    history: torch.Tensor,
    history_lens: torch.Tensor,
) -> None:
    """Bans, in place, the token that would complete a banned sequence (sets it to -inf).

    Slot ``r`` has ``num_bad_words[r]`` sequences; sequence ``i`` is
    ``bad_word_ids[r, bad_word_offsets[r, i] : bad_word_offsets[r, i + 1]]``. For row ``t`` with slot
    ``r = idx_mapping[t]``, a sequence of length ``n >= 1`` sets ``logits[t, last token] = -inf``
    when its first ``n - 1`` tokens equal the last ``n - 1`` tokens of
    ``history[r, :history_lens[t]]`` (a one-token sequence is always banned; one longer than the
    history + 1 never matches).

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride (any row stride); modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row. A row whose slot is outside ``[0, R)`` is untouched.
        bad_word_ids: ``[R, W]`` int32/int64, the sequences of each slot back to back.
        bad_word_offsets: int32 ``[R, N + 1]``, where each sequence starts (and the last one ends).
        num_bad_words: ``[R]`` int32/int64, sequences per slot, clamped to ``[0, N]``.
        history: int32 ``[R, L]``, each slot's past tokens (prompt and output).
        history_lens: ``[T]`` int32/int64, how many of them precede row ``t``, clamped to ``[0, L]``.

    Offsets are clamped to ``[0, W]`` (an end before its start is an empty sequence, which bans
    nothing); a last token outside ``[0, V)`` is ignored. Nothing is ever read out of bounds.
    """
