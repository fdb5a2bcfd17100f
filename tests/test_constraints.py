"""logit_bias and apply_token_bitmask against the float64 reference, on every backend."""
import pytest
import torch

from torch_sampling_ops import constraints, reference

from conftest import (
    BACKENDS,
    DTYPES,
    assert_pad_untouched,
    device_of,
    logits_past_2_pow_31,
    make_logits,
    over_backends_dtypes_and_shapes,
    run_op,
    tolerance,
)

INT = torch.int32


@pytest.fixture(params=["restore", "keep_bits", "keep_bits_lines_first", "save_launch"])
def allowed_design(request, monkeypatch):
    """Runs a Triton logit_bias test with each form of the allowed list (save, fill and restore
    below `_KEEP_BITS_MIN_T` rows, keep bits from there, keep bits after a launch that asks the
    L2 for the kept lines, and save, fill and restore after a launch that saves the allowed
    logits), whatever its batch size."""
    keep_bits = request.param.startswith("keep_bits")
    if request.param != "restore" and request.node.callspec.params.get("backend") == "cpu":
        pytest.skip("one C++ kernel: the forms are the Triton kernel's")
    monkeypatch.setattr(constraints, "_KEEP_BITS_MIN_T", 1 if keep_bits else 2**62)
    monkeypatch.setattr(constraints, "_KEPT_LINES_FIRST", request.param == "keep_bits_lines_first")
    monkeypatch.setattr(constraints, "_SAVE_LAUNCH_MIN_T", 1 if request.param == "save_launch" else 2**62)


over_allowed_designs = pytest.mark.usefixtures("allowed_design")


def ragged(R, W, V, gen, *, lengths=None, dtype=INT):
    """A ragged list [R, W] of random ids and its counts (default: random in [0, W])."""
    ids = torch.randint(0, V, (R, W), generator=gen, dtype=dtype)
    num = lengths if lengths is not None else torch.randint(0, W + 1, (R,), generator=gen, dtype=INT)
    return ids, num


def logit_bias_state(T, V, R, gen, *, allowed_w=8, bias_w=6, stop_w=3):
    idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
    output_lens = torch.randint(0, 8, (T,), generator=gen, dtype=torch.int64)
    allowed_ids, num_allowed = ragged(R, allowed_w, V, gen)
    bias_ids, num_bias = ragged(R, bias_w, V, gen)
    # Unique bias ids per slot (the contract); duplicates have their own test.
    bias_ids = torch.stack([torch.randperm(V, generator=gen)[:bias_w] for _ in range(R)]).to(INT)
    bias_values = torch.randn(R, bias_w, generator=gen) * 2
    stop_ids, num_stop = ragged(R, stop_w, V, gen)
    min_tokens = torch.randint(0, 8, (R,), generator=gen, dtype=INT)
    return [idx_mapping, output_lens, allowed_ids, num_allowed, bias_ids, bias_values, num_bias,
            stop_ids, num_stop, min_tokens]


def check_logit_bias(backend, logits, state):
    device = device_of(backend)
    state = [s.to(device) for s in state]
    expected = reference.logit_bias(logits.cpu(), *[s.cpu() for s in state])
    run_op(backend, "logit_bias", logits, *state)
    atol, rtol = tolerance(logits.dtype)
    torch.testing.assert_close(logits.cpu().double(), expected, atol=atol, rtol=rtol, equal_nan=True)
    assert_pad_untouched(logits)


@over_allowed_designs
@over_backends_dtypes_and_shapes
def test_logit_bias_matches_reference(backend, dtype, T, V, gen):
    R = 4
    state = logit_bias_state(T, V, R, gen)
    state[0][-1] = R + 5 if T > 1 else state[0][-1]  # a row whose slot is out of range: untouched
    check_logit_bias(backend, make_logits(T, V, dtype, device_of(backend), generator=gen), state)


@pytest.mark.cuda
@over_allowed_designs
def test_dependent_launches_change_no_bit(gen):
    """On Hopper and later the min-tokens launch is a programmatic dependent one, placed while the
    first launch drains: the results are those of plain launches, bit for bit. In two of the four
    slots the stops are the whole allowed list, so the min-tokens scan keeps them only if it sees
    the first launch's -inf over the rest of the row."""
    from torch_sampling_ops.truncation import use_settings
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    T, V, R = 40, 32000, 4
    state = logit_bias_state(T, V, R, gen, stop_w=8)
    state[3][:2] = 8  # num_allowed
    state[7][:2], state[8][:2] = state[2][:2], 8  # stop_ids, num_stop
    state[9][:2] = 100  # min_tokens: active in every row of those slots
    logits = make_logits(T, V, torch.float32, "cuda", generator=gen)
    outs = []
    for pdl in (False, True):
        out = logits.clone()
        with use_settings(dependent_launches=pdl):
            torch.ops.sampling.logit_bias(out, *[x.cuda() for x in state])
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    expected = reference.logit_bias(logits.cpu(), *state)
    atol, rtol = tolerance(torch.float32)
    torch.testing.assert_close(outs[1].cpu().double(), expected, atol=atol, rtol=rtol)
    kept_stops = (state[0] < 2).cuda()
    assert bool(torch.isfinite(outs[1][kept_stops]).any(dim=1).all()), "the stop tokens must survive"


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("token", [1, 5, 100, 500, 2518, 9834, 31999])
def test_single_allowed_id_survives(backend, token, gen):
    T, V, R = 2, 32000, 2
    state = logit_bias_state(T, V, R, gen, bias_w=0, stop_w=0)
    state[2] = torch.tensor([[token], [V - 1 - token]], dtype=INT)
    state[3] = torch.tensor([1, 1], dtype=INT)
    state[0] = torch.tensor([0, 1], dtype=INT)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    original = logits.clone()
    check_logit_bias(backend, logits, state)
    assert logits[0, token] == original[0, token] and logits[1, V - 1 - token] == original[1, V - 1 - token]
    assert int(torch.isfinite(logits).sum()) == 2


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_allowed", [1, 7, 300, 4096, 5000])
def test_allowed_lists_spread_over_the_row(backend, n_allowed, gen):
    T, V, R = 3, 32000, 2
    state = logit_bias_state(T, V, R, gen, bias_w=4, stop_w=2)
    state[2] = torch.stack([torch.randperm(V, generator=gen)[:n_allowed] for _ in range(R)]).to(INT)
    state[3] = torch.tensor([n_allowed, n_allowed // 2], dtype=INT)
    check_logit_bias(backend, make_logits(T, V, torch.float32, device_of(backend), generator=gen), state)


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stops_cover_finite", [False, True])
def test_lists_longer_than_a_register_block(backend, stops_cover_finite, gen):
    """Bias and stop lists wider than 2048 ids are staged through a scratch buffer."""
    T, V, R = 3, 6000, 2
    state = logit_bias_state(T, V, R, gen, allowed_w=0, bias_w=3000, stop_w=2500)
    state[1] = torch.zeros(T, dtype=torch.int64)
    state[9] = torch.full((R,), 5, dtype=INT)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    if stops_cover_finite:  # every finite logit is a stop token: the stops keep their values
        state[8] = torch.full((R,), 2500, dtype=INT)
        state[5].fill_(0.5)
        keep = torch.zeros(T, V, dtype=torch.bool)
        for t in range(T):
            keep[t, state[7][int(state[0][t])].long()] = True
        logits.masked_fill_(~keep.to(logits.device), float("-inf"))
    check_logit_bias(backend, logits, state)


@over_allowed_designs
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's -inf + inf
@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_on_tokens_outside_the_allowed_list(backend, gen):
    """A biased token outside the allowed list is -inf + bias: -inf, or NaN for a bias of +inf or NaN;
    the allowed tokens around it, biased or not, keep their logit (plus bias)."""
    T, V = 2, 9000
    allowed = [5, 4100, 8999]
    bias = [6, 4101, 8998, 4100, 7000, 3]
    state = one_slot_state(T, V, allowed=allowed, bias=bias, bias_values=[INF, NAN, -INF, 2.5, 1.0, INF],
                           min_tokens=0)
    check_logit_bias(backend, make_logits(T, V, torch.float32, device_of(backend), generator=gen), state)


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicated_ids(backend, gen):
    T, V, R = 2, 2000, 1
    state = logit_bias_state(T, V, R, gen)
    state[0] = torch.tensor([0, 0], dtype=INT)
    state[1] = torch.tensor([0, 0])
    state[2] = torch.tensor([[7, 7, 1500, 1500, 3, 7, 9, 11]], dtype=INT)
    state[3] = torch.tensor([8], dtype=INT)
    state[4] = torch.tensor([[7, 9, 7, 1500, 9, 7]], dtype=INT)
    state[5] = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]])
    state[6] = torch.tensor([6], dtype=INT)
    state[7] = torch.tensor([[11, 11, 11]], dtype=INT)
    state[8] = torch.tensor([3], dtype=INT)
    state[9] = torch.tensor([5], dtype=INT)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    original = logits.clone().cpu()
    run_op(backend, "logit_bias", logits, *[s.to(logits.device) for s in state])
    out = logits.cpu()

    def got_one_of(t, token, biases):  # one of its biases, never a sum
        return any(abs(float(out[t, token]) - float(original[t, token] + b)) < 1e-5 for b in biases)

    for t in range(T):
        assert got_one_of(t, 7, [1.0, 4.0, 32.0]) and got_one_of(t, 9, [2.0, 16.0]) and got_one_of(t, 1500, [8.0])
        assert out[t, 3] == original[t, 3] and out[t, 11] == float("-inf")
        assert int(torch.isfinite(out[t]).sum()) == 4
    assert_pad_untouched(logits)


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["stop_is_whole_vocab", "stop_covers_allowed", "stop_covers_finite"])
def test_min_tokens_keeps_stops_when_nothing_else_is_left(backend, case, gen):
    T, V, R = 2, 5000, 2
    state = logit_bias_state(T, V, R, gen, bias_w=0)
    state[0] = torch.tensor([0, 1], dtype=INT)
    state[1] = torch.tensor([0, 10])  # row 1 is past min_tokens: its stops are never masked
    state[9] = torch.tensor([3, 3], dtype=INT)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    if case == "stop_is_whole_vocab":
        state[7] = torch.arange(V, dtype=INT).flip(0).repeat(R, 1)
        state[8] = torch.tensor([V, V], dtype=INT)
        state[2], state[3] = torch.zeros(R, 0, dtype=INT), torch.zeros(R, dtype=INT)
    elif case == "stop_covers_allowed":
        state[2] = torch.tensor([[4, 4500, 4999], [4, 4500, 4999]], dtype=INT)
        state[3] = torch.tensor([3, 3], dtype=INT)
        state[7] = torch.tensor([[4999, 4, 4500, 12]] * R, dtype=INT)
        state[8] = torch.tensor([4, 4], dtype=INT)
    else:
        logits[:, :4990] = float("-inf")
        state[2], state[3] = torch.zeros(R, 0, dtype=INT), torch.zeros(R, dtype=INT)
        state[7] = torch.arange(4990, V, dtype=INT).repeat(R, 1)
        state[8] = torch.tensor([V - 4990] * R, dtype=INT)
    check_logit_bias(backend, logits, state)
    stops = state[7][0, :int(state[8][0])].long()
    assert bool(torch.isfinite(logits[0, stops.to(logits.device)]).any()), "the stop tokens must survive"


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_values_follow_the_documented_result(backend, gen):
    """Out-of-range slots leave the row untouched, out-of-range ids are ignored, NaN stays NaN."""
    T, V, R = 4, 3000, 2
    state = logit_bias_state(T, V, R, gen)
    state[0] = torch.tensor([0, -1, 2, 1], dtype=INT)
    state[2][0, :3] = torch.tensor([-5, V, 2**30], dtype=INT)
    state[3][:] = 8
    state[4][1, 0] = -3
    state[6][:] = 6
    state[7][:, 0] = V + 1
    state[8] = torch.tensor([9, -4], dtype=INT)  # counts are clamped to [0, W]
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    logits[0, state[2][0, 5]] = float("nan")
    logits[3, 17] = float("nan")
    check_logit_bias(backend, logits, state)


def one_slot_state(T, V, *, allowed=(), bias=(), bias_values=None, stops=(), min_tokens=5, dtype=INT):
    """State for rows that all map to slot 0 with the given lists; min-tokens active (output_lens 0)."""
    def lst(ids):
        return torch.tensor([list(ids)], dtype=dtype).reshape(1, len(ids)), torch.tensor([len(ids)], dtype=dtype)

    allowed_ids, num_allowed = lst(allowed)
    bias_ids, num_bias = lst(bias)
    values = torch.tensor([list(bias_values if bias_values is not None else [1.5] * len(bias))],
                          dtype=torch.float32).reshape(1, len(bias))
    stop_ids, num_stop = lst(stops)
    return [torch.zeros(T, dtype=INT), torch.zeros(T, dtype=torch.int64), allowed_ids, num_allowed,
            bias_ids, values, num_bias, stop_ids, num_stop, torch.tensor([min_tokens], dtype=INT)]


V_CHUNKS = 9000  # three 4096-token blocks: the min-tokens scan and the chunk passes cross block boundaries
NAN = float("nan")
INF = float("inf")

# (allowed ids, bias ids, bias values, stop ids, tokens left finite in the row (None: all), stops survive)
MIN_TOKENS_CASES = {
    # with an allowed list: the finite non-stop tokens lie in other chunks than the stops, or there are none
    "allowed_other_chunk_finite": ([7, 8990], [], [], [8990], None, False),
    "allowed_finite_in_last_block": ([7, 8990], [], [], [7], None, False),
    "allowed_all_stops": ([7, 8990, 4500], [], [], [8990, 4500, 7, 7], None, True),
    "allowed_rest_biased_to_neg_inf": ([7, 8990], [7], [-INF], [8990], None, True),
    "allowed_rest_nan": ([7, 8990, 4600], [7], [NAN], [8990, 4600], None, True),
    "allowed_rest_neg_inf_logits": ([7, 8990], [], [], [8990], [8990], True),
    "allowed_biased_rest_finite": ([7, 8990], [7, 8990], [2.0, 3.0], [8990], None, False),
    "allowed_stop_not_allowed": ([7], [], [], [8990], None, False),  # a stop outside the list: -inf anyway
    "allowed_only_stop_biased_inf": ([7], [8990, 7], [INF, -INF], [8990, 7], None, True),
    # without an allowed list: the row holds -inf except where listed
    "row_finite_far_from_stops": ([], [], [], [8990, 8991], [3, 8990, 8991], False),
    "row_finite_in_last_block": ([], [], [], [3], [3, 8995], False),
    "row_only_stops_finite": ([], [], [], [8990, 5, 8990], [5, 8990], True),
    "row_rest_biased_to_neg_inf": ([], [3], [-INF], [8990], [3, 8990], True),
    "row_rest_nan_by_bias": ([], [3, 6000], [NAN, INF], [8990], [3, 8990], True),
    "row_rest_nan_logit": ([], [], [], [8990], [8990], True),
}


@over_allowed_designs
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's -inf + inf
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(MIN_TOKENS_CASES))
@pytest.mark.parametrize("stop_width", ["short", "long"])
def test_min_tokens_decides_over_the_whole_row(backend, case, stop_width, gen):
    """Stops are masked only if a finite non-stop token is left anywhere in the row, after the allowed list and
    the bias, wherever in the row (and in which chunk) that token and the stops lie. A long stop list (padded
    with ids out of range) takes the kernels' path for many stops."""
    allowed, bias, values, stops, finite, survive = MIN_TOKENS_CASES[case]
    if stop_width == "long":
        stops = stops + [-1, V_CHUNKS] * 40
    T, V = 2, V_CHUNKS
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    if finite is not None:
        keep = torch.zeros(V, dtype=torch.bool)
        keep[finite] = True
        logits[:, ~keep.to(logits.device)] = float("-inf")
        if case == "row_rest_nan_logit":
            logits[:, 17] = NAN
    if case == "allowed_rest_nan":
        logits[:, 4600] = NAN
    state = one_slot_state(T, V, allowed=allowed, bias=bias, bias_values=values, stops=stops)
    check_logit_bias(backend, logits, state)
    stop = logits[:, stops[0]].cpu()  # the reference decides; this checks each case is the one its name says
    if survive:
        assert bool((stop != float("-inf")).all()), "the stops must keep their values"
    else:
        assert bool((stop == float("-inf")).all()), "the stops must be masked"


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64], ids=str)
def test_list_edges(backend, count_dtype, gen):
    """Width-0 lists, counts past the width (2**31 and more in int64), negative counts, ids out of range
    (int64 ids that a 32-bit truncation would bring into range), rows whose slot is out of range."""
    T, V, R = 6, V_CHUNKS, 3
    big = 2**31 + 5 if count_dtype == torch.int64 else 2**31 - 1
    huge_id = 2**32 + 11 if count_dtype == torch.int64 else -7
    idx_mapping = torch.tensor([0, 1, 2, -1, 3, 2], dtype=count_dtype)  # rows 3 and 4: untouched
    allowed_ids = torch.stack([torch.randperm(V, generator=gen)[:40] for _ in range(R)]).to(count_dtype)
    allowed_ids[0, :2] = torch.tensor([huge_id, V])
    num_allowed = torch.tensor([big, -big, 0], dtype=count_dtype)  # slot 1: negative count, no list
    bias_ids = torch.stack([torch.randperm(V, generator=gen)[:30] for _ in range(R)]).to(count_dtype)
    bias_ids[1, 0] = huge_id
    num_bias = torch.tensor([30, big, -1], dtype=count_dtype)
    stop_ids = torch.stack([torch.randperm(V, generator=gen)[:4] for _ in range(R)]).to(count_dtype)
    stop_ids[2, 0] = huge_id
    num_stop = torch.tensor([big, 4, 3], dtype=count_dtype)
    state = [idx_mapping, torch.zeros(T, dtype=torch.int64), allowed_ids, num_allowed, bias_ids,
             torch.randn(R, 30, generator=gen), num_bias, stop_ids, num_stop, torch.full((R,), 3, dtype=INT)]
    check_logit_bias(backend, make_logits(T, V, torch.float32, device_of(backend), generator=gen), state)

    empty = torch.zeros(R, 0, dtype=count_dtype)
    for widths in [(0, 0, 0), (40, 0, 0), (0, 30, 0), (0, 0, 4), (40, 0, 4)]:
        lists = [allowed_ids, bias_ids, stop_ids]
        lists = [lst if w else empty for lst, w in zip(lists, widths)]
        values = state[5] if widths[1] else torch.zeros(R, 0)
        s = [idx_mapping, state[1], lists[0], num_allowed, lists[1], values, num_bias, lists[2], num_stop, state[9]]
        check_logit_bias(backend, make_logits(T, V, torch.float32, device_of(backend), generator=gen), s)


@over_allowed_designs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wide_lists_with_duplicates(backend, dtype, gen):
    """Lists wider than a register block (more so under the interpreter, whose blocks are small), with repeated
    ids in every list and NaN logits, over a row of several chunks."""
    T, V, R = 3, V_CHUNKS, 2
    state = logit_bias_state(T, V, R, gen, allowed_w=300, bias_w=200, stop_w=150)
    state[4][:, 100:] = state[4][:, :100]  # every bias id twice
    state[7][:, 75:] = state[7][:, :75]
    state[2][:, 150:] = state[2][:, :150]
    state[3] = torch.tensor([300, 0], dtype=INT)
    state[6] = torch.tensor([200, 200], dtype=INT)
    state[8] = torch.tensor([150, 150], dtype=INT)
    state[1] = torch.zeros(T, dtype=torch.int64)
    state[9] = torch.full((R,), 5, dtype=INT)
    state[0] = torch.tensor([0, 1, 0], dtype=INT)
    logits = make_logits(T, V, dtype, device_of(backend), generator=gen)
    logits[:, state[2][0, 3].long()] = NAN
    original = logits.clone().cpu()
    run_op(backend, "logit_bias", logits, *[s.to(device_of(backend)) for s in state])
    # Each repeated bias id gets one of its two biases: every logit matches the result of the first copies
    # alone or that of the second copies alone.
    out, atol, rtol = logits.cpu().double(), *tolerance(dtype)
    matches = torch.zeros(T, V, dtype=torch.bool)
    for half in (slice(0, 100), slice(100, 200)):
        alone = list(state)
        alone[4], alone[5], alone[6] = state[4][:, half], state[5][:, half], torch.full((R,), 100, dtype=INT)
        expected = reference.logit_bias(original, *alone)
        matches |= torch.isclose(out, expected, atol=atol, rtol=rtol, equal_nan=True)
    assert bool(matches.all()), f"{int((~matches).sum())} logits match neither result"
    assert_pad_untouched(logits)


# ----------------------------------------------------------------------------------------------
# apply_token_bitmask


def random_bitmask(rows, V, gen, density=0.5):
    words = (V + 31) // 32
    bits = torch.rand(rows, words * 32, generator=gen) < density
    weights = (1 << torch.arange(32, dtype=torch.int64))
    packed = (bits.view(rows, words, 32).long() * weights).sum(-1)
    return packed.to(torch.int64).where(packed < 2**31, packed - 2**32).to(torch.int32)


@over_backends_dtypes_and_shapes
@pytest.mark.parametrize("mapped", [False, True], ids=["rows", "idx_mapping"])
@pytest.mark.parametrize("density", [0.7, 0.01], ids=["dense", "sparse"])  # sparse: most sectors are not read
def test_token_bitmask_matches_reference(backend, dtype, T, V, mapped, density, gen):
    device = device_of(backend)
    logits = make_logits(T, V, dtype, device, generator=gen)
    R = 5
    bitmask = random_bitmask(R if mapped else T, V, gen, density=density)
    idx_mapping = None
    if mapped:
        idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=torch.int64)
        idx_mapping[0] = R if T > 1 else 0  # out of range: untouched
        idx_mapping = idx_mapping.to(device)
    expected = reference.apply_token_bitmask(logits.cpu(), bitmask, None if idx_mapping is None else idx_mapping.cpu())
    run_op(backend, "apply_token_bitmask", logits, bitmask.to(device), idx_mapping)
    torch.testing.assert_close(logits.cpu().double(), expected, atol=0, rtol=0)
    assert_pad_untouched(logits)


@pytest.mark.cuda
def test_more_than_2_pow_31_elements():
    """Rows past element 2**31 are addressed with 64-bit offsets (the last row is checked)."""
    logits = logits_past_2_pow_31()
    T, V = logits.shape
    last = logits[-1].clone()
    allowed = torch.tensor([[3, V - 1]], dtype=INT, device="cuda")
    idx_mapping = torch.full((T,), 1, dtype=INT, device="cuda")  # slot 1 is out of range: untouched
    idx_mapping[-1] = 0
    empty = torch.zeros(1, 0, dtype=INT, device="cuda")
    one = torch.ones(1, dtype=INT, device="cuda")
    torch.ops.sampling.logit_bias(
        logits, idx_mapping, torch.zeros(T, dtype=INT, device="cuda"), allowed, 2 * one,
        torch.tensor([[V - 1]], dtype=INT, device="cuda"), torch.tensor([[1.0]], device="cuda"), one,
        empty, 0 * one, 0 * one)
    assert int(torch.isfinite(logits[-1]).sum()) == 2
    assert logits[-1, 3] == last[3] and logits[-1, V - 1] == (last[V - 1].float() + 1.0).half()
    assert bool(torch.isfinite(logits[-2]).all())
    bitmask = torch.zeros(T, (V + 31) // 32, dtype=INT, device="cuda")
    bitmask[:-1] = -1  # only the last row is masked (entirely)
    torch.ops.sampling.apply_token_bitmask(logits, bitmask)
    assert bool(torch.isinf(logits[-1]).all()) and bool(torch.isfinite(logits[-2]).all())
