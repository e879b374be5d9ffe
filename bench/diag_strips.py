"""The CLIP op's forward and backward timed apart, with the column-strip forward (plain sums, d
scale summed by the backward's gradient kernel) and without it (_STRIPS=False: the per-tile
forward with its weighted sums), in one process on a CUDA GPU; then the backward's fused
gradient kernel alone over one block, with and without the d-scale sum (DSCALE 2 / 1).

    python bench/diag_strips.py --sizes 4096,8192,16384,65536
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
from bench_loss_kernels import timed  # noqa: E402
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


def grad_block_ms(img, txt, scale, dscale: int, reps: int) -> float:
    """One fused gradient block (the backward's first, _grad_block's size) by itself."""
    m, d = img.shape
    rows, cols = tri._grad_block(m, m, d, 0, img.element_size())
    a, b = img[:rows], txt[:cols]
    p = torch.empty(rows, cols, device="cuda", dtype=img.dtype)
    lse = torch.full((max(rows, cols),), 30.0, device="cuda")
    ref = (a.float() * txt[:rows].float()).sum(-1)
    one = torch.ones(1, device="cuda")
    dst = torch.zeros((), device="cuda")
    return timed(lambda: tri._fused(
        tri._clip_grad_fused_kernel, a, b, "grad", False, scale, one, 1.0, one, dst, lse[:rows],
        lse[:cols], ref, lse[:cols], 0, 2.0, 0.0, True, dscale, p=p), reps)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096,8192,16384,32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--strips", nargs="*", default=[], help="more _TMA_STRIPS tuples to time, comma-separated")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, strips {tri._TMA_STRIPS}, grad tiles {tri._TMA_GRAD}")
    for b in [int(x) for x in args.sizes.split(",") if x]:
        g = torch.Generator(device="cuda").manual_seed(0)
        img = F.normalize(torch.randn(b, args.dim, device="cuda", generator=g), dim=-1).bfloat16()
        txt = F.normalize(img.float() + 0.5 * torch.randn(b, args.dim, device="cuda", generator=g),
                          dim=-1).bfloat16()
        scale = torch.full((1,), 14.3, device="cuda")
        default = tri._TMA_STRIPS
        for label, strips, tiles in [("strips", True, default), ("tiles", False, default)] + [
                (f"strips{t}", True, tuple(int(v) for v in t.split(","))) for t in args.strips]:
            tri._STRIPS, tri._TMA_STRIPS = strips, tiles
            f, bw = fwd_bwd_ms(img, txt, scale, args.reps)
            print(f"B={b:<7} {label:<28} forward {f:8.3f} ms  backward {bw:8.3f} ms  total {f + bw:8.3f}",
                  flush=True)
        tri._STRIPS, tri._TMA_STRIPS = True, default
        for dscale in (1, 2):
            ms = grad_block_ms(img, txt, scale, dscale, args.reps)
            print(f"B={b:<7} grad block DSCALE={dscale}  {ms:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
