"""Triton helpers shared by the op families."""
import functools
import os

import torch
import triton
import triton.language as tl

# PTX is compiled (inline assembly allowed); false under the interpreter, which runs none.
ON_GPU = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


def dependent_launch_supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be programmatic dependent launches (`launch_pdl`,
    `gdc_wait`): a Hopper or later GPU, not under the Triton interpreter."""
    return bool(ON_GPU) and device.type == "cuda" and _compute_capability(device.index)[0] >= 9


@functools.cache
def _compute_capability(index) -> tuple:
    return torch.cuda.get_device_capability(index)


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
