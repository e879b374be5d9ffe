"""Where an idle-GPU call of the loss op loses time against its GPU work: for each call (started
on an idle GPU, the previous call finished), the host's time from the call's start to its first
kernel launch, the GPU's idle gaps between its kernels, and its kernels' busy time, from a torch
profiler trace (the GPU's clock as the trace aligns it: its "first kernel after" column read 0.00
throughout in h200_fe / h200_ff). A call bound by its host shows gaps between kernels; one bound by its start, a
long first wait.

    python bench/diag_idle_gaps.py --sizes 32768 --calls 5 [--interleave]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contrastive_loss import inputs, make_dense_siglip, make_compiled_dense, ours  # noqa: E402


def call_gaps(prof, label: str) -> list:
    """(first wait, gaps, busy, span) in ms for each ``label`` range of the trace (the kernels
    up to the next range of any label)."""
    events = prof.events()
    starts = sorted(e.time_range.start for e in events if e.name.startswith("call"))
    calls = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == label)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    launches = sorted(e.time_range.start for e in events
                      if e.device_type == torch.autograd.DeviceType.CPU and "Launch" in e.name)
    out = []
    for t0, t1 in calls:
        t_next = next((t for t in starts if t > t0), float("inf"))
        ks = [k for k in kernels if t0 <= k[0] < t_next]
        if not ks:
            continue
        busy, gaps, end = 0.0, 0.0, ks[0][0]
        for s, e in ks:
            gaps += max(0.0, s - end)
            busy += e - max(s, end) if e > end else 0.0
            end = max(end, e)
        first_launch = next((t for t in launches if t >= t0), t0)
        out.append(((ks[0][0] - t0) / 1e3, gaps / 1e3, busy / 1e3, (end - t0) / 1e3, (first_launch - t0) / 1e3))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--interleave", action="store_true",
                   help="the impls in turn within each round (the order rotating), as the bench's --interleave")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}")
    impls = {"ours_bf16": ours("bf16"), "ours_siglip_bf16": ours("bf16", loss="siglip"),
             "compiled_dense": make_compiled_dense(), "dense_siglip": make_dense_siglip()}
    for b in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, bias = inputs(b, args.dim, torch.bfloat16)
        names = list(impls)
        for name, fn in impls.items():
            for _ in range(2):  # warm-up (compiles)
                fn(img, txt, scale, bias).backward()
        torch.cuda.synchronize()
        rounds = ([names[r % len(names):] + names[:r % len(names)] for r in range(args.calls)] if args.interleave
                  else [[name] * args.calls for name in names])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for order in rounds:
                for name in order:
                    torch.cuda.synchronize()
                    with record_function(f"call {name}"):
                        impls[name](img, txt, scale, bias).backward()
                    img.grad = txt.grad = scale.grad = bias.grad = None
            torch.cuda.synchronize()
        for name in names:
            rows = call_gaps(prof, f"call {name}")
            med = [statistics.median(r[i] for r in rows) for i in range(5)]
            print(f"B={b:<7} {name:<18} ms (median of {len(rows)}{', interleaved' if args.interleave else ''}): "
                  f"first launch on the host after {med[4]:.2f}, first kernel after {med[0]:.2f}, gaps {med[1]:.2f}, "
                  f"kernels busy {med[2]:.2f}, call to last kernel's end {med[3]:.2f}", flush=True)


if __name__ == "__main__":
    main()
