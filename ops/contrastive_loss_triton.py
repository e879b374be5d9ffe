"""Triton kernels for the contrastive losses (CLIP InfoNCE and SigLIP) on cuBLAS logit bands.

Design. The matrix work goes to cuBLAS; Triton only does what cuBLAS cannot, reading each
element of S once per direction. For a band of R rows of A (all of A when the whole R x N matrix
fits in the caller's budget) the host computes S' = A_band Bm^T with one GEMM into a buffer in
the features' dtype (bf16 logits, as autocast rounds them), then:
  forward  (_clip_stats_kernel: a row pass and a column pass / _siglip_stats_kernel): the row
           sums and the column partial sums of exp(S - shift) and exp(S - shift) (S' - ref), or
           the SigLIP pair losses, accumulated element-wise in registers and reduced once per
           program (fp32 atomics across programs).
  backward (_clip_grad_kernel / _siglip_grad_kernel): recomputes the block with one GEMM (or
           reads the kept whole matrix), writes P = coef (exp(S - r) + exp(S - c) - labels)
           (SigLIP: coef G) in the features' dtype, and two GEMMs give P @ Bm and P^T @ A_band.
           Where the whole matrix does not fit the band budget its blocks are _GRAD_BLOCK rows x
           columns (not full-width bands): the fp32 sums of both GEMMs then take few, long
           accumulations (_grad_bands).
  The O(B) prologue (positives, norms, shifts, the sums zeroed) and epilogue (loss terms, LSEs,
  d-scale sums) of the single-device loss are one kernel launch each (_clip_prologue_kernel,
  _clip_shift_kernel, _clip_epilogue_kernel); SigLIP's forward finishes in one launch
  (_siglip_finish_kernel) and its backward is one (_scale_grads_kernel, as is CLIP's fp16 scaling):
  no host sync anywhere, capturable in a CUDA graph. At small B the GPU time is set by the number
  of launches: SigLIP 6 a forward + backward, CLIP 8; on an H200, bf16, D = 768, behind queued
  work, 0.92x / 0.90x the compiled dense losses at B = 1,024 (1.54x / 1.02x with 15 / 11 launches).
Blocks of at most _FUSED_MAX_LOGITS logits (16,384^2) that are not kept take fused kernels
instead: the logit tile comes from tl.dot in registers and the statistics (forward: one launch,
no band buffer) or P (backward: one launch per band, then the two cuBLAS GEMMs) are taken from
it in the same program. Fewer launches win below 32k (B = 1k-16k: 1.16-4.42 ms against
1.66-4.86 ms on an H200); above, cuBLAS's GEMM rate wins (tl.dot at K = 768 with the epilogue:
~300 TFLOP/s against ~660). On Hopper the fused kernels load by TMA tensor descriptors as
persistent programs (_use_tma: 16-bit features, aligned rows, large blocks), which makes the
fused gradient block faster than cuBLAS's GEMM plus a pass at every B, so the backward is fused
there at every size. From _STRIPS_MIN_LOGITS on, a CLIP forward whose backward folds its
coefficients (one device, nothing kept) takes only the plain sums, by column strips
(_clip_sums_strip_kernel: the column terms summed in registers down a chunk of row blocks, reduced
across warps once a chunk); its backward's gradient kernel then sums d loss / d s from the final
softmax weights (DSCALE 2): 13.6 against 16.4 ms for the statistics at 65k. On sm_90 the CLIP
gradient block goes to a warp-specialised Gluon kernel instead (ops/gluon_kernels.py, _gluon_grad:
the same P bit for bit, its epilogue beside the MMA; 0.103 against 0.116 ms for the 65k block),
and so do the strip sums (_gluon_sums: each strip's column block of B kept in shared memory;
11.3 against 13.6 ms at 65k) and the SigLIP gradient block with its pair losses (_gluon_grad with
_GLUON_SIGLIP: 0.132 against 0.163 ms for the 65k block).
FLOPs: 8 B^2 D in GEMMs (6 B^2 D when the matrix is kept from forward to backward: whole in fp32
at small B, or, within a larger ``logits_budget_mb``, as the forward's bands in the features'
dtype, read back _KEPT_BANDS_FACTOR bands at a time by the backward). SigLIP's gradient needs no
statistic of the whole row, so a forward whose backward will follow runs the gradient pass itself, the pair losses
summed in the same epilogue (``siglip_grads_triton(with_loss=True)``): 6 B^2 D and no
statistics pass, the backward only scales the result by the incoming gradient. GEMMs run at
cuBLAS's rate or tl.dot's; the Triton kernels are
memory-bound (2-3.5 TB/s on an H200). Bands hold
<= _BAND_FACTOR max(N D, 2^24) elements (the backward's P buffer over kept bands _KEPT_BANDS_FACTOR
times that), so the extra memory stays O(B D) at any batch size.
Measured and not used: one stats kernel for both directions (per-tile reductions both ways:
0.3-0.6 TB/s; column strips with per-tile row reductions: 0.9-1.3 TB/s, 2-3% slower end to end
at B = 32k-65k than two kernels) and overlapping a band's Triton kernel with the next band's GEMM
on a second stream (no gain at B = 16k-65k: the GEMMs hold every SM; _OVERLAP, off).
Limits: band logits are rounded to the features' dtype before the exponentials (as a dense bf16
loss does; a kept whole matrix stays fp32); B = 1k-8k is bound by the host (~1 ms a call:
Python, 5-6 Triton launches, 2-3 cuBLAS calls, two registered-op dispatches); the fp32 atomics make the last bits of the sums depend on the order in which
programs finish (not bitwise deterministic run to run).
Under TRITON_INTERPRET=1 (CPU) the kernels run exactly for fp32/fp16 (the host side does the
GEMMs in fp32 there); bf16 needs a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from . import gluon_kernels
from .precision import matmul_precision

__all__ = [
    "band_rows",
    "clip_prologue_triton",
    "clip_epilogue_triton",
    "clip_stats_triton",
    "clip_grads_triton",
    "siglip_stats_triton",
    "siglip_grads_triton",
    "siglip_loss_grads_triton",
    "scale_grads_triton",
    "sums_in_strips",
    "logit_bound_limit",
]

LOG2E = 1.4426950408889634

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ----------------------------------------------------------------------------------------------
# Kernels (all read a band S'[M, N] of logits without the scale, row stride stride_s; row offsets
# in int64: a kept whole matrix passes 2^31 elements at B = 46,341)
# ----------------------------------------------------------------------------------------------
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


# Prologue (O(B D), one read of the features): ref_i = <A_i, B_i> (the positive's S'),
# |A_i|, |B_i| in fp32, and each program's largest norms, written to its own slot part_max[pid]
# (norms are >= 0; the shift kernel takes the max of the slots: no buffer to zero first, where an
# atomic max would need one). Each program also zeroes its rows of the four [M] statistics sums
# of the stats kernels (what would otherwise be a separate fill launch). Gradient: none (the
# shifts are constants of the loss; ref's gradient is taken inside the GEMMs).
@triton.jit
def _clip_prologue_kernel(A, Bm, stride_a, stride_b, M, D, ref, norm_a, norm_b, part_max, sums,
                          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    dot = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sa = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sb = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask = mask_m[:, None] & (offs_d < D)[None, :]
        a = tl.load(A + offs_m[:, None] * stride_a + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(Bm + offs_m[:, None] * stride_b + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        dot += tl.sum(a * b, axis=1)
        sa += tl.sum(a * a, axis=1)
        sb += tl.sum(b * b, axis=1)
    na = tl.sqrt(sa)
    nb = tl.sqrt(sb)
    tl.store(ref + offs_m, dot, mask=mask_m)
    tl.store(norm_a + offs_m, na, mask=mask_m)
    tl.store(norm_b + offs_m, nb, mask=mask_m)
    tl.store(part_max + 2 * pid, tl.max(tl.where(mask_m, na, 0.0), axis=0))
    tl.store(part_max + 2 * pid + 1, tl.max(tl.where(mask_m, nb, 0.0), axis=0))
    for j in tl.static_range(4):
        tl.store(sums + j * M + offs_m, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=mask_m)


# Shifts: row_shift_i = max(s ref_i, |s| |A_i| max|B| - MARGIN), col likewise (see
# ops/blocks.clip_shifts), max|A| and max|B| the largest of the ``parts`` pairs in part_max. A
# non-finite norm or scale gives a non-finite shift, a bound above ``limit`` a NaN one
# (ops/blocks.LOGIT_BOUND_LIMIT). With TIGHTEN (one device), a shift more than ``slack`` above its
# positive logit (the bound says too little of the row's sum to trust underflow,
# ops/blocks.SHIFT_SLACK) becomes the row's true maximum max_j s S'_ij (never below s ref_i), from
# tl.dots over the whole row (_true_max); the column shifts likewise from B A^T. Each program
# takes BLOCK rows and the same BLOCK columns, so that this rare work spreads over B / BLOCK
# programs; when no shift of a program is loose it costs the check alone (no launch of its own).
@triton.jit
def _true_max(X, Y, stride_x, stride_y, M, D, scale, offs_m, mask_m, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """max_j scale (X Y^T)_ij over all M columns j, for the rows offs_m of X (fp32 [BLOCK_M])."""
    offs_k = tl.arange(0, BLOCK_K)
    top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    for n0 in range(0, M, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            mask_k = (k0 + offs_k) < D
            x = tl.load(X + offs_m[:, None].to(tl.int64) * stride_x + (k0 + offs_k)[None, :],
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            y = tl.load(Y + offs_n[None, :].to(tl.int64) * stride_y + (k0 + offs_k)[:, None],
                        mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc = tl.dot(x, y, acc, input_precision=PRECISION)
        top = tl.maximum(top, tl.max(tl.where(mask_n[None, :], acc * scale, float("-inf")), axis=1))
    return top


@triton.jit
def _tightened(shift, d, slack, X, Y, stride_x, stride_y, M, D, scale, offs, mask,
               BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PRECISION: tl.constexpr):
    """``shift`` with its loose entries (more than ``slack`` above d) replaced by max(true
    maximum, d)."""
    loose = mask & (shift - d > slack)
    if tl.sum(loose.to(tl.int32), axis=0) > 0:
        top = _true_max(X, Y, stride_x, stride_y, M, D, scale, offs, mask, BLOCK, BLOCK_N, BLOCK_K,
                        PRECISION)
        shift = tl.where(loose, tl.maximum(top, d), shift)
    return shift


@triton.jit
def _clip_shift_kernel(scale_ptr, ref, norm_a, norm_b, part_max, parts, row_shift, col_shift, M,
                       margin, limit, A, Bm, stride_a, stride_b, D, slack, BLOCK: tl.constexpr,
                       PARTS: tl.constexpr, TIGHTEN: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    max_a = tl.zeros((PARTS,), dtype=tl.float32)
    max_b = tl.zeros((PARTS,), dtype=tl.float32)
    for p0 in range(0, parts, PARTS):
        offs_p = p0 + tl.arange(0, PARTS)
        max_a = tl.maximum(max_a, tl.load(part_max + 2 * offs_p, mask=offs_p < parts, other=0.0))
        max_b = tl.maximum(max_b, tl.load(part_max + 2 * offs_p + 1, mask=offs_p < parts, other=0.0))
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    scale = tl.load(scale_ptr)
    d = scale * tl.load(ref + offs, mask=mask, other=0.0)
    na = tl.load(norm_a + offs, mask=mask, other=0.0)
    nb = tl.load(norm_b + offs, mask=mask, other=0.0)
    bound_r = tl.abs(scale) * na * tl.max(max_b, axis=0) - margin
    bound_c = tl.abs(scale) * nb * tl.max(max_a, axis=0) - margin
    # where(a > b, a, b) rather than maximum: a NaN in either must reach the shift
    row = tl.where(bound_r > d, bound_r, d + 0.0 * bound_r)
    col = tl.where(bound_c > d, bound_c, d + 0.0 * bound_c)
    if TIGHTEN:
        row = _tightened(row, d, slack, A, Bm, stride_a, stride_b, M, D, scale, offs, mask, BLOCK,
                         BLOCK_N, BLOCK_K, PRECISION)
        col = _tightened(col, d, slack, Bm, A, stride_b, stride_a, M, D, scale, offs, mask, BLOCK,
                         BLOCK_N, BLOCK_K, PRECISION)
    tl.store(row_shift + offs, tl.where(bound_r + margin > limit, float("nan"), row), mask=mask)
    tl.store(col_shift + offs, tl.where(bound_c + margin > limit, float("nan"), col), mask=mask)


@triton.jit
def _softplus_log(off, delta):
    """LSE_i - d_i from the off-diagonal sum and delta = shift - d >= 0 (clip_terms)."""
    x = tl.log(off) + delta
    sp = tl.maximum(x, 0.0) + _log1p_unit(tl.exp(-tl.abs(x)))
    return tl.where(delta == 0.0, _log1p(off), sp)


# Epilogue (O(B), one program): the per-row and per-column terms of ops/blocks.clip_terms from the
# complete sums, their sums over 2 count (count = B, or the global batch for one rank's share), and
# the d-scale sums: out[0] = 1/2 (mean row + mean col loss) (NaN if any shift is non-finite), aux[i] = ref_i is kept, aux[M] = sum of the
# E[S'] - S'_ii terms, aux[M + 1] = sum ref. Writes the final LSEs for the backward.
@triton.jit
def _clip_epilogue_kernel(scale_ptr, sums, row_shift, col_shift, aux, row_lse, col_lse, out, M,
                          count, BLOCK: tl.constexpr):
    scale = tl.load(scale_ptr)
    acc_loss = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_e = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_ref = tl.zeros((BLOCK,), dtype=tl.float32)
    bad = tl.zeros((BLOCK,), dtype=tl.float32)
    for i0 in range(0, M, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        mask = offs < M
        r = tl.load(aux + offs, mask=mask, other=0.0)
        d = scale * r
        rs = tl.load(row_shift + offs, mask=mask, other=0.0)
        cs = tl.load(col_shift + offs, mask=mask, other=0.0)
        r_off = tl.load(sums + offs, mask=mask, other=0.0)
        r_w = tl.load(sums + M + offs, mask=mask, other=0.0)
        c_off = tl.load(sums + 2 * M + offs, mask=mask, other=0.0)
        c_w = tl.load(sums + 3 * M + offs, mask=mask, other=0.0)
        dr = rs - d
        dc = cs - d
        lr = _softplus_log(r_off, dr)
        lc = _softplus_log(c_off, dc)
        tr = tl.exp(-dr) + r_off
        tc = tl.exp(-dc) + c_off
        er = tl.where(tr > 0, r_w / tr, 0.0)
        ec = tl.where(tc > 0, c_w / tc, 0.0)
        tl.store(row_lse + offs, d + lr, mask=mask)
        tl.store(col_lse + offs, d + lc, mask=mask)
        acc_loss += tl.where(mask, lr + lc, 0.0)
        acc_e += tl.where(mask, er + ec, 0.0)
        acc_ref += tl.where(mask, r, 0.0)
        finite = (tl.abs(rs) < float("inf")) & (tl.abs(cs) < float("inf"))
        bad += tl.where(mask & (finite == 0), 1.0, 0.0)
    loss = 0.5 * tl.sum(acc_loss, axis=0) / count
    loss = tl.where(tl.sum(bad, axis=0) > 0, float("nan"), loss)
    tl.store(out, loss)
    tl.store(aux + M, tl.sum(acc_e, axis=0))
    tl.store(aux + M + 1, tl.sum(acc_ref, axis=0))


# CLIP statistics. For rows i and columns j of the band, S = scale * S', skipping the positive
# pairs (i - j == diag; the assembly adds them analytically):
#   row_sum_i  += sum_j exp(S_ij - rs_i),  row_wsum_i += sum_j exp(S_ij - rs_i) (S'_ij - rr_i)
#   col_sum_j  += sum_i exp(S_ij - cs_j),  col_wsum_j += sum_i exp(S_ij - cs_j) (S'_ij - cr_j)
# rs/cs: fixed shifts (no running max: partial sums add); rr/cr: the diagonal S' (weights taken
# relative to it, so E[S'] - S'_ii never cancels). Gradient: none (the backward recomputes).
# Two passes, one per direction, each reading the band once: a program walks its rows (its
# columns) tile by tile adding into element-wise register accumulators, and reduces them once at
# the end (one fp32 atomic per row or column per program). Reducing every tile, and in both
# directions in one program, ran at 0.3-0.6 TB/s on an H200; one pass per direction reaches the
# memory rate. Both passes run as one grid (_clip_stats_kernel: the row programs, then the column
# programs; one launch fewer per band than a kernel per pass, each program doing the same work).
@triton.jit
def _clip_row_stats(S, stride_s, M, N, COLS, scale_ptr, row_shift, row_ref, row_sum, row_wsum,
                    diag, pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_w = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rows = S + offs_m[:, None].to(tl.int64) * stride_s
    for n0 in range(pid_n * COLS, tl.minimum(pid_n * COLS + COLS, N), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = mask_m[:, None] & (offs_n < N)[None, :]
        # the load is masked by the bounds only (a mask that varies along the row would make
        # it element-wise instead of 16-byte vectors); the positives are dropped after it
        x = tl.load(rows + offs_n[None, :], mask=inside, other=0.0).to(tl.float32)
        valid = inside & ((offs_m[:, None] - offs_n[None, :]) != diag)
        p = tl.where(valid, tl.exp2(x * scale2 - rs2[:, None]), 0.0)
        acc += p
        acc_w += p * (x - rr[:, None])
    tl.atomic_add(row_sum + offs_m, tl.sum(acc, axis=1), mask=mask_m, sem="relaxed")
    tl.atomic_add(row_wsum + offs_m, tl.sum(acc_w, axis=1), mask=mask_m, sem="relaxed")


@triton.jit
def _clip_col_stats(S, stride_s, M, N, ROWS, scale_ptr, col_shift, col_ref, col_sum, col_wsum,
                    diag, pid_n, pid_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_w = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for m0 in range(pid_m * ROWS, tl.minimum(pid_m * ROWS + ROWS, M), BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        inside = (offs_m < M)[:, None] & mask_n[None, :]
        x = tl.load(S + offs_m[:, None].to(tl.int64) * stride_s + offs_n[None, :], mask=inside,
                    other=0.0).to(tl.float32)
        valid = inside & ((offs_m[:, None] - offs_n[None, :]) != diag)
        q = tl.where(valid, tl.exp2(x * scale2 - cs2[None, :]), 0.0)
        acc += q
        acc_w += q * (x - cr[None, :])
    tl.atomic_add(col_sum + offs_n, tl.sum(acc, axis=0), mask=mask_n, sem="relaxed")
    tl.atomic_add(col_wsum + offs_n, tl.sum(acc_w, axis=0), mask=mask_n, sem="relaxed")


@triton.jit
def _clip_stats_kernel(S, stride_s, M, N, COLS, ROWS, GRID_M, ROW_PROGRAMS, GRID_N, scale_ptr,
                       row_shift, row_ref, row_sum, row_wsum, col_shift, col_ref, col_sum,
                       col_wsum, diag, ROW_M: tl.constexpr, ROW_N: tl.constexpr,
                       COL_M: tl.constexpr, COL_N: tl.constexpr):
    """Both passes in one launch: programs [0, ROW_PROGRAMS) are the row grid (GRID_M row blocks
    x column spans of COLS), the rest the column grid (GRID_N column strips x row spans of ROWS),
    each numbered as in its own 2-D grid (the first index fastest)."""
    pid = tl.program_id(0)
    if pid < ROW_PROGRAMS:
        _clip_row_stats(S, stride_s, M, N, COLS, scale_ptr, row_shift, row_ref, row_sum, row_wsum,
                        diag, pid % GRID_M, pid // GRID_M, ROW_M, ROW_N)
    else:
        col = pid - ROW_PROGRAMS
        _clip_col_stats(S, stride_s, M, N, ROWS, scale_ptr, col_shift, col_ref, col_sum, col_wsum,
                        diag, col % GRID_N, col // GRID_N, COL_M, COL_N)


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
def _store_tile(P, stride_p, offs_m, offs_n, valid, value):
    tl.store(P + offs_m[:, None].to(tl.int64) * stride_p + offs_n[None, :],
             value.to(P.dtype.element_ty), mask=valid)


@triton.jit
def _clip_grad_kernel(S, P, stride_s, M, N, scale_ptr, coef_ptr, coef_mul, dscale_src, dscale_dst,
                      row_lse, col_lse, row_ref, diag, diag_value, offset, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, COEF_SCALE: tl.constexpr, DSCALE: tl.constexpr):
    offs_m, offs_n, mask_m, mask_n, valid, x = _load_tile(S, stride_s, M, N, BLOCK_M, BLOCK_N)
    p, _ = _clip_grad_value(x, offs_m, offs_n, mask_m, mask_n, scale_ptr, coef_ptr, coef_mul,
                            dscale_src, dscale_dst, row_lse, col_lse, row_ref, row_ref, diag,
                            diag_value, offset, COEF_SCALE, DSCALE)
    _store_tile(P, stride_s, offs_m, offs_n, valid, p)


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

# CLIP statistics of one tile (the sums of _clip_stats_kernel's row and column passes),
# reduced in the program and added by one fp32 atomic per row and per column.
@triton.jit
def _clip_stats_fused_kernel(A, Bm, stride_a, stride_b, M, N, D, scale_ptr, row_shift, row_ref,
                             col_shift, col_ref, row_sum, row_wsum, col_sum, col_wsum, diag,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                             TMA: tl.constexpr, PROGRAMS: tl.constexpr, FAST: tl.constexpr = 0):
    """FAST: tiles inside the block and off the positives (_interior) skip both masks."""
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    for tile in tl.range(tl.program_id(0), _tiles(M, N, BLOCK_M, BLOCK_N), PROGRAMS, flatten=TMA):
        offs_m, offs_n, mask_m, mask_n, inside, x = _logit_tile(
            A, Bm, stride_a, stride_b, M, N, D, tile, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K,
            PRECISION, TMA, False)
        rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        xs = x * scale2
        if FAST and _interior(tile, M, N, diag, BLOCK_M, BLOCK_N, GROUP_M):
            p = tl.exp2(xs - rs2[:, None])
            q = tl.exp2(xs - cs2[None, :])
        else:
            valid = inside & ((offs_m[:, None] - offs_n[None, :]) != diag)
            p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
            q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
        tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
        tl.atomic_add(row_wsum + offs_m, tl.sum(p * (x - rr[:, None]), axis=1), mask=mask_m,
                      sem="relaxed")
        tl.atomic_add(col_sum + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
        tl.atomic_add(col_wsum + offs_n, tl.sum(q * (x - cr[None, :]), axis=0), mask=mask_n,
                      sem="relaxed")


# CLIP plain sums (no weighted sums: the caller takes d scale in the backward) by column strips:
# a work item is one column block and a chunk of CHUNK row blocks (chunk-major, so that the
# programs running at once share the chunk's rows in L2). The rows are reduced every tile (within
# a warp) and added by atomics; the column terms are added element-wise into a register tile and
# reduced across the warps once per item, not once per tile. The tiles that need masks (on the
# positives, past the last row or column) run in loops of their own, the others in unmasked
# loops: a mask chosen per tile by a branch cost as much as masking every tile (1.4 ms of 14.7
# at 65k). H200, bf16, D = 768 (an unmasked copy):
# 13.70 / 3.42 ms at B = 65k / 32k against 16.52 / 3.95 for the per-tile kernel
# (_clip_stats_fused_kernel, with the weighted sums); with the weighted sums in the strips too (a
# second register tile) 28.8 / 7.0 ms (spilled).
@triton.jit
def _strip_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, offs_n, mask_n, diag, pid_n,
                 lo, hi, q_acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """Row blocks [lo, hi) of column block pid_n: row sums added, column terms into q_acc."""
    for pid_m in range(lo, hi):
        x = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            a = A.load([pid_m * BLOCK_M, k0])
            b = Bm.load([pid_n * BLOCK_N, k0])
            x = tl.dot(a, b.T, x, input_precision=PRECISION)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        xs = x * scale2
        if MASKED:
            rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
            valid = mask_m[:, None] & mask_n[None, :] & ((offs_m[:, None] - offs_n[None, :]) != diag)
            p = tl.where(valid, tl.exp2(xs - rs2[:, None]), 0.0)
            q = tl.where(valid, tl.exp2(xs - cs2[None, :]), 0.0)
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), mask=mask_m, sem="relaxed")
        else:
            rs2 = tl.load(row_shift + offs_m) * 1.4426950408889634
            p = tl.exp2(xs - rs2[:, None])
            q = tl.exp2(xs - cs2[None, :])
            tl.atomic_add(row_sum + offs_m, tl.sum(p, axis=1), sem="relaxed")
        q_acc += q
    return q_acc


@triton.jit
def _clip_sums_strip_kernel(A, Bm, M, N, D, scale_ptr, row_shift, col_shift, row_sum, col_sum,
                            diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
                            PROGRAMS: tl.constexpr):
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    full_m = M // BLOCK_M  # row blocks with no row past M
    for item in tl.range(tl.program_id(0), tl.cdiv(grid_m, CHUNK) * grid_n, PROGRAMS):
        pid_n = item % grid_n
        lo = (item // grid_n) * CHUNK
        hi = tl.minimum(lo + CHUNK, grid_m)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        # unmasked: [lo, d0) and [d1, top); masked: [d0, d1) (the positives' rows i - diag in
        # [n0, n0 + BLOCK_N), or all of the chunk when the column block runs past N) and
        # [top, hi) (a row block running past M)
        top = tl.maximum(tl.minimum(hi, full_m), lo)
        first = n0 + diag  # the positives' rows of this column block: [first, first + BLOCK_N)
        last = first + BLOCK_N - 1
        d0 = tl.minimum(tl.maximum(tl.maximum(first, 0) // BLOCK_M, lo), top)
        d1 = tl.where(last < 0, d0, tl.minimum(tl.maximum(last // BLOCK_M + 1, d0), top))
        if n0 + BLOCK_N > N:
            d0 = lo
            d1 = top
        q_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        q_acc = _strip_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, offs_n, mask_n, diag,
                             pid_n, lo, d0, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, False)
        q_acc = _strip_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, offs_n, mask_n, diag,
                             pid_n, d0, d1, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, True)
        q_acc = _strip_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, offs_n, mask_n, diag,
                             pid_n, d1, top, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, False)
        q_acc = _strip_tiles(A, Bm, M, N, D, scale2, row_shift, row_sum, cs2, offs_n, mask_n, diag,
                             pid_n, top, hi, q_acc, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, True)
        tl.atomic_add(col_sum + offs_n, tl.sum(q_acc, axis=0), mask=mask_n, sem="relaxed")


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


# ----------------------------------------------------------------------------------------------
# Finishing launches (O(B) and O(B D)): what would otherwise be several small torch launches
# ----------------------------------------------------------------------------------------------
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


_ROUND_BF16_BY_BITS = tl.constexpr(_INTERPRET)
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


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
if _INTERPRET:  # small tiles: the interpreter's cost grows with the tile
    _STATS_M, _STATS_N, _STATS_WARPS = 16, 16, 4
    _COLS_M, _COLS_N, _COLS_WARPS = 16, 16, 4
    _GRAD_M, _GRAD_N, _GRAD_WARPS = 16, 16, 4
else:
    # measured on an H200 over a 1536 x 65536 bf16 band: rows 2.4 TB/s, columns 1.9 TB/s
    # (one launch runs both, _clip_stats_kernel: the same number of warps)
    _STATS_M, _STATS_N, _STATS_WARPS = 32, 128, 4  # row programs walk right along 32 rows
    _COLS_M, _COLS_N, _COLS_WARPS = 32, 128, _STATS_WARPS  # column programs walk down 128 columns
    _GRAD_M, _GRAD_N, _GRAD_WARPS = 16, 256, 4  # 3.5 TB/s on an H200 (32 x 256 x 8 warps: 2.9)

# Fused kernels' tiles (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), the fastest of
# bench/bench_loss_kernels.py's sweep at B = 16,384 on an H200. The fused kernels run the
# recompute path of blocks with at most _FUSED_MAX_LOGITS logits; larger blocks go to cuBLAS
# bands and Triton passes. Measured on an H200 (op fwd+bwd, bf16, D = 768): fused 1.16 / 1.25 /
# 1.93 / 4.42 ms at B = 1k / 4k / 8k / 16k against 1.66 / 1.80 / 2.19 / 4.86 ms (fewer launches),
# but 16.6 / 64.8 ms at 32k / 65k against 14.9 / 56.8 ms: tl.dot with this short K (768) runs at
# ~290-330 TFLOP/s with the epilogue, cuBLAS at ~660.
if _INTERPRET:
    _FUSED_STATS = _FUSED_GRAD = (16, 16, 16, 2, 4, 1)
else:
    _FUSED_STATS = (128, 64, 64, 8, 4, 4)
    _FUSED_GRAD = (128, 256, 64, 8, 8, 3)
# SigLIP's gradient kernel with the pair losses in its epilogue (pointer loads: blocks below
# _TMA_MIN_LOGITS on Hopper, every block before it). With _FUSED_GRAD's tiles it spills 4 KB a
# thread on sm_90 (bench/bench_kernel_resources.py) and took 0.045 / 0.065 ms at B = 1k / 2k on an
# H200, with these 0.025 / 0.027.
_FUSED_SIGLIP_GRAD_LOSS = _FUSED_GRAD if _INTERPRET else (128, 128, 64, 8, 8, 3)
_FUSED_MAX_LOGITS = 1 << 28  # a 16,384 x 16,384 block

# The same kernels with TMA tensor descriptors (Hopper and later, 16-bit features whose rows are
# 16-byte aligned, blocks of at least _TMA_MIN_LOGITS: below, building the descriptors costs more
# host time than the kernel saves): the copy engine loads the tiles and persistent programs (a
# seventh tile entry: programs per SM) walk them; P is stored by the copy engine too. Tiles: the
# fastest of bench/bench_loss_kernels.py --tma on an H200 (bf16, D = 768, the op's own kernels):
# statistics of the whole B x B 1.14 / 18.6 ms at B = 16k / 65k (pointer loads 1.44 / 21.7,
# cuBLAS's GEMM with the two Triton passes 1.34 / 18.1); the gradient block of one backward band
# (2,048 / 1,536 rows) 0.186 / 0.409 ms (pointer 0.187 / 0.465, cuBLAS's GEMM + the Triton pass
# 0.158 / 0.424). So with TMA the backward is fused at every size (_TMA_MAX_LOGITS); the
# statistics, without the fast path below, only up to 32k. End to end (the op, fwd + bwd, same
# process) TMA gains 1-2% at B = 8k-65k: 56.8 ms against 57.7-58.1 at 65k.
# The statistics' eighth entry: the interior-tile fast path (FAST, _interior). Measured on an
# H200 (bench_loss_kernels.py --variants): 1.036 / 4.094 / 17.00 ms at 16k / 32k / 65k against 1.081 /
# 4.164 / 17.82 without, and against 17.65 for cuBLAS + the passes at 65k, so the statistics are
# fused at every size (end to end at 65k 49.86 against 51.73 ms). Measured and not used: the same
# fast path in the gradient kernel (198-245 registers a thread against 168: slower); warp
# specialisation of the persistent loop (Triton 3.6's pass fails on these kernels, except beside a
# one-exponential gradient variant, where the statistics took 18.46 against 17.64 ms at 65k); 8 warps with
# 128 x 128 / 128 x 256 tiles, 3 programs per SM, BLOCK_K 128 or 3 stages (2-70% slower).
_TMA_STATS = (128, 64, 64, 8, 4, 4, 2, 1)
# The gradient kernel's eighth entry: SPLIT, its epilogue in that many column slices of the tile
# (_clip_grad_fused_kernel). Where a block's time goes (an 8,192 x 4,096 block at 65k on an H200):
# cuBLAS's GEMM of the logits 0.077 ms; the kernel with 128 x 64 tiles 0.133, its GEMM with the
# store and no epilogue 0.113 (the small tiles), 128 x 256's 0.082, with both exponentials 0.114:
# each program runs its epilogue after the tile's MMA, not beside it. Taken: 64 x 128 tiles (one
# warpgroup, wgmma N = 128), 4 warps, 4 stages, two programs per SM (one's epilogue beside the
# other's MMA), two slices (188 registers a thread with the d-scale sum, no spill; one slice: 255
# and a spill). The op behind 20
# ms of queued work, every variant twice in one process: against 128 x 128 with 8 warps and one
# program per SM (two slices) 0.79 / 3.15 / 12.45-12.50 / 47.6-48.1 ms at 8k / 16k / 32k / 65k
# against 0.81 / 3.21 / 12.63-12.68 / 47.9-48.1, which in turn took 3.19 / 12.60 / 47.6-48.0 at
# 16k / 32k / 65k against 3.25 / 12.85 / 48.7-49.3 for the 128 x 64 tiles. No faster: four slices,
# 3 stages, BLOCK_K 32 with three programs per SM, 128 x 128 with 4 warps, 128 x 256 and 256 x 128
# in slices.
_TMA_GRAD = (64, 128, 64, 8, 4, 4, 2, 2)
# SigLIP's kernels reduce rows only (no column sums across warps): larger tiles, 8 warps. H200,
# bench_loss_kernels.py --loss siglip: the gradient block 0.217 / 0.484 ms at 16k / 65k against
# 0.257 / 0.481 with the CLIP tiles; the statistics (a no-grad call: with a backward to follow the
# forward takes the gradient kernel) with the polynomial log1p 0.887 / 14.0 ms against 0.948 / 15.1
# with 128 x 128 tiles and 1.06 / 15.4 for cuBLAS + the Triton pass, so fused at every size.
_TMA_SIGLIP_STATS = (256, 128, 64, 8, 8, 3, 1)
_TMA_SIGLIP_GRAD = (128, 128, 64, 8, 8, 4, 1)
# The gradient kernel with the pair losses in its epilogue (a forward whose backward follows): the
# same tiles, the fastest of bench_loss_kernels.py --loss siglip on an H200 with the polynomial
# log1p: 0.240 / 0.590 ms at 16k / 65k (128 x 64 tiles: 0.244-0.257 / 0.619-0.659; with libdevice's
# log 0.330 / 0.698).
_TMA_SIGLIP_GRAD_LOSS = _TMA_SIGLIP_GRAD
# Largest block (logits) a TMA kernel takes, per kind; above, cuBLAS bands and Triton passes. The
# CLIP statistics: TMA 4.25 ms against 4.96 for cuBLAS + the passes at 32k, 18.6 against 18.1 at
# 65k without the interior fast path, 17.00 against 17.65 with it (above); SigLIP's statistics and
# every gradient block are fused at every size.
_TMA_MAX_LOGITS = {"stats": 1 << 62, "siglip_stats": 1 << 62, "grad": 1 << 62}
# The plain sums by column strips (_clip_sums_strip_kernel: BLOCK_M, BLOCK_N, BLOCK_K, warps,
# stages, programs per SM, CHUNK row blocks an item), for forwards whose d scale the backward sums
# (clip_stats_triton's weighted=False): the fastest measured on an H200: 128 x 128
# with 8 warps 13.70 ms at 65k, 128 x 64 with 4 warps 16.10, 128 x 256 23.6 (spilled), chunks of
# 16 row blocks 15.14; two programs an SM 14.00; 5 stages, BLOCK_K 128, chunks of 64, 256 x 64
# no faster (13.67-16.05 against 13.72 measured alongside).
_TMA_STRIPS = (16, 16, 16, 4, 1, 1, 2) if _INTERPRET else (128, 128, 64, 8, 4, 1, 32)
_STRIPS = True  # False: the per-tile statistics kernel (with the weighted sums) at every size
_STRIP_WAVES = 4  # at least this many work items a program: CHUNK shrinks at small B
# Strips from this many logits (B = 11,585 square) on: below, the per-tile kernel is as fast or
# faster end to end (H200, queued: 0.22 / 0.80 ms at B = 4k / 8k against 0.24 / 0.81 with the
# strips; 16k-65k: 3.19 / 12.63 / 48.33 against 3.27 / 12.82 / 50.33).
_STRIPS_MIN_LOGITS = 1 << 27
_TMA_MIN_LOGITS = 1 << 23
_TMA_FORCE = None  # None: by the device and the tensors; tests set True (interpreter, fp32; rows aligned)
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: pointer kernels only
    TensorDescriptor = None
# The CLIP gradient block by the warp-specialised Gluon kernel (ops/gluon_kernels.py) where it
# applies (sm_90, TMA loads and store); "on" False: the Triton kernel everywhere (INFCLIP_GLUON=0,
# a bench's A/B, or after its first launch failed on this Triton); "tiles": its tiles (a bench's A/B);
# "launch": gluon_kernels' function (looked up at each launch).
_GLUON = {"on": os.environ.get("INFCLIP_GLUON", "1") != "0" and not gluon_kernels.available(),
          "tiles": gluon_kernels.GRAD_TILES, "launch": "clip_grad_block"}
# The SigLIP gradient block with its pair losses (the forward of a loss whose backward follows)
# likewise, with a switch of its own: a kernel whose build fails turns off itself only.
_GLUON_SIGLIP = dict(_GLUON, launch="siglip_grad_block")
# The CLIP forward's column-strip sums by the warp-specialised Gluon kernel (gluon_kernels.clip_sums)
# where the strips apply on sm_90, likewise; "tiles": its tiles and chunk (gluon_kernels.SUMS_TILES).
# A state's optional "kw" goes to its launch too (bench/bench_contrastive_loss.py --variant sets e.g.
# the sums' launch_logits or rotate that way).
_GLUON_SUMS = {"on": _GLUON["on"], "tiles": gluon_kernels.SUMS_TILES, "launch": "clip_sums"}
log = logging.getLogger(__name__)


def _tma_rows(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor's rows can be a TMA descriptor's: unit inner stride, 16-byte aligned
    base and row stride."""
    return (t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


def _use_tma(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the fused kernels load a and b by TMA descriptors."""
    if _TMA_FORCE is not None:
        return _TMA_FORCE and _tma_rows(a) and _tma_rows(b)
    if TensorDescriptor is None or not a.is_cuda or a.dtype not in (torch.bfloat16, torch.float16):
        return False
    if a.shape[0] * b.shape[0] < _TMA_MIN_LOGITS:
        return False
    return _capability(a.device)[0] >= 9 and _tma_rows(a) and _tma_rows(b)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple:
    """The CUDA device's compute capability (asked once per device)."""
    return torch.cuda.get_device_capability(device)


def _gluon_grad(state: dict, a, b, p, args: tuple, checked: Optional[dict] = None,
                descriptors: Optional[dict] = None) -> bool:
    """Whether the gradient block a b^T into ``p`` went to the warp-specialised Gluon kernel of
    ``state`` (_GLUON: CLIP, _GLUON_SIGLIP; ``args``: its launch's between p and sm_count): on
    sm_90 (wgmma) with the TMA loads and a TMA-aligned P, while the state is on. A launch that fails
    (a Triton whose Gluon differs fails at its first build) turns it off, with a warning, and the
    Triton kernel takes the block. ``checked`` and ``descriptors``: dicts kept for the blocks of one
    call (views of the same tensors, so the answer depends on the block's shape only): the checks'
    answer per block shape, and the kernel's TMA descriptors per view."""
    if not state["on"]:
        return False
    shape = (a.shape[0], b.shape[0], p.shape[1])
    ok = checked.get(shape) if checked is not None else None
    if ok is None:
        ok = a.is_cuda and _use_tma(a, b) and _tma_rows(p) and _capability(a.device) == (9, 0)
        if checked is not None:
            checked[shape] = ok
    return ok and _gluon_launch(state, a, b, p, *args, descriptors=descriptors)


def _gluon_launch(state: dict, *args, **kwargs) -> bool:
    """Whether gluon_kernels.``state["launch"]`` ran on ``args`` (then the device's SM count and the
    state's tiles, and its "kw" if any). A launch that fails (a Triton whose Gluon differs fails at
    its first build) turns the state off, with a warning, and returns False: the caller's Triton
    kernel takes the work, now and from then on."""
    try:
        getattr(gluon_kernels, state["launch"])(*args, _sm_count(args[0].device), state["tiles"], **kwargs,
                                                **state.get("kw", {}))
    except Exception as exc:  # noqa: BLE001 - any failure of the first build: the Triton kernel
        state["on"] = False
        log.warning("contrastive_loss: the Gluon kernel %s failed (%s: %s); using the Triton kernel "
                    "from now on", state["launch"], type(exc).__name__, str(exc)[:200])
        return False
    return True


def _use_fused(m: int, n: int, keep, kind: str = "stats", tma: bool = False) -> bool:
    """Whether an [m, n] block's statistics (kind "stats" / "siglip_stats") or gradient blocks
    ("grad") take the fused kernels (``tma``: loading by descriptors, _TMA_MAX_LOGITS; else
    _FUSED_MAX_LOGITS)."""
    limit = _TMA_MAX_LOGITS[kind] if tma else _FUSED_MAX_LOGITS
    return not keep and m * n <= limit



_ROUNDED_BOUND = {torch.bfloat16: 2.0**12, torch.float16: 2.0**14}
"""The largest logit bound |s| max|A| max|B| that logits rounded to 16 bits take: a logit near the
bound rounded up by half an ulp (2^-9 of it in bf16, 2^-11 in fp16) then sits at most 8 above
the shift's margin, e^(64 + 8) a term, finite in a sum of up to 2^24 terms."""


def logit_bound_limit(a: torch.Tensor, b: torch.Tensor, n: int, keep, limit: float) -> float:
    """``limit``, or less where the statistics or the gradient blocks of a x (n rows like b)^T
    take logits rounded to a's 16-bit dtype (_ROUNDED_BOUND): kept bands, or blocks above
    _FUSED_MAX_LOGITS that do not load by TMA (cuBLAS bands). Every other path takes its logits
    from fp32 accumulators."""
    if a.dtype not in _ROUNDED_BOUND:
        return limit
    bands = keep == "bands" or (a.shape[0] * n > _FUSED_MAX_LOGITS and not _use_tma(a, b))
    return min(limit, _ROUNDED_BOUND[a.dtype]) if bands else limit


def sums_in_strips(a: torch.Tensor, b: torch.Tensor, keep) -> bool:
    """Whether the statistics of a x b^T, asked without weighted sums, take the column-strip
    kernel (TMA loads, nothing kept, at least _STRIPS_MIN_LOGITS): a forward that does lets its
    backward sum d scale (clip_grads_triton's ``dscale_summed``); both sides ask this of the
    same tensors."""
    return (_STRIPS and not keep and a.shape[0] * b.shape[0] >= _STRIPS_MIN_LOGITS
            and _use_tma(a, b))


@functools.lru_cache(maxsize=64)
def _strips_config(tiles, m: int, n: int, fp32: bool, allow_tf32: bool, programs: int):
    """(grid, meta-parameters) of _clip_sums_strip_kernel (tiles: _TMA_STRIPS) over [m, n]."""
    block_m, block_n, block_k, warps, stages, per_sm, chunk = tiles
    if fp32 and not _INTERPRET:
        block_k, stages = min(block_k, 32), min(stages, 3)
    grid_m, grid_n = _cdiv(m, block_m), _cdiv(n, block_n)
    # chunks short enough for _STRIP_WAVES items a program (small B: down to one row block)
    chunk = max(1, min(chunk, grid_m * grid_n // (_STRIP_WAVES * per_sm * programs)))
    items = _cdiv(grid_m, chunk) * grid_n
    grid = min(items, per_sm * programs)
    return (grid,), dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, CHUNK=chunk,
                         PRECISION="tf32" if allow_tf32 or not fp32 else "ieee", PROGRAMS=grid,
                         num_warps=warps, num_stages=stages)


def _gluon_sums(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag) -> bool:
    """Whether the column-strip sums went to the warp-specialised Gluon kernel: on sm_90 with
    16-bit features of at most gluon_kernels.SUMS_MAX_DIM, while _GLUON_SUMS is on (a first launch
    that fails turns it off, _gluon_launch, and the Triton strip kernel takes the sums)."""
    if (not _GLUON_SUMS["on"] or a.dtype == torch.float32 or a.shape[1] > gluon_kernels.SUMS_MAX_DIM
            or _capability(a.device) != (9, 0)):
        return False
    return _gluon_launch(_GLUON_SUMS, a, b, scale_t, row_shift, col_shift, row_sum, col_sum, int(diag))


def _clip_sums_strips(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag, allow_tf32):
    if _gluon_sums(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag):
        return
    (m, d), n = a.shape, b.shape[0]
    grid, meta = _strips_config(_TMA_STRIPS, m, n, a.dtype == torch.float32, allow_tf32,
                                _sm_count(a.device))
    da = TensorDescriptor.from_tensor(a, [meta["BLOCK_M"], meta["BLOCK_K"]])
    db = TensorDescriptor.from_tensor(b, [meta["BLOCK_N"], meta["BLOCK_K"]])
    _clip_sums_strip_kernel[grid](da, db, m, n, d, scale_t, row_shift, col_shift, row_sum, col_sum,
                                  int(diag), **meta)

_PRO_M, _PRO_D = (16, 16) if _INTERPRET else (32, 128)
# the shift kernel's rows (and columns) a program, and the tiles (BLOCK_N = BLOCK_K) of its true
# maxima (loose shifts only, _clip_shift_kernel), one stage: small, so that the rare work of a
# loose shift spreads over B / 32 programs and the kernel holds 96-152 registers a thread with
# no spill on sm_90 (64 x 64 tiles: 238-255 and a spill; bench/bench_kernel_resources.py); the
# common work is each program's read of the ``parts`` largest norms, ~32 MB of L2 at B = 65k
_SHIFT_M, _SHIFT_N = (16, 16) if _INTERPRET else (32, 32)
_SHIFT_TIGHTEN = True
"""False: the shift launch leaves loose shifts as the bound made them (B / 1,024 programs, no
true maxima), for a bench's A/B of the launch's cost only: rows whose every logit lies far below
the bound then lose their sums to underflow."""
_VEC = 64 if _INTERPRET else 1024
_EPI = 64 if _INTERPRET else 2048

_SMS: dict = {}


def _sm_count(device: torch.device) -> int:
    """The device's multiprocessors (1 on the CPU: the interpreter runs a handful of programs)."""
    if device.type != "cuda":
        return 1
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def _programs_wanted(device: torch.device) -> int:
    """About four waves of programs on this device (a handful under the interpreter)."""
    return 4 * _sm_count(device)


_BAND_FACTOR = 2  # band budget in units of max(n d, 2^24) elements
_OVERLAP = False  # two band buffers, a band's Triton kernel beside the next band's GEMM (no gain)
# a backward reading the kept bf16 bands takes this many forward bands at a time: each band's P^T @ A adds into
# the fp32 [B, D] sum of dT, re-read and re-written once a band (H200, 32k / 65k: 11.3 -> 10.1 / 42.2 -> 38.7 ms
# from 1 to 4, the band buffer 0.3 / 0.56 GiB larger; 8 and 16 no faster)
_KEPT_BANDS_FACTOR = 4
_SIDE: dict = {}


def band_rows(m: int, n: int, d: int) -> int:
    """Rows per band when the whole matrix is not kept: each band buffer holds at most
    _BAND_FACTOR max(n d, 2^24) elements (O(B D) memory)."""
    budget = _BAND_FACTOR * max(n * d, 1 << 24)
    return min(m, max(256, budget // max(n, 1)))


def _side_stream(device) -> "torch.cuda.Stream":
    if device not in _SIDE:
        _SIDE[device] = torch.cuda.Stream(device)
    return _SIDE[device]


def _pipeline(bands, a, gemm: Callable, kernel: Callable, bufs):
    """Runs, per band (r0, r1): s = gemm(r0, r1, buf) on the current stream, then kernel(s, r0,
    r1). On CUDA with two buffers the kernel runs on a side stream, so that band i's
    memory-bound kernel overlaps band i+1's GEMM; the streams join at the end (capturable in a
    CUDA graph)."""
    if not (a.is_cuda and len(bufs) == 2 and len(bands) > 1):
        for r0, r1 in bands:
            kernel(gemm(r0, r1, bufs[0]), r0, r1)
        return
    main = torch.cuda.current_stream(a.device)
    side = _side_stream(a.device)
    side.wait_stream(main)
    freed = [None, None]  # per buffer: the event after which it may be overwritten
    for i, (r0, r1) in enumerate(bands):
        j = i % 2
        if freed[j] is not None:
            main.wait_event(freed[j])
        s = gemm(r0, r1, bufs[j])
        made = torch.cuda.Event()
        made.record(main)
        with torch.cuda.stream(side):
            side.wait_event(made)
            kernel(s, r0, r1)
            freed[j] = torch.cuda.Event()
            freed[j].record(side)
    main.wait_stream(side)


def _cdiv(x: int, y: int) -> int:
    """ceil(x / y) for ints (triton.cdiv is a constexpr function: ~1 us a call on the host)."""
    return -(-x // y)


# The tile entries after the seventh, by kind: their meta-parameters' names.
_EXTRA_META = {"stats": ("FAST",), "grad": ("SPLIT",)}


@functools.lru_cache(maxsize=256)
def _fused_config(tiles, m: int, n: int, d: int, fp32: bool, allow_tf32: bool, programs: int,
                  kind: str = "stats"):
    """(grid, meta-parameters) of a fused kernel over an [m, n] block with K = d (per shape,
    computed once). tiles: _FUSED_STATS / _FUSED_GRAD, or with a seventh entry, programs per
    SM (TMA: persistent programs, at most ``programs`` per SM; else one program per tile); the
    entries after it are ``kind``'s _EXTRA_META."""
    block_m, block_n, block_k, group_m, warps, stages = tiles[:6]
    if fp32 and not _INTERPRET:  # fp32 tiles: half the K depth, same shared memory
        block_k, stages = min(block_k, 32), min(stages, 3)
    count = _cdiv(m, block_m) * _cdiv(n, block_n)
    tma = len(tiles) > 6
    grid = (min(count, tiles[6] * programs) if tma else count,)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                EVEN_K=d % block_k == 0, PRECISION="tf32" if allow_tf32 or not fp32 else "ieee",
                TMA=tma, PROGRAMS=grid[0], num_warps=warps, num_stages=stages,
                **{name: int(v) for name, v in zip(_EXTRA_META.get(kind, ()), tiles[7:])})
    return grid, meta


def _descriptor(t: torch.Tensor, block: list, cache: Optional[dict]):
    """A TMA descriptor of ``t`` in ``block`` tiles; with ``cache`` (a dict kept for views that
    stay put meanwhile: the blocks of one backward, :class:`_BlockMemo`) one per view."""
    if cache is None:
        return TensorDescriptor.from_tensor(t, block)
    key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), *block)
    desc = cache.get(key)
    if desc is None:
        desc = cache[key] = TensorDescriptor.from_tensor(t, block)
    return desc


def _fused(kernel, a, b, kind: str, allow_tf32, *args, p=None, tma=None, descriptors=None) -> None:
    """Launches a fused kernel over all tiles of a b^T (a: [M, D], b: [N, D]); kind "stats",
    "grad", "siglip_stats", "siglip_grad" or "siglip_grad_loss" picks the tiles. ``args``
    follow (A, Bm, strides, M, N, D) and, for the gradient kernels, ``p`` (the [M, N] block P,
    then its row stride). With TMA (``tma``, or when None _use_tma(a, b)) A, Bm and an aligned P
    go as tensor descriptors (kept in ``descriptors`` when given, :func:`_descriptor`)."""
    (m, d), n = a.shape, b.shape[0]
    tma = _use_tma(a, b) if tma is None else tma
    tiles = {"stats": (_FUSED_STATS, _TMA_STATS), "grad": (_FUSED_GRAD, _TMA_GRAD),
             "siglip_stats": (_FUSED_STATS, _TMA_SIGLIP_STATS),
             "siglip_grad": (_FUSED_GRAD, _TMA_SIGLIP_GRAD),
             "siglip_grad_loss": (_FUSED_SIGLIP_GRAD_LOSS, _TMA_SIGLIP_GRAD_LOSS)}[kind][tma]
    programs = _sm_count(a.device) if tma else 1
    grid, meta = _fused_config(tiles, m, n, d, a.dtype == torch.float32, allow_tf32, programs,
                               kind)
    if tma:
        bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
        a, b = _descriptor(a, [bm, bk], descriptors), _descriptor(b, [bn, bk], descriptors)
    if p is not None:
        store, stride_p = tma and _tma_rows(p), p.stride(0)
        if store:  # (blocks of one epilogue slice: BLOCK_N / SPLIT columns)
            p = _descriptor(p, [bm, bn // meta.get("SPLIT", 1)], descriptors)
        args = (p, stride_p, *args)
        meta = dict(meta, TMA_STORE=store)
    kernel[grid](a, b, a.stride(0) if not tma else 0, b.stride(0) if not tma else 0, m, n, d,
                 *args, **meta)


def _prep(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


_ONES: dict = {}


def _scalar(x, device) -> torch.Tensor:
    """A device fp32 one-element tensor from a tensor or a Python number (no host sync either
    way); an fp32 tensor on ``device`` is passed as it is (the kernels read one element)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.float32 and x.device == device:
            return x
        return x.detach().to(device=device, dtype=torch.float32).reshape(1)
    if x == 1.0:  # coef=None: one cached constant per device, never written
        one = _ONES.get(device)
        if one is None:
            one = _ONES[device] = torch.ones(1, device=device, dtype=torch.float32)
        return one
    return torch.full((1,), float(x), device=device, dtype=torch.float32)


def _precision(a: torch.Tensor, allow_tf32: bool):
    """matmul_precision for fp32 features; a no-op for bf16/fp16 GEMMs, which the TF32 switches
    do not touch (saves setting and restoring four global flags per band loop)."""
    return matmul_precision(allow_tf32) if a.dtype == torch.float32 else contextlib.nullcontext()


def _logits(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[M, N] = a b^T in the features' dtype (cuBLAS, fp32 accumulation; rounded once)."""
    if a.is_cuda:
        return torch.mm(a, b.T, out=out)
    return out.copy_(a.float() @ b.float().T)  # CPU (interpreter tests): fp32, rounded once


def _mm(p: torch.Tensor, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """p @ x with fp32 accumulation, returned in out_dtype."""
    if p.is_cuda:
        if out_dtype == p.dtype:
            return torch.mm(p, x)
        return torch.mm(p, x, out_dtype=out_dtype)
    return (p.float() @ x.float()).to(out_dtype)


def _mm_into(out: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> None:
    """out = p @ x with fp32 accumulation, rounded once to out's dtype (out may be a row slice)."""
    if not p.is_cuda:
        out.copy_(p.float() @ x.float())
    elif out.dtype == p.dtype:
        torch.mm(p, x, out=out)
    else:
        torch.mm(p, x, out_dtype=out.dtype, out=out)


def _addmm_(acc: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> None:
    """acc (fp32) += p @ x."""
    if p.is_cuda and p.dtype != torch.float32:
        torch.addmm(acc, p, x, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(p.float(), x.float())


@functools.lru_cache(maxsize=256)
def _row_grid(m: int, n: int, device) -> tuple[tuple[int, int], int]:
    """Row-stats grid (row blocks, column spans) and the span width (a multiple of the tile)."""
    grid_m = _cdiv(m, _STATS_M)
    tiles_n = _cdiv(n, _STATS_N)
    spans = max(1, min(tiles_n, _cdiv(_programs_wanted(device), grid_m)))
    cols = _cdiv(tiles_n, spans) * _STATS_N
    return (grid_m, _cdiv(n, cols)), cols


@functools.lru_cache(maxsize=256)
def _col_grid(m: int, n: int, device) -> tuple[tuple[int, int], int]:
    """Column-stats grid (column strips, row spans) and the span height."""
    grid_n = _cdiv(n, _COLS_N)
    tiles_m = _cdiv(m, _COLS_M)
    spans = max(1, min(tiles_m, _cdiv(_programs_wanted(device), grid_n)))
    rows = _cdiv(tiles_m, spans) * _COLS_M
    return (grid_n, _cdiv(m, rows)), rows


def _step(m: int, n: int, d: int, keep: bool, band: int) -> int:
    """Rows per band: all of them when the matrix is kept, else ``band`` or the memory rule."""
    if keep:
        return m
    return min(m, band) if band > 0 else band_rows(m, n, d)


def _bands(m: int, step: int):
    for r0 in range(0, m, step):
        yield r0, min(m, r0 + step)


def clip_prologue_triton(a, b, scale, margin, combine_max: Callable | None = None,
                         limit: float = float("inf"), slack: Optional[float] = None,
                         allow_tf32: bool = False):
    """The loss's O(B D) start in two launches: returns (row_shift [B], col_shift [B], aux
    [B + 2], sums [4 B]) fp32, with aux[:B] = ref (the positives' S') and sums zeroed (by the
    first launch) for :func:`clip_stats_triton` (out=) and :func:`clip_epilogue_triton`. Shifts
    as ops/blocks.clip_shifts (NaN where the bound exceeds ``limit``); with ``slack`` (one device,
    a and b all of the batch) those more than ``slack`` above their positive logit become their
    row's or column's true maximum (_clip_shift_kernel's TIGHTEN; their tl.dots' rounding differs
    from the statistics kernels' by ~D 2^-24 |S|, far below ``margin`` while |S| <= ``limit``).
    ``combine_max``: applied in place to the two largest norms ([2] fp32) between the launches (a
    sweep's max over its process group; None on one rank)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    parts = _cdiv(m, _PRO_M)
    f32 = dict(device=a.device, dtype=torch.float32)
    sums = torch.empty(4 * m, **f32)
    # one allocation: aux first (an output of the registered op: storage offset 0, as its fake
    # kernel says), then the norms, the shifts and the programs' largest norms
    work = torch.empty(5 * m + 2 + 2 * parts, **f32)
    aux = work[: m + 2]
    norm_a, norm_b, row_shift, col_shift = work[m + 2:5 * m + 2].view(4, m).unbind(0)
    part_max = work[5 * m + 2:]
    _clip_prologue_kernel[(parts,)](
        a, b, a.stride(0), b.stride(0), m, d, aux, norm_a, norm_b, part_max, sums,
        BLOCK_M=_PRO_M, BLOCK_D=_PRO_D, num_warps=4)
    if combine_max is not None:
        part_max = combine_max(part_max.view(parts, 2).amax(0))
        parts = 1
    fp32 = a.dtype == torch.float32
    tighten = slack is not None and _SHIFT_TIGHTEN
    block = _SHIFT_M if tighten else _VEC
    _clip_shift_kernel[(_cdiv(m, block),)](
        _scalar(scale, a.device), aux, norm_a, norm_b, part_max, parts, row_shift, col_shift, m,
        float(margin), float(limit), a, b, a.stride(0), b.stride(0), d,
        float(slack if tighten else 0.0), BLOCK=block, PARTS=_VEC, TIGHTEN=tighten,
        BLOCK_N=_SHIFT_N, BLOCK_K=_SHIFT_N, PRECISION="tf32" if allow_tf32 or not fp32 else "ieee",
        num_warps=4, num_stages=1)
    return row_shift, col_shift, aux, sums


def clip_epilogue_triton(scale, sums, row_shift, col_shift, aux, count=None):
    """The loss from the complete sums in one launch: returns (loss [], row_lse [B], col_lse [B])
    with loss = the rows' and columns' terms summed / (2 count) (count: B by default; the global
    batch when these B rows are one rank's share); fills aux[B] (sum of the E[S'] - S'_ii terms)
    and aux[B + 1] (sum ref)."""
    m = row_shift.shape[0]
    f32 = dict(device=sums.device, dtype=torch.float32)
    # three buffers, not views of one: the registered op's outputs must not alias
    loss, row_lse, col_lse = torch.empty((), **f32), torch.empty(m, **f32), torch.empty(m, **f32)
    _clip_epilogue_kernel[(1,)](_scalar(scale, sums.device), sums, row_shift, col_shift, aux,
                                row_lse, col_lse, loss, m, float(count or m), BLOCK=_EPI,
                                num_warps=8 if not _INTERPRET else 4)
    return loss, row_lse, col_lse


def _run_stats(a, b, keep_logits, band, allow_tf32, kernel: Callable):
    """The forward's band loop: S' by GEMM, then ``kernel(s, r0, r1)``. A kept whole matrix is
    fp32 (the GEMM's accumulator, not rounded: the small-B path is as exact as fp32 logits);
    bands are in the features' dtype, and so is a matrix kept as bands (``keep_logits="bands"``).
    Returns the kept matrix or None."""
    m, d = a.shape
    n = b.shape[0]
    with _precision(a, allow_tf32):
        if keep_logits == "whole":
            s = _mm(a, b.T, torch.float32)
            kernel(s, 0, m)
            return s
        step = _step(m, n, d, False, band)
        bands = list(_bands(m, step))
        if keep_logits == "bands":  # each band's GEMM writes its rows of the kept matrix
            kept = torch.empty(m, n, device=a.device, dtype=a.dtype)
            for r0, r1 in bands:
                kernel(_logits(a[r0:r1], b, kept[r0:r1]), r0, r1)
            return kept
        _pipeline(bands, a, lambda r0, r1, buf: _logits(a[r0:r1], b, buf[: r1 - r0]), kernel,
                  _band_buffers(a, n, step, len(bands)))
    return None


def clip_stats_launch(s, scale_t, row_shift, row_ref, row_sum, row_wsum, col_shift, col_ref,
                      col_sum, col_wsum, diag: int) -> None:
    """Both directions' statistics passes over the [m, n] logits ``s`` in one launch
    (_clip_stats_kernel), adding into the row sums [m] and column sums [n]; the positives at
    i - j == diag."""
    m, n = s.shape
    (grid_m, spans_m), cols = _row_grid(m, n, s.device)
    (grid_n, spans_n), rows = _col_grid(m, n, s.device)
    _clip_stats_kernel[(grid_m * spans_m + grid_n * spans_n,)](
        s, s.stride(0), m, n, cols, rows, grid_m, grid_m * spans_m, grid_n, scale_t, row_shift,
        row_ref, row_sum, row_wsum, col_shift, col_ref, col_sum, col_wsum, diag, ROW_M=_STATS_M,
        ROW_N=_STATS_N, COL_M=_COLS_M, COL_N=_COLS_N, num_warps=_STATS_WARPS)


def clip_stats_triton(a, b, scale, row_shift, col_shift, row_ref, col_ref, diag=0, *,
                      keep_logits="", band=0, allow_tf32=False, out=None, weighted=True):
    """Partial CLIP statistics of S = scale * a b^T (see ops/blocks.clip_stats).

    a: [M, D], b: [N, D]; scale: fp32 [] tensor; shifts and refs: fp32 [M] / [N]. Returns
    (row_sum, col_sum, row_wsum, col_wsum, logits): fp32 sums without the pairs i - j == diag;
    logits is the kept [M, N] matrix S' when ``keep_logits`` is "whole" (fp32) or "bands" (the
    features' dtype), else None ("").
    band: rows per GEMM band (0: by memory, :func:`band_rows`). out: fp32 buffers to add into,
    either one [2 M + 2 N] (row_sum, row_wsum, col_sum, col_wsum, in that order) or those four
    ([M], [M], [N], [N], contiguous each). ``weighted=False``: the weighted sums are not needed;
    where :func:`sums_in_strips` holds they are not taken (left as they were).
    """
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.zeros(2 * m + 2 * n, device=a.device, dtype=torch.float32)
    if isinstance(out, torch.Tensor):
        out = (out[:m], out[m:2 * m], out[2 * m:2 * m + n], out[2 * m + n:])
    row_sum, row_wsum, col_sum, col_wsum = out
    scale_t = _scalar(scale, a.device)
    shifts = [t.float().contiguous() for t in (row_shift, row_ref, col_shift, col_ref)]
    def kernel(s, r0, r1):
        clip_stats_launch(s, scale_t, shifts[0][r0:r1], shifts[1][r0:r1], row_sum[r0:r1],
                          row_wsum[r0:r1], shifts[2], shifts[3], col_sum, col_wsum, int(diag) - r0)

    if not weighted and sums_in_strips(a, b, keep_logits):
        _clip_sums_strips(a, b, scale_t, shifts[0], shifts[2], row_sum, col_sum, diag, allow_tf32)
        return row_sum, col_sum, row_wsum, col_wsum, None
    tma = _use_tma(a, b)
    if _use_fused(m, n, keep_logits, "stats", tma):
        _fused(_clip_stats_fused_kernel, a, b, "stats", allow_tf32, scale_t, shifts[0],
               shifts[1], shifts[2], shifts[3], row_sum, row_wsum, col_sum, col_wsum, int(diag),
               tma=tma)
        return row_sum, col_sum, row_wsum, col_wsum, None
    logits = _run_stats(a, b, keep_logits, band, allow_tf32, kernel)
    return row_sum, col_sum, row_wsum, col_wsum, logits


def siglip_stats_triton(a, b, scale, bias, diag=0, *, keep_logits="", band=0,
                        allow_tf32=False):
    """Per-row SigLIP pair-loss sums of the block (fp32 [M]) and the kept logits (or None)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    row_loss = torch.zeros(m, device=a.device, dtype=torch.float32)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    def kernel(s, r0, r1):
        grid, cols = _row_grid(r1 - r0, n, a.device)
        _siglip_stats_kernel[grid](s, s.stride(0), r1 - r0, n, cols, scale_t, bias_t,
                                   row_loss[r0:r1], int(diag) - r0, BLOCK_M=_STATS_M,
                                   BLOCK_N=_STATS_N, num_warps=_STATS_WARPS)

    tma = _use_tma(a, b)
    if _use_fused(m, n, keep_logits, "siglip_stats", tma):
        _fused(_siglip_stats_fused_kernel, a, b, "siglip_stats", allow_tf32, scale_t, bias_t,
               row_loss, int(diag), tma=tma)
        return row_loss, None
    return row_loss, _run_stats(a, b, keep_logits, band, allow_tf32, kernel)


# The backward's recompute path over blocks of at most _GRAD_BLOCK rows x columns (when the whole
# block does not fit the band budget): P of one block, then grad_a rows += P @ b_block (fp32 over
# the column blocks of a row band, unless there is one) and grad_b rows += P^T @ a_band (fp32 over
# the row bands, unless there is one). Full-width row bands would re-read and re-write the whole
# [B, D] fp32 sum of grad_b once per band of ~1,536 rows; blocks of 8,192 rows do it 5x less often
# with a smaller buffer. H200, bf16, D = 768, the op's gradient pass (bench/bench_blocked_loss.py):
# 9.32 / 37.14 ms at 32k / 65k against 9.69 / 39.98 with full-width bands; 8,192 x 8,192 blocks
# 8.99 / 35.73 (against 9.33 / 38.27 measured alongside) but
# 56 MiB more at 65k; the same fp64 error either way (the bf16 rounding of the gradients). A block
# and its fp32 row sum never take more than a full-width band (_grad_block): the op's peak is
# then no higher than with bands at any B.
_GRAD_BLOCK = (8192, 4096)
# Smaller blocks tried in turn where _GRAD_BLOCK does not fit the backward's budget, and that
# budget for a block and its fp32 row sum in units of max(n d, 2^24) elements of the features'
# dtype (2: a full-width band's bytes, as band_rows). With 1.5 and 4,096 x 4,096 blocks below
# B = ~45k (D = 768) the op's peak at 16k / 32k is 116 / 193 MiB (full-width bands of 2,048 rows
# and 8,192 x 4,096 blocks with 2: 136 / 233 MiB),
# for 1-2% more time there (H200, bf16, queued: 3.29 / 12.83 ms against 3.23 / 12.19, the compiled
# dense loss 3.29 / 13.09; 1,536-row bands 3.42 / 13.57; factor 1, 1,024-row bands at 16k, 3.64).
# 65k keeps _GRAD_BLOCK (8,192 x 4,096, 0.38 GiB).
# Below _GRAD_FACTOR_MIN_N columns the factor is 2 and _GRAD_BLOCKS unused (full-width bands
# unless _GRAD_BLOCK fits): at 8k 4,096 x 4,096 blocks
# took 0.86 ms against 0.80 with 4,096-row bands (the compiled dense loss 0.86; SigLIP 0.71
# against 0.63), for 0.08 against 0.10 GiB.
_GRAD_BLOCKS: tuple = ((4096, 4096),)
_GRAD_FACTOR = 1.5
_GRAD_FACTOR_MIN_N = 12288
# Larger blocks, tried first where the backward casts its fp32 [N, D] sum of grad_b to the features'
# dtype at the end (a single-device call whose outputs are 16-bit): that cast holds N D of the dtype
# beside the sum, and a block with its fp32 row sum taking no more leaves the call's peak where the
# cast puts it. From B ~ 104k (D = 768): 8,192 x 8,192 at 131k, 16,384 x 8,192 at 262k, the same
# peak (0.75 / 1.51 GiB); H200, queued, against the blocks chosen without the cast: CLIP 182
# against 188 ms at 131k, 742 against 772 at 262k, SigLIP 150 / 156 and 605 / 639.
_GRAD_BLOCKS_WIDE: tuple = ((16384, 8192), (8192, 8192))


def _grad_block(m: int, n: int, d: int, band: int, itemsize: int, width: int = 0,
                cast: bool = False) -> tuple[int, int]:
    """(rows, columns) of the backward's recompute blocks: the whole [m, n] when it fits the band
    budget (band_rows), full-width bands of ``band`` rows when a band height is forced, else the
    first of _GRAD_BLOCK, _GRAD_BLOCKS whose block and fp32 [rows, D] sum of grad_a take no more
    than _GRAD_FACTOR max(w d, 2^24) elements' bytes (below _GRAD_FACTOR_MIN_N columns: _GRAD_BLOCK
    within 2 max(w d, 2^24)),
    else full-width bands of at most that many bytes; w = max(n, ``width``) from
    _GRAD_FACTOR_MIN_N columns on (else n): a distributed sweep's column block takes the budget
    of the global batch, as disco's one step over all B columns does (below, at
    b = 8,192 of 32,768, 8,192 x 4,096 blocks were no faster than the 4,096-row bands, for 184
    against 160 MiB on an H200). (Capping the rows instead, 5,888 at 8k-16k,
    measured 1.05 / 1.00x the compiled dense loss against 0.96 / 0.99x with bands.) With ``cast``
    (grad_b's fp32 sum is cast to the features' dtype at the end) first the _GRAD_BLOCKS_WIDE
    block whose bytes the cast's n d of the dtype covers."""
    step = _step(m, n, d, False, band)
    if step >= m:
        return m, n
    if band > 0:
        return step, n
    for block in _GRAD_BLOCKS_WIDE if cast else ():
        rows, cols = min(m, block[0]), min(n, block[1])
        if rows < m and rows * (cols * itemsize + d * 4) <= n * d * itemsize:
            return rows, cols
    small = n < _GRAD_FACTOR_MIN_N  # (full-width bands unless _GRAD_BLOCK fits)
    w = n if small else max(n, width)
    budget = int((_BAND_FACTOR if small else _GRAD_FACTOR) * max(w * d, 1 << 24)) * itemsize
    for block in (_GRAD_BLOCK,) if small else (_GRAD_BLOCK, *_GRAD_BLOCKS):
        rows, cols = min(m, block[0]), min(n, block[1])
        if rows * (cols * itemsize + d * 4) <= budget:
            return rows, cols
    return min(step, max(256, budget // max(n * itemsize, 1))), n


class _BlockMemo:
    """What the fused launches of one backward's blocks can share, all views of the same tensors
    (a :func:`_grad_bands` call makes one and drops it with P's buffer): each row band's and
    column block's vector slices, the Gluon kernel's checks per block shape, the TMA descriptors
    per view (_gluon_grad, _fused)."""

    __slots__ = ("rows", "columns", "checked", "descriptors")

    def __init__(self) -> None:
        self.rows, self.columns, self.checked, self.descriptors = {}, {}, {}, {}


def _grad_bands(a, b, logits, band, allow_tf32, fill: Callable, fused_fill: Callable, out_dtype,
                sink_a, width: int = 0):
    """Shared block loop of the backward: per block, the scaled gradient block P, then grad_a
    rows += P @ b_block and grad_b rows += P^T @ a_band. P comes from ``fused_fill(r0, r1, c0,
    c1, p, a_band, b_block, memo)`` (one fused launch, ``memo`` the call's :class:`_BlockMemo`,
    when nothing is kept and the matrix is small enough or loads by TMA: _use_fused) or from S'
    (recomputed by cuBLAS, or the kept ``logits``) and ``fill(s, p, r0, r1, c0, c1)`` (in place,
    p is s, except for the kept logits, which stay untouched: the registered op declares no
    mutation). A kept matrix is read in full-width row bands. With ``sink_a(i0, i1, rows)`` the
    finished fp32 rows of grad_a are handed over instead; a sink that only adds them into an fp32
    [M, D] tensor names it as ``sink_a.into``, and every block's GEMM then accumulates straight
    into its rows (no band sums, no add a band). Returns (grad_a or None, grad_b).

    The views a block needs are made once per row band, column block and block shape, not per
    block: at B = 32,768 (64 blocks) each slice cost ~2.7 us of the host's ~160 us a block, where
    the GPU takes ~140-150 us (H200): made per block, they let the eager call's host pace it on
    an idle GPU."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    keep = logits is not None
    kept_bands = keep and logits.dtype != torch.float32  # the forward's bands, in the features' dtype
    fused = _use_fused(m, n, keep, "grad", _use_tma(a, b))
    if keep:
        rows, cols = _step(m, n, d, not kept_bands, band), n
        if kept_bands and band <= 0:
            rows = min(m, rows * _KEPT_BANDS_FACTOR)
    else:
        rows, cols = _grad_block(m, n, d, band, a.element_size(), width, cast=out_dtype != torch.float32)
    dev = a.device
    grad_a = None if sink_a is not None else torch.empty(m, d, device=dev, dtype=out_dtype)
    into = getattr(sink_a, "into", None)  # fp32 [m, d] the rows' GEMMs add into
    with _precision(a, allow_tf32):
        buf = torch.empty(rows * cols, device=dev, dtype=a.dtype)
        # fp32 sums where a result takes several blocks; else each block writes its final rows
        acc_a = torch.empty(rows, d, device=dev, dtype=torch.float32) if cols < n and into is None else None
        acc_b = torch.zeros(n, d, device=dev, dtype=torch.float32) if rows < m else None
        grad_b = acc_b if acc_b is not None else torch.empty(n, d, device=dev, dtype=out_dtype)
        # (c0, c1, b's column block, grad_b's rows of it) for every column block
        columns = [(c0, c1, b[c0:c1], grad_b[c0:c1]) for c0, c1 in _bands(n, cols)]
        views: dict = {}  # block shape -> (P, P^T, acc_a's rows)
        memo = _BlockMemo()  # fused_fill's, for this call's blocks (its descriptors hold P)
        for r0, r1 in _bands(m, rows):
            a_band = a[r0:r1]
            for c0, c1, b_block, grad_b_rows in columns:
                shape = (r1 - r0, c1 - c0)
                if shape not in views:
                    p = buf[: shape[0] * shape[1]].view(shape)
                    views[shape] = (p, p.T, acc_a[: shape[0]] if acc_a is not None else None)
                p, p_t, acc_rows = views[shape]
                if keep:  # no GEMM to redo: P from the kept rows (full-width bands)
                    fill(logits[r0:r1], p, r0, r1, 0, n)
                elif fused:
                    fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo)
                else:
                    fill(_logits(a_band, b_block, p), p, r0, r1, c0, c1)
                if into is not None:
                    _addmm_(into[r0:r1], p, b_block)
                elif acc_a is None and sink_a is None:
                    _mm_into(grad_a[r0:r1], p, b)
                elif acc_a is None:
                    sink_a(r0, r1, _mm(p, b, torch.float32))
                elif c0 == 0:
                    _mm_into(acc_rows, p, b_block)
                else:
                    _addmm_(acc_rows, p, b_block)
                if acc_b is None:
                    _mm_into(grad_b_rows, p_t, a_band)
                else:
                    _addmm_(grad_b_rows, p_t, a_band)
            if acc_a is not None and sink_a is None:
                grad_a[r0:r1] = acc_a[: r1 - r0]
            elif acc_a is not None:
                sink_a(r0, r1, acc_a[: r1 - r0])
        # before the cast below: the peak holds neither (nor any view of P: the memo's descriptors)
        del buf, p, p_t, acc_rows, views, memo, acc_a
    if acc_b is None or out_dtype == torch.float32:
        return grad_a, grad_b
    return grad_a, acc_b.to(out_dtype)


def _band_buffers(a, n, step, count):
    """One band buffer, or two when the bands overlap on two streams (CUDA, several bands)."""
    two = _OVERLAP and a.is_cuda and count > 1
    return [torch.empty(step, n, device=a.device, dtype=a.dtype) for _ in range(2 if two else 1)]


@functools.lru_cache(maxsize=256)
def _grad_grid(m, n):
    return (_cdiv(m, _GRAD_M), _cdiv(n, _GRAD_N))


def clip_grads_triton(a, b, scale, row_lse, col_lse, row_ref, *, diag=0, diag_value=0.0,
                      offset=0.0, coef=None, coef_mul=1.0, coef_scale=False, dscale_from=None,
                      dscale_index=0, dscale_summed=False, col_ref=None, dscale_out=None,
                      logits=None, band=0, out_dtype=torch.float32, allow_tf32=False,
                      sink_a=None, width=0):
    """(k P @ b, k P^T @ a) in ``out_dtype`` (see ops/blocks.clip_grads), k folded into
    P before its rounding: k = c scale if ``coef_scale`` else c, c = coef coef_mul.

    coef: None (1) or an fp32 one-element device tensor; logits: the kept [M, N] S' of the
    forward instead of a recompute (read, not written). dscale_from: an fp32 device tensor;
    then the kernel also computes c dscale_from[dscale_index] (the single-device d scale) and
    the result is (grad_a, grad_b, that fp32 [] tensor). ``dscale_summed``: that d scale is
    summed by the gradient kernel instead (the forward took no weighted sums: clip_stats_triton
    with ``weighted=False``; needs the fused kernels, :func:`sums_in_strips`): c times the
    block's share of the E[S'] - S'_ii terms of its rows and columns, added into ``dscale_out``
    (an fp32 [] tensor, then returned) when given. col_ref: the columns' positive S' ([N] fp32)
    for a block whose positives are not on its diagonal (a sweep's column block); None: row_ref,
    on a square block with its positives on the diagonal. width: the blocks' memory budget is
    that of this many columns if more than b's (_grad_block).
    """
    a, b = _prep(a), _prep(b)
    dev = a.device
    scale_t = _scalar(scale, dev)
    coef_t = _scalar(1.0 if coef is None else coef, dev)
    r, c, ref = (t.float().contiguous() for t in (row_lse, col_lse, row_ref))
    cref = ref if col_ref is None else col_ref.float().contiguous()
    if dscale_summed:
        if not sums_in_strips(a, b, logits is not None) or (
                col_ref is None and (diag != 0 or a.shape != b.shape)):
            raise ValueError("clip_grads_triton: dscale_summed needs the fused TMA kernels, and "
                             "col_ref unless the block is square with its positives on the "
                             "diagonal")
        src = scale_t
        dst = torch.zeros((), device=dev, dtype=torch.float32) if dscale_out is None else dscale_out
    elif dscale_from is None:
        src = dst = scale_t  # not touched (DSCALE off)
    else:
        src, dst = dscale_from[dscale_index:], torch.empty((), device=dev, dtype=torch.float32)
    flags = dict(COEF_SCALE=bool(coef_scale),
                 DSCALE=2 if dscale_summed else int(dscale_from is not None))
    label_args = (int(diag), float(diag_value), float(offset))

    # a block of rows r0:r1 and columns c0:c1 holds the positives at local i - j == diag - r0 + c0
    def fill(s, p, r0, r1, c0, c1):
        _clip_grad_kernel[_grad_grid(r1 - r0, c1 - c0)](
            s, p, s.stride(0), r1 - r0, c1 - c0, scale_t, coef_t, float(coef_mul), src, dst,
            r[r0:r1], c[c0:c1], ref[r0:r1], label_args[0] - r0 + c0, *label_args[1:],
            BLOCK_M=_GRAD_M, BLOCK_N=_GRAD_N, num_warps=_GRAD_WARPS, **flags)

    def fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo):
        if r0 not in memo.rows:
            memo.rows[r0] = (r[r0:r1], ref[r0:r1])
        if c0 not in memo.columns:
            memo.columns[c0] = (c[c0:c1], cref[c0:c1])
        (r_rows, ref_rows), (c_cols, ref_cols) = memo.rows[r0], memo.columns[c0]
        args = (scale_t, coef_t, float(coef_mul), src, dst, r_rows, c_cols, ref_rows, ref_cols,
                label_args[0] - r0 + c0, *label_args[1:], *flags.values())
        if not _gluon_grad(_GLUON, a_band, b_block, p, args, memo.checked, memo.descriptors):
            _fused(_clip_grad_fused_kernel, a_band, b_block, "grad", allow_tf32, *args, p=p,
                   descriptors=memo.descriptors)

    grads = _grad_bands(a, b, logits, band, allow_tf32, fill, fused_fill, out_dtype, sink_a, width)
    return grads if dscale_from is None and not dscale_summed else (*grads, dst)


def _sums_and_coef(rows: int, m: int, coef, device) -> tuple:
    """Zeroed fp32 row sums [rows, m] for the SigLIP gradient kernels and their coefficient as a
    device tensor (coef: None for 1, a device tensor, or a Python number). A number other than 1
    is written by the launch that zeroes the sums (as its own tensor, torch.full, it would take a
    launch more)."""
    if coef is None or isinstance(coef, torch.Tensor) or coef == 1.0:
        coef_t = _scalar(1.0 if coef is None else coef, device)
        return torch.zeros(rows, m, device=device, dtype=torch.float32), coef_t
    buf = torch.empty(rows * m + 1, device=device, dtype=torch.float32)
    _fill_kernel[(_cdiv(rows * m + 1, _VEC),)](buf, rows * m, float(coef), BLOCK=_VEC, num_warps=4)
    return buf[: rows * m].view(rows, m), buf[rows * m:]


def _siglip_grad_pass(a, b, scale, bias, diag, coef, coef_scale, logits, band, out_dtype,
                      allow_tf32, sink_a, with_loss, width=0):
    """The gradient pass of :func:`siglip_grads_triton`: (sums, grad_a, grad_b), sums fp32
    [2, M] (row i: sum_j G_ij S'_ij, sum_j G_ij), with the pair losses of row i a third row with
    ``with_loss``. Rows of one buffer: a single reduction sums them all."""
    a, b = _prep(a), _prep(b)
    m = a.shape[0]
    sums, coef_t = _sums_and_coef(3 if with_loss else 2, m, coef, a.device)
    gwsum, gsum = sums[0], sums[1]
    row_loss = sums[2] if with_loss else gsum  # (not touched without LOSS)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    kind = "siglip_grad_loss" if with_loss else "siglip_grad"

    def fill(s, p, r0, r1, c0, c1):  # (positives as in clip_grads_triton's blocks)
        _siglip_grad_kernel[_grad_grid(r1 - r0, c1 - c0)](
            s, p, s.stride(0), r1 - r0, c1 - c0, scale_t, bias_t, coef_t, gsum[r0:r1],
            gwsum[r0:r1], row_loss[r0:r1], int(diag) - r0 + c0, BLOCK_M=_GRAD_M, BLOCK_N=_GRAD_N,
            num_warps=_GRAD_WARPS, COEF_SCALE=bool(coef_scale), LOSS=with_loss)

    def fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo):
        if r0 not in memo.rows:
            memo.rows[r0] = (gsum[r0:r1], gwsum[r0:r1], row_loss[r0:r1])
        args = (scale_t, bias_t, coef_t, *memo.rows[r0], int(diag) - r0 + c0, bool(coef_scale))
        if not (with_loss and _gluon_grad(_GLUON_SIGLIP, a_band, b_block, p, args, memo.checked,
                                          memo.descriptors)):
            _fused(_siglip_grad_fused_kernel, a_band, b_block, kind, allow_tf32, *args, with_loss,
                   p=p, descriptors=memo.descriptors)

    grads = _grad_bands(a, b, logits, band, allow_tf32, fill, fused_fill, out_dtype, sink_a, width)
    return (sums, *grads)


def siglip_grads_triton(a, b, scale, bias, diag=0, *, coef=None, coef_scale=False, logits=None,
                        band=0, out_dtype=torch.float32, allow_tf32=False, sink_a=None,
                        with_loss=False, width=0):
    """(k G @ b, k G^T @ a, sum(G), sum(G * S')): gradients in ``out_dtype``, the two sums
    fp32 [] without k (see ops/blocks.siglip_grads); k = coef (None: 1; a number or a device
    tensor), times scale if ``coef_scale`` (taken in the kernel). ``with_loss``: the same pass also
    sums the pair losses, returned first (fp32 [M], as siglip_stats_triton's). ``width``: as
    clip_grads_triton's."""
    sums, grad_a, grad_b = _siglip_grad_pass(a, b, scale, bias, diag, coef, coef_scale, logits,
                                             band, out_dtype, allow_tf32, sink_a, with_loss, width)
    pair = sums[:2].sum(1)  # (sum G S', sum G): one reduction for both
    grads = (grad_a, grad_b, pair[1], pair[0])
    return (sums[2], *grads) if with_loss else grads


def siglip_loss_grads_triton(a, b, scale, bias, count, *, coef=None, coef_scale=False, band=0,
                             out_dtype=torch.float32, allow_tf32=False):
    """The single-device SigLIP forward whose backward will follow, as :func:`siglip_grads_triton`
    with ``with_loss`` on the block's own positives, finished in one more launch: (loss = the
    pair losses' sum / count [], grad_a, grad_b, pair [2] = (sum G S', sum G)), fp32 scalars,
    each its own tensor."""
    sums, grad_a, grad_b = _siglip_grad_pass(a, b, scale, bias, 0, coef, coef_scale, None, band,
                                             out_dtype, allow_tf32, None, True)
    f32 = dict(device=sums.device, dtype=torch.float32)
    loss, pair = torch.empty((), **f32), torch.empty(2, **f32)
    _siglip_finish_kernel[(1,)](sums, sums.shape[1], pair, loss, float(count), BLOCK=_EPI,
                                num_warps=8 if not _INTERPRET else 4)
    return loss, grad_a, grad_b, pair


def scale_grads_triton(grad, a, b, count, *, factor=1.0, scale=None, scalars=(), out_dtype=None):
    """The backward's finish in one launch: (a k, b k, coef s_0, ...) with coef = grad / count *
    factor (fp32, IEEE division) and k = coef scale, or k = grad where ``scale`` is None (the
    coefficients already folded into a and b). a k and b k: fp32 products rounded once to
    ``out_dtype`` (default a's), new tensors; ``scalars``: up to two fp32 one-element tensors,
    each giving a new fp32 [] tensor. grad: an fp32 one-element device tensor."""
    assert a.shape == b.shape and len(scalars) <= 2
    a, b = a.contiguous(), b.contiguous()
    dev = a.device
    grad = _scalar(grad, dev)
    out_a = torch.empty(a.shape, device=dev, dtype=out_dtype or a.dtype)
    out_b = torch.empty(b.shape, device=dev, dtype=out_dtype or a.dtype)
    dst = [torch.empty((), device=dev, dtype=torch.float32) for _ in scalars]
    unused = [grad] * (2 - len(scalars))  # pointers the kernel neither reads nor writes
    _scale_grads_kernel[(_cdiv(a.numel(), _VEC), 2)](
        grad, a, b, out_a, out_b, a.numel(), float(count), float(factor),
        grad if scale is None else _scalar(scale, dev), *scalars, *unused, *dst, *unused,
        FOLDED=scale is None, SCALARS=len(scalars), BLOCK=_VEC, num_warps=4)
    return (out_a, out_b, *dst)
