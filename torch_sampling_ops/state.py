"""Host-side helpers that keep the per-slot state of `penalties`, `update_output_counts` and
`bad_words` when a request is added to a slot or a slot is reused.

They run once per request, not per step: each is a few device ops on the slot's rows (no `.item()`,
no data-dependent shapes, nothing that waits for the device), so they can be called while earlier
steps are still running. Python lists given to them are copied to the device once.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def host_values(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A CPU tensor of `values` (a sequence) for a copy to `device`: pinned when that is a GPU, so
    that a `non_blocking` copy does not wait."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory() if device.type == "cuda" else t


def _as_ids(token_ids, device: torch.device) -> torch.Tensor:
    """A 1-D int64 tensor of token ids on `device` (a list is copied once, without waiting)."""
    if isinstance(token_ids, torch.Tensor):
        return token_ids.reshape(-1).to(device=device, dtype=torch.int64, non_blocking=True)
    return host_values(list(token_ids), torch.int64, device).to(device, non_blocking=True)


def pack_bitmask(bits: torch.Tensor) -> torch.Tensor:
    """bool [rows, V] -> int32 [rows, ceil(V/32)] token bitmask (bit j of word w is token 32 * w + j)."""
    rows, V = bits.shape
    words = (V + 31) // 32
    padded = torch.zeros(rows, words * 32, dtype=torch.int64, device=bits.device)
    padded[:, :V] = bits.long()
    packed = (padded.view(rows, words, 32) << torch.arange(32, device=bits.device)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def pack_token_bitmask(token_ids, vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """int32 [ceil(V/32)] bitmask with the bit of every listed token set; ids outside [0, V) are ignored,
    duplicates are fine."""
    device = torch.device(device)
    ids = _as_ids(token_ids, device)
    bits = torch.zeros(vocab_size + 1, dtype=torch.bool, device=device)  # the last entry takes ignored ids
    bits[torch.where((ids >= 0) & (ids < vocab_size), ids, vocab_size)] = True
    return pack_bitmask(bits[None, :vocab_size])[0]


def set_prompt_mask(prompt_mask: torch.Tensor, slot: int, prompt_token_ids, vocab_size: int) -> None:
    """Writes row `slot` of `prompt_mask` (int32 [R, ceil(V/32)]): the bits of the prompt's tokens."""
    prompt_mask[slot].copy_(pack_token_bitmask(prompt_token_ids, vocab_size, prompt_mask.device))


def clear_slot(slot: int, output_counts: torch.Tensor, output_mask: torch.Tensor,
               prompt_mask: torch.Tensor | None = None) -> None:
    """Zeroes a reused slot's output counts and output mask (and its prompt mask, if given)."""
    output_counts[slot].zero_()
    output_mask[slot].zero_()
    if prompt_mask is not None:
        prompt_mask[slot].zero_()


def set_bad_words(bad_word_ids: torch.Tensor, bad_word_offsets: torch.Tensor, num_bad_words: torch.Tensor,
                  slot: int, sequences: Sequence[Sequence[int]]) -> None:
    """Packs a request's banned sequences into row `slot` of the flattened layout of `bad_words`.

    bad_word_ids ``[R, W]`` gets the sequences back to back, bad_word_offsets ``[R, N + 1]`` their
    starts (entry ``i + 1`` is where sequence ``i`` ends; entries past the last sequence repeat its
    end) and num_bad_words ``[R]`` their number. Empty sequences are dropped. Raises ValueError if
    the sequences need more than ``N`` entries or ``W`` ids.
    """
    sequences = [list(s) for s in sequences if len(s) > 0]
    W, N = bad_word_ids.size(1), bad_word_offsets.size(1) - 1
    flat = [tok for s in sequences for tok in s]
    if len(sequences) > N:
        raise ValueError(f"set_bad_words: {len(sequences)} sequences do not fit 'bad_word_offsets' (N = {N})")
    if len(flat) > W:
        raise ValueError(f"set_bad_words: {len(flat)} ids do not fit 'bad_word_ids' (W = {W})")
    offsets = [0]
    for s in sequences:
        offsets.append(offsets[-1] + len(s))
    offsets += [offsets[-1]] * (N + 1 - len(offsets))
    device = bad_word_ids.device
    for dst, src in ((bad_word_ids[slot], host_values(flat + [0] * (W - len(flat)), bad_word_ids.dtype, device)),
                     (bad_word_offsets[slot], host_values(offsets, bad_word_offsets.dtype, device))):
        dst.copy_(src, non_blocking=True)
    num_bad_words[slot].fill_(len(sequences))
