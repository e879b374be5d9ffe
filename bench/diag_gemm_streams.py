"""The backward's two gradient GEMMs a block (grad_a rows += P @ b_block, grad_b rows += P^T @ a_band,
bf16 into fp32 sums), one after the other as the op runs them or the second on a side stream beside
the first, alone and after the block's Gluon kernel, on the op's block shape at each B, in one
process on a Hopper GPU (ten calls replayed as one CUDA graph, median of ``--reps``).

Why: at B = 32,768 the 128 GEMMs of the backward take 4.87 ms (~675 TFLOP/s, h200_ie): each has
an output of only 4,096 x 768, too few tiles to fill 132 SMs in whole waves; the two of a block are
independent and together would. Measured (h200_ig, bench/results/gemm_streams_*_ig_h200.log): block +
pair 0.1286 against 0.1322 ms at 32k, no gain at 65k-262k; in the op, queued, 11.30 against 11.38 ms at
32k (h200_ih): not kept (docs/benchmark_history.md, eighteenth session).

    python bench/diag_gemm_streams.py --sizes 32768,65536,131072
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from diag_gluon_grad import FirstBlock, graph_timed  # noqa: E402


def pair(blk: FirstBlock, p, acc_a, acc_b, side: "torch.cuda.Stream | None"):
    """The block's two GEMMs: in order on the current stream, or the second on ``side``."""
    def run():
        if side is None:
            tri._addmm_(acc_a, p, blk.b)
            tri._addmm_(acc_b, p.T, blk.a)
            return
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        tri._addmm_(acc_a, p, blk.b)
        with torch.cuda.stream(side):
            tri._addmm_(acc_b, p.T, blk.a)
        main.wait_stream(side)
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32768,65536,131072")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--blas", default="", help="torch.backends.cuda.preferred_blas_library for the run")
    args = ap.parse_args(argv)
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    print(f"# {torch.cuda.get_device_name()}, BLAS {torch.backends.cuda.preferred_blas_library()}")
    side = torch.cuda.Stream()
    for size in [int(x) for x in args.sizes.split(",") if x]:
        blk = FirstBlock(size, args.dim, cast=True)
        rows, cols = blk.rows, blk.cols
        p = blk.out()
        blk.gluon(p)
        acc_a = torch.zeros(rows, args.dim, device="cuda")
        acc_b = torch.zeros(cols, args.dim, device="cuda")
        gemm = 2 * rows * cols * args.dim / 1e9

        def emit(label, ms, gflop):
            print(f"B={size:<7} {rows}x{cols} {label:<40} {ms:7.4f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        emit("gemm grad_a += P b", graph_timed(lambda: tri._addmm_(acc_a, p, blk.b), args.reps), gemm)
        emit("gemm grad_b += P^T a", graph_timed(lambda: tri._addmm_(acc_b, p.T, blk.a), args.reps), gemm)
        emit("gemm pair, one stream", graph_timed(pair(blk, p, acc_a, acc_b, None), args.reps), 2 * gemm)
        emit("gemm pair, two streams", graph_timed(pair(blk, p, acc_a, acc_b, side), args.reps), 2 * gemm)
        emit("gluon block", graph_timed(lambda: blk.gluon(p), args.reps), gemm)
        for label, stream in (("block + pair, one stream", None), ("block + pair, two streams", side)):
            run = pair(blk, p, acc_a, acc_b, stream)
            emit(label, graph_timed(lambda: (blk.gluon(p), run()), args.reps), 3 * gemm)
        def sums(stream):
            """(grad_a, grad_b) rows of one call of the pair from zero (fp32 sums of the same products)."""
            acc_a.zero_(), acc_b.zero_()
            pair(blk, p, acc_a, acc_b, stream)()
            torch.cuda.synchronize()
            return acc_a.clone(), acc_b.clone()

        same = all(torch.equal(x, y) for x, y in zip(sums(None), sums(side)))
        print(f"B={size:<7} two streams equal to one: {same}")


if __name__ == "__main__":
    main()
