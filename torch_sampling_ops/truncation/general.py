"""The general path of top_k_top_p: a row its candidates did not settle, on its untouched logits
(run by the selection's program). A first pass gives the row max, count and normaliser and, for
pivots placed geometrically below the first block's max, the count and mass of the tokens >= each;
the two pivots around the threshold give a bracket, which counting passes narrow by key rounds
until few enough tokens remain to rank in registers; then one masking pass. Exact for any finite
row, whatever its scale.
"""
import triton
import triton.language as tl

from .keys import (
    _compact_tile,
    _float_key,
    _in_interval,
    _interval_partials,
    _interval_round,
    _is_finite,
    _key_value,
    _part_count,
    _part_starts,
)
from .settings import _SWEEP_GROUP


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


# _find_threshold and _rank_bracket stay functions of their own (noinline; Triton allows it with
# scalar arguments only): Triton's coalescing pass walks, for each load and store, the dataflow
# slice of the whole function holding it, so its work grows with the function's size times its
# memory operations, and inlined, the general path's searches multiplied the selection kernel's.
@triton.jit(noinline=True)
def _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max, lo, hi, above_count, above_mass,
                    in_bracket, target, USE_MASS: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """The largest finite row value v whose count / mass of tokens >= v reaches target, and the mass
    of the finite tokens >= v, from the first pass's bracket (_bracket: the values [lo, hi), the
    count and mass of the tokens >= hi, with the +inf tokens for top-k, and the tokens in it). Exact
    for any finite row: key rounds narrow the bracket (each keeps the one of 16 parts of its key
    interval holding the answer, so the interval shrinks at least 8-fold a round and reaches a
    single key within 11) until at most CAP tokens are left, which are ranked in registers. A single
    key left is the answer, with all its ties."""
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
    threshold, bracket_mass = _rank_bracket(scratch_ptr, compact, in_bracket, low, row_max, above_mass, above_count,
                                            target, tl.full([], USE_MASS, tl.int1), CAP)
    return threshold, above_mass + bracket_mass


@triton.jit(noinline=True)
def _rank_bracket(scratch_ptr, compact, in_bracket, low, row_max, above_mass, above_count, target, use_mass,
                  CAP: tl.constexpr):
    """_find_threshold's last step: the threshold among the bracket's in_bracket tokens, compacted in
    the scratch (compact) or all of key `low` (a single key left), given the count and mass of the
    tokens above the bracket, and the mass of the bracket's tokens >= it. use_mass is a runtime
    flag, not a constexpr, so that both searches call one function."""
    k = tl.arange(0, CAP)
    listed = k < in_bracket
    rank = tl.minimum(target.to(tl.int32) - above_count, CAP)  # 1-based rank of the threshold in the bracket
    # The threshold lies in the bracket: top-p's always (rounding may leave its target unreached),
    # top-k's where its rank falls in it.
    in_reach = (in_bracket > 0) & (use_mass | (rank >= 1))
    if compact:
        # No sort (a CAP-wide sort's unrolled stages were much of the selection kernel's code and
        # compile time): the threshold's key is built bit by bit from the top, a bit kept where the
        # listed values at or above the key so far carry the target's count (top-k, against its
        # rank within the bracket) or, with the mass above the bracket, its mass (top-p). The
        # largest key that reaches the target is a listed value's. Where none reaches it (top-p's
        # rounding), the smallest value.
        values = tl.load(scratch_ptr + k, mask=listed, other=float("-inf"), cache_modifier=".cg")
        weights = tl.where(listed, tl.exp(values - row_max), 0.0)
        keys = _float_key(values)
        share = tl.where(use_mass, weights, listed.to(tl.float32))
        start = tl.where(use_mass, above_mass, 0.0)
        goal = tl.where(use_mass, target.to(tl.float32), rank.to(tl.float32))
        key = tl.zeros([], tl.uint32)
        for r in range(32):
            trial = key | (tl.full([], 0x80000000, tl.uint32) >> r)
            key = tl.where(start + tl.sum(tl.where(keys >= trial, share, 0.0)) >= goal, trial, key)
        reached = start + tl.sum(tl.where(keys >= key, share, 0.0)) >= goal
        smallest = tl.min(tl.where(listed, values, float("inf")))
        fallback = tl.where(use_mass & (in_bracket > 0), smallest, float("-inf"))
        threshold = tl.where(reached & in_reach, _key_value(key), fallback)
        bracket_mass = tl.sum(tl.where(listed & (values >= threshold), weights, 0.0))
    else:  # a single key left: every bracket token has its value, the threshold, and all are kept
        threshold = tl.where(in_reach, _key_value(low), float("-inf"))
        bracket_mass = in_bracket * tl.exp(threshold - row_max)
    return threshold, bracket_mass


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
                target = k.to(tl.float32)
                lo, hi, above_count, above_mass, in_bracket = _bracket(pivots, counts, masses, target, infinite, False,
                                                                       P)
                threshold, kept_mass = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max, lo, hi,
                                                       above_count, above_mass, in_bracket, target, False, CAP, BLOCK)
        if p_on:
            if infinite > 0:  # all the mass lies on the +inf tokens
                threshold = float("inf")
            else:
                target = tl.maximum(p * kept_mass, 1e-30)
                lo, hi, above_count, above_mass, in_bracket = _bracket(pivots, counts, masses, target, 0, True, P)
                top_p_threshold, _ = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, finite_max, lo, hi,
                                                     above_count, above_mass, in_bracket, target, True, CAP, BLOCK)
                threshold = tl.maximum(threshold, top_p_threshold)
        for v0 in range(0, vocab_size, MASK_BLOCK):
            offs = v0 + tl.arange(0, MASK_BLOCK)
            in_row = offs < vocab_size
            x = tl.load(row_ptr + offs, mask=in_row)
            tl.store(row_ptr + offs, tl.where(x.to(tl.float32) >= threshold, x, float("-inf")), mask=in_row)
