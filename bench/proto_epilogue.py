"""Prototype: where the fused loss kernels' epilogues spend their time, and a one-exponential
epilogue (measured on a GPU before it goes into ops/contrastive_loss_triton.py).

The fused TMA kernels run at ~360-400 TFLOP/s against ~650 for a plain TMA matmul of the same
tiles. Each logit tile costs two exponentials per element (row and column direction). Both are
exp2(x - shift) with a per-row and a per-column shift, so one exponential against a per-tile
constant K, times a per-row and a per-column factor, gives both:
    2^(x - r_i) = 2^(x - K) 2^(K - r_i),   2^(x - c_j) = 2^(x - K) 2^(K - c_j).
With K = the smallest shift of the tile and the tile's shifts within SPREAD (log2 units) of it,
nothing overflows and nothing underflows that the two-exponential form keeps; tiles whose shifts
spread further take the two-exponential form (a branch uniform over the tile).

Statistics variants (MODE): 0 the op's epilogue, 1 one exponential (+ fallback), 2 no column
reductions, 3 no exponentials (cost floor of the arithmetic), 4 row sums of x only (matmul floor).
Gradient variants: 0 the op's, 1 one exponential (+ fallback), 2 store x only.

    python bench/proto_epilogue.py --sizes 16384,65536
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench_loss_kernels import inputs, timed  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _stats_variant(A, Bm, M, N, D, scale_ptr, row_shift, row_ref, col_shift, col_ref, row_sum,
                   row_wsum, col_sum, col_wsum, diag, MODE: tl.constexpr, SPREAD: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    for tile in tl.range(tl.program_id(0), tri._tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=True):
        offs_m, offs_n, mask_m, mask_n, inside, x = tri._logit_tile(
            A, Bm, 0, 0, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True, "tf32", True)
        if MODE == 4:
            tl.atomic_add(row_sum + offs_m, tl.sum(x, axis=1), mask=mask_m, sem="relaxed")
        else:
            rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
            cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
            cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
            valid = inside & ((offs_m[:, None] - offs_n[None, :]) != diag)
            if MODE == 1:
                lo = tl.minimum(tl.min(tl.where(mask_m, rs2, float("inf")), axis=0),
                                tl.min(tl.where(mask_n, cs2, float("inf")), axis=0))
                hi = tl.maximum(tl.max(tl.where(mask_m, rs2, -float("inf")), axis=0),
                                tl.max(tl.where(mask_n, cs2, -float("inf")), axis=0))
                if hi - lo <= SPREAD:
                    e = tl.where(valid, tl.exp2(x * scale2 - lo), 0.0)
                    p = e * tl.exp2(lo - rs2)[:, None]
                    q = e * tl.exp2(lo - cs2)[None, :]
                else:
                    xs = x * scale2
                    p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
                    q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
            elif MODE == 3:
                xs = x * scale2
                p = tl.where(valid, xs - rs2[:, None], 0.0)
                q = tl.where(valid, xs - cs2[None, :], 0.0)
            else:
                xs = x * scale2
                p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
                q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
            if MODE == 5:
                rsum, rwsum = tl.reduce((p, p * (x - rr[:, None])), 1, _add2)
                tl.atomic_add(row_sum + offs_m, rsum, mask=mask_m, sem="relaxed")
                tl.atomic_add(row_wsum + offs_m, rwsum, mask=mask_m, sem="relaxed")
                csum, cwsum = tl.reduce((q, q * (x - cr[None, :])), 0, _add2)
                tl.atomic_add(col_sum + offs_n, csum, mask=mask_n, sem="relaxed")
                tl.atomic_add(col_wsum + offs_n, cwsum, mask=mask_n, sem="relaxed")
            else:
                tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
                tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1), mask=mask_m,
                              sem="relaxed")
            if MODE != 2 and MODE != 5:
                tl.atomic_add(col_sum + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
                tl.atomic_add(col_wsum + offs_n, tl.sum(q * (x - cr[None, :]), axis=0),
                              mask=mask_n, sem="relaxed")


@triton.jit
def _grad_variant(A, Bm, M, N, D, P, scale_ptr, coef_ptr, row_lse, col_lse, row_ref, diag,
                  diag_value, MODE: tl.constexpr, SPREAD: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  PROGRAMS: tl.constexpr):
    scale = tl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = tl.load(coef_ptr) * scale
    for tile in tl.range(tl.program_id(0), tri._tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=True):
        offs_m, offs_n, mask_m, mask_n, inside, x = tri._logit_tile(
            A, Bm, 0, 0, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True, "tf32", True)
        if MODE == 2:
            p = x
        else:
            r2 = tl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            c2 = tl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
            rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
            pos = (offs_m[:, None] - offs_n[None, :]) == diag
            t2 = tl.where(pos, rr[:, None], x) * scale2
            if MODE == 1:
                lo = tl.minimum(tl.min(tl.where(mask_m, r2, float("inf")), axis=0),
                                tl.min(tl.where(mask_n, c2, float("inf")), axis=0))
                hi = tl.maximum(tl.max(tl.where(mask_m, r2, -float("inf")), axis=0),
                                tl.max(tl.where(mask_n, c2, -float("inf")), axis=0))
                if hi - lo <= SPREAD:
                    p = tl.exp2(t2 - lo) * (tl.exp2(lo - r2)[:, None] + tl.exp2(lo - c2)[None, :])
                else:
                    p = tl.exp2(t2 - r2[:, None]) + tl.exp2(t2 - c2[None, :])
            else:
                p = tl.exp2(t2 - r2[:, None]) + tl.exp2(t2 - c2[None, :])
            p = (p - tl.where(pos, diag_value, 0.0)) * coef
        pid_m, pid_n = tri._tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        P.store([pid_m * BLOCK_M, pid_n * BLOCK_N], p.to(P.dtype))


# Column strips: a program takes (column block, chunk of CHUNK row blocks) items and walks down
# the chunk; the column direction is summed element-wise in registers across the walk and reduced
# across warps once per item (the row direction is reduced per tile: within a warp's threads).
@triton.jit
def _stats_strips(A, Bm, M, N, D, scale_ptr, row_shift, row_ref, col_shift, col_ref, row_sum,
                  row_wsum, col_sum, col_wsum, diag, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROGRAMS: tl.constexpr):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    items = grid_n * tl.cdiv(grid_m, CHUNK)
    for item in tl.range(tl.program_id(0), items, PROGRAMS, flatten=True):
        pid_n = item % grid_n
        first_m = (item // grid_n) * CHUNK
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        cq = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        cqw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for pid_m in range(first_m, tl.minimum(first_m + CHUNK, grid_m)):
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            mask_m = offs_m < M
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, D, BLOCK_K):
                a = A.load([pid_m * BLOCK_M, k0])
                b = Bm.load([pid_n * BLOCK_N, k0])
                acc = tl.dot(a, b.T, acc)
            valid = mask_m[:, None] & mask_n[None, :] & ((offs_m[:, None] - offs_n[None, :]) != diag)
            x = tl.where(valid, acc, 0.0)
            rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
            xs = x * scale2
            p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
            tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1), mask=mask_m,
                          sem="relaxed")
            q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
            cq += q
            cqw += q * (x - cr[None, :])
        tl.atomic_add(col_sum + offs_n, tl.sum(cq, axis=0), mask=mask_n, sem="relaxed")
        tl.atomic_add(col_wsum + offs_n, tl.sum(cqw, axis=0), mask=mask_n, sem="relaxed")


def launch_strips(a, b, tiles, chunk, *args):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, _, warps, stages, per_sm = tiles
    (m, d), n = a.shape, b.shape[0]
    items = tri._cdiv(n, bn) * tri._cdiv(tri._cdiv(m, bm), chunk)
    programs = min(items, per_sm * tri._sm_count(a.device))
    da = TensorDescriptor.from_tensor(a, [bm, bk])
    db = TensorDescriptor.from_tensor(b, [bn, bk])
    _stats_strips[(programs,)](da, db, m, n, d, *args, CHUNK=chunk, BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=bk, PROGRAMS=programs, num_warps=warps, num_stages=stages)


# Column strips in one flattened loop: program p takes the contiguous range of tiles
# [p T / P, (p + 1) T / P) in column-major order; the column sums are carried element-wise while
# the column block stays the same and added (one reduction, one atomic) when it changes.
@triton.jit
def _stats_flat_strips(A, Bm, M, N, D, scale_ptr, row_shift, row_ref, col_shift, col_ref, row_sum,
                       row_wsum, col_sum, col_wsum, diag, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROGRAMS: tl.constexpr):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    grid_m = tl.cdiv(M, BLOCK_M)
    total = grid_m * tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    start = (pid * total) // PROGRAMS
    end = ((pid + 1) * total) // PROGRAMS
    cq = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    cqw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tile in tl.range(start, end, flatten=True):
        pid_n = tile // grid_m
        pid_m = tile % grid_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            a = A.load([pid_m * BLOCK_M, k0])
            b = Bm.load([pid_n * BLOCK_N, k0])
            acc = tl.dot(a, b.T, acc)
        valid = mask_m[:, None] & mask_n[None, :] & ((offs_m[:, None] - offs_n[None, :]) != diag)
        x = tl.where(valid, acc, 0.0)
        rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        xs = x * scale2
        p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
        tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
        tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1), mask=mask_m,
                      sem="relaxed")
        q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
        cq += q
        cqw += q * (x - cr[None, :])
        if (pid_m == grid_m - 1) | (tile == end - 1):
            tl.atomic_add(col_sum + offs_n, tl.sum(cq, axis=0), mask=mask_n, sem="relaxed")
            tl.atomic_add(col_wsum + offs_n, tl.sum(cqw, axis=0), mask=mask_n, sem="relaxed")
            cq = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            cqw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


def launch_flat(a, b, tiles, *args):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, _, warps, stages, per_sm = tiles
    (m, d), n = a.shape, b.shape[0]
    programs = min(tri._cdiv(n, bn) * tri._cdiv(m, bm), per_sm * tri._sm_count(a.device))
    da = TensorDescriptor.from_tensor(a, [bm, bk])
    db = TensorDescriptor.from_tensor(b, [bn, bk])
    _stats_flat_strips[(programs,)](da, db, m, n, d, *args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                    PROGRAMS=programs, num_warps=warps, num_stages=stages)


def launch(kernel, a, b, tiles, *args, p=None, **const):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, gm, warps, stages, per_sm = tiles
    (m, d), n = a.shape, b.shape[0]
    programs = min(tri._cdiv(m, bm) * tri._cdiv(n, bn), per_sm * tri._sm_count(a.device))
    da = TensorDescriptor.from_tensor(a, [bm, bk])
    db = TensorDescriptor.from_tensor(b, [bn, bk])
    extra = () if p is None else (TensorDescriptor.from_tensor(p, [bm, bn]),)
    kernel[(programs,)](da, db, m, n, d, *extra, *args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                        GROUP_M=gm, PROGRAMS=programs, num_warps=warps, num_stages=stages, **const)


CONFIGS = [(128, 64, 64, 8, 4, 4, 2), (128, 128, 64, 8, 8, 4, 1), (128, 128, 64, 8, 8, 3, 1),
           (128, 64, 64, 8, 8, 4, 2), (128, 128, 64, 8, 4, 4, 1), (64, 256, 64, 8, 8, 3, 1),
           (256, 64, 64, 8, 8, 3, 1), (256, 128, 64, 8, 8, 3, 1), (64, 128, 64, 8, 4, 4, 2)]


STRIP_CONFIGS = [(128, 64, 64, 0, 4, 4, 2), (128, 64, 64, 0, 8, 4, 2), (128, 128, 64, 0, 8, 4, 1),
                 (128, 64, 64, 0, 8, 4, 1), (64, 128, 64, 0, 4, 4, 2)]


def run(b: int, d: int, reps: int, configs, scale_value: float, modes=(0, 1, 2, 3, 4),
        grad_too: bool = True) -> None:
    img, txt, scale, row_shift, col_shift, ref, sums = inputs(b, d)
    scale.fill_(scale_value)
    row_shift, col_shift, aux, sums = tri.clip_prologue_triton(img, txt, scale, 64.0)
    ref = aux[:b]
    flop = 2 * b * b * d
    mm = torch.empty(b, b, device="cuda", dtype=torch.bfloat16) if b <= 32768 else None
    if mm is not None:
        ms = timed(lambda: torch.mm(img, txt.T, out=mm), reps)
        print(f"B={b} cublas_mm {ms:.3f} ms {flop / ms / 1e9:.0f} TFLOP/s", flush=True)
        del mm

    def stats(mode, tiles):
        sums.zero_()
        launch(_stats_variant, img, txt, tiles, scale, row_shift, ref, col_shift, ref,
               sums[:b], sums[b:2 * b], sums[2 * b:3 * b], sums[3 * b:4 * b], 0, MODE=mode, SPREAD=32.0)

    ref_sums = None
    for tiles in configs:
        for mode in modes:
            try:
                ms = timed(lambda: stats(mode, tiles), reps)
            except Exception as exc:  # noqa: BLE001
                print(f"B={b} stats mode={mode} {tiles} failed: {type(exc).__name__} {str(exc)[:100]}")
                continue
            stats(mode, tiles)
            check = ""
            if mode == 0:
                ref_sums = sums.clone()
            elif mode == 1 and ref_sums is not None:
                err = ((sums - ref_sums).abs() / ref_sums.abs().clamp_min(1e-30)).max().item()
                check = f" max rel diff vs mode 0 {err:.2e}"
            print(f"B={b} stats mode={mode} {tiles} {ms:.3f} ms {flop / ms / 1e9:.0f} TFLOP/s{check}",
                  flush=True)

    for tiles in STRIP_CONFIGS:
        for chunk in (0,):
            def strips():
                sums.zero_()
                launch_flat(img, txt, tiles, scale, row_shift, ref, col_shift, ref,
                            sums[:b], sums[b:2 * b], sums[2 * b:3 * b], sums[3 * b:4 * b], 0)
            try:
                ms = timed(strips, reps)
            except Exception as exc:  # noqa: BLE001
                print(f"B={b} strips {tiles} chunk={chunk} failed: {type(exc).__name__} {str(exc)[:100]}")
                continue
            strips()
            err = ((sums - ref_sums).abs() / ref_sums.abs().clamp_min(1e-30)).max().item()
            print(f"B={b} strips {tiles} chunk={chunk} {ms:.3f} ms {flop / ms / 1e9:.0f} TFLOP/s "
                  f"max rel diff vs mode 0 {err:.2e}", flush=True)

    if not grad_too:
        return
    band = tri.band_rows(b, b, d)
    p_band = torch.empty(band, b, device="cuda", dtype=torch.bfloat16)
    lse = row_shift + 1.0
    k = torch.full((1,), 1e-4, device="cuda")

    def grad(mode, tiles, rows):
        launch(_grad_variant, img[:rows], txt, tiles, scale.reshape(1), k, lse[:rows].contiguous(),
               lse, ref[:rows].contiguous(), 0, 2.0, p=p_band[:rows], MODE=mode, SPREAD=100.0)

    gflop = 2 * band * b * d
    for tiles in configs:
        ref_p = None
        for mode in (0, 1, 2):
            try:
                ms = timed(lambda: grad(mode, tiles, band), reps)
            except Exception as exc:  # noqa: BLE001
                print(f"B={b} grad mode={mode} {tiles} failed: {type(exc).__name__} {str(exc)[:100]}")
                continue
            grad(mode, tiles, band)
            check = ""
            if mode == 0:
                ref_p = p_band.float()
            elif mode == 1:
                err = ((p_band.float() - ref_p).abs().max() / ref_p.abs().max()).item()
                check = f" max diff / max vs mode 0 {err:.2e}"
            print(f"B={b} grad band={band} mode={mode} {tiles} {ms:.3f} ms {gflop / ms / 1e9:.0f} TFLOP/s{check}",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16384,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--scale", type=float, default=14.3)
    p.add_argument("--configs", type=int, default=len(CONFIGS))
    p.add_argument("--no_grad", action="store_true")
    p.add_argument("--modes", default="0,1,2,3,4")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    for b in map(int, args.sizes.split(",")):
        run(b, args.dim, args.reps, CONFIGS[:args.configs], args.scale,
            tuple(map(int, args.modes.split(","))), not args.no_grad)


if __name__ == "__main__":
    main()
