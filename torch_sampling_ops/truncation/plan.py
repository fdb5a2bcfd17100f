"""The launch plan of top_k_top_p: which kernels run for a [T, V] batch, with which grids, constants
and compile options, from the settings (settings.py). The launcher, `.ci/inspect_kernels.py` and
the benchmark read it.
"""
from __future__ import annotations

import functools

import torch

from .._launch import cdiv, next_power_of_2
from .scan import (
    _fill_chunks_kernel,
    _gather_chunks_kernel,
    _sample_bound_kernel,
    _scan_segments_kernel,
    _settle_kernel,
)
from .select import _select_kernel
from .settings import _INTERPRET, TruncationSettings, current_settings


def _launch_plan(T: int, V: int, pdl: bool, settings: TruncationSettings | None = None,
                 group_scan: bool = False, draw: bool = False) -> list:
    """The op's launches for a [T, V] batch, in order: (kernel, grid, constants and compile options);
    with pdl, every launch after the first is a programmatic dependent launch (see row_settings).
    `settings`: the current ones (current_settings) by default. group_scan: the scan walks
    `scan_group` segments a program from `scan_group_min_t` rows (for callers whose rows mostly have
    both filters off, as `sample`'s: the op itself does not). draw: `sample`'s launches (DRAW) after
    its own first launch, which stores the rows' bounds (so no bound launch here) and splits its
    full-row draw below `split_draw_max_t` rows: the scan (which then reduces the draw's pairs), below
    `gather_in_draw_min_t` rows the settle and gather launches, and the selection (from that batch
    size settling and gathering its row itself), which draws the token; nothing is filled."""
    s = settings or current_settings()
    num_segments = cdiv(V, s.segment)
    segments_p2 = next_power_of_2(num_segments)
    settle_launch = T >= s.settle_launch_min_t
    follow = dict(PDL=pdl, launch_pdl=pdl)
    chunks = (T, cdiv(V, s.chunk))
    fill_group = s.fill_group if settle_launch else 1
    scan_group = s.scan_group if group_scan and T >= s.scan_group_min_t else 1
    fill_in_select = T >= s.fill_in_select_min_t and not draw
    gathered = not draw or T < s.gather_in_draw_min_t  # a gather launch before the selection (its grid tells it)
    fill = [(_fill_chunks_kernel, (T, cdiv(chunks[1], fill_group)),
             dict(CHUNK=s.chunk, SEGMENTS=s.chunk // s.segment, SEG_CAP=s.seg_cap, GROUP=fill_group,
                  num_warps=s.chunk_warps, **follow))]
    settle = [(_settle_kernel, (T,), dict(SEG_CAP=s.seg_cap, SEGMENTS_P2=segments_p2, DRAW=draw, num_warps=1,
                                          **follow))]
    gather = [(_gather_chunks_kernel, chunks,
               dict(CHUNK=s.chunk, SEGMENTS=s.chunk // s.segment, SEG_CAP=s.seg_cap, SEGMENTS_P2=segments_p2,
                    SETTLED=settle_launch, DRAW=draw, num_warps=s.chunk_warps, **follow))]
    # 128 registers: two programs an SM
    select = (_select_kernel, (T,),
              dict(SEG_CAP=s.seg_cap, TILE=s.tile, SMALL=s.small, P=s.pivots, CAP=s.cap, BLOCK=s.block,
                   MASK_BLOCK=s.mask_block, FILL=fill_in_select, CHUNK=s.chunk, SEGMENTS=s.chunk // s.segment,
                   SEGMENTS_P2=segments_p2, GATHER_IN_DRAW_MIN_T=s.gather_in_draw_min_t, DRAW=draw,
                   num_warps=s.select_warps, maxnreg=128, **follow))
    bound = [(_sample_bound_kernel, (T,), dict(SAMPLE=s.sample, SEG_CAP=s.seg_cap, PDL=pdl, DRAW=draw,
                                               num_warps=4 if T >= s.few_sample_warps_min_t else s.sample_warps))]
    # Read with DRAW only; always passed (a graph node of torch.compile takes every parameter), and
    # without DRAW the same at every T, so that top_k_top_p's scan is one compiled variant.
    draw_segment = s.draw_segment_for(T) if draw else s.draw_segment
    draw_pairs = dict(DRAW_SEGMENT=draw_segment, DRAW_SEGMENTS_P2=next_power_of_2(cdiv(V, draw_segment)),
                      SPLIT_DRAW_MAX_T=s.split_draw_max_t)
    return [
        *([] if draw else bound),
        # 64 registers: 32 one-warp programs an SM
        (_scan_segments_kernel, (T, cdiv(num_segments, scan_group)),
         dict(SEGMENT=s.segment, SEG_CAP=s.seg_cap, STAGES=s.scan_stages, GROUP=scan_group, DRAW=draw, **draw_pairs,
              num_warps=1, maxnreg=64, **follow)),
        # Otherwise the selection settles and gathers its row itself.
        *(settle if settle_launch and gathered else []),
        *(gather if gathered else []),
        select,
        *([] if fill_in_select or draw else fill),
    ]


def _compiled_kernels(V: int, pdl: bool = True, settings: TruncationSettings | None = None) -> list:
    """Each distinct (kernel, constants and compile options) the op launches at vocabulary V, in a
    batch below settle_launch_min_t rows, and in one at each of it, fill_in_select_min_t and
    few_sample_warps_min_t (for .ci/inspect_kernels.py and the benchmark)."""
    s = settings or current_settings()
    kernels = []
    for T in (1, s.settle_launch_min_t, s.fill_in_select_min_t, s.few_sample_warps_min_t):
        for kernel, _, meta in _launch_plan(T, V, pdl, s):
            if (kernel, meta) not in kernels:
                kernels.append((kernel, meta))
    return kernels


def uses_dependent_launches(device: torch.device, settings: TruncationSettings | None = None) -> bool:
    """Whether the package's launches on `device` are programmatic dependent ones: on Hopper and later
    GPUs (not under the Triton interpreter), unless the settings turn it off. The one switch for
    every op that uses them (`top_k_top_p`, `sample`, `rejection_sample`, `logit_bias`)."""
    s = settings or current_settings()
    return (s.dependent_launches and not _INTERPRET and device.type == "cuda"
            and _compute_capability(device.index)[0] >= 9)


@functools.cache
def _compute_capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)
