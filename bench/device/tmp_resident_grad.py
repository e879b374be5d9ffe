"""Device-only prototype: the CLIP gradient block with the column block of B resident in shared memory (the
forward sums' loader and turn loop, ops/gluon_kernels.clip_sums), each consumer's epilogue the op's CLIP gradient
arithmetic (DSCALE 2, coef scaled), P stored from the registers by masked pointers (no room left for a TMA store
buffer beside the 192 KB block). P and d scale checked against the op's Triton kernel, then timed against the op's
Gluon block alone and followed by the op's two gradient GEMMs, at 32k and 65k, several item chunks."""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import gluon_kernels as glk
from infclip.ops.gluon_kernels import gluon, gl, mbarrier, _turn_mma, _strip_item, _sums_loader, _descriptor
from diag_gluon_grad import graph_timed, FirstBlock

LOG2E = 1.4426950408889634


@gluon.jit
def _p_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
    a_ring, b_res = rings
    ready, empty, turn, b_ready, b_free = bars
    (chunk, p_ptr, stride_p, scale_ptr, coef_ptr, coef_mul, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
     diag_value, offset) = scalars
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    KSTEPS: gl.constexpr = b_res.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    scale = gl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = gl.load(coef_ptr) * coef_mul
    coef_p = coef * scale
    w_acc = gl.zeros([BM], gl.float32, layout=rows_l)
    items = gl.cdiv(gl.cdiv(M, BM), chunk) * gl.cdiv(N, BN)
    j = 0
    t = 0
    for item in range(gl.program_id(0), items, gl.num_programs(0)):
        off_n, lo, hi = _strip_item(item, M, N, BM, BN, chunk)
        offs_n = off_n + gl.arange(0, BN, layout=cols_l)
        mask_n = offs_n < N
        mbarrier.wait(b_ready, j & 1)
        for i in range(lo + (t + WHICH) % 2, hi, 2):
            g = t + i - lo
            n = g // 2
            acc = gl.zeros([BM, BN], gl.float32, layout=mma)
            acc = _turn_mma(a_ring, b_res, ready, empty, turn, acc, n, g * KSTEPS, KSTEPS, WHICH, True)
            offs_m = i * BM + gl.arange(0, BM, layout=rows_l)
            mask_m = offs_m < M
            r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
            rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)
            pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag
            tt = gl.where(pos, gl.expand_dims(rr, 1), acc)
            t2 = tt * scale2
            e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
            e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))
            p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)
            cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)
            inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)
            w_acc += gl.sum(gl.where(inside, e_r * (tt - gl.expand_dims(rr, 1))
                                     + e_c * (tt - gl.expand_dims(cr, 0)), 0.0), axis=1)
            ptrs = p_ptr + (gl.expand_dims(offs_m * stride_p, 1) + gl.expand_dims(offs_n, 0))
            gl.store(ptrs, (p * coef_p).to(p_ptr.dtype.element_ty), mask=inside)
        mbarrier.arrive(b_free)
        t += hi - lo
        j += 1
    gl.atomic_add(dscale_dst, coef * gl.sum(w_acc, axis=0), sem="relaxed")


@gluon.jit
def _p_consumer0(a_desc, b_desc, rings, bars, M, N, D, scalars):
    _p_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, 0)


@gluon.jit
def _p_consumer1(a_desc, b_desc, rings, bars, M, N, D, scalars):
    _p_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, 1)


@gluon.jit
def _p_resident_kernel(a_desc, b_desc, M, N, D, chunk, p_ptr, stride_p, scale_ptr, coef_ptr, coef_mul, dscale_dst,
                       row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                       STAGES: gl.constexpr, KSTEPS: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_res = gl.allocate_shared_memory(b_desc.dtype, [KSTEPS, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    b_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    mbarrier.init(b_ready, count=1)
    mbarrier.init(b_free, count=2)
    scalars = (chunk, p_ptr, stride_p, scale_ptr, coef_ptr, coef_mul, dscale_dst, row_lse, col_lse, row_ref, col_ref,
               diag, diag_value, offset)
    args = (a_desc, b_desc, (a_ring, b_res), (ready, empty, turn, b_ready, b_free), M, N, D, scalars)
    gl.warp_specialize([(_p_consumer0, args), (_sums_loader, args), (_p_consumer1, args)], [1, 4], [40, 232])


def resident_block(blk, p, dst, chunk, stages=None):
    bm, bn, bk = 64, 128, 64
    (m, d), n = blk.a.shape, blk.b.shape[0]
    scale, coef, coef_mul, _src = blk.args
    row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset = blk.vectors
    grid_m, grid_n = -(-m // bm), -(-n // bn)
    grid = min(blk.sms, -(-grid_m // chunk) * grid_n)
    stages = stages or glk.sums_stages(d, blk.a.element_size())
    _p_resident_kernel[(grid, )](_descriptor(blk.a, [bm, bk], None), _descriptor(blk.b, [bn, bk], None), m, n, d,
                                 chunk, p, p.stride(0), scale, coef, coef_mul, dst, row_lse, col_lse, row_ref,
                                 col_ref, diag, diag_value, offset, STAGES=stages, KSTEPS=-(-d // bk),
                                 num_warps=4, maxnreg=168)


def _no_store_module():
    """This file with P's store cut (the d-scale sums keep the epilogue's arithmetic), as a module."""
    import importlib.util, tempfile
    src = open(__file__).read()
    line = "            gl.store(ptrs, (p * coef_p).to(p_ptr.dtype.element_ty), mask=inside)\n"
    assert src.count(line) == 1
    path = os.path.join(tempfile.mkdtemp(), "tmp_resident_nostore.py")
    open(path, "w").write(src.replace(line, ""))
    spec = importlib.util.spec_from_file_location("tmp_resident_nostore", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    import triton
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}; sums stages {glk.sums_stages(768, 2)}")
    nostore = _no_store_module()
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        want, want_d = blk.out(), torch.zeros((), device="cuda")
        blk.triton(want, want_d)
        acc_a = torch.zeros(blk.rows, 768, device="cuda")
        acc_b = torch.zeros(blk.cols, 768, device="cuda")
        p = blk.out()

        def emit(label, ms):
            print(f"B={size:<7} {blk.rows}x{blk.cols} {label:<40} {ms:7.4f} ms", flush=True)

        def gemms():
            tri._addmm_(acc_a, p, blk.b)
            tri._addmm_(acc_b, p.T, blk.a)

        def gluon_op():
            blk.gluon(p)

        emit("the op's Gluon block", graph_timed(gluon_op, 9))
        emit("the op's Gluon block + GEMMs", graph_timed(lambda: (gluon_op(), gemms()), 9))
        for chunk in (16, 32):
            got, got_d = blk.out().zero_(), torch.zeros((), device="cuda")
            try:
                resident_block(blk, got, got_d, chunk)
                torch.cuda.synchronize()
            except Exception as exc:
                print("failed", type(exc).__name__, str(exc)[:2000], flush=True)
                return
            print(f"B={size:<7} resident chunk {chunk}: P equal to the Triton kernel's: {torch.equal(got, want)} "
                  f"(max |diff| {(got.float() - want.float()).abs().max().item():.3e}), d scale "
                  f"{got_d.item():.6e} against {want_d.item():.6e}", flush=True)
            scratch = torch.zeros((), device="cuda")
            emit(f"resident chunk {chunk}", graph_timed(lambda: resident_block(blk, p, scratch, chunk), 9))
            emit(f"resident chunk {chunk} + GEMMs",
                 graph_timed(lambda: (resident_block(blk, p, scratch, chunk), gemms()), 9))
            emit(f"resident chunk {chunk}, P not stored",
                 graph_timed(lambda: nostore.resident_block(blk, p, scratch, chunk), 9))


if __name__ == "__main__":
    main()
