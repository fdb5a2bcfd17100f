"""The top_k_top_p op: argument checks, the launcher and the registration."""
from __future__ import annotations

import functools

import torch

from .. import _call_cache, _checks
from .._launch import cdiv
from .._registry import define_op, launch
from . import plan as launch_plan
from .settings import TruncationSettings, current_settings
from .workspace import _workspace_words

# The launch plan follows the settings in use: a recorded call replays only under the same ones.
_call_cache.register_state(current_settings)


def _check_top_k_top_p(logits, idx_mapping, top_k, top_p) -> None:
    op = "top_k_top_p"
    T, _ = _checks.check_logits(op, logits)
    dev = logits.device
    _checks.check_tensor(op, "idx_mapping", idx_mapping, _checks.INDEX_DTYPES, ndim=1, device=dev, shape=(T,))
    R = _checks.check_slot_vector(op, "top_k", top_k, (torch.int32,), dev)
    _checks.check_tensor(op, "top_p", top_p, (torch.float32,), ndim=1, device=dev, shape=(R,))


def _check_top_k_top_p_values(logits, idx_mapping, top_k, top_p) -> None:
    op = "top_k_top_p"
    _checks.check_values(op, "logits", ~logits.isnan(), "no NaN")
    _checks.check_values(op, "top_p", (top_p > 0) & (top_p <= 1), "values in (0, 1]")


@functools.lru_cache(maxsize=4096)
def _launch_setup(T: int, V: int, pdl: bool, settings: TruncationSettings, group_scan: bool, draw: bool) -> tuple:
    """(segments, workspace words per row, launch plan) of a [T, V] batch, computed once per shape
    and settings: building the plan costs more host time than a launch."""
    num_segments = cdiv(V, settings.segment)
    words = _workspace_words(num_segments, settings, V if draw else 0)
    return num_segments, words, launch_plan._launch_plan(T, V, pdl, settings, group_scan, draw)


def _truncation_launches(logits, idx_mapping, top_k, top_p, group_scan: bool, draw_args: tuple | None = None):
    """(the arguments every launch takes, the launch plan, the settings, whether the launches are
    programmatic dependent ones) of the op on a [T, V] batch, T > 0, or with draw_args (temperature,
    min_p, seeds, output_lens, out, the draw's tolerance) of `sample`'s filtered rows (DRAW)."""
    T, V = logits.shape
    settings = current_settings()
    draw = draw_args is not None
    pdl = launch_plan.uses_dependent_launches(logits.device, settings)
    setup = _launch_setup if type(T) is int and type(V) is int else _launch_setup.__wrapped__  # SymInts: no cache
    num_segments, ws_stride, plan = setup(T, V, pdl, settings, group_scan, draw)
    ws = logits.new_empty((T, ws_stride), dtype=torch.float32)
    extra = draw_args if draw else (top_p, top_p, top_k, top_k, top_k, 0.0)  # read only with DRAW
    args = (logits, logits.stride()[0], idx_mapping, top_k, top_p, ws, ws_stride, top_k.shape[0], V, num_segments,
            *extra)
    return args, plan, settings, pdl


def _top_k_top_p_triton(logits, idx_mapping, top_k, top_p, group_scan: bool = False) -> None:
    """The op's CUDA/Triton body; `group_scan` as `_launch_plan` takes it."""
    if logits.shape[0] == 0:
        return
    args, plan, _, _ = _truncation_launches(logits, idx_mapping, top_k, top_p, group_scan)
    for kernel, grid, meta in plan:
        launch(kernel, grid, *args, **meta)


def filtered_draw_launches(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens, out,
                           tol: float):
    """`sample`'s launches for the rows with temperature != 0 and a filter on (min_p, top_k or top_p),
    which set out[t] to the token drawn from the tokens the filters keep of logits[t] / temperature
    (-1 without one), leave other rows' out to the caller and never write the logits: (the
    arguments every launch takes, the launch plan, the settings, PDL), for T > 0. The caller launches
    first a kernel of the same arguments that stores each such row's bounds (`store_row_bound`) and
    draws the other rows, splitting them below `split_draw_max_t` rows (`store_draw_pair`: the scan
    writes their tokens then), then the plan. Scans grouped (most rows usually have their filters
    off). tol: the approximate Gumbel scores' tolerance (gumbel.GUMBEL_APPROX_TOL)."""
    return _truncation_launches(logits, idx_mapping, top_k, top_p, True,
                                (temperature, min_p, seeds, output_lens, out, tol))


@define_op(
    mutates_args=("logits",), check=_check_top_k_top_p, check_values=_check_top_k_top_p_values,
    triton=_top_k_top_p_triton,
)
def top_k_top_p(logits: torch.Tensor, idx_mapping: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """Keeps the top-k, then the top-p tokens of each row, in place; the others become -inf.

    Per row ``t`` with slot ``r = idx_mapping[t]``: keeps the tokens >= the ``top_k[r]``-th largest
    logit (all ties kept); then, of those, the most probable tokens (softmax renormalised over the
    kept set) whose cumulative mass first reaches ``top_p[r]``, with ties at that boundary kept.

    Args:
        logits: ``[T, V]`` float32/float16/bfloat16, unit column stride; modified in place.
        idx_mapping: ``[T]`` int32/int64 slot of each row; a row outside ``[0, R)`` is untouched.
        top_k: ``[R]`` int32; ``<= 0`` or ``>= V`` is off.
        top_p: ``[R]`` float32 in ``(0, 1]``; ``1.0`` is off. Out of that range (an error that
            TORCH_SAMPLING_OPS_DEBUG=1 raises): ``<= 0`` keeps the most probable token(s), ``> 1`` or NaN is off.

    A row with both filters off is not read. When a filter is on, NaN logits become -inf; a row
    without any logit above -inf is unchanged. +inf logits hold all the mass: top-p keeps just them,
    and top-k counts them as the largest values. Masses are float32 sums: a token's membership may
    differ from the exact answer only where the exact mass above it is within ~1e-4 of top_p.
    """
