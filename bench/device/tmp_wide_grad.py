"""Device-only (h200_iw): the Gluon CLIP gradient block with 128 x 128 tiles a consumer, as two 64-row
halves: each k-chunk's B slot feeds two m64n128 wgmmas (one per half of the A slot), so a chunk's shared
memory carries 160 bytes a clock at the tensor cores' peak instead of the 64 x 128 tiles' 192 (the twentieth
session's reading), and the epilogue runs half by half (the second half's accumulator beside the first's
arithmetic), P's two halves into one 128 x 128 buffer and one TMA store. Loader warp, ring, turns and
arithmetic as the op's kernel (ops/gluon_kernels.py). Compared with the op's kernel on the backward's first
block (P bit for bit, d scale), GPU time by replay alone and with the block's two GEMMs, then the op queued
with it as a variant (gluon_kernels.clip_grad_block_wide).

    python bench/device/tmp_wide_grad.py --resources     # compile only (Triton 3.6 venv, no GPU)
"""
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from infclip.ops import gluon_kernels as glk  # noqa: E402
from infclip.ops.gluon_kernels import (_grad_smem, _loader, _pdl_wait, _tile_origin,  # noqa: E402
                                       _tma_store)

_GROUP_M = gl.constexpr(8)
WIDE_TILES = (128, 128, 64, 4)
EPI = gl.constexpr(int(os.environ.get("WIDE_EPI", "0")))  # timing only, without d-scale sums: 1 no selects, 2 one exp, 3 both
PLAIN = gl.constexpr(int(os.environ.get("WIDE_PLAIN", "0")))  # 1: tiles without positives or bounds by _half_plain, 2: all
REGS = gl.constexpr([int(x) for x in os.environ.get("WIDE_REGS", "40,232").split(",")])


@gluon.jit
def _turn_mma2(a_ring, b_ring, ready, empty, turn, acc_t, acc_b, n, count, steps, WHICH: gl.constexpr):
    """_turn_mma with the A slot's two 64-row halves against the same B slot."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    HM: gl.constexpr = a_ring.type.shape[1] // 2
    mbarrier.wait(turn.index(WHICH), (n & 1) ^ (1 - WHICH))
    for k in range(steps):
        s = count % STAGES
        mbarrier.wait(ready.index(s), (count // STAGES) & 1)
        a = a_ring.index(s)
        b = b_ring.index(s).permute((1, 0))
        acc_t = warpgroup_mma(a.slice(0, HM), b, acc_t, is_async=True)
        acc_b = warpgroup_mma(a.slice(HM, HM), b, acc_b, is_async=True)
        acc_t, acc_b = warpgroup_mma_wait(num_outstanding=2, deps=(acc_t, acc_b))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
        count += 1
    acc_t, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, acc_b))
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
    mbarrier.arrive(turn.index(1 - WHICH))
    return acc_t, acc_b


@gluon.jit
def _half(acc, c_half, off_m, offs_n, mask_n, col_lse, col_ref, row_lse, row_ref, M, diag, scale2, diag_value, offset,
          coef_p, DSCALE: gl.constexpr):
    """The op's epilogue on one 64-row half: P * coef into ``c_half``; returns its rows' d-scale terms."""
    HM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    offs_m = off_m + gl.arange(0, HM, layout=gl.SliceLayout(1, mma))
    mask_m = offs_m < M
    r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag
    t = gl.where(pos, gl.expand_dims(rr, 1), acc)
    t2 = t * scale2
    e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
    e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))
    p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)
    w = gl.zeros([HM], gl.float32, layout=gl.SliceLayout(1, mma))
    if DSCALE == 2:
        inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)
        cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        w = gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1)) + e_c * (t - gl.expand_dims(cr, 0)), 0.0),
                   axis=1)
    c_half.store((p * coef_p).to(c_half.dtype))
    return w


@gluon.jit
def _half_plain(acc, c_half, off_m, offs_n, col_lse, col_ref, row_lse, row_ref, scale2, offset, coef_p,
                DSCALE: gl.constexpr):
    """_half on a tile with no positive and no bound in it: the same values without the selects and masks."""
    HM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    offs_m = off_m + gl.arange(0, HM, layout=gl.SliceLayout(1, mma))
    r2 = gl.load(row_lse + offs_m) * 1.4426950408889634
    c2 = gl.load(col_lse + offs_n) * 1.4426950408889634
    t2 = acc * scale2
    e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
    e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))
    p = e_r + e_c - offset
    w = gl.zeros([HM], gl.float32, layout=gl.SliceLayout(1, mma))
    if DSCALE == 2:
        rr = gl.load(row_ref + offs_m)
        cr = gl.load(col_ref + offs_n)
        w = gl.sum(e_r * (acc - gl.expand_dims(rr, 1)) + e_c * (acc - gl.expand_dims(cr, 0)), axis=1)
    c_half.store((p * coef_p).to(c_half.dtype))
    return w


@gluon.jit
def _half_fast(acc, c_half, off_m, offs_n, mask_n, col_lse, row_lse, row_ref, M, diag, scale2, diag_value, offset,
               coef_p, k2):
    """Timing only (--epi): the epilogue without the d-scale sums, EPI 1: no positives' selects (wrong on the
    tiles that hold positives), 2: one exponential a logit (e_c = e_r 2^(r2 - k2) 2^(k2 - c2), no range
    check), 3: both."""
    HM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    offs_m = off_m + gl.arange(0, HM, layout=gl.SliceLayout(1, mma))
    mask_m = offs_m < M
    r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    if EPI == 2:
        rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)
        pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag
        t2 = gl.where(pos, gl.expand_dims(rr, 1), acc) * scale2
    else:
        t2 = acc * scale2
    e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))
    if EPI == 1:
        q = e_r + gl.exp2(t2 - gl.expand_dims(c2, 0))
    else:
        u = gl.exp2(r2 - k2)
        v = gl.exp2(k2 - c2)
        q = e_r * (gl.expand_dims(u, 1) * gl.expand_dims(v, 0) + 1.0)
    if EPI == 2:
        p = q - (gl.where(pos, diag_value, 0.0) + offset)
    else:
        p = q - offset
    c_half.store((p * coef_p).to(c_half.dtype))


@gluon.jit
def _wide_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
    a_ring, b_ring, c_bufs = rings
    ready, empty, turn = bars[0], bars[1], bars[2]
    (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
     diag_value, offset, flags) = scalars
    COEF_SCALE: gl.constexpr = flags.type.shape[0] // 2
    DSCALE: gl.constexpr = flags.type.shape[1] // 2
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    HM: gl.constexpr = BM // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    c_buf = c_bufs.index(WHICH)
    _pdl_wait(bars[3])
    scale = gl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = gl.load(coef_ptr) * coef_mul
    if DSCALE == 1:
        if WHICH == 0:
            gl.store(dscale_dst, coef * gl.load(dscale_src), mask=gl.program_id(0) == 0)
    coef_p = coef * scale if COEF_SCALE else coef
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    steps = gl.cdiv(D, BK)
    w_acc = gl.zeros([HM], gl.float32, layout=gl.SliceLayout(1, mma))
    nprog = gl.num_programs(0)
    n = 0
    for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
        off_m, off_n = _tile_origin(tile, M, N, BM, BN, _GROUP_M)
        acc_t = gl.zeros([HM, BN], gl.float32, layout=mma)
        acc_b = gl.zeros([HM, BN], gl.float32, layout=mma)
        acc_t, acc_b = _turn_mma2(a_ring, b_ring, ready, empty, turn, acc_t, acc_b, n, (2 * n + WHICH) * steps,
                                  steps, WHICH)
        n += 1
        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        mask_n = offs_n < N
        tma.store_wait(pendings=0)
        if EPI != 0 and DSCALE != 2:
            k2 = gl.load(col_lse + off_n) * 1.4426950408889634
            _half_fast(acc_t, c_buf.slice(0, HM), off_m, offs_n, mask_n, col_lse, row_lse, row_ref, M, diag, scale2,
                       diag_value, offset, coef_p, k2)
            _half_fast(acc_b, c_buf.slice(HM, HM), off_m + HM, offs_n, mask_n, col_lse, row_lse, row_ref, M, diag,
                       scale2, diag_value, offset, coef_p, k2)
        elif PLAIN == 2:  # (a block with no positive and no bound: the caller's choice)
            w_acc += _half_plain(acc_t, c_buf.slice(0, HM), off_m, offs_n, col_lse, col_ref, row_lse, row_ref, scale2,
                                 offset, coef_p, DSCALE)
            w_acc += _half_plain(acc_b, c_buf.slice(HM, HM), off_m + HM, offs_n, col_lse, col_ref, row_lse, row_ref,
                                 scale2, offset, coef_p, DSCALE)
        elif PLAIN == 1 and (off_m + BM <= M) & (off_n + BN <= N) & ((diag < off_m - off_n - BN + 1)
                                                                  | (diag > off_m - off_n + BM - 1)):
            w_acc += _half_plain(acc_t, c_buf.slice(0, HM), off_m, offs_n, col_lse, col_ref, row_lse, row_ref, scale2,
                                 offset, coef_p, DSCALE)
            w_acc += _half_plain(acc_b, c_buf.slice(HM, HM), off_m + HM, offs_n, col_lse, col_ref, row_lse, row_ref,
                                 scale2, offset, coef_p, DSCALE)
        else:
            w_acc += _half(acc_t, c_buf.slice(0, HM), off_m, offs_n, mask_n, col_lse, col_ref, row_lse, row_ref, M, diag,
                           scale2, diag_value, offset, coef_p, DSCALE)
            w_acc += _half(acc_b, c_buf.slice(HM, HM), off_m + HM, offs_n, mask_n, col_lse, col_ref, row_lse, row_ref,
                           M, diag, scale2, diag_value, offset, coef_p, DSCALE)
        fence_async_shared()
        _tma_store(p_desc, [off_m, off_n], c_buf)
    tma.store_wait(pendings=0)
    if DSCALE == 2:
        gl.atomic_add(dscale_dst, coef * gl.sum(w_acc, axis=0), sem="relaxed")


@gluon.jit
def _wide_consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _wide_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)


@gluon.jit
def _wide_consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
    _wide_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)


@gluon.jit
def _clip_grad_wide_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, coef_ptr, coef_mul, dscale_src,
                           dscale_dst, row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                           COEF_SCALE: gl.constexpr, DSCALE: gl.constexpr, STAGES: gl.constexpr,
                           PDL: gl.constexpr):
    rings, bars = _grad_smem(a_desc, b_desc, p_desc, STAGES, PDL)
    flags = gl.allocate_shared_memory(gl.int8, [1 << COEF_SCALE, 1 << DSCALE],
                                      gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scalars = (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
               diag, diag_value, offset, flags)
    args = (a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars)
    gl.warp_specialize([(_wide_consumer0, args), (_loader, args), (_wide_consumer1, args)], [1, 4], REGS)


def clip_grad_block_wide(a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref,
                         col_ref, diag, diag_value, offset, coef_scale: bool, dscale: int, sm_count: int,
                         tiles=WIDE_TILES, descriptors=None, pdl=None) -> None:
    """gluon_kernels.clip_grad_block with the wide kernel (``tiles`` ignored: WIDE_TILES)."""
    glk._launch_grad(_clip_grad_wide_kernel, a, b, p, (scale, coef, coef_mul, dscale_src, dscale_dst, row_lse,
                                                       col_lse, row_ref, col_ref, diag, diag_value, offset),
                     sm_count, WIDE_TILES, descriptors, pdl, COEF_SCALE=coef_scale, DSCALE=dscale)


def resources() -> None:
    from triton.backends.compiler import GPUTarget
    import diag_kernel_resources as dkr
    bm, bn, bk, stages = WIDE_TILES
    f32 = "*fp32"
    types = dict(M="i32", N="i32", D="i32", scale_ptr=f32, coef_ptr=f32, coef_mul="fp32", dscale_src=f32,
                 dscale_dst=f32, row_lse=f32, col_lse=f32, row_ref=f32, col_ref=f32, diag="i32",
                 diag_value="fp32", offset="fp32")
    for dscale in (1, 2):
        r = dkr._gluon_compiled(_clip_grad_wide_kernel, "bf16", dict(a_desc=[bm, bk], b_desc=[bn, bk],
                                                                     p_desc=[bm, bn]), types,
                                dict(COEF_SCALE=True, DSCALE=dscale, STAGES=stages, PDL=1), GPUTarget("cuda", 90, 128))
        print(f"wide {WIDE_TILES} dscale={dscale}: {r}", flush=True)


def blocks():
    from diag_gluon_grad import graph_timed, FirstBlock
    import infclip.ops.contrastive_loss_triton as tri
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        for dscale in (2, 1):
            ref, out = blk.out(), blk.out()
            d_ref, d = torch.zeros((), device="cuda"), torch.zeros((), device="cuda")
            blk.gluon(ref, d_ref, dscale=dscale)
            clip_grad_block_wide(blk.a, blk.b, out, *blk.args, d, *blk.vectors, True, dscale, blk.sms)
            torch.cuda.synchronize()
            print(f"B={size} DSCALE {dscale} wide: P equal {torch.equal(out, ref)} "
                  f"(max diff {(out.float() - ref.float()).abs().max().item():.3g}), "
                  f"d scale {d.item():.9g} against {d_ref.item():.9g}", flush=True)
        acc_a = torch.zeros(blk.rows, 768, device="cuda")
        acc_b = torch.zeros(blk.cols, 768, device="cuda")
        p = blk.out()
        fns = {}
        for ds in (2, 1):
            fns[f"as is d{ds}"] = lambda ds=ds: blk.gluon(p, dscale=ds)
            fns[f"wide d{ds}"] = lambda ds=ds: clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch,
                                                                     *blk.vectors, True, ds, blk.sms)
        for rnd in range(3):
            for name, fn in fns.items():
                alone = graph_timed(fn, 7)
                both = graph_timed(lambda: (fn(), tri._addmm_(acc_a, p, blk.b), tri._addmm_(acc_b, p.T, blk.a)), 7)
                print(f"B={size:<7} round {rnd} {name:<10} block {alone:.4f} ms, block + GEMMs {both:.4f} ms",
                      flush=True)

OP_EPILOGUE = """            mask_m = offs_m < M
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
                w_acc += gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))
                                         + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)
            _store_tile(p_desc, c_buf, p * coef_p, off_m, off_n)
"""
WIDE_HALF = """    p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)
"""
WIDE_STORE = """        fence_async_shared()
        _tma_store(p_desc, [off_m, off_n], c_buf)
"""


def _module(path, src, name):
    import importlib.util
    import tempfile
    out = os.path.join(tempfile.mkdtemp(), name + ".py")
    open(out, "w").write(src)
    spec = importlib.util.spec_from_file_location(name, out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cut_modules():
    """{cut: (op-kernel module, wide module)} with the epilogue cut to P = S' ("store") or to a row sum of S'
    and no store ("mma")."""
    op_src, wide_src = open(glk.__file__).read(), open(os.path.abspath(__file__)).read()
    assert op_src.count(OP_EPILOGUE) == 1 and wide_src.count(WIDE_HALF) == 3 and wide_src.count(WIDE_STORE) == 2
    cuts = {}
    for cut, op_new, half_new, store_new in (
            ("store", "            _store_tile(p_desc, c_buf, acc, off_m, off_n)\n",
             "    p = acc\n    coef_p = 1.0\n", WIDE_STORE),
            ("mma", "            w_acc += gl.sum(acc, axis=1)\n",
             "    return gl.sum(acc, axis=1)\n", "")):
        op = _module(glk.__file__, op_src.replace(OP_EPILOGUE, op_new), f"glk_{cut}")
        wide = _module(__file__, wide_src.replace(WIDE_HALF, half_new, 1).replace(WIDE_STORE, store_new, 1), f"wide_{cut}")
        cuts[cut] = (op, wide)
    return cuts


def cut_blocks():
    from diag_gluon_grad import graph_timed, FirstBlock
    cuts = cut_modules()
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        p = blk.out()
        fns = {"as is full": lambda: blk.gluon(p, dscale=1),
               "wide full": lambda: clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch, *blk.vectors,
                                                          True, 1, blk.sms)}
        for cut, (op, wide) in cuts.items():
            fns[f"as is {cut}"] = lambda op=op: op.clip_grad_block(blk.a, blk.b, p, *blk.args, blk.scratch,
                                                                   *blk.vectors, True, 1, blk.sms)
            fns[f"wide {cut}"] = lambda wide=wide: wide.clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch,
                                                                            *blk.vectors, True, 1, blk.sms)
        for rnd in range(3):
            for name, fn in fns.items():
                print(f"B={size:<7} round {rnd} {name:<12} DSCALE 1 block {graph_timed(fn, 7):.4f} ms", flush=True)


def epi_blocks():
    """Timing only: the wide kernel's epilogue without selects / with one exponential a logit (EPI 1-3), DSCALE
    1, against the wide kernel and the op's as they are."""
    from diag_gluon_grad import graph_timed, FirstBlock
    src = open(os.path.abspath(__file__)).read()
    mods = {}
    for epi, name in ((1, "no selects"), (2, "one exp"), (3, "both")):
        os.environ["WIDE_EPI"] = str(epi)
        mods[name] = _module(__file__, src, f"wide_epi{epi}")
    os.environ["WIDE_EPI"] = "0"
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        ref = blk.out()
        clip_grad_block_wide(blk.a, blk.b, ref, *blk.args, blk.scratch, *blk.vectors, True, 1, blk.sms)
        p = blk.out()
        for name, mod in mods.items():
            mod.clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch, *blk.vectors, True, 1, blk.sms)
            diff = (p.float() - ref.float()).abs()
            print(f"B={size} {name}: P max diff {diff.max().item():.3g}, entries differing "
                  f"{(diff > 0).float().mean().item():.3g}, rel {(diff / ref.float().abs().clamp_min(1e-30)).max().item():.3g}",
                  flush=True)
        fns = {"as is": lambda: blk.gluon(p, dscale=1),
               "wide": lambda: clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch, *blk.vectors, True, 1,
                                                    blk.sms)}
        for name, mod in mods.items():
            fns[f"wide {name}"] = lambda mod=mod: mod.clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch,
                                                                          *blk.vectors, True, 1, blk.sms)
        for rnd in range(3):
            for name, fn in fns.items():
                print(f"B={size:<7} round {rnd} {name:<16} DSCALE 1 block {graph_timed(fn, 7):.4f} ms", flush=True)


def plain_module():
    """This file's kernel with PLAIN 2 (every tile by _half_plain)."""
    os.environ["WIDE_PLAIN"] = "2"
    try:
        return _module(__file__, open(os.path.abspath(__file__)).read(), "wide_plain")
    finally:
        os.environ["WIDE_PLAIN"] = "0"


def wide_plain_launch(mod):
    """gluon_kernels.clip_grad_block's stand-in: a block with no positive (i - j == diag nowhere) and whole
    128 x 128 tiles goes to the wide plain kernel, any other to the op's kernel with its tiles."""
    def launch(a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
               diag_value, offset, coef_scale, dscale, sm_count, tiles=None, descriptors=None, pdl=None):
        m, n = a.shape[0], b.shape[0]
        args = (a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
                diag_value, offset, coef_scale, dscale, sm_count)
        if m % 128 == 0 and n % 128 == 0 and not -(n - 1) <= diag <= m - 1:
            mod.clip_grad_block_wide(*args, descriptors=descriptors, pdl=pdl)
        else:
            glk.clip_grad_block(*args, glk.GRAD_TILES, descriptors, pdl)
    return launch


def plain_blocks(mod):
    """A block with no positives (diag far outside): the op's kernel against the wide plain one, P and d scale,
    GPU time alone and with the block's two GEMMs, DSCALE 2 and 1."""
    from diag_gluon_grad import graph_timed, FirstBlock
    import infclip.ops.contrastive_loss_triton as tri
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        vec = list(blk.vectors)
        vec[4] = 1 << 30
        for dscale in (2, 1):
            ref, out = blk.out(), blk.out()
            d_ref, d = torch.zeros((), device="cuda"), torch.zeros((), device="cuda")
            glk.clip_grad_block(blk.a, blk.b, ref, *blk.args, d_ref, *vec, True, dscale, blk.sms)
            mod.clip_grad_block_wide(blk.a, blk.b, out, *blk.args, d, *vec, True, dscale, blk.sms)
            torch.cuda.synchronize()
            print(f"B={size} no positives, DSCALE {dscale} wide plain: P equal {torch.equal(out, ref)}, d scale "
                  f"{d.item():.9g} against {d_ref.item():.9g}", flush=True)
        acc_a = torch.zeros(blk.rows, 768, device="cuda")
        acc_b = torch.zeros(blk.cols, 768, device="cuda")
        p = blk.out()
        fns = {}
        for ds in (2, 1):
            fns[f"as is d{ds}"] = lambda ds=ds: glk.clip_grad_block(blk.a, blk.b, p, *blk.args, blk.scratch, *vec,
                                                                     True, ds, blk.sms)
            fns[f"plain d{ds}"] = lambda ds=ds: mod.clip_grad_block_wide(blk.a, blk.b, p, *blk.args, blk.scratch,
                                                                          *vec, True, ds, blk.sms)
        for rnd in range(3):
            for name, fn in fns.items():
                alone = graph_timed(fn, 7)
                both = graph_timed(lambda: (fn(), tri._addmm_(acc_a, p, blk.b), tri._addmm_(acc_b, p.T, blk.a)), 7)
                print(f"B={size:<7} round {rnd} {name:<9} block {alone:.4f} ms, block + GEMMs {both:.4f} ms",
                      flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--plain":
        mod = plain_module()
        plain_blocks(mod)
        glk.clip_grad_block_wideplain = wide_plain_launch(mod)
        import bench_contrastive_loss
        bench_contrastive_loss.main(sys.argv[2:])
        sys.exit()
    if sys.argv[1:] == ["--epi"]:
        epi_blocks()
        sys.exit()
    if sys.argv[1:] == ["--cuts"]:
        cut_blocks()
        sys.exit()
    if sys.argv[1:] == ["--resources"]:
        resources()
        sys.exit()
    blocks()
    glk.clip_grad_block_wide = clip_grad_block_wide
    import bench_contrastive_loss
    bench_contrastive_loss.main(sys.argv[1:])
