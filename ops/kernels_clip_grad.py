"""Triton kernels of the CLIP gradient block: P = coef (softmax_row + softmax_col - labels) of a
block of S', written in the features' dtype for the two cuBLAS GEMMs P @ B and P^T @ A.

Two ways, picked by ops/contrastive_loss_triton.py: a pass over a cuBLAS logit band
(_clip_grad_kernel, in place) and a fused kernel taking the logit tile from tl.dot in registers
(_clip_grad_fused_kernel; on sm_90 ops/gluon_kernels.py's clip_grad_block computes the same P).
The math: ops/blocks.clip_grads (the torch reference).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import _grad_coef, _halves, _load_tile, _logit_tile, _store_p, _store_tile, _tile_pids, _tiles

__all__ = ["_clip_grad_kernel", "_clip_grad_fused_kernel"]


# CLIP gradient tile: P_ij = coef (exp(S_ij - r_i) + exp(S_ij - c_j) - diag_value [i - j == diag]
#   - offset), r, c: final row / column LSEs, written over S' (P may be S: in place). The label
# terms are taken before the rounding to the buffer's dtype (P is close to them once the model
# learns). On the positive pairs S' is row_ref_i, the value the forward's LSEs were taken
# against (not the GEMM's rounding of it), so P_ii is consistent with the loss. coef: _grad_coef.
# With DSCALE == 2 the tile's share of d loss / d s (before coef) comes too, per row:
#   w_i = sum_j exp(S_ij - r_i) (S'_ij - row_ref_i) + exp(S_ij - c_j) (S'_ij - col_ref_j),
# summed over all tiles the forward's E[S'] - S'_ii terms (aux[B], ops/blocks.clip_terms) from
# the final softmax weights, each taken relative to its positive as there (no cancellation).
@triton.jit
def _clip_grad_value(x, offs_m, offs_n, mask_m, mask_n, scale_ptr, coef_ptr, coef_mul, dscale_src,
                     dscale_dst, row_lse, col_lse, row_ref, col_ref, diag, diag_value, offset,
                     COEF_SCALE: tl.constexpr, DSCALE: tl.constexpr):
    """(coef P of an S' tile (fp32), to be stored at its offsets where the tile is valid; w [M]
    with DSCALE == 2, else 0)."""
    scale = tl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    coef = _grad_coef(scale, coef_ptr, coef_mul, dscale_src, dscale_dst, COEF_SCALE, DSCALE)
    r2 = tl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    c2 = tl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    pos = (offs_m[:, None] - offs_n[None, :]) == diag
    t = tl.where(pos, rr[:, None], x)
    t2 = t * scale2
    e_r = tl.exp2(t2 - r2[:, None])
    e_c = tl.exp2(t2 - c2[None, :])
    p = e_r + e_c - (tl.where(pos, diag_value, 0.0) + offset)
    w = 0.0
    if DSCALE == 2:
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        inside = mask_m[:, None] & mask_n[None, :]
        w = tl.sum(tl.where(inside, e_r * (t - rr[:, None]) + e_c * (t - cr[None, :]), 0.0), axis=1)
    return p * coef, w


@triton.jit
def _clip_grad_kernel(S, P, stride_s, M, N, scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst,
                      row_lse, col_lse, row_ref, diag, diag_value, offset, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, COEF_SCALE: tl.constexpr, DSCALE: tl.constexpr):
    offs_m, offs_n, mask_m, mask_n, valid, x = _load_tile(S, stride_s, M, N, BLOCK_M, BLOCK_N)
    p, _ = _clip_grad_value(x, offs_m, offs_n, mask_m, mask_n, scale_ptr, coef_ptr, coef_mul,
                            dscale_src, dscale_dst, row_lse, col_lse, row_ref, row_ref, diag,
                            diag_value, offset, COEF_SCALE, DSCALE)
    _store_tile(P, stride_s, offs_m, offs_n, valid, p)


@triton.jit
def _clip_grad_part(P, stride_p, x, row0, col0, offs_m, mask_m, N, g, WIDTH: tl.constexpr,
                    COEF_SCALE: tl.constexpr, DSCALE: tl.constexpr, TMA_STORE: tl.constexpr):
    """Columns [col0, col0 + WIDTH) of a gradient tile (x: their S', fp32) into P (_store_p); g:
    _clip_grad_value's arguments from scale_ptr to offset, as a tuple. Returns the rows' d-scale
    shares (_clip_grad_value's w)."""
    offs_n = col0 + tl.arange(0, WIDTH)
    mask_n = offs_n < N
    p, w = _clip_grad_value(x, offs_m, offs_n, mask_m, mask_n, g[0], g[1], g[2], g[3], g[4], g[5],
                            g[6], g[7], g[8], g[9], g[10], g[11], COEF_SCALE, DSCALE)
    _store_p(P, stride_p, row0, col0, offs_m, offs_n, mask_m[:, None] & mask_n[None, :], p,
             TMA_STORE)
    return w


# CLIP gradient block of one tile into P (as _clip_grad_kernel, from the fp32 tile). DSCALE == 2:
# each program also adds coef times its tiles' d-scale shares (_clip_grad_value) into dscale_dst.
# SPLIT (1, 2 or 4): the epilogue takes the tile in that many column slices, one after another
# (fewer registers live at once, a smaller store; P's descriptor has blocks [BLOCK_M,
# BLOCK_N / SPLIT]).
@triton.jit
def _clip_grad_fused_kernel(A, Bm, stride_a, stride_b, M, N, D, P, stride_p, scale_ptr, coef_ptr,
                            coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
                            diag, diag_value, offset, COEF_SCALE: tl.constexpr,
                            DSCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                            PRECISION: tl.constexpr, TMA: tl.constexpr, PROGRAMS: tl.constexpr,
                            TMA_STORE: tl.constexpr, SPLIT: tl.constexpr = 1):
    g = (scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst, row_lse, col_lse, row_ref, col_ref,
         diag, diag_value, offset)
    w_acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for tile in tl.range(tl.program_id(0), _tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=TMA):
        offs_m, offs_n, mask_m, mask_n, inside, x = _logit_tile(
            A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K,
            PRECISION, TMA, False)
        pid_m, pid_n = _tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        r0 = pid_m * BLOCK_M
        c0 = pid_n * BLOCK_N
        width: tl.constexpr = BLOCK_N // SPLIT  # (of a slice)
        if SPLIT == 1:
            w_acc += _clip_grad_part(P, stride_p, x, r0, c0, offs_m, mask_m, N, g, width,
                                     COEF_SCALE, DSCALE, TMA_STORE)
        elif SPLIT == 2:
            x0, x1 = _halves(x, BLOCK_M, BLOCK_N)
            w_acc += _clip_grad_part(P, stride_p, x0, r0, c0, offs_m, mask_m, N, g, width,
                                     COEF_SCALE, DSCALE, TMA_STORE)
            w_acc += _clip_grad_part(P, stride_p, x1, r0, c0 + width, offs_m, mask_m, N, g, width,
                                     COEF_SCALE, DSCALE, TMA_STORE)
        else:
            tl.static_assert(SPLIT == 4)
            x0, x1 = _halves(x, BLOCK_M, BLOCK_N)
            x00, x01 = _halves(x0, BLOCK_M, 2 * width)
            x10, x11 = _halves(x1, BLOCK_M, 2 * width)
            w_acc += _clip_grad_part(P, stride_p, x00, r0, c0, offs_m, mask_m, N, g, width,
                                     COEF_SCALE, DSCALE, TMA_STORE)
            w_acc += _clip_grad_part(P, stride_p, x01, r0, c0 + width, offs_m, mask_m, N, g, width,
                                     COEF_SCALE, DSCALE, TMA_STORE)
            w_acc += _clip_grad_part(P, stride_p, x10, r0, c0 + 2 * width, offs_m, mask_m, N, g,
                                     width, COEF_SCALE, DSCALE, TMA_STORE)
            w_acc += _clip_grad_part(P, stride_p, x11, r0, c0 + 3 * width, offs_m, mask_m, N, g,
                                     width, COEF_SCALE, DSCALE, TMA_STORE)
    if DSCALE == 2:
        tl.atomic_add(dscale_dst, tl.load(coef_ptr) * coef_mul * tl.sum(w_acc, axis=0), sem="relaxed")
