"""The ``model`` config section (tower sizes, logit scale/bias, how the towers are built and run)
and what a model of that size costs: stored activations and forward FLOPs.

Design: the dataclasses parse and check the section (``parse_section``; every key known, ranges
and combinations checked at load time, naming the key), so that :mod:`pipeline.config` reads a
run's config without building a model. The costs are computed from the section alone, no model
built: :func:`activation_bytes` decides ``gradient_checkpointing: "auto"``, :func:`forward_flops`
gives the MFU (formula in docs/mfu.md). :func:`ds_param_dtype` is the parameter dtype a DeepSpeed
config implies. This module imports neither transformers nor DeepSpeed; the towers themselves are
:mod:`pipeline.model.model`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any, Mapping, Optional

import torch

from infclip.ops.config import ConfigError, parse_section, require_at_least

from .patch_dropout import kept_patches

__all__ = ["VisionTowerConfig", "TextTowerConfig", "ModelConfig", "ds_param_dtype", "activation_bytes",
           "forward_flops"]


@dataclasses.dataclass
class VisionTowerConfig:
    """``model.vision``: the ViT image tower."""

    image_size: int = 224
    """Input resolution in pixels (square)."""
    patch_size: int = 32
    """Patch side in pixels; ``image_size`` must be a multiple of it."""
    hidden_size: int = 768
    """Transformer width."""
    layers: int = 12
    """Number of transformer blocks."""
    heads: int = 12
    """Attention heads; must divide ``hidden_size``."""
    intermediate_size: Optional[int] = None
    """MLP width (None: 4 * hidden_size)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities (CLIP towers have no other dropout)."""

    def __post_init__(self) -> None:
        _check_tower(self)
        if self.image_size % self.patch_size:
            raise ConfigError(f"'image_size' {self.image_size} is not a multiple of 'patch_size' "
                              f"{self.patch_size}")


@dataclasses.dataclass
class TextTowerConfig:
    """``model.text``: the causal text transformer."""

    context_length: int = 77
    """Tokens per caption (padded/truncated to this by the data pipeline)."""
    hidden_size: int = 512
    """Transformer width."""
    layers: int = 12
    """Number of transformer blocks."""
    heads: int = 8
    """Attention heads; must divide ``hidden_size``."""
    intermediate_size: Optional[int] = None
    """MLP width (None: 4 * hidden_size)."""
    vocab_size: Optional[int] = None
    """Embedding rows (None: the tokenizer's vocabulary size)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""

    def __post_init__(self) -> None:
        _check_tower(self)
        if self.context_length < 2:
            raise ConfigError(f"'context_length' must be >= 2, got {self.context_length}")
        if self.vocab_size is not None and self.vocab_size < 4:
            raise ConfigError(f"'vocab_size' must be >= 4, got {self.vocab_size}")


def _check_tower(cfg: Any) -> None:
    require_at_least(cfg, 1, "hidden_size", "layers", "heads")
    if cfg.hidden_size % cfg.heads:
        raise ConfigError(f"'heads' {cfg.heads} must divide 'hidden_size' {cfg.hidden_size}")
    require_at_least(cfg, 1, "intermediate_size", optional=True)
    if not 0.0 <= cfg.attention_dropout < 1.0:
        raise ConfigError(f"'attention_dropout' must be in [0, 1), got {cfg.attention_dropout}")


@dataclasses.dataclass
class ModelConfig:
    """The ``model`` section: tower sizes, logit scale/bias init, pretrained folder."""

    embed_dim: int = 512
    """Width of the shared image-text embedding (both projections)."""
    vision: Any = None
    """Image tower (object, see :class:`VisionTowerConfig`)."""
    text: Any = None
    """Text tower (object, see :class:`TextTowerConfig`)."""
    init_logit_scale: float = math.log(1 / 0.07)
    """Initial log of the logit scale (CLIP: log(1/0.07); SigLIP: log(10))."""
    max_logit_scale: float = 100.0
    """The multiplier exp(logit_scale) is clamped to this (CLIP's 100)."""
    init_logit_bias: float = -10.0
    """Initial logit bias (used by loss 'siglip' only)."""
    pretrained: Optional[str] = None
    """Local folder written by CLIPTowers.save_pretrained (or a training run's export, or any
    transformers CLIPModel folder), an OpenCLIP state dict file (``.pt``/``.bin`` read
    weights-only, or ``.safetensors``; see :mod:`pipeline.model.openclip`), or an OpenCLIP model folder
    (``open_clip_config.json`` beside its weights: hf-hub's layout, and ``--export-openclip``'s) to
    start from; the tower sizes above are then ignored."""
    hidden_act: Optional[typing.Literal["gelu", "quick_gelu"]] = None
    """The towers' MLP activation. None: ``gelu`` for a new model, a folder's own for a
    pretrained folder, the OpenCLIP config's (``quick_gelu``) for an OpenCLIP file that has one;
    required for an OpenCLIP file without a config (``quick_gelu`` for OpenAI's weights and
    OpenCLIP's ``-quickgelu`` models, ``gelu`` for its others: the weights do not say)."""
    openclip_config: Optional[typing.Union[str, typing.Dict[str, Any]]] = None
    """OpenCLIP import: the model's OpenCLIP config (OpenCLIP's ``model_configs/<name>.json``, or
    an ``open_clip_config.json``), as a file or inline (``{"vision_cfg": {"head_width": 80}}``):
    head widths per tower, QuickGELU, the text pooling token. None: the ``open_clip_config.json``
    beside the weights, if any. Configs the towers cannot express (timm or ResNet image towers, HF
    text towers, attentional or average pooling, ...) are refused, naming the key."""
    openclip_head_width: int = 64
    """OpenCLIP import, for a tower whose head count no OpenCLIP config gives (``head_width`` /
    ``heads``): attention heads = tower width / this (OpenCLIP's default ``head_width``; its
    ViT-H/g/bigG image towers use 80/88/104, which their configs say)."""
    lock_image: bool = False
    """Freeze the image tower (LiT): its parameters get ``requires_grad=False`` and stay out of
    the optimizer (every ZeRO stage)."""
    lock_image_unlocked_blocks: int = 0
    """With ``lock_image``: leave the last N transformer blocks of the image tower, and what comes
    after them (post-LN, projection), trainable. 0: the whole tower frozen."""
    lock_text: bool = False
    """Freeze the text tower (same rules as ``lock_image``)."""
    lock_text_unlocked_blocks: int = 0
    """With ``lock_text``: the last N text blocks (and final LN, projection) stay trainable."""
    gradient_checkpointing: typing.Union[bool, typing.Literal["auto"]] = "auto"
    """Recompute each transformer block in backward (the towers' own activation checkpointing).
    ``"auto"``: decided at the first training forward from the rows it carries (the micro-batch,
    or the chunk of the chunked backbone) and the memory then free on the device: on only when
    the estimated activations (:func:`activation_bytes`) would take more than
    ``checkpointing_memory_fraction`` of it. Checkpointing costs a second forward of every block
    (about a third more FLOPs, and more on the host), so it should be on only where it is needed."""
    checkpointing_memory_fraction: float = 0.6
    """With ``gradient_checkpointing: "auto"``: the share of the free device memory the stored
    activations may take before checkpointing switches on."""
    compile: typing.Union[bool, typing.Literal["auto"]] = "auto"
    """``torch.compile`` the towers (fused layer norms, bias/GELU/residual epilogues, far fewer
    launches): each tower as one graph, or each transformer block alone under ZeRO-3 or
    checkpointing (their hooks stay outside the compiled code). ``"auto"``: on when the towers
    run on a CUDA device. Compiling takes ~1 minute at the first step. Only training runs the
    compiled code; evaluation (``model.eval()``) runs the towers eagerly."""
    compile_backend: str = "inductor"
    """The ``torch.compile`` backend for ``compile`` (``"aot_eager"`` traces without generating
    kernels: a quick check that a setup compiles)."""
    compile_mode: typing.Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = "default"
    """``torch.compile``'s mode: ``"reduce-overhead"`` replays the compiled towers as CUDA graphs
    (fewer launches on the host; more memory): whole towers, and ZeRO-3 layer stacks of flat
    blocks (where blocks compile alone, under ZeRO-3 or checkpointing, or a stack holds its own
    parameters, they use ``"default"``), and not with the chunked backbone."""
    attn_implementation: typing.Literal["sdpa", "eager"] = "sdpa"
    """Attention kernel of the towers: torch's scaled_dot_product_attention (flash / memory-
    efficient kernels, no stored attention matrix) or transformers' eager softmax(QK^T)V."""
    checkpointing_impl: typing.Literal["torch", "deepspeed"] = "torch"
    """With gradient_checkpointing: torch's checkpoint, or DeepSpeed's (configured by DeepSpeed's
    ``activation_checkpointing`` section: partition_activations, cpu_checkpointing, ...)."""
    zero3_init: bool = True
    """ZeRO-3 only: build the towers inside ``deepspeed.zero.Init`` so that no rank ever holds
    the whole model (each keeps its shard from the start); transformers' weight init then runs
    on rank 0 one module at a time, gathered, and is broadcast. Not for ``pretrained``."""
    zero3_leaf_layers: typing.Union[bool, typing.Literal["stack", "tower"]] = True
    """ZeRO-3 only: the unit whose parameters DeepSpeed gathers at once (its "leaf modules").
    ``true``: each transformer block (one fetch per block instead of one per Linear/LayerNorm; one
    block's weights live at a time). ``"stack"``: each tower's whole stack of blocks
    (``pipeline/model/layer_stack.py``): two fetches per step and, compiled, one graph per tower instead
    of one per block, at the cost of a tower's weights live during its forward. ``"tower"``: each
    whole tower (``pipeline/engine/tower_unit.py``): DeepSpeed's hooks on 3 modules instead of 20, a
    tower's weights gathered from its forward to the optimizer step. ``"stack"`` and ``"tower"``
    not with locked towers. ``false``: DeepSpeed's per-module fetch."""
    patch_embedding: typing.Literal["gemm", "conv"] = "gemm"
    """The image tower's patch embedding: ``"gemm"`` cuts the image into its patches and multiplies
    them by the kernel (``pipeline/model/patch_embed.py``; same weights, same results), ``"conv"`` keeps
    transformers' strided convolution, which cuDNN runs with slow generic kernels (on an H200,
    ViT-B/32: 12% of the step's GPU time at micro-batch 256 and 1,024)."""
    patch_dropout: float = 0.0
    """Share of each image's patch tokens the image tower drops in training (FLIP; OpenCLIP's
    ``patch_dropout``): a random subset per image, the class token always kept
    (``pipeline/model/patch_dropout.py``). Evaluation and exports see every patch. 0.5 halves the image
    tower's tokens; in [0, 1)."""
    flat_parameters: typing.Union[bool, typing.Literal["tower"]] = False
    """``true``: hold each transformer block's weights in two parameter tensors (matrices,
    vectors) instead of 16: DeepSpeed's per-tensor host work in every step shrinks with the count
    (ViT-B/32: 399 -> 63 tensors; ``pipeline/model/flat_params.py``). ``"tower"``: each whole tower's
    weights in two (ViT-B/32: 399 -> 6 tensors); under ZeRO-3 only with ``zero3_leaf_layers:
    "tower"`` (the unit that gathers them), where each tower then compiles to one graph, CUDA
    graphs included; not with gradient checkpointing. Checkpoints and exports keep the usual
    names. Unlocked towers; under ZeRO-3 with ``zero3_init`` false (a block's gathered weights
    then stay in memory from its forward to its backward). On an H200 (ViT-B/32, ZeRO-2):
    ``true`` 1.28x at micro-batch 256, 1.045x at 1,024; on in the vitb32 preset."""

    def __post_init__(self) -> None:
        self.vision = _sub(VisionTowerConfig, self.vision, "model.vision")
        self.text = _sub(TextTowerConfig, self.text, "model.text")
        require_at_least(self, 1, "embed_dim", "openclip_head_width")
        for tower in ("image", "text"):
            n = getattr(self, f"lock_{tower}_unlocked_blocks")
            layers = (self.vision if tower == "image" else self.text).layers
            if n < 0 or (n > layers and not self.pretrained):
                raise ConfigError(f"'lock_{tower}_unlocked_blocks' must be in [0, {layers}] (the tower's blocks), got {n}")
        if not 0.0 <= self.patch_dropout < 1.0:
            raise ConfigError(f"'patch_dropout' must be in [0, 1), got {self.patch_dropout}")
        if self.max_logit_scale <= 0:
            raise ConfigError(f"'max_logit_scale' must be > 0, got {self.max_logit_scale}")
        if not 0.0 < self.checkpointing_memory_fraction <= 1.0:
            raise ConfigError(f"'checkpointing_memory_fraction' must be in (0, 1], got "
                              f"{self.checkpointing_memory_fraction}")
        if self.zero3_leaf_layers in ("stack", "tower") and (self.lock_image or self.lock_text):
            raise ConfigError(f"'zero3_leaf_layers': \"{self.zero3_leaf_layers}\" does not support locked towers "
                              "('lock_image' / 'lock_text'); use true")
        if self.flat_parameters and (self.lock_image or self.lock_text):
            raise ConfigError("'flat_parameters' does not support locked towers ('lock_image' / 'lock_text')")
        if self.flat_parameters == "tower" and self.gradient_checkpointing is not False:
            # a recomputed block's backward would add into its tower's flat gradient once per block
            raise ConfigError(f"'flat_parameters': \"tower\" needs 'gradient_checkpointing': false, got "
                              f"{json.dumps(self.gradient_checkpointing)} (use 'flat_parameters': true with checkpointing)")
        if math.exp(self.init_logit_scale) > self.max_logit_scale * (1 + 1e-6):
            raise ConfigError(f"exp('init_logit_scale') = {math.exp(self.init_logit_scale):.4g} "
                              f"exceeds 'max_logit_scale' {self.max_logit_scale}")

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], source: Optional[str] = None) -> "ModelConfig":
        data = dict(data or {})
        for key, sub in (("vision", VisionTowerConfig), ("text", TextTowerConfig)):
            if key in data and not isinstance(data[key], (VisionTowerConfig, TextTowerConfig)):
                data[key] = parse_section(sub, data[key], f"model.{key}", source)
        return parse_section(cls, data, "model", source)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sub(cls, value, section):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    return parse_section(cls, value, section)


def ds_param_dtype(ds_config: Mapping[str, Any]) -> torch.dtype:
    """The dtype DeepSpeed keeps the model's parameters in for this config (``bf16`` /
    ``bfloat16`` enabled, else ``fp16`` enabled, else fp32): the towers' inputs take it too."""
    bf16 = ds_config.get("bf16", ds_config.get("bfloat16")) or {}
    if bf16.get("enabled", False):
        return torch.bfloat16
    if (ds_config.get("fp16") or {}).get("enabled", False):
        return torch.float16
    return torch.float32


def _tower_tokens(cfg: ModelConfig) -> tuple[int, int]:
    """Tokens a training sample takes through the image tower's blocks (its patches after
    ``patch_dropout``, and the class token) and through the text tower's."""
    v = cfg.vision
    return kept_patches((v.image_size // v.patch_size) ** 2, cfg.patch_dropout) + 1, cfg.text.context_length


def _tower_dims(cfg: ModelConfig):
    """(tokens, width, MLP width, heads, blocks) of the vision and the text tower."""
    v, t = cfg.vision, cfg.text
    nv, nt = _tower_tokens(cfg)
    return ((nv, v.hidden_size, v.intermediate_size or 4 * v.hidden_size, v.heads, v.layers),
            (nt, t.hidden_size, t.intermediate_size or 4 * t.hidden_size, t.heads, t.layers))


def activation_bytes(cfg: ModelConfig, rows: int, element_bytes: int = 2) -> int:
    """Activations a training forward of ``rows`` samples keeps for backward, without
    checkpointing: per block and sample 9 s d + 2 s f elements (layer-norm inputs and outputs,
    Q, K, V, the attention output, the MLP's two wide tensors), plus the s x s attention
    probabilities twice per head with eager attention (SDPA keeps only a row statistic)."""
    total = 0
    for s, d, f, heads, blocks in _tower_dims(cfg):
        per_block = (9 * s * d + 2 * s * f) * element_bytes
        if cfg.attn_implementation == "eager":
            per_block += 2 * heads * s * s * element_bytes
        total += blocks * per_block
    return rows * total


def forward_flops(cfg: ModelConfig) -> int:
    """Matrix FLOPs (2 x multiply-adds) of one sample's forward through both towers: the patch
    embedding, each block's Q/K/V/output projections, attention scores and weighted sum, and
    MLP, and the two output projections. With ``patch_dropout`` the image tower's blocks count the
    kept tokens (the patch embedding still runs over every patch): the FLOPs the step does.
    Training is 3x this (the backward is twice the forward; recomputation by checkpointing or the
    chunked backbone is not counted). Formula in docs/mfu.md."""
    v = cfg.vision
    patches = (v.image_size // v.patch_size) ** 2
    flops = 2 * patches * 3 * v.patch_size ** 2 * v.hidden_size
    for s, d, f, _heads, blocks in _tower_dims(cfg):
        flops += blocks * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
        flops += 2 * d * cfg.embed_dim
    return flops
