"""OpenCLIP checkpoints <-> the HF CLIP towers of :class:`~pipeline.model.model.CLIPTowers`.

In: an OpenCLIP state dict (``visual.conv1.weight``, ``visual.transformer.resblocks.N.attn.in_proj_weight``,
``token_embedding.weight``, ``text_projection``, ``logit_scale``, ...; also a training checkpoint's
``{"state_dict": ...}`` with ``module.`` prefixes, and ``CustomTextCLIP``'s ``text.``-prefixed text
keys) is read weights-only (``torch.load(..., weights_only=True)`` or safetensors). The tower sizes
are read off its shapes; what the shapes do not say (the image tower's head width, the text tower's
heads, QuickGELU, the text pooling token) comes from the OpenCLIP model config when there is one
(:func:`read_openclip_config`: ``model.openclip_config``, or ``open_clip_config.json`` beside the
weights), else from ``model.openclip_head_width`` and ``model.hidden_act``. Each tensor is renamed to
HF's CLIP names: the fused ``in_proj`` is split into q/k/v, the output projections (``visual.proj``,
``text_projection``, stored [width, embed]) are transposed, and a layer scale (``ls_1`` / ``ls_2``,
OpenCLIP's ``ls_init_value``) is folded into the output projection it scales (the same features; the
fine-tuned model then trains the product).

Out: :func:`towers_to_openclip` is the inverse: the state dict and the model config
(``open_clip_config.json``'s ``model_cfg``) of an OpenCLIP ``CLIP`` with the same features, text
pooled at the tokenizer's EOS (``pool_type: "eos"``).

Limit: OpenCLIP configs whose towers are not these (timm or ResNet image towers, HF text towers,
attentional or average pooling, no pre-LayerNorm, bidirectional text, CoCa, ...) are refused,
naming the key and what the towers lack (:func:`openclip_spec`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from typing import Any, Mapping, Optional, Union

import torch
from torch import Tensor

from infclip.ops.config import ConfigError

__all__ = ["OPENCLIP_CONFIG_FILE", "OPENCLIP_WEIGHTS_FILE", "OpenCLIPSpec", "load_into", "load_openclip_state_dict",
           "openclip_folder_weights", "openclip_hf_configs", "openclip_spec", "openclip_to_hf",
           "read_openclip_config", "towers_to_openclip"]

logger = logging.getLogger(__name__)

# image tower width -> head width of OpenCLIP's ViT-H, g, bigG and e (not 64): a bare file of one of
# them imports with the wrong heads unless a config says so
_WIDE_HEADS = {1280: 80, 1408: 88, 1664: 104, 1792: 112}

OPENCLIP_CONFIG_FILE = "open_clip_config.json"
"""OpenCLIP's name for a model's config beside its weights (hf-hub and ``local-dir:`` folders)."""
OPENCLIP_WEIGHTS_FILE = "open_clip_model.safetensors"
"""The weights file OpenCLIP looks for first in a ``local-dir:`` folder."""

_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
          "attn.out_proj": "self_attn.out_proj"}
_IGNORED = ("attn_mask",)  # OpenCLIP's causal-mask buffer (HF builds its own)
_CUSTOM_TEXT = ("token_embedding.", "positional_embedding", "transformer.", "ln_final.", "text_projection")

# OpenCLIP model-config keys, per part. Keys in _TAKEN are sizes (checked against the weights), what
# this import reads, or what does not change the features; a key in _REFUSED must keep one of
# OpenCLIP's default values, else the towers cannot express the model (the text says what is missing).
_TAKEN = {
    "model": {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "init_logit_scale", "init_logit_bias",
              "custom_text", "cast_dtype"},
    "vision_cfg": {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio", "ls_init_value",
                   "patch_dropout", "output_tokens", "final_ln_after_pool", "attn_pooler_queries",
                   "attn_pooler_heads", "timm_model_pretrained", "timm_pool", "timm_proj", "timm_proj_bias",
                   "timm_drop", "timm_drop_path"},
    "text_cfg": {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "ls_init_value",
                 "pool_type", "eos_id", "pad_id", "hf_tokenizer_name", "tokenizer_mode", "tokenizer_kwargs",
                 "output_tokens", "final_ln_after_pool", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type"},
}
_CUSTOM_BLOCK = "custom attention blocks"
_BLOCK_REFUSED = {  # either tower's transformer blocks: only CLIP's plain pre-LN block is expressed
    "act_kwargs": ((None, {}), "activation arguments"), "norm_kwargs": ((None, {}), "LayerNorm arguments"),
    "block_type": ((None, "default"), _CUSTOM_BLOCK), "qk_norm": ((False,), "q/k normalisation"),
    "scaled_cosine_attn": ((False,), "scaled cosine attention"), "scale_heads": ((False,), "head scales"),
    "scale_attn_inner": ((False,), _CUSTOM_BLOCK), "scale_attn": ((False,), _CUSTOM_BLOCK),
    "scale_fc": ((False,), _CUSTOM_BLOCK)}
_REFUSED = {
    "model": {"multimodal_cfg": ((None,), "a CoCa model (multimodal text decoder)")},
    "vision_cfg": {
        "timm_model_name": ((None,), "a timm image tower (the towers are ViTs)"),
        "attentional_pool": ((False,), "attentional pooling"),
        "no_ln_pre": ((False,), "an image tower without its pre-LayerNorm"),
        "pool_type": (("tok",), "image pooling other than the class token"),
        "pos_embed_type": (("learnable",), "fixed sin-cos position embeddings"),
        **_BLOCK_REFUSED},
    "text_cfg": {
        "hf_model_name": ((None,), "an HF transformers text tower (the text tower is CLIP's)"),
        "embed_cls": ((False,), "a text class token (CoCa)"),
        "no_causal_mask": ((False,), "a bidirectional text tower (it is causal)"),
        "proj_bias": ((False,), "a text projection bias"),
        "proj_type": (("linear",), "a text tower without projection"),
        **_BLOCK_REFUSED},
}


@dataclasses.dataclass(frozen=True)
class OpenCLIPSpec:
    """What an OpenCLIP model config says beyond the weights' shapes (all None: no config)."""

    vision_head_width: Optional[int] = None
    """``vision_cfg.head_width``; None where the config leaves it out (``model.openclip_head_width``
    then, whose default is OpenCLIP's 64)."""
    text_heads: Optional[int] = None
    """``text_cfg.heads``; None where the config leaves it out (the text width /
    ``model.openclip_head_width`` then)."""
    quick_gelu: Optional[bool] = None
    """The towers' activation: QuickGELU (OpenAI's weights) or GELU; a config without the key means
    GELU, as in OpenCLIP."""
    text_eos_id: Optional[int] = None
    """With ``text_cfg.pool_type: "eos"``: the token the text tower pools (else the highest id: OpenAI's EOS)."""
    sizes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``{"embed_dim", "vision.width", ...}`` as the config gives them, to check against the weights."""
    source: str = ""
    """Where the config came from (for messages)."""

    def hidden_act(self, configured: Optional[str], weights: str) -> str:
        """The towers' activation: the config's, else ``model.hidden_act`` (required then: the weights
        do not say); both given and different is an error."""
        said = None if self.quick_gelu is None else ("quick_gelu" if self.quick_gelu else "gelu")
        if said and configured and said != configured:
            raise ConfigError(f"{weights}: model.hidden_act is {configured!r} but the OpenCLIP config {self.source} "
                              f"says {said!r} (quick_gelu: {self.quick_gelu})")
        if said or configured:
            return said or configured
        raise ConfigError(f"{weights}: an OpenCLIP checkpoint needs model.hidden_act: 'quick_gelu' (OpenAI's weights, "
                          "OpenCLIP's -quickgelu models) or 'gelu' (its other models), or model.openclip_config "
                          f"(or an {OPENCLIP_CONFIG_FILE} beside the weights); the weights do not say")


def read_openclip_config(value: Union[None, str, Mapping[str, Any]], weights: str) -> Optional[tuple[dict, str]]:
    """``(model config, source)``: ``value`` itself (an object), the JSON file it names, or with
    ``value`` None the ``open_clip_config.json`` beside ``weights``; None when there is none. A
    hf-hub style file (``{"model_cfg": ..., "preprocess_cfg": ...}``) gives its ``model_cfg``."""
    if value is None:
        beside = os.path.join(os.path.dirname(os.path.abspath(weights)), OPENCLIP_CONFIG_FILE)
        if not os.path.isfile(beside):
            return None
        value = beside
    if isinstance(value, str):
        try:
            with open(value) as f:
                data, source = json.load(f), value
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.openclip_config: cannot read {value} ({exc})") from None
    else:
        data, source = dict(value), "model.openclip_config"
    if isinstance(data, Mapping) and isinstance(data.get("model_cfg"), Mapping):
        data = data["model_cfg"]
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: an OpenCLIP model config must be a JSON object")
    return dict(data), source


def _check_keys(part: str, cfg: Mapping[str, Any], source: str) -> None:
    for key, value in cfg.items():
        if key in _TAKEN[part]:
            continue
        if key not in _REFUSED[part]:
            raise ConfigError(f"{source}: OpenCLIP {part} key '{key}' is not known to this import")
        defaults, missing = _REFUSED[part][key]
        if value not in defaults:
            raise ConfigError(f"{source}: {part}.{key} = {json.dumps(value)} needs {missing}, which the HF CLIP "
                              "towers do not have")


def openclip_spec(found: Optional[tuple[dict, str]]) -> OpenCLIPSpec:
    """The :class:`OpenCLIPSpec` of a :func:`read_openclip_config` result; a config the towers
    cannot express raises :class:`ConfigError` naming the key and what is missing."""
    if found is None:
        return OpenCLIPSpec()
    cfg, source = found
    vision, text = dict(cfg.get("vision_cfg") or {}), dict(cfg.get("text_cfg") or {})
    if isinstance(vision.get("layers"), (list, tuple)):
        raise ConfigError(f"{source}: vision_cfg.layers {vision['layers']} is a ResNet image tower; the towers are "
                          "ViTs")
    for part, section in (("model", cfg), ("vision_cfg", vision), ("text_cfg", text)):
        _check_keys(part, section, source)
    pool = text.get("pool_type", "argmax")
    if pool not in ("argmax", "eos"):
        raise ConfigError(f"{source}: text_cfg.pool_type {pool!r} needs pooling other than at the EOS token, which "
                          "the HF CLIP text tower does not have")
    for key in ("image_size", "patch_size"):
        value = vision.get(key)
        if isinstance(value, (list, tuple)):
            if len(set(value)) != 1:
                raise ConfigError(f"{source}: vision_cfg.{key} {list(value)} is not square, which the HF CLIP image "
                                  "tower does not take")
            vision[key] = value[0]
    sizes = {"embed_dim": cfg.get("embed_dim")}
    sizes.update({f"vision.{k}": vision.get(k) for k in ("width", "layers", "patch_size", "image_size")})
    sizes.update({f"text.{k}": text.get(k) for k in ("width", "layers", "context_length", "vocab_size")})
    for tower, section in (("vision", vision), ("text", text)):
        if "mlp_ratio" in section and "width" in section:
            sizes[f"{tower}.mlp"] = int(section["width"] * section["mlp_ratio"])  # OpenCLIP's own rounding
    head_width = vision.get("head_width")
    return OpenCLIPSpec(vision_head_width=None if head_width is None else int(head_width), text_heads=text.get("heads"),
                        quick_gelu=bool(cfg.get("quick_gelu", False)),
                        text_eos_id=int(text.get("eos_id", 2)) if pool == "eos" else None,
                        sizes={k: v for k, v in sizes.items() if v is not None}, source=source)


def openclip_folder_weights(folder: str) -> Optional[str]:
    """The weights file of an OpenCLIP model folder (``open_clip_config.json`` beside its weights,
    as hf-hub and :func:`towers_to_openclip`'s export lay it out), in OpenCLIP's order of names;
    None when ``folder`` is not one."""
    if not os.path.isfile(os.path.join(folder, OPENCLIP_CONFIG_FILE)):
        return None
    for name in (OPENCLIP_WEIGHTS_FILE, "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                 "open_clip_pytorch_model.pth"):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise FileNotFoundError(f"{folder} has an {OPENCLIP_CONFIG_FILE} but no OpenCLIP weights ({OPENCLIP_WEIGHTS_FILE})")


def load_openclip_state_dict(path: str) -> dict[str, Tensor]:
    """The state dict in ``path`` (``.safetensors``, or a torch file read with ``weights_only``),
    unwrapped from a training checkpoint's ``state_dict``, stripped of ``module.``, with
    ``CustomTextCLIP``'s ``text.`` keys at the top (as ``CLIP`` names them) and layer scales folded."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        sd = load_file(path, device="cpu")
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping) or "visual.conv1.weight" not in {k.removeprefix("module.") for k in sd}:
        raise ValueError(f"{path}: not an OpenCLIP ViT state dict (no 'visual.conv1.weight')")
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    sd = {(k[5:] if k.startswith("text.") and k[5:].startswith(_CUSTOM_TEXT) else k): v for k, v in sd.items()}
    return _fold_layer_scale(sd)


def _fold_layer_scale(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``x + gamma * (W h + b)`` is ``x + (gamma W) h + gamma b``: each ``ls_1.gamma`` /
    ``ls_2.gamma`` multiplied into the rows of the attention / MLP output projection it follows."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith((".ls_1.gamma", ".ls_2.gamma"))]:
        block = key[: -len("ls_1.gamma")]
        proj = "attn.out_proj" if key.endswith("ls_1.gamma") else "mlp.c_proj"
        gamma = out.pop(key).float()
        for kind in ("weight", "bias"):
            name = f"{block}{proj}.{kind}"
            value = out[name]
            out[name] = (value.float() * (gamma[:, None] if kind == "weight" else gamma)).to(value.dtype)
    return out


def _blocks(sd: Mapping[str, Tensor], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in sd for m in [pat.match(k)] if m}
    return max(found) + 1 if found else 0


def _heads(width: int, head_width: int, key: str, source: str) -> int:
    if width % head_width:
        raise ConfigError(f"{key}: width {width} is not a multiple of the head width {head_width} ({source})")
    return width // head_width


def _check_sizes(spec: OpenCLIPSpec, shapes: Mapping[str, int]) -> None:
    for key, said in spec.sizes.items():
        if key in shapes and int(said) != shapes[key]:
            raise ConfigError(f"{spec.source}: the OpenCLIP config gives {key} = {said}, the weights {shapes[key]}")


def openclip_hf_configs(sd: Mapping[str, Tensor], hidden_act: str, head_width: int,
                        token_ids: Mapping[str, Optional[int]], attn_implementation: str = "sdpa",
                        spec: OpenCLIPSpec = OpenCLIPSpec()):
    """(CLIPVisionConfig, CLIPTextConfig, model-section dict) read off the state dict's shapes; the
    image tower's heads are its width / ``spec.vision_head_width`` (else ``head_width``), the text
    tower's ``spec.text_heads`` (else its width / ``head_width``)."""
    from transformers import CLIPTextConfig, CLIPVisionConfig

    conv = sd["visual.conv1.weight"]
    width, patch = int(conv.shape[0]), int(conv.shape[-1])
    grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    t_width = int(sd["token_embedding.weight"].shape[1])
    shapes = {"embed_dim": int(sd["visual.proj"].shape[1]), "vision.width": width, "vision.patch_size": patch,
              "vision.image_size": grid * patch, "vision.layers": _blocks(sd, "visual.transformer.resblocks."),
              "vision.mlp": int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
              "text.width": t_width, "text.vocab_size": int(sd["token_embedding.weight"].shape[0]),
              "text.context_length": int(sd["positional_embedding"].shape[0]),
              "text.layers": _blocks(sd, "transformer.resblocks."),
              "text.mlp": int(sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0])}
    _check_sizes(spec, shapes)
    source = spec.source or "model.openclip_head_width"
    if spec.vision_head_width is None and _WIDE_HEADS.get(width, head_width) != head_width:
        logger.warning("OpenCLIP image tower of width %d without an OpenCLIP config: heads of %d as "
                       "model.openclip_head_width says, but OpenCLIP's ViTs of this width use %d (set "
                       "model.openclip_config, e.g. {\"vision_cfg\": {\"head_width\": %d}})", width, head_width,
                       _WIDE_HEADS[width], _WIDE_HEADS[width])
    v_heads = _heads(width, spec.vision_head_width or head_width, "visual", source)
    t_heads = spec.text_heads or _heads(t_width, head_width, "text", source)
    if t_width % t_heads:
        raise ConfigError(f"{spec.source}: text_cfg.heads {t_heads} does not divide the text width {t_width}")
    embed, vocab = shapes["embed_dim"], shapes["text.vocab_size"]
    vision = CLIPVisionConfig(hidden_size=width, intermediate_size=shapes["vision.mlp"], projection_dim=embed,
                              num_hidden_layers=shapes["vision.layers"], num_attention_heads=v_heads,
                              image_size=grid * patch, patch_size=patch, hidden_act=hidden_act)
    text = CLIPTextConfig(vocab_size=vocab, hidden_size=t_width, intermediate_size=shapes["text.mlp"],
                          projection_dim=embed, num_hidden_layers=shapes["text.layers"], num_attention_heads=t_heads,
                          max_position_embeddings=shapes["text.context_length"], hidden_act=hidden_act,
                          **_text_token_ids(token_ids, spec, vocab))
    for hf in (vision, text):
        hf._attn_implementation = attn_implementation
    section = {"embed_dim": embed, "hidden_act": hidden_act,
               "vision": {"image_size": grid * patch, "patch_size": patch, "hidden_size": width,
                          "layers": shapes["vision.layers"], "heads": v_heads,
                          "intermediate_size": shapes["vision.mlp"]},
               "text": {"context_length": shapes["text.context_length"], "hidden_size": t_width,
                        "layers": shapes["text.layers"], "heads": t_heads, "intermediate_size": shapes["text.mlp"],
                        "vocab_size": vocab}}
    return vision, text, section


def _text_token_ids(token_ids: Mapping[str, Optional[int]], spec: OpenCLIPSpec, vocab: int) -> dict:
    """The text config's token ids: a tokenizer's (None: no such token, e.g. no BOS where its BOS
    is its EOS), the EOS the OpenCLIP config pools at (``pool_type: "eos"``), else OpenAI's
    (<end_of_text> is the last id, 49407, which OpenCLIP's argmax pooling finds)."""
    ids = dict(token_ids)
    eos = ids.get("eos_token_id")
    if spec.text_eos_id is not None and eos is not None and eos != spec.text_eos_id:
        raise ConfigError(f"{spec.source}: the text tower pools at eos_id {spec.text_eos_id}, the tokenizer's EOS "
                          f"is {eos}")
    if eos is None:
        ids["eos_token_id"] = spec.text_eos_id if spec.text_eos_id is not None else vocab - 1
    return ids


def openclip_to_hf(sd: Mapping[str, Tensor]) -> tuple[dict, dict, dict]:
    """``(vision, text, extra)`` state dicts with HF names (``CLIPVisionModelWithProjection`` /
    ``CLIPTextModelWithProjection``); ``extra`` has ``logit_scale`` (and ``logit_bias``). Each HF
    value is paired with the OpenCLIP key it came from: ``{hf_name: (openclip_key, tensor)}``."""
    vision: dict = {}
    text: dict = {}
    extra: dict = {}
    used = set()

    def take(key):
        used.add(key)
        return sd[key]

    def block(out, hf_prefix, oc_prefix, layers):
        for i in range(layers):
            oc, hf = f"{oc_prefix}{i}.", f"{hf_prefix}{i}."
            for kind in ("weight", "bias"):
                key = f"{oc}attn.in_proj_{kind}"
                for name, part in zip(("q", "k", "v"), take(key).chunk(3, dim=0)):
                    out[f"{hf}self_attn.{name}_proj.{kind}"] = (key, part)
                for src, dst in _BLOCK.items():
                    key = f"{oc}{src}.{kind}"
                    out[f"{hf}{dst}.{kind}"] = (key, take(key))

    vision["vision_model.embeddings.patch_embedding.weight"] = ("visual.conv1.weight", take("visual.conv1.weight"))
    vision["vision_model.embeddings.class_embedding"] = ("visual.class_embedding", take("visual.class_embedding"))
    vision["vision_model.embeddings.position_embedding.weight"] = (
        "visual.positional_embedding", take("visual.positional_embedding"))
    for src, dst in (("visual.ln_pre", "vision_model.pre_layrnorm"), ("visual.ln_post", "vision_model.post_layernorm")):
        for kind in ("weight", "bias"):
            vision[f"{dst}.{kind}"] = (f"{src}.{kind}", take(f"{src}.{kind}"))
    block(vision, "vision_model.encoder.layers.", "visual.transformer.resblocks.",
          _blocks(sd, "visual.transformer.resblocks."))
    vision["visual_projection.weight"] = ("visual.proj", take("visual.proj").t())

    text["text_model.embeddings.token_embedding.weight"] = ("token_embedding.weight", take("token_embedding.weight"))
    text["text_model.embeddings.position_embedding.weight"] = ("positional_embedding", take("positional_embedding"))
    for kind in ("weight", "bias"):
        text[f"text_model.final_layer_norm.{kind}"] = (f"ln_final.{kind}", take(f"ln_final.{kind}"))
    block(text, "text_model.encoder.layers.", "transformer.resblocks.", _blocks(sd, "transformer.resblocks."))
    text["text_projection.weight"] = ("text_projection", take("text_projection").t())

    for key in ("logit_scale", "logit_bias"):
        if key in sd:
            extra[key] = take(key)
    unknown = sorted(k for k in sd if k not in used and not k.endswith(_IGNORED))
    if unknown:
        raise ValueError(f"OpenCLIP state dict has keys this conversion does not support (attention pooling, "
                         f"a non-ViT tower?): {', '.join(unknown[:5])}")
    return vision, text, extra


def load_into(module: torch.nn.Module, converted: Mapping[str, tuple[str, Tensor]], source: str) -> None:
    """Copy ``converted`` into ``module``'s parameters, every name present, shapes equal: the first
    mismatch is an error naming the OpenCLIP key and both shapes."""
    own = dict(module.named_parameters())
    missing = sorted(set(own) - set(converted))
    if missing:
        raise ValueError(f"{source}: no OpenCLIP tensor for {missing[0]} ({len(missing)} missing)")
    with torch.no_grad():
        for name, (key, value) in converted.items():
            if name not in own:
                raise ValueError(f"{source}: {key} maps to {name}, which the tower does not have")
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(f"{source}: shape mismatch at {key}: {tuple(value.shape)} in the checkpoint, "
                                 f"{tuple(own[name].shape)} expected for {name}")
            own[name].copy_(value.to(own[name].dtype))


def _mlp_ratio(width: int, mlp: int) -> float:
    """A ratio whose ``int(width * ratio)`` (OpenCLIP's MLP width) is ``mlp``."""
    ratio = mlp / width
    return ratio if int(width * ratio) == mlp else (mlp + 0.5) / width


def towers_to_openclip(model: Any, *, logit_bias: bool = False) -> tuple[dict[str, Tensor], dict]:
    """``(state_dict, model_cfg)`` of an OpenCLIP ``CLIP`` with ``model``'s features (a
    :class:`~pipeline.model.model.CLIPTowers`, fp32 on the CPU): fused q/k/v, [width, embed]
    projections, ``logit_scale`` the log of the multiplier training used (clamped to
    ``max_logit_scale``), text pooled at the tokenizer's EOS (``pool_type: "eos"``). With
    ``logit_bias`` (a SigLIP run) the bias and ``init_logit_bias`` are written too."""
    vis = {k: v.detach().float().cpu() for k, v in model.vision.state_dict().items()}
    txt = {k: v.detach().float().cpu() for k, v in model.text.state_dict().items()}
    vc, tc = model.vision.config, model.text.config
    inverse = {hf: oc for oc, hf in _BLOCK.items()}
    sd: dict[str, Tensor] = {}

    def blocks(src, hf_prefix, oc_prefix, layers):
        for i in range(layers):
            hf, oc = f"{hf_prefix}{i}.", f"{oc_prefix}{i}."
            for kind in ("weight", "bias"):
                sd[f"{oc}attn.in_proj_{kind}"] = torch.cat([src[f"{hf}self_attn.{n}_proj.{kind}"] for n in "qkv"])
                for hf_name, oc_name in inverse.items():
                    sd[f"{oc}{oc_name}.{kind}"] = src[f"{hf}{hf_name}.{kind}"]

    sd["visual.conv1.weight"] = vis["vision_model.embeddings.patch_embedding.weight"]
    sd["visual.class_embedding"] = vis["vision_model.embeddings.class_embedding"]
    sd["visual.positional_embedding"] = vis["vision_model.embeddings.position_embedding.weight"]
    for oc, hf in (("visual.ln_pre", "vision_model.pre_layrnorm"), ("visual.ln_post", "vision_model.post_layernorm")):
        for kind in ("weight", "bias"):
            sd[f"{oc}.{kind}"] = vis[f"{hf}.{kind}"]
    blocks(vis, "vision_model.encoder.layers.", "visual.transformer.resblocks.", vc.num_hidden_layers)
    sd["visual.proj"] = vis["visual_projection.weight"].t()
    sd["token_embedding.weight"] = txt["text_model.embeddings.token_embedding.weight"]
    sd["positional_embedding"] = txt["text_model.embeddings.position_embedding.weight"]
    for kind in ("weight", "bias"):
        sd[f"ln_final.{kind}"] = txt[f"text_model.final_layer_norm.{kind}"]
    blocks(txt, "text_model.encoder.layers.", "transformer.resblocks.", tc.num_hidden_layers)
    sd["text_projection"] = txt["text_projection.weight"].t()
    scale = min(float(model.logit_scale.detach().float().reshape(-1)[0]), math.log(model.max_logit_scale))
    sd["logit_scale"] = torch.tensor(scale)
    cfg = {"embed_dim": int(vc.projection_dim), "quick_gelu": vc.hidden_act == "quick_gelu",
           "vision_cfg": {"image_size": int(vc.image_size), "patch_size": int(vc.patch_size),
                          "width": int(vc.hidden_size), "layers": int(vc.num_hidden_layers),
                          "head_width": int(vc.hidden_size) // int(vc.num_attention_heads),
                          "mlp_ratio": _mlp_ratio(int(vc.hidden_size), int(vc.intermediate_size))},
           "text_cfg": {"context_length": int(tc.max_position_embeddings), "vocab_size": int(tc.vocab_size),
                        "width": int(tc.hidden_size), "heads": int(tc.num_attention_heads),
                        "layers": int(tc.num_hidden_layers),
                        "mlp_ratio": _mlp_ratio(int(tc.hidden_size), int(tc.intermediate_size)),
                        "pool_type": "eos", "eos_id": int(model.eos_token_id)}}
    if logit_bias:
        bias = float(model.logit_bias.detach().float().reshape(-1)[0])
        sd["logit_bias"] = torch.tensor(bias)
        cfg["init_logit_bias"] = bias
    return {k: v.contiguous() for k, v in sd.items()}, cfg
