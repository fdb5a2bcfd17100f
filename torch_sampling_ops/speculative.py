"""Speculative decoding's verification step: `rejection_sample`.

Each request proposed `n_i` draft tokens; the target model scored its `n_i` draft positions and one
bonus position. The op walks each request's positions in order and stops at the first rejection,
so it reads a target row only once the request reaches it, and a draft-probability row in full only
at the rejected position (elsewhere the one probability `q(x)` of the draft token).

Random numbers come from the stream of `sample` (sampling.py), keyed by the request's seed and the
position `output_lens[i] + j`: the acceptance uniform of position j uses the reserved token index
`ACCEPT_TOKEN = 2**31 - 1` (outside every vocabulary), the residual and bonus draws use the Gumbel
noise of the token indices, as `sample` does. So a request's tokens depend only on its own rows,
seed and position, never on the batch.

CUDA: one program a request; each position it reaches costs one pass over the target row (the
argmax for greedy requests; the max and normaliser of the softmax otherwise), the rejected position
one more pass over the target row and the draft row (the residual draw), the bonus position one
Gumbel-max pass. Passes run in blocks of 4096 tokens over the program's 8 warps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._registry import define_op, launch
from .sampling import stream_bits, stream_gumbel, stream_key

ACCEPT_TOKEN = 2**31 - 1  # the token index of the acceptance uniform in a position's stream
_BLOCK_V = 4096


@triton.jit
def _argmax_update(best, best_j, score, live, offs):
    """Per-lane running argmax; strictly larger only, so a lane keeps its lower index on ties."""
    take = live & ((best_j < 0) | (score > best))
    return tl.where(take, score, best), tl.where(take, offs, best_j)


@triton.jit
def _argmax_finish(best, best_j, vocab_size):
    """The lowest index of the largest lane score as int64, -1 if no lane took a token."""
    top = tl.max(tl.where(best_j >= 0, best, float("-inf")), axis=0)
    token = tl.min(tl.where((best_j >= 0) & (best == top), best_j, vocab_size), axis=0)
    return tl.where(token < vocab_size, token, -1).to(tl.int64)


@triton.jit
def _load_row(row_ptr, offs, vocab_size):
    x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
    return tl.where(x == x, x, float("-inf"))  # NaN is read as -inf


@triton.jit
def _argmax_pass(row_ptr, key, vocab_size, NOISE: tl.constexpr, BLOCK_V: tl.constexpr):
    """argmax of the row (plus the Gumbel noise of `key` when NOISE) over the tokens above -inf."""
    best = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    best_j = tl.full((BLOCK_V,), -1, dtype=tl.int32)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = _load_row(row_ptr, offs, vocab_size)
        if NOISE:
            score = x + stream_gumbel(stream_bits(key, offs))
        else:
            score = x
        best, best_j = _argmax_update(best, best_j, score, x > float("-inf"), offs)
    return _argmax_finish(best, best_j, vocab_size)


@triton.jit
def _max_sum_pass(row_ptr, vocab_size, BLOCK_V: tl.constexpr):
    """(max, sum of exp(x - max)) of the row; (-inf, 0) without a logit above -inf. The sums stay
    per lane until the end: one cross-warp reduction a block (the max), not two."""
    run_max = float("-inf")
    lane_sum = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        x = _load_row(row_ptr, start + tl.arange(0, BLOCK_V), vocab_size)
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        if new_max > float("-inf"):
            lane_sum = lane_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
            run_max = new_max
    return run_max, tl.sum(lane_sum, axis=0)


@triton.jit
def _residual_pass(row_ptr, probs_row_ptr, draft, row_max, row_sum, key, vocab_size, HAS_PROBS: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    """argmax_k log(r_k) + g_k over r = p - q > 0; argmax_k x_k + g_k (a draw from p) if r has no
    positive entry; -1 for a row without a logit above -inf."""
    best_r = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    best_rj = tl.full((BLOCK_V,), -1, dtype=tl.int32)
    best_p = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    best_pj = tl.full((BLOCK_V,), -1, dtype=tl.int32)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        in_row = offs < vocab_size
        x = _load_row(row_ptr, offs, vocab_size)
        g = stream_gumbel(stream_bits(key, offs))
        p = tl.exp(x - row_max) / row_sum  # NaN for every token of a row with max -inf: never taken
        if HAS_PROBS:
            q = tl.load(probs_row_ptr + offs, mask=in_row, other=0.0)
        else:
            q = tl.where(offs == draft, 1.0, 0.0)
        r = p - q
        has = in_row & (r > 0.0)  # false for NaN
        best_r, best_rj = _argmax_update(best_r, best_rj, tl.log(tl.where(has, r, 1.0)) + g, has, offs)
        best_p, best_pj = _argmax_update(best_p, best_pj, x + g, x > float("-inf"), offs)
    token_r = _argmax_finish(best_r, best_rj, vocab_size)
    token_p = _argmax_finish(best_p, best_pj, vocab_size)
    return tl.where(token_r >= 0, token_r, token_p)


@triton.jit
def _rejection_sample_kernel(logits_ptr, logits_stride, draft_ids_ptr, probs_ptr, probs_stride, cu_ptr,
                             temperature_ptr, seeds_ptr, output_lens_ptr, out_ptr, num_ptr, num_drafts,
                             max_spec_len, vocab_size, HAS_PROBS: tl.constexpr, BLOCK_V: tl.constexpr,
                             BLOCK_OUT: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    # Clamped layout: draft rows [lo, lo + n) within [0, N), target rows lo + i + j <= N + i < N + B.
    lo = tl.minimum(tl.maximum(tl.load(cu_ptr + i).to(tl.int64), 0), num_drafts)
    hi = tl.minimum(tl.maximum(tl.load(cu_ptr + i + 1).to(tl.int64), 0), num_drafts)
    n = tl.minimum(tl.maximum(hi - lo, 0), max_spec_len)
    greedy = tl.load(temperature_ptr + i) == 0.0
    seed = tl.load(seeds_ptr + i).to(tl.int64)
    position = tl.load(output_lens_ptr + i).to(tl.int64)
    out_row = out_ptr + i * (max_spec_len + 1)
    j = lo * 0
    token = lo * 0 - 1
    done = tl.full([], 0, tl.int32)
    while done == 0:
        row_ptr = logits_ptr + (lo + i + j) * logits_stride
        is_draft = j < n
        draft = tl.load(draft_ids_ptr + lo + j, mask=is_draft, other=-1).to(tl.int64)
        draft_ok = (draft >= 0) & (draft < vocab_size)
        key = stream_key(seed, position + j)
        accept = draft_ok & (draft < 0)  # false; each branch below sets it
        if greedy:
            token = _argmax_pass(row_ptr, key, vocab_size, False, BLOCK_V)
            accept = draft_ok & (draft == token)
        elif is_draft:
            row_max, row_sum = _max_sum_pass(row_ptr, vocab_size, BLOCK_V)
            x_d = tl.load(row_ptr + tl.where(draft_ok, draft, 0)).to(tl.float32)
            p_d = tl.where((row_max > float("-inf")) & (x_d == x_d), tl.exp(x_d - row_max) / row_sum, 0.0)
            probs_row_ptr = probs_ptr + (lo + j) * probs_stride
            if HAS_PROBS:
                q_d = tl.load(probs_row_ptr + tl.where(draft_ok, draft, 0))
            else:
                q_d = 1.0
            u = ((stream_bits(key, tl.full([], 2147483647, tl.int32)) >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
            accept = draft_ok & (u * q_d < p_d)
            token = lo * 0 - 1
            rejected = ~accept
            if rejected:
                # int32 (an id out of range as -1): compared with the int32 token offsets of the pass
                draft32 = tl.where(draft_ok, draft, -1).to(tl.int32)
                token = _residual_pass(row_ptr, probs_row_ptr, draft32, row_max, row_sum, key, vocab_size,
                                       HAS_PROBS, BLOCK_V)
        else:
            token = _argmax_pass(row_ptr, key, vocab_size, True, BLOCK_V)
            accept = draft_ok & (draft < 0)  # no draft at the bonus row
        tl.store(out_row + j, tl.where(accept, draft, token))
        j += accept.to(tl.int64)
        done = (~accept).to(tl.int32)
    # j places hold accepted drafts, place j the final token; the rest are padding. Each place is
    # written once, so the threads of the program never race on one address.
    k = tl.arange(0, BLOCK_OUT)
    tl.store(out_row + k, tl.full((BLOCK_OUT,), -1, tl.int64), mask=(k > j) & (k <= max_spec_len))
    tl.store(num_ptr + i, (j + (token >= 0).to(tl.int64)).to(tl.int32))


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
    # Without drafts (N == 0) the draft tensors are empty and never read: valid pointers stand in.
    drafts = draft_token_ids if N else cu_num_draft
    has_probs = draft_probs is not None and N > 0
    probs = draft_probs if has_probs else target_logits  # never read without draft probabilities
    probs_stride = draft_probs.stride()[0] if has_probs else 0
    launch(_rejection_sample_kernel, (B,), target_logits, target_logits.stride()[0], drafts, probs, probs_stride,
           cu_num_draft, temperature, seeds, output_lens, out, num, N, max_spec_len, V, HAS_PROBS=has_probs,
           BLOCK_V=_BLOCK_V, BLOCK_OUT=triton.next_power_of_2(max_spec_len + 1), num_warps=8)
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
