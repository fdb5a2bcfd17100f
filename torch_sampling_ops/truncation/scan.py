"""Launches 1-3 of top_k_top_p and the fill (launch 5): the sample bound, the segment scan, the
settle step, the gather of a settled row's candidate list, and the fill of a top-p-alone row.
"""
import triton
import triton.language as tl

from .._triton_helpers import load_slot, program_range
from .keys import _float_key, _is_finite, _key_value
from .workspace import (
    _FLAG,
    _LISTED,
    _LO,
    _REF,
    _ROW_MAX,
    _SECOND_BOUND,
    _THRESHOLD,
    _TOTAL,
    _buffer_ptr,
    _header_int,
    _pairs_ptr,
    _segment_count_high_ptr,
    _segment_count_ptr,
    _segment_first_ptr,
    _segment_mass_high_ptr,
    _segment_mass_ptr,
    _segment_max_ptr,
    _segment_total_ptr,
    _values_ptr,
    _weighs_row,
    reduce_draw_pairs,
    row_settings,
)

_FLT_MAX = tl.constexpr(3.4028234663852886e38)  # the sample stores lo >= -_FLT_MAX: -inf is never a candidate
_LOG2E = tl.constexpr(1.4426950408889634)
# Slots of every segment's list that sample's own gather (_gather_list) takes a step: two steps of
# [SEGMENTS_P2, _GATHER_SLOTS] int64 pairs fit the selection's 128 registers (at 32 they spill).
_GATHER_SLOTS = tl.constexpr(16)


@triton.jit
def _sample_bound_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    SAMPLE: tl.constexpr, SEG_CAP: tl.constexpr, PDL: tl.constexpr, DRAW: tl.constexpr,
):
    """Launch 1 of top_k_top_p: each active row's bounds (store_row_bound). (`sample` computes them
    in its first launch, beside its full-row draws.)"""
    t = tl.program_id(0)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                              min_p_ptr, t, num_slots, vocab_size, PDL, DRAW)
    if active:
        store_row_bound(logits_ptr + t.to(tl.int64) * logits_stride, ws_ptr + t.to(tl.int64) * ws_stride,
                         vocab_size, num_segments, k, k_on, temp, min_p, SAMPLE, SEG_CAP)


@triton.jit
def store_row_bound(row_ptr, ws_row, vocab_size, num_segments, k, k_on, temp, min_p, SAMPLE: tl.constexpr,
                     SEG_CAP: tl.constexpr):
    """An active row's lower bound `lo` from a sample of its tokens, its exp reference, and for top-p
    alone a second bound above `lo`, into its workspace header. With min_p on and top-k off
    (`sample` only), `lo` lies just below what min_p keeps of the sample (its max divided by temp,
    plus log(min_p)): the row's max is at least the sample's, so every token min_p keeps is listed."""
    i = tl.arange(0, SAMPLE)
    run = SAMPLE // 32
    offs = tl.where(vocab_size <= SAMPLE, i, (i // run) * (vocab_size // 32) + i % run)
    x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
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
    minp_bound = (k_on == 0) & (min_p != 0.0)
    if ((k_on == 0) | (rank > 32) | (vocab_size <= SAMPLE)) & (minp_bound == 0):
        low, high_low = _rank_bounds(x, offs < vocab_size, low, rank, tl.where(k_on, rank, (rank + 1) // 2))
    lo = tl.maximum(_key_value(low), -_FLT_MAX)  # -inf is never a candidate
    if minp_bound:  # a margin far above the roundings of the quotient; the settle step checks it
        kept_floor = tl.math.div_rn(tl.max(x), temp) + tl.log(tl.where(minp_bound, min_p, 1.0))
        lo = tl.maximum((kept_floor - 2.0**-12 * (1.0 + tl.abs(kept_floor))) * temp, -_FLT_MAX)
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
def _scan_pair_with_mass(xa, xb, offs, lo, high_bound, log2_scale, ref2, lane_max, total, mass, mass_high, count,
                         count_high, pairs_ptr, SEG_CAP: tl.constexpr):
    """_scan_step's top-p-alone counterpart over two tiles [32, 4] at once, xa at offs and xb 128
    tokens on, with one warp scan for both and the sums per lane [32] (fewer instructions for the
    two tiles than for each tile on its own). Also the mass and count of the tokens
    >= high_bound; those are stored from the front of the region, the other candidates from the back.
    Masses are exp2(x * log2_scale - ref2): log2(e), or log2(e) / temperature for `sample`."""
    lane_max = tl.maximum(lane_max, tl.max(tl.maximum(xa, xb), axis=1))  # max.f32 passes over NaN
    # Clamping the exponent sends NaN and -inf to 2^-200, which is 0 in float32.
    ea = tl.math.exp2(tl.maximum(xa * log2_scale - ref2, -200.0))
    eb = tl.math.exp2(tl.maximum(xb * log2_scale - ref2, -200.0))
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
    # Masked loads throughout: unmasked ones in a segment wholly inside the row were no faster
    # (docs/notes/top-k-top-p-tuning.md).
    lane_max = tl.full([32, 4], float("-inf"), tl.float32)
    count = 0
    x0 = _segment_tile(row_ptr, offs, 0, vocab_size, False, SEGMENT)
    x1 = _segment_tile(row_ptr, offs + STEP, STEP, vocab_size, False, SEGMENT)
    x2 = _segment_tile(row_ptr, offs + 2 * STEP, 2 * STEP, vocab_size, False, SEGMENT)
    x3 = _segment_tile(row_ptr, offs + 3 * STEP, 3 * STEP, vocab_size, False, SEGMENT)
    # Four tiles a loop iteration, each variable reloaded four tiles on as soon as its tile is
    # counted: the loop carries its tiles in place (rotating them costs register moves every tile).
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
def _scan_segment_with_mass(row_ptr, offs, vocab_size, lo, high_bound, log2_scale, ref2, pairs_ptr, FULL: tl.constexpr,
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
            x0, x1, offs + v0, lo, high_bound, log2_scale, ref2, lane_max, total, mass, mass_high, count, count_high,
            pairs_ptr, SEG_CAP)
    return (tl.max(lane_max, axis=0), tl.sum(total, axis=0), tl.sum(mass, axis=0), tl.sum(mass_high, axis=0),
            count, count_high)


@triton.jit
def _scan_segments_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    SEGMENT: tl.constexpr, SEG_CAP: tl.constexpr, STAGES: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr, DRAW: tl.constexpr, DRAW_SEGMENT: tl.constexpr, DRAW_SEGMENTS_P2: tl.constexpr,
    SPLIT_DRAW_MAX_T: tl.constexpr,
):
    """Statistics and candidates of GROUP consecutive segments in turn, in one warp: each one's max,
    normaliser and candidate mass (only for a row it weighs, `_weighs_row`: otherwise the selection
    weighs its own candidates), and its candidates (_scan_segment). A tile is 4 consecutive tokens a lane; with one
    warp a program, a tile's prefix sums never wait on a block-wide barrier (with several warps,
    Triton 3.6 spread a tile's lanes over warps).
    With DRAW (`sample`), below SPLIT_DRAW_MAX_T rows the first program of a row the truncation
    leaves alone writes its token: the best of the pairs its split full-row draw (DRAW_SEGMENT
    tokens a program) left in its workspace; -1 for a slot out of range."""
    t = tl.program_id(0)
    # With DRAW, below SPLIT_DRAW_MAX_T rows a row's first program reads its split draw's pairs.
    reduces_draw = DRAW & (tl.program_id(1) == 0) & (tl.num_programs(0) < SPLIT_DRAW_MAX_T)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                              min_p_ptr, t, num_slots, vocab_size, PDL, DRAW,
                                                              reduces_draw)
    if DRAW:
        if (active == 0) & reduces_draw:
            token = tl.full([], -1, tl.int32)
            if load_slot(idx_mapping_ptr, t, num_slots) >= 0:
                token = reduce_draw_pairs(ws_ptr + t.to(tl.int64) * ws_stride,
                                          tl.cdiv(vocab_size, DRAW_SEGMENT), DRAW_SEGMENTS_P2)
            tl.store(out_ptr + t, token.to(tl.int64))
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        lo = tl.load(ws_row + _LO)
        if DRAW:  # the logits as read, x: the masses of y = x / temperature
            log2_scale = tl.math.div_rn(_LOG2E, temp)
        else:
            log2_scale = _LOG2E
        ref2 = tl.load(ws_row + _REF) * log2_scale
        high_bound = tl.load(ws_row + _SECOND_BOUND)
        row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
        max_ptr = _segment_max_ptr(ws_row)
        sum_ptr = _segment_total_ptr(ws_row, num_segments)
        mass_ptr = _segment_mass_ptr(ws_row, num_segments)
        count_ptr = _segment_count_ptr(ws_row, num_segments)
        mass_high_ptr = _segment_mass_high_ptr(ws_row, num_segments)
        count_high_ptr = _segment_count_high_ptr(ws_row, num_segments)
        first, end = program_range(num_segments, GROUP)
        for segment in range(first, end):
            pairs_ptr = _pairs_ptr(ws_row, num_segments) + segment * SEG_CAP
            offs = segment * SEGMENT + tl.arange(0, 32)[:, None] * 4 + tl.arange(0, 4)[None, :]
            full = (segment + 1) * SEGMENT <= vocab_size  # the segment lies in the row: unmasked top-p loads
            if _weighs_row(k_on, p_on, min_p) == 0:
                seg_max, count = _scan_segment(row_ptr, offs, vocab_size, lo, pairs_ptr, SEGMENT, SEG_CAP)
            else:
                if full:
                    seg_max, total, mass, mass_high, count, count_high = _scan_segment_with_mass(
                        row_ptr, offs, vocab_size, lo, high_bound, log2_scale, ref2, pairs_ptr, True, SEGMENT, SEG_CAP,
                        STAGES)
                else:
                    seg_max, total, mass, mass_high, count, count_high = _scan_segment_with_mass(
                        row_ptr, offs, vocab_size, lo, high_bound, log2_scale, ref2, pairs_ptr, False, SEGMENT, SEG_CAP,
                        STAGES)
                tl.store(sum_ptr + segment, total)
                tl.store(mass_ptr + segment, mass)
                tl.store(mass_high_ptr + segment, mass_high)
                tl.store(count_high_ptr + segment, count_high)
            tl.store(max_ptr + segment, seg_max)
            tl.store(count_ptr + segment, count)


@triton.jit
def _largest_below(floor, temp):
    """The largest x / temp (IEEE division) of a token x < floor, for floor > -inf: what a token the
    scan did not list (x < lo) can reach once divided."""
    return tl.math.div_rn(_key_value(_float_key(floor) - 1), temp)


@triton.jit
def _settle_row(ws_row, num_segments, k, p, k_on, p_on, temp, min_p, SEG_CAP: tl.constexpr,
                SEGMENTS_P2: tl.constexpr, DRAW: tl.constexpr):
    """Combines the segment statistics in segment order: whether the candidates settle the row (flag
    1: no segment overflowed, and they hold the k tokens or the top_p mass; 2: top-p alone, and the
    candidates >= the second bound hold the mass, so only they are listed), each segment's listed
    candidates, the row max and the normaliser (top-p alone). A row whose max is more than 60 above
    the scan's reference is not settled (a segment's float32 sums could have overflowed), nor one
    holding +inf: the general path alone deals with those.
    With DRAW the scan read x and the row is y = x / temp: the row max is y's, the masses are
    rescaled to it, and min_p (keep y >= row max + log(min_p)) is applied before top-k and top-p: with
    top-k on the selection raises top-k's threshold to min_p's; otherwise the candidates settle the row
    when min_p's threshold lies above every unlisted token (top-p, if on, is then renormalised over
    the candidates it keeps)."""
    max_ptr = _segment_max_ptr(ws_row)
    sum_ptr = _segment_total_ptr(ws_row, num_segments)
    mass_ptr = _segment_mass_ptr(ws_row, num_segments)
    count_ptr = _segment_count_ptr(ws_row, num_segments)
    mass_high_ptr = _segment_mass_high_ptr(ws_row, num_segments)
    count_high_ptr = _segment_count_high_ptr(ws_row, num_segments)
    g = tl.arange(0, SEGMENTS_P2)
    in_row = g < num_segments
    weighs = _weighs_row(k_on, p_on, min_p)
    with_mass = g < tl.where(weighs, num_segments, 0)
    row_max = tl.max(tl.load(max_ptr + g, mask=in_row, other=float("-inf")))
    ref = tl.load(ws_row + _REF)
    if DRAW:
        gap = tl.math.div_rn(row_max - ref, temp)
        scale = tl.where(gap <= 60.0, tl.exp(-gap), float("nan"))
        row_max = tl.math.div_rn(row_max, temp)
    else:
        scale = tl.where(row_max <= ref + 60.0, tl.exp(ref - row_max), float("nan"))
    total = tl.sum(tl.load(sum_ptr + g, mask=with_mass, other=0.0)) * scale
    mass = tl.sum(tl.load(mass_ptr + g, mask=with_mass, other=0.0)) * scale
    mass_high = tl.sum(tl.load(mass_high_ptr + g, mask=with_mass, other=0.0)) * scale
    counts = tl.load(count_ptr + g, mask=in_row, other=0)
    counts_high = tl.load(count_high_ptr + g, mask=with_mass, other=0)
    enough = tl.where(k_on, tl.sum(counts) >= k, mass >= p * total)  # NaN: not settled
    narrow = weighs & (mass_high >= p * total)
    if DRAW:  # min_p without top-k: the candidates hold every token min_p keeps
        held = row_max + tl.log(tl.where(min_p != 0.0, min_p, 1.0)) > _largest_below(tl.load(ws_row + _LO), temp)
        enough = tl.where(k_on | weighs, enough, held)
    settled = _is_finite(row_max) & (tl.max(counts) <= SEG_CAP) & enough
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
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr, PDL: tl.constexpr, DRAW: tl.constexpr,
):
    """A large batch's rows settled once each, one warp a row (see settle_launch_min_t): the header
    and each segment's offset in the row's list."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                              min_p_ptr, t, num_slots, vocab_size, PDL, DRAW)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        flag, listed, row_max, total = _settle_row(ws_row, num_segments, k, p, k_on, p_on, temp, min_p, SEG_CAP,
                                                        SEGMENTS_P2, DRAW)
        _store_settlement(ws_row, flag, row_max, total, listed)
        g = tl.arange(0, SEGMENTS_P2)
        first_ptr = _segment_first_ptr(ws_row, num_segments)
        tl.store(first_ptr + g, tl.cumsum(listed, axis=0) - listed, mask=g < num_segments)


@triton.jit
def _listed_candidates(ws_row, num_segments, mine, flag, weighs, SEG_CAP: tl.constexpr):
    """The listed candidates of segments `mine` [SEGMENTS], as [SEGMENTS, SEG_CAP]: values,
    positions, which are present, and how many each segment lists."""
    count_ptr = _segment_count_ptr(ws_row, num_segments)
    count_high_ptr = _segment_count_high_ptr(ws_row, num_segments)
    pairs_ptr = _pairs_ptr(ws_row, num_segments)
    counts = tl.load(count_ptr + mine, mask=mine < num_segments, other=0)
    # The scan writes counts_high for the rows it weighs only. (A select, not `& weighs`: the interpreter
    # turns a scalar & a tensor into an int32 mask, which tl.load refuses.)
    counts_high = tl.load(count_high_ptr + mine, mask=tl.where(weighs, mine < num_segments, False), other=0)
    n = tl.where(flag == 2, counts_high, counts)  # as _settle_row lists them
    n_front = tl.where(weighs, counts_high, counts)  # see _scan_step and _scan_pair_with_mass
    i = tl.arange(0, SEG_CAP)[None, :]
    present = i < n[:, None]
    source = tl.where(i < n_front[:, None], i, SEG_CAP - 1 - (i - n_front[:, None]))
    pair = tl.load(pairs_ptr + mine[:, None] * SEG_CAP + source, mask=present, other=0)
    return (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True), pair.to(tl.int32), present, n


@triton.jit
def _gather_list(ws_row, num_segments, listed, weighs, temp, values_ptr, positions_ptr, SEG_CAP: tl.constexpr,
                 SEGMENTS_P2: tl.constexpr):
    """`sample`'s settled row, in the program that draws it: the `listed` [SEGMENTS_P2] candidates of
    every segment gathered in segment order into the row's list, values divided by temp (IEEE), and
    their positions; _GATHER_SLOTS slots of every segment a step (most segments list a few
    candidates), the next step's loads in flight while one is stored."""
    g = tl.arange(0, SEGMENTS_P2)
    in_row = g < num_segments
    counts = tl.load(_segment_count_ptr(ws_row, num_segments) + g, mask=in_row, other=0)
    counts_high = tl.load(_segment_count_high_ptr(ws_row, num_segments) + g, mask=tl.where(weighs, in_row, False),
                          other=0)
    n_front = tl.where(weighs, counts_high, counts)  # see _listed_candidates
    first = tl.cumsum(listed, axis=0) - listed
    pairs_ptr = _pairs_ptr(ws_row, num_segments)
    pair, present, dest = _listed_step(pairs_ptr, g, listed, n_front, first, 0, SEG_CAP)
    for i0 in range(_GATHER_SLOTS, tl.max(listed) + _GATHER_SLOTS, _GATHER_SLOTS):
        next_pair, next_present, next_dest = _listed_step(pairs_ptr, g, listed, n_front, first, i0, SEG_CAP)
        value = (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        tl.store(values_ptr + dest, tl.math.div_rn(value, temp), mask=present)
        tl.store(positions_ptr + dest, pair.to(tl.int32), mask=present)
        pair, present, dest = next_pair, next_present, next_dest


@triton.jit
def _listed_step(pairs_ptr, g, listed, n_front, first, i0, SEG_CAP: tl.constexpr):
    """_gather_list's step: slots i0 .. i0 + _GATHER_SLOTS - 1 of every segment's list (pairs, present,
    their places)."""
    i = i0 + tl.arange(0, _GATHER_SLOTS)[None, :]
    present = i < listed[:, None]
    source = tl.where(i < n_front[:, None], i, SEG_CAP - 1 - (i - n_front[:, None]))
    pair = tl.load(pairs_ptr + g[:, None] * SEG_CAP + source, mask=present, other=0)
    return pair, present, first[:, None] + i


@triton.jit
def _gather_chunks_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr,
    SETTLED: tl.constexpr, PDL: tl.constexpr, DRAW: tl.constexpr,
):
    """A row's chunk of SEGMENTS segments. Unless the settle launch ran (SETTLED), each program
    settles the row from the segment statistics (all of a row's programs reach the same bits; the
    first writes the header). In a settled row: the segments' listed candidate values gathered into
    the row's candidate list, at their offsets in segment order; with top-k on, also their positions
    (into the selection's buffer), and -inf over the chunk. With DRAW (`sample`, small batches) the
    values divided by the temperature, the positions of every row, and the logits not written."""
    t = tl.program_id(0)
    c = tl.program_id(1)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                              min_p_ptr, t, num_slots, vocab_size, PDL, DRAW)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        mine = c * SEGMENTS + tl.arange(0, SEGMENTS)
        if SETTLED:
            flag = tl.load(_header_int(ws_row, _FLAG))
        else:
            flag, listed, row_max, total = _settle_row(ws_row, num_segments, k, p, k_on, p_on, temp, min_p, SEG_CAP,
                                                       SEGMENTS_P2, DRAW)
            if c == 0:
                _store_settlement(ws_row, flag, row_max, total, listed)
        if flag != 0:
            values, positions, present, n = _listed_candidates(ws_row, num_segments, mine, flag,
                                                               _weighs_row(k_on, p_on, min_p), SEG_CAP)
            if SETTLED:
                first_ptr = _segment_first_ptr(ws_row, num_segments)
                first = tl.load(first_ptr + mine, mask=mine < num_segments, other=0)
            else:
                first = tl.sum(tl.where(tl.arange(0, SEGMENTS_P2) < c * SEGMENTS, listed, 0)) + tl.cumsum(n, axis=0) - n
            values_ptr = _values_ptr(ws_row, num_segments, SEG_CAP)
            buffer_ptr = _buffer_ptr(ws_row, num_segments, SEG_CAP)
            dest = first[:, None] + tl.arange(0, SEG_CAP)[None, :]
            if DRAW:  # the selection draws from the list: every row's positions, nothing filled
                tl.store(values_ptr + dest, tl.math.div_rn(values, temp), mask=present)
                tl.store(buffer_ptr.to(tl.pointer_type(tl.int32)) + dest, positions, mask=present)
            else:
                tl.store(values_ptr + dest, values, mask=present)
                # With top-k on the selection writes the few kept candidates back from their positions.
                # Top-p alone keeps thousands: the fill restores them chunk by chunk instead (package
                # docstring).
                if k_on:
                    tl.store(buffer_ptr.to(tl.pointer_type(tl.int32)) + dest, positions, mask=present)
                    offs = c * CHUNK + tl.arange(0, CHUNK)
                    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
                    tl.store(row_ptr + offs, tl.full([CHUNK], float("-inf"), row_ptr.dtype.element_ty),
                             mask=offs < vocab_size)


@triton.jit
def _fill_chunks_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, SEG_CAP: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """For top-p alone, once the selection found a settled row's threshold, GROUP chunks of SEGMENTS
    segments each: -inf over a chunk, then, after a block barrier, its segments' listed candidates
    >= the threshold restored (their positions lie in the chunk: the barrier orders every -inf
    store of the chunk before any restore)."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                              min_p_ptr, t, num_slots, vocab_size, PDL, False)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        flag = tl.load(_header_int(ws_row, _FLAG))
        if (flag != 0) & (k_on == 0):
            threshold = tl.load(ws_row + _THRESHOLD)
            row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
            first, end = program_range(tl.cdiv(vocab_size, CHUNK), GROUP)
            for c in range(first, end):
                mine = c * SEGMENTS + tl.arange(0, SEGMENTS)
                values, positions, present, _ = _listed_candidates(ws_row, num_segments, mine, flag,
                                                                   _weighs_row(k_on, p_on, min_p), SEG_CAP)
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
