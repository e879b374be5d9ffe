"""How much of the CLIP forward's strip statistics is the second exponential: a copy of the op's
_clip_sums_strip_kernel (same tiles, same loops) whose column term is computed five ways, timed
in one process on a CUDA GPU over the whole B x B, each checked against the copy of the op's:

  two_exp    p = 2^(x' - r_i), q = 2^(x' - c_j)                  (the op's kernel)
  row_factor p as above, q_acc += p 2^(r_i - K); the column sums times 2^(K - c_j) at the end
             (K: the column block's largest shift, so no term grows past the op's own q)
  outer      p as above, q = p (2^(r_i - K) 2^(K - c_j))          (one multiply more an element)
  no_q_exp   p as above, q = x'                                    (a bound: one exponential)
  no_exp     p = q = x'                                            (a bound: the GEMM and sums)

    python bench/diag_one_exp.py --sizes 32768,65536 --scales 14.3,100
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench_loss_kernels import timed  # noqa: E402
from infclip.ops.contrastive_loss import SHIFT_MARGIN  # noqa: E402

MODES = {"two_exp": 0, "row_factor": 1, "outer": 2, "no_q_exp": 3, "no_exp": 4}
ORDERS = int(os.environ.get("DIAG_ORDERS", "1"))  # 2: each mode also with items by column block


@triton.jit
def _variant_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, k2, offs_n, mask_n, diag, pid_n,
                   lo, hi, q_acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, MASKED: tl.constexpr, MODE: tl.constexpr):
    for pid_m in range(lo, hi):
        x = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            a = A.load([pid_m * BLOCK_M, k0])
            b = Bm.load([pid_n * BLOCK_N, k0])
            x = tl.dot(a, b.T, x)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        xs = x * scale2
        rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        if MODE == 4:
            p = xs
        else:
            p = tl.exp2(xs - rs2[:, None])
        if MODE == 0:
            q = tl.exp2(xs - cs2[None, :])
        elif MODE == 1:
            q = p * tl.exp2(rs2 - k2)[:, None]
        elif MODE == 2:
            q = p * (tl.exp2(rs2 - k2)[:, None] * tl.exp2(k2 - cs2)[None, :])
        else:
            q = xs
        if MASKED:
            valid = mask_m[:, None] & mask_n[None, :] & ((offs_m[:, None] - offs_n[None, :]) != diag)
            p = tl.where(valid, p, 0.0)
            q = tl.where(valid, q, 0.0)
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
        else:
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), sem="relaxed")
        q_acc += q
    return q_acc


@triton.jit
def _variant_kernel(A, Bm, M, N, D, scale_ptr, row_shift, col_shift, row_sum, col_sum, diag,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    CHUNK: tl.constexpr, PROGRAMS: tl.constexpr, MODE: tl.constexpr,
                    ORDER: tl.constexpr = 0):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    full_m = M // BLOCK_M
    for item in tl.range(tl.program_id(0), tl.cdiv(grid_m, CHUNK) * grid_n, PROGRAMS):
        if ORDER == 1:  # an item's neighbours (the other programs' items) share its column block
            pid_n = item // tl.cdiv(grid_m, CHUNK)
            lo = (item % tl.cdiv(grid_m, CHUNK)) * CHUNK
        else:
            pid_n = item % grid_n
            lo = (item // grid_n) * CHUNK
        hi = tl.minimum(lo + CHUNK, grid_m)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=-float("inf")) * 1.4426950408889634
        k2 = tl.max(cs2, axis=0)
        cs2 = tl.where(mask_n, cs2, 0.0)
        top = tl.maximum(tl.minimum(hi, full_m), lo)
        first = n0 + diag
        last = first + BLOCK_N - 1
        d0 = tl.minimum(tl.maximum(tl.maximum(first, 0) // BLOCK_M, lo), top)
        d1 = tl.where(last < 0, d0, tl.minimum(tl.maximum(last // BLOCK_M + 1, d0), top))
        if n0 + BLOCK_N > N:
            d0 = lo
            d1 = top
        q_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        q_acc = _variant_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, k2, offs_n, mask_n,
                               diag, pid_n, lo, d0, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, False, MODE)
        q_acc = _variant_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, k2, offs_n, mask_n,
                               diag, pid_n, d0, d1, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, True, MODE)
        q_acc = _variant_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, k2, offs_n, mask_n,
                               diag, pid_n, d1, top, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, False, MODE)
        q_acc = _variant_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, k2, offs_n, mask_n,
                               diag, pid_n, top, hi, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, True, MODE)
        col = tl.sum(q_acc, axis=0)
        if MODE == 1:
            col = col * tl.exp2(k2 - cs2)
        tl.atomic_add(col_sum + offs_n, col, mask=mask_n, sem="relaxed")


def run_variant(mode: int, img, txt, scale, row_shift, col_shift, row_sum, col_sum, tiles=None, order=0):
    (m, d), n = img.shape, txt.shape[0]
    tiles = tiles or tri._TMA_STRIPS
    grid, meta = tri._strips_config(tiles, m, n, False, False, tri._sm_count(img.device))
    meta = {k: v for k, v in meta.items() if k != "PRECISION"}  # (the dict is cached: no pop)
    da = tri.TensorDescriptor.from_tensor(img, [meta["BLOCK_M"], meta["BLOCK_K"]])
    db = tri.TensorDescriptor.from_tensor(txt, [meta["BLOCK_N"], meta["BLOCK_K"]])
    _variant_kernel[grid](da, db, m, n, d, scale, row_shift, col_shift, row_sum, col_sum, 0,
                          MODE=mode, ORDER=order, **meta)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--scales", default="14.3,100")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--modes", default=",".join(MODES), help="which of " + ", ".join(MODES))
    args = p.parse_args(argv)
    modes = {name: MODES[name] for name in args.modes.split(",")}
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}, tiles {tri._TMA_STRIPS}")
    for b in [int(s) for s in args.sizes.split(",")]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        img = F.normalize(torch.randn(b, args.dim, device="cuda", generator=gen), dim=-1).bfloat16()
        txt = F.normalize(img.float() + 0.5 * torch.randn(b, args.dim, device="cuda", generator=gen),
                          dim=-1).bfloat16()
        for s in [float(x) for x in args.scales.split(",")]:
            scale = torch.full((), s, device="cuda")
            row_shift, col_shift, _, _ = tri.clip_prologue_triton(img, txt, scale, SHIFT_MARGIN)
            sums = torch.zeros(2, b, device="cuda")
            tri._clip_sums_strips(img, txt, scale, row_shift, col_shift, sums[0], sums[1], 0, False)
            ref = sums.clone()
            op_ms = timed(lambda: tri._clip_sums_strips(img, txt, scale, row_shift, col_shift, sums[0],
                                                         sums[1], 0, False), args.reps)
            print(f"B={b} scale={s} op_kernel {op_ms:.3f} ms", flush=True)
            for (name, mode), order in [(m, o) for m in modes.items() for o in range(ORDERS)]:
                sums.zero_()
                run_variant(mode, img, txt, scale, row_shift, col_shift, sums[0], sums[1], order=order)
                err = ((sums - ref).abs() / ref.abs().clamp_min(1e-30)).amax(dim=1).tolist()
                ms = timed(lambda: run_variant(mode, img, txt, scale, row_shift, col_shift, sums[0],
                                               sums[1], order=order), args.reps)
                print(f"B={b} scale={s} {name:10s} order {order} {ms:.3f} ms  x op {ms / op_ms:.3f}  "
                      f"max rel err rows {err[0]:.2e} cols {err[1]:.2e}", flush=True)


if __name__ == "__main__":
    main()
