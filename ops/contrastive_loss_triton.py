"""Triton kernels for the tiled contrastive losses (CLIP InfoNCE and SigLIP).

Design. S = scale * A Bm^T is never stored beyond a tile (forward) or a row band (backward).
How often S is computed: twice in all, the minimum for an exact loss whose backward needs
the final LSEs: once in the forward, once in the backward.
  forward  (_contrastive_fwd_kernel): one program per BLOCK_M rows of A walks all column tiles
           of Bm. Both directions in one pass: row sums stay in registers; column sums are
           added with fp32 atomics (the column loop starts at a different tile in each program,
           so programs rarely hit the same columns at once). Sums are relative to fixed shifts
           (the diagonal logits), so no running max and no rescaling: see ops/contrastive_loss.py.
           2 B^2 D FLOPs.
  backward (_contrastive_bwd_kernel): for a band of R rows, one program per (BLOCK_M, BLOCK_N)
           tile recomputes S and writes P = exp(S - r) + exp(S - c) (CLIP) or
           G = -z sigmoid(-z x) (SigLIP) into an R x N buffer in the features' dtype; then two
           cuBLAS GEMMs give P @ Bm and P^T @ A_band. 2 B^2 D (Triton) + 4 B^2 D (cuBLAS).
  Total 8 B^2 D FLOPs = the roofline count. The band size R keeps the P buffer at
  <= B D elements, so the extra memory stays O(B D) at any batch size.
Limits: P is rounded to the features' dtype before the GEMMs (as autocast rounds dS); fp32
features use exact fp32 dots unless allow_tf32. The column atomics make the last bits of the
column sums depend on summation order (not bitwise deterministic run to run).
Under TRITON_INTERPRET=1 (CPU) these kernels run exactly for fp32/fp16; bf16 needs a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dot_tile(A, Bm, offs_m, offs_n, mask_m, mask_n, D, stride_am, stride_bn,
              DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """S'[BLOCK_M, BLOCK_N] = A[offs_m] . Bm[offs_n]^T, fp32 accumulation, masked on D."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = Bm + offs_n[:, None] * stride_bn + offs_k[None, :]
    for k0 in range(0, D, BLOCK_K):
        k_mask = (offs_k + k0) < D
        a = tl.load(a_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc


# Forward. CLIP: for rows i of A and columns j of Bm, with S = scale * S',
#   row_sum_i  += sum_j exp(S_ij - rs_i),  row_wsum_i += sum_j exp(S_ij - rs_i) S'_ij
#   col_sum_j  += sum_i exp(S_ij - cs_j),  col_wsum_j += sum_i exp(S_ij - cs_j) S'_ij   (atomics)
# SigLIP: row_sum_i += sum_j softplus(-z_ij (S_ij + bias)), z = +1 iff i - j == diag.
# Gradient: none here (the backward kernel recomputes S from A and Bm).
@triton.jit
def _contrastive_fwd_kernel(A, Bm, scale_ptr, bias_ptr, row_shift_ptr, col_shift_ptr,
                            row_sum_ptr, row_wsum_ptr, col_sum_ptr, col_wsum_ptr,
                            M, N, D, diag, stride_am, stride_bn, size_bucket,
                            SIGLIP: tl.constexpr, DOT_PRECISION: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    scale = tl.load(scale_ptr)
    scale2 = scale * 1.4426950408889634
    acc_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_wsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if SIGLIP:
        bias = tl.load(bias_ptr)
    else:
        rshift2 = tl.load(row_shift_ptr + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
    num_n = tl.cdiv(N, BLOCK_N)
    for it in range(0, num_n):
        nb = (pid + it) % num_n  # staggered start: programs touch different column atomics
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        dots = _dot_tile(A, Bm, offs_m, offs_n, mask_m, mask_n, D, stride_am, stride_bn,
                         DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
        valid = mask_m[:, None] & mask_n[None, :]
        if SIGLIP:
            z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
            t = -z * (dots * scale + bias)
            # softplus(t) = max(t, 0) + log(1 + exp(-|t|)), stable for any t
            sp = tl.maximum(t, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(t)))
            acc_sum += tl.sum(tl.where(valid, sp, 0.0), axis=1)
        else:
            t2 = dots * scale2
            p = tl.where(valid, tl.exp2(t2 - rshift2[:, None]), 0.0)
            acc_sum += tl.sum(p, axis=1)
            acc_wsum += tl.sum(p * dots, axis=1)
            cshift2 = tl.load(col_shift_ptr + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
            q = tl.where(valid, tl.exp2(t2 - cshift2[None, :]), 0.0)
            tl.atomic_add(col_sum_ptr + offs_n, tl.sum(q, axis=0), mask=mask_n, sem="relaxed")
            tl.atomic_add(col_wsum_ptr + offs_n, tl.sum(q * dots, axis=0), mask=mask_n,
                          sem="relaxed")
    tl.store(row_sum_ptr + offs_m, acc_sum, mask=mask_m)
    if not SIGLIP:
        tl.store(row_wsum_ptr + offs_m, acc_wsum, mask=mask_m)


# Backward tile producer for a band of rows of A (M = band rows). Writes, per tile,
#   CLIP:   P_ij = exp(S_ij - r_i) + exp(S_ij - c_j) - diag_value [i - j == diag] - offset
#           (r, c: final row/column LSEs; the label term is taken before P is rounded)
#   SigLIP: G_ij = -z_ij sigmoid(-z_ij x_ij), x = S + bias; and atomically adds per-row
#           sum_j G_ij and sum_j G_ij S'_ij (for d bias and d scale).
# The host then forms P @ Bm (dA) and P^T @ A (dBm) with cuBLAS.
@triton.jit
def _contrastive_bwd_kernel(A, Bm, P, scale_ptr, bias_ptr, row_lse_ptr, col_lse_ptr,
                            gsum_ptr, gwsum_ptr, M, N, D, diag, diag_value, offset, stride_am,
                            stride_bn,
                            stride_pm,
                            size_bucket, SIGLIP: tl.constexpr, DOT_PRECISION: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row tiles share the column tiles they stream (L2 reuse)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dots = _dot_tile(A, Bm, offs_m, offs_n, mask_m, mask_n, D, stride_am, stride_bn,
                     DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    scale = tl.load(scale_ptr)
    valid = mask_m[:, None] & mask_n[None, :]
    if SIGLIP:
        bias = tl.load(bias_ptr)
        z = tl.where((offs_m[:, None] - offs_n[None, :]) == diag, 1.0, -1.0)
        g = -z * tl.sigmoid(-z * (dots * scale + bias))
        g = tl.where(valid, g, 0.0)
        tl.atomic_add(gsum_ptr + offs_m, tl.sum(g, axis=1), mask=mask_m, sem="relaxed")
        tl.atomic_add(gwsum_ptr + offs_m, tl.sum(g * dots, axis=1), mask=mask_m, sem="relaxed")
        out = g
    else:
        scale2 = scale * 1.4426950408889634
        r2 = tl.load(row_lse_ptr + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634
        c2 = tl.load(col_lse_ptr + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634
        t2 = dots * scale2
        out = tl.exp2(t2 - r2[:, None]) + tl.exp2(t2 - c2[None, :])
        out -= tl.where((offs_m[:, None] - offs_n[None, :]) == diag, diag_value, 0.0) + offset
    p_ptrs = P + offs_m[:, None] * stride_pm + offs_n[None, :]
    tl.store(p_ptrs, out.to(P.dtype.element_ty), mask=valid)


# ----------------------------------------------------------------------------------------------
# Launch configuration
# ----------------------------------------------------------------------------------------------
def _fwd_configs():
    if _INTERPRET:  # the interpreter cannot autotune over several configs
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4)]
    return [
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8, num_stages=4),
        triton.Config({"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 64}, num_warps=8, num_stages=3),
    ]


def _bwd_configs():
    if _INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4)]
    return [
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    ]


# Tuned per size bucket (small / large batch), not per exact N: one tuning serves all batches.
_fwd_tuned = triton.autotune(
    configs=_fwd_configs(), key=["size_bucket", "SIGLIP", "DOT_PRECISION"],
    reset_to_zero=["row_sum_ptr", "row_wsum_ptr", "col_sum_ptr", "col_wsum_ptr"],
)(_contrastive_fwd_kernel)
_bwd_tuned = triton.autotune(
    configs=_bwd_configs(), key=["size_bucket", "SIGLIP", "DOT_PRECISION"],
    reset_to_zero=["gsum_ptr", "gwsum_ptr"],
)(_contrastive_bwd_kernel)


def _bucket(m: int, n: int) -> int:
    return int(m * n >= 8192 * 8192)


def _explicit_blocks(block_m: int, block_n: int) -> tuple[int, int]:
    """Tile sizes given in the config (0 = 64) instead of autotuning; checked for tl.dot."""
    blocks = (block_m or 64, block_n or 64)
    for name, value in zip(("block_m", "block_n"), blocks):
        if value < 16 or value & (value - 1):
            raise ValueError(f"triton {name} must be a power of two >= 16, got {value}")
    return blocks


def _precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    return "tf32" if (dtype == torch.float32 and allow_tf32) else "ieee"


def _prep(a, b):
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    return a, b


def _scalar(x: torch.Tensor, device) -> torch.Tensor:
    return x.detach().to(device=device, dtype=torch.float32).reshape(1)


def _launch_fwd(a, b, scale, bias, row_shift, col_shift, diag, siglip, block_m, block_n, allow_tf32):
    a, b = _prep(a, b)
    m, d = a.shape
    n = b.shape[0]
    f32 = dict(device=a.device, dtype=torch.float32)
    row_sum = torch.zeros(m, **f32)
    row_wsum = torch.zeros(m if not siglip else 1, **f32)
    col_sum = torch.zeros(n if not siglip else 1, **f32)
    col_wsum = torch.zeros(n if not siglip else 1, **f32)
    spare = torch.zeros(2, **f32)  # for unused pointers (see _launch_bwd_band)
    args = (a, b, _scalar(scale, a.device), _scalar(bias, a.device) if bias is not None else spare,
            row_shift if row_shift is not None else spare, col_shift if col_shift is not None else spare,
            row_sum, row_wsum, col_sum, col_wsum, m, n, d, int(diag), a.stride(0), b.stride(0),
            _bucket(m, n))
    prec = _precision(a.dtype, allow_tf32)
    if block_m or block_n:
        bm, bn = _explicit_blocks(block_m, block_n)
        _contrastive_fwd_kernel[(triton.cdiv(m, bm),)](
            *args, SIGLIP=siglip, DOT_PRECISION=prec, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_K=32 if _INTERPRET else 64, num_warps=4)
    else:
        _fwd_tuned[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)](
            *args, SIGLIP=siglip, DOT_PRECISION=prec)
    return row_sum, row_wsum, col_sum, col_wsum


def _band_rows(m: int, n: int, d: int) -> int:
    """Rows per backward band: the P buffer holds at most max(n d, 2^24) elements."""
    budget = max(n * d, 1 << 24)
    rows = max(256, budget // max(n, 1))
    return min(m, rows)


def _launch_bwd_band(a, b, pbuf, scale, bias, row_lse, col_lse, gsum, gwsum, diag, diag_value,
                     offset, siglip, block_m, block_n, allow_tf32):
    m, d = a.shape
    n = b.shape[0]
    # Unused pointers get their own scratch, never an input: the autotuner zeroes gsum/gwsum
    # (reset_to_zero) between trial launches, which must not touch scale.
    spare = torch.zeros(2, device=a.device, dtype=torch.float32)
    args = (a, b, pbuf, scale, bias if bias is not None else spare,
            row_lse if row_lse is not None else spare, col_lse if col_lse is not None else spare,
            gsum if gsum is not None else spare, gwsum if gwsum is not None else spare,
            m, n, d, int(diag), float(diag_value), float(offset), a.stride(0), b.stride(0),
            pbuf.stride(0),
            _bucket(m, n))
    prec = _precision(a.dtype, allow_tf32)
    if block_m or block_n:
        bm, bn = _explicit_blocks(block_m, block_n)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _contrastive_bwd_kernel[grid](*args, SIGLIP=siglip, DOT_PRECISION=prec, BLOCK_M=bm,
                                      BLOCK_N=bn, BLOCK_K=32 if _INTERPRET else 64, GROUP_M=4,
                                      num_warps=4)
    else:
        _bwd_tuned[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)](
            *args, SIGLIP=siglip, DOT_PRECISION=prec)


def _band_products(a, b, scale, bias, row_lse, col_lse, diag, diag_value, offset, siglip,
                   block_m, block_n, allow_tf32, sink_a=None):
    """Runs the backward kernel band by band; returns (P @ b, P^T @ a, gsum, gwsum) in fp32.

    With ``sink_a`` each band's rows of P @ b go to ``sink_a(r0, r1, rows)`` (first result None).
    """
    from .contrastive_loss import _emit, _matmul_precision

    a, b = _prep(a, b)
    m, d = a.shape
    n = b.shape[0]
    f32 = dict(device=a.device, dtype=torch.float32)
    grad_a = torch.empty(m, d, **f32) if sink_a is None else None
    grad_b = torch.zeros(n, d, **f32)
    gsum = torch.zeros(m, **f32) if siglip else None
    gwsum = torch.zeros(m, **f32) if siglip else None
    scale_t = _scalar(scale, a.device)
    bias_t = _scalar(bias, a.device) if bias is not None else None
    band = _band_rows(m, n, d)
    pbuf = torch.empty(band, n, device=a.device, dtype=a.dtype)
    cuda = a.is_cuda and a.dtype != torch.float32
    with _matmul_precision(allow_tf32):
        for r0 in range(0, m, band):
            r1 = min(m, r0 + band)
            p = pbuf[: r1 - r0]
            _launch_bwd_band(a[r0:r1], b, p, scale_t, bias_t,
                             row_lse[r0:r1] if row_lse is not None else None, col_lse,
                             gsum[r0:r1] if siglip else None, gwsum[r0:r1] if siglip else None,
                             diag - r0, diag_value, offset, siglip, block_m, block_n,
                             allow_tf32)
            if cuda:  # bf16/fp16 GEMMs with fp32 outputs (no rounding of the partial sums)
                rows = torch.mm(p, b, out_dtype=torch.float32)
                torch.addmm(grad_b, p.T, a[r0:r1], out_dtype=torch.float32, out=grad_b)
            else:
                rows = p.float() @ b.float()
                grad_b.addmm_(p.T.float(), a[r0:r1].float())
            _emit(rows, r0, r1, grad_a, sink_a)
    return grad_a, grad_b, gsum, gwsum


# ----------------------------------------------------------------------------------------------
# Host launchers with the block-primitive signatures of ops/contrastive_loss.py
# ----------------------------------------------------------------------------------------------
def clip_stats_triton(a, b, scale, row_shift, col_shift, *, block_m=0, block_n=0, allow_tf32=False):
    row_sum, row_wsum, col_sum, col_wsum = _launch_fwd(
        a, b, scale, None, row_shift.float().contiguous(), col_shift.float().contiguous(), 0,
        False, block_m, block_n, allow_tf32)
    return row_sum, col_sum, row_wsum, col_wsum


def clip_grads_triton(a, b, scale, row_lse, col_lse, *, diag=0, diag_value=0.0, offset=0.0,
                      block_m=0, block_n=0, allow_tf32=False, sink_a=None):
    grad_a, grad_b, _, _ = _band_products(a, b, scale, None, row_lse.float().contiguous(),
                                          col_lse.float().contiguous(), diag, diag_value, offset,
                                          False,
                                          block_m, block_n, allow_tf32, sink_a)
    return grad_a, grad_b


def siglip_stats_triton(a, b, scale, bias, diag=0, *, block_m=0, block_n=0, allow_tf32=False):
    row_loss, _, _, _ = _launch_fwd(a, b, scale, bias, None, None, diag, True, block_m, block_n,
                                    allow_tf32)
    return row_loss


def siglip_grads_triton(a, b, scale, bias, diag=0, *, block_m=0, block_n=0, allow_tf32=False,
                        sink_a=None):
    grad_a, grad_b, gsum, gwsum = _band_products(a, b, scale, bias, None, None, diag, 0.0, 0.0, True,
                                                 block_m, block_n, allow_tf32, sink_a)
    return grad_a, grad_b, gsum.sum(), gwsum.sum()
