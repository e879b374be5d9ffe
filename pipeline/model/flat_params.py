"""Flat parameters: each transformer block's (or each whole tower's) weights held in two tensors.

Why: DeepSpeed's ZeRO stages do Python work for every parameter tensor in every step (a gradient
hook, a bucket copy, a norm term). The two ViT-B/32 towers have 399 tensors, and at micro-batch
256 that host work bounds the step (docs/benchmarks.md; ``bench/bench_host_overhead.py``
measures it: 53-84 ms per step with 399 tensors against 23-32 ms with 54 on a 2-core CPU).
With ``model.flat_parameters``, each block keeps its matrices in one parameter
(``flat_matrices``, weight decay) and its vectors in another (``flat_vectors``, no decay):
ViT-B/32 then has 63 tensors (2 x 24 for the blocks, 15 outside them) instead of 399.

How:
- the block's parameters are copied into the flat tensors and removed from their modules; each
  starts on a 64-element boundary, so every view is 128-byte aligned (fast GEMM and norm kernels);
- :func:`bind_views`, run by the model before every forward, sets each module attribute
  (``mlp.fc1.weight`` ...) to a view into the current flat tensor: autograd takes the gradients to
  the flat parameter, and DeepSpeed's replacement of a parameter's ``.data`` is followed. Views
  bound once serve the next forwards while the flat tensor, its memory and version are unchanged
  (:func:`_bound_key`);
- a state-dict hook on each block writes the original names, and a load hook packs them back, so
  checkpoints, exports and evaluation see the keys of an unflattened model; a dict with the flat
  names (consolidated from ZeRO optimizer partitions) is turned into them by
  :func:`expand_flat_entries`.

Under ZeRO-3 the flat tensors are partitioned and gathered block by block in DeepSpeed's module
hooks, so the views cannot be bound before the forward: :func:`bind_in_forward` makes each block
bind them inside its own forward (after DeepSpeed's gather) and drop them when it returns. A
partitioned flat tensor is never bound (:func:`bind_views` skips it). The price: autograd keeps the
views it saved for backward, so a block's gathered parameters stay in memory from its forward to
its backward (as under ZeRO-2; gradients and optimizer states stay partitioned), and ZeRO-3's
re-gather for the backward is not used. With each tower's stack of blocks as ZeRO-3's unit
(``pipeline/model/layer_stack.py``) the stack binds all of its blocks' views in its forward; a
checkpointed block's recomputation binds its own (:class:`BindingCheckpoint`). The towers must
be built whole (``model.zero3_init`` false) and partitioned by ``deepspeed.initialize``.

Whole towers (``model.flat_parameters: "tower"``): :func:`flatten_block` applied to each tower
instead of each block (its embeddings, layer norms and projection included): ViT-B/32 has 6
tensors. Under ZeRO-3 the tower is the unit that gathers them (``zero3_leaf_layers: "tower"``,
pipeline/engine/tower_unit.py) and binds their views in its forward (:class:`BindingForward` on the
tower), so that everything inside is one compiled graph, CUDA graphs included. Gradient
checkpointing is refused: transformers' (reentrant) recomputation of a block would add into the
tower's flat gradient once per block. The state-dict hook writes a tower's keys, buffers included,
in the order of the unflattened tower.

Limits: locked towers are refused. On an H200, ViT-B/32 under ZeRO-2: 1.28x at micro-batch 256
(host-bound), 1.045x at 1,024 (docs/benchmarks.md); flat towers 1.02x more; under ZeRO-3 with
tower units, flat towers 1.18-1.24x flat blocks (0.93x ZeRO-2). On the CPU host,
bench/bench_host_overhead.py.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ALIGN", "bind_in_checkpoint", "bind_in_forward", "bind_views", "expand_flat_entries", "flatten_block", "flat_blocks"]

ALIGN = 64
"""Elements between the starts of two members of a flat tensor (128 bytes in bf16)."""
MATRICES, VECTORS = "flat_matrices", "flat_vectors"
REUSE_VIEWS = True
"""Keep the views bound in a forward for the next ones while their flat tensors are unchanged
(:func:`_bound_key`); False binds them anew every forward (for measuring what that costs:
``bench/bench_stream.py --host_work per_tensor``)."""


class _Member(NamedTuple):
    module: nn.Module
    attr: str
    key: str  # the state-dict key relative to the block, e.g. "mlp.fc1.weight"
    offset: int
    shape: tuple

    @property
    def span(self) -> slice:
        return slice(self.offset, self.offset + math.prod(self.shape))

    def view(self, flat: Tensor) -> Tensor:
        """This member's weight: a view into ``flat``."""
        return flat[self.span].view(self.shape)


def flatten_block(block: nn.Module) -> int:
    """Replace ``block``'s parameters by ``flat_matrices`` (>= 2-D) and ``flat_vectors``;
    returns how many tensors were folded. The block must hold trainable parameters only."""
    groups: Dict[str, list] = {}
    state_order = list(block.state_dict())  # the keys (parameters and buffers) in the order they are written
    for path, module in block.named_modules():
        for attr, p in list(module._parameters.items()):
            if p is None:
                continue
            if not p.requires_grad:
                raise ValueError(f"flat_parameters: '{path}.{attr}' is frozen (locked towers are not supported)")
            groups.setdefault(MATRICES if p.ndim >= 2 else VECTORS, []).append((path, module, attr, p))
    layout: Dict[str, List[_Member]] = {}
    for name, members in groups.items():
        offsets, total = [], 0
        for *_, p in members:
            offsets.append(total)
            total += -(-p.numel() // ALIGN) * ALIGN
        first = members[0][3]
        flat = torch.zeros(total, dtype=first.dtype, device=first.device)
        for (path, module, attr, p), offset in zip(members, offsets):
            flat[offset:offset + p.numel()] = p.detach().reshape(-1)
            del module._parameters[attr]
        param = nn.Parameter(flat)
        param.infclip_weight_decay = name == MATRICES  # read by pipeline.model.param_layout.param_groups
        block.register_parameter(name, param)
        layout[name] = [_Member(module, attr, f"{path}.{attr}" if path else attr, offset, tuple(p.shape))
                        for (path, module, attr, p), offset in zip(members, offsets)]
    block._flat_layout = layout
    block._flat_sizes = {name: _split_sizes(members, block._parameters[name].numel())
                         for name, members in layout.items()}
    block._flat_order = state_order
    block._flat_numel = {name: block._parameters[name].numel() for name in layout}
    block._flat_held = False  # views bound by an enclosing BindingForward (a ZeRO-3 layer stack)
    block.register_state_dict_post_hook(_write_original_names)
    block.register_load_state_dict_pre_hook(_read_original_names)
    _bind(block)
    return sum(len(m) for m in layout.values())


def flat_blocks(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "_flat_layout")]


def _split_sizes(members: List[_Member], total: int) -> List[int]:
    """Sizes that split a flat tensor into gap, member, gap, member, ..., gap (gaps may be 0)."""
    sizes, end = [], 0
    for m in members:
        sizes += [m.offset - end, math.prod(m.shape)]
        end = m.offset + math.prod(m.shape)
    return sizes + [total - end]


def _bind(block: nn.Module, reuse: bool = False) -> None:
    """Point ``block``'s member attributes at views of its flat tensors; with ``reuse``, a flat
    tensor whose views are already bound (:func:`_bound_key`) is left as it is."""
    # one split per flat tensor: autograd gets one SplitWithSizesBackward node (one concatenation
    # of the members' gradients) instead of a slice node per member, each of which would add a
    # zero-filled copy of the whole flat tensor
    held = block.__dict__.setdefault("_flat_bound", {})
    for name, members in block._flat_layout.items():
        flat = block._parameters[name]
        if flat.numel() != block._flat_numel[name]:
            continue  # partitioned by ZeRO-3: bound in the block's forward (bind_in_forward)
        key = _bound_key(flat)
        if reuse and held.get(name) == key:
            continue
        pieces = flat.split(block._flat_sizes[name])
        for m, piece in zip(members, pieces[1::2]):
            # a plain attribute since flattening (not in _parameters): written straight into the
            # module's __dict__, as nn.Module.__setattr__ would after its checks (~40x faster;
            # 399 members per forward for ViT-B/32)
            m.module.__dict__[m.attr] = piece.view(m.shape)
        held[name] = key


def _bound_key(flat: Tensor) -> tuple:
    """What views of ``flat`` depend on: the tensor, its memory, its version, and whether autograd
    records them.

    Views bound once serve every later forward while this is unchanged: they alias the flat
    tensor's memory, and their autograd nodes (a split and a view per member, which save no
    tensors) carry each backward's gradients to the flat parameter, so a backward may run through
    them again. DeepSpeed's ZeRO-1/2 step writes the new weights through its own buffer and gives
    the parameter a new ``.data`` at the same address, which changes none of this. An in-place
    write to the parameter itself (a checkpoint loaded into it) bumps its version, and autograd
    refuses views of a split whose base was written in place: those are bound anew. Binding anew
    every forward costs about 400 tensor calls for ViT-B/32 (4-6 ms of host time a step on one
    H100 host, at micro-batch 256 a tenth of the step)."""
    return (id(flat), flat.data_ptr(), flat.dtype, flat._version, flat.requires_grad, torch.is_grad_enabled(),
            torch.is_inference_mode_enabled())


def _unbind(block: nn.Module) -> None:
    for members in block._flat_layout.values():
        for m in members:
            m.module.__dict__.pop(m.attr, None)
    block.__dict__.get("_flat_bound", {}).clear()


def bind_views(blocks: List[nn.Module]) -> None:
    """Point every member attribute of ``blocks`` at its slice of the current flat tensors, unless
    the views bound before still are (:func:`_bound_key`). Flat tensors partitioned by ZeRO-3 are
    left to :func:`bind_in_forward`, and so are blocks that bind their views in their own forward:
    there the binding would be replaced before any read, and dropped after the forward; under
    ZeRO-3 it bound each block's persistent vectors, 24 redundant bindings a ViT-B/32 step."""
    for block in blocks:
        if not isinstance(block.__dict__.get("forward"), BindingForward):
            _bind(block, reuse=REUSE_VIEWS)


class BindingForward:
    """The ``forward`` of a flat block (or of a stack of them, ``pipeline.model.layer_stack``) under
    ZeRO-3: binds the views of ``blocks`` to the flat tensors DeepSpeed's forward pre-hook has
    just gathered, runs ``inner`` (the module's own forward, possibly compiled), and drops the
    views, so that no module attribute keeps a gathered tensor alive after the forward. Binding
    inside the forward (after the module's backward hooks are set up on its inputs) also orders
    the backward: the split that carries the members' gradients to the flat tensors runs before
    the hook on the module's inputs, where ZeRO-3 reduces a leaf module's gradients. A block
    whose views an enclosing stack holds (``_flat_held``) runs ``inner`` as it is; a checkpointed
    block's recomputation in backward, outside the stack's forward, binds its own."""

    def __init__(self, blocks: List[nn.Module], inner) -> None:
        self.blocks, self.inner = list(blocks), inner

    def __call__(self, *args, **kwargs):
        if self.blocks[0]._flat_held:
            return self.inner(*args, **kwargs)
        for block in self.blocks:
            _bind(block)
            block._flat_held = True
        try:
            return self.inner(*args, **kwargs)
        finally:
            for block in self.blocks:
                _unbind(block)
                block._flat_held = False


class BindingCheckpoint:
    """A flat block's ``_gradient_checkpointing_func`` under ZeRO-3. transformers' checkpointed
    layers hand it the block's class forward, which the recomputation in backward runs outside
    the block's (or its stack's) :class:`BindingForward`: wrapped here, it binds the views to the
    flat tensors ZeRO-3 gathered for the backward, unless a binding holds them already."""

    def __init__(self, block: nn.Module, checkpoint) -> None:
        self.block, self.checkpoint = block, checkpoint

    def __call__(self, run, *args, **kwargs):
        return self.checkpoint(BindingForward([self.block], run), *args, **kwargs)


def bind_in_checkpoint(blocks: List[nn.Module]) -> None:
    """Wrap the checkpoint function of each of ``blocks`` that binds its views in its forward
    (:class:`BindingCheckpoint`); call whenever checkpointing is switched on."""
    for block in blocks:
        fn = block.__dict__.get("_gradient_checkpointing_func")
        if isinstance(block.forward, BindingForward) and fn is not None and not isinstance(fn, BindingCheckpoint):
            block._gradient_checkpointing_func = BindingCheckpoint(block, fn)


def bind_in_forward(blocks: List[nn.Module], stacks: List[nn.Module] = ()) -> None:
    """Make each of ``blocks`` bind its views inside its forward (:class:`BindingForward`), and
    each of ``stacks`` (modules whose forward runs some of ``blocks``) bind all of its blocks';
    call once DeepSpeed's ZeRO-3 hooks are on the modules."""
    for block in blocks:
        if not isinstance(block.forward, BindingForward):
            block.forward = BindingForward([block], block.forward)
    for stack in stacks:
        if not isinstance(stack.forward, BindingForward):
            members = [b for b in blocks if any(b is m for m in stack.modules())]
            if members:
                stack.forward = BindingForward(members, stack.forward)
    bind_in_checkpoint(blocks)


def _write_original_names(block: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    # the block's entries come last in state_dict when its hook runs: they are rewritten in the
    # order the unflattened block would have written them (a whole tower's buffers included)
    if any(state_dict[prefix + name].numel() != block._flat_numel[name] for name in block._flat_layout):
        return  # partitioned by ZeRO-3 (its checkpoints keep the parameters in the optimizer's files)
    pieces = {}
    for name, members in block._flat_layout.items():
        flat = state_dict.pop(prefix + name)
        pieces.update((m.key, m.view(flat).clone()) for m in members)
    for key in block._flat_order:  # each entry popped and appended in turn: the original order
        value = pieces.pop(key) if key in pieces else state_dict.pop(prefix + key, None)
        if value is not None:  # (None: a buffer the state dict does not hold)
            state_dict[prefix + key] = value


def _read_original_names(block: nn.Module, state_dict: dict, prefix: str, local_metadata, strict,
                         missing_keys, unexpected_keys, error_msgs) -> None:
    for name, members in block._flat_layout.items():
        keys = [prefix + m.key for m in members]
        if prefix + name in state_dict or not all(k in state_dict for k in keys):
            continue  # already flat, or incomplete: load_state_dict names what is missing
        current = block._parameters[name]
        flat = torch.zeros(current.numel(), dtype=current.dtype, device=current.device)
        for m, key in zip(members, keys):
            flat[m.span] = state_dict.pop(key).reshape(-1)
        state_dict[prefix + name] = flat


def expand_flat_entries(state_dict: Mapping[str, Tensor], model: nn.Module) -> Dict[str, Tensor]:
    """``state_dict`` with every ``<block>.flat_*`` entry of ``model``'s flattened blocks replaced
    by the original per-parameter entries (other entries pass through)."""
    out = dict(state_dict)
    for path, block in model.named_modules():
        layout = getattr(block, "_flat_layout", None)
        if layout is None:
            continue
        for name, members in layout.items():
            key = f"{path}.{name}" if path else name
            if key not in out:
                continue
            flat = out.pop(key)
            for m in members:
                full = f"{path}.{m.key}" if path else m.key
                out[full] = m.view(flat).clone()
    return out
