"""Drawing tokens: `sample` and `logprobs`, and the random stream of sampling.

The random stream. Token j of a row with seed s and position p (its `output_lens`) gets 32 random
bits h = stream_bits(stream_key(s, p), j): the key mixes the four 32-bit words of (s, p), low word
first, through the murmur3 finalizer (`_mix32`), and the token's bits are two more rounds over
key ^ j. Every step is a wrapping uint32 operation, so Triton, the C++ kernels
(csrc/random_stream.h) and the reference (torch int64 arithmetic masked to 32 bits, the
definition) compute the same bits. The uniform u = ((h >> 9) + 1/2) / 2**23 lies in (0, 1) and is
exact in float32 (23 bits, not 24: (2m + 1) / 2**25 for a 24-bit m would round to 1.0 at the
top); the Gumbel noise -log(-log(u)) is computed in float32, where the two logs are the only steps
whose last bit may differ between devices. The stream has no state: a row's draw depends only on
(seed, position, token), never on the batch, the launch grid or a CUDA-graph replay count.

`sample` on CUDA: one launch copies each row that has a filter on, divided by its temperature
(greedy rows as they are) with an IEEE division as the `temperature` op, into a float32 [T, V]
workspace; the `min_p` and `top_k_top_p` launchers run on the workspace (rows whose filters are off
are not read); then one program a row (below 128 rows, one a row and 8192-token segment, with a
second launch reducing the segments in order) draws: the argmax of value + Gumbel noise over the
tokens above -inf, ties to the lower index, reading the workspace row, or for a row without filters
its logits (divided on the fly: the same bits), or for a greedy row the plain argmax of its logits
(the filters always keep it). Greedy and unfiltered rows thus cost one read of the row.

The draw (`gumbel_argmax`, also rejection_sample's) scores every token approximately, from two
hardware log2 (`stream_gumbel_approx`) and a multiplication by 1 / temperature, each score within
a tolerance of its exact value, and keeps each lane's two largest. When the largest minus the
tolerance stays above the runner-up plus it, that token wins the exact scores too: its exact score
alone is computed. Otherwise (a near tie, an infinite score) a second pass scores every token
exactly. So the token is the exact scores' argmax, bit for bit, at about half the arithmetic.

`logprobs` on CUDA: two launches. The first splits each row into fixed segments (their length a
module constant, so a row's result never depends on the batch), one program each, which reads its
segment once and writes its max, sum of exp(x - max), count of logits strictly larger than the
token's, and up to W candidates (value, token) that hold its K largest, in no order. They come
without a sort: tau, the K-th largest of the float32 maxima of strided groups, bounds the K largest
from below, and the tokens at or above it (about 1.4 K) take their slots by a prefix sum; `tl.topk`
on blocks is the path for large K or when more than W pass. The second, one program a
row, combines the segments in order (max and sum rescaled), sums the counts, and takes the top k of
the segments' candidates with `tl.topk`, as sortable int64 keys (order-preserving float bits
above, V-inverted index below, so ties go to the lower index).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import _checks
from ._launch import cdiv, next_power_of_2
from ._registry import define_op, launch
from ._triton_helpers import ON_GPU, load_slot, program_range
from .filtering import _min_p_triton, blocks_per_program
from .truncation.op import _top_k_top_p_triton

_BLOCK_V = 4096
# The draw splits each row into segments of this many tokens, one program each, below
# _SPLIT_MAX_T rows (a row alone would otherwise be streamed by one SM); a second launch reduces the
# segments' (score, index) pairs in order. The argmax is exact whatever the split, so a row's token
# does not depend on it.
_SEGMENT = 2 * _BLOCK_V if os.environ.get("TRITON_INTERPRET") != "1" else 1024
_SPLIT_MAX_T = 128
# The draw's programs walk their tokens in tiles of _DRAW_BLOCK_V over _DRAW_WARPS warps.
_DRAW_BLOCK_V = 4096
_DRAW_WARPS = 8
_MAX_TOPK = 1024  # largest num_logprobs: the Triton kernels hold K-key lists in registers; more is rejected
# logprobs splits each row into segments of _LOGPROBS_SEGMENT tokens, one program of _LOGPROBS_WARPS
# warps each (a function of V only, so a row's result never depends on the batch). Each segment hands
# the combining program W candidates (value, token) that hold its K largest (K = num_logprobs to a
# power of two, at least 2), in no order. Fast path (2 * K <= _LOGPROBS_GROUPS, W = 2 * K <
# _LOGPROBS_SEGMENT): the tokens at or above a threshold from the maxima of _LOGPROBS_GROUPS strided
# groups (about 1.4 K of them), unless more than W pass it; otherwise, and for larger K (W = K),
# `tl.topk` on blocks of max(_LOGPROBS_BLOCK, W) keys. The combining program takes `tl.topk` on up
# to _LOGPROBS_MERGE_KEYS of the segments' candidates at once.
_LOGPROBS_SEGMENT = 4096 if os.environ.get("TRITON_INTERPRET") != "1" else 1024
_LOGPROBS_GROUPS = 64
_LOGPROBS_BLOCK = 1024
_LOGPROBS_MERGE_KEYS = 1024
_LOGPROBS_WARPS = 4
# The tolerance of the approximate Gumbel scores (gumbel_argmax, rejection_sample's residual), a
# kernel argument: above their analysed error with room to spare; larger only costs exact passes
# (tests raise it to force the exact pass everywhere).
GUMBEL_APPROX_TOL = 2.0**-16
_KEY_NONE = tl.constexpr(-2**63)  # below every `_sortable_key` (its high word is a NaN's; NaN is read as -inf)

# ----------------------------------------------------------------------------------------------
# The random stream


@triton.jit
def _mix32(h):
    """The murmur3 finalizer on uint32: a bijection with full avalanche."""
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h


@triton.jit
def stream_key(seed, position):
    """uint32 key of the stream of (seed, position), both int64."""
    k = _mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ 0x9E3779B9)
    k = _mix32(k ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    k = _mix32(k ^ (position & 0xFFFFFFFF).to(tl.uint32))
    return _mix32(k ^ ((position >> 32) & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def stream_bits(key, token):
    """uint32 random bits of token indices `token` (in [0, 2**31)) of the stream `key`."""
    return _mix32(_mix32(key ^ token.to(tl.uint32)) + 0x6A09E667)


@triton.jit
def stream_gumbel(bits):
    """Gumbel noise -log(-log(u)) in float32, u = ((bits >> 9) + 1/2) / 2**23 in (0, 1)."""
    u = ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
    return -tl.log(-tl.log(u))


@triton.jit
def fast_log2(x):
    """log2(x) for x > 0 by the hardware approximation (PTX lg2.approx: absolute error at most
    2**-22.6 on [0.5, 2], 2 ulp elsewhere); tl.log2 under the interpreter, which runs no PTX."""
    if ON_GPU:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.log2(x)


@triton.jit
def stream_gumbel_approx(bits):
    """stream_gumbel(bits) to within 2**-17 * (1 + |result|), from two hardware log2.

    u (exact: Sterbenz) as stream_gumbel takes it. E = -log(u) comes from the series of
    -log(1 - w), w = 1 - u (exact there), where w < 1/16 (relative error below w**4 / 5 <= 2**-18.3),
    as lg2.approx's absolute error would swamp a small E; elsewhere from -ln 2 * log2(u) (E >= 1/16:
    relative error below 2**-19). The outer log adds at most 2**-22 * (1 + |g|)."""
    u = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 0.99999994039535522  # (m + 1/2) / 2**23
    w = 1.0 - u
    e_series = w * (1.0 + w * (0.5 + w * (0.3333333432674408 + w * 0.25)))
    e = tl.where(w < 0.0625, e_series, -0.6931471805599453 * fast_log2(u))
    return -0.6931471805599453 * fast_log2(e)


@triton.jit
def argmax_init(BLOCK_V: tl.constexpr):
    """Per-lane running argmax state: (scores -inf, tokens -1)."""
    return tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32), tl.full((BLOCK_V,), -1, dtype=tl.int32)


@triton.jit
def argmax_update(best, best_j, score, live, offs):
    """Per-lane running argmax; strictly larger only, so a lane keeps its lower index on ties."""
    take = live & ((best_j < 0) | (score > best))
    return tl.where(take, score, best), tl.where(take, offs, best_j)


@triton.jit
def argmax_finish(best, best_j, bound):
    """(the largest lane score, the lowest index holding it as int32); (-inf, -1) if no lane took a
    token. `bound`: above every token index."""
    top = tl.max(tl.where(best_j >= 0, best, float("-inf")), axis=0)
    token = tl.min(tl.where((best_j >= 0) & (best == top), best_j, bound), axis=0)
    return top, tl.where(token < bound, token, -1)


@triton.jit
def top2_init(BLOCK_V: tl.constexpr):
    """Per-lane top-2 state: (largest -inf, second -inf, token of the largest -1)."""
    return (tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32), tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32),
            tl.full((BLOCK_V,), -1, dtype=tl.int32))


@triton.jit
def top2_update(first, second, first_j, score, offs):
    """Per lane: the largest score (and its token) and the second largest."""
    second = tl.maximum(second, tl.minimum(first, score))
    first_j = tl.where(score > first, offs, first_j)
    return tl.maximum(first, score), second, first_j


@triton.jit
def top2_certified(first, second, first_j, tol, BLOCK_V: tl.constexpr):
    """(token, certified) of per-lane top-2 approximate scores, each within err(s) = tol * (35 + |s|)
    of its exact score, -inf only where no token is: the token of the largest (-1 without one), and
    whether err proves it the exact argmax (the others' largest plus its err stays below the
    largest minus its err, finite; a lone token always wins) or there is no token."""
    top = tl.max(first, axis=0)
    lane = tl.arange(0, BLOCK_V)
    top_lane = tl.min(tl.where(first == top, lane, BLOCK_V), axis=0)
    runner_up = tl.maximum(tl.max(second, axis=0), tl.max(tl.where(lane == top_lane, float("-inf"), first), axis=0))
    token = tl.max(tl.where(lane == top_lane, first_j, -1), axis=0)
    runner_up_bound = tl.where(runner_up > float("-inf"), runner_up + tol * (35.0 + tl.abs(runner_up)), float("-inf"))
    certified = (top == float("-inf")) | ((top < float("inf")) & (runner_up_bound < top - tol * (35.0 + tl.abs(top))))
    return token, certified


@triton.jit
def _exact_gumbel_argmax(row_ptr, begin, end, key, temp, SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """(score, token) of argmax_j of x_j (/ temp with SCALE) + stream_gumbel(key, j) over the tokens
    of [begin, end) above -inf, the lower index among ties; (-inf, -1) without one."""
    best, best_j = argmax_init(BLOCK_V)
    for start in range(begin, end, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        if SCALE:
            x = tl.math.div_rn(x, temp)
        best, best_j = argmax_update(best, best_j, x + stream_gumbel(stream_bits(key, offs)), x > float("-inf"), offs)
    return argmax_finish(best, best_j, 2147483647)


@triton.jit
def gumbel_argmax(row_ptr, begin, end, key, temp, tol, SCALE: tl.constexpr, BLOCK_V: tl.constexpr,
                  STAGES: tl.constexpr = 1):
    """(score, token) of argmax_j of x_j (/ temp with SCALE) + stream_gumbel(key, j) over the tokens
    of row_ptr[begin:end] above -inf (NaN never), the lower index among ties; (-inf, -1) without
    one. The exact scores' result, bit for bit, mostly from approximate ones:

    One pass scores every token approximately (x * (1 / temp), stream_gumbel_approx), each within
    err(s) = tol * (35 + |s|) of its exact score (tol >= GUMBEL_APPROX_TOL; |g| <= 16.7, so err bounds
    the noise's and the product's errors and both roundings), and keeps per lane the largest and the
    second largest approximate score. With A the largest (token a) and S the largest of the others,
    S + err(S) < A - err(A) proves every other token's exact score below a's: a wins, and its exact
    score alone is computed (x reloaded). Otherwise (near ties within the tolerance, an infinite
    score) a second pass scores every token exactly."""
    inv_temp = tl.math.div_rn(1.0, temp)
    first, second, first_j = top2_init(BLOCK_V)
    for start in tl.range(begin, end, BLOCK_V, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        if SCALE:
            x_scaled = x * inv_temp
        else:
            x_scaled = x
        # -inf for -inf and NaN logits (x_scaled is NaN for NaN) alone: never first, never second; a
        # token whose scaled logit overflows to -inf counts at -FLT_MAX (its exact score is lower).
        approx = tl.where(x > float("-inf"),
                          tl.maximum(x_scaled + stream_gumbel_approx(stream_bits(key, offs)), -3.4028234663852886e38),
                          float("-inf"))
        first, second, first_j = top2_update(first, second, first_j, approx, offs)
    token, certified = top2_certified(first, second, first_j, tol, BLOCK_V)
    if certified:
        if token >= 0:
            x_a = tl.load(row_ptr + token).to(tl.float32)
            if SCALE:
                x_a = tl.math.div_rn(x_a, temp)
            score = x_a + stream_gumbel(stream_bits(key, token))
        else:
            score = float("-inf")
    else:
        score, token = _exact_gumbel_argmax(row_ptr, begin, end, key, temp, SCALE, BLOCK_V)
    return score, token


@triton.jit
def argmax_tokens(row_ptr, begin, end, BLOCK_V: tl.constexpr, STAGES: tl.constexpr = 1):
    """(max, token) of row_ptr[begin:end] over the tokens above -inf (NaN never), the lower index
    among ties; (-inf, -1) without one: a greedy row's argmax. STAGES tiles in flight."""
    best, best_j = argmax_init(BLOCK_V)
    for start in tl.range(begin, end, BLOCK_V, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        best, best_j = argmax_update(best, best_j, x, x > float("-inf"), offs)  # false for -inf and NaN
    return argmax_finish(best, best_j, 2147483647)


@triton.jit
def _random_stream_kernel(seeds_ptr, positions_ptr, tokens_ptr, bits_ptr, noise_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    key = stream_key(tl.load(seeds_ptr + offs, mask=ok).to(tl.int64), tl.load(positions_ptr + offs, mask=ok).to(tl.int64))
    bits = stream_bits(key, tl.load(tokens_ptr + offs, mask=ok))
    tl.store(bits_ptr + offs, bits.to(tl.int64), mask=ok)
    tl.store(noise_ptr + offs, stream_gumbel(bits), mask=ok)


@triton.jit
def _gumbel_noise_kernel(bits_ptr, exact_ptr, approx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    bits = tl.load(bits_ptr + offs, mask=ok).to(tl.uint32)
    tl.store(exact_ptr + offs, stream_gumbel(bits), mask=ok)
    tl.store(approx_ptr + offs, stream_gumbel_approx(bits), mask=ok)


def gumbel_noise_triton(bits: torch.Tensor):
    """(stream_gumbel, stream_gumbel_approx) float32 of 1-D int64 `bits` (uint32 values), computed by
    the Triton functions the kernels use (for tests)."""
    exact = torch.empty(bits.numel(), dtype=torch.float32, device=bits.device)
    approx = torch.empty_like(exact)
    if bits.numel():
        _gumbel_noise_kernel[(cdiv(bits.numel(), 1024),)](bits, exact, approx, bits.numel(), BLOCK=1024)
    return exact, approx


def random_stream_triton(seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor):
    """(bits int64, noise float32) of the stream at each (seed, position, token), elementwise over
    1-D int64 tensors, computed by the Triton functions the kernels use (for tests)."""
    n = seeds.numel()
    bits = torch.empty(n, dtype=torch.int64, device=seeds.device)
    noise = torch.empty(n, dtype=torch.float32, device=seeds.device)
    if n:
        _random_stream_kernel[(cdiv(n, 1024),)](seeds, positions, tokens, bits, noise, n, BLOCK=1024)
    return bits, noise


# ----------------------------------------------------------------------------------------------
# logprobs


@triton.jit
def _sortable_key(x, offs):
    """int64 keys ordered as (x descending, offs ascending): float bits made order-preserving in the
    high word, 2**32 - 1 - offs in the low word."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (4294967295 - offs.to(tl.int64))


@triton.jit
def _key_parts(keys):
    """(value float32, token int32) of `_sortable_key` keys; (NaN-bits value, -1) for _KEY_NONE."""
    ordered = (keys >> 32).to(tl.int32)
    values = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    return values, tl.where(keys != _KEY_NONE, (4294967295 - (keys & 4294967295)).to(tl.int32), -1)


@triton.jit
def _store_candidates(vals_ptr, ids_ptr, keys, W: tl.constexpr):
    """Stores W keys as their (value, token) parts (token -1 for _KEY_NONE)."""
    values, tokens = _key_parts(keys)
    tl.store(vals_ptr + tl.arange(0, W), values)
    tl.store(ids_ptr + tl.arange(0, W), tokens)


@triton.jit
def _topk_of_blocks(row_ptr, begin, end, K: tl.constexpr, BLOCK: tl.constexpr):
    """The K largest keys of row[begin:end] (_KEY_NONE past the end), larger first: `tl.topk` on each
    block holding a key above the running K-th."""
    best = tl.full((K,), _KEY_NONE, dtype=tl.int64)
    for start in range(begin, end, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < end
        x = tl.load(row_ptr + offs, mask=ok, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))
        keys = tl.where(ok, _sortable_key(x, offs), _KEY_NONE)
        if tl.max(keys, axis=0) > tl.min(best, axis=0):
            best = tl.topk(tl.reshape(tl.join(best, tl.topk(keys, K)), (2 * K,)), K)
    return best


@triton.jit
def _logprobs_segment_kernel(logits_ptr, logits_stride, token_ids_ptr, part_max_ptr, part_sum_ptr, part_larger_ptr,
                             part_vals_ptr, part_ids_ptr, vocab_size, num_segments, SEGMENT: tl.constexpr,
                             GROUPS: tl.constexpr, K: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr,
                             HAS_TOPK: tl.constexpr, FAST: tl.constexpr):
    """Segment s of row t: its max, sum of exp(x - max) (0 without mass), count of logits strictly
    larger than the token's, and W candidates holding its K largest (value and token, in no order;
    token -1 pads), at [t, s] of the part tensors."""
    t = tl.program_id(0)
    s = tl.program_id(1)
    part = t.to(tl.int64) * num_segments + s
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    token = tl.load(token_ids_ptr + t).to(tl.int64)
    token_ok = (token >= 0) & (token < vocab_size)
    x_token = tl.load(row_ptr + tl.where(token_ok, token, 0)).to(tl.float32)
    x_token = tl.where(x_token == x_token, x_token, float("-inf"))
    begin = s.to(tl.int64) * SEGMENT
    end = tl.minimum(begin + SEGMENT, vocab_size)
    offs = begin + tl.arange(0, SEGMENT)
    ok = offs < end
    x = tl.load(row_ptr + offs, mask=ok, other=float("-inf")).to(tl.float32)
    x = tl.where(x == x, x, float("-inf"))  # NaN is read as -inf
    seg_max = tl.max(x, axis=0)
    seg_sum = tl.where(seg_max > float("-inf"), tl.sum(tl.exp(x - seg_max), axis=0), 0.0)
    tl.store(part_max_ptr + part, seg_max)
    tl.store(part_sum_ptr + part, seg_sum)
    tl.store(part_larger_ptr + part, tl.sum((x > x_token).to(tl.int32), axis=0).to(tl.int64))
    if HAS_TOPK:
        out_vals = part_vals_ptr + part * W
        out_ids = part_ids_ptr + part * W
        if FAST:
            # The maxima of GROUPS strided groups (index mod GROUPS), in float32 (cheaper than keys): with
            # tau the largest maximum that at least K maxima reach (ties included), at least K groups
            # hold a value >= tau, so the segment's K largest are all >= tau.
            group_max = tl.max(tl.reshape(x, (SEGMENT // GROUPS, GROUPS)), axis=0)
            group_rank = tl.sum((group_max[None, :] >= group_max[:, None]).to(tl.int32), axis=1)
            tau = tl.max(tl.where(group_rank >= K, group_max, float("-inf")), axis=0)
            take = (x >= tau) & ok  # every in-range token when tau is -inf: more than W, the general path
            n = tl.sum(take.to(tl.int32), axis=0)
            if n <= W:
                # The n tokens >= tau to slots 0 .. n - 1 in token order, token -1 to the others:
                # disjoint stores. The prefix sum runs on rows of 4 consecutive tokens, as one thread
                # holds them: a sum and a prefix within each row, a scan over the row counts only
                # (a scan of every token would move them all into its layout). Values and int32
                # tokens rather than int64 keys: half the bytes.
                take_rows = tl.reshape(take, (SEGMENT // 4, 4)).to(tl.int32)
                row_n = tl.sum(take_rows, axis=1)
                slot = (tl.cumsum(row_n, axis=0) - row_n)[:, None] + tl.cumsum(take_rows, axis=1) - 1
                tl.store(out_vals + slot, tl.reshape(x, (SEGMENT // 4, 4)), mask=take_rows != 0)
                tl.store(out_ids + slot, tl.reshape(offs, (SEGMENT // 4, 4)).to(tl.int32), mask=take_rows != 0)
                c = tl.arange(0, W)
                tl.store(out_ids + c, tl.full((W,), -1, tl.int32), mask=c >= n)
            else:
                _store_candidates(out_vals, out_ids, _topk_of_blocks(row_ptr, begin, end, W, BLOCK), W)
        else:
            _store_candidates(out_vals, out_ids, _topk_of_blocks(row_ptr, begin, end, W, BLOCK), W)


@triton.jit
def _logprobs_combine_kernel(logits_ptr, logits_stride, token_ids_ptr, part_max_ptr, part_sum_ptr, part_larger_ptr,
                             part_vals_ptr, part_ids_ptr, topk_ids_ptr, topk_lp_ptr, token_lp_ptr, ranks_ptr,
                             vocab_size, num_segments, k, STAT_SEGS: tl.constexpr, MERGE_SEGS: tl.constexpr,
                             K: tl.constexpr, W: tl.constexpr, HAS_TOPK: tl.constexpr):
    """Row t from its segments' parts, in segment order (chunks of STAT_SEGS and MERGE_SEGS, both
    functions of V only): logsumexp, rank, the top-k keys, and the four outputs."""
    t = tl.program_id(0)
    base = t.to(tl.int64) * num_segments
    token = tl.load(token_ids_ptr + t).to(tl.int64)
    token_ok = (token >= 0) & (token < vocab_size)
    x_token = tl.load(logits_ptr + t.to(tl.int64) * logits_stride + tl.where(token_ok, token, 0)).to(tl.float32)
    x_token = tl.where(x_token == x_token, x_token, float("-inf"))
    run_max = float("-inf")
    run_sum = 0.0
    larger = tl.zeros((), dtype=tl.int64)
    for first in range(0, num_segments, STAT_SEGS):
        seg = first + tl.arange(0, STAT_SEGS)
        m = seg < num_segments
        seg_max = tl.load(part_max_ptr + base + seg, mask=m, other=float("-inf"))
        seg_sum = tl.load(part_sum_ptr + base + seg, mask=m, other=0.0)
        larger += tl.sum(tl.load(part_larger_ptr + base + seg, mask=m, other=0), axis=0)
        chunk_max = tl.max(seg_max, axis=0)
        chunk_sum = tl.sum(tl.where(seg_max > float("-inf"), seg_sum * tl.exp(seg_max - chunk_max), 0.0), axis=0)
        new_max = tl.maximum(run_max, chunk_max)
        run_sum = (tl.where(run_max > float("-inf"), run_sum * tl.exp(run_max - new_max), 0.0) +
                   tl.where(chunk_max > float("-inf"), chunk_sum * tl.exp(chunk_max - new_max), 0.0))
        run_max = new_max
    # logsumexp is +inf with a +inf logit (the sum is NaN then): finite logits get -inf, +inf ones NaN.
    lse = tl.where(run_max == float("inf"), float("inf"), run_max + tl.log(run_sum))
    no_mass = run_max == float("-inf")
    token_lp = tl.where(no_mass, float("-inf"), x_token - lse)
    tl.store(token_lp_ptr + t, tl.where(token_ok, token_lp, float("-inf")))
    tl.store(ranks_ptr + t, tl.where(token_ok, 1 + larger, -1))
    if HAS_TOPK:
        w = tl.arange(0, W)
        best = tl.full((K,), _KEY_NONE, dtype=tl.int64)
        for first in range(0, num_segments, MERGE_SEGS):
            seg = first + tl.arange(0, MERGE_SEGS)
            at = (base + seg)[:, None] * W + w[None, :]
            live = (seg < num_segments)[:, None]
            tokens = tl.load(part_ids_ptr + at, mask=live, other=-1)
            values = tl.load(part_vals_ptr + at, mask=live & (tokens >= 0), other=float("-inf"))
            keys = tl.where(tokens >= 0, _sortable_key(values, tokens), _KEY_NONE)
            chunk_best = tl.topk(tl.reshape(keys, (MERGE_SEGS * W,)), K)
            best = tl.topk(tl.reshape(tl.join(best, chunk_best), (2 * K,)), K)
        j = tl.arange(0, K)
        vals, ids = _key_parts(best)
        lp = tl.where(no_mass, float("-inf"), vals - lse)
        out = t.to(tl.int64) * k + j
        tl.store(topk_ids_ptr + out, ids, mask=j < k)
        tl.store(topk_lp_ptr + out, lp, mask=j < k)


def _check_logprobs(logits, token_ids, num_logprobs) -> None:
    op = "logprobs"
    T, V = _checks.check_logits(op, logits)
    _checks.check_tensor(op, "token_ids", token_ids, _checks.INDEX_DTYPES, ndim=1, device=logits.device, shape=(T,))
    if not isinstance(num_logprobs, int) or isinstance(num_logprobs, bool):
        raise TypeError(f"sampling.{op}: 'num_logprobs' must be an int, got {type(num_logprobs).__name__}")
    if not 0 <= num_logprobs <= min(V, _MAX_TOPK):
        raise ValueError(f"sampling.{op}: 'num_logprobs' must be in [0, {min(V, _MAX_TOPK)}] (at most V and "
                         f"{_MAX_TOPK}), got {num_logprobs}")


def _check_logprobs_values(logits, token_ids, num_logprobs) -> None:
    _checks.check_values("logprobs", "logits", ~logits.isnan(), "no NaN")


def _logprobs_outputs(logits, num_logprobs):
    T = logits.shape[0]
    return (logits.new_empty((T, num_logprobs), dtype=torch.int64),
            logits.new_empty((T, num_logprobs), dtype=torch.float32),
            logits.new_empty((T,), dtype=torch.float32), logits.new_empty((T,), dtype=torch.int64))


def _logprobs_fake(logits, token_ids, num_logprobs):
    return _logprobs_outputs(logits, num_logprobs)


def _logprobs_triton(logits, token_ids, num_logprobs):
    outs = _logprobs_outputs(logits, num_logprobs)
    T, V = logits.shape
    if T == 0:
        return outs
    S = cdiv(V, _LOGPROBS_SEGMENT)
    K = next_power_of_2(max(num_logprobs, 2))  # tl.topk needs k >= 2
    has_topk = num_logprobs > 0
    # With fewer than K finite values in a segment tau is -inf and all SEGMENT > W tokens pass: the fallback.
    fast = has_topk and 2 * K <= _LOGPROBS_GROUPS and 2 * K < _LOGPROBS_SEGMENT
    W = 2 * K if fast else K
    part_max = logits.new_empty((T, S), dtype=torch.float32)
    part_sum = logits.new_empty((T, S), dtype=torch.float32)
    part_larger = logits.new_empty((T, S), dtype=torch.int64)
    part_vals = logits.new_empty((T, S, W) if has_topk else (1,), dtype=torch.float32)
    part_ids = logits.new_empty((T, S, W) if has_topk else (1,), dtype=torch.int32)
    launch(_logprobs_segment_kernel, (T, S), logits, logits.stride()[0], token_ids, part_max, part_sum, part_larger,
           part_vals, part_ids, V, S, SEGMENT=_LOGPROBS_SEGMENT, GROUPS=_LOGPROBS_GROUPS, K=K, W=W,
           BLOCK=max(_LOGPROBS_BLOCK, W), HAS_TOPK=has_topk, FAST=fast, num_warps=_LOGPROBS_WARPS)
    merge_segs = min(next_power_of_2(S), max(1, _LOGPROBS_MERGE_KEYS // W))
    launch(_logprobs_combine_kernel, (T,), logits, logits.stride()[0], token_ids, part_max, part_sum, part_larger,
           part_vals, part_ids, *outs, V, S, num_logprobs, STAT_SEGS=min(next_power_of_2(S), 1024),
           MERGE_SEGS=merge_segs, K=K, W=W, HAS_TOPK=has_topk, num_warps=4 if merge_segs * W <= 1024 else 8)
    return outs


@define_op(mutates_args=(), check=_check_logprobs, check_values=_check_logprobs_values, triton=_logprobs_triton,
           fake=_logprobs_fake)
def logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
             num_logprobs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-softmax of each row: its largest entries and the logprob and rank of a given token.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; read only.
        token_ids: ``[T]`` int32/int64, the token of each row whose logprob and rank are returned.
        num_logprobs: ``k`` in ``[0, min(V, 1024)]``.

    Returns ``(topk_ids int64 [T, k], topk_logprobs float32 [T, k], token_logprobs float32 [T],
    token_ranks int64 [T])``: the ``k`` largest logits of each row (larger first, the lower index
    among ties) with their log-probabilities ``logit - logsumexp(row)`` (float32); the
    log-probability of ``token_ids[t]`` and its rank, 1 + the number of logits strictly larger. A
    token id outside ``[0, V)`` gets ``-inf`` and rank ``-1``. NaN logits are read as ``-inf``
    (probability 0, never larger than another logit). A row with no logit above ``-inf`` has every
    logprob ``-inf``. With ``+inf`` logits the logprobs are NaN.
    """


# ----------------------------------------------------------------------------------------------
# sample


@triton.jit
def _row_is_filtered(slot, min_p_ptr, top_k_ptr, top_p_ptr, vocab_size):
    """Whether any of the row's filters is on (as the filter ops read their parameters)."""
    k = tl.load(top_k_ptr + slot)
    return (tl.load(min_p_ptr + slot) != 0.0) | ((k > 0) & (k < vocab_size)) | (tl.load(top_p_ptr + slot) < 1.0)


@triton.jit
def _scale_rows_kernel(logits_ptr, logits_stride, ws_ptr, idx_mapping_ptr, temperature_ptr, min_p_ptr, top_k_ptr,
                       top_p_ptr, num_slots, vocab_size, BLOCK_V: tl.constexpr, GROUP: tl.constexpr):
    """ws[t] = logits[t] / temperature (IEEE division; as they are for greedy rows) for the rows with a
    filter on, the rows the filters will read; the others are drawn from the logits directly.
    Program (t, g) writes GROUP blocks of BLOCK_V tokens."""
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    if not _row_is_filtered(slot, min_p_ptr, top_k_ptr, top_p_ptr, vocab_size):
        return
    temp = tl.load(temperature_ptr + slot)
    first, end = program_range(tl.cdiv(vocab_size, BLOCK_V), GROUP)
    for b in range(first, end):
        offs = b * BLOCK_V + tl.arange(0, BLOCK_V)
        in_row = offs < vocab_size
        x = tl.load(logits_ptr + t.to(tl.int64) * logits_stride + offs, mask=in_row).to(tl.float32)
        x = tl.where(temp != 0.0, tl.math.div_rn(x, tl.where(temp != 0.0, temp, 1.0)), x)
        tl.store(ws_ptr + t.to(tl.int64) * vocab_size + offs, x, mask=in_row)


@triton.jit
def _gumbel_argmax_row(row_ptr, begin, end, vocab_size, key, temp, tol, SAMPLED: tl.constexpr, SCALE: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    """(score, token) of tokens [begin, end) (end <= vocab_size) of one row: gumbel_argmax with
    SAMPLED, else argmax_tokens; token vocab_size (score -inf) when there is none."""
    if SAMPLED:
        score, token = gumbel_argmax(row_ptr, begin, end, key, temp, tol, SCALE, BLOCK_V)
    else:
        score, token = argmax_tokens(row_ptr, begin, end, BLOCK_V)
    return score, tl.where(token >= 0, token, vocab_size)


@triton.jit
def _gumbel_argmax_kernel(logits_ptr, logits_stride, ws_ptr, idx_mapping_ptr, temperature_ptr, min_p_ptr, top_k_ptr,
                          top_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, part_score_ptr, part_token_ptr, num_slots,
                          vocab_size, tol, SEGMENT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_V: tl.constexpr):
    """out[t] = argmax_j of x[t, j] + gumbel(seed, position, j) over the tokens above -inf, with x the
    filtered workspace row or, for a row without filters, logits / temperature; the plain argmax of
    the logits for greedy rows (the filters always keep it); -1 without such a token or slot. With
    SPLIT, program (t, s) takes segment s and stores its (score, token) pair for _reduce_segments_kernel."""
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        if not SPLIT:
            tl.store(out_ptr + t, -1)
        return
    if SPLIT:
        begin = tl.program_id(1) * SEGMENT
        end = tl.minimum(begin + SEGMENT, vocab_size)
    else:
        begin = 0
        end = vocab_size
    temp = tl.load(temperature_ptr + slot)
    key = stream_key(tl.load(seeds_ptr + slot).to(tl.int64), tl.load(output_lens_ptr + t).to(tl.int64))
    logits_row = logits_ptr + t.to(tl.int64) * logits_stride
    if temp == 0.0:
        score, token = _gumbel_argmax_row(logits_row, begin, end, vocab_size, key, temp, tol, SAMPLED=False, SCALE=False,
                                          BLOCK_V=BLOCK_V)
    elif _row_is_filtered(slot, min_p_ptr, top_k_ptr, top_p_ptr, vocab_size):
        score, token = _gumbel_argmax_row(ws_ptr + t.to(tl.int64) * vocab_size, begin, end, vocab_size, key, temp, tol,
                                          SAMPLED=True, SCALE=False, BLOCK_V=BLOCK_V)
    else:
        score, token = _gumbel_argmax_row(logits_row, begin, end, vocab_size, key, temp, tol, SAMPLED=True, SCALE=True,
                                          BLOCK_V=BLOCK_V)
    if SPLIT:
        part = t.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(part_score_ptr + part, score)
        tl.store(part_token_ptr + part, token)
    else:
        tl.store(out_ptr + t, tl.where(token < vocab_size, token, -1).to(tl.int64))


@triton.jit
def _reduce_segments_kernel(idx_mapping_ptr, part_score_ptr, part_token_ptr, out_ptr, num_slots, vocab_size,
                            num_segments, SEGMENTS_P2: tl.constexpr):
    """out[t] = the token of the best segment pair of row t (ties: the lower token), -1 if none."""
    t = tl.program_id(0)
    if load_slot(idx_mapping_ptr, t, num_slots) < 0:
        tl.store(out_ptr + t, -1)
        return
    s = tl.arange(0, SEGMENTS_P2)
    part = t.to(tl.int64) * num_segments + s
    score = tl.load(part_score_ptr + part, mask=s < num_segments, other=float("-inf"))
    token = tl.load(part_token_ptr + part, mask=s < num_segments, other=vocab_size)
    live = token < vocab_size
    top = tl.max(tl.where(live, score, float("-inf")), axis=0)
    best = tl.min(tl.where(live & (score == top), token, vocab_size), axis=0)
    tl.store(out_ptr + t, tl.where(best < vocab_size, best, -1).to(tl.int64))


def _check_sample(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens) -> None:
    op = "sample"
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    R = _checks.check_slot_vector(op, "temperature", temperature, (torch.float32,), dev)
    for name, value, dtypes in [("top_k", top_k, (torch.int32,)), ("top_p", top_p, (torch.float32,)),
                                ("min_p", min_p, (torch.float32,)), ("seeds", seeds, (torch.int64,))]:
        _checks.check_tensor(op, name, value, dtypes, ndim=1, device=dev, shape=(R,), like="logits")
    _checks.check_tensor(op, "output_lens", output_lens, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))


def _check_sample_values(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens) -> None:
    op = "sample"
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_values(op, "temperature", torch.isfinite(temperature) & (temperature >= 0), "finite values >= 0")
    _checks.check_values(op, "min_p", (min_p >= 0) & (min_p <= 1), "values in [0, 1]")
    _checks.check_values(op, "top_p", (top_p > 0) & (top_p <= 1), "values in (0, 1]")


def _sample_fake(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def _sample_triton(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens):
    T, V = logits.shape
    out = logits.new_empty((T,), dtype=torch.int64)
    if T == 0:
        return out
    R = temperature.shape[0]
    ws = logits.new_empty((T, V), dtype=torch.float32)
    params = (idx_mapping, temperature, min_p, top_k, top_p)
    group = blocks_per_program(T)
    launch(_scale_rows_kernel, (T, cdiv(V, _BLOCK_V * group)), logits, logits.stride()[0], ws, *params, R, V,
           BLOCK_V=_BLOCK_V, GROUP=group, num_warps=8)
    # The filters read only the rows whose parameters turn them on: exactly the rows written above
    # (greedy ones included, filtered for nothing: the draw takes their argmax from the logits).
    _min_p_triton(ws, idx_mapping, min_p)
    _top_k_top_p_triton(ws, idx_mapping, top_k, top_p, group_scan=True)  # most rows usually have the filters off
    segments = cdiv(V, _SEGMENT) if T < _SPLIT_MAX_T else 1
    if segments == 1:
        launch(_gumbel_argmax_kernel, (T, 1), logits, logits.stride()[0], ws, *params, seeds, output_lens, out,
               out, out, R, V, GUMBEL_APPROX_TOL, SEGMENT=_SEGMENT, SPLIT=False, BLOCK_V=_DRAW_BLOCK_V,
               num_warps=_DRAW_WARPS)
        return out
    part_score = logits.new_empty((T, segments), dtype=torch.float32)
    part_token = logits.new_empty((T, segments), dtype=torch.int32)
    launch(_gumbel_argmax_kernel, (T, segments), logits, logits.stride()[0], ws, *params, seeds, output_lens, out,
           part_score, part_token, R, V, GUMBEL_APPROX_TOL, SEGMENT=_SEGMENT, SPLIT=True,
           BLOCK_V=min(_DRAW_BLOCK_V, _SEGMENT), num_warps=_DRAW_WARPS)
    launch(_reduce_segments_kernel, (T,), idx_mapping, part_score, part_token, out, R, V, segments,
           SEGMENTS_P2=next_power_of_2(segments), num_warps=1)
    return out


@define_op(mutates_args=(), check=_check_sample, check_values=_check_sample_values, triton=_sample_triton,
           fake=_sample_fake)
def sample(logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, min_p: torch.Tensor, seeds: torch.Tensor, output_lens: torch.Tensor) -> torch.Tensor:
    """Draws one token a row; returns int64 ``[T]``. ``logits`` is not modified.

    Row ``t`` with slot ``r = idx_mapping[t]`` draws from ``softmax(logits[t] / temperature[r])``
    restricted by ``min_p[r]``, then ``top_k[r]``, then ``top_p[r]``, with the semantics of the ops of
    those names: the token ``argmax_j (logits[t, j] / temperature[r] + g_j)`` over the kept tokens,
    with ``g_j`` the Gumbel noise of the random stream keyed by ``(seeds[r], output_lens[t], j)``.
    A greedy row (``temperature[r] == 0``) returns its argmax, the lowest index among ties.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; read only.
        idx_mapping: ``[T]`` int32/int64, the slot of each row.
        temperature, top_p, min_p: ``[R]`` float32; top_k: ``[R]`` int32; seeds: ``[R]`` int64.
        output_lens: ``[T]`` int32/int64, the position that keys the row's stream.

    Returns ``-1`` for a row whose slot is outside ``[0, R)`` or that has no logit above ``-inf``
    (NaN logits are never drawn). Same inputs, same tokens; advance ``output_lens`` or the seed on the
    device for fresh draws (under CUDA graphs too).
    """
