"""The CLIP forward's strip sums by the warp-specialised Gluon kernel (ops/gluon_kernels.py, one
exponential a logit) against the op's Triton strip kernel (two), over the whole B x B in one
process on a Hopper GPU: sums compared (the column blocks the Gluon kernel leaves to the Triton
kernel, those whose shifts spread wider than its window, counted and left out of the column
check), then GPU time (ten calls replayed as one CUDA graph).

    python bench/diag_gluon_sums.py --sizes 32768,65536 --scales 14.3,100 --chunks 32,64
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from infclip.ops import gluon_kernels  # noqa: E402
from infclip.ops.contrastive_loss import SHIFT_MARGIN  # noqa: E402
from diag_gluon_grad import graph_timed  # noqa: E402


def features(b: int, d: int, spread: float):
    """Unit rows; ``spread`` > 0 mixes in near-duplicate pairs (cosine ~1) among the others, so
    that column blocks hold shifts far apart at a large scale."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=gen), dim=-1)
    noise = torch.randn(b, d, device="cuda", generator=gen)
    mix = torch.full((b, 1), 0.5, device="cuda")
    if spread > 0:
        mix[torch.rand(b, 1, device="cuda", generator=gen) < spread] = 0.02
    txt = F.normalize(img + mix * noise * 2, dim=-1)
    return img.bfloat16(), txt.bfloat16()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--scales", default="14.3,100")
    p.add_argument("--chunks", default="64")
    p.add_argument("--spread", type=float, default=0.0, help="fraction of near-duplicate pairs")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, Triton strips {tri._TMA_STRIPS}, Gluon {gluon_kernels.SUMS_TILES}"
          f" window {gluon_kernels.SUMS_WINDOW} nats")
    for b in [int(x) for x in args.sizes.split(",")]:
        img, txt = features(b, args.dim, args.spread)
        for s in [float(x) for x in args.scales.split(",")]:
            scale = torch.full((1,), s, device="cuda")
            row_shift, col_shift, _, _ = tri.clip_prologue_triton(img, txt, scale, SHIFT_MARGIN)
            blocks = col_shift[: b // 128 * 128].view(-1, 128)
            wide = (blocks.amax(1) - blocks.amin(1)) > gluon_kernels.SUMS_WINDOW
            keep = wide.logical_not().repeat_interleave(128)
            want = torch.zeros(2, b, device="cuda")
            tri._clip_sums_strips(img, txt, scale, row_shift, col_shift, want[0], want[1], 0, False)
            ms = graph_timed(lambda: tri._clip_sums_strips(img, txt, scale, row_shift, col_shift, want[0],
                                                           want[1], 0, False), args.reps)
            print(f"B={b} scale={s} triton strips {ms:.3f} ms; wide column blocks {int(wide.sum())} of "
                  f"{wide.numel()}", flush=True)
            want.zero_()
            tri._clip_sums_strips(img, txt, scale, row_shift, col_shift, want[0], want[1], 0, False)
            for chunk in [int(x) for x in args.chunks.split(",")]:
                got = torch.zeros(2, b, device="cuda")
                run = lambda: gluon_kernels.clip_sums_strips(  # noqa: E731
                    img, txt, scale, row_shift, col_shift, got[0], got[1], 0, chunk, sms)
                run()
                torch.cuda.synchronize()
                rel = lambda x, y: float(((x - y).abs() / y.abs().clamp_min(1e-30)).max())  # noqa: E731
                err_r = rel(got[0], want[0])
                err_c = rel(got[1][: keep.numel()][keep], want[1][: keep.numel()][keep])
                ms_g = graph_timed(run, args.reps)
                print(f"B={b} scale={s} gluon chunk {chunk}: {ms_g:.3f} ms (x triton {ms_g / ms:.3f}); "
                      f"max rel diff rows {err_r:.2e} cols {err_c:.2e}", flush=True)


if __name__ == "__main__":
    main()
