"""Triton helpers shared by the op families."""
import triton
import triton.language as tl


@triton.jit
def load_slot(idx_mapping_ptr, t, num_slots):
    """The request slot of row t as int64, or -1 when it lies outside [0, num_slots)."""
    slot = tl.load(idx_mapping_ptr + t).to(tl.int64)
    return tl.where((slot >= 0) & (slot < num_slots), slot, -1)
