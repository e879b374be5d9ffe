"""The registered op ``infclip::contrastive_loss``: one op for every scheme, its backward op, fake
kernels and autograd.

One role: registration. The op takes the scheme as plain values (its name, the process group's
``group_name``, the ranks per node: a registered op's schema takes primitives only), turns them
back into the :class:`ops.sweeps.Scheme` the public API parsed, once per call at its boundary
(:func:`ops.sweeps.scheme_of`, cached per distinct value), hands that object to the forward,
backward and fake kernels, builds the sweep from it and calls the loss assembly
(ops/assembly.py), so torch.compile sees one opaque op with a shape rule for the single-device
loss and every distributed scheme alike, not a graph break.

Defined through torch.library.Library rather than the custom_op decorator: the decorator's Python
wrapper (aliasing checks, dynamo guards) cost ~0.2-0.3 ms of host time per call on the H200
machine's host, a third of a whole call at B = 1,024. The autograd is hand-written for the same
reason (:class:`_Function`).

Outputs of the forward op: (loss [], row_lse, col_lse, aux, kept); all but the loss feed the
backward op (empty where there is none: see ops/assembly.clip_forward; ``kept`` is the kept S'
on one device, the gathered features under disco and gather). SigLIP with ``grads_in_forward`` (the caller's promise that a
backward follows) returns (loss, d_img, d_txt, sums [2], then empty) instead
(ops/assembly.siglip_forward_with_grads).
The op runs collectives inside its kernel for the distributed schemes: under torch.compile every
rank must run the same compiled graph (as data-parallel training does). With ``graph_max_batch``
set (0 by default), on one CUDA device, a call of up to that many rows on an idle stream replays
CUDA graphs of its forward and backward kernels, captured at the first such call of each shape and
options (ops/graphs.py; :func:`_graphed` says when).
"""

from __future__ import annotations

import collections
import contextlib
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import assembly
from .config import DEFAULT_GRAPH_MAX_BATCH
from .graphs import GraphCache, tensor_key
from .sweeps import Scheme, Sweep, resolve_group, scheme_of

__all__ = ["OP", "OP_BACKWARD", "scheme_args"]

_LIB = torch.library.Library("infclip", "FRAGMENT")
_SCHEME_ARGS = ('str scheme="none", str group_name="", int local_world_size=0, '
                f'str grad_reduction="mean", int graph_max_batch={DEFAULT_GRAPH_MAX_BATCH}')
_LIB.define("contrastive_loss(Tensor image_features, Tensor text_features, Tensor logit_scale, "
            "Tensor? logit_bias, str loss, str impl, float label_smoothing, int block_m, "
            "int block_n, bool allow_tf32, float logits_budget_mb=0.0, "
            "bool grads_in_forward=False, " + _SCHEME_ARGS + ") -> "
            "(Tensor, Tensor, Tensor, Tensor, Tensor)")
_LIB.define("contrastive_loss_backward(Tensor grad, Tensor image_features, Tensor text_features, "
            "Tensor logit_scale, Tensor? logit_bias, Tensor row_lse, Tensor col_lse, Tensor aux, "
            "Tensor kept, str loss, "
            "str impl, float label_smoothing, int block_m, int block_n, bool allow_tf32, "
            + _SCHEME_ARGS + ") -> (Tensor, Tensor, Tensor, Tensor)")

# the forward op's arguments after the four tensors, with their defaults (the dispatcher leaves
# trailing defaults out)
_DEFAULTS = (None, None, None, None, None, None, 0.0, False, "none", "", 0, "mean",
             DEFAULT_GRAPH_MAX_BATCH)
_OPTIONS = slice(0, 6)  # loss, impl, label_smoothing, block_m, block_n, allow_tf32
_SCHEME = slice(8, 13)  # scheme, group_name, local_world_size, grad_reduction, graph_max_batch
_SCHEME_NAME = slice(8, 11)  # the Scheme's three fields
_GRAPHS = GraphCache()
_REPLAYED: collections.deque = collections.deque(maxlen=16)  # see _forward_replayed


def _full(options: tuple) -> tuple:
    return tuple(options) + _DEFAULTS[len(options):]


def scheme_args(scheme: Scheme, grad_reduction: str = "mean",
                graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH) -> tuple:
    """The op's trailing arguments for ``scheme``: on one device none (their defaults: fewer for
    the dispatcher to parse) unless ``graph_max_batch`` is not its default, which then follows
    the defaults of the scheme's four; otherwise the scheme's values and ``grad_reduction`` (CUDA
    graphs are for one device only: collectives stay eager)."""
    if scheme.local:
        if graph_max_batch == DEFAULT_GRAPH_MAX_BATCH:
            return ()
        return _DEFAULTS[_SCHEME][:4] + (int(graph_max_batch),)
    return (scheme.name, scheme.group_name, scheme.local_world_size, grad_reduction)


def _scheme(options: tuple) -> Scheme:
    """The scheme of the op's full arguments (the string parsed once per distinct value)."""
    return scheme_of(*options[_SCHEME_NAME])


def _setup(image_features, options: tuple, scheme: Scheme, grad_reduction: str, budget_mb: float
           ) -> tuple[Sweep, assembly.Options]:
    """The call's sweep and options (what to keep of S' decided for this batch)."""
    loss, impl, eps, block_m, block_n, allow_tf32 = options
    sw = scheme.make_sweep()
    keep = ""
    if sw.in_place:
        keep = assembly.keep_logits(impl, image_features.shape[0], image_features.dtype,
                                    int(block_m), budget_mb)
    factor = float(sw.world if grad_reduction == "mean" else 1)
    return sw, assembly.Options(loss, impl, float(eps), bool(allow_tf32), int(block_m),
                                int(block_n), factor, keep)


def _empty_unless(values: tuple, like: Tensor) -> tuple:
    """None outputs as empty tensors, each its own (outputs must not alias)."""
    return tuple([x if x is not None else like.new_empty(0) for x in values])


def _graphed(image_features: Tensor, options: tuple, scheme: Scheme,
             forward_replayed: bool = False) -> bool:
    """Whether this call replays a CUDA graph (ops/graphs.py): one device (no collectives),
    CUDA, at most ``graph_max_batch`` rows, not inside another capture, and nothing queued on
    the stream, or (a backward) its forward replayed. With work queued ahead (a model's forward,
    in training) the eager launches hide behind it and the replay's copies would only add GPU
    time (~0.05 ms a forward + backward at B = 1,024 on an H200); on an idle stream the call waits
    on its host, which the replay cuts. A backward right after a replayed forward finds the
    forward still running on the GPU: it replays too."""
    return (scheme.local and image_features.is_cuda
            and 0 < image_features.shape[0] <= options[12]
            and not torch.cuda.is_current_stream_capturing()
            and (forward_replayed or torch.cuda.current_stream(image_features.device).query()))


def _forward_replayed(saved: Tensor) -> bool:
    """Whether ``saved`` (the forward's second output) came from a replayed forward (the
    addresses of the last few are kept; an address reused by an eager forward only makes its
    backward replay too, which gives the same numbers)."""
    if saved.numel() and saved.data_ptr() in _REPLAYED:
        _REPLAYED.remove(saved.data_ptr())
        return True
    return False


def _forward(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
             logit_bias: Optional[Tensor], *options) -> tuple:
    options = _full(options)
    scheme = _scheme(options)
    tensors = (image_features, text_features, logit_scale, logit_bias)
    if _graphed(image_features, options, scheme):
        out = _GRAPHS.call(("forward", tensor_key(tensors), options),
                           lambda *t: _forward_eager(*t, options, scheme), tensors)
        if out[1].numel():
            _REPLAYED.append(out[1].data_ptr())
        return out
    return _forward_eager(*tensors, options, scheme)


def _forward_eager(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                   logit_bias: Optional[Tensor], options: tuple, scheme: Scheme) -> tuple:
    eager = assembly.grads_in_forward(options[0], bool(options[7]))
    # (the forward that takes the gradients keeps no S' for the backward)
    sw, o = _setup(image_features, options[_OPTIONS], scheme, options[11],
                   0.0 if eager else float(options[6]))
    sw.check_sizes(image_features)
    s = logit_scale.detach().float().reshape(())
    bias = logit_bias.detach().float().reshape(()) if o.loss == "siglip" else None
    args = (image_features, text_features, s)
    if o.loss == "clip":
        out = assembly.clip_forward(*args, sw, o)
    elif eager:
        out = assembly.siglip_forward_with_grads(*args, bias, sw, o) + (None,)
    else:
        loss, kept = assembly.siglip_forward(*args, bias, sw, o)
        out = (loss, None, None, None, kept)
    return _empty_unless(out, image_features)


@torch.library.register_fake("infclip::contrastive_loss", lib=_LIB)
def _(image_features, text_features, logit_scale, logit_bias, *options):
    options = _full(options)
    loss, impl, eps, block_m = options[:4]
    scheme = _scheme(options)
    cls = scheme.sweep_class
    b, d = image_features.shape
    n = b if cls.in_place else b * dist.get_world_size(resolve_group(scheme.group_name))
    new = image_features.new_empty
    f32 = torch.float32
    if assembly.grads_in_forward(loss, bool(options[7])):
        folds = assembly.folds_coefficients(cls.in_place, impl, image_features.dtype)
        dtype = image_features.dtype if folds else f32
        return (new((), dtype=f32), new((b, d), dtype=dtype), new((b, d), dtype=dtype),
                new((2,), dtype=f32), new((0,)))
    clip = loss == "clip"
    keep = ""
    if cls.in_place:
        keep = assembly.keep_logits(impl, b, image_features.dtype, int(block_m), float(options[6]))
    m = b if clip else 0
    aux = (b + 2 + (2 * d if eps else 0)) if clip else 0
    if keep:
        kept = new((n, n), dtype=f32 if keep == "whole" else None)
    elif clip and cls.gathers_rows:
        kept = new((2, n, d))
    else:
        kept = new((n, d) if cls.gathers_columns else (0,))
    return (new((), dtype=f32), new((m,), dtype=f32), new((m,), dtype=f32), new((aux,), dtype=f32),
            kept)


def _backward(grad: Tensor, image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
              logit_bias: Optional[Tensor], row_lse: Tensor, col_lse: Tensor, aux: Tensor,
              kept: Tensor, *options) -> tuple:
    """Returns (d_image [b, D], d_text [b, D], d_scale like logit_scale, d_bias like logit_bias
    or empty), each times the convention's factor c."""
    options = _full(tuple(options[:6]) + (0.0, False) + tuple(options[6:]))
    scheme = _scheme(options)
    tensors = (grad, image_features, text_features, logit_scale, logit_bias, row_lse, col_lse,
               aux, kept)
    if _graphed(image_features, options, scheme, _forward_replayed(row_lse)):
        return _GRAPHS.call(("backward", tensor_key(tensors), options),
                            lambda *t: _backward_eager(*t, options, scheme), tensors)
    return _backward_eager(*tensors, options, scheme)


def _backward_eager(grad: Tensor, image_features: Tensor, text_features: Tensor,
                    logit_scale: Tensor, logit_bias: Optional[Tensor], row_lse: Tensor,
                    col_lse: Tensor, aux: Tensor, kept: Tensor, options: tuple,
                    scheme: Scheme) -> tuple:
    sw, o = _setup(image_features, options[_OPTIONS], scheme, options[11], 0.0)
    s = logit_scale.detach().float().reshape(())
    g = grad.float().reshape(())
    args = (image_features, text_features, s)
    if o.loss == "clip":
        d_img, d_txt, d_scale = assembly.clip_backward(g, *args, row_lse, col_lse, aux, kept, sw, o)
        d_bias = logit_scale.new_empty(0)
    else:
        if row_lse.dim() == 2:  # the forward took the gradients (siglip_forward_with_grads)
            d_img, d_txt, d_scale, d_bias = assembly.siglip_backward_from_forward(
                g, s, image_features.dtype, row_lse, col_lse, aux, sw, o)
        else:
            bias = logit_bias.detach().float().reshape(())
            d_img, d_txt, d_scale, d_bias = assembly.siglip_backward(g, *args, bias, kept, sw, o)
        d_bias = d_bias.reshape(logit_bias.shape).to(logit_bias.dtype)
    return (d_img.to(image_features.dtype), d_txt.to(text_features.dtype),
            d_scale.reshape(logit_scale.shape).to(logit_scale.dtype), d_bias)


@torch.library.register_fake("infclip::contrastive_loss_backward", lib=_LIB)
def _(grad, image_features, text_features, logit_scale, logit_bias, *rest):
    loss = rest[4]
    d_bias = (torch.empty_like(logit_bias) if loss == "siglip" and logit_bias is not None
              else logit_scale.new_empty(0))
    return (torch.empty_like(image_features), torch.empty_like(text_features),
            torch.empty_like(logit_scale), d_bias)


class _Function(torch.autograd.Function):
    """The op's autograd: runs the op below autograd and saves what its backward op needs.

    Hand-written rather than torch.library.register_autograd, whose per-call Python (argument
    defaults filled back in, pytree work, a generated Function with metadata) showed in the
    host profile at B = 1,024 (bench_contrastive_loss.py --host-profile). ``args`` are the op's
    arguments as the dispatcher passes them (trailing defaults may be left out). Once
    differentiable: the backward op has no derivative, so gradients taken with create_graph=True
    come out of a node that raises when differentiated (:class:`_NoSecondOrder`)."""

    @staticmethod
    def forward(ctx, keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out = OP.redispatch(keyset & torch._C._after_autograd_keyset, *args)
        # the outputs besides the loss only feed the backward: without this autograd would
        # allocate and zero-fill a gradient for each of them (the kept [B, B] logits or gathered
        # features among them) per call
        ctx.mark_non_differentiable(*out[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*args[:4], *out[1:])
        options = _full(args[4:])
        ctx.options = options[_OPTIONS] + options[_SCHEME]
        ctx.count = len(args)
        return out

    @staticmethod
    def backward(ctx, grad_loss, *_grad_saved):
        saved = ctx.saved_tensors
        second_order = torch.is_grad_enabled()  # create_graph=True
        with torch.set_grad_enabled(False) if second_order else contextlib.nullcontext():
            d_img, d_txt, d_scale, d_bias = OP_BACKWARD(grad_loss, *saved, *ctx.options)
        grads = (d_img, d_txt, d_scale, d_bias if saved[3] is not None else None)
        if second_order:  # (the backward op has no autograd of its own)
            grads = _NoSecondOrder.apply(4, *saved[:4], *grads)
        return (None, *grads) + (None,) * (ctx.count - 4)


class _NoSecondOrder(torch.autograd.Function):
    """The gradients of a backward run with create_graph=True, as the outputs of a node that
    depends on the op's inputs and whose backward raises RuntimeError naming the op: a second
    derivative fails where it is taken, instead of giving numbers that leave this op out."""

    @staticmethod
    def forward(ctx, count, *tensors):
        return tuple(t.detach() if t is not None else None for t in tensors[count:])

    @staticmethod
    def backward(ctx, *_grads):
        raise RuntimeError("infclip::contrastive_loss has no second-order gradient: its backward "
                           "is not differentiable (gradients taken with create_graph=True cannot "
                           "be differentiated again)")


def _autograd_kernel(keyset, *args):
    """The op's Autograd kernel: a graph node only when a gradient can flow."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args[:4]):
        return _Function.apply(keyset, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return OP.redispatch(keyset & torch._C._after_autograd_keyset, *args)


_LIB.impl("contrastive_loss", _forward, "CompositeExplicitAutograd")
_LIB.impl("contrastive_loss_backward", _backward, "CompositeExplicitAutograd")
_LIB.impl("contrastive_loss", _autograd_kernel, "Autograd", with_keyset=True)
OP = torch.ops.infclip.contrastive_loss.default
OP_BACKWARD = torch.ops.infclip.contrastive_loss_backward.default
