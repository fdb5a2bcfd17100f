"""Truncation of the distribution, in place, without sorting the row: `top_k_top_p`.

Both filters keep the tokens >= a threshold: the largest value v whose count (top-k) or probability
mass (top-p, after top-k: renormalised over the kept set) of tokens >= v reaches the target. Five
launches (six from _SETTLE_LAUNCH_MIN_T rows); rows are split into fixed 2048-token segments, so a
small batch still spreads over the GPU:

1. `_sample_bound_kernel` (per row): a 2048-token sample gives a lower bound `lo` the threshold
   should clear: past the sample rank expected of the k-th token by a safe margin (top-k), or where
   about half the candidate capacity is expected above it (top-p alone; then also a second bound,
   where a quarter is).
2. `_scan_segments_kernel` (one warp per row and segment): the segment's max, softmax
   normaliser and the mass of its tokens >= lo (the candidates) and >= the second bound (all
   three only for top-p alone), and the candidates, with their positions, into its own region of
   the workspace.
3. `_gather_chunks_kernel` (row x 8192-token chunk): each program combines the segment statistics
   in segment order (all of a row's programs reach the same bits; from _SETTLE_LAUNCH_MIN_T rows
   `_settle_kernel` does it once a row, before the gather): whether the candidates settle
   the row (no segment overflowed, and they hold the k tokens or the top_p mass; for top-p alone,
   only those >= the second bound when they hold it) and each segment's offset in the row's list.
   In a settled row: its segments' listed candidate values gathered into the row's list; with
   top-k on, also their positions, and -inf over the chunk.
4. `_select_kernel` (per row): the exact threshold by interval rounds on the float keys of the
   candidates (each keeps the one of 16 equal key ranges holding the answer, by counts for top-k
   and masses for top-p; the list is compacted as the range narrows; the kernel runs with 128
   registers, two programs an SM). With top-k on, the few kept candidates are then written back
   over the gather's -inf. For top-p alone, from _FILL_IN_SELECT_MIN_T rows the program fills its
   row itself as launch 5 does, chunk by chunk, and launch 5 is left out (rows whose search ends
   early fill while others still search); in smaller batches the threshold is stored in the header.
   A row the candidates did not settle takes the general path in the same program, on its
   untouched logits: the row max, count and normaliser and, for 16 pivots placed geometrically
   below the first block's max, the count and mass of the tokens >= each; the two pivots around
   the threshold give a bracket, which counting passes narrow as key rounds (the selection's
   interval rounds over the row, so exact for any finite row, whatever its scale) until at most
   CAP tokens remain, which are compacted, sorted in registers and read off; then one masking pass.
5. `_fill_chunks_kernel` (settled rows of top-p alone, below _FILL_IN_SELECT_MIN_T rows; a chunk a
   program, _FILL_GROUP from _SETTLE_LAUNCH_MIN_T rows): -inf over a chunk, a block barrier, then
   the chunk's own listed candidates >= the threshold restored, into lines the program has just
   written. Top-p alone keeps thousands of tokens: written back by the selection, after a fill in
   the gather, each landed in its own sector of a row long gone from the L2 (25 µs of the selection
   at T = 256).

On Hopper and later GPUs every launch after the first is a programmatic dependent launch: its
programs are placed while the previous launch drains and read their row settings, then wait for it
(see _row_settings); about 3 µs less per call at T = 1 and T = 256.

Every reduction runs in a fixed order over segments that depend on V alone, so a row's result does
not depend on the batch it is in. A row with both filters off is not read. Masses are float32
sums, so a token's membership may differ from the exact answer only where the exact mass above it
is within float32 rounding of top_p.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import _checks
from ._registry import define_op, launch
from ._triton_helpers import load_slot

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Under TRITON_INTERPRET=1 the tests run small rows: smaller segments, capacities, sample and tiles
# exercise the multi-segment, overflow, narrowing and fallback logic there.
# Segments of 2048 tokens rather than 1024 (H200, V = 151936): 214 / 120 / 111 instead of 224 / 126 /
# 116 µs at T = 256 (top-p / both / top-k), 22.4 / 53.3 / 16.4 instead of 21.1 / 52.6 / 15.0 at T = 1.
# The same at every batch size: the segments fix the order of a row's sums.
_SEGMENT = 256 if _INTERPRET else 2048  # tokens of a segment: one warp of the scan, its own candidate region
_SEG_CAP = 32 if _INTERPRET else 512  # candidates a segment can hold
# The top-p-alone scan's software pipeline depth (Triton's num_stages): 3 steps of 256 tokens load
# while one is counted (H200, T = 256, top-p alone: 212 against 215 µs with the next step loading
# into registers, same run; 6 stages: no better).
_SCAN_STAGES = 4
_CHUNK = 1024 if _INTERPRET else 8192  # tokens per program of the gather and fill launches (whole segments)
_SAMPLE = 256 if _INTERPRET else 2048  # sampled tokens (32 runs spread over the row)
_TILE = 256 if _INTERPRET else 1024  # candidates per step of the selection, and held in registers
_SMALL = 32 if _INTERPRET else 128  # the selection's last rounds run on this many candidates
_WARPS = {"sample": 8, "chunks": 4, "select": 8}  # "chunks": the gather and the fill, a row's chunk a program
# From this batch size the sample launch takes 4 warps (T = 256: 2 µs less; T = 128: 1 µs more, T = 1:
# 3 µs more). Its histograms and maxima are exact, so its results do not depend on the warps.
_FEW_SAMPLE_WARPS_MIN_T = 192
# From this batch size a launch of its own settles each row once (measured at T = 256: 3 µs, against
# about 9 µs more in the chunk programs when each settles its row); below it the gather programs do.
_SETTLE_LAUNCH_MIN_T = 32
# From that batch size too, a fill program takes this many chunks: in a batch of top-k rows, which
# the fill leaves alone, each program still costs a launch slot and the loads of its row settings.
_FILL_GROUP = 4
# From this batch size the selection fills each settled top-p-alone row itself once its threshold
# is known, and the fill launch is left out: rows whose search ends early fill while others still
# search (top-p alone, T = 256: 224 instead of 237 µs; T = 128: 153 either way). Below it the fill
# launch spreads a row over its chunks' programs (one program filling a whole row takes a chunk's
# candidate-load latency 19 times over).
_FILL_IN_SELECT_MIN_T = 128
# General path: tokens per step of a counting pass and of the mask pass, the first pass's pivots,
# and the bracket size sorted in registers (in the selection's scratch).
_BLOCK = 1024
_MASK_BLOCK = 4096
_PIVOTS = 16
_CAP = 256 if _INTERPRET else 2048
# The selection's sweeps keep per-thread statistics over groups of this many consecutive candidates:
# the values each of the selection's threads holds of a tile (4 on the GPU).
_SWEEP_GROUP = tl.constexpr(max(_TILE // (32 * _WARPS["select"]), 1))


# ----------------------------------------------------------------------------------------------
# Float keys and interval rounds


@triton.jit
def _float_key(x):
    """uint32 keys that order like the float32 values (x not NaN; -0.0 counts as +0.0). Integer
    operations only: subnormals keep their own keys even where float arithmetic flushes them."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0
    signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (signed ^ -2147483648).to(tl.uint32, bitcast=True)


@triton.jit
def _key_value(key):
    """The float32 whose key is `key` (the inverse of _float_key); NaN patterns give -inf."""
    signed = key.to(tl.int32, bitcast=True) ^ -2147483648
    x = (signed ^ ((signed >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return tl.where(x == x, x, float("-inf"))


@triton.jit
def _is_finite(x):
    return (x > float("-inf")) & (x < float("inf"))  # NaN is not


@triton.jit
def _in_interval(values, present, low, high):
    """Which values are present with keys in [low, high]."""
    key = _float_key(values)
    return present & (key >= low) & (key <= high)


@triton.jit
def _part_shift(low, high):
    """The shift that cuts the key interval [low, high] into at most 16 parts of 2^shift keys."""
    top = ((high - low).to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # rounding up only widens
    return tl.maximum(top - 3, 0).to(tl.uint32)


@triton.jit
def _part_starts(low, high, widen):
    """The keys where a round's 16 parts of [low, high] start ([16] uint32; a part starting at
    high + 1 is empty): 2^shift keys each, the fewest that cover the interval; or, with widen,
    j (j + 8) / 8 sixty-fourths of it for part j, widening from 1/64. A list's candidates crowd
    above its floor: on randn * 3 rows at p = 0.9 the answer's part then holds about 460 of 9 600
    candidates, a tile's worth, against about 2 100 in equal parts."""
    j = tl.arange(0, 16).to(tl.uint32)
    span = high - low  # uint32 throughout: keys stay below 0xFF800001 (+inf), 15 << 28 fits
    size = span + 1
    c = j * (j + 8) // 8
    widening = (size >> 6) * c + (((size & 63) * c) >> 6)  # floor(size * c / 64)
    offset = tl.where(widen, widening, j << _part_shift(low, high))
    return tl.where(offset <= span, low + offset, high + 1)


@triton.jit
def _interval_partials(values, present, low, high, starts, row_max, USE_MASS: tl.constexpr, GROUP: tl.constexpr):
    """For the values whose keys lie in [low, high], in the parts starting at `starts`: per part
    j < 16, the count of those in parts >= j, or with USE_MASS their mass relative to row_max, as
    [16, N / GROUP] sums over GROUP consecutive values each. With GROUP the values a thread holds,
    those sums stay in the thread's registers, so a sweep adds tiles up without any reduction
    across threads."""
    # [16, ...], not [..., 16]: Triton then spreads the values over the lanes as they were loaded
    # and keeps the 16 parts in each lane's registers (the other way round, it copies every value
    # to 16 lanes through shared memory).
    n: tl.constexpr = values.shape[0]
    shape: tl.constexpr = [1, n // GROUP, GROUP]
    at_least = tl.reshape(_float_key(values), shape) >= starts[:, None, None]
    inside = _in_interval(values, present, low, high)
    if USE_MASS:
        mass = tl.where(inside, tl.exp(values - row_max), 0.0)
        return tl.sum(tl.where(at_least, tl.reshape(mass, shape), 0.0), axis=2)
    else:
        return tl.sum((at_least & tl.reshape(inside, shape)).to(tl.int32), axis=2)


@triton.jit
def _interval_stats(values, present, low, high, starts, row_max, USE_MASS: tl.constexpr):
    """_interval_partials summed over all the values: [16]."""
    return tl.sum(_interval_partials(values, present, low, high, starts, row_max, USE_MASS, 1), axis=1)


@triton.jit
def _interval_round(high, starts, above, stat, target):
    """Narrows the key interval [starts[0], high] to its highest part d whose tokens (with those
    above the interval) reach target. Returns the new interval, the stat above it and d."""
    j = tl.arange(0, 16)
    d = tl.max(tl.where(above + stat >= target, j, 0))
    above += tl.sum(tl.where(j == d + 1, stat, 0))
    new_low = tl.sum(tl.where(j == d, starts, 0))
    new_high = tl.where(d == 15, high, tl.sum(tl.where(j == d + 1, starts, 0)) - 1)
    return new_low, new_high, above, d


@triton.jit
def _part_count(counts, d):
    """Tokens in part d, from the counts of the tokens in parts >= j (_interval_stats)."""
    j = tl.arange(0, 16)
    return tl.sum(tl.where(j == d, counts, 0)) - tl.sum(tl.where(j == d + 1, counts, 0))


# ----------------------------------------------------------------------------------------------
# The row workspace, in 4-byte words, S = number of segments, C = SEG_CAP:
#   header (8): lo, settled flag (0: no, 1: yes, 2: yes, on the candidates >= the second bound), exp
#     reference (the sample max), the threshold (written by the selection), row max, normaliser
#     relative to the row max, listed candidates, the second bound (the flag and the three after it
#     written once the row is settled)
#   per segment [S each]: max; normaliser and candidate mass relative to the reference; candidate
#     count; mass and count of the candidates >= the second bound (top-p alone); listed candidates
#     before it (written by the settle launch); one unused word (the pairs stay 8-byte aligned)
#   per segment [S, C] int64: its candidates, value bits << 32 | position; for top-p alone those
#     >= the second bound from the front, the others from the back, each in row order
#   the row's candidate list, once gathered: values [S * C]; the selection's buffer [S * C] (with top-k
#     on, the candidates' positions, and the pair regions, no longer read, take the compactions)
#   scratch [max(TILE, CAP)]
# _workspace_words gives the size, _workspace the pointers: keep the two together.
_HEADER = 8
# Header words (float32 unless said): lo, settled flag (int32), exp reference, threshold, row max,
# normaliser, listed candidates (int32), second bound.
_LO = tl.constexpr(0)
_FLAG = tl.constexpr(1)
_REF = tl.constexpr(2)
_THRESHOLD = tl.constexpr(3)
_ROW_MAX = tl.constexpr(4)
_TOTAL = tl.constexpr(5)
_LISTED = tl.constexpr(6)
_SECOND_BOUND = tl.constexpr(7)
_FLT_MAX = tl.constexpr(3.4028234663852886e38)  # the sample stores lo >= -_FLT_MAX: -inf is never a candidate
_LOG2E = tl.constexpr(1.4426950408889634)


def _workspace_words(num_segments: int) -> int:
    """Words per workspace row (a multiple of 16, so every row starts 64-byte aligned)."""
    return triton.cdiv(_HEADER + 8 * num_segments + 4 * num_segments * _SEG_CAP + max(_TILE, _CAP), 16) * 16


@triton.jit
def _workspace(ws_row, num_segments, SEG_CAP: tl.constexpr):
    """(segment max, normaliser, mass, count, mass and count above the second bound, listed
    candidates before it, candidate pairs, gathered values, the selection's buffer, scratch)
    pointers of a row's workspace. The pairs start 8-byte aligned: 8 + 8 S words in."""
    max_ptr = ws_row + 8
    count_ptr = (max_ptr + 3 * num_segments).to(tl.pointer_type(tl.int32))
    pairs_ptr = (max_ptr + 8 * num_segments).to(tl.pointer_type(tl.int64))
    values_ptr = max_ptr + 8 * num_segments + 2 * num_segments * SEG_CAP
    buffer_ptr = values_ptr + num_segments * SEG_CAP
    scratch_ptr = values_ptr + 2 * num_segments * SEG_CAP
    return (max_ptr, max_ptr + num_segments, max_ptr + 2 * num_segments, count_ptr, max_ptr + 4 * num_segments,
            count_ptr + 2 * num_segments, count_ptr + 3 * num_segments, pairs_ptr, values_ptr, buffer_ptr,
            scratch_ptr)


@triton.jit
def _header_int(ws_row, word):
    return (ws_row + word).to(tl.pointer_type(tl.int32))


@triton.jit
def _search_floor(ws_row, flag):
    """The floor of a settled row's threshold search: lo, or for flag 2 the second bound (only the
    candidates >= it are listed)."""
    return tl.load(ws_row + tl.where(flag == 2, _SECOND_BOUND, _LO))


@triton.jit
def _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL: tl.constexpr):
    """(k, p, k_on, p_on, active) of row t; an inactive row (slot out of range, both filters off) is left alone.
    Every launch starts with it. With programmatic dependent launch (PDL), the next launch may place
    its programs as soon as all of this one's have started, and a launch reads its row settings (the
    op's inputs, which no launch writes) while the previous one drains, then waits for it to finish:
    all that comes after may read or write what the previous launches touched."""
    if PDL:
        gdc_launch_dependents()
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    safe = tl.maximum(slot, 0)
    k = tl.load(top_k_ptr + safe)
    p = tl.load(top_p_ptr + safe)
    if PDL:
        gdc_wait()
    k_on = (k > 0) & (k < vocab_size)
    p_on = p < 1.0
    return k, p, k_on, p_on, (slot >= 0) & (k_on | p_on)


# ----------------------------------------------------------------------------------------------
# Launches 1-3


@triton.jit
def _sample_bound_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, SAMPLE: tl.constexpr, SEG_CAP: tl.constexpr, PDL: tl.constexpr,
):
    """A row's lower bound `lo` from a sample of its tokens, its exp reference, and for top-p alone a
    second bound above `lo`."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        i = tl.arange(0, SAMPLE)
        run = SAMPLE // 32
        offs = tl.where(vocab_size <= SAMPLE, i, (i // run) * (vocab_size // 32) + i % run)
        x = tl.load(logits_ptr + t.to(tl.int64) * logits_stride + offs, mask=offs < vocab_size,
                    other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))
        n_sample = tl.minimum(vocab_size, SAMPLE)
        if k_on:  # top-p, if on, runs inside the top-k set
            expected = k.to(tl.float32) * n_sample / vocab_size
            rank = tl.where(vocab_size <= SAMPLE, k, (expected + 4.0 * tl.sqrt(expected) + 4.0).to(tl.int32))
        else:  # top-p alone: where half the candidate capacity is expected above it
            budget = 0.5 * SEG_CAP * num_segments
            rank = (budget * n_sample / vocab_size).to(tl.int32)
        rank = tl.minimum(tl.maximum(rank, 1), n_sample)
        # lo: at least `rank` sampled values are >= lo. In a long row with rank <= 32, the rank-th
        # largest of the 32 runs' maxima (each of those runs holds a value >= it): on logits without
        # runs of large values, within a sample rank or two of the rank-th largest value. Else (and
        # always for top-p alone) the low end of a key interval at most 2^16 wide holding that value,
        # from two histograms of the keys (_rank_bounds).
        run_max = tl.max(tl.reshape(x, [32, SAMPLE // 32]), axis=1)
        runs_above = tl.sum((run_max[None, :] >= run_max[:, None]).to(tl.int32), axis=1)
        low = _float_key(tl.max(tl.where(runs_above >= rank, run_max, float("-inf"))))
        # Top-p alone: also a second bound, where a quarter of the capacity is expected above it. The
        # scan counts the mass above it too; when that holds top_p, only the candidates above it are kept.
        high_low = low
        if (k_on == 0) | (rank > 32) | (vocab_size <= SAMPLE):
            low, high_low = _rank_bounds(x, offs < vocab_size, low, rank, tl.where(k_on, rank, (rank + 1) // 2))
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        lo = tl.maximum(_key_value(low), -_FLT_MAX)  # -inf is never a candidate
        tl.store(ws_row + _LO, lo)
        high_bound = tl.where(k_on, float("inf"), tl.maximum(_key_value(high_low), lo))
        tl.store(ws_row + _SECOND_BOUND, high_bound)
        # The scan's exp reference; a row whose max is far above it is left to the general path.
        tl.store(ws_row + _REF, tl.max(x))


@triton.jit
def _add_and_max(a_count, a_max, b_count, b_max):
    return a_count + b_count, tl.maximum(a_max, b_max)


@triton.jit
def _highest_bin_reaching(h, above, rank):
    """The highest bin b of the histogram h with `above` + the values in bins >= b reaching rank (0
    when none does), and `above` + the values in the bins above it. One scan and one reduction: the
    bins reaching rank are a prefix."""
    at_or_above = above + tl.cumsum(h, axis=0, reverse=True)
    reaching = at_or_above >= rank
    n, above_top = tl.reduce((reaching.to(tl.int32), tl.where(reaching, above, at_or_above)), 0, _add_and_max)
    return tl.maximum(n - 1, 0), above_top


@triton.jit
def _rank_bounds(x, present, low, rank, rank_high):
    """For rank and rank_high <= rank: the low ends of key intervals 2^16 wide (or less, none below
    low) holding the rank-th and the rank_high-th largest of the present values x with keys >= low:
    at least `rank` (`rank_high`) of them are >= each. Two histograms instead of interval rounds:
    the keys' top bytes, then the second bytes within the one or two top bytes found, each in its
    half of a 512-bin histogram. With fewer than rank such values, low."""
    key = _float_key(x)
    inside = present & (key >= low)
    top = (key >> 24).to(tl.int32)
    tops = tl.histogram(top, 256, mask=inside)
    b1, above = _highest_bin_reaching(tops, 0, rank)
    b1_high, above_high = _highest_bin_reaching(tops, 0, rank_high)
    in_high = (top == b1_high) & (b1_high != b1)  # otherwise both read the first half
    second = ((key >> 16) & 0xFF).to(tl.int32) * 2 + in_high.to(tl.int32)
    seconds = tl.histogram(second, 512, mask=inside & ((top == b1) | (top == b1_high)))
    first_half, second_half = tl.split(tl.reshape(seconds, [256, 2]))
    b2, _ = _highest_bin_reaching(first_half, above, rank)
    b2_high, _ = _highest_bin_reaching(tl.where(b1_high != b1, second_half, first_half), above_high, rank_high)
    bound = ((b1 << 24) | (b2 << 16)).to(tl.uint32)
    bound_high = ((b1_high << 24) | (b2_high << 16)).to(tl.uint32)
    return tl.maximum(bound, low), tl.maximum(bound_high, low)


@triton.jit
def _lane_elements(x):
    """The 4 elements each lane holds of x [32, 4], as 4 tensors [32] (no data moves)."""
    even, odd = tl.split(tl.reshape(x, [32, 2, 2]))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _scan_step(x, offs, lo, lane_max, count, pairs_ptr, SEG_CAP: tl.constexpr):
    """One step of _scan_segment over x [32, 4] at offs (each lane 4 consecutive tokens): the
    running per-element max and candidate count, and the step's candidates (x >= lo) stored in the
    segment's region in token order."""
    lane_max = tl.maximum(lane_max, x)  # max.f32 passes over NaN
    candidate = x >= lo  # never NaN, never past the row (loaded as -inf; lo > -inf)
    taken = candidate.to(tl.int32)
    per_lane = tl.sum(taken, axis=1)
    slot = (count + tl.cumsum(per_lane, axis=0) - per_lane)[:, None] + tl.cumsum(taken, axis=1) - 1
    _store_candidates(pairs_ptr, slot, x, offs, candidate, SEG_CAP)
    return lane_max, count + tl.sum(per_lane, axis=0)


@triton.jit
def _store_candidates(pairs_ptr, slot, x, offs, candidate, SEG_CAP: tl.constexpr):
    """The candidates of a tile x [32, 4] at offs as (value bits, position) pairs at their slots."""
    pair = (x.to(tl.int32, bitcast=True).to(tl.uint32).to(tl.uint64) << 32) | offs.to(tl.uint64)
    stored = candidate & (slot >= 0) & (slot < SEG_CAP)  # a segment over capacity is never read
    # One store per token of the lane, so the scatter keeps the load's layout (no conversion).
    slots = _lane_elements(slot)
    pairs = _lane_elements(pair.to(tl.int64, bitcast=True))
    masks = _lane_elements(stored)
    for r in tl.static_range(4):
        tl.store(pairs_ptr + slots[r], pairs[r], mask=masks[r])


@triton.jit
def _scan_pair_with_mass(xa, xb, offs, lo, high_bound, ref2, lane_max, total, mass, mass_high, count, count_high,
                         pairs_ptr, SEG_CAP: tl.constexpr):
    """_scan_step's top-p-alone counterpart over two tiles [32, 4] at once, xa at offs and xb 128
    tokens on, with one warp scan for both and the sums per lane [32] (sm_90a: 284 instructions
    for the two tiles in a register loop, 310 in the pipelined loop of a full segment with its
    copies and waits, against 180 a tile one at a time). Also the mass and count of the tokens
    >= high_bound; those are stored from the front of the region, the other candidates from the back."""
    lane_max = tl.maximum(lane_max, tl.max(tl.maximum(xa, xb), axis=1))  # max.f32 passes over NaN
    # Clamping the exponent sends NaN and -inf to 2^-200, which is 0 in float32.
    ea = tl.math.exp2(tl.maximum(xa * _LOG2E - ref2, -200.0))
    eb = tl.math.exp2(tl.maximum(xb * _LOG2E - ref2, -200.0))
    candidate_a = xa >= lo  # never NaN, never past the row (loaded as -inf; lo > -inf)
    candidate_b = xb >= lo
    high_a = xa >= high_bound  # high_bound >= lo: candidates
    high_b = xb >= high_bound
    total += tl.sum(ea + eb, axis=1)
    mass += tl.sum(tl.where(candidate_a, ea, 0.0) + tl.where(candidate_b, eb, 0.0), axis=1)
    mass_high += tl.sum(tl.where(high_a, ea, 0.0) + tl.where(high_b, eb, 0.0), axis=1)
    # A lane's high candidates in the upper 16 bits, its others in the lower (at most 256 each).
    packed_a = tl.where(high_a, 65536, tl.where(candidate_a, 1, 0))
    packed_b = tl.where(high_b, 65536, tl.where(candidate_b, 1, 0))
    lane_a = tl.sum(packed_a, axis=1)
    packed_lane = lane_a + tl.sum(packed_b, axis=1)
    before = count_high * 65535 + count + tl.cumsum(packed_lane, axis=0) - packed_lane
    rank_a = before[:, None] + tl.cumsum(packed_a, axis=1) - packed_a
    rank_b = (before + lane_a)[:, None] + tl.cumsum(packed_b, axis=1) - packed_b
    slot_a = tl.where(high_a, rank_a >> 16, SEG_CAP - 1 - (rank_a & 0xFFFF))
    slot_b = tl.where(high_b, rank_b >> 16, SEG_CAP - 1 - (rank_b & 0xFFFF))
    packed_step = tl.sum(packed_lane, axis=0)
    count += (packed_step >> 16) + (packed_step & 0xFFFF)
    count_high += packed_step >> 16
    _store_candidates(pairs_ptr, slot_a, xa, offs, candidate_a, SEG_CAP)
    _store_candidates(pairs_ptr, slot_b, xb, offs + 128, candidate_b, SEG_CAP)
    return lane_max, total, mass, mass_high, count, count_high


@triton.jit
def _segment_tile(row_ptr, offs, start, vocab_size, FULL: tl.constexpr, SEGMENT: tl.constexpr):
    """The tile of 128 tokens at offs, `start` tokens into the segment: unmasked in a FULL segment
    (all of it in the row, and start < SEGMENT), otherwise -inf past the segment or the row."""
    if FULL:
        return tl.load(row_ptr + offs).to(tl.float32)
    else:
        return tl.load(row_ptr + offs, mask=(start < SEGMENT) & (offs < vocab_size),
                       other=float("-inf")).to(tl.float32)


@triton.jit
def _scan_segment(row_ptr, offs, vocab_size, lo, pairs_ptr, SEGMENT: tl.constexpr, SEG_CAP: tl.constexpr):
    """_scan_step over the segment's tiles from offs [32, 4] (rows with top-k on): the segment's
    max and candidate count. Three tiles' loads stay in flight while one is counted."""
    STEP: tl.constexpr = 128
    # Masked loads throughout: unmasked ones in a segment wholly inside the row were no faster (k = 50
    # alone at T = 256: 110 µs masked, 112 unmasked, in two calls; session 11 had them 1 µs slower).
    lane_max = tl.full([32, 4], float("-inf"), tl.float32)
    count = 0
    x0 = _segment_tile(row_ptr, offs, 0, vocab_size, False, SEGMENT)
    x1 = _segment_tile(row_ptr, offs + STEP, STEP, vocab_size, False, SEGMENT)
    x2 = _segment_tile(row_ptr, offs + 2 * STEP, 2 * STEP, vocab_size, False, SEGMENT)
    x3 = _segment_tile(row_ptr, offs + 3 * STEP, 3 * STEP, vocab_size, False, SEGMENT)
    # Four tiles a loop iteration, each variable reloaded four tiles on as soon as its tile is
    # counted: the loop carries its tiles in place (rotating them cost 12 register moves a tile;
    # sm_90a: 337 instructions for four tiles, against 106 a tile with the rotation).
    for v0 in range(0, SEGMENT, 4 * STEP):
        lane_max, count = _scan_step(x0, offs, lo, lane_max, count, pairs_ptr, SEG_CAP)
        x0 = _segment_tile(row_ptr, offs + 4 * STEP, v0 + 4 * STEP, vocab_size, False, SEGMENT)
        lane_max, count = _scan_step(x1, offs + STEP, lo, lane_max, count, pairs_ptr, SEG_CAP)
        x1 = _segment_tile(row_ptr, offs + 5 * STEP, v0 + 5 * STEP, vocab_size, False, SEGMENT)
        lane_max, count = _scan_step(x2, offs + 2 * STEP, lo, lane_max, count, pairs_ptr, SEG_CAP)
        x2 = _segment_tile(row_ptr, offs + 6 * STEP, v0 + 6 * STEP, vocab_size, False, SEGMENT)
        lane_max, count = _scan_step(x3, offs + 3 * STEP, lo, lane_max, count, pairs_ptr, SEG_CAP)
        x3 = _segment_tile(row_ptr, offs + 7 * STEP, v0 + 7 * STEP, vocab_size, False, SEGMENT)
        offs += 4 * STEP
    return tl.max(tl.max(lane_max, axis=1), axis=0), count


@triton.jit
def _scan_segment_with_mass(row_ptr, offs, vocab_size, lo, high_bound, ref2, pairs_ptr, FULL: tl.constexpr,
                            SEGMENT: tl.constexpr, SEG_CAP: tl.constexpr, STAGES: tl.constexpr):
    """_scan_pair_with_mass over the segment's tiles from offs [32, 4], two tiles a step: the
    segment's max, normaliser, masses and counts. Triton's pipeliner keeps STAGES - 1 steps' loads
    in flight (cp.async into shared memory, no registers held)."""
    STEP: tl.constexpr = 128
    lane_max = tl.full([32], float("-inf"), tl.float32)
    total = tl.zeros([32], tl.float32)
    mass = tl.zeros([32], tl.float32)
    mass_high = tl.zeros([32], tl.float32)
    count = 0
    count_high = 0
    for v0 in tl.range(0, SEGMENT, 2 * STEP, num_stages=STAGES):
        x0 = _segment_tile(row_ptr, offs + v0, v0, vocab_size, FULL, SEGMENT)
        x1 = _segment_tile(row_ptr, offs + v0 + STEP, v0 + STEP, vocab_size, FULL, SEGMENT)
        lane_max, total, mass, mass_high, count, count_high = _scan_pair_with_mass(
            x0, x1, offs + v0, lo, high_bound, ref2, lane_max, total, mass, mass_high, count, count_high, pairs_ptr,
            SEG_CAP)
    return (tl.max(lane_max, axis=0), tl.sum(total, axis=0), tl.sum(mass, axis=0), tl.sum(mass_high, axis=0),
            count, count_high)


@triton.jit
def _scan_segments_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, SEGMENT: tl.constexpr, SEG_CAP: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """Statistics and candidates of one segment, in one warp: its max, normaliser and candidate mass
    (only for top-p alone: with top-k on, the selection weighs its own candidates), and its
    candidates (_scan_segment). A tile is 4 consecutive tokens a lane; with one warp a program, a
    tile's prefix sums never wait on a block-wide barrier (with several warps, Triton 3.6 spread a
    tile's lanes over warps)."""
    t = tl.program_id(0)
    segment = tl.program_id(1)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        lo = tl.load(ws_row + _LO)
        ref2 = tl.load(ws_row + _REF) * _LOG2E
        high_bound = tl.load(ws_row + _SECOND_BOUND)
        row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
        (max_ptr, sum_ptr, mass_ptr, count_ptr, mass_high_ptr, count_high_ptr, _,
         pairs_ptr) = _workspace(ws_row, num_segments, SEG_CAP)[:8]
        pairs_ptr += segment * SEG_CAP
        offs = segment * SEGMENT + tl.arange(0, 32)[:, None] * 4 + tl.arange(0, 4)[None, :]
        full = (segment + 1) * SEGMENT <= vocab_size  # the segment lies in the row: unmasked top-p loads
        if k_on:
            seg_max, count = _scan_segment(row_ptr, offs, vocab_size, lo, pairs_ptr, SEGMENT, SEG_CAP)
        else:
            if full:
                seg_max, total, mass, mass_high, count, count_high = _scan_segment_with_mass(
                    row_ptr, offs, vocab_size, lo, high_bound, ref2, pairs_ptr, True, SEGMENT, SEG_CAP, STAGES)
            else:
                seg_max, total, mass, mass_high, count, count_high = _scan_segment_with_mass(
                    row_ptr, offs, vocab_size, lo, high_bound, ref2, pairs_ptr, False, SEGMENT, SEG_CAP, STAGES)
            tl.store(sum_ptr + segment, total)
            tl.store(mass_ptr + segment, mass)
            tl.store(mass_high_ptr + segment, mass_high)
            tl.store(count_high_ptr + segment, count_high)
        tl.store(max_ptr + segment, seg_max)
        tl.store(count_ptr + segment, count)


@triton.jit
def _settle_row(ws_row, num_segments, k, p, k_on, SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr):
    """Combines the segment statistics in segment order: whether the candidates settle the row (flag
    1: no segment overflowed, and they hold the k tokens or the top_p mass; 2: top-p alone, and the
    candidates >= the second bound hold the mass, so only they are listed), each segment's listed
    candidates, the row max and the normaliser (top-p alone). A row whose max is more than 60 above
    the scan's reference is not settled (a segment's float32 sums could have overflowed), nor one
    holding +inf: the general path alone deals with those."""
    (max_ptr, sum_ptr, mass_ptr, count_ptr, mass_high_ptr,
     count_high_ptr) = _workspace(ws_row, num_segments, SEG_CAP)[:6]
    g = tl.arange(0, SEGMENTS_P2)
    in_row = g < num_segments
    with_mass = g < tl.where(k_on, 0, num_segments)  # top-p alone
    row_max = tl.max(tl.load(max_ptr + g, mask=in_row, other=float("-inf")))
    ref = tl.load(ws_row + _REF)
    scale = tl.where(row_max <= ref + 60.0, tl.exp(ref - row_max), float("nan"))
    total = tl.sum(tl.load(sum_ptr + g, mask=with_mass, other=0.0)) * scale
    mass = tl.sum(tl.load(mass_ptr + g, mask=with_mass, other=0.0)) * scale
    mass_high = tl.sum(tl.load(mass_high_ptr + g, mask=with_mass, other=0.0)) * scale
    counts = tl.load(count_ptr + g, mask=in_row, other=0)
    counts_high = tl.load(count_high_ptr + g, mask=with_mass, other=0)
    enough = tl.where(k_on, tl.sum(counts) >= k, mass >= p * total)  # NaN: not settled
    settled = _is_finite(row_max) & (tl.max(counts) <= SEG_CAP) & enough
    narrow = (k_on == 0) & (mass_high >= p * total)
    flag = tl.where(settled, tl.where(narrow, 2, 1), 0)
    listed = tl.where(narrow, counts_high, counts)
    return flag, listed, row_max, total


@triton.jit
def _store_settlement(ws_row, flag, row_max, total, listed):
    """The header words the selection reads: the settled flag, row max, normaliser and list size."""
    tl.store(_header_int(ws_row, _FLAG), flag)
    tl.store(ws_row + _ROW_MAX, row_max)
    tl.store(ws_row + _TOTAL, total)
    tl.store(_header_int(ws_row, _LISTED), tl.sum(listed))


@triton.jit
def _settle_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr, PDL: tl.constexpr,
):
    """A large batch's rows settled once each, one warp a row (see _SETTLE_LAUNCH_MIN_T): the header
    and each segment's offset in the row's list."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        flag, listed, row_max, total = _settle_row(ws_row, num_segments, k, p, k_on, SEG_CAP, SEGMENTS_P2)
        _store_settlement(ws_row, flag, row_max, total, listed)
        g = tl.arange(0, SEGMENTS_P2)
        first_ptr = _workspace(ws_row, num_segments, SEG_CAP)[6]
        tl.store(first_ptr + g, tl.cumsum(listed, axis=0) - listed, mask=g < num_segments)


@triton.jit
def _listed_candidates(ws_row, num_segments, mine, flag, k_on, SEG_CAP: tl.constexpr):
    """The listed candidates of segments `mine` [SEGMENTS], as [SEGMENTS, SEG_CAP]: values,
    positions, which are present, and how many each segment lists."""
    count_ptr, _, count_high_ptr = _workspace(ws_row, num_segments, SEG_CAP)[3:6]
    pairs_ptr = _workspace(ws_row, num_segments, SEG_CAP)[7]
    counts = tl.load(count_ptr + mine, mask=mine < num_segments, other=0)
    # The scan writes counts_high for top-p alone only. (A select, not `& ~k_on`: the interpreter
    # turns a scalar & a tensor into an int32 mask, which tl.load refuses.)
    counts_high = tl.load(count_high_ptr + mine, mask=tl.where(k_on, False, mine < num_segments), other=0)
    n = tl.where(flag == 2, counts_high, counts)  # as _settle_row lists them
    n_front = tl.where(k_on, counts, counts_high)  # see _scan_step and _scan_pair_with_mass
    i = tl.arange(0, SEG_CAP)[None, :]
    present = i < n[:, None]
    source = tl.where(i < n_front[:, None], i, SEG_CAP - 1 - (i - n_front[:, None]))
    pair = tl.load(pairs_ptr + mine[:, None] * SEG_CAP + source, mask=present, other=0)
    return (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True), pair.to(tl.int32), present, n


@triton.jit
def _gather_chunks_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr,
    SETTLED: tl.constexpr, PDL: tl.constexpr,
):
    """A row's chunk of SEGMENTS segments. Unless the settle launch ran (SETTLED), each program
    settles the row from the segment statistics (all of a row's programs reach the same bits; the
    first writes the header). In a settled row: the segments' listed candidate values gathered into
    the row's candidate list, at their offsets in segment order; with top-k on, also their positions
    (into the selection's buffer), and -inf over the chunk."""
    t = tl.program_id(0)
    c = tl.program_id(1)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        mine = c * SEGMENTS + tl.arange(0, SEGMENTS)
        if SETTLED:
            flag = tl.load(_header_int(ws_row, _FLAG))
        else:
            flag, listed, row_max, total = _settle_row(ws_row, num_segments, k, p, k_on, SEG_CAP, SEGMENTS_P2)
            if c == 0:
                _store_settlement(ws_row, flag, row_max, total, listed)
        if flag != 0:
            values, positions, present, n = _listed_candidates(ws_row, num_segments, mine, flag, k_on, SEG_CAP)
            if SETTLED:
                first_ptr = _workspace(ws_row, num_segments, SEG_CAP)[6]
                first = tl.load(first_ptr + mine, mask=mine < num_segments, other=0)
            else:
                first = tl.sum(tl.where(tl.arange(0, SEGMENTS_P2) < c * SEGMENTS, listed, 0)) + tl.cumsum(n, axis=0) - n
            values_ptr, buffer_ptr = _workspace(ws_row, num_segments, SEG_CAP)[8:10]
            dest = first[:, None] + tl.arange(0, SEG_CAP)[None, :]
            tl.store(values_ptr + dest, values, mask=present)
            # With top-k on the selection writes the few kept candidates back from their positions.
            # Top-p alone keeps thousands: the fill restores them chunk by chunk instead (module docstring).
            if k_on:
                tl.store(buffer_ptr.to(tl.pointer_type(tl.int32)) + dest, positions, mask=present)
                offs = c * CHUNK + tl.arange(0, CHUNK)
                row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
                tl.store(row_ptr + offs, tl.full([CHUNK], float("-inf"), row_ptr.dtype.element_ty),
                         mask=offs < vocab_size)


@triton.jit
def _fill_chunks_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, SEG_CAP: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """For top-p alone, once the selection found a settled row's threshold, GROUP chunks of SEGMENTS
    segments each: -inf over a chunk, then, after a block barrier, its segments' listed candidates
    >= the threshold restored (their positions lie in the chunk: the barrier orders every -inf
    store of the chunk before any restore)."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        flag = tl.load(_header_int(ws_row, _FLAG))
        if (flag != 0) & (k_on == 0):
            threshold = tl.load(ws_row + _THRESHOLD)
            row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
            first_chunk = tl.program_id(1) * GROUP
            for c in range(first_chunk, tl.minimum(first_chunk + GROUP, tl.cdiv(vocab_size, CHUNK))):
                mine = c * SEGMENTS + tl.arange(0, SEGMENTS)
                values, positions, present, _ = _listed_candidates(ws_row, num_segments, mine, flag, k_on, SEG_CAP)
                _fill_chunk(row_ptr, c, vocab_size, threshold, values, positions, present, CHUNK)


@triton.jit
def _fill_chunk(row_ptr, c, vocab_size, threshold, values, positions, present, CHUNK: tl.constexpr):
    """-inf over chunk c of a row, then, after a block barrier, the chunk's listed candidates
    (values, positions, present) >= the threshold restored. Their positions lie in the chunk, and
    only this program writes it: the barrier orders every -inf store of the chunk before any restore."""
    offs = c * CHUNK + tl.arange(0, CHUNK)
    tl.store(row_ptr + offs, tl.full([CHUNK], float("-inf"), row_ptr.dtype.element_ty), mask=offs < vocab_size)
    tl.debug_barrier()
    tl.store(row_ptr + positions, values.to(row_ptr.dtype.element_ty), mask=present & (values >= threshold))


# ----------------------------------------------------------------------------------------------
# Launch 4: exact thresholds from the candidates


@triton.jit
def _candidate_values(src_ptr, count, start, TILE: tl.constexpr):
    """Values start .. start + TILE of a candidate list (-inf past the last) and which are present.
    .cg: a list compacted by this program is read back after a barrier, past the SM's L1."""
    i = start + tl.arange(0, TILE)
    present = i < count
    return tl.load(src_ptr + i, mask=present, other=float("-inf"), cache_modifier=".cg"), present


@triton.jit
def _compact_tile(values, present, low, high, dst_ptr, base, cap):
    """Stores the values of a tile whose keys lie in [low, high] at dst[base:], in order (at most
    cap in all); returns base + how many."""
    # As [threads, the values a thread holds]: a scan within each thread, then one over the
    # threads' counts, in the layout the values were loaded in. (A scan of the [TILE] tile takes a
    # layout of one value a thread, and its store then converts every operand through shared
    # memory: sm_90a, 365 instructions and 13 block barriers a tile, against 154 and 5.)
    n: tl.constexpr = values.shape[0]
    shape: tl.constexpr = [n // _SWEEP_GROUP, _SWEEP_GROUP]
    inside = tl.reshape(_in_interval(values, present, low, high).to(tl.int32), shape)
    per_thread = tl.sum(inside, axis=1)
    slot = (base + tl.cumsum(per_thread, axis=0) - per_thread)[:, None] + tl.cumsum(inside, axis=1) - 1
    tl.store(dst_ptr + slot, tl.reshape(values, shape), mask=(inside != 0) & (slot < cap))
    return base + tl.sum(per_thread, axis=0)


@triton.jit
def _compact(src_ptr, n, low, high, dst_ptr, cap, TILE: tl.constexpr):
    """Copies, in order, the values of src[:n] whose keys lie in [low, high] to dst (at most cap).
    Returns how many lie there."""
    tl.debug_barrier()  # an earlier step of this program may still read dst
    base = 0
    values, present = _candidate_values(src_ptr, n, 0, TILE)
    for start in range(TILE, n + TILE, TILE):
        next_values, next_present = _candidate_values(src_ptr, n, start, TILE)  # in flight meanwhile
        base = _compact_tile(values, present, low, high, dst_ptr, base, cap)
        values, present = next_values, next_present
    tl.debug_barrier()
    return base


@triton.jit
def _unsettled(low, high, above, in_bracket, target, USE_MASS: tl.constexpr):
    """Whether the answer may still be above the bracket's smallest value: more than one key left,
    and more than one token (masses) or more tokens than needed (counts)."""
    if USE_MASS:
        return (high != low) & (in_bracket > 1)
    else:
        return (high != low) & (above + in_bracket > target)


@triton.jit
def _register_rounds(values, present, low, high, above, in_bracket, row_max, target, widen, STOP_AT: tl.constexpr,
                     USE_MASS: tl.constexpr):
    """Interval rounds on values held in registers, until the answer is the bracket's smallest
    value or the bracket holds at most STOP_AT tokens, the first in widening parts if widen (see
    _part_starts). Returns the bracket and whether it is unsettled."""
    unsettled = _unsettled(low, high, above, in_bracket, target, USE_MASS)
    while unsettled & (in_bracket > STOP_AT):
        starts = _part_starts(low, high, widen)
        widen = tl.full([], False, tl.int1)
        stats = _interval_stats(values, present, low, high, starts, row_max, USE_MASS)
        low, high, above, d = _interval_round(high, starts, above, stats, target)
        if USE_MASS:  # one count for the part kept, rather than 16 counts summed over the block
            in_bracket = tl.sum(_in_interval(values, present, low, high).to(tl.int32))
        else:
            in_bracket = _part_count(stats, d)
        unsettled = _unsettled(low, high, above, in_bracket, target, USE_MASS)
    return low, high, above, in_bracket, unsettled, widen


@triton.jit
def _select_threshold(values_ptr, buffer_ptr, list_size, scratch_ptr, count, lo, low, high, above, in_bracket,
                      row_max, target, USE_MASS: tl.constexpr, TILE: tl.constexpr, SMALL: tl.constexpr):
    """The largest candidate value v in the key interval [low, high] whose count (or mass relative to
    row_max) of candidates >= v, with `above` (the count or mass of those above the interval),
    reaches target; lo when none does. `count` candidates in all, `in_bracket` of them in the
    interval. Each round cuts the interval still holding the answer into at most 16 parts of a
    power-of-two size and keeps one, so about 8 rounds fix a key; the first round's parts widen
    upwards from 1/64 of the interval instead (_part_starts).
    While the interval holds more than TILE candidates a round sweeps the list; then the list is
    compacted to the part kept, into the buffer of list_size words at buffer_ptr, then within it (a
    compaction never writes past what it has read). A count round compacts only a list at least
    twice the part's size, or one that would not fit a tile; a mass round always does, and takes
    the part's size from it: its sweep sums masses only, a third fewer instructions than with the
    counts. Then the rounds run on TILE, then on SMALL candidates in registers. The list itself is
    left as it was."""
    src_ptr = values_ptr
    n = count
    widen = tl.full([], True, tl.int1)
    while (in_bracket > TILE) & (high > low):
        starts = _part_starts(low, high, widen)
        widen = tl.full([], False, tl.int1)
        # Each thread sums its own values' statistics over the sweep; one reduction a round.
        if USE_MASS:
            stats = tl.zeros([16, TILE // _SWEEP_GROUP], tl.float32)
        else:
            stats = tl.zeros([16, TILE // _SWEEP_GROUP], tl.int32)
        values, present = _candidate_values(src_ptr, n, 0, TILE)
        for start in range(TILE, n + TILE, TILE):
            # The next tile loads while this one is counted.
            next_values, next_present = _candidate_values(src_ptr, n, start, TILE)
            stats += _interval_partials(values, present, low, high, starts, row_max, USE_MASS, _SWEEP_GROUP)
            values, present = next_values, next_present
        stats = tl.sum(stats, axis=1)
        low, high, above, d = _interval_round(high, starts, above, stats, target)
        if USE_MASS:  # the part's size from compacting it
            in_bracket = _compact(src_ptr, n, low, high, buffer_ptr, list_size, TILE)
            src_ptr = buffer_ptr
            n = in_bracket
        else:
            in_bracket = _part_count(stats, d)
            if (in_bracket * 2 <= n) | ((in_bracket <= TILE) & (n > TILE)):
                _compact(src_ptr, n, low, high, buffer_ptr, list_size, TILE)
                src_ptr = buffer_ptr
                n = in_bracket
    if n > TILE:  # all keys alike (high == low), or no round ran
        _compact(src_ptr, n, low, high, scratch_ptr, TILE, TILE)
        src_ptr = scratch_ptr
        n = tl.minimum(in_bracket, TILE)
    values, present = _candidate_values(src_ptr, n, 0, TILE)
    low, high, above, in_bracket, unsettled, widen = _register_rounds(values, present, low, high, above, in_bracket,
                                                                       row_max, target, widen, SMALL, USE_MASS)
    smallest = tl.min(tl.where(_in_interval(values, present, low, high), values, float("inf")))
    if unsettled:  # at most SMALL tokens left: on to a smaller tile
        tl.debug_barrier()  # the scratch may still be read
        _compact_tile(values, present, low, high, scratch_ptr, 0, SMALL)
        tl.debug_barrier()
        small, small_present = _candidate_values(scratch_ptr, tl.minimum(in_bracket, SMALL), 0, SMALL)
        low, high, above, in_bracket, _, _ = _register_rounds(small, small_present, low, high, above, in_bracket,
                                                              row_max, target, widen, 0, USE_MASS)
        smallest = tl.min(tl.where(_in_interval(small, small_present, low, high), small, float("inf")))
    return tl.maximum(tl.where(smallest < float("inf"), smallest, _key_value(low)), lo)


@triton.jit
def _candidate_mass(values_ptr, count, row_max, floor, TILE: tl.constexpr):
    """Mass (relative to row_max) and number of the candidates >= floor."""
    mass = 0.0
    kept = 0
    for start in range(0, count, TILE):
        values, present = _candidate_values(values_ptr, count, start, TILE)
        inside = present & (values >= floor)
        mass += tl.sum(tl.where(inside, tl.exp(values - row_max), 0.0))
        kept += tl.sum(inside.to(tl.int32))
    return mass, kept


@triton.jit
def _select_row(row_ptr, ws_row, flag, pairs_ptr, values_ptr, buffer_ptr, scratch_ptr, num_segments, vocab_size, k,
                p, k_on, p_on, SEG_CAP: tl.constexpr, TILE: tl.constexpr, SMALL: tl.constexpr, FILL: tl.constexpr,
                CHUNK: tl.constexpr, SEGMENTS: tl.constexpr):
    """A settled row's threshold, from its candidate list, applied: with top-k on, the kept
    candidates written back here from the positions the gather listed in the buffer (the pair
    regions, which the fill then does not read, take the compactions); for top-p alone, with FILL,
    the row filled here chunk by chunk as the fill launch does (the next chunk's candidates load
    while one is written), or the threshold stored for the fill launch."""
    list_size = num_segments * SEG_CAP
    positions_ptr = buffer_ptr.to(tl.pointer_type(tl.int32))
    if k_on:
        buffer_ptr = pairs_ptr.to(tl.pointer_type(tl.float32))
    lo = _search_floor(ws_row, flag)
    row_max = tl.load(ws_row + _ROW_MAX)
    total = tl.load(ws_row + _TOTAL)
    count = tl.load(_header_int(ws_row, _LISTED))
    low = _float_key(lo)
    high = _float_key(row_max)
    threshold = lo
    if k_on:
        threshold = _select_threshold(values_ptr, buffer_ptr, list_size, scratch_ptr, count, lo, low, high,
                                      tl.full([], 0, tl.int32), count, row_max, k, False, TILE, SMALL)
    if p_on:
        if k_on:  # renormalised over the top-k set
            kept_mass, in_set = _candidate_mass(values_ptr, count, row_max, threshold, TILE)
            target = tl.maximum(p * kept_mass, 1e-30)  # top_p <= 0 keeps the most probable token(s)
            low = _float_key(threshold)
        else:
            target = tl.maximum(p * total, 1e-30)
            in_set = count
        threshold = _select_threshold(values_ptr, buffer_ptr, list_size, scratch_ptr, count, lo, low, high,
                                      tl.full([], 0.0, tl.float32), in_set, row_max, target, True, TILE, SMALL)
    if k_on:  # the next tile loads while one is written back
        values, present = _candidate_values(values_ptr, count, 0, TILE)
        positions = tl.load(positions_ptr + tl.arange(0, TILE), mask=present)
        for start in range(TILE, count + TILE, TILE):
            next_values, next_present = _candidate_values(values_ptr, count, start, TILE)
            next_positions = tl.load(positions_ptr + start + tl.arange(0, TILE), mask=next_present)
            tl.store(row_ptr + positions, values.to(row_ptr.dtype.element_ty), mask=present & (values >= threshold))
            values, present, positions = next_values, next_present, next_positions
    elif FILL:
        mine = tl.arange(0, SEGMENTS)
        listed, listed_at, is_listed, _ = _listed_candidates(ws_row, num_segments, mine, flag, k_on, SEG_CAP)
        for c in range(0, tl.cdiv(vocab_size, CHUNK)):
            mine += SEGMENTS  # past the last segment: nothing listed, nothing loaded
            next_listed, next_at, next_is_listed, _ = _listed_candidates(ws_row, num_segments, mine, flag, k_on,
                                                                         SEG_CAP)
            _fill_chunk(row_ptr, c, vocab_size, threshold, listed, listed_at, is_listed, CHUNK)
            listed, listed_at, is_listed = next_listed, next_at, next_is_listed
    else:
        tl.store(ws_row + _THRESHOLD, threshold)


# ----------------------------------------------------------------------------------------------
# The general path


@triton.jit
def _first_pass(row_ptr, vocab_size, BLOCK: tl.constexpr, P: tl.constexpr):
    """Row statistics (max, the largest finite value, how many are valid, above -inf, and how many
    +inf, normaliser) and the first pivot counts. Pivot P-1 is the row min: count and mass of all.
    The pivots are finite."""
    offs = tl.arange(0, BLOCK)
    x0 = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
    anchor = tl.max(tl.where(_is_finite(x0), x0, float("-inf")))
    anchor = tl.where(anchor > float("-inf"), anchor, 0.0)
    j = tl.arange(0, P)
    # Geometric gaps below anchor + 4: 0, 0.125, 0.31, 0.59, 1.0, ... 112 (ratio 1.5).
    pivots = anchor + 4.0 - 0.25 * (tl.exp2(j.to(tl.float32) * 0.5849625007211562) - 1.0)

    row_max = float("-inf")
    finite_max = float("-inf")
    row_min = float("inf")
    count = 0
    infinite = 0
    total = 0.0
    counts = tl.zeros([P], tl.int32)
    masses = tl.zeros([P], tl.float32)
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        valid = x > float("-inf")  # NaN too is never valid
        new_max = tl.maximum(row_max, tl.max(tl.where(valid, x, float("-inf"))))
        shift = tl.where(new_max > float("-inf"), new_max, 0.0)  # no -inf - -inf while nothing is valid
        rescale = tl.exp(row_max - shift)
        e = tl.where(valid, tl.exp(x - shift), 0.0)
        above = x[:, None] >= pivots[None, :]
        counts += tl.sum(above.to(tl.int32), axis=0)
        masses = masses * rescale + tl.sum(tl.where(above, e[:, None], 0.0), axis=0)
        total = total * rescale + tl.sum(e)
        count += tl.sum(valid.to(tl.int32))
        infinite += tl.sum((x == float("inf")).to(tl.int32))
        finite_max = tl.maximum(finite_max, tl.max(tl.where(_is_finite(x), x, float("-inf"))))
        row_min = tl.minimum(row_min, tl.min(tl.where(_is_finite(x), x, float("inf"))))
        row_max = new_max
    last = j == P - 1
    pivots = tl.where(last, row_min, tl.maximum(pivots, row_min))
    counts = tl.where(last, count, counts)
    masses = tl.where(last, total, masses)
    return pivots, counts, masses, row_max, finite_max, count, infinite, total


@triton.jit
def _bracket(pivots, counts, masses, target, infinite, USE_MASS: tl.constexpr, P: tl.constexpr):
    """The values [lo, hi) between the first pivot whose count (or mass) reaches target and the
    pivot above it (+inf above the first), with the count and mass of the tokens >= hi (`infinite`
    +inf tokens above the first) and the number of tokens in it."""
    j = tl.arange(0, P)
    if USE_MASS:
        reached = masses >= target
    else:
        reached = counts.to(tl.float32) >= target
    first = tl.min(tl.where(reached, j, P - 1))  # pivot P - 1 (the row min) holds every token
    lo = tl.max(tl.where(j == first, pivots, float("-inf")))
    hi = tl.where(first == 0, float("inf"), tl.max(tl.where(j == first - 1, pivots, float("-inf"))))
    count_above = tl.where(first == 0, infinite, tl.sum(tl.where(j == first - 1, counts, 0)))
    mass_above = tl.sum(tl.where(j == first - 1, masses, 0.0))
    n_inside = tl.sum(tl.where(j == first, counts, 0)) - count_above
    return lo, hi, count_above, mass_above, n_inside


@triton.jit
def _key_round_stats(row_ptr, vocab_size, low, high, starts, row_max, USE_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over the row: per part j of the key interval [low, high], the count, or with
    USE_MASS the mass relative to row_max, of the row's tokens in parts >= j ([16])."""
    # One statistic a pass: two [16, threads] sums would not fit the selection kernel's registers.
    if USE_MASS:
        stats = tl.zeros([16, BLOCK // _SWEEP_GROUP], tl.float32)
    else:
        stats = tl.zeros([16, BLOCK // _SWEEP_GROUP], tl.int32)
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        in_row = offs < vocab_size
        x = tl.load(row_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
        stats += _interval_partials(x, in_row, low, high, starts, row_max, USE_MASS, _SWEEP_GROUP)
    return tl.sum(stats, axis=1)


@triton.jit
def _key_count(row_ptr, vocab_size, low, high, BLOCK: tl.constexpr):
    """How many of the row's tokens have keys in [low, high]."""
    count = tl.zeros([BLOCK], tl.int32)
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        in_row = offs < vocab_size
        x = tl.load(row_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
        count += _in_interval(x, in_row, low, high).to(tl.int32)
    return tl.sum(count)


@triton.jit
def _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max, infinite, pivots, counts, masses,
                    target, USE_MASS: tl.constexpr, P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """The largest finite row value v whose count / mass of tokens >= v reaches target, and the mass
    of the finite tokens >= v; the `infinite` +inf tokens (top-k only) are counted above every finite
    pivot. Exact for any finite row: the first pass's pivots give a bracket, which key rounds narrow
    (each keeps the one of 16 parts of its key interval holding the answer, so the interval shrinks
    at least 8-fold a round and reaches a single key within 11) until at most CAP tokens are left,
    which are sorted in registers. A single key left is the answer, with all its ties."""
    lo, hi, above_count, above_mass, in_bracket = _bracket(pivots, counts, masses, target, infinite, USE_MASS, P)
    # [lo, hi) as keys, capped at the largest finite value (hi may be +inf, or above it).
    low = _float_key(lo)
    high = tl.minimum(_float_key(hi) - 1, _float_key(finite_max))
    while (in_bracket > CAP) & (high > low):
        starts = _part_starts(low, high, False)
        stats = _key_round_stats(row_ptr, vocab_size, low, high, starts, row_max, USE_MASS, BLOCK)
        if USE_MASS:
            low, high, above_mass, d = _interval_round(high, starts, above_mass, stats, target)
            in_bracket = _key_count(row_ptr, vocab_size, low, high, BLOCK)
        else:
            low, high, above_count, d = _interval_round(high, starts, above_count, stats, target)
            in_bracket = _part_count(stats, d)

    # One more pass: the mass of the finite tokens above the bracket (in one order, whichever
    # rounds ran) and, when they fit, the bracket's tokens compacted into the scratch.
    compact = in_bracket <= CAP
    tl.debug_barrier()  # an earlier search may still be reading the scratch
    base = 0
    mass = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        in_row = offs < vocab_size
        x = tl.load(row_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
        mass += tl.where(_is_finite(x) & (_float_key(x) > high), tl.exp(x - row_max), 0.0)
        if compact:
            base = _compact_tile(x, in_row, low, high, scratch_ptr, base, CAP)
    above_mass = tl.sum(mass)
    tl.debug_barrier()
    k = tl.arange(0, CAP)
    if compact:
        ranked = tl.sort(tl.load(scratch_ptr + k, mask=k < in_bracket, other=float("-inf"), cache_modifier=".cg"),
                         descending=True)
    else:  # a single key left: every bracket token has its value
        ranked = tl.where(k < in_bracket, _key_value(low), float("-inf"))
    weights = tl.where(k < in_bracket, tl.exp(ranked - row_max), 0.0)
    if USE_MASS:
        reached = (above_mass + tl.cumsum(weights, axis=0)) >= target
        first = tl.min(tl.where(reached, k, tl.minimum(in_bracket, CAP) - 1))
    else:
        first = tl.minimum(target.to(tl.int32) - above_count - 1, CAP - 1)
    threshold = tl.max(tl.where(k == first, ranked, float("-inf")))
    bracket_mass = tl.sum(tl.where(ranked >= threshold, weights, 0.0))
    if not compact:  # all of the single key's tokens are kept
        bracket_mass = in_bracket * tl.exp(threshold - row_max)
    return threshold, above_mass + bracket_mass


@triton.jit
def _general_row(row_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, P: tl.constexpr, CAP: tl.constexpr,
                 BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """A row the candidates did not settle, on its untouched logits."""
    pivots, counts, masses, row_max, finite_max, count, infinite, total = _first_pass(row_ptr, vocab_size, BLOCK, P)
    if count > 0:  # else no logit above -inf: nothing to keep or drop
        threshold = float("-inf")
        kept_mass = total
        if k_on & (k < count):
            if k <= infinite:
                threshold = float("inf")
            else:
                threshold, kept_mass = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max,
                                                       infinite, pivots, counts, masses, k.to(tl.float32), False, P,
                                                       CAP, BLOCK)
        if p_on:
            if infinite > 0:  # all the mass lies on the +inf tokens
                threshold = float("inf")
            else:
                target = tl.maximum(p * kept_mass, 1e-30)
                top_p_threshold, _ = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max, 0,
                                                     pivots, counts, masses, target, True, P, CAP, BLOCK)
                threshold = tl.maximum(threshold, top_p_threshold)
        for v0 in range(0, vocab_size, MASK_BLOCK):
            offs = v0 + tl.arange(0, MASK_BLOCK)
            in_row = offs < vocab_size
            x = tl.load(row_ptr + offs, mask=in_row)
            tl.store(row_ptr + offs, tl.where(x.to(tl.float32) >= threshold, x, float("-inf")), mask=in_row)


@triton.jit
def _select_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, SEG_CAP: tl.constexpr, TILE: tl.constexpr, SMALL: tl.constexpr, P: tl.constexpr,
    CAP: tl.constexpr, BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr, FILL: tl.constexpr,
    CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, PDL: tl.constexpr,
):
    """A row's threshold: from its candidates when they settle it (applied here with top-k on, and
    for top-p alone here with FILL, else by the fill launch), else by the general path, which also
    masks the row."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active = _row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, t, num_slots, vocab_size, PDL)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
        pairs_ptr, values_ptr, buffer_ptr, scratch_ptr = _workspace(ws_row, num_segments, SEG_CAP)[7:]
        flag = tl.load(_header_int(ws_row, _FLAG))
        if flag != 0:
            _select_row(row_ptr, ws_row, flag, pairs_ptr, values_ptr, buffer_ptr, scratch_ptr, num_segments, vocab_size,
                        k, p, k_on, p_on, SEG_CAP, TILE, SMALL, FILL, CHUNK, SEGMENTS)
        else:
            _general_row(row_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, P, CAP, BLOCK, MASK_BLOCK)


def _check_top_k_top_p(logits, idx_mapping, top_k, top_p) -> None:
    op = "top_k_top_p"
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    R = _checks.check_slot_vector(op, "top_k", top_k, (torch.int32,), dev)
    _checks.check_tensor(op, "top_p", top_p, (torch.float32,), ndim=1, device=dev, shape=(R,))


def _check_top_k_top_p_values(logits, idx_mapping, top_k, top_p) -> None:
    op = "top_k_top_p"
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_values(op, "top_p", (top_p > 0) & (top_p <= 1), "values in (0, 1]")


def _launch_plan(T: int, V: int, pdl: bool) -> list:
    """The op's launches for a [T, V] batch, in order: (kernel, grid, constants and compile options);
    with pdl, every launch after the first is a programmatic dependent launch (see _row_settings).
    The launcher, `.ci/inspect_kernels.py` and the benchmark read it."""
    num_segments = triton.cdiv(V, _SEGMENT)
    segments_p2 = triton.next_power_of_2(num_segments)
    settle_launch = T >= _SETTLE_LAUNCH_MIN_T
    follow = dict(PDL=pdl, launch_pdl=pdl)
    chunks = (T, triton.cdiv(V, _CHUNK))
    fill_group = _FILL_GROUP if settle_launch else 1
    fill_in_select = T >= _FILL_IN_SELECT_MIN_T
    fill = [(_fill_chunks_kernel, (T, triton.cdiv(chunks[1], fill_group)),
             dict(CHUNK=_CHUNK, SEGMENTS=_CHUNK // _SEGMENT, SEG_CAP=_SEG_CAP, GROUP=fill_group,
                  num_warps=_WARPS["chunks"], **follow))]
    settle = [(_settle_kernel, (T,), dict(SEG_CAP=_SEG_CAP, SEGMENTS_P2=segments_p2, num_warps=1, **follow))]
    return [
        (_sample_bound_kernel, (T,), dict(SAMPLE=_SAMPLE, SEG_CAP=_SEG_CAP, PDL=pdl,
                                          num_warps=4 if T >= _FEW_SAMPLE_WARPS_MIN_T else _WARPS["sample"])),
        # 64 registers: 32 one-warp programs an SM
        (_scan_segments_kernel, (T, num_segments),
         dict(SEGMENT=_SEGMENT, SEG_CAP=_SEG_CAP, STAGES=_SCAN_STAGES, num_warps=1, maxnreg=64, **follow)),
        *(settle if settle_launch else []),
        (_gather_chunks_kernel, chunks,
         dict(CHUNK=_CHUNK, SEGMENTS=_CHUNK // _SEGMENT, SEG_CAP=_SEG_CAP, SEGMENTS_P2=segments_p2,
              SETTLED=settle_launch, num_warps=_WARPS["chunks"], **follow)),
        # 128 registers: two programs an SM (measured: 24 instead of 34 µs at T = 256, k=50 p=0.9)
        (_select_kernel, (T,),
         dict(SEG_CAP=_SEG_CAP, TILE=_TILE, SMALL=_SMALL, P=_PIVOTS, CAP=_CAP, BLOCK=_BLOCK,
              MASK_BLOCK=_MASK_BLOCK, FILL=fill_in_select, CHUNK=_CHUNK, SEGMENTS=_CHUNK // _SEGMENT,
              num_warps=_WARPS["select"], maxnreg=128, **follow)),
        *([] if fill_in_select else fill),
    ]


def _compiled_kernels(V: int, pdl: bool = True) -> list:
    """Each distinct (kernel, constants and compile options) the op launches at vocabulary V, in a
    batch below _SETTLE_LAUNCH_MIN_T rows, and in one at each of it, _FILL_IN_SELECT_MIN_T and
    _FEW_SAMPLE_WARPS_MIN_T (for .ci/inspect_kernels.py and the benchmark)."""
    kernels = []
    for T in (1, _SETTLE_LAUNCH_MIN_T, _FILL_IN_SELECT_MIN_T, _FEW_SAMPLE_WARPS_MIN_T):
        for kernel, _, meta in _launch_plan(T, V, pdl):
            if (kernel, meta) not in kernels:
                kernels.append((kernel, meta))
    return kernels


def _uses_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: on Hopper and later GPUs (not under the Triton interpreter)."""
    return not _INTERPRET and device.type == "cuda" and _compute_capability(device.index)[0] >= 9


@functools.cache
def _compute_capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=4096)
def _launch_setup(T: int, V: int, pdl: bool) -> tuple:
    """(segments, workspace words per row, launch plan) of a [T, V] batch, computed once per shape:
    building the plan costs more host time than a launch."""
    num_segments = triton.cdiv(V, _SEGMENT)
    return num_segments, _workspace_words(num_segments), _launch_plan(T, V, pdl)


def _top_k_top_p_triton(logits, idx_mapping, top_k, top_p) -> None:
    T, V = logits.shape
    if T == 0:
        return
    setup = _launch_setup if type(T) is int and type(V) is int else _launch_setup.__wrapped__  # SymInts: no cache
    num_segments, ws_stride, plan = setup(T, V, _uses_pdl(logits.device))
    ws = logits.new_empty((T, ws_stride), dtype=torch.float32)
    args = (logits, logits.stride()[0], idx_mapping, top_k, top_p, ws, ws_stride, top_k.shape[0], V, num_segments)
    for kernel, grid, meta in plan:
        launch(kernel, grid, *args, **meta)


@define_op(
    mutates_args=("logits",), check=_check_top_k_top_p, check_values=_check_top_k_top_p_values,
    triton=_top_k_top_p_triton,
)
def top_k_top_p(logits: torch.Tensor, idx_mapping: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """Keeps the top-k, then the top-p tokens of each row, in place; the others become -inf.

    Per row ``t`` with slot ``r = idx_mapping[t]``: keeps the tokens >= the ``top_k[r]``-th largest
    logit (all ties kept); then, of those, the most probable tokens (softmax renormalised over the
    kept set) whose cumulative mass first reaches ``top_p[r]``, with ties at that boundary kept.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; modified in place.
        idx_mapping: ``[T]`` int32/int64 slot of each row; a row outside ``[0, R)`` is untouched.
        top_k: ``[R]`` int32; ``<= 0`` or ``>= V`` is off.
        top_p: ``[R]`` float32 in ``(0, 1]``; ``1.0`` is off. Out of that range (an error that
            TORCH_SAMPLING_OPS_DEBUG=1 raises): ``<= 0`` keeps the most probable token(s), ``> 1`` or NaN is off.

    A row with both filters off is not read. When a filter is on, NaN logits become -inf; a row
    without any logit above -inf is unchanged. +inf logits hold all the mass: top-p keeps just them,
    and top-k counts them as the largest values. Masses are float32 sums: a token's membership may
    differ from the exact answer only where the exact mass above it is within ~1e-4 of top_p.
    """
