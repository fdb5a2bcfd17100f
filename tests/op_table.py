"""The op table: per op, a factory of valid random arguments, how a result is checked against the
reference, and the bad inputs with the error each must raise. test_ops.py runs every entry through
validation, debug-mode value checks, opcheck, torch.compile and CUDA-graph replay; an op's semantic
tests stay in its family's test module. A new op is one entry here.

Besides an entry's own bad inputs, every tensor argument gets the generic ones of `bad_inputs`
(wrong dtype, rank, length, stride, device; requires grad), and every mutated one shared rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import test_constraints
import test_history
import test_sampling
import test_speculative
import test_truncation
import torch

from torch_sampling_ops import reference

from conftest import make_logits, tolerance

INT = torch.int32


@dataclass(frozen=True)
class Bad:
    """One bad input: `make(value, device)` turns the valid value of argument `arg` into a bad one,
    for which the op must raise `error` naming `arg`, before anything runs."""

    arg: str
    what: str
    make: Callable[[torch.Tensor, torch.device], torch.Tensor]
    error: type[Exception]


@dataclass(frozen=True)
class BadValue:
    """A value only TORCH_SAMPLING_OPS_DEBUG=1 rejects: `spoil(args)` writes it into valid arguments."""

    arg: str
    what: str
    spoil: Callable[[list], None]


@dataclass(frozen=True)
class OpSpec:
    name: str
    args: Callable[[torch.device, torch.Generator], list]  # fresh valid arguments, logits first
    anchors: frozenset[str]  # arguments whose sizes define T, V or R: no "wrong length" case
    bad: list[Bad] = field(default_factory=list)
    bad_values: list[BadValue] = field(default_factory=list)
    # check(out, original logits, other arguments), all on the CPU: asserts out is the reference's answer
    check: Callable | None = None
    # a fresh tensor made from the first argument, for the op to write in place inside a compiled step
    fresh: Callable[[torch.Tensor], torch.Tensor] = lambda first: first * 2.0
    # the op returns its results (checked by `check`) and writes nothing in place
    returns: bool = False

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.sampling, self.name).default

    def run(self, args: list):
        """Calls the op; returns what it produced: its outputs, or its first argument written in place."""
        out = self.op(*args)
        return out if self.returns else args[0]

    def assert_matches(self, out: torch.Tensor, original: torch.Tensor, state: list) -> None:
        if self.check is not None:
            return self.check(out, original, state)
        expected = getattr(reference, self.name)(original, *state)
        atol, rtol = tolerance(out.dtype)
        torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol, equal_nan=True)


def _slots(T: int, R: int, gen) -> torch.Tensor:
    """Random slots in [-1, R]: out-of-range ones (rows left untouched) included."""
    return torch.randint(-1, R + 1, (T,), generator=gen, dtype=INT)


def _logit_bias_args(device, gen, T=5, V=1000):
    state = test_constraints.logit_bias_state(T, V, 3, gen)
    return [make_logits(T, V, torch.float32, device, generator=gen)] + [s.to(device) for s in state]


def _token_bitmask_args(device, gen, T=5, V=1000):
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    return [logits, test_constraints.random_bitmask(3, V, gen).to(device), _slots(T, 3, gen).to(device)]


def _temperature_args(device, gen, T=5, V=1000):
    temps = torch.rand(3, generator=gen) * 1.8 + 0.2
    temps[torch.rand(3, generator=gen) < 0.3] = 0.0  # greedy slots
    return [make_logits(T, V, torch.float32, device, generator=gen), _slots(T, 3, gen).to(device), temps.to(device)]


def _min_p_args(device, gen, T=5, V=1000):
    ps = torch.tensor([0.0, 1.0, 0.0, 0.0])  # off, ties of the maximum, then random
    ps[2:] = torch.rand(2, generator=gen) * 0.5
    return [make_logits(T, V, torch.float32, device, generator=gen), _slots(T, 4, gen).to(device), ps.to(device)]


def _top_k_top_p_args(device, gen, T=5, V=3000):
    pick = torch.randperm(len(test_truncation.SETTINGS), generator=gen)[:4]
    top_k, top_p = test_truncation.settings([test_truncation.SETTINGS[i] for i in pick])
    return [make_logits(T, V, torch.float32, device, generator=gen), _slots(T, 4, gen).to(device),
            top_k.to(device), top_p.to(device)]


def _top_k_top_p_check(out, original, state):
    test_truncation.assert_matches(out, original, *state)


def _penalties_args(device, gen, T=5, V=1000):
    args = test_history.penalties_args(T, V, gen, device, R=6)
    args[1] = _slots(T, 6, gen).to(device)
    return args


def _update_output_counts_args(device, gen, T=5, V=1000):
    return test_history.update_args(T, V, gen, device)


def _update_output_counts_check(out, original, state):
    """The counts the reference computes, and the mask (written in place too) equal to counts > 0."""
    expected_counts, _ = reference.update_output_counts(original, *state)
    assert torch.equal(out, expected_counts)
    assert torch.equal(state[0], reference.pack_bitmask(out > 0))


def _bad_words_args(device, gen, T=5, V=1000):
    args = test_history.bad_words_args(T, V, gen, device)
    args[1] = _slots(T, 3, gen).to(device)
    return args


def _logprobs_args(device, gen, T=5, V=1000):
    logits = make_logits(T, V, torch.float32, device, generator=gen)
    return [logits, torch.randint(-2, V + 2, (T,), generator=gen).to(device), 7]


def _logprobs_check(out, original, state):
    test_sampling.assert_logprobs(out, original, *state)


def _sample_args(device, gen, T=5, V=1000):
    return test_sampling.sample_args(T, V, gen, device, R=6)


def _sample_check(out, original, state):
    """The reference's tokens (all but one row: a near tie may go the other way), inside the filtered set."""
    expected = reference.sample(original, *state)
    assert out.dtype == torch.int64 and out.shape == expected.shape
    assert int((out != expected).sum()) <= 1, f"{out} != {expected}"
    test_sampling.assert_inside_filtered_set(out, [original, *state])


def _rejection_sample_args(device, gen, V=1000):
    """Ragged drafts (N = 6 over B = 4 requests, each at most 3), greedy and random requests."""
    while True:
        counts = torch.randint(0, 4, (4,), generator=gen)
        if int(counts.sum()) == 6:
            break
    return test_speculative.spec_args(counts.tolist(), V, gen, device, temperature=torch.tensor([0.0, 1.0, 0.8, 1.0]))


def _rejection_sample_check(out, original, state):
    test_speculative.assert_matches_reference(out, [original, *state])


def to_cpu(x):
    """x with every tensor (also inside a tuple or list) moved to the CPU."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_cpu(a) for a in x)
    return x.cpu() if isinstance(x, torch.Tensor) else x


def clone_args(args: list) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _set(arg_index: int, index, value):
    def spoil(args):
        args[arg_index][index] = value
    return spoil


def _nan_logits(args):
    args[0][1, 2] = float("nan")


def _allowed_id_out_of_range(args):
    args[3][0, 0] = args[0].size(1)
    args[4][0] = args[3].size(1)


NAN_LOGITS = BadValue("logits", "nan", _nan_logits)


def _filter_bad(param: str) -> list[Bad]:
    return [
        Bad("logits", "int32", lambda a, d: a.to(torch.int32), TypeError),
        Bad(param, "float16", lambda a, d: a.half(), TypeError),
        Bad(param, "no_slots", lambda a, d: a[:0], ValueError),
    ]


OPS = [
    OpSpec(
        "logit_bias", _logit_bias_args, frozenset({"logits", "min_tokens"}),
        bad=[
            Bad("num_allowed", "one_slot_too_many", lambda a, d: torch.zeros(a.size(0) + 1, dtype=a.dtype, device=d),
                ValueError),
            Bad("min_tokens", "int64", lambda a, d: a.long(), TypeError),
            Bad("bias_values", "narrower_than_bias_ids", lambda a, d: a[:, :-1], ValueError),
        ],
        bad_values=[BadValue("allowed_ids", "out_of_range", _allowed_id_out_of_range), NAN_LOGITS],
    ),
    OpSpec(
        "apply_token_bitmask", _token_bitmask_args, frozenset({"logits", "bitmask"}),
        bad=[
            Bad("bitmask", "too_few_words", lambda a, d: a[:, :-1], ValueError),
            Bad("bitmask", "int64", lambda a, d: a.long(), TypeError),
        ],
    ),
    OpSpec(
        "temperature", _temperature_args, frozenset({"logits", "temperature"}),
        bad=_filter_bad("temperature"),
        bad_values=[BadValue("temperature", "negative", _set(2, 1, -0.5)),
                    BadValue("temperature", "inf", _set(2, 1, float("inf"))),
                    BadValue("temperature", "nan", _set(2, 1, float("nan"))), NAN_LOGITS],
    ),
    OpSpec(
        "min_p", _min_p_args, frozenset({"logits", "min_p"}),
        bad=_filter_bad("min_p"),
        bad_values=[BadValue("min_p", "negative", _set(2, 1, -0.1)), BadValue("min_p", "above_one", _set(2, 1, 1.5)),
                    BadValue("min_p", "nan", _set(2, 1, float("nan"))), NAN_LOGITS],
    ),
    OpSpec(
        "top_k_top_p", _top_k_top_p_args, frozenset({"logits", "top_k"}),
        bad=[
            Bad("top_k", "int64", lambda a, d: a.long(), TypeError),
            Bad("top_k", "no_slots", lambda a, d: a[:0], ValueError),
        ],
        bad_values=[BadValue("top_p", "zero", _set(3, 1, 0.0)), BadValue("top_p", "above_one", _set(3, 1, 1.5)),
                    BadValue("top_p", "nan", _set(3, 1, float("nan"))), NAN_LOGITS],
        check=_top_k_top_p_check,
    ),
]
OPS += [
    OpSpec(
        "penalties", _penalties_args, frozenset({"logits", "repetition_penalty"}),
        bad=[
            Bad("prompt_mask", "too_few_words", lambda a, d: a[:, :-1], ValueError),
            Bad("output_counts", "narrower_than_vocabulary", lambda a, d: a[:, :-1], ValueError),
            Bad("output_mask", "int64", lambda a, d: a.long(), TypeError),
        ],
        bad_values=[BadValue("repetition_penalty", "zero", _set(5, 1, 0.0)),
                    BadValue("repetition_penalty", "nan", _set(5, 1, float("nan"))),
                    BadValue("frequency_penalty", "inf", _set(6, 1, float("inf"))),
                    BadValue("presence_penalty", "nan", _set(7, 1, float("nan")))],
    ),
    OpSpec(
        "update_output_counts", _update_output_counts_args, frozenset({"output_counts", "idx_mapping"}),
        bad=[
            Bad("output_mask", "too_few_words", lambda a, d: a[:, :-1], ValueError),
            Bad("output_counts", "no_slots", lambda a, d: a[:0], ValueError),
        ],
        bad_values=[BadValue("token_ids", "past_vocabulary", _set(3, 0, 1000))],
        check=_update_output_counts_check,
        fresh=lambda counts: counts * 2,
    ),
    OpSpec(
        "bad_words", _bad_words_args, frozenset({"logits", "num_bad_words"}),
        bad=[
            Bad("bad_word_offsets", "int64", lambda a, d: a.long(), TypeError),
            Bad("bad_word_offsets", "no_columns", lambda a, d: a[:, :0], ValueError),
            Bad("history", "int64", lambda a, d: a.long(), TypeError),
        ],
        bad_values=[BadValue("history_lens", "past_history", _set(6, 0, 10**6)),
                    BadValue("bad_word_offsets", "past_ids", _set(3, (0, 1), 10**6))],
    ),
]
OPS += [
    OpSpec(
        "logprobs", _logprobs_args, frozenset({"logits"}),
        bad=[Bad("num_logprobs", "negative", lambda a, d: -1, ValueError),
             Bad("num_logprobs", "past_vocabulary", lambda a, d: 1001, ValueError)],
        bad_values=[NAN_LOGITS], check=_logprobs_check, returns=True,
    ),
    OpSpec(
        "sample", _sample_args, frozenset({"logits", "temperature"}),
        bad=_filter_bad("temperature") + [Bad("seeds", "int32", lambda a, d: a.int(), TypeError)],
        bad_values=[BadValue("temperature", "negative", _set(2, 1, -0.5)),
                    BadValue("top_p", "zero", _set(4, 1, 0.0)), BadValue("min_p", "above_one", _set(5, 1, 1.5)),
                    NAN_LOGITS],
        check=_sample_check, returns=True,
    ),
    OpSpec(
        "rejection_sample", _rejection_sample_args, frozenset({"target_logits", "draft_token_ids", "cu_num_draft"}),
        bad=[Bad("target_logits", "int32", lambda a, d: a.to(torch.int32), TypeError),
             Bad("target_logits", "one_row_short", lambda a, d: a[:-1], ValueError),
             Bad("cu_num_draft", "int64", lambda a, d: a.long(), TypeError),
             Bad("cu_num_draft", "empty", lambda a, d: a[:0], ValueError),
             Bad("seeds", "int32", lambda a, d: a.int(), TypeError),
             Bad("draft_probs", "float16", lambda a, d: a.half(), TypeError),
             Bad("max_spec_len", "negative", lambda a, d: -1, ValueError)],
        bad_values=[BadValue("draft_token_ids", "past_vocabulary", _set(1, 0, 1000)),
                    BadValue("cu_num_draft", "decreasing", _set(3, 2, -1)),
                    BadValue("temperature", "negative", _set(4, 1, -0.5)),
                    BadValue("draft_probs", "nan", _set(2, (0, 3), float("nan"))),
                    BadValue("target_logits", "nan", _nan_logits)],
        check=_rejection_sample_check, returns=True,
    ),
]
BY_NAME = {spec.name: spec for spec in OPS}


def _other_dtype(a, d):
    return a.double() if a.is_floating_point() else a.float()


def _column_stride(a, d):
    return a.t().contiguous().t() if a.dim() == 2 else a.repeat(2)[::2]


def _other_device(a, d):
    return a.to("meta" if d.type == "cpu" else "cpu")


def _requires_grad(a, d):
    return a.detach().clone().requires_grad_()


def _expanded_rows(a, d):
    return a[:1].expand_as(a)


def _overlapping_rows(a, d):
    return a.as_strided(a.shape, (a.size(1) // 2, 1))


def generic_bad(name: str, value: torch.Tensor, anchor: bool, mutated: bool, first: bool) -> list[Bad]:
    """The bad inputs every tensor argument has."""
    bad = [Bad(name, "dtype", _other_dtype, TypeError), Bad(name, "rank", lambda a, d: a.unsqueeze(0), ValueError)]
    if not anchor and value.size(0) > 1:
        bad.append(Bad(name, "length", lambda a, d: a[:1], ValueError))
    if value.size(-1) > 1:
        bad.append(Bad(name, "stride", _column_stride, ValueError))
    if not first:  # the others must be on the device of the first argument (logits, or the state it updates)
        bad.append(Bad(name, "device", _other_device, ValueError))
    if value.is_floating_point():
        bad.append(Bad(name, "requires_grad", _requires_grad, RuntimeError))
    if mutated:
        bad.append(Bad(name, "expanded_rows", _expanded_rows, ValueError))
        bad.append(Bad(name, "overlapping_rows", _overlapping_rows, ValueError))
    if name == "logits":
        bad.append(Bad(name, "empty_vocabulary", lambda a, d: a[:, :0], ValueError))
        bad.append(Bad(name, "rank_1", lambda a, d: a[0], ValueError))
    return bad


def bad_inputs(spec: OpSpec) -> list[Bad]:
    """Every bad input of `spec`: the generic ones of each tensor argument, then the entry's own."""
    args = spec.args(torch.device("cpu"), torch.Generator().manual_seed(0))
    bad = []
    for i, (schema_arg, value) in enumerate(zip(spec.op._schema.arguments, args)):
        if isinstance(value, torch.Tensor):
            mutated = schema_arg.alias_info is not None and schema_arg.alias_info.is_write
            bad += generic_bad(schema_arg.name, value, schema_arg.name in spec.anchors, mutated, first=i == 0)
    return bad + spec.bad
