"""The random stream of sampling and the Gumbel-max draw over a row (`sample`, `rejection_sample`).

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

The draw (`gumbel_argmax`, also rejection_sample's) scores every token approximately, from two
hardware log2 (`stream_gumbel_approx`) and a multiplication by 1 / temperature, each score within
a tolerance of its exact value, and keeps each lane's two largest. When the largest minus the
tolerance stays above the runner-up plus it, that token wins the exact scores too: its exact score
alone is computed. Otherwise (a near tie, an infinite score) a second pass scores every token
exactly. So the token is the exact scores' argmax, bit for bit, at about half the arithmetic.
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
def stream_gumbel(bits):
    """Gumbel noise -log(-log(u)) in float32, u = ((bits >> 9) + 1/2) / 2**23 in (0, 1)."""
    u = ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
    return -tl.log(-tl.log(u))


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
    # u >= 2**-24 and e >= min(w, -log(15 / 16)) >= 2**-24: both logs take normal floats.
    e = tl.where(w < 0.0625, e_series, -0.6931471805599453 * fast_log2(u, NORMAL=True))
    return -0.6931471805599453 * fast_log2(e, NORMAL=True)


# ----------------------------------------------------------------------------------------------
# The Gumbel-max draw over a row


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
def approx_gumbel_score(x, x_scaled, key, tokens):
    """The approximate score x_scaled + stream_gumbel_approx of `tokens` (within the tolerance that
    top2_certified takes), -inf where x is -inf or NaN alone (never first, never second); a token
    whose score overflows to -inf counts at -FLT_MAX (its exact score is lower)."""
    score = tl.maximum(x_scaled + stream_gumbel_approx(stream_bits(key, tokens)), -3.4028234663852886e38)
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
    """err(s): how far an approximate score s may lie from its exact value (see gumbel_argmax)."""
    return tol * (35.0 + tl.abs(s))


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
def lane_leaders_within_reach(first, second, first_j, tol):
    """For per-lane top-2 approximate scores that `top2_certified` leaves open: (decided, near).
    With A the largest and every lane's second plus its err below A - err(A) (decided), the exact
    argmax is a lane's leader whose score s reaches A - err(A) - err(s) (near): any other token
    scores at most its lane's second, and so do tokens tied with the winner (the winner's exact score
    is at least A - err(A)). Not decided (the caller's exact pass) when a second comes that close,
    or A is infinite; `near` is then meaningless."""
    top = tl.max(first, axis=0)
    floor = top - _score_err(top, tol)  # -inf when top is -FLT_MAX (or -inf)
    runner = tl.max(second, axis=0)
    runner_bound = tl.where(runner > float("-inf"), runner + _score_err(runner, tol), float("-inf"))
    decided = (top < float("inf")) & (floor > float("-inf")) & (runner_bound < floor)
    near = (first_j >= 0) & (first + _score_err(first, tol) >= floor)
    return decided, near


@triton.jit
def best_rescored(exact, near, first_j):
    """(score, token) of the leaders `near` rescored exactly (`exact`, -inf elsewhere): the largest
    exact score, the lowest token among equal ones."""
    score = tl.max(exact, axis=0)
    return score, tl.min(tl.where(near & (exact == score), first_j, 2147483647), axis=0)


@triton.jit
def _exact_gumbel_scores(row_ptr, tokens, live, key, temp, SCALE: tl.constexpr):
    """The exact scores x_j (/ temp with SCALE) + stream_gumbel(key, j) at `tokens` (a scalar or a
    vector), -inf where not `live` or x_j is not above -inf (NaN never). gumbel_argmax's certified
    winner, its rescored leaders and its exact pass all take them from here: the same bits at every
    site."""
    safe = tl.where(live, tokens, 0)
    x = tl.load(row_ptr + safe, mask=live, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temp)
    return tl.where(x > float("-inf"), x + stream_gumbel(stream_bits(key, safe)), float("-inf"))


@triton.jit
def _rescore_lane_leaders(row_ptr, first, second, first_j, key, temp, tol, SCALE: tl.constexpr):
    """(decided, score, token): gumbel_argmax's near tie settled among the lanes' leaders
    (`lane_leaders_within_reach`), each rescored exactly."""
    decided, near = lane_leaders_within_reach(first, second, first_j, tol)
    exact = _exact_gumbel_scores(row_ptr, first_j, near, key, temp, SCALE)
    score, token = best_rescored(exact, near, first_j)
    return decided, score, token


@triton.jit
def _exact_gumbel_argmax(row_ptr, begin, end, key, temp, SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """(score, token) of argmax_j of x_j (/ temp with SCALE) + stream_gumbel(key, j) over the tokens
    of [begin, end) above -inf, the lower index among ties; (-inf, -1) without one."""
    best, best_j = argmax_init(BLOCK_V)
    for start in range(begin, end, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        score = _exact_gumbel_scores(row_ptr, offs, offs < end, key, temp, SCALE)
        best, best_j = argmax_update(best, best_j, score, score > float("-inf"), offs)
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
    score alone is computed (x reloaded). A near tie between lanes' leaders is settled by rescoring
    those leaders exactly (`_rescore_lane_leaders`); otherwise (a lane's second within reach, an
    infinite score) a second pass scores every token exactly."""
    inv_temp = tl.math.div_rn(1.0, temp)
    first, second, first_j = top2_init(BLOCK_V)
    for start in tl.range(begin, end, BLOCK_V, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        if SCALE:
            x_scaled = x * inv_temp
        else:
            x_scaled = x
        first, second, first_j = top2_update(first, second, first_j, approx_gumbel_score(x, x_scaled, key, offs), offs)
    token, certified = top2_certified(first, second, first_j, tol, BLOCK_V)
    if certified:
        score = _exact_gumbel_scores(row_ptr, token, token >= 0, key, temp, SCALE)
    else:
        decided, score, token = _rescore_lane_leaders(row_ptr, first, second, first_j, key, temp, tol, SCALE)
        if not decided:
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


# ----------------------------------------------------------------------------------------------
# The stream and the noise as the kernels compute them, for tests


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
