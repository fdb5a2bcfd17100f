"""The tunable settings of top_k_top_p: sizes, warps and the batch sizes where the launch plan
changes, in one object that the launch plan reads.

`GPU_SETTINGS` serves real GPUs; `INTERPRETER_SETTINGS` (chosen at import under TRITON_INTERPRET=1)
has smaller segments, capacities, sample and tiles, so that the small rows the tests run there
still exercise the multi-segment, overflow, narrowing and fallback logic. `use_settings` overrides
fields for a block of code, as the tests do to take every launch plan at a small batch size.

The segments fix the order of a row's sums, so a row's result depends on `segment` (and on the
sizes that shape the selection's sums) but never on the batch size: the batch-size thresholds only
choose between launch plans that compute the same bits.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os

import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclasses.dataclass(frozen=True)
class TruncationSettings:
    """Sizes and launch choices of top_k_top_p (see the package docstring for the launches)."""

    segment: int = 2048
    """Tokens of a segment: one warp of the scan, with its own candidate region. 2048 rather than
    1024 favours large batches over T = 1 with top-k on (docs/notes/top-k-top-p-tuning.md). It
    must not follow the batch size: the segments fix the order of a row's sums."""
    seg_cap: int = 512
    """Candidates a segment can hold; a segment with more overflows and its row takes the general path."""
    scan_stages: int = 4
    """The top-p-alone scan's software pipeline depth (Triton's num_stages): STAGES - 1 steps of 256
    tokens load into shared memory while one is counted, holding no registers."""
    chunk: int = 8192
    """Tokens per program of the gather and fill launches (a whole number of segments)."""
    sample: int = 2048
    """Sampled tokens of the bound launch: 32 runs spread over the row."""
    tile: int = 1024
    """Candidates per step of the selection, and held in its registers."""
    small: int = 128
    """Candidates the selection's last rounds run on."""
    sample_warps: int = 8
    """Warps of the bound launch below `few_sample_warps_min_t` rows."""
    chunk_warps: int = 4
    """Warps of the gather and fill launches (a row's chunk a program)."""
    select_warps: int = 8
    """Warps of the selection (launch 4)."""
    few_sample_warps_min_t: int = 192
    """From this batch size the bound launch takes 4 warps: with many rows, more programs share an
    SM. Its histograms and maxima are exact, so its results do not depend on the warps."""
    settle_launch_min_t: int = 32
    """From this batch size a launch of its own settles each row once; below it each gather program
    settles its row (all reach the same bits), which saves a launch while the rows are few."""
    scan_group: int = 2
    """For `sample`, whose rows may mostly have their filters off, from `scan_group_min_t` rows:
    segments a scan program walks in turn, so such a row costs a fraction of the scan's programs
    (each still a launch slot). Rows with a filter on scan slower so (top_k_top_p itself does not);
    2 balances the two (docs/notes/sampling-tuning.md)."""
    scan_group_min_t: int = 64
    """From this batch size such callers' scans group their segments; below it one program a
    segment keeps the few rows spread over the GPU."""
    draw_segment: int = 8192
    """For `sample`: tokens a program of its full-row draw takes below `wide_draw_min_t` rows (a
    row alone would otherwise be streamed by one SM). The argmax is exact whatever the split, so a
    row's token does not depend on it."""
    wide_draw_segment: int = 16384
    """For `sample`: tokens a program of its full-row draw takes from `wide_draw_min_t` to
    `split_draw_max_t` rows, where the batch alone spreads the draw over the GPU and longer
    programs pay their start and their reduction fewer times."""
    wide_draw_min_t: int = 32
    """For `sample`: from this batch size the split draw takes `wide_draw_segment` tokens a program."""
    split_draw_max_t: int = 80
    """For `sample`: below this batch size the full-row draw splits each row into segments of
    `draw_segment_for(T)` tokens, one program each, whose (score, token) pairs the scan launch
    reduces; from it one program a row (whole rows then fill the GPU, and skip the reduction)."""
    gather_in_draw_min_t: int = 128
    """For `sample`, from this batch size the program that draws a row settles and gathers it itself
    (two launches fewer); below it the settle and gather launches do, a row's chunks spread over
    programs (top-p alone lists thousands of candidates, too many for one program at small T)."""
    fill_group: int = 4
    """From `settle_launch_min_t` rows, chunks a fill program takes: in a batch of top-k rows, which
    the fill leaves alone, each program still costs a launch slot and the loads of its row settings."""
    fill_in_select_min_t: int = 128
    """From this batch size the selection fills each settled top-p-alone row itself once its
    threshold is known, and the fill launch is left out: rows whose search ends early fill while
    others still search. Below it the fill launch spreads a row over its chunks' programs (one
    program filling a whole row would wait for each chunk's candidates in turn)."""
    block: int = 1024
    """General path: tokens per step of a counting pass."""
    mask_block: int = 4096
    """General path: tokens per step of the masking pass."""
    pivots: int = 16
    """General path: pivots of the first pass."""
    cap: int = 2048
    """General path: the bracket size ranked in registers (in the selection's scratch)."""
    dependent_launches: bool = True
    """Programmatic dependent launches where the GPU has them (compute capability 9.0 and later, not
    under the interpreter); False: plain launches. The results are the same bits either way."""

    def __post_init__(self):
        sizes = ("segment", "seg_cap", "chunk", "sample", "tile", "small", "block", "mask_block", "pivots", "cap",
                 "draw_segment", "wide_draw_segment")
        for name in sizes:  # tl.arange extents
            value = getattr(self, name)
            if value <= 0 or value & (value - 1):
                raise ValueError(f"TruncationSettings.{name} must be a power of two, got {value}")
        if self.chunk % self.segment:
            raise ValueError(f"TruncationSettings.chunk ({self.chunk}) must be a whole number of segments "
                             f"({self.segment})")

    def draw_segment_for(self, T: int) -> int:
        """Tokens a program of `sample`'s split full-row draw takes in a batch of T rows."""
        return self.wide_draw_segment if T >= self.wide_draw_min_t else self.draw_segment

    @property
    def sweep_group(self) -> int:
        """The values each of the selection's threads holds of a tile."""
        return max(self.tile // (32 * self.select_warps), 1)


GPU_SETTINGS = TruncationSettings()
INTERPRETER_SETTINGS = TruncationSettings(segment=256, seg_cap=32, chunk=1024, sample=256, tile=256, small=32,
                                          cap=256, draw_segment=1024, wide_draw_segment=2048)
DEFAULT_SETTINGS = INTERPRETER_SETTINGS if _INTERPRET else GPU_SETTINGS

# The selection's sweeps keep per-thread statistics over groups of this many consecutive candidates
# (4 on the GPU). Jitted code reads it as a global, so it is a constant of the default settings:
# `use_settings` does not change it.
_SWEEP_GROUP = tl.constexpr(DEFAULT_SETTINGS.sweep_group)

_current = contextvars.ContextVar("truncation_settings", default=DEFAULT_SETTINGS)


def current_settings() -> TruncationSettings:
    """The settings the op launches with now: the default ones, or those of `use_settings`."""
    return _current.get()


@contextlib.contextmanager
def use_settings(**overrides):
    """Runs the block with the current settings' fields replaced by `overrides`, e.g.
    ``with use_settings(settle_launch_min_t=1): ...``. Kernels compile per distinct constants, so
    the new sizes take effect at the next call (the selection's sweep group stays as imported)."""
    token = _current.set(dataclasses.replace(_current.get(), **overrides))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
