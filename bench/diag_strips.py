"""The CLIP op's forward and backward timed apart, with the column-strip forward (plain sums, d
scale summed by the backward's gradient kernel) and without it (_STRIPS=False: the per-tile
forward with its weighted sums), in one process on a CUDA GPU; then the backward's fused
gradient kernel alone over one block, with and without the d-scale sum (DSCALE 2 / 1). With
``--grad``, other gradient tiles (_TMA_GRAD plus SPLIT: BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
warps, stages, programs per SM, epilogue slices) are timed the same way, the op end to end and
the block alone (behind 9 others), each block checked against the op's tiles.

    python bench/diag_strips.py --sizes 4096,8192,16384,65536
    python bench/diag_strips.py --sizes 32768,65536 --no-modes --grad 128,128,64,8,8,3,1,2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench_loss_kernels import _try, timed, timed_queued  # noqa: E402
from infclip.ops import contrastive_loss  # noqa: E402


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def fwd_bwd_ms(img, txt, scale, reps: int) -> tuple[float, float]:
    """Median forward and backward ms of the op (events around each, after two warm-up calls)."""
    fwd, bwd = [], []
    for i in range(reps + 2):
        leaves = [x.detach().requires_grad_() for x in (img, txt, scale)]
        f0, f1 = _events()
        b0, b1 = _events()
        f0.record()
        loss = contrastive_loss(*leaves, impl="triton")
        f1.record()
        b0.record()
        loss.backward()
        b1.record()
        torch.cuda.synchronize()
        if i >= 2:
            fwd.append(f0.elapsed_time(f1))
            bwd.append(b0.elapsed_time(b1))
    return statistics.median(fwd), statistics.median(bwd)


def grad_block_ms(img, txt, scale, dscale: int, reps: int, queued: bool = False, p=None) -> float:
    """One fused gradient block (the backward's first, _grad_block's size) by itself, into ``p``
    when given; ``queued``: timed behind 9 others (the launch's host time hidden)."""
    m, d = img.shape
    rows, cols = tri._grad_block(m, m, d, 0, img.element_size())
    a, b = img[:rows], txt[:cols]
    p = torch.empty(rows, cols, device="cuda", dtype=img.dtype) if p is None else p
    lse = torch.full((max(rows, cols),), 30.0, device="cuda")
    ref = (a.float() * txt[:rows].float()).sum(-1)
    one = torch.ones(1, device="cuda")
    dst = torch.zeros((), device="cuda")
    fn = lambda: tri._fused(  # noqa: E731
        tri._clip_grad_fused_kernel, a, b, "grad", False, scale, one, 1.0, one, dst, lse[:rows],
        lse[:cols], ref, lse[:cols], 0, 2.0, 0.0, True, dscale, p=p)
    return timed_queued(fn, reps, 10) if queued else timed(fn, reps)


def _tiles(text: str) -> tuple:
    return tuple(int(v) for v in text.split(","))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096,8192,16384,32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--strips", nargs="*", default=[], help="more _TMA_STRIPS tuples to time, comma-separated")
    p.add_argument("--grad", nargs="*", default=[], help="more _TMA_GRAD tuples (with SPLIT) to time")
    p.add_argument("--no-modes", dest="modes", action="store_false",
                   help="skip the strips / per-tile forwards and the DSCALE 1 / 2 blocks")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, strips {tri._TMA_STRIPS}, grad tiles {tri._TMA_GRAD}")
    for b in [int(x) for x in args.sizes.split(",") if x]:
        g = torch.Generator(device="cuda").manual_seed(0)
        img = F.normalize(torch.randn(b, args.dim, device="cuda", generator=g), dim=-1).bfloat16()
        txt = F.normalize(img.float() + 0.5 * torch.randn(b, args.dim, device="cuda", generator=g),
                          dim=-1).bfloat16()
        scale = torch.full((1,), 14.3, device="cuda")
        default = tri._TMA_STRIPS
        modes = [("strips", True, default), ("tiles", False, default)] if args.modes else []
        for label, strips, tiles in modes + [
                (f"strips{t}", True, _tiles(t)) for t in args.strips]:
            tri._STRIPS, tri._TMA_STRIPS = strips, tiles
            f, bw = fwd_bwd_ms(img, txt, scale, args.reps)
            print(f"B={b:<7} {label:<28} forward {f:8.3f} ms  backward {bw:8.3f} ms  total {f + bw:8.3f}",
                  flush=True)
        tri._STRIPS, tri._TMA_STRIPS = True, default
        for dscale in (1, 2) if args.modes else ():
            ms = grad_block_ms(img, txt, scale, dscale, args.reps)
            print(f"B={b:<7} grad block DSCALE={dscale}  {ms:8.3f} ms", flush=True)
        if args.grad:
            grad_variants(img, txt, scale, [tri._TMA_GRAD] + [_tiles(t) for t in args.grad], b, args.reps)


def grad_variants(img, txt, scale, variants: list, b: int, reps: int) -> None:
    """The op end to end and its gradient block (DSCALE 2, queued) with each of ``variants`` as
    _TMA_GRAD; each block's P compared with the first variant's."""
    saved = tri._TMA_GRAD
    m, d = img.shape
    rows, cols = tri._grad_block(m, m, d, 0, img.element_size())
    flops = 2 * rows * cols * d
    first = None
    for tiles in variants:
        tri._TMA_GRAD = tiles
        p = torch.empty(rows, cols, device="cuda", dtype=img.dtype)
        times = _try(lambda: (*fwd_bwd_ms(img, txt, scale, reps),
                              grad_block_ms(img, txt, scale, 2, reps, queued=True, p=p)))
        if times is None:  # (a tile that does not compile or launch: _try said why)
            print(f"B={b:<7} grad {str(tiles):<34} skipped", flush=True)
            continue
        f, bw, ms = times
        first = p if first is None else first
        err = ((p.float() - first.float()).abs().max() / first.float().abs().max()).item()
        print(f"B={b:<7} grad {str(tiles):<34} op forward {f:7.3f} backward {bw:7.3f} total {f + bw:7.3f} ms"
              f"  block {rows}x{cols} {ms:6.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  diff {err:.1e}",
              flush=True)
    tri._TMA_GRAD = saved


if __name__ == "__main__":
    main()
