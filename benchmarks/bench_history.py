"""Benchmark of the penalties family (penalties, bad_words, update_output_counts) against composed
PyTorch and the memory floor.

    python benchmarks/bench_history.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_history.py --out results.md
    python benchmarks/bench_history.py --cpu-only
    BENCH_T=1,32,256 python benchmarks/bench_history.py

Every request has its own slot (R = T), repetition 1.1, frequency 0.2, presence 0.1, except where a
case says otherwise. Cases:
- penalties, realistic history: 1024 random prompt tokens and 256 generated tokens a request;
- penalties, dense worst case: 30% of the vocabulary seen (a third of it generated);
- penalties, every row off (1.0 / 0.0 / 0.0), realistic history: what a batch without penalties pays;
- bad_words: 128 sequences a request (1 to 4 tokens, a quarter of them matching the history),
  histories of 1280 tokens;
- update_output_counts: one token a row.

The composed-PyTorch baseline of penalties and bad_words is torch_sampling_ops.reference in float32:
what dense code does (vLLM-style: the [T, V] penalty math over every token, counts gathered per row;
every sequence compared at once). For update_output_counts it is an in-place `index_put_` on the
counts plus a rebuild of the touched mask words. penalties runs on a fresh copy of the logits each
call (repeated penalties would drive them to 0 and -inf), and the copy's time is subtracted.

Floors: "touched floor" is the bytes the op must move at least (the mask rows it reads, and one
32-byte sector read and written per touched logit sector and one read per touched count sector) over
the copy bandwidth; "dense floor" is what a dense kernel moves (read + write of the logits, one
read of the gathered counts).
"""
from __future__ import annotations

import functools

import torch

import torch_sampling_ops as tso
from torch_sampling_ops import reference

from timing import Case, main, print_table, time_case

REPETITION, FREQUENCY, PRESENCE = 1.1, 0.2, 0.1


def penalty_inputs(T, V, device, seed=0, *, prompt_len=1024, output_len=256, dense=False, off=False):
    """[logits, idx_mapping, prompt_mask, output_mask, output_counts, repetition, frequency, presence]."""
    g = torch.Generator().manual_seed(seed)
    R = max(T, 1)
    if dense:  # 30% of V seen; a third of the seen tokens generated, 1-4 times
        seen = torch.rand(R, V, generator=g) < 0.3
        output = seen & (torch.rand(R, V, generator=g) < 1 / 3)
        prompt = seen & ~output | (output & (torch.rand(R, V, generator=g) < 0.5))
        counts = torch.where(output, torch.randint(1, 5, (R, V), generator=g, dtype=torch.int32), 0)
    else:
        prompt = torch.zeros(R, V, dtype=torch.bool)
        prompt.scatter_(1, torch.randint(0, V, (R, prompt_len), generator=g), True)
        counts = torch.zeros(R, V, dtype=torch.int32)
        counts.scatter_add_(1, torch.randint(0, V, (R, output_len), generator=g),
                            torch.ones(R, output_len, dtype=torch.int32))
    prompt, counts = prompt.to(device), counts.to(device)
    values = (1.0, 0.0, 0.0) if off else (REPETITION, FREQUENCY, PRESENCE)
    params = [torch.full((R,), v, device=device) for v in values]
    logits = (torch.randn(T, V, generator=g) * 3).to(device)
    idx_mapping = torch.arange(T, dtype=torch.int32, device=device)
    return [logits, idx_mapping, reference.pack_bitmask(prompt), reference.pack_bitmask(counts > 0), counts, *params]


def bad_words_inputs(T, V, device, seed=0, *, words=128, max_len=4, history_len=1280):
    """[logits, idx_mapping, bad_word_ids, bad_word_offsets, num_bad_words, history, history_lens]."""
    g = torch.Generator().manual_seed(seed)
    R, L = max(T, 1), history_len + 256
    lengths = torch.randint(1, max_len + 1, (R, words), generator=g)
    offsets = torch.zeros(R, words + 1, dtype=torch.int64)
    offsets[:, 1:] = lengths.cumsum(1)
    ids = torch.randint(0, V, (R, words * max_len), generator=g, dtype=torch.int32)
    history = torch.randint(0, V, (R, L), generator=g, dtype=torch.int32)
    for r in range(R):  # a quarter of the sequences end with their prefix matching the history
        for i in range(0, words, 4):
            n, start = int(lengths[r, i]), int(offsets[r, i])
            ids[r, start:start + n - 1] = history[r, history_len - (n - 1):history_len]
    logits = torch.randn(T, V, generator=g) * 3
    state = [torch.arange(T, dtype=torch.int32), ids, offsets.to(torch.int32),
             torch.full((R,), words, dtype=torch.int32), history, torch.full((T,), history_len, dtype=torch.int32)]
    return [logits.to(device)] + [s.to(device) for s in state]


def update_inputs(T, V, device, seed=0):
    """[output_counts, output_mask, idx_mapping, token_ids]: one token a row, each row its own slot."""
    g = torch.Generator().manual_seed(seed)
    R = max(T, 1)
    counts = torch.zeros(R, V, dtype=torch.int32, device=device)
    mask = torch.zeros(R, (V + 31) // 32, dtype=torch.int32, device=device)
    return [counts, mask, torch.arange(T, dtype=torch.int32, device=device),
            torch.randint(0, V, (T,), generator=g).to(device)]


def composed_update_output_counts(counts, mask, idx_mapping, token_ids):
    """In-place composed PyTorch: index_put_ with accumulate, then the touched mask words rebuilt from the counts."""
    R, V = counts.shape
    slots, tokens = idx_mapping.long(), token_ids.long()
    ok = (slots >= 0) & (slots < R) & (tokens >= 0) & (tokens < V)
    slots, tokens = torch.where(ok, slots, 0), torch.where(ok, tokens, 0)
    counts.index_put_((slots, tokens), ok.to(torch.int32), accumulate=True)
    word = tokens >> 5
    cols = word.unsqueeze(1) * 32 + torch.arange(32, device=counts.device)
    bits = (counts[slots.unsqueeze(1), cols.clamp(max=V - 1)] > 0) & (cols < V)
    packed = (bits.long() << torch.arange(32, device=counts.device)).sum(1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    mask.index_put_((slots, word), torch.where(ok, packed, mask[slots, word]))


def _reference(name):
    return lambda *a: getattr(reference, name)(*a, compute_dtype=torch.float32)


CASES = [
    Case("penalties, realistic history (1024 prompt + 256 generated tokens)", penalty_inputs, tso.penalties,
         _reference("penalties"), fresh_logits=True),
    Case("penalties, dense worst case (30% of V seen)", functools.partial(penalty_inputs, dense=True), tso.penalties,
         _reference("penalties"), fresh_logits=True),
    Case("penalties, every row off", functools.partial(penalty_inputs, off=True), tso.penalties,
         _reference("penalties"), fresh_logits=True),
    Case("bad_words, 128 sequences a request", bad_words_inputs, tso.bad_words, _reference("bad_words")),
    Case("update_output_counts, one token a row", update_inputs, tso.update_output_counts,
         composed_update_output_counts),
]


def touched_bytes(case: Case, inputs) -> tuple[int, int]:
    """(bytes the op must move at least, bytes a dense kernel moves), per call."""
    if case.ours is tso.penalties:
        logits, _, prompt_mask, output_mask, counts, rep, freq, pres = inputs
        T, V = logits.shape
        if bool((rep == 1).all() & (freq == 0).all() & (pres == 0).all()):
            return 0, 3 * T * V * 4
        seen = reference.unpack_bitmask(prompt_mask | output_mask, V)
        output = reference.unpack_bitmask(output_mask, V)
        pad = (-V) % 8

        def sectors(bits):  # 32-byte sectors of 8 four-byte entries holding a set bit
            return int(torch.nn.functional.pad(bits, (0, pad)).view(T, -1, 8).any(-1).sum())

        masks = 2 * prompt_mask.numel() * 4
        return masks + 2 * 32 * sectors(seen) + 32 * sectors(output), 3 * T * V * 4
    if case.ours is tso.bad_words:
        _, idx, ids, offsets, *_ = inputs
        # each row reads its slot's ids and offsets and one sector of history tail
        return idx.size(0) * ((ids.size(1) + offsets.size(1)) * 4 + 32), 0
    # each row: its slot and token id, one sector of counts and one of the mask (read and written)
    return inputs[2].numel() * (4 + 8 + 2 * 2 * 32), 0


def gpu_table(case: Case, V: int, bandwidth_gbps: float, Ts) -> str:
    rows = []
    for T in Ts:
        inputs, eager, graph, base = time_case(case, T, V)
        touched, dense = touched_bytes(case, inputs)
        floor = touched / (bandwidth_gbps * 1e9) * 1e6
        dense_floor = dense / (bandwidth_gbps * 1e9) * 1e6
        rows.append([T, eager, graph, base, base / graph, floor, dense_floor or "-"])
    return print_table(f"{case.name}, V = {V}, fp32, {torch.cuda.get_device_name()}, µs (median)",
                       ["T", "ours eager", "ours graph", "PyTorch", "speed-up (graph)", "touched floor",
                        "dense floor"], rows)


if __name__ == "__main__":
    main(CASES, __doc__, table=gpu_table, sizes="1,32,256")
