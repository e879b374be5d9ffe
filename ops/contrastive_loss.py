"""Two-direction CLIP (InfoNCE) and SigLIP losses that never build the B x B logit matrix.

Math (I, T: B x D features, s: logit scale, S = s * I T^T, S' = I T^T):
    CLIP   loss = 1/2 mean_i(LSE_j S_ij - t_i) + 1/2 mean_j(LSE_i S_ij - t'_j)
           t_i  = (1 - eps) S_ii + eps/B sum_j S_ij       (label smoothing eps; t' likewise on columns)
           dS   = g/(2B) (P - 2 Q),  P = softmax_row(S) + softmax_col(S),  Q = (1 - eps) Id + eps/B
           dI   = s dS T,  dT = s dS^T I,  ds = sum(dS * S')
    SigLIP loss = 1/B sum_ij softplus(-z_ij x_ij),  x = s S' + b,  z = +1 on the diagonal, -1 off it
           dX   = -g/B z sigmoid(-z x),  dI = s dX T,  dT = s dX^T I,  ds = sum(dX * S'),  db = sum(dX)

The work is split into *block primitives* over a pair of feature blocks (rows A, columns Bm).
They return results that merge by plain addition, which is what the distributed schemes
(ops/distributed.py) send round the ring:
    clip_stats    -> row/col sums of exp(S - shift) and of exp(S - shift) * S'
    clip_grads    -> P @ Bm and P^T @ A, with P = exp(S - r) + exp(S - c) for final LSEs r, c,
                     less the label terms (taken inside the tile, before any rounding)
    siglip_stats  -> per-row sums of softplus(-z x)
    siglip_grads  -> G @ Bm, G^T @ A, sum(G), sum(G * S') with G = -z sigmoid(-z x)
Shifts: every LSE is taken relative to a fixed per-row/column shift instead of a running max,
so partial sums add with no rescaling. The shift is the diagonal logit S_ii (exact for the
loss: LSE_i - S_ii = log(sum_i)); if any sum overflows or underflows (an off-diagonal logit more
than ~88 above its diagonal) the stats are recomputed relative to the exact row/column max.

Implementations (same numbers within the tolerances of tests/ops): ``naive`` (one tile: the
whole matrix), ``chunked_torch`` (tiles of block_m x block_n in plain torch; any device),
``triton`` (ops/contrastive_loss_triton.py). ``contrastive_loss_reference`` is an independent
full-matrix statement through torch autograd, the ground truth for tests.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError, ContrastiveLossConfig

__all__ = [
    "contrastive_loss",
    "contrastive_loss_reference",
    "ContrastiveLoss",
    "resolve_impl",
    "clip_stats",
    "clip_grads",
    "clip_max",
    "siglip_stats",
    "siglip_grads",
    "clip_shifts",
    "rowdot",
]

log = logging.getLogger(__name__)

IMPLS = ("naive", "chunked_torch", "triton")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DEFAULT_TORCH_BLOCK = 1024


# ----------------------------------------------------------------------------------------------
# Reference: full matrix through torch autograd (ground truth for tests; O(B^2) memory)
# ----------------------------------------------------------------------------------------------
def contrastive_loss_reference(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                               logit_bias: Optional[Tensor] = None, *, loss: str = "clip",
                               label_smoothing: float = 0.0) -> Tensor:
    """The loss computed the obvious way (OpenCLIP's ClipLoss / SigLipLoss conventions).

    image_features, text_features: [B, D]; logit_scale: [] or [1] (the multiplier, not its log).
    Computes in the inputs' dtype: upcast the inputs for an fp32/fp64 reference.
    """
    scale = logit_scale.reshape(())
    logits = scale * image_features @ text_features.T
    n = logits.shape[0]
    if loss == "clip":
        labels = torch.arange(n, device=logits.device)
        return 0.5 * (F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
                      + F.cross_entropy(logits.T, labels, label_smoothing=label_smoothing))
    if loss == "siglip":
        if logit_bias is None:
            raise ValueError("siglip needs logit_bias")
        signs = 2 * torch.eye(n, device=logits.device, dtype=logits.dtype) - 1
        return -F.logsigmoid(signs * (logits + logit_bias.reshape(()))).sum() / n
    raise ValueError(f"unknown loss {loss!r}")


# ----------------------------------------------------------------------------------------------
# Block primitives, plain torch (tiles of block_m x block_n; block >= size gives `naive`)
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _matmul_precision(allow_tf32: bool):
    """fp32 matmuls exact (ieee) unless TF32 is allowed; restores the global flags."""
    old_cuda = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_cuda
        torch.backends.cudnn.allow_tf32 = old_cudnn


def _tiles(n: int, block: int):
    for start in range(0, n, block):
        yield start, min(start + block, n)


def _torch_clip_stats(a, b, scale, row_shift, col_shift, bm, bn):
    a32, b32 = a.float(), b.float()
    row_sum = a32.new_zeros(a.shape[0])
    row_wsum = a32.new_zeros(a.shape[0])
    col_sum = a32.new_zeros(b.shape[0])
    col_wsum = a32.new_zeros(b.shape[0])
    for i0, i1 in _tiles(a.shape[0], bm):
        for j0, j1 in _tiles(b.shape[0], bn):
            dots = a32[i0:i1] @ b32[j0:j1].T
            logits = scale * dots
            p = torch.exp(logits - row_shift[i0:i1, None])
            row_sum[i0:i1] += p.sum(1)
            row_wsum[i0:i1] += (p * dots).sum(1)
            p = torch.exp(logits - col_shift[None, j0:j1])
            col_sum[j0:j1] += p.sum(0)
            col_wsum[j0:j1] += (p * dots).sum(0)
    return row_sum, col_sum, row_wsum, col_wsum


def _torch_clip_max(a, b, scale, bm, bn):
    a32, b32 = a.float(), b.float()
    row_max = a32.new_full((a.shape[0],), -math.inf)
    col_max = a32.new_full((b.shape[0],), -math.inf)
    for i0, i1 in _tiles(a.shape[0], bm):
        for j0, j1 in _tiles(b.shape[0], bn):
            logits = scale * (a32[i0:i1] @ b32[j0:j1].T)
            row_max[i0:i1] = torch.maximum(row_max[i0:i1], logits.amax(1))
            col_max[j0:j1] = torch.maximum(col_max[j0:j1], logits.amax(0))
    return row_max, col_max


def _torch_clip_grads(a, b, scale, row_lse, col_lse, bm, bn, diag, diag_value, offset,
                      sink_a=None):
    a32, b32 = a.float(), b.float()
    grad_a = torch.zeros_like(a32) if sink_a is None else None
    grad_b = torch.zeros_like(b32)
    for i0, i1 in _tiles(a.shape[0], bm):
        rows = a32.new_zeros(i1 - i0, a.shape[1])
        for j0, j1 in _tiles(b.shape[0], bn):
            logits = scale * (a32[i0:i1] @ b32[j0:j1].T)
            p = torch.exp(logits - row_lse[i0:i1, None]) + torch.exp(logits - col_lse[None, j0:j1])
            if diag_value:
                p -= diag_value * (_pair_signs(i0, i1, j0, j1, diag, a.device) > 0)
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


def _pair_signs(i0, i1, j0, j1, diag, device):
    """+1 where row i - column j == diag (the positive pairs of this tile), -1 elsewhere."""
    rows = torch.arange(i0, i1, device=device)[:, None]
    cols = torch.arange(j0, j1, device=device)[None, :]
    return torch.where(rows - cols == diag, 1.0, -1.0)


def _torch_siglip_stats(a, b, scale, bias, diag, bm, bn):
    a32, b32 = a.float(), b.float()
    row_loss = a32.new_zeros(a.shape[0])
    for i0, i1 in _tiles(a.shape[0], bm):
        for j0, j1 in _tiles(b.shape[0], bn):
            x = scale * (a32[i0:i1] @ b32[j0:j1].T) + bias
            z = _pair_signs(i0, i1, j0, j1, diag, a.device)
            row_loss[i0:i1] += F.softplus(-z * x).sum(1)
    return row_loss


def _torch_siglip_grads(a, b, scale, bias, diag, bm, bn, sink_a=None):
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


def _triton():
    from . import contrastive_loss_triton

    return contrastive_loss_triton


def clip_stats(a: Tensor, b: Tensor, scale: Tensor, row_shift: Tensor, col_shift: Tensor, *,
               impl: str = "chunked_torch", block_m: int = 0, block_n: int = 0,
               allow_tf32: bool = False):
    """Partial CLIP statistics of the block S = scale * a b^T.

    a: [M, D], b: [N, D] (same dtype); scale: [] fp32; row_shift: [M], col_shift: [N] fp32.
    Returns fp32 (row_sum [M], col_sum [N], row_wsum [M], col_wsum [N]):
    row_sum_i = sum_j exp(S_ij - row_shift_i), row_wsum_i = sum_j exp(S_ij - row_shift_i) * S'_ij,
    and the same over i for columns. Partials over column (row) blocks add up.
    """
    if impl == "triton":
        return _triton().clip_stats_triton(a, b, scale, row_shift, col_shift, block_m=block_m,
                                           block_n=block_n, allow_tf32=allow_tf32)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with _matmul_precision(allow_tf32):
        return _torch_clip_stats(a, b, scale, row_shift, col_shift, bm, bn)


def clip_max(a: Tensor, b: Tensor, scale: Tensor, *, block_m: int = 0, block_n: int = 0,
             allow_tf32: bool = False):
    """Exact row and column maxima of S = scale * a b^T (fp32 [M], [N]); the overflow fallback."""
    bm, bn = _blocks("chunked_torch", a, b, block_m, block_n)
    with _matmul_precision(allow_tf32):
        return _torch_clip_max(a, b, scale, bm, bn)


def clip_grads(a: Tensor, b: Tensor, scale: Tensor, row_lse: Tensor, col_lse: Tensor, *,
               diag: int = 0, diag_value: float = 0.0, offset: float = 0.0,
               impl: str = "chunked_torch",
               block_m: int = 0, block_n: int = 0, allow_tf32: bool = False, sink_a=None):
    """(P @ b, P^T @ a) in fp32 for P = exp(S - row_lse[:, None]) + exp(S - col_lse[None, :])
    - diag_value [i - j == diag] - offset.

    a: [M, D], b: [N, D]; row_lse: [M], col_lse: [N] fp32 (final, global LSEs). The label terms
    ``diag_value`` (2 (1 - eps) for the block holding the positives) and ``offset`` (2 eps / B,
    label smoothing) are subtracted inside the tile, before P is rounded to the features'
    dtype: P is close to them once the model learns, and subtracting after rounding would
    cancel away the gradient's precision.
    Returns ([M, D], [N, D]) fp32; partials over blocks add up. With ``sink_a(i0, i1, rows)``
    the finished fp32 rows of P @ b are handed over band by band instead (first result None),
    so the caller can write its final gradient without an [M, D] fp32 buffer.
    """
    if impl == "triton":
        return _triton().clip_grads_triton(a, b, scale, row_lse, col_lse, diag=diag,
                                           diag_value=diag_value, offset=offset, block_m=block_m,
                                           block_n=block_n, allow_tf32=allow_tf32, sink_a=sink_a)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with _matmul_precision(allow_tf32):
        return _torch_clip_grads(a, b, scale, row_lse, col_lse, bm, bn, diag, diag_value, offset,
                                 sink_a)


def siglip_stats(a: Tensor, b: Tensor, scale: Tensor, bias: Tensor, diag: int = 0, *,
                 impl: str = "chunked_torch", block_m: int = 0, block_n: int = 0,
                 allow_tf32: bool = False) -> Tensor:
    """Per-row sums of softplus(-z x), x = scale * a b^T + bias, z = +1 where i - j == diag.

    ``diag`` is the offset of the positive pairs inside this block (0 for the block on the
    diagonal; out of range for a block with no positives). Returns fp32 [M].
    """
    if impl == "triton":
        return _triton().siglip_stats_triton(a, b, scale, bias, diag, block_m=block_m,
                                             block_n=block_n, allow_tf32=allow_tf32)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with _matmul_precision(allow_tf32):
        return _torch_siglip_stats(a, b, scale, bias, diag, bm, bn)


def siglip_grads(a: Tensor, b: Tensor, scale: Tensor, bias: Tensor, diag: int = 0, *,
                 impl: str = "chunked_torch", block_m: int = 0, block_n: int = 0,
                 allow_tf32: bool = False, sink_a=None):
    """(G @ b [M, D], G^T @ a [N, D], sum(G) [], sum(G * S') []) in fp32, G = -z sigmoid(-z x).

    ``sink_a`` as in :func:`clip_grads`."""
    if impl == "triton":
        return _triton().siglip_grads_triton(a, b, scale, bias, diag, block_m=block_m,
                                             block_n=block_n, allow_tf32=allow_tf32, sink_a=sink_a)
    bm, bn = _blocks(impl, a, b, block_m, block_n)
    with _matmul_precision(allow_tf32):
        return _torch_siglip_grads(a, b, scale, bias, diag, bm, bn, sink_a)


def rowdot(a: Tensor, b: Tensor, chunk_elems: int = 1 << 22) -> Tensor:
    """<a_i, b_i> in fp32 ([B]), in row chunks of <= chunk_elems elements (16 MiB of fp32
    temporaries), so no [B, D] fp32 copy of a or b is made."""
    out = torch.empty(a.shape[0], device=a.device, dtype=torch.float32)
    for i0, i1 in _tiles(a.shape[0], max(1, chunk_elems // max(a.shape[1], 1))):
        out[i0:i1] = (a[i0:i1].float() * b[i0:i1].float()).sum(-1)
    return out


def clip_shifts(a: Tensor, b: Tensor, scale: Tensor) -> Tensor:
    """The default LSE shift: the diagonal logits scale * <a_i, b_i> in fp32 ([B])."""
    return scale * rowdot(a, b)


def _needs_exact_shift(*sums: Tensor) -> bool:
    return any(bool(((s <= 0) | ~torch.isfinite(s)).any()) for s in sums)


# ----------------------------------------------------------------------------------------------
# Single-device loss: forward and backward in terms of the primitives
# ----------------------------------------------------------------------------------------------
def _clip_forward(img, txt, scale, eps, impl, bm, bn, tf32):
    n = img.shape[0]
    diag = clip_shifts(img, txt, scale)
    kw = dict(impl=impl, block_m=bm, block_n=bn, allow_tf32=tf32)
    row_shift = col_shift = diag
    row_sum, col_sum, row_wsum, col_wsum = clip_stats(img, txt, scale, row_shift, col_shift, **kw)
    if _needs_exact_shift(row_sum, col_sum):
        log.warning("contrastive_loss: a logit exceeds its diagonal by > 80; recomputing with exact maxima")
        row_shift, col_shift = clip_max(img, txt, scale, block_m=bm, block_n=bn, allow_tf32=tf32)
        row_sum, col_sum, row_wsum, col_wsum = clip_stats(img, txt, scale, row_shift, col_shift, **kw)
    row_lse = row_shift + torch.log(row_sum)
    col_lse = col_shift + torch.log(col_sum)
    loss = 0.5 * (row_lse.mean() + col_lse.mean()) - (1.0 - eps) * diag.mean()
    if eps:
        # sum_ij S_ij = s <sum_i I_i, sum_j T_j>: the smoothing term in O(BD)
        loss = loss - eps / n**2 * scale * torch.dot(_colsum(img), _colsum(txt))
    # d loss / d s needs E_row[S'] and E_col[S']: kept from the forward (wsum / sum), O(B)
    expect = torch.stack([(row_wsum / row_sum).sum(), (col_wsum / col_sum).sum()])
    return loss, row_lse, col_lse, expect


def _colsum(x: Tensor) -> Tensor:
    return x.sum(0, dtype=torch.float32)


def _clip_backward(grad, img, txt, scale, row_lse, col_lse, expect, eps, impl, bm, bn, tf32):
    """Returns (d_img in img's dtype, d_txt fp32, d_scale fp32 [])."""
    n = img.shape[0]
    coef = grad / (2 * n)
    k = coef * scale
    d_img = torch.empty_like(img)

    # dI = s dS T with dS = g/(2B) (P - 2(1-eps) Id - 2 eps/B); likewise dT with dS^T. The label
    # terms are taken inside the tiles (clip_grads' diag_value, offset); dI is finished band by
    # band (no [B, D] fp32 buffer), dT in place on its fp32 sum.
    def finish_img(i0, i1, rows):
        d_img[i0:i1] = rows.mul_(k)

    _, d_txt = clip_grads(img, txt, scale, row_lse, col_lse, diag=0, diag_value=2 * (1 - eps),
                          offset=2 * eps / n, impl=impl, block_m=bm, block_n=bn, allow_tf32=tf32,
                          sink_a=finish_img)
    d_scale = coef * (expect.sum() - 2 * (1 - eps) * rowdot(img, txt).sum())
    if eps:
        d_scale = d_scale - coef * 2 * eps / n * torch.dot(_colsum(img), _colsum(txt))
    d_txt.mul_(k)
    return d_img, d_txt, d_scale


def _siglip_forward(img, txt, scale, bias, impl, bm, bn, tf32):
    row_loss = siglip_stats(img, txt, scale, bias, 0, impl=impl, block_m=bm, block_n=bn,
                            allow_tf32=tf32)
    return row_loss.sum() / img.shape[0]


def _siglip_backward(grad, img, txt, scale, bias, impl, bm, bn, tf32):
    coef = grad / img.shape[0]
    k = coef * scale
    d_img = torch.empty_like(img)

    def finish_img(i0, i1, rows):
        d_img[i0:i1] = rows.mul_(k)

    _, gb, gsum, gwsum = siglip_grads(img, txt, scale, bias, 0, impl=impl, block_m=bm,
                                      block_n=bn, allow_tf32=tf32, sink_a=finish_img)
    return d_img, gb.mul_(k), coef * gwsum, coef * gsum


# ----------------------------------------------------------------------------------------------
# The registered op: infclip::contrastive_loss (+ its backward op and autograd)
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("infclip::contrastive_loss", mutates_args=())
def _contrastive_loss_op(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                         logit_bias: Optional[Tensor], loss: str, impl: str,
                         label_smoothing: float, block_m: int, block_n: int,
                         allow_tf32: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (loss [], row_lse [B], col_lse [B], expect [2]); the last three feed the backward
    (empty for siglip)."""
    scale = logit_scale.detach().float().reshape(())
    if loss == "clip":
        return _clip_forward(image_features, text_features, scale, label_smoothing, impl,
                             block_m, block_n, allow_tf32)
    bias = logit_bias.detach().float().reshape(())
    value = _siglip_forward(image_features, text_features, scale, bias, impl, block_m, block_n,
                            allow_tf32)
    return value, value.new_zeros(0), value.new_zeros(0), value.new_zeros(0)


@_contrastive_loss_op.register_fake
def _(image_features, text_features, logit_scale, logit_bias, loss, impl, label_smoothing,
      block_m, block_n, allow_tf32):
    n = image_features.shape[0] if loss == "clip" else 0
    new = image_features.new_empty
    return (new((), dtype=torch.float32), new((n,), dtype=torch.float32),
            new((n,), dtype=torch.float32), new((2 if loss == "clip" else 0,), dtype=torch.float32))


@torch.library.custom_op("infclip::contrastive_loss_backward", mutates_args=())
def _contrastive_loss_backward_op(grad: Tensor, image_features: Tensor, text_features: Tensor,
                                  logit_scale: Tensor, logit_bias: Optional[Tensor],
                                  row_lse: Tensor, col_lse: Tensor, expect: Tensor, loss: str,
                                  impl: str, label_smoothing: float, block_m: int, block_n: int,
                                  allow_tf32: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (d_image [B, D], d_text [B, D], d_scale like logit_scale, d_bias like logit_bias
    or empty)."""
    scale = logit_scale.detach().float().reshape(())
    g = grad.float().reshape(())
    if loss == "clip":
        d_img, d_txt, d_scale = _clip_backward(g, image_features, text_features, scale, row_lse,
                                               col_lse, expect, label_smoothing, impl, block_m,
                                               block_n, allow_tf32)
        d_bias = logit_scale.new_zeros(0)
    else:
        bias = logit_bias.detach().float().reshape(())
        d_img, d_txt, d_scale, d_bias = _siglip_backward(g, image_features, text_features, scale,
                                                         bias, impl, block_m, block_n, allow_tf32)
        d_bias = d_bias.reshape(logit_bias.shape).to(logit_bias.dtype)
    return (d_img.to(image_features.dtype), d_txt.to(text_features.dtype),
            d_scale.reshape(logit_scale.shape).to(logit_scale.dtype), d_bias)


@_contrastive_loss_backward_op.register_fake
def _(grad, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, expect, loss,
      impl, label_smoothing, block_m, block_n, allow_tf32):
    d_bias = (torch.empty_like(logit_bias) if loss == "siglip" and logit_bias is not None
              else logit_scale.new_empty(0))
    return (torch.empty_like(image_features), torch.empty_like(text_features),
            torch.empty_like(logit_scale), d_bias)


def _setup_context(ctx, inputs, output):
    (image_features, text_features, logit_scale, logit_bias, loss, impl, label_smoothing, block_m,
     block_n, allow_tf32) = inputs
    _, row_lse, col_lse, expect = output
    ctx.save_for_backward(image_features, text_features, logit_scale, logit_bias, row_lse, col_lse,
                          expect)
    ctx.options = (loss, impl, label_smoothing, block_m, block_n, allow_tf32)


def _backward(ctx, grad_loss, _grad_row, _grad_col, _grad_expect):
    image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, expect = ctx.saved_tensors
    d_img, d_txt, d_scale, d_bias = torch.ops.infclip.contrastive_loss_backward(
        grad_loss, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, expect,
        *ctx.options)
    return d_img, d_txt, d_scale, (d_bias if logit_bias is not None else None), None, None, None, None, None, None


_contrastive_loss_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def resolve_impl(impl: str, device: torch.device, triton_interpret: bool = False) -> tuple[str, str]:
    """Map a configured impl to the one that runs on ``device``; returns (impl, why)."""
    if impl not in ("auto",) + IMPLS:
        raise ConfigError(f"unknown contrastive_loss impl {impl!r}; choose from {('auto',) + IMPLS}")
    on_cuda = device.type == "cuda"
    if impl == "auto":
        return ("triton", "auto: CUDA device") if on_cuda else ("chunked_torch", "auto: no CUDA device")
    if impl == "triton" and not on_cuda:
        interpreting = os.environ.get("TRITON_INTERPRET") == "1"
        if triton_interpret:
            if not interpreting:
                raise ConfigError("contrastive_loss.triton_interpret needs TRITON_INTERPRET=1 in the "
                                  "environment before ops is imported (Triton reads it when kernels are defined)")
            return "triton", "triton through the CPU interpreter (triton_interpret: true)"
        return "chunked_torch", "triton requested but the features are not on CUDA: ran chunked_torch"
    return impl, "as configured"


def _validate(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
              logit_bias: Optional[Tensor], loss: str, check_finite: bool) -> None:
    if not isinstance(image_features, Tensor) or not isinstance(text_features, Tensor):
        raise TypeError("image_features and text_features must be tensors")
    if image_features.dim() != 2 or text_features.dim() != 2:
        raise ValueError(f"features must be 2-D [B, D]; got image {tuple(image_features.shape)}, "
                         f"text {tuple(text_features.shape)}")
    if image_features.shape != text_features.shape:
        raise ValueError(f"image and text features differ in shape: {tuple(image_features.shape)} vs "
                         f"{tuple(text_features.shape)} (need the same [B, D])")
    if image_features.shape[0] == 0:
        raise ValueError("empty batch: features have 0 rows")
    if image_features.dtype != text_features.dtype:
        raise TypeError(f"image and text features differ in dtype: {image_features.dtype} vs "
                        f"{text_features.dtype}")
    if image_features.dtype not in _DTYPES:
        raise TypeError(f"features must be float32, bfloat16 or float16, got {image_features.dtype}")
    if image_features.device != text_features.device:
        raise ValueError(f"features on different devices: {image_features.device} vs {text_features.device}")
    for name, value in (("logit_scale", logit_scale), ("logit_bias", logit_bias)):
        if value is None:
            continue
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a tensor (shape [] or [1]), got {type(value).__name__}")
        if value.numel() != 1:
            raise ValueError(f"{name} must have exactly one element (shape [] or [1]), got shape {tuple(value.shape)}")
        if value.device != image_features.device:
            raise ValueError(f"{name} is on {value.device} but the features are on {image_features.device}")
    if loss == "siglip" and logit_bias is None:
        raise ValueError("loss 'siglip' needs logit_bias")
    if check_finite:  # one host-device sync for all three
        named = (("image_features", image_features), ("text_features", text_features), ("logit_scale", logit_scale))
        finite = torch.stack([torch.isfinite(value).all() for _, value in named])
        if not bool(finite.all()):
            bad = [name for (name, _), ok in zip(named, finite.tolist()) if not ok]
            raise FloatingPointError(f"{bad[0]} contains NaN or Inf")


def contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                     logit_bias: Optional[Tensor] = None, *, loss: str = "clip", impl: str = "auto",
                     label_smoothing: float = 0.0, allow_tf32: bool = False, block_m: int = 0,
                     block_n: int = 0, triton_interpret: bool = False, distributed: str = "none",
                     process_group=None, local_world_size: Optional[int] = None,
                     grad_reduction: str = "mean", check_finite: bool = True) -> Tensor:
    """CLIP (or SigLIP) loss over the batch without materialising the B x B logits.

    image_features, text_features: [B, D] fp32/bf16/fp16 (L2-normalised by the caller);
    logit_scale: [] or [1], the multiplier s (exp of the learnable log-scale), with gradient;
    logit_bias: [] or [1] (siglip only). Returns a 0-dim fp32 loss: CLIP = mean of the two
    cross-entropy directions (OpenCLIP's convention); SigLIP = sum of pair losses / B.

    With ``distributed`` != "none" and a process group of more than one rank, the features are
    this rank's local batch and the loss is over the global batch (ops/distributed.py).
    """
    if distributed != "none":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
            from .distributed import distributed_contrastive_loss

            _validate(image_features, text_features, logit_scale, logit_bias, loss, check_finite)
            impl_run, _ = resolve_impl(impl, image_features.device, triton_interpret)
            return distributed_contrastive_loss(
                image_features, text_features, logit_scale, logit_bias, scheme=distributed,
                loss=loss, impl=impl_run, label_smoothing=label_smoothing, allow_tf32=allow_tf32,
                block_m=block_m, block_n=block_n, process_group=process_group,
                local_world_size=local_world_size, grad_reduction=grad_reduction)
    if loss not in ("clip", "siglip"):
        raise ValueError(f"unknown loss {loss!r}; choose 'clip' or 'siglip'")
    _validate(image_features, text_features, logit_scale, logit_bias, loss, check_finite)
    impl_run, _ = resolve_impl(impl, image_features.device, triton_interpret)
    out = torch.ops.infclip.contrastive_loss(
        image_features, text_features, logit_scale, logit_bias if loss == "siglip" else None, loss,
        impl_run, float(label_smoothing), int(block_m), int(block_n), bool(allow_tf32))
    return out[0]


class ContrastiveLoss(torch.nn.Module):
    """The loss as a module built from the ``contrastive_loss`` config section.

    ``forward(image_features, text_features, logit_scale, logit_bias=None, process_group=None)``;
    after the first call, ``resolved_impl`` and ``resolved_reason`` say what actually ran.
    """

    def __init__(self, config: Optional[ContrastiveLossConfig] = None, **overrides):
        super().__init__()
        if config is None:
            config = ContrastiveLossConfig(**overrides)
        elif overrides:
            config = ContrastiveLossConfig(**{**config.__dict__, **overrides})
        self.config = config
        self.resolved_impl: Optional[str] = None
        self.resolved_reason: Optional[str] = None
        self.process_group = None

    def forward(self, image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                logit_bias: Optional[Tensor] = None, process_group=None) -> Tensor:
        cfg = self.config
        impl, why = resolve_impl(cfg.impl, image_features.device, cfg.triton_interpret)
        if impl != self.resolved_impl:
            if cfg.impl == "triton" and impl != "triton":
                log.warning("contrastive_loss: %s", why)
            self.resolved_impl, self.resolved_reason = impl, why
        return contrastive_loss(
            image_features, text_features, logit_scale, logit_bias, loss=cfg.loss, impl=impl,
            label_smoothing=cfg.label_smoothing, allow_tf32=cfg.allow_tf32,
            block_m=cfg.block_m or 0, block_n=cfg.block_n or 0,
            triton_interpret=cfg.triton_interpret, distributed=cfg.distributed,
            process_group=process_group if process_group is not None else self.process_group,
            local_world_size=cfg.local_world_size, grad_reduction=cfg.grad_reduction)

    def extra_repr(self) -> str:
        cfg = self.config
        return f"loss={cfg.loss}, impl={cfg.impl} (ran: {self.resolved_impl}), distributed={cfg.distributed}"
