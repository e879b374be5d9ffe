"""The two CLIP towers (HF transformers) plus the learnable logit scale and bias.

Design: ``CLIPTowers`` wraps ``CLIPVisionModelWithProjection`` and
``CLIPTextModelWithProjection`` built from the ``model`` config section (random init, nothing
downloaded) or loaded from a local folder written by :meth:`CLIPTowers.save_pretrained`
(``vision/`` and ``text/`` are plain HF folders, so ``transformers`` can load either tower on
its own). The logit scale is stored as its log (shape ``(1,)``: a 0-dim bf16 parameter breaks
``deepspeed.initialize``'s broadcast) and handed to the loss as the clamped multiplier.

Text pooling is done here, not by HF: HF's ``CLIPTextTransformer`` treats ``eos_token_id == 2``
as a legacy checkpoint and pools the token with the largest id. We pool the first EOS token of
each row (HF's modern rule), falling back to the last attended token for rows with no EOS. The
project's tokenizer has EOS id 1, so HF pools the same token; :meth:`CLIPTowers.save_pretrained`
also writes the towers as one ``transformers.CLIPModel`` (skipped for an EOS id of 2), and
:meth:`CLIPTowers.from_pretrained` reads such a folder (any transformers CLIP checkpoint) too.

Under ZeRO-3, call the model through its ``forward`` (the DeepSpeed engine's ``__call__``) so
the logit parameters, which live on this top module, are gathered; ``encode_image`` and
``encode_text`` are for an unwrapped model (evaluation).

The ``model`` section and what it costs (activations, FLOPs) are :mod:`pipeline.model.config`;
how the towers' parameters are grouped for the optimizer and for ZeRO-3 is
:mod:`pipeline.model.param_layout`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import typing
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn

from infclip.ops.config import ConfigError

from ..data.tokenizer import special_token_ids
from ..errors import CheckpointError
from .config import ModelConfig, TextTowerConfig, VisionTowerConfig, activation_bytes, ds_param_dtype
from .flat_params import BindingForward, bind_in_checkpoint, bind_in_forward, bind_views, flatten_block
from .layer_stack import layer_stacks, stack_forward
from .param_layout import encoder_layers
from .patch_dropout import use_patch_dropout
from .patch_embed import use_patch_gemm

__all__ = ["CLIPTowers", "is_hf_clip_folder"]

logger = logging.getLogger(__name__)

_LOGIT_FILE = "logit_params.json"


def _hf_configs(cfg: ModelConfig, vocab_size: int, token_ids: Mapping[str, Optional[int]]):
    from transformers import CLIPTextConfig, CLIPVisionConfig

    v, t = cfg.vision, cfg.text
    vision = CLIPVisionConfig(
        hidden_size=v.hidden_size, intermediate_size=v.intermediate_size or 4 * v.hidden_size,
        projection_dim=cfg.embed_dim, num_hidden_layers=v.layers, num_attention_heads=v.heads,
        image_size=v.image_size, patch_size=v.patch_size, attention_dropout=v.attention_dropout,
        hidden_act=cfg.hidden_act or "gelu")
    ids = dict(token_ids)  # None: no such token (no BOS where the tokenizer's BOS is its EOS), not HF's default
    text = CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size or 4 * t.hidden_size, projection_dim=cfg.embed_dim,
        num_hidden_layers=t.layers, num_attention_heads=t.heads,
        max_position_embeddings=t.context_length, attention_dropout=t.attention_dropout,
        hidden_act=cfg.hidden_act or "gelu", **ids)
    for hf in (vision, text):
        hf._attn_implementation = cfg.attn_implementation
    return vision, text


def _with_tower_sizes(cfg: ModelConfig, vision: Any, text: Any) -> ModelConfig:
    """``cfg`` with its tower sizes read from loaded HF towers' configs: a pretrained start ignores
    the section's sizes, and what is computed from them (``"auto"`` checkpointing's activation
    estimate, the kept patches, the FLOPs) must be the towers' own."""
    sizes = lambda c: {"hidden_size": c.hidden_size, "layers": c.num_hidden_layers,  # noqa: E731
                       "heads": c.num_attention_heads, "intermediate_size": c.intermediate_size,
                       "attention_dropout": float(c.attention_dropout)}
    return dataclasses.replace(
        cfg, embed_dim=vision.projection_dim,
        vision=VisionTowerConfig(image_size=vision.image_size, patch_size=vision.patch_size, **sizes(vision)),
        text=TextTowerConfig(context_length=text.max_position_embeddings, vocab_size=text.vocab_size, **sizes(text)))


def _set_checkpointing(model: nn.Module, enable: bool, function: Optional[Any] = None) -> None:
    """Switch a HF tower's activation checkpointing; transformers >= 5.23 renamed the method
    (``activation_checkpointing_enable``) and deprecated the old one, 5.17 has only the old.

    Reentrant torch checkpointing: the non-reentrant kind re-runs module forwards inside
    backward in an order that breaks ZeRO-3's parameter-fetch trace ("tracing error at step N"
    on the second step). ``function`` replaces torch's checkpoint (DeepSpeed's)."""
    if enable and function is not None:
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=function)
        if getattr(model, "main_input_name", "") == "input_ids":
            model.enable_input_require_grads()  # a reentrant segment needs an input that requires grad
    elif enable:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    else:
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()


def _free_bytes(device: torch.device) -> int:
    """Memory a new allocation can still take on ``device``: the device's free memory plus what
    torch's caching allocator holds unused; on the CPU, the available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _no_init_weights():
    try:  # transformers >= 5
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def _new_tower(cls: Any, hf_config: Any, zero3_config: Optional[Mapping[str, Any]]) -> nn.Module:
    """A randomly initialised HF tower. Built with transformers' init switched off, then
    initialised by :func:`_init_tower_weights`, so the weights depend only on the torch seed:
    with ``zero3_config`` (a DeepSpeed config dict at stage 3) the tower is built partitioned under
    ``deepspeed.zero.Init`` and ends up with exactly the weights the whole build gets."""
    import contextlib

    zero3 = zero3_config is not None
    partitioned = contextlib.nullcontext()
    if zero3:
        import deepspeed

        partitioned = deepspeed.zero.Init(config_dict_or_path=dict(zero3_config))
    with _no_init_weights(), partitioned:
        tower = cls(hf_config)
    _init_tower_weights(tower, zero3=zero3)
    return tower


def _init_tower_weights(tower: nn.Module, zero3: bool) -> None:
    """transformers' weight init (each model's ``_init_weights``) applied module by module,
    children first. A module's ``_init_weights`` may also set its direct children's weights, so
    those are part of its unit. With ``zero3`` each unit's partitioned parameters are gathered, rank
    0 initialises them and DeepSpeed broadcasts them on release: one unit is whole at a time, and
    rank 0 draws the same random numbers in the same order as a whole build on one process."""
    import contextlib

    import torch.distributed as dist
    from transformers import PreTrainedModel

    writer = not zero3 or not dist.is_initialized() or dist.get_rank() == 0

    def visit(module: nn.Module, owner: Any) -> None:
        for child in module.children():
            visit(child, child if isinstance(child, PreTrainedModel) else owner)
        unit = list(module.parameters(recurse=False))
        for child in module.children():
            if not isinstance(child, PreTrainedModel):
                unit.extend(child.parameters(recurse=False))
        if zero3 and unit:
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(unit, modifier_rank=0)
        else:
            gather = contextlib.nullcontext()
        with gather, torch.no_grad():
            if writer or not unit:
                owner._initialize_weights(module)

    visit(tower, tower)


def _compiled_while_training(module: nn.Module, fn: typing.Callable, compile_fn: typing.Callable) -> typing.Callable:
    """``fn`` compiled while ``module`` is in training mode, eager in evaluation mode. The
    compiled graphs are specialised to the training batch; evaluation's batches (the class
    prompts, a last partial batch) would each be compiled anew: the first evaluation of a ViT-B/32
    run waited about 3 minutes for that on an H200, for a pass that takes seconds eagerly."""
    compiled = compile_fn(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return (compiled if module.training else fn)(*args, **kwargs)

    return call


def _token_ids(tokenizer: Any) -> dict:
    """The text config's EOS, PAD and BOS ids as the rows are tokenized
    (``pipeline.data.tokenizer.special_token_ids``: PAD falls back to EOS, no BOS where BOS is EOS);
    none without a tokenizer."""
    if tokenizer is None:
        return {}
    return {k: v for k, v in special_token_ids(tokenizer).items() if k != "vocab_size"}


def copy_gradients_out_of_graphs(params: typing.Iterable[nn.Parameter]) -> None:
    """Hand autograd a copy of each gradient of ``params`` that a CUDA graph computes.

    Why: replayed as CUDA graphs (``compile_mode: "reduce-overhead"``), the towers' backward writes
    the gradients of the parameters it takes as inputs into the graphs' own memory pool, and
    autograd installs that memory as ``.grad``. The next replay reuses it, so a gradient still
    held there, to be accumulated over micro-steps, fails with "accessing tensor output of
    CUDAGraphs that has been overwritten by a subsequent run" (pytorch/pytorch#169545): on an H200,
    DeepSpeed's ZeRO-0 and ZeRO-1 with ``gradient_accumulation_steps`` 2 failed at the second
    micro-step, with plain and with flat blocks (ZeRO-2 moves each gradient into its own buffer at
    once), and so did any loop that does not clear ``.grad`` between backwards
    (tests/pipeline/test_cuda_graphs.py, run on a GPU with the copy switched off).
    A hook before the accumulation copies each such gradient into ordinary memory: one copy of
    these parameters' gradients per backward (with flat blocks, the ~15 tensors outside them)."""
    for p in params:
        p.register_hook(torch.clone)


def is_hf_clip_folder(directory: str) -> bool:
    """A saved transformers ``CLIPModel``: ``config.json`` with ``model_type: clip``."""
    try:
        with open(os.path.join(directory, "config.json")) as f:
            return json.load(f).get("model_type") == "clip"
    except (OSError, ValueError, AttributeError):
        return False



def _hf_load(cls: Any, folder: str, **kwargs: Any) -> Any:
    """``cls.from_pretrained(folder)``; a pickled weights file that holds more than tensors (which
    transformers reads weights-only, so refuses) is a CheckpointError naming the file."""
    import pickle
    import re

    try:
        return cls.from_pretrained(folder, **kwargs)
    except pickle.UnpicklingError as exc:
        files = sorted(f for f in os.listdir(folder) if f.endswith((".bin", ".pt", ".pth")))
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"refused to load {os.path.join(folder, files[0]) if files else folder}: it holds a "
                              f"Python object{what} that only a full unpickle could build, and unpickling can run code "
                              "from the file; only tensors are loaded (a safetensors file is never refused)") from None


@contextlib.contextmanager
def _no_progress_bars():
    """transformers' progress bar off for the saves inside: an export writes one small weights
    file, and a "Writing model shards" bar for it is noise in a training log."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


class CLIPTowers(nn.Module):
    """Image and text towers with a shared embedding width E and learnable logit scale/bias.

    ``forward(pixel_values [B,3,H,W], input_ids [B,L], attention_mask [B,L])`` returns
    ``(image_features [B,E] | None, text_features [B,E] | None, scale [1], bias [1])``, features
    L2-normalised, ``scale = exp(logit_scale).clamp(max=max_logit_scale)``. Either input may be
    left out (None) to run one tower only.
    """

    def __init__(self, cfg: ModelConfig, *, vocab_size: Optional[int] = None,
                 eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None,
                 bos_token_id: Optional[int] = None,
                 _towers: Optional[tuple[nn.Module, nn.Module]] = None,
                 zero3_config: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__()
        from transformers import CLIPTextModelWithProjection, CLIPVisionModelWithProjection

        self.cfg = cfg
        if cfg.flat_parameters and zero3_config is not None:
            raise ConfigError("'model.flat_parameters' under ZeRO-3 needs 'model.zero3_init': false (the blocks "
                              "are flattened whole, then partitioned by deepspeed.initialize)")
        if _towers is not None:  # loaded: the section's sizes become the towers' own
            self.vision, self.text = _towers
            self.cfg = cfg = _with_tower_sizes(cfg, self.vision.config, self.text.config)
        else:
            vocab = cfg.text.vocab_size or vocab_size
            if vocab is None:
                raise ConfigError("model.text.vocab_size is null and no tokenizer vocabulary size was given")
            if eos_token_id is None:
                raise ConfigError("CLIPTowers needs the tokenizer's eos_token_id (text pooling picks the EOS token)")
            vision_cfg, text_cfg = _hf_configs(cfg, vocab, {"eos_token_id": eos_token_id,
                                                            "pad_token_id": pad_token_id,
                                                            "bos_token_id": bos_token_id})
            self.vision = _new_tower(CLIPVisionModelWithProjection, vision_cfg, zero3_config)
            self.text = _new_tower(CLIPTextModelWithProjection, text_cfg, zero3_config)
        if cfg.patch_embedding == "gemm":
            use_patch_gemm(self.vision)
        use_patch_dropout(self.vision.vision_model.embeddings, cfg.patch_dropout)
        self.eos_token_id = self.text.config.eos_token_id
        self.logit_scale = nn.Parameter(torch.full((1,), float(cfg.init_logit_scale)))
        self.logit_bias = nn.Parameter(torch.full((1,), float(cfg.init_logit_bias)))
        if zero3_config is not None:
            # the towers' parameters were made in DeepSpeed's training dtype by zero.Init; these two
            # are converted at deepspeed.initialize as they are, and ZeRO-3 needs one dtype for all
            dtype = ds_param_dtype(zero3_config)
            self.logit_scale.data = self.logit_scale.data.to(dtype)
            self.logit_bias.data = self.logit_bias.data.to(dtype)
        self.max_logit_scale = float(cfg.max_logit_scale)
        self._checkpoint_function: Optional[Any] = None
        self._planned = False
        self._towers_routed = False
        self.compiled: Optional[str] = None
        """What :meth:`_plan` compiled: None, "towers" or "blocks"."""
        self.set_gradient_checkpointing(cfg.gradient_checkpointing is True)
        self._flat_blocks: list[nn.Module] = []
        """The modules holding flat tensors: the blocks, or the two towers (``flat_parameters``)."""
        if cfg.flat_parameters:
            self._flat_blocks = [self.vision, self.text] if cfg.flat_parameters == "tower" else encoder_layers(self)
        for block in self._flat_blocks:
            flatten_block(block)

    def bind_flat_views_in_forward(self) -> None:
        """Under ZeRO-3, once ``deepspeed.initialize`` has partitioned the parameters and put its
        hooks on the blocks: each flat block binds its views in its own forward, after DeepSpeed's
        gather (``pipeline.model.flat_params.bind_in_forward``); a layer stack (``zero3_leaf_layers:
        "stack"``) binds all of its blocks' views in its forward. No-op without flat parameters."""
        bind_in_forward(self._flat_blocks, layer_stacks(self))

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        bind_views(getattr(self, "_flat_blocks", []))  # .to() / .bfloat16() made new flat tensors
        return out

    # ------------------------------------------------------------------ towers
    def set_gradient_checkpointing(self, enable: bool, function: Optional[Any] = None) -> None:
        """Recompute each tower block in backward: the towers' own (HF) activation checkpointing
        with torch's reentrant checkpoint, or with ``function`` (e.g.
        ``deepspeed.checkpointing.checkpoint``, configured by the ``activation_checkpointing``
        section: partitioned or CPU-offloaded activations)."""
        self._checkpoint_function = function
        if self.cfg.gradient_checkpointing == "auto" and not self._planned:
            return  # decided at the first training forward (see _plan)
        for tower in (self.vision, self.text):
            _set_checkpointing(tower, enable, function)
        if enable:
            bind_in_checkpoint(getattr(self, "_flat_blocks", []))  # ZeRO-3: the recomputation binds its views

    def lock_towers(self) -> list[str]:
        """Apply ``lock_image`` / ``lock_text`` (LiT): ``requires_grad=False`` on the locked
        tower's parameters except its last ``lock_*_unlocked_blocks`` blocks and the modules after
        them (post/final LN, projection). Call before building the optimizer
        (``pipeline.model.param_layout.param_groups`` skips frozen parameters). Returns the names of the
        frozen parameters."""
        frozen = []
        for name, tower, lock, keep in (("image", self.vision, self.cfg.lock_image, self.cfg.lock_image_unlocked_blocks),
                                        ("text", self.text, self.cfg.lock_text, self.cfg.lock_text_unlocked_blocks)):
            if not lock:
                continue
            layers = encoder_layers(tower)
            if keep > len(layers):
                raise ConfigError(f"'lock_{name}_unlocked_blocks' {keep} exceeds the {name} tower's {len(layers)} blocks")
            trainable = set()
            if keep:
                for block in layers[-keep:]:
                    trainable.update(id(p) for p in block.parameters())
                inner = tower.vision_model if name == "image" else tower.text_model
                after = inner.post_layernorm if name == "image" else inner.final_layer_norm
                proj = tower.visual_projection if name == "image" else tower.text_projection
                trainable.update(id(p) for p in (*after.parameters(), *proj.parameters()))
            for pname, p in tower.named_parameters():
                if id(p) not in trainable:
                    p.requires_grad_(False)
                    frozen.append(f"{'vision' if name == 'image' else 'text'}.{pname}")
            if keep:
                # reentrant checkpointing of an unlocked block needs an input that requires grad
                tower.enable_input_require_grads()
        if frozen:
            logger.info("locked towers: %d parameters frozen", len(frozen))
        return frozen

    def _plan(self, rows: int, device: torch.device) -> None:
        """At the first training forward: resolve ``gradient_checkpointing: "auto"`` and
        ``compile`` for the device and the rows per forward (micro-batch or chunk), once."""
        self._planned = True
        cfg = self.cfg
        if cfg.gradient_checkpointing == "auto":
            need = activation_bytes(cfg, rows, element_bytes=next(self.parameters()).element_size())
            adam_state = 8 * sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters() if p.requires_grad)
            free = _free_bytes(device) - adam_state  # Adam's moments appear at the first step
            enable = need > cfg.checkpointing_memory_fraction * free
            logger.info("gradient_checkpointing auto: %s (activations of %d rows ~%.2f GiB, free ~%.2f GiB "
                        "after optimizer state)", "on" if enable else "off", rows, need / 2**30, free / 2**30)
            self.set_gradient_checkpointing(enable, self._checkpoint_function)
        if cfg.compile is True or (cfg.compile == "auto" and device.type == "cuda"):
            self._compile()

    def _compile(self) -> None:
        """Whole towers as one graph each (the features of encode_image / encode_text); where
        hooks run inside the towers, the parts between them: under ZeRO-3 with layer stacks as its
        unit (``zero3_leaf_layers: "stack"``), each tower's stack of blocks as one graph; under
        ZeRO-3 with per-block units, or with checkpointed blocks, each block's forward alone. Under
        ZeRO-3 with flat towers as its units (``flat_parameters: "tower"``) each tower is whole
        again: its binding of the gathered tensors' views stays outside, the rest is one graph. The
        hooks (ZeRO-3's parameter fetch, checkpointing) stay outside the compiled code."""
        mode = self.cfg.compile_mode
        zero3 = any(hasattr(p, "ds_id") for p in self.parameters())
        checkpointing = self.vision.vision_model.encoder.gradient_checkpointing
        # ZeRO-3 with flat towers as its units: each tower binds its views after the gather and
        # runs its features as one graph, as without ZeRO-3
        flat_units = [t for t in (self.vision, self.text) if isinstance(t.__dict__.get("forward"), BindingForward)]
        stacks = layer_stacks(self) if zero3 and not checkpointing and not flat_units else []
        by_block = (zero3 and not flat_units or checkpointing) and not stacks
        # CUDA graphs per block would copy each block's re-gathered (moving) ZeRO-3 weights into
        # the graph's inputs at every replay, or replay under checkpointing's recompute. A stack or
        # a tower of flat tensors takes that copy once (~0.1 ms for ViT-B/32's towers: its views
        # are plain inputs); a stack's own parameters would be static inputs whose gathers move
        # them, so that the graphs would be recorded anew
        graphs = not (zero3 or checkpointing) or bool(flat_units and not checkpointing) or bool(
            stacks and all(isinstance(m.forward, BindingForward) for m in stacks))
        if mode == "reduce-overhead" and not graphs:
            logger.warning("compile_mode 'reduce-overhead' applies to whole towers and stacks of flat blocks; "
                           "%s compile with mode 'default' (%s)", "the stacks" if stacks else "the blocks",
                           "ZeRO-3" if zero3 else "gradient checkpointing")
            mode = "default"
        compile_fn = functools.partial(torch.compile, backend=self.cfg.compile_backend, mode=mode)
        if stacks:
            for layers in stacks:
                run = stack_forward(layers)
                run.inner = _compiled_while_training(layers, run.inner, compile_fn)
            self.compiled = "stacks"
        elif by_block:
            self._compile_blocks(compile_fn)
            self.compiled = "blocks"
        elif flat_units:
            for tower in flat_units:
                tower.forward.inner = _compiled_while_training(self, tower.forward.inner, compile_fn)
            self.compiled = "towers"
        else:
            self._image_features = _compiled_while_training(self, self._image_features, compile_fn)
            self._text_features = _compiled_while_training(self, self._text_features, compile_fn)
            self.compiled = "towers"
            if mode == "reduce-overhead":
                copy_gradients_out_of_graphs(self._graph_parameters())
        logger.info("torch.compile (%s): %s", self.cfg.compile_backend, self.compiled)

    def _graph_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters that the whole-tower graphs take as they are: all but the flat
        tensors, which reach the graphs through views bound outside them (their gradients come out
        of the views' backward, in the ordinary allocator)."""
        flat = {id(p) for block in self._flat_blocks for p in block.parameters(recurse=False)}
        return [p for tower in (self.vision, self.text) for p in tower.parameters()
                if p.requires_grad and id(p) not in flat]

    def _compile_blocks(self, compile_fn: typing.Callable) -> None:
        """Each transformer block's forward compiled alone (a flat block's binding under ZeRO-3
        stays outside the compiled code)."""
        blocks = encoder_layers(self)
        # the blocks share one code object, and under ZeRO-3 each is guarded on its own
        # parameters' ds_id: one graph per block. At dynamo's default limit (8) the other blocks
        # ran eager (ZeRO-3 at 0.3-0.5x ZeRO-2 on an H200)
        limit = len(blocks) + 8
        if torch._dynamo.config.recompile_limit < limit:
            torch._dynamo.config.recompile_limit = limit
            logger.info("torch._dynamo.config.recompile_limit raised to %d (one graph per block)", limit)
        for block in blocks:
            if isinstance(block.forward, BindingForward):
                block.forward.inner = _compiled_while_training(block, block.forward.inner, compile_fn)
            else:
                block.forward = _compiled_while_training(block, block.forward, compile_fn)

    @property
    def image_size(self) -> int:
        return int(self.vision.config.image_size)

    @property
    def context_length(self) -> int:
        return int(self.text.config.max_position_embeddings)

    @property
    def embed_dim(self) -> int:
        return int(self.vision.config.projection_dim)

    def encode_image(self, pixel_values: Tensor) -> Tensor:
        """[B,3,H,W] float -> L2-normalised [B,E] (dtype of the tower)."""
        bind_views(self._flat_blocks)
        return self._image_features(pixel_values)

    def encode_text(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """[B,L] token ids (+ [B,L] 0/1 mask) -> L2-normalised [B,E]; pools the first EOS token
        of each row, or the last attended token where a row has no EOS."""
        bind_views(self._flat_blocks)
        return self._text_features(input_ids, attention_mask)

    def route_towers(self) -> list[nn.Module]:
        """Make each tower module's call compute its features (ZeRO-3 with whole towers as units,
        ``pipeline/engine/tower_unit.py``): ``vision(pixel_values)`` and ``text(input_ids,
        attention_mask)``, positional, return the normalised features, and this model calls the
        towers that way. Module names and state dicts are untouched. Returns the two towers."""
        self.vision.forward = self._image_tower
        self.text.forward = self._text_tower
        self._towers_routed = True
        return [self.vision, self.text]

    def tower_units(self) -> list[tuple[str, nn.Module]]:
        """The towers that :meth:`route_towers` made callable as units, by name; none before."""
        return [("vision", self.vision), ("text", self.text)] if self._towers_routed else []

    def _image_features(self, pixel_values: Tensor) -> Tensor:
        return self.vision(pixel_values) if self._towers_routed else self._image_tower(pixel_values)

    def _text_features(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        if self._towers_routed:
            return self.text(input_ids, attention_mask)
        return self._text_tower(input_ids, attention_mask)

    def _image_tower(self, pixel_values: Tensor) -> Tensor:
        out = self.vision.vision_model(pixel_values=pixel_values)
        feats = self.vision.visual_projection(out.pooler_output)
        return nn.functional.normalize(feats, dim=-1)

    def _text_attention_mask(self, attention_mask: Optional[Tensor]) -> Optional[Tensor]:
        """The text tower's attention mask, for SDPA as the 4D boolean mask transformers builds from a
        [B,L] 0/1 mask (causal AND key not padded: [B,1,L,L], True = attend); other attention
        implementations get the [B,L] mask as it is.

        Why: from a [B,L] mask, transformers' ``create_causal_mask`` first asks whether the mask is
        all ones (then it passes no mask and SDPA's ``is_causal``) with two ``bool()`` of device
        sums: two host waits per text forward where the tower runs eager (ZeRO-3's hooked
        modules, checkpointing, evaluation). A 4D mask is passed through as it is. The same values
        as transformers' mask, so a batch with padding gives the same bits; a batch without any
        padding now takes the explicit mask too, as the compiled towers always did (under
        torch.compile transformers never skips it)."""
        if (attention_mask is None or attention_mask.dim() != 2
                or getattr(self.text.config, "_attn_implementation", None) != "sdpa"):
            return attention_mask
        length = attention_mask.shape[1]
        pos = torch.arange(length, device=attention_mask.device)
        causal = pos[None, None, None, :] <= pos[None, None, :, None]  # key <= query: [1,1,L,L]
        return causal & attention_mask.bool()[:, None, None, :]

    def _text_tower(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        if input_ids.shape[1] > self.context_length:
            raise ValueError(f"input_ids has {input_ids.shape[1]} tokens, the text tower takes at most "
                             f"{self.context_length}")
        hidden = self.text.text_model(input_ids=input_ids,
                                      attention_mask=self._text_attention_mask(attention_mask)).last_hidden_state
        is_eos = input_ids == self.eos_token_id
        first_eos = is_eos.int().argmax(dim=1)
        if attention_mask is not None:
            last = attention_mask.long().sum(dim=1).clamp(min=1) - 1
        else:
            last = torch.full_like(first_eos, input_ids.shape[1] - 1)
        pos = torch.where(is_eos.any(dim=1), first_eos, last.to(first_eos.dtype))
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), pos]
        feats = self.text.text_projection(pooled)
        return nn.functional.normalize(feats, dim=-1)

    def logit_params(self) -> tuple[Tensor, Tensor]:
        """(scale [1] = exp(logit_scale) clamped to max_logit_scale, bias [1])."""
        return self.logit_scale.exp().clamp(max=self.max_logit_scale), self.logit_bias

    def forward(self, pixel_values: Optional[Tensor] = None, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None):
        if not self._planned and self.training and torch.is_grad_enabled():
            lead = pixel_values if pixel_values is not None else input_ids
            self._plan(lead.shape[0], lead.device)
        bind_views(self._flat_blocks)  # flat parameters: views into the current tensors, in this graph
        img = self._image_features(pixel_values) if pixel_values is not None else None
        txt = self._text_features(input_ids, attention_mask) if input_ids is not None else None
        scale, bias = self.logit_params()
        return img, txt, scale, bias

    # ------------------------------------------------------------------ save / load
    def save_pretrained(self, directory: str, tokenizer: Any = None, image_mean: Optional[list] = None,
                        image_std: Optional[list] = None) -> None:
        """Write a transformers ``CLIPModel`` folder that this project loads back exactly:

        - ``config.json`` + ``model.safetensors`` (one weights file): ``logit_scale`` = the log
          scale training used (``min(logit_scale, log max_logit_scale)``: HF does not clamp), the
          text config's BOS/EOS/PAD ids, so HF pools the same EOS token as :meth:`encode_text`;
          the config's ``infclip`` entry keeps what transformers has no field for (the raw logit
          scale and bias, ``max_logit_scale``, the model section);
        - with ``tokenizer``: the tokenizer with its CLIP template (``pipeline.data.tokenizer.with_clip_template``)
          and a ``CLIPProcessor`` whose image processor resizes the shorter side to ``image_size``
          (bicubic), centre-crops, and normalises with ``image_mean`` / ``image_std`` (default
          CLIP's): ``CLIPProcessor.from_pretrained`` and transformers' ``zero-shot-image-classification``
          pipeline load the folder.

        A tokenizer whose EOS id is 2 cannot be pooled right by transformers (it falls back to its
        legacy argmax pooling for that id): then the two towers are written as HF tower folders
        (``vision/``, ``text/``) with ``logit_params.json`` instead, with a warning. Under ZeRO-3
        gather the parameters first (or use the engine's consolidated state dict)."""
        os.makedirs(directory, exist_ok=True)
        meta = {"logit_scale": float(self.logit_scale.detach().float().reshape(-1)[0]),
                "logit_bias": float(self.logit_bias.detach().float().reshape(-1)[0]),
                "max_logit_scale": self.max_logit_scale,
                "model_config": self.cfg.to_dict()}
        if self.text.config.eos_token_id == 2:
            logger.warning("%s: the tokenizer's EOS id is 2, for which transformers' CLIPTextTransformer pools the "
                           "highest token id instead of the EOS: the towers are written as vision/ and text/, not as "
                           "one CLIPModel", directory)
            with _no_progress_bars():
                self.vision.save_pretrained(os.path.join(directory, "vision"))
                self.text.save_pretrained(os.path.join(directory, "text"))
            with open(os.path.join(directory, _LOGIT_FILE), "w") as f:
                json.dump(meta, f, indent=2)
        else:
            hf = self.to_hf_clip_model()
            hf.config.infclip = meta
            with _no_progress_bars():
                hf.save_pretrained(directory)
        if tokenizer is not None:
            self._save_processor(directory, tokenizer, image_mean, image_std)

    def _save_processor(self, directory: str, tokenizer: Any, image_mean: Optional[list],
                        image_std: Optional[list]) -> None:
        import importlib.util

        import transformers
        from transformers import CLIPProcessor

        from ..data.config import CLIP_MEAN, CLIP_STD
        from ..data.tokenizer import with_clip_template

        # without torchvision transformers 5 falls back to the PIL class with a warning; both
        # save the same preprocessor_config.json ("CLIPImageProcessor")
        image_cls = None
        if importlib.util.find_spec("torchvision") is None:
            image_cls = getattr(transformers, "CLIPImageProcessorPil", None)
        image_cls = image_cls or transformers.CLIPImageProcessor
        size = self.image_size
        images = image_cls(
            do_resize=True, size={"shortest_edge": size}, resample=3, do_center_crop=True,
            crop_size={"height": size, "width": size}, do_rescale=True, rescale_factor=1 / 255,
            do_normalize=True, image_mean=list(image_mean or CLIP_MEAN), image_std=list(image_std or CLIP_STD),
            do_convert_rgb=True)
        tok = with_clip_template(tokenizer, self.context_length)
        CLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(directory)

    def to_hf_clip_model(self):
        """A ``transformers.CLIPModel`` (fp32, CPU) holding these towers' weights; its
        ``logit_scale`` is the log of the multiplier training used (clamped to ``max_logit_scale``)."""
        from transformers import CLIPConfig, CLIPModel

        log_scale = min(float(self.logit_scale.detach().float().reshape(-1)[0]), math.log(self.max_logit_scale))
        config = CLIPConfig(text_config=self.text.config.to_dict(), vision_config=self.vision.config.to_dict(),
                            projection_dim=self.embed_dim, logit_scale_init_value=log_scale)
        with _no_init_weights():
            hf = CLIPModel(config)
        state = {"logit_scale": torch.tensor(log_scale)}
        # the towers' keys (vision_model.*, visual_projection.* ...) are CLIPModel's; read from the
        # towers, whose state-dict hooks write flat tensors under those names
        for tower in (self.vision, self.text):
            state.update({k: v.detach().float().cpu() for k, v in tower.state_dict().items()})
        hf.load_state_dict(state, strict=True)
        return hf.float().eval()

    @classmethod
    def from_pretrained(cls, directory: str, cfg: Optional[ModelConfig] = None) -> "CLIPTowers":
        """Load a folder written by :meth:`save_pretrained` or any standard transformers CLIP
        folder (a saved ``CLIPModel``: ``config.json`` with ``model_type: clip`` and its weights,
        whose ``logit_scale`` is kept), or the two towers' folders (``vision/``, ``text/``: an EOS
        id of 2, or an earlier export), or an OpenCLIP file or folder. ``cfg`` overrides the
        stored model section (only its non-size fields matter: checkpointing, logit limits)."""
        from transformers import CLIPTextModelWithProjection, CLIPVisionModelWithProjection

        from .openclip import openclip_folder_weights

        if os.path.isfile(directory):
            return cls.from_openclip(directory, cfg)
        weights = openclip_folder_weights(directory)
        if weights is not None:
            return cls.from_openclip(weights, cfg)
        towers = all(os.path.isdir(os.path.join(directory, sub)) for sub in ("vision", "text"))
        if not towers and is_hf_clip_folder(directory):
            return cls._from_hf_clip_folder(directory, cfg)
        for sub in ("vision", "text"):
            if not os.path.isdir(os.path.join(directory, sub)):
                raise FileNotFoundError(f"{directory} is not a CLIPTowers folder: '{sub}/' is missing "
                                        "(and there is no transformers CLIPModel config.json)")
        meta_path = os.path.join(directory, _LOGIT_FILE)
        meta = {}
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
        if cfg is None:
            stored = dict(meta.get("model_config") or {})
            stored["pretrained"] = None
            cfg = ModelConfig.from_dict(stored, source=meta_path)
        attn = {"attn_implementation": cfg.attn_implementation}
        vision = _hf_load(CLIPVisionModelWithProjection, os.path.join(directory, "vision"), **attn)
        text = _hf_load(CLIPTextModelWithProjection, os.path.join(directory, "text"), **attn)
        if vision.config.projection_dim != text.config.projection_dim:
            raise ValueError(f"{directory}: vision projection {vision.config.projection_dim} != "
                             f"text projection {text.config.projection_dim}")
        model = cls(cfg, _towers=(vision, text))
        with torch.no_grad():
            if "logit_scale" in meta:
                model.logit_scale.fill_(meta["logit_scale"])
            if "logit_bias" in meta:
                model.logit_bias.fill_(meta["logit_bias"])
        model.max_logit_scale = float(meta.get("max_logit_scale", cfg.max_logit_scale))
        return model

    @classmethod
    def from_openclip(cls, path: str, cfg: Optional[ModelConfig] = None, tokenizer: Any = None) -> "CLIPTowers":
        """An OpenCLIP state dict file converted to the HF towers (:mod:`pipeline.model.openclip`); sizes
        from its shapes, head widths, activation and text pooling from its OpenCLIP config
        (``cfg.openclip_config``, or ``open_clip_config.json`` beside it; else
        ``cfg.openclip_head_width`` and ``cfg.hidden_act``, required then), logit scale (and bias)
        carried over. Token ids come from ``tokenizer`` (else the config's EOS, or OpenAI's: the
        last vocabulary id)."""
        from transformers import CLIPTextModelWithProjection, CLIPVisionModelWithProjection

        from .openclip import (load_into, load_openclip_state_dict, openclip_hf_configs, openclip_spec,
                               openclip_to_hf, read_openclip_config)

        cfg = cfg or ModelConfig()
        spec = openclip_spec(read_openclip_config(cfg.openclip_config, path))
        hidden_act = spec.hidden_act(cfg.hidden_act, path)
        sd = load_openclip_state_dict(path)
        vc, tc, section = openclip_hf_configs(sd, hidden_act, cfg.openclip_head_width, _token_ids(tokenizer),
                                              cfg.attn_implementation, spec)
        vision_sd, text_sd, extra = openclip_to_hf(sd)
        with _no_init_weights():
            vision = CLIPVisionModelWithProjection(vc)
            text = CLIPTextModelWithProjection(tc)
        load_into(vision, vision_sd, path)
        load_into(text, text_sd, path)
        keep = {k: v for k, v in cfg.to_dict().items() if k not in ("vision", "text", "embed_dim", "pretrained")}
        model_cfg = ModelConfig.from_dict({**keep, **section, "pretrained": None}, source=path)
        model = cls(model_cfg, _towers=(vision, text))
        with torch.no_grad():
            for key in ("logit_scale", "logit_bias"):
                if key in extra:
                    getattr(model, key).fill_(float(extra[key].float().reshape(-1)[0]))
        return model

    @classmethod
    def _from_hf_clip_folder(cls, directory: str, cfg: Optional[ModelConfig]) -> "CLIPTowers":
        """A transformers ``CLIPModel`` folder split into the two towers; the raw logit scale and
        the model section come from the config's ``infclip`` entry (this project's export; or an
        older export's ``logit_params.json``), else the scale from the CLIPModel."""
        from transformers import (AutoTokenizer, CLIPModel, CLIPTextModelWithProjection,
                                  CLIPVisionModelWithProjection)

        attn = {"attn_implementation": (cfg or ModelConfig()).attn_implementation}
        hf = _hf_load(CLIPModel, directory, **attn)
        meta_path = os.path.join(directory, _LOGIT_FILE)
        if isinstance(getattr(hf.config, "infclip", None), dict):  # this project's export
            meta = dict(hf.config.infclip)
        elif os.path.exists(meta_path):  # an export of the two-layout folder
            with open(meta_path) as f:
                meta = json.load(f)
        else:
            meta = {"logit_scale": float(hf.logit_scale.detach().float())}
        tc, vc = hf.config.text_config, hf.config.vision_config
        tc.projection_dim = vc.projection_dim = hf.config.projection_dim  # the sub-configs keep their default
        if tc.eos_token_id == 2 and os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
            # the legacy value (OpenAI's checkpoints): HF pools argmax(ids); pool at the tokenizer's EOS
            eos = AutoTokenizer.from_pretrained(directory, local_files_only=True).eos_token_id
            if eos is not None and eos != 2:
                logger.info("%s: text eos_token_id 2 (legacy) replaced by the tokenizer's EOS id %d", directory, eos)
                tc.eos_token_id = eos
                hf.text_model.eos_token_id = eos
        if cfg is None:
            stored = dict(meta.get("model_config") or {})
            if not stored:
                stored = {"embed_dim": hf.config.projection_dim,
                          "vision": {"image_size": vc.image_size, "patch_size": vc.patch_size,
                                     "hidden_size": vc.hidden_size, "layers": vc.num_hidden_layers,
                                     "heads": vc.num_attention_heads, "intermediate_size": vc.intermediate_size},
                          "text": {"context_length": tc.max_position_embeddings, "hidden_size": tc.hidden_size,
                                   "layers": tc.num_hidden_layers, "heads": tc.num_attention_heads,
                                   "intermediate_size": tc.intermediate_size, "vocab_size": tc.vocab_size}}
            stored["pretrained"] = None
            cfg = ModelConfig.from_dict(stored, source=directory)
        with _no_init_weights():
            vision = CLIPVisionModelWithProjection(vc)
            text = CLIPTextModelWithProjection(tc)
        vision.vision_model, vision.visual_projection = hf.vision_model, hf.visual_projection
        text.text_model, text.text_projection = hf.text_model, hf.text_projection
        model = cls(cfg, _towers=(vision, text))
        with torch.no_grad():
            model.logit_scale.fill_(meta["logit_scale"])
            if "logit_bias" in meta:
                model.logit_bias.fill_(meta["logit_bias"])
        model.max_logit_scale = float(meta.get("max_logit_scale", cfg.max_logit_scale))
        return model

    @classmethod
    def from_config(cls, cfg: ModelConfig, tokenizer: Any = None,
                    zero3_config: Optional[Mapping[str, Any]] = None) -> "CLIPTowers":
        """Random init from ``cfg`` (token ids and vocabulary from a HF tokenizer), or load
        ``cfg.pretrained`` if set. ``zero3_config``: the DeepSpeed config of a ZeRO-3 run, to build
        the towers partitioned (see ``ModelConfig.zero3_init``)."""
        if cfg.pretrained:
            from .openclip import openclip_folder_weights

            weights = cfg.pretrained if os.path.isfile(cfg.pretrained) else openclip_folder_weights(cfg.pretrained)
            if weights is not None:
                model = cls.from_openclip(weights, cfg, tokenizer)
            else:
                model = cls.from_pretrained(cfg.pretrained, cfg)
            if tokenizer is not None and model.text.config.vocab_size < len(tokenizer):
                raise ValueError(f"{cfg.pretrained}: text vocabulary {model.text.config.vocab_size} is "
                                 f"smaller than the tokenizer's {len(tokenizer)}")
            return model
        vocab = len(tokenizer) if tokenizer is not None else None
        return cls(cfg, vocab_size=vocab, zero3_config=zero3_config, **_token_ids(tokenizer))
