"""Each whole tower as ZeRO-3's unit (``model.zero3_leaf_layers: "tower"``): DeepSpeed's module
hooks on three modules (the model and its two towers) instead of twenty, one parameter fetch per
tower and step.

Why: with each tower's stack of blocks as the unit (``"stack"``, pipeline/model/layer_stack.py) ZeRO-3
still hooks every module outside the stacks (the tower wrappers, embeddings, layer norms,
projections: 18 of the 20 hooked modules), each with a fetch before and a release after its
forward and again around its backward. On an H200 (ViT-B/32, micro-batch 256) that step is bound
by the host at 0.55-0.62x ZeRO-2.

How: :meth:`pipeline.model.model.CLIPTowers.route_towers` gives each tower module (transformers'
``CLIP*ModelWithProjection``) a forward of its own that computes the project's features from
positional tensors (pixel values; token ids and mask), so that the model's call of a tower is a
call of the unit. Inside a unit DeepSpeed puts no hooks; the layer stacks still run as one
compiled graph each (their views bound after the tower's gather).

DeepSpeed reduces a unit's gradients in a full backward hook on it, which torch fires once the
gradients of the unit's tensor inputs are computed. A tower's inputs (pixels, token ids) take no
gradient, so torch fires it as soon as the features' gradient arrives, before the tower's backward
has run: DeepSpeed would reduce zeros. :func:`reduce_when_accumulated` takes that hook off and
calls the same reduction (DeepSpeed's closure) once every parameter of the tower has accumulated
its gradient (post-accumulate-grad hooks): per backward of the tower, as the full hook meant. A
step whose backward left a tower short (a parameter that got no gradient) is refused before the
optimizer step, naming the parameters.

Limits: DeepSpeed releases a unit's gathered weights after its backward only when one of its
inputs has a gradient; a tower's stay gathered until the optimizer step, where DeepSpeed
partitions every parameter (on N ranks each rank holds both towers' weights through the backward:
ViT-B/32 0.3 GB, ViT-L/14 0.86 GB in bf16). A parameter used twice in one backward of its tower
(accumulated twice) is refused; the towers use each once, with or without checkpointing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List

from torch import nn

__all__ = ["TowerReduction", "reduce_when_accumulated"]


class TowerReduction:
    """DeepSpeed's gradient reduction of one tower unit, run when all of the tower's trainable
    parameters have accumulated their gradient since the last run."""

    def __init__(self, name: str, tower: nn.Module, reduce: Callable) -> None:
        self.name, self.tower, self.reduce = name, tower, reduce
        named = [(n, p) for n, p in tower.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.accumulated: set = set()
        self.handles = [p.register_post_accumulate_grad_hook(functools.partial(self._accumulated, i))
                        for i, (_, p) in enumerate(named)]

    def _accumulated(self, index: int, param: Any) -> None:
        if index in self.accumulated:
            raise RuntimeError(f"ZeRO-3 tower unit '{self.name}': parameter '{self.names[index]}' accumulated a "
                               "gradient twice in one backward of the tower; use model.zero3_leaf_layers "
                               "\"stack\" for a model that reuses a parameter")
        self.accumulated.add(index)
        if len(self.accumulated) == len(self.names):
            self.accumulated.clear()
            self.reduce(self.tower, None, None)

    def check_complete(self) -> None:
        """Raise if a backward left this tower's reduction waiting (some parameters never got a
        gradient): their gradients would never reach the optimizer."""
        if self.accumulated:
            missing = [n for i, n in enumerate(self.names) if i not in self.accumulated]
            self.accumulated.clear()
            raise RuntimeError(f"ZeRO-3 tower unit '{self.name}': {len(missing)} parameters got no gradient in the "
                               f"last backward ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}), so "
                               "the tower's gradients were not reduced; use model.zero3_leaf_layers \"stack\" when "
                               "a tower's parameters go unused")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _leaf_hook(optimizer: Any, tower: nn.Module):
    """(handle, hook) of DeepSpeed's full backward hook that reduces ``tower``'s gradients."""
    found = [h for h in getattr(optimizer, "_leaf_module_hooks", [])
             if h.hooks_dict_ref() is tower._backward_hooks and h.id in tower._backward_hooks]
    if len(found) != 1:
        raise RuntimeError(f"expected one DeepSpeed leaf-module hook on {type(tower).__name__}, found {len(found)} "
                           "(DeepSpeed's ZeRO-3 optimizer keeps them in _leaf_module_hooks)")
    return found[0], tower._backward_hooks[found[0].id]


def reduce_when_accumulated(engine: Any) -> List[TowerReduction]:
    """For each tower unit of ``engine``'s model (``CLIPTowers.tower_units()``: ZeRO-3 leaf
    modules called with inputs that take no gradient): move DeepSpeed's gradient reduction from
    the tower's full backward hook to the moment its last parameter gradient accumulates, and
    check at each optimizer step that no backward left one waiting. Returns the reductions (none,
    and nothing changed, for a model without tower units)."""
    towers = engine.module.tower_units()
    if not towers:
        return []
    optimizer = engine.optimizer
    reductions = []
    for name, tower in towers:
        handle, hook = _leaf_hook(optimizer, tower)
        handle.remove()
        optimizer._leaf_module_hooks.remove(handle)
        reductions.append(TowerReduction(name, tower, hook))
    step = optimizer.step

    def checked_step(*args, **kwargs):
        for reduction in reductions:
            reduction.check_complete()
        return step(*args, **kwargs)

    optimizer.step = checked_step
    return reductions
