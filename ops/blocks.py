"""Block primitives of the contrastive losses, and the per-row assembly every scheme shares.

One role: given a pair of feature blocks (rows A, columns Bm), return partial results that merge
by plain addition: the single-device op (ops/contrastive_loss.py) runs them on the whole batch,
the distributed schemes on the blocks a sweep hands them (ops/assembly.py). The torch
versions tile in plain torch (any device; a tile >= the block is the ``naive`` impl); ``triton``
dispatches to ops/contrastive_loss_triton.py. :func:`clip_shifts` and :func:`clip_terms` are the
shifts the sums are taken against and the per-row terms assembled from the complete sums (the
math is in ops/contrastive_loss.py's docstring).
Limit: the torch tiles hold block_m x block_n fp32 logits at a time (1024 x 1024 by default).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .precision import matmul_precision

__all__ = [
    "LOGIT_BOUND_LIMIT",
    "SHIFT_MARGIN",
    "SHIFT_SLACK",
    "clip_block_max",
    "clip_stats",
    "clip_grads",
    "clip_shifts",
    "clip_terms",
    "siglip_stats",
    "siglip_grads",
    "loose_shifts",
    "rowdot",
    "rownorm",
    "triton_kernels",
]

_DEFAULT_TORCH_BLOCK = 1024
SHIFT_MARGIN = 64.0
"""No exponent exceeds this (e^64 * B stays finite in fp32 for B < 2^28)."""
LOGIT_BOUND_LIMIT = 2.0**20
"""The largest logit bound |s| max|I| max|T| the op takes: every row's LSE is one fp32 number of
that magnitude, which puts ~|S| 2^-24 into the gradients' exponents (~1e-5 of the largest
gradient at |S| = 100, 2-3e-4 at 1e4) and, far above this, overflows them. Above it the shifts
are NaN (a NaN loss)."""
SHIFT_SLACK = 48.0
"""The most a row's shift may sit above its positive logit on a bound alone. The sum of a row is
then at least e^-48 (its positive), and what underflow drops (< B e^-87.3, every term flushed)
stays below 2^-24 of it for B < 2^28; a row whose bound is looser gets its true maximum as shift
(:func:`clip_block_max`)."""


# ----------------------------------------------------------------------------------------------
# Block primitives, plain torch (tiles of block_m x block_n; block >= size gives `naive`)
# ----------------------------------------------------------------------------------------------
def _tiles(n: int, block: int):
    for start in range(0, n, block):
        yield start, min(start + block, n)


def _positives(i0, i1, j0, j1, diag, device):
    """True where row i - column j == diag (the positive pairs of this tile)."""
    rows = torch.arange(i0, i1, device=device)[:, None]
    cols = torch.arange(j0, j1, device=device)[None, :]
    return rows - cols == diag


def _pair_signs(i0, i1, j0, j1, diag, device):
    """+1 on the positive pairs of this tile, -1 elsewhere."""
    return torch.where(_positives(i0, i1, j0, j1, diag, device), 1.0, -1.0)


def _torch_clip_stats(a, b, scale, row_shift, col_shift, row_ref, col_ref, diag, bm, bn):
    a32, b32 = a.float(), b.float()
    row_sum = a32.new_zeros(a.shape[0])
    row_wsum = a32.new_zeros(a.shape[0])
    col_sum = a32.new_zeros(b.shape[0])
    col_wsum = a32.new_zeros(b.shape[0])
    for i0, i1 in _tiles(a.shape[0], bm):
        for j0, j1 in _tiles(b.shape[0], bn):
            dots = a32[i0:i1] @ b32[j0:j1].T
            logits = scale * dots
            off = ~_positives(i0, i1, j0, j1, diag, a.device)
            p = torch.exp(logits - row_shift[i0:i1, None]) * off
            row_sum[i0:i1] += p.sum(1)
            row_wsum[i0:i1] += (p * (dots - row_ref[i0:i1, None])).sum(1)
            p = torch.exp(logits - col_shift[None, j0:j1]) * off
            col_sum[j0:j1] += p.sum(0)
            col_wsum[j0:j1] += (p * (dots - col_ref[None, j0:j1])).sum(0)
    return row_sum, col_sum, row_wsum, col_wsum


def _torch_clip_grads(a, b, scale, row_lse, col_lse, row_ref, bm, bn, diag, diag_value, offset,
                      sink_a=None):
    a32, b32 = a.float(), b.float()
    grad_a = torch.zeros_like(a32) if sink_a is None else None
    grad_b = torch.zeros_like(b32)
    for i0, i1 in _tiles(a.shape[0], bm):
        rows = a32.new_zeros(i1 - i0, a.shape[1])
        for j0, j1 in _tiles(b.shape[0], bn):
            logits = scale * (a32[i0:i1] @ b32[j0:j1].T)
            pos = _positives(i0, i1, j0, j1, diag, a.device)
            logits = torch.where(pos, scale * row_ref[i0:i1, None], logits)
            p = torch.exp(logits - row_lse[i0:i1, None]) + torch.exp(logits - col_lse[None, j0:j1])
            if diag_value:
                p -= diag_value * pos
            if offset:
                p -= offset
            rows += p @ b32[j0:j1]
            grad_b[j0:j1] += p.T @ a32[i0:i1]
        _emit(rows, i0, i1, grad_a, sink_a)
    return grad_a, grad_b


def _emit(rows, i0, i1, out, sink):
    """Hand finished rows [i0, i1) of the first gradient to ``sink`` or store them in ``out``."""
    if sink is None:
        out[i0:i1] = rows
    else:
        sink(i0, i1, rows)


def _torch_siglip_stats(a, b, scale, bias, diag, bm, bn):
    a32, b32 = a.float(), b.float()
    row_loss = a32.new_zeros(a.shape[0])
    for i0, i1 in _tiles(a.shape[0], bm):
        for j0, j1 in _tiles(b.shape[0], bn):
            x = scale * (a32[i0:i1] @ b32[j0:j1].T) + bias
            z = _pair_signs(i0, i1, j0, j1, diag, a.device)
            row_loss[i0:i1] += F.softplus(-z * x).sum(1)
    return row_loss


def _torch_siglip_grads(a, b, scale, bias, diag, bm, bn, sink_a=None, row_loss=None):
    a32, b32 = a.float(), b.float()
    grad_a = torch.zeros_like(a32) if sink_a is None else None
    grad_b = torch.zeros_like(b32)
    gsum = a32.new_zeros(())
    gwsum = a32.new_zeros(())
    for i0, i1 in _tiles(a.shape[0], bm):
        rows = a32.new_zeros(i1 - i0, a.shape[1])
        for j0, j1 in _tiles(b.shape[0], bn):
            dots = a32[i0:i1] @ b32[j0:j1].T
            x = scale * dots + bias
            z = _pair_signs(i0, i1, j0, j1, diag, a.device)
            g = -z * torch.sigmoid(-z * x)
            if row_loss is not None:
                row_loss[i0:i1] += F.softplus(-z * x).sum(1)
            rows += g @ b32[j0:j1]
            grad_b[j0:j1] += g.T @ a32[i0:i1]
            gsum += g.sum()
            gwsum += (g * dots).sum()
        _emit(rows, i0, i1, grad_a, sink_a)
    return grad_a, grad_b, gsum, gwsum


# ----------------------------------------------------------------------------------------------
# Dispatch of the block primitives
# ----------------------------------------------------------------------------------------------
def _blocks(impl: str, a: Tensor, b: Tensor, block_m: int, block_n: int):
    if impl == "naive":
        return max(a.shape[0], 1), max(b.shape[0], 1)
    return block_m or _DEFAULT_TORCH_BLOCK, block_n or _DEFAULT_TORCH_BLOCK


_TRITON = []


def triton_kernels():
    """ops/contrastive_loss_triton.py, imported at first use (it defines the kernels) and kept."""
    if not _TRITON:
        from . import contrastive_loss_triton

        _TRITON.append(contrastive_loss_triton)
    return _TRITON[0]


def clip_stats(a: Tensor, b: Tensor, scale: Tensor, row_shift: Tensor, col_shift: Tensor,
               row_ref: Tensor, col_ref: Tensor, diag: int = 0, *, impl: str = "chunked_torch",
               block_m: int = 0, block_n: int = 0, allow_tf32: bool = False):
    """Partial CLIP statistics of the block S = scale * a b^T, without its positive pairs.

    a: [M, D], b: [N, D] (same dtype); scale: [] fp32; row_shift, row_ref: [M], col_shift,
    col_ref: [N] fp32 (shifts from :func:`clip_shifts`; refs: the diagonal S'_ii of each row /
    column). Pairs with i - j == diag are left out (out of range: a block with no positives).
    Returns fp32 (row_sum [M], col_sum [N], row_wsum [M], col_wsum [N]):
    row_sum_i = sum_j exp(S_ij - row_shift_i), row_wsum_i = sum_j exp(S_ij - row_shift_i)
    (S'_ij - row_ref_i), and the same over i for columns. Partials over blocks add up.
    For triton, block_m is the rows per GEMM band (0: by memory) and block_n is unused.
    """
    if impl == "triton":
        return triton_kernels().clip_stats_triton(a, b, scale, row_shift, col_shift, row_ref, col_ref,
                                           diag, band=block_m, allow_tf32=allow_tf32)[:4]
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with matmul_precision(allow_tf32):
        return _torch_clip_stats(a, b, scale, row_shift, col_shift, row_ref, col_ref, diag, bm, bn)


def clip_grads(a: Tensor, b: Tensor, scale: Tensor, row_lse: Tensor, col_lse: Tensor,
               row_ref: Tensor, *, diag: int = 0, diag_value: float = 0.0, offset: float = 0.0,
               impl: str = "chunked_torch",
               block_m: int = 0, block_n: int = 0, allow_tf32: bool = False, sink_a=None,
               width: int = 0):
    """(P @ b, P^T @ a) in fp32 for P = exp(S - row_lse[:, None]) + exp(S - col_lse[None, :])
    - diag_value [i - j == diag] - offset.

    a: [M, D], b: [N, D]; row_lse: [M], col_lse: [N] fp32 (final, global LSEs); row_ref: [M]
    the positives' S' as the forward took them (:func:`clip_shifts`), used on the pairs
    i - j == diag instead of the tile's own rounding of them. The label terms
    ``diag_value`` (2 (1 - eps) for the block holding the positives) and ``offset`` (2 eps / B,
    label smoothing) are subtracted inside the tile, before P is rounded to the features'
    dtype: P is close to them once the model learns, and subtracting after rounding would
    cancel away the gradient's precision.
    Returns ([M, D], [N, D]) fp32; partials over blocks add up. With ``sink_a(i0, i1, rows)``
    the finished fp32 rows of P @ b are handed over band by band instead (first result None),
    so the caller can write its final gradient without an [M, D] fp32 buffer. ``width``
    (triton): the global batch of a sweep's column block, whose memory budget its blocks take.
    """
    if impl == "triton":
        return triton_kernels().clip_grads_triton(a, b, scale, row_lse, col_lse, row_ref, diag=diag,
                                           diag_value=diag_value, offset=offset, band=block_m,
                                           allow_tf32=allow_tf32, sink_a=sink_a, width=width)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with matmul_precision(allow_tf32):
        return _torch_clip_grads(a, b, scale, row_lse, col_lse, row_ref, bm, bn, diag, diag_value,
                                 offset, sink_a)


def siglip_stats(a: Tensor, b: Tensor, scale: Tensor, bias: Tensor, diag: int = 0, *,
                 impl: str = "chunked_torch", block_m: int = 0, block_n: int = 0,
                 allow_tf32: bool = False) -> Tensor:
    """Per-row sums of softplus(-z x), x = scale * a b^T + bias, z = +1 where i - j == diag.

    ``diag`` is the offset of the positive pairs inside this block (0 for the block on the
    diagonal; out of range for a block with no positives). Returns fp32 [M].
    """
    if impl == "triton":
        return triton_kernels().siglip_stats_triton(a, b, scale, bias, diag, band=block_m,
                                             allow_tf32=allow_tf32)[0]
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with matmul_precision(allow_tf32):
        return _torch_siglip_stats(a, b, scale, bias, diag, bm, bn)


def siglip_grads(a: Tensor, b: Tensor, scale: Tensor, bias: Tensor, diag: int = 0, *,
                 impl: str = "chunked_torch", block_m: int = 0, block_n: int = 0,
                 allow_tf32: bool = False, sink_a=None, with_loss: bool = False, width: int = 0):
    """(G @ b [M, D], G^T @ a [N, D], sum(G) [], sum(G * S') []) in fp32, G = -z sigmoid(-z x).

    ``sink_a`` and ``width`` as in :func:`clip_grads`. ``with_loss``: the same pass also gives
    the :func:`siglip_stats` row sums, returned first (a forward whose backward will follow)."""
    if impl == "triton":
        return triton_kernels().siglip_grads_triton(a, b, scale, bias, diag, band=block_m,
                                             allow_tf32=allow_tf32, sink_a=sink_a,
                                             with_loss=with_loss, width=width)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    row_loss = a.new_zeros(a.shape[0], dtype=torch.float32) if with_loss else None
    with matmul_precision(allow_tf32):
        grads = _torch_siglip_grads(a, b, scale, bias, diag, bm, bn, sink_a, row_loss)
    return (row_loss, *grads) if with_loss else grads


def rowdot(a: Tensor, b: Tensor, chunk_elems: int = 1 << 22) -> Tensor:
    """<a_i, b_i> in fp32 ([B]), in row chunks of <= chunk_elems elements (16 MiB of fp32
    temporaries), so no [B, D] fp32 copy of a or b is made."""
    out = torch.empty(a.shape[0], device=a.device, dtype=torch.float32)
    for i0, i1 in _tiles(a.shape[0], max(1, chunk_elems // max(a.shape[1], 1))):
        out[i0:i1] = (a[i0:i1].float() * b[i0:i1].float()).sum(-1)
    return out


def rownorm(a: Tensor) -> Tensor:
    """|a_i| in fp32 ([B]) without an fp32 copy of a (torch's norm accumulates in fp32)."""
    return torch.linalg.vector_norm(a, dim=-1, dtype=torch.float32)


def clip_shifts(a: Tensor, b: Tensor, scale: Tensor, a_max: Optional[Tensor] = None,
                b_max: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """The LSE shifts of the rows of a and the columns b (pairs a_i, b_i), fp32 [B] each.

    ref_i = <a_i, b_i>, d_i = scale ref_i (the positive logit). row_shift_i = max(d_i,
    |scale| |a_i| max|b| - SHIFT_MARGIN), col_shift_i = max(d_i, |scale| |b_i| max|a| -
    SHIFT_MARGIN), so no exp(S - shift) exceeds e^SHIFT_MARGIN (Cauchy-Schwarz, either sign of the
    scale). ``a_max`` / ``b_max``: the largest row norm of all of a / b when these are one rank's
    rows (default: of these rows). Returns (row_shift, col_shift, ref). A non-finite feature or
    scale makes its shifts non-finite (the callers fold that into the loss). Shifts more than
    SHIFT_SLACK above d_i are loose: :func:`loose_shifts` finds them, and the caller replaces
    them by the true maxima (:func:`clip_block_max`).
    """
    ref = rowdot(a, b)
    d = scale * ref
    na, nb = rownorm(a), rownorm(b)
    a_max = na.max() if a_max is None else a_max
    b_max = nb.max() if b_max is None else b_max
    bound_r, bound_c = scale.abs() * na * b_max, scale.abs() * nb * a_max
    row_shift = torch.maximum(d, bound_r - SHIFT_MARGIN)
    col_shift = torch.maximum(d, bound_c - SHIFT_MARGIN)
    row_shift = torch.where(bound_r > LOGIT_BOUND_LIMIT, math.nan, row_shift)
    col_shift = torch.where(bound_c > LOGIT_BOUND_LIMIT, math.nan, col_shift)
    return row_shift, col_shift, ref


def loose_shifts(shift: Tensor, ref: Tensor, scale: Tensor) -> Tensor:
    """Where a shift of :func:`clip_shifts` is further than SHIFT_SLACK above its positive logit
    (bool [n]): there the bound says too little of the row's sum to trust its underflow."""
    return shift - scale * ref > SHIFT_SLACK


def clip_block_max(a: Tensor, b: Tensor, scale: Tensor, *, impl: str = "chunked_torch",
                   block_m: int = 0, block_n: int = 0, allow_tf32: bool = False,
                   cols: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """(row max [M], column max [N] or None without ``cols``) of S = scale * a b^T, fp32, with
    the tiles and the arithmetic of :func:`clip_stats` (the same rounding of every logit, so
    no term of the sums taken against these maxima exceeds 1). For the triton impl the torch
    tiles serve (this runs only for rows whose bound is loose)."""
    if impl == "triton":
        impl = "chunked_torch"
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    a32, b32 = a.float(), b.float()
    row_max = a32.new_full((a.shape[0],), -math.inf)
    col_max = a32.new_full((b.shape[0],), -math.inf) if cols else None
    with matmul_precision(allow_tf32):
        for i0, i1 in _tiles(a.shape[0], bm):
            for j0, j1 in _tiles(b.shape[0], bn):
                logits = scale * (a32[i0:i1] @ b32[j0:j1].T)
                row_max[i0:i1] = torch.maximum(row_max[i0:i1], logits.amax(1))
                if cols:
                    col_max[j0:j1] = torch.maximum(col_max[j0:j1], logits.amax(0))
    return row_max, col_max


def clip_terms(off: Tensor, wsum: Tensor, shift: Tensor, ref: Tensor, scale: Tensor):
    """Per-row (or per-column) CLIP terms from complete sums (see the module docstring).

    off, wsum: [n] fp32 sums of :func:`clip_stats` over all blocks; shift: [n]; ref: [n] the
    positive's S'. Returns (loss [n] = LSE - d, lse [n], e [n] = E[S'] - S'_ii), fp32.
    """
    delta = shift - scale * ref  # >= 0, exactly 0 in the normal case
    loss = torch.where(delta == 0, torch.log1p(off), F.softplus(torch.log(off) + delta))
    total = torch.exp(-delta) + off
    e = torch.where(total > 0, wsum / total, torch.zeros_like(wsum))
    return loss, scale * ref + loss, e
