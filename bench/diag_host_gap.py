"""Diagnostic: is the loss op bound by its host work at a given B?

For each B (bf16, D = --dim, CLIP, the op's defaults), three numbers per forward + backward:
  steady  median wall time of one call, synchronised (what bench_contrastive_loss.py reports);
  gpu     the GPU's time for --calls calls enqueued behind a long sleep kernel (the host is far
          ahead, so there are no idle gaps between kernels): the op's pure device time;
  host    the host's time to enqueue one call while the GPU is still sleeping.
steady ~ gpu: device-bound; steady ~ host > gpu: the GPU waits on Python and launches.

    python bench/diag_host_gap.py --sizes 1024,4096,16384,32768
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss  # noqa: E402


def inputs(b: int, d: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=gen), dim=-1).bfloat16()
    txt = F.normalize(img.float() + 0.5 * torch.randn(b, d, device="cuda", generator=gen), dim=-1)
    txt = txt.bfloat16()
    img.requires_grad_(True)
    txt.requires_grad_(True)
    scale = torch.full((), 14.3, device="cuda", requires_grad=True)
    return img, txt, scale


def measure(b: int, d: int, calls: int, reps: int) -> tuple[float, float, float]:
    img, txt, scale = inputs(b, d)

    def call():
        contrastive_loss(img, txt, scale, impl="triton").backward()
        img.grad = txt.grad = scale.grad = None

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    steady = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        steady.append((time.perf_counter() - t0) * 1e3)
    gpu, host = [], []
    for _ in range(reps):
        torch.cuda._sleep(int(5e8))  # ~0.25 s of GPU sleep: the host enqueues everything behind it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - t0) * 1e3 / calls)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / calls)
    return statistics.median(steady), statistics.median(gpu), statistics.median(host)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096,16384,32768")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print(torch.cuda.get_device_name())
    print("| B | steady ms | GPU ms (no gaps) | host ms to enqueue |")
    print("|---|---|---|---|")
    for b in map(int, args.sizes.split(",")):
        steady, gpu, host = measure(b, args.dim, args.calls, args.reps)
        print(f"| {b:,} | {steady:.3f} | {gpu:.3f} | {host:.3f} |", flush=True)


if __name__ == "__main__":
    main()
