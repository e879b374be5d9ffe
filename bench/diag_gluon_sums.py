"""The CLIP forward's column-strip sums by the warp-specialised Gluon kernel
(gluon_kernels.clip_sums) against the op's Triton strip kernel (_clip_sums_strip_kernel) and
cuBLAS's GEMM of the same logits, over the whole B x B at each B, in one process on a Hopper GPU:
the row and column sums checked against the Triton kernel's, then GPU time (ten calls replayed as
one CUDA graph: the launches' host time left out).

    python bench/diag_gluon_sums.py --sizes 32768,65536 --tiles 64,128,64,8,64 64,128,64,6,32
    python bench/diag_gluon_sums.py --sizes 262144,65536x262144 --launch-logits 0 8589934592 --rotate 0 1

A size MxN takes M rows of A against N columns of B (the rows' inputs and shifts from a batch of M, the
columns' from a batch of N).
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
    p.add_argument("--sizes", default="32768,65536", help="B, or MxN, comma-separated")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--diag", type=int, default=0, help="the positives' offset i - j")
    p.add_argument("--tiles", nargs="+", default=[",".join(map(str, gluon_kernels.SUMS_TILES))],
                   help="BLOCK_M,BLOCK_N,BLOCK_K,STAGES,CHUNK of the Gluon kernel")
    p.add_argument("--launch-logits", nargs="+", type=int, default=[gluon_kernels.SUMS_LAUNCH_LOGITS],
                   help="the most logits a launch of the Gluon kernel (launches over slabs of rows; 0: one launch)")
    p.add_argument("--rotate", nargs="+", type=int, default=[-1],
                   help="1: each program takes its items' row tiles from its own offset on, 0: in order, -1: as "
                        "the op (gluon_kernels.SUMS_ROTATE_ITEMS)")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, the Triton strip kernel's tiles {tri._TMA_STRIPS}, "
          f"the Gluon kernel's {gluon_kernels.SUMS_TILES}")
    for spec in [x for x in args.sizes.split(",") if x]:
        m, n = (int(v) for v in spec.split("x")) if "x" in spec else (int(spec),) * 2
        rows_in = inputs(m, args.dim)
        cols_in = rows_in if n == m else inputs(n, args.dim)
        img, scale, row_shift = rows_in[0], rows_in[2], rows_in[3]
        txt, col_shift = cols_in[1], cols_in[4]
        scale_t = scale.reshape(1)
        sms = tri._sm_count(img.device)
        gflop = 2 * m * n * args.dim / 1e9
        size = spec

        def emit(label, ms):
            print(f"B={size:<14} {label:<36} {ms:7.3f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        def sums_by(fn):
            rows, cols = torch.zeros(m, device="cuda"), torch.zeros(n, device="cuda")
            fn(rows, cols)
            return rows, cols

        def triton(rows, cols):
            with_gluon, tri._GLUON_SUMS = tri._GLUON_SUMS, dict(tri._GLUON_SUMS, on=False)
            try:
                tri._clip_sums_strips(img, txt, scale_t, row_shift, col_shift, rows, cols, args.diag, False)
            finally:
                tri._GLUON_SUMS = with_gluon

        want = sums_by(triton)
        if m * n <= 65536 ** 2:
            logits = torch.empty(m, n, device="cuda", dtype=img.dtype)
            emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(img, txt.T, out=logits), args.reps))
            del logits
        scratch = torch.zeros(m, device="cuda"), torch.zeros(n, device="cuda")
        emit("triton strip kernel (the op's before)", graph_timed(lambda: triton(*scratch), args.reps))
        for tiles in [tuple(int(v) for v in t.split(",")) for t in args.tiles]:
            for most, rotate in [(x, r) for x in args.launch_logits for r in args.rotate]:

                def gluon(rows, cols, tiles=tiles, most=most, rotate=rotate):
                    gluon_kernels.clip_sums(img, txt, scale_t, row_shift, col_shift, rows, cols, args.diag, sms,
                                            tiles, launch_logits=most, rotate=None if rotate < 0 else bool(rotate))

                got = _try(lambda: sums_by(gluon))
                if got is None:  # (_try said why)
                    continue
                err = [((g - w).abs() / w.abs().clamp_min(1e-30)).max().item() for g, w in zip(got, want)]
                launches = f"launch<=2^{most.bit_length() - 1}" if most else "one launch"
                label = f"gluon {tiles} {launches}{['', ' rotated', ' (rotated as the op)'][rotate]}"
                print(f"B={size:<14} {label}: largest relative difference to the Triton kernel's sums: "
                      f"rows {err[0]:.2e}, columns {err[1]:.2e}", flush=True)
                emit(label, graph_timed(lambda: gluon(*scratch), args.reps))


if __name__ == "__main__":
    main()
