"""Benchmark of the constraints family (logit_bias, apply_token_bitmask) against the composed-PyTorch
baseline (benchmarks/baselines.py) and the bandwidth floor.

    python benchmarks/bench_logit_bias.py            # GPU tables if CUDA is present, CPU table always
    python benchmarks/bench_logit_bias.py --out results.md
"""
from __future__ import annotations

import os

import baselines
import torch
import triton
import triton.language as tl

import torch_sampling_ops as tso
from torch_sampling_ops import constraints

from timing import Case, bench_gpu, copy_bandwidth_gbps, eager_overhead_us, main, print_table, record


def logit_bias_inputs(T, V, device, *, allowed=1024, bias=1024, stops=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    R = T

    def unique_ids(n):
        return torch.stack([torch.randperm(V, generator=g)[:n] for _ in range(R)]).to(torch.int32)

    state = [
        torch.arange(T, dtype=torch.int32),                      # idx_mapping
        torch.zeros(T, dtype=torch.int64),                       # output_lens
        unique_ids(allowed), torch.full((R,), allowed, dtype=torch.int32),
        unique_ids(bias), torch.randn(R, bias, generator=g), torch.full((R,), bias, dtype=torch.int32),
        unique_ids(stops), torch.full((R,), stops, dtype=torch.int32),
        torch.full((R,), 4, dtype=torch.int32),                  # min_tokens: active in every row
    ]
    logits = torch.randn(T, V, generator=g) * 3
    return [logits.to(device)] + [s.to(device) for s in state]


def bitmask_inputs(T, V, device, seed=0, allowed=None):
    """Random bits (half set), or `allowed` random tokens a row allowed (a grammar's narrow mask)."""
    g = torch.Generator().manual_seed(seed)
    words = (V + 31) // 32
    if allowed is None:
        bitmask = torch.randint(-2**31, 2**31 - 1, (T, words), generator=g, dtype=torch.int64).to(torch.int32)
    else:
        bits = torch.zeros(T, words * 32, dtype=torch.bool)
        for t in range(T):
            bits[t, torch.randperm(V, generator=g)[:allowed]] = True
        packed = (bits.view(T, words, 32).long() << torch.arange(32)).sum(-1)
        bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return [(torch.randn(T, V, generator=g) * 3).to(device), bitmask.to(device)]


CASES = [
    Case("logit_bias (1024 allowed, 1024 bias, 8 stops), fp32", lambda T, V, dev, s: logit_bias_inputs(T, V, dev, seed=s),
         tso.logit_bias, baselines.logit_bias),
    Case("logit_bias (1024 bias, 8 stops, no allowed list), fp32",
         lambda T, V, dev, s: logit_bias_inputs(T, V, dev, allowed=0, seed=s), tso.logit_bias, baselines.logit_bias),
    Case("apply_token_bitmask, fp32", lambda T, V, dev, s: bitmask_inputs(T, V, dev, seed=s), tso.apply_token_bitmask,
         baselines.apply_token_bitmask),
    Case("apply_token_bitmask (1024 allowed tokens), fp32",
         lambda T, V, dev, s: bitmask_inputs(T, V, dev, seed=s, allowed=1024), tso.apply_token_bitmask,
         baselines.apply_token_bitmask),
]


@triton.jit
def _fill_beside_reads_kernel(logits_ptr, ids_ptr, saved_ptr, vocab_size, num_ids, CHUNK: tl.constexpr,
                              BLOCK: tl.constexpr, IDS_A_PROGRAM: tl.constexpr, READ: tl.constexpr,
                              WRITE: tl.constexpr = True, KEEP_READ_LINES: tl.constexpr = False,
                              STREAM_WRITES: tl.constexpr = False):
    """Not an op: what any logit_bias with an allowed list must move, without its ordering. Program
    (row, chunk) stores -inf over its chunk (with WRITE) and, with READ, reads its share of the row's
    allowed ids' logits (anywhere in the row) into `saved`; no store waits for a load.
    KEEP_READ_LINES asks the L2 to keep the lines read (evict_last), STREAM_WRITES to evict the
    written ones first: a reads-only launch, then a launch that writes beside the same reads, times
    the two phases apart, the second's reads served from the L2 if its lines outlive the writes."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    logits_row = logits_ptr + row * vocab_size
    if READ:
        j = chunk * IDS_A_PROGRAM + tl.arange(0, IDS_A_PROGRAM)
        listed = j < num_ids
        ids = tl.load(ids_ptr + row * num_ids + j, mask=listed, other=0)
        vals = tl.load(logits_row + ids, mask=listed, other=0.0,
                       eviction_policy="evict_last" if KEEP_READ_LINES else "")
        tl.store(saved_ptr + row * num_ids + j, vals, mask=listed)
    if WRITE:
        for start in tl.static_range(0, CHUNK, BLOCK):
            offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
            tl.store(logits_row + offs, tl.full([BLOCK], float("-inf"), tl.float32), mask=offs < vocab_size,
                     eviction_policy="evict_first" if STREAM_WRITES else "")


def must_move_table(V: int = 151936, chunk: int = 8192, device: str = "cuda"):
    """logit_bias with 1024 allowed ids against what it must move: the rows written (`fill_`, and a
    Triton kernel of 8192-token chunk programs) and, beside the write, the allowed ids' logits read
    from anywhere in the row (random 32-byte sectors), with nothing waiting on those reads; the
    reads alone, and the reads then the writes beside them in a second launch. CUDA graph µs at
    BENCH_T's sizes."""
    bw = copy_bandwidth_gbps()
    chunks = triton.cdiv(V, chunk)

    def probe(logits, ids, saved, read, **phases):
        per_program = triton.next_power_of_2(triton.cdiv(ids.shape[1], chunks))
        _fill_beside_reads_kernel[(logits.shape[0], chunks)](logits, ids, saved, V, ids.shape[1], CHUNK=chunk,
                                                             BLOCK=2048, IDS_A_PROGRAM=per_program, READ=read,
                                                             num_warps=8, **phases)

    def reads_then_writes(*a):  # the reads alone, then the writes beside the same reads (from the L2)
        probe(*a, True, WRITE=False, KEEP_READ_LINES=True)
        probe(*a, True, STREAM_WRITES=True)

    rows = []
    for T in (int(t) for t in os.environ.get("BENCH_T", "1,32,256").split(",")):
        sets = [logit_bias_inputs(T, V, device, seed=s) for s in range(3)]
        allowed_only = [logit_bias_inputs(T, V, device, bias=0, stops=0, seed=s) for s in range(3)]
        # The probe's own rows: after its fill, logit_bias's min-tokens step would find a row of
        # -inf and scan all of it for a finite logit, which is not the op's usual work.
        probe_sets = [(s[0].clone(), s[3], torch.empty(s[3].shape, device=device)) for s in sets]
        rows.append([T, "write floor (the rows over the copy bandwidth)", T * V * 4 / (bw * 1e3)])
        timed = {
            "fill_ (torch)": bench_gpu(lambda x, *_: x.fill_(float("-inf")), probe_sets, graph=True),
            "write-only chunks (Triton)": bench_gpu(lambda *a: probe(*a, False), probe_sets, graph=True),
            "write-only chunks beside the 1024 allowed reads": bench_gpu(lambda *a: probe(*a, True), probe_sets,
                                                                        graph=True),
            "the 1024 allowed reads alone": bench_gpu(lambda *a: probe(*a, True, WRITE=False), probe_sets,
                                                      graph=True),
            "the reads alone, then the writes beside them (2 launches)": bench_gpu(reads_then_writes, probe_sets,
                                                                                   graph=True),
            "logit_bias, 1024 allowed ids only": bench_gpu(tso.logit_bias, allowed_only, graph=True),
            "logit_bias, 1024 allowed, 1024 bias, 8 stops": bench_gpu(tso.logit_bias, sets, graph=True),
        }
        for what, us in timed.items():
            record("logit_bias", f"must move: {what}", T, V, torch.float32, "graph", "probe", us)
            rows.append([T, what, us])
    return print_table(f"logit_bias against what it must move, V = {V}, CUDA graph µs", ["T", "what", "µs"], rows)


def overhead_table():
    logits, bitmask = bitmask_inputs(1, 1000, "cuda")
    kernel_args = (logits, logits.stride(0), bitmask, bitmask.stride(0), None, 1, 1000)

    def raw():
        constraints._token_bitmask_kernel[(1, 1)](*kernel_args, HAS_IDX_MAPPING=False, BLOCK_V=4096, num_warps=8)

    rows = [
        ["raw Triton launch", eager_overhead_us(raw)],
        ["torch.ops.sampling.apply_token_bitmask",
         eager_overhead_us(lambda: torch.ops.sampling.apply_token_bitmask(logits, bitmask))],
        ["torch_sampling_ops.apply_token_bitmask", eager_overhead_us(lambda: tso.apply_token_bitmask(logits, bitmask))],
    ]
    state = logit_bias_inputs(1, 1000, "cuda", allowed=16, bias=16, stops=2)
    rows.append(["torch.ops.sampling.logit_bias (2 launches)",
                 eager_overhead_us(lambda: torch.ops.sampling.logit_bias(*state))])
    for call, us in rows:
        op = "logit_bias" if "logit_bias" in call else "apply_token_bitmask"
        record(op, "host cost per call", 1, 1000, logits.dtype, "host", call, us)
    return print_table("Eager host cost per call (µs), T = 1, V = 1000", ["call", "µs / call"], rows)


if __name__ == "__main__":
    main(CASES, __doc__, extra_gpu=lambda: overhead_table() + "\n" + must_move_table())
