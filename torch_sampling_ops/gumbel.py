"""The random stream of sampling and the Gumbel-max draw over a row (`sample`, `rejection_sample`).

The random stream. A row with seed s and position p (its `output_lens`) has the key
stream_key(s, p): the four 32-bit words of (s, p), low word first, through the murmur3 finalizer
(`_mix32`). Counter c of the stream gets 32 random bits stream_bits(key, c), two more rounds over
key ^ c, and the uniform u = ((h >> 9) + 1/2) / 2**23 in (0, 1), exact in float32 (23 bits, not
24: (2m + 1) / 2**25 for a 24-bit m would round to 1.0 at the top). Every step is a wrapping uint32
operation, so Triton, the C++ kernels (csrc/random_stream.h) and the reference (torch int64
arithmetic masked to 32 bits, the definition) compute the same bits.

The noise of token j shares an exponential with its block of 4 (b = j >> 2, counter 2**31 | b):
W = -log(u_b) / 4 is the least of the block's four Exp(1) variables, the block's first arrival
(token 4b + (h_b & 3)) takes E = W and the others E = W - log(u_j); the noise is -log(E). The
four E are iid Exp(1) (the least of 4 is Exp(4), uniform in position, the others it plus fresh
Exp(1)), so the noise is iid standard Gumbel, and every token of block b has noise at most
M_b = -log(W), its first arrival exactly M_b. Three float32 logs are the only steps whose last bit
may differ between devices. The stream has no state: a row's draw depends only on (seed, position,
token), never on the batch, the launch grid or a CUDA-graph replay count.

The draw (`gumbel_argmax`, also rejection_sample's bonus draws) bounds each block's scores by its
largest logit plus M_b, from one hash and two hardware logs per block, and scores exactly only the
blocks whose bound reaches a score already realised by a first arrival: the exact scores' argmax,
bit for bit.
"""
import torch
import triton
import triton.language as tl

from ._launch import cdiv
from ._triton_helpers import fast_log2

# The tolerance of the approximate Gumbel scores (gumbel_argmax, rejection_sample's residual), a
# kernel argument: above their analysed error with room to spare; larger only costs exact passes
# (tests raise it to force the exact pass everywhere).
GUMBEL_APPROX_TOL = 2.0**-16


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
    """uint32 random bits of token indices `token` (in [0, 2**31)) of the stream `key`:
    _mix32(_mix32(key ^ token) + 0x6A09E667). The first finalizer's opening step is distributed over
    the xor, (key ^ j) ^ ((key ^ j) >> 16) = (key ^ (key >> 16)) ^ j ^ (j >> 16), so that its key part
    is computed once and a token pays one three-input xor."""
    j = token.to(tl.uint32)
    h = (key ^ (key >> 16)) ^ j ^ (j >> 16)
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return _mix32(h + 0x6A09E667)


@triton.jit
def stream_uniform(bits):
    """u = ((bits >> 9) + 1/2) / 2**23 in (0, 1), exact in float32."""
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def stream_gumbel(bits):
    """Gumbel noise -log(-log(u)) in float32 of bits (a block's noise less log 4)."""
    return -tl.log(-tl.log(stream_uniform(bits)))


@triton.jit
def block_bits(key, blocks):
    """uint32 bits of blocks `blocks` (int32, the tokens 4b .. 4b + 3) of the stream `key`: its
    counters BLOCK_COUNTER | b lie above every token index and ACCEPT_TOKEN."""
    return stream_bits(key, blocks.to(tl.uint32) | 0x80000000)


@triton.jit
def stream_noise(key, tokens):
    """The exact float32 Gumbel noise of token indices `tokens` (int32) of the stream `key`: with hb
    the bits of the token's block, W = -log(u(hb)) / 4 and E = W at the block's first arrival
    (hb & 3), W - log(u(bits of the token)) elsewhere; the noise is -log(E)."""
    hb = block_bits(key, tokens >> 2)
    w = -tl.log(stream_uniform(hb)) * 0.25
    e = tl.where((tokens & 3) == (hb & 3).to(tl.int32), w, w - tl.log(stream_uniform(stream_bits(key, tokens))))
    return -tl.log(e)


@triton.jit
def _neg_log_uniform_approx(bits):
    """-log(u) of bits to a relative error below 2**-18.3, from one hardware log2.

    u is exact as stream_uniform takes it (Sterbenz). Where w = 1 - u < 1/16 (exact), the series
    of -log(1 - w) (relative error below w**4 / 5 <= 2**-18.3), as lg2.approx's absolute error
    would swamp a small result; elsewhere -ln 2 * log2(u) (result >= 1/16: relative error below
    2**-19). u >= 2**-24 is a normal float."""
    u = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 0.99999994039535522  # (m + 1/2) / 2**23
    w = 1.0 - u
    e_series = w * (1.0 + w * (0.5 + w * (0.3333333432674408 + w * 0.25)))
    return tl.where(w < 0.0625, e_series, -0.6931471805599453 * fast_log2(u, NORMAL=True))


@triton.jit
def stream_gumbel_approx(bits):
    """stream_gumbel(bits) to within 2**-17 * (1 + |result|), from two hardware log2: the outer log
    adds at most 2**-22 * (1 + |g|) to the relative error of -log(u) (its argument is at least
    min(w, -log(15 / 16)) >= 2**-24, a normal float)."""
    return -0.6931471805599453 * fast_log2(_neg_log_uniform_approx(bits), NORMAL=True)


@triton.jit
def block_noise_approx(bits):
    """The largest noise of a block, -log(W), from its bits (block_bits) within 2**-17 * (1 +
    |result|): stream_gumbel_approx plus log 4."""
    return stream_gumbel_approx(bits) + 1.3862943611198906


@triton.jit
def stream_noise_approx(key, tokens):
    """stream_noise(key, tokens) to within 2**-17 * (1 + |result|): the sum of two positive terms
    each within a relative 2**-18.3 keeps that error, and the outer hardware log2 (of at least
    2**-26, normal) adds at most 2**-22 * (1 + |g|)."""
    hb = block_bits(key, tokens >> 2)
    w = _neg_log_uniform_approx(hb) * 0.25
    e = tl.where((tokens & 3) == (hb & 3).to(tl.int32), w, w + _neg_log_uniform_approx(stream_bits(key, tokens)))
    return -0.6931471805599453 * fast_log2(e, NORMAL=True)


# ----------------------------------------------------------------------------------------------
# The Gumbel-max draw over a row


@triton.jit
def argmax_init(BLOCK_V: tl.constexpr):
    """Per-lane running argmax state: (scores -inf, tokens -1)."""
    return tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32), tl.full((BLOCK_V,), -1, dtype=tl.int32)


@triton.jit
def argmax_update(best, best_j, score, offs):
    """Per-lane running argmax from argmax_init: strictly larger only, so from -inf it takes exactly the
    scores above -inf (NaN never) and a lane keeps its lower index on ties. `offs`: the tokens of
    `score`, or one value standing for them (argmax_tokens keeps a lane's tile start)."""
    take = score > best
    return tl.where(take, score, best), tl.where(take, offs, best_j)


@triton.jit
def argmax_finish(best, best_j, bound):
    """(the largest lane score, the lowest index holding it as int32); (-inf, -1) if no lane took a
    token. `bound`: above every token index."""
    top = tl.max(tl.where(best_j >= 0, best, float("-inf")), axis=0)
    token = tl.min(tl.where((best_j >= 0) & (best == top), best_j, bound), axis=0)
    return top, tl.where(token < bound, token, -1)


@triton.jit
def approx_gumbel_score(x, x_scaled, key, tokens):
    """The approximate score x_scaled + stream_gumbel_approx of `tokens` (within the tolerance that
    top2_certified takes), -inf where x is -inf or NaN alone (never first, never second); a token
    whose score overflows to -inf counts at -FLT_MAX (its exact score is lower)."""
    score = tl.maximum(x_scaled + stream_noise_approx(key, tokens), -3.4028234663852886e38)
    return tl.where(x > float("-inf"), score, float("-inf"))


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
def _score_err(s, tol):
    """err(s): how far an approximate score s may lie from its exact value (see gumbel_argmax). Finite
    for an infinite s (which is exact), so that s +- err(s) stays s rather than giving NaN."""
    return tol * (35.0 + tl.abs(tl.where(tl.abs(s) < float("inf"), s, 0.0)))


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
    runner_up_bound = tl.where(runner_up > float("-inf"), runner_up + _score_err(runner_up, tol), float("-inf"))
    certified = (top == float("-inf")) | ((top < float("inf")) & (runner_up_bound < top - _score_err(top, tol)))
    return token, certified


@triton.jit
def _exact_gumbel_scores(row_ptr, tokens, live, key, temp, SCALE: tl.constexpr):
    """The exact scores x_j (/ temp with SCALE) + stream_noise(key, j) at `tokens` (a scalar or a
    vector), -inf where not `live` or x_j is not above -inf (NaN never). gumbel_argmax's rounds and
    its exact pass both take them from here: the same bits at every site."""
    safe = tl.where(live, tokens, 0)
    x = tl.load(row_ptr + safe, mask=live, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temp)
    return tl.where(x > float("-inf"), x + stream_noise(key, safe), float("-inf"))


@triton.jit
def _exact_gumbel_argmax(row_ptr, begin, end, key, temp, SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """(score, token) of argmax_j of x_j (/ temp with SCALE) + stream_noise(key, j) over the tokens
    of [begin, end) above -inf, the lower index among ties; (-inf, -1) without one."""
    best, best_j = argmax_init(BLOCK_V)
    for start in range(begin, end, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        score = _exact_gumbel_scores(row_ptr, offs, offs < end, key, temp, SCALE)
        best, best_j = argmax_update(best, best_j, score, offs)
    return argmax_finish(best, best_j, 2147483647)


@triton.jit
def first_arrival_value(x, hb):
    """x[:, hb & 3] of a [lanes, 4] tile (hb: the blocks' bits, block_bits): the value at each
    block's first arrival, by two selects on the position's bits within a thread's registers."""
    NUM_LANES: tl.constexpr = x.shape[0]
    even, odd = tl.split(tl.reshape(x, (NUM_LANES, 2, 2)))  # columns (0, 2) and (1, 3)
    low, high = tl.split(tl.where(((hb & 1) != 0)[:, None], odd, even))  # columns pos & 1 and 2 + (pos & 1)
    return tl.where((hb & 2) != 0, high, low)


@triton.jit
def _bound_blocks(x, blocks, key, inv_temp, realised, c1, c1_block, c2, c2_block, c3):
    """gumbel_argmax's pass over a [lanes, 4] tile x of `blocks`: each block's bound U (its max
    scaled by inv_temp, plus M_b) and first arrival's score L into the lanes' state."""
    hb = block_bits(key, blocks)
    noise_max = block_noise_approx(hb)
    # Scaled after the block's max: rounding is monotone, so max(x) * s is max(x * s) (s > 0).
    bound = tl.max(x, axis=1) * inv_temp + noise_max
    realised = tl.maximum(realised, first_arrival_value(x, hb) * inv_temp + noise_max)
    c1, c1_block, c2, c2_block, c3 = _block_candidates_update(c1, c1_block, c2, c2_block, c3, bound, blocks)
    return realised, c1, c1_block, c2, c2_block, c3


@triton.jit
def _block_candidates_update(c1, c1_block, c2, c2_block, c3, bound, blocks):
    """Per lane: the largest block bound (and its block), the second (and its block), and the largest
    of the others (c3, a value only). Strictly larger displaces, so -inf and NaN bounds never enter."""
    above_first = bound > c1
    above_second = bound > c2
    c3 = tl.maximum(c3, tl.where(above_second, c2, bound))
    c2_block = tl.where(above_first, c1_block, tl.where(above_second, blocks, c2_block))
    c2 = tl.where(above_first, c1, tl.where(above_second, bound, c2))
    c1_block = tl.where(above_first, blocks, c1_block)
    c1 = tl.where(above_first, bound, c1)
    return c1, c1_block, c2, c2_block, c3


@triton.jit
def reaches_floor(bound, floor, tol):
    """Whether a block whose exact scores lie at most at its bound U (approximate: within err(U)) may
    hold a score of at least `floor`: U above -inf (NaN never) and U + err(U) >= floor."""
    return (bound > float("-inf")) & (bound + _score_err(bound, tol) >= floor)


@triton.jit
def _max2(a0, b0, a1, b1):
    return tl.maximum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def block_reach_lanes(c1, c2, c3, realised, tol):
    """(infinite, full, reach1, reach2, floor) of the per-lane candidate state (_block_candidates_update)
    and the per-lane largest realised scores: with A the largest realised score the winner scores at
    least floor = A - err(A) exactly, so the blocks that may hold it are a lane's first and second
    whose bound reaches the floor (reach1, reach2), unless its third block reaches it too: then the
    lane is full [lanes] (any block it saw may: full_lane_tokens), and reach1 and reach2 hold outside
    the full lanes. Infinite, a scalar: a bound or A is infinite (the caller's exact pass)."""
    top, first = tl.reduce((realised, c1), 0, _max2)
    floor = top - _score_err(top, tol)  # -inf without a realised score: every finite block reaches it
    full = reaches_floor(c3, floor, tol)
    infinite = (first == float("inf")) | (top == float("inf"))
    return infinite, full, ~full & reaches_floor(c1, floor, tol), ~full & reaches_floor(c2, floor, tol), floor


@triton.jit
def next_full_lane(full, after):
    """The lowest full lane above `after` (block_reach_lanes' mask), or the number of lanes if none."""
    NUM_LANES: tl.constexpr = full.shape[0]
    lanes = tl.arange(0, NUM_LANES)
    return tl.min(tl.where(full & (lanes > after), lanes, NUM_LANES), axis=0)


@triton.jit
def full_lane_tokens(lane, first_tile, begin, end, NUM_LANES: tl.constexpr, TILES: tl.constexpr):
    """(tokens, live) [TILES, 4]: the tokens `lane` saw in tiles first_tile .. first_tile + TILES - 1
    of a pass of NUM_LANES blocks a tile from `begin` (block begin / 4 + lane + k * NUM_LANES in tile
    k), live inside [begin, end)."""
    blocks = begin // 4 + lane + (first_tile + tl.arange(0, TILES)) * NUM_LANES
    tokens = blocks[:, None] * 4 + tl.arange(0, 4)[None, :]
    return tokens, tokens < end


@triton.jit
def score_token_key(score, token):
    """int64 keys that order (score, token) pairs as a draw ranks them: the larger score, then the
    lower token (score not NaN, -0.0 equal to +0.0; token in (-2**31, 2**31)), so that one max
    reduction finds the winner. score_token_of inverts them."""
    bits = score.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0
    signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # orders as the float does
    return (signed.to(tl.int64) << 32) | (2147483647 - token.to(tl.int64))


@triton.jit
def score_token_of(key):
    """The (score, token) of a score_token_key key (-0.0 comes back as +0.0)."""
    signed = (key >> 32).to(tl.int32)
    score = (signed ^ ((signed >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return score, (2147483647 - (key & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def slot_pick(slot, block, slots, other):
    """[lanes, slots]: a lane's `block` at its `slot` (-1: none), `other` elsewhere (-1, or the picks
    of the next list). Its max over the lanes gathers a round's blocks (reach_round_tokens)."""
    return tl.where(slot[:, None] == slots[None, :], block[:, None], other)


@triton.jit
def reach_round_tokens(picked, begin, end):
    """(tokens, live) [slots, 4] of the blocks a round gathers from `picked` (slot_pick's): the
    blocks' tokens, live where a block was gathered and the token lies in [begin, end)."""
    slot_blocks = tl.max(picked, axis=0)
    tokens = slot_blocks[:, None] * 4 + tl.arange(0, 4)[None, :]
    return tokens, (slot_blocks[:, None] >= 0) & (tokens >= begin) & (tokens < end)


@triton.jit
def round_best_empty():
    """The score_token_key no token beats: (-inf, the largest token); round_best folds rounds into it."""
    return score_token_key(tl.full([], float("-inf"), tl.float32), tl.full([], 2147483647, tl.int32))


@triton.jit
def round_winner(best):
    """(score, token) of round_best's key `best`; token -1 when no round scored a token above -inf."""
    score, token = score_token_of(best)
    return score, tl.where(score > float("-inf"), token, -1)


@triton.jit
def round_best(best, exact, tokens):
    """The running score_token_key `best` with a round's exact scores at `tokens` (same shape, 2-D,
    -inf where not scored) taken in."""
    return tl.maximum(best, tl.max(tl.max(score_token_key(exact, tokens), axis=1), axis=0))


# Reaching blocks a round of sample's Gumbel draws scores exactly (gumbel_argmax's REACH_SLOTS):
# the full-row draw and the general path.
DRAW_REACH_SLOTS = tl.constexpr(8)
# Tiles of a full lane (gumbel_argmax) whose blocks one gather scores.
FULL_TILES = tl.constexpr(16)


@triton.jit
def gumbel_argmax(row_ptr, begin, end, key, temp, tol, SCALE: tl.constexpr, BLOCK_V: tl.constexpr,
                  REACH_SLOTS: tl.constexpr, STAGES: tl.constexpr = 1, FULL_LANES: tl.constexpr = 0):
    """(score, token) of argmax_j of x_j (/ temp with SCALE) + stream_noise(key, j) over the tokens
    of row_ptr[begin:end] above -inf (NaN never), the lower index among ties; (-inf, -1) without
    one. The exact scores' result, bit for bit, from one hash and two hardware logs per block of 4:

    Every token of block b has noise at most M_b = -log(W_b), its first arrival exactly M_b
    (stream_noise). One pass computes per block U_b = max x_j + M_b, an upper bound of the block's
    exact scores, and L_b = x_pos + M_b, the first arrival's score, both approximately (within
    err(s) = tol * (35 + |s|), as the per-token scores of top2_certified), and keeps per lane the
    largest L, the two blocks of largest U, and the largest U of the lane's other blocks. With A the
    largest L, the winner scores at least floor = A - err(A) exactly; a block whose U + err(U)
    stays below it cannot hold the winner. The blocks that reach it are scored exactly,
    REACH_SLOTS at a time. A lane whose third block reaches the floor (a full lane) has every block
    it saw scored, FULL_TILES of them at a time; with more than FULL_LANES full lanes, or a bound
    infinite, a second pass scores every token exactly. `begin` is a multiple of 4 (no block
    straddles it)."""
    inv_temp = tl.math.div_rn(1.0, temp) if SCALE else 1.0
    NUM_LANES: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, NUM_LANES)
    column = tl.arange(0, 4)
    realised = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    c1 = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    c2 = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    c3 = tl.full((NUM_LANES,), float("-inf"), dtype=tl.float32)
    c1_block = tl.full((NUM_LANES,), -1, dtype=tl.int32)
    c2_block = tl.full((NUM_LANES,), -1, dtype=tl.int32)
    # Whole tiles unmasked, then the partial tile at the end masked.
    full_end = begin + (end - begin) // BLOCK_V * BLOCK_V
    for start in tl.range(begin, full_end, BLOCK_V, num_stages=STAGES):
        blocks = start // 4 + lanes
        x = tl.load(row_ptr + blocks[:, None] * 4 + column[None, :]).to(tl.float32)
        realised, c1, c1_block, c2, c2_block, c3 = _bound_blocks(x, blocks, key, inv_temp, realised, c1, c1_block, c2,
                                                                 c2_block, c3)
    if full_end < end:
        blocks = full_end // 4 + lanes
        offs = blocks[:, None] * 4 + column[None, :]
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        realised, c1, c1_block, c2, c2_block, c3 = _bound_blocks(x, blocks, key, inv_temp, realised, c1, c1_block, c2,
                                                                 c2_block, c3)
    infinite, full, reach1, reach2, _ = block_reach_lanes(c1, c2, c3, realised, tol)
    # The reaching blocks of a lane take consecutive slots (first, second), the lanes in order; they
    # are scored exactly REACH_SLOTS at a time.
    f1 = reach1.to(tl.int32)
    count = f1 + reach2.to(tl.int32)
    reaching = tl.sum(count, axis=0)
    base = tl.cumsum(count, axis=0) - count
    slot1 = tl.where(reach1, base, -1)
    slot2 = tl.where(reach2, base + f1, -1)
    if infinite | (tl.sum(full.to(tl.int32), axis=0) > FULL_LANES):
        score, token = _exact_gumbel_argmax(row_ptr, begin, end, key, temp, SCALE, BLOCK_V)
    else:
        best = round_best_empty()
        first_slot = 0
        while first_slot < reaching:
            slots = first_slot + tl.arange(0, REACH_SLOTS)
            tokens, live = reach_round_tokens(slot_pick(slot1, c1_block, slots, slot_pick(slot2, c2_block, slots, -1)),
                                              begin, end)
            exact = _exact_gumbel_scores(row_ptr, tokens, live, key, temp, SCALE)
            best = round_best(best, exact, tokens)
            first_slot += REACH_SLOTS
        if FULL_LANES > 0:
            num_tiles = (end - begin + BLOCK_V - 1) // BLOCK_V
            lane = next_full_lane(full, -1)
            while lane < NUM_LANES:
                for first_tile in range(0, num_tiles, FULL_TILES):
                    tokens, live = full_lane_tokens(lane, first_tile, begin, end, NUM_LANES, FULL_TILES)
                    best = round_best(best, _exact_gumbel_scores(row_ptr, tokens, live, key, temp, SCALE), tokens)
                lane = next_full_lane(full, lane)
        score, token = round_winner(best)
    return score, token


@triton.jit
def argmax_tokens(row_ptr, begin, end, BLOCK_V: tl.constexpr, STAGES: tl.constexpr = 1):
    """(max, token) of row_ptr[begin:end] over the tokens above -inf (NaN never), the lower index
    among ties; (-inf, -1) without one: a greedy row's argmax. STAGES tiles in flight."""
    lanes = tl.arange(0, BLOCK_V)
    best, best_start = argmax_init(BLOCK_V)  # best_start: the tile of a lane's best; -1: none yet
    # Whole tiles unmasked, then the partial tile at the end masked.
    full_end = begin + (end - begin) // BLOCK_V * BLOCK_V
    for start in tl.range(begin, full_end, BLOCK_V, num_stages=STAGES):
        best, best_start = argmax_update(best, best_start, tl.load(row_ptr + start + lanes).to(tl.float32), start)
    if full_end < end:
        offs = full_end + lanes
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        best, best_start = argmax_update(best, best_start, x, full_end)
    return argmax_finish(best, tl.where(best_start >= 0, best_start + lanes, -1), 2147483647)


# ----------------------------------------------------------------------------------------------
# The stream and the noise as the kernels compute them, for tests


@triton.jit
def _random_stream_kernel(seeds_ptr, positions_ptr, tokens_ptr, bits_ptr, noise_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    key = stream_key(tl.load(seeds_ptr + offs, mask=ok).to(tl.int64), tl.load(positions_ptr + offs, mask=ok).to(tl.int64))
    tokens = tl.load(tokens_ptr + offs, mask=ok)
    bits = stream_bits(key, tokens)
    tl.store(bits_ptr + offs, bits.to(tl.int64), mask=ok)
    tl.store(noise_ptr + offs, stream_noise(key, tokens), mask=ok)


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


@triton.jit
def _score_token_key_kernel(scores_ptr, tokens_ptr, keys_ptr, back_scores_ptr, back_tokens_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    key = score_token_key(tl.load(scores_ptr + offs, mask=ok), tl.load(tokens_ptr + offs, mask=ok))
    score, token = score_token_of(key)
    tl.store(keys_ptr + offs, key, mask=ok)
    tl.store(back_scores_ptr + offs, score, mask=ok)
    tl.store(back_tokens_ptr + offs, token, mask=ok)


def score_token_keys_triton(scores: torch.Tensor, tokens: torch.Tensor):
    """(score_token_key int64, then score_token_of's float32 scores and int32 tokens) of 1-D float32
    `scores` and int32 `tokens`, computed by the Triton functions the kernels use (for tests)."""
    n = scores.numel()
    keys = torch.empty(n, dtype=torch.int64, device=scores.device)
    back_scores, back_tokens = torch.empty_like(scores), torch.empty_like(tokens)
    if n:
        _score_token_key_kernel[(cdiv(n, 1024),)](scores, tokens, keys, back_scores, back_tokens, n, BLOCK=1024)
    return keys, back_scores, back_tokens


def random_stream_triton(seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor):
    """(bits int64, noise float32) of the stream at each (seed, position, token), elementwise over
    1-D int64 tensors, computed by the Triton functions the kernels use (for tests)."""
    n = seeds.numel()
    bits = torch.empty(n, dtype=torch.int64, device=seeds.device)
    noise = torch.empty(n, dtype=torch.float32, device=seeds.device)
    if n:
        _random_stream_kernel[(cdiv(n, 1024),)](seeds, positions, tokens, bits, noise, n, BLOCK=1024)
    return bits, noise
