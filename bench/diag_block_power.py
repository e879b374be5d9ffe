"""Whether the CLIP gradient block is bound by the GPU's power: each kernel replayed for a few
seconds (a CUDA graph of ten calls, over and over) while nvidia-smi samples the SM clock and the
board's power, one process on one GPU. A kernel that runs at a lower SM clock than cuBLAS's GEMM
of the same logits, at the power cap, pays for its epilogue in energy, not in issue slots.

    python bench/diag_block_power.py --sizes 32768,65536 --seconds 4

bench/device/h200_er.sh and h200_es.sh ran it with working copies of a 64 x 256 kernel (commit
a8edf12, bench/diag_gluon_wide.py; then in ops/gluon_kernels.py, its tiles 64,256,64,4,64).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import gluon_kernels as glk  # noqa: E402
from bench_contrastive_loss import captured  # noqa: E402
from diag_gluon_grad import FirstBlock  # noqa: E402


def sampled(fn, seconds: float, calls: int = 10) -> dict:
    """Replays a graph of ``calls`` fn() for ``seconds``; ms a call and nvidia-smi's medians."""
    graph = captured(fn, calls)
    for _ in range(20):  # warm: clocks settle
        graph.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "-i", str(torch.cuda.current_device()), "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    replays = 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            graph.replay()
        replays += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines()]
    rows = [r for r in rows if len(r) == 3][2:]  # the first samples may predate the load
    clock = statistics.median(float(r[0]) for r in rows)
    power = statistics.median(float(r[1]) for r in rows)
    temp = statistics.median(float(r[2]) for r in rows)
    return dict(ms=start.elapsed_time(end) / (replays * calls), clock=clock, power=power, temp=temp,
                samples=len(rows))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--tiles", nargs="*", default=[],
                   help="more tiles of the Gluon kernel: BLOCK_M,BLOCK_N,BLOCK_K,STAGES")
    p.add_argument("--square", type=int, default=8192,
                   help="also cuBLAS's n x n x n bf16 GEMM, the bench's roofline rate, sustained (0: not)")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}")
    if args.square:
        n = args.square
        x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        z = torch.empty_like(x)
        r = sampled(lambda: torch.mm(x, y, out=z), args.seconds)
        print(f"square {n}^3 cuBLAS GEMM sustained: {r['ms']:.4f} ms {2 * n**3 / r['ms'] / 1e9:5.0f} TFLOP/s "
              f"SM {r['clock']:.0f} MHz {r['power']:.0f} W", flush=True)
        del x, y, z
    for size in [int(x) for x in args.sizes.split(",") if x]:
        blk = FirstBlock(size, args.dim)
        rows, cols, gflop = blk.rows, blk.cols, blk.gflop
        out = blk.out()
        kernels = {"cublas_gemm_bf16": lambda: torch.mm(blk.a, blk.b.T, out=out),
                   f"op's gluon {glk.GRAD_TILES}": lambda: blk.gluon(out)}
        for spec in args.tiles:
            tiles = tuple(int(v) for v in spec.split(","))
            kernels[f"gluon {tiles}"] = lambda tiles=tiles: blk.gluon(out, tiles=tiles)
        for rnd in range(2):
            for label, fn in kernels.items():
                r = sampled(fn, args.seconds)
                print(f"B={size:<7} {rows}x{cols} {label:<34} {r['ms']:.4f} ms {gflop / r['ms']:5.0f} TFLOP/s "
                      f"SM {r['clock']:.0f} MHz {r['power']:.0f} W {r['temp']:.0f} C ({r['samples']} samples)",
                      flush=True)


if __name__ == "__main__":
    main()
