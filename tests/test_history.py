"""penalties, update_output_counts and bad_words against the float64 reference on every backend;
the state helpers; argument checks, opcheck, torch.compile and CUDA graphs."""

import pytest
import torch
import triton
import triton.language as tl

import torch_sampling_ops

# The module (the package attribute `penalties` is the op's wrapper, which shadows it).
from torch_sampling_ops import history as penalties_module
from torch_sampling_ops import reference, state

from conftest import (
    BACKENDS,
    DTYPES,
    HAS_CUDA,
    INTERPRET,
    assert_pad_untouched,
    device_of,
    logits_past_2_pow_31,
    make_logits,
    run_op,
)

INT = torch.int32
NEG_INF = float("-inf")
NAN = float("nan")

# (repetition, frequency, presence) per slot: all off, all on, repetition only, frequency and
# presence only, presence only, repetition < 1.
PENALTY_SLOTS = [(1.0, 0.0, 0.0), (1.3, 0.2, 0.1), (0.8, 0.0, 0.0), (1.0, 0.5, -0.3), (1.0, 0.0, 0.7), (0.7, 0.1, 0.0)]


def tolerance(dtype):
    # float32 arithmetic rounded to the logits dtype; the reference rounds once from float64.
    return {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}[dtype]


def penalty_params(slots=PENALTY_SLOTS, device="cpu"):
    rep, freq, pres = (torch.tensor(list(col), dtype=torch.float32, device=device) for col in zip(*slots))
    return rep, freq, pres


def penalty_state(R, V, gen, *, prompt_density=0.05, output_density=0.03):
    """(prompt_mask, output_mask, output_counts): random bits; counts in [1, 6] where the output bit
    is set and garbage elsewhere (a token whose output bit is 0 must count 0)."""
    prompt = torch.rand(R, V, generator=gen) < prompt_density
    output = torch.rand(R, V, generator=gen) < output_density
    counts = torch.randint(1, 7, (R, V), generator=gen, dtype=INT)
    counts = torch.where(output, counts, torch.randint(-50, 50, (R, V), generator=gen, dtype=INT))
    return reference.pack_bitmask(prompt), reference.pack_bitmask(output), counts


def untouched_tokens(idx_mapping, prompt_mask, output_mask, rep, freq, pres, V):
    """bool [T, V]: tokens that must keep their exact bits (neither bit, slot out of range, all off)."""
    R = rep.size(0)
    idx = idx_mapping.long().cpu()
    valid = (idx >= 0) & (idx < R)
    s = idx.clamp(0, R - 1)
    on = valid & ((rep.cpu()[s] != 1) | (freq.cpu()[s] != 0) | (pres.cpu()[s] != 0))
    seen = reference.unpack_bitmask(prompt_mask.cpu()[s], V) | reference.unpack_bitmask(output_mask.cpu()[s], V)
    return ~(seen & on.unsqueeze(1))


def same_bits(a, b):
    """Bitwise equality (NaN payloads included)."""
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


# ----------------------------------------------------------------------------------------------
# penalties


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("V", [1000, 4099, 5003])
def test_penalties_matches_reference(backend, dtype, T, V, gen):
    device = device_of(backend)
    rep, freq, pres = penalty_params()
    R = rep.size(0)
    prompt_mask, output_mask, counts = penalty_state(R, V, gen)
    idx_mapping = torch.tensor([1, 5, -1, 3][:T], dtype=torch.int64 if V == 4099 else INT)
    logits = make_logits(T, V, dtype, device, generator=gen)
    logits[0, :50] = logits[0, :50].abs()  # positive and negative logits both meet the penalty
    logits[0, 50:100] = -logits[0, 50:100].abs()
    original = logits.clone().cpu()
    expected = reference.penalties(original, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    args = [a.to(device) for a in (idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)]
    run_op(backend, "penalties", logits, *args)
    out = logits.cpu()
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)
    keep = untouched_tokens(idx_mapping, prompt_mask, output_mask, rep, freq, pres, V)
    assert same_bits(out[keep], original[keep])
    assert not torch.equal(out[0], original[0])
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_penalties_by_hand(backend):
    """Repetition divides positive logits and multiplies the others; prompt tokens get repetition only."""
    device = device_of(backend)
    V = 40
    logits = make_logits(2, V, torch.float32, device)
    logits[:, :6] = torch.tensor([2.0, -2.0, 0.0, 3.0, -1.0, 5.0])
    original = logits.clone().cpu()
    prompt = torch.zeros(1, V, dtype=torch.bool)
    prompt[0, [0, 1, 2, 3]] = True
    output = torch.zeros(1, V, dtype=torch.bool)
    output[0, [3, 4, 39]] = True
    counts = torch.zeros(1, V, dtype=INT)
    counts[0, [3, 4, 5, 39]] = torch.tensor([2, 1, 9, 1], dtype=INT)  # token 5 has no output bit: counts 0
    args = [torch.tensor([0, 1], dtype=INT), reference.pack_bitmask(prompt), reference.pack_bitmask(output), counts,
            torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25])]
    run_op(backend, "penalties", logits, *[a.to(device) for a in args])  # row 1: slot 1 is out of range
    out = logits.cpu()
    # token 3: 3 / 2 - (0.5 * 2 + 0.25); token 4: -1 * 2 - (0.5 + 0.25); token 39: x / 2 or x * 2, minus 0.75
    x39 = original[0, 39].item()
    want39 = (x39 / 2 if x39 > 0 else x39 * 2) - 0.75
    assert out[0, :6].tolist() == [1.0, -4.0, 0.0, 0.25, -2.75, 5.0]
    assert out[0, 39].item() == pytest.approx(want39, abs=1e-6)
    assert torch.equal(out[0, 6:39], original[0, 6:39]) and torch.equal(out[1], original[1])
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_penalties_off_are_exact_no_ops(backend, dtype, gen):
    """1.0 / 0.0 change no bit: a row with all three off is untouched (NaN too); repetition 1.0 with a
    frequency leaves prompt-only tokens bit for bit; frequency and presence 0 leave output tokens
    with repetition alone."""
    T, V = 3, 3001
    device = device_of(backend)
    prompt_mask, output_mask, counts = penalty_state(3, V, gen, prompt_density=0.5, output_density=0.5)
    rep, freq, pres = penalty_params([(1.0, 0.0, 0.0), (1.0, 0.3, 0.0), (1.0, 0.0, 0.0)])
    logits = make_logits(T, V, dtype, device, generator=gen)
    logits[0, ::7] = NAN
    logits[0, 1::7] = NEG_INF
    logits[0, 2::7] = -0.0
    original = logits.clone().cpu()
    idx_mapping = torch.tensor([0, 1, 2], dtype=INT)
    args = [a.to(device) for a in (idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)]
    run_op(backend, "penalties", logits, *args)
    out = logits.cpu()
    assert same_bits(out[0], original[0]) and same_bits(out[2], original[2])
    output_bits = reference.unpack_bitmask(output_mask[1:2], V)[0]
    assert same_bits(out[1][~output_bits], original[1][~output_bits])
    assert not torch.equal(out[1][output_bits], original[1][output_bits])


@pytest.mark.interpret
@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (no GPU)")
@pytest.mark.parametrize("dense_popcount", [0, 32], ids=["all-bits", "lowest-bit-steps"])
@pytest.mark.parametrize("density", [0.02, 0.6])
def test_penalties_both_block_paths(dense_popcount, density, gen, monkeypatch):
    """The Triton kernel's two ways through a block of mask words give the reference's result."""
    monkeypatch.setattr(penalties_module, "_DENSE_POPCOUNT", dense_popcount)
    T, V = 3, 4133
    rep, freq, pres = penalty_params()
    prompt_mask, output_mask, counts = penalty_state(rep.size(0), V, gen, prompt_density=density,
                                                     output_density=density / 2)
    idx_mapping = torch.tensor([1, 5, 3], dtype=INT)
    logits = make_logits(T, V, torch.float32, "cpu", generator=gen)
    expected = reference.penalties(logits, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    run_op("interpret", "penalties", logits, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    torch.testing.assert_close(logits.double(), expected, atol=1e-5, rtol=1e-5)
    assert_pad_untouched(logits)


@pytest.mark.interpret
@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (no GPU)")
def test_penalties_rows_past_the_grids_second_axis(gen, monkeypatch):
    """Rows beyond the grid's second axis continue on its third (here 3 rows an axis step: 8 rows on
    a 3 x 3 grid, whose last place holds no row)."""
    monkeypatch.setattr(penalties_module, "_MAX_GRID_Y", 3)
    T, V = 8, 1000
    rep, freq, pres = penalty_params()
    prompt_mask, output_mask, counts = penalty_state(rep.size(0), V, gen)
    idx_mapping = torch.tensor([1, 5, 3, 2, 1, 4, 5, 3], dtype=INT)
    logits = make_logits(T, V, torch.float32, "cpu", generator=gen)
    expected = reference.penalties(logits, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    run_op("interpret", "penalties", logits, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    torch.testing.assert_close(logits.double(), expected, atol=1e-5, rtol=1e-5)
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_penalties_dense_blocks_keep_unseen_bits(backend, dtype, gen):
    """Blocks dense with seen tokens are rewritten whole on CUDA: every unseen token keeps its exact
    bits (NaN payloads, -0.0, -inf), the seen ones match the reference."""
    T, V = 2, 4133
    device = device_of(backend)
    rep, freq, pres = penalty_params([(1.3, 0.2, 0.1), (1.0, 0.5, 0.25)])
    prompt_mask, output_mask, counts = penalty_state(2, V, gen, prompt_density=0.6, output_density=0.3)
    logits = make_logits(T, V, dtype, "cpu", generator=gen)
    bits = logits.view({torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype])
    bits[:, ::5] = {torch.float32: 0x7FC12345, torch.float16: 0x7E01, torch.bfloat16: 0x7FC1}[dtype]  # NaN payloads
    logits[:, 1::5] = -0.0
    logits[:, 2::5] = NEG_INF
    original = logits.clone()
    idx_mapping = torch.tensor([0, 1], dtype=INT)
    expected = reference.penalties(original, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)
    logits = logits.to(device)
    run_op(backend, "penalties", logits, *[a.to(device) for a in (idx_mapping, prompt_mask, output_mask, counts, rep,
                                                                   freq, pres)])
    out = logits.cpu()
    keep = untouched_tokens(idx_mapping, prompt_mask, output_mask, rep, freq, pres, V)
    assert same_bits(out[keep], original[keep])
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(out.double()[~keep], expected[~keep], atol=atol, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_penalties_ignore_bits_past_vocab(backend, gen):
    """Mask bits past V (the last word's padding) never address a logit or a count."""
    T, V = 2, 1000  # 1000 = 31 words + 8 tokens: 24 padding bits
    device = device_of(backend)
    full = torch.full((1, (V + 31) // 32), -1, dtype=INT)
    counts = torch.ones(1, V, dtype=INT)
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    original = logits.clone().cpu()
    rep, freq, pres = penalty_params([(1.5, 0.25, 0.5)])
    idx_mapping = torch.zeros(T, dtype=INT)
    run_op(backend, "penalties", logits, *[a.to(device) for a in (idx_mapping, full, full, counts, rep, freq, pres)])
    expected = reference.penalties(original, idx_mapping, full, full, counts, rep, freq, pres)
    torch.testing.assert_close(logits.cpu().double(), expected, atol=1e-5, rtol=1e-5)
    assert_pad_untouched(logits)


# ----------------------------------------------------------------------------------------------
# update_output_counts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", [INT, torch.int64], ids=str)
@pytest.mark.parametrize("V", [37, 5003])
def test_update_output_counts_matches_reference(backend, index_dtype, V, gen):
    """Several steps from zeroed state: duplicated (slot, token) rows all count, -1 and ids or slots
    out of range count nothing, and the mask stays equal to counts > 0."""
    device = device_of(backend)
    R, T = 4, 24
    counts = torch.zeros(R, V, dtype=INT, device=device)
    mask = torch.zeros(R, (V + 31) // 32, dtype=INT, device=device)
    big = 2**40 if index_dtype == torch.int64 else 2**31 - 1
    for step in range(4):
        idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=index_dtype)
        token_ids = torch.randint(0, min(V, 6), (T,), generator=gen, dtype=index_dtype)  # many duplicates
        token_ids[:4] = torch.tensor([V - 1, 31, 32, 0], dtype=index_dtype)
        token_ids[4:9] = torch.tensor([-1, V, -5, big, -big], dtype=index_dtype)
        idx_mapping[9:12] = torch.tensor([-1, R, big], dtype=index_dtype)
        want_counts, want_mask = reference.update_output_counts(counts.cpu(), mask.cpu(), idx_mapping, token_ids)
        run_op(backend, "update_output_counts", counts, mask, idx_mapping.to(device), token_ids.to(device))
        assert torch.equal(counts.cpu(), want_counts) and torch.equal(mask.cpu(), want_mask)
        assert torch.equal(mask.cpu(), reference.pack_bitmask(counts.cpu() > 0))
    assert int(counts.sum()) > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_output_counts_duplicates_count_each(backend):
    device = device_of(backend)
    V = 100
    counts = torch.zeros(2, V, dtype=INT, device=device)
    mask = torch.zeros(2, 4, dtype=INT, device=device)
    idx_mapping = torch.tensor([1, 1, 1, 0, 1, 0], dtype=INT, device=device)
    token_ids = torch.tensor([63, 63, 63, 99, -1, 31], dtype=INT, device=device)
    run_op(backend, "update_output_counts", counts, mask, idx_mapping, token_ids)
    counts, mask = counts.cpu(), mask.cpu()
    assert counts[1, 63] == 3 and counts[0, 99] == 1 and counts[0, 31] == 1 and int(counts.sum()) == 5
    assert mask[1].tolist() == [0, -(2**31), 0, 0]  # token 63: bit 31 of word 1
    assert mask[0].tolist() == [-(2**31), 0, 0, 1 << 3]


# ----------------------------------------------------------------------------------------------
# bad_words


def check_bad_words(backend, logits, *state):
    """Runs bad_words on `backend` and compares every bit with the reference; the pad stays untouched."""
    expected = reference.bad_words(logits.cpu(), *state)
    run_op(backend, "bad_words", logits, *[a.to(logits.device) for a in state])
    torch.testing.assert_close(logits.cpu().double(), expected, atol=0, rtol=0)
    assert_pad_untouched(logits)


def bad_words_state(R, V, gen, *, N=6, W=24, L=12, lengths=(1, 2, 5)):
    """Random sequences of the given lengths; about half of them end the slot's history on purpose."""
    history = torch.randint(0, V, (R, L), generator=gen, dtype=INT)
    ids = torch.full((R, W), -7, dtype=INT)  # unused entries hold garbage
    offsets = torch.zeros(R, N + 1, dtype=INT)
    num = torch.zeros(R, dtype=INT)
    for r in range(R):
        pos, n = 0, int(torch.randint(0, N + 1, (1,), generator=gen))
        for i in range(n):
            length = lengths[int(torch.randint(0, len(lengths), (1,), generator=gen))]
            if pos + length > W:
                n = i
                break
            seq = torch.randint(0, V, (length,), generator=gen, dtype=INT)
            if bool(torch.rand(1, generator=gen) < 0.5) and length > 1:
                end = int(torch.randint(length - 1, L + 1, (1,), generator=gen))
                seq[:-1] = history[r, end - (length - 1):end]
            ids[r, pos:pos + length] = seq
            pos += length
            offsets[r, i + 1] = pos
        offsets[r, n + 1:] = pos
        num[r] = n
    return ids, offsets, num, history


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", [1000, 5003])
def test_bad_words_matches_reference(backend, dtype, V, gen):
    device = device_of(backend)
    R, T = 5, 4
    for trial in range(3):
        ids, offsets, num, history = bad_words_state(R, V, gen)
        if trial == 1:
            ids = ids.long()
        idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
        history_lens = torch.randint(0, history.size(1) + 1, (T,), generator=gen, dtype=torch.int64)
        check_bad_words(backend, make_logits(T, V, dtype, device, generator=gen),
                        idx_mapping, ids, offsets, num, history, history_lens)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_words_by_hand(backend):
    """Lengths 1, 2 and 5; histories shorter than the sequence; ids outside [0, V) ignored."""
    device = device_of(backend)
    V = 50
    words = [[7], [3, 9], [1, 2, 3, 4, 11], [4, 60], [4, -1], [60, 12], [5, 5, 13]]
    ids = torch.tensor([[w for s in words for w in s]], dtype=INT)
    offsets = torch.tensor([[0, 1, 3, 8, 10, 12, 14, 17]], dtype=INT)
    history = torch.tensor([[1, 2, 3, 4, 5, 3, 0, 0]], dtype=INT)
    # rows: the history lengths 0 .. 6
    history_lens = torch.arange(7, dtype=INT)
    idx_mapping = torch.zeros(7, dtype=INT)
    logits = make_logits(7, V, torch.float32, device)
    logits.copy_(torch.arange(V, dtype=torch.float32).expand(7, V))
    run_op(backend, "bad_words", logits, *[a.to(device) for a in (idx_mapping, ids, offsets, torch.tensor([7]),
                                                                   history, history_lens)])
    banned = [torch.isinf(row).nonzero().flatten().tolist() for row in logits.cpu()]
    # 7 always; 9 after a 3 (len 3); 11 after 1 2 3 4 (len 4); 13 never (needs 5 5); 12 never (60 not in history)
    assert banned == [[7], [7], [7], [7, 9], [7, 11], [7], [7, 9]]
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_words_clamps_corrupt_lists(backend, gen):
    """Counts past N, offsets outside [0, W] or decreasing, lengths outside [0, L]: clamped, never out of bounds."""
    device = device_of(backend)
    V, R, T = 300, 3, 5
    ids = torch.randint(0, V, (R, 6), generator=gen, dtype=INT)
    offsets = torch.tensor([[0, 2, 1, 9, -4], [-3, 1, 2, 100, 3], [0, 1, 2, 3, 6]], dtype=INT)
    num = torch.tensor([2**31 - 1, 4, -2], dtype=INT)
    history = torch.randint(0, V, (R, 4), generator=gen, dtype=INT)
    history[0, :2] = ids[0, :2]
    history_lens = torch.tensor([2, 2**40, -(2**40), 4, 3], dtype=torch.int64)
    idx_mapping = torch.tensor([0, 1, 2, 0, 1], dtype=INT)
    check_bad_words(backend, make_logits(T, V, torch.float16, device, generator=gen),
                    idx_mapping, ids, offsets, num, history, history_lens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("W, N, L", [(0, 3, 4), (4, 0, 4), (4, 2, 0)])
def test_bad_words_empty_lists(backend, W, N, L, gen):
    device = device_of(backend)
    V, T = 100, 2
    ids = torch.full((2, W), 5, dtype=INT)
    offsets = torch.arange(N + 1, dtype=INT).clamp(max=W).expand(2, N + 1).contiguous()
    args = [torch.tensor([0, 1], dtype=INT), ids, offsets, torch.full((2,), N, dtype=INT),
            torch.full((2, L), 5, dtype=INT), torch.full((T,), L, dtype=INT)]
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    expected = reference.bad_words(logits.cpu(), *args)
    run_op(backend, "bad_words", logits, *[a.to(device) for a in args])
    torch.testing.assert_close(logits.cpu().double(), expected, atol=0, rtol=0)
    if W > 0 and N > 0:  # L == 0: one-token sequences still ban
        assert bool(torch.isinf(logits[:, 5]).all())


# ----------------------------------------------------------------------------------------------
# All three


def penalties_args(T, V, gen, device, R=6):
    rep, freq, pres = penalty_params()
    prompt_mask, output_mask, counts = penalty_state(R, V, gen)
    idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
    return [make_logits(T, V, torch.float32, device, generator=gen)] + [
        a.to(device) for a in (idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)]


def update_args(T, V, gen, device, R=3):
    counts = torch.randint(0, 3, (R, V), generator=gen, dtype=INT)
    mask = reference.pack_bitmask(counts > 0)
    idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
    token_ids = torch.randint(-1, V, (T,), generator=gen, dtype=torch.int64)
    return [a.to(device) for a in (counts, mask, idx_mapping, token_ids)]


def bad_words_args(T, V, gen, device, R=3):
    ids, offsets, num, history = bad_words_state(R, V, gen)
    idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
    history_lens = torch.randint(0, history.size(1) + 1, (T,), generator=gen, dtype=INT)
    return [make_logits(T, V, torch.float32, device, generator=gen)] + [
        a.to(device) for a in (idx_mapping, ids, offsets, num, history, history_lens)]


ARGS = {"penalties": penalties_args, "update_output_counts": update_args, "bad_words": bad_words_args}
OPS = sorted(ARGS)


def example_args(op, device, gen, T=5, V=1000):
    return ARGS[op](T, V, gen, device)


def reference_result(op, args):
    """The reference's result as the list of tensors the op writes."""
    cpu = [a.cpu() for a in args]
    if op == "update_output_counts":
        return list(reference.update_output_counts(*cpu))
    return [getattr(reference, op)(*cpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_out_of_range_slots_are_untouched(backend, op, gen):
    device = device_of(backend)
    args = ARGS[op](6, 700, gen, device)
    idx = 2 if op == "update_output_counts" else 1
    R = args[0 if op == "update_output_counts" else 4].size(0)  # output_counts, or num_bad_words
    args[idx] = torch.tensor([-1, R, 2**40, -(2**40), R + 3, -2], dtype=torch.int64, device=device)
    before = [a.clone() for a in args]
    run_op(backend, op, *args)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_empty_batch(backend, op, gen):
    args = ARGS[op](0, 100, gen, device_of(backend))
    before = [a.clone() for a in args]
    run_op(backend, op, *args)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


def test_wrappers_take_keywords(gen):
    logits, idx, prompt_mask, output_mask, counts, rep, freq, pres = penalties_args(3, 500, gen, "cpu")
    expected = reference.penalties(logits, idx, prompt_mask, output_mask, counts, rep, freq, pres)
    torch_sampling_ops.penalties(logits=logits, idx_mapping=idx, prompt_mask=prompt_mask, output_mask=output_mask,
                                 output_counts=counts, repetition_penalty=rep, frequency_penalty=freq,
                                 presence_penalty=pres)
    torch.testing.assert_close(logits.double(), expected, atol=1e-5, rtol=1e-5)
    counts, mask, idx, tokens = update_args(4, 500, gen, "cpu")
    want = reference.update_output_counts(counts, mask, idx, tokens)
    torch_sampling_ops.update_output_counts(output_counts=counts, output_mask=mask, idx_mapping=idx, token_ids=tokens)
    assert torch.equal(counts, want[0]) and torch.equal(mask, want[1])
    logits, idx, ids, offsets, num, history, lens = bad_words_args(3, 500, gen, "cpu")
    expected = reference.bad_words(logits, idx, ids, offsets, num, history, lens)
    torch_sampling_ops.bad_words(logits=logits, idx_mapping=idx, bad_word_ids=ids, bad_word_offsets=offsets,
                                 num_bad_words=num, history=history, history_lens=lens)
    torch.testing.assert_close(logits.double(), expected, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------
# State helpers


def test_state_helpers_pack_a_request(gen):
    V, R = 1003, 3
    prompt_mask = torch.full((R, (V + 31) // 32), 12345, dtype=INT)
    counts = torch.randint(0, 4, (R, V), generator=gen, dtype=INT)
    output_mask = reference.pack_bitmask(counts > 0)
    prompt = torch.randint(0, V, (200,), generator=gen)
    state.clear_slot(1, counts, output_mask, prompt_mask)
    assert int(counts[1].abs().sum()) == 0 and int(output_mask[1].abs().sum()) == 0
    assert int(prompt_mask[1].abs().sum()) == 0 and int(prompt_mask[0, 0]) == 12345
    state.set_prompt_mask(prompt_mask, 1, prompt.tolist() + [-1, V, 5000], V)  # ids out of range are ignored
    bits = torch.zeros(1, V, dtype=torch.bool)
    bits[0, prompt] = True
    assert torch.equal(prompt_mask[1:2], reference.pack_bitmask(bits))
    state.set_prompt_mask(prompt_mask, 2, prompt, V)  # a tensor works too
    assert torch.equal(prompt_mask[2], prompt_mask[1])

    ids = torch.full((R, 10), 99, dtype=INT)
    offsets = torch.full((R, 5), 99, dtype=INT)
    num = torch.zeros(R, dtype=INT)
    state.set_bad_words(ids, offsets, num, 2, [[4], [], [1, 2, 3]])
    assert ids[2, :4].tolist() == [4, 1, 2, 3] and offsets[2].tolist() == [0, 1, 4, 4, 4] and int(num[2]) == 2
    with pytest.raises(ValueError, match="bad_word_ids"):
        state.set_bad_words(ids, offsets, num, 0, [[1] * 11])
    with pytest.raises(ValueError, match="bad_word_offsets"):
        state.set_bad_words(ids, offsets, num, 0, [[1]] * 5)
    history = torch.zeros(R, 4, dtype=INT)
    history[2, :2] = torch.tensor([1, 2])
    logits = torch.zeros(2, V)
    torch_sampling_ops.bad_words(logits, torch.tensor([2, 2]), ids, offsets, num, history, torch.tensor([2, 1]))
    assert torch.isinf(logits).nonzero().tolist() == [[0, 3], [0, 4], [1, 4]]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_state_helpers_on_cuda(gen):
    """The helpers on device state: lists copied once, bits packed on the device."""
    V, R = 5003, 2
    prompt = torch.randint(0, V, (300,), generator=gen)
    prompt_mask = torch.full((R, (V + 31) // 32), 7, dtype=INT, device="cuda")
    counts = torch.ones(R, V, dtype=INT, device="cuda")
    output_mask = torch.full_like(prompt_mask, -1)
    state.clear_slot(0, counts, output_mask, prompt_mask)
    state.set_prompt_mask(prompt_mask, 0, prompt.tolist(), V)
    state.set_prompt_mask(prompt_mask, 1, prompt.cuda(), V)
    bits = torch.zeros(1, V, dtype=torch.bool)
    bits[0, prompt] = True
    assert torch.equal(prompt_mask.cpu(), reference.pack_bitmask(bits).expand(2, -1))
    assert int(counts[0].sum()) == 0 and int(counts[1].sum()) == V and int(output_mask[0].abs().sum()) == 0
    ids = torch.zeros(R, 8, dtype=INT, device="cuda")
    offsets = torch.zeros(R, 4, dtype=INT, device="cuda")
    num = torch.zeros(R, dtype=INT, device="cuda")
    state.set_bad_words(ids, offsets, num, 1, [[3, 4], [9]])
    assert ids[1, :3].tolist() == [3, 4, 9] and offsets[1].tolist() == [0, 2, 3, 3] and num.tolist() == [0, 2]


# ----------------------------------------------------------------------------------------------
# Validation, debug-mode checks, opcheck, torch.compile and CUDA-graph replay of each op: the op
# table (op_table.py, test_ops.py). Here: the three ops in one captured step.


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "cpu"])
@pytest.mark.parametrize("density", [0.05, 0.6])
def test_penalties_cpu_and_triton_agree_bitwise(backend, density, gen):
    """float32: the IEEE division and the fused multiply-add give the C++ kernel's bits."""
    R, T, V = 6, 4, 4099
    rep, freq, pres = penalty_params()
    masks_and_counts = penalty_state(R, V, gen, prompt_density=density, output_density=density / 2)
    args = [make_logits(T, V, torch.float32, "cpu", generator=gen), torch.tensor([1, 5, 3, 2], dtype=INT),
            *masks_and_counts, rep, freq, pres]
    cpu = [a.clone() for a in args]
    torch.ops.sampling.penalties(*cpu)
    triton_args = [a.to(device_of(backend)) for a in args]
    run_op(backend, "penalties", *triton_args)
    assert same_bits(triton_args[0].cpu(), cpu[0])


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "cpu"])
@pytest.mark.parametrize("rep", [1.3, 0.7, 1e5], ids=["fast-division", "penalty-below-1", "penalty-above-2**16"])
def test_penalties_extreme_logits_agree_bitwise(backend, rep, gen):
    """Dense rows whose logits leave the fast division's ranges (tiny, subnormal, huge, infinite,
    NaN) next to ordinary ones: the tiles that hold them are divided exactly, as in C++."""
    T, V = 2, 4099
    logits = make_logits(T, V, torch.float32, "cpu", generator=gen)
    specials = torch.tensor([1e-30, 1e-45, 2e-38, 3e38, float("inf"), -float("inf"), NAN, 8.3e-25, 1.3e30, -1e-30])
    logits[0, 100:100 + specials.numel()] = specials
    logits[1, 4000:4000 + specials.numel()] = specials
    args = [logits, torch.tensor([0, 0], dtype=INT), *penalty_state(1, V, gen, prompt_density=0.9, output_density=0.5),
            *penalty_params([(rep, 0.2, 0.1)])]
    cpu = [a.clone() for a in args]
    torch.ops.sampling.penalties(*cpu)
    triton_args = [a.to(device_of(backend)) for a in args]
    run_op(backend, "penalties", *triton_args)
    # bit for bit, NaN aside (its payload is the hardware's)
    torch.testing.assert_close(triton_args[0].cpu(), cpu[0], rtol=0, atol=0, equal_nan=True)


@triton.jit
def _divide_fast_kernel(x_ptr, rep_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    rep = tl.load(rep_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, penalties_module._divide_fast(x, rep, tl.math.div_rn(1.0, rep)), mask=offs < n)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_fast_division_is_the_ieee_division(gen):
    """The penalties kernels' 5-instruction division gives the IEEE quotient bit for bit inside its
    ranges: every float32 mantissa of the penalty, each with random logits over x in [2**-80, 2**100]
    and the penalty scaled into [1, 2**16)."""
    n = 2**23
    mantissa = 1.0 + torch.arange(n, dtype=torch.float64) / n
    for _ in range(4):
        rep = (mantissa * torch.exp2(torch.randint(0, 16, (n,), generator=gen)).double()).float()
        x = ((1 + torch.rand(n, generator=gen, dtype=torch.float64)) * torch.exp2(
            torch.randint(-80, 100, (n,), generator=gen)).double()).float()
        out = torch.empty(n, device="cuda")
        _divide_fast_kernel[(n // 1024,)](x.cuda(), rep.cuda(), out, n, BLOCK=1024)
        assert same_bits(out.cpu(), x / rep)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_replays_with_changed_state(gen):
    """update_output_counts, bad_words and penalties in one captured step; the state, the rows'
    slots, the tokens and the penalties change between replays."""
    T, V, R = 6, 5000, 4
    src = make_logits(T, V, torch.float32, "cuda", generator=gen)
    logits = torch.empty_like(src)
    rep, freq, pres = (p.cuda() for p in penalty_params(PENALTY_SLOTS[:R]))
    prompt_mask, output_mask, counts = (s.cuda() for s in penalty_state(R, V, gen))
    counts.clamp_(min=0)
    idx_mapping = torch.zeros(T, dtype=INT, device="cuda")
    token_ids = torch.zeros(T, dtype=torch.int64, device="cuda")
    ids, offsets, num, history = (s.cuda() for s in bad_words_state(R, V, gen))
    history_lens = torch.zeros(T, dtype=INT, device="cuda")

    def step():
        logits.copy_(src)
        torch.ops.sampling.update_output_counts(counts, output_mask, idx_mapping, token_ids)
        torch.ops.sampling.bad_words(logits, idx_mapping, ids, offsets, num, history, history_lens)
        torch.ops.sampling.penalties(logits, idx_mapping, prompt_mask, output_mask, counts, rep, freq, pres)

    token_ids.fill_(-1)
    step()  # compile the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(3):
        idx_mapping.copy_(torch.randint(-1, R + 1, (T,), generator=gen, dtype=INT))
        token_ids.copy_(torch.randint(-1, V, (T,), generator=gen))
        history_lens.copy_(torch.randint(0, history.size(1) + 1, (T,), generator=gen, dtype=INT))
        rep.copy_(rep.roll(1))
        for s, f in zip((ids, offsets, num, history), bad_words_state(R, V, gen)):
            s.copy_(f)
        src.copy_(make_logits(T, V, torch.float32, "cuda", generator=gen))
        old = (counts.cpu(), output_mask.cpu())
        graph.replay()
        new_counts, new_mask = reference.update_output_counts(*old, idx_mapping.cpu(), token_ids.cpu())
        assert torch.equal(counts.cpu(), new_counts) and torch.equal(output_mask.cpu(), new_mask)
        expected = reference.bad_words(src.cpu(), idx_mapping.cpu(), ids.cpu(), offsets.cpu(), num.cpu(),
                                       history.cpu(), history_lens.cpu())
        expected = reference.penalties(expected, idx_mapping.cpu(), prompt_mask.cpu(), new_mask, new_counts,
                                       rep.cpu(), freq.cpu(), pres.cpu())
        torch.testing.assert_close(logits.cpu().double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_more_than_2_pow_31_elements():
    """Rows past element 2**31 are addressed with 64-bit offsets (the last rows are checked)."""
    logits = logits_past_2_pow_31()
    T, V = logits.shape
    last, second_last = logits[-1].clone(), logits[-2].clone()
    words = (V + 31) // 32
    idx_mapping = torch.full((T,), 1, dtype=INT, device="cuda")  # slot 1 is out of range: untouched
    idx_mapping[-1] = 0
    mask = torch.full((1, words), -1, dtype=INT, device="cuda")  # every token seen and generated once
    counts = torch.ones(1, V, dtype=INT, device="cuda")
    one = torch.ones(1, device="cuda")
    torch.ops.sampling.penalties(logits, idx_mapping, mask, mask, counts, 2 * one, 0.5 * one, 0.25 * one)
    x = last.float()
    assert torch.equal(logits[-1], (torch.where(x > 0, x / 2, x * 2) - 0.75).half())
    assert torch.equal(logits[-2], second_last)
    ids = torch.tensor([[V - 1, 0, 5]], dtype=INT, device="cuda")
    offsets = torch.tensor([[0, 1, 3]], dtype=INT, device="cuda")
    history = torch.zeros(1, 4, dtype=INT, device="cuda")
    torch.ops.sampling.bad_words(logits, idx_mapping, ids, offsets, torch.tensor([2], device="cuda"), history,
                                 torch.full((T,), 4, device="cuda"))
    assert torch.isinf(logits[-1]).nonzero().flatten().tolist() == [5, V - 1]
    assert torch.equal(logits[-2], second_last)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_update_output_counts_past_2_pow_31_elements():
    V = 151936
    R = 2**31 // V + 2
    counts = torch.zeros(R, V, dtype=INT, device="cuda")
    mask = torch.zeros(R, (V + 31) // 32, dtype=INT, device="cuda")
    torch.ops.sampling.update_output_counts(counts, mask, torch.tensor([R - 1, R - 1, 0], device="cuda"),
                                            torch.tensor([V - 1, V - 1, 3], device="cuda"))
    assert int(counts[R - 1, V - 1]) == 2 and int(counts[0, 3]) == 1 and int(counts.sum(dtype=torch.int64)) == 3
    assert int(mask[R - 1, -1]) & 0xFFFFFFFF == 1 << ((V - 1) % 32) and int(mask[0, 0]) == 8
