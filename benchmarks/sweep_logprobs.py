"""Sweep of the CUDA logprobs split's knobs (torch_sampling_ops.sampling._LOGPROBS_*): each
configuration checked against the float64 reference, then timed under CUDA-graph replay.

    python benchmarks/sweep_logprobs.py                      # V = 151936, k = 20, T = 1, 32, 256
    SWEEP_T=256 SWEEP_K=20,64 python benchmarks/sweep_logprobs.py
    SWEEP_CONFIGS=default,seg4096-w4-g64-c4 python benchmarks/sweep_logprobs.py

Inputs: fp32 logits randn * 3. Prints one line a configuration and T, in microseconds a call.
"""
import itertools
import os

import torch

from torch_sampling_ops import reference, sampling

CONFIGS = {  # (SEGMENT, WARPS, GROUP, COMBINE_WARPS)
    "default": (sampling._LOGPROBS_SEGMENT, sampling._LOGPROBS_WARPS, sampling._LOGPROBS_GROUP,
                sampling._LOGPROBS_COMBINE_WARPS),
}
for seg, warps, group, combine_warps in itertools.product((2048, 4096, 8192), (4, 8), (32, 64, 128), (4, 8)):
    CONFIGS[f"seg{seg}-w{warps}-g{group}-c{combine_warps}"] = (seg, warps, group, combine_warps)


def set_knobs(seg, warps, group, combine_warps):
    sampling._LOGPROBS_SEGMENT, sampling._LOGPROBS_WARPS = seg, warps
    sampling._LOGPROBS_GROUP, sampling._LOGPROBS_COMBINE_WARPS = group, combine_warps


def time_graph(fn, iters=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / iters)
    return best


def main():
    V = int(os.environ.get("SWEEP_V", 151936))
    Ts = [int(t) for t in os.environ.get("SWEEP_T", "1,32,256").split(",")]
    ks = [int(k) for k in os.environ.get("SWEEP_K", "20").split(",")]
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(max(Ts), V, generator=g) * 3).cuda()
    ids = torch.randint(0, V, (max(Ts),), generator=g).cuda()
    for k in ks:
        expected = reference.logprobs(logits.cpu(), ids.cpu(), k)
        names = os.environ.get("SWEEP_CONFIGS")
        for name, knobs in CONFIGS.items():
            if names and name not in names.split(","):
                continue
            set_knobs(*knobs)
            try:
                out = sampling._logprobs_triton(logits, ids, k)
                torch.cuda.synchronize()
            except Exception as e:  # a configuration that does not compile or launch
                print(f"k={k} {name}: FAILED {str(e).splitlines()[-1][:120]}")
                continue
            ok = (torch.equal(out[0].cpu(), expected[0]) and torch.equal(out[3].cpu(), expected[3]) and
                  torch.allclose(out[1].cpu().double(), expected[1], atol=2e-5, rtol=1e-5))
            times = [time_graph(lambda T=T, k=k: sampling._logprobs_triton(logits[:T], ids[:T], k)) for T in Ts]
            print(f"k={k} {name:24s} {'ok ' if ok else 'BAD'} " + "  ".join(f"T={T}: {us:7.1f} us"
                                                                         for T, us in zip(Ts, times, strict=True)),
                  flush=True)


if __name__ == "__main__":
    main()
