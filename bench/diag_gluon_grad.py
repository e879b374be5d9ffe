"""The warp-specialised Gluon CLIP gradient kernel (ops/gluon_kernels.py) against the op's Triton
kernel (_clip_grad_fused_kernel) and cuBLAS's GEMM of the same logits, on the backward's first
block at each B, in one process on a Hopper GPU: P and d scale checked against the Triton
kernel's, then GPU time (ten calls replayed as one CUDA graph: the launches' host time left out).

    python bench/diag_gluon_grad.py --sizes 32768,65536 --tiles 64,128,64,6 64,128,128,4

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
from bench_loss_kernels import _try, inputs  # noqa: E402


def graph_timed(fn, reps: int, calls: int = 10) -> float:
    """Median GPU ms of one fn() over ``reps`` replays of a CUDA graph of ``calls`` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
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
    p.add_argument("--tiles", nargs="+", default=[",".join(map(str, gluon_kernels.GRAD_TILES))],
                   help="BLOCK_M,BLOCK_N,BLOCK_K,STAGES of the Gluon kernel")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, the Triton kernel's tiles {tri._TMA_GRAD}, "
          f"the Gluon kernel's {gluon_kernels.GRAD_TILES}")
    for size in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, ref, _ = inputs(size, args.dim)
        rows, cols = tri._grad_block(size, size, args.dim, 0, img.element_size())
        a, b = img[:rows], txt[:cols]
        lse = row_shift + 1.0
        s1 = scale.reshape(1)
        one = torch.ones(1, device="cuda")
        scratch = torch.zeros((), device="cuda")  # d scale of the timed calls
        gflop = 2 * rows * cols * args.dim / 1e9
        kernel_args = (s1, one, 1.0, one)
        vectors = (lse[:rows], lse[:cols], ref[:rows], lse[:cols], 0, 2.0, 0.0)

        def emit(label, ms):
            print(f"B={size:<7} {rows}x{cols} {label:<34} {ms:7.3f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        def triton_block(out, dst):
            tri._fused(tri._clip_grad_fused_kernel, a, b, "grad", False, *kernel_args, dst, *vectors, True, 2,
                       p=out)

        def gluon_block(out, dst, tiles):
            gluon_kernels.clip_grad_block(a, b, out, *kernel_args, dst, *vectors, True, 2,
                                          tri._sm_count(a.device), tiles)

        want = torch.empty(rows, cols, device="cuda", dtype=img.dtype)
        want_d = torch.zeros((), device="cuda")
        triton_block(want, want_d)
        logits = torch.empty_like(want)
        emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(a, b.T, out=logits), args.reps))
        emit("triton kernel (the op's before)", graph_timed(lambda: triton_block(want, scratch), args.reps))
        for spec in args.tiles:
            tiles = tuple(int(v) for v in spec.split(","))
            got = torch.zeros_like(want)
            got_d = torch.zeros((), device="cuda")
            if _try(lambda: gluon_block(got, got_d, tiles) or True) is None:  # (_try said why)
                continue
            torch.cuda.synchronize()
            print(f"B={size:<7} gluon {tiles}: P equal to the Triton kernel's: {torch.equal(got, want)}, "
                  f"d scale {got_d.item():.6e} against {want_d.item():.6e}", flush=True)
            emit(f"gluon {tiles}", graph_timed(lambda: gluon_block(got, scratch, tiles), args.reps))


if __name__ == "__main__":
    main()
