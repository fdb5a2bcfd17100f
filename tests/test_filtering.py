"""temperature and min_p against the float64 reference, on every backend."""
import pytest
import torch

import torch_sampling_ops
from torch_sampling_ops import filtering, reference

from conftest import (
    BACKENDS,
    DTYPES,
    TRITON_BACKENDS,
    assert_pad_untouched,
    device_of,
    logits_past_2_pow_31,
    make_logits,
    over_backends_dtypes_and_shapes,
    run_op,
    tolerance,
)

INT = torch.int32
NEG_INF = float("-inf")
NAN = float("nan")


def untouched_rows(idx_mapping, values, *, off_value=0.0):
    """bool [T]: rows whose slot is out of range or whose parameter is `off_value`."""
    R = values.size(0)
    idx = idx_mapping.long().cpu()
    valid = (idx >= 0) & (idx < R)
    return ~valid | (values.cpu()[idx.clamp(0, R - 1)] == off_value)


# ----------------------------------------------------------------------------------------------
# temperature


@over_backends_dtypes_and_shapes
def test_temperature_matches_reference(backend, dtype, T, V, gen):
    device = device_of(backend)
    temps = torch.tensor([0.7, 0.0, 1.9, 0.25])  # slot 1 is greedy: its rows stay unchanged
    R = temps.size(0)
    idx_mapping = ((torch.arange(T) + 2) % R).to(torch.int64 if V == 5003 else INT)
    if T > 1:
        idx_mapping[-1] = R + 5  # out of range: untouched
    logits = make_logits(T, V, dtype, device, generator=gen)
    logits[0, : V // 3] = NEG_INF  # a row with -inf entries
    if T > 2:
        logits[2] = NEG_INF  # a whole row of -inf: stays -inf
    original = logits.clone().cpu()
    expected = reference.temperature(original, idx_mapping, temps)
    run_op(backend, "temperature", logits, idx_mapping.to(device), temps.to(device))
    atol, rtol = tolerance(dtype)
    out = logits.cpu()
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)
    assert_pad_untouched(logits)
    # Greedy and out-of-range rows are bitwise untouched; the others are the IEEE float32 quotient
    # rounded once to the logits dtype, the same on every backend.
    skip = untouched_rows(idx_mapping, temps)
    assert torch.equal(out[skip], original[skip])
    if backend == "interpret" and dtype == torch.bfloat16:
        return  # the Triton interpreter truncates float32 -> bfloat16 (GPUs and the CPU round to nearest even)
    quotient = (original.float() / temps[idx_mapping.long().clamp(0, R - 1)].unsqueeze(1)).to(dtype)
    assert torch.equal(out[~skip], quotient[~skip])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 3e38 / 0.5 under the interpreter
@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_keeps_nan_and_inf(backend):
    device = device_of(backend)
    logits = make_logits(2, 8, torch.float32, device)
    logits.copy_(torch.tensor([[NAN, NEG_INF, float("inf"), 1.0, -2.0, 0.0, 3e38, -1e-30]] * 2))
    run_op(backend, "temperature", logits, torch.tensor([0, 1], dtype=INT, device=device),
           torch.tensor([0.5, 4.0], device=device))
    want = torch.tensor([[NAN, NEG_INF, float("inf"), 2.0, -4.0, 0.0, float("inf"), -2e-30],
                         [NAN, NEG_INF, float("inf"), 0.25, -0.5, 0.0, 7.5e37, -2.5e-31]])
    torch.testing.assert_close(logits.cpu(), want, atol=0, rtol=0, equal_nan=True)
    assert_pad_untouched(logits)


# ----------------------------------------------------------------------------------------------
# min_p


@over_backends_dtypes_and_shapes
def test_min_p_matches_reference(backend, dtype, T, V, gen):
    device = device_of(backend)
    ps = torch.tensor([0.0, 0.05, 0.3, 1.0, 0.9])  # slot 0 is off
    R = ps.size(0)
    idx_mapping = ((torch.arange(T) + 1) % R).to(torch.int64 if V == 4096 else INT)
    if T > 1:
        idx_mapping[-1] = -1  # out of range: untouched
    logits = make_logits(T, V, dtype, device, generator=gen)
    logits[0, ::3] = NEG_INF  # a row with -inf entries (slot 1)
    if T > 2:
        logits[1] = NEG_INF  # a whole row of -inf (slot 2): left as it is
        logits[2, 5] = NAN  # NaN never is the maximum and stays NaN (slot 3: only the maximum survives)
        logits[2, V - 1] = NAN
    original = logits.clone().cpu()
    expected = reference.min_p(original, idx_mapping, ps)
    run_op(backend, "min_p", logits, idx_mapping.to(device), ps.to(device))
    out = logits.cpu()
    # min_p only replaces logits by -inf: the survivors keep their exact values.
    torch.testing.assert_close(out.double(), expected, atol=0, rtol=0, equal_nan=True)
    assert_pad_untouched(logits)
    skip = untouched_rows(idx_mapping, ps)
    torch.testing.assert_close(out[skip], original[skip], atol=0, rtol=0, equal_nan=True)
    if T > 3:  # row 2 has slot 3 (min_p 1.0): its maximum alone survives, the NaN stay
        assert int(torch.isfinite(out[2]).sum()) == 1 and bool(out[2, [5, V - 1]].isnan().all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_min_p_one_keeps_only_the_ties_of_the_maximum(backend, dtype, gen):
    T, V = 3, 5003
    device = device_of(backend)
    logits = make_logits(T, V, dtype, device, generator=gen)
    logits.clamp_(max=10.0)
    ties = {0: [7, 4100, 5002], 1: [0], 2: [4095, 4096]}
    for t, cols in ties.items():
        logits[t, cols] = 20.0
    logits[2, 100] = NAN
    run_op(backend, "min_p", logits, torch.zeros(T, dtype=INT, device=device), torch.ones(1, device=device))
    out = logits.cpu()
    for t, cols in ties.items():
        assert torch.isfinite(out[t]).nonzero().flatten().tolist() == cols
        assert bool((out[t, cols] == 20.0).all())
    assert bool(out[2, 100].isnan())
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_p_rows_without_a_maximum_are_unchanged(backend, gen):
    T, V = 5, 300
    device = device_of(backend)
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    logits[0] = NEG_INF
    logits[1] = NAN
    logits[2, ::2] = NAN
    logits[2, 1::2] = NEG_INF
    logits[3, 10:20] = NAN  # the maximum is taken over the other tokens
    logits[4, 0] = float("inf")  # +inf is the maximum: every finite token goes
    original = logits.clone().cpu()
    run_op(backend, "min_p", logits, torch.zeros(T, dtype=INT, device=device), torch.tensor([0.5], device=device))
    out = logits.cpu()
    torch.testing.assert_close(out[:3], original[:3], atol=0, rtol=0, equal_nan=True)
    expected = reference.min_p(original, torch.zeros(T, dtype=INT), torch.tensor([0.5]))
    torch.testing.assert_close(out.double(), expected, atol=0, rtol=0, equal_nan=True)
    assert bool(out[3, 10:20].isnan().all()) and int(torch.isfinite(out[3]).sum()) >= 1
    assert out[4, 0] == float("inf") and not bool(torch.isfinite(out[4]).any())
    assert_pad_untouched(logits)


@pytest.mark.interpret
def test_min_p_reduces_the_block_maxima_in_chunks(gen, monkeypatch):
    """Vocabularies of more than _MAX_BLOCK_PARTS blocks: the partial maxima are reduced chunk by chunk."""
    monkeypatch.setattr(filtering, "_MAX_BLOCK_PARTS", 2)
    T, V = 3, 3 * 4096 + 5  # 4 blocks, reduced 2 at a time
    logits = make_logits(T, V, torch.float32, "cpu", generator=gen)
    logits[0, V - 1] = 50.0  # the maximum in the last chunk
    logits[1, 0] = 50.0  # in the first
    idx_mapping = torch.zeros(T, dtype=INT)
    ps = torch.tensor([0.01])
    expected = reference.min_p(logits, idx_mapping, ps)
    run_op("interpret", "min_p", logits, idx_mapping, ps)
    torch.testing.assert_close(logits.double(), expected, atol=0, rtol=0)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [V - 1]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [0]
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_grouped_programs_write_the_same_bits(backend, gen, monkeypatch):
    """From _GROUP_MIN_T rows a program handles _GROUP blocks (here 3 of a 5-block row, the last
    group ragged): temperature and min_p give the bits of one block a program."""
    T, V = 4, 4 * 4096 + 77
    device = device_of(backend)
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    idx_mapping = torch.tensor([0, 1, -1, 2], dtype=INT, device=device)
    temps, ps = torch.tensor([0.7, 0.0, 1.3], device=device), torch.tensor([0.02, 0.1, 0.0], device=device)
    outs = []
    for min_t, group in ((T + 1, 4), (1, 3), (1, 4)):
        monkeypatch.setattr(filtering, "_GROUP_MIN_T", min_t)
        monkeypatch.setattr(filtering, "_GROUP", group)
        out = logits.as_strided((T, logits.stride(0)), (logits.stride(0), 1)).clone()[:, :V]  # pad kept
        run_op(backend, "temperature", out, idx_mapping, temps)
        run_op(backend, "min_p", out, idx_mapping, ps)
        outs.append(out)
    assert all(torch.equal(outs[0], out) for out in outs[1:])
    cpu = [a.cpu() for a in (logits, idx_mapping, temps, ps)]
    expected = reference.min_p(reference.temperature(*cpu[:3]).float(), cpu[1], cpu[3])
    torch.testing.assert_close(outs[0].double().cpu(), expected, atol=0, rtol=0)
    assert_pad_untouched(outs[-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_p_zero_is_off(backend, gen):
    T, V = 4, 5003
    device = device_of(backend)
    logits = make_logits(T, V, torch.bfloat16, device, generator=gen)
    logits[1, 3] = NAN
    original = logits.clone()
    run_op(backend, "min_p", logits, torch.tensor([0, 1, 1, 0], dtype=INT, device=device), torch.zeros(2, device=device))
    assert torch.equal(logits.view(torch.int16), original.view(torch.int16))  # bitwise, NaN included


# ----------------------------------------------------------------------------------------------
# Both ops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["temperature", "min_p"])
def test_out_of_range_slots_are_untouched(backend, op, gen):
    T, V, R = 6, 2000, 2
    device = device_of(backend)
    idx_mapping = torch.tensor([-1, R, 2**40, -(2**40), 0, 1], dtype=torch.int64)
    values = torch.tensor([0.5, 0.2])
    logits = make_logits(T, V, torch.float16, device, generator=gen)
    original = logits.clone().cpu()
    run_op(backend, op, logits, idx_mapping.to(device), values.to(device))
    out = logits.cpu()
    assert torch.equal(out[:4], original[:4])
    expected = getattr(reference, op)(original, idx_mapping, values)
    atol, rtol = tolerance(torch.float16)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)
    assert not torch.equal(out[4:], original[4:])
    assert_pad_untouched(logits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["temperature", "min_p"])
def test_empty_batch(backend, op):
    device = device_of(backend)
    logits = torch.zeros(0, 100, device=device)
    run_op(backend, op, logits, torch.zeros(0, dtype=INT, device=device), torch.ones(3, device=device))


def test_wrappers_take_keywords(gen):
    logits = make_logits(3, 500, torch.float32, "cpu", generator=gen)
    original = logits.clone()
    idx_mapping = torch.tensor([0, 1, 0], dtype=INT)
    torch_sampling_ops.temperature(logits=logits, idx_mapping=idx_mapping, temperature=torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(logits, reference.temperature(original, idx_mapping, torch.tensor([2.0, 0.5])).float())
    expected = reference.min_p(logits, idx_mapping, torch.tensor([0.1, 0.0]))
    torch_sampling_ops.min_p(logits=logits, idx_mapping=idx_mapping, min_p=torch.tensor([0.1, 0.0]))
    torch.testing.assert_close(logits.double(), expected, atol=0, rtol=0)


@pytest.mark.cuda
def test_more_than_2_pow_31_elements():
    """Rows past element 2**31 are addressed with 64-bit offsets (the last row is checked)."""
    logits = logits_past_2_pow_31()
    T, V = logits.shape
    last, second_last = logits[-1].clone(), logits[-2].clone()
    idx_mapping = torch.full((T,), 1, dtype=INT, device="cuda")  # slot 1 is out of range: untouched
    idx_mapping[-1] = 0
    torch.ops.sampling.temperature(logits, idx_mapping, torch.tensor([0.5], device="cuda"))
    scaled = (last.float() / 0.5).half()  # exact: the same on every device
    assert torch.equal(logits[-1], scaled)
    assert torch.equal(logits[-2], second_last)
    torch.ops.sampling.min_p(logits, idx_mapping, torch.tensor([1.0], device="cuda"))
    assert torch.equal(torch.isfinite(logits[-1]), scaled == scaled.max())  # only the maximum survives
    assert torch.equal(logits[-2], second_last)
