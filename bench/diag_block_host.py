"""Host microseconds per gradient block of the CLIP backward at B = 32,768 (64 blocks of 4,096 x
4,096 a call; h200_ej: the eager call's host needs 9.2 ms to issue against a 13.4 ms GPU span) and
of each of its parts, issued behind a long queued sleep so that no launch waits for the GPU: the
slices, the three TMA descriptors, the Gluon launch, the two cuBLAS GEMMs, and the whole block
as clip_grads_triton issues it.

    python bench/diag_block_host.py --reps 200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss_triton as tri  # noqa: E402
from infclip.ops import gluon_kernels  # noqa: E402


def per_call_us(fn, reps: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of queued GPU work: launches below never wait
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    us = (time.perf_counter() - t0) / reps * 1e6
    torch.cuda.synchronize()
    return us


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--b", type=int, default=32768)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    b, d, blk = args.b, args.dim, 4096
    a = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
    t = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
    buf = torch.empty(blk * blk, device="cuda", dtype=torch.bfloat16)
    acc_a = torch.zeros(blk, d, device="cuda", dtype=torch.float32)
    acc_b = torch.zeros(b, d, device="cuda", dtype=torch.float32)
    r = torch.zeros(b, device="cuda")
    scale, coef = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
    dst = torch.zeros((), device="cuda")
    r0, r1, c0, c1 = blk, 2 * blk, 3 * blk, 4 * blk
    pv = buf[: blk * blk].view(blk, blk)
    args_k = (scale, coef, 1.0, scale, dst, r[r0:r1], r[c0:c1], r[r0:r1], r[c0:c1], -r0 + c0, 0.0, 0.0)
    bm, bn, bk, _ = gluon_kernels.GRAD_TILES
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    launch = lambda: gluon_kernels.clip_grad_block(a[r0:r1], t[c0:c1], pv, *args_k, True, 2, sms)
    launch()  # compiled here
    parts = {
        "slices (a, b, P view, 4 vectors)": lambda: (a[r0:r1], t[c0:c1], buf[: blk * blk].view(blk, blk),
                                                    r[r0:r1], r[c0:c1], r[r0:r1], r[c0:c1]),
        "three TMA descriptors": lambda: (
            gluon_kernels.TensorDescriptor.from_tensor(a[r0:r1], [bm, bk], gluon_kernels._layout(bm, bk, a.dtype)),
            gluon_kernels.TensorDescriptor.from_tensor(t[c0:c1], [bn, bk], gluon_kernels._layout(bn, bk, a.dtype)),
            gluon_kernels.TensorDescriptor.from_tensor(pv, [bm, bn], gluon_kernels._layout(bm, bn, a.dtype))),
        "checks (_use_tma, _tma_rows, capability)": lambda: (tri._use_tma(a[r0:r1], t[c0:c1]) and tri._tma_rows(pv)
                                                             and tri._capability(a.device) == (9, 0)),
        "Gluon launch (clip_grad_block, descriptors included)": launch,
        "two GEMMs (addmm into fp32)": lambda: (tri._addmm_(acc_a, pv, t[c0:c1]),
                                               tri._addmm_(acc_b[c0:c1], pv.T, a[r0:r1])),
    }
    for name, fn in parts.items():
        fn()
        print(f"{name}: {per_call_us(fn, args.reps):.1f} us", flush=True)
    row_lse = torch.zeros(b, device="cuda")
    for reps in (1, 3):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)
        t0 = time.perf_counter()
        for _ in range(reps):
            tri.clip_grads_triton(a, t, scale, row_lse, row_lse, row_lse, coef=coef, dscale_summed=False)
        us = (time.perf_counter() - t0) / reps * 1e6
        torch.cuda.synchronize()
        print(f"clip_grads_triton at B = {b} ({(b // blk) ** 2} blocks): {us / 1e3:.2f} ms to issue, "
              f"{us / (b // blk) ** 2:.1f} us a block", flush=True)


if __name__ == "__main__":
    main()
