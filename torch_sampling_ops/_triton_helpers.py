"""Triton helpers shared by the op families."""
import os

import triton
import triton.language as tl

# PTX is compiled (inline assembly allowed); false under the interpreter, which runs none.
ON_GPU = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def load_slot(idx_mapping_ptr, t, num_slots):
    """The request slot of row t as int64, or -1 when it lies outside [0, num_slots)."""
    slot = tl.load(idx_mapping_ptr + t).to(tl.int64)
    return tl.where((slot >= 0) & (slot < num_slots), slot, -1)


@triton.jit
def program_range(count, GROUP: tl.constexpr):
    """[first, end) of the items (blocks, segments, chunks of a row) program (t, g) handles: GROUP
    consecutive ones from g * GROUP, the last group cut at `count`."""
    first = tl.program_id(1) * GROUP
    return first, tl.minimum(first + GROUP, count)


@triton.jit
def fast_log2(x, NORMAL: tl.constexpr = False):
    """log2(x) for x > 0 by the hardware approximation (PTX lg2.approx: absolute error at most
    2**-22.6 on [0.5, 2], 2 ulp elsewhere); with NORMAL (x a normal float) its ftz form, the same
    value without the denormal handling (three instructions); tl.log2 under the interpreter, which
    runs no PTX."""
    if ON_GPU:
        if NORMAL:
            return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
    else:
        return tl.log2(x)


@triton.jit
def exp_flush_tiny(x):
    """exp(x) as tl.exp computes it on the GPU (ex2.approx of x * log2(e)), with results below
    2**-126 flushed to 0 (the ftz form, without the denormal handling: three instructions fewer);
    tl.exp under the interpreter. For sums that also hold a term near 1, where such terms are below
    float32 resolution."""
    if ON_GPU:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)


@triton.jit
def prefetch_l2_evict_last(ptrs, mask):
    """Asks for the lines of ptrs (where mask) in the L2, marked to be evicted last (PTX
    prefetch.global.L2::evict_last: a hint, no value returned, no fault), so that a later launch's
    loads of them hit the L2; nothing under the interpreter. Side-effecting, as prefetch_l1."""
    if ON_GPU:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_l1(ptrs, mask):
    """Asks for the lines of ptrs (where mask) in the SM's L1 (PTX prefetch.global.L1: a hint, no
    value returned, no fault), so that a later load of them by any thread of the program hits L1;
    nothing under the interpreter. Side-effecting, so the compiler keeps it though nothing reads it."""
    if ON_GPU:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L1 [$1]; mov.u32 $0, 0; }",
                                  "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
