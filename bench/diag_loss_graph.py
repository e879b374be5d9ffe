"""The loss op's forward + backward on an idle GPU, eager (graph_max_batch=0) and with its in-op
CUDA graphs (ops/graphs.py), against the compiled dense loss: per B, the call (CUDA events from
before the forward to after the backward), the host time to issue it (perf_counter, no sync),
and the same forward + backward captured whole by the caller and replayed behind a copy of the
inputs: the floor (the GPU's own time plus one graph launch).

    python bench/diag_loss_graph.py --sizes 1024,2048,4096,8192
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_contrastive_loss import inputs, make_compiled_dense, ours  # noqa: E402


def events_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step(fn, img, txt, scale, bias):
    def run():
        fn(img, txt, scale, bias).backward()
    return run


def graphed(fn, img, txt, scale, bias):
    """The forward + backward of fn captured on static copies of the inputs; returns a callable
    that copies fresh inputs in and replays."""
    s_img, s_txt = img.detach().clone().requires_grad_(), txt.detach().clone().requires_grad_()
    s_scale, s_bias = scale.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(s_img, s_txt, s_scale, s_bias).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for t in (s_img, s_txt, s_scale, s_bias):
        t.grad = None
    with torch.cuda.graph(graph):
        fn(s_img, s_txt, s_scale, s_bias).backward()

    def run():
        s_img.detach().copy_(img.detach())
        s_txt.detach().copy_(txt.detach())
        graph.replay()
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,4096,8192")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    fns = {"ours_clip_eager": ours("bf16", graph_max_batch=0),
           "ours_clip": ours("bf16", graph_max_batch=1 << 20),
           "ours_siglip_eager": ours("bf16", loss="siglip", graph_max_batch=0),
           "ours_siglip": ours("bf16", loss="siglip", graph_max_batch=1 << 20),
           "compiled_dense": make_compiled_dense()}
    print(f"# {torch.cuda.get_device_name()}, idle GPU, ms per forward + backward", flush=True)
    print("| B | impl | eager (events) | eager host issue | graph replay (events) |")
    print("|---|---|---|---|---|")
    for b in [int(x) for x in args.sizes.split(",") if x]:
        for name, fn in fns.items():
            img, txt, scale, bias = inputs(b, args.dim, torch.bfloat16)
            run = step(fn, img, txt, scale, bias)
            for _ in range(3):
                run()
            eager = events_ms(run, args.reps)
            host = host_ms(run, args.reps)
            try:
                replay = f"{events_ms(graphed(fn, img, txt, scale, bias), args.reps):.3f}"
            except Exception as exc:  # not capturable
                replay = f"error: {type(exc).__name__}: {str(exc)[:80]}"
            print(f"| {b:,} | {name} | {eager:.3f} | {host:.3f} | {replay} |", flush=True)


if __name__ == "__main__":
    main()
