"""The sampling family: the random stream, `logprobs` and `sample`, against the float64 reference."""
import math

import pytest
import torch

from torch_sampling_ops import _C, _call_cache, gumbel, reference, sampling
from torch_sampling_ops.truncation import current_settings, use_settings

from conftest import BACKENDS, DTYPES, OP_BACKENDS, TRITON_BACKENDS, device_of, make_logits, run_op

NEG_INF = float("-inf")

# ----------------------------------------------------------------------------------------------
# The random stream

SEEDS = [0, 1, -1, 42, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1, -(2**63), -987654321987]
POSITIONS = [0, 1, 7, 2**31 - 1, 2**31, 2**32 + 3, 2**40]


def _stream_grid():
    s, p = torch.tensor(SEEDS), torch.tensor(POSITIONS)
    seeds, positions = s.repeat_interleave(len(p)), p.repeat(len(s))
    tokens = torch.arange(seeds.numel()) * 7919 % 151936
    tokens[:4] = torch.tensor([0, 1, 151935, 2**31 - 1])
    return seeds, positions, tokens


@pytest.mark.interpret
def test_stream_is_bit_identical_in_triton_cpp_and_reference():
    seeds, positions, tokens = _stream_grid()
    expected = reference.stream_bits(reference.stream_key(seeds, positions), tokens)
    cpp_bits, cpp_noise = _C.random_stream(seeds, positions, tokens)
    tri_bits, tri_noise = gumbel.random_stream_triton(seeds, positions, tokens)
    assert torch.equal(cpp_bits, expected)
    assert torch.equal(tri_bits, expected)
    assert bool(((expected >= 0) & (expected < 2**32)).all())
    # The noise goes through three float32 logs, whose last bit the two libms may round differently.
    same = (cpp_noise == tri_noise).double().mean().item()
    print(f"float32 Gumbel noise bit-identical in C++ and Triton: {same:.1%} of {len(seeds)}")
    torch.testing.assert_close(cpp_noise, tri_noise, atol=1e-6, rtol=5e-7)
    exact = reference.stream_noise(reference.stream_key(seeds, positions), tokens)
    torch.testing.assert_close(cpp_noise.double(), exact, atol=2e-6, rtol=1e-6)


def test_stream_uniform_is_open_and_exact():
    bits = torch.tensor([0, 511, 2**32 - 1, 2**31], dtype=torch.int64)
    u32 = reference.stream_uniform(bits, torch.float32)
    assert torch.equal(u32.double(), reference.stream_uniform(bits))  # exact in float32
    assert bool(((u32 > 0) & (u32 < 1)).all())
    assert torch.isfinite(reference.stream_gumbel(bits, torch.float32)).all()


def test_stream_bits_look_uniform():
    """Top 4 bits of 2**16 consecutive tokens, and of one token over consecutive positions, in 16 bins."""
    key = reference.stream_key(torch.tensor([7]), torch.tensor([3]))
    along_tokens = reference.stream_bits(key, torch.arange(2**16)) >> 28
    along_positions = reference.stream_bits(reference.stream_key(torch.full((2**16,), 7), torch.arange(2**16)),
                                            torch.tensor(5)) >> 28
    for bins in (along_tokens, along_positions):
        counts = torch.bincount(bins, minlength=16).double()
        assert _chi_square(counts, torch.full((16,), 1 / 16, dtype=torch.float64)) < _chi_square_bound(15)


# ----------------------------------------------------------------------------------------------
# Chi-square without scipy


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic; categories expected below 5 draws are pooled into one."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    assert bool((obs[~keep] == 0).all()), "a draw landed on a zero-probability token"
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())


def _chi_square_bound(df: int, z: float = 4.753) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) at p ~ 1e-6 (z = 4.753)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


# ----------------------------------------------------------------------------------------------
# logprobs


def assert_logprobs(out, logits, token_ids, k):
    ids, lps, token_lp, ranks = out
    e_ids, e_lps, e_token_lp, e_ranks = reference.logprobs(logits.cpu(), token_ids.cpu(), k)
    assert ids.dtype == torch.int64 and lps.dtype == torch.float32 and ranks.dtype == torch.int64
    assert ids.shape == (logits.size(0), k) and token_lp.shape == (logits.size(0),)
    assert torch.equal(ids.cpu(), e_ids)
    assert torch.equal(ranks.cpu(), e_ranks)
    torch.testing.assert_close(lps.cpu().double(), e_lps, atol=2e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(token_lp.cpu().double(), e_token_lp, atol=2e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T, V, k", [(3, 1000, 5), (2, 5003, 20), (1, 64, 64), (4, 300, 0)])
def test_logprobs_matches_reference(backend, dtype, T, V, k, gen):
    device = device_of(backend)
    logits = make_logits(T, V, dtype, device, generator=gen)
    token_ids = torch.randint(-3, V + 3, (T,), generator=gen).to(device)
    token_ids[0] = int(logits[0].float().argmax())  # rank 1
    assert_logprobs(run_op(backend, "logprobs", logits, token_ids, k), logits, token_ids, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_ties_infinities_and_nan(backend):
    """Ties go to the lower index, across blocks too; -inf rows give -inf logprobs; NaN reads as -inf;
    ids out of range give -inf and rank -1."""
    device = device_of(backend)
    V = 5000
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(3))
    logits[0, [10, 4500, 4096, 7]] = 9.0  # four-way tie for first, across two blocks
    logits[1] = 2.0  # all tied
    logits[2] = NEG_INF
    logits[3, ::2] = float("nan")
    logits[4, 100] = NEG_INF
    logits = logits.to(device)
    token_ids = torch.tensor([4500, 17, 3, 0, 100], device=device)
    for k in (0, 3, 8):
        assert_logprobs(run_op(backend, "logprobs", logits, token_ids, k), logits, token_ids, k)
    ids, lps, token_lp, ranks = run_op(backend, "logprobs", logits, token_ids, 6)
    assert ids[0, :4].tolist() == [7, 10, 4096, 4500]
    assert ids[1].tolist() == list(range(6))
    assert ranks[0] == 1 and ranks[1] == 1 and ranks[4] > 1
    assert bool((lps[2] == NEG_INF).all()) and token_lp[2] == NEG_INF
    assert token_lp[3] == NEG_INF  # a NaN logit has probability 0
    for bad_id in (-1, V, 2**40):
        out = run_op(backend, "logprobs", logits[:1], torch.tensor([bad_id], device=device), 2)
        assert out[2].item() == NEG_INF and out[3].item() == -1
    # +inf holds all the mass: logsumexp +inf, finite logits -inf, the +inf one NaN
    row = torch.randn(1, V, generator=torch.Generator().manual_seed(4))
    row[0, 123] = float("inf")
    ids, lps, token_lp, ranks = run_op(backend, "logprobs", row.to(device), torch.tensor([5], device=device), 3)
    assert ids[0, 0] == 123 and lps[0, 0].isnan() and bool((lps[0, 1:] == NEG_INF).all())
    assert token_lp[0] == NEG_INF and ranks[0] > 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_k_equals_v(backend, gen):
    device = device_of(backend)
    logits = make_logits(2, 100, torch.float32, device, generator=gen)
    token_ids = torch.tensor([5, 99], device=device)
    assert_logprobs(run_op(backend, "logprobs", logits, token_ids, 100), logits, token_ids, 100)


def _rows_over_segments(V):
    """Rows [6, V] that span several logprobs segments: random; ties across segments at the top; ties
    everywhere; groups of _LOGPROBS_GROUP tokens with three maxima among them, so that far more groups
    and tokens than k tie at the k-th largest; fewer finite logits than k, NaN among them; all -inf."""
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(6, V, generator=gen) * 3
    seg = sampling._LOGPROBS_SEGMENT
    logits[1, [2 * seg + 5, 10, V - 1, seg, 2 * seg - 1]] = 20.0
    logits[2] = (torch.randn(V, generator=gen) * 2).round() / 2
    logits[3] = -(torch.arange(V) // sampling._LOGPROBS_GROUP % 3).float()
    logits[4] = NEG_INF
    logits[4, torch.randperm(V, generator=gen)[:12]] = torch.randn(12, generator=gen)
    logits[4, ::7] = float("nan")
    logits[5] = NEG_INF
    return logits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [0, 1, 20, 64, 300])
def test_logprobs_rows_over_several_segments(backend, k):
    """The CUDA split into segments: each path of a segment's top-k, the merge across segments (ties to
    the lower index), and a row's result independent of the rows beside it, bit for bit."""
    device = device_of(backend)
    V = (4 if k <= 32 else 2) * sampling._LOGPROBS_SEGMENT + 905  # large k: blocks of tl.topk, slow interpreted
    logits = _rows_over_segments(V).to(device)
    token_ids = torch.tensor([int(logits[0].argmax()), 10, V - 2, -1, V, 7], device=device)
    if k > 32:
        logits, token_ids = logits[2:5], token_ids[2:5]
    out = run_op(backend, "logprobs", logits, token_ids, k)
    assert_logprobs(out, logits, token_ids, k)
    if k == 20:
        for t in (1, 4):
            alone = run_op(backend, "logprobs", logits[t:t + 1].clone(), token_ids[t:t + 1].clone(), k)
            for a, b in zip(alone, out):
                assert torch.equal(a[0], b[t])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [2, 7, 33, 64])
def test_logprobs_ties_at_the_kth_group_and_token(backend, k):
    """Few distinct values, so that many groups share the k-th largest maximum and many tokens the
    k-th largest logit: the lower groups and tokens are kept, in order."""
    device = device_of(backend)
    V = 3 * sampling._LOGPROBS_SEGMENT + 77
    gen = torch.Generator().manual_seed(k)
    logits = torch.randint(0, 4, (4, V), generator=gen).float()
    logits[1] = torch.where(torch.rand(V, generator=gen) < 0.001, 1.0, 0.0)  # k-th largest among zeros
    logits[2, :V // 2] = NEG_INF
    logits[3, -100:] = 5.0  # the largest at the end of the row, tied
    logits = logits.to(device)
    token_ids = torch.tensor([0, 3, V - 1, V - 50], device=device)
    assert_logprobs(run_op(backend, "logprobs", logits, token_ids, k), logits, token_ids, k)


@pytest.mark.parametrize("backend", OP_BACKENDS)  # interpreted: minutes, and the segments tests cover Triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 20, 64, 300])
def test_logprobs_ties_at_the_bound(backend, dtype, k):
    """The CPU kernel offers its top-k list only the logits at least a lower bound of the k-th largest
    (the k-th largest of disjoint groups' maxima): ties at that bound, within and across blocks of 64
    tokens and in the tail past the last full block; a bound at -inf (fewer finite logits than k, NaN
    among them); few distinct values; the largest logits in the tail."""
    device = device_of(backend)
    V = 64 * 100 + 37
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(6, V, generator=gen) * 3
    logits[0, torch.randperm(V, generator=gen)[:3 * k]] = 12.0  # more ties at the k-th largest than k
    logits[0, V - 5:] = 12.0
    logits[1, torch.arange(k) * (V // k)] = 12.0  # the k largest, one a group: the bound is the k-th
    logits[1, [V - 1, 3]] = 12.0
    logits[2] = NEG_INF
    logits[2, torch.randperm(V, generator=gen)[:k // 2]] = torch.randn(k // 2, generator=gen)
    logits[2, ::5] = float("nan")
    logits[3] = torch.randint(0, 3, (V,), generator=gen).float()
    logits[4, V - 30:] = 20.0 + torch.arange(30.0) % 4  # the largest in the tail, tied in fours
    logits[5] = 1.0
    logits[5, 7::64] = float("nan")
    logits = logits.to(dtype).to(device)
    token_ids = torch.tensor([V - 1, 3, 0, 1, V - 2, 64], device=device)
    assert_logprobs(run_op(backend, "logprobs", logits, token_ids, k), logits, token_ids, k)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 2, 64, 300])
def test_logprobs_signed_zeros_tie(backend, k):
    """-0.0 and +0.0 are equal logits: the lower index goes first whatever the signs, in a segment,
    across segments and among the k-th largest (the keys the kernels sort by ignore the sign of 0)."""
    device = device_of(backend)
    seg = sampling._LOGPROBS_SEGMENT
    V = 2 * seg + 300
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5)) * 3 - 100
    logits[0, [5, seg + 3, 2 * seg + 1]] = torch.tensor([-0.0, 0.0, -0.0])
    logits[1] = torch.where(torch.arange(V) % 3 == 1, 0.0, -0.0)  # all tied, signs mixed
    logits[2, [9, 40, seg + 7]] = torch.tensor([0.0, -0.0, 0.0])
    logits[2, 20] = 1.0
    logits = logits.to(device)
    token_ids = torch.tensor([seg + 3, 4, 40], device=device)
    out = run_op(backend, "logprobs", logits, token_ids, k)
    assert_logprobs(out, logits, token_ids, k)
    assert out[0][0, :min(k, 3)].tolist() == [5, seg + 3, 2 * seg + 1][:k]
    assert out[0][1].tolist() == list(range(min(k, V)))
    assert out[0][2, :min(k, 4)].tolist() == [20, 9, 40, seg + 7][:k]
    assert out[3].tolist() == [1, 1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("V", [1024, 2 * 1024 + 5])
def test_logprobs_largest_k(backend, V, gen):
    """k = 1024 (the largest), = V for V = 1024, over several segments with -inf ties in the tail."""
    device = device_of(backend)
    logits = make_logits(2, V, torch.float32, device, generator=gen)
    logits[1, V // 3:] = NEG_INF
    token_ids = torch.tensor([5, V - 1], device=device)
    assert_logprobs(run_op(backend, "logprobs", logits, token_ids, 1024), logits, token_ids, 1024)


def test_logprobs_rejects_bad_k():
    logits, ids = torch.randn(2, 10), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="'num_logprobs'"):
        torch.ops.sampling.logprobs(logits, ids, 11)
    with pytest.raises(ValueError, match="'num_logprobs'"):
        torch.ops.sampling.logprobs(logits, ids, -1)


# ----------------------------------------------------------------------------------------------
# sample


def sample_args(T, V, gen, device, *, R=4, dtype=torch.float32, scale=3.0):
    """Random rows and parameters: greedy, plain, min_p, top-k, top-p and combined slots."""
    logits = make_logits(T, V, dtype, device, generator=gen, scale=scale)
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.9, 2.0][:R])
    top_k = torch.tensor([0, 0, 5, 0, 20, 3][:R], dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.8, 0.9, 0.5][:R])
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.1, 0.0][:R])
    seeds = torch.randint(-(2**62), 2**62, (R,), generator=gen)
    idx_mapping = torch.randint(-1, R + 1, (T,), generator=gen, dtype=torch.int32)
    output_lens = torch.randint(0, 1000, (T,), generator=gen)
    return [logits] + [a.to(device) for a in (idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens)]


def _broadcast_params(R, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234):
    return (torch.full((R,), temperature), torch.full((R,), top_k, dtype=torch.int32), torch.full((R,), top_p),
            torch.full((R,), min_p), torch.full((R,), seed, dtype=torch.int64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sample_matches_reference(backend, dtype, gen):
    """Every token equals the float64 reference's, except where float32 rounding decides a near tie;
    every drawn token lies in the filtered set."""
    device = device_of(backend)
    args = sample_args(37, 1000, gen, device, R=6, dtype=dtype)
    before = args[0].clone()
    out = run_op(backend, "sample", *args)
    assert torch.equal(args[0], before), "sample modified the logits"
    cpu = [a.cpu() for a in args]
    assert_sample_basics(out.cpu(), cpu)
    agree = (out.cpu() == reference.sample(*cpu)).double().mean().item()
    assert agree >= 0.9, f"only {agree:.2%} of tokens match the reference"


def assert_inside_filtered_set(tokens, cpu_args, compute_dtype=torch.float64):
    filtered = reference.filtered_logits(*cpu_args[:6], compute_dtype=compute_dtype)
    ok = tokens >= 0
    assert bool((filtered[ok.nonzero().squeeze(1), tokens[ok]] > NEG_INF).all()), "a token outside the filtered set"


def assert_sample_basics(tokens, cpu_args, compute_dtype=torch.float64):
    """What every drawn batch satisfies: tokens inside the filtered set (the reference in
    compute_dtype), -1 for a slot out of range, greedy rows exactly their argmax."""
    assert_inside_filtered_set(tokens, cpu_args, compute_dtype)
    slots, R = cpu_args[1].long(), cpu_args[2].numel()
    invalid = (slots < 0) | (slots >= R)
    assert bool((tokens[invalid] == -1).all())
    greedy = ~invalid & (cpu_args[2][slots.clamp(0, R - 1)] == 0)
    assert torch.equal(tokens[greedy], cpu_args[0].float()[greedy].argmax(dim=1))


FILTERED = [dict(top_k=12, temperature=1.5), dict(top_p=0.8), dict(top_k=20, top_p=0.9, min_p=0.02),
            dict(temperature=0.7, min_p=0.05)]
# The interpreter runs a filtered row's launches (bound, scan, gather, selection) at tens of ms a row:
# its cases stay unfiltered; the CPU kernel and CUDA take every case (the CPU vs Triton agreement
# test covers the interpreter's filtered rows).
CHI_SQUARE_CASES = [pytest.param("cpu", 20000, p, id=f"cpu-{p}") for p in [dict()] + FILTERED] + [
    pytest.param("interpret", 800, dict(), id="interpret-{}", marks=pytest.mark.interpret)] + [
    pytest.param("cuda", 20000, p, id=f"cuda-{p}", marks=pytest.mark.cuda) for p in [dict()] + FILTERED]


@pytest.mark.parametrize("backend, draws, params", CHI_SQUARE_CASES)
def test_sample_distribution_chi_square(backend, draws, params):
    """Many draws of one row (positions 0..n-1 of one seed) against the float64 filtered softmax."""
    V = 40
    row = torch.randn(V, generator=torch.Generator().manual_seed(5)) * 2
    logits = row.expand(draws, V).contiguous()
    R = 1
    temperature, top_k, top_p, min_p, seeds = _broadcast_params(R, **params)
    idx_mapping = torch.zeros(draws, dtype=torch.int64)
    output_lens = torch.arange(draws)
    args = [logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens]
    tokens = run_op(backend, "sample", *[a.to(device_of(backend)) for a in args]).cpu()
    assert bool((tokens >= 0).all())
    probs = torch.softmax(reference.filtered_logits(*[a[:1] for a in args[:2]], *args[2:6])[0], dim=0)
    counts = torch.bincount(tokens, minlength=V).double()
    assert bool((counts[probs == 0] == 0).all()), "a removed token was drawn"
    df = int((probs > 0).sum()) - 1
    if df > 0:
        assert _chi_square(counts, probs) < _chi_square_bound(df)


@pytest.mark.parametrize("backend, draws", [("cpu", 300), pytest.param("cuda", 20000, marks=pytest.mark.cuda)])
@pytest.mark.parametrize("params", [dict(), dict(top_k=50, top_p=0.9, temperature=0.8)], ids=str)
def test_sample_distribution_chi_square_full_vocabulary(backend, draws, params):
    """V = 151936, a peaked row (a few tokens hold most of the mass), one row expanded to many positions."""
    V = 151936
    gen = torch.Generator().manual_seed(9)
    row = torch.randn(V, generator=gen) * 3
    row[torch.randperm(V, generator=gen)[:6]] += torch.tensor([14.0, 13.5, 13.0, 12.0, 11.0, 10.0])
    device = device_of(backend)
    logits = row.to(device).expand(draws, V)  # row stride 0: one row read at every position
    temperature, top_k, top_p, min_p, seeds = _broadcast_params(1, **params)
    args = [logits, torch.zeros(draws, dtype=torch.int64), temperature, top_k, top_p, min_p, seeds,
            torch.arange(draws)]
    args = [args[0]] + [a.to(device) for a in args[1:]]
    tokens = run_op(backend, "sample", *args).cpu()
    probs = torch.softmax(reference.filtered_logits(row.unsqueeze(0), torch.zeros(1, dtype=torch.int64),
                                                    *[a.cpu() for a in args[2:6]])[0], dim=0)
    counts = torch.bincount(tokens, minlength=V).double()
    assert bool((counts[probs == 0] == 0).all()), "a removed token was drawn"
    df = max(int((probs * draws >= 5).sum()), 1)  # categories kept by the pooling of _chi_square
    assert _chi_square(counts, probs) < _chi_square_bound(df)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_batch_invariance_and_positions(backend, gen):
    """A row's token depends on its row, parameters, seed and position only: alone or inside a batch of
    37 with other parameters, the same token; a new position gives new draws."""
    device = device_of(backend)
    args = sample_args(37, 700, gen, device, R=6)
    batch = run_op(backend, "sample", *args)
    again = run_op(backend, "sample", *args)
    assert torch.equal(batch, again)
    for t in (0, 11, 36):
        alone = [args[0][t:t + 1], args[1][t:t + 1], *args[2:7], args[7][t:t + 1]]
        assert run_op(backend, "sample", *alone).item() == batch[t].item()
    # Plain draws from a flat row: positions change the token.
    R = 1
    flat = torch.zeros(16, 700, device=device)
    params = [p.to(device) for p in _broadcast_params(R)]
    slots = torch.zeros(16, dtype=torch.int64, device=device)
    first = run_op(backend, "sample", flat, slots, *params, torch.zeros(16, dtype=torch.int64, device=device))
    moved = run_op(backend, "sample", flat, slots, *params, torch.arange(16, device=device) + 1)
    assert len(set(first.tolist())) == 1  # same seed, same position: the same token
    assert len(set(moved.tolist())) > 8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("R", [2, 6], ids=["greedy-and-plain", "all-kinds"])
def test_sample_reads_rows_of_a_larger_stride(backend, R, gen):
    """Logits whose rows are wider apart than V draw the tokens of a contiguous copy (greedy and plain
    rows alone are drawn from the logits in place on CPU)."""
    device = device_of(backend)
    args = sample_args(9, 700, gen, device, R=R)
    wide = make_logits(9, 1000, torch.float32, device, generator=gen)
    wide[:, :700] = args[0]
    tokens = run_op(backend, "sample", wide[:, :700], *args[1:])
    assert torch.equal(tokens, run_op(backend, "sample", *args))
    assert bool((tokens >= -1).all()) and bool((tokens < 700).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_rows_without_finite_logits(backend):
    device = device_of(backend)
    V = 300
    logits = torch.randn(4, V)
    logits[0] = NEG_INF
    logits[1] = float("nan")
    logits[2, :] = NEG_INF
    logits[2, 123] = 0.5  # one live token: always drawn
    logits[3, ::2] = float("nan")  # NaN tokens are never drawn
    logits = logits.to(device)
    for temperature, top_k, top_p, min_p in [(1.0, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.8, 5, 0.9, 0.1)]:
        params = [p.to(device) for p in _broadcast_params(1, temperature, top_k, top_p, min_p)]
        out = run_op(backend, "sample", logits, torch.zeros(4, dtype=torch.int64, device=device), *params,
                     torch.arange(4, device=device)).cpu()
        assert out[0] == -1 and out[1] == -1 and out[2] == 123
        assert out[3] % 2 == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_approximate_gumbel_noise_is_within_its_tolerance(backend):
    """Every one of the 2**23 uniforms (cpu and cuda: all of them, the C++ kernel's vectorized
    noise and the hardware log2): the approximate noise lies within 2**-17 * (1 + |noise|) of the
    exact one, inside the tolerance the draw assumes."""
    step = 4099 if backend == "interpret" else 1  # the interpreter: a spread of 2047 values, both ends included
    m = torch.cat([torch.arange(0, 2**23, step), torch.tensor([2**23 - 1])])
    if backend == "cpu":
        exact, approx = _C.gumbel_noise(m << 9)
    else:
        exact, approx = gumbel.gumbel_noise_triton((m << 9).to(device_of(backend)))
    err = (approx.double() - exact.double()).abs().cpu()
    bound = 2.0**-17 * (1 + approx.double().abs().cpu())
    assert bool((err <= bound).all()), f"largest error / bound: {(err / bound).max().item():.3g}"
    assert 2.0**-17 * 35 <= gumbel.GUMBEL_APPROX_TOL * 35  # the draw's err(s) covers the noise's


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_score_token_keys_rank_pairs_as_the_draw_does(backend):
    """The int64 keys the draws reduce a round's exact scores with order (score, token) pairs by the
    larger score, then the lower token, on signed zeros, infinities, subnormals and ties, and give
    both back (-0.0 as +0.0)."""
    gen = torch.Generator().manual_seed(41)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 1.5, -1.5, 3.4e38, -3.4e38])
    scores = torch.cat([specials, torch.randn(500, generator=gen) * 10, torch.randn(6, generator=gen).repeat(20)])
    tokens = torch.cat([torch.tensor([-1, 2**31 - 1]), torch.randint(-4, 2**31 - 1, (scores.numel() - 2,),
                                                                        generator=gen)]).to(torch.int32)
    keys, back_scores, back_tokens = gumbel.score_token_keys_triton(scores.to(device_of(backend)),
                                                                    tokens.to(device_of(backend)))
    keys, back_scores, back_tokens = keys.cpu(), back_scores.cpu(), back_tokens.cpu()
    assert torch.equal(back_scores, scores + 0.0) and torch.equal(back_tokens, tokens)  # + 0.0: -0.0 to +0.0
    i, j = torch.meshgrid(torch.arange(scores.numel()), torch.arange(scores.numel()), indexing="ij")
    ranks_above = (scores[i] > scores[j]) | ((scores[i] == scores[j]) & (tokens[i] < tokens[j]))
    assert torch.equal(keys[i] > keys[j], ranks_above)


def test_cpu_draw_skips_only_blocks_whose_noise_is_below_the_level():
    """The CPU draws skip a block of 4 tokens when its largest logit plus `noise_upper` of its block
    bits stays below a level: on all 2**23 uniforms, the bound lies above the block's largest noise
    -log(-log(u) / 4) in float32, and within 0.2 of it wherever that noise is above 3."""
    m = torch.arange(0, 2**23)
    u = reference.stream_uniform(m << 9, torch.float32)
    block = -torch.log(-torch.log(u) * 0.25)
    upper = _C.noise_upper(m << 9)
    assert bool((block < upper).all())
    assert bool((upper[block > 3] - block[block > 3] < 0.2).all())


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_cpu_draw_with_skipped_tokens_gives_the_exact_draw(scale):
    """Rows where most tokens cannot come near the best (large logit spreads, the largest logits
    first or last in the row, temperatures 1 and 0.5): the same tokens as scoring every token
    exactly (the kernel's tolerance so large that it skips nothing and certifies nothing)."""
    gen = torch.Generator().manual_seed(31)
    T, V = 48, 32000
    logits = torch.randn(T, V, generator=gen) * scale
    logits[::3] = logits[::3].sort(dim=1).values  # the best tokens last
    logits[1::3] = logits[1::3].sort(dim=1, descending=True).values  # ... and first
    R = 2
    idx_mapping = torch.arange(T, dtype=torch.int32) % R
    temperature, top_k, top_p, min_p = torch.tensor([1.0, 0.5]), torch.zeros(R, dtype=torch.int32), torch.ones(R), \
        torch.zeros(R)
    seeds, output_lens = torch.tensor([5, -77]), torch.arange(T) * 13
    args = (logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens)
    fast = _C.sample(*args)
    assert torch.equal(fast, _C.sample(*args, tol=1e30))
    assert bool((fast >= 0).all())


def test_cpu_and_triton_draws_share_their_tolerance():
    assert _C.GUMBEL_APPROX_TOL == gumbel.GUMBEL_APPROX_TOL


def exact_draw(backend, args, monkeypatch):
    """sample's tokens with a tolerance so large that every row (every tile on CUDA) is scored
    exactly: GUMBEL_APPROX_TOL for the Triton draw, the C++ kernel's `tol` argument on the CPU."""
    if backend == "cpu":
        return _C.sample(*args, tol=1e30)
    monkeypatch.setattr(gumbel, "GUMBEL_APPROX_TOL", 1e30)
    return run_op(backend, "sample", *args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_exact_rescoring_gives_the_exact_draw(backend, monkeypatch):
    """The draw scores tiles approximately and rescores candidates exactly: its tokens equal those
    of scoring every token exactly (a tolerance so large that every tile is rescored whole)."""
    gen = torch.Generator().manual_seed(21)
    T, V = {"cuda": (512, 151936), "cpu": (64, 32000)}.get(backend, (6, 3000))
    args = sample_args(T, V, gen, device_of(backend), R=6)
    args[1] = torch.randint(1, 6, (T,), generator=gen).to(args[1])  # no greedy rows: they draw no noise
    fast = run_op(backend, "sample", *args)
    exact = exact_draw(backend, args, monkeypatch)
    assert torch.equal(fast, exact)
    assert bool((fast >= 0).all())


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("tol", [2.0**-10, 2.0**-6], ids=["tol_2e-10", "tol_2e-6"])
def test_sample_full_lanes_give_the_exact_draw(backend, tol, monkeypatch):
    """Whole-row draws whose lanes hold a third block reaching the floor (made common by a wide
    tolerance) score those lanes block by block (`_DRAW_FULL_LANES`): the tokens of the exact pass
    taking every such row (0 full lanes allowed) and of every token scored (a tolerance of 1e30)."""
    gen = torch.Generator().manual_seed(22)
    if backend == "cuda":
        T, V, split_max_t = 256, 151936, current_settings().split_draw_max_t
    else:  # whole rows at T = 6, in 256-token tiles: 12 tiles a lane
        T, V, split_max_t = 6, 3001, 1
        monkeypatch.setattr(sampling, "_DRAW_BLOCK_V", 256)
    args = sample_args(T, V, gen, device_of(backend), R=6)
    args[1] = torch.randint(1, 6, (T,), generator=gen).to(args[1])  # no greedy rows: they draw no noise
    args[3].zero_()  # no filter: every row takes the whole-row draw
    args[4].fill_(1.0)
    args[5].zero_()

    def draw(full_lanes, tol):
        monkeypatch.setattr(sampling, "_DRAW_FULL_LANES", full_lanes)
        monkeypatch.setattr(gumbel, "GUMBEL_APPROX_TOL", tol)
        _call_cache.clear()  # the constants are read when a call is recorded
        with use_settings(split_draw_max_t=split_max_t):
            return run_op(backend, "sample", *args)

    lanes = sampling._DRAW_BLOCK_V // 4
    rounds, exact_pass, every_token = draw(lanes, tol), draw(0, tol), draw(lanes, 1e30)
    assert torch.equal(rounds, exact_pass) and torch.equal(rounds, every_token)
    assert bool((rounds >= 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_exact_rescoring_at_the_edges(backend, monkeypatch):
    """Rows the certificate must get right or leave to the exact pass: one live token in a segment,
    none, a scaled logit overflowing to -inf or +inf, ties of equal logits: the exact scores' tokens."""
    V = 3 * current_settings().draw_segment + 5
    logits = torch.full((6, V), NEG_INF)
    logits[0, 7] = 2.0  # one live token in the row: its segments hold it alone or nothing
    logits[2, :] = -3e38  # divided by 0.01: -inf, no longer a live token ...
    logits[2, V - 3] = -1e30  # ... but this one
    logits[3, :50] = 3e38  # divided by 0.01: +inf
    logits[4, :] = 1.5  # all equal: the noise alone decides
    logits[5, ::3] = torch.randn(len(range(0, V, 3)), generator=torch.Generator().manual_seed(4))
    temperature = torch.tensor([1.0, 1.0, 0.01, 0.01, 0.7, 1.3])
    R = 6
    args = [logits, torch.arange(R), temperature, torch.zeros(R, dtype=torch.int32), torch.ones(R), torch.zeros(R),
            torch.arange(R, dtype=torch.int64) * 977, torch.arange(R) + 3]
    args = [a.to(device_of(backend)) for a in args]
    fast = run_op(backend, "sample", *args).cpu()
    exact = exact_draw(backend, args, monkeypatch).cpu()
    assert torch.equal(fast, exact)
    assert fast.tolist()[:4] == [7, -1, V - 3, 0]  # row 3: +inf scores, the lowest index
    if backend != "cpu":
        with use_settings(split_draw_max_t=0):  # whole rows in one program
            assert torch.equal(run_op(backend, "sample", *args).cpu(), exact)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_rows_without_first_arrivals_score_every_block(backend, monkeypatch):
    """Rows with the first arrival of every block removed (the token whose noise is its block's
    largest): no score is realised, so every block with a live token reaches the floor and is scored
    exactly, over many rounds of slots, in segments and in whole rows: the exact scores' tokens."""
    T, V = 4, 3001
    logits = torch.randn(T, V, generator=torch.Generator().manual_seed(12)) * 3
    seeds = torch.arange(T, dtype=torch.int64) * 131 + 5
    output_lens = torch.arange(T) + 9
    blocks = torch.arange((V + 3) // 4)
    key = reference.stream_key(seeds, output_lens).unsqueeze(1)
    first = blocks * 4 + (reference.stream_bits(key, reference.BLOCK_COUNTER | blocks) & 3)
    for t in range(T):
        logits[t, first[t][first[t] < V]] = NEG_INF
    args = [logits, torch.arange(T), torch.tensor([1.0, 0.7, 1.0, 2.0]), torch.zeros(T, dtype=torch.int32),
            torch.ones(T), torch.zeros(T), seeds, output_lens]
    args = [a.to(device_of(backend)) for a in args]
    exact = exact_draw(backend, args, monkeypatch).cpu()
    assert torch.equal(run_op(backend, "sample", *args).cpu(), exact)
    assert bool((exact >= 0).all())
    if backend != "cpu":
        with use_settings(split_draw_max_t=0):  # whole rows in one program
            assert torch.equal(run_op(backend, "sample", *args).cpu(), exact)


def make_near_ties(logits, noise, offsets, temperature):
    """Makes the best Gumbel scores x / temperature + noise of row t of `logits` (in place) near ties,
    2e-4 apart (well inside the approximate scores' tolerance): its best token a and a + offsets[t]
    (in different or the same lanes of the draws' tiles), and a third token in the last row. Returns
    the token each row must draw."""
    T, V = logits.shape
    expected = []
    for t, d in enumerate(offsets):
        temp = float(temperature[t])
        score = (logits[t] / temp + noise[t]).double()
        a = int(score.argmax())
        others = [(a + d) % V] + ([(a + 2 * d + 11) % V] if t == T - 1 else [])
        for i, b in enumerate(others):
            delta = 2e-4 * (i + 1) * (1 if t % 2 else -1)  # b wins on odd rows
            logits[t, b] = temp * (float(score[a]) + delta - float(noise[t, b]))
        score = (logits[t] / temp + noise[t]).double()
        top2 = score.topk(2)
        assert float(top2.values[0] - top2.values[1]) > 5e-5  # the winner stands clear of float32 rounding
        expected.append(int(top2.indices[0]))
    return expected


def stream_noise(seeds, output_lens, V):
    """[len(seeds), V] float32 Gumbel noise of the reference stream at each (seed, position)."""
    return reference.stream_noise(reference.stream_key(seeds, output_lens).unsqueeze(1), torch.arange(V), torch.float32)


def _near_tie_rows(V, gen):
    """sample's arguments for rows whose best Gumbel scores are near ties (`make_near_ties`: two
    tokens 1 to 8192 apart, three in the last row), with the token each row must draw."""
    offsets = [1, 3, 37, 1024, 2048, 4096, 8192, 5]
    T = len(offsets)
    temperature = torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 0.7, 1.0, 1.0])
    seeds = torch.randint(0, 2**62, (T,), generator=gen)
    output_lens = torch.randint(0, 1000, (T,), generator=gen)
    logits = torch.randn(T, V, generator=gen) * 3
    expected = make_near_ties(logits, stream_noise(seeds, output_lens, V), offsets, temperature)
    zeros = torch.zeros(T)
    args = [logits, torch.arange(T), temperature, torch.zeros(T, dtype=torch.int32), torch.ones(T), zeros, seeds,
            output_lens]
    return args, expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_near_ties_give_the_exact_draw(backend, monkeypatch):
    """Near ties of the best scores, between lanes (settled by rescoring the lanes' leaders) or within
    one (the exact pass): the exact draw, in split and whole-row programs."""
    V = 3 * current_settings().draw_segment + 5
    args, expected = _near_tie_rows(V, torch.Generator().manual_seed(8))
    args = [a.to(device_of(backend)) for a in args]
    assert run_op(backend, "sample", *args).cpu().tolist() == expected
    if backend != "cpu":
        with use_settings(split_draw_max_t=0):  # whole rows in one program
            assert run_op(backend, "sample", *args).cpu().tolist() == expected
    assert exact_draw(backend, args, monkeypatch).cpu().tolist() == expected


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_sample_grouped_scan_programs_give_the_same_tokens(backend):
    """From scan_group_min_t rows the filtered rows' scan takes several segments a program: the same
    tokens."""
    gen = torch.Generator().manual_seed(23)
    args = sample_args(6, 3 * 4096 + 11, gen, device_of(backend), R=6)
    args[1] = torch.arange(6).to(args[1])
    alone = run_op(backend, "sample", *args)
    with use_settings(scan_group_min_t=1, scan_group=3):
        grouped = run_op(backend, "sample", *args)
    assert torch.equal(alone, grouped)


# min_p alone, with top_p, with top_k; all three; top_p alone; a min_p threshold far below the list.
FILTER_PATH_PARAMS = [dict(min_p=0.1), dict(min_p=0.1, top_p=0.8), dict(min_p=0.3, top_k=7),
                      dict(top_k=7, top_p=0.6, min_p=0.05, temperature=0.6), dict(top_p=0.9, temperature=1.7),
                      dict(min_p=1e-4, temperature=0.8)]


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("params", FILTER_PATH_PARAMS, ids=str)
@pytest.mark.parametrize("gather_in_draw_min_t", [1, 1 << 30], ids=["gathered-by-the-drawing-program",
                                                                   "gather-launch"])
def test_sample_filtered_rows_listed_and_general_paths(backend, params, gather_in_draw_min_t):
    """A filtered row is drawn from its listed candidates (gathered by a launch of their own, or by
    the program that draws the row) or, when they may miss a kept token (here every segment over a
    capacity of 2, or min_p's threshold below the list), by the general path on a copy of the row:
    each draws the C++ kernel's tokens, and the logits stay as they were."""
    gen = torch.Generator().manual_seed(31)
    T, V = 6, 1100
    temperature, top_k, top_p, min_p, seeds = _broadcast_params(1, **params)
    args = [torch.randn(T, V, generator=gen) * 3, torch.zeros(T, dtype=torch.int32), temperature, top_k, top_p,
            min_p, seeds, torch.arange(T) * 7]
    expected = torch.ops.sampling.sample(*args)
    args = [a.to(device_of(backend)) for a in args]
    before = args[0].clone()
    with use_settings(gather_in_draw_min_t=gather_in_draw_min_t):
        listed = run_op(backend, "sample", *args)
        with use_settings(seg_cap=2):
            general = run_op(backend, "sample", *args)
    assert torch.equal(listed.cpu(), expected)
    assert torch.equal(general.cpu(), expected)
    assert torch.equal(args[0], before)


@pytest.mark.parametrize("T, kernels", [
    (1, ["_draw_kernel", "_scan_segments_kernel", "_gather_chunks_kernel", "_select_kernel"]),
    (32, ["_draw_kernel", "_scan_segments_kernel", "_settle_kernel", "_gather_chunks_kernel", "_select_kernel"]),
    (256, ["_draw_kernel", "_scan_segments_kernel", "_select_kernel"]),
])
def test_sample_launches(monkeypatch, T, kernels):
    """sample's launches on CUDA (recorded, not run): the first both draws the rows without a filter
    and stores the filtered rows' bounds, and the scan reduces a split draw, so no launch of their
    own; the split is below split_draw_max_t rows (one program a draw segment)."""
    from torch_sampling_ops.truncation import op as truncation_op
    launched = []

    def record(kernel, grid, *args, **meta):
        launched.append((getattr(getattr(kernel, "fn", kernel), "__name__", ""), grid))

    monkeypatch.setattr(sampling, "launch", record)
    monkeypatch.setattr(truncation_op, "launch", record)
    settings = current_settings()
    V = 3 * settings.draw_segment + 1
    sampling._sample_triton(*sample_args(T, V, torch.Generator().manual_seed(5), torch.device("cpu")))
    assert [name for name, _ in launched] == kernels
    segments = -(-V // settings.draw_segment_for(T))
    assert launched[0][1] == ((T, segments) if T < settings.split_draw_max_t else (T, 1))
    assert segments == (4 if T < settings.wide_draw_min_t else 2)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_sample_row_split_gives_the_same_tokens(backend):
    """The draw splits rows into segments below split_draw_max_t rows, wider ones from
    wide_draw_min_t; split either way or not at all, the same tokens."""
    gen = torch.Generator().manual_seed(13)
    V = 2 * current_settings().wide_draw_segment + 904  # 5 narrow segments, 3 wide ones
    args = sample_args(6, V, gen, device_of(backend), R=6)
    args[1] = torch.tensor([0, 1, 2, 3, -1, 1]).to(args[1])
    split = run_op(backend, "sample", *args)
    with use_settings(split_draw_max_t=0):
        whole = run_op(backend, "sample", *args)
    with use_settings(wide_draw_min_t=1):  # the wider segments of larger batches
        wide = run_op(backend, "sample", *args)
    assert torch.equal(split, whole)
    assert torch.equal(wide, whole)
    assert split[4] == -1
    assert (split.cpu() == torch.ops.sampling.sample(*[a.cpu() for a in args])).sum() >= 5


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_sample_tile_edges(backend, monkeypatch):
    """The draws walk whole tiles unmasked and the partial tile at the end masked: rows that end on a
    tile, one, two or three tokens past it (a block of 4 cut by the row's end) or inside the first
    tile, split into segments and whole. Greedy rows with their maximum in the last token, the last
    token of the last whole tile and (tied) the first token; plain rows equal the exact draw."""
    gen = torch.Generator().manual_seed(17)
    tile = sampling._DRAW_BLOCK_V  # the whole-row tile; a split row's segment is whole tiles
    for V in (tile // 2 + 3, tile, tile + 1, tile + 2, 2 * tile + 3):
        logits = torch.randn(6, V, generator=gen) * 3
        last_whole = V // tile * tile - 1 if V >= tile else V - 1
        logits[0, V - 1] = logits[1, last_whole] = 20.0
        logits[2, 0] = logits[2, V - 1] = 30.0
        seeds = torch.arange(6, dtype=torch.int64) * 977 + 3
        args = [logits, torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0.0, 0.8]), torch.zeros(2, dtype=torch.int32),
                torch.ones(2), torch.zeros(2), seeds[:2], torch.arange(6) * 13]
        args = [a.to(device_of(backend)) for a in args]
        for split_max in (current_settings().split_draw_max_t, 0):
            with use_settings(split_draw_max_t=split_max):
                out = run_op(backend, "sample", *args).cpu()
                with monkeypatch.context() as m:
                    exact = exact_draw(backend, args, m).cpu()
            assert out[:3].tolist() == [V - 1, last_whole, 0], (V, split_max)
            assert torch.equal(out, exact), (V, split_max)


@pytest.mark.interpret
def test_sample_cpu_and_triton_agree():
    """CPU (C++) and Triton draw the same tokens except at near ties (rate reported)."""
    gen = torch.Generator().manual_seed(11)
    args = sample_args(240, 512, gen, torch.device("cpu"), R=6)
    args[1] = torch.randint(0, 6, (240,), generator=gen)
    cpu = torch.ops.sampling.sample(*args)
    tri = run_op("interpret", "sample", *args)
    rate = (cpu == tri).double().mean().item()
    print(f"CPU vs Triton agreement: {rate:.4%} of {cpu.numel()} rows")
    assert rate >= 0.99


def test_sample_cpu_agrees_with_reference_at_scale():
    gen = torch.Generator().manual_seed(12)
    args = sample_args(10000, 256, gen, torch.device("cpu"), R=6)
    args[1] = torch.randint(0, 6, (10000,), generator=gen)
    rate = (torch.ops.sampling.sample(*args) == reference.sample(*args)).double().mean().item()
    print(f"CPU vs float64 reference agreement: {rate:.4%} of 10000 rows")
    assert rate >= 0.99


@pytest.mark.cuda
@pytest.mark.parametrize("V", [1024, 151936])
def test_sample_cpu_and_cuda_agree(V):
    """CPU (C++) and CUDA (Triton) on 10**4 rows of mixed parameters (rate reported with -s)."""
    gen = torch.Generator().manual_seed(14)
    T = 10000 if V == 1024 else 2000
    args = sample_args(T, V, gen, torch.device("cpu"), R=6)
    args[1] = torch.randint(0, 6, (T,), generator=gen)
    cpu = torch.ops.sampling.sample(*args)
    cuda = torch.ops.sampling.sample(*[a.cuda() for a in args]).cpu()
    rate = (cpu == cuda).double().mean().item()
    print(f"CPU vs CUDA agreement, V = {V}: {rate:.4%} of {T} rows")
    assert rate >= 0.99
    ids = torch.randint(-1, V, (T,), generator=gen)
    for c, g in zip(torch.ops.sampling.logprobs(args[0], ids, 20), torch.ops.sampling.logprobs(args[0].cuda(),
                                                                                              ids.cuda(), 20)):
        if c.is_floating_point():
            torch.testing.assert_close(g.cpu(), c, atol=1e-4, rtol=1e-5)
        else:
            assert torch.equal(g.cpu(), c)


@pytest.mark.cuda
def test_sample_cuda_graph_replays_draw_fresh_tokens():
    """Positions advanced on the device inside the graph give new draws at every replay."""
    device = torch.device("cuda")
    T, V = 8, 151936
    logits = torch.zeros(T, V, device=device)
    params = [p.to(device) for p in _broadcast_params(1)]
    slots = torch.zeros(T, dtype=torch.int64, device=device)
    positions = torch.arange(T, device=device)
    out = torch.empty(T, dtype=torch.int64, device=device)

    def step():
        out.copy_(torch.ops.sampling.sample(logits, slots, *params, positions))
        positions.add_(T)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    draws = []
    for _ in range(4):
        graph.replay()
        draws.append(out.clone())
        expected = torch.ops.sampling.sample(logits.cpu(), slots.cpu(), *[p.cpu() for p in params],
                                             positions.cpu() - T)
        assert (draws[-1].cpu() == expected).double().mean() >= 0.99
    assert len({tuple(d.tolist()) for d in draws}) == 4


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "plain"])
def test_sample_tokens_are_ready_for_the_next_kernel(temperature, gen):
    """In a batch the truncation launches leave alone, their programs leave without waiting for the
    draw (only each launch's first program waits), yet every launch finishes after the one before
    it: a kernel queued right after the op reads the drawn tokens, never the poison left in their
    memory."""
    T, V = 256, 151936
    logits = make_logits(T, V, torch.float32, "cuda", generator=gen, scale=3.0)
    params = [p.cuda() for p in _broadcast_params(T, temperature=temperature)]
    slots = torch.arange(T, device="cuda")
    positions = torch.arange(T, device="cuda")
    expected = torch.ops.sampling.sample(logits, slots, *params, positions)
    torch.cuda.synchronize()
    if temperature == 0.0:
        assert torch.equal(expected, logits.argmax(dim=1))
    copies = []
    for _ in range(20):
        # The allocator hands the op's output this freed block again, poisoned.
        torch.full((T,), -7, dtype=torch.int64, device="cuda")
        copies.append(torch.ops.sampling.sample(logits, slots, *params, positions).clone())
    for c in copies:
        assert torch.equal(c, expected)


@pytest.mark.cuda
def test_sample_past_2_pow_31_elements():
    from conftest import logits_past_2_pow_31

    logits = logits_past_2_pow_31()
    T, V = logits.shape
    logits[-1, 12345] = 100.0
    params = [p.cuda() for p in _broadcast_params(1)]
    out = torch.ops.sampling.sample(logits, torch.zeros(T, dtype=torch.int64, device="cuda"), *params,
                                    torch.arange(T, device="cuda"))
    assert out[-1].item() == 12345
    ids, lps, tlp, ranks = torch.ops.sampling.logprobs(logits, torch.full((T,), 12345, device="cuda"), 4)
    assert ids[-1, 0].item() == 12345 and ranks[-1].item() == 1


# ----------------------------------------------------------------------------------------------
# sample: mixed filters, ties and bad slots in one batch

KMAX = 64  # top_k values around it: KMAX - 1, KMAX


def _mixed_filter_args(T, V, gen, device):
    """Slots with small top_k with and without top_p / min_p, top_k KMAX - 1, KMAX and 0, greedy
    rows; idx_mapping also holds out-of-range slots."""
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.9, 2.0, 1.0, 0.5, 1.1, 0.8, 1.0])
    top_k = torch.tensor([0, 1, 5, 50, KMAX - 1, KMAX, 0, 20, 5, KMAX - 1, 3], dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.8, 1.0, 0.5, 0.9, 0.95, 1.0, 0.6, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.1, 0.0, 0.0, 0.02, 0.3, 0.0, 0.0])
    R = temperature.numel()
    logits = make_logits(T, V, torch.float32, device, generator=gen, scale=3.0)
    seeds = torch.randint(-(2**62), 2**62, (R,), generator=gen)
    idx_mapping = torch.randint(-2, R + 2, (T,), generator=gen)
    idx_mapping[:R] = torch.arange(R)  # every slot at least once
    output_lens = torch.randint(0, 1000, (T,), generator=gen)
    return [logits] + [a.to(device) for a in (idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens)]


def _assert_like_cpu(out, args, rate=0.97, compute_dtype=torch.float64):
    """Tokens in the filtered set (of the reference in compute_dtype), -1 for bad slots, greedy rows
    exact, and the C++ kernel's tokens except at near ties."""
    cpu_args = [a.cpu() for a in args]
    out = out.cpu()
    assert_sample_basics(out, cpu_args, compute_dtype)
    agree = (out == torch.ops.sampling.sample(*cpu_args)).double().mean().item()
    assert agree >= rate, f"only {agree:.2%} of tokens match the C++ kernel"


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_mixed_filters_in_one_batch(backend, gen):
    """V over several segments (of the interpreter too); every row written."""
    device = device_of(backend)
    V = 2500 if backend != "cuda" else 151936
    args = _mixed_filter_args(48, V, gen, device)
    out = run_op(backend, "sample", *args)
    _assert_like_cpu(out, args)
    alone = [args[0][3:4], args[1][3:4], *args[2:7], args[7][3:4]]
    assert run_op(backend, "sample", *alone).item() == out[3].item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_ties_at_the_kth_value(backend):
    """Rows of mostly equal values: ties at the k-th value (all kept), and a row with fewer live
    tokens than KMAX."""
    device = device_of(backend)
    V = 1500
    gen = torch.Generator().manual_seed(21)
    logits = torch.zeros(6, V)  # row 0: all equal
    logits[1, :100] = 2.0  # row 1: 100 tied tokens on top
    logits[1, 100:] = torch.randn(V - 100, generator=gen) - 5
    logits[2] = torch.randn(V, generator=gen)
    logits[2, torch.randperm(V, generator=gen)[:10]] = 5.0  # row 2: 10 tied tokens on top
    logits[3] = NEG_INF
    logits[3, torch.randperm(V, generator=gen)[:20]] = torch.randn(20, generator=gen)  # 20 live tokens
    logits[4] = torch.randn(V, generator=gen).round()  # few distinct values
    logits[5, ::3] = float("nan")
    temperature, top_k, top_p, min_p, seeds = _broadcast_params(3, temperature=0.9, top_k=5)
    top_p[1], min_p[2], top_k[2] = 0.7, 0.5, KMAX - 1
    idx_mapping = torch.tensor([0, 0, 1, 2, 0, 1]).repeat(4)
    logits = logits.repeat(4, 1)
    output_lens = torch.arange(24)
    args = [logits.to(device)] + [a.to(device) for a in (idx_mapping, temperature, top_k, top_p, min_p, seeds,
                                                          output_lens)]
    out = run_op(backend, "sample", *args)
    _assert_like_cpu(out, args, rate=1.0)
    assert len(set(out[0::6].tolist())) > 1  # a row of equal values draws from all of them
    assert bool((out[1::6] < 100).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_temperature_makes_ties(backend):
    """Distinct logits whose quotients by the temperature round to equal floats: the filters see the
    quotients (the ties are kept at the k-th value)."""
    device = device_of(backend)
    V = 1200
    gen = torch.Generator().manual_seed(22)
    logits = torch.randn(8, V, generator=gen) - 5
    # 1.5 + j ulp: consecutive floats whose quotients by 1.5 lie in [1, 4/3), where the ulp is twice theirs.
    steps = 1.5 + torch.arange(KMAX + 8, dtype=torch.float32) * 2**-23
    for t in range(8):
        logits[t, torch.randperm(V, generator=gen)[:steps.numel()]] = steps
    scaled = torch.div(logits[0], torch.tensor(1.5))
    assert scaled.unique().numel() < logits[0].unique().numel()  # the division made ties
    temperature, top_k, top_p, min_p, seeds = _broadcast_params(4, temperature=1.5)
    top_k[:] = torch.tensor([4, 5, KMAX - 1, 1], dtype=torch.int32)
    top_p[1] = 0.3
    idx_mapping = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    args = [logits.to(device)] + [a.to(device) for a in (idx_mapping, temperature, top_k, top_p, min_p, seeds,
                                                          torch.arange(8) * 5)]
    out = run_op(backend, "sample", *args)
    # The float32 reference: its division makes the same ties (float64 would keep the values apart).
    _assert_like_cpu(out, args, rate=1.0, compute_dtype=torch.float32)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_sample_writes_every_row(backend, monkeypatch, gen):
    """Every allocation of the op prefilled with a sentinel: each element of out is written, for bad
    slots too, and no workspace is read before it is written."""
    device = device_of(backend)
    args = _mixed_filter_args(24, 1300 if backend != "cuda" else 5003, gen, device)
    new_empty = torch.Tensor.new_empty

    def poisoned(self, *shape, **kwargs):
        x = new_empty(self, *shape, **kwargs)
        return x.fill_(float("nan") if x.is_floating_point() else 777777)

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)
    out = run_op("interpret" if backend == "interpret" else "cuda", "sample", *args)
    monkeypatch.undo()
    assert not bool((out == 777777).any())
    _assert_like_cpu(out, args)
