"""Composed-PyTorch versions of each step, as a competent user writes them (in place, in the logits
dtype, no float64, no Python loops): the baselines every benchmark compares with.

They follow the op contracts on valid inputs (slots in range, ids in [0, V), counts in [0, W]) and
skip the corner rules a user would skip too: logit_bias does not restore the stop tokens of a row
that masking would leave without a finite logit, and duplicated stop ids may race in scatter_.
"""
from __future__ import annotations

import torch


def _listed(ids: torch.Tensor, num: torch.Tensor, idx_mapping: torch.Tensor):
    """Per row: the row's slot's ids (int64 [T, W]) and which of them are listed ([T, W] bool)."""
    slots = idx_mapping.long()
    ids = ids[slots].long()
    listed = torch.arange(ids.size(1), device=ids.device) < num[slots].unsqueeze(1)
    return ids, listed


def temperature(logits, idx_mapping, temperature):
    t = temperature[idx_mapping.long()]
    logits.div_(torch.where(t == 0, 1.0, t).unsqueeze(1).to(logits.dtype))


def min_p(logits, idx_mapping, min_p):
    threshold = logits.amax(dim=1, keepdim=True).float() + min_p[idx_mapping.long()].log().unsqueeze(1)
    logits.masked_fill_(logits < threshold, float("-inf"))


def top_k_top_p(logits, idx_mapping, top_k, top_p):
    """The sort-based step of the serving stacks: sort ascending, cut top-k, then top-p on the
    softmax's cumulative sum, and scatter back."""
    slots = idx_mapping.long()
    V = logits.size(1)
    k = top_k[slots].long()
    k = torch.where((k <= 0) | (k >= V), V, k)
    p = top_p[slots]
    sorted_logits, order = logits.sort(dim=1)
    kth = sorted_logits.gather(1, (V - k).unsqueeze(1))
    sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    cumulative = sorted_logits.softmax(dim=1, dtype=torch.float32).cumsum(dim=1)
    drop = cumulative <= (1 - p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, float("-inf"))
    logits.scatter_(1, order, sorted_logits)


def logit_bias(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values, num_bias,
               stop_ids, num_stop, min_tokens):
    """A bool mask scattered from the allowed ids + masked_fill_, scatter_add_ of the bias, and a
    gather / scatter of the stop ids."""
    T, V = logits.shape
    slots = idx_mapping.long()
    if allowed_ids.size(1) > 0:
        ids, listed = _listed(allowed_ids, num_allowed, idx_mapping)
        keep = torch.zeros(T, V + 1, dtype=torch.bool, device=logits.device)  # column V: unlisted entries
        keep.scatter_(1, torch.where(listed, ids, V), True)
        keep = keep[:, :V] | (num_allowed[slots] <= 0).unsqueeze(1)
        logits.masked_fill_(~keep, float("-inf"))
    if bias_ids.size(1) > 0:
        ids, listed = _listed(bias_ids, num_bias, idx_mapping)
        values = torch.where(listed, bias_values[slots], 0.0).to(logits.dtype)
        logits.scatter_add_(1, torch.where(listed, ids, 0), values)
    if stop_ids.size(1) > 0:
        ids, listed = _listed(stop_ids, num_stop, idx_mapping)
        active = listed & (output_lens < min_tokens[slots]).unsqueeze(1)
        ids = torch.where(listed, ids, 0)
        logits.scatter_(1, ids, torch.where(active, float("-inf"), logits.gather(1, ids)))


def apply_token_bitmask(logits, bitmask, idx_mapping=None):
    T, V = logits.shape
    rows = bitmask if idx_mapping is None else bitmask[idx_mapping.long()]
    bits = (rows.unsqueeze(2) >> torch.arange(32, device=rows.device, dtype=torch.int32)) & 1
    logits.masked_fill_(bits.reshape(T, -1)[:, :V] == 0, float("-inf"))


def sample(logits, idx_mapping, temperature, top_k, top_p, min_p_, seeds, output_lens):
    """The composed sampler of the serving stacks: temperature, min_p, the sort-based top-k/top-p above,
    softmax and an exponential race (argmax of p / q, q ~ Exp(1): a draw from p); greedy rows take the
    argmax. Not seeded per request (the global generator), so not batch-invariant; `logits` is kept."""
    slots = idx_mapping.long()
    t = temperature[slots]
    greedy = t == 0
    x = logits.float() / torch.where(greedy, 1.0, t).unsqueeze(1)
    min_p(x, idx_mapping, min_p_)
    top_k_top_p(x, idx_mapping, top_k, top_p)
    probs = x.softmax(dim=1)
    race = (probs / torch.empty_like(probs).exponential_()).argmax(dim=1)
    return torch.where(greedy, logits.argmax(dim=1), race)


def logprobs(logits, token_ids, num_logprobs):
    """log_softmax materialised as [T, V] float32, topk, a gather and a count of larger logprobs."""
    lp = logits.float().log_softmax(dim=1)
    top = lp.topk(num_logprobs, dim=1)
    token_lp = lp.gather(1, token_ids.long().unsqueeze(1)).squeeze(1)
    ranks = (lp > token_lp.unsqueeze(1)).sum(dim=1) + 1
    return top.indices, top.values, token_lp, ranks


def rejection_sample(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature, seeds, output_lens,
                     max_spec_len):
    """Speculative verification composed of batched PyTorch ops over every row: softmax of all N + B
    target rows, the acceptance test and a residual draw (exponential race) at every draft position,
    then a cumulative product finds each request's first rejection. Not seeded per request (the global
    generator); valid layouts only (counts in [0, max_spec_len], cu from 0 to N)."""
    B, N = cu_num_draft.numel() - 1, draft_token_ids.numel()
    S, dev = max_spec_len, target_logits.device
    cu = cu_num_draft.long()
    counts = cu[1:] - cu[:-1]
    req = torch.repeat_interleave(torch.arange(B, device=dev), counts, output_size=N)
    pos = torch.arange(N, device=dev) - cu[:-1][req]
    draft_rows = torch.arange(N, device=dev) + req
    bonus_rows = cu[1:] + torch.arange(B, device=dev)
    x = target_logits.float()
    probs = x.softmax(dim=1)
    argmax = x.argmax(dim=1)
    drafts = draft_token_ids.long()
    p_draft = probs[draft_rows]
    p_x = p_draft.gather(1, drafts.unsqueeze(1)).squeeze(1)
    if draft_probs is None:
        q = torch.zeros_like(p_draft).scatter_(1, drafts.unsqueeze(1), 1.0)
    else:
        q = draft_probs
    q_x = q.gather(1, drafts.unsqueeze(1)).squeeze(1)
    greedy = temperature == 0
    accept = torch.where(greedy[req], drafts == argmax[draft_rows], torch.rand(N, device=dev) * q_x < p_x)
    residual = (p_draft - q).clamp_(min=0)
    recovered = (residual / torch.empty_like(residual).exponential_()).argmax(dim=1)
    recovered = torch.where(greedy[req], argmax[draft_rows], recovered)
    p_bonus = probs[bonus_rows]
    bonus = torch.where(greedy, argmax[bonus_rows], (p_bonus / torch.empty_like(p_bonus).exponential_()).argmax(dim=1))
    accepted = torch.zeros(B, S, dtype=torch.int32, device=dev)
    accepted[req, pos] = accept.int()
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)
    draft_mat = torch.full((B, S + 1), -1, dtype=torch.int64, device=dev)
    draft_mat[req, pos] = drafts
    recovered_mat = torch.zeros(B, S + 1, dtype=torch.int64, device=dev)
    recovered_mat[req, pos] = recovered
    places = torch.arange(S + 1, device=dev)
    out = torch.where(places < num_accepted.unsqueeze(1), draft_mat, -1)
    last = num_accepted.unsqueeze(1)
    final = torch.where(num_accepted < counts, recovered_mat.gather(1, last).squeeze(1), bonus)
    out.scatter_(1, last, final.unsqueeze(1))
    return out, (num_accepted + 1).int()


BASELINES = {
    "temperature": temperature,
    "min_p": min_p,
    "top_k_top_p": top_k_top_p,
    "logit_bias": logit_bias,
    "apply_token_bitmask": apply_token_bitmask,
}
