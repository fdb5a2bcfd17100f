"""Truncation of the distribution, in place, without sorting the row: `top_k_top_p`.

Both filters keep the tokens >= a threshold: the largest value v whose count (top-k) or probability
mass (top-p, after top-k: renormalised over the kept set) of tokens >= v reaches the target. Five
launches (six from `settle_launch_min_t` rows); rows are split into fixed segments (2048 tokens on
the GPU), so a small batch still spreads over the GPU:

1. `_sample_bound_kernel` (per row): a 2048-token sample gives a lower bound `lo` the threshold
   should clear: past the sample rank expected of the k-th token by a safe margin (top-k), or where
   about half the candidate capacity is expected above it (top-p alone; then also a second bound,
   where a quarter is).
2. `_scan_segments_kernel` (one warp per row and segment; `scan_group` segments in large batches): the segment's max, softmax
   normaliser and the mass of its tokens >= lo (the candidates) and >= the second bound (all
   three only for top-p alone), and the candidates, with their positions, into its own region of
   the workspace.
3. `_gather_chunks_kernel` (row x 8192-token chunk): each program combines the segment statistics
   in segment order (all of a row's programs reach the same bits; from `settle_launch_min_t` rows
   `_settle_kernel` does it once a row, before the gather): whether the candidates settle
   the row (no segment overflowed, and they hold the k tokens or the top_p mass; for top-p alone,
   only those >= the second bound when they hold it) and each segment's offset in the row's list.
   In a settled row: its segments' listed candidate values gathered into the row's list; with
   top-k on, also their positions, and -inf over the chunk.
4. `_select_kernel` (per row): the exact threshold by interval rounds on the float keys of the
   candidates (each keeps the one of 16 equal key ranges holding the answer, by counts for top-k
   and masses for top-p; the list is compacted as the range narrows; the kernel runs with 128
   registers, two programs an SM). With top-k on, the few kept candidates are then written back
   over the gather's -inf. For top-p alone, from `fill_in_select_min_t` rows the program fills its
   row itself as launch 5 does, chunk by chunk, and launch 5 is left out (rows whose search ends
   early fill while others still search); in smaller batches the threshold is stored in the header.
   A row the candidates did not settle takes the general path in the same program, on its
   untouched logits: the row max, count and normaliser and, for 16 pivots placed geometrically
   below the first block's max, the count and mass of the tokens >= each; the two pivots around
   the threshold give a bracket, which counting passes narrow as key rounds (the selection's
   interval rounds over the row, so exact for any finite row, whatever its scale) until at most
   CAP tokens remain, which are compacted and ranked in registers; then one masking pass.
5. `_fill_chunks_kernel` (settled rows of top-p alone, below `fill_in_select_min_t` rows; a chunk a
   program, `fill_group` from `settle_launch_min_t` rows): -inf over a chunk, a block barrier, then
   the chunk's own listed candidates >= the threshold restored, into lines the program has just
   written. Top-p alone keeps thousands of tokens: written back by the selection, after a fill in
   the gather, each landed in its own sector of a row long gone from the L2.

On Hopper and later GPUs every launch after the first is a programmatic dependent launch: its
programs are placed while the previous launch drains and read their row settings, then wait for it
(see row_settings), so each launch's start overlaps the previous one's tail.

Every reduction runs in a fixed order over segments that depend on V alone, so a row's result does
not depend on the batch it is in. A row with both filters off is not read. Masses are float32
sums, so a token's membership may differ from the exact answer only where the exact mass above it
is within float32 rounding of top_p.

`sample` draws its filtered rows with the same launches in their DRAW form (`filtered_draw_launches`):
the bound (`store_row_bound`, in `sample`'s own first launch, which draws the other rows), the
scan, then (below `gather_in_draw_min_t` rows after the settle and gather launches)
one program a row that settles the row, gathers its list and finds the thresholds as above on
y = logits / temperature (the scan reads the logits as they are: a bound on
them is one on y), with min_p's threshold folded in, and draws the token from the kept candidates;
nothing is written to the logits, and a row the list may not cover takes the general path on a
copy of the row in its workspace.

The modules, one concern each: `settings` (the tunable sizes and batch-size thresholds, one
`TruncationSettings` object; `use_settings` overrides them), `keys` (float keys, interval rounds
and compaction), `workspace` (a row's settings and the layout of its workspace), `scan` (launches
1-3 and the fill), `select` (launch 4 on the candidates), `general` (the general path), `plan` (the
launch plan), `op` (checks, launcher and registration).
"""
from .op import top_k_top_p
from .settings import (
    DEFAULT_SETTINGS,
    GPU_SETTINGS,
    INTERPRETER_SETTINGS,
    TruncationSettings,
    current_settings,
    use_settings,
)

__all__ = ["DEFAULT_SETTINGS", "GPU_SETTINGS", "INTERPRETER_SETTINGS", "TruncationSettings", "current_settings",
           "top_k_top_p", "use_settings"]
