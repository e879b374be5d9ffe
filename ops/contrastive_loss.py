"""Two-direction CLIP (InfoNCE) and SigLIP losses that never build the B x B logit matrix.

Math (I, T: B x D features, s: logit scale, S = s * I T^T, S' = I T^T):
    CLIP   loss = 1/2 mean_i(LSE_j S_ij - t_i) + 1/2 mean_j(LSE_i S_ij - t'_j)
           t_i  = (1 - eps) S_ii + eps/B sum_j S_ij       (label smoothing eps; t' likewise on columns)
           dS   = g/(2B) (P - 2 Q),  P = softmax_row(S) + softmax_col(S),  Q = (1 - eps) Id + eps/B
           dI   = s dS T,  dT = s dS^T I,  ds = sum(dS * S')
    SigLIP loss = 1/B sum_ij softplus(-z_ij x_ij),  x = s S' + b,  z = +1 on the diagonal, -1 off it
           dX   = -g/B z sigmoid(-z x),  dI = s dX T,  dT = s dX^T I,  ds = sum(dX * S'),  db = sum(dX)

The work is split into *block primitives* (ops/blocks.py) over a pair of feature blocks (rows
A, columns Bm).
They return results that merge by plain addition, which is what the distributed schemes
(ops/distributed.py) send round the ring:
    clip_stats    -> row/col sums of exp(S - shift) and of exp(S - shift) (S' - ref), without
                     the positive pairs
    clip_grads    -> P @ Bm and P^T @ A, with P = exp(S - r) + exp(S - c) for final LSEs r, c,
                     less the label terms (taken inside the tile, before any rounding)
    siglip_stats  -> per-row sums of softplus(-z x)
    siglip_grads  -> G @ Bm, G^T @ A, sum(G), sum(G * S') with G = -z sigmoid(-z x)
Shifts and assembly (:func:`clip_shifts`, :func:`clip_terms`). Every LSE is taken relative to a
fixed per-row/column shift instead of a running max, so partial sums add with no rescaling.
The shift is the diagonal logit d_i = S_ii unless the Cauchy-Schwarz bound s |I_i| max_j |T_j|
exceeds it by more than 64; then it is that bound - 64. So no term exceeds e^64 (no overflow,
no recompute, no host sync). The positive pair is left out of the sums and added analytically:
with off_i = sum_{j != i} exp(S_ij - shift_i) and delta_i = shift_i - d_i >= 0,
    loss_i = LSE_i - d_i = log1p(off_i)                  (delta_i = 0, the normal case)
                         = softplus(log(off_i) + delta_i) (otherwise),
so a loss of 1e-3 keeps fp32's relative precision (LSE - d would cancel it away); the d-scale
term E_i[S'] - S'_ii likewise comes from sums weighted by (S' - S'_ii). Limit: a row all of
whose logits lie more than ~150 below its bound (e.g. every cosine < -0.5 at s = 100) loses its
sum to underflow.

This file: the reference, the single-device forward/backward on the primitives, the registered
op and the public API. Implementations (same numbers within the tolerances of tests/ops): ``naive`` (one tile: the
whole matrix), ``chunked_torch`` (tiles of block_m x block_n in plain torch; any device),
``triton`` (ops/contrastive_loss_triton.py: cuBLAS GEMMs on row bands + Triton reductions;
keeps the whole B x B logit matrix, in fp32, from forward to backward when it fits in
``logits_budget_mb``). ``contrastive_loss_reference`` is an independent full-matrix statement
through torch autograd, the ground truth for tests.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .blocks import (
    SHIFT_MARGIN,
    clip_grads,
    clip_shifts,
    clip_stats,
    clip_terms,
    rowdot,
    rownorm,
    siglip_grads,
    siglip_stats,
)
from .config import ConfigError, ContrastiveLossConfig
from .distributed import backward_follows, distributed_contrastive_loss
from .sweeps import choose_scheme

__all__ = [
    "contrastive_loss",
    "contrastive_loss_reference",
    "ContrastiveLoss",
    "resolve_impl",
    "clip_stats",
    "clip_grads",
    "clip_terms",
    "siglip_stats",
    "siglip_grads",
    "clip_shifts",
    "rowdot",
    "SHIFT_MARGIN",
]

log = logging.getLogger(__name__)

IMPLS = ("naive", "chunked_torch", "triton")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_LOGITS_BUDGET_MB = 64.0


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


def _triton():
    from . import contrastive_loss_triton

    return contrastive_loss_triton


def _finite(*values: Tensor) -> Tensor:
    """A device bool: all values finite (no host sync)."""
    return torch.stack([torch.isfinite(v).all() for v in values]).all()


# ----------------------------------------------------------------------------------------------
# Single-device loss: forward and backward in terms of the primitives
# ----------------------------------------------------------------------------------------------
_BANDS_MIN_LOGITS = 16384 * 16384
"""Kept bands only above this many logits: below, the fused recompute kernels are as fast (an
H200 at B = 4,096: 1.04 ms recomputing, 1.13 ms with the bands kept)."""


def _keep_logits(impl: str, n: int, dtype: torch.dtype, block_m: int, budget_mb: float) -> str:
    """What the triton impl keeps of the [B, B] S' from forward to backward, within
    ``budget_mb`` MiB: ``"whole"``, the matrix in fp32 (exact logits; with the backward's [B, B]
    gradient block in the features' dtype, 6 bytes a pair in bf16); else, above B = 16,384 and
    for 16-bit features, ``"bands"``, the matrix in the features' dtype (the banded path's own
    rounded logits, 2 bytes a pair; the backward turns it into gradients one row band at a time,
    no GEMM redone); else ``""`` (recompute by row bands). Nothing is kept when a band height is
    forced (block_m)."""
    if impl != "triton" or block_m:
        return ""
    itemsize = torch.finfo(dtype).bits // 8
    budget = budget_mb * 2**20
    if n * n * (4 + itemsize) <= budget:
        return "whole"
    if itemsize == 2 and n * n > _BANDS_MIN_LOGITS and n * n * itemsize <= budget:
        return "bands"
    return ""


def _colsum(x: Tensor) -> Tensor:
    return x.sum(0, dtype=torch.float32)


def _clip_forward(img, txt, scale, eps, impl, bm, bn, tf32, keep):
    """Returns (loss [], row_lse [B], col_lse [B], aux [B + 2], logits [B, B] or [0]) with
    aux = (ref_1..ref_B, sum of the E[S'] - S'_ii terms, sum ref) for the backward."""
    n = img.shape[0]
    logits = None
    if impl == "triton":  # the same steps as below in four launches around the GEMM
        tri = _triton()
        row_shift, col_shift, aux, sums = tri.clip_prologue_triton(img, txt, scale, SHIFT_MARGIN)
        ref = aux[:n]
        logits = tri.clip_stats_triton(img, txt, scale, row_shift, col_shift, ref, ref, 0,
                                       keep_logits=keep, band=bm, allow_tf32=tf32, out=sums)[4]
        loss, row_lse, col_lse = tri.clip_epilogue_triton(scale, sums, row_shift, col_shift, aux)
    else:
        row_shift, col_shift, ref = clip_shifts(img, txt, scale)
        r_off, c_off, r_w, c_w = clip_stats(img, txt, scale, row_shift, col_shift, ref, ref, 0,
                                            impl=impl, block_m=bm, block_n=bn, allow_tf32=tf32)
        r_loss, row_lse, r_e = clip_terms(r_off, r_w, row_shift, ref, scale)
        c_loss, col_lse, c_e = clip_terms(c_off, c_w, col_shift, ref, scale)
        loss = 0.5 * (r_loss.mean() + c_loss.mean())
        # non-finite features or scale make the shifts non-finite: the loss says so (no sync)
        loss = torch.where(_finite(row_shift, col_shift), loss, torch.full_like(loss, math.nan))
        # d loss / d s needs sum_i (E_row_i[S'] - S'_ii) + sum_j (E_col_j[S'] - S'_jj)
        aux = torch.cat([ref, (r_e.sum() + c_e.sum()).reshape(1), ref.sum().reshape(1)])
    if eps:
        # t_i = S_ii - eps (S_ii - mean_j S_ij); sum_ij S_ij = s <sum_i I_i, sum_j T_j> in O(BD)
        loss = loss + eps * scale * (aux[n + 1] / n - torch.dot(_colsum(img), _colsum(txt)) / n**2)
    if logits is None:
        logits = img.new_empty(0)
    return loss, row_lse, col_lse, aux, logits


def _clip_backward(grad, img, txt, scale, row_lse, col_lse, aux, logits, eps, impl, bm, bn,
                   tf32):
    """Returns (d_img, d_txt in the features' dtype, d_scale fp32 [])."""
    n = img.shape[0]
    labels = dict(diag=0, diag_value=2 * (1 - eps), offset=2 * eps / n)
    ref = aux[:n]
    if impl == "triton" and img.dtype != torch.float16:
        # k = coef s folded into P before its rounding: the GEMMs write the final gradients. The
        # kernel takes coef = g / (2B), k and d_scale = coef aux[B] itself (no torch launches).
        d_img, d_txt, d_scale = _triton().clip_grads_triton(
            img, txt, scale, row_lse, col_lse, ref, **labels, coef=grad, coef_mul=1 / (2 * n),
            coef_scale=True, dscale_from=aux, dscale_index=n,
            logits=logits if logits.numel() else None, band=bm, out_dtype=img.dtype,
            allow_tf32=tf32)
    else:
        coef = grad / (2 * n)
        k = coef * scale
        if impl == "triton":
            # fp16, whose range would flush k P (~1e-9) to zero: k multiplies the fp32 results
            d_img, d_txt = _triton().clip_grads_triton(
                img, txt, scale, row_lse, col_lse, ref, **labels,
                logits=logits if logits.numel() else None, band=bm, out_dtype=torch.float32,
                allow_tf32=tf32)
            d_img, d_txt = d_img.mul_(k), d_txt.mul_(k)
        else:
            # dI is finished band by band (no [B, D] fp32 buffer), dT in place on its fp32 sum.
            d_img = torch.empty_like(img)

            def finish_img(i0, i1, rows):
                d_img[i0:i1] = rows.mul_(k)

            _, d_txt = clip_grads(img, txt, scale, row_lse, col_lse, ref, **labels, impl=impl,
                                  block_m=bm, block_n=bn, allow_tf32=tf32, sink_a=finish_img)
            d_txt.mul_(k)
        d_scale = coef * aux[n]
    if eps:
        coef = grad / (2 * n)
        d_scale = d_scale + coef * 2 * eps * (aux[n + 1] - torch.dot(_colsum(img), _colsum(txt)) / n)
    return d_img, d_txt, d_scale


def _siglip_forward(img, txt, scale, bias, impl, bm, bn, tf32, keep):
    logits = None
    if impl == "triton":
        row_loss, logits = _triton().siglip_stats_triton(img, txt, scale, bias, 0,
                                                         keep_logits=keep, band=bm,
                                                         allow_tf32=tf32)
    else:
        row_loss = siglip_stats(img, txt, scale, bias, 0, impl=impl, block_m=bm, block_n=bn,
                                allow_tf32=tf32)
    loss = row_loss.sum() / img.shape[0]
    if impl != "triton":  # (the triton kernel folds this into the sums itself)
        ok = _finite(rownorm(img), rownorm(txt), scale, bias)
        loss = torch.where(ok, loss, torch.full_like(loss, math.nan))
    return loss, (logits if logits is not None else img.new_empty(0))


def _siglip_triton_grads(coef, img, txt, scale, bias, logits, bm, tf32, with_loss=False):
    """The triton SigLIP gradient pass, scaled by k = coef s: (d_img, d_txt, sum G, sum G S'),
    the gradients in the features' dtype, k folded into G before its rounding in the kernel
    (for fp16, whose range would flush k G, in fp32 and multiplied after: see _clip_backward);
    ``with_loss``: the row sums of the pair losses first."""
    fold = img.dtype != torch.float16
    out = _triton().siglip_grads_triton(
        img, txt, scale, bias, 0, coef=coef if fold else None, coef_scale=fold, logits=logits,
        band=bm, out_dtype=img.dtype if fold else torch.float32, allow_tf32=tf32,
        with_loss=with_loss)
    if not fold:
        k = coef * scale
        for grad in out[-4:-2]:  # d_img, d_txt (fp32)
            grad.mul_(k)
    return out


def _siglip_forward_with_grads(img, txt, scale, bias, bm, tf32):
    """The triton SigLIP forward of a call whose backward will follow: one pass gives the pair
    losses and the gradients for an incoming gradient of 1 (no statistics pass: a pair's
    gradient needs no row statistic). Returns (loss, d_img, d_txt, [sum G S', sum G]), k = s / B
    folded in (_siglip_triton_grads)."""
    n = img.shape[0]
    row_loss, d_img, d_txt, gsum, gwsum = _siglip_triton_grads(1.0 / n, img, txt, scale, bias,
                                                               None, bm, tf32, with_loss=True)
    return row_loss.sum() / n, d_img, d_txt, torch.stack([gwsum, gsum])


def _siglip_backward_from_forward(grad, n, d_img, d_txt, sums):
    """The backward of _siglip_forward_with_grads: its results times the incoming gradient."""
    coef = grad / n
    return d_img * grad, d_txt * grad, coef * sums[0], coef * sums[1]


def _siglip_backward(grad, img, txt, scale, bias, logits, impl, bm, bn, tf32):
    coef = grad / img.shape[0]
    if impl == "triton":
        d_img, d_txt, gsum, gwsum = _siglip_triton_grads(
            coef, img, txt, scale, bias, logits if logits.numel() else None, bm, tf32)
        return d_img, d_txt, coef * gwsum, coef * gsum
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
# Defined through torch.library.Library rather than the custom_op decorator: the decorator's
# Python wrapper (aliasing checks, dynamo guards) cost ~0.2-0.3 ms of host time per call on the
# H200 machine's host, a third of a whole call at B = 1,024. Same op, fake kernel and autograd.
_LIB = torch.library.Library("infclip", "FRAGMENT")
_LIB.define("contrastive_loss(Tensor image_features, Tensor text_features, Tensor logit_scale, "
            "Tensor? logit_bias, str loss, str impl, float label_smoothing, int block_m, "
            "int block_n, bool allow_tf32, float logits_budget_mb=0.0, "
            "bool grads_in_forward=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
_LIB.define("contrastive_loss_backward(Tensor grad, Tensor image_features, Tensor text_features, "
            "Tensor logit_scale, Tensor? logit_bias, Tensor row_lse, Tensor col_lse, Tensor aux, "
            "Tensor logits, str loss, str impl, float label_smoothing, int block_m, int block_n, "
            "bool allow_tf32) -> (Tensor, Tensor, Tensor, Tensor)")


def _contrastive_loss_op(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                         logit_bias: Optional[Tensor], loss: str, impl: str,
                         label_smoothing: float, block_m: int, block_n: int,
                         allow_tf32: bool, logits_budget_mb: float = 0.0,
                         grads_in_forward: bool = False
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (loss [], row_lse [B], col_lse [B], aux [B + 2], logits [B, B] or [0]); the last
    four feed the backward (row_lse, col_lse, aux empty for siglip; aux: see _clip_forward;
    logits: the kept S' of the triton impl when it fits in ``logits_budget_mb``). SigLIP on the
    triton impl with ``grads_in_forward`` (the caller's promise that a backward follows):
    (loss, d_img [B, D], d_txt [B, D], sums [2], [0]) of _siglip_forward_with_grads instead."""
    scale = logit_scale.detach().float().reshape(())
    n = image_features.shape[0]
    if _grads_in_forward(loss, impl, grads_in_forward):
        bias = logit_bias.detach().float().reshape(())
        value, d_img, d_txt, sums = _siglip_forward_with_grads(
            image_features, text_features, scale, bias, block_m, allow_tf32)
        return value, d_img, d_txt, sums, value.new_empty(0)
    keep = _keep_logits(impl, n, image_features.dtype, block_m, logits_budget_mb)
    if loss == "clip":
        return _clip_forward(image_features, text_features, scale, label_smoothing, impl,
                             block_m, block_n, allow_tf32, keep)
    bias = logit_bias.detach().float().reshape(())
    value, logits = _siglip_forward(image_features, text_features, scale, bias, impl, block_m,
                                    block_n, allow_tf32, keep)
    return value, value.new_empty(0), value.new_empty(0), value.new_empty(0), logits


_SIGLIP_GRADS_IN_FORWARD = True
"""False: SigLIP's forward runs the statistics pass and its backward the gradient pass, as
before (bench_contrastive_loss.py --siglip-two-pass times that path beside this one)."""


def _grads_in_forward(loss: str, impl: str, asked: bool) -> bool:
    """Whether the forward takes the gradients too: asked for, and SigLIP on the triton impl."""
    return asked and loss == "siglip" and impl == "triton" and _SIGLIP_GRADS_IN_FORWARD


@torch.library.register_fake("infclip::contrastive_loss", lib=_LIB)
def _(image_features, text_features, logit_scale, logit_bias, loss, impl, label_smoothing,
      block_m, block_n, allow_tf32, logits_budget_mb=0.0, grads_in_forward=False):
    n = image_features.shape[0]
    new = image_features.new_empty
    if _grads_in_forward(loss, impl, grads_in_forward):
        dtype = torch.float32 if image_features.dtype == torch.float16 else image_features.dtype
        return (new((), dtype=torch.float32), new(image_features.shape, dtype=dtype),
                new(text_features.shape, dtype=dtype), new((2,), dtype=torch.float32),
                new((0,), dtype=torch.float32))
    keep = _keep_logits(impl, n, image_features.dtype, block_m, logits_budget_mb)
    m = n if loss == "clip" else 0
    return (new((), dtype=torch.float32), new((m,), dtype=torch.float32),
            new((m,), dtype=torch.float32), new((n + 2 if loss == "clip" else 0,), dtype=torch.float32),
            new((n, n) if keep else (0,), dtype=torch.float32 if keep == "whole" else None))


def _contrastive_loss_backward_op(grad: Tensor, image_features: Tensor, text_features: Tensor,
                                  logit_scale: Tensor, logit_bias: Optional[Tensor],
                                  row_lse: Tensor, col_lse: Tensor, aux: Tensor,
                                  logits: Tensor, loss: str, impl: str, label_smoothing: float,
                                  block_m: int, block_n: int, allow_tf32: bool
                                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (d_image [B, D], d_text [B, D], d_scale like logit_scale, d_bias like logit_bias
    or empty). A kept ``logits`` matrix replaces the recompute of S' (read only)."""
    scale = logit_scale.detach().float().reshape(())
    g = grad.float().reshape(())
    if loss == "clip":
        d_img, d_txt, d_scale = _clip_backward(g, image_features, text_features, scale, row_lse,
                                               col_lse, aux, logits, label_smoothing, impl,
                                               block_m, block_n, allow_tf32)
        d_bias = logit_scale.new_empty(0)
    else:
        if row_lse.dim() == 2:  # the forward took the gradients (_siglip_forward_with_grads)
            d_img, d_txt, d_scale, d_bias = _siglip_backward_from_forward(
                g, image_features.shape[0], row_lse, col_lse, aux)
        else:
            bias = logit_bias.detach().float().reshape(())
            d_img, d_txt, d_scale, d_bias = _siglip_backward(g, image_features, text_features,
                                                             scale, bias, logits, impl, block_m,
                                                             block_n, allow_tf32)
        d_bias = d_bias.reshape(logit_bias.shape).to(logit_bias.dtype)
    return (d_img.to(image_features.dtype), d_txt.to(text_features.dtype),
            d_scale.reshape(logit_scale.shape).to(logit_scale.dtype), d_bias)


@torch.library.register_fake("infclip::contrastive_loss_backward", lib=_LIB)
def _(grad, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, aux,
      logits, loss, impl, label_smoothing, block_m, block_n, allow_tf32):
    d_bias = (torch.empty_like(logit_bias) if loss == "siglip" and logit_bias is not None
              else logit_scale.new_empty(0))
    return (torch.empty_like(image_features), torch.empty_like(text_features),
            torch.empty_like(logit_scale), d_bias)


class _ContrastiveLossFunction(torch.autograd.Function):
    """The op's autograd: runs the op below autograd and saves what its backward op needs.

    Hand-written rather than torch.library.register_autograd, whose per-call Python (argument
    defaults filled back in, pytree work, a generated Function with metadata) showed in the
    host profile at B = 1,024 (bench_contrastive_loss.py --host-profile). ``args`` are the op's
    arguments as the dispatcher passes them: ``logits_budget_mb`` is left out when it equals
    its default. Once differentiable: the backward op has no derivative."""

    @staticmethod
    def forward(ctx, keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out = _OP.redispatch(keyset & torch._C._after_autograd_keyset, *args)
        image_features, text_features, logit_scale, logit_bias = args[:4]
        _, row_lse, col_lse, aux, logits = out
        # the four outputs besides the loss only feed the backward: without this autograd would
        # allocate and zero-fill a gradient for each of them (the [B, B] logits among them) per call
        ctx.mark_non_differentiable(row_lse, col_lse, aux, logits)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(image_features, text_features, logit_scale, logit_bias, row_lse,
                              col_lse, aux, logits)
        ctx.options = args[4:10]  # loss, impl, label_smoothing, block_m, block_n, allow_tf32
        ctx.count = len(args)
        return out

    @staticmethod
    def backward(ctx, grad_loss, *_grad_saved):
        (image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, aux,
         logits) = ctx.saved_tensors
        d_img, d_txt, d_scale, d_bias = _OP_BACKWARD(
            grad_loss, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse,
            aux, logits, *ctx.options)
        return ((None, d_img, d_txt, d_scale, d_bias if logit_bias is not None else None)
                + (None,) * (ctx.count - 4))


def _autograd_kernel(keyset, *args):
    """The op's Autograd kernel: a graph node only when a gradient can flow."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args[:4]):
        return _ContrastiveLossFunction.apply(keyset, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return _OP.redispatch(keyset & torch._C._after_autograd_keyset, *args)


_LIB.impl("contrastive_loss", _contrastive_loss_op, "CompositeExplicitAutograd")
_LIB.impl("contrastive_loss_backward", _contrastive_loss_backward_op, "CompositeExplicitAutograd")
_LIB.impl("contrastive_loss", _autograd_kernel, "Autograd", with_keyset=True)
_OP = torch.ops.infclip.contrastive_loss.default
_OP_BACKWARD = torch.ops.infclip.contrastive_loss_backward.default


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


def _validate_options(loss: str, label_smoothing: float, block_m: int, block_n: int,
                      grad_reduction: str, logits_budget_mb: float) -> None:
    """The scalar options, checked whether or not a process group is there."""
    if loss not in ("clip", "siglip"):
        raise ValueError(f"unknown loss {loss!r}; choose 'clip' or 'siglip'")
    if not 0.0 <= label_smoothing < 1.0:  # also rejects NaN
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if label_smoothing and loss != "clip":
        raise ValueError("label_smoothing applies to loss 'clip' only")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 (0: the impl's default), got {value}")
    if grad_reduction not in ("mean", "sum"):
        raise ValueError(f"grad_reduction must be 'mean' or 'sum', got {grad_reduction!r}")
    if not logits_budget_mb >= 0:
        raise ValueError(f"logits_budget_mb must be >= 0, got {logits_budget_mb}")


def _validate(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
              logit_bias: Optional[Tensor], loss: str, check_finite: Union[bool, str]) -> None:
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
    if check_finite == "raise":  # one host-device sync for all inputs
        named = [("image_features", image_features), ("text_features", text_features),
                 ("logit_scale", logit_scale)]
        if loss == "siglip":
            named.append(("logit_bias", logit_bias))
        finite = torch.stack([torch.isfinite(value).all() for _, value in named])
        if not bool(finite.all()):
            bad = [name for (name, _), ok in zip(named, finite.tolist()) if not ok]
            raise FloatingPointError(f"{bad[0]} contains NaN or Inf")
    elif not isinstance(check_finite, bool):
        raise ValueError(f"check_finite must be True, False or 'raise', got {check_finite!r}")


def contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                     logit_bias: Optional[Tensor] = None, *, loss: str = "clip", impl: str = "auto",
                     label_smoothing: float = 0.0, allow_tf32: bool = False, block_m: int = 0,
                     block_n: int = 0, triton_interpret: bool = False, distributed: str = "none",
                     process_group=None, local_world_size: Optional[int] = None,
                     grad_reduction: str = "mean", check_finite: Union[bool, str] = True,
                     logits_budget_mb: float = DEFAULT_LOGITS_BUDGET_MB) -> Tensor:
    """CLIP (or SigLIP) loss over the batch without materialising the B x B logits.

    image_features, text_features: [B, D] fp32/bf16/fp16 (L2-normalised by the caller);
    logit_scale: [] or [1], the multiplier s (exp of the learnable log-scale), with gradient;
    logit_bias: [] or [1] (siglip only). Returns a 0-dim fp32 loss: CLIP = mean of the two
    cross-entropy directions (OpenCLIP's convention); SigLIP = sum of pair losses / B.

    check_finite: True (default) folds the check into the result on the device: NaN or Inf in
    the features, scale or bias give a NaN loss (no host sync: capturable in a CUDA graph and
    compiled without a graph break); "raise" raises FloatingPointError naming the input (one
    host sync); False skips it. logits_budget_mb: the triton impl keeps the [B, B] logit matrix
    between forward and backward when it fits (6 B^2 D FLOPs instead of 8; ops/config.py says
    how); 0, or a call that needs no gradient, never keeps it. block_m: torch impls' row tile;
    triton's rows per GEMM band (0: by memory).

    With ``distributed`` != "none" and a process group of more than one rank, the features are
    this rank's local batch and the loss is over the global batch (ops/distributed.py).
    """
    _validate_options(loss, label_smoothing, block_m, block_n, grad_reduction, logits_budget_mb)
    # the scheme string is parsed here, once (an unknown name fails whether or not a group is
    # there); Local unless a process group of more than one rank is given
    scheme = choose_scheme(distributed, process_group, local_world_size)
    _validate(image_features, text_features, logit_scale, logit_bias, loss, check_finite)
    impl_run, why = resolve_impl(impl, image_features.device, triton_interpret)
    if impl == "triton" and impl_run != "triton":
        warnings.warn(f"contrastive_loss: {why}", stacklevel=2)
    if not scheme.local:
        return distributed_contrastive_loss(
            image_features, text_features, logit_scale, logit_bias, scheme=scheme, loss=loss,
            impl=impl_run, label_smoothing=label_smoothing, allow_tf32=allow_tf32,
            block_m=block_m, block_n=block_n, grad_reduction=grad_reduction)
    inputs = (image_features, text_features, logit_scale, logit_bias if loss == "siglip" else None)
    backward = backward_follows(inputs)  # (the test _autograd_kernel makes)
    if not backward:
        logits_budget_mb = 0.0  # no backward will come: nothing to keep for it
    out = _OP(*inputs, loss, impl_run, float(label_smoothing), int(block_m), int(block_n), bool(allow_tf32),
              float(logits_budget_mb), backward)
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
            local_world_size=cfg.local_world_size, grad_reduction=cfg.grad_reduction,
            logits_budget_mb=cfg.logits_budget_mb)

    def extra_repr(self) -> str:
        cfg = self.config
        return f"loss={cfg.loss}, impl={cfg.impl} (ran: {self.resolved_impl}), distributed={cfg.distributed}"
