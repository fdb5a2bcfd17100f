"""Adversarial inputs, on every backend against the float64 reference: rows at extreme scales (tight
clusters, subnormals, values near FLT_MAX, large offsets), int64 list counts at and past 2**31, lists
of width 0, out-of-range parameters, and a randomized sweep over magnitudes, dtypes and list counts
for every op."""
import pytest
import torch
from test_constraints import check_logit_bias, logit_bias_state
from test_truncation import run_and_check

from torch_sampling_ops import reference

from conftest import BACKENDS, DTYPES, INTERPRET, OP_BACKENDS, PAD, SENTINEL, device_of, make_logits, run_op

INT = torch.int32
NEG_INF = float("-inf")


def extreme_row(case: str, V: int, gen: torch.Generator) -> torch.Tensor:
    """A [1, V] float32 row of distinct values at an extreme scale."""
    if case.startswith("spread_"):  # tight clusters around 0: distinct values 1e-9 or 1e-12 apart
        return (torch.randn(1, V, generator=gen, dtype=torch.float64) * float(case[7:])).float()
    if case == "subnormal":
        return (torch.randn(1, V, generator=gen, dtype=torch.float64) * 1e-40).float()
    if case == "flt_max":  # the range exceeds FLT_MAX: differences of values overflow
        return ((torch.rand(1, V, generator=gen, dtype=torch.float64) * 2 - 1) * 3e38).float()
    if case.startswith("offset_"):  # a realistic row far from 0, where float32 spacing is coarse
        return (torch.randn(1, V, generator=gen, dtype=torch.float64) * 3 + float(case[7:])).float()
    raise ValueError(case)


def padded(rows: torch.Tensor, device) -> torch.Tensor:
    """rows [T, V] viewed in a [T, V + PAD] buffer whose pad columns hold SENTINEL (as make_logits)."""
    buf = torch.full((rows.size(0), rows.size(1) + PAD), SENTINEL, dtype=rows.dtype)
    buf[:, : rows.size(1)] = rows
    return buf.to(device)[:, : rows.size(1)]


EXTREME_CASES = ["spread_1e-9", "spread_1e-12", "subnormal", "flt_max", "offset_1e4", "offset_1e5", "offset_1e6"]
# (top_k, top_p): top-p alone, top-k alone (small, and a quarter of the row), both.
EXTREME_SETTINGS = [(0, 0.9), (50, 1.0), (1200, 1.0), (300, 0.9)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EXTREME_CASES)
@pytest.mark.parametrize("V", [5000, 20000])
def test_top_k_top_p_exact_at_extreme_scales(backend, case, V, gen):
    if backend == "interpret" and V > 5000:
        pytest.skip("the interpreter is slow: the smaller row covers the same paths at its constants")
    device = device_of(backend)
    for k, p in EXTREME_SETTINGS:
        logits = padded(extreme_row(case, V, gen), device)
        run_and_check(backend, logits, torch.zeros(1, dtype=INT), torch.tensor([k], dtype=INT), torch.tensor([p]))


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_bfloat16_subnormal_rows_are_distinct_values(backend, gen):
    """bf16 has float32's exponent range, so a row of bf16 subnormals holds distinct values: top-k
    keeps k of them, logprobs ranks them, a greedy draw takes the largest. (Not under the
    interpreter: its bf16 conversion flushes subnormals to zero.)"""
    V = 5000
    device = device_of(backend)
    row = (torch.randn(1, V, generator=gen, dtype=torch.float64) * 2e-39).to(torch.bfloat16)
    assert 0 < float(row.float().abs().max()) < 1.18e-38  # every value subnormal
    zero = torch.zeros(1, dtype=INT)
    for k, p in [(50, 1.0), (0, 0.5)]:
        run_and_check(backend, padded(row, device), zero, torch.tensor([k], dtype=INT), torch.tensor([p]))
    token = torch.tensor([int(row.float().argmin())])
    ids, _, _, ranks = run_op(backend, "logprobs", row.to(device), token.to(device), 8)
    want_ids, _, _, want_ranks = reference.logprobs(row, token, 8)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(ranks.cpu(), want_ranks)
    assert int(want_ranks[0]) > 1
    tokens = run_op(backend, "sample", row.to(device), zero.to(device), torch.zeros(1, device=device),
                    torch.zeros(1, dtype=INT, device=device), torch.ones(1, device=device),
                    torch.zeros(1, device=device), torch.zeros(1, dtype=torch.int64, device=device),
                    torch.zeros(1, dtype=torch.int64, device=device))
    assert int(tokens[0]) == int(row.float().argmax())


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_k_top_p_issue_examples(backend):
    """The rows of the defect report: the CUDA general path kept 2459 of 4500 tokens (top-p alone on a
    1e-9 spread), 1454 instead of 1200 (top-k), and all 1000 instead of 300 (range past FLT_MAX)."""
    device = device_of(backend)
    torch.manual_seed(0)
    clustered = (torch.randn(1, 5000, dtype=torch.float64) * 1e-9).float()
    torch.manual_seed(0)
    huge = ((torch.rand(1, 1000, dtype=torch.float64) * 2 - 1) * 3e38).float()
    for row, k, p, kept in [(clustered, 0, 0.9, 4500), (clustered, 1200, 1.0, 1200), (huge, 300, 1.0, 300)]:
        logits = row.clone().to(device)
        run_op(backend, "top_k_top_p", logits, torch.zeros(1, dtype=INT, device=device),
               torch.tensor([k], dtype=INT, device=device), torch.tensor([p], device=device))
        assert int((logits > NEG_INF).sum()) == kept


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count", [2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62, -(2**31), -(2**40)])
def test_logit_bias_int64_counts_are_clamped_in_64_bits(backend, count, gen):
    """An int64 count clamps to [0, W] as a 64-bit number: 2**32 is the whole list, not 0 (its low
    32 bits), and a large negative count is an empty list."""
    T, V, R = 2, 3000, 2
    device = device_of(backend)
    state = logit_bias_state(T, V, R, gen, allowed_w=3, bias_w=4, stop_w=2)
    state[0] = torch.tensor([0, 1], dtype=INT)
    state[1] = torch.zeros(T, dtype=torch.int64)  # output_lens 0 < min_tokens: stops active
    state[9] = torch.full((R,), 5, dtype=INT)
    for i in (3, 6, 8):  # num_allowed, num_bias, num_stop
        state[i] = torch.tensor([count, 1], dtype=torch.int64)
    check_logit_bias(backend, make_logits(T, V, torch.float32, device, generator=gen), state)


def test_logit_bias_issue_example_count_2_pow_32():
    """The defect report's call: a count of 2**32 on a list of width 1 keeps just token 3."""
    for backend in [b.values[0] for b in BACKENDS if b.values[0] != "cuda" or torch.cuda.is_available()]:
        if backend == "interpret" and not INTERPRET:
            continue
        device = device_of(backend)
        x = torch.randn(1, 8, device=device)
        E = torch.zeros(1, 0, dtype=INT, device=device)
        z = torch.zeros(1, dtype=INT, device=device)
        run_op(backend, "logit_bias", x, z, z, torch.tensor([[3]], dtype=INT, device=device),
               torch.tensor([2**32], device=device), E, torch.zeros(1, 0, device=device), z, E, z, z)
        assert torch.isfinite(x[0]).nonzero().flatten().tolist() == [3], backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_allowed_list_of_width_0_is_no_list(backend, gen):
    """num_allowed > 0 with a list of width 0 clamps to 0: no allowed list (the reference too)."""
    T, V, R = 3, 2000, 2
    state = logit_bias_state(T, V, R, gen, allowed_w=0, bias_w=3, stop_w=2)
    state[3] = torch.tensor([5, 2**33], dtype=torch.int64)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    expected = reference.logit_bias(logits.cpu(), *state)
    assert bool(torch.isfinite(expected).any(dim=1).all()), "the reference banned every token"
    check_logit_bias(backend, logits, state)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.5, float("nan")])
def test_top_p_outside_its_range_has_the_documented_result(backend, top_p, gen):
    """Without the debug check: top_p <= 0 keeps the most probable token(s); > 1 or NaN is off."""
    logits = make_logits(2, 3000, torch.float32, device_of(backend), generator=gen)
    logits[1, 7] = logits[1, 11] = 100.0  # tied maxima are both kept
    original = logits.clone()
    run_op(backend, "top_k_top_p", logits, torch.zeros(2, dtype=INT, device=logits.device),
           torch.zeros(1, dtype=INT, device=logits.device), torch.tensor([top_p], device=logits.device))
    if top_p <= 0:
        kept = (logits > NEG_INF).nonzero().tolist()
        assert kept == [[0, int(original[0].argmax())], [1, 7], [1, 11]]
    else:
        assert torch.equal(logits, original)


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.5, float("nan")])
def test_debug_mode_rejects_top_p_outside_its_range(top_p, gen, debug_checks):
    debug_checks(True)
    logits = make_logits(2, 300, torch.float32, "cpu", generator=gen)
    original = logits.clone()
    with pytest.raises(ValueError, match="top_p"):
        torch.ops.sampling.top_k_top_p(logits, torch.zeros(2, dtype=INT), torch.zeros(1, dtype=INT),
                                       torch.tensor([top_p]))
    assert torch.equal(logits, original)


# ----------------------------------------------------------------------------------------------
# A randomized sweep: every op on rows of random magnitude, offset and dtype, with random list counts.


def random_row_scale(gen) -> tuple[float, float]:
    """(scale, offset) spanning tight clusters to wide rows, near 0 or far from it."""
    scale = 10.0 ** float(torch.empty(1).uniform_(-10, 2, generator=gen))
    offset = [0.0, 0.0, 1e2, -1e3, 1e4][int(torch.randint(0, 5, (1,), generator=gen))]
    return scale, offset


def random_count(W: int, gen) -> int:
    choices = [0, 1, W, W + 1, 2**31 - 1, 2**31, 2**32, -1, -(2**31), -(2**33)]
    return choices[int(torch.randint(0, len(choices), (1,), generator=gen))]


def sweep_cases(backend: str) -> int:
    return 2 if backend == "interpret" else 12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["logit_bias", "apply_token_bitmask", "temperature", "min_p", "top_k_top_p"])
def test_randomized_sweep_against_the_reference(backend, op, gen):
    device = device_of(backend)
    for case in range(sweep_cases(backend)):
        T = int(torch.randint(1, 4, (1,), generator=gen))
        V = int(torch.randint(1, 3000 if backend == "interpret" else 9000, (1,), generator=gen))
        dtype = DTYPES[case % len(DTYPES)]
        scale, offset = random_row_scale(gen)
        logits = make_logits(T, V, dtype, device, generator=gen, scale=scale)
        logits += offset
        R = 3
        if op == "logit_bias":
            state = logit_bias_state(T, V, R, gen, allowed_w=5, bias_w=4, stop_w=3)
            for i, W in ((3, 5), (6, 4), (8, 3)):
                state[i] = torch.tensor([random_count(W, gen) for _ in range(R)], dtype=torch.int64)
            check_logit_bias(backend, logits, state)
            continue
        idx_mapping = torch.randint(-1, R + 1, (T,), generator=gen, dtype=INT)  # some out of range
        if op == "top_k_top_p":
            top_k = torch.tensor([0, int(torch.randint(1, V + 1, (1,), generator=gen)), 1], dtype=INT)
            top_p = torch.tensor([float(torch.rand(1, generator=gen)) * 0.98 + 0.01, 1.0, 0.5])
            run_and_check(backend, logits, idx_mapping, top_k, top_p)
            continue
        original = logits.cpu().clone()
        if op == "apply_token_bitmask":
            params = [torch.randint(-2**31, 2**31, (R, (V + 31) // 32), generator=gen, dtype=torch.int64).to(INT),
                      idx_mapping]
        elif op == "temperature":
            params = [idx_mapping, torch.rand(R, generator=gen) * 2 + torch.tensor([0.0, 0.1, 0.0])]
        else:
            params = [idx_mapping, torch.rand(R, generator=gen) * torch.tensor([1.0, 0.1, 0.0])]
        expected = getattr(reference, op)(original, *params)
        if op == "apply_token_bitmask":
            run_op(backend, op, logits, params[0].to(device), params[1].to(device))
        else:
            run_op(backend, op, logits, *[p.to(device) for p in params])
        # float32 arithmetic rounded to the logits dtype against one rounding from float64
        rtol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
        torch.testing.assert_close(logits.cpu().double(), expected.to(dtype).double(), atol=0, rtol=rtol,
                                   equal_nan=True, msg=lambda m: f"{op} case {case} (V={V}, {dtype}): {m}")
