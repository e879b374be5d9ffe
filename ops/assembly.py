"""The contrastive loss written once against a sweep over blocks: CLIP and SigLIP, forward and
backward, for every scheme (one device, gather, disco, ring, hierarchical ring).

One role: the loss's arithmetic. Rank r owns rows I_r and columns T_r of the global batch
(B = N b rows for N ranks of b; N = 1 on one device). Which column blocks meet those rows, and
how their partial results travel home, is the sweep's business (ops/sweeps.py, one class per
scheme, chosen once); the blocks' partial results come from the primitives of ops/blocks.py,
or from the Triton kernels of ops/contrastive_loss_triton.py, and merge by addition. The LSE
shift of row or column i is its diagonal logit s <I_i, T_i> (raised to the Cauchy-Schwarz bound
- 64 where that is higher: clip_shifts; a bound that loose made the row's true maximum:
_clip_prologue), known to the owner of both, so partial sums from other ranks add with no
rescaling; the per-row terms come from the complete sums (clip_terms, or the
Triton epilogue). The math is in ops/contrastive_loss.py's docstring.

What the assembly asks of a sweep (class attributes, never its name):
    in_place          one step covers this rank's rows and columns whole (ops.sweeps.Local):
                      the step writes its statistics where the epilogue reads them, the
                      gradients come out finished (coefficients folded in before rounding, in
                      the features' dtype), and the triton impl may keep S' from forward to
                      backward (``logits_budget_mb``). On one device this is the launch sequence
                      of the fast path: prologue, fused statistics, epilogue, folded gradients.
    gathers_columns   the gathered column block is kept for the backward (disco)
    gathers_rows      rank r also computes its columns against all rows (gather)

Gradient convention. Every rank returns the same global loss L. The feature gradients on rank r
are c * dL/d(features_r), complete (they include the terms computed on other ranks), and the
logit_scale / logit_bias gradients are c * (rank r's share of dL/ds), the shares summing to dL/ds.
c = N for ``grad_reduction="mean"`` (DeepSpeed / DDP average gradients), c = 1 for "sum"; on one
device c = 1. After the framework reduces gradients, every parameter gradient equals the
one-process full-batch one. The upstream gradient of L is taken to be the same on every rank
(it is under DeepSpeed: loss scaling and gradient-accumulation division are global).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .blocks import (
    LOGIT_BOUND_LIMIT,
    SHIFT_MARGIN,
    SHIFT_SLACK,
    clip_block_max,
    clip_grads,
    clip_shifts,
    clip_stats,
    clip_terms,
    loose_shifts,
    rownorm,
    siglip_grads,
    siglip_stats,
    triton_kernels,
)
from .sweeps import Sweep
from .tuning import TUNING

__all__ = ["Options", "keep_logits", "clip_forward", "clip_backward", "siglip_forward",
           "siglip_forward_with_grads", "siglip_backward", "siglip_backward_from_forward",
           "grads_in_forward", "folds_coefficients"]


def keep_logits(impl: str, n: int, dtype: torch.dtype, block_m: int, budget_mb: float) -> str:
    """What the triton impl keeps of the [B, B] S' from forward to backward, within
    ``budget_mb`` MiB: ``"whole"``, the matrix in fp32 (exact logits; with the backward's [B, B]
    gradient block in the features' dtype, 6 bytes a pair in bf16); else, above B = 16,384 and
    for 16-bit features, ``"bands"``, the matrix in the features' dtype (the banded path's own
    rounded logits, 2 bytes a pair; the backward turns it into gradients one row band at a time,
    no GEMM redone; bf16 only, TUNING.bands_dtypes); else ``""`` (recompute by row bands). Nothing is
    kept when a band height is forced (block_m)."""
    if impl != "triton" or block_m:
        return ""
    if not budget_mb:
        return ""
    itemsize = dtype.itemsize
    budget = budget_mb * 2**20
    if n * n * (4 + itemsize) <= budget:
        return "whole"
    if dtype in TUNING.bands_dtypes and n * n > TUNING.bands_min_logits and n * n * itemsize <= budget:
        return "bands"
    return ""


class Options(NamedTuple):
    """The call's options, fixed for its forward and backward (a tuple: built at every call,
    cheaply)."""

    loss: str
    impl: str
    eps: float  # label smoothing
    allow_tf32: bool
    block_m: int
    block_n: int
    factor: float  # c of the gradient convention
    keep: str = ""  # keep_logits' answer (in-place sweeps only)

    @property
    def kw(self) -> dict:
        return dict(impl=self.impl, block_m=self.block_m, block_n=self.block_n,
                    allow_tf32=self.allow_tf32)


def grads_in_forward(loss: str, asked: bool) -> bool:
    """Whether the forward takes the gradients too: SigLIP, when the caller promises that a
    backward follows (a pair's gradient needs no statistic of its row: one sweep, not two)."""
    return asked and loss == "siglip" and TUNING.siglip_grads_in_forward


def folds_coefficients(sweep_in_place: bool, impl: str, dtype: torch.dtype) -> bool:
    """Whether the gradient kernels write finished gradients (the coefficient k folded into P
    before its rounding, in the features' dtype): the triton impl on an in-place sweep, except
    for fp16, whose range would flush k P (~1e-9) to zero (k then multiplies the fp32 results)."""
    return sweep_in_place and impl == "triton" and dtype != torch.float16


def _finite(*values: Tensor) -> Tensor:
    """A device bool: all values finite (no host sync)."""
    return torch.stack([torch.isfinite(v).all() for v in values]).all()


def _colsum(x: Tensor) -> Tensor:
    return x.sum(0, dtype=torch.float32)


def _own_block(sw: Sweep, block: list, fn):
    """``fn(block)`` run as the one step of an in-place sweep (the block this rank holds whole);
    returns its result."""
    result = []
    sw.columns(block, lambda col_offset, held: (result.append(fn(held)), [])[1])
    return result[0]


def _sum_over_ranks(sw: Sweep, *pieces: Tensor) -> tuple:
    """The fp32 pieces summed over the sweep's group (in fp64, back to fp32); as they are on one
    rank (no launch)."""
    if sw.world == 1:
        return pieces
    total = sw.sum(torch.cat([p.reshape(-1).double() for p in pieces])).float()
    out, start = [], 0
    for p in pieces:
        out.append(total[start:start + p.numel()].reshape(p.shape))
        start += p.numel()
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# CLIP forward: prologue (shifts), statistics over the sweep, epilogue (terms, loss)
# ----------------------------------------------------------------------------------------------
def _clip_prologue(img, txt, s, sw: Sweep, o: Options):
    """(row_shift [b], col_shift [b], aux [b + 2], sums [4 b]): aux[:b] = ref (the positives' S'),
    sums zeroed (row_sum, row_wsum, col_sum, col_wsum). The shift bounds need the largest feature
    norms of the whole batch (one tiny all-reduce of the sweep); a shift the bound leaves loose
    (blocks.loose_shifts) becomes its row's or column's true maximum."""
    if o.impl == "triton":  # (one rank: no max to combine, no reduction launched for it)
        tri = triton_kernels()
        # the widest block the sweep's statistics and gradients take (gathered: up to b x B)
        width = img.shape[0] * (sw.world if sw.gathers_columns else 1)
        limit = tri.logit_bound_limit(img, txt, width, o.keep, LOGIT_BOUND_LIMIT)
        # in place the shift launch itself makes loose shifts tight (on the device, no host read)
        row_shift, col_shift, aux, sums = tri.clip_prologue_triton(
            img, txt, s, SHIFT_MARGIN, combine_max=sw.max_ if sw.world > 1 else None,
            limit=limit, slack=SHIFT_SLACK if sw.in_place else None, allow_tf32=o.allow_tf32)
        if not sw.in_place:
            _tighten_loose_shifts(img, txt, s, row_shift, col_shift, aux[:img.shape[0]], sw, o)
        return row_shift, col_shift, aux, sums
    b = img.shape[0]
    norms = sw.max_(torch.stack([rownorm(img).max(), rownorm(txt).max()]))
    row_shift, col_shift, ref = clip_shifts(img, txt, s, a_max=norms[0], b_max=norms[1])
    _tighten_loose_shifts(img, txt, s, row_shift, col_shift, ref, sw, o)
    aux = torch.cat([ref, ref.new_zeros(2)])
    return row_shift, col_shift, aux, ref.new_zeros(4 * b)


def _tighten_loose_shifts(img, txt, s, row_shift, col_shift, ref, sw: Sweep, o: Options) -> None:
    """In place: each loose shift (blocks.loose_shifts) raised or lowered to its row's or column's
    true maximum over the global batch, by a sweep of block maxima (blocks.clip_block_max, the
    tiles of the statistics that follow). Whether any rank has one is read on the host (one
    tiny all-reduce and one sync a call): the torch impls and the distributed schemes only."""
    loose_r = loose_shifts(row_shift, ref, s)
    loose_c = loose_shifts(col_shift, ref, s)
    if not bool(sw.max_(torch.stack([loose_r.any(), loose_c.any()]).float()).any()):
        return
    d = s * ref
    if sw.gathers_rows:  # the statistics' orientation: rows I_r x T_all, columns T_r x I_all
        row_max, _ = clip_block_max(img, sw.all_gather(txt), s, cols=False, **o.kw)
        col_max, _ = clip_block_max(txt, sw.all_gather(img), s, cols=False, **o.kw)
    else:
        row_max = torch.full_like(row_shift, -math.inf)

        def step(col_offset, held):
            rows, cols = clip_block_max(img, held[0], s, **o.kw)
            torch.maximum(row_max, rows, out=row_max)
            return [cols]

        (col_max,), _ = sw.columns([txt], step, "max")
    row_shift.copy_(torch.where(loose_r, torch.maximum(row_max, d), row_shift))
    col_shift.copy_(torch.where(loose_c, torch.maximum(col_max, d), col_shift))


def _dscale_in_backward(img, txt, sw: Sweep, o: Options, keep: bool) -> bool:
    """Whether the forward leaves the weighted sums out (the triton column-strip statistics) and
    the backward's gradient kernels sum d loss / d s instead, asked of the same tensors (this
    rank's rows, a column block) by forward and backward: where the strips run, nothing kept
    (``keep``: the forward keeps S', the backward has it), and in place only where the kernel
    writes finished gradients (it takes the coefficient itself). The gathered-rows sweep keeps
    its weighted sums (two one-direction blocks)."""
    if sw.in_place:
        ok = folds_coefficients(True, o.impl, img.dtype)
    else:
        ok = o.impl == "triton" and not sw.gathers_rows and TUNING.sweeps_sum_dscale
    return ok and triton_kernels().sums_in_strips(img, txt, keep)


def _sweep_width(sw: Sweep, b: int) -> int:
    return sw.world * b if TUNING.sweep_blocks_global else 0


def _adding_into(rows: Tensor):
    """A gradient pass's ``sink_a`` that adds each block's finished rows straight into the fp32
    sum ``rows`` (no [b, D] result to add a step); named as ``sink.into``, the triton block loop
    accumulates its GEMMs into ``rows`` itself (no band sums and no add a band, of which a ring
    or pipelined disco step has two or more)."""
    def sink(i0, i1, part):
        rows[i0:i1].add_(part)
    sink.into = rows
    return sink


def _clip_block_stats(a, b, s, row_shift, col_shift, row_ref, col_ref, diag, rows, cols,
                      o: Options, keep: str = "", weighted: bool = True):
    """Adds the statistics of the block a x b into rows = [row_sum, row_wsum] ([M] each) and
    cols = [col_sum, col_wsum] ([N] each), the weighted ones only if ``weighted`` (triton);
    returns the kept S' (triton, ``keep``) or None."""
    if o.impl == "triton":
        return triton_kernels().clip_stats_triton(a, b, s, row_shift, col_shift, row_ref, col_ref, diag,
                                           keep_logits=keep, band=o.block_m,
                                           allow_tf32=o.allow_tf32, out=(*rows, *cols),
                                           weighted=weighted)[4]
    r_sum, c_sum, r_w, c_w = clip_stats(a, b, s, row_shift, col_shift, row_ref, col_ref, diag,
                                        **o.kw)
    for acc, part in zip((*rows, *cols), (r_sum, r_w, c_sum, c_w)):
        acc.add_(part)
    return None


def _clip_epilogue(s, sums, row_shift, col_shift, aux, n_global: int, o: Options):
    """(this rank's share of the loss [], row_lse [b], col_lse [b]) from the complete sums; fills
    aux[b] (sum of the E[S'] - S'_ii terms, for d loss / d s) and aux[b + 1] (sum ref). A
    non-finite shift (non-finite features or scale) makes the share NaN (no sync)."""
    if o.impl == "triton":
        return triton_kernels().clip_epilogue_triton(s, sums, row_shift, col_shift, aux, count=n_global)
    b = row_shift.shape[0]
    ref = aux[:b]
    r_loss, row_lse, r_e = clip_terms(sums[:b], sums[b:2 * b], row_shift, ref, s)
    c_loss, col_lse, c_e = clip_terms(sums[2 * b:3 * b], sums[3 * b:], col_shift, ref, s)
    share = 0.5 * (r_loss.sum() + c_loss.sum()) / n_global
    share = torch.where(_finite(row_shift, col_shift), share, torch.full_like(share, math.nan))
    aux[b] = r_e.sum() + c_e.sum()
    aux[b + 1] = ref.sum()
    return share, row_lse, col_lse


def clip_forward(img, txt, s, sw: Sweep, o: Options) -> tuple:
    """Returns (loss [], row_lse [b], col_lse [b], aux, kept): aux = (ref [b], sum of the
    E[S'] - S'_ii terms, sum ref[, the global feature sums [D] each, with label smoothing]);
    kept: what the backward reuses: the kept S' (in-place triton, ``o.keep``), T_all [B, D]
    (gathers_columns), [I_all, T_all] [2, B, D] (gathers_rows), or None."""
    b = img.shape[0]
    n_global = sw.world * b
    row_offset = sw.rank * b  # the positives of a column block at col_offset: i - j == col_offset - row_offset
    row_shift, col_shift, aux, sums = _clip_prologue(img, txt, s, sw, o)
    ref = aux[:b]
    rows, own_cols = [sums[:b], sums[b:2 * b]], [sums[2 * b:3 * b], sums[3 * b:]]
    kept = None
    if sw.gathers_rows:
        kept = img.new_empty((2, n_global, img.shape[1]))
        img_all, txt_all = sw.all_gather(img, kept[0]), sw.all_gather(txt, kept[1])
        params = sw.all_gather(torch.stack([row_shift, col_shift, ref], 1))
        # own rows: I_r x T_all; own columns as the rows of S^T = s T I^T: T_r x I_all (both
        # b x B, row sums, the kernels' cheap direction); the other direction's sums unused
        unused = list(sums.new_zeros(2, n_global))
        _clip_block_stats(img, txt_all, s, row_shift, params[:, 1], ref, params[:, 2],
                          -row_offset, rows, unused, o)
        _clip_block_stats(txt, img_all, s, col_shift, params[:, 0], ref, params[:, 2],
                          -row_offset, own_cols, unused, o)
    else:
        def step(col_offset, held):
            nonlocal kept
            t, t_shift, t_ref = held
            # column partials travel (rank to rank, or scattered by rows): two separate
            # tensors; in place they are written where the epilogue reads them
            cols = own_cols if sw.in_place else [sums.new_zeros(t.shape[0]) for _ in range(2)]
            kept = _clip_block_stats(img, t, s, row_shift, t_shift, ref, t_ref,
                                     col_offset - row_offset, rows, cols, o, o.keep,
                                     not _dscale_in_backward(img, t, sw, o, bool(o.keep)))
            return cols

        cols, full = sw.columns([txt, col_shift, ref], step, "sum")
        if cols[0] is not own_cols[0]:
            for acc, part in zip(own_cols, cols):
                acc.copy_(part)
        if full is not None:
            kept = full[0]
    loss, row_lse, col_lse = _clip_epilogue(s, sums, row_shift, col_shift, aux, n_global, o)
    if o.eps:
        # t_i = S_ii - eps (S_ii - mean_j S_ij); sum_ij S_ij = s <sum_i I_i, sum_j T_j> in O(BD)
        share = loss + o.eps * s * aux[b + 1] / n_global
        share, img_sum, txt_sum = _sum_over_ranks(sw, share, _colsum(img), _colsum(txt))
        loss = share - o.eps / n_global**2 * s * torch.dot(img_sum, txt_sum)
        aux = torch.cat([aux, img_sum, txt_sum])
    else:
        (loss,) = _sum_over_ranks(sw, loss)
    return loss, row_lse, col_lse, aux, kept


# ----------------------------------------------------------------------------------------------
# CLIP backward
# ----------------------------------------------------------------------------------------------
def _clip_own_block_grads(g, img, txt, s, row_lse, col_lse, aux, logits, sw: Sweep, o: Options):
    """The finished (d_img, d_txt, d_scale) of an in-place sweep: one block, this rank's rows and
    columns whole; the kept S' (``logits``) replaces the recompute when there is one."""
    n = img.shape[0]
    labels = dict(diag=0, diag_value=2 * (1 - o.eps), offset=2 * o.eps / n)
    ref = aux[:n]
    kept = logits if logits is not None and logits.numel() else None
    if folds_coefficients(True, o.impl, img.dtype):
        # k = coef s folded into P before its rounding: the GEMMs write the final gradients. The
        # kernel takes coef = g / (2B), k and d_scale = coef aux[B] itself (no torch launches),
        # or sums d_scale itself where the forward took no weighted sums
        return triton_kernels().clip_grads_triton(
            img, txt, s, row_lse, col_lse, ref, **labels, coef=g, coef_mul=1 / (2 * n),
            coef_scale=True, dscale_from=aux, dscale_index=n,
            dscale_summed=_dscale_in_backward(img, txt, sw, o, kept is not None), logits=kept,
            band=o.block_m, out_dtype=img.dtype, allow_tf32=o.allow_tf32)
    if o.impl == "triton":  # fp16: k = coef s multiplies the fp32 results, d_scale = coef aux[n]
        tri = triton_kernels()
        d_img, d_txt = tri.clip_grads_triton(
            img, txt, s, row_lse, col_lse, ref, **labels, logits=kept, band=o.block_m,
            out_dtype=torch.float32, allow_tf32=o.allow_tf32)
        return tri.scale_grads_triton(g, d_img, d_txt, 2 * n, scale=s, scalars=(aux[n],),
                                      out_dtype=img.dtype)
    coef = g / (2 * n)
    k = coef * s
    # dI is finished band by band (no [B, D] fp32 buffer), dT in place on its fp32 sum.
    d_img = torch.empty_like(img)

    def finish_img(i0, i1, rows):
        d_img[i0:i1] = rows.mul_(k)

    _, d_txt = clip_grads(img, txt, s, row_lse, col_lse, ref, **labels, **o.kw, sink_a=finish_img)
    return d_img, d_txt.mul_(k), coef * aux[n]


def _clip_gathered_grads(img, txt, s, row_lse, col_lse, ref, kept, sw: Sweep, o: Options):
    """gather: (P @ T rows, P^T @ I of this rank's columns), fp32 [b, D] each, without k;
    kept: [I_all, T_all] of the forward."""
    b = img.shape[0]
    n_global = sw.world * b
    img_all, txt_all = kept.unbind(0)
    none = torch.full((n_global,), math.inf, device=img.device)
    # exp(S - inf) = 0: only the row-softmax term for I_r x T_all, and for T_r x I_all (the rows
    # of S^T) only the column-softmax term; the label terms of one direction each, taken inside
    # the tiles (see clip_grads)
    lab = dict(diag=-sw.rank * b, diag_value=1 - o.eps, offset=o.eps / n_global)
    d_img, d_txt_all = clip_grads(img, txt_all, s, row_lse, none, ref, **lab, **o.kw)
    d_txt, d_img_all = clip_grads(txt, img_all, s, col_lse, none, ref, **lab, **o.kw)
    d_img += sw.reduce_scatter(d_img_all)
    del d_img_all
    d_txt += sw.reduce_scatter(d_txt_all)
    return d_img, d_txt


def _clip_swept_grads(img, txt, s, row_lse, col_lse, aux, kept_text, sw: Sweep, o: Options):
    """Every column block through the sweep: (P @ T rows, P^T @ I of this rank's columns), fp32
    [b, D] each, without k, and this rank's share of the sum of the E[S'] - S'_ii terms (fp32
    []): aux[b] of the forward's weighted sums plus what the gradient kernels sum of the blocks
    whose forward took none (_dscale_in_backward; the terms are linear in the blocks)."""
    b = img.shape[0]
    n_global = sw.world * b
    ref = aux[:b]
    rows = torch.zeros(img.shape, dtype=torch.float32, device=img.device)
    # the share's accumulator once a block sums d scale: a copy of aux[b] (the saved aux stays
    # as the forward left it)
    summed = []
    fixed = dict(diag_value=2 * (1 - o.eps), offset=2 * o.eps / n_global,
                 width=_sweep_width(sw, b), sink_a=_adding_into(rows))

    def step(col_offset, held):
        t, t_lse, t_ref = held
        # positives (global row == global column) at i - j == col_offset - row_offset; the label
        # terms are taken inside the tiles, before rounding (see clip_grads)
        labels = dict(fixed, diag=col_offset - sw.rank * b)
        if _dscale_in_backward(img, t, sw, o, False):
            if not summed:
                summed.append(aux[b].clone())
            _, grad_b, _ = triton_kernels().clip_grads_triton(
                img, t, s, row_lse, t_lse, ref, **labels, dscale_summed=True, col_ref=t_ref,
                dscale_out=summed[0], band=o.block_m, allow_tf32=o.allow_tf32)
        else:
            _, grad_b = clip_grads(img, t, s, row_lse, t_lse, ref, **labels, **o.kw)
        return [grad_b]

    gathered = sw.gathers_columns and kept_text is not None and kept_text.numel()
    reuse = [kept_text, None, None] if gathered else None
    (d_txt,), _ = sw.columns([txt, col_lse, ref], step, "sum", reuse)
    return rows, d_txt, summed[0] if summed else aux[b]


def clip_backward(g, img, txt, s, row_lse, col_lse, aux, kept, sw: Sweep, o: Options):
    """Returns (d_img, d_txt, d_scale fp32 []), each times the convention's factor c; ``kept``:
    the forward's (see clip_forward; empty or None for none)."""
    b, d = img.shape
    n_global = sw.world * b
    # (in place the kernels take the coefficient themselves: no launch for it there unless eps)
    coef = g / (2 * n_global) if o.eps or not sw.in_place else None
    if sw.in_place:
        d_img, d_txt, d_scale = _own_block(sw, [txt, col_lse], lambda held: _clip_own_block_grads(
            g, img, held[0], s, row_lse, held[1], aux, kept, sw, o))
    else:
        if sw.gathers_rows:
            d_img, d_txt = _clip_gathered_grads(img, txt, s, row_lse, col_lse, aux[:b], kept, sw, o)
            share = aux[b]
        else:
            d_img, d_txt, share = _clip_swept_grads(img, txt, s, row_lse, col_lse, aux, kept, sw, o)
        k = coef * s * o.factor
        d_img.mul_(k)
        d_txt.mul_(k)
        # this rank's share of the sum of the E[S'] - S'_ii terms (see clip_terms); the shares
        # of all ranks add up to the whole batch's
        d_scale = coef * share * o.factor
    if o.eps:
        img_sum, txt_sum = aux[b + 2:b + 2 + d], aux[b + 2 + d:]
        # the global term -2 eps / B <sum I, sum T>: each rank takes 1/N of it
        d_scale = d_scale + coef * o.factor * 2 * o.eps * (
            aux[b + 1] - torch.dot(img_sum, txt_sum) / n_global / sw.world)
    return d_img, d_txt, d_scale


# ----------------------------------------------------------------------------------------------
# SigLIP
# ----------------------------------------------------------------------------------------------
def siglip_forward(img, txt, s, bias, sw: Sweep, o: Options) -> tuple:
    """The statistics sweep: (loss [], kept): the kept S' (in-place triton, ``o.keep``), the
    gathered column block (gathers_columns) or None."""
    b = img.shape[0]
    row_offset = sw.rank * b
    row_loss = kept = None

    def step(col_offset, held):
        # the positives (global row == global column) sit at i - j == col_offset - row_offset
        nonlocal row_loss, kept
        diag = col_offset - row_offset
        if o.impl == "triton":
            part, kept = triton_kernels().siglip_stats_triton(img, held[0], s, bias, diag,
                                                         keep_logits=o.keep, band=o.block_m,
                                                         allow_tf32=o.allow_tf32)
        else:
            part = siglip_stats(img, held[0], s, bias, diag, **o.kw)
        row_loss = part if row_loss is None else row_loss.add_(part)
        return []

    _, full = sw.columns([txt], step)
    share = row_loss.sum() / (sw.world * b)
    if o.impl != "triton":  # (the triton kernels fold this into their sums)
        ok = _finite(rownorm(img), rownorm(txt), s, bias)
        share = torch.where(ok, share, torch.full_like(share, math.nan))
    (loss,) = _sum_over_ranks(sw, share)
    return loss, (full[0] if full is not None else kept)


def _siglip_own_block_grads(coef, img, txt, s, bias, logits, o: Options):
    """An in-place sweep's one block, scaled by k = coef s: (d_img, d_txt, sum G, sum G S'), the
    gradients finished (folds_coefficients: k folded into G before its rounding in the kernel;
    otherwise fp32 times k after)."""
    if o.impl != "triton":
        k = coef * s
        d_img = torch.empty_like(img)

        def finish_img(i0, i1, rows):
            d_img[i0:i1] = rows.mul_(k)

        _, d_txt, gsum, gwsum = siglip_grads(img, txt, s, bias, 0, **o.kw, sink_a=finish_img)
        return d_img, d_txt.mul_(k), gsum, gwsum
    fold = folds_coefficients(True, o.impl, img.dtype)
    kept = logits if logits is not None and logits.numel() else None
    out = triton_kernels().siglip_grads_triton(
        img, txt, s, bias, 0, coef=coef if fold else None, coef_scale=fold, logits=kept,
        band=o.block_m, out_dtype=img.dtype if fold else torch.float32, allow_tf32=o.allow_tf32)
    if not fold:
        k = coef * s
        for grad in out[:2]:  # d_img, d_txt (fp32)
            grad.mul_(k)
    return out


def _siglip_swept_grads(img, txt, s, bias, kept_text, sw: Sweep, o: Options, row_loss=None):
    """The gradient sweep: (G @ T rows [b, D], G^T @ I of this rank's columns [b, D], both fp32
    without k, sum G, sum G S'); with ``row_loss`` ([b] fp32) the pair losses of the same
    blocks are added to it."""
    b = img.shape[0]
    row_offset = sw.rank * b
    rows = [torch.zeros(img.shape, dtype=torch.float32, device=img.device),
            img.new_zeros((), dtype=torch.float32), img.new_zeros((), dtype=torch.float32)]
    sink, width = _adding_into(rows[0]), _sweep_width(sw, b)

    def step(col_offset, held):
        out = siglip_grads(img, held[0], s, bias, col_offset - row_offset, **o.kw,
                           with_loss=row_loss is not None, width=width, sink_a=sink)
        if row_loss is not None:
            row_loss.add_(out[0])
        _, grad_b, gsum, gwsum = out[-4:]
        rows[1] += gsum
        rows[2] += gwsum
        return [grad_b]

    gathered = sw.gathers_columns and kept_text is not None and kept_text.numel()
    reuse = [kept_text] if gathered else None
    (d_txt,), _ = sw.columns([txt], step, "sum", reuse)
    return rows[0], d_txt, rows[1], rows[2]


def siglip_forward_with_grads(img, txt, s, bias, sw: Sweep, o: Options) -> tuple:
    """One sweep for the loss and the gradients (a forward whose backward will follow): (loss,
    d_img, d_txt, sums [2] = (sum G S', sum G)). The gradients are those of an upstream gradient
    of 1, finished where folds_coefficients (k = s / B), otherwise fp32 without k;
    :func:`siglip_backward_from_forward` scales them. In place the triton impl runs the block's
    gradient pass and one finishing launch (loss and sums), nothing else."""
    b = img.shape[0]
    n_global = sw.world * b
    if sw.in_place and o.impl == "triton":
        fold = folds_coefficients(True, o.impl, img.dtype)
        return _own_block(sw, [txt], lambda held: triton_kernels().siglip_loss_grads_triton(
            img, held[0], s, bias, n_global, coef=1.0 / n_global if fold else None,
            coef_scale=fold, band=o.block_m, out_dtype=img.dtype if fold else torch.float32,
            allow_tf32=o.allow_tf32))
    row_loss = torch.zeros(b, dtype=torch.float32, device=img.device)
    d_img, d_txt, gsum, gwsum = _siglip_swept_grads(img, txt, s, bias, None, sw, o, row_loss)
    (loss,) = _sum_over_ranks(sw, row_loss.sum() / n_global)
    return loss, d_img, d_txt, torch.stack([gwsum, gsum])


def siglip_backward_from_forward(g, s, dtype, d_img, d_txt, sums, sw: Sweep, o: Options) -> tuple:
    """(d_img, d_txt, d_scale, d_bias) from :func:`siglip_forward_with_grads`' results for
    features of ``dtype``, times the upstream gradient (and c); new tensors (the saved ones stay
    intact: a backward may run twice). The triton impl does it in one launch, with the fp32
    arithmetic of the torch ops below as they run on the CPU (on CUDA, eager torch rounds a 0-dim
    fp32 k to bf16 before a bf16 product and divides by a number through its reciprocal; the
    kernel keeps k in fp32 and divides)."""
    n_global = sw.world * d_img.shape[0]
    folded = folds_coefficients(sw.in_place, o.impl, dtype)
    if o.impl == "triton":
        return triton_kernels().scale_grads_triton(
            g, d_img, d_txt, n_global, factor=o.factor, scale=None if folded else s,
            scalars=(sums[0], sums[1]), out_dtype=dtype)
    coef = g / n_global
    if o.factor != 1:
        coef = coef * o.factor
    k = g if folded else coef * s
    return d_img * k, d_txt * k, coef * sums[0], coef * sums[1]


def siglip_backward(g, img, txt, s, bias, kept, sw: Sweep, o: Options) -> tuple:
    """The gradient sweep of a forward that took none: (d_img, d_txt, d_scale, d_bias), times c;
    ``kept``: the forward's."""
    coef = g / (sw.world * img.shape[0])
    if sw.in_place:
        d_img, d_txt, gsum, gwsum = _own_block(sw, [txt], lambda held: _siglip_own_block_grads(
            coef, img, held[0], s, bias, kept, o))
        return d_img, d_txt, coef * gwsum, coef * gsum
    d_img, d_txt, gsum, gwsum = _siglip_swept_grads(img, txt, s, bias, kept, sw, o)
    coef = coef * o.factor
    k = coef * s
    return d_img.mul_(k), d_txt.mul_(k), coef * gwsum, coef * gsum
