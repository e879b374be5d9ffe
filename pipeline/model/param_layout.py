"""How the towers' parameters are grouped: into the optimizer's parameter groups, and into the
units ZeRO-3 gathers at once.

Design: :func:`param_groups` splits decayed matrices from undecayed 1-D parameters and puts each
group's odd-sized parameters last, so that DeepSpeed's flat buffers keep every tower weight
16-byte aligned (:func:`misaligned_parameters` checks). :func:`mark_zero3_leaf_layers` flags
ZeRO-3's leaf modules (``model.zero3_leaf_layers``): each transformer block, each tower's stack
of blocks (:mod:`pipeline.model.layer_stack`) or each whole tower (:mod:`pipeline.engine.tower_unit`). Both
read only the model object (its modules and parameters; for whole towers its ``cfg`` and
:meth:`~pipeline.model.model.CLIPTowers.route_towers`), so this module does not import
:mod:`pipeline.model.model`, which imports it.
"""

from __future__ import annotations

import math
import typing

from torch import nn

from .layer_stack import route_through_stack

__all__ = ["param_groups", "misaligned_parameters", "mark_zero3_leaf_layers", "encoder_layers"]


def param_groups(model: nn.Module, decay_1d: bool = False) -> list[dict]:
    """The optimizer's parameter groups: weight decay on matrices (>= 2-D), none on 1-D
    parameters (biases, norms, logit scale/bias) unless ``decay_1d``.

    Within each group, parameters whose size is not a multiple of 8 elements come last.
    DeepSpeed (bf16 / ZeRO 1-2) packs each group into one flat buffer in this order, and every
    parameter is a view into it: two 1-element parameters (the logit scale and bias) at the
    front left every tower weight 4 bytes off 16-byte alignment, which sends cuBLAS to its slow
    unaligned GEMM kernels and the norm/elementwise kernels to their scalar paths (a ViT-B/32
    step ran 3-4x slower on an H200)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            shape = getattr(p, "ds_shape", p.shape)  # a zero.Init parameter's own data is its shard
            matrix = getattr(p, "infclip_weight_decay", len(shape) >= 2)  # a flat parameter says
            (decay if matrix or decay_1d else no_decay).append(p)

    def aligned_first(params: list) -> list:
        return sorted(params, key=lambda p: math.prod(getattr(p, "ds_shape", p.shape)) % 8 != 0)

    groups = [{"params": aligned_first(decay)}]
    if no_decay:
        groups.append({"params": aligned_first(no_decay), "weight_decay": 0.0})
    return groups


def misaligned_parameters(model: nn.Module, alignment: int = 16) -> list[str]:
    """Names of parameters of more than one element whose storage does not start on an
    ``alignment``-byte boundary (slow kernels; see :func:`param_groups`)."""
    return [n for n, p in model.named_parameters() if p.numel() > 1 and p.data_ptr() % alignment]


def encoder_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("EncoderLayer")]


def _encoders(model: nn.Module) -> list[nn.Module]:
    """transformers' encoders (a ``layers`` list of ``*EncoderLayer`` blocks) in ``model``."""
    return [m for m in model.modules() if type(m).__name__.endswith("Encoder")
            and isinstance(getattr(m, "layers", None), nn.ModuleList)]


def mark_zero3_leaf_layers(model: nn.Module, unit: typing.Union[bool, str] = True) -> int:
    """Flag DeepSpeed ZeRO-3 leaf modules in ``model``, whose parameters are gathered and
    released as one unit (call before ``deepspeed.initialize``): each HF transformer block
    (``*EncoderLayer``), with ``unit="stack"`` each encoder's whole stack of blocks, routed
    through :func:`pipeline.model.layer_stack.route_through_stack`, with ``unit="tower"`` each tower of
    a :class:`CLIPTowers` (:meth:`CLIPTowers.route_towers`; its stacks routed too, for one graph
    each; after ``deepspeed.initialize`` call :func:`pipeline.engine.tower_unit.reduce_when_accumulated`).
    Returns how many were flagged."""
    from deepspeed.utils import set_z3_leaf_module

    if unit == "tower":
        if model.cfg.flat_parameters != "tower":  # a flat tower compiles whole, its stack inside
            for encoder in _encoders(model):
                route_through_stack(encoder)
        leaves = model.route_towers()
    elif unit == "stack":
        leaves = [route_through_stack(e) for e in _encoders(model)]
    else:
        leaves = encoder_layers(model)
    for leaf in leaves:
        set_z3_leaf_module(leaf, True)
    return len(leaves)
