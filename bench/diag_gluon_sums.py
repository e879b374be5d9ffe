"""The CLIP forward's column-strip sums by the warp-specialised Gluon kernel
(gluon_kernels.clip_sums) against the op's Triton strip kernel (_clip_sums_strip_kernel) and
cuBLAS's GEMM of the same logits, over the whole B x B at each B, in one process on a Hopper GPU:
the row and column sums checked against the Triton kernel's, then GPU time (ten calls replayed as
one CUDA graph: the launches' host time left out).

    python bench/diag_gluon_sums.py --sizes 32768,65536 --tiles 64,128,64,8,64 64,128,64,6,32
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from infclip.ops import gluon_kernels  # noqa: E402
from bench_loss_kernels import _try, inputs  # noqa: E402
from diag_gluon_grad import graph_timed  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--diag", type=int, default=0, help="the positives' offset i - j")
    p.add_argument("--tiles", nargs="+", default=[",".join(map(str, gluon_kernels.SUMS_TILES))],
                   help="BLOCK_M,BLOCK_N,BLOCK_K,STAGES,CHUNK of the Gluon kernel")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, the Triton strip kernel's tiles {tri._TMA_STRIPS}, "
          f"the Gluon kernel's {gluon_kernels.SUMS_TILES}")
    for size in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, _ref, _sums = inputs(size, args.dim)
        scale_t = scale.reshape(1)
        sms = tri._sm_count(img.device)
        gflop = 2 * size * size * args.dim / 1e9

        def emit(label, ms):
            print(f"B={size:<7} {label:<36} {ms:7.3f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        def sums_by(fn):
            rows, cols = torch.zeros(size, device="cuda"), torch.zeros(size, device="cuda")
            fn(rows, cols)
            return rows, cols

        def triton(rows, cols):
            with_gluon, tri._GLUON_SUMS = tri._GLUON_SUMS, dict(tri._GLUON_SUMS, on=False)
            try:
                tri._clip_sums_strips(img, txt, scale_t, row_shift, col_shift, rows, cols, args.diag, False)
            finally:
                tri._GLUON_SUMS = with_gluon

        want = sums_by(triton)
        if size <= 65536:
            logits = torch.empty(size, size, device="cuda", dtype=img.dtype)
            emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(img, txt.T, out=logits), args.reps))
            del logits
        scratch = torch.zeros(size, device="cuda"), torch.zeros(size, device="cuda")
        emit("triton strip kernel (the op's before)", graph_timed(lambda: triton(*scratch), args.reps))
        for spec in args.tiles:
            tiles = tuple(int(v) for v in spec.split(","))

            def gluon(rows, cols, tiles=tiles):
                gluon_kernels.clip_sums(img, txt, scale_t, row_shift, col_shift, rows, cols, args.diag, sms,
                                        tiles)

            got = _try(lambda: sums_by(gluon))
            if got is None:  # (_try said why)
                continue
            err = [((g - w).abs() / w.abs().clamp_min(1e-30)).max().item() for g, w in zip(got, want)]
            print(f"B={size:<7} gluon {tiles}: largest relative difference to the Triton kernel's sums: "
                  f"rows {err[0]:.2e}, columns {err[1]:.2e}", flush=True)
            emit(f"gluon {tiles}", graph_timed(lambda: gluon(*scratch), args.reps))


if __name__ == "__main__":
    main()
