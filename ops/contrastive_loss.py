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
They return results that merge by plain addition, which is what the distributed schemes send
round the ring:
    clip_stats    -> row/col sums of exp(S - shift) and of exp(S - shift) (S' - ref), without
                     the positive pairs
    clip_grads    -> P @ Bm and P^T @ A, with P = exp(S - r) + exp(S - c) for final LSEs r, c,
                     less the label terms (taken inside the tile, before any rounding)
    siglip_stats  -> per-row sums of softplus(-z x)
    siglip_grads  -> G @ Bm, G^T @ A, sum(G), sum(G * S') with G = -z sigmoid(-z x)
Shifts and assembly (:func:`clip_shifts`, :func:`clip_terms`). Every LSE is taken relative to a
fixed per-row/column shift instead of a running max, so partial sums add with no rescaling.
The shift is the diagonal logit d_i = S_ii unless the Cauchy-Schwarz bound |s| |I_i| max_j |T_j|
exceeds it by more than 64; then it is that bound - 64. So no term exceeds e^64 (no overflow).
Where that leaves the shift more than SHIFT_SLACK (48) above d_i, the bound says too little of
the row's sum (its every logit may lie far below the bound, and underflow), so the shift becomes
the row's true maximum, from one pass over that row's logits (on one device in the shift launch
itself, programs with no such row doing nothing more; elsewhere by a sweep of block maxima that
runs only when some rank has such a row). Then the sum is at least e^-48 and what underflow
drops is below fp32's resolution of it. The positive pair is left out of the sums and added
analytically: with off_i = sum_{j != i} exp(S_ij - shift_i) and delta_i = shift_i - d_i >= 0,
    loss_i = LSE_i - d_i = log1p(off_i)                  (delta_i = 0, the normal case)
                         = softplus(log(off_i) + delta_i) (otherwise),
so a loss of 1e-3 keeps fp32's relative precision (LSE - d would cancel it away); the d-scale
term E_i[S'] - S'_ii likewise comes from sums weighted by (S' - S'_ii). Limit: the logit bound
|s| max|I| max|T| must be at most LOGIT_BOUND_LIMIT (2^20; above it the loss is NaN): each LSE is
one fp32 number of the logits' magnitude, so the gradients carry ~|S| 2^-24 in their exponents.

The files: ops/blocks.py (primitives), ops/contrastive_loss_triton.py (kernel launchers; the
kernels in ops/kernels_*.py, the knobs in ops/tuning.py), ops/sweeps.py
(which blocks meet and how partials travel: one class per scheme, one device included),
ops/assembly.py (the loss written once against a sweep), ops/registered.py (the one op,
``infclip::contrastive_loss``, for every scheme). This file: the reference and the public API. Implementations (same numbers within the tolerances of tests/ops): ``naive`` (one tile: the
whole matrix), ``chunked_torch`` (tiles of block_m x block_n in plain torch; any device),
``triton`` (ops/contrastive_loss_triton.py: cuBLAS GEMMs on row bands + Triton reductions;
keeps the whole B x B logit matrix, in fp32, from forward to backward when it fits in
``logits_budget_mb``). ``contrastive_loss_reference`` is an independent full-matrix statement
through torch autograd, the ground truth for tests.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .blocks import (
    LOGIT_BOUND_LIMIT,
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
from .config import DEFAULT_GRAPH_MAX_BATCH, DEFAULT_LOGITS_BUDGET_MB, ConfigError, ContrastiveLossConfig
from .registered import OP, scheme_args
from .sweeps import Scheme, choose_scheme

__all__ = [
    "contrastive_loss",
    "distributed_contrastive_loss",
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
                      grad_reduction: str, logits_budget_mb: float,
                      graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH) -> None:
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
    if isinstance(graph_max_batch, bool) or not isinstance(graph_max_batch, int) or graph_max_batch < 0:
        raise ValueError(f"graph_max_batch must be an integer >= 0 (0: never replay a CUDA graph), "
                         f"got {graph_max_batch!r}")


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
        raise TypeError(f"features must be float32, bfloat16 or float16 (every impl computes in "
                        f"fp32: upcast fp64 to fp32, or use contrastive_loss_reference for an fp64 "
                        f"reference), got {image_features.dtype}")
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
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a real floating-point tensor, got {value.dtype}")
    if loss == "siglip" and logit_bias is None:
        raise ValueError("loss 'siglip' needs logit_bias")
    if loss == "clip" and logit_bias is not None:
        raise ValueError("logit_bias applies to loss 'siglip' only (the CLIP loss has no bias)")
    if check_finite == "raise":  # one host-device sync for all inputs
        named = [("image_features", image_features), ("text_features", text_features),
                 ("logit_scale", logit_scale)]
        if loss == "siglip":
            named.append(("logit_bias", logit_bias))
        finite = torch.stack([torch.isfinite(value).all() for _, value in named]).float()
        bound = _logit_bound(image_features, text_features, logit_scale).reshape(1)
        *finite, bound = torch.cat([finite, bound]).tolist()
        if not all(finite):
            bad = [name for (name, _), ok in zip(named, finite) if not ok]
            raise FloatingPointError(f"{bad[0]} contains NaN or Inf")
        if loss == "clip" and bound > LOGIT_BOUND_LIMIT:
            raise ValueError(f"|logit_scale| max|image_features| max|text_features| = {bound:.4g} "
                             f"exceeds {LOGIT_BOUND_LIMIT:.4g}, the largest logit bound the CLIP "
                             f"loss takes (its loss would be NaN)")
    elif not isinstance(check_finite, bool):
        raise ValueError(f"check_finite must be True, False or 'raise', got {check_finite!r}")


def _logit_bound(image_features: Tensor, text_features: Tensor, logit_scale: Tensor) -> Tensor:
    """|s| max|I_i| max|T_j| (fp32 []): the bound on every logit that the CLIP shifts take."""
    return (logit_scale.detach().float().abs().reshape(()) * rownorm(image_features).max()
            * rownorm(text_features).max())


def contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                     logit_bias: Optional[Tensor] = None, *, loss: str = "clip", impl: str = "auto",
                     label_smoothing: float = 0.0, allow_tf32: bool = False, block_m: int = 0,
                     block_n: int = 0, triton_interpret: bool = False, distributed: Union[str, Scheme] = "none",
                     process_group=None, local_world_size: Optional[int] = None,
                     grad_reduction: str = "mean", check_finite: Union[bool, str] = True,
                     logits_budget_mb: float = DEFAULT_LOGITS_BUDGET_MB,
                     graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH) -> Tensor:
    """CLIP (or SigLIP) loss over the batch without materialising the B x B logits.

    image_features, text_features: [B, D] fp32/bf16/fp16, taken as given (not normalised here:
    a model normalises its own; any norm is exact); logit_scale: [] or [1], the real multiplier s
    (exp of the learnable log-scale; any sign), with gradient; logit_bias: [] or [1] (siglip
    only, an error with clip). The CLIP loss needs |s| max|I_i| max|T_j| <= 2^20
    (ops/blocks.LOGIT_BOUND_LIMIT; above, a NaN loss, or with check_finite="raise" a ValueError).
    Once differentiable: differentiating its gradients again raises RuntimeError. Returns a
    0-dim fp32 loss: CLIP = mean of the two cross-entropy directions (OpenCLIP's convention);
    SigLIP = sum of pair losses / B.

    check_finite: True (default) folds the check into the result on the device: NaN or Inf in
    the features, scale or bias give a NaN loss (no host sync: capturable in a CUDA graph and
    compiled without a graph break); "raise" raises FloatingPointError naming the input (one
    host sync); False skips it. logits_budget_mb: the triton impl keeps the [B, B] logit matrix
    between forward and backward when it fits (6 B^2 D FLOPs instead of 8; ops/config.py says
    how); 0, or a call that needs no gradient, never keeps it. block_m: torch impls' row tile;
    triton's rows per GEMM band (0: by memory). graph_max_batch: on one CUDA device, a batch of
    at most this many rows whose stream is idle runs its forward and backward as CUDA graphs,
    captured at the first such call of each shape and replayed after (ops/graphs.py: small calls
    on an idle GPU are bound by the host; behind queued work calls run eagerly); default 16,384;
    0: never (ops/config.py says when it pays).

    With ``distributed`` != "none" and a process group of more than one rank, the features are
    this rank's local batch and the loss is over the global batch (ops/assembly.py).
    ``distributed``: a scheme name, parsed here once a call, or a :class:`ops.sweeps.Scheme`
    already chosen (:func:`ops.sweeps.choose_scheme`; process_group and local_world_size unused).
    """
    _validate_options(loss, label_smoothing, block_m, block_n, grad_reduction, logits_budget_mb,
                      graph_max_batch)
    # the scheme string is parsed here, once (an unknown name fails whether or not a group is
    # there); Local unless a process group of more than one rank is given
    scheme = (distributed if isinstance(distributed, Scheme)
              else choose_scheme(distributed, process_group, local_world_size))
    _validate(image_features, text_features, logit_scale, logit_bias, loss, check_finite)
    impl_run, why = resolve_impl(impl, image_features.device, triton_interpret)
    if impl == "triton" and impl_run != "triton":
        warnings.warn(f"contrastive_loss: {why}", stacklevel=2)
    return _call(image_features, text_features, logit_scale, logit_bias, scheme, loss, impl_run,
                 label_smoothing, block_m, block_n, allow_tf32, grad_reduction, logits_budget_mb,
                 graph_max_batch)


def backward_follows(inputs) -> bool:
    """Whether autograd will call the loss's backward: grad enabled and an input requiring grad
    (the test the op's autograd kernel makes, in Python: dynamo cannot trace
    torch._C._any_requires_grad, and the entry points compile with fullgraph=True)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)


def _call(image_features, text_features, logit_scale, logit_bias, scheme: Scheme, loss, impl,
          label_smoothing, block_m, block_n, allow_tf32, grad_reduction, logits_budget_mb,
          graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH) -> Tensor:
    """The registered op on checked arguments; its loss output."""
    inputs = (image_features, text_features, logit_scale, logit_bias if loss == "siglip" else None)
    backward = backward_follows(inputs)
    if not backward:
        logits_budget_mb = 0.0  # no backward will come: nothing to keep for it
    out = OP(*inputs, loss, impl, float(label_smoothing), int(block_m), int(block_n),
             bool(allow_tf32), float(logits_budget_mb), backward,
             *scheme_args(scheme, grad_reduction, graph_max_batch))
    return out[0]


def distributed_contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                                 logit_bias: Optional[Tensor] = None, *,
                                 scheme: Union[str, Scheme] = "ring", loss: str = "clip",
                                 impl: str = "chunked_torch", label_smoothing: float = 0.0,
                                 allow_tf32: bool = False, block_m: int = 0, block_n: int = 0,
                                 process_group=None, local_world_size: Optional[int] = None,
                                 grad_reduction: str = "mean") -> Tensor:
    """The CLIP / SigLIP loss of the global batch spread over ``process_group``, by one scheme.

    image_features, text_features: [b, D] this rank's local batch (same b and D on every rank);
    logit_scale: [] or [1] (the multiplier); logit_bias: [] or [1] (siglip). ``scheme``: a name
    from ops.sweeps.SCHEMES (or "none": every block here), or a :class:`ops.sweeps.Scheme`
    already chosen (then ``process_group`` and ``local_world_size`` are ignored). ``impl`` must
    be an implementation that runs here ("naive", "chunked_torch", "triton"; resolve "auto"
    first). Returns the 0-dim fp32 loss of the global batch, identical on every rank; the
    gradient convention is in ops/assembly.py (``grad_reduction`` "mean" or "sum"). Runs the
    scheme even on a group of one rank (:func:`contrastive_loss` runs one device's loss there).
    """
    _validate_options(loss, label_smoothing, block_m, block_n, grad_reduction, 0.0)
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'naive', 'chunked_torch' or 'triton' (resolve 'auto' with "
                         f"ops.resolve_impl first), got {impl!r}")
    _validate(image_features, text_features, logit_scale, logit_bias, loss, False)
    if not isinstance(scheme, Scheme):
        scheme = choose_scheme(scheme, process_group, local_world_size, world_one_is_local=False)
    return _call(image_features, text_features, logit_scale, logit_bias, scheme, loss, impl,
                 label_smoothing, block_m, block_n, allow_tf32, grad_reduction, 0.0,
                 graph_max_batch=0)  # (scheme "none" too: this entry point stays eager)


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
            logits_budget_mb=cfg.logits_budget_mb, graph_max_batch=cfg.graph_max_batch)

    def extra_repr(self) -> str:
        cfg = self.config
        return f"loss={cfg.loss}, impl={cfg.impl} (ran: {self.resolved_impl}), distributed={cfg.distributed}"
