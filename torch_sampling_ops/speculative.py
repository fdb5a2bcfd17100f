"""Speculative decoding's verification step: `rejection_sample`.

Each request proposed `n_i` draft tokens; the target model scored its `n_i` draft positions and one
bonus position. The op walks each request's positions in order and stops at the first rejection,
so it reads a target row only once the request reaches it, and a draft-probability row in full only
at the rejected position (elsewhere the one probability `q(x)` of the draft token).

Random numbers come from the stream of `sample` (gumbel.py), keyed by the request's seed and the
position `output_lens[i] + j`: the acceptance uniform of position j uses the reserved token index
`ACCEPT_TOKEN = 2**31 - 1` (outside every vocabulary), the residual and bonus draws use the Gumbel
noise of the token indices, as `sample` does, and like its draw (gumbel_argmax) bound each block of
4 tokens by its noise bound and score exactly only the blocks that reach a realised score (else an
exact pass): the exact scores' argmax.
So a request's tokens depend only on its own rows, seed and position, never on the batch.

CUDA, in levels: each target row is cut into chunks of `_CHUNK` tokens (a constant), and each
position j = 0 .. max_spec_len has one launch over a (B, chunks) grid; a last launch over (B,)
finalizes. A level-j program first combines, in chunk order, the partials its request left at level
j - 1, and so decides position j - 1 (accept or not; for greedy requests the row's argmax): every
program of the request takes the same decision, and chunk 0 stores the request's status (alive,
drawing the residual of the position just rejected, or done with its token). Then it writes its
chunk's partial of the level's pass: at a draft position reached, the (max, sum of exp(x - max)) of
the softmax (random requests) or the (max, lowest index) argmax (greedy); at the bonus position the
Gumbel argmax (the argmax when greedy); right after a rejection, the two argmax pairs of the
residual draw (over r > 0, and the draw from p that stands in when r has no positive entry) over the
rejected target row and its draft-probability row. A request that is done exits at once. The
finalize decides the last position and writes the accepted drafts, the final token, the padding and
num_emitted. The partials live in a workspace of the call sized by the shapes alone. Cross-chunk
reductions run in chunk order, ties to the lower index, the sums rescaled as sum_s sum_s *
exp(max_s - max); so a request's tokens depend on its rows, seed and position (and `_CHUNK`,
through the float32 sum order), never on the batch. Each program walks its chunk in tiles of
`_BLOCK_V` tokens over `_NUM_WARPS` warps.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import _checks, gumbel
from ._launch import cdiv, next_power_of_2
from ._registry import define_op, launch
from ._triton_helpers import exp_flush_tiny, fast_log2
from .gumbel import (
    FULL_TILES,
    _block_candidates_update,
    argmax_finish,
    argmax_init,
    argmax_tokens,
    argmax_update,
    block_bits,
    block_noise_approx,
    block_reach_lanes,
    first_arrival_value,
    full_lane_tokens,
    gumbel_argmax,
    next_full_lane,
    reach_round_tokens,
    reaches_floor,
    round_best,
    round_best_empty,
    round_winner,
    slot_pick,
    stream_bits,
    stream_key,
    stream_noise,
)
from .truncation import plan as truncation_plan

ACCEPT_TOKEN = 2**31 - 1  # the token index of the acceptance uniform in a position's stream
# Each target row is cut into chunks of _CHUNK tokens, one program a chunk; a program walks its
# chunk in tiles of _BLOCK_V tokens over _NUM_WARPS warps (8 values a thread). _CHUNK is a constant
# (smaller under the interpreter, so that the tests' vocabularies span several chunks): a request's
# tokens never depend on the batch or the launch grid.
_CHUNK = 16384 if os.environ.get("TRITON_INTERPRET") != "1" else 1024
_BLOCK_V = 1024 if os.environ.get("TRITON_INTERPRET") != "1" else 256
_NUM_WARPS = 4
# Tiles a chunk program keeps in flight (Triton's software pipelining of the tile loops: the next
# tiles' loads are issued before the current one is reduced). It changes no sum order.
_STAGES = 3
_ARGMAX_STAGES = 4  # a greedy row's argmax, whose loop holds fewer registers a tile
# Reaching blocks a round of the residual draw and of the bonus rows' draw scores exactly
# (gumbel.gumbel_argmax's REACH_SLOTS).
_REACH_SLOTS = 16
# Full lanes (a lane whose third block reaches a floor) a chunk of the residual or bonus draw scores
# block by block (16 blocks a lane at _CHUNK / _BLOCK_V tiles); with more, the exact pass.
_FULL_LANES = 2
# The residual's exact pass (taken where a bound is infinite or more lanes are full: rarely, by one
# program while its level waits): its tiles, and with _EXACT_SKIP only the tiles holding a
# block that reaches a floor are scored. The pass's tiles set the one compiled kernel's registers,
# so every level's occupancy (offline sm_90, Triton 3.6, with the full lanes' gathers: 96 at 512
# or 256 with the skip, 127 at 512 without it). The same tokens whatever the values
# (docs/notes/sampling-tuning.md has the forms timed).
_EXACT_BLOCK_V = _BLOCK_V // 2
_EXACT_SKIP = True
# A request's status after a level (status[i, level, :]): the state, the drafts accepted, the token.
_ALIVE = tl.constexpr(0)  # the level scores position `level` (a draft's or the bonus row)
_RESIDUAL = tl.constexpr(1)  # position level - 1 was rejected: the level draws its residual
_DONE = tl.constexpr(2)  # the final token is known


@triton.jit
def _load_row(row_ptr, offs, limit):
    x = tl.load(row_ptr + offs, mask=offs < limit, other=float("-inf")).to(tl.float32)
    return tl.where(x == x, x, float("-inf"))  # NaN is read as -inf


@triton.jit
def _max_sum_lanes(x, lane_max, lane_sum):
    """_max_sum_chunk's update of each lane's running (max, sum of exp(x - max)) with its block of 4
    logits x [lanes, 4] (NaN read as -inf): one rescaling a block, no exchange between lanes."""
    x = tl.maximum(x, float("-inf"))  # NaN -> -inf (max ignores NaN)
    new_max = tl.maximum(lane_max, tl.max(x, axis=1))
    terms = tl.sum(exp_flush_tiny(x - new_max[:, None]), axis=1)
    lane_sum = tl.where(new_max > float("-inf"), lane_sum * exp_flush_tiny(lane_max - new_max) + terms, 0.0)
    return new_max, lane_sum


@triton.jit
def _max_sum_chunk(row_ptr, start, limit, BLOCK_V: tl.constexpr, STAGES: tl.constexpr):
    """(max, sum of exp(x - max)) of row tokens [start, limit); (-inf, 0) without a logit above -inf.
    Each lane keeps the max and sum of its own blocks of 4 tokens, combined at the end as sum_l
    sum_l * exp(max_l - max). A lane's sum holds a term exp(0) = 1, so the terms and rescalings below
    2**-126 that `exp_flush_tiny` drops lie below its float32 resolution. `start` is a multiple of 4."""
    NUM_LANES: tl.constexpr = BLOCK_V // 4
    offs = tl.arange(0, NUM_LANES)[:, None] * 4 + tl.arange(0, 4)[None, :]
    lane_max = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros((NUM_LANES,), dtype=tl.float32)
    # Whole tiles unmasked, then the partial tile at the end masked.
    full_end = start + (limit - start) // BLOCK_V * BLOCK_V
    for tile in tl.range(start, full_end, BLOCK_V, num_stages=STAGES):
        lane_max, lane_sum = _max_sum_lanes(tl.load(row_ptr + tile + offs).to(tl.float32), lane_max, lane_sum)
    if full_end < limit:
        x = tl.load(row_ptr + full_end + offs, mask=full_end + offs < limit, other=float("-inf")).to(tl.float32)
        lane_max, lane_sum = _max_sum_lanes(x, lane_max, lane_sum)
    row_max = tl.max(lane_max, axis=0)
    scaled = tl.where(lane_max > float("-inf"), lane_sum * exp_flush_tiny(lane_max - row_max), 0.0)
    return row_max, tl.sum(scaled, axis=0)


@triton.jit
def _residual_terms(row_ptr, probs_row_ptr, draft, row_max, row_sum, offs, limit, HAS_PROBS: tl.constexpr):
    """(x, r = p - q, r > 0 inside the row) at tokens `offs` of a rejected position's target row
    (softmax max and sum given) and its draft row (the one-hot of `draft` without draft probs)."""
    in_row = offs < limit
    x = _load_row(row_ptr, offs, limit)
    # The IEEE division rounds p on its own: a product by 1 / sum could fuse with the subtraction below
    # at one site and not another, and r = p - q cancels where q is near p. NaN for every token of a
    # row with max -inf: never taken.
    p = tl.math.div_rn(tl.exp(x - row_max), row_sum)
    if HAS_PROBS:
        q = tl.load(probs_row_ptr + offs, mask=in_row, other=0.0)
    else:
        q = tl.where(offs == draft, 1.0, 0.0)
    r = p - q
    return x, r, in_row & (r > 0.0)  # false for NaN


@triton.jit
def _exact_residual_scores(row_ptr, probs_row_ptr, draft, row_max, row_sum, key, tokens, live, limit,
                           HAS_PROBS: tl.constexpr):
    """The exact scores at `tokens` (a scalar or a vector; -inf where not `live`) of the residual
    draw, log(r) + g over r > 0, and of the draw from p, x + g over x above -inf. The exact pass and
    the rescoring of its winners both take them from here: the same bits at every site."""
    safe = tl.where(live, tokens, 0)
    x, r, has = _residual_terms(row_ptr, probs_row_ptr, draft, row_max, row_sum, safe, limit, HAS_PROBS)
    g = stream_noise(key, safe)
    score_r = tl.where(live & has, tl.log(tl.where(has, r, 1.0)) + g, float("-inf"))
    return score_r, tl.where(live & (x > float("-inf")), x + g, float("-inf"))


@triton.jit
def _exact_residual_chunk(row_ptr, probs_row_ptr, draft, row_max, row_sum, log_sum, key, start, limit, vocab_size,
                          floor_r, floor_p, tol, HAS_PROBS: tl.constexpr, BLOCK_V: tl.constexpr, SKIP: tl.constexpr):
    """Over row tokens [start, limit): the (score, token) argmax of log(r_k) + g_k over r = p - q > 0
    and the (score, token) argmax of x_k + g_k over the tokens above -inf (the draw from p that
    stands in when r has no positive entry in the whole row). With SKIP, a tile of BLOCK_V tokens
    none of whose blocks reaches floor_r or floor_p (`_residual_bound`, gumbel.reaches_floor) is
    not scored: its exact scores lie below both floors, which both winners reach, so the result is
    the same. `start` is a multiple of 4."""
    best_r, best_rj = argmax_init(BLOCK_V)
    best_p, best_pj = argmax_init(BLOCK_V)
    for tile in range(start, limit, BLOCK_V):
        offs = tile + tl.arange(0, BLOCK_V)
        scored = True
        if SKIP:  # the tile's bounds, as the pass computed them
            blocks = tile // 4 + tl.arange(0, BLOCK_V // 4)
            block_offs = blocks[:, None] * 4 + tl.arange(0, 4)[None, :]
            x = tl.load(row_ptr + block_offs, mask=block_offs < limit, other=float("-inf")).to(tl.float32)
            if HAS_PROBS:
                q = tl.load(probs_row_ptr + block_offs, mask=block_offs < limit, other=0.0)
            else:
                q = x  # not read
            noise_max = block_noise_approx(block_bits(key, blocks))
            x_max = tl.max(x, axis=1)
            reach = reaches_floor(_residual_bound(x_max, q, noise_max, row_max, log_sum, HAS_PROBS), floor_r, tol) \
                | reaches_floor(x_max + noise_max, floor_p, tol)
            scored = tl.max(reach.to(tl.int32), axis=0) > 0
        if scored:
            score_r, score_p = _exact_residual_scores(row_ptr, probs_row_ptr, draft, row_max, row_sum, key, offs,
                                                      offs < limit, limit, HAS_PROBS)
            best_r, best_rj = argmax_update(best_r, best_rj, score_r, offs)
            best_p, best_pj = argmax_update(best_p, best_pj, score_p, offs)
    score_r, token_r = argmax_finish(best_r, best_rj, vocab_size)
    score_p, token_p = argmax_finish(best_p, best_pj, vocab_size)
    return score_r, token_r, score_p, token_p


# A block whose largest fl(x - m) lies below _LOG_P_ZERO has p = 0 at every token (the approximate
# exp of a number below -120 * log2(e) is 0, and sum >= 1): it holds no residual. Below
# _LOG_P_CLAMP a p may be subnormal (less accurate): a block's bound takes log p at least -87 there.
_LOG_P_ZERO = tl.constexpr(-120.0)
_LOG_P_CLAMP = tl.constexpr(-87.0)


@triton.jit
def _residual_blocks(x, q, blocks, draft, row_max, row_sum, log_sum, key, realised_r, r1, r1_block, r2, r2_block, r3,
                     realised_p, p1, p1_block, p2, p2_block, p3, HAS_PROBS: tl.constexpr):
    """_residual_chunk's pass over a [lanes, 4] tile of `blocks`: logits x (-inf past the row) and
    draft probabilities q (0 past the row; not read without HAS_PROBS). Each block's bounds and first
    arrival's scores of both lists go into the lanes' state (gumbel._block_candidates_update).

    The residual's bound needs no r: with q >= 0, r = p - q <= p, and p = exp(fl(x - m)) / sum
    (an ex2.approx and a division) lies within a relative 2**-16.9 of its exact value where p >=
    e**-87 is normal, below e**-87 * (1 + 2**-16.9) elsewhere; so log r <= max(fl(x_max - m) - log
    sum, -87) + 2**-16.9 for every token of the block, and the bound stays within 2**-17 * 22 +
    2**-22 * |U| of the block's largest exact score, inside err(U) = 2**-16 * (35 + |U|). A block
    with a negative q bounds at +inf (the exact pass). r_pos is computed as the exact scores compute
    r (its log from one hardware log2: non-ftz, r may be subnormal), so its L stays within err(L)."""
    hb = block_bits(key, blocks)
    noise_max = block_noise_approx(hb)
    x_max = tl.max(x, axis=1)  # max ignores NaN (a NaN logit scores -inf in both lists)
    x_pos = first_arrival_value(x, hb)
    # the draw from p
    realised_p = tl.maximum(realised_p, x_pos + noise_max)
    p1, p1_block, p2, p2_block, p3 = _block_candidates_update(p1, p1_block, p2, p2_block, p3, x_max + noise_max,
                                                              blocks)
    # the residual draw, over r > 0
    bound_r = _residual_bound(x_max, q, noise_max, row_max, log_sum, HAS_PROBS)
    if HAS_PROBS:
        q_pos = first_arrival_value(q, hb)
    else:
        q_pos = tl.where(blocks * 4 + (hb & 3).to(tl.int32) == draft, 1.0, 0.0)
    r_pos = tl.math.div_rn(tl.exp(x_pos - row_max), row_sum) - q_pos  # as _residual_terms; NaN for a NaN x_pos
    realised_r = tl.maximum(realised_r, tl.where(
        r_pos > 0.0, 0.6931471805599453 * fast_log2(tl.where(r_pos > 0.0, r_pos, 1.0)) + noise_max, float("-inf")))
    r1, r1_block, r2, r2_block, r3 = _block_candidates_update(r1, r1_block, r2, r2_block, r3, bound_r, blocks)
    return realised_r, r1, r1_block, r2, r2_block, r3, realised_p, p1, p1_block, p2, p2_block, p3


@triton.jit
def _residual_bound(x_max, q, noise_max, row_max, log_sum, HAS_PROBS: tl.constexpr):
    """U of the residual draw [lanes] of a [lanes, 4] tile's blocks, from their largest logit and
    noise and their draft probabilities q (_residual_blocks explains it): log p_max + M_b, +inf where
    a draft probability is negative or NaN, -inf where p is 0. (U of the draw from p: x_max + M_b.)"""
    log_p = x_max - row_max
    bound = tl.where(log_p >= _LOG_P_ZERO, tl.maximum(log_p - log_sum, _LOG_P_CLAMP), float("-inf")) + noise_max
    if HAS_PROBS:
        bound = tl.where(tl.min(q, axis=1) >= 0.0, bound, float("inf"))
    return bound


@triton.jit
def _residual_chunk(row_ptr, probs_row_ptr, draft, row_max, row_sum, key, start, limit, vocab_size, tol,
                    HAS_PROBS: tl.constexpr, BLOCK_V: tl.constexpr, REACH_SLOTS: tl.constexpr, STAGES: tl.constexpr,
                    FULL_LANES: tl.constexpr, EXACT_BLOCK_V: tl.constexpr, EXACT_SKIP: tl.constexpr):
    """_exact_residual_chunk's result, bit for bit, on block bounds as gumbel.gumbel_argmax draws, for
    both lists at once (`_residual_blocks`): per block of 4 tokens one hash and M_b
    (block_noise_approx) bound the block's exact scores by U = log p_max + M_b (r <= p) and U = max x
    + M_b, and its first arrival realises L = log(r_pos) + M_b (r_pos > 0) and L = x_pos + M_b. Per
    lane and list: the two blocks of largest U, the largest other U, the largest L
    (gumbel.block_reach_lanes). The blocks that reach either list's floor are scored exactly for both
    lists (a block outside a list's reach scores below its winner), and every block of a lane whose
    third block reaches a floor (a full lane: gumbel.FULL_TILES blocks a gather). The exact pass
    (EXACT_BLOCK_V-token tiles, with EXACT_SKIP only those holding a block that reaches a floor)
    scores the chunk instead where a bound or realised score is infinite, or more than FULL_LANES
    lanes are full. `start` is a multiple of 4 (no block straddles it)."""
    NUM_LANES: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, NUM_LANES)
    column = tl.arange(0, 4)
    log_sum = tl.log(row_sum)
    neg = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    none = tl.full((NUM_LANES,), -1, dtype=tl.int32)
    realised_r, r1, r2, r3, r1_block, r2_block = neg, neg, neg, neg, none, none
    realised_p, p1, p2, p3, p1_block, p2_block = neg, neg, neg, neg, none, none
    # Whole tiles unmasked, then the partial tile at the end masked.
    full_end = start + (limit - start) // BLOCK_V * BLOCK_V
    for tile in tl.range(start, full_end, BLOCK_V, num_stages=STAGES):
        blocks = tile // 4 + lanes
        offs = blocks[:, None] * 4 + column[None, :]
        x = tl.load(row_ptr + offs).to(tl.float32)
        if HAS_PROBS:
            q = tl.load(probs_row_ptr + offs)
        else:
            q = x  # not read
        realised_r, r1, r1_block, r2, r2_block, r3, realised_p, p1, p1_block, p2, p2_block, p3 = _residual_blocks(
            x, q, blocks, draft, row_max, row_sum, log_sum, key, realised_r, r1, r1_block, r2, r2_block, r3,
            realised_p, p1, p1_block, p2, p2_block, p3, HAS_PROBS)
    if full_end < limit:
        blocks = full_end // 4 + lanes
        offs = blocks[:, None] * 4 + column[None, :]
        x = tl.load(row_ptr + offs, mask=offs < limit, other=float("-inf")).to(tl.float32)
        if HAS_PROBS:
            q = tl.load(probs_row_ptr + offs, mask=offs < limit, other=0.0)
        else:
            q = x  # not read
        realised_r, r1, r1_block, r2, r2_block, r3, realised_p, p1, p1_block, p2, p2_block, p3 = _residual_blocks(
            x, q, blocks, draft, row_max, row_sum, log_sum, key, realised_r, r1, r1_block, r2, r2_block, r3,
            realised_p, p1, p1_block, p2, p2_block, p3, HAS_PROBS)
    infinite_r, full_r, reach_r1, reach_r2, floor_r = block_reach_lanes(r1, r2, r3, realised_r, tol)
    infinite_p, full_p, reach_p1, reach_p2, floor_p = block_reach_lanes(p1, p2, p3, realised_p, tol)
    # A lane full in either list has every block it saw scored for both, after the rounds; elsewhere
    # a block in both lists is scored once.
    full = full_r | full_p
    reach_r1 = reach_r1 & ~full
    reach_r2 = reach_r2 & ~full
    reach_p1 = reach_p1 & ~full & ~((reach_r1 & (p1_block == r1_block)) | (reach_r2 & (p1_block == r2_block)))
    reach_p2 = reach_p2 & ~full & ~((reach_r1 & (p2_block == r1_block)) | (reach_r2 & (p2_block == r2_block)))
    # The reaching blocks of a lane take consecutive slots (r1, r2, p1, p2), the lanes in order; a
    # [lanes, slots] selection gathers a round's blocks (-1 where a block does not reach).
    f_r1 = reach_r1.to(tl.int32)
    f_r2 = reach_r2.to(tl.int32)
    f_p1 = reach_p1.to(tl.int32)
    count = f_r1 + f_r2 + f_p1 + reach_p2.to(tl.int32)
    reaching = tl.sum(count, axis=0)
    base = tl.cumsum(count, axis=0) - count
    slot_r1 = tl.where(reach_r1, base, -1)
    slot_r2 = tl.where(reach_r2, base + f_r1, -1)
    slot_p1 = tl.where(reach_p1, base + f_r1 + f_r2, -1)
    slot_p2 = tl.where(reach_p2, base + f_r1 + f_r2 + f_p1, -1)
    if infinite_r | infinite_p | (tl.sum(full.to(tl.int32), axis=0) > FULL_LANES):
        score_r, token_r, score_p, token_p = _exact_residual_chunk(
            row_ptr, probs_row_ptr, draft, row_max, row_sum, log_sum, key, start, limit, vocab_size, floor_r, floor_p,
            tol, HAS_PROBS, EXACT_BLOCK_V, EXACT_SKIP)
    else:
        best_r = round_best_empty()
        best_p = best_r
        first_slot = 0
        while first_slot < reaching:
            slots = first_slot + tl.arange(0, REACH_SLOTS)
            picked = slot_pick(slot_r1, r1_block, slots, slot_pick(slot_r2, r2_block, slots, slot_pick(
                slot_p1, p1_block, slots, slot_pick(slot_p2, p2_block, slots, -1))))
            tokens, live = reach_round_tokens(picked, start, limit)
            exact_r, exact_p = _exact_residual_scores(row_ptr, probs_row_ptr, draft, row_max, row_sum, key, tokens,
                                                      live, limit, HAS_PROBS)
            best_r = round_best(best_r, exact_r, tokens)
            best_p = round_best(best_p, exact_p, tokens)
            first_slot += REACH_SLOTS
        num_tiles = (limit - start + BLOCK_V - 1) // BLOCK_V
        lane = next_full_lane(full, -1)
        while lane < NUM_LANES:
            for first_tile in range(0, num_tiles, FULL_TILES):
                tokens, live = full_lane_tokens(lane, first_tile, start, limit, NUM_LANES, FULL_TILES)
                exact_r, exact_p = _exact_residual_scores(row_ptr, probs_row_ptr, draft, row_max, row_sum, key,
                                                          tokens, live, limit, HAS_PROBS)
                best_r = round_best(best_r, exact_r, tokens)
                best_p = round_best(best_p, exact_p, tokens)
            lane = next_full_lane(full, lane)
        score_r, token_r = round_winner(best_r)
        score_p, token_p = round_winner(best_p)
    return score_r, token_r, score_p, token_p


@triton.jit
def _combine_argmax(score_ptr, token_ptr, num_chunks, CHUNKS_P2: tl.constexpr):
    """The token of the chunks' (score, token) partials with the largest score, the lowest token among
    equal scores (chunks hold increasing token ranges), as int32; -1 if no chunk has a token."""
    s = tl.arange(0, CHUNKS_P2)
    score = tl.load(score_ptr + s, mask=s < num_chunks, other=float("-inf"))
    token = tl.load(token_ptr + s, mask=s < num_chunks, other=-1)
    live = token >= 0
    top = tl.max(tl.where(live, score, float("-inf")), axis=0)
    best = tl.min(tl.where(live & (score == top), token, 2147483647), axis=0)
    return tl.where(best < 2147483647, best, -1)


@triton.jit
def _combine_max_sum(max_ptr, sum_ptr, num_chunks, CHUNKS_P2: tl.constexpr):
    """(max, sum of exp(x - max)) of a row from its chunks' partials: sum_s sum_s * exp(max_s - max)."""
    s = tl.arange(0, CHUNKS_P2)
    part_max = tl.load(max_ptr + s, mask=s < num_chunks, other=float("-inf"))
    part_sum = tl.load(sum_ptr + s, mask=s < num_chunks, other=0.0)
    row_max = tl.max(part_max, axis=0)
    scaled = tl.where(part_max > float("-inf"), part_sum * tl.exp(part_max - row_max), 0.0)
    return row_max, tl.sum(scaled, axis=0)


# The draft count and the level are not specialised (== 1, divisible by 16): one compiled variant
# serves every batch and level, so `warmup` of one request covers them.
@triton.jit(do_not_specialize=["num_drafts", "level"])
def _rejection_level_kernel(logits_ptr, logits_stride, draft_ids_ptr, probs_ptr, probs_stride, cu_ptr,
                            temperature_ptr, seeds_ptr, output_lens_ptr, part_f_ptr, part_i_ptr, status_ptr,
                            out_ptr, num_ptr, num_drafts, max_spec_len, vocab_size, num_chunks, tol,
                            level, HAS_PROBS: tl.constexpr, FINAL: tl.constexpr, CHUNK: tl.constexpr,
                            BLOCK_V: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK_OUT: tl.constexpr,
                            STAGES: tl.constexpr, ARGMAX_STAGES: tl.constexpr, REACH_SLOTS: tl.constexpr,
                            FULL_LANES: tl.constexpr, EXACT_BLOCK_V: tl.constexpr, EXACT_SKIP: tl.constexpr,
                            PDL: tl.constexpr):
    """Level `level` of request program_id(0), chunk program_id(1): decides position level - 1 from
    the partials level - 1 left (the same in every chunk program), then writes this chunk's partial
    of the level's pass. FINAL (grid (B, 1), level = max_spec_len + 1): decides the last position and
    writes the request's outputs.

    Workspace: part_f float32 / part_i int32 [B, levels, 2, num_chunks] (two partials a chunk: (max,
    sum), (score, token) or the residual's two (score, token) pairs), status int32 [B, levels, 3],
    levels = max_spec_len + 1. (The batch size is no argument: Triton would specialise B == 1.)

    PDL: every launch is a programmatic dependent one. A program reads the op's inputs (which no
    launch of the op writes; level 0 first waits for the launches before the op), then waits for the
    previous level before it reads the workspace, so a level's end implies the end of every launch
    before it. The next level may be placed once every program has called `gdc_launch_dependents`:
    a greedy request's programs call it at their start, the others at their end (placed beside a
    level's softmax and residual passes, the next level's programs slowed some batch sizes: see
    docs/notes/sampling-tuning.md)."""
    i = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)
    level64 = i * 0 + level
    levels = max_spec_len + 1
    if PDL:
        if level == 0:
            gdc_wait()  # for the launches before the op, which may have written its inputs
    # Clamped layout: draft rows [lo, lo + n) within [0, N), target rows lo + i + j <= N + i < N + B.
    lo = tl.minimum(tl.maximum(tl.load(cu_ptr + i).to(tl.int64), 0), num_drafts)
    hi = tl.minimum(tl.maximum(tl.load(cu_ptr + i + 1).to(tl.int64), 0), num_drafts)
    n = tl.minimum(tl.maximum(hi - lo, 0), max_spec_len)
    greedy = tl.load(temperature_ptr + i) == 0.0
    if PDL:
        if greedy:
            gdc_launch_dependents()
    seed = tl.load(seeds_ptr + i).to(tl.int64)
    position = tl.load(output_lens_ptr + i).to(tl.int64)
    # Position level - 1: its draft (-1 at the bonus row) and its draft row of probabilities.
    prev = lo * 0 + level - 1
    prev_draft = tl.load(draft_ids_ptr + lo + prev, mask=(prev >= 0) & (prev < n), other=-1).to(tl.int64)
    prev_draft_ok = (prev_draft >= 0) & (prev_draft < vocab_size)
    prev_key = stream_key(seed, position + prev)
    prev_probs_ptr = probs_ptr + (lo + prev) * probs_stride
    if PDL:
        gdc_wait()

    # (a) The decision of position level - 1.
    state = tl.full([], _ALIVE, tl.int32)
    accepted = prev.to(tl.int32) + 1
    token = tl.full([], -1, tl.int32)
    row_max = tl.full([], float("-inf"), tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    if prev >= 0:
        status = status_ptr + (i * levels + prev) * 3
        state = tl.load(status)
        accepted = tl.load(status + 1)
        token = tl.load(status + 2)
        part = (i * levels + prev) * 2 * num_chunks
        if state == _ALIVE:
            if greedy | (prev >= n):  # the argmax, or at the bonus row the Gumbel argmax
                token = _combine_argmax(part_f_ptr + part, part_i_ptr + part, num_chunks, CHUNKS_P2)
                if prev_draft_ok & (prev_draft == token):
                    accepted = prev.to(tl.int32) + 1
                else:
                    state = tl.full([], _DONE, tl.int32)
                    accepted = prev.to(tl.int32)
            else:
                row_max, row_sum = _combine_max_sum(part_f_ptr + part, part_f_ptr + part + num_chunks, num_chunks,
                                                    CHUNKS_P2)
                row_ptr = logits_ptr + (lo + i + prev) * logits_stride
                x_d = tl.load(row_ptr + tl.where(prev_draft_ok, prev_draft, 0)).to(tl.float32)
                p_d = tl.where((row_max > float("-inf")) & (x_d == x_d), tl.exp(x_d - row_max) / row_sum, 0.0)
                if HAS_PROBS:
                    q_d = tl.load(prev_probs_ptr + tl.where(prev_draft_ok, prev_draft, 0))
                else:
                    q_d = 1.0
                u = ((stream_bits(prev_key, tl.full([], 2147483647, tl.int32)) >> 9).to(tl.float32) + 0.5) \
                    * 1.1920928955078125e-07
                if prev_draft_ok & (u * q_d < p_d):
                    accepted = prev.to(tl.int32) + 1
                else:
                    accepted = prev.to(tl.int32)
                    # A row without a logit above -inf draws -1 from its residual: no pass needed.
                    if row_max > float("-inf"):
                        state = tl.full([], _RESIDUAL, tl.int32)
                    else:
                        state = tl.full([], _DONE, tl.int32)
                        token = tl.full([], -1, tl.int32)
        elif state == _RESIDUAL:
            token_r = _combine_argmax(part_f_ptr + part, part_i_ptr + part, num_chunks, CHUNKS_P2)
            token_p = _combine_argmax(part_f_ptr + part + num_chunks, part_i_ptr + part + num_chunks, num_chunks,
                                      CHUNKS_P2)
            token = tl.where(token_r >= 0, token_r, token_p)
            state = tl.full([], _DONE, tl.int32)

    if FINAL:
        # `accepted` places hold accepted drafts, the next one the final token; the rest are padding.
        # Each place is written once.
        out_row = out_ptr + i * (max_spec_len + 1)
        k = tl.arange(0, BLOCK_OUT)
        drafts = tl.load(draft_ids_ptr + lo + k, mask=k < accepted, other=-1).to(tl.int64)
        value = tl.where(k < accepted, drafts, tl.where(k == accepted, token.to(tl.int64), -1))
        tl.store(out_row + k, value, mask=k <= max_spec_len)
        tl.store(num_ptr + i, accepted + (token >= 0).to(tl.int32))
    else:
        if s == 0:
            status = status_ptr + (i * levels + level64) * 3
            tl.store(status, state)
            tl.store(status + 1, accepted)
            tl.store(status + 2, token)
        # (b) This chunk's partial of the level's pass.
        start = tl.program_id(1) * CHUNK  # int32 token indices, as the passes compare them with int32 ids
        limit = tl.minimum(start + CHUNK, vocab_size)
        part = (i * levels + level64) * 2 * num_chunks + s
        if state == _ALIVE:
            row_ptr = logits_ptr + (lo + i + level64) * logits_stride
            if greedy:
                score, best = argmax_tokens(row_ptr, start, limit, BLOCK_V, ARGMAX_STAGES)
                tl.store(part_f_ptr + part, score)
                tl.store(part_i_ptr + part, best)
            elif level64 >= n:  # the bonus row: the Gumbel argmax, as `sample` draws
                key = stream_key(seed, position + level64)
                score, best = gumbel_argmax(row_ptr, start, limit, key, 1.0, tol, False, BLOCK_V, REACH_SLOTS, STAGES,
                                            FULL_LANES)
                tl.store(part_f_ptr + part, score)
                tl.store(part_i_ptr + part, best)
            else:
                chunk_max, chunk_sum = _max_sum_chunk(row_ptr, start, limit, BLOCK_V, STAGES)
                tl.store(part_f_ptr + part, chunk_max)
                tl.store(part_f_ptr + part + num_chunks, chunk_sum)
        elif state == _RESIDUAL:
            row_ptr = logits_ptr + (lo + i + prev) * logits_stride
            # int32 (an id out of range as -1): compared with the int32 token offsets of the pass
            draft32 = tl.where(prev_draft_ok, prev_draft, -1).to(tl.int32)
            score_r, token_r, score_p, token_p = _residual_chunk(row_ptr, prev_probs_ptr, draft32, row_max, row_sum,
                                                                 prev_key, start, limit, vocab_size, tol,
                                                                 HAS_PROBS, BLOCK_V, REACH_SLOTS, STAGES,
                                                                 FULL_LANES, EXACT_BLOCK_V, EXACT_SKIP)
            tl.store(part_f_ptr + part, score_r)
            tl.store(part_i_ptr + part, token_r)
            tl.store(part_f_ptr + part + num_chunks, score_p)
            tl.store(part_i_ptr + part + num_chunks, token_p)
    if PDL:
        gdc_launch_dependents()  # a no-op where the program already called it


def _check_rejection_sample(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds,
                            output_lens, max_spec_len) -> None:
    op = "rejection_sample"
    rows, V = _checks.check_logits(op, target_logits, "target_logits")
    dev = target_logits.device
    _checks.check_tensor(op, "cu_num_draft", cu_num_draft, (torch.int32,), ndim=1, device=dev, like="target_logits")
    B = cu_num_draft.shape[0] - 1
    if B < 0:
        raise ValueError(f"sampling.{op}: 'cu_num_draft' must have B + 1 >= 1 entries, got shape "
                         f"{tuple(cu_num_draft.shape)}")
    _checks.check_tensor(op, "draft_token_ids", draft_token_ids, _checks.INDEX_DTYPES, ndim=1, device=dev,
                         like="target_logits")
    N = draft_token_ids.shape[0]
    if rows != N + B:
        raise ValueError(f"sampling.{op}: 'target_logits' must have N + B = {N} + {B} rows (drafts plus one bonus "
                         f"row a request), got shape {tuple(target_logits.shape)}")
    if draft_probs is not None:
        _checks.check_tensor(op, "draft_probs", draft_probs, (torch.float32,), ndim=2, device=dev, shape=(N, V),
                             like="target_logits")
    _checks.check_tensor(op, "temperature", temperature, (torch.float32,), ndim=1, device=dev, shape=(B,),
                         like="target_logits")
    _checks.check_tensor(op, "seeds", seeds, (torch.int64,), ndim=1, device=dev, shape=(B,), like="target_logits")
    _checks.check_tensor(op, "output_lens", output_lens, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(B,),
                         like="target_logits")
    if not isinstance(max_spec_len, int) or isinstance(max_spec_len, bool):
        raise TypeError(f"sampling.{op}: 'max_spec_len' must be an int, got {type(max_spec_len).__name__}")
    if max_spec_len < 0:
        raise ValueError(f"sampling.{op}: 'max_spec_len' must be >= 0, got {max_spec_len}")


def _check_rejection_sample_values(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds,
                                   output_lens, max_spec_len) -> None:
    op = "rejection_sample"
    V = target_logits.shape[1]
    counts = cu_num_draft[1:] - cu_num_draft[:-1]
    _checks.check_values(op, "cu_num_draft", (cu_num_draft[:1] == 0).all() & (counts >= 0).all()
                         & (counts <= max_spec_len).all() & (cu_num_draft[-1:] == draft_token_ids.numel()).all(),
                         f"offsets from 0 to N, non-decreasing by at most max_spec_len = {max_spec_len}")
    _checks.check_values(op, "draft_token_ids", (draft_token_ids >= 0) & (draft_token_ids < V), f"ids in [0, {V})")
    _checks.check_values(op, "target_logits", ~target_logits.isnan(), "no NaN")
    _checks.check_values(op, "temperature", torch.isfinite(temperature) & (temperature >= 0), "finite values >= 0")
    if draft_probs is not None:
        _checks.check_values(op, "draft_probs", torch.isfinite(draft_probs) & (draft_probs >= 0), "finite values >= 0")


def _rejection_sample_outputs(target_logits, cu_num_draft, max_spec_len):
    B = cu_num_draft.shape[0] - 1
    return (target_logits.new_empty((B, max_spec_len + 1), dtype=torch.int64),
            target_logits.new_empty((B,), dtype=torch.int32))


def _rejection_sample_fake(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds,
                           output_lens, max_spec_len):
    return _rejection_sample_outputs(target_logits, cu_num_draft, max_spec_len)


def _rejection_sample_triton(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds,
                             output_lens, max_spec_len):
    out, num = _rejection_sample_outputs(target_logits, cu_num_draft, max_spec_len)
    B = num.shape[0]
    if B == 0:
        return out, num
    N, V = draft_token_ids.shape[0], target_logits.shape[1]
    # Without drafts (N == 0) the draft tensors are empty and never read: valid pointers of the same
    # dtype stand in (the kernel variant does not change).
    drafts = draft_token_ids if N else (cu_num_draft if draft_token_ids.dtype == torch.int32 else out)
    has_probs = draft_probs is not None and N > 0
    probs = draft_probs if has_probs else target_logits  # never read without draft probabilities
    probs_stride = draft_probs.stride()[0] if has_probs else 0
    # Workspace sized by the shapes alone: levels 0 .. max_spec_len, each chunk's two partials and
    # each request's status. Every entry a level reads was written by the level before it.
    levels, chunks = max_spec_len + 1, cdiv(V, _CHUNK)
    part_f = target_logits.new_empty((B, levels, 2, chunks), dtype=torch.float32)
    part_i = target_logits.new_empty((B, levels, 2, chunks), dtype=torch.int32)
    status = target_logits.new_empty((B, levels, 3), dtype=torch.int32)
    args = (target_logits, target_logits.stride()[0], drafts, probs, probs_stride, cu_num_draft, temperature, seeds,
            output_lens, part_f, part_i, status, out, num, N, max_spec_len, V, chunks, gumbel.GUMBEL_APPROX_TOL)
    pdl = truncation_plan.uses_dependent_launches(target_logits.device)
    meta = dict(HAS_PROBS=has_probs, CHUNK=_CHUNK, BLOCK_V=_BLOCK_V, CHUNKS_P2=next_power_of_2(chunks),
                BLOCK_OUT=next_power_of_2(max_spec_len + 1), STAGES=_STAGES, ARGMAX_STAGES=_ARGMAX_STAGES,
                REACH_SLOTS=_REACH_SLOTS, FULL_LANES=_FULL_LANES, EXACT_BLOCK_V=_EXACT_BLOCK_V,
                EXACT_SKIP=_EXACT_SKIP, PDL=pdl,
                num_warps=_NUM_WARPS, launch_pdl=pdl)
    for level in range(levels):
        launch(_rejection_level_kernel, (B, chunks), *args, level, FINAL=False, **meta)
    launch(_rejection_level_kernel, (B, 1), *args, levels, FINAL=True, **meta)
    return out, num


@define_op(mutates_args=(), check=_check_rejection_sample, check_values=_check_rejection_sample_values,
           triton=_rejection_sample_triton, fake=_rejection_sample_fake)
def rejection_sample(target_logits: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None,
                     cu_num_draft: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                     output_lens: torch.Tensor, max_spec_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Verifies draft tokens against the target model; returns ``(output_token_ids int64 [B, max_spec_len + 1],
    num_emitted int32 [B])``, unused places ``-1``. No input is modified.

    Args:
        target_logits: ``[N + B, V]`` float32/float16/bfloat16, unit column stride: for request ``i`` its
            ``n_i`` draft positions then its bonus position, in request order. Used as given: the
            temperature must already be applied (it is not divided again), filters too.
        draft_token_ids: ``[N]`` int32/int64.
        draft_probs: ``[N, V]`` float32 (unit column stride) or None: a proposal of probability 1.
        cu_num_draft: ``[B + 1]`` int32, request ``i`` owns drafts ``cu[i]:cu[i + 1]``.
        temperature: ``[B]`` float32, only compared with 0 (greedy); seeds: ``[B]`` int64;
        output_lens: ``[B]`` int32/int64, the position of request ``i``'s first draft.
        max_spec_len: the most drafts a request may have.

    Greedy requests (``temperature == 0``) accept drafts while they equal the row's argmax (lowest
    index among ties) and emit the argmax at the first mismatch or the bonus row. Other requests
    accept draft ``x`` at position ``j`` when ``u * q_j(x) < p_j(x)`` (``p_j = softmax(row)``, ``u``
    the uniform of the stream ``(seed, output_lens + j)`` at token index ``ACCEPT_TOKEN``); at the
    first rejection they emit ``argmax_k log(r_k) + g_k`` over ``r = max(p_j - q_j, 0) > 0`` (a draw
    from the normalised residual; from ``p_j`` if ``r`` is all zero), at the bonus row
    ``argmax_k x_k + g_k`` as `sample` draws, ``g`` the Gumbel noise of the position's stream.

    Bad values, without a sync: counts are clamped (``lo_i = clamp(cu[i], 0, N)``, ``n_i =
    clamp(clamp(cu[i + 1], 0, N) - lo_i, 0, max_spec_len)``) so nothing is read out of bounds; a draft
    id outside ``[0, V)`` is rejected (``p(x) = 0``); NaN logits are read as ``-inf``; a row with no
    logit above ``-inf`` emits ``-1`` and ends its request (``-1`` is not counted in ``num_emitted``).

    The draft model must not draw its tokens with the same ``(seed, position)`` stream (use another
    seed): its noise would be correlated with the residual draw.
    """
