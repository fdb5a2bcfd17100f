"""PyTorch references that define the semantics of every op (see docs/ops.md).

Each reference takes the op's arguments, leaves them untouched and returns the result: for an
in-place op, the processed logits as a new tensor of `compute_dtype`. They are batched
compositions of PyTorch ops that run on any device: float64 (the default) is the reference the
tests compare against; with `compute_dtype=torch.float32` the same functions are the
composed-PyTorch baseline that the benchmarks time.
"""
from __future__ import annotations

import torch

from .state import pack_bitmask  # noqa: F401  (the layout helper; tests and benchmarks use it from here)

NEG_INF = float("-inf")


def _slots(idx_mapping: torch.Tensor | None, T: int, num_slots: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot of each row clamped into [0, R), whether the row's slot was in range)."""
    slots = torch.arange(T, device=device) if idx_mapping is None else idx_mapping.long()
    valid = (slots >= 0) & (slots < num_slots)
    return slots.clamp(0, num_slots - 1), valid


def _listed(ids: torch.Tensor, num: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor, vocab_size: int):
    """Each row's ragged list: (ids [T, W] int64, listed [T, W] bool), dropping ids outside [0, V)."""
    width = ids.size(1)
    row_ids = ids[slots].long()
    listed = torch.arange(width, device=ids.device) < num[slots].clamp(0, width).unsqueeze(1)
    return row_ids, listed & valid.unsqueeze(1) & (row_ids >= 0) & (row_ids < vocab_size)


def _token_mask(row_ids: torch.Tensor, listed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [T, V]: the listed tokens of each row."""
    T = row_ids.size(0)
    mask = torch.zeros(T, vocab_size + 1, dtype=torch.bool, device=row_ids.device)
    return mask.scatter_(1, torch.where(listed, row_ids, vocab_size), True)[:, :vocab_size]


def logit_bias(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values,
               num_bias, stop_ids, num_stop, min_tokens, *, compute_dtype=torch.float64) -> torch.Tensor:
    T, V = logits.shape
    out = logits.to(compute_dtype, copy=True)
    slots, valid = _slots(idx_mapping, T, min_tokens.size(0), logits.device)

    ids, listed = _listed(allowed_ids, num_allowed, slots, valid, V)
    restricted = valid & (num_allowed[slots].clamp(0, allowed_ids.size(1)) > 0)  # a count clamped to width 0: no list
    out.masked_fill_(restricted.unsqueeze(1) & ~_token_mask(ids, listed, V), NEG_INF)

    ids, listed = _listed(bias_ids, num_bias, slots, valid, V)
    padded = torch.cat([out, out.new_zeros(T, 1)], dim=1)  # column V takes the unlisted entries
    target = torch.where(listed, ids, V)
    biased = padded.gather(1, target) + bias_values[slots].to(compute_dtype)
    out = padded.scatter(1, target, biased)[:, :V]  # a duplicated id gets one of its biases

    ids, listed = _listed(stop_ids, num_stop, slots, valid, V)
    stops = _token_mask(ids, listed, V)
    active = valid & (output_lens.long() < min_tokens[slots])
    others_finite = (torch.isfinite(out) & ~stops).any(dim=1)
    return out.masked_fill_(stops & (active & others_finite).unsqueeze(1), NEG_INF)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [rows, ceil(V/32)] bitmask -> bool [rows, V]; bit j of word w is token 32 * w + j."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def apply_token_bitmask(logits, bitmask, idx_mapping=None, *, compute_dtype=torch.float64) -> torch.Tensor:
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, bitmask.size(0), logits.device)
    banned = ~unpack_bitmask(bitmask[slots], V) & valid.unsqueeze(1)
    return logits.to(compute_dtype, copy=True).masked_fill_(banned, NEG_INF)


def temperature(logits, idx_mapping, temperature, *, compute_dtype=torch.float64) -> torch.Tensor:
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, temperature.size(0), logits.device)
    temp = temperature[slots].to(compute_dtype)
    active = valid & (temp != 0)  # temperature 0: a greedy row, unchanged
    out = logits.to(compute_dtype, copy=True)
    return torch.where(active.unsqueeze(1), out / torch.where(active, temp, 1.0).unsqueeze(1), out)


def min_p(logits, idx_mapping, min_p, *, compute_dtype=torch.float64) -> torch.Tensor:
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, min_p.size(0), logits.device)
    p = min_p[slots].to(compute_dtype)
    out = logits.to(compute_dtype, copy=True)
    row_max = torch.where(out.isnan(), NEG_INF, out).amax(dim=1)  # NaN is never the maximum
    active = valid & (p != 0) & (row_max > NEG_INF)  # min_p 0 is off; a row without a maximum is unchanged
    threshold = row_max + torch.log(p)
    return out.masked_fill_(active.unsqueeze(1) & (out < threshold.unsqueeze(1)), NEG_INF)


def top_k_top_p(logits, idx_mapping, top_k, top_p, *, compute_dtype=torch.float64) -> torch.Tensor:
    """Keeps, per row, the tokens >= the k-th largest logit, then of those the tokens >= the value at
    which the cumulative probability (renormalised over the kept set, counted from the most
    probable) first reaches top_p; ties at either boundary are kept, everything else (NaN too)
    becomes -inf. top_k <= 0 or >= V and top_p >= 1 are off; a row with no non-NaN logit above -inf
    is unchanged."""
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, top_k.size(0), logits.device)
    k, p = top_k[slots].long(), top_p[slots].to(compute_dtype)
    k_on, p_on = valid & (k > 0) & (k < V), valid & (p < 1)
    out = logits.to(compute_dtype, copy=True)
    ranked = torch.where(out.isnan(), NEG_INF, out).sort(dim=1, descending=True).values
    row_max = ranked[:, 0]
    kth = ranked.gather(1, (k.clamp(1, V) - 1).unsqueeze(1)).squeeze(1)
    tau_k = torch.where(k_on, kth, NEG_INF)
    in_k = ranked >= tau_k.unsqueeze(1)
    shift = torch.where(row_max > NEG_INF, row_max, 0.0).unsqueeze(1)  # no -inf - -inf in empty rows
    weights = torch.where(in_k, torch.exp(ranked - shift), 0.0)
    mass = weights.cumsum(dim=1)
    first = (mass < (p * mass[:, -1]).unsqueeze(1)).sum(dim=1).clamp(max=V - 1)  # first index reaching p
    tau_p = torch.where(p_on, ranked.gather(1, first.unsqueeze(1)).squeeze(1), NEG_INF)
    threshold = torch.maximum(tau_k, tau_p)
    active = (k_on | p_on) & (row_max > NEG_INF)
    return out.masked_fill_(active.unsqueeze(1) & ~(out >= threshold.unsqueeze(1)), NEG_INF)


def penalties(logits, idx_mapping, prompt_mask, output_mask, output_counts, repetition_penalty,
              frequency_penalty, presence_penalty, *, compute_dtype=torch.float64) -> torch.Tensor:
    """Dense over [T, V] (the composed-PyTorch form): counts are gathered per row and count only
    where the output bit is set; rows whose three penalties are off are unchanged."""
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, repetition_penalty.size(0), logits.device)
    rep = repetition_penalty[slots].to(compute_dtype).unsqueeze(1)
    freq = frequency_penalty[slots].to(compute_dtype).unsqueeze(1)
    pres = presence_penalty[slots].to(compute_dtype).unsqueeze(1)
    on = valid & ((repetition_penalty[slots] != 1) | (frequency_penalty[slots] != 0) | (presence_penalty[slots] != 0))
    output = unpack_bitmask(output_mask[slots], V) & on.unsqueeze(1)
    seen = (unpack_bitmask(prompt_mask[slots], V) & on.unsqueeze(1)) | output
    counts = torch.where(output, output_counts[slots], 0).to(compute_dtype)
    out = logits.to(compute_dtype, copy=True)
    out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
    return torch.where(output, out - (freq * counts + pres), out)


def update_output_counts(output_counts, output_mask, idx_mapping, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The state after the update: (new output_counts, new output_mask), the inputs untouched."""
    R, V = output_counts.shape
    slots, tokens = idx_mapping.long(), token_ids.long()
    ok = (slots >= 0) & (slots < R) & (tokens >= 0) & (tokens < V)
    flat = torch.where(ok, slots * V + tokens, R * V)  # entry R * V takes the rows that count nothing
    added = torch.zeros(R * V + 1, dtype=torch.int64, device=output_counts.device)
    added.index_add_(0, flat, torch.ones_like(flat))
    added = added[: R * V].view(R, V)
    counts = (output_counts.long() + added).to(torch.int32)
    return counts, output_mask | pack_bitmask(added > 0)


def bad_words(logits, idx_mapping, bad_word_ids, bad_word_offsets, num_bad_words, history, history_lens, *,
              compute_dtype=torch.float64) -> torch.Tensor:
    """Compares every listed sequence's prefix with the end of the row's history at once ([T, N, W - 1])."""
    T, V = logits.shape
    W, N, L = bad_word_ids.size(1), bad_word_offsets.size(1) - 1, history.size(1)
    out = logits.to(compute_dtype, copy=True)
    if W == 0 or N == 0:
        return out
    slots, valid = _slots(idx_mapping, T, num_bad_words.size(0), logits.device)
    ids = bad_word_ids[slots].long()  # [T, W]
    offsets = bad_word_offsets[slots].long().clamp(0, W)  # [T, N + 1]
    start, end = offsets[:, :-1], offsets[:, 1:]
    prefix = end - start - 1  # tokens to match; < 0 for an empty sequence
    hist_len = history_lens.long().clamp(0, L).unsqueeze(1)  # [T, 1]
    listed = torch.arange(N, device=logits.device) < num_bad_words[slots].long().clamp(0, N).unsqueeze(1)
    live = valid.unsqueeze(1) & listed & (prefix >= 0) & (prefix <= hist_len)
    last = ids.gather(1, (end - 1).clamp(0, W - 1))
    live &= (last >= 0) & (last < V)
    k = torch.arange(max(W - 1, 1), device=logits.device)  # a prefix is at most W - 1 tokens
    compared = k < prefix.unsqueeze(2)  # [T, N, K]
    word_tok = ids.gather(1, (start.unsqueeze(2) + k).clamp(0, W - 1).flatten(1)).view(compared.shape)
    if L > 0:
        hist_pos = (hist_len.unsqueeze(2) - prefix.unsqueeze(2) + k).clamp(0, L - 1)
        hist_tok = history[slots].long().gather(1, hist_pos.flatten(1)).view(compared.shape)
    else:  # only one-token sequences can match
        hist_tok = torch.zeros_like(word_tok)
    matched = live & ~(compared & (word_tok != hist_tok)).any(dim=2)
    banned = torch.zeros(T, V + 1, dtype=torch.bool, device=logits.device)
    banned.scatter_(1, torch.where(matched, last, V), True)
    return out.masked_fill_(banned[:, :V], NEG_INF)


# ----------------------------------------------------------------------------------------------
# The random stream of sampling (the definition; see torch_sampling_ops/sampling.py), in int64
# arithmetic masked to 32 bits: a wrapped int64 product keeps the low 32 bits of the exact one.

_U32 = 0xFFFFFFFF


def _mix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _U32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


def stream_key(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """uint32 key (held in int64) of the stream of each (seed, position), int64 tensors."""
    s, p = seeds.long(), positions.long()
    k = _mix32((s & _U32) ^ 0x9E3779B9)
    k = _mix32(k ^ ((s >> 32) & _U32))
    k = _mix32(k ^ (p & _U32))
    return _mix32(k ^ ((p >> 32) & _U32))


def stream_bits(key: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """uint32 random bits (held in int64) of token indices `tokens` of the streams `key` (broadcast)."""
    return _mix32((_mix32(key ^ tokens.long()) + 0x6A09E667) & _U32)


def stream_uniform(bits: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """u = ((bits >> 9) + 1/2) / 2**23 in (0, 1), exact in float32."""
    return ((bits >> 9).to(dtype) + 0.5) * 2.0**-23


def stream_gumbel(bits: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Gumbel noise -log(-log(u)) of bits: a block's noise less log 4 (below)."""
    return -torch.log(-torch.log(stream_uniform(bits, dtype)))


# Block b of a stream (the tokens 4b .. 4b + 3) takes its bits at counter BLOCK_COUNTER | b, above
# every token index and ACCEPT_TOKEN.
BLOCK_COUNTER = 2**31


def stream_noise(key: torch.Tensor, tokens: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Gumbel noise of token indices `tokens` of the streams `key` (broadcast), exponentials shared
    by blocks of 4 tokens. Block b = j >> 2 has bits hb = stream_bits(key, BLOCK_COUNTER | b), its
    first arrival pos = hb & 3 and W = -log(u(hb)) / 4; token j has E = W at pos, else W - log(u(bits
    of j)), and noise -log(E). The E of a block are iid Exp(1) (the least of 4 is Exp(4), uniform in
    position, the others it plus fresh Exp(1)), so the noise is iid standard Gumbel; every token of
    block b has noise at most -log(W), the pos token exactly that."""
    tokens = tokens.long()
    block_bits = stream_bits(key, BLOCK_COUNTER | (tokens >> 2))
    w = -torch.log(stream_uniform(block_bits, dtype)) * 0.25
    e_token = -torch.log(stream_uniform(stream_bits(key, tokens), dtype))
    e = torch.where((tokens & 3) == (block_bits & 3), w, w + e_token)
    return -torch.log(e)


def logprobs(logits, token_ids, num_logprobs, *, compute_dtype=torch.float64):
    """(topk_ids, topk_logprobs, token_logprobs, token_ranks): the log-softmax of each row (NaN read
    as -inf; every logprob -inf in a row without a logit above -inf), its k largest entries (larger
    first, lower index among ties), the given token's logprob and rank (1 + count of strictly larger
    logits); -inf and rank -1 for a token id outside [0, V)."""
    T, V = logits.shape
    x = logits.to(compute_dtype)
    x = torch.where(x.isnan(), NEG_INF, x)
    lse = torch.logsumexp(x, dim=1, keepdim=True)
    lp = torch.where(lse > NEG_INF, x - lse, NEG_INF)
    # A stable sort by descending value keeps the lower index first among ties.
    order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :num_logprobs]
    tokens = token_ids.long()
    ok = (tokens >= 0) & (tokens < V)
    safe = tokens.clamp(0, V - 1).unsqueeze(1)
    x_token = x.gather(1, safe)
    ranks = torch.where(ok, 1 + (x > x_token).sum(dim=1), -1)
    token_lp = torch.where(ok, lp.gather(1, safe).squeeze(1), NEG_INF)
    return order, lp.gather(1, order), token_lp, ranks


def filtered_logits(logits, idx_mapping, temperature_, top_k, top_p, min_p_, *, compute_dtype=torch.float64):
    """The logits `sample` draws from: divided by the temperature, then min_p, then top_k_top_p
    (greedy rows as given); -inf marks a removed token."""
    out = temperature(logits, idx_mapping, temperature_, compute_dtype=compute_dtype)
    out = min_p(out, idx_mapping, min_p_, compute_dtype=compute_dtype)
    return top_k_top_p(out, idx_mapping, top_k, top_p, compute_dtype=compute_dtype)


def sample(logits, idx_mapping, temperature_, top_k, top_p, min_p_, seeds, output_lens, *,
           compute_dtype=torch.float64) -> torch.Tensor:
    """The token of each row: argmax over the filtered tokens of filtered logit + Gumbel noise of the
    stream (seed of the slot, output_lens of the row, token index); the argmax for greedy rows (the
    lowest index among ties); -1 for a row without a logit above -inf or whose slot is out of range."""
    T, V = logits.shape
    slots, valid = _slots(idx_mapping, T, temperature_.size(0), logits.device)
    x = filtered_logits(logits, idx_mapping, temperature_, top_k, top_p, min_p_, compute_dtype=compute_dtype)
    live = x > NEG_INF  # false for NaN
    greedy = (temperature_[slots] == 0).unsqueeze(1)
    key = stream_key(seeds[slots], output_lens).unsqueeze(1)
    noise = stream_noise(key, torch.arange(V, device=logits.device), compute_dtype)
    score = torch.where(live, torch.where(greedy, x, x + noise), NEG_INF)
    # argmax returns the first maximal index: the lowest among ties.
    token = torch.where(live.any(dim=1) & valid, score.argmax(dim=1), -1)
    return token


# The token index whose stream bits give a speculative position's acceptance uniform: outside every
# vocabulary (token indices are < V < 2**31 - 1), so it is independent of the Gumbel noise of the
# same position's residual draw.
ACCEPT_TOKEN = 2**31 - 1


def _spec_layout(cu_num_draft: torch.Tensor, num_drafts: int, max_spec_len: int):
    """(first draft row, clamped draft count) of each request, as Python ints."""
    cu = cu_num_draft.long().cpu().tolist()
    out = []
    for i in range(len(cu) - 1):
        lo = min(max(cu[i], 0), num_drafts)
        hi = min(max(cu[i + 1], 0), num_drafts)
        out.append((lo, min(max(hi - lo, 0), max_spec_len)))
    return out


def rejection_sample(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds, output_lens,
                     max_spec_len, *, compute_dtype=torch.float64):
    """(output_token_ids int64 [B, max_spec_len + 1], num_emitted int32 [B]) of speculative decoding's
    verification step; a loop over requests and positions (the definition, not fast).

    Request i has draft rows lo_i .. lo_i + n_i - 1 (lo_i = clamp(cu[i], 0, N), n_i = clamp(clamp(cu[i + 1],
    0, N) - lo_i, 0, max_spec_len)) and target rows lo_i + i + j, j = 0 .. n_i (the last is the bonus row).
    Target rows are used as given (temperature already applied; NaN read as -inf).
    - Greedy (temperature == 0): accept draft j while it equals the row's argmax (lowest index among
      ties); at the first mismatch, or at the bonus row, emit the argmax and stop.
    - Random: p = softmax(row), q = draft_probs row (one-hot of the draft token without draft_probs).
      Accept draft x when u * q(x) < p(x), u the uniform of the stream (seed, output_lens + j) at token
      index ACCEPT_TOKEN (a draft id outside [0, V) is rejected). At the first rejection emit
      argmax_k log(r_k) + g_k over r = max(p - q, 0) > 0, g the Gumbel noise of the same stream at token
      k (if r has no positive entry, argmax_k x_k + g_k, a draw from p); at the bonus row emit
      argmax_k x_k + g_k with the stream at output_lens + n_i, as `sample` draws.
    A row with no logit above -inf emits -1 and stops the request; -1 is not counted in num_emitted.
    """
    B = cu_num_draft.numel() - 1
    N = draft_token_ids.numel()
    V = target_logits.shape[1]
    dev = target_logits.device
    out = torch.full((B, max_spec_len + 1), -1, dtype=torch.int64, device=dev)
    num = torch.zeros(B, dtype=torch.int32, device=dev)
    x_all = target_logits.to(compute_dtype)
    x_all = torch.where(x_all.isnan(), NEG_INF, x_all)
    drafts = draft_token_ids.long().cpu().tolist()
    tokens = torch.arange(V, device=dev)
    for i, (lo, n) in enumerate(_spec_layout(cu_num_draft, N, max_spec_len)):
        greedy = bool(temperature[i] == 0)
        emitted = []
        for j in range(n + 1):
            x = x_all[lo + i + j]
            live = x > NEG_INF
            bonus = j == n
            d = -1 if bonus else drafts[lo + j]
            d_ok = 0 <= d < V
            if not bool(live.any()):
                emitted.append(-1)
                break
            if greedy:
                tok = int(x.argmax())  # the first maximal index
                if d_ok and d == tok:
                    emitted.append(d)
                    continue
                emitted.append(tok)
                break
            key = stream_key(seeds[i : i + 1], output_lens[i : i + 1] + j)
            g = stream_noise(key, tokens, compute_dtype)
            from_p = int(torch.where(live, x + g, NEG_INF).argmax())
            if bonus:
                emitted.append(from_p)
                break
            p = torch.softmax(x, dim=0)
            if draft_probs is None:
                q = torch.zeros(V, dtype=compute_dtype, device=dev)
                if d_ok:
                    q[d] = 1.0
            else:
                q = draft_probs[lo + j].to(compute_dtype)
            if d_ok:
                u = stream_uniform(stream_bits(key, torch.tensor(ACCEPT_TOKEN, device=dev)), compute_dtype)
                if bool(u * q[d] < p[d]):
                    emitted.append(d)
                    continue
            r = (p - q).clamp(min=0)
            has = r > 0  # false for NaN
            if bool(has.any()):
                emitted.append(int(torch.where(has, torch.log(r) + g, NEG_INF).argmax()))
            else:
                emitted.append(from_p)
            break
        out[i, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
        num[i] = sum(1 for t in emitted if t >= 0)
    return out, num


def sampler_step(logits, idx_mapping, token_bitmask, state, *, max_model_len, max_num_logprobs=None,
                 processed_logprobs=False, compute_dtype=torch.float64):
    """`Sampler.step` on the state tensors of `state` (a mapping named as the Sampler's attributes:
    temperature, top_k, ..., output_counts, output_mask, history, output_lens), all left untouched.
    Returns (processed logits, tokens, logprobs or None, the recorded state):
    - the processed logits: the token bitmask, logit_bias, bad_words and penalties applied in that
      order, each result stored in the logits dtype as the in-place ops store it (a row's history
      length is its output length, and 0 past max_model_len, where the history stops);
    - the tokens: `sample`'s on them;
    - logprobs with k = max_num_logprobs: of the logits as given, or with processed_logprobs of the
      processed ones filtered as `sample` filters them;
    - the recorded state, the dict of output_counts, output_mask, history and output_lens after each
      row's token (not -1) is counted, written at its output length in the history (below
      max_model_len) and its output length advanced."""
    s = state
    T, V = logits.shape
    R = s["output_lens"].size(0)
    slots, valid = _slots(idx_mapping, T, R, logits.device)
    output_lens = torch.where(valid, s["output_lens"][slots], 0)
    kw = dict(compute_dtype=compute_dtype)
    x = logits
    if token_bitmask is not None:
        x = apply_token_bitmask(x, token_bitmask, **kw).to(logits.dtype)
    x = logit_bias(x, idx_mapping, output_lens, s["allowed_ids"], s["num_allowed"], s["bias_ids"], s["bias_values"],
                   s["num_bias"], s["stop_ids"], s["num_stop"], s["min_tokens"], **kw).to(logits.dtype)
    x = bad_words(x, idx_mapping, s["bad_word_ids"], s["bad_word_offsets"], s["num_bad_words"], s["history"],
                  torch.where(output_lens <= max_model_len, output_lens, 0), **kw).to(logits.dtype)
    x = penalties(x, idx_mapping, s["prompt_mask"], s["output_mask"], s["output_counts"], s["repetition_penalty"],
                  s["frequency_penalty"], s["presence_penalty"], **kw).to(logits.dtype)
    params = (idx_mapping, s["temperature"], s["top_k"], s["top_p"], s["min_p"])
    tokens = sample(x, *params, s["seeds"], output_lens, **kw)
    lp = None
    if max_num_logprobs is not None:
        source = filtered_logits(x, *params, **kw) if processed_logprobs else logits
        lp = logprobs(source, tokens, max_num_logprobs, **kw)
    counts, mask = update_output_counts(s["output_counts"], s["output_mask"], idx_mapping, tokens)
    history, lens = s["history"].clone(), s["output_lens"].clone()
    for t in range(T):
        if bool(valid[t]) and int(tokens[t]) >= 0:
            r, n = int(slots[t]), int(output_lens[t])
            if n < max_model_len:
                history[r, n] = int(tokens[t])
            lens[r] = n + 1
    return x, tokens, lp, {"output_counts": counts, "output_mask": mask, "history": history, "output_lens": lens}
