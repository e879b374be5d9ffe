"""Triton helpers shared by the loss kernels (ops/kernels_clip_fwd.py, ops/kernels_clip_grad.py,
ops/kernels_siglip.py), and the backward's finishing launch that both losses use.

Tile access: a band tile of S' (_load_tile / _store_tile), a logit tile computed by tl.dot in
registers in grouped order (_logit_tile, _tile_pids, _tiles, _interior; pointer loads or TMA
tensor descriptors), a gradient tile's store (_store_p) and column halves (_halves); the factor a
gradient tile is scaled by (_grad_coef); log(1 + u) two ways (_log1p, _log1p_unit).
Finishing: _scale_grads_kernel scales both feature gradients and the scalar gradients by the
upstream gradient in one launch, rounding as torch does (_round_to).
Row offsets are int64 wherever a tile is addressed (a kept whole matrix passes 2^31 elements at
B = 46,341).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tuning import INTERPRET

__all__ = [
    "_log1p",
    "_log1p_unit",
    "_load_tile",
    "_grad_coef",
    "_store_tile",
    "_tile_pids",
    "_logit_tile",
    "_tiles",
    "_interior",
    "_store_p",
    "_halves",
    "_scale_grads_kernel",
]


@triton.jit
def _log1p(u):
    """log(1 + u) for 0 <= u <= 1 to ~1e-7 relative: the series u - u^2/2 + u^3/3 below 1e-2
    (where log(1 + u) would lose log10(1/u) digits), log(1 + u) above. No division: the SigLIP
    forward does one per logit pair."""
    return tl.where(u < 1e-2, u * (1.0 - u * (0.5 - u * 0.3333333333333333)), tl.log(1.0 + u))


@triton.jit
def _log1p_unit(u):
    """log(1 + u) for 0 <= u <= 1 (u = exp(-|t|) of a logit pair) to 2e-7 relative: u times a
    degree-8 polynomial (Chebyshev fit of log1p(u) / u on [0, 1]), 9 FMAs and no special
    function (libdevice's log, _log1p's, costs ~20 instructions, once per pair); NaN stays NaN."""
    p = 0.005253457929939032 * u - 0.02958850748836994
    p = p * u + 0.07836166769266129
    p = p * u - 0.13674770295619965
    p = p * u + 0.19111430644989014
    p = p * u - 0.24844369292259216
    p = p * u + 0.33319270610809326
    p = p * u - 0.49999502301216125
    return (p * u + 1.0) * u


@triton.jit
def _load_tile(S, stride_s, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile (program_id(0), program_id(1)) of S'[M, N] that a gradient program owns: its row
    and column offsets, their bounds masks, the tile's mask and S' there in fp32 (0 outside)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    valid = mask_m[:, None] & mask_n[None, :]
    x = tl.load(S + offs_m[:, None].to(tl.int64) * stride_s + offs_n[None, :], mask=valid, other=0.0)
    return offs_m, offs_n, mask_m, mask_n, valid, x.to(tl.float32)


@triton.jit
def _grad_coef(scale, coef_ptr, coef_mul, dscale_src, dscale_dst, COEF_SCALE: tl.constexpr,
               DSCALE: tl.constexpr):
    """The factor folded into a gradient tile: c = coef coef_mul, times scale if COEF_SCALE. With
    DSCALE == 1 the first program also writes dscale_dst = c dscale_src (before the scale factor):
    the single-device CLIP backward's d scale, with no torch launch for either (DSCALE == 2: the
    gradient kernel sums d scale itself, _clip_grad_value)."""
    coef = tl.load(coef_ptr) * coef_mul
    if DSCALE == 1:
        first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
        tl.store(dscale_dst, coef * tl.load(dscale_src), mask=first)
    if COEF_SCALE:
        coef = coef * scale
    return coef


@triton.jit
def _store_tile(P, stride_p, offs_m, offs_n, valid, value):
    tl.store(P + offs_m[:, None].to(tl.int64) * stride_p + offs_n[None, :],
             value.to(P.dtype.element_ty), mask=valid)


# ----------------------------------------------------------------------------------------------
# Fused kernels: the logit tile comes from tl.dot in registers (fp32, never written to memory) and
# the statistics or the gradient block are taken from it in the same program. The forward then
# needs no band buffer at all, the backward's band holds P only: per band one launch instead of a
# GEMM plus one to two passes over S'. Programs walk the tiles in groups of GROUP_M row blocks so
# that a group's column blocks stay in L2.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tile_pids(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of tile number ``tile``, walking GROUP_M row blocks at a time
    (a group's column blocks stay in L2)."""
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (tile // width) * GROUP_M
    size_m = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    return first_m + (tile % width) % size_m, (tile % width) // size_m


@triton.jit
def _logit_tile(A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                EVEN_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
                MASK: tl.constexpr = True):
    """Tile number ``tile`` of the [M, N] block in grouped order: its row and column offsets,
    their bounds masks, and S' = A B^T there (fp32, 0 outside the bounds). With TMA, A and Bm
    are tensor descriptors (blocks [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K]; the copy engine
    fills what lies outside with zeros), else pointers with row strides. MASK=False leaves the
    pointer path's values outside the bounds as they are (rows of row 0's products: finite
    wherever the features are; callers that mask every use of them, the CLIP kernels, save the
    select per element)."""
    pid_m, pid_n = _tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        for k0 in range(0, D, BLOCK_K):
            a = A.load([pid_m * BLOCK_M, k0])
            b = Bm.load([pid_n * BLOCK_N, k0])
            acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    else:
        # rows past the end read row 0 (unmasked loads stay vectorised); zeroed below
        rows_a = tl.where(mask_m, offs_m, 0).to(tl.int64)
        rows_b = tl.where(mask_n, offs_n, 0).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        pa = A + rows_a[:, None] * stride_a + offs_k[None, :]
        pb = Bm + rows_b[None, :] * stride_b + offs_k[:, None]  # B^T's [BLOCK_K, BLOCK_N] tile
        for k0 in range(0, D, BLOCK_K):
            if EVEN_K:
                a = tl.load(pa)
                b = tl.load(pb)
            else:
                a = tl.load(pa, mask=(offs_k < D - k0)[None, :], other=0.0)
                b = tl.load(pb, mask=(offs_k < D - k0)[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            pa += BLOCK_K
            pb += BLOCK_K
    inside = mask_m[:, None] & mask_n[None, :]
    if MASK and not TMA:  # (TMA: zeros outside already)
        acc = tl.where(inside, acc, 0.0)
    return offs_m, offs_n, mask_m, mask_n, inside, acc


@triton.jit
def _tiles(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    return tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)


@triton.jit
def _interior(tile, M, N, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              GROUP_M: tl.constexpr):
    """Whether tile number ``tile`` lies wholly inside [M, N] and holds no positive pair
    (i - j == diag): its epilogue then needs neither the bounds mask nor the diagonal's."""
    pid_m, pid_n = _tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    full = (m0 + BLOCK_M <= M) & (n0 + BLOCK_N <= N)
    # i - j over the tile spans [m0 - n0 - BLOCK_N + 1, m0 - n0 + BLOCK_M - 1]
    return full & ((diag < m0 - n0 - (BLOCK_N - 1)) | (diag > m0 - n0 + (BLOCK_M - 1)))


# Every fused kernel walks tiles tile = program_id, program_id + PROGRAMS, ... (PROGRAMS: the grid;
# one tile a program, or persistent programs when the grid is smaller than the tile count).

@triton.jit
def _store_p(P, stride_p, row0, col0, offs_m, offs_n, inside, value, TMA_STORE: tl.constexpr):
    """A gradient tile (or a slice of one) whose first element is P[row0, col0] into P: by the
    copy engine when P is a tensor descriptor (it clips the tile at P's bounds), else by
    pointers masked to ``inside``."""
    if TMA_STORE:
        P.store([row0, col0], value.to(P.dtype))
    else:
        _store_tile(P, stride_p, offs_m, offs_n, inside, value)


@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    """The left and right halves (columns) of a [BLOCK_M, WIDTH] tile held in registers."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))


# ----------------------------------------------------------------------------------------------
# Finishing launches (O(B) and O(B D)): what would otherwise be several small torch launches
# ----------------------------------------------------------------------------------------------
_ROUND_BF16_BY_BITS = tl.constexpr(INTERPRET)
"""The interpreter truncates fp32 to bf16 (Triton 3.x); the GPU's cast rounds to nearest even."""


@triton.jit
def _round_to(x, dtype: tl.constexpr):
    """fp32 x rounded to nearest even in ``dtype``, as torch rounds (the bits' rounding where the
    interpreter's cast would truncate; NaN stays NaN)."""
    if _ROUND_BF16_BY_BITS and dtype == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        u = tl.where(x == x, u, 0x7FC0)
        return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def _scale_into(X, O, offs, mask, k):
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(O + offs, _round_to(x * k, O.dtype.element_ty), mask=mask)


# The backward's scaling by the upstream gradient g, both gradients and the scalar gradients in one
# launch (grid: blocks of numel x the two tensors), with the torch formulas' fp32 arithmetic:
# coef = g / count * factor; OA = A k, OB = B k (fp32 products, rounded once to the outputs'
# dtype), k = g (FOLDED: the coefficients are in A and B already) or coef scale; the first
# program also writes dst_i = coef src_i for the SCALARS scalars.
@triton.jit
def _scale_grads_kernel(grad_ptr, A, Bg, OA, OB, numel, count, factor, scale_ptr, src0, src1, dst0,
                        dst1, FOLDED: tl.constexpr, SCALARS: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.load(grad_ptr)
    coef = tl.math.div_rn(g, count) * factor
    if FOLDED:
        k = g
    else:
        k = coef * tl.load(scale_ptr)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if tl.program_id(1) == 0:
        _scale_into(A, OA, offs, mask, k)
    else:
        _scale_into(Bg, OB, offs, mask, k)
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    if SCALARS > 0:
        tl.store(dst0, coef * tl.load(src0), mask=first)
    if SCALARS > 1:
        tl.store(dst1, coef * tl.load(src1), mask=first)
