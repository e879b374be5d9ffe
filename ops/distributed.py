"""The contrastive loss over a batch spread across a process group, as one registered op.

Every scheme computes the loss of the GLOBAL batch (B = N * b rows for N ranks of b rows each)
from the block primitives of ops/blocks.py, whose partial results merge by addition.
Rank r owns rows I_r and columns T_r. The LSE shift of row or column i is its diagonal logit
s <I_i, T_i> (raised to the Cauchy-Schwarz bound - 64 where that is higher: clip_shifts), known to
the owner of both, so partial sums from other ranks add with no rescaling; the per-row assembly
(clip_terms) is the single-device one.

One role: the loss assembly against a sweep, and its registration. The CLIP / SigLIP forward and
backward below are written once against the :class:`ops.sweeps.Sweep` interface (columns(),
all_gather, sum, ...); which blocks exist and how they travel is the sweep's business
(ops/sweeps.py: gather, disco, ring, hierarchical_ring, and Local, all blocks on this device).
``infclip::distributed_contrastive_loss`` is a torch.library op (fake kernel + register_autograd)
that takes the scheme by name and the process group by its ``group_name``, so torch.compile sees
one opaque op with a shape rule, not a graph break.

Gradient convention. Every rank returns the same global loss L. The feature gradients on rank r
are c * dL/d(features_r), complete (they include the terms computed on other ranks), and the
logit_scale / logit_bias gradients are c * (rank r's share of dL/ds), the shares summing to dL/ds.
c = N for ``grad_reduction="mean"`` (DeepSpeed / DDP average gradients), c = 1 for "sum". After
the framework reduces gradients, every parameter gradient equals the one-process full-batch one.
The upstream gradient of L is taken to be the same on every rank (it is under DeepSpeed: loss
scaling and gradient-accumulation division are global); it is not all-reduced.

Limits. Equal local batches on every rank (checked with one tiny all-gather per call: a clear
error otherwise). The op runs collectives inside its kernel: under torch.compile it is opaque,
so every rank must run the same compiled graph (as data-parallel training does).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from .blocks import (
    clip_grads,
    clip_shifts,
    clip_stats,
    clip_terms,
    rownorm,
    siglip_grads,
    siglip_stats,
)
from .sweeps import (
    SCHEMES,
    Local,
    Scheme,
    Sweep,
    choose_scheme,
    make_sweep,
    resolve_group,
    sweep_class,
)

__all__ = ["SCHEMES", "distributed_contrastive_loss"]


@dataclasses.dataclass(frozen=True)
class _Options:
    loss: str
    impl: str
    eps: float
    allow_tf32: bool
    block_m: int
    block_n: int
    factor: float  # c of the gradient convention

    @property
    def kw(self) -> dict:
        return dict(impl=self.impl, block_m=self.block_m, block_n=self.block_n,
                    allow_tf32=self.allow_tf32)


# ----------------------------------------------------------------------------------------------
# Loss assembly against a sweep
# ----------------------------------------------------------------------------------------------
def _clip_forward(img, txt, s, sw: Sweep, o: _Options):
    """Returns (loss [], row_lse [b], col_lse [b], aux, kept) with aux = (ref [b], sum of the
    E[S'] - S'_ii terms, sum ref[, the global feature sums [D] each, with label smoothing]) and
    kept = (I_all, T_all, params_all) where the sweep gathered them, else None entries."""
    eps, kw = o.eps, o.kw
    b = img.shape[0]
    n_global = sw.world * b
    rank_offset = sw.rank * b
    # the shift bounds need the largest feature norms of the whole batch (one tiny all-reduce)
    norms = sw.max_(torch.stack([rownorm(img).max(), rownorm(txt).max()]))
    row_shift, col_shift, ref = clip_shifts(img, txt, s, a_max=norms[0], b_max=norms[1])
    if sw.gathers_rows:
        img_all, txt_all = sw.all_gather(img), sw.all_gather(txt)
        params_all = sw.all_gather(torch.stack([row_shift, col_shift, ref], 1))
        # own rows: I_r x T_all; own columns as the rows of S^T = s T I^T: T_r x I_all (both
        # b x B, row sums, the kernels' cheap direction); the other direction's output unused.
        # Positives at i - j == -rank_offset in both.
        r_off, _, r_wsum, _ = clip_stats(img, txt_all, s, row_shift, params_all[:, 1], ref,
                                         params_all[:, 2], -rank_offset, **kw)
        c_off, _, c_wsum, _ = clip_stats(txt, img_all, s, col_shift, params_all[:, 0], ref,
                                         params_all[:, 2], -rank_offset, **kw)
        kept = (img_all, txt_all, params_all)
    else:
        rows = [torch.zeros_like(row_shift), torch.zeros_like(row_shift)]

        def step(col_offset, held):
            cols = held[1]
            r_sum, c_sum, r_w, c_w = clip_stats(img, held[0], s, row_shift, cols[:, 0], ref,
                                                cols[:, 1], col_offset - rank_offset, **kw)
            rows[0] += r_sum
            rows[1] += r_w
            return [torch.stack([c_sum, c_w], 1)]

        (cols,), full = sw.columns([txt, torch.stack([col_shift, ref], 1)], step, "sum")
        r_off, r_wsum, c_off, c_wsum = rows[0], rows[1], cols[:, 0], cols[:, 1]
        kept = (None, full[0] if full is not None else None, None)
    r_loss, row_lse, r_e = clip_terms(r_off, r_wsum, row_shift, ref, s)
    c_loss, col_lse, c_e = clip_terms(c_off, c_wsum, col_shift, ref, s)
    share = 0.5 * (r_loss.sum() + c_loss.sum()) / n_global
    pieces = [share.reshape(1)]
    if eps:
        share = share + eps * s * ref.sum() / n_global
        pieces = [share.reshape(1), img.sum(0, dtype=torch.float32), txt.sum(0, dtype=torch.float32)]
    total = sw.sum(torch.cat([p.double() for p in pieces]))
    loss = total[0].float()
    aux = [ref, (r_e.sum() + c_e.sum()).reshape(1), ref.sum().reshape(1)]
    if eps:
        d = img.shape[1]
        img_sum, txt_sum = total[1:1 + d].float(), total[1 + d:].float()
        loss = loss - eps / n_global**2 * s * torch.dot(img_sum, txt_sum)
        aux += [img_sum, txt_sum]
    return loss, row_lse, col_lse, torch.cat(aux), kept


def _clip_backward(g, img, txt, s, row_lse, col_lse, aux, kept, sw: Sweep, o: _Options):
    eps, kw = o.eps, o.kw
    b, d = img.shape
    n_global = sw.world * b
    ref, expect, ref_sum = aux[:b], aux[b], aux[b + 1]
    if sw.gathers_rows:
        img_all, txt_all, _ = kept
        none = torch.full((n_global,), math.inf, device=img.device)
        # exp(S - inf) = 0: only the row-softmax term for I_r x T_all, and for T_r x I_all (the
        # rows of S^T) only the column-softmax term; the label terms of one direction each,
        # taken inside the tiles (see clip_grads)
        lab = dict(diag=-sw.rank * b, diag_value=1 - eps, offset=eps / n_global)
        d_img, d_txt_all = clip_grads(img, txt_all, s, row_lse, none, ref, **lab, **kw)
        d_txt, d_img_all = clip_grads(txt, img_all, s, col_lse, none, ref, **lab, **kw)
        d_img += sw.reduce_scatter(d_img_all)
        del d_img_all
        d_txt += sw.reduce_scatter(d_txt_all)
    else:
        rows = [torch.zeros(img.shape, dtype=torch.float32, device=img.device)]

        def step(col_offset, held):
            # positives (global row == global column) at i - j == col_offset - row_offset; the
            # label terms are taken inside the tiles, before rounding (see clip_grads)
            grad_a, grad_b = clip_grads(img, held[0], s, row_lse, held[1], ref,
                                        diag=col_offset - sw.rank * b, diag_value=2 * (1 - eps),
                                        offset=2 * eps / n_global, **kw)
            rows[0] += grad_a
            return [grad_b]

        reuse = [kept[1], None] if sw.gathers_columns else None
        (d_txt,), _ = sw.columns([txt, col_lse], step, "sum", reuse)
        d_img = rows[0]
    coef = g / (2 * n_global)
    # this rank's share: sum over its rows and columns of E[S'] - S'_ii (see clip_terms)
    d_scale = coef * expect
    if eps:
        img_sum, txt_sum = aux[b + 2:b + 2 + d], aux[b + 2 + d:]
        # the global term -2 eps / B <sum I, sum T>: each rank takes 1/N of it
        d_scale = d_scale + coef * 2 * eps * (
            ref_sum - torch.dot(img_sum, txt_sum) / n_global / sw.world)
    d_img.mul_(coef * s * o.factor)
    d_txt.mul_(coef * s * o.factor)
    return d_img, d_txt, d_scale * o.factor


def _siglip_forward(img, txt, s, bias, sw: Sweep, o: _Options):
    """Returns (loss [], T_all or None)."""
    b = img.shape[0]
    row_offset = sw.rank * b
    row_loss = torch.zeros(b, dtype=torch.float32, device=img.device)

    def step(col_offset, held):
        # the positives (global row == global column) sit at i - j == col_offset - row_offset
        row_loss.add_(siglip_stats(img, held[0], s, bias, col_offset - row_offset, **o.kw))
        return []

    _, full = sw.columns([txt], step)
    total = sw.sum((row_loss.sum() / (sw.world * b)).reshape(1))
    return total[0].float(), (full[0] if full is not None else None)


def _siglip_sweep(img, txt, s, bias, kept_txt, sw: Sweep, o: _Options, row_loss=None):
    """The SigLIP gradient sweep: (G @ T rows [b, D], G^T @ I of this rank's columns [b, D], both
    fp32 without the factor, [sum G S', sum G]); with ``row_loss`` ([b] fp32) the pair losses of
    the same blocks are added to it (the forward of a call whose backward will follow)."""
    b = img.shape[0]
    row_offset = sw.rank * b
    rows = [torch.zeros(img.shape, dtype=torch.float32, device=img.device),
            img.new_zeros((), dtype=torch.float32), img.new_zeros((), dtype=torch.float32)]

    def step(col_offset, held):
        out = siglip_grads(img, held[0], s, bias, col_offset - row_offset, **o.kw,
                           with_loss=row_loss is not None)
        if row_loss is not None:
            row_loss.add_(out[0])
        grad_a, grad_b, gsum, gwsum = out[-4:]
        rows[0] += grad_a
        rows[1] += gsum
        rows[2] += gwsum
        return [grad_b]

    (d_txt,), _ = sw.columns([txt], step, "sum", [kept_txt] if kept_txt is not None else None)
    return rows[0], d_txt, torch.stack([rows[2], rows[1]])


def _siglip_forward_with_grads(img, txt, s, bias, sw: Sweep, o: _Options):
    """(loss [], d_img, d_txt, sums): one sweep for the loss and the gradient (a SigLIP pair's
    gradient needs no row statistic); the backward finishes the gradient (_siglip_finish)."""
    b = img.shape[0]
    row_loss = torch.zeros(b, dtype=torch.float32, device=img.device)
    d_img, d_txt, sums = _siglip_sweep(img, txt, s, bias, None, sw, o, row_loss)
    total = sw.sum((row_loss.sum() / (sw.world * b)).reshape(1))
    return total[0].float(), d_img, d_txt, sums


def _siglip_finish(g, s, b, d_img, d_txt, sums, sw: Sweep, o: _Options, inplace: bool):
    """The gradients from the sweep's results: (d_img, d_txt, d_scale, d_bias), times c; in
    place on the sweep's buffers unless they are saved tensors (a backward may run twice)."""
    coef = g / (sw.world * b) * o.factor
    mul = torch.Tensor.mul_ if inplace else torch.Tensor.mul
    return mul(d_img, coef * s), mul(d_txt, coef * s), coef * sums[0], coef * sums[1]


def _siglip_backward(g, img, txt, s, bias, kept_txt, sw: Sweep, o: _Options):
    d_img, d_txt, sums = _siglip_sweep(img, txt, s, bias,
                                       kept_txt if sw.gathers_columns else None, sw, o)
    return _siglip_finish(g, s, img.shape[0], d_img, d_txt, sums, sw, o, inplace=True)


# ----------------------------------------------------------------------------------------------
# The registered op: infclip::distributed_contrastive_loss (+ its backward op and autograd)
# ----------------------------------------------------------------------------------------------
_LIB = torch.library.Library("infclip", "FRAGMENT")
_OPTIONS = ("str scheme, str group_name, int local_world_size, str loss, str impl, "
            "float label_smoothing, int block_m, int block_n, bool allow_tf32, str grad_reduction")
_LIB.define("distributed_contrastive_loss(Tensor image_features, Tensor text_features, "
            "Tensor logit_scale, Tensor? logit_bias, " + _OPTIONS + ", "
            "bool grads_in_forward=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_N_OPTIONS = _OPTIONS.count(",") + 1  # the options both ops take (the forward's flag is not one)
_LIB.define("distributed_contrastive_loss_backward(Tensor grad, Tensor image_features, "
            "Tensor text_features, Tensor logit_scale, Tensor? logit_bias, Tensor row_lse, "
            "Tensor col_lse, Tensor aux, Tensor kept_image, Tensor kept_text, Tensor kept_params, "
            + _OPTIONS + ") -> (Tensor, Tensor, Tensor, Tensor)")


def _split_options(options: tuple) -> tuple[tuple, bool]:
    """The forward op's trailing arguments as (the shared options, grads_in_forward); the
    dispatcher leaves the flag out when it has its default."""
    return options[:_N_OPTIONS], bool(options[_N_OPTIONS:] and options[_N_OPTIONS])


def backward_follows(inputs) -> bool:
    """Whether autograd will call the loss's backward: grad enabled and an input requiring grad
    (the test the ops' autograd makes, in Python: dynamo cannot trace
    torch._C._any_requires_grad, and the entry points compile with fullgraph=True)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)


def _sweep_and_options(scheme, group_name, local_world_size, loss, impl, label_smoothing,
                       block_m, block_n, allow_tf32, grad_reduction) -> tuple[Sweep, _Options]:
    sw = make_sweep(scheme, resolve_group(group_name), local_world_size or None)
    factor = float(sw.world if grad_reduction == "mean" else 1)
    return sw, _Options(loss, impl, float(label_smoothing), bool(allow_tf32), int(block_m),
                        int(block_n), factor)


def _op(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
        logit_bias: Optional[Tensor], *options) -> tuple:
    """Returns (loss [], row_lse [b], col_lse [b], aux, kept_image, kept_text, kept_params): the
    last six feed the backward (aux: see _clip_forward; kept_*: what a gathering sweep gathered,
    [B, D], [B, D], [B, 3] fp32, else empty; SigLIP: everything but kept_text empty). SigLIP with
    ``grads_in_forward`` (the caller's promise that a backward follows): (loss, d_img [b, D],
    d_txt [b, D], sums [2], then empty) of _siglip_forward_with_grads instead."""
    options, eager = _split_options(options)
    sw, o = _sweep_and_options(*options)
    sw.check_sizes(image_features)
    s = logit_scale.detach().float().reshape(())
    if o.loss == "siglip" and eager:
        bias = logit_bias.detach().float().reshape(())
        loss, d_img, d_txt, sums = _siglip_forward_with_grads(image_features, text_features, s,
                                                              bias, sw, o)
        empty = [image_features.new_empty(0) for _ in range(3)]
        return (loss, d_img, d_txt, sums, *empty)
    if o.loss == "clip":
        loss, row_lse, col_lse, aux, kept = _clip_forward(image_features, text_features, s, sw, o)
    else:
        bias = logit_bias.detach().float().reshape(())
        loss, kept_text = _siglip_forward(image_features, text_features, s, bias, sw, o)
        row_lse, col_lse, aux, kept = None, None, None, (None, kept_text, None)
    # the unused outputs are empty tensors, each its own (outputs must not alias)
    f32 = [None, torch.float32, torch.float32, torch.float32, None, None, torch.float32]
    out = (loss, row_lse, col_lse, aux) + tuple(kept)
    return tuple(x if x is not None else image_features.new_empty(0, dtype=dtype)
                 for x, dtype in zip(out, f32))


@torch.library.register_fake("infclip::distributed_contrastive_loss", lib=_LIB)
def _(image_features, text_features, logit_scale, logit_bias, *options):
    options, eager = _split_options(options)
    scheme, group_name, _, loss, _, label_smoothing = options[:6]
    cls = sweep_class(scheme)
    b, d = image_features.shape
    n = b * (1 if cls is Local else dist.get_world_size(resolve_group(group_name)))
    clip = loss == "clip"
    new = image_features.new_empty
    f32 = torch.float32
    if not clip and eager:
        return (new((), dtype=f32), new((b, d), dtype=f32), new((b, d), dtype=f32),
                new((2,), dtype=f32), new((0,)), new((0,)), new((0,)))
    m = b if clip else 0
    aux = (b + 2 + (2 * d if label_smoothing else 0)) if clip else 0
    return (new((), dtype=f32), new((m,), dtype=f32), new((m,), dtype=f32), new((aux,), dtype=f32),
            new((n, d) if clip and cls.gathers_rows else (0,)),
            new((n, d) if cls.gathers_columns else (0,)),
            new((n, 3) if clip and cls.gathers_rows else (0,), dtype=f32))


def _backward_op(grad: Tensor, image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                 logit_bias: Optional[Tensor], row_lse: Tensor, col_lse: Tensor, aux: Tensor,
                 kept_image: Tensor, kept_text: Tensor, kept_params: Tensor, *options) -> tuple:
    """Returns (d_image [b, D], d_text [b, D], d_scale like logit_scale, d_bias like logit_bias
    or empty), each times the convention's factor c."""
    sw, o = _sweep_and_options(*options)
    s = logit_scale.detach().float().reshape(())
    g = grad.float().reshape(())
    if o.loss == "clip":
        d_img, d_txt, d_scale = _clip_backward(g, image_features, text_features, s, row_lse,
                                               col_lse, aux, (kept_image, kept_text, kept_params),
                                               sw, o)
        d_bias = logit_scale.new_zeros(0)
    else:
        if row_lse.dim() == 2:  # the forward took the gradients (_siglip_forward_with_grads)
            d_img, d_txt, d_scale, d_bias = _siglip_finish(g, s, image_features.shape[0], row_lse,
                                                           col_lse, aux, sw, o, inplace=False)
        else:
            bias = logit_bias.detach().float().reshape(())
            d_img, d_txt, d_scale, d_bias = _siglip_backward(g, image_features, text_features, s,
                                                             bias, kept_text, sw, o)
        d_bias = d_bias.reshape(logit_bias.shape).to(logit_bias.dtype)
    return (d_img.to(image_features.dtype), d_txt.to(text_features.dtype),
            d_scale.reshape(logit_scale.shape).to(logit_scale.dtype), d_bias)


@torch.library.register_fake("infclip::distributed_contrastive_loss_backward", lib=_LIB)
def _(grad, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse, aux,
      kept_image, kept_text, kept_params, scheme, group_name, local_world_size, loss, *rest):
    d_bias = (torch.empty_like(logit_bias) if loss == "siglip" and logit_bias is not None
              else logit_scale.new_empty(0))
    return (torch.empty_like(image_features), torch.empty_like(text_features),
            torch.empty_like(logit_scale), d_bias)


def _setup_context(ctx, inputs, output):
    image_features, text_features, logit_scale, logit_bias, *options = inputs
    _, row_lse, col_lse, aux, kept_image, kept_text, kept_params = output
    # only the loss has a gradient: no zero-filled gradients for the saved outputs (the gathered
    # features among them, [global B, D] each) at every backward
    ctx.mark_non_differentiable(row_lse, col_lse, aux, kept_image, kept_text, kept_params)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(image_features, text_features, logit_scale, logit_bias, row_lse, col_lse,
                          aux, kept_image, kept_text, kept_params)
    ctx.options = tuple(options)


def _backward(ctx, grad_loss, *_grad_saved):
    (image_features, text_features, logit_scale, logit_bias, *saved) = ctx.saved_tensors
    d_img, d_txt, d_scale, d_bias = torch.ops.infclip.distributed_contrastive_loss_backward(
        grad_loss, image_features, text_features, logit_scale, logit_bias, *saved,
        *ctx.options[:_N_OPTIONS])
    return (d_img, d_txt, d_scale, (d_bias if logit_bias is not None else None)) + (None,) * len(ctx.options)


_LIB.impl("distributed_contrastive_loss", _op, "CompositeExplicitAutograd")
_LIB.impl("distributed_contrastive_loss_backward", _backward_op, "CompositeExplicitAutograd")
torch.library.register_autograd("infclip::distributed_contrastive_loss", _backward,
                                setup_context=_setup_context, lib=_LIB)


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------
def distributed_contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                                 logit_bias: Optional[Tensor] = None, *,
                                 scheme: Union[str, Scheme] = "ring", loss: str = "clip",
                                 impl: str = "chunked_torch", label_smoothing: float = 0.0,
                                 allow_tf32: bool = False, block_m: int = 0, block_n: int = 0,
                                 process_group=None, local_world_size: Optional[int] = None,
                                 grad_reduction: str = "mean") -> Tensor:
    """The CLIP / SigLIP loss of the global batch spread over ``process_group``.

    image_features, text_features: [b, D] this rank's local batch (same b and D on every rank);
    logit_scale: [] or [1] (the multiplier); logit_bias: [] or [1] (siglip). ``scheme``: a name
    from SCHEMES (or "none": every block here), or a :class:`ops.sweeps.Scheme` already chosen
    (then ``process_group`` and ``local_world_size`` are ignored). ``impl`` must be an
    implementation that runs here ("naive", "chunked_torch", "triton"; resolve "auto" first).
    Returns the 0-dim fp32 loss of the global batch, identical on every rank; see the module
    docstring for the gradient convention (``grad_reduction`` "mean" or "sum"). Runs the
    registered op even on a group of one rank.
    """
    if loss not in ("clip", "siglip"):
        raise ValueError(f"unknown loss {loss!r}; choose 'clip' or 'siglip'")
    if impl not in ("naive", "chunked_torch", "triton"):
        raise ValueError(f"impl must be 'naive', 'chunked_torch' or 'triton' (resolve 'auto' with "
                         f"ops.resolve_impl first), got {impl!r}")
    if grad_reduction not in ("mean", "sum"):
        raise ValueError(f"grad_reduction must be 'mean' or 'sum', got {grad_reduction!r}")
    if loss == "siglip" and logit_bias is None:
        raise ValueError("loss 'siglip' needs logit_bias")
    if loss == "siglip" and label_smoothing:
        raise ValueError("label_smoothing applies to loss 'clip' only")
    if image_features.shape != text_features.shape or image_features.dim() != 2:
        raise ValueError(f"features must both be [b, D]; got image {tuple(image_features.shape)}, "
                         f"text {tuple(text_features.shape)}")
    if not isinstance(scheme, Scheme):
        scheme = choose_scheme(scheme, process_group, local_world_size, world_one_is_local=False)
    inputs = (image_features, text_features, logit_scale, logit_bias if loss == "siglip" else None)
    out = torch.ops.infclip.distributed_contrastive_loss(
        *inputs, scheme.name, scheme.group_name, scheme.local_world_size, loss, impl,
        float(label_smoothing), int(block_m or 0), int(block_n or 0), bool(allow_tf32),
        grad_reduction, loss == "siglip" and backward_follows(inputs))  # SigLIP: one sweep
    return out[0]
