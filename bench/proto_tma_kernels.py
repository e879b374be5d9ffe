"""Prototype (GPU, Hopper): the fused CLIP statistics and gradient kernels with TMA tensor
descriptors, one program per tile or persistent, against the op's pointer-load kernels and cuBLAS.

Question it answers: can a Triton kernel that makes the logit tile with tl.dot and reduces it in
the same program reach cuBLAS's GEMM rate at K = 768 on an H200 (the op's fused kernels run at
~290-330 TFLOP/s there, cuBLAS at ~660)? Rows: median ms and TFLOP/s (2 R B D) per variant.

    python bench/proto_tma_kernels.py --sizes 16384,65536
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench.bench_loss_kernels import inputs, timed  # noqa: E402


@triton.jit
def _coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (tile // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % size_m
    pid_n = (tile % width) // size_m
    return pid_m, pid_n


@triton.jit
def _tile_desc(a_desc, b_desc, pid_m, pid_n, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])
        b = b_desc.load([pid_n * BLOCK_N, k0])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _stats_epilogue(x, pid_m, pid_n, M, N, scale2, row_shift, row_ref, col_shift, col_ref,
                    row_sum, row_wsum, col_sum, col_wsum, diag, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
    valid = mask_m[:, None] & mask_n[None, :] & ((offs_m[:, None] - offs_n[None, :]) != diag)
    xs = x * scale2
    p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
    tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
    tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1), mask=mask_m, sem="relaxed")
    q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
    tl.atomic_add(col_sum + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
    tl.atomic_add(col_wsum + offs_n, tl.sum(q * (x - cr[None, :]), axis=0), mask=mask_n, sem="relaxed")


@triton.jit
def stats_tma_kernel(a_desc, b_desc, M, N, D, scale_ptr, row_shift, row_ref, col_shift, col_ref,
                     row_sum, row_wsum, col_sum, col_wsum, diag, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     PROGRAMS: tl.constexpr, PERSISTENT: tl.constexpr):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
            pid_m, pid_n = _coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            x = _tile_desc(a_desc, b_desc, pid_m, pid_n, D, BLOCK_M, BLOCK_N, BLOCK_K)
            _stats_epilogue(x, pid_m, pid_n, M, N, scale2, row_shift, row_ref, col_shift, col_ref,
                            row_sum, row_wsum, col_sum, col_wsum, diag, BLOCK_M, BLOCK_N)
    else:
        pid_m, pid_n = _coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        x = _tile_desc(a_desc, b_desc, pid_m, pid_n, D, BLOCK_M, BLOCK_N, BLOCK_K)
        _stats_epilogue(x, pid_m, pid_n, M, N, scale2, row_shift, row_ref, col_shift, col_ref,
                        row_sum, row_wsum, col_sum, col_wsum, diag, BLOCK_M, BLOCK_N)


@triton.jit
def stats_ptr_t_kernel(A, Bm, stride_a, stride_b, M, N, D, scale_ptr, row_shift, row_ref,
                       col_shift, col_ref, row_sum, row_wsum, col_sum, col_wsum, diag,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):
    """Pointer loads with B read as [BLOCK_N, BLOCK_K] (K contiguous) and transposed in tl.dot."""
    pid_m, pid_n = _coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_a = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    rows_b = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    pa = A + rows_a[:, None] * stride_a + offs_k[None, :]
    pb = Bm + rows_b[:, None] * stride_b + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        acc = tl.dot(tl.load(pa), tl.load(pb).T, acc)
        pa += BLOCK_K
        pb += BLOCK_K
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    _stats_epilogue(acc, pid_m, pid_n, M, N, scale2, row_shift, row_ref, col_shift, col_ref,
                    row_sum, row_wsum, col_sum, col_wsum, diag, BLOCK_M, BLOCK_N)


@triton.jit
def grad_tma_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, coef_ptr, row_lse, col_lse,
                    row_ref, diag, diag_value, P, stride_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr,
                    PERSISTENT: tl.constexpr, TMA_STORE: tl.constexpr):
    scale = tl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = tl.load(coef_ptr)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    start = tl.program_id(0)
    step = PROGRAMS if PERSISTENT else tiles
    for tile in tl.range(start, tiles, step, flatten=True):
        pid_m, pid_n = _coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        x = _tile_desc(a_desc, b_desc, pid_m, pid_n, D, BLOCK_M, BLOCK_N, BLOCK_K)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        r2 = tl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        c2 = tl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
        pos = (offs_m[:, None] - offs_n[None, :]) == diag
        t2 = tl.where(pos, rr[:, None], x) * scale2
        p = tl.exp2(t2 - r2[:, None]) + tl.exp2(t2 - c2[None, :])
        p = (p - tl.where(pos, diag_value, 0.0)) * coef
        if TMA_STORE:
            p_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], p.to(p_desc.dtype))
        else:
            tl.store(P + offs_m[:, None].to(tl.int64) * stride_p + offs_n[None, :],
                     p.to(P.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr):
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        x = _tile_desc(a_desc, b_desc, pid_m, pid_n, D, BLOCK_M, BLOCK_N, BLOCK_K)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], x.to(c_desc.dtype))


CONFIGS = [  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages
    (128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 3),
    (128, 128, 128, 8, 8, 2), (128, 128, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4),
    (256, 128, 64, 8, 8, 3),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16384,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    d = args.dim
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)

    def emit(b, what, cfg, fn, flop):
        try:
            ms = timed(fn, args.reps)
            took = f"{ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s"
        except Exception as exc:
            ms, took = None, f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        print(f"B={b:<7} {what:<24} {str(cfg or ''):<28} {took}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(dict(B=b, what=what, tiles=cfg, ms=ms)) + "\n")

    for b in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, ref, sums = inputs(b, d)
        flops = 2 * b * b * d
        s_full = torch.empty(b, b, device="cuda", dtype=torch.bfloat16)
        emit(b, "cublas_logits", None, lambda: torch.mm(img, txt.T, out=s_full), flops)
        emit(b, "op_unfused_stats", None, lambda: (
            sums.zero_(), setattr(tri, "_FUSED_MAX_LOGITS", 0),
            tri.clip_stats_triton(img, txt, scale, row_shift, col_shift, ref, ref, 0, out=sums)), flops)
        srow, swrow, scol, swcol = sums.view(4, b).unbind(0)
        scale1 = scale.reshape(1)
        for cfg in CONFIGS:
            bm, bn, bk, gm, w, st = cfg
            a_desc = TensorDescriptor.from_tensor(img, [bm, bk])
            b_desc = TensorDescriptor.from_tensor(txt, [bn, bk])
            tiles = triton.cdiv(b, bm) * triton.cdiv(b, bn)
            for progs, pers in ((tiles, False), (sms, True), (2 * sms, True)):
                def run(progs=progs, pers=pers):
                    stats_tma_kernel[(min(progs, tiles),)](
                        a_desc, b_desc, b, b, d, scale1, row_shift, ref, col_shift, ref, srow, swrow,
                        scol, swcol, 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                        PROGRAMS=min(progs, tiles), PERSISTENT=pers, num_warps=w, num_stages=st)
                emit(b, f"stats_tma_{'p' + str(progs // sms) if pers else 'tile'}", cfg, run, flops)
            emit(b, "stats_ptr_T", cfg, lambda: stats_ptr_t_kernel[(tiles,)](
                img, txt, img.stride(0), txt.stride(0), b, b, d, scale1, row_shift, ref, col_shift,
                ref, srow, swrow, scol, swcol, 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                num_warps=w, num_stages=st), flops)
            emit(b, "stats_op_fused", cfg, lambda: (
                setattr(tri, "_FUSED_MAX_LOGITS", 1 << 62), setattr(tri, "_FUSED_STATS", cfg),
                tri.clip_stats_triton(img, txt, scale, row_shift, col_shift, ref, ref, 0, out=sums)), flops)
            c_desc = TensorDescriptor.from_tensor(s_full, [bm, bn])
            emit(b, "matmul_tma_p1", cfg, lambda: matmul_tma_kernel[(min(sms, tiles),)](
                a_desc, b_desc, c_desc, b, b, d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                PROGRAMS=min(sms, tiles), num_warps=w, num_stages=st), flops)
            lse = row_shift + 1.0
            coef = torch.full((1,), 1e-4, device="cuda")
            p_desc = TensorDescriptor.from_tensor(s_full, [bm, bn])
            for pers, store in ((False, False), (True, False), (True, True)):
                progs = sms if pers else tiles
                emit(b, f"grad_tma{'_p1' if pers else '_tile'}{'_tmastore' if store else ''}", cfg,
                     lambda pers=pers, store=store, progs=progs: grad_tma_kernel[(min(progs, tiles),)](
                         a_desc, b_desc, p_desc, b, b, d, scale1, coef, lse, lse, ref, 0, 2.0, s_full, s_full.stride(0),
                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, PROGRAMS=min(progs, tiles),
                         PERSISTENT=pers, TMA_STORE=store,
                         num_warps=w, num_stages=st), flops)
        del s_full
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
