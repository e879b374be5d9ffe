"""Experiment: the Gluon CLIP gradient kernel with 64 x 256 tiles a consumer (one m64n256 wgmma
a chunk, the epilogue run in two 64 x 128 halves of the accumulator), against the op's Gluon
kernel (64 x 128 tiles) and cuBLAS on the backward's first block, one process on a Hopper GPU.

Why: with 64 x 128 tiles a consumer, each tile's chunks fill shared memory by TMA with as many
bytes as the wgmma then reads from it: ~576 KB a tile, ~130 B a clock at the measured MMA-only
time, at the SM's shared-memory bandwidth (128 B a clock). A 64 x 256 tile reads and fills
~17% fewer bytes per FLOP. Its accumulator takes 128 registers a thread, so the epilogue runs on
halves (split in registers, no data movement) to stay within the consumers' 232.

    python bench/diag_gluon_wide.py --sizes 32768,65536 --tiles 64,256,64,4,64 64,256,32,6,128
    python bench/diag_gluon_wide.py --resources      # registers / spills for sm_90, CPU only
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import gluon_kernels as glk  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,  # noqa: E402
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_GROUP_M = gl.constexpr(8)


@gluon.jit
def _loader(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    a_ring, b_ring, c_bufs = rings
    ready, empty, turn = bars
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_ring.type.shape[0]
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    steps = gl.cdiv(D, BK)
    count = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        off_m, off_n = glk._tile_origin(tile, M, N, BM, BN, _GROUP_M)
        for k in range(steps):
            s = count % STAGES
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [off_m, k * BK], ready.index(s), a_ring.index(s))
            _tma_load(b_desc, [off_n, k * BK], ready.index(s), b_ring.index(s))
            count += 1


@gluon.jit
def _half(acc, off_m, off_n, c_buf, p_desc, M, N, scale2, coef, coef_p, diag, diag_value, offset,
          row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE: gl.constexpr,
          PARTS: gl.constexpr):
    """The epilogue of one 64 x 128 half (as ops/gluon_kernels._consumer's), P by TMA."""
    BM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    rows_l: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    cols_l: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
    offs_m = off_m + gl.arange(0, BM, layout=rows_l)
    offs_n = off_n + gl.arange(0, BN, layout=cols_l)
    mask_m = offs_m < M
    mask_n = offs_n < N
    r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag
    t = gl.where(pos, gl.expand_dims(rr, 1), acc)
    t2 = t * scale2
    e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
    e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))
    p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)
    if DSCALE == 2:
        cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)
        w = gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))
                            + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)
        w_acc += gl.convert_layout(w, w_acc.type.layout, assert_trivial=True)
    tma.store_wait(pendings=PARTS - 1)  # this buffer's store of the previous tile has left it
    c_buf.store((p * coef_p).to(p_desc.dtype))
    fence_async_shared()
    _tma_store(p_desc, [off_m, off_n], c_buf)
    return w_acc


@gluon.jit
def _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
    a_ring, b_ring, c_bufs = rings
    ready, empty, turn = bars
    (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
     diag_value, offset, flags) = scalars
    COEF_SCALE: gl.constexpr = flags.type.shape[0] // 2
    DSCALE: gl.constexpr = flags.type.shape[1] // 2
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    HN: gl.constexpr = p_desc.block_type.shape[1]
    PARTS: gl.constexpr = BN // HN
    STAGES: gl.constexpr = a_ring.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    scale = gl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = gl.load(coef_ptr) * coef_mul
    if DSCALE == 1:
        if WHICH == 0:
            gl.store(dscale_dst, coef * gl.load(dscale_src), mask=gl.program_id(0) == 0)
    coef_p = coef * scale if COEF_SCALE else coef
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    steps = gl.cdiv(D, BK)
    w_acc = gl.zeros([BM], gl.float32, layout=rows_l)
    nprog = gl.num_programs(0)
    n = 0
    for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
        off_m, off_n = glk._tile_origin(tile, M, N, BM, BN, _GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout=mma)
        mbarrier.wait(turn.index(WHICH), (n & 1) ^ (1 - WHICH))
        count = (2 * n + WHICH) * steps
        for k in range(steps):
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        mbarrier.arrive(turn.index(1 - WHICH))
        n += 1
        if BN == HN:
            w_acc = _half(acc, off_m, off_n, c_bufs.index(PARTS * WHICH), p_desc, M, N, scale2, coef, coef_p,
                          diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
        elif BN == 2 * HN:
            lo, hi = gl.split(gl.permute(gl.reshape(acc, [BM, 2, HN]), [0, 2, 1]))
            w_acc = _half(lo, off_m, off_n, c_bufs.index(PARTS * WHICH), p_desc, M, N, scale2, coef, coef_p,
                          diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
            w_acc = _half(hi, off_m, off_n + HN, c_bufs.index(PARTS * WHICH + 1), p_desc, M, N, scale2, coef,
                          coef_p, diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
        else:  # four quarters
            lo, hi = gl.split(gl.permute(gl.reshape(acc, [BM, 2, 2 * HN]), [0, 2, 1]))
            q0, q1 = gl.split(gl.permute(gl.reshape(lo, [BM, 2, HN]), [0, 2, 1]))
            w_acc = _half(q0, off_m, off_n, c_bufs.index(PARTS * WHICH), p_desc, M, N, scale2, coef, coef_p,
                          diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
            w_acc = _half(q1, off_m, off_n + HN, c_bufs.index(PARTS * WHICH + 1), p_desc, M, N, scale2, coef,
                          coef_p, diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
            q2, q3 = gl.split(gl.permute(gl.reshape(hi, [BM, 2, HN]), [0, 2, 1]))
            w_acc = _half(q2, off_m, off_n + 2 * HN, c_bufs.index(PARTS * WHICH + 2), p_desc, M, N, scale2, coef,
                          coef_p, diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
            w_acc = _half(q3, off_m, off_n + 3 * HN, c_bufs.index(PARTS * WHICH + 3), p_desc, M, N, scale2, coef,
                          coef_p, diag, diag_value, offset, row_lse, col_lse, row_ref, col_ref, w_acc, DSCALE, PARTS)
    tma.store_wait(pendings=0)
    if DSCALE == 2:
        gl.atomic_add(dscale_dst, coef * gl.sum(w_acc, axis=0), sem="relaxed")


@gluon.jit
def _consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)


@gluon.jit
def _consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)


@gluon.jit
def _wide_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, coef_ptr, coef_mul, dscale_src,
                 dscale_dst, row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                 COEF_SCALE: gl.constexpr, DSCALE: gl.constexpr, STAGES: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    HN: gl.constexpr = p_desc.block_type.shape[1]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(p_desc.dtype, [2 * (BN // HN), BM, HN], p_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    flags = gl.allocate_shared_memory(gl.int8, [1 << COEF_SCALE, 1 << DSCALE],
                                      gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scalars = (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
               diag, diag_value, offset, flags)
    args = (a_desc, b_desc, p_desc, (a_ring, b_ring, c_bufs), (ready, empty, turn), M, N, D, scalars)
    gl.warp_specialize([(_consumer0, args), (_loader, args), (_consumer1, args)], [1, 4], [40, 232])


def wide_block(a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref,
               col_ref, diag, diag_value, offset, coef_scale, dscale, sm_count, tiles) -> None:
    bm, bn, bk, stages, hn = tiles
    (m, d), n = a.shape, b.shape[0]
    da = TensorDescriptor.from_tensor(a, [bm, bk], glk._layout(bm, bk, a.dtype))
    db = TensorDescriptor.from_tensor(b, [bn, bk], glk._layout(bn, bk, b.dtype))
    dp = TensorDescriptor.from_tensor(p, [bm, hn], glk._layout(bm, hn, p.dtype))
    grid = min(sm_count, -(-m // bm) * -(-n // bn))
    _wide_kernel[(grid, )](da, db, dp, m, n, d, scale, coef, coef_mul, dscale_src, dscale_dst,
                           row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                           COEF_SCALE=coef_scale, DSCALE=dscale, STAGES=stages, num_warps=4, maxnreg=168)


def resources(tiles, dscale: int) -> dict:
    """Registers / spill stack / shared bytes of _wide_kernel for sm_90, compiled on this machine."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    import diag_kernel_resources as dkr
    bm, bn, bk, stages, hn = tiles

    def desc(block):
        return f"tensordesc<bf16[{block[0]},{block[1]}],{glk._layout(*block, torch.bfloat16)!r}>"

    f32 = "*fp32"
    types = dict(a_desc=desc([bm, bk]), b_desc=desc([bn, bk]), p_desc=desc([bm, hn]), M="i32", N="i32",
                 D="i32", scale_ptr=f32, coef_ptr=f32, coef_mul="fp32", dscale_src=f32, dscale_dst=f32,
                 row_lse=f32, col_lse=f32, row_ref=f32, col_ref=f32, diag="i32", diag_value="fp32",
                 offset="fp32")
    constexprs = dict(COEF_SCALE=True, DSCALE=dscale, STAGES=stages)
    kernel = _wide_kernel
    sig = {name: "constexpr" if name in constexprs else types[name] for name in kernel.arg_names}
    source = GluonASTSource(kernel, sig, {(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=168))
    return dkr._cubin_resources(compiled)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--tiles", nargs="+", default=["64,256,64,4,64"],
                   help="BLOCK_M,BLOCK_N,BLOCK_K,STAGES,epilogue part width")
    p.add_argument("--resources", action="store_true")
    args = p.parse_args(argv)
    specs = [tuple(int(v) for v in s.split(",")) for s in args.tiles]
    if args.resources:
        for tiles in specs:
            for dscale in (1, 2):
                print(tiles, f"dscale={dscale}", resources(tiles, dscale), flush=True)
        return
    import infclip.ops.contrastive_loss_triton as tri
    from bench_loss_kernels import _try, inputs
    from diag_gluon_grad import graph_timed
    print(f"# {torch.cuda.get_device_name()}, the op's Gluon tiles {glk.GRAD_TILES}")
    for size in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, row_shift, col_shift, ref, _ = inputs(size, args.dim)
        rows, cols = tri._grad_block(size, size, args.dim, 0, img.element_size())
        a, b = img[:rows], txt[:cols]
        lse = row_shift + 1.0
        s1 = scale.reshape(1)
        one = torch.ones(1, device="cuda")
        scratch = torch.zeros((), device="cuda")
        gflop = 2 * rows * cols * args.dim / 1e9
        kernel_args = (s1, one, 1.0, one)
        vectors = (lse[:rows], lse[:cols], ref[:rows], lse[:cols], 0, 2.0, 0.0)
        sms = tri._sm_count(a.device)

        def emit(label, ms):
            print(f"B={size:<7} {rows}x{cols} {label:<34} {ms:7.3f} ms {gflop / ms:6.0f} TFLOP/s", flush=True)

        def op_block(out, dst):
            glk.clip_grad_block(a, b, out, *kernel_args, dst, *vectors, True, 2, sms)

        want = torch.empty(rows, cols, device="cuda", dtype=img.dtype)
        want_d = torch.zeros((), device="cuda")
        op_block(want, want_d)
        logits = torch.empty_like(want)
        for rnd in range(2):  # twice, alternating: the GPU's clock drifts between rows
            emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(a, b.T, out=logits), args.reps))
            emit(f"op's gluon {glk.GRAD_TILES}", graph_timed(lambda: op_block(want, scratch), args.reps))
            for tiles in specs:
                got = torch.zeros_like(want)
                got_d = torch.zeros((), device="cuda")
                run = lambda: wide_block(a, b, got, *kernel_args, got_d, *vectors, True, 2, sms, tiles)  # noqa: E731
                if _try(lambda: run() or True) is None:
                    continue
                torch.cuda.synchronize()
                if rnd == 0:
                    print(f"B={size:<7} wide {tiles}: P equal to the op's: {torch.equal(got, want)}, "
                          f"max diff {(got.float() - want.float()).abs().max().item():.3e}, "
                          f"d scale {got_d.item():.6e} against {want_d.item():.6e}", flush=True)
                emit(f"wide {tiles}", graph_timed(
                    lambda: wide_block(a, b, got, *kernel_args, scratch, *vectors, True, 2, sms, tiles),
                    args.reps))


if __name__ == "__main__":
    main()
