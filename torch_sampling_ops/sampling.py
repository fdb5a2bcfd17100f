"""Drawing tokens: `sample` and `logprobs` (the random stream and the Gumbel draw: `gumbel`).

`sample` on CUDA: the rows without a filter and the greedy rows are drawn by the first launch,
reading each row once (below `split_draw_max_t` rows, one program a row and segment of
`draw_segment_for(T)` tokens, truncation.settings, whose pairs the next launch reduces in order):
the argmax of logits / temperature + Gumbel noise over the tokens above -inf, ties to the lower
index (`gumbel.gumbel_argmax`), or for a greedy row the plain argmax (the filters always keep it).
The rows with min_p, top_k or top_p on take `top_k_top_p`'s launches in their DRAW form
(`truncation.filtered_draw_launches`), whose first step, the rows' bounds from a sample of their
tokens, the first launch takes too: the scan lists each row's candidates from the logits as they
are, the list is gathered (by a launch of its own below 128 rows, else by the
selection's program), the selection finds the filters' threshold on y = logits / temperature
(IEEE division, as the `temperature` op) among them and draws the token from the kept
candidates alone (scored approximately, the winner exact); nothing is written back and no [T, V]
copy is made.

`logprobs` on CUDA: two launches. The first splits each row into fixed segments (their length a
module constant, so a row's result never depends on the batch), one program each, which reads its
segment once and writes its max, sum of exp(x - max), count of logits strictly larger than the
token's, and the maxima of its groups of 64 consecutive tokens. The second, one program a row,
combines the segments in order (max and sum rescaled) and sums the counts; for the top k it takes
the k groups of largest maximum, which hold the row's k largest logits, reads their tokens again
(k * 64 of them) and keeps the k largest, both by counts (`_largest`), with no sort. Ties go to the
lower index. For k above 64 (or V above 512 K tokens) each segment hands over its own top k
(`tl.topk` on blocks), merged by the second launch as sortable int64 keys (the value's
order-preserving key above, -0.0 and +0.0 alike; the V-inverted index below).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import _checks, gumbel
from ._launch import cdiv, next_power_of_2
from ._registry import define_op, launch
from ._triton_helpers import load_slot
from .gumbel import argmax_tokens, gumbel_argmax, stream_key
from .truncation.keys import _float_key, _key_value
from .truncation.op import filtered_draw_launches
from .truncation.scan import store_row_bound
from .truncation.workspace import row_settings, store_draw_pair

# The full-row draw's programs walk their tokens over _DRAW_WARPS warps: a whole row in tiles of
# _DRAW_BLOCK_V, _ARGMAX_STAGES at a time for a greedy row's argmax (bound by the read) and
# _DRAW_STAGES for the Gumbel draw (its block bounds leave it near the read too; whether staging
# pays there is open, docs/notes/sampling-tuning.md); the staging buffers are shared memory, so
# the kernel's registers do not grow; below `split_draw_max_t` rows, the `draw_segment_for(T)`
# tokens of a program (truncation.settings) in tiles of _SPLIT_DRAW_BLOCK_V, with _SPLIT_DRAW_STAGES
# tiles in flight (a segment is only a few tiles: their loads would otherwise wait on each other).
# The token is the exact argmax whatever the tiles.
_DRAW_BLOCK_V = 4096
_ARGMAX_STAGES = 3
_DRAW_STAGES = _ARGMAX_STAGES
_SPLIT_DRAW_BLOCK_V = 2048
_SPLIT_DRAW_STAGES = 3
_DRAW_WARPS = 8
# Full lanes (gumbel_argmax: a lane whose third block reaches the floor) the draw scores block by
# block; with more, its exact pass over the program's tokens. 0: every such draw takes the exact pass
# (block by block did not pay for these draws: docs/notes/sampling-tuning.md).
_DRAW_FULL_LANES = 0
_MAX_TOPK = 1024  # largest num_logprobs: the Triton kernels hold K-key lists in registers; more is rejected
# logprobs splits each row into segments of _LOGPROBS_SEGMENT tokens, one program of _LOGPROBS_WARPS
# warps each (a function of V only, so a row's result never depends on the batch). For K (=
# num_logprobs to a power of two, at least 2) up to _LOGPROBS_GROUPS_MAX_K, a segment stores the
# maxima of its groups of _LOGPROBS_GROUP consecutive tokens, and the combining program gathers K
# groups (a [K, _LOGPROBS_GROUP] tile). Larger K: each segment hands over its K largest (`tl.topk` on
# blocks of max(_LOGPROBS_BLOCK, K) keys), which the combining program merges _LOGPROBS_MERGE_KEYS at
# a time.
_LOGPROBS_SEGMENT = 4096 if os.environ.get("TRITON_INTERPRET") != "1" else 1024
_LOGPROBS_GROUP = 64
_LOGPROBS_GROUPS_MAX_K = 64
_LOGPROBS_ROW_GROUPS_MAX = 8192  # group maxima the combining program holds (V up to 512 K tokens)
_LOGPROBS_COMBINE_WARPS = 8
_LOGPROBS_BLOCK = 1024
_LOGPROBS_MERGE_KEYS = 1024
_LOGPROBS_WARPS = 4
_KEY_NONE = tl.constexpr(-2**63)  # below every `_sortable_key` (NaN is read as -inf before keys are made)

# ----------------------------------------------------------------------------------------------
# logprobs


@triton.jit
def _sortable_key(x, offs):
    """int64 keys ordered as (x descending, offs ascending), x not NaN: x's `_float_key` less 2**31
    in the high word (so -0.0 ties with +0.0, and every key lies above _KEY_NONE), 2**32 - 1 - offs
    in the low word."""
    return ((_float_key(x).to(tl.int64) - 2**31) << 32) | (4294967295 - offs.to(tl.int64))


@triton.jit
def _key_parts(keys):
    """(value float32, token int32) of `_sortable_key` keys (a -0.0 comes back as +0.0); (-inf, -1)
    for _KEY_NONE."""
    values = _key_value(((keys >> 32) + 2**31).to(tl.uint32))
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
                             GROUP: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, HAS_TOPK: tl.constexpr,
                             GROUPS: tl.constexpr):
    """Segment s of row t: its max, sum of exp(x - max) (0 without mass) and count of logits strictly
    larger than the token's, at [t, s] of the part tensors. With GROUPS, the maxima of its groups of
    GROUP consecutive tokens (-inf for a group past V) at part_vals[t, s, :]; else its K largest
    (value and token, larger first, token -1 past V) at [t, s, :] of part_vals and part_ids."""
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
        if GROUPS:
            group_max = tl.max(tl.reshape(x, (SEGMENT // GROUP, GROUP)), axis=1)
            tl.store(part_vals_ptr + part * (SEGMENT // GROUP) + tl.arange(0, SEGMENT // GROUP), group_max)
        else:
            _store_candidates(part_vals_ptr + part * K, part_ids_ptr + part * K,
                              _topk_of_blocks(row_ptr, begin, end, K, BLOCK), K)


@triton.jit
def _largest(u, k):
    """Which entries of the 1-D int64 u (values in [0, 2**32), -1 for none; at least k not -1) are its
    k largest, the lower position first among equal values: exactly k True. Their k-th largest
    value is found bit by bit from the top (32 counts); ties at it, if more than fit, by a prefix sum."""
    theta = tl.zeros((), dtype=tl.int64)
    for i in range(32):
        trial = theta | (tl.full((), 1, tl.int64) << (31 - i))
        theta = tl.where(tl.sum((u >= trial).to(tl.int32), axis=0) >= k, trial, theta)
    above = u > theta
    tie = u == theta
    need = k - tl.sum(above.to(tl.int32), axis=0)
    take = above | tie
    if tl.sum(tie.to(tl.int32), axis=0) > need:
        take = above | (tie & (tl.cumsum(tie.to(tl.int32), axis=0) <= need))
    return take


@triton.jit
def _rank(keys):
    """Each int64 key's place in descending order (keys distinct, _KEY_NONE below all): pairwise, one
    reduction."""
    return tl.sum((keys[None, :] > keys[:, None]).to(tl.int32), axis=1)


@triton.jit
def _top_groups(part_max_ptr, group_max_ptr, scratch, num_segments, num_groups, k_groups,
                SEGS_P2: tl.constexpr, ROW_GROUPS: tl.constexpr, K: tl.constexpr):
    """Writes the k_groups groups of largest maximum of a row (the lower group first among equal
    maxima), ascending, to scratch[0:k_groups] (read after a barrier). The k-th largest segment max
    bounds the k-th largest group maximum from below (k segments each hold a group reaching their
    max), so with k_groups <= the segments only the groups at or above it (about 1.4 k on random rows)
    are ranked, pairwise, after a compaction in group order into scratch[K:5K]; with more than 4K of
    them, or more groups wanted than segments, `_largest` takes them from all the groups."""
    seg = tl.arange(0, SEGS_P2)
    seg_max = tl.load(part_max_ptr + seg, mask=seg < num_segments, other=0.0)
    seg_u = tl.where(seg < num_segments, _float_key(seg_max).to(tl.int64), -1)
    seg_rank = tl.sum(((seg_u[None, :] > seg_u[:, None]) |
                       ((seg_u[None, :] == seg_u[:, None]) & (seg[None, :] < seg[:, None]))).to(tl.int32), axis=1)
    floor = tl.max(tl.where(seg_rank == k_groups - 1, seg_u, -1), axis=0)  # -1: no bound
    g = tl.arange(0, ROW_GROUPS)
    group_max = tl.load(group_max_ptr + g, mask=g < num_groups, other=float("-inf"))
    u = tl.where(g < num_groups, _float_key(group_max).to(tl.int64), -1)
    near = (u >= floor) & (u >= 0)
    n = tl.sum(near.to(tl.int32), axis=0)
    if n <= 4 * K:
        tl.store(scratch + K + tl.cumsum(near.to(tl.int32), axis=0) - 1, _sortable_key(group_max, g), mask=near)
        tl.debug_barrier()  # the slots written above are read by other threads
        c = tl.arange(0, 4 * K)
        keys = tl.load(scratch + K + c, mask=c < n, other=_KEY_NONE)
        chosen = (_rank(keys) < k_groups) & (c < n)
        _, index = _key_parts(keys)
        tl.store(scratch + tl.cumsum(chosen.to(tl.int32), axis=0) - 1, index.to(tl.int64), mask=chosen)
    else:
        take = _largest(u, k_groups)
        tl.store(scratch + tl.cumsum(take.to(tl.int32), axis=0) - 1, g.to(tl.int64), mask=take)
    tl.debug_barrier()


@triton.jit
def _store_top_tokens(row_ptr, scratch, vocab_size, k, k_groups, lse, no_mass, out_ids_ptr, out_lp_ptr,
                      GROUP: tl.constexpr, K: tl.constexpr):
    """The row's k largest logits from the tokens of the groups at scratch[0:k_groups] (ascending),
    stored in order at out_ids_ptr / out_lp_ptr. With k groups, the k largest are at least the
    smallest of their maxima; the tokens there (about k on random rows) are compacted into
    scratch[5K:7K] and ranked pairwise; with more than 2K of them, or fewer groups than k (all the
    tokens are here), `_largest` takes the k first (the tile is in token order)."""
    j = tl.arange(0, K)
    group = tl.load(scratch + j, mask=j < k_groups, other=0)
    tok = group[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    live = (j < k_groups)[:, None] & (tok < vocab_size)
    x = tl.load(row_ptr + tok, mask=live, other=float("-inf")).to(tl.float32)
    x = tl.where(x == x, x, float("-inf"))
    u = tl.where(live, _float_key(x).to(tl.int64), -1)
    tau = tl.min(tl.where(j < k_groups, tl.max(u, axis=1), 2**32), axis=0)
    tau = tl.where(k_groups == k, tau, -1)
    tok = tl.reshape(tok, (K * GROUP,))
    x = tl.reshape(x, (K * GROUP,))
    u = tl.reshape(u, (K * GROUP,))
    near = (u >= tau) & (u >= 0)
    n = tl.sum(near.to(tl.int32), axis=0)
    if n > 2 * K:
        near = _largest(u, k)
        n = k
    tl.store(scratch + 5 * K + tl.cumsum(near.to(tl.int32), axis=0) - 1, _sortable_key(x, tok), mask=near)
    tl.debug_barrier()
    c = tl.arange(0, 2 * K)
    keys = tl.load(scratch + 5 * K + c, mask=c < n, other=_KEY_NONE)
    place = _rank(keys)
    values, ids = _key_parts(keys)
    keep = (place < k) & (c < n)
    tl.store(out_ids_ptr + place, ids, mask=keep)
    tl.store(out_lp_ptr + place, tl.where(no_mass, float("-inf"), values - lse), mask=keep)


@triton.jit
def _logprobs_combine_kernel(logits_ptr, logits_stride, token_ids_ptr, part_max_ptr, part_sum_ptr, part_larger_ptr,
                             part_vals_ptr, part_ids_ptr, scratch_ptr, topk_ids_ptr, topk_lp_ptr, token_lp_ptr,
                             ranks_ptr, vocab_size, num_segments, k, STAT_SEGS: tl.constexpr,
                             MERGE_SEGS: tl.constexpr, K: tl.constexpr, HAS_TOPK: tl.constexpr,
                             GROUP: tl.constexpr, GROUPS: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """Row t from its segments' parts, in segment order (chunks of STAT_SEGS, functions of V only):
    logsumexp, rank, the top k, and the four outputs. The top k with GROUPS (groups a segment):
    the k groups of largest maximum (the lower group first among ties) hold the row's k largest
    (were a group with one of them outside, k groups would each hold a larger key), so their tokens
    are gathered and the k largest taken; both through `_largest`, then compacted in token order
    through the row's scratch (K groups, then K keys; a barrier after each store) and ranked
    pairwise. Without GROUPS, the segments' K-key lists are merged, MERGE_SEGS at a time."""
    t = tl.program_id(0)
    base = t.to(tl.int64) * num_segments
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    token = tl.load(token_ids_ptr + t).to(tl.int64)
    token_ok = (token >= 0) & (token < vocab_size)
    x_token = tl.load(row_ptr + tl.where(token_ok, token, 0)).to(tl.float32)
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
        out = t.to(tl.int64) * k
        if GROUPS:
            scratch = scratch_ptr + t.to(tl.int64) * (8 * K)
            num_groups = (vocab_size + GROUP - 1) // GROUP
            k_groups = tl.minimum(k, num_groups)
            _top_groups(part_max_ptr + base, part_vals_ptr + base * GROUPS, scratch, num_segments, num_groups,
                        k_groups, STAT_SEGS, ROW_GROUPS, K)
            _store_top_tokens(row_ptr, scratch, vocab_size, k, k_groups, lse, no_mass, topk_ids_ptr + out,
                              topk_lp_ptr + out, GROUP, K)
        else:
            w = tl.arange(0, K)
            best = tl.full((K,), _KEY_NONE, dtype=tl.int64)
            for first in range(0, num_segments, MERGE_SEGS):
                seg = first + tl.arange(0, MERGE_SEGS)
                at = (base + seg)[:, None] * K + w[None, :]
                live = (seg < num_segments)[:, None]
                tokens = tl.load(part_ids_ptr + at, mask=live, other=-1)
                values = tl.load(part_vals_ptr + at, mask=live & (tokens >= 0), other=float("-inf"))
                keys = tl.where(tokens >= 0, _sortable_key(values, tokens), _KEY_NONE)
                chunk_best = tl.topk(tl.reshape(keys, (MERGE_SEGS * K,)), K)
                best = tl.topk(tl.reshape(tl.join(best, chunk_best), (2 * K,)), K)
            vals, ids = _key_parts(best)
            tl.store(topk_ids_ptr + out + w, ids, mask=w < k)
            tl.store(topk_lp_ptr + out + w, tl.where(no_mass, float("-inf"), vals - lse), mask=w < k)


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
    gps = _LOGPROBS_SEGMENT // _LOGPROBS_GROUP
    row_groups = next_power_of_2(S * gps)
    groups = gps if K <= _LOGPROBS_GROUPS_MAX_K and row_groups <= _LOGPROBS_ROW_GROUPS_MAX else 0
    part_max = logits.new_empty((T, S), dtype=torch.float32)
    part_sum = logits.new_empty((T, S), dtype=torch.float32)
    part_larger = logits.new_empty((T, S), dtype=torch.int64)
    lists = has_topk and not groups
    part_vals = logits.new_empty((T, S, groups or K) if has_topk else (1,), dtype=torch.float32)
    part_ids = logits.new_empty((T, S, K) if lists else (1,), dtype=torch.int32)
    scratch = logits.new_empty((T, 8 * K) if has_topk and groups else (1,), dtype=torch.int64)
    launch(_logprobs_segment_kernel, (T, S), logits, logits.stride()[0], token_ids, part_max, part_sum, part_larger,
           part_vals, part_ids, V, S, SEGMENT=_LOGPROBS_SEGMENT, GROUP=_LOGPROBS_GROUP, K=K,
           BLOCK=max(_LOGPROBS_BLOCK, K), HAS_TOPK=has_topk, GROUPS=groups, num_warps=_LOGPROBS_WARPS)
    merge_segs = min(next_power_of_2(S), max(1, _LOGPROBS_MERGE_KEYS // K))
    launch(_logprobs_combine_kernel, (T,), logits, logits.stride()[0], token_ids, part_max, part_sum, part_larger,
           part_vals, part_ids, scratch, *outs, V, S, num_logprobs, STAT_SEGS=min(next_power_of_2(S), 1024),
           MERGE_SEGS=merge_segs, K=K, HAS_TOPK=has_topk, GROUP=_LOGPROBS_GROUP, GROUPS=groups,
           ROW_GROUPS=row_groups if groups else 1, num_warps=_LOGPROBS_COMBINE_WARPS if groups or
           merge_segs * K <= 1024 else 8)
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
def _draw_kernel(logits_ptr, logits_stride, idx_mapping_ptr, top_k_ptr, top_p_ptr, ws_ptr, ws_stride, num_slots,
                 vocab_size, num_segments, temperature_ptr, min_p_ptr, seeds_ptr, output_lens_ptr, out_ptr, tol,
                 DRAW_SEGMENT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_V: tl.constexpr, SAMPLE: tl.constexpr,
                 SEG_CAP: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr, ARGMAX_STAGES: tl.constexpr,
                 REACH_SLOTS: tl.constexpr, FULL_LANES: tl.constexpr):
    """`sample`'s first launch, with the truncation launches' arguments. A row with a filter on and a
    temperature != 0 is drawn by those launches: program (t, 0) stores its bounds, which their
    first launch would (`store_row_bound`). Every other row: out[t] = argmax_j of logits[t, j] /
    temperature + gumbel(seed, position, j) over the tokens above -inf, the plain argmax of the
    logits for greedy rows (the filters always keep it); -1 without such a token or slot. With
    SPLIT, program (t, s) takes the DRAW_SEGMENT tokens of segment s and stores its (score, token)
    pair in the row's workspace (`store_draw_pair`), and the scan launch writes out[t]. STAGES and
    ARGMAX_STAGES: tiles in flight of the Gumbel draw and of the argmax; REACH_SLOTS and FULL_LANES:
    gumbel_argmax's."""
    t = tl.program_id(0)
    k, _, k_on, _, filtered, temp, min_p = row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
                                                          min_p_ptr, t, num_slots, vocab_size, PDL, True)
    logits_row = logits_ptr + t.to(tl.int64) * logits_stride
    ws_row = ws_ptr + t.to(tl.int64) * ws_stride
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if filtered:
        if tl.program_id(1) == 0:
            store_row_bound(logits_row, ws_row, vocab_size, num_segments, k, k_on, temp, min_p, SAMPLE, SEG_CAP)
    elif slot < 0:
        if not SPLIT:
            tl.store(out_ptr + t, -1)
    else:
        if SPLIT:
            begin = tl.program_id(1) * DRAW_SEGMENT
            end = tl.minimum(begin + DRAW_SEGMENT, vocab_size)
        else:
            begin = 0
            end = vocab_size
        key = stream_key(tl.load(seeds_ptr + slot).to(tl.int64), tl.load(output_lens_ptr + t).to(tl.int64))
        if temp == 0.0:
            score, token = argmax_tokens(logits_row, begin, end, BLOCK_V, ARGMAX_STAGES)
        else:
            score, token = gumbel_argmax(logits_row, begin, end, key, temp, tol, True, BLOCK_V, REACH_SLOTS, STAGES,
                                         FULL_LANES)
        if SPLIT:
            store_draw_pair(ws_row, tl.program_id(1), tl.num_programs(1), score, token)
        else:
            tl.store(out_ptr + t, token.to(tl.int64))


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
    args, plan, settings, pdl = filtered_draw_launches(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds,
                                                       output_lens, out, gumbel.GUMBEL_APPROX_TOL)
    split = T < settings.split_draw_max_t
    segment = settings.draw_segment_for(T)  # the scan launch reduces the pairs of the same segments
    if split:
        grid, block, stages, argmax_stages = ((T, cdiv(V, segment)), _SPLIT_DRAW_BLOCK_V, _SPLIT_DRAW_STAGES,
                                              _SPLIT_DRAW_STAGES)
    else:
        grid, block, stages, argmax_stages = (T, 1), _DRAW_BLOCK_V, _DRAW_STAGES, _ARGMAX_STAGES
    launch(_draw_kernel, grid, *args, DRAW_SEGMENT=segment, SPLIT=split,
           BLOCK_V=min(block, segment), SAMPLE=settings.sample, SEG_CAP=settings.seg_cap, PDL=pdl,
           STAGES=stages, ARGMAX_STAGES=argmax_stages, REACH_SLOTS=gumbel.DRAW_REACH_SLOTS.value,
           FULL_LANES=_DRAW_FULL_LANES, num_warps=_DRAW_WARPS)
    for kernel, grid, meta in plan:
        launch(kernel, grid, *args, **meta)
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
