"""Triton kernels of the SigLIP loss: the pair-loss statistics, the gradient block G (with the
pair losses in the same epilogue when a backward follows), and the forward's finishing launch.

Statistics and gradients each two ways, picked by ops/contrastive_loss_triton.py: a pass over a
cuBLAS logit band (_siglip_stats_kernel, _siglip_grad_kernel) and a fused kernel taking the logit
tile from tl.dot in registers (_siglip_stats_fused_kernel, _siglip_grad_fused_kernel).
The math: ops/blocks.siglip_stats and siglip_grads (the torch reference).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import _grad_coef, _load_tile, _log1p_unit, _logit_tile, _store_p, _store_tile, _tile_pids, _tiles

__all__ = [
    "_siglip_stats_kernel",
    "_siglip_grad_kernel",
    "_siglip_stats_fused_kernel",
    "_siglip_grad_fused_kernel",
    "_siglip_finish_kernel",
    "_fill_kernel",
]


@triton.jit
def _softplus_pairs(t, e, x, nan_sb):
    """softplus(t) = max(t, 0) + log1p(e), e = exp(-|t|) (the caller's, which the gradient also
    uses); NaN where S' (x) is not finite (a non-finite feature) or nan_sb is (scale or bias)."""
    return tl.maximum(t, 0.0) + _log1p_unit(e) + (x * 0.0 + nan_sb)


@triton.jit
def _siglip_pair_loss(x, offs_m, offs_n, diag, scale, bias, nan_sb):
    """softplus(-z (S + bias)) of an S' tile, z = +1 on the pairs i - j == diag (_softplus_pairs)."""
    z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
    t = -z * (x * scale + bias)
    return _softplus_pairs(t, tl.exp(-tl.abs(t)), x, nan_sb)


# SigLIP statistics: row_loss_i += sum_j softplus(-z_ij (S_ij + bias)), z = +1 iff i - j == diag.
# softplus(t) = max(t, 0) + log1p(exp(-|t|)); NaN where S', scale or bias is not finite.
# Gradient: _siglip_grad_kernel.
@triton.jit
def _siglip_stats_kernel(S, stride_s, M, N, COLS, scale_ptr, bias_ptr, row_loss, diag,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    scale = tl.load(scale_ptr)
    bias = tl.load(bias_ptr)
    nan_sb = scale * 0.0 + bias * 0.0  # NaN iff scale or bias is not finite, else 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rows = S + offs_m[:, None].to(tl.int64) * stride_s
    for n0 in range(pid_n * COLS, tl.minimum(pid_n * COLS + COLS, N), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        valid = mask_m[:, None] & (offs_n < N)[None, :]
        x = tl.load(rows + offs_n[None, :], mask=valid, other=0.0).to(tl.float32)
        acc += tl.where(valid, _siglip_pair_loss(x, offs_m, offs_n, diag, scale, bias, nan_sb), 0.0)
    tl.atomic_add(row_loss + offs_m, tl.sum(acc, axis=1), mask=mask_m, sem="relaxed")


# SigLIP gradient tile: P_ij = coef G_ij, G = -z sigmoid(-z x), x = S + bias (P may be S); and
# per row gsum_i += sum_j G_ij, gwsum_i += sum_j G_ij S'_ij (for d bias and d scale). With LOSS
# also row_loss_i += sum_j softplus(-z x) (as _siglip_stats_kernel): the forward of a loss whose
# backward will follow takes its gradients in the same pass. One exponential serves both:
# e = exp(-|t|), t = -z x: softplus(t) = max(t, 0) + log1p(e), sigmoid(t) = 1/(1 + e) or e/(1 + e).
@triton.jit
def _siglip_grad_value(x, offs_m, offs_n, mask_m, valid, scale_ptr, bias_ptr, coef_ptr, gsum, gwsum,
                       row_loss, diag, COEF_SCALE: tl.constexpr, LOSS: tl.constexpr):
    """coef G of an S' tile (to be stored where it is valid); the tile's per-row sums are added
    to gsum / gwsum, and with LOSS its pair losses to row_loss (coef: _grad_coef, coef_mul 1)."""
    scale = tl.load(scale_ptr)
    bias = tl.load(bias_ptr)
    coef = _grad_coef(scale, coef_ptr, 1.0, coef_ptr, coef_ptr, COEF_SCALE, False)
    z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
    t = -z * (x * scale + bias)
    if LOSS:
        e = tl.exp(-tl.abs(t))
        r = 1.0 / (1.0 + e)
        sig = tl.where(t >= 0.0, r, e * r)
        sp = _softplus_pairs(t, e, x, scale * 0.0 + bias * 0.0)
        tl.atomic_add(row_loss + offs_m, tl.sum(tl.where(valid, sp, 0.0), axis=1), mask=mask_m,
                      sem="relaxed")
    else:
        sig = tl.sigmoid(t)
    g = tl.where(valid, -z * sig, 0.0)
    tl.atomic_add(gsum + offs_m, tl.sum(g, axis=1), mask=mask_m, sem="relaxed")
    tl.atomic_add(gwsum + offs_m, tl.sum(g * x, axis=1), mask=mask_m, sem="relaxed")
    return g * coef


@triton.jit
def _siglip_grad_kernel(S, P, stride_s, M, N, scale_ptr, bias_ptr, coef_ptr, gsum, gwsum, row_loss,
                        diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        COEF_SCALE: tl.constexpr, LOSS: tl.constexpr):
    offs_m, offs_n, mask_m, mask_n, valid, x = _load_tile(S, stride_s, M, N, BLOCK_M, BLOCK_N)
    g = _siglip_grad_value(x, offs_m, offs_n, mask_m, valid, scale_ptr, bias_ptr, coef_ptr, gsum,
                           gwsum, row_loss, diag, COEF_SCALE, LOSS)
    _store_tile(P, stride_s, offs_m, offs_n, valid, g)


# SigLIP pair losses of one tile, summed per row (as _siglip_stats_kernel).
@triton.jit
def _siglip_stats_fused_kernel(A, Bm, stride_a, stride_b, M, N, D, scale_ptr, bias_ptr, row_loss,
                               diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                               EVEN_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
                               PROGRAMS: tl.constexpr):
    scale = tl.load(scale_ptr)
    bias = tl.load(bias_ptr)
    nan_sb = scale * 0.0 + bias * 0.0  # NaN iff scale or bias is not finite, else 0
    for tile in tl.range(tl.program_id(0), _tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=TMA):
        offs_m, offs_n, mask_m, mask_n, inside, x = _logit_tile(
            A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K,
            PRECISION, TMA)
        sp = _siglip_pair_loss(x, offs_m, offs_n, diag, scale, bias, nan_sb)
        tl.atomic_add(row_loss + offs_m, tl.sum(tl.where(inside, sp, 0.0), axis=1), mask=mask_m,
                      sem="relaxed")


# SigLIP gradient block of one tile into P, with the per-row sums (as _siglip_grad_kernel).
@triton.jit
def _siglip_grad_fused_kernel(A, Bm, stride_a, stride_b, M, N, D, P, stride_p, scale_ptr, bias_ptr,
                              coef_ptr, gsum, gwsum, row_loss, diag, COEF_SCALE: tl.constexpr,
                              LOSS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                              PRECISION: tl.constexpr, TMA: tl.constexpr, PROGRAMS: tl.constexpr,
                              TMA_STORE: tl.constexpr):
    for tile in tl.range(tl.program_id(0), _tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=TMA):
        offs_m, offs_n, mask_m, mask_n, inside, x = _logit_tile(
            A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K,
            PRECISION, TMA)
        g = _siglip_grad_value(x, offs_m, offs_n, mask_m, inside, scale_ptr, bias_ptr, coef_ptr,
                               gsum, gwsum, row_loss, diag, COEF_SCALE, LOSS)
        pid_m, pid_n = _tile_pids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _store_p(P, stride_p, pid_m * BLOCK_M, pid_n * BLOCK_N, offs_m, offs_n, inside, g,
                 TMA_STORE)


# SigLIP's forward with its gradients, one program: from the row sums [3, M] of the gradient pass
# (sum_j G_ij S'_ij, sum_j G_ij, the pair losses of row i), pair = (sum G S', sum G) and
# loss = (sum of the pair losses) / count (IEEE division, as torch's).
@triton.jit
def _siglip_finish_kernel(sums, M, pair, loss, count, BLOCK: tl.constexpr):
    acc_w = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_l = tl.zeros((BLOCK,), dtype=tl.float32)
    for i0 in range(0, M, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        mask = offs < M
        acc_w += tl.load(sums + offs, mask=mask, other=0.0)
        acc_g += tl.load(sums + M + offs, mask=mask, other=0.0)
        acc_l += tl.load(sums + 2 * M + offs, mask=mask, other=0.0)
    tl.store(pair, tl.sum(acc_w, axis=0))
    tl.store(pair + 1, tl.sum(acc_g, axis=0))
    tl.store(loss, tl.math.div_rn(tl.sum(acc_l, axis=0), count))


# The SigLIP gradient pass's start: buf[:n] = 0 (the row sums its atomics add into) and buf[n] =
# value (its coefficient).
@triton.jit
def _fill_kernel(buf, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf + offs, tl.where(offs == n, value, 0.0), mask=offs <= n)
