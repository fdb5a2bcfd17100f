"""`Sampler`: the per-request state of a decode loop, and one decode step through the ops.

`SamplingParams` holds one request's parameters. `Sampler(max_num_reqs, vocab_size, device)` owns
the state tensors the ops read, one row a request slot; `add_request` packs a request into a slot
and `step` runs one decode step on a ``[T, V]`` logits batch: the token bitmask, `logit_bias`,
`bad_words` and `penalties` in place, the fused `sample`, `logprobs` when the sampler was built for
them, then the tokens recorded (output counts and mask, history, output lengths), all on the device.

A step makes no host sync and allocates nothing whose size depends on the data, and every op runs
whatever the requests ask (a row whose feature is off costs its kernel little; `skip_unused_ops`
leaves out, eagerly, the ops no request needs): the same step runs eagerly, inside
``torch.cuda.graph`` capture (each replay draws fresh tokens, as the output lengths that key the
random stream advance on the device) and under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import random
from array import array
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from . import _checks, state
from .constraints import apply_token_bitmask, logit_bias
from .filtering import min_p, temperature
from .history import bad_words, penalties, update_output_counts
from .sampling import logprobs, sample
from .truncation import top_k_top_p


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters (each default is "off").

    temperature: ``0.0`` (or below ``GREEDY_TEMPERATURE``, 1e-5) is greedy (the argmax), else the
    logits are divided by it.
    top_k: keep the k largest logits (``0``, ``-1`` or ``>= V``: off). top_p: in ``(0, 1]``. min_p: in ``[0, 1]``.
    seed: keys the request's random stream with its position; None takes one from the sampler's generator.
    repetition_penalty (``> 0``), frequency_penalty, presence_penalty: as `penalties`, over the prompt
    and the tokens generated so far.
    logit_bias: token id -> bias added to its logit. allowed_token_ids: the only tokens the request may
    emit (None: every token). bad_words: token sequences the request must not complete.
    min_tokens: while fewer tokens were generated, the stop_token_ids are masked (list the EOS token
    there too; the caller decides when a request stops, the sampler only masks).
    logprobs: None, or how many top logprobs the request wants (0: the sampled token's only), at most
    the sampler's ``max_num_logprobs``.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    allowed_token_ids: Sequence[int] | None = None
    bad_words: Sequence[Sequence[int]] | None = None
    min_tokens: int = 0
    stop_token_ids: Sequence[int] = ()
    logprobs: int | None = None

    def validate(self, vocab_size: int) -> None:
        """Raises ValueError naming the first parameter out of its range, as the sampler stores it
        (floats in float32, integers in int32, token ids in ``[0, vocab_size)``)."""
        self._packed(vocab_size)

    def _packed(self, vocab_size: int) -> _PackedParams:
        """The parameters as `Sampler.add_request` writes them, checked (see validate). A temperature
        below GREEDY_TEMPERATURE is greedy: x / T would overflow float32."""
        def fail(name, expected):
            raise ValueError(f"SamplingParams.{name} must be {expected}, got {getattr(self, name)!r}")

        def integer(name, value, low, high):
            try:
                value = operator.index(value)
            except TypeError:
                fail(name, "an integer")
            if not low <= value <= high:
                fail(name, f"in [{low}, {high}]")
            return value

        def float32(name, value, ok, expected):
            try:
                value = array("f", [value])[0]  # as the sampler stores it
            except TypeError:
                fail(name, "a number")
            if not ok(value):
                fail(name, expected)
            return value

        def token_ids(name, ids):
            try:
                ids = [operator.index(t) for t in ids]
            except TypeError:
                fail(name, "integer token ids")
            if any(not 0 <= t < vocab_size for t in ids):
                fail(name, f"token ids in [0, {vocab_size})")
            return ids

        finite = math.isfinite
        temperature = float32("temperature", self.temperature, lambda t: finite(t) and t >= 0, "finite and >= 0")
        floats = dict(
            temperature=temperature if self.temperature >= GREEDY_TEMPERATURE else 0.0,
            top_p=float32("top_p", self.top_p, lambda p: 0.0 < p <= 1.0, "in (0, 1]"),
            min_p=float32("min_p", self.min_p, lambda p: 0.0 <= p <= 1.0, "in [0, 1]"),
            repetition_penalty=float32("repetition_penalty", self.repetition_penalty, lambda r: finite(r) and r > 0,
                                       "finite and > 0 in float32"),
            frequency_penalty=float32("frequency_penalty", self.frequency_penalty, finite, "finite in float32"),
            presence_penalty=float32("presence_penalty", self.presence_penalty, finite, "finite in float32"))
        top_k = integer("top_k", self.top_k, -1, 2**31 - 1)
        min_tokens = integer("min_tokens", self.min_tokens, 0, 2**31 - 1)
        seed = None if self.seed is None else integer("seed", self.seed, -2**63, 2**63 - 1)
        if self.logprobs is not None:
            integer("logprobs", self.logprobs, 0, 2**31 - 1)
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            fail("allowed_token_ids", "None (every token) or a non-empty list")
        stops = token_ids("stop_token_ids", self.stop_token_ids)
        bias = dict(self.logit_bias or {})
        bias_values = [float32("logit_bias", b, finite, "finite biases in float32") for b in bias.values()]
        return _PackedParams(
            floats=floats, top_k=top_k if 0 < top_k < vocab_size else 0, min_tokens=min_tokens, seed=seed,
            allowed=token_ids("allowed_token_ids", self.allowed_token_ids or ()),
            bias_ids=token_ids("logit_bias", bias), bias_values=bias_values,
            stops=stops if min_tokens > 0 else [],
            bad_words=[token_ids("bad_words", word) for word in self.bad_words or () if len(word) > 0],
            logprobs=self.logprobs)


# Temperatures below it are greedy (as serving stacks treat them): dividing by one overflows float32.
GREEDY_TEMPERATURE = 1e-5


@dataclasses.dataclass(frozen=True)
class _PackedParams:
    """A request's parameters as the sampler writes them into its slot, checked (SamplingParams._packed)."""

    floats: dict
    top_k: int
    min_tokens: int
    seed: int | None
    allowed: list
    bias_ids: list
    bias_values: list
    stops: list
    bad_words: list
    logprobs: int | None


class SamplerOutput(NamedTuple):
    """`Sampler.step`'s result. sampled_token_ids: int64 ``[T]`` (``-1`` for a row whose slot is out of
    range or that has no finite logit). The logprobs fields are None unless the sampler has
    ``max_num_logprobs`` (and, with skip_unused_ops, a request in a slot asked for logprobs); then,
    as `logprobs` with ``k = max_num_logprobs`` for every row: topk_ids int64 ``[T, k]``,
    topk_logprobs float32 ``[T, k]``, and the sampled token's logprob (float32 ``[T]``) and rank
    (int64 ``[T]``). A request that asked for n logprobs reads the first n of its row."""

    sampled_token_ids: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    token_logprobs: torch.Tensor | None = None
    token_ranks: torch.Tensor | None = None


# What makes a request need each of the step's ops that skip_unused_ops may leave out, judged on its
# packed parameters (_PackedParams: the caller's lists changed after add_request do not count).
_NEEDS = {
    "logit_bias": lambda p: bool(p.allowed or p.bias_ids or p.stops),
    "bad_words": lambda p: bool(p.bad_words),
    "penalties": lambda p: (p.floats["repetition_penalty"], p.floats["frequency_penalty"],
                            p.floats["presence_penalty"]) != (1.0, 0.0, 0.0),
    "logprobs": lambda p: p.logprobs is not None,
}

# Per-slot parameters, kept as the rows of one float32 and one int32 block so that `add_request`
# writes a slot's scalars with two copies.
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
_INT_FIELDS = ("top_k", "min_tokens", "num_allowed", "num_bias", "num_stop", "num_bad_words")


class Sampler:
    """The state of ``max_num_reqs`` request slots over a vocabulary of ``vocab_size`` tokens, and one
    decode step over them.

    Args:
        max_num_reqs: R, the request slots.
        vocab_size: V.
        device: where the state lives (the logits' device).
        max_model_len: the generated tokens a request's history keeps for `bad_words` (``[R,
            max_model_len]`` int32): past that many, only one-token bad words apply.
        max_num_logprobs: None (no logprobs), or the ``k`` of every step's `logprobs` (0: the sampled
            token's logprob and rank only); requests may ask for up to that many.
        processed_logprobs: logprobs of the logits as `sample` draws from them (processed, then
            divided by the temperature, greedy rows excepted, and min_p, top-k and top-p applied)
            rather than of the logits as given to `step` (the default, as vLLM returns them).
        max_allowed_ids, max_logit_bias, max_stop_ids: the widths of the allowed, bias and stop lists.
        max_bad_words, max_bad_word_ids: how many bad-word sequences, and their ids in all, a request may have.
        seed: seeds the generator of the seeds of requests that give none (the same seeds in every
            process that passes the same one).
        skip_unused_ops: leave out of `step` the ops (logit_bias, bad_words, penalties, and logprobs
            with its copy of the logits) that no request in a slot needs, as the host knows from
            `add_request`: fewer launches eagerly. A step captured in a CUDA graph keeps the choice
            made at capture, and torch.compile recompiles for each choice: leave it off (the
            default) for those.

    The state tensors are attributes named as the ops' arguments (``temperature``, ``top_k``, ...,
    ``output_counts``, ``output_mask``, ``history``, ``output_lens``): read them, and change them only
    through `add_request`. The largest is ``output_counts``, int32 ``[R, V]``.
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device | str | None = None, *,
                 max_model_len: int = 4096, max_num_logprobs: int | None = None, processed_logprobs: bool = False,
                 max_allowed_ids: int = 1024, max_logit_bias: int = 1024, max_stop_ids: int = 128,
                 max_bad_words: int = 16, max_bad_word_ids: int = 256, seed: int = 0, skip_unused_ops: bool = False):
        if max_num_reqs < 1 or vocab_size < 1 or max_model_len < 1:
            raise ValueError(f"Sampler: max_num_reqs, vocab_size and max_model_len must be >= 1, got "
                             f"{max_num_reqs}, {vocab_size}, {max_model_len}")
        if max_num_logprobs is not None and not 0 <= max_num_logprobs <= min(vocab_size, 1024):
            raise ValueError(f"Sampler: max_num_logprobs must be None or in [0, {min(vocab_size, 1024)}], "
                             f"got {max_num_logprobs}")
        R, V = max_num_reqs, vocab_size
        self.max_num_reqs, self.vocab_size, self.max_model_len = R, V, max_model_len
        self.max_num_logprobs, self.processed_logprobs = max_num_logprobs, processed_logprobs
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if self.device.type == "cuda" and self.device.index is None:  # as the logits' device reads
            self.device = torch.device("cuda", torch.cuda.current_device())
        dev, i32 = self.device, torch.int32
        words = (V + 31) // 32
        # Each block row a 16-byte aligned [R] vector, as the ops' kernels are specialised for.
        stride = (R + 3) // 4 * 4
        # Free slots hold the defaults of SamplingParams, in range for the ops' value checks.
        defaults = SamplingParams()
        self._floats = torch.tensor([[getattr(defaults, name)] * stride for name in _FLOAT_FIELDS],
                                    dtype=torch.float32).to(dev)
        self._ints = torch.zeros(len(_INT_FIELDS), stride, dtype=i32, device=dev)
        for fields, block in ((_FLOAT_FIELDS, self._floats), (_INT_FIELDS, self._ints)):
            for i, name in enumerate(fields):
                setattr(self, name, block[i, :R])
        self.seeds = torch.zeros(R, dtype=torch.int64, device=dev)
        self.allowed_ids = torch.zeros(R, max_allowed_ids, dtype=i32, device=dev)
        self.bias_ids = torch.zeros(R, max_logit_bias, dtype=i32, device=dev)
        self.bias_values = torch.zeros(R, max_logit_bias, dtype=torch.float32, device=dev)
        self.stop_ids = torch.zeros(R, max_stop_ids, dtype=i32, device=dev)
        self.bad_word_ids = torch.zeros(R, max_bad_word_ids, dtype=i32, device=dev)
        self.bad_word_offsets = torch.zeros(R, max_bad_words + 1, dtype=i32, device=dev)
        self.prompt_mask = torch.zeros(R, words, dtype=i32, device=dev)
        self.output_mask = torch.zeros(R, words, dtype=i32, device=dev)
        self.output_counts = torch.zeros(R, V, dtype=i32, device=dev)
        # One row (entry) more than the slots, never read: a step's rows that record nothing write
        # there, so that no two rows of a step write one element of a slot's state (see _record).
        self._history = torch.zeros(R + 1, max_model_len, dtype=i32, device=dev)
        self._output_lens = torch.zeros(R + 1, dtype=i32, device=dev)
        self.history, self.output_lens = self._history[:R], self._output_lens[:R]
        self.skip_unused_ops = skip_unused_ops
        # slot -> its request's parameters and the ops of _NEEDS it needs
        self._requests: dict[int, tuple[SamplingParams, frozenset]] = {}
        self._needed_by = dict.fromkeys(_NEEDS, 0)  # op -> how many requests in a slot need it
        self._seeds = random.Random(seed)

    def warmup(self, dtypes: Sequence[torch.dtype] = (torch.float32,), max_num_tokens: int | None = None,
               **kwargs) -> dict:
        """Compiles, before the first step, every Triton kernel variant `step` launches on this
        sampler's state for batches of 1 to max_num_tokens rows (default max_num_reqs; more for
        batches padded with rows out of range) of logits of `dtypes` (idx_mapping int32):
        `torch_sampling_ops.warmup` with the sampler's sizes; `kwargs` go to it (``parallel``,
        ``workers``). Returns its result; on the CPU it does nothing."""
        from ._warmup import warmup

        if self.processed_logprobs and self.max_num_logprobs is not None:
            dtypes = tuple(dict.fromkeys((*dtypes, torch.float32)))  # the filters run on a float32 copy
        return warmup(self.vocab_size, tuple(dtypes), device=self.device, **self._warmup_sizes(max_num_tokens),
                      **kwargs)

    def _warmup_sizes(self, max_num_tokens: int | None = None) -> dict:
        """The sizes `warmup` takes, this sampler's."""
        R = self.max_num_reqs
        return dict(max_num_tokens=max_num_tokens or R, num_slots=R, index_dtype=torch.int32,
                    logit_bias_widths=((self.allowed_ids.size(1), self.bias_ids.size(1), self.stop_ids.size(1)),),
                    num_logprobs=() if self.max_num_logprobs is None else (self.max_num_logprobs,),
                    bad_words_shape=(self.bad_word_ids.size(1), self.bad_word_offsets.size(1) - 1,
                                     self.max_model_len))

    # Requests

    def add_request(self, slot: int, params: SamplingParams, prompt_token_ids: Sequence[int] | torch.Tensor = ()) -> None:
        """Packs a request into a free slot: its parameters and lists, the prompt's token mask (for
        the repetition penalty), and zeroed output counts, mask, history and output length. Device
        writes only, no host sync. Raises ValueError for a slot in use or out of range, a parameter
        out of range or a list longer than the sampler's capacity, before writing anything."""
        R, V = self.max_num_reqs, self.vocab_size
        if not 0 <= slot < R:
            raise ValueError(f"Sampler.add_request: slot must be in [0, {R}), got {slot}")
        if slot in self._requests:
            raise ValueError(f"Sampler.add_request: slot {slot} is in use; remove_request({slot}) first")
        packed = params._packed(V)
        if packed.logprobs is not None and (self.max_num_logprobs is None or packed.logprobs > self.max_num_logprobs):
            raise ValueError(f"Sampler.add_request: the request asks for {packed.logprobs} logprobs, the sampler "
                             f"gives at most {self.max_num_logprobs} (max_num_logprobs)")
        for name, needed, capacity in (("max_allowed_ids", len(packed.allowed), self.allowed_ids.size(1)),
                                       ("max_logit_bias", len(packed.bias_ids), self.bias_ids.size(1)),
                                       ("max_stop_ids", len(packed.stops), self.stop_ids.size(1)),
                                       ("max_bad_words", len(packed.bad_words), self.bad_word_offsets.size(1) - 1),
                                       ("max_bad_word_ids", sum(map(len, packed.bad_words)), self.bad_word_ids.size(1))):
            if needed > capacity:
                raise ValueError(f"Sampler.add_request: the request needs {needed}, more than the sampler's "
                                 f"{name} = {capacity}")
        # Every host tensor is built before the first write to the slot.
        prompt = torch.as_tensor(prompt_token_ids if isinstance(prompt_token_ids, torch.Tensor)
                                 else list(prompt_token_ids), dtype=torch.int64)
        ints = dict(top_k=packed.top_k, min_tokens=packed.min_tokens, num_allowed=len(packed.allowed),
                    num_bias=len(packed.bias_ids), num_stop=len(packed.stops), num_bad_words=len(packed.bad_words))
        scalars = [(self._floats[:, slot], state.host_values([packed.floats[n] for n in _FLOAT_FIELDS], torch.float32, self.device)),
                   (self._ints[:, slot], state.host_values([ints[n] for n in _INT_FIELDS], torch.int32, self.device))]
        lists = [(ids[slot, :len(values)], state.host_values(values, dtype, self.device))
                 for ids, values, dtype in ((self.allowed_ids, packed.allowed, torch.int32),
                                            (self.bias_ids, packed.bias_ids, torch.int32),
                                            (self.bias_values, packed.bias_values, torch.float32),
                                            (self.stop_ids, packed.stops, torch.int32)) if values]
        seed = packed.seed if packed.seed is not None else self._seeds.getrandbits(63)
        for dst, src in scalars + lists:
            dst.copy_(src, non_blocking=True)
        self.seeds[slot].fill_(seed)
        state.set_bad_words(self.bad_word_ids, self.bad_word_offsets, self.num_bad_words, slot, packed.bad_words)
        state.clear_slot(slot, self.output_counts, self.output_mask)
        state.set_prompt_mask(self.prompt_mask, slot, prompt, V)
        self.history[slot].zero_()
        self.output_lens[slot].zero_()
        needed = frozenset(op for op, needs in _NEEDS.items() if needs(packed))
        self._requests[slot] = params, needed
        for op in needed:
            self._needed_by[op] += 1

    def remove_request(self, slot: int) -> None:
        """Frees a slot for `add_request`. Its state stays on the device until then: rows must not map
        to a free slot."""
        if slot not in self._requests:
            raise ValueError(f"Sampler.remove_request: slot {slot} holds no request")
        for op in self._requests.pop(slot)[1]:
            self._needed_by[op] -= 1

    def _runs(self, op: str) -> bool:
        """Whether `step` runs `op` (one of _NEEDS): always, unless skip_unused_ops and no request in a
        slot needs it."""
        return not self.skip_unused_ops or self._needed_by[op] > 0

    def request(self, slot: int) -> SamplingParams | None:
        """The parameters of the request in `slot`, None for a free slot."""
        return self._requests[slot][0] if slot in self._requests else None

    # The decode step

    def step(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
             token_bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """One decode step: row ``t`` of ``logits`` (``[T, V]``, float32/float16/bfloat16, unit column
        stride) is the next-token logits of the request in slot ``idx_mapping[t]`` (int32/int64
        ``[T]``, each slot at most once a step). ``token_bitmask``: int32 ``[T, ceil(V / 32)]``, one row a
        logits row (a grammar's mask), or None.

        Modifies ``logits`` in place: the bitmask, the logit bias, allowed ids and min-tokens stops,
        the bad words and the penalties. Then draws each row's token (`sample`), computes the
        logprobs if the sampler has ``max_num_logprobs``, and records the tokens: each slot's output
        counts, output mask, history and output length (a ``-1`` token records nothing). Rows whose
        slot is out of range are left untouched and get ``-1``.
        """
        self._check_step(logits, idx_mapping, token_bitmask)
        R = self.max_num_reqs
        # The ops leave a row whose slot is out of range alone but for the bitmask; its slot here is
        # the spare entry R (clamped into [-1, R], then -1 taken to R; the caller's tensor unchanged).
        slots = idx_mapping.long().clamp(-1, R).remainder_(R + 1)
        output_lens = self._output_lens[slots]
        wants_logprobs = self.max_num_logprobs is not None and self._runs("logprobs")
        raw = logits.clone() if wants_logprobs and not self.processed_logprobs else None
        if token_bitmask is not None:
            apply_token_bitmask(logits, token_bitmask)
        if self._runs("logit_bias"):
            logit_bias(logits, idx_mapping, output_lens, self.allowed_ids, self.num_allowed, self.bias_ids,
                       self.bias_values, self.num_bias, self.stop_ids, self.num_stop, self.min_tokens)
        if self._runs("bad_words"):
            # Past max_model_len the history stops: only one-token bad words apply there.
            bad_words(logits, idx_mapping, self.bad_word_ids, self.bad_word_offsets, self.num_bad_words,
                      self.history, output_lens.masked_fill(output_lens > self.max_model_len, 0))
        if self._runs("penalties"):
            penalties(logits, idx_mapping, self.prompt_mask, self.output_mask, self.output_counts,
                      self.repetition_penalty, self.frequency_penalty, self.presence_penalty)
        tokens = sample(logits, idx_mapping, self.temperature, self.top_k, self.top_p, self.min_p, self.seeds,
                        output_lens)
        out = SamplerOutput(tokens)
        if wants_logprobs:
            source = raw if raw is not None else self._processed(logits, idx_mapping)
            out = SamplerOutput(tokens, *logprobs(source, tokens, self.max_num_logprobs))
        self._record(idx_mapping, slots, output_lens, tokens)
        return out

    def _check_step(self, logits, idx_mapping, token_bitmask) -> None:
        """step's arguments, checked as the ops check them but before any op runs, so that a bad one
        leaves the logits as they were."""
        op, V = "Sampler.step", self.vocab_size
        _checks.check_tensor(op, "logits", logits, _checks.LOGITS_DTYPES, ndim=2, device=self.device,
                             shape=(None, V), like="the sampler's state")
        T = logits.shape[0]
        _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=self.device,
                             shape=(T,), like="the sampler's state")
        if token_bitmask is not None:
            _checks.check_tensor(op, "token_bitmask", token_bitmask, (torch.int32,), ndim=2, device=self.device,
                                 shape=(T, (V + 31) // 32), like="the sampler's state")
        if _checks.debug_enabled():  # TORCH_SAMPLING_OPS_DEBUG=1: value checks, with host syncs
            in_range = idx_mapping[(idx_mapping >= 0) & (idx_mapping < self.max_num_reqs)]
            slots = in_range.sort().values
            _checks.check_values(op, "idx_mapping", slots[1:] != slots[:-1], "each slot at most once a step")

    def _processed(self, logits: torch.Tensor, idx_mapping: torch.Tensor) -> torch.Tensor:
        """A float32 copy of the processed logits with the filters `sample` applies (temperature,
        min_p, top-k and top-p) applied, as `sample` sees them (it computes in float32)."""
        x = logits.to(torch.float32, copy=True)
        temperature(x, idx_mapping, self.temperature)
        min_p(x, idx_mapping, self.min_p)
        top_k_top_p(x, idx_mapping, self.top_k, self.top_p)
        return x

    def _record(self, idx_mapping: torch.Tensor, slots: torch.Tensor, output_lens: torch.Tensor,
                tokens: torch.Tensor) -> None:
        """Counts each drawn token in its slot, appends it to the slot's history and advances the
        slot's output length, on the device; a row whose token is -1 records nothing. `slots`: each
        row's slot, R (the spare entry) for a row out of range; its history write goes to the spare
        row R too, as does that of a row past max_model_len or without a token."""
        L, R = self.max_model_len, self.max_num_reqs
        update_output_counts(self.output_counts, self.output_mask, idx_mapping, tokens)
        drawn = tokens >= 0
        rows = slots.masked_fill(~drawn | (output_lens >= L), R)
        self._history.index_put_((rows, output_lens.clamp(max=L - 1).long()), tokens.to(torch.int32))
        self._output_lens.index_put_((slots,), output_lens + drawn)
