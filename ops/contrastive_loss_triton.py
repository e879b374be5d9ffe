"""Triton kernels for the contrastive losses (CLIP InfoNCE and SigLIP) on cuBLAS logit bands.

Design. The matrix work goes to cuBLAS; Triton only does what cuBLAS cannot, in one read of
each element. For a band of R rows of A (all of A when the whole R x N matrix fits in the
caller's budget) the host computes S' = A_band Bm^T with one GEMM into a buffer in the
features' dtype (bf16 logits, as autocast rounds them), then:
  forward  (_clip_stats_kernel / _siglip_stats_kernel): one read of the band gives the row
           sums (complete for the band) and the column partial sums (fp32 atomics) of
           exp(S - shift) and exp(S - shift) (S' - ref), or the SigLIP pair losses.
  backward (_clip_grad_kernel / _siglip_grad_kernel): recomputes the band with one GEMM (or
           reuses the kept whole matrix), overwrites it in place with
           P = coef (exp(S - r) + exp(S - c) - labels) (SigLIP: coef G), and two GEMMs give
           P @ Bm and P^T @ A_band.
FLOPs: 8 B^2 D in GEMMs (6 B^2 D when the whole matrix is kept from forward to backward),
all at cuBLAS's rate; the Triton kernels are memory-bound (one read, or one read and one
write, of the band in bf16). Bands hold <= max(N D, 2^24) elements, so the extra memory
stays O(B D) at any batch size.
Limits: the logits are rounded to the features' dtype before the exponentials (as a dense
bf16 loss does); the column atomics make the last bits of the column sums depend on the
order in which programs finish (not bitwise deterministic run to run).
Under TRITON_INTERPRET=1 (CPU) the kernels run exactly for fp32/fp16 (the host side does the
GEMMs in fp32 there); bf16 needs a GPU.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from .precision import matmul_precision

__all__ = [
    "band_rows",
    "clip_stats_triton",
    "clip_grads_triton",
    "siglip_stats_triton",
    "siglip_grads_triton",
]

LOG2E = 1.4426950408889634

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ----------------------------------------------------------------------------------------------
# Kernels (all read a band S'[M, N] of logits without the scale, row stride stride_s)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _log1p(u):
    """log(1 + u) to full precision for u >= 0 (Goldberg's correction of log(1 + u))."""
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


# CLIP statistics. For rows i and columns j of the band, S = scale * S', skipping the positive
# pairs (i - j == diag; the assembly adds them analytically):
#   row_sum_i  += sum_j exp(S_ij - rs_i),  row_wsum_i += sum_j exp(S_ij - rs_i) (S'_ij - rr_i)
#   col_sum_j  += sum_i exp(S_ij - cs_j),  col_wsum_j += sum_i exp(S_ij - cs_j) (S'_ij - cr_j)
# rs/cs: fixed shifts (no running max: partial sums add); rr/cr: the diagonal S' (weights taken
# relative to it, so E[S'] - S'_ii never cancels). Gradient: none (the backward recomputes).
# Program (pm, pn): rows pm*BLOCK_M.. and a span of COLS columns; row sums in registers,
# column sums with one fp32 atomic per column per program.
@triton.jit
def _clip_stats_kernel(S, stride_s, M, N, COLS, scale_ptr, row_shift, row_ref, col_shift, col_ref,
                       row_sum, row_wsum, col_sum, col_wsum, diag,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    rs2 = tl.load(row_shift + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    acc_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_wsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    n_start = pid_n * COLS
    for n0 in range(0, COLS, BLOCK_N):
        offs_n = n_start + n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        valid = (mask_m[:, None] & mask_n[None, :]) & ((offs_m[:, None] - offs_n[None, :]) != diag)
        x = tl.load(S + offs_m[:, None] * stride_s + offs_n[None, :], mask=valid, other=0.0)
        x = x.to(tl.float32)
        t2 = x * scale2
        p = tl.where(valid, tl.exp2(t2 - rs2[:, None]), 0.0)
        acc_sum += tl.sum(p, axis=1)
        acc_wsum += tl.sum(p * (x - rr[:, None]), axis=1)
        cs2 = tl.load(col_shift + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        cr = tl.load(col_ref + offs_n, mask=mask_n, other=0.0)
        q = tl.where(valid, tl.exp2(t2 - cs2[None, :]), 0.0)
        tl.atomic_add(col_sum + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
        tl.atomic_add(col_wsum + offs_n, tl.sum(q * (x - cr[None, :]), axis=0), mask=mask_n,
                      sem="relaxed")
    tl.atomic_add(row_sum + offs_m, acc_sum, mask=mask_m, sem="relaxed")
    tl.atomic_add(row_wsum + offs_m, acc_wsum, mask=mask_m, sem="relaxed")


# SigLIP statistics: row_loss_i += sum_j softplus(-z_ij (S_ij + bias)), z = +1 iff i - j == diag.
# softplus(t) = max(t, 0) + log1p(exp(-|t|)). Gradient: _siglip_grad_kernel.
@triton.jit
def _siglip_stats_kernel(S, stride_s, M, N, COLS, scale_ptr, bias_ptr, row_loss, diag,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    scale = tl.load(scale_ptr)
    bias = tl.load(bias_ptr)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    n_start = pid_n * COLS
    for n0 in range(0, COLS, BLOCK_N):
        offs_n = n_start + n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        valid = mask_m[:, None] & mask_n[None, :]
        x = tl.load(S + offs_m[:, None] * stride_s + offs_n[None, :], mask=valid, other=0.0)
        z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
        t = -z * (x.to(tl.float32) * scale + bias)
        sp = tl.maximum(t, 0.0) + _log1p(tl.exp(-tl.abs(t)))
        acc += tl.sum(tl.where(valid, sp, 0.0), axis=1)
    tl.atomic_add(row_loss + offs_m, acc, mask=mask_m, sem="relaxed")


# CLIP gradient tile: P_ij = coef (exp(S_ij - r_i) + exp(S_ij - c_j) - diag_value [i - j == diag]
#   - offset), r, c: final row / column LSEs, written over S' (P may be S: in place). The label
# terms are taken before the rounding to the buffer's dtype (P is close to them once the model
# learns). On the positive pairs S' is row_ref_i, the value the forward's LSEs were taken
# against (not the GEMM's rounding of it), so P_ii is consistent with the loss.
@triton.jit
def _clip_grad_kernel(S, P, stride_s, M, N, scale_ptr, coef_ptr, row_lse, col_lse, row_ref, diag,
                      diag_value, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    valid = mask_m[:, None] & mask_n[None, :]
    x = tl.load(S + offs_m[:, None] * stride_s + offs_n[None, :], mask=valid, other=0.0)
    x = x.to(tl.float32)
    scale2 = tl.load(scale_ptr) * 1.4426950408889634
    coef = tl.load(coef_ptr)
    r2 = tl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    c2 = tl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
    rr = tl.load(row_ref + offs_m, mask=mask_m, other=0.0)
    pos = (offs_m[:, None] - offs_n[None, :]) == diag
    t2 = tl.where(pos, rr[:, None], x) * scale2
    p = tl.exp2(t2 - r2[:, None]) + tl.exp2(t2 - c2[None, :])
    p -= tl.where(pos, diag_value, 0.0) + offset
    tl.store(P + offs_m[:, None] * stride_s + offs_n[None, :], (p * coef).to(P.dtype.element_ty),
             mask=valid)


# SigLIP gradient tile: P_ij = coef G_ij, G = -z sigmoid(-z x), x = S + bias (P may be S); and
# per row gsum_i += sum_j G_ij, gwsum_i += sum_j G_ij S'_ij (for d bias and d scale).
@triton.jit
def _siglip_grad_kernel(S, P, stride_s, M, N, scale_ptr, bias_ptr, coef_ptr, gsum, gwsum, diag,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    valid = mask_m[:, None] & mask_n[None, :]
    x = tl.load(S + offs_m[:, None] * stride_s + offs_n[None, :], mask=valid, other=0.0)
    x = x.to(tl.float32)
    scale = tl.load(scale_ptr)
    bias = tl.load(bias_ptr)
    coef = tl.load(coef_ptr)
    z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
    g = tl.where(valid, -z * tl.sigmoid(-z * (x * scale + bias)), 0.0)
    tl.atomic_add(gsum + offs_m, tl.sum(g, axis=1), mask=mask_m, sem="relaxed")
    tl.atomic_add(gwsum + offs_m, tl.sum(g * x, axis=1), mask=mask_m, sem="relaxed")
    tl.store(P + offs_m[:, None] * stride_s + offs_n[None, :], (g * coef).to(P.dtype.element_ty),
             mask=valid)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
if _INTERPRET:  # small tiles: the interpreter's cost grows with the tile
    _STATS_M, _STATS_N, _STATS_WARPS = 16, 16, 4
    _GRAD_M, _GRAD_N, _GRAD_WARPS = 16, 16, 4
else:
    _STATS_M, _STATS_N, _STATS_WARPS = 64, 128, 8
    _GRAD_M, _GRAD_N, _GRAD_WARPS = 32, 256, 8

_SMS: dict = {}


def _programs_wanted(device: torch.device) -> int:
    """About four waves of programs on this device (a handful under the interpreter)."""
    if device.type != "cuda":
        return 4
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return 4 * _SMS[device]


def band_rows(m: int, n: int, d: int) -> int:
    """Rows per band when the whole matrix is not kept: the band holds at most
    max(n d, 2^24) elements (O(B D) memory)."""
    budget = max(n * d, 1 << 24)
    return min(m, max(256, budget // max(n, 1)))


def _prep(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _scalar(x, device) -> torch.Tensor:
    """A device fp32 [1] tensor from a tensor or a Python number (no host sync either way)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device=device, dtype=torch.float32).reshape(1)
    return torch.full((1,), float(x), device=device, dtype=torch.float32)


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


def _addmm_(acc: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> None:
    """acc (fp32) += p @ x."""
    if p.is_cuda and p.dtype != torch.float32:
        torch.addmm(acc, p, x, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(p.float(), x.float())


def _stats_grid(m: int, n: int, device) -> tuple[tuple[int, int], int]:
    """Grid (row programs, column spans) and the span width (a multiple of the column tile)."""
    grid_m = triton.cdiv(m, _STATS_M)
    tiles_n = triton.cdiv(n, _STATS_N)
    spans = max(1, min(tiles_n, triton.cdiv(_programs_wanted(device), grid_m)))
    cols = triton.cdiv(tiles_n, spans) * _STATS_N
    return (grid_m, triton.cdiv(n, cols)), cols


def _step(m: int, n: int, d: int, keep: bool, band: int) -> int:
    """Rows per band: all of them when the matrix is kept, else ``band`` or the memory rule."""
    if keep:
        return m
    return min(m, band) if band > 0 else band_rows(m, n, d)


def _bands(m: int, step: int):
    for r0 in range(0, m, step):
        yield r0, min(m, r0 + step)


def clip_stats_triton(a, b, scale, row_shift, col_shift, row_ref, col_ref, diag=0, *,
                      keep_logits=False, band=0, allow_tf32=False):
    """Partial CLIP statistics of S = scale * a b^T (see ops/contrastive_loss.clip_stats).

    a: [M, D], b: [N, D]; scale: fp32 [] tensor; shifts and refs: fp32 [M] / [N]. Returns
    (row_sum, col_sum, row_wsum, col_wsum, logits): fp32 sums without the pairs i - j == diag;
    logits is the kept [M, N] matrix S' (features' dtype) when ``keep_logits``, else None.
    band: rows per GEMM band (0: by memory, :func:`band_rows`).
    """
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    f32 = dict(device=a.device, dtype=torch.float32)
    row_sum, row_wsum = torch.zeros(m, **f32), torch.zeros(m, **f32)
    col_sum, col_wsum = torch.zeros(n, **f32), torch.zeros(n, **f32)
    scale_t = _scalar(scale, a.device)
    shifts = [t.float().contiguous() for t in (row_shift, row_ref, col_shift, col_ref)]
    step = _step(m, n, d, keep_logits, band)
    buf = torch.empty(step, n, device=a.device, dtype=a.dtype)
    with matmul_precision(allow_tf32):
        for r0, r1 in _bands(m, step):
            s = _logits(a[r0:r1], b, buf[: r1 - r0])
            grid, cols = _stats_grid(r1 - r0, n, a.device)
            _clip_stats_kernel[grid](
                s, s.stride(0), r1 - r0, n, cols, scale_t, shifts[0][r0:r1], shifts[1][r0:r1],
                shifts[2], shifts[3], row_sum[r0:r1], row_wsum[r0:r1], col_sum, col_wsum,
                int(diag) - r0, BLOCK_M=_STATS_M, BLOCK_N=_STATS_N, num_warps=_STATS_WARPS)
    return row_sum, col_sum, row_wsum, col_wsum, (buf if keep_logits else None)


def siglip_stats_triton(a, b, scale, bias, diag=0, *, keep_logits=False, band=0,
                        allow_tf32=False):
    """Per-row SigLIP pair-loss sums of the block (fp32 [M]) and the kept logits (or None)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    row_loss = torch.zeros(m, device=a.device, dtype=torch.float32)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    step = _step(m, n, d, keep_logits, band)
    buf = torch.empty(step, n, device=a.device, dtype=a.dtype)
    with matmul_precision(allow_tf32):
        for r0, r1 in _bands(m, step):
            s = _logits(a[r0:r1], b, buf[: r1 - r0])
            grid, cols = _stats_grid(r1 - r0, n, a.device)
            _siglip_stats_kernel[grid](s, s.stride(0), r1 - r0, n, cols, scale_t, bias_t,
                                       row_loss[r0:r1], int(diag) - r0, BLOCK_M=_STATS_M,
                                       BLOCK_N=_STATS_N, num_warps=_STATS_WARPS)
    return row_loss, (buf if keep_logits else None)


def _grad_bands(a, b, logits, band, allow_tf32, fill: Callable, out_dtype, sink_a):
    """Shared band loop of the backward: per band, S' (recomputed, or the kept ``logits``),
    ``fill(s, p, r0, r1)`` writes the scaled gradient block into p (in place, p is s, except
    for the kept logits, which stay untouched: the registered op declares no mutation), then
    grad_a rows = P @ b and grad_b += P^T @ a_band. Returns (grad_a or None, grad_b)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    keep = logits is not None
    step = _step(m, n, d, keep, band)
    grad_a = None if sink_a is not None else torch.empty(m, d, device=a.device, dtype=out_dtype)
    with matmul_precision(allow_tf32):
        if step >= m:  # one band: two plain GEMMs, no fp32 accumulator
            s = logits if keep else _logits(a, b, torch.empty(m, n, device=a.device, dtype=a.dtype))
            p = torch.empty_like(s) if keep else s
            fill(s, p, 0, m)
            s = p
            rows = _mm(s, b, out_dtype if sink_a is None else torch.float32)
            grad_b = _mm(s.T, a, out_dtype)
            if sink_a is None:
                grad_a = rows
            else:
                sink_a(0, m, rows)
            return grad_a, grad_b
        acc_b = torch.zeros(n, d, device=a.device, dtype=torch.float32)
        buf = torch.empty(step, n, device=a.device, dtype=a.dtype)
        for r0, r1 in _bands(m, step):
            s = _logits(a[r0:r1], b, buf[: r1 - r0])
            fill(s, s, r0, r1)
            if sink_a is None:
                grad_a[r0:r1] = _mm(s, b, out_dtype)
            else:
                sink_a(r0, r1, _mm(s, b, torch.float32))
            _addmm_(acc_b, s.T, a[r0:r1])
    return grad_a, (acc_b if out_dtype == torch.float32 else acc_b.to(out_dtype))


def _grad_grid(m, n):
    return (triton.cdiv(m, _GRAD_M), triton.cdiv(n, _GRAD_N))


def clip_grads_triton(a, b, scale, row_lse, col_lse, row_ref, *, diag=0, diag_value=0.0,
                      offset=0.0, coef=None, logits=None, band=0, out_dtype=torch.float32,
                      allow_tf32=False, sink_a=None):
    """(coef P @ b, coef P^T @ a) in ``out_dtype`` (see ops/contrastive_loss.clip_grads).

    coef: None (1) or an fp32 [] / [1] device tensor folded into P before its rounding;
    logits: the kept [M, N] S' of the forward instead of a recompute (read, not written).
    """
    a = _prep(a)
    scale_t = _scalar(scale, a.device)
    coef_t = _scalar(1.0 if coef is None else coef, a.device)
    r, c, ref = (t.float().contiguous() for t in (row_lse, col_lse, row_ref))

    def fill(s, p, r0, r1):
        _clip_grad_kernel[_grad_grid(r1 - r0, s.shape[1])](
            s, p, s.stride(0), r1 - r0, s.shape[1], scale_t, coef_t, r[r0:r1], c, ref[r0:r1],
            int(diag) - r0,
            float(diag_value), float(offset), BLOCK_M=_GRAD_M, BLOCK_N=_GRAD_N,
            num_warps=_GRAD_WARPS)

    return _grad_bands(a, b, logits, band, allow_tf32, fill, out_dtype, sink_a)


def siglip_grads_triton(a, b, scale, bias, diag=0, *, coef=None, logits=None, band=0,
                        out_dtype=torch.float32, allow_tf32=False, sink_a=None):
    """(coef G @ b, coef G^T @ a, sum(G), sum(G * S')): gradients in ``out_dtype``, the two sums
    fp32 [] without coef (see ops/contrastive_loss.siglip_grads)."""
    a = _prep(a)
    m = a.shape[0]
    f32 = dict(device=a.device, dtype=torch.float32)
    gsum, gwsum = torch.zeros(m, **f32), torch.zeros(m, **f32)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    coef_t = _scalar(1.0 if coef is None else coef, a.device)

    def fill(s, p, r0, r1):
        _siglip_grad_kernel[_grad_grid(r1 - r0, s.shape[1])](
            s, p, s.stride(0), r1 - r0, s.shape[1], scale_t, bias_t, coef_t, gsum[r0:r1],
            gwsum[r0:r1], int(diag) - r0, BLOCK_M=_GRAD_M, BLOCK_N=_GRAD_N,
            num_warps=_GRAD_WARPS)

    grad_a, grad_b = _grad_bands(a, b, logits, band, allow_tf32, fill, out_dtype, sink_a)
    return grad_a, grad_b, gsum.sum(), gwsum.sum()
