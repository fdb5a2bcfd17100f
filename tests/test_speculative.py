"""rejection_sample (speculative decoding's verification step) against the float64 reference, the
greedy rule by hand, and the distribution of the emitted tokens (chi-square, fixed seeds)."""
import math

import pytest
import torch
from test_sampling import _chi_square, _chi_square_bound, make_near_ties, stream_noise

from torch_sampling_ops import _C, _call_cache, gumbel, reference, speculative

from conftest import BACKENDS, DTYPES, OP_BACKENDS, TRITON_BACKENDS, device_of, make_logits, run_op

NEG_INF = float("-inf")


def cu_of(counts) -> torch.Tensor:
    counts = torch.as_tensor(counts, dtype=torch.int64)
    cu = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    cu[1:] = counts.cumsum(0)
    return cu


def spec_args(counts, V, gen, device, *, dtype=torch.float32, max_spec_len=3, with_probs=True, temperature=None,
              match=0.5):
    """Random target rows for ragged drafts `counts`; about a fraction `match` of the drafts equal their
    row's argmax (so greedy requests accept some), the others are random ids. Temperatures alternate
    greedy and random unless given."""
    B, N = len(counts), int(sum(counts))
    logits = make_logits(N + B, V, dtype, device, generator=gen)
    cu = cu_of(counts)
    rows = torch.cat([torch.arange(int(cu[i]) + i, int(cu[i + 1]) + i) for i in range(B)]).long()
    drafts = torch.randint(0, V, (N,), generator=gen)
    take = torch.rand(N, generator=gen) < match
    drafts[take] = logits.cpu().float()[rows].argmax(1)[take]
    probs = torch.softmax(torch.randn(N, V, generator=gen) * 2, dim=1) if with_probs else None
    if temperature is None:
        temperature = torch.tensor([0.0 if i % 3 == 0 else 1.0 for i in range(B)])
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
    output_lens = torch.randint(0, 1000, (B,), generator=gen)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return [logits, to(drafts), to(probs), to(cu), to(temperature), to(seeds), to(output_lens), max_spec_len]


def assert_matches_reference(out, args, *, allowed_mismatches=1):
    """The reference's tokens for every request, except where float32 rounding decides a near tie
    (at most `allowed_mismatches` requests); -1 padding past num_emitted."""
    tokens, num = (o.cpu() for o in out)
    cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    e_tokens, e_num = reference.rejection_sample(*cpu_args)
    assert tokens.dtype == torch.int64 and num.dtype == torch.int32
    assert tokens.shape == e_tokens.shape and num.shape == e_num.shape
    differ = (tokens != e_tokens).any(dim=1) | (num != e_num)
    assert int(differ.sum()) <= allowed_mismatches, f"{tokens[differ]} != {e_tokens[differ]}"
    places = torch.arange(tokens.shape[1])
    emitted = places < num.unsqueeze(1).long()
    assert bool((tokens[~emitted] == -1).all()) and bool((tokens[emitted] >= 0).all())


# ----------------------------------------------------------------------------------------------
# Against the reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_matches_reference(backend, dtype, with_probs, gen):
    """Ragged drafts (0 to max_spec_len), greedy and random requests mixed, a vocabulary past one block."""
    device = device_of(backend)
    args = spec_args([3, 0, 2, 1, 3, 3, 0, 2, 1], 5003, gen, device, dtype=dtype, with_probs=with_probs)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out = run_op(backend, "rejection_sample", *args)
    for a, b in zip(args, before):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, "an input was modified"
    assert_matches_reference(out, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_high_acceptance_reaches_the_bonus_row(backend, gen):
    """Drafts from a draft distribution close to the target: many requests accept everything and draw
    the bonus token; the result is still the reference's."""
    device = device_of(backend)
    V, counts = 64, [3] * 12
    args = spec_args(counts, V, gen, torch.device("cpu"), temperature=torch.ones(12))
    logits = args[0]
    cu = cu_of(counts)
    rows = torch.cat([torch.arange(int(cu[i]) + i, int(cu[i + 1]) + i) for i in range(12)]).long()
    p = torch.softmax(logits[rows].double(), 1)
    args[2] = (0.9 * p + 0.1 / V).float()  # q close to p
    args[1] = torch.multinomial(args[2], 1, generator=gen).squeeze(1)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    out = run_op(backend, "rejection_sample", *args)
    assert_matches_reference(out, args)
    assert int((out[1] == 4).sum()) >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_int32_ids_and_positions(backend, gen):
    """draft_token_ids and output_lens as int32: the same result as int64."""
    device = device_of(backend)
    args = spec_args([1, 3, 2, 0], 700, gen, device)
    out64 = run_op(backend, "rejection_sample", *args)
    args[1], args[6] = args[1].int(), args[6].int()
    out32 = run_op(backend, "rejection_sample", *args)
    assert torch.equal(out32[0], out64[0]) and torch.equal(out32[1], out64[1])
    assert_matches_reference(out32, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batches_and_no_speculation(backend, gen):
    """B = 0; N = 0 with max_spec_len = 0 (one token a request, [B, 1] outputs)."""
    device = device_of(backend)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    tokens, num = run_op(backend, "rejection_sample", torch.randn(0, 50, device=device), empty, None,
                         torch.zeros(1, dtype=torch.int32, device=device), torch.zeros(0, device=device), empty,
                         empty, 3)
    assert tokens.shape == (0, 4) and num.shape == (0,)
    args = spec_args([0, 0, 0], 50, gen, device, max_spec_len=0, with_probs=False)
    args[2] = torch.zeros(0, 50, device=device)  # empty draft probabilities
    tokens, num = run_op(backend, "rejection_sample", *args)
    assert tokens.shape == (3, 1) and num.tolist() == [1, 1, 1]
    assert_matches_reference((tokens, num), args, allowed_mismatches=0)


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_without_draft_probs_through_opcheck_and_compile(backend, gen):
    """draft_probs=None (the op table covers a tensor): opcheck, and torch.compile(fullgraph=True)."""
    device = device_of(backend)
    args = spec_args([2, 0, 3], 300, gen, device, with_probs=False)
    torch.library.opcheck(torch.ops.sampling.rejection_sample.default, args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch.ops.sampling.rejection_sample(*a), fullgraph=True)
    out = compiled(*args)
    eager = torch.ops.sampling.rejection_sample(*args)
    assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])


@pytest.mark.interpret
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_cpu_and_interpreter_agree(with_probs, gen):
    args = spec_args([2, 3, 0, 1, 3, 2], 4099, gen, torch.device("cpu"), with_probs=with_probs)
    cpu = run_op("cpu", "rejection_sample", *args)
    tri = run_op("interpret", "rejection_sample", *args)
    differ = (cpu[0] != tri[0]).any(dim=1) | (cpu[1] != tri[1])
    assert int(differ.sum()) <= 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_rows_over_several_chunks(backend, with_probs, gen):
    """A vocabulary of 4 CUDA chunks and a few tokens (partials combined across chunks, a ragged last
    chunk): a random request that accepts everything (bonus draw), one rejected at its first draft
    (the residual pass), a greedy one that accepts everything, a greedy argmax tied across chunks,
    zero-draft and one-draft requests; the maxima of the rows fall in different chunks."""
    device = device_of(backend)
    V = 4 * speculative._CHUNK + 5
    counts = [3, 3, 3, 0, 2, 1]
    args = spec_args(counts, V, gen, torch.device("cpu"), with_probs=with_probs,
                     temperature=torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    logits, drafts = args[0], args[1]
    cu = cu_of(counts)
    row = lambda i, j: int(cu[i]) + i + j  # noqa: E731  (target row of request i, position j)
    for j in range(3):  # request 0: each draft almost certain under the target, q(x) about 1/2
        drafts[j] = (j + 1) * speculative._CHUNK + 7
        logits[row(0, j), drafts[j]] = logits[row(0, j)].max() + 40.0
        if with_probs:
            args[2][j] = 0.5 * args[2][j]
            args[2][j, drafts[j]] += 0.5
    logits[row(1, 0), drafts[3]] = NEG_INF  # request 1: its first draft has no target probability
    for j in range(3):  # request 2 (greedy): each draft its row's argmax
        drafts[6 + j] = logits[row(2, j)].argmax()
    tie = row(4, 0)  # request 4 (greedy): a maximum tied in chunks 0 and 3; its first draft takes it
    logits[tie, 10] = logits[tie, 3 * speculative._CHUNK + 2] = logits[tie].max() + 1.0
    drafts[9] = 10
    drafts[10] = (logits[row(4, 1)].argmax() + 1) % V  # ... then a mismatch
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    tokens, num = (o.cpu() for o in run_op(backend, "rejection_sample", *args))
    assert_matches_reference((tokens, num), args)
    assert num.tolist()[:5] == [4, 1, 4, 1, 2]
    assert tokens[0, :3].tolist() == drafts[:3].tolist()
    assert tokens[2].tolist() == drafts[6:9].tolist() + [int(logits[row(2, 3)].argmax())]
    assert tokens[4].tolist() == [10, int(logits[row(4, 1)].argmax()), -1, -1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_exact_rescoring_gives_the_exact_draws(backend, with_probs, monkeypatch):
    """The residual and bonus draws score approximately and rescore the winners exactly: the same
    tokens as scoring every token exactly (a tolerance so large that every chunk is rescored whole;
    on the CPU, the C++ kernel's `tol` argument)."""
    gen = torch.Generator().manual_seed(22)
    counts, V = {"cuda": ([3] * 128 + [0, 1, 2] * 8, 151936), "cpu": ([3, 0, 2, 1] * 16, 32000)}.get(
        backend, ([3, 0, 2, 1], 2 * speculative._CHUNK + 9))
    args = spec_args(counts, V, gen, device_of(backend), with_probs=with_probs,
                     temperature=torch.ones(len(counts)), match=0.3)
    fast = run_op(backend, "rejection_sample", *args)
    if backend == "cpu":
        exact = _C.rejection_sample(*args, tol=1e30)
    else:
        monkeypatch.setattr(gumbel, "GUMBEL_APPROX_TOL", 1e30)
        exact = run_op(backend, "rejection_sample", *args)
    assert torch.equal(fast[0], exact[0]) and torch.equal(fast[1], exact[1])
    if backend == "cpu":  # float16/bfloat16 rows, converted to float32, take the same draws
        for dtype in (torch.float16, torch.bfloat16):
            half = [args[0].to(dtype), *args[1:]]
            fast, exact = _C.rejection_sample(*half), _C.rejection_sample(*half, tol=1e30)
            assert torch.equal(fast[0], exact[0]) and torch.equal(fast[1], exact[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0, 30.0])
@pytest.mark.parametrize("draft", ["random", "near_p", "sharper", "one_hot", "negative", "above_p", "above_p_but_last"])
def test_residual_draw_with_skipped_tokens_gives_the_exact_draws(backend, scale, draft, monkeypatch):
    """The residual draw skips tokens whose noise cannot bring them near the best (its bound log r <=
    log p): the same tokens as scoring every token exactly (every other request rejects its first
    draft, the others some of theirs), on rows of small and large logit spreads (at 12 and 30 many
    tokens' p are subnormal or 0), with draft distributions far from p, close to it (few positive
    residuals), sharper than it (no residual at its top tokens), without draft probabilities, with
    some negative ones (invalid input, which bounds nothing: the exact pass), and above p (unnormalised
    q = 2p: no positive residual, the draw from p stands in), or above p but in the row's last
    tokens (a positive residual in one chunk only: the other chunks' draws from p are not needed)."""
    gen = torch.Generator().manual_seed(41)
    counts, V = {"cpu": ([3, 1, 2, 3] * 6, 32000), "cuda": ([3, 1, 2, 3] * 16, 32000)}.get(
        backend, ([3, 1, 2, 3], 2 * speculative._CHUNK + 9))
    args = spec_args(counts, V, gen, "cpu", with_probs=draft != "one_hot", temperature=torch.ones(len(counts)),
                     match=0.2)
    args[0] = args[0] * scale
    N, cu = len(args[1]), args[3]
    for i in range(0, len(counts), 2):  # every other request rejects its first draft: a residual draw
        args[0][int(cu[i]) + i, args[1][int(cu[i])]] = NEG_INF
    rows = torch.cat([torch.arange(int(cu[i]) + i, int(cu[i + 1]) + i) for i in range(len(counts))])
    if draft == "near_p":
        args[2] = torch.softmax(args[0][rows] + 0.01 * torch.randn(N, V, generator=gen), dim=1)
    if draft == "sharper":  # q above p at the top tokens: the residual's winner lies below them
        args[2] = torch.softmax(args[0][rows] * 1.3, dim=1)
    if draft == "negative":
        args[2][::2, 5::97] = -1e-3
    if draft.startswith("above_p"):
        args[2] = 2 * torch.softmax(args[0][rows], dim=1)
        if draft == "above_p_but_last":
            args[2][:, -9:] = 0.0
    args = [a.to(device_of(backend)) if isinstance(a, torch.Tensor) else a for a in args]
    if backend == "cpu":
        fast, exact = _C.rejection_sample(*args), _C.rejection_sample(*args, tol=1e30)
    else:
        fast = run_op(backend, "rejection_sample", *args)
        monkeypatch.setattr(gumbel, "GUMBEL_APPROX_TOL", 1e30)
        exact = run_op(backend, "rejection_sample", *args)
    assert torch.equal(fast[0], exact[0]) and torch.equal(fast[1], exact[1])


def residual_pass_args(backend):
    """Requests whose residual chunks take the exact pass with finite floors (a negative draft
    probability at one token bounds its block at +inf; every other request rejects its first draft)."""
    gen = torch.Generator().manual_seed(43)
    counts, V = {"cuda": ([3, 1, 2, 3] * 16, 32000)}.get(backend, ([3, 1, 2, 3], 2 * speculative._CHUNK + 9))
    args = spec_args(counts, V, gen, "cpu", temperature=torch.ones(len(counts)), match=0.2)
    cu = args[3]
    for i in range(0, len(counts), 2):
        args[0][int(cu[i]) + i, args[1][int(cu[i])]] = NEG_INF
    args[2][:, 7] = -1e-3
    return [a.to(device_of(backend)) if isinstance(a, torch.Tensor) else a for a in args]


DEFAULT_RESIDUAL_FORM = {name: getattr(speculative, f"_{name}") for name in ("FULL_LANES", "EXACT_BLOCK_V", "EXACT_SKIP")}


def run_residual_form(backend, args, monkeypatch, tol, **constants):
    """rejection_sample's tokens with GUMBEL_APPROX_TOL = tol and the speculative module's `constants`
    (name without its underscore: value) in place of the defaults."""
    monkeypatch.setattr(gumbel, "GUMBEL_APPROX_TOL", tol)
    for name, default in DEFAULT_RESIDUAL_FORM.items():
        monkeypatch.setattr(speculative, f"_{name}", constants.get(name, default))
    _call_cache.clear()  # the constants are read when a call is recorded
    return run_op(backend, "rejection_sample", *args)


def assert_same_tokens(*outs):
    for got in outs[1:]:
        assert torch.equal(got[0], outs[0][0]) and torch.equal(got[1], outs[0][1])


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("tile_divisor, skip", [(1, False), (1, True), (2, False), (4, True)])
def test_exact_pass_tiles_and_skips_give_the_same_draws(backend, tile_divisor, skip, monkeypatch):
    """The residual's exact pass in smaller tiles (`_EXACT_BLOCK_V`), and scoring only the tiles that
    hold a block reaching a floor (`_EXACT_SKIP`): the default form's tokens, on chunks that take
    the pass with finite floors, and with every chunk taking it and every tile reaching (a
    tolerance of 1e30)."""
    args = residual_pass_args(backend)
    tol = gumbel.GUMBEL_APPROX_TOL
    form = dict(EXACT_BLOCK_V=speculative._BLOCK_V // tile_divisor, EXACT_SKIP=skip)
    expected = run_residual_form(backend, args, monkeypatch, tol)
    expected_exact = run_residual_form(backend, args, monkeypatch, 1e30)
    out = run_residual_form(backend, args, monkeypatch, tol, **form)
    exact = run_residual_form(backend, args, monkeypatch, 1e30, **form)
    assert_same_tokens(expected, out, expected_exact)
    assert_same_tokens(expected_exact, exact)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("tol", [2.0**-10, 2.0**-6], ids=["tol_2e-10", "tol_2e-6"])
@pytest.mark.parametrize("draws", ["residual", "bonus"])
def test_full_lanes_give_the_exact_draws(backend, tol, draws, monkeypatch):
    """A residual or bonus chunk whose lanes hold a third reaching block (made common by a wide
    tolerance) scores those lanes block by block (`_FULL_LANES`): the tokens of the exact pass
    taking every such chunk (`_FULL_LANES = 0`), and of every block scored (a tolerance of 1e30).
    Bonus draws: draft probabilities half the target's, so that every draft is accepted."""
    args = residual_pass_args(backend)
    args[2][:, 7] = 1e-3  # no infinite bound: full lanes decide between the rounds and the exact pass
    if draws == "bonus":
        rows = torch.cat([torch.arange(int(args[3][i]) + i, int(args[3][i + 1]) + i) for i in range(len(args[4]))])
        args[0] = make_logits(args[0].shape[0], args[0].shape[1], torch.float32, args[0].device,
                              generator=torch.Generator().manual_seed(44))
        args[2] = torch.softmax(args[0][rows.to(args[0].device)].double(), dim=1).float() / 2  # q < p: accepted
        args[1] = args[0][rows.to(args[0].device)].argmax(dim=1)
    lanes = speculative._BLOCK_V // 4
    rounds = run_residual_form(backend, args, monkeypatch, tol, FULL_LANES=lanes)
    exact_pass = run_residual_form(backend, args, monkeypatch, tol, FULL_LANES=0)
    every_block = run_residual_form(backend, args, monkeypatch, 1e30, FULL_LANES=lanes)
    assert_same_tokens(exact_pass, rounds, every_block, run_residual_form(backend, args, monkeypatch, tol))
    if draws == "bonus":  # the drafts (their row's argmax) are accepted: each request reaches its bonus row
        assert bool((rounds[1].cpu() == args[3].diff().cpu() + 1).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_near_ties_give_the_exact_draw(backend):
    """Requests of one rejected draft (its logit -30, no draft probabilities) whose residual draw,
    argmax of log(p) + g over the other tokens, has its two or three best scores 2e-4 apart: the
    token each must emit, whether the tie lies across the draw's lanes or inside one."""
    gen = torch.Generator().manual_seed(9)
    offsets = [1, 3, 37, 8, 2048, speculative._BLOCK_V, 5]
    B, V = len(offsets), 2 * speculative._CHUNK + 9
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    output_lens = torch.randint(0, 1000, (B,), generator=gen)
    noise = stream_noise(seeds, output_lens, V)
    logits = torch.randn(2 * B, V, generator=gen) * 3
    draft_rows = logits[0::2]  # each request's draft position; its bonus row is not reached
    expected = make_near_ties(draft_rows, noise, offsets, torch.ones(B))
    drafts = [(e + V // 2) % V for e in expected]  # far from every near-tied token
    for i, draft in enumerate(drafts):
        draft_rows[i, draft] = -30.0
        top2 = (draft_rows[i] + noise[i]).double().topk(2)
        assert float(top2.values[0] - top2.values[1]) > 5e-5
        assert int(top2.indices[0]) == expected[i]
    args = [logits, torch.tensor(drafts), None, cu_of([1] * B), torch.ones(B), seeds, output_lens]
    args = [None if a is None else a.to(device_of(backend)) for a in args] + [1]
    out, num = run_op(backend, "rejection_sample", *args)
    assert out.cpu().tolist() == [[t, -1] for t in expected]
    assert num.cpu().tolist() == [1] * B


# ----------------------------------------------------------------------------------------------
# Greedy and zero-draft requests by hand


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_follows_the_argmax_rule(backend, gen):
    """Request 0 matches 2 drafts then mismatches: emits them and the argmax; request 1 matches all 3
    and emits the bonus argmax; request 2 has a tie for the maximum, broken to the lower index."""
    device = device_of(backend)
    V = 40
    counts = [3, 3, 1]
    logits = torch.randn(sum(counts) + 3, V, generator=gen)
    argmax = logits.argmax(1)
    # rows: request 0 -> 0..3, request 1 -> 4..7, request 2 -> 8, 9
    logits[8, 5] = logits[8, 30] = logits[8].max() + 1.0  # tie: token 5 wins
    argmax[8] = 5
    wrong = (argmax[2] + 1) % V
    drafts = torch.stack([argmax[0], argmax[1], wrong, argmax[4], argmax[5], argmax[6], torch.tensor(5)])
    args = [logits.to(device), drafts.to(device), None, cu_of(counts).to(device), torch.zeros(3, device=device),
            torch.arange(3, device=device), torch.zeros(3, dtype=torch.int64, device=device), 3]
    tokens, num = (o.cpu() for o in run_op(backend, "rejection_sample", *args))
    assert tokens.tolist() == [[int(argmax[0]), int(argmax[1]), int(argmax[2]), -1],
                               [int(argmax[4]), int(argmax[5]), int(argmax[6]), int(argmax[7])],
                               [5, int(argmax[9]), -1, -1]]
    assert num.tolist() == [3, 4, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_draft_requests_emit_the_token_sample_draws(backend, gen):
    """With no drafts a request emits exactly one token: the bonus row's, drawn as `sample` draws it
    with temperature 1 (the same stream) or its argmax when greedy."""
    device = device_of(backend)
    B, V = 6, 300
    logits = make_logits(B, V, torch.float32, device, generator=gen)
    temperature = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], device=device)
    seeds = torch.randint(0, 2**40, (B,), generator=gen).to(device)
    output_lens = torch.randint(0, 100, (B,), generator=gen).to(device)
    drafts = torch.zeros(0, dtype=torch.int64, device=device)
    tokens, num = run_op(backend, "rejection_sample", logits, drafts, None, torch.zeros(B + 1, dtype=torch.int32,
                         device=device), temperature, seeds, output_lens, 2)
    assert num.tolist() == [1] * B
    assert bool((tokens[:, 1:] == -1).all())
    idx = torch.arange(B, device=device)
    off = torch.zeros(B, dtype=torch.int32, device=device)
    expected = run_op(backend, "sample", logits, idx, temperature, off, torch.ones(B, device=device),
                      torch.zeros(B, device=device), seeds, output_lens)
    # Identical float32 arithmetic on CPU and in the interpreter; compiled separately on CUDA, one near
    # tie may round the other way.
    assert int((tokens[:, 0] != expected).sum()) <= (1 if backend == "cuda" else 0)


# ----------------------------------------------------------------------------------------------
# Distributions (the C++ kernel; the interpreter agrees with it above)


def _target(V, gen):
    return torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 1.5, 0)


def _draft_distributions(p, gen):
    V = p.numel()
    disjoint = torch.zeros(V, dtype=torch.float64)
    disjoint[p.argsort()[: V // 2]] = 1.0  # the least likely half of the target's tokens
    p_disjoint = p.clone()
    p_disjoint[disjoint > 0] = 0.0  # ... and a target that gives them no mass
    return {"same": (p, p), "disjoint": (p_disjoint / p_disjoint.sum(), disjoint / disjoint.sum()),
            "random": (p, torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64), 0))}


def _one_position_batch(p, q, B, gen, with_probs):
    """B requests with one draft each (drawn from q) on the same target p; output_lens = arange(B) so
    every request draws fresh numbers."""
    V = p.numel()
    logits = torch.log(p).float().expand(2 * B, V).contiguous()
    drafts = torch.multinomial(q, B, replacement=True, generator=gen)
    probs = q.float().expand(B, V).contiguous() if with_probs else None
    return [logits, drafts, probs, cu_of([1] * B), torch.ones(B), torch.full((B,), 77, dtype=torch.int64),
            torch.arange(B), 1]


@pytest.mark.parametrize("case", ["same", "disjoint", "random"])
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_first_token_is_distributed_as_the_target(case, with_probs, gen):
    """Whatever the drafts' distribution q, the first emitted token follows p; the acceptance rate is
    sum_x min(p(x), q(x)) with draft probabilities, sum_x q(x) p(x) for a proposal of probability 1."""
    V, B = 12, 40000
    p, q = _draft_distributions(_target(V, gen), gen)[case]
    args = _one_position_batch(p, q, B, gen, with_probs)
    tokens, num = run_op("cpu", "rejection_sample", *args)
    counts = torch.bincount(tokens[:, 0], minlength=V).double()
    assert _chi_square(counts, p) < _chi_square_bound(int((p > 0).sum()) - 1)
    accepted = (num == 2).double().mean().item()
    expected = (torch.minimum(p, q).sum() if with_probs else (p * q).sum()).item()
    sigma = math.sqrt(max(expected * (1 - expected), 0.0) / B)
    assert abs(accepted - expected) <= 5 * sigma + 1e-3, (accepted, expected)
    # The token after an accepted draft is the bonus row's draw, from p too.
    bonus = tokens[num == 2, 1]
    if bonus.numel() > 1000:
        assert _chi_square(torch.bincount(bonus, minlength=V).double(), p) < _chi_square_bound(int((p > 0).sum()) - 1)


@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_second_token_is_distributed_as_its_target(with_probs, gen):
    """Two drafts on different targets p1, p2 (drafts from q1, q2): the first token follows p1 and,
    where the first draft was accepted, the second follows p2."""
    V, B = 10, 40000
    p1, p2 = _target(V, gen), _target(V, gen)
    q1, q2 = (torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64), 0) for _ in range(2))
    rows = torch.stack([torch.log(p1), torch.log(p2), torch.log(p2)]).float()  # draft 1, draft 2, bonus
    logits = rows.repeat(B, 1)
    drafts = torch.stack([torch.multinomial(q, B, replacement=True, generator=gen) for q in (q1, q2)], dim=1)
    probs = torch.stack([q1, q2]).float().repeat(B, 1) if with_probs else None
    args = [logits, drafts.reshape(-1), probs, cu_of([2] * B), torch.ones(B), torch.full((B,), 5, dtype=torch.int64),
            torch.arange(B) * 3, 2]
    tokens, num = run_op("cpu", "rejection_sample", *args)
    first = torch.bincount(tokens[:, 0], minlength=V).double()
    second = torch.bincount(tokens[num >= 2, 1], minlength=V).double()
    assert _chi_square(first, p1) < _chi_square_bound(V - 1)
    assert _chi_square(second, p2) < _chi_square_bound(V - 1)


@pytest.mark.interpret
def test_interpreter_draws_like_the_cpu_kernel(gen):
    """The interpreter on a batch of the distribution tests: the same tokens as the C++ kernel."""
    p, q = _draft_distributions(_target(12, gen), gen)["random"]
    args = _one_position_batch(p, q, 64, gen, True)
    cpu = run_op("cpu", "rejection_sample", *args)
    tri = run_op("interpret", "rejection_sample", *args)
    assert int((cpu[0] != tri[0]).any(dim=1).sum()) <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_invariance(backend, gen):
    """A request's tokens do not depend on the other requests of the batch."""
    device = device_of(backend)
    counts = [2, 3, 0, 1, 3]
    args = spec_args(counts, 500, gen, device, temperature=torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0]))
    tokens, num = run_op(backend, "rejection_sample", *args)
    logits, drafts, probs, cu, temperature, seeds, output_lens, S = args
    for i in range(len(counts)):
        lo, hi = int(cu[i]), int(cu[i + 1])
        alone = run_op(backend, "rejection_sample", logits[lo + i: hi + i + 1], drafts[lo:hi], probs[lo:hi],
                       cu_of([hi - lo]).to(device), temperature[i: i + 1], seeds[i: i + 1], output_lens[i: i + 1], S)
        assert torch.equal(alone[0][0], tokens[i]) and int(alone[1][0]) == int(num[i])


@pytest.mark.cuda
@pytest.mark.parametrize("B", [3, 40])
def test_dependent_launches_change_no_bit(B, gen):
    """On Hopper and later the levels are programmatic dependent launches (greedy and random
    requests let the next level start at different points): the outputs are those of plain
    launches, bit for bit, in a batch mixing greedy and random requests, ragged drafts included."""
    from torch_sampling_ops.truncation import use_settings
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    counts = [i % 4 for i in range(B)]
    args = spec_args(counts, 40000, gen, "cuda", match=0.7)
    outs = []
    for pdl in (False, True):
        with use_settings(dependent_launches=pdl):
            outs.append(torch.ops.sampling.rejection_sample(*args))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert_matches_reference(outs[1], args)


# ----------------------------------------------------------------------------------------------
# Bad values: the documented result, no out-of-bounds access


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_values_give_the_documented_result(backend, gen):
    """Decreasing cu_num_draft (a request then has no drafts), more drafts than max_spec_len (clamped),
    offsets past N (clamped), draft ids outside [0, V) (rejected), a row without a live logit (-1)."""
    device = device_of(backend)
    V, N, B = 50, 8, 5
    logits = torch.randn(N + B, V, generator=gen)
    drafts = logits[:N].argmax(1)
    drafts[6] = V + 3  # request 3's only draft (greedy)
    drafts[7] = -2  # request 4's only draft (random)
    cu = torch.tensor([0, 4, 2, 6, 7, 100], dtype=torch.int32)  # 4 > max_spec_len, decreasing, past N = 8
    logits[5] = NEG_INF  # request 1's only row (cu[1] + 1): no live logit
    args = [logits, drafts, None, cu, torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0]), torch.arange(B),
            torch.zeros(B, dtype=torch.int64), 3]
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    tokens, num = (o.cpu() for o in run_op(backend, "rejection_sample", *args))
    e_tokens, e_num = reference.rejection_sample(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    assert torch.equal(tokens, e_tokens) and torch.equal(num, e_num)
    assert num[0] == 4 and tokens[0, :3].tolist() == drafts[:3].tolist()  # 3 of the 4 drafts, then the bonus
    assert tokens[1].tolist() == [-1, -1, -1, -1] and num[1] == 0  # decreasing: no drafts; a dead row
    assert num[3] == 1 and tokens[3, 0] == logits[9].argmax()  # the out-of-range draft is rejected
    assert num[4] == 1 and 0 <= tokens[4, 0] < V
    assert bool((tokens < V).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
def test_nan_logits_and_dead_chunks_read_as_minus_inf(backend, with_probs, gen):
    """Target rows with NaN logits scattered, a chunk of NaN alone, a chunk of -inf alone and a
    ragged last chunk: the tokens of the same rows with NaN read as -inf, bit for bit (the softmax
    sums, the residual and bonus draws, the greedy argmax), and the reference's."""
    V = 3 * speculative._CHUNK + 7
    counts = [3, 2, 3, 1, 3, 2]
    args = spec_args(counts, V, gen, torch.device("cpu"), with_probs=with_probs,
                     temperature=torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0]), match=0.6)
    logits = args[0]
    logits[:, 11::53] = float("nan")
    logits[::2, speculative._CHUNK:2 * speculative._CHUNK] = float("nan")
    logits[1::2, 2 * speculative._CHUNK:3 * speculative._CHUNK] = NEG_INF
    cleaned = torch.where(logits.isnan(), NEG_INF, logits)
    args = [a.to(device_of(backend)) if isinstance(a, torch.Tensor) else a for a in args]
    out = run_op(backend, "rejection_sample", *args)
    assert_matches_reference(out, [cleaned, *args[1:]])
    same = run_op(backend, "rejection_sample", cleaned.to(device_of(backend)), *args[1:])
    assert torch.equal(out[0], same[0]) and torch.equal(out[1], same[1])


# ----------------------------------------------------------------------------------------------
# CUDA


@pytest.mark.cuda
def test_cuda_graph_replays_draw_fresh_tokens(gen):
    """Captured once; advancing output_lens on the device gives fresh draws per replay."""
    device = torch.device("cuda")
    args = spec_args([3] * 16, 1000, gen, device, temperature=torch.ones(16), match=0.0)
    output_lens = args[6]
    run_op("cuda", "rejection_sample", *args)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_op("cuda", "rejection_sample", *args)
    seen = []
    for _ in range(4):
        graph.replay()
        assert_matches_reference(out, args)
        seen.append(out[0].clone())
        output_lens += 1
    assert len({tuple(s.flatten().tolist()) for s in seen}) == 4


@pytest.mark.cuda
def test_offsets_past_2_pow_31():
    """(N + B) * V > 2**31: the last requests' rows lie past 32-bit element offsets."""
    V, drafts_each = 151936, 3
    B = (2**31 // V + 2 + drafts_each) // (drafts_each + 1)
    N = drafts_each * B
    assert (N + B) * V > 2**31
    logits = torch.randn(N + B, V, device="cuda", dtype=torch.float16)
    cu = torch.arange(0, N + 1, drafts_each, dtype=torch.int32, device="cuda")
    # request i scores its drafts on rows 4i..4i+2 and its bonus on 4i+3: every draft is its row's argmax
    drafts = logits.view(B, drafts_each + 1, V)[:, :drafts_each].float().argmax(-1).reshape(-1)
    seeds = torch.arange(B, device="cuda") + 5
    output_lens = torch.zeros(B, dtype=torch.int64, device="cuda")
    for temperature in (0.0, 1.0):
        temps = torch.full((B,), temperature, device="cuda")
        tokens, num = run_op("cuda", "rejection_sample", logits, drafts, None, cu, temps, seeds, output_lens,
                             drafts_each)
        e_tokens, e_num = reference.rejection_sample(
            logits[-(drafts_each + 1):].float().cpu(), drafts[-drafts_each:].cpu(), None, cu_of([drafts_each]),
            temps[-1:].cpu(), seeds[-1:].cpu(), output_lens[-1:].cpu(), drafts_each)
        assert tokens[-1].cpu().tolist() == e_tokens[0].tolist() and int(num[-1]) == int(e_num[0])
        if temperature == 0.0:
            assert bool((num == drafts_each + 1).all())
