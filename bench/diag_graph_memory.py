"""What the loss op's CUDA-graph replay (ops/graphs.py) keeps on the GPU between calls, and how it
grows when new shapes keep coming (each capture beyond the cache's eight evicts the oldest).

    python bench/diag_graph_memory.py                # the captures as ops/graphs.py makes them
    python bench/diag_graph_memory.py --previous     # as before: a pool and a side stream each

Run each mode in a process of its own: torch keeps a cuBLAS workspace per stream until the process
ends, so a mode run second would find the first one's. Per loss and B, on an idle stream: the
reserved and allocated memory that three replayed forward + backward calls leave behind (the
cache cleared before), the growth over ten calls of ten new shapes (B - 8, B - 16, ...), and the
median time of a replayed call. Rows are printed (no file).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss, graphs, registered  # noqa: E402

MIB = 2 ** 20


@contextlib.contextmanager
def previous_captures():
    """ops/graphs.py's captures as they were before this diagnostic: each capture warms up on a
    new side stream and draws on a private pool of its own."""
    init, pool = graphs.GraphedCall.__init__, graphs.GraphCache._pool

    def init_on_a_side_stream(self, run, tensors, pool=None):
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            init(self, run, tensors, None)
        current.wait_stream(side)

    graphs.GraphedCall.__init__ = init_on_a_side_stream
    graphs.GraphCache._pool = lambda self, device: None
    try:
        yield
    finally:
        graphs.GraphedCall.__init__, graphs.GraphCache._pool = init, pool


def _leaves(b: int, d: int, loss: str) -> list:
    img = torch.nn.functional.normalize(torch.randn(b, d, device="cuda"), dim=-1)
    txt = torch.nn.functional.normalize(img + torch.randn(b, d, device="cuda"), dim=-1)
    leaves = [img.bfloat16(), txt.bfloat16(), torch.full((), 10.0, device="cuda")]
    leaves.append(torch.full((), -5.0, device="cuda") if loss == "siglip" else None)
    return [x.requires_grad_() if x is not None else None for x in leaves]


def _call(leaves: list, loss: str, limit: int) -> float:
    """One forward + backward started on an idle stream; its host-to-done time in ms."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    contrastive_loss(*leaves, loss=loss, impl="triton", graph_max_batch=limit).backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _memory() -> tuple:
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_reserved(), torch.cuda.memory_allocated()


def row(loss: str, b: int, d: int, calls: int) -> dict:
    registered._GRAPHS.clear()
    gc.collect()
    torch.cuda.empty_cache()
    leaves = _leaves(b, d, loss)
    r0, a0 = _memory()
    for _ in range(3):
        _call(leaves, loss, b)
    r1, a1 = _memory()
    times = [_call(leaves, loss, b) for _ in range(calls)]
    for k in range(1, 11):
        _call(_leaves(b - 8 * k, d, loss), loss, b)
    r2, a2 = _memory()
    return dict(loss=loss, B=b, held_reserved_mib=(r1 - r0) / MIB, held_allocated_mib=(a1 - a0) / MIB,
                growth_reserved_mib=(r2 - r1) / MIB, growth_allocated_mib=(a2 - a1) / MIB,
                replay_ms=statistics.median(times), captures=len(registered._GRAPHS.calls))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096,8192")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--calls", type=int, default=9)
    p.add_argument("--previous", action="store_true", help="the captures as they were before")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("diag_graph_memory needs a CUDA GPU", file=sys.stderr)
        return 2
    mode = "previous (a pool and a side stream per capture)" if args.previous else "ops/graphs.py"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; captures: {mode}")
    print("| loss | B | held reserved MiB | held allocated MiB | + 10 new shapes: reserved MiB | allocated MiB "
          "| replayed call ms |")
    print("|---|---|---|---|---|---|---|")
    with previous_captures() if args.previous else contextlib.nullcontext():
        for loss in ("clip", "siglip"):
            for b in [int(x) for x in args.sizes.split(",") if x]:
                r = row(loss, b, args.dim, args.calls)
                print(f"| {loss} | {b:,} | {r['held_reserved_mib']:.1f} | {r['held_allocated_mib']:.1f} | "
                      f"{r['growth_reserved_mib']:.1f} | {r['growth_allocated_mib']:.1f} | {r['replay_ms']:.3f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
