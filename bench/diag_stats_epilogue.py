"""Where the fused CLIP statistics kernel spends its time, on a Hopper GPU: the op's kernel
(_clip_stats_fused_kernel, TMA, its tiles) against copies of it that leave parts of the epilogue
out, each over the whole B x B in the same process (the outputs of the cut-down copies are
wrong; they only time what is left):

  full       the op's epilogue: two exponentials a logit, row and column sums and weighted sums;
  rows_only  the row sums only (one exponential, no column reduction across the warps);
  one_exp    both directions' sums from one exponential (q = p): the second exponential's cost;
  no_exp     both directions' sums of the scaled logits themselves: the exponentials' cost;
  gemm_only  the logit tile and one row sum of it (the GEMM with the least epilogue);
  sums_only  both directions' plain sums, no weighted sums (what is left if d scale were taken
             in the backward);
and cuBLAS's GEMM of the same logits into bf16. With --strips, a differently ordered kernel
(_stats_strip_kernel): each program walks a column block down a chunk of row blocks, reduces the
rows every tile (within a warp) but adds the column terms element-wise into registers, reducing
them across the warps once per chunk; its sums are checked against the op kernel's.

    python bench/diag_stats_epilogue.py --sizes 32768,65536
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

MODES = ("full", "rows_only", "one_exp", "no_exp", "gemm_only", "sums_only")


@triton.jit
def _stats_cut_kernel(A, Bm, stride_a, stride_b, M, N, D, scale_ptr, row_shift, row_ref,
                      col_shift, col_ref, row_sum, row_wsum, col_sum, col_wsum, diag,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                      TMA: tl.constexpr, PROGRAMS: tl.constexpr, FAST: tl.constexpr = 0,
                      MODE: tl.constexpr = 0):
    """_clip_stats_fused_kernel's interior tiles with parts of the epilogue left out (MODE: the
    index in MODES); every tile is treated as interior (no masks)."""
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    for tile in tl.range(tl.program_id(0), tri._tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=TMA):
        offs_m, offs_n, mask_m, mask_n, inside, x = tri._logit_tile(
            A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K,
            PRECISION, TMA, False)
        rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        xs = x * scale2
        if MODE == 4:
            tl.atomic_add(row_sum + offs_m, tl.sum(x, axis=1), mask=mask_m, sem="relaxed")
        else:
            if MODE == 3:
                p = xs - rs2[:, None]
                q = xs - cs2[None, :]
            else:
                p = tl.exp2(xs - rs2[:, None])
                if MODE == 2:
                    q = p
                else:
                    q = tl.exp2(xs - cs2[None, :])
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
            if MODE != 5:
                tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1),
                              mask=mask_m, sem="relaxed")
            if MODE != 1:
                tl.atomic_add(col_sum + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
            if MODE != 1 and MODE != 5:
                tl.atomic_add(col_wsum + offs_n, tl.sum(q * (x - cr[None, :]), axis=0),
                              mask=mask_n, sem="relaxed")


@triton.jit
def _stats_strip_kernel(A, Bm, M, N, D, scale_ptr, row_shift, row_ref, col_shift, col_ref,
                        row_sum, row_wsum, col_sum, col_wsum, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
                        PROGRAMS: tl.constexpr, WSUM: tl.constexpr):
    """The statistics by column strips (TMA descriptors A, Bm; B a multiple of the tiles, no
    positives skipped): work item = (chunk of CHUNK row blocks, column block), chunk-major so
    that concurrent programs share the chunk's rows in L2. Row sums: per tile; column sums (and
    with WSUM the weighted sums of both): element-wise accumulators, reduced once per item."""
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    grid_n = N // BLOCK_N
    chunks = tl.cdiv(M // BLOCK_M, CHUNK)
    for item in tl.range(tl.program_id(0), chunks * grid_n, PROGRAMS):
        pid_n = item % grid_n
        first = (item // grid_n) * CHUNK
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cs2 = tl.load(col_shift + offs_n) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n)
        q_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for pid_m in range(first, tl.minimum(first + CHUNK, M // BLOCK_M)):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, D, BLOCK_K):
                a = A.load([pid_m * BLOCK_M, k0])
                b = Bm.load([pid_n * BLOCK_N, k0])
                acc = tl.dot(a, b.T, acc)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rs2 = tl.load(row_shift + offs_m) * 1.4426950408889634
            xs = acc * scale2
            p = tl.exp2(xs - rs2[:, None])
            q = tl.exp2(xs - cs2[None, :])
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), sem="relaxed")
            if WSUM:
                rr = tl.load(row_ref + offs_m)
                tl.atomic_add(row_wsum + offs_m, tl.sum(p * (acc - rr[:, None]), axis=1),
                              sem="relaxed")
                w_acc += q * (acc - cr[None, :])
            q_acc += q
        tl.atomic_add(col_sum + offs_n, tl.sum(q_acc, axis=0), sem="relaxed")
        if WSUM:
            tl.atomic_add(col_wsum + offs_n, tl.sum(w_acc, axis=0), sem="relaxed")


def run_strips(img, txt, scale, shifts, out, tiles, chunk: int, wsum: int) -> None:
    """One _stats_strip_kernel pass; tiles = (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages,
    programs per SM)."""
    bm, bn, bk, warps, stages, per_sm = tiles
    programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    a = tri.TensorDescriptor.from_tensor(img, [bm, bk])
    b = tri.TensorDescriptor.from_tensor(txt, [bn, bk])
    _stats_strip_kernel[(programs,)](a, b, img.shape[0], txt.shape[0], img.shape[1], scale, *shifts,
                                     *out, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, CHUNK=chunk,
                                     PROGRAMS=programs, WSUM=wsum, num_warps=warps,
                                     num_stages=stages)


class _WithMode:
    """``kernel[grid](...)`` with MODE added (tri._fused launches it with the op's meta)."""

    def __init__(self, mode: int) -> None:
        self.mode = mode

    def __getitem__(self, grid):
        return lambda *args, **meta: _stats_cut_kernel[grid](*args, MODE=self.mode, **meta)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--tiles", nargs="*", default=[],
                   help="more TMA tile configs (BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,stages,"
                        "programs per SM,FAST), each timed over every mode")
    p.add_argument("--strips", nargs="*", default=[],
                   help="_stats_strip_kernel configs BLOCK_M,BLOCK_N,BLOCK_K,warps,stages,"
                        "programs per SM,CHUNK,WSUM")
    p.add_argument("--no-modes", action="store_true", help="only the op kernel and the strips")
    args = p.parse_args(argv)
    configs = [tri._TMA_STATS] + [tuple(int(v) for v in t.split(",")) for t in args.tiles]
    print(f"# {torch.cuda.get_device_name()}, the op's tiles {tri._TMA_STATS}", flush=True)
    for b in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, ref, sums = inputs(b, args.dim)
        out = sums.view(4, b).unbind(0)  # row_sum, row_wsum, col_sum, col_wsum
        flop = 2 * b * b * args.dim
        shifts = (row_shift, ref, col_shift, ref)

        def run(kernel, diag=0):
            tri._fused(kernel, img, txt, "stats", False, scale.reshape(1), *shifts, *out, diag,
                       tma=True)

        s_full = torch.empty(b, b, device="cuda", dtype=torch.bfloat16)
        ms = timed(lambda: torch.mm(img, txt.T, out=s_full), args.reps)
        print(f"B={b:<7} {'cublas_logits':<12} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s", flush=True)
        del s_full
        torch.cuda.empty_cache()
        saved = tri._TMA_STATS
        for tiles in configs:
            tri._TMA_STATS = tiles
            kernels = [("op_kernel", tri._clip_stats_fused_kernel)] + [
                (name, _WithMode(mode)) for mode, name in enumerate(MODES) if not args.no_modes]
            for name, kernel in kernels:
                try:
                    ms = timed(lambda: run(kernel), args.reps)
                except Exception as exc:  # tiles that do not fit (shared memory, registers)
                    print(f"B={b:<7} {name:<12} {tiles}: skipped, {type(exc).__name__}", flush=True)
                    continue
                print(f"B={b:<7} {name:<12} {str(tiles):<34} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s",
                      flush=True)
        tri._TMA_STATS = saved
        if args.strips:  # the op's own strip kernel
            op_strips = lambda: tri._clip_sums_strips(  # noqa: E731
                img, txt, scale.reshape(1), row_shift, col_shift, out[0], out[2], 0, False)
            ms = timed(op_strips, args.reps)
            print(f"B={b:<7} op_strips    {str(tri._TMA_STRIPS):<34} {ms:8.3f} ms "
                  f"{flop / ms / 1e9:7.1f} TFLOP/s", flush=True)
        sums.zero_()
        run(tri._clip_stats_fused_kernel, diag=b)  # no positive skipped, as in the strips
        want = [o.clone() for o in out]
        for spec in args.strips:
            *tiles, chunk, wsum = (int(v) for v in spec.split(","))
            strip = lambda: run_strips(img, txt, scale.reshape(1), shifts, out, tiles, chunk, wsum)  # noqa: E731
            try:
                ms = timed(strip, args.reps)
            except Exception as exc:
                print(f"B={b:<7} strips       {spec}: skipped, {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            sums.zero_()
            strip()
            err = [((o - w).abs().max() / w.abs().max()).item() for o, w in zip(out, want)]
            print(f"B={b:<7} strips       {spec:<34} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s "
                  f"rel.err row/rw/col/cw {err[0]:.1e} {err[1]:.1e} {err[2]:.1e} {err[3]:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
