"""The warp-specialised Gluon CLIP gradient kernel (ops/gluon_kernels.py) against the op's Triton
kernel (_clip_grad_fused_kernel) and cuBLAS's GEMM of the same logits, on the backward's first
block at each B, in one process on a Hopper GPU: P and d scale checked against the Triton
kernel's, then GPU time (ten calls replayed as one CUDA graph: the launches' host time left out).

    python bench/diag_gluon_grad.py --sizes 32768,65536 --tiles 64,128,64,6 64,128,128,4
    python bench/diag_gluon_grad.py --siglip     # also the SigLIP block with its pair losses

How the kernel got its shape (a ring per consumer, then one shared ring with turns, a third
consumer, an interior path, cut-down epilogues): ops/gluon_kernels.py and
docs/benchmark_history.md (2026-11-24, fourth session); the calls' logs are
bench/results/gluon_grad_*_h200.log (bench/device/h200_dc.sh to h200_dm.sh ran working versions of
this file with those variants, not kept; the 64 x 256 tiles: bench/diag_gluon_wide.py in commit
a8edf12, h200_eq).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from infclip.ops import gluon_kernels  # noqa: E402
from bench_contrastive_loss import captured  # noqa: E402
from bench_loss_kernels import _try, inputs  # noqa: E402


class FirstBlock:
    """The backward's first gradient block at B = ``size`` (bench_loss_kernels.inputs' features;
    ``cast``: the block of a call whose grad_b is cast to 16 bits at its end, _grad_block's),
    with the kernels' arguments: ``args`` from scale to the d-scale source, ``vectors`` from the
    row LSEs to the offset (LSE = the shift + 1), ``scratch`` a d-scale output for timed calls."""

    def __init__(self, size: int, dim: int, cast: bool = False):
        img, txt, scale, row_shift, col_shift, ref, _ = inputs(size, dim)
        self.rows, self.cols = tri._grad_block(size, size, dim, 0, img.element_size(), cast=cast)
        self.a, self.b = img[:self.rows], txt[:self.cols]
        lse = row_shift + 1.0
        one = torch.ones(1, device="cuda")
        self.args = (scale.reshape(1), one, 1.0, one)
        self.vectors = (lse[:self.rows], lse[:self.cols], ref[:self.rows], lse[:self.cols], 0, 2.0, 0.0)
        self.scratch = torch.zeros((), device="cuda")
        self.sms = tri._sm_count(self.a.device)
        self.gflop = 2 * self.rows * self.cols * dim / 1e9

    def out(self) -> torch.Tensor:
        return torch.empty(self.rows, self.cols, device="cuda", dtype=self.a.dtype)

    def gluon(self, out, dst=None, tiles=gluon_kernels.GRAD_TILES, descriptors=None, dscale: int = 2) -> None:
        """The op's Gluon kernel on this block into ``out`` (d scale into ``dst``, else scratch;
        ``dscale`` 2: summed by the kernel, 1: taken from the forward's weighted sums)."""
        gluon_kernels.clip_grad_block(self.a, self.b, out, *self.args, self.scratch if dst is None else dst,
                                      *self.vectors, True, dscale, self.sms, tiles, descriptors)

    def triton(self, out, dst=None) -> None:
        """The op's Triton kernel on this block."""
        tri._fused(tri._clip_grad_fused_kernel, self.a, self.b, "grad", False, *self.args,
                   self.scratch if dst is None else dst, *self.vectors, True, 2, p=out)


def graph_timed(fn, reps: int, calls: int = 10) -> float:
    """Median GPU ms of one fn() over ``reps`` replays of a CUDA graph of ``calls`` calls."""
    graph = captured(fn, calls)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--cast", action="store_true",
                   help="the block of a call whose grad_b is cast to 16 bits at its end (wider from ~104k)")
    p.add_argument("--dscale", nargs="+", type=int, default=[2],
                   help="the CLIP kernel's DSCALE: 2 sums d scale (the op's where the forward takes no weighted "
                        "sums), 1 writes the forward's")
    p.add_argument("--siglip", action="store_true",
                   help="also the SigLIP gradient block with its pair losses, Triton and Gluon")
    p.add_argument("--tiles", nargs="+", default=[",".join(map(str, gluon_kernels.GRAD_TILES))],
                   help="BLOCK_M,BLOCK_N,BLOCK_K,STAGES of the Gluon kernels (CLIP, and SigLIP with --siglip)")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, the Triton kernel's tiles {tri._TMA_GRAD}, "
          f"the Gluon kernel's {gluon_kernels.GRAD_TILES}")
    tile_specs = [tuple(int(v) for v in spec.split(",")) for spec in args.tiles]
    for size in [int(x) for x in args.sizes.split(",") if x]:
        blk = FirstBlock(size, args.dim, cast=args.cast)

        def emit(label, ms):
            print(f"B={size:<7} {blk.rows}x{blk.cols} {label:<34} {ms:7.3f} ms {blk.gflop / ms:6.0f} TFLOP/s",
                  flush=True)

        want = blk.out()
        want_d = torch.zeros((), device="cuda")
        blk.triton(want, want_d)
        logits = torch.empty_like(want)
        emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(blk.a, blk.b.T, out=logits), args.reps))
        emit("triton kernel (the op's before)", graph_timed(lambda: blk.triton(want), args.reps))
        for tiles in tile_specs:
            got = torch.zeros_like(want)
            got_d = torch.zeros((), device="cuda")
            if _try(lambda: blk.gluon(got, got_d, tiles) or True) is None:  # (_try said why)
                continue
            torch.cuda.synchronize()
            print(f"B={size:<7} gluon {tiles}: P equal to the Triton kernel's: {torch.equal(got, want)}, "
                  f"d scale {got_d.item():.6e} against {want_d.item():.6e}", flush=True)
            for dscale in args.dscale:
                label = f"gluon {tiles}" + ("" if dscale == 2 else f" DSCALE {dscale}")
                emit(label, graph_timed(lambda: blk.gluon(got, tiles=tiles, dscale=dscale), args.reps))
        if args.siglip:
            siglip_rows(blk, args.reps, emit, tile_specs)


def siglip_rows(blk: FirstBlock, reps: int, emit, tiles: list) -> None:
    """The SigLIP gradient block with its pair losses on the same block (scale 10, bias -10): the
    Triton kernel, then the Gluon kernel with each of ``tiles``, P and the row sums checked against
    the Triton kernel's."""
    scale = torch.full((1,), 10.0, device="cuda")
    bias = torch.full((1,), -10.0, device="cuda")
    coef = torch.full((1,), 1.0 / blk.rows, device="cuda")
    outs = []
    for spec in [None, *tiles]:
        p, sums = blk.out(), torch.zeros(3, blk.rows, device="cuda")
        args = (scale, bias, coef, sums[1], sums[0], sums[2], 0, True)
        if spec is not None:
            call = lambda: gluon_kernels.siglip_grad_block(blk.a, blk.b, p, *args, blk.sms, spec)  # noqa: E731
        else:
            call = lambda: tri._fused(tri._siglip_grad_fused_kernel, blk.a, blk.b,  # noqa: E731
                                      "siglip_grad_loss", False, *args, True, p=p)
        call()
        torch.cuda.synchronize()
        outs.append((p, sums.clone()))
        emit(f"siglip {'triton' if spec is None else f'gluon {spec}'} (pair losses)", graph_timed(call, reps))
    (want, want_sums), *gots = outs
    for spec, (got, got_sums) in zip(tiles, gots):
        err = ((got_sums - want_sums).abs() / want_sums.abs().clamp_min(1e-30)).max().item()
        print(f"siglip gluon {spec}: P equal to the Triton kernel's: {torch.equal(got, want)}, row sums within "
              f"{err:.1e}", flush=True)

if __name__ == "__main__":
    main()
