"""Float64 PyTorch references that define the semantics of every op (see docs/ops.md).

Each reference takes the op's arguments, leaves them untouched and returns the result: for an
in-place op, the processed logits as a new float64 tensor. They favour clarity over speed: the
tests and benchmarks compare the kernels against them on small and mid-size inputs.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _ragged_row(ids: torch.Tensor, num: torch.Tensor, slot: int, vocab_size: int) -> torch.Tensor:
    """The listed ids of one slot (count clamped to [0, W]), without ids outside [0, V)."""
    n = min(max(int(num[slot]), 0), ids.size(1))
    row = ids[slot, :n].long()
    return row[(row >= 0) & (row < vocab_size)]


def _slot(idx_mapping: torch.Tensor | None, t: int, num_slots: int) -> int | None:
    r = t if idx_mapping is None else int(idx_mapping[t])
    return r if 0 <= r < num_slots else None


def logit_bias(logits, idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values,
               num_bias, stop_ids, num_stop, min_tokens) -> torch.Tensor:
    out = logits.double().clone()
    T, V = out.shape
    R = min_tokens.size(0)
    for t in range(T):
        r = _slot(idx_mapping, t, R)
        if r is None:
            continue
        row = out[t]
        allowed = _ragged_row(allowed_ids, num_allowed, r, V)
        if allowed.numel() > 0:
            keep = torch.zeros(V, dtype=torch.bool)
            keep[allowed] = True
            row.masked_fill_(~keep, NEG_INF)
        n_bias = min(max(int(num_bias[r]), 0), bias_ids.size(1))
        ids, values = bias_ids[r, :n_bias].long(), bias_values[r, :n_bias].double()
        ok = (ids >= 0) & (ids < V)
        ids, values = ids[ok], values[ok]
        row[ids] = row[ids] + values  # a duplicated id gets one of its biases (here: the last)
        stops = _ragged_row(stop_ids, num_stop, r, V)
        if stops.numel() > 0 and int(output_lens[t]) < int(min_tokens[r]):
            others = torch.ones(V, dtype=torch.bool)
            others[stops] = False
            if bool(torch.isfinite(row[others]).any()):
                row[stops] = NEG_INF
    return out


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [rows, ceil(V/32)] bitmask -> bool [rows, V]; bit j of word w is token 32 * w + j."""
    bits = (bitmask.long().unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_token_bitmask(logits, bitmask, idx_mapping=None) -> torch.Tensor:
    out = logits.double().clone()
    allowed = unpack_bitmask(bitmask.cpu(), out.size(1))
    for t in range(out.size(0)):
        r = _slot(idx_mapping, t, bitmask.size(0))
        if r is not None:
            out[t].masked_fill_(~allowed[r].to(out.device), NEG_INF)
    return out
