"""OpenCLIP checkpoints -> the HF CLIP towers of :class:`~pipeline.model.CLIPTowers`.

An OpenCLIP state dict (``visual.conv1.weight``, ``visual.transformer.resblocks.N.attn.in_proj_weight``,
``token_embedding.weight``, ``text_projection``, ``logit_scale``, ...; also a training checkpoint's
``{"state_dict": ...}`` with ``module.`` prefixes) is read weights-only (``torch.load(...,
weights_only=True)`` or safetensors), the tower sizes are read off its shapes (heads = width /
``model.openclip_head_width``), and each tensor is renamed to HF's CLIP names: the fused
``in_proj`` is split into q/k/v, the output projections (``visual.proj``, ``text_projection``,
stored [width, embed]) are transposed. OpenCLIP's OpenAI models use QuickGELU: the activation is
``model.hidden_act`` and must be given (it is not in the weights).
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional

import torch
from torch import Tensor

from infclip.ops.config import ConfigError

__all__ = ["is_openclip_file", "load_openclip_state_dict", "openclip_hf_configs", "openclip_to_hf"]

_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
          "attn.out_proj": "self_attn.out_proj"}
_IGNORED = ("attn_mask",)  # OpenCLIP's causal-mask buffer (HF builds its own)


def is_openclip_file(path: str) -> bool:
    """A file (not a folder): ``model.pretrained`` then names an OpenCLIP state dict."""
    return os.path.isfile(path)


def load_openclip_state_dict(path: str) -> dict[str, Tensor]:
    """The state dict in ``path`` (``.safetensors``, or a torch file read with ``weights_only``),
    unwrapped from a training checkpoint's ``state_dict`` and stripped of ``module.``."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        sd = load_file(path, device="cpu")
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping) or "visual.conv1.weight" not in {k.removeprefix("module.") for k in sd}:
        raise ValueError(f"{path}: not an OpenCLIP ViT state dict (no 'visual.conv1.weight')")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def _blocks(sd: Mapping[str, Tensor], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in sd for m in [pat.match(k)] if m}
    return max(found) + 1 if found else 0


def _heads(width: int, head_width: int, key: str) -> int:
    if width % head_width:
        raise ConfigError(f"{key}: width {width} is not a multiple of model.openclip_head_width {head_width}")
    return width // head_width


def openclip_hf_configs(sd: Mapping[str, Tensor], hidden_act: str, head_width: int,
                        token_ids: Mapping[str, Optional[int]], attn_implementation: str = "sdpa"):
    """(CLIPVisionConfig, CLIPTextConfig, model-section dict) read off the state dict's shapes."""
    from transformers import CLIPTextConfig, CLIPVisionConfig

    conv = sd["visual.conv1.weight"]
    width, patch = int(conv.shape[0]), int(conv.shape[-1])
    grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    embed = int(sd["visual.proj"].shape[1])
    v_layers = _blocks(sd, "visual.transformer.resblocks.")
    v_mlp = int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0])
    t_width = int(sd["token_embedding.weight"].shape[1])
    vocab = int(sd["token_embedding.weight"].shape[0])
    ctx = int(sd["positional_embedding"].shape[0])
    t_layers = _blocks(sd, "transformer.resblocks.")
    t_mlp = int(sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0])
    v_heads = _heads(width, head_width, "visual")
    t_heads = _heads(t_width, head_width, "text")
    vision = CLIPVisionConfig(hidden_size=width, intermediate_size=v_mlp, projection_dim=embed,
                              num_hidden_layers=v_layers, num_attention_heads=v_heads, image_size=grid * patch,
                              patch_size=patch, hidden_act=hidden_act)
    ids = dict(token_ids)  # a tokenizer's ids; None: no such token (no BOS where its BOS is its EOS)
    if ids.get("eos_token_id") is None:
        ids["eos_token_id"] = vocab - 1  # OpenAI's BPE: <end_of_text> is the last id (49407)
    text = CLIPTextConfig(vocab_size=vocab, hidden_size=t_width, intermediate_size=t_mlp, projection_dim=embed,
                          num_hidden_layers=t_layers, num_attention_heads=t_heads, max_position_embeddings=ctx,
                          hidden_act=hidden_act, **ids)
    for hf in (vision, text):
        hf._attn_implementation = attn_implementation
    section = {"embed_dim": embed, "hidden_act": hidden_act, "openclip_head_width": head_width,
               "vision": {"image_size": grid * patch, "patch_size": patch, "hidden_size": width, "layers": v_layers,
                          "heads": v_heads, "intermediate_size": v_mlp},
               "text": {"context_length": ctx, "hidden_size": t_width, "layers": t_layers, "heads": t_heads,
                        "intermediate_size": t_mlp, "vocab_size": vocab}}
    return vision, text, section


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
        raise ValueError(f"OpenCLIP state dict has keys this conversion does not support (layer scale, attention "
                         f"pooling, a non-ViT tower?): {', '.join(unknown[:5])}")
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
