"""Triton kernels of the CLIP forward: the O(B D) prologue (positives, norms, shifts), the
statistics passes over S' and the O(B) epilogue (loss terms, LSEs, d-scale sums).

Statistics three ways, picked by ops/contrastive_loss_triton.py: band passes over a cuBLAS logit
band (_clip_stats_kernel: a row pass and a column pass in one launch), a fused kernel taking the
logit tile from tl.dot in registers (_clip_stats_fused_kernel), and the plain sums by column
strips for forwards whose backward sums d scale itself (_clip_sums_strip_kernel, TMA loads).
The math: ops/blocks.clip_stats, clip_shifts and clip_terms (the torch reference).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import _interior, _log1p, _log1p_unit, _logit_tile, _tiles

__all__ = [
    "_clip_prologue_kernel",
    "_clip_shift_kernel",
    "_clip_epilogue_kernel",
    "_clip_stats_kernel",
    "_clip_stats_fused_kernel",
    "_clip_sums_strip_kernel",
]


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
