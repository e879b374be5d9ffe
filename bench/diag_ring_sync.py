"""Diagnostic (torchrun, NCCL): where the distributed loss makes the host wait for the GPU, and
what those waits cost.

For each scheme and global batch: the forward + backward time (median of --reps, the slowest
rank), the host-device waits of one call (torch's CUDA sync debug mode, by calling line), and the
time again with the per-call size check (Sweep.check_sizes: an all-gather read on the host)
replaced by nothing, to price that wait.

    torchrun --nproc_per_node 2 bench/diag_ring_sync.py --batches 32768 65536
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_distributed import features, measure, slowest, step_fn  # noqa: E402
from infclip.ops import sweeps  # noqa: E402


def sync_points(fn) -> collections.Counter:
    """Calling lines (outside torch) of every host-device wait in one call of ``fn``."""
    seen: collections.Counter = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "/torch/" not in f.filename and "warnings" not in f.filename]
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[-3:][::-1])
        seen[where] += 1

    old = warnings.showwarning
    warnings.showwarning = show
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = old
    return seen


def check_sizes_on_gpu(self, x) -> None:
    """The size check as it was before the host twin: all-gathered on the GPU, read by the host."""
    mine = torch.tensor([x.shape[0], x.shape[1]], dtype=torch.int64, device=x.device)
    sizes = self.all_gather(mine).view(self.world, 2).tolist()
    if any(s != sizes[0] for s in sizes):
        raise ValueError(f"uneven local batches: {sizes}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[32768, 65536])
    p.add_argument("--schemes", nargs="+", default=["ring", "disco"])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--queued_ms", type=float, default=20.0,
                   help="GPU work queued before each call in the second timing")
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    original = sweeps.Sweep.check_sizes
    for batch in args.batches:
        b = batch // world
        for scheme in args.schemes:
            img, txt = features(b, args.dim, torch.bfloat16, device, seed=batch * world + rank)
            scale = torch.tensor([20.0], device=device, requires_grad=True)
            fn = step_fn(img, txt, scale, impl="triton", distributed=scheme)
            def timed(queued_ms=0.0):
                times = measure(fn, device, 2, args.reps, dist.group.WORLD, queued_ms)
                return slowest(sorted(times)[args.reps // 2], device)

            waits = sync_points(fn)
            row = {}
            for label, check in (("host check", original), ("GPU check", check_sizes_on_gpu),
                                 ("no check", lambda self, x: None)):
                sweeps.Sweep.check_sizes = check
                try:
                    row[label] = (timed(), timed(args.queued_ms))
                finally:
                    sweeps.Sweep.check_sizes = original
            if rank == 0:
                cells = "; ".join(f"{k} {a:.2f} ms alone, {q:.2f} ms behind {args.queued_ms:.0f} ms of queued work"
                                  for k, (a, q) in row.items())
                print(f"{scheme} B={batch} b={b}: {cells}; host waits in one call: {sum(waits.values())}",
                      flush=True)
                for where, count in waits.most_common():
                    print(f"    {count} x {where}", flush=True)
            del img, txt, fn
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
