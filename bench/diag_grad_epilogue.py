"""Where the fused CLIP gradient kernel spends its time, on a Hopper GPU: the op's kernel
(_clip_grad_fused_kernel, TMA, its tiles, d scale summed: the 65k path) against a copy of it
that leaves parts of the epilogue out, over the backward's first block (_grad_block) in the same
process, each timed behind 9 others (the outputs of the cut-down copies are wrong; they only time
what is left):

  two_exp    P = coef (exp(S - r) + exp(S - c) - labels), stored (the op's, without d scale);
  one_exp    P from one exponential (exp(S - r) times a column factor; not safe in general);
  no_exp     P = coef S' (no exponential; the same stores);
  gemm_store the logit tile stored as it is (the GEMM and the store, no epilogue);
  gemm_sum   the logit tile summed per row into one fp32 vector (the GEMM alone, no store);
and cuBLAS's GEMM of the same logits into bf16, and the unfused block (that GEMM, then the op's
Triton pass over it in place). Each mode with the copy engine's stores and with pointer stores.

    python bench/diag_grad_epilogue.py --sizes 32768,65536
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench_loss_kernels import _try, inputs, timed_queued  # noqa: E402

MODES = ("two_exp", "one_exp", "no_exp", "gemm_store", "gemm_sum")


@triton.jit
def _grad_cut_kernel(A, Bm, M, N, D, P, stride_p, scale_ptr, row_lse, col_lse, row_ref, rows,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, TMA_STORE: tl.constexpr,
                     MODE: tl.constexpr, FLATTEN: tl.constexpr):
    """_clip_grad_fused_kernel with parts of the epilogue left out (MODE: the index in MODES)."""
    scale = tl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    acc_rows = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for tile in tl.range(tl.program_id(0), tri._tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS,
                         flatten=FLATTEN):
        offs_m, offs_n, mask_m, mask_n, inside, x = tri._logit_tile(
            A, Bm, 0, 0, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True, "tf32", True,
            False)
        if MODE == 4:
            acc_rows += tl.sum(x, axis=1)
        else:
            if MODE == 3:
                p = x
            elif MODE == 2:
                p = x * scale
            else:
                r2 = tl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
                c2 = tl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
                rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
                pos = (offs_m[:, None] - offs_n[None, :]) == 0
                t2 = tl.where(pos, rr[:, None], x) * scale2
                e_r = tl.exp2(t2 - r2[:, None])
                if MODE == 1:
                    e_c = e_r * tl.exp2(r2 - 40.0)[:, None] * tl.exp2(40.0 - c2)[None, :]
                else:
                    e_c = tl.exp2(t2 - c2[None, :])
                p = (e_r + e_c - (tl.where(pos, 2.0, 0.0) + 0.001)) * scale
            if TMA_STORE:
                pid_m, pid_n = tri._tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
                P.store([pid_m * BLOCK_M, pid_n * BLOCK_N], p.to(P.dtype))
            else:
                tri._store_tile(P, stride_p, offs_m, offs_n, inside, p)
    if MODE == 4:
        tl.store(rows + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M), acc_rows)


def cut_block(a, b, p, scale, lse, ref, mode: int, tma_store: bool, flatten: bool, tiles) -> None:
    (m, d), n = a.shape, b.shape[0]
    bm, bn, bk, group, warps, stages, per_sm = tiles[:7]
    count = tri._cdiv(m, bm) * tri._cdiv(n, bn)
    grid = min(count, per_sm * tri._sm_count(a.device))
    da = TensorDescriptor.from_tensor(a, [bm, bk])
    db = TensorDescriptor.from_tensor(b, [bn, bk])
    dp = TensorDescriptor.from_tensor(p, [bm, bn]) if tma_store else p
    rows = torch.empty(grid * bm, device=a.device)
    _grad_cut_kernel[(grid,)](da, db, m, n, d, dp, p.stride(0), scale, lse[:m], lse[:n], ref[:m], rows,
                              BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PROGRAMS=grid,
                              TMA_STORE=tma_store, MODE=mode, FLATTEN=flatten, num_warps=warps,
                              num_stages=stages)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--tiles", nargs="*", default=[], help="more tiles (_TMA_GRAD's first 7 entries)")
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, the op's grad tiles {tri._TMA_GRAD}")
    tiles_list = [tri._TMA_GRAD[:7]] + [tuple(int(v) for v in t.split(",")) for t in args.tiles]
    for b in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, ref, _ = inputs(b, args.dim)
        rows, cols = tri._grad_block(b, b, args.dim, 0, img.element_size())
        a, bb = img[:rows], txt[:cols]
        p = torch.empty(rows, cols, device="cuda", dtype=img.dtype)
        lse = row_shift + 1.0
        s1 = scale.reshape(1)
        one = torch.ones(1, device="cuda")
        dst = torch.zeros((), device="cuda")
        gflop = 2 * rows * cols * args.dim / 1e9

        def emit(label, ms):
            print(f"B={b:<7} {rows}x{cols} {label:<44} {ms:7.3f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        emit("cublas_gemm_bf16", timed_queued(lambda: torch.mm(a, bb.T, out=p), args.reps, 10))

        def unfused():
            torch.mm(a, bb.T, out=p)
            tri._clip_grad_kernel[tri._grad_grid(rows, cols)](
                p, p, p.stride(0), rows, cols, s1, one, 1.0, s1, s1, lse[:rows], lse[:cols], ref[:rows],
                0, 2.0, 0.0, BLOCK_M=tri._GRAD_M, BLOCK_N=tri._GRAD_N, num_warps=tri._GRAD_WARPS,
                COEF_SCALE=True, DSCALE=False)
        emit("unfused (cuBLAS + the Triton pass)", timed_queued(unfused, args.reps, 10))
        emit("op kernel DSCALE=2", timed_queued(lambda: tri._fused(
            tri._clip_grad_fused_kernel, a, bb, "grad", False, s1, one, 1.0, one, dst, lse[:rows],
            lse[:cols], ref[:rows], lse[:cols], 0, 2.0, 0.0, True, 2, p=p), args.reps, 10))
        for tiles in tiles_list:
            for flatten in (True, False):
                for mode, name in enumerate(MODES):
                    for tma_store in (True, False) if mode < 4 else (False,):
                        label = f"{name} {'tma' if tma_store else 'ptr'} flat={int(flatten)} {tiles}"
                        ms = _try(lambda: timed_queued(lambda: cut_block(
                            a, bb, p, s1, lse, ref, mode, tma_store, flatten, tiles), args.reps, 10))
                        if ms is None:  # (a tile that does not compile: _try said why)
                            print(f"B={b:<7} {label} skipped", flush=True)
                        else:
                            emit(label, ms)


if __name__ == "__main__":
    main()
