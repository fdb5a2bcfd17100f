"""top_k_top_p against the float64 reference on every backend: realistic, peaked and flat rows, ties
at both boundaries, -inf and NaN entries, brackets that need narrowing, batch invariance."""
import pytest
import torch

from torch_sampling_ops import reference
from torch_sampling_ops.truncation.op import _top_k_top_p_triton

from conftest import (
    BACKENDS,
    OP_BACKENDS,
    assert_pad_untouched,
    device_of,
    logits_past_2_pow_31,
    make_logits,
    over_backends_dtypes_and_shapes,
    run_op,
)

INT = torch.int32
NEG_INF = float("-inf")
# (top_k, top_p) per slot: k only, p only, both, neither, k = 1, k >= V, tiny p
SETTINGS = [(50, 1.0), (0, 0.9), (20, 0.8), (0, 1.0), (1, 1.0), (10**6, 0.95), (0, 1e-6), (3, 0.5)]


def slots_for(T, R, gen):
    idx_mapping = torch.randint(0, R, (T,), generator=gen, dtype=INT)
    idx_mapping[: min(T, R)] = torch.arange(min(T, R), dtype=INT)  # every setting appears
    return idx_mapping


def assert_matches(logits, original, idx_mapping, top_k, top_p):
    """Kept tokens keep their value, the rest are -inf; membership may differ from the float64
    reference only for a top-p boundary token whose exact mass above is within 1e-4 of top_p."""
    expected = reference.top_k_top_p(original, idx_mapping, top_k, top_p)
    out = logits.cpu()
    kept, want = out > NEG_INF, expected > NEG_INF
    assert torch.equal(out[kept], original[kept]), "a kept token changed value"
    for t, j in (kept != want).nonzero().tolist():
        r = int(idx_mapping[t])
        x = torch.where(original[t].isnan(), NEG_INF, original[t].double())
        k = int(top_k[r])
        kth = x.sort(descending=True).values[k - 1] if 0 < k < x.numel() else NEG_INF
        probs = torch.where(x >= kth, torch.exp(x - x.max()), 0.0)
        probs /= probs.sum()
        mass_above = float(probs[x > x[j]].sum())
        assert abs(mass_above - float(top_p[r])) <= 1e-4, (
            f"row {t} token {j}: kept={bool(kept[t, j])}, reference={bool(want[t, j])}, mass above {mass_above}")


def run_and_check(backend, logits, idx_mapping, top_k, top_p):
    device = logits.device
    original = logits.cpu().clone()
    run_op(backend, "top_k_top_p", logits, idx_mapping.to(device), top_k.to(device), top_p.to(device))
    assert_matches(logits, original, idx_mapping, top_k, top_p)
    assert_pad_untouched(logits)


def settings(pairs):
    return torch.tensor([k for k, _ in pairs], dtype=INT), torch.tensor([p for _, p in pairs])


def test_cpu_top_p_near_one_keeps_the_reference_set():
    """The CPU kernel sums float32 exponentials (1 ulp) in double: even at top_p = 1 - 2**-24, where
    the boundary moves with the last bits of the tail's mass, it keeps exactly the float64
    reference's tokens (rows of randn * 3, and * 30 whose tails lie far below the maximum)."""
    T, V = 16, 5003
    logits = torch.randn(T, V, generator=torch.Generator().manual_seed(3)) * 3
    logits[:4] *= 10
    idx = torch.arange(T, dtype=INT)
    for p in (1.0 - 2.0**-24, 0.9999, 0.99, 1e-6):
        top_k, top_p = torch.zeros(T, dtype=INT), torch.full((T,), p)
        out = logits.clone()
        torch.ops.sampling.top_k_top_p(out, idx, top_k, top_p)
        expected = reference.top_k_top_p(logits, idx, top_k, top_p)
        assert torch.equal(out == NEG_INF, expected == NEG_INF), p


@over_backends_dtypes_and_shapes
def test_matches_reference(backend, dtype, T, V, gen):
    if backend == "interpret" and T > 3:
        pytest.skip("the interpreter runs about 0.5 s per row of this op")
    top_k, top_p = settings(SETTINGS)
    R = top_k.size(0)
    idx_mapping = slots_for(T, R, gen)
    if T > 1:
        idx_mapping[-1] = -3  # out of range: untouched
    logits = make_logits(T, V, dtype, device_of(backend), generator=gen)
    run_and_check(backend, logits, idx_mapping, top_k, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", ["peaked", "flat", "tiny_spread"])
def test_peaked_and_flat_rows(backend, shape, gen):
    T, V = 8, 9000
    scale = {"peaked": 12.0, "flat": 0.2, "tiny_spread": 1e-3}[shape]
    top_k, top_p = settings(SETTINGS)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen, scale=scale)
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wide_brackets_are_narrowed(backend, gen):
    """Flat rows of 40000 tokens: the first top-p bracket holds more tokens than fit in registers."""
    T, V = 3, 40000
    top_k, top_p = settings([(0, 0.5), (30000, 0.9), (2500, 1.0)])
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen, scale=0.05)
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_full_vocabulary(backend, gen):
    """V = 151936 rows as the benchmark times them: on CUDA, top-p alone leaves ~10 000 candidates, so
    the selection sweeps them before it narrows the bracket into registers."""
    T, V = 4, 151936
    top_k, top_p = settings([(50, 0.9), (0, 0.9), (50, 1.0), (1000, 0.5)])
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_over_what_top_k_keeps(backend, gen):
    """Top-p renormalised over top-k's set: sets small enough to be sorted whole (k up to the
    selection's `small`, 32 in the interpreter, 128 on the GPU), a larger one searched by rounds,
    ties across the k-th value, and top_p = 0 (the largest token alone)."""
    T, V = 5, 3000
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    logits[3] = torch.round(logits[3] * 2) / 2  # values on a 0.5 grid: wide ties
    top_k, top_p = settings([(20, 0.8), (3, 0.5), (300, 0.9), (25, 0.7), (30, 0.0)])
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_at_both_boundaries_are_kept(backend):
    V = 3000
    logits = make_logits(4, V, torch.float32, device_of(backend))
    logits.copy_(torch.linspace(-5, 5, V).repeat(4, 1))
    logits[:, 100:110] = 7.0       # ten tokens tied at the 5th..10th largest value
    logits[2, 200:240] = 9.0       # 40 equal maxima: any top-p keeps all of them
    logits[3] = 1.0                # a constant row
    top_k, top_p = settings([(5, 1.0), (10, 0.99), (0, 0.3), (7, 0.5)])
    run_and_check(backend, logits, torch.arange(4, dtype=INT), top_k, top_p)
    out = logits.cpu()
    assert bool((out[0, 100:110] == 7.0).all()) and bool((out[2, 200:240] == 9.0).all())
    assert bool((out[3] == 1.0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_and_nan_rows(backend, gen):
    T, V = 4, 2000
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    logits[0, :1500] = NEG_INF                  # few finite tokens: k larger than that keeps them all
    logits[1] = NEG_INF                         # no finite logit: unchanged
    logits[2, ::7] = float("nan")               # NaN becomes -inf when a filter is on
    logits[3, :1999] = NEG_INF                  # a single finite token
    top_k, top_p = settings([(900, 1.0), (5, 0.5), (40, 0.9), (3, 0.2)])
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)
    out = logits.cpu()
    assert int((out[0] > NEG_INF).sum()) == 500 and not bool(out[2].isnan().any())


@pytest.mark.parametrize("backend", BACKENDS)
def test_positive_inf_logits(backend, gen):
    """+inf logits (tokens a bias forces) hold all the mass: top-p keeps just them, top-k counts them
    as the largest values, ties kept. Rows holding them take the general path."""
    T, V = 6, 3000
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    inf = float("inf")
    logits[0, 17] = inf
    logits[1, ::500] = inf
    logits[2, 5], logits[2, 9] = inf, float("nan")
    logits[3, 100:] = inf
    logits[4:, 1000:1600] = inf
    top_k, top_p = settings([(5, 0.9), (0, 0.9), (5, 1.0), (3, 1.0), (650, 1.0), (650, 0.5)])
    run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p)
    assert (logits.cpu() > NEG_INF).sum(dim=1).tolist() == [1, 6, 5, 2900, 650, 600]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_do_not_depend_on_the_batch_or_the_run(backend, gen):
    T, V = 6, 5000
    top_k, top_p = settings(SETTINGS)
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    idx_mapping = torch.arange(T, dtype=INT)
    batch, again = logits.clone(), logits.clone()
    for out in (batch, again):
        run_op(backend, "top_k_top_p", out, idx_mapping.to(logits.device), top_k.to(logits.device),
               top_p.to(logits.device))
    assert torch.equal(batch, again)  # bitwise the same on a second run
    for t in [0, 3, T - 1]:
        alone = logits[t:t + 1].clone()
        run_op(backend, "top_k_top_p", alone, idx_mapping[t:t + 1].to(logits.device), top_k.to(logits.device),
               top_p.to(logits.device))
        assert torch.equal(alone[0], batch[t])


def row_flags(call):
    """Runs call() and returns each row's settled flag as the selection finds it (word 1 of its workspace)."""
    from torch_sampling_ops.truncation import op
    from torch_sampling_ops.truncation.select import _select_kernel
    flags = []

    def spy(kernel, grid, *args, **meta):
        if kernel is _select_kernel:
            flags.append(args[5][:, 1].clone().view(INT))
        launch(kernel, grid, *args, **meta)

    launch = op.launch
    with pytest.MonkeyPatch.context() as patch:  # undoes this patch only
        patch.setattr(op, "launch", spy)
        call()
    return flags[0].cpu()


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "cpu"])
def test_every_way_to_settle_a_row_matches_the_reference(backend, gen):
    """Top-p alone settles a row on its candidates (flag 1), on those >= the second bound (flag 2),
    or leaves it to the general path (flag 0): each way gives the reference's answer."""
    top_p = [0.3, 0.5, 0.8, 0.82, 0.84, 0.86, 0.88, 0.9, 0.92, 0.95, 0.99]
    T, V = len(top_p), 5000
    top_k, top_p = settings([(0, p) for p in top_p])
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    flags = row_flags(lambda: run_and_check(backend, logits, torch.arange(T, dtype=INT), top_k, top_p))
    assert {0, 1, 2} <= set(flags.tolist()), flags.tolist()


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "cpu"])
def test_rows_are_settled_and_filled_alike_in_small_and_large_batches(backend, gen):
    """Small batches settle a row in each of its gather programs and fill one chunk a program; large
    ones settle it in a launch of their own and fill fill_group chunks a program (5 chunks here,
    so the last program has fewer), or, from fill_in_select_min_t rows, fill it in the selection;
    from few_sample_warps_min_t rows the sample launch has 4 warps; from scan_group_min_t rows a
    scan program of `sample`'s plan walks scan_group segments: the same combinations in the same
    order, so the same bits."""
    from torch_sampling_ops.truncation import current_settings, use_settings
    T, V = 6, 5 * current_settings().chunk - 100
    top_k, top_p = settings(SETTINGS[:4] + [(0, 0.5), (0, 0.92)])
    logits = make_logits(T, V, torch.float32, device_of(backend), generator=gen)
    args = (torch.arange(T, dtype=INT).to(logits.device), top_k.to(logits.device), top_p.to(logits.device))
    outs = []
    combos = ((T + 1, 4, T + 1, T + 1, T + 1, 4), (1, 4, T + 1, 1, T + 1, 4), (1, 3, T + 1, T + 1, 1, 4),
              (1, 4, 1, 1, 1, 3), (T + 1, 1, 1, T + 1, 1, 7))
    for min_t, group, fill_min_t, sample_min_t, scan_min_t, scan_group in combos:
        out = logits.clone()
        with use_settings(few_sample_warps_min_t=sample_min_t, settle_launch_min_t=min_t, fill_group=group,
                          fill_in_select_min_t=fill_min_t, scan_group_min_t=scan_min_t, scan_group=scan_group):
            if scan_min_t > T:
                run_op(backend, "top_k_top_p", out, *args)
            else:  # the grouped scan, as `sample` asks for it
                _top_k_top_p_triton(out, *args, group_scan=True)
        outs.append(out)
    assert all(torch.equal(outs[0], out) for out in outs[1:])
    assert_matches(outs[-1], logits.cpu(), *[a.cpu() for a in args])


@pytest.mark.cuda
def test_benchmark_rows_are_settled_by_their_candidates(gen):
    """The general path is exact but several times slower: rows like the benchmark's (V = 151936,
    randn * 3) must be settled by their candidates under every setting it times, and a few more."""
    T, V = 16, 151936
    top_k, top_p = settings([(50, 0.9), (0, 0.9), (50, 1.0), (1000, 0.5), (0, 0.5), (0, 0.8), (20, 1.0), (1, 0.3)])
    logits = make_logits(T, V, torch.float32, "cuda", generator=gen)
    flags = row_flags(lambda: run_and_check("cuda", logits, torch.arange(T, dtype=INT) % 8, top_k, top_p))
    assert bool((flags != 0).all()), f"rows left to the general path: {flags.tolist()}"


@pytest.mark.cuda
# below settle_launch_min_t, from it, and from fill_in_select_min_t: five, six and five launches
@pytest.mark.parametrize("T", [5, 40, 130])
def test_dependent_launches_change_no_bit(T, gen):
    """On Hopper and later, each launch after the first starts while the previous one drains
    (programmatic dependent launch): the results are those of plain launches, bit for bit."""
    from torch_sampling_ops.truncation import use_settings
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    top_k, top_p = settings(SETTINGS)
    logits = make_logits(T, 20000, torch.float32, "cuda", generator=gen)
    idx_mapping = (torch.arange(T, dtype=INT) % len(SETTINGS)).cuda()
    outs = []
    for pdl in (False, True):
        out = logits.clone()
        with use_settings(dependent_launches=pdl):
            torch.ops.sampling.top_k_top_p(out, idx_mapping, top_k.cuda(), top_p.cuda())
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert_matches(outs[1], logits.cpu(), idx_mapping.cpu(), top_k, top_p)


@pytest.mark.cuda
def test_more_than_2_pow_31_elements():
    logits = logits_past_2_pow_31()
    T, V = logits.shape
    idx_mapping = torch.ones(T, dtype=INT, device="cuda")  # slot 1: filters off
    idx_mapping[-1] = 0
    top_k = torch.tensor([5, 0], dtype=INT, device="cuda")
    top_p = torch.tensor([1.0, 1.0], device="cuda")
    last = logits[-1].clone()
    torch.ops.sampling.top_k_top_p(logits, idx_mapping, top_k, top_p)
    assert int((logits[-1] > NEG_INF).sum()) >= 5
    assert torch.equal(logits[-1][logits[-1] > NEG_INF].sort().values, last.sort().values[-int((logits[-1] > NEG_INF).sum()):])
    assert bool((logits[-2] > NEG_INF).all())
