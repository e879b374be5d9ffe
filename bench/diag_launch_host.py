"""Host microseconds of one launch of the op's Gluon CLIP gradient kernel, by part: the whole
``clip_grad_block`` call (TMA descriptors cached, as in the op's backward), Triton's argument
binding and cache lookup alone (``run(..., warmup=True)``: no launch), and the compiled kernel's
launcher called directly with the bound arguments (what a launch costs once the binding is
known). One process on a Hopper GPU; the GPU is kept busy behind the launches so none waits.

    python bench/diag_launch_host.py --b 32768 --launches 64 --reps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import gluon_kernels as glk  # noqa: E402
from diag_gluon_grad import FirstBlock  # noqa: E402
from gpu_queue import queue_gpu_work  # noqa: E402


def host_us(fn, launches: int, reps: int) -> float:
    """Median host microseconds of one fn() over ``reps`` bursts of ``launches`` calls, each burst
    behind enough queued GPU work that no call waits on the GPU."""
    per = []
    for _ in range(reps):
        torch.cuda.synchronize()
        queue_gpu_work(launches * 0.2, None)
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        per.append((time.perf_counter() - t0) * 1e6 / launches)
    torch.cuda.synchronize()
    return statistics.median(per)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--b", type=int, default=32768)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--launches", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    blk = FirstBlock(args.b, args.dim)
    a, b, rows, cols = blk.a, blk.b, blk.rows, blk.cols
    out = blk.out()
    sms = blk.sms
    kargs = (*blk.args, blk.scratch, *blk.vectors)
    descriptors: dict = {}
    block = lambda: blk.gluon(out, descriptors=descriptors)  # noqa: E731
    block()
    bm, bn, bk, stages = glk.GRAD_TILES
    tiles = ((a, [bm, bk]), (b, [bn, bk]), (out, [bm, bn]))  # the kernel's three TMA descriptors
    da, db, dp = (glk._descriptor(t, shape, descriptors) for t, shape in tiles)
    positional = (da, db, dp, rows, cols, args.dim, *kargs)
    consts = dict(COEF_SCALE=True, DSCALE=2, PLAIN=False, STAGES=stages, PDL=0)  # (launched without PDL)
    options = dict(num_warps=4, maxnreg=168)
    jit = glk._clip_grad_ws_kernel
    grid = (min(sms, -(-rows // bm) * -(-cols // bn)), )
    kernel = jit.run(*positional, grid=grid, warmup=True, **consts, **options)
    values = list(positional) + [consts[name] for name in jit.arg_names[len(positional):]]
    from triton.runtime.driver import driver
    stream = driver.active.get_current_stream(driver.active.get_current_device())

    def direct():
        kernel.run(grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *values)

    direct()
    mm_out = torch.empty(rows, args.dim, device="cuda", dtype=a.dtype)
    torch.cuda.synchronize()
    print(f"# {torch.cuda.get_device_name()}, B = {args.b}, block {rows} x {cols}, tiles {glk.GRAD_TILES}")
    for rnd in range(2):
        full = host_us(block, args.launches, args.reps)
        bind = host_us(lambda: jit.run(*positional, grid=grid, warmup=True, **consts, **options), args.launches,
                       args.reps)
        launch = host_us(direct, args.launches, args.reps)
        desc = host_us(lambda: [glk._descriptor(t, shape, descriptors) for t, shape in tiles], args.launches,
                       args.reps)
        addmm = host_us(lambda: torch.mm(out, b, out=mm_out), args.launches, args.reps)
        print(f"host us a launch: clip_grad_block {full:.1f}; Triton's binding + lookup (warmup=True) {bind:.1f}; "
              f"the launcher alone {launch:.1f}; the cached descriptors' lookup {desc:.1f}; torch.mm of P @ b {addmm:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
