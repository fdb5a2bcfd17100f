"""Filtering steps of logit processing, in place: `temperature` and `min_p`.

temperature is one launch, one program per (row, vocabulary block): a pure streaming pass, the
read + write floor. The division is an IEEE float32 division (`tl.math.div_rn`; Triton's `/` may
lower to an approximate divide on NVIDIA GPUs), as the C++ kernel's `x / temp`, so CPU and CUDA
agree bitwise in float32.

min_p needs the row maximum before any token of the row can be judged. Three layouts were weighed
for T = 1..1024 rows of V = 151936 (38 blocks of 4096 a row):

- one program per row, a max pass then a masking pass: 2 reads + 1 write per row, but only T
  programs. Below about one row per SM the row is streamed by a single SM, which reaches a small
  fraction of HBM bandwidth.
- grid (T, blocks), every program reading the whole row for its max: as many reads of a row as it
  has blocks. With few rows the re-reads come from L2, but with many they miss it (the blocks of
  one row are not scheduled together), and the traffic grows with the number of blocks.
- chosen: two launches over grid (T, blocks). The first writes each block's maximum to a
  [T, blocks] float32 scratch, the second reduces its row's partial maxima (from L2) and masks its
  block. Traffic is the 2 reads + 1 write of the first layout, but each row is spread over its
  blocks at any T, and while the rows fit in L2 the second read of the logits hits it, so the op
  runs near the read + write floor; with many rows it costs the first layout's three passes over
  HBM plus one launch. The scratch size depends only on the shapes, so the op allocates nothing
  data-dependent, syncs nothing and is CUDA-graph capturable. benchmarks/bench_filtering.py
  measures it.

NaN logits are never the row maximum (the maximum ignores NaN: NaN is read as -inf) and stay NaN
(`NaN < threshold` is false). A row without a non-NaN logit above -inf is left unchanged.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._launch import cdiv, next_power_of_2
from ._registry import define_op, launch
from ._triton_helpers import load_slot, program_range

# Vocabulary tokens of a block; a program handles one block, or from _GROUP_MIN_T rows on, _GROUP
# consecutive blocks of its row (a row whose filter is off then costs a quarter of the programs).
_BLOCK_V = 4096
_GROUP = 4
_GROUP_MIN_T = 64
# Largest chunk of per-block maxima one min_p program reduces at once.
_MAX_BLOCK_PARTS = 1024


def blocks_per_program(T: int) -> int:
    """Blocks of _BLOCK_V tokens a program of a [T, V] pass handles: _GROUP from _GROUP_MIN_T rows on
    (enough programs remain to fill the GPU), one below (a row's blocks spread over programs)."""
    return _GROUP if T >= _GROUP_MIN_T else 1


@triton.jit
def _temperature_kernel(logits_ptr, logits_stride, idx_mapping_ptr, temperature_ptr, num_slots, vocab_size,
                        BLOCK_V: tl.constexpr, GROUP: tl.constexpr):
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    temp = tl.load(temperature_ptr + slot)
    if temp == 0.0:  # greedy row: left unchanged
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    first, end = program_range(tl.cdiv(vocab_size, BLOCK_V), GROUP)
    for b in range(first, end):
        offs = b * BLOCK_V + tl.arange(0, BLOCK_V)
        in_row = offs < vocab_size
        vals = tl.load(row_ptr + offs, mask=in_row).to(tl.float32)
        tl.store(row_ptr + offs, tl.math.div_rn(vals, temp).to(row_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _min_p_block_max_kernel(logits_ptr, logits_stride, idx_mapping_ptr, min_p_ptr, partial_ptr, num_blocks,
                            num_slots, vocab_size, BLOCK_V: tl.constexpr, GROUP: tl.constexpr):
    """partial[t, b] = the largest non-NaN logit of block b of row t (-inf if none), for the GROUP
    blocks of program (t, g)."""
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    if tl.load(min_p_ptr + slot) == 0.0:  # off: the row is not read
        return
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    first, end = program_range(num_blocks, GROUP)
    for b in range(first, end):
        offs = b * BLOCK_V + tl.arange(0, BLOCK_V)
        vals = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        vals = tl.where(vals == vals, vals, float("-inf"))  # NaN is never the maximum
        tl.store(partial_ptr + t.to(tl.int64) * num_blocks + b, tl.max(vals, axis=0))


@triton.jit
def _min_p_mask_kernel(logits_ptr, logits_stride, idx_mapping_ptr, min_p_ptr, partial_ptr, num_blocks,
                       num_slots, vocab_size, BLOCK_V: tl.constexpr, BLOCK_PARTS: tl.constexpr, GROUP: tl.constexpr):
    """Sets to -inf the tokens of row t below row_max + log(min_p), in the GROUP blocks of program (t, g)."""
    t = tl.program_id(0)
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    if slot < 0:
        return
    p = tl.load(min_p_ptr + slot)
    if p == 0.0:
        return
    parts_ptr = partial_ptr + t.to(tl.int64) * num_blocks
    k = tl.arange(0, BLOCK_PARTS)
    row_max = tl.max(tl.load(parts_ptr + k, mask=k < num_blocks, other=float("-inf")), axis=0)
    for i in range(BLOCK_PARTS, num_blocks, BLOCK_PARTS):
        k = i + tl.arange(0, BLOCK_PARTS)
        row_max = tl.maximum(row_max, tl.max(tl.load(parts_ptr + k, mask=k < num_blocks, other=float("-inf")), axis=0))
    if row_max == float("-inf"):  # no non-NaN logit above -inf: the row is left unchanged
        return
    threshold = row_max + tl.log(p)
    row_ptr = logits_ptr + t.to(tl.int64) * logits_stride
    first, end = program_range(num_blocks, GROUP)
    for b in range(first, end):
        offs = b * BLOCK_V + tl.arange(0, BLOCK_V)
        in_row = offs < vocab_size
        vals = tl.load(row_ptr + offs, mask=in_row)
        # A full write of the block: min_p usually removes most tokens, and masked stores of the
        # scattered survivors would leave partly written sectors.
        tl.store(row_ptr + offs, tl.where(vals.to(tl.float32) < threshold, float("-inf"), vals), mask=in_row)


# ----------------------------------------------------------------------------------------------
# Argument checks shared by both ops: logits [T, V], idx_mapping [T], a float32 parameter [R].


def _check_filter(op: str, param: str, logits, idx_mapping, values) -> None:
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    _checks.check_slot_vector(op, param, values, (torch.float32,), dev)


# ----------------------------------------------------------------------------------------------
# temperature


def _check_temperature(logits, idx_mapping, temperature) -> None:
    _check_filter("temperature", "temperature", logits, idx_mapping, temperature)


def _check_temperature_values(logits, idx_mapping, temperature) -> None:
    op = "temperature"
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_values(op, "temperature", torch.isfinite(temperature) & (temperature >= 0), "finite values >= 0")


def _temperature_triton(logits, idx_mapping, temperature) -> None:
    T, V = logits.shape
    if T == 0:
        return
    group = blocks_per_program(T)
    launch(
        _temperature_kernel, (T, cdiv(V, _BLOCK_V * group)),
        logits, logits.stride(0), idx_mapping, temperature, temperature.size(0), V,
        BLOCK_V=_BLOCK_V, GROUP=group, num_warps=8,
    )



@define_op(
    mutates_args=("logits",), check=_check_temperature, check_values=_check_temperature_values,
    triton=_temperature_triton,
)
def temperature(logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor) -> None:
    """Divides each row of ``logits`` by its request's temperature, in place.

    Row ``t`` becomes ``logits[t] / temperature[idx_mapping[t]]``, computed as an IEEE float32
    division (CPU and CUDA agree bitwise) and stored in the logits dtype. A temperature of ``0.0``
    marks a greedy row: it is left unchanged (the sampling ops take its argmax).

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride (any row stride); modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row. A row whose slot is outside ``[0, R)`` is untouched.
        temperature: ``[R]`` float32, ``>= 0`` and finite (checked with TORCH_SAMPLING_OPS_DEBUG=1).

    ``-inf`` logits stay ``-inf`` and NaN stays NaN.
    """


# ----------------------------------------------------------------------------------------------
# min_p


def _check_min_p(logits, idx_mapping, min_p) -> None:
    _check_filter("min_p", "min_p", logits, idx_mapping, min_p)


def _check_min_p_values(logits, idx_mapping, min_p) -> None:
    op = "min_p"
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_values(op, "min_p", (min_p >= 0) & (min_p <= 1), "values in [0, 1]")


def _min_p_triton(logits, idx_mapping, min_p) -> None:
    T, V = logits.shape
    if T == 0:
        return
    blocks = cdiv(V, _BLOCK_V)
    partial = logits.new_empty((T, blocks), dtype=torch.float32)  # per-block maxima; rows with min_p off skip it
    common = (logits, logits.stride(0), idx_mapping, min_p, partial, blocks, min_p.size(0), V)
    group = blocks_per_program(T)
    grid = (T, cdiv(blocks, group))
    launch(_min_p_block_max_kernel, grid, *common, BLOCK_V=_BLOCK_V, GROUP=group, num_warps=8)
    launch(_min_p_mask_kernel, grid, *common, BLOCK_V=_BLOCK_V,
           BLOCK_PARTS=min(next_power_of_2(blocks), _MAX_BLOCK_PARTS), GROUP=group, num_warps=8)



@define_op(
    mutates_args=("logits",), check=_check_min_p, check_values=_check_min_p_values, triton=_min_p_triton,
)
def min_p(logits: torch.Tensor, idx_mapping: torch.Tensor, min_p: torch.Tensor) -> None:
    """Removes, in place, the tokens whose probability is below ``min_p`` times the row's largest.

    With ``p = min_p[idx_mapping[t]]``, every token of row ``t`` with
    ``logit < max_logit + log(p)`` becomes ``-inf`` (float32 arithmetic); the tokens tied with the
    maximum always survive, so ``p = 1.0`` keeps exactly the ties of the maximum. ``p = 0.0`` is
    off: the row is not read.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride (any row stride); modified in place.
        idx_mapping: ``[T]`` int32/int64, the slot of each row. A row whose slot is outside ``[0, R)`` is untouched.
        min_p: ``[R]`` float32 in ``[0, 1]`` (checked with TORCH_SAMPLING_OPS_DEBUG=1).

    NaN logits are ignored by the maximum (it is taken over the non-NaN logits) and stay NaN. A row
    whose maximum is ``-inf`` (all ``-inf`` or NaN) is left unchanged.
    """
