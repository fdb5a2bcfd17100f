"""Sampler and SamplingParams: add_request packs the state as the ops read it, step equals the float64
reference step (reference.sampler_step) on a copy of the state, eagerly, under torch.compile and (on
CUDA) in a CUDA graph whose replays draw fresh tokens."""
import pytest
import torch

import torch_sampling_ops as tso
from torch_sampling_ops import reference, state

from conftest import DTYPES, OP_BACKENDS, device_of, make_logits, tolerance

V = 1000
R = 6
MAX_MODEL_LEN = 8

# Slots 0..4: greedy, top-k with penalties and a bias, top-p with bad words and min tokens, an
# allowed list with min_p, a seeded plain draw; slot 5 stays free.
REQUESTS = {
    0: (tso.SamplingParams(temperature=0.0, repetition_penalty=1.3, logprobs=2), [3, 5, 5, 900]),
    1: (tso.SamplingParams(temperature=0.8, top_k=20, seed=7, frequency_penalty=0.4, presence_penalty=0.3,
                           logit_bias={11: 4.0, 999: -2.5, 12: 30.0}), [11, 12]),
    2: (tso.SamplingParams(top_p=0.9, seed=-3, bad_words=[[7], [1, 2], [12, 30, 31]], min_tokens=3,
                           stop_token_ids=[0, 31], logprobs=3), []),
    3: (tso.SamplingParams(temperature=1.3, min_p=0.05, allowed_token_ids=[30, 31, 32, 12, 999],
                           logit_bias={31: 1.5}), [30]),
    4: (tso.SamplingParams(seed=2**62, top_k=5000), [1, 2, 3]),
}
STATE = ("temperature", "top_k", "top_p", "min_p", "seeds", "repetition_penalty", "frequency_penalty",
         "presence_penalty", "allowed_ids", "num_allowed", "bias_ids", "bias_values", "num_bias", "stop_ids",
         "num_stop", "min_tokens", "bad_word_ids", "bad_word_offsets", "num_bad_words", "prompt_mask", "output_mask",
         "output_counts", "history", "output_lens")


def make_sampler(device, **kwargs) -> tso.Sampler:
    kwargs = {"max_model_len": MAX_MODEL_LEN, "max_num_logprobs": 4, **kwargs}
    sampler = tso.Sampler(R, V, device, **kwargs)
    for slot, (params, prompt) in REQUESTS.items():
        sampler.add_request(slot, params, prompt)
    return sampler


def snapshot(sampler: tso.Sampler) -> dict:
    return {name: getattr(sampler, name).cpu().clone() for name in STATE}


def step_inputs(T, dtype, device, gen, step):
    """Logits (slot 2's bad-word prefix made likely; at step 5 none of slot 3's allowed tokens
    finite, so that it draws -1), the rows' slots (each active slot once, in an order that changes,
    then rows out of range) and a bitmask that bans tokens 40..63."""
    logits = make_logits(T, V, dtype, device, generator=gen)
    order = torch.randperm(5, generator=gen).tolist()
    idx_mapping = torch.tensor((order + [-1, R + 3])[:T], dtype=torch.int32)
    bitmask = torch.full((T, (V + 31) // 32), -1, dtype=torch.int32)
    bitmask[:, 1] = 0xFF  # tokens 32..39 allowed, 40..63 banned
    if step % 2:
        logits[:, 12] = 20.0  # slot 2 then draws 12, the start of its bad word [12, 30, 31]
    if step == 5:
        logits[order.index(3), [30, 31, 32, 12, 999]] = float("-inf")
    return logits, idx_mapping.to(device), bitmask.to(device)


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_add_request_packs_the_state(backend):
    sampler = make_sampler(device_of(backend))
    s = snapshot(sampler)
    p1 = REQUESTS[1][0]
    assert s["temperature"].tolist()[:5] == pytest.approx([0.0, 0.8, 1.0, 1.3, 1.0])
    assert s["top_k"].tolist()[:5] == [0, 20, 0, 0, 0]  # top_k >= V is off
    assert s["seeds"][1] == 7 and s["seeds"][2] == -3 and s["seeds"][4] == 2**62
    assert s["num_bias"][1] == 3 and s["bias_ids"][1, :3].tolist() == list(p1.logit_bias)
    assert s["bias_values"][1, :3].tolist() == list(p1.logit_bias.values())
    assert s["num_allowed"].tolist()[:5] == [0, 0, 0, 5, 0]
    assert s["allowed_ids"][3, :5].tolist() == [30, 31, 32, 12, 999]
    assert s["min_tokens"][2] == 3 and s["num_stop"][2] == 2 and s["stop_ids"][2, :2].tolist() == [0, 31]
    assert s["num_bad_words"][2] == 3 and s["bad_word_offsets"][2, :4].tolist() == [0, 1, 3, 6]
    assert s["bad_word_ids"][2, :6].tolist() == [7, 1, 2, 12, 30, 31]
    assert torch.equal(s["prompt_mask"][0], state.pack_token_bitmask([3, 5, 900], V, "cpu"))
    for name in ("output_counts", "output_mask", "history", "output_lens"):
        assert not s[name].any(), name


@pytest.mark.parametrize("backend", OP_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("processed", [False, True], ids=["raw_logprobs", "processed_logprobs"])
def test_step_matches_the_reference_step(backend, dtype, processed, gen):
    """Ten steps, past max_model_len: processed logits, tokens, logprobs and recorded state against
    reference.sampler_step on the state before each step."""
    device = device_of(backend)
    sampler = make_sampler(device, processed_logprobs=processed)
    atol, rtol = tolerance(dtype)
    for step in range(10):
        logits, idx_mapping, bitmask = step_inputs(7, dtype, device, gen, step)
        before = snapshot(sampler)
        given = logits.cpu().clone()
        out = sampler.step(logits, idx_mapping, bitmask)
        x, tokens, lp, recorded = reference.sampler_step(given, idx_mapping.cpu(), bitmask.cpu(), before,
                                                         max_model_len=MAX_MODEL_LEN, max_num_logprobs=4,
                                                         processed_logprobs=processed)
        # Rows out of range too: the token bitmask alone, which goes by row, changes them.
        torch.testing.assert_close(logits.cpu(), x, atol=atol, rtol=rtol)
        assert torch.equal(out.sampled_token_ids.cpu(), tokens), step
        assert torch.equal(out.topk_ids.cpu(), lp[0]) and torch.equal(out.token_ranks.cpu(), lp[3])
        torch.testing.assert_close(out.topk_logprobs.cpu().double(), lp[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.token_logprobs.cpu().double(), lp[2], atol=1e-4, rtol=1e-4)
        after = snapshot(sampler)
        for name, expected in recorded.items():
            assert torch.equal(after[name], expected), (step, name)
    assert sampler.output_lens.tolist() == [10, 10, 10, 9, 10, 0]  # slot 3 drew -1 once
    history = sampler.history[2].tolist()  # slot 2's first 8 tokens: no bad word completed
    assert 7 not in history and all(history[i:i + 2] != [1, 2] and history[i:i + 3] != [12, 30, 31]
                                    for i in range(MAX_MODEL_LEN))


def test_step_passes_the_ops_value_checks(debug_checks, gen):
    """With the ops' value checks on (ids, offsets and history lengths in range), past max_model_len."""
    debug_checks(True)
    sampler = make_sampler("cpu")
    for step in range(MAX_MODEL_LEN + 2):
        sampler.step(*step_inputs(7, torch.float32, "cpu", gen, step))


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_step_under_torch_compile_equals_eager(backend, gen):
    """torch.compile(fullgraph=True) of step: the same tokens, logprobs and state, bit for bit."""
    device = device_of(backend)
    eager, compiled = make_sampler(device), make_sampler(device)
    step = torch.compile(compiled.step, fullgraph=True)
    for i in range(3):
        logits, idx_mapping, bitmask = step_inputs(6, torch.float32, device, gen, i)
        a = eager.step(logits.clone(), idx_mapping, bitmask)
        b = step(logits.clone(), idx_mapping, bitmask)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    for name, value in snapshot(eager).items():
        assert torch.equal(value, getattr(compiled, name).cpu()), name


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_a_request_draws_the_same_tokens_in_any_batch(backend, gen):
    """Slot 2 stepped alone, then with the others in a changing order: the same tokens and state."""
    device = device_of(backend)
    alone, batched = make_sampler(device), make_sampler(device)
    for step in range(4):
        logits, idx_mapping, bitmask = step_inputs(5, torch.float32, device, gen, step)
        row = idx_mapping.tolist().index(2)
        a = alone.step(logits[row:row + 1].clone(), idx_mapping[row:row + 1], bitmask[row:row + 1])
        b = batched.step(logits, idx_mapping, bitmask)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x[0], y[row])
    for name in ("output_counts", "output_mask", "history", "output_lens"):
        assert torch.equal(getattr(alone, name)[2], getattr(batched, name)[2]), name


def test_skip_unused_ops_leaves_out_only_what_no_request_needs(monkeypatch, gen):
    """A sampler that skips the ops no request needs gives what one that runs them all gives, as
    requests come and go; it runs penalties, logit_bias, bad_words and logprobs only while a request
    needs them (the requests' own lists changed after add_request do not count)."""
    from torch_sampling_ops import sampler as sampler_module

    calls = []
    for name in ("logit_bias", "bad_words", "penalties"):
        op = getattr(sampler_module, name)
        monkeypatch.setattr(sampler_module, name, lambda *args, op=op, name=name: (calls.append(name), op(*args))[1])
    skipping, full = (tso.Sampler(R, V, max_num_logprobs=2, skip_unused_ops=skip) for skip in (True, False))
    late_words = []  # given empty, filled after add_request: the sampler keeps what it was given
    requests = {0: tso.SamplingParams(seed=1, bad_words=late_words), 1: tso.SamplingParams(temperature=0.0),
                2: tso.SamplingParams(seed=2, presence_penalty=0.5),
                3: tso.SamplingParams(seed=3, bad_words=[[5], [1, 2]], logprobs=1),
                4: tso.SamplingParams(seed=4, logit_bias={3: 2.0}, min_tokens=3, stop_token_ids=[7])}
    schedule = {0: ([0, 1], []), 2: ([2], []), 3: ([3, 4], []), 5: ([], [0, 2, 4])}  # step: (added, removed)
    ran = []
    for step in range(8):
        for sampler in (skipping, full):
            added, removed = schedule.get(step, ([], []))
            for slot in added:
                sampler.add_request(slot, requests[slot], [1, 5, 9])
            for slot in removed:
                sampler.remove_request(slot)
        if step == 0:
            late_words.append([9])
        slots = [slot for slot in range(R) if skipping.request(slot) is not None]
        logits = make_logits(len(slots), V, torch.float32, "cpu", generator=gen)
        idx_mapping = torch.tensor(slots, dtype=torch.int32)
        mine, theirs = logits.clone(), logits.clone()
        calls.clear()
        a = skipping.step(mine, idx_mapping)
        ran.append(sorted(set(calls)))
        b = full.step(theirs, idx_mapping)
        assert torch.equal(mine, theirs), step
        assert torch.equal(a.sampled_token_ids, b.sampled_token_ids), step
        if step < 3:  # no request asked for logprobs yet
            assert a.topk_ids is None and b.topk_ids is not None
        else:
            for u, v in zip(a, b, strict=True):
                assert torch.equal(u, v), step
    assert ran == [[], [], ["penalties"], ["bad_words", "logit_bias", "penalties"],
                   ["bad_words", "logit_bias", "penalties"], ["bad_words"], ["bad_words"], ["bad_words"]]
    for name, value in snapshot(full).items():
        assert torch.equal(value, getattr(skipping, name)), name


def test_a_tiny_temperature_is_greedy():
    sampler = tso.Sampler(2, V)
    sampler.add_request(0, tso.SamplingParams(temperature=1e-30))
    sampler.add_request(1, tso.SamplingParams(temperature=tso.sampler.GREEDY_TEMPERATURE))
    assert sampler.temperature.tolist() == [0.0, pytest.approx(1e-5)]
    logits = make_logits(1, V, torch.float32, "cpu")
    assert sampler.step(logits.clone(), torch.tensor([0]))[0].tolist() == [int(logits[0].argmax())]


def test_idx_mapping_is_not_modified():
    sampler = make_sampler("cpu")
    idx_mapping = torch.tensor([0, -1, 3, R + 3, -7], dtype=torch.int64)
    sampler.step(torch.randn(5, V), idx_mapping)
    assert idx_mapping.tolist() == [0, -1, 3, R + 3, -7]


@pytest.mark.parametrize("backend", OP_BACKENDS)
def test_bad_words_ban_the_next_token_until_max_model_len(backend):
    """Greedy, bad words [1, 2] and [4]: after a 1 the argmax 2 is banned (the next best drawn), 4
    always; once the history (max_model_len tokens) has stopped, only the one-token word applies."""
    device = device_of(backend)
    L = 3
    sampler = tso.Sampler(2, 16, device, max_model_len=L)
    sampler.add_request(1, tso.SamplingParams(temperature=0.0, bad_words=[[1, 2], [4]]))
    idx_mapping = torch.tensor([1], device=device)

    def step(*best):  # logits ranking the given tokens first
        logits = torch.zeros(1, 16, device=device)
        logits[0, list(best)] = torch.arange(len(best), 0, -1, dtype=torch.float32, device=device)
        return int(sampler.step(logits, idx_mapping).sampled_token_ids[0])

    # The 4th token sees the whole history (3 tokens); from the 5th on it has stopped.
    assert [step(4, 1), step(2, 6), step(1), step(2, 5), step(4, 1), step(2, 5)] == [1, 6, 1, 5, 1, 2]
    assert sampler.history[1].tolist() == [1, 6, 1]


def test_debug_checks_refuse_a_slot_twice_in_a_step(debug_checks):
    debug_checks(True)
    sampler = make_sampler("cpu")
    logits = torch.randn(3, V)
    given = logits.clone()
    with pytest.raises(ValueError, match="'idx_mapping' must hold each slot at most once a step"):
        sampler.step(logits, torch.tensor([1, -1, 1], dtype=torch.int32))
    assert torch.equal(logits, given)
    sampler.step(logits, torch.tensor([1, -1, -1], dtype=torch.int32))  # out of range twice is fine


def test_an_empty_batch_changes_nothing():
    sampler = make_sampler("cpu")
    before = snapshot(sampler)
    out = sampler.step(torch.randn(0, V), torch.zeros(0, dtype=torch.int32))
    assert out.sampled_token_ids.shape == (0,) and out.topk_ids.shape == (0, 4)
    assert all(torch.equal(v, getattr(sampler, k)) for k, v in before.items())


def test_top_k_off_is_packed_as_zero():
    """-1, 0 and V or more all mean top-k off, which the ops read as 0."""
    sampler = tso.Sampler(4, V)
    for slot, k in enumerate((-1, 0, V, 7)):
        sampler.add_request(slot, tso.SamplingParams(top_k=k))
    assert sampler.top_k.tolist() == [0, 0, 0, 7]


OPS = ("apply_token_bitmask", "logit_bias", "bad_words", "penalties", "sample", "logprobs", "update_output_counts",
       "temperature", "min_p", "top_k_top_p")


@pytest.mark.parametrize("dtype, processed", [(torch.float32, False), (torch.bfloat16, True)], ids=["fp32", "bf16"])
def test_warmup_prepares_every_variant_a_step_launches(monkeypatch, gen, dtype, processed):
    """Each Triton launch of steps of 1 to R rows (its kernel, constants and argument specialisation,
    as warmup's variant key) is one that Sampler.warmup's launches make: the step's ops run their
    Triton launchers, which only record here, and then the C++ kernels, which give the data."""
    from torch_sampling_ops import _launch, _registry, _warmup
    from torch_sampling_ops import sampler as sampler_module

    sampler = make_sampler("cpu", processed_logprobs=processed)
    sizes = sampler._warmup_sizes()
    dtypes = (dtype, torch.float32) if processed else (dtype,)
    launch_args = (V, dtypes, sizes["max_num_tokens"], torch.device("cpu"), sizes["num_slots"], sizes["index_dtype"],
                   sizes["logit_bias_widths"], 4, sizes["num_logprobs"], sizes["bad_words_shape"])
    warm = {_warmup._variant_key(*variant) for variant in _warmup._distinct_variants(launch_args)}
    launched = {}

    def note(kernel, args, meta):
        launched[_warmup._variant_key(kernel, args, meta)] = _warmup._kernel_name(kernel)
        return False  # nothing compiles or runs

    def through_triton(name, op):
        def run(*args):
            with _launch.compiling_only(note):
                _registry.triton_impl(name)(*args)
            return op(*args)
        return run

    for name in OPS:
        monkeypatch.setattr(sampler_module, name, through_triton(name, getattr(sampler_module, name)))
    for step, T in enumerate((1, 3, R)):
        logits, idx_mapping, bitmask = step_inputs(T, dtype, "cpu", gen, step)
        sampler.step(logits, idx_mapping, bitmask)
    assert set(launched.values()) >= {"_allowed_and_bias_kernel", "_bad_words_kernel", "_penalties_kernel"}
    missing = sorted(name for key, name in launched.items() if key not in warm)
    assert not missing, missing


@pytest.mark.interpret
def test_step_through_the_triton_kernels_equals_the_cpu_kernels(monkeypatch, gen):
    """The step with every op run by its Triton kernels (interpreted) against the C++ kernels: the
    same tokens and recorded state, logits and logprobs within float32 rounding."""
    from torch_sampling_ops import _registry
    from torch_sampling_ops import sampler as sampler_module

    cpp, triton_path = make_sampler("cpu"), make_sampler("cpu")
    cpp_ops = {name: getattr(sampler_module, name) for name in OPS}
    for step in (0, 1, 5):
        logits, idx_mapping, bitmask = step_inputs(7, torch.float32, "cpu", gen, step)
        x, y = logits.clone(), logits.clone()
        a = cpp.step(x, idx_mapping, bitmask)
        for name in OPS:
            monkeypatch.setattr(sampler_module, name, _registry.triton_impl(name))
        b = triton_path.step(y, idx_mapping, bitmask)
        for name in OPS:
            monkeypatch.setattr(sampler_module, name, cpp_ops[name])
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        for u, v in zip(a, b, strict=True):
            torch.testing.assert_close(u, v, atol=1e-4, rtol=1e-4)
        assert torch.equal(a.sampled_token_ids, b.sampled_token_ids) and torch.equal(a.topk_ids, b.topk_ids)
    for name, value in snapshot(cpp).items():
        assert torch.equal(value, getattr(triton_path, name)), name


def test_seeds_come_from_the_sampler_seed():
    """Requests without a seed get one from the sampler's generator: equal for equal sampler seeds."""
    seeds = [tso.Sampler(2, V, seed=s) for s in (0, 0, 1)]
    for sampler in seeds:
        sampler.add_request(0, tso.SamplingParams())
        sampler.add_request(1, tso.SamplingParams())
    a, b, c = (s.seeds.tolist() for s in seeds)
    assert a == b and a != c and a[0] != a[1]


def test_slots_are_reused_after_remove_request():
    sampler = make_sampler("cpu")
    sampler.step(torch.randn(5, V), torch.arange(5, dtype=torch.int32))
    assert sampler.request(2) is REQUESTS[2][0]
    sampler.remove_request(2)
    assert sampler.request(2) is None
    sampler.add_request(2, tso.SamplingParams(), [4])
    assert sampler.output_lens[2] == 0 and not sampler.output_counts[2].any() and not sampler.history[2].any()
    assert sampler.num_bad_words[2] == 0 and sampler.min_tokens[2] == 0
    with pytest.raises(ValueError, match="holds no request"):
        sampler.remove_request(5)


BAD_PARAMS = [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(min_p=2.0), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(min_tokens=-1), "min_tokens"),
    (dict(logprobs=-1), "logprobs"), (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[V]), "allowed_token_ids"), (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(stop_token_ids=[V + 5]), "stop_token_ids"), (dict(bad_words=[[1, V]]), "bad_words"),
    (dict(temperature=float("inf")), "temperature"), (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(presence_penalty=float("-inf")), "presence_penalty"), (dict(seed=2**63), "seed"),
    (dict(logit_bias={3: float("inf")}), "logit_bias"),
    # as the sampler stores them: float32 and int32
    (dict(temperature=1e39), "temperature"), (dict(repetition_penalty=1e-50), "repetition_penalty"),
    (dict(frequency_penalty=1e39), "frequency_penalty"), (dict(logit_bias={3: -1e39}), "logit_bias"),
    (dict(min_tokens=2**31), "min_tokens"), (dict(top_k=2**31), "top_k"),
    # integers that are not
    (dict(top_k=2.5), "top_k"), (dict(seed=1.5), "seed"), (dict(logit_bias={"3": 1.0}), "logit_bias"),
    (dict(logit_bias={3.7: 1.0}), "logit_bias"), (dict(allowed_token_ids=[1, 2.0]), "allowed_token_ids"),
    (dict(min_tokens=1, stop_token_ids=["a"]), "stop_token_ids"), (dict(logprobs=1.5), "logprobs"),
]


@pytest.mark.parametrize("kwargs, name", BAD_PARAMS)
def test_bad_params_are_refused_before_any_write(kwargs, name):
    sampler = tso.Sampler(2, V)
    before = snapshot(sampler)
    with pytest.raises(ValueError, match=f"SamplingParams.{name}"):
        sampler.add_request(0, tso.SamplingParams(**kwargs))
    assert all(torch.equal(v, getattr(sampler, k)) for k, v in before.items())
    assert sampler.request(0) is None


@pytest.mark.parametrize("kwargs, params, match", [
    (dict(), dict(logprobs=0), "max_num_logprobs"),
    (dict(max_num_logprobs=2), dict(logprobs=3), "max_num_logprobs"),
    (dict(max_allowed_ids=2), dict(allowed_token_ids=[1, 2, 3]), "max_allowed_ids = 2"),
    (dict(max_logit_bias=1), dict(logit_bias={1: 1.0, 2: 1.0}), "max_logit_bias = 1"),
    (dict(max_stop_ids=1), dict(min_tokens=2, stop_token_ids=[1, 2]), "max_stop_ids = 1"),
    (dict(max_bad_words=1), dict(bad_words=[[1], [2]]), "max_bad_words = 1"),
    (dict(max_bad_word_ids=2), dict(bad_words=[[1, 2, 3]]), "max_bad_word_ids = 2"),
])
def test_requests_beyond_the_capacities_are_refused(kwargs, params, match):
    sampler = tso.Sampler(2, V, **kwargs)
    with pytest.raises(ValueError, match=match):
        sampler.add_request(1, tso.SamplingParams(**params))
    assert sampler.request(1) is None


def test_bad_slots_and_logits_are_refused():
    sampler = make_sampler("cpu")
    with pytest.raises(ValueError, match=r"slot must be in \[0, 6\)"):
        sampler.add_request(6, tso.SamplingParams())
    with pytest.raises(ValueError, match="slot 1 is in use"):
        sampler.add_request(1, tso.SamplingParams())
    idx = torch.zeros(2, dtype=torch.int32)
    logits = torch.randn(2, V)
    given = logits.clone()
    words = torch.zeros(2, (V + 31) // 32, dtype=torch.int32)
    for bad, match in [((torch.randn(2, V + 1), idx, None), r"'logits' must have shape \('\*', 1000\)"),
                       ((logits.double(), idx, None), "'logits' must be float32 or float16 or bfloat16"),
                       ((logits, idx[:1], None), r"'idx_mapping' must have shape \(2,\)"),
                       ((logits, idx.float(), None), "'idx_mapping' must be int32 or int64"),
                       ((logits, idx.repeat_interleave(2)[::2], None), "'idx_mapping' must have unit stride"),
                       ((logits, idx, words[:, 1:]), r"'token_bitmask' must have shape \(2, 32\)"),
                       ((logits, idx, words.long()), "'token_bitmask' must be int32")]:
        with pytest.raises((ValueError, TypeError), match=match):
            sampler.step(*bad)
        assert torch.equal(logits, given)
    with pytest.raises(ValueError, match="max_num_logprobs"):
        tso.Sampler(2, V, max_num_logprobs=V + 1)
    assert not sampler.output_lens.any()


@pytest.mark.cuda
def test_after_sampler_warmup_a_step_compiles_nothing(gen):
    from triton.runtime.jit import JITFunction

    from torch_sampling_ops import constraints, filtering, history, sampling
    from torch_sampling_ops.truncation import scan, select

    device = torch.device("cuda", torch.cuda.current_device())
    sampler = make_sampler(device, processed_logprobs=True)
    assert sampler.warmup((torch.bfloat16,))["calls"] > 0
    kernels = [k for m in (constraints, filtering, history, sampling, scan, select) for k in vars(m).values()
               if isinstance(k, JITFunction)]
    cached = {k: len(k.device_caches[device.index][0]) for k in kernels}
    for step, T in enumerate((1, 3, R)):
        sampler.step(*step_inputs(T, torch.bfloat16, device, gen, step))
    torch.cuda.synchronize()
    after = {k: len(k.device_caches[device.index][0]) for k in kernels}
    assert after == cached, {k.fn.__name__: (cached[k], after[k]) for k in kernels if after[k] != cached[k]}


@pytest.mark.cuda
def test_step_in_a_cuda_graph_draws_fresh_tokens(gen):
    """A captured step replayed: each replay draws at the next positions, as eager steps of a twin
    sampler do, and records its tokens; no replay reads the host."""
    device = torch.device("cuda")
    graphed, eager = make_sampler(device), make_sampler(device)
    logits, idx_mapping, bitmask = step_inputs(5, torch.float32, device, gen, 0)
    given = logits.clone()
    graphed.step(logits.clone(), idx_mapping, bitmask)  # compiles the kernels outside the capture
    eager.step(logits.clone(), idx_mapping, bitmask)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = graphed.step(logits, idx_mapping, bitmask)
    # Capture recorded the step without running it: both samplers stand after one step.
    draws = []
    for _ in range(4):
        logits.copy_(given)
        graph.replay()
        expected = eager.step(given.clone(), idx_mapping, bitmask)
        for x, y in zip(out, expected, strict=True):
            assert torch.equal(x, y)
        draws.append(out.sampled_token_ids.clone())
    assert len({tuple(d.tolist()) for d in draws}) > 1
    for name, value in snapshot(eager).items():
        assert torch.equal(value, getattr(graphed, name).cpu()), name
