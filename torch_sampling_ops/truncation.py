"""Truncation of the distribution, in place, without sorting the row: `top_k_top_p`.

Both filters keep the tokens >= a threshold: the largest value v whose count (top-k) or probability
mass (top-p) of tokens >= v reaches the target. One program per row finds it by counting:

Fast path (`_fast_threshold`): a sorted 4096-token sample of the row gives a lower bound `lo` (past
the sample rank expected of the k-th token by a margin; for top-p alone, where ~0.6 * CAP tokens are
expected above it). One pass counts and weighs the tokens >= lo and compacts them into a per-row
scratch; if they are at most CAP and hold the k tokens (or the top_p mass), the thresholds are read
off the sorted candidates. Then one pass writes -inf below the threshold.

General path (any row the fast path cannot settle):
1. first pass: the row max, min, count and softmax normaliser (online), and, for 16 pivots placed
   geometrically below the first block's max, the count and mass of the tokens >= each pivot;
2. the pivot interval that holds the threshold is the bracket. If it holds more than CAP tokens,
   a counting pass over 16 pivots spread across it narrows it (repeated while needed);
3. one pass compacts the bracket's tokens into the scratch; they are sorted in registers and the
   exact threshold is read off, with the count / mass above the bracket added.
Top-p runs after top-k over the kept set (its target is top_p times the kept mass). A row with both
filters off costs no pass. Masses are float32 sums; so a token's membership may differ from the
exact answer only where the exact mass above it is within float32 rounding of top_p.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import _checks
from ._registry import define_op, launch
from ._triton_helpers import load_slot

_BLOCK = 1024  # tokens per step of a counting pass ([BLOCK, PIVOTS] comparisons)
_FAST_BLOCK = 4096  # tokens per step of the fast path's pass and of the masking pass
_PIVOTS = 16
# Bracket tokens sorted in registers. Triton's interpreter sorts slowly (3 s for 2048 values), so
# under TRITON_INTERPRET=1 the tests use smaller brackets, which exercises the narrowing more.
_CAP = 256 if os.environ.get("TRITON_INTERPRET") == "1" else 2048
_MAX_REFINE = 8  # counting passes that narrow a bracket; 16 pivots each cut it ~16x
# Tokens sampled (in 8 spread runs) to estimate the bracket of the fast path.
_SAMPLE = 512 if os.environ.get("TRITON_INTERPRET") == "1" else 4096


@triton.jit
def _first_pass(row_ptr, vocab_size, BLOCK: tl.constexpr, P: tl.constexpr):
    """Row statistics and the first pivot counts. Pivot P-1 is the row min: count and mass of all."""
    offs = tl.arange(0, BLOCK)
    x0 = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
    anchor = tl.max(tl.where(x0 > float("-inf"), x0, float("-inf")))
    anchor = tl.where(anchor > float("-inf"), anchor, 0.0)
    j = tl.arange(0, P)
    # Geometric gaps below anchor + 4: 0, 0.125, 0.31, 0.59, 1.0, ... 112 (ratio 1.5).
    pivots = anchor + 4.0 - 0.25 * (tl.exp2(j.to(tl.float32) * 0.5849625007211562) - 1.0)

    row_max = float("-inf")
    row_min = float("inf")
    count = 0
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
        row_min = tl.minimum(row_min, tl.min(tl.where(valid, x, float("inf"))))
        row_max = new_max
    last = j == P - 1
    pivots = tl.where(last, row_min, tl.maximum(pivots, row_min))
    counts = tl.where(last, count, counts)
    masses = tl.where(last, total, masses)
    return pivots, counts, masses, row_max, count, total


@triton.jit
def _count_pass(row_ptr, vocab_size, pivots, row_max, BLOCK: tl.constexpr, P: tl.constexpr):
    """Count and mass (relative to row_max) of the tokens >= each pivot."""
    counts = tl.zeros([P], tl.int32)
    masses = tl.zeros([P], tl.float32)
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        above = x[:, None] >= pivots[None, :]
        counts += tl.sum(above.to(tl.int32), axis=0)
        masses += tl.sum(tl.where(above, tl.exp(x - row_max)[:, None], 0.0), axis=0)
    return counts, masses


@triton.jit
def _bracket(pivots, counts, masses, target, USE_MASS: tl.constexpr, P: tl.constexpr):
    """The interval [lo, hi) between the first pivot whose count (or mass) reaches target and the
    pivot above it, with the count and mass of the tokens >= hi and the number of tokens in it."""
    j = tl.arange(0, P)
    if USE_MASS:
        reached = masses >= target
    else:
        reached = counts.to(tl.float32) >= target
    first = tl.min(tl.where(reached, j, P - 1))
    lo = tl.max(tl.where(j == first, pivots, float("-inf")))
    hi = tl.where(first == 0, float("inf"), tl.max(tl.where(j == first - 1, pivots, float("-inf"))))
    count_above = tl.sum(tl.where(j == first - 1, counts, 0))
    mass_above = tl.sum(tl.where(j == first - 1, masses, 0.0))
    mass_at_lo = tl.sum(tl.where(j == first, masses, 0.0))
    n_inside = tl.sum(tl.where(j == first, counts, 0)) - count_above
    return lo, hi, count_above, mass_above, mass_at_lo, n_inside


@triton.jit
def _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, pivots, counts, masses, target,
                    USE_MASS: tl.constexpr, P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
                    MAX_REFINE: tl.constexpr):
    """The largest row value v whose count / mass of tokens >= v reaches target, and that mass."""
    lo, hi, count_above, mass_above, mass_at_lo, n_inside = _bracket(pivots, counts, masses, target, USE_MASS, P)
    rounds = 0
    while (n_inside > CAP) & (rounds < MAX_REFINE):
        top = tl.where(hi < float("inf"), hi, row_max)
        pivots = top - (top - lo) * (tl.arange(0, P).to(tl.float32) / (P - 1))  # top ... lo
        counts, masses = _count_pass(row_ptr, vocab_size, pivots, row_max, BLOCK, P)
        lo, hi, count_above, mass_above, mass_at_lo, n_inside = _bracket(pivots, counts, masses, target, USE_MASS, P)
        rounds += 1

    threshold = lo  # still too many after MAX_REFINE rounds: all but equal values, keep them all
    kept_mass = mass_at_lo
    if n_inside <= CAP:
        # Compact the bracket's tokens into the scratch, then sort them in registers.
        tl.debug_barrier()  # an earlier search may still be reading the scratch
        base = 0
        for v0 in range(0, vocab_size, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            inside = (x >= lo) & (x < hi)
            slot = base + tl.cumsum(inside.to(tl.int32), axis=0) - 1
            tl.store(scratch_ptr + slot, x, mask=inside)
            base += tl.sum(inside.to(tl.int32))
        tl.debug_barrier()
        k = tl.arange(0, CAP)
        ranked = tl.sort(tl.load(scratch_ptr + k, mask=k < n_inside, other=float("-inf"), cache_modifier=".cg"),
                         descending=True)
        weights = tl.exp(ranked - row_max)
        if USE_MASS:
            reached = (mass_above + tl.cumsum(weights, axis=0)) >= target
            first = tl.min(tl.where(reached, k, n_inside - 1))
        else:
            first = target.to(tl.int32) - count_above - 1
        threshold = tl.max(tl.where(k == first, ranked, float("-inf")))
        kept_mass = mass_above + tl.sum(tl.where(ranked >= threshold, weights, 0.0))
    return threshold, kept_mass


@triton.jit
def _sorted_sample(row_ptr, vocab_size, SAMPLE: tl.constexpr):
    """Up to SAMPLE tokens of the row (8 runs spread over it, or the whole row), sorted descending."""
    i = tl.arange(0, SAMPLE)
    spread = (i // (SAMPLE // 8)) * (vocab_size // 8) + i % (SAMPLE // 8)
    offs = tl.where(vocab_size <= SAMPLE, i, spread)
    x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
    return tl.sort(tl.where(x > float("-inf"), x, float("-inf")), descending=True)


@triton.jit
def _pick(values, index, SIZE: tl.constexpr):
    return tl.max(tl.where(tl.arange(0, SIZE) == index, values, float("-inf")))


@triton.jit
def _fast_threshold(row_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on,
                    SAMPLE: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """The threshold from one pass that compacts the tokens >= lo, with lo read off a sorted sample:
    past the sample rank expected of the k-th token by a safe margin (top-k), or where about 0.6 * CAP
    tokens of the row are expected above it (top-p alone). Returns (threshold, valid); valid is 0
    when the tokens >= lo are more than CAP or do not hold the k tokens / the top_p mass."""
    ranked = _sorted_sample(row_ptr, vocab_size, SAMPLE)
    n_sample = tl.minimum(vocab_size, SAMPLE)
    scale = (vocab_size * 1.0) / n_sample
    if k_on:
        expected = k.to(tl.float32) / scale
        rank = (expected + 4.0 * tl.sqrt(expected) + 4.0).to(tl.int32)
    else:
        rank = (0.6 * CAP / scale).to(tl.int32)
    rank = tl.minimum(rank, n_sample - 1)
    lo = _pick(ranked, rank, SAMPLE)
    ref = tl.max(ranked)  # exp(x - ref): a token more than 60 above it sends the row to the general path

    threshold = float("-inf")
    valid = 0
    if (lo > float("-inf")) & (rank.to(tl.float32) * scale < 0.75 * CAP):
        count = tl.zeros([BLOCK], tl.int32)
        mass_lo = tl.zeros([BLOCK], tl.float32)
        mass_all = tl.zeros([BLOCK], tl.float32)
        too_large = tl.zeros([BLOCK], tl.int32)
        base = 0
        for v0 in range(0, vocab_size, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            e = tl.where(x > float("-inf"), tl.exp(x - ref), 0.0)
            inside = x >= lo
            count += inside.to(tl.int32)
            mass_lo += tl.where(inside, e, 0.0)
            mass_all += e
            too_large |= (x > ref + 60.0).to(tl.int32)
            n_in = tl.sum(inside.to(tl.int32))
            if n_in > 0:
                slot = base + tl.cumsum(inside.to(tl.int32), axis=0) - 1
                tl.store(scratch_ptr + slot, x, mask=inside & (slot < CAP))
                base += n_in
        n_inside = tl.sum(count)
        if k_on:
            holds_target = n_inside >= k
        else:
            holds_target = tl.sum(mass_lo) >= p * tl.sum(mass_all)
        valid = (holds_target & (n_inside <= CAP) & (tl.max(too_large) == 0)).to(tl.int32)
        if valid:
            tl.debug_barrier()
            i = tl.arange(0, CAP)
            cand = tl.sort(tl.load(scratch_ptr + i, mask=i < n_inside, other=float("-inf"), cache_modifier=".cg"),
                           descending=True)
            w = tl.exp(cand - ref)
            target = p * tl.sum(mass_all)
            if k_on:  # every token >= the k-th is a candidate: so is the whole kept set of top-p
                threshold = _pick(cand, k - 1, CAP)
                target = p * tl.sum(tl.where(cand >= threshold, w, 0.0))
            if p_on:
                reached = tl.cumsum(w, axis=0) >= tl.maximum(target, 1e-30)
                threshold = tl.maximum(threshold, _pick(cand, tl.min(tl.where(reached, i, n_inside - 1)), CAP))
    return threshold, valid


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, scratch_ptr, num_slots, vocab_size,
    P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, MAX_REFINE: tl.constexpr, SAMPLE: tl.constexpr,
    FAST_BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    k = tl.load(top_k_ptr + slot)
    p = tl.load(top_p_ptr + slot)
    k_on = (k > 0) & (k < vocab_size)
    p_on = p < 1.0
    if (k_on | p_on) == 0:
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    scratch_ptr += t.to(tl.int64) * CAP

    threshold, valid = _fast_threshold(row_ptr, scratch_ptr, vocab_size, k, p, k_on, p_on, SAMPLE, CAP, FAST_BLOCK)
    if valid == 0:  # the general path: pivot counting, narrowing, compaction
        pivots, counts, masses, row_max, count, total = _first_pass(row_ptr, vocab_size, BLOCK, P)
        if count == 0:
            return  # no logit above -inf: nothing to keep or drop
        threshold = float("-inf")
        kept_mass = total
        if k_on & (k < count):
            threshold, kept_mass = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, pivots, counts, masses,
                                                   k.to(tl.float32), False, P, CAP, BLOCK, MAX_REFINE)
        if p_on:
            target = tl.maximum(p * kept_mass, 1e-30)  # top_p <= 0 keeps the most probable token(s)
            top_p_threshold, _ = _find_threshold(row_ptr, scratch_ptr, vocab_size, row_max, pivots, counts, masses,
                                                 target, True, P, CAP, BLOCK, MAX_REFINE)
            threshold = tl.maximum(threshold, top_p_threshold)

    for v0 in range(0, vocab_size, FAST_BLOCK):
        offs = v0 + tl.arange(0, FAST_BLOCK)
        in_row = offs < vocab_size
        x = tl.load(row_ptr + offs, mask=in_row)
        tl.store(row_ptr + offs, tl.where(x.to(tl.float32) >= threshold, x, float("-inf")), mask=in_row)


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


def _top_k_top_p_triton(logits, idx_mapping, top_k, top_p) -> None:
    T, V = logits.shape
    if T == 0:
        return
    scratch = logits.new_empty((T, _CAP), dtype=torch.float32)
    launch(
        _top_k_top_p_kernel, (T,),
        logits, logits.stride(0), idx_mapping, top_k, top_p, scratch, top_k.size(0), V,
        P=_PIVOTS, CAP=_CAP, BLOCK=_BLOCK, MAX_REFINE=_MAX_REFINE, SAMPLE=_SAMPLE, FAST_BLOCK=_FAST_BLOCK, num_warps=8,
    )



top_k_top_p_op = define_op(
    "top_k_top_p(Tensor(a!) logits, Tensor idx_mapping, Tensor top_k, Tensor top_p) -> ()",
    check=_check_top_k_top_p,
    check_values=_check_top_k_top_p_values,
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
        top_p: ``[R]`` float32 in ``(0, 1]``; ``1.0`` is off (a value ``<= 0`` keeps the most probable token).

    A row with both filters off is not read. When a filter is on, NaN logits become -inf; a row
    without any logit above -inf is unchanged. Masses are float32 sums: a token's membership may
    differ from the exact answer only where the exact mass above it is within ~1e-4 of top_p.
    """
    torch.ops.sampling.top_k_top_p(logits, idx_mapping, top_k, top_p)
