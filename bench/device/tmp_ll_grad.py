"""Device-only (h200_it): the Gluon CLIP gradient block without a loader warp. Each consumer issues the TMA
loads of the ring itself (the chunk STAGES - 1 ahead, into the slot whose MMA its last wgmma wait retired),
so the kernel runs 8 warps and its consumers may hold up to 240 registers: tiles of 128 x 128 a consumer
(a third less L2 traffic a FLOP than 64 x 128) without spilling. Compared with the op's kernel on the
backward's first block at 32k / 65k (P bit for bit, d scale), GPU time by replay, alone and with the
block's two gradient GEMMs after it."""
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from infclip.ops import gluon_kernels as glk  # noqa: E402
from infclip.ops.gluon_kernels import _tile_origin, _gdc_wait, _store_tile, _tma_load  # noqa: E402

_GROUP_M = gl.constexpr(8)


@gluon.jit
def _ll_load(a_desc, b_desc, a_ring, b_ring, ready, s, off_m, off_n, off_k, valid):
    """TMA loads of A [off_m, off_k] and B [off_n, off_k] into ring slot ``s`` (if ``valid``)."""
    if valid:
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        _tma_load(a_desc, [off_m, off_k], ready.index(s), a_ring.index(s))
        _tma_load(b_desc, [off_n, off_k], ready.index(s), b_ring.index(s))


@gluon.jit
def _ll_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
    a_ring, b_ring, c_bufs = rings
    ready, turn, mode = bars
    (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
     diag_value, offset, flags) = scalars
    COEF_SCALE: gl.constexpr = flags.type.shape[0] // 2
    DSCALE: gl.constexpr = flags.type.shape[1] // 2
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_ring.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    c_buf = c_bufs.index(WHICH)
    if mode.type.shape[0] == 2:
        _gdc_wait()
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    steps = gl.cdiv(D, BK)
    nprog = gl.num_programs(0)
    if WHICH == 0:  # the first STAGES - 1 chunks of the program's first tile
        f_m, f_n = _tile_origin(gl.program_id(0), M, N, BM, BN, _GROUP_M)
        for c0 in gl.static_range(STAGES - 1):
            _ll_load(a_desc, b_desc, a_ring, b_ring, ready, c0, f_m, f_n, c0 * BK, True)
    scale = gl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = gl.load(coef_ptr) * coef_mul
    if DSCALE == 1:
        if WHICH == 0:
            gl.store(dscale_dst, coef * gl.load(dscale_src), mask=gl.program_id(0) == 0)
    coef_p = coef * scale if COEF_SCALE else coef
    w_acc = gl.zeros([BM], gl.float32, layout=rows_l)
    n = 0
    for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
        off_m, off_n = _tile_origin(tile, M, N, BM, BN, _GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout=mma)
        mbarrier.wait(turn.index(WHICH), (n & 1) ^ (1 - WHICH))
        g = (2 * n + WHICH) * steps
        # the chunks loaded during this tile: its own from STAGES - 1 on, then the next tile's (the
        # program's next, the other consumer's) first STAGES - 1
        nxt = tile + nprog
        n_m, n_n = _tile_origin(nxt, M, N, BM, BN, _GROUP_M)
        has_next = nxt < tiles
        for k in range(steps):
            s = g % STAGES
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            gl.thread_barrier()  # every warp's part of chunk g - 1 retired before its slot is refilled
            c = k + STAGES - 1
            own = c < steps
            _ll_load(a_desc, b_desc, a_ring, b_ring, ready, (g + STAGES - 1) % STAGES, gl.where(own, off_m, n_m),
                     gl.where(own, off_n, n_n), gl.where(own, c, c - steps) * BK, own | has_next)
            g += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        gl.thread_barrier()
        mbarrier.arrive(turn.index(1 - WHICH))
        n += 1
        offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        d0 = off_m - off_n
        if mode.type.shape[1] == 2:
            plain = (off_m + BM <= M) & (off_n + BN <= N) & ((diag < d0 - BN + 1) | (diag > d0 + BM - 1))
        else:
            plain = off_m < 0
        if plain:
            r2 = gl.load(row_lse + offs_m) * 1.4426950408889634
            c2 = gl.load(col_lse + offs_n) * 1.4426950408889634
            rr = gl.load(row_ref + offs_m)
            t2 = acc * scale2
            e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
            e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))
            if DSCALE == 2:
                cr = gl.load(col_ref + offs_n)
                w_acc += gl.sum(e_r * (acc - gl.expand_dims(rr, 1)) + e_c * (acc - gl.expand_dims(cr, 0)), axis=1)
            p = ((e_r + e_c - offset) * coef_p).to(p_desc.dtype)
            _store_tile(p_desc, c_buf, p, off_m, off_n)
        else:
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
            if DSCALE == 2:
                cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)
                inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)
                w_acc += gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))
                                         + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)
            p = ((e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)) * coef_p).to(p_desc.dtype)
            _store_tile(p_desc, c_buf, p, off_m, off_n)
    tma.store_wait(pendings=0)
    if DSCALE == 2:
        gl.atomic_add(dscale_dst, coef * gl.sum(w_acc, axis=0), sem="relaxed")


@gluon.jit
def _ll_consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _ll_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)


@gluon.jit
def _ll_consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _ll_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)


@gluon.jit
def _ll_clip_grad_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, coef_ptr, coef_mul, dscale_src,
                         dscale_dst, row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                         COEF_SCALE: gl.constexpr, DSCALE: gl.constexpr, STAGES: gl.constexpr,
                         PDL: gl.constexpr, REGS: gl.constexpr, PLAIN: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(p_desc.dtype, [2, BM, BN], p_desc.layout)
    mode = gl.allocate_shared_memory(gl.int8, [1 << PDL, 1 << PLAIN], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    flags = gl.allocate_shared_memory(gl.int8, [1 << COEF_SCALE, 1 << DSCALE], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scalars = (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
               diag, diag_value, offset, flags)
    args = (a_desc, b_desc, p_desc, (a_ring, b_ring, c_bufs), (ready, turn, mode), M, N, D, scalars)
    gl.warp_specialize([(_ll_consumer0, args), (_ll_consumer1, args)], [4], [REGS])


def ll_clip_grad_block(a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref,
                       col_ref, diag, diag_value, offset, coef_scale, dscale, sm_count, tiles, regs=240, pdl=True,
                       plain=False):
    bm, bn, bk, stages = tiles
    (m, d), n = a.shape, b.shape[0]
    da = glk._descriptor(a, [bm, bk], None)
    db = glk._descriptor(b, [bn, bk], None)
    dp = glk._descriptor(p, [bm, bn], None)
    grid = min(sm_count, -(-m // bm) * -(-n // bn))
    _ll_clip_grad_kernel[(grid, )](da, db, dp, m, n, d, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse,
                                   row_ref, col_ref, diag, diag_value, offset, COEF_SCALE=coef_scale, DSCALE=dscale,
                                   STAGES=stages, PDL=int(pdl), REGS=regs, PLAIN=int(plain), num_warps=4, maxnreg=regs,
                                   launch_pdl=pdl)


def main():
    import triton
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from diag_gluon_grad import graph_timed, FirstBlock
    import infclip.ops.contrastive_loss_triton as tri
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}", flush=True)
    variants = [("ll 64x128x64 s6", (64, 128, 64, 6), 2, 240, False), ("ll 64x128x64 s7", (64, 128, 64, 7), 2, 240, False),
                ("ll 64x128x64 s6 plain", (64, 128, 64, 6), 2, 240, True),
                ("ll 128x128x64 s4", (128, 128, 64, 4), 2, 248, False), ("ll 128x128x64 s4 dscale1", (128, 128, 64, 4), 1, 248, False),
                ("ll 128x128x64 s4 dscale1 plain", (128, 128, 64, 4), 1, 248, True),
                ("ll 64x256x64 s4 dscale1", (64, 256, 64, 4), 1, 248, False)]
    for size in [int(s) for s in os.environ.get("SIZES", "32768,65536").split(",")]:
        blk = FirstBlock(size, 768)
        ref = blk.out()
        d_ref = torch.zeros((), device="cuda")
        blk.gluon(ref, d_ref)
        acc_a = torch.zeros(blk.rows, 768, device="cuda")
        acc_b = torch.zeros(blk.cols, 768, device="cuda")

        def emit(label, ms):
            print(f"B={size:<7} {blk.rows}x{blk.cols} {label:<34} {ms:7.4f} ms  "
                  f"{blk.gflop / ms / 1e3:6.0f} TFLOP/s-eq", flush=True)

        p = blk.out()
        emit("op kernel", graph_timed(lambda: blk.gluon(p), 7))
        emit("op kernel + GEMMs", graph_timed(lambda: (blk.gluon(p), tri._addmm_(acc_a, p, blk.b),
                                                          tri._addmm_(acc_b, p.T, blk.a)), 7))
        d1 = torch.zeros((), device="cuda")
        blk.gluon(blk.out(), d1, dscale=1)
        emit("op kernel dscale1", graph_timed(lambda: blk.gluon(p, dscale=1), 7))
        for label, tiles, dscale, regs, plain in variants:
            def run(out, dst=None, tiles=tiles, dscale=dscale, regs=regs, plain=plain):
                ll_clip_grad_block(blk.a, blk.b, out, *blk.args, blk.scratch if dst is None else dst, *blk.vectors,
                                   True, dscale, blk.sms, tiles, regs, plain=plain)
            try:
                out = blk.out().fill_(float("nan"))
                d = torch.zeros((), device="cuda")
                run(out, d)
                torch.cuda.synchronize()
                same = torch.equal(out, ref)
                diff = (out.float() - ref.float()).abs().max().item()
                print(f"B={size:<7} {label}: P equal {same} (max diff {diff:.3g}), d scale {d.item():.9g} "
                      f"against {(d_ref if dscale == 2 else d1).item():.9g}", flush=True)
                emit(label, graph_timed(lambda: run(p), 7))
                emit(label + " + GEMMs", graph_timed(lambda: (run(p), tri._addmm_(acc_a, p, blk.b),
                                                                 tri._addmm_(acc_b, p.T, blk.a)), 7))
            except Exception as exc:  # noqa: BLE001
                print(f"B={size:<7} {label}: failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
        emit("op kernel (again)", graph_timed(lambda: blk.gluon(p), 7))


if __name__ == "__main__":
    main()
