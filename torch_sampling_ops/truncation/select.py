"""Launch 4 of top_k_top_p: a row's exact threshold, by interval rounds on the float keys of its
gathered candidates when they settle it (_select_row), else by the general path on its logits.
"""
import triton
import triton.language as tl

from .._triton_helpers import load_slot
from ..gumbel import (
    DRAW_REACH_SLOTS,
    approx_gumbel_score,
    argmax_finish,
    gumbel_argmax,
    stream_key,
    stream_noise,
    top2_certified,
    top2_init,
    top2_update,
)
from .general import _general_row
from .keys import (
    _compact_tile,
    _float_key,
    _in_interval,
    _interval_partials,
    _interval_round,
    _interval_stats,
    _key_value,
    _part_count,
    _part_starts,
)
from .scan import _fill_chunk, _gather_list, _largest_below, _listed_candidates, _settle_row
from .settings import _SWEEP_GROUP
from .workspace import (
    _FLAG,
    _LISTED,
    _ROW_MAX,
    _THRESHOLD,
    _TOTAL,
    _buffer_ptr,
    _header_int,
    _pairs_ptr,
    _row_copy_ptr,
    _scratch_ptr,
    _search_floor,
    _values_ptr,
    _weighs_row,
    row_settings,
)


@triton.jit
def _candidate_values(src_ptr, count, start, TILE: tl.constexpr):
    """Values start .. start + TILE of a candidate list (-inf past the last) and which are present.
    .cg: a list compacted by this program is read back after a barrier, past the SM's L1."""
    i = start + tl.arange(0, TILE)
    present = i < count
    return tl.load(src_ptr + i, mask=present, other=float("-inf"), cache_modifier=".cg"), present


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
def _settled_threshold(ws_row, flag, values_ptr, buffer_ptr, scratch_ptr, list_size, count, row_max, total, k, p,
                       k_on, p_on, temp, min_p, TILE: tl.constexpr, SMALL: tl.constexpr, DRAW: tl.constexpr):
    """The threshold of a settled row from its candidate list of `count`, given the row max and
    normaliser: top-k's, then top-p's (renormalised over the tokens top-k keeps). With DRAW the
    values are y = x / temp, and min_p's threshold (row max + log(min_p)) comes before top-k's and
    top-p's: it raises top-k's, and top-p is renormalised over what both keep (see _settle_row)."""
    floor = _search_floor(ws_row, flag)
    if DRAW:
        floor = tl.math.div_rn(floor, temp)
    low = _float_key(floor)
    high = _float_key(row_max)
    threshold = floor
    if k_on:
        threshold = _select_threshold(values_ptr, buffer_ptr, list_size, scratch_ptr, count, floor, low, high,
                                      tl.full([], 0, tl.int32), count, row_max, k, False, TILE, SMALL)
    renormalise = k_on
    if DRAW:
        if min_p != 0.0:
            threshold = tl.maximum(threshold, row_max + tl.log(min_p))
            renormalise = True
    if p_on:
        searched = True
        target = tl.full([], 0.0, tl.float32)
        if renormalise:  # over the kept set
            low = _float_key(threshold)
            # A kept set of at most SMALL (top-k's, as a sampler sets it) is sorted instead of searched.
            in_set = _compact(values_ptr, count, low, high, scratch_ptr, SMALL, TILE)
            if in_set <= SMALL:
                threshold = tl.maximum(_top_p_of_few(scratch_ptr, in_set, row_max, p, SMALL), threshold)
                searched = False
            else:
                kept_mass, in_set = _candidate_mass(values_ptr, count, row_max, threshold, TILE)
                target = tl.maximum(p * kept_mass, 1e-30)  # top_p <= 0 keeps the most probable token(s)
        else:
            target = tl.maximum(p * total, 1e-30)
            in_set = count
        if searched:
            threshold = _select_threshold(values_ptr, buffer_ptr, list_size, scratch_ptr, count, floor, low, high,
                                          tl.full([], 0.0, tl.float32), in_set, row_max, target, True, TILE, SMALL)
    return threshold


@triton.jit
def _top_p_of_few(src_ptr, n, row_max, p, SMALL: tl.constexpr):
    """Top-p's threshold over the n <= SMALL values at src (the kept set): the largest value v whose
    values >= v carry at least p of the set's mass (relative to row_max), by one sort and a prefix
    sum: the mass of the values >= sorted[i] is the prefix sum at the last of sorted[i]'s ties, and
    the prefix sums only grow, so the answer is the first sorted value whose prefix sum reaches
    the target. top_p <= 0 keeps the largest value(s)."""
    values, _ = _candidate_values(src_ptr, n, 0, SMALL)
    values = tl.sort(values, descending=True)  # the absent (-inf) last, with no mass
    mass = tl.cumsum(tl.exp(values - row_max), 0)
    target = tl.maximum(p * tl.max(mass), 1e-30)
    return tl.max(tl.where(mass >= target, values, float("-inf")))


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
    count = tl.load(_header_int(ws_row, _LISTED))
    threshold = _settled_threshold(ws_row, flag, values_ptr, buffer_ptr, scratch_ptr, list_size, count,
                                   tl.load(ws_row + _ROW_MAX), tl.load(ws_row + _TOTAL), k, p, k_on, p_on, 1.0, 0.0,
                                   TILE, SMALL, False)
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
        weighs = _weighs_row(k_on, p_on, 0.0)  # top-p alone, in this branch
        listed, listed_at, is_listed, _ = _listed_candidates(ws_row, num_segments, mine, flag, weighs, SEG_CAP)
        for c in range(0, tl.cdiv(vocab_size, CHUNK)):
            mine += SEGMENTS  # past the last segment: nothing listed, nothing loaded
            next_listed, next_at, next_is_listed, _ = _listed_candidates(ws_row, num_segments, mine, flag, weighs,
                                                                         SEG_CAP)
            _fill_chunk(row_ptr, c, vocab_size, threshold, listed, listed_at, is_listed, CHUNK)
            listed, listed_at, is_listed = next_listed, next_at, next_is_listed
    else:
        tl.store(ws_row + _THRESHOLD, threshold)


@triton.jit
def _draw_candidates(values_ptr, positions_ptr, count, threshold, key, tol, TILE: tl.constexpr):
    """The token of argmax over the listed candidates >= threshold of value + stream_noise(key,
    position), the lower position among ties; -1 without one. As gumbel_argmax: each candidate
    scored approximately (per-lane top two), and when the tolerance separates the winner, it is the
    exact scores' winner; otherwise every candidate is scored exactly. The next tile loads while one
    is scored."""
    first, second, first_j = top2_init(TILE)
    values, present = _candidate_values(values_ptr, count, 0, TILE)
    positions = tl.load(positions_ptr + tl.arange(0, TILE), mask=present, other=0)
    for start in range(TILE, count + TILE, TILE):
        next_values, next_present = _candidate_values(values_ptr, count, start, TILE)
        next_positions = tl.load(positions_ptr + start + tl.arange(0, TILE), mask=next_present, other=0)
        kept = tl.where(present & (values >= threshold), values, float("-inf"))
        first, second, first_j = top2_update(first, second, first_j, approx_gumbel_score(kept, values, key, positions),
                                             positions)
        values, present, positions = next_values, next_present, next_positions
    token, certified = top2_certified(first, second, first_j, tol, TILE)
    if not certified:
        token = _draw_candidates_exactly(values_ptr, positions_ptr, count, threshold, key, TILE)
    return token


@triton.jit
def _draw_candidates_exactly(values_ptr, positions_ptr, count, threshold, key, TILE: tl.constexpr):
    """_draw_candidates' result from the exact scores of all candidates (the list is not in row
    order: ties go to the lower position explicitly)."""
    best = tl.full([TILE], float("-inf"), tl.float32)
    best_j = tl.full([TILE], -1, tl.int32)
    for start in range(0, count, TILE):
        values, present = _candidate_values(values_ptr, count, start, TILE)
        positions = tl.load(positions_ptr + start + tl.arange(0, TILE), mask=present, other=0)
        score = values + stream_noise(key, positions)
        take = present & (values >= threshold) & (
            (best_j < 0) | (score > best) | ((score == best) & (positions < best_j)))
        best = tl.where(take, score, best)
        best_j = tl.where(take, positions, best_j)
    _, token = argmax_finish(best, best_j, 2147483647)
    return token


@triton.jit(noinline=True)
def _draw_general_row(logits_row, copy_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, temp, min_p, row_max, key,
                      tol, P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """`sample`'s general path: the row the candidates did not settle as the filters see it, y = x /
    temp with min_p applied (as the min_p op: y < row max + log(min_p) becomes -inf), copied into the
    workspace; _general_row masks the copy, and gumbel_argmax draws from it (the exact scores'
    token)."""
    minp_threshold = tl.where(min_p != 0.0, row_max + tl.log(tl.where(min_p != 0.0, min_p, 1.0)), float("-inf"))
    for v0 in range(0, vocab_size, MASK_BLOCK):
        offs = v0 + tl.arange(0, MASK_BLOCK)
        in_row = offs < vocab_size
        y = tl.math.div_rn(tl.load(logits_row + offs, mask=in_row).to(tl.float32), temp)
        tl.store(copy_ptr + offs, tl.where(y < minp_threshold, float("-inf"), y), mask=in_row)
    tl.debug_barrier()  # the copy, written by all of the program's threads, is read by all of them
    _general_row(copy_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, P, CAP, BLOCK, MASK_BLOCK)
    tl.debug_barrier()
    _, token = gumbel_argmax(copy_ptr, 0, vocab_size, key, temp, tol, False, BLOCK, DRAW_REACH_SLOTS)
    return token


@triton.jit
def _draw_row(logits_row, ws_row, num_segments, vocab_size, k, p, k_on, p_on, temp, min_p, key, tol, gathered,
              SEG_CAP: tl.constexpr, SEGMENTS_P2: tl.constexpr, TILE: tl.constexpr, SMALL: tl.constexpr,
              P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """`sample`'s filtered row after the scan (and if `gathered`, the gather launch's list and header;
    otherwise settled and gathered here), in one program: the thresholds found among its
    listed candidates and the token drawn from the kept ones; or, when the list may miss a kept
    token (not settled, or the threshold not above what an unlisted token can reach), the general
    path on a copy of the row."""
    values_ptr = _values_ptr(ws_row, num_segments, SEG_CAP)
    positions_ptr = _buffer_ptr(ws_row, num_segments, SEG_CAP).to(tl.pointer_type(tl.int32))
    scratch_ptr = _scratch_ptr(ws_row, num_segments, SEG_CAP)
    if gathered:
        flag = tl.load(_header_int(ws_row, _FLAG))
        count = tl.load(_header_int(ws_row, _LISTED))
        row_max = tl.load(ws_row + _ROW_MAX)
        total = tl.load(ws_row + _TOTAL)
    else:
        flag, listed, row_max, total = _settle_row(ws_row, num_segments, k, p, k_on, p_on, temp, min_p, SEG_CAP,
                                                   SEGMENTS_P2, True)
        count = tl.sum(listed)
        if flag != 0:
            _gather_list(ws_row, num_segments, listed, _weighs_row(k_on, p_on, min_p), temp, values_ptr,
                         positions_ptr, SEG_CAP, SEGMENTS_P2)
            tl.debug_barrier()  # the list, written by all of the program's threads, is read by all of them
    token = tl.full([], -1, tl.int32)
    drawn = tl.full([], False, tl.int1)
    if flag != 0:
        # The buffer holds the positions: the pair regions, read by now, take the compactions.
        threshold = _settled_threshold(ws_row, flag, values_ptr, _pairs_ptr(ws_row, num_segments).to(tl.pointer_type(
            tl.float32)), scratch_ptr, num_segments * SEG_CAP, count, row_max, total, k, p, k_on, p_on, temp, min_p,
            TILE, SMALL, True)
        if threshold > _largest_below(_search_floor(ws_row, flag), temp):
            token = _draw_candidates(values_ptr, positions_ptr, count, threshold, key, tol, TILE)
            drawn = True
    if not drawn:
        SCRATCH: tl.constexpr = TILE if TILE > CAP else CAP
        token = _draw_general_row(logits_row, _row_copy_ptr(ws_row, num_segments, SEG_CAP, SCRATCH), scratch_ptr,
                                  vocab_size, k, p, k_on, p_on, temp, min_p, row_max, key, tol, P, CAP, BLOCK,
                                  MASK_BLOCK)
    return token


@triton.jit
def _select_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots, vocab_size,
    num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
    SEG_CAP: tl.constexpr, TILE: tl.constexpr, SMALL: tl.constexpr, P: tl.constexpr,
    CAP: tl.constexpr, BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr, FILL: tl.constexpr,
    CHUNK: tl.constexpr, SEGMENTS: tl.constexpr, SEGMENTS_P2: tl.constexpr, GATHER_IN_DRAW_MIN_T: tl.constexpr,
    PDL: tl.constexpr, DRAW: tl.constexpr,
):
    """A row's threshold: from its candidates when they settle it (applied here with top-k on, and
    for top-p alone here with FILL, else by the fill launch), else by the general path, which also
    masks the row. With DRAW (`sample`): out[t], the token _draw_row draws (below GATHER_IN_DRAW_MIN_T
    rows after the gather launch, otherwise right after the scan: one compiled variant for both);
    the logits are not written."""
    t = tl.program_id(0)
    k, p, k_on, p_on, active, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                          min_p_ptr, t, num_slots, vocab_size, PDL, DRAW)
    if active:
        ws_row = ws_ptr + t.to(tl.int64) * ws_stride
        row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
        if DRAW:
            slot = load_slot(idx_mapping_ptr, t, num_slots)
            key = stream_key(tl.load(seeds_ptr + slot).to(tl.int64), tl.load(output_lens_ptr + t).to(tl.int64))
            gathered = tl.num_programs(0) < GATHER_IN_DRAW_MIN_T  # as the launch plan decides
            token = _draw_row(row_ptr, ws_row, num_segments, vocab_size, k, p, k_on, p_on, temp, min_p, key, tol,
                              gathered, SEG_CAP, SEGMENTS_P2, TILE, SMALL, P, CAP, BLOCK, MASK_BLOCK)
            tl.store(out_ptr + t, token.to(tl.int64))
        else:
            flag = tl.load(_header_int(ws_row, _FLAG))
            scratch_ptr = _scratch_ptr(ws_row, num_segments, SEG_CAP)
            if flag != 0:
                _select_row(row_ptr, ws_row, flag, _pairs_ptr(ws_row, num_segments),
                            _values_ptr(ws_row, num_segments, SEG_CAP), _buffer_ptr(ws_row, num_segments, SEG_CAP),
                            scratch_ptr, num_segments, vocab_size, k, p, k_on, p_on, SEG_CAP, TILE, SMALL, FILL, CHUNK,
                            SEGMENTS)
            else:
                _general_row(row_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, P, CAP, BLOCK, MASK_BLOCK)
