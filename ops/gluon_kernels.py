"""Warp-specialised Hopper kernels in Gluon (Triton's lower-level language). One role: the loss's
GEMM-bound passes with their work split between warps: the CLIP backward's gradient block P (as
ops/kernels_clip_grad._clip_grad_fused_kernel computes it; :func:`clip_grad_block`), the
SigLIP gradient block with its pair losses (as _siglip_grad_fused_kernel with LOSS;
:func:`siglip_grad_block`) and the CLIP forward's plain sums by column strips (as
_clip_sums_strip_kernel; :func:`clip_sums`).

Why: the Triton kernel runs each tile's epilogue (two exponentials per logit, the labels, the
d-scale shares, the store of P) in the warps that ran the tile's MMA, after it. On an H200 at
B = 65,536 one 8,192 x 4,096 block took 0.116 ms against 0.076 ms for cuBLAS's GEMM of the same
logits. Here one loader warp fills a ring of shared-memory stages by
TMA and two consumer warpgroups take alternate tiles, each running its tile's wgmma when its
turn at the tensor cores comes (a barrier pair: CUTLASS's ping-pong order) and then its
epilogue, beside the other's MMA: 0.103-0.105 ms for that block, 0.052-0.055 against 0.060 at
32k, bit for bit the Triton kernel's P, its d scale up to the order of the atomic sums.

Design points, measured on an H200:
* one ring for both consumers, not a ring each: two rings of 2-3 stages starved the MMA (0.050 ms
  of loads alone for a block cuBLAS computes in 0.040); one ring of 6 stages keeps the MMA-only
  kernel at cuBLAS's time. A consumer waits on the slot of its tile's chunks only when its turn
  comes, so it never waits on a barrier more than one phase ahead (a barrier's parity tells only
  the next phase apart: waiting several fills ahead passed at once and read stale chunks).
* 64 x 128 tiles per consumer (the accumulator in 64 registers a thread); 128 x 128 or 64 x 256
  spill and ran 2x slower. A third consumer, the turn passed at issue or at completion, the
  epilogue's vectors loaded before the MMA, and an interior path without masks were no faster:
  what is left over the MMA is mostly P's store through shared memory.
* Tile sizes are read from the descriptors inside the partitions, the flags from a small buffer's
  shape: constexprs passed through ``warp_specialize``'s arguments arrive as tensors.

The blocks that hold no positive in whole tiles (most of a large backward's) go to a variant with
128 x 128 tiles a consumer and an epilogue without selects or masks (_clip_grad_ws_kernel with
PLAIN, TUNING.gluon_grad_plain): its MMA alone runs 0.029 against 0.038 ms at 32k (B read once
for two 64-row wgmmas), and a consumer's epilogue, which binds at that size, is the cheaper one.

The SigLIP block takes the same loader and ping-pong consumers with SigLIP's
epilogue: 0.067 against 0.081 ms for the Triton kernel at 4,096 x 4,096, 0.132 against 0.163 at
8,192 x 4,096. With the pair losses' atomic before P's store it takes 0.114: the
store's fence (fence.proxy.async) waits for the global atomics issued before it, so every atomic
follows the store. Without the pair losses the Triton kernel is as fast and takes the block. Its blocks
without positives in whole tiles take the epilogue without the labels' and bounds' selects (TUNING.gluon_grad_plain).

The forward's sums: the same loader and ping-pong consumers, a work item being
a chunk of row tiles of one column block: each consumer adds its tiles' row sums by atomics and
keeps their column terms in registers until the item's end. With A and B both streamed per tile
(~290 KB from L2 a tile) it takes 16.8 against 13.6 ms for the Triton strip kernel at 65k, its
MMA alone no faster (the item order keeps 132 column blocks in flight, so L2 serves them
poorly). Here the item's column block of B is loaded once into shared memory and
stays (BLOCK_N x D, 192 KB at D = 768) while only A streams through a short ring (a third of
the traffic): 11.3 against 13.6 ms at 65k (582 against 484 TFLOP/s; cuBLAS's GEMM of the same
logits 10.9), 2.84 against 3.45 at 32k, 0.72 against 0.96 at 16k. Chunks of 32 row tiles are
fastest (64: 11.7-11.8 ms, 16: 11.8, 8: 13.7; 128: 15.0); a ring of BLOCK_K 32 with 6-8 stages
is slower (13.6-14.0). Features wider than SUMS_MAX_DIM do not fit and take the Triton kernel.
Two orders of the work, measured: a long launch loses ~25% (one launch of
2^36 logits at 262k: 438-447 TFLOP/s, L2 hit rate 76% against 89% at 65k, warps waiting on L1TEX;
the same items at 65k x 262k: 547-569), so the sums go in launches of at most TUNING.gluon_sums_launch_logits
(slabs of rows: 575 at 262k); and a short one gains where each program takes its items' row tiles
from its own offset (TUNING.gluon_sums_rotate_items). Items in groups of 132 or 264 column blocks (the group's
B within L2 chunk after chunk) were slower at 32k-131k and only 5% faster at 262k. An item with no
positive among its rows and no bound in it (most of them) takes its tiles' epilogue without the
select that leaves the positives and bounds out: 650 instead of 1,020 instructions a tile, the sums
alone 2.50 / 10.96 / 177.6 against 2.78 / 11.30 / 185.5 ms at 32k / 65k / 262k (660 / 602 / 594
TFLOP/s; cuBLAS's GEMM of the same logits 2.46-2.77 / 10.84 ms), the op 10.57 / 41.27 / 171.6 / 698.0
against 10.71 / 41.92 / 176.0 / 708.6 ms at 32k-262k.

The gradient kernels launch with programmatic dependent launch (TUNING.gluon_grad_pdl): each block's programs
set up while the GEMM before them drains and wait for it before their first load or store, 1-3%
of the op's time at 16k-32k.

:func:`available` says whether this Triton has what the kernels need (Gluon, Hopper's wgmma and
TMA); the caller (ops/contrastive_loss_triton.py) takes them only on sm_90 with TMA-aligned blocks
and falls back to the Triton kernels if a first launch fails.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .tuning import TUNING

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # TMA copies by their Triton 3.6 names or their later ones (async_load / async_store)
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _WHY_NOT = ""
except (ImportError, AttributeError) as exc:  # an older Triton: the Triton kernel serves
    _WHY_NOT = f"{type(exc).__name__}: {exc}"

__all__ = ["available", "clip_grad_block", "clip_sums", "plain_block", "siglip_grad_block", "GRAD_PLAIN_TILES",
           "GRAD_TILES", "SUMS_MAX_DIM", "SUMS_TILES"]

GRAD_TILES = (64, 128, 64, 6)
"""BLOCK_M, BLOCK_N, BLOCK_K of a consumer's tile and the ring's stages (180 KB of shared memory
with the two P buffers)."""

SUMS_TILES = (64, 128, 64, 4, 32)
"""clip_sums: BLOCK_M, BLOCK_N, BLOCK_K of a consumer's tile, the most stages of the A ring, and the
row tiles of one work item (a chunk of one column strip). The item's column block of B stays in
shared memory whole (BLOCK_N x D: 192 KB at D = 768), so the ring gets what is left
(_sums_stages: 3 stages at D = 768)."""

GRAD_PLAIN_TILES = (128, 128, 64, 4)
"""_clip_grad_ws_kernel's BLOCK_M with PLAIN (two halves of 64 rows a consumer), BLOCK_N, BLOCK_K and
stages (196 KB of shared memory with the two 128 x 128 P buffers)."""



SHARED_BYTES = 232448
"""The shared memory one block may take on an H100 / H200 (227 KB)."""

SUMS_MAX_DIM = 768
"""The widest features clip_sums takes (its resident column block of B beside a ring of 2 stages
or more)."""




def available() -> str:
    """"" when this Triton can build the kernels, else why not."""
    return _WHY_NOT


if not _WHY_NOT:
    _GROUP_M = gl.constexpr(8)

    @gluon.jit
    def _tile_origin(tile, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
        """(first row, first column) of tile number ``tile``, GROUP_M row blocks at a time (the
        Triton kernels' _tile_pids order: a group's column blocks stay in L2)."""
        grid_n = gl.cdiv(N, BN)
        width = GROUP_M * grid_n
        first_m = (tile // width) * GROUP_M
        size_m = gl.minimum(gl.cdiv(M, BM) - first_m, GROUP_M)
        return (first_m + (tile % width) % size_m) * BM, ((tile % width) // size_m) * BN

    @gluon.jit
    def _gdc_wait():
        """griddepcontrol.wait: until the kernel this one was launched after (programmatic dependent
        launch) has finished and its writes are visible; returns at once without PDL."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _pdl_wait(mode):
        """_gdc_wait in a gradient kernel launched with programmatic dependent launch: ``mode`` is
        _grad_smem's buffer of shape [2^PDL, 1], whose shape stays a constexpr in every partition
        (a helper returning the flag would not: Triton 3.6 keeps no constexpr from a jit return)."""
        if mode.type.shape[0] == 2:
            _gdc_wait()

    @gluon.jit
    def _turn_mma(a_ring, b_ops, ready, empty, turn, acc, acc_b, n, count, steps, WHICH: gl.constexpr,
                  B_BY_K: gl.constexpr, HALVES: gl.constexpr):
        """One consumer's wgmma of one tile, in its turn at the tensor cores (the n-th tile of
        consumer WHICH; 0 goes first), over ``steps`` chunks of the ring from its chunk ``count``:
        A from the ring, B from the ring too or, B_BY_K, chunk k of a resident block. HALVES: A's
        slot holds 2 x 64 rows, each chunk of B goes against both halves (two m64 wgmmas that read
        B once each) into ``acc`` and ``acc_b``; else ``acc_b`` passes through. Each slot is
        released once the next chunk's MMA is issued, and the turn passed once the tile's are done."""
        STAGES: gl.constexpr = a_ring.type.shape[0]
        HM: gl.constexpr = a_ring.type.shape[1] // 2
        mbarrier.wait(turn.index(WHICH), (n & 1) ^ (1 - WHICH))
        for k in range(steps):
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            if B_BY_K:
                b = b_ops.index(k).permute((1, 0))
            else:
                b = b_ops.index(s).permute((1, 0))
            if HALVES:
                acc = warpgroup_mma(a_ring.index(s).slice(0, HM), b, acc, is_async=True)
                acc_b = warpgroup_mma(a_ring.index(s).slice(HM, HM), b, acc_b, is_async=True)
                acc, acc_b = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_b))
            else:
                acc = warpgroup_mma(a_ring.index(s), b, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
            count += 1
        if HALVES:
            acc, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_b))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        mbarrier.arrive(turn.index(1 - WHICH))
        return acc, acc_b

    @gluon.jit
    def _loader(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        """One warp: the A and B chunks of every tile of this program, in order, into the ring."""
        a_ring, b_ring, c_bufs = rings
        ready, empty = bars[0], bars[1]
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        STAGES: gl.constexpr = a_ring.type.shape[0]
        _pdl_wait(bars[3])
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        steps = gl.cdiv(D, BK)
        count = 0
        for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
            off_m, off_n = _tile_origin(tile, M, N, BM, BN, _GROUP_M)
            for k in range(steps):
                s = count % STAGES
                mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                _tma_load(a_desc, [off_m, k * BK], ready.index(s), a_ring.index(s))
                _tma_load(b_desc, [off_n, k * BK], ready.index(s), b_ring.index(s))
                count += 1

    @gluon.jit
    def _tile_acc(a_ring, b_ring, bars, tile, n, M, N, steps, WHICH: gl.constexpr):
        """Tile number ``tile`` of the block, this consumer's n-th: S' of it by wgmma over the ring
        in this consumer's turn (the ring's chunks before it: 2 n + WHICH tiles' worth), its
        origin, its row and column offsets."""
        ready, empty, turn = bars[0], bars[1], bars[2]
        BM: gl.constexpr = a_ring.type.shape[1]
        BN: gl.constexpr = b_ring.type.shape[1]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
        off_m, off_n = _tile_origin(tile, M, N, BM, BN, _GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout=mma)
        acc, _ = _turn_mma(a_ring, b_ring, ready, empty, turn, acc, acc, n, (2 * n + WHICH) * steps, steps, WHICH,
                           False, False)
        offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        return acc, off_m, off_n, offs_m, offs_n

    @gluon.jit
    def _store_tile(p_desc, c_buf, value, off_m, off_n):
        """``value`` stored by TMA at [off_m, off_n] of P through this consumer's buffer (once its
        previous tile has left it; the copy engine clips at the bounds)."""
        tma.store_wait(pendings=0)
        c_buf.store(value.to(p_desc.dtype))
        fence_async_shared()
        _tma_store(p_desc, [off_m, off_n], c_buf)

    @gluon.jit
    def _clip_coefs(scalars, WHICH: gl.constexpr):
        """A CLIP gradient consumer's set-up: (scale log2(e), coef, P's factor: coef, times scale with
        COEF_SCALE); with DSCALE 1 program 0's first consumer writes the single-device d scale (as
        _grad_coef)."""
        scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, flags = (scalars[0], scalars[1], scalars[2],
                                                                        scalars[3], scalars[4], scalars[12])
        COEF_SCALE: gl.constexpr = flags.type.shape[0] // 2  # (shape [2^COEF_SCALE, 2^DSCALE])
        DSCALE: gl.constexpr = flags.type.shape[1] // 2
        scale = gl.load(scale_ptr)
        scale2 = scale * 1.4426950408889634
        coef = gl.load(coef_ptr) * coef_mul
        if DSCALE == 1:
            if WHICH == 0:
                gl.store(dscale_dst, coef * gl.load(dscale_src), mask=gl.program_id(0) == 0)
        coef_p = coef * scale if COEF_SCALE else coef
        return scale2, coef, coef_p

    @gluon.jit
    def _clip_finish(w_acc, coef, scalars):
        """A CLIP gradient consumer's end: its last P store out of its buffer, and with DSCALE 2 its
        rows' d-scale terms (``w_acc``) added to the d scale."""
        flags = scalars[12]
        DSCALE: gl.constexpr = flags.type.shape[1] // 2
        tma.store_wait(pendings=0)
        if DSCALE == 2:
            gl.atomic_add(scalars[4], coef * gl.sum(w_acc, axis=0), sem="relaxed")

    @gluon.jit
    def _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
        """One warpgroup: every other tile of this program (WHICH 0: the first), its wgmma over the
        ring's chunks in its turn, then _clip_grad_fused_kernel's epilogue (the same arithmetic in
        the same order), P stored by TMA from this consumer's buffer."""
        a_ring, b_ring, c_bufs = rings
        (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
         diag_value, offset, flags) = scalars
        DSCALE: gl.constexpr = flags.type.shape[1] // 2  # (flags of shape [2^COEF_SCALE, 2^DSCALE])
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        c_buf = c_bufs.index(WHICH)
        _pdl_wait(bars[3])
        scale2, coef, coef_p = _clip_coefs(scalars, WHICH)
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        steps = gl.cdiv(D, BK)
        w_acc = gl.zeros([BM], gl.float32, layout=rows_l)
        nprog = gl.num_programs(0)
        n = 0  # this consumer's tiles so far
        for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
            acc, off_m, off_n, offs_m, offs_n = _tile_acc(a_ring, b_ring, bars, tile, n, M, N, steps, WHICH)
            n += 1
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
                w_acc += gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))
                                         + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)
            _store_tile(p_desc, c_buf, p * coef_p, off_m, off_n)
        _clip_finish(w_acc, coef, scalars)

    @gluon.jit
    def _consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)

    @gluon.jit
    def _consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)

    @gluon.jit
    def _grad_smem(a_desc, b_desc, p_desc, STAGES: gl.constexpr, PDL: gl.constexpr):
        """The gradient kernels' shared memory: (the ring of A and B chunks, a P buffer for each
        consumer), (the ring's ready and empty barriers, the consumers' turn pair, a buffer of shape
        [2^PDL, 1] telling the partitions whether the kernel was launched with programmatic
        dependent launch: then each waits for the previous kernel before its first global access)."""
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
        c_bufs = gl.allocate_shared_memory(p_desc.dtype, [2, BM, BN], p_desc.layout)
        mode = gl.allocate_shared_memory(gl.int8, [1 << PDL, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        ready, empty, turn = _ring_barriers(STAGES)
        return (a_ring, b_ring, c_bufs), (ready, empty, turn, mode)

    @gluon.jit
    def _ring_barriers(STAGES: gl.constexpr):
        """(ready, empty, turn): the ring's STAGES ready and empty barriers and the consumers' turn
        pair, allocated and initialised (one arrival each)."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        return ready, empty, turn

    @gluon.jit
    def _clip_grad_ws_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, coef_ptr, coef_mul, dscale_src,
                             dscale_dst, row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                             COEF_SCALE: gl.constexpr, DSCALE: gl.constexpr, PLAIN: gl.constexpr,
                             STAGES: gl.constexpr, PDL: gl.constexpr):
        """_clip_grad_fused_kernel's P (and d scale) with TMA descriptors for A [M, D], Bm [N, D]
        and P [M, N]; one program an SM (persistent), 12 warps: 4 + 4 consumers, 1 loader. PLAIN: a
        block with no positive and whole tiles (plain_block), tiles of GRAD_PLAIN_TILES: the loader's
        ring of 128-row A and 128-row B chunks, each consumer's tile in two 64-row halves
        (_plain_consumer)."""
        rings, bars = _grad_smem(a_desc, b_desc, p_desc, STAGES, PDL)
        # the flags travel as the shape of a small unused buffer: constexprs passed to the
        # partitions arrive as tensors, a shared-memory buffer's shape stays a constexpr
        flags = gl.allocate_shared_memory(gl.int8, [1 << COEF_SCALE, 1 << DSCALE],
                                          gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        scalars = (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
                   diag, diag_value, offset, flags)
        args = (a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars)
        # registers: 168 a thread for the 12 warps at launch (64K / 384), moved at run time from
        # the loader's warpgroup (40) to the consumers' (232)
        if PLAIN:
            gl.warp_specialize([(_plain_consumer0, args), (_loader, args), (_plain_consumer1, args)], [1, 4],
                               [40, 232])
        else:
            gl.warp_specialize([(_consumer0, args), (_loader, args), (_consumer1, args)], [1, 4], [40, 232])

    @gluon.jit
    def _plain_half(acc, c_half, off_m, offs_n, row_lse, col_lse, row_ref, col_ref, scale2, offset, coef_p,
                    DSCALE: gl.constexpr):
        """_consumer's epilogue on 64 rows of a tile with no positive and no bound in it, the same P
        without the selects and masks: P coef into ``c_half``; returns the rows' d-scale terms, the
        row side's e_r (S' - rr) and the column side's e_c (S' - cr) summed apart (one sum of both
        spilled 192 bytes under Triton 3.6; regrouped as (e_r + e_c) S' - e_c cr - e_r rr, 256 under
        3.9)."""
        HM: gl.constexpr = acc.type.shape[0]
        BN: gl.constexpr = acc.type.shape[1]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
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
            w = (gl.sum(e_r * (acc - gl.expand_dims(rr, 1)), axis=1)
                 + gl.sum(e_c * (acc - gl.expand_dims(cr, 0)), axis=1))
        c_half.store((p * coef_p).to(c_half.dtype))
        return w

    @gluon.jit
    def _plain_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
        """_consumer for a block with no positive and whole tiles of 2 x 64 rows a consumer: the halves'
        wgmma in its turn, then each half's epilogue into its half of this consumer's P buffer, one
        TMA store a tile."""
        a_ring, b_ring, c_bufs = rings
        (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref, diag,
         diag_value, offset, flags) = scalars
        DSCALE: gl.constexpr = flags.type.shape[1] // 2
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        HM: gl.constexpr = BM // 2
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
        c_buf = c_bufs.index(WHICH)
        _pdl_wait(bars[3])
        scale2, coef, coef_p = _clip_coefs(scalars, WHICH)
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        steps = gl.cdiv(D, BK)
        w_acc = gl.zeros([HM], gl.float32, layout=gl.SliceLayout(1, mma))
        nprog = gl.num_programs(0)
        n = 0
        for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
            off_m, off_n = _tile_origin(tile, M, N, BM, BN, _GROUP_M)
            acc_t = gl.zeros([HM, BN], gl.float32, layout=mma)
            acc_b = gl.zeros([HM, BN], gl.float32, layout=mma)
            acc_t, acc_b = _turn_mma(a_ring, b_ring, bars[0], bars[1], bars[2], acc_t, acc_b, n,
                                     (2 * n + WHICH) * steps, steps, WHICH, False, True)
            n += 1
            offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
            tma.store_wait(pendings=0)  # (this consumer's previous tile has left its buffer)
            w_acc += _plain_half(acc_t, c_buf.slice(0, HM), off_m, offs_n, row_lse, col_lse, row_ref, col_ref,
                                 scale2, offset, coef_p, DSCALE)
            w_acc += _plain_half(acc_b, c_buf.slice(HM, HM), off_m + HM, offs_n, row_lse, col_lse, row_ref,
                                 col_ref, scale2, offset, coef_p, DSCALE)
            fence_async_shared()
            _tma_store(p_desc, [off_m, off_n], c_buf)
        _clip_finish(w_acc, coef, scalars)

    @gluon.jit
    def _plain_consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _plain_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)

    @gluon.jit
    def _plain_consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _plain_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)

    @gluon.jit
    def _log1p_unit(u):
        """log(1 + u) for 0 <= u <= 1: kernels_common._log1p_unit's polynomial, the same
        FMAs in the same order."""
        p = 0.005253457929939032 * u - 0.02958850748836994
        p = p * u + 0.07836166769266129
        p = p * u - 0.13674770295619965
        p = p * u + 0.19111430644989014
        p = p * u - 0.24844369292259216
        p = p * u + 0.33319270610809326
        p = p * u - 0.49999502301216125
        return (p * u + 1.0) * u

    @gluon.jit
    def _sigmoid_parts(t):
        """(exp(-|t|), sigmoid(t)) as _siglip_grad_value takes them (the same operations in the same order)."""
        e = gl.exp(-gl.abs(t))
        r = 1.0 / (1.0 + e)
        return e, gl.where(t >= 0.0, r, e * r)

    @gluon.jit
    def _siglip_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
        """One warpgroup: every other tile of this program (as _consumer), then
        _siglip_grad_fused_kernel's epilogue with the pair losses (_siglip_grad_value's arithmetic,
        LOSS, so P is its bit for bit): coef G stored by TMA, then the row sums of G, G S' and the
        pair losses by atomics. No atomic comes before the store's fence, which would wait for it: with the
        pair losses' atomic before it the 4,096 x 4,096 block took 0.114 against 0.067 ms.
        PLAIN (a block without positives in whole tiles, plain_block with GRAD_TILES): the
        same values without the labels' and the bounds' selects."""
        a_ring, b_ring, c_bufs = rings
        scale_ptr, bias_ptr, coef_ptr, gsum, gwsum, row_loss, diag, flags = scalars
        COEF_SCALE: gl.constexpr = flags.type.shape[0] // 2  # (shape [2^COEF_SCALE, 2^PLAIN])
        PLAIN: gl.constexpr = flags.type.shape[1] // 2
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        c_buf = c_bufs.index(WHICH)
        _pdl_wait(bars[3])
        scale = gl.load(scale_ptr)
        bias = gl.load(bias_ptr)
        nan_sb = scale * 0.0 + bias * 0.0  # NaN iff scale or bias is not finite, else 0
        coef = gl.load(coef_ptr) * 1.0
        if COEF_SCALE:
            coef = coef * scale
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        steps = gl.cdiv(D, BK)
        nprog = gl.num_programs(0)
        n = 0  # this consumer's tiles so far
        for tile in range(gl.program_id(0) + WHICH * nprog, tiles, 2 * nprog):
            acc, off_m, off_n, offs_m, offs_n = _tile_acc(a_ring, b_ring, bars, tile, n, M, N, steps, WHICH)
            n += 1
            mask_m = offs_m < M
            y = acc * scale + bias
            if PLAIN:  # every pair a negative (z = -1) inside the block
                t = y
                e, g = _sigmoid_parts(t)
            else:
                inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(offs_n < N, 0)
                is_pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag  # z = +1, else -1
                t = gl.where(is_pos, -y, y)  # -z y (a sign flip: bit for bit the Triton kernel's product)
                e, sig = _sigmoid_parts(t)
                g = gl.where(inside, gl.where(is_pos, -sig, sig), 0.0)  # -z sig
            _store_tile(p_desc, c_buf, g * coef, off_m, off_n)
            # (every atomic after the fence, which would wait for them)
            sp = gl.maximum(t, 0.0) + _log1p_unit(e)
            if not PLAIN:
                sp = gl.where(inside, sp, 0.0)
            # (NaN where S' is not finite, or where scale or bias is not: added to the row sum)
            sp_sum = gl.sum(sp + acc * 0.0, axis=1) + nan_sb
            gl.atomic_add(row_loss + offs_m, sp_sum, mask=mask_m, sem="relaxed")
            gl.atomic_add(gsum + offs_m, gl.sum(g, axis=1), mask=mask_m, sem="relaxed")
            gl.atomic_add(gwsum + offs_m, gl.sum(g * acc, axis=1), mask=mask_m, sem="relaxed")
        tma.store_wait(pendings=0)

    @gluon.jit
    def _siglip_consumer0(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _siglip_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 0)

    @gluon.jit
    def _siglip_consumer1(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars):
        _siglip_consumer(a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars, 1)

    @gluon.jit
    def _siglip_grad_ws_kernel(a_desc, b_desc, p_desc, M, N, D, scale_ptr, bias_ptr, coef_ptr, gsum, gwsum,
                               row_loss, diag, COEF_SCALE: gl.constexpr, PLAIN: gl.constexpr,
                               STAGES: gl.constexpr, PDL: gl.constexpr):
        """_siglip_grad_fused_kernel's coef G and row sums with the pair losses (LOSS) with TMA
        descriptors for A [M, D], Bm [N, D] and G [M, N]; the loader and barriers of
        _clip_grad_ws_kernel. PLAIN: a block without positives in whole tiles (plain_block with GRAD_TILES)."""
        rings, bars = _grad_smem(a_desc, b_desc, p_desc, STAGES, PDL)
        flags = gl.allocate_shared_memory(gl.int8, [1 << COEF_SCALE, 1 << PLAIN],
                                          gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        scalars = (scale_ptr, bias_ptr, coef_ptr, gsum, gwsum, row_loss, diag, flags)
        args = (a_desc, b_desc, p_desc, rings, bars, M, N, D, scalars)
        gl.warp_specialize([(_siglip_consumer0, args), (_loader, args), (_siglip_consumer1, args)], [1, 4],
                           [40, 232])

    @gluon.jit
    def _strip_item(item, M, N, BM: gl.constexpr, BN: gl.constexpr, chunk):
        """Work item ``item`` of the column-strip sums: (its column block's first column, its first
        and last + 1 row tile). Items run along the column blocks of one chunk of row tiles, so
        the programs at work together share the chunk's rows of A in L2."""
        grid_m = gl.cdiv(M, BM)
        grid_n = gl.cdiv(N, BN)
        lo = (item // grid_n) * chunk
        return (item % grid_n) * BN, lo, gl.minimum(lo + chunk, grid_m)

    @gluon.jit
    def _strip_row(i, lo, hi, rot):
        """The row tile an item's i-th (lo <= i < hi) is: its tiles taken from ``rot`` on, round."""
        return lo + (i - lo + rot) % (hi - lo)

    @gluon.jit
    def _sums_loader(a_desc, b_desc, rings, bars, M, N, D, scalars):
        """One warp: per item of this program, its column block of B whole into the resident
        buffer (once both consumers are done with the last item's), then the A chunks of its row
        tiles, in order, into the ring."""
        a_ring, b_res = rings
        ready, empty, turn, b_ready, b_free = bars
        chunk = scalars[0]
        rot = scalars[1] * gl.program_id(0)
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        STAGES: gl.constexpr = a_ring.type.shape[0]
        KSTEPS: gl.constexpr = b_res.type.shape[0]
        items = gl.cdiv(gl.cdiv(M, BM), chunk) * gl.cdiv(N, BN)
        count = 0
        j = 0  # this program's items so far
        for item in range(gl.program_id(0), items, gl.num_programs(0)):
            off_n, lo, hi = _strip_item(item, M, N, BM, BN, chunk)
            mbarrier.wait(b_free, (j & 1) ^ 1)
            mbarrier.expect(b_ready, KSTEPS * b_desc.block_type.nbytes)
            for kb in gl.static_range(KSTEPS):
                _tma_load(b_desc, [off_n, kb * BK], b_ready, b_res.index(kb))
            for i in range(lo, hi):
                for k in range(KSTEPS):
                    s = count % STAGES
                    mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes)
                    _tma_load(a_desc, [_strip_row(i, lo, hi, rot) * BM, k * BK], ready.index(s), a_ring.index(s))
                    count += 1
            j += 1

    @gluon.jit
    def _sums_tile(acc, q_acc, offs_m, mask_m, offs_n, mask_n, scale2, rs2, cs2, row_sum, diag, PLAIN: gl.constexpr):
        """One tile's share of the sums (_strip_tiles' arithmetic): its row sums of
        exp(S - row shift) added to ``row_sum``, its column terms exp(S - column shift) added into
        ``q_acc`` (returned); rows and columns past the ends and the positives left out (their
        logits set to -inf: one select a logit). PLAIN: a tile of an item with no positive and no
        bound in it, the same values without that select."""
        if PLAIN:
            xs = acc * scale2
        else:
            valid = (gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)
                     & (gl.expand_dims(offs_m - diag, 1) != gl.expand_dims(offs_n, 0)))
            xs = gl.where(valid, acc * scale2, float("-inf"))
        gl.atomic_add(row_sum + offs_m, gl.sum(gl.exp2(xs - gl.expand_dims(rs2, 1)), axis=1), mask=mask_m,
                      sem="relaxed")
        return q_acc + gl.exp2(xs - gl.expand_dims(cs2, 0))

    @gluon.jit
    def _sums_item(a_ring, b_res, bars, q_acc, t, lo, hi, rot, M, N, off_n, scale2, cs2, row_shift, row_sum,
                   diag, WHICH: gl.constexpr, PLAIN: gl.constexpr):
        """A consumer's tiles of one item (row tiles lo to hi of its column block from ``off_n``; ``t``
        tiles of the program before it): those whose number in the program is WHICH modulo 2, each
        one's wgmma in its turn, then _sums_tile; returns ``q_acc`` with their column terms."""
        ready, empty, turn = bars[0], bars[1], bars[2]
        BM: gl.constexpr = a_ring.type.shape[1]
        BN: gl.constexpr = b_res.type.shape[1]
        KSTEPS: gl.constexpr = b_res.type.shape[0]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        mask_n = offs_n < N
        for i in range(lo + (t + WHICH) % 2, hi, 2):
            g = t + i - lo
            n = g // 2  # this consumer's tiles before this one
            acc = gl.zeros([BM, BN], gl.float32, layout=mma)
            acc, _ = _turn_mma(a_ring, b_res, ready, empty, turn, acc, acc, n, g * KSTEPS, KSTEPS, WHICH, True, False)
            offs_m = _strip_row(i, lo, hi, rot) * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
            mask_m = offs_m < M
            rs2 = gl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            q_acc = _sums_tile(acc, q_acc, offs_m, mask_m, offs_n, mask_n, scale2, rs2, cs2, row_sum, diag, PLAIN)
        return q_acc

    @gluon.jit
    def _sums_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, WHICH: gl.constexpr):
        """One warpgroup: every other tile of this program's items (WHICH 0: the first), its wgmma
        in its turn, then its row sums out by atomics and its column terms kept in registers
        until the item's end (one reduction across the warps an item). An item with no positive
        and whole tiles (most of a launch's) takes the tiles' epilogue without the select."""
        a_ring, b_res = rings
        ready, empty, turn, b_ready, b_free = bars
        chunk, rotate, scale_ptr, row_shift, col_shift, row_sum, col_sum, diag = scalars
        rot = rotate * gl.program_id(0)
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 16])
        cols_l: gl.constexpr = gl.SliceLayout(0, mma)
        scale2 = gl.load(scale_ptr) * 1.4426950408889634
        items = gl.cdiv(gl.cdiv(M, BM), chunk) * gl.cdiv(N, BN)
        j = 0  # this program's items so far
        t = 0  # tiles of this program before the item (both consumers')
        for item in range(gl.program_id(0), items, gl.num_programs(0)):
            off_n, lo, hi = _strip_item(item, M, N, BM, BN, chunk)
            offs_n = off_n + gl.arange(0, BN, layout=cols_l)
            cs2 = gl.load(col_shift + offs_n, mask=offs_n < N, other=0.0) * 1.4426950408889634
            q_acc = gl.zeros([BM, BN], gl.float32, layout=mma)
            # no positive (rows off_n + diag to off_n + diag + BN - 1) among the item's rows, no bound in it
            plain = ((hi * BM <= off_n + diag) | (lo * BM >= off_n + diag + BN)) & (hi * BM <= M) & (off_n + BN <= N)
            mbarrier.wait(b_ready, j & 1)  # the item's column block of B is in
            if plain:
                q_acc = _sums_item(a_ring, b_res, bars, q_acc, t, lo, hi, rot, M, N, off_n, scale2, cs2, row_shift,
                                   row_sum, diag, WHICH, True)
            else:
                q_acc = _sums_item(a_ring, b_res, bars, q_acc, t, lo, hi, rot, M, N, off_n, scale2, cs2, row_shift,
                                   row_sum, diag, WHICH, False)
            mbarrier.arrive(b_free)  # (its MMAs of the item are done)
            t += hi - lo
            j += 1
            offs_n = off_n + gl.arange(0, BN, layout=cols_l)  # (made again: not held through the tiles)
            gl.atomic_add(col_sum + offs_n, gl.sum(q_acc, axis=0), mask=offs_n < N, sem="relaxed")

    @gluon.jit
    def _sums_consumer0(a_desc, b_desc, rings, bars, M, N, D, scalars):
        _sums_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, 0)

    @gluon.jit
    def _sums_consumer1(a_desc, b_desc, rings, bars, M, N, D, scalars):
        _sums_consumer(a_desc, b_desc, rings, bars, M, N, D, scalars, 1)

    @gluon.jit
    def _clip_sums_ws_kernel(a_desc, b_desc, M, N, D, chunk, rotate, scale_ptr, row_shift, col_shift, row_sum,
                             col_sum, diag, STAGES: gl.constexpr, KSTEPS: gl.constexpr):
        """_clip_sums_strip_kernel's sums (row_sum [M], col_sum [N] += the plain sums of
        exp(scale a b^T - shift) without the pairs i - j == diag) with TMA descriptors for A [M, D]
        and Bm [N, D] (D <= KSTEPS BLOCK_K); persistent, 12 warps: 4 + 4 consumers, 1 loader."""
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
        b_res = gl.allocate_shared_memory(b_desc.dtype, [KSTEPS, BN, BK], b_desc.layout)
        ready, empty, turn = _ring_barriers(STAGES)
        b_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        b_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(b_ready, count=1)
        mbarrier.init(b_free, count=2)  # both consumers, once an item
        scalars = (chunk, rotate, scale_ptr, row_shift, col_shift, row_sum, col_sum, diag)
        args = (a_desc, b_desc, (a_ring, b_res), (ready, empty, turn, b_ready, b_free), M, N, D, scalars)
        gl.warp_specialize([(_sums_consumer0, args), (_sums_loader, args), (_sums_consumer1, args)], [1, 4],
                           [40, 232])

@functools.lru_cache(maxsize=8)
def _layout(rows: int, cols: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], {torch.bfloat16: gl.bfloat16,
                                                                torch.float16: gl.float16}[dtype])


def _descriptor(t, block: list, cache: Optional[dict]):
    """A TMA descriptor of ``t`` in ``block`` tiles; with ``cache`` (a dict of the caller's, for
    tensors that stay put meanwhile) one per view, by its address, shape and strides."""
    if cache is None:
        return TensorDescriptor.from_tensor(t, block, _layout(*block, t.dtype))
    # (tagged: the Triton kernels' descriptors may share the cache)
    key = ("gluon", t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), *block)
    desc = cache.get(key)
    if desc is None:
        desc = cache[key] = TensorDescriptor.from_tensor(t, block, _layout(*block, t.dtype))
    return desc


def _launch_grad(kernel, a, b, p, args: tuple, sm_count: int, tiles, descriptors: Optional[dict],
                 pdl: Optional[bool], **flags) -> None:
    """A gradient kernel (_clip_grad_ws_kernel, _siglip_grad_ws_kernel) on a [M, D], b [N, D] into
    p [M, N]: their TMA descriptors, one program an SM at most, ``args`` after the shapes, ``flags``
    its constexprs besides STAGES and PDL (``pdl`` None: TUNING.gluon_grad_pdl)."""
    pdl = TUNING.gluon_grad_pdl if pdl is None else bool(pdl)
    bm, bn, bk, stages = tiles
    (m, d), n = a.shape, b.shape[0]
    da = _descriptor(a, [bm, bk], descriptors)
    db = _descriptor(b, [bn, bk], descriptors)
    dp = _descriptor(p, [bm, bn], descriptors)
    grid = min(sm_count, -(-m // bm) * -(-n // bn))
    kernel[(grid, )](da, db, dp, m, n, d, *args, **flags, STAGES=stages, PDL=int(pdl), num_warps=4, maxnreg=168,
                     launch_pdl=pdl)


def plain_block(m: int, n: int, diag: int, plain: Optional[bool] = None, tiles=GRAD_PLAIN_TILES) -> bool:
    """Whether an [m, n] block whose positives sit at i - j == ``diag`` takes a gradient kernel's
    plain epilogue: none of them in the block, whole ``tiles`` (clip_grad_block: GRAD_PLAIN_TILES,
    siglip_grad_block: its tiles), and ``plain`` (None: TUNING.gluon_grad_plain)."""
    bm, bn = tiles[:2]
    return (TUNING.gluon_grad_plain if plain is None else bool(plain)) and m % bm == 0 and n % bn == 0 and not -n < diag < m


def clip_grad_block(a, b, p, scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref,
                    col_ref, diag, diag_value, offset, coef_scale: bool, dscale: int, sm_count: int,
                    tiles=GRAD_TILES, descriptors: Optional[dict] = None, pdl: Optional[bool] = None,
                    plain: Optional[bool] = None) -> None:
    """P = a b^T's gradient block into ``p`` (and d scale as DSCALE says), the arguments as
    _clip_grad_fused_kernel's: a [M, D], b [N, D], p [M, N], 16-bit, rows TMA-aligned.
    ``descriptors``: a dict that keeps the TMA descriptors between calls on the same views (the
    blocks of one backward: each descriptor cost ~5 us of host time); ``pdl``: launched
    with programmatic dependent launch (None: TUNING.gluon_grad_pdl). A block without positives in whole tiles
    (:func:`plain_block`, ``plain`` None: TUNING.gluon_grad_plain) takes _clip_grad_ws_kernel's PLAIN consumers with
    GRAD_PLAIN_TILES, any other its consumers with ``tiles``."""
    is_plain = plain_block(a.shape[0], b.shape[0], int(diag), plain)
    _launch_grad(_clip_grad_ws_kernel, a, b, p, (scale, coef, coef_mul, dscale_src, dscale_dst, row_lse, col_lse,
                                                 row_ref, col_ref, diag, diag_value, offset),
                 sm_count, GRAD_PLAIN_TILES if is_plain else tiles, descriptors, pdl, COEF_SCALE=coef_scale,
                 DSCALE=dscale, PLAIN=is_plain)


def siglip_grad_block(a, b, p, scale, bias, coef, gsum, gwsum, row_loss, diag: int, coef_scale: bool,
                      sm_count: int, tiles=GRAD_TILES, descriptors: Optional[dict] = None,
                      pdl: Optional[bool] = None, plain: Optional[bool] = None) -> None:
    """coef G of a b^T into ``p`` with the row sums and the pair losses, the arguments as
    _siglip_grad_fused_kernel's with LOSS (a [M, D], b [N, D], p [M, N], 16-bit, rows TMA-aligned;
    scale, bias, coef fp32 one-element tensors; gsum, gwsum, row_loss fp32 [M]); ``descriptors``,
    ``pdl`` and ``plain`` as :func:`clip_grad_block`'s (a plain block keeps ``tiles``, with the
    epilogue without selects). (Without the losses the Triton kernel is as fast: 0.059 against
    0.063 ms for a 4,096 x 4,096 block on an H200.)"""
    _launch_grad(_siglip_grad_ws_kernel, a, b, p, (scale, bias, coef, gsum, gwsum, row_loss, diag),
                 sm_count, tiles, descriptors, pdl, COEF_SCALE=coef_scale,
                 PLAIN=plain_block(a.shape[0], b.shape[0], int(diag), plain, tiles))


def clip_sums(a, b, scale, row_shift, col_shift, row_sum, col_sum, diag: int, sm_count: int,
              tiles=SUMS_TILES, waves: int = 4, launch_logits: Optional[int] = None,
              rotate: Optional[bool] = None) -> None:
    """row_sum [M] and col_sum [N] (fp32) += the plain sums of exp(scale a b^T - shift), the pairs
    i - j == diag left out, as _clip_sums_strip_kernel takes them: a [M, D], b [N, D], 16-bit,
    rows TMA-aligned, D <= SUMS_MAX_DIM; ``scale`` an fp32 [1] tensor, the shifts fp32 [M] / [N].
    Items of at most ``tiles[4]`` row tiles, fewer where that leaves under ``waves`` items a
    program; one launch a slab of A's rows of at most ``launch_logits`` logits (None: TUNING.gluon_sums_launch_logits; 0: one launch), in
    whole items; ``rotate`` None: where a launch has at most TUNING.gluon_sums_rotate_items items a program."""
    bm, bn, bk, stages, chunk = tiles
    (m, d), n = a.shape, b.shape[0]
    if d > SUMS_MAX_DIM:
        raise ValueError(f"clip_sums takes features of at most {SUMS_MAX_DIM} (a column block of B stays in "
                         f"shared memory whole), got {d}")
    item_rows = bm * chunk
    if launch_logits is None:
        launch_logits = TUNING.gluon_sums_launch_logits
    slab = m if launch_logits <= 0 else max(item_rows, launch_logits // n // item_rows * item_rows)
    db = _descriptor(b, [bn, bk], None)
    grid_n = -(-n // bn)
    meta = dict(STAGES=sums_stages(d, a.element_size(), tiles), KSTEPS=-(-d // bk), num_warps=4, maxnreg=168)
    for r0 in range(0, m, slab):
        rows = min(slab, m - r0)
        grid_m = -(-rows // bm)
        items_chunk = max(1, min(chunk, grid_m * grid_n // (waves * sm_count)))
        items = -(-grid_m // items_chunk) * grid_n
        grid = min(sm_count, items)
        rotated = items <= TUNING.gluon_sums_rotate_items * grid if rotate is None else rotate
        _clip_sums_ws_kernel[(grid, )](_descriptor(a[r0:r0 + rows], [bm, bk], None), db, rows, n, d, items_chunk,
                                       int(rotated), scale, row_shift[r0:], col_shift, row_sum[r0:], col_sum,
                                       diag - r0, **meta)


def sums_stages(d: int, size: int, tiles=SUMS_TILES, spare: int = 6144) -> int:
    """The A ring's stages of clip_sums at feature width ``d`` (``size`` bytes an element): as many
    as fit (at most ``tiles[3]``) beside the resident column block of B and ``spare`` bytes for
    the barriers and the compiler's scratch (Triton 3.6 takes ~4.2 KB of it, 3.9 less)."""
    bm, bn, bk, most, _chunk = tiles
    resident = bn * -(-d // bk) * bk * size
    return max(1, min(most, (SHARED_BYTES - resident - spare) // (bm * bk * size)))
