"""A tower's stack of transformer blocks as one module call: the unit ZeRO-3 gathers at once
(``model.zero3_leaf_layers: "stack"``) and, under torch.compile, one graph per tower.

Why: with each block a ZeRO-3 leaf, every block costs a parameter fetch, DeepSpeed's forward and
backward module hooks and, compiled, a call into AOT autograd's runtime of its own (~1 ms per
block per step on an H200's host): ViT-B/32 at micro-batch 256 ran at 0.36x ZeRO-2, bound by the
host. With the stack as the leaf there are two fetches and two compiled calls per step.

How: transformers' encoder (``CLIPEncoder``) runs its loop over the blocks inside its own forward
and is called with keywords (``inputs_embeds=...``), returning a ``ModelOutput``. DeepSpeed
reduces a leaf module's gradients in a full backward hook, which torch fires with the gradients
of the module's *positional* tensor inputs (with none it fires before the module's parameters
have their gradients). So the leaf is the encoder's ``layers`` (the ``ModuleList`` holding every
block), given a forward of its own, :class:`StackForward`: ``layers(inputs_embeds,
attention_mask, *other tensors)`` runs the encoder's own forward (its loop, unchanged) and
returns the last hidden state; the encoder's forward routes its call through it. Module names,
state dicts and the blocks are untouched.

Limits: the stack returns the last hidden state (transformers 5 collects per-layer outputs with
hooks on the blocks, which still run). The whole stack's weights are gathered at
once (a tower's weights live during its forward, and, as under ZeRO-2, from forward to backward
with flat parameters); its gradients are reduced when the tower's backward ends, so the
reduction overlaps the other tower's backward rather than the tower's own.
"""

from __future__ import annotations

import functools
from typing import List, Optional

from torch import Tensor, nn

__all__ = ["StackForward", "layer_stacks", "route_through_stack", "stack_forward"]


class StackForward:
    """``encoder.layers.forward``: the encoder's own forward with its tensor arguments passed
    positionally (so that module hooks see them), returning the last hidden state. ``inner`` is
    the encoder's class forward bound to it; :meth:`pipeline.model.model.CLIPTowers._compile` replaces
    it by a compiled one."""

    def __init__(self, encoder: nn.Module) -> None:
        self.inner = functools.partial(type(encoder).forward, encoder)

    def __call__(self, inputs_embeds: Tensor, attention_mask: Optional[Tensor] = None, *tensors: Tensor,
                 names: tuple = (), options: Optional[dict] = None) -> Tensor:
        out = self.inner(inputs_embeds, attention_mask=attention_mask, **dict(zip(names, tensors)), **(options or {}))
        return out[0]


def _routed_forward(encoder: nn.Module, inputs_embeds: Tensor, attention_mask: Optional[Tensor] = None, **kwargs):
    from transformers.modeling_outputs import BaseModelOutput

    # bare tensors only (CLIP's masks); a tensor inside a tuple would stay hidden from the hooks
    names = tuple(k for k, v in kwargs.items() if isinstance(v, Tensor))
    tensors = [kwargs.pop(k) for k in names]
    hidden = encoder.layers(inputs_embeds, attention_mask, *tensors, names=names, options=kwargs)
    return BaseModelOutput(last_hidden_state=hidden)


def route_through_stack(encoder: nn.Module) -> nn.Module:
    """Give ``encoder.layers`` a :class:`StackForward` and route ``encoder``'s calls through it;
    returns ``encoder.layers`` (idempotent)."""
    layers = encoder.layers
    if stack_forward(layers) is None:
        layers.forward = StackForward(encoder)
        encoder.forward = functools.partial(_routed_forward, encoder)
    return layers


def layer_stacks(model: nn.Module) -> List[nn.Module]:
    """The ``layers`` modules of ``model`` routed by :func:`route_through_stack`."""
    return [m for m in model.modules() if stack_forward(m) is not None]


def stack_forward(layers: nn.Module) -> Optional[StackForward]:
    """The :class:`StackForward` of a routed ``layers`` module (possibly inside a flat-parameter
    binding, ``pipeline.model.flat_params.BindingForward``), else None."""
    fn = layers.__dict__.get("forward")
    while fn is not None and not isinstance(fn, StackForward):
        fn = getattr(fn, "inner", None)
    return fn
