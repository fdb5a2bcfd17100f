"""What the launches pass each other about a row: its settings and its workspace.

The row workspace, in 4-byte words, S = number of segments, C = SEG_CAP:

- header (8): lo, settled flag (0: no, 1: yes, 2: yes, on the candidates >= the second bound), exp
  reference (the sample max), the threshold (written by the selection), row max, normaliser
  relative to the row max, listed candidates, the second bound (the flag and the three after it
  written once the row is settled)
- per segment [S each]: max; normaliser and candidate mass relative to the reference; candidate
  count; mass and count of the candidates >= the second bound (top-p alone); listed candidates
  before it (written by the settle launch); one unused word (the pairs stay 8-byte aligned)
- per segment [S, C] int64: its candidates, value bits << 32 | position; for top-p alone those
  >= the second bound from the front, the others from the back, each in row order
- the row's candidate list, once gathered: values [S * C]; the selection's buffer [S * C] (with
  top-k on, the candidates' positions, and the pair regions, no longer read, take the compactions)
- scratch [max(TILE, CAP)]
- for `sample` (DRAW) only, a copy of the row [V] (float32): the general path's row, divided by the
  temperature and with min_p applied, which it masks and draws from (the logits are read-only there)
- for `sample`'s rows the truncation launches leave alone, when its full-row draw splits them: the
  segments' (score, token) pairs in the first words (`store_draw_pair`); nothing else

_workspace_words gives the size, the region functions below the pointers: keep them together.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .._launch import cdiv
from .._triton_helpers import load_slot
from ..gumbel import argmax_finish

_HEADER = 8
# Header words (float32 unless said): lo, settled flag (int32), exp reference, threshold, row max,
# normaliser, listed candidates (int32), second bound.
_LO = tl.constexpr(0)
_FLAG = tl.constexpr(1)
_REF = tl.constexpr(2)
_THRESHOLD = tl.constexpr(3)
_ROW_MAX = tl.constexpr(4)
_TOTAL = tl.constexpr(5)
_LISTED = tl.constexpr(6)
_SECOND_BOUND = tl.constexpr(7)


def _workspace_words(num_segments: int, settings, row_copy: int = 0) -> int:
    """Words per workspace row (a multiple of 16, so every row starts 64-byte aligned); `row_copy`:
    the words of the row copy (V for `sample`, 0 for the op)."""
    return cdiv(_HEADER + 8 * num_segments + 4 * num_segments * settings.seg_cap
                + max(settings.tile, settings.cap) + row_copy, 16) * 16


@triton.jit
def _segment_max_ptr(ws_row):
    """Each segment's max [S] (float32), just past the header."""
    return ws_row + 8


@triton.jit
def _segment_total_ptr(ws_row, num_segments):
    """Each segment's normaliser relative to the exp reference [S] (float32, top-p alone)."""
    return _segment_max_ptr(ws_row) + num_segments


@triton.jit
def _segment_mass_ptr(ws_row, num_segments):
    """Each segment's candidate mass relative to the exp reference [S] (float32, top-p alone)."""
    return _segment_max_ptr(ws_row) + 2 * num_segments


@triton.jit
def _segment_count_ptr(ws_row, num_segments):
    """Each segment's candidate count [S] (int32)."""
    return (_segment_max_ptr(ws_row) + 3 * num_segments).to(tl.pointer_type(tl.int32))


@triton.jit
def _segment_mass_high_ptr(ws_row, num_segments):
    """Each segment's mass of the candidates >= the second bound [S] (float32, top-p alone)."""
    return _segment_max_ptr(ws_row) + 4 * num_segments


@triton.jit
def _segment_count_high_ptr(ws_row, num_segments):
    """Each segment's count of the candidates >= the second bound [S] (int32, top-p alone)."""
    return _segment_count_ptr(ws_row, num_segments) + 2 * num_segments


@triton.jit
def _segment_first_ptr(ws_row, num_segments):
    """Each segment's offset in the row's candidate list [S] (int32, written by the settle launch)."""
    return _segment_count_ptr(ws_row, num_segments) + 3 * num_segments


@triton.jit
def _pairs_ptr(ws_row, num_segments):
    """The segments' candidate regions [S, C] (int64 pairs), 8-byte aligned: 8 + 8 S words in."""
    return (_segment_max_ptr(ws_row) + 8 * num_segments).to(tl.pointer_type(tl.int64))


@triton.jit
def _values_ptr(ws_row, num_segments, SEG_CAP: tl.constexpr):
    """The row's gathered candidate values [S * C] (float32)."""
    return _segment_max_ptr(ws_row) + 8 * num_segments + 2 * num_segments * SEG_CAP


@triton.jit
def _buffer_ptr(ws_row, num_segments, SEG_CAP: tl.constexpr):
    """The selection's buffer [S * C]: with top-k on, the gathered candidates' positions (int32)."""
    return _values_ptr(ws_row, num_segments, SEG_CAP) + num_segments * SEG_CAP


@triton.jit
def _scratch_ptr(ws_row, num_segments, SEG_CAP: tl.constexpr):
    """The selection's and the general path's scratch [max(TILE, CAP)] (float32)."""
    return _values_ptr(ws_row, num_segments, SEG_CAP) + 2 * num_segments * SEG_CAP


@triton.jit
def _row_copy_ptr(ws_row, num_segments, SEG_CAP: tl.constexpr, SCRATCH: tl.constexpr):
    """The general path's copy of the row [V] (float32, `sample` only), past the scratch of
    SCRATCH = max(TILE, CAP) words."""
    return _scratch_ptr(ws_row, num_segments, SEG_CAP) + SCRATCH


@triton.jit
def _header_int(ws_row, word):
    return (ws_row + word).to(tl.pointer_type(tl.int32))


@triton.jit
def _search_floor(ws_row, flag):
    """The floor of a settled row's threshold search: lo, or for flag 2 the second bound (only the
    candidates >= it are listed)."""
    return tl.load(ws_row + tl.where(flag == 2, _SECOND_BOUND, _LO))


@triton.jit
def store_draw_pair(ws_row, segment, num_draw_segments, score, token):
    """`sample`'s split full-row draw: segment `segment`'s (score, token) pair (token -1: none) in the
    row's workspace, scores in words [0, D), tokens in [D, 2 D) for D = num_draw_segments. Only a
    row the truncation launches leave alone is split, so nothing else of its workspace is used."""
    tl.store(ws_row + segment, score)
    tl.store(_header_int(ws_row, num_draw_segments + segment), token)


@triton.jit
def reduce_draw_pairs(ws_row, num_draw_segments, SEGMENTS_P2: tl.constexpr):
    """The token of the best of a row's `store_draw_pair` pairs, the lower token among equal
    scores; -1 without one."""
    s = tl.arange(0, SEGMENTS_P2)
    in_row = s < num_draw_segments
    score = tl.load(ws_row + s, mask=in_row, other=float("-inf"))
    token = tl.load(_header_int(ws_row, num_draw_segments + s), mask=in_row, other=-1)
    _, best = argmax_finish(score, token, 2147483647)
    return best


@triton.jit
def _weighs_row(k_on, p_on, min_p):
    """Whether the scan weighs the row: top-p alone (for `sample`, without min_p). Such a row's scan
    sums masses, counts the candidates >= the second bound and stores those from the front of its
    regions, the others from the back; any other row's candidates are all stored from the front, and
    top-p, if on, is renormalised over the candidates the other filters keep."""
    return p_on & (k_on == 0) & (min_p == 0.0)


@triton.jit
def row_settings(idx_mapping_ptr, top_k_ptr, top_p_ptr, temperature_ptr, min_p_ptr, t, num_slots, vocab_size,
                  PDL: tl.constexpr, DRAW: tl.constexpr, reads_inactive=False):
    """(k, p, k_on, p_on, active, temp, min_p) of row t; an inactive row (slot out of range, both
    filters off) is left alone. With DRAW (`sample`) the row is also read through its temperature
    (temp) and min_p; a greedy row (temp == 0) is inactive (its argmax is drawn elsewhere) and one
    with min_p alone on is active. Otherwise temp is 1 and min_p 0 (off).
    Every launch starts with it. With programmatic dependent launch (PDL), the next launch may place
    its programs as soon as all of this one's have started, and a launch reads its row settings (the
    op's inputs, which no launch writes) while the previous one drains, then waits for it to finish
    (gdc_wait): all that comes after may read or write what the previous launches touched.
    With DRAW (`sample`, whose rows mostly have their filters off) only the programs that go on to
    touch what earlier launches wrote wait: an active row's, those the caller marks
    (`reads_inactive`), and the launch's first program, always. An inactive row's other programs
    leave at once instead of holding a launch slot until the full-row draw ends; the first
    program's wait keeps the launches finishing in order (a launch cannot finish before it), so
    whatever follows the op's last launch finds every launch done. top_k_top_p keeps every program
    waiting: its batches with a few filtered rows ran slower with the early exit
    (docs/notes/sampling-tuning.md)."""
    if PDL:
        gdc_launch_dependents()
    slot = load_slot(idx_mapping_ptr, t, num_slots)
    safe = tl.maximum(slot, 0)
    k = tl.load(top_k_ptr + safe)
    p = tl.load(top_p_ptr + safe)
    if DRAW:
        temp = tl.load(temperature_ptr + safe)
        min_p = tl.load(min_p_ptr + safe)
    else:
        temp = 1.0
        min_p = 0.0
    k_on = (k > 0) & (k < vocab_size)
    p_on = p < 1.0
    if DRAW:
        active = (slot >= 0) & (temp != 0.0) & (k_on | p_on | (min_p != 0.0))
    else:
        active = (slot >= 0) & (k_on | p_on)
    if PDL:
        if DRAW:
            first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0)
            if active | reads_inactive | first:
                gdc_wait()
        else:
            gdc_wait()
    return k, p, k_on, p_on, active, temp, min_p
