"""model.pretrained = an OpenCLIP state dict file: converted to the HF towers, checked against a
plain-torch OpenCLIP-style forward computed from the OpenCLIP-named tensors themselves."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from infclip.ops.config import ConfigError
from infclip.pipeline.model import CLIPTowers
from infclip.pipeline.model_config import ModelConfig

HEAD_WIDTH = 8


def _openclip_state_dict(seed: int = 0) -> dict:
    """OpenCLIP's names and shapes (ViT, width 16, 2 heads of 8), random values."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    sd = {}

    def blocks(prefix, layers, width, mlp):
        for i in range(layers):
            b = f"{prefix}{i}."
            sd[b + "attn.in_proj_weight"] = r(3 * width, width)
            sd[b + "attn.in_proj_bias"] = r(3 * width)
            sd[b + "attn.out_proj.weight"] = r(width, width)
            sd[b + "attn.out_proj.bias"] = r(width)
            for ln in ("ln_1", "ln_2"):
                sd[b + ln + ".weight"] = 1 + r(width)
                sd[b + ln + ".bias"] = r(width)
            sd[b + "mlp.c_fc.weight"] = r(mlp, width)
            sd[b + "mlp.c_fc.bias"] = r(mlp)
            sd[b + "mlp.c_proj.weight"] = r(width, mlp)
            sd[b + "mlp.c_proj.bias"] = r(width)

    vw, tw, embed, patch, grid, ctx, vocab = 16, 24, 12, 4, 3, 8, 50
    sd["visual.conv1.weight"] = r(vw, 3, patch, patch)
    sd["visual.class_embedding"] = r(vw)
    sd["visual.positional_embedding"] = r(grid * grid + 1, vw)
    sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"] = 1 + r(vw), r(vw)
    blocks("visual.transformer.resblocks.", 2, vw, 4 * vw)
    sd["visual.ln_post.weight"], sd["visual.ln_post.bias"] = 1 + r(vw), r(vw)
    sd["visual.proj"] = r(vw, embed)
    sd["token_embedding.weight"] = r(vocab, tw)
    sd["positional_embedding"] = r(ctx, tw)
    blocks("transformer.resblocks.", 3, tw, 2 * tw)
    sd["ln_final.weight"], sd["ln_final.bias"] = 1 + r(tw), r(tw)
    sd["text_projection"] = r(tw, embed)
    sd["logit_scale"] = torch.tensor(math.log(50.0))
    sd["attn_mask"] = torch.full((ctx, ctx), float("-inf")).triu(1)  # OpenCLIP's buffer, ignored
    return sd


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def _resblock(sd, b, x, heads, mask=None):
    """OpenCLIP's ResidualAttentionBlock (nn.MultiheadAttention with in_proj), [B, S, W]."""
    bsz, s, w = x.shape
    h = F.layer_norm(x, (w,), sd[b + "ln_1.weight"], sd[b + "ln_1.bias"], 1e-5)
    q, k, v = F.linear(h, sd[b + "attn.in_proj_weight"], sd[b + "attn.in_proj_bias"]).chunk(3, dim=-1)
    q, k, v = (t.reshape(bsz, s, heads, w // heads).transpose(1, 2) for t in (q, k, v))
    att = q @ k.transpose(-1, -2) / math.sqrt(w // heads)
    if mask is not None:
        att = att + mask
    o = (att.softmax(-1) @ v).transpose(1, 2).reshape(bsz, s, w)
    x = x + F.linear(o, sd[b + "attn.out_proj.weight"], sd[b + "attn.out_proj.bias"])
    h = F.layer_norm(x, (w,), sd[b + "ln_2.weight"], sd[b + "ln_2.bias"], 1e-5)
    h = F.linear(_quick_gelu(F.linear(h, sd[b + "mlp.c_fc.weight"], sd[b + "mlp.c_fc.bias"])),
                 sd[b + "mlp.c_proj.weight"], sd[b + "mlp.c_proj.bias"])
    return x + h


def _reference_image(sd, pixels):
    w = sd["visual.class_embedding"].shape[0]
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=sd["visual.conv1.weight"].shape[-1])
    x = x.flatten(2).transpose(1, 2)
    cls = sd["visual.class_embedding"].expand(x.shape[0], 1, w)
    x = torch.cat([cls, x], dim=1) + sd["visual.positional_embedding"]
    x = F.layer_norm(x, (w,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"], 1e-5)
    for i in range(2):
        x = _resblock(sd, f"visual.transformer.resblocks.{i}.", x, w // HEAD_WIDTH)
    x = F.layer_norm(x[:, 0], (w,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"], 1e-5)
    return F.normalize(x @ sd["visual.proj"], dim=-1)


def _reference_text(sd, ids, eot):
    w = sd["token_embedding.weight"].shape[1]
    x = sd["token_embedding.weight"][ids] + sd["positional_embedding"][: ids.shape[1]]
    mask = torch.full((ids.shape[1],) * 2, float("-inf")).triu(1)
    for i in range(3):
        x = _resblock(sd, f"transformer.resblocks.{i}.", x, w // HEAD_WIDTH, mask)
    x = F.layer_norm(x, (w,), sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    pooled = x[torch.arange(ids.shape[0]), (ids == eot).int().argmax(dim=1)]
    return F.normalize(pooled @ sd["text_projection"], dim=-1)


@pytest.fixture
def openclip_file(tmp_path):
    sd = _openclip_state_dict()
    path = tmp_path / "open_clip_model.pt"
    torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in sd.items()}}, path)  # a training checkpoint
    return sd, path


def test_openclip_text_config_takes_the_tokenizers_ids_or_openais():
    """With a tokenizer's ids (``pipeline.tokenizer.special_token_ids``) the text config has them,
    a missing BOS as none (not transformers' 49406); without a tokenizer, OpenAI's EOS (the last id)."""
    from infclip.pipeline.openclip import openclip_hf_configs

    sd = _openclip_state_dict()
    _, text, _ = openclip_hf_configs(sd, "quick_gelu", HEAD_WIDTH,
                                     {"eos_token_id": 47, "pad_token_id": 47, "bos_token_id": None})
    assert (text.eos_token_id, text.pad_token_id, text.bos_token_id) == (47, 47, None)
    _, text, _ = openclip_hf_configs(sd, "quick_gelu", HEAD_WIDTH, {})
    assert text.eos_token_id == 49 == text.vocab_size - 1


def test_openclip_state_dict_converts_to_the_same_features(openclip_file, tmp_path):
    sd, path = openclip_file
    cfg = ModelConfig.from_dict({"pretrained": str(path), "hidden_act": "quick_gelu", "openclip_head_width": HEAD_WIDTH,
                                 "attn_implementation": "eager"})
    model = CLIPTowers.from_config(cfg).eval()
    assert (model.image_size, model.context_length, model.embed_dim) == (12, 8, 12)
    assert model.vision.config.hidden_act == model.text.config.hidden_act == "quick_gelu"
    assert model.vision.config.num_attention_heads == 2 and model.text.config.num_attention_heads == 3
    assert model.logit_scale.item() == pytest.approx(math.log(50.0))
    g = torch.Generator().manual_seed(1)
    pixels = torch.randn(4, 3, 12, 12, generator=g)
    eot = 49  # no tokenizer: OpenAI's convention, the last id
    ids = torch.randint(1, 40, (4, 8), generator=g)
    lengths = torch.tensor([3, 8, 5, 2])
    ids[torch.arange(4), lengths - 1] = eot
    ids[torch.arange(8)[None] >= lengths[:, None]] = 0
    mask = (ids != 0).long()
    with torch.no_grad():
        img, txt, scale, _ = model(pixels, ids, mask)
        ref_img, ref_txt = _reference_image(sd, pixels), _reference_text(sd, ids, eot)
    torch.testing.assert_close(img, ref_img, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(txt, ref_txt, atol=1e-5, rtol=1e-5)
    assert scale.item() == pytest.approx(50.0, rel=1e-6)
    # safetensors reads the same, sdpa attention gives the same features
    from safetensors.torch import save_file

    st = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(st))
    model2 = CLIPTowers.from_config(ModelConfig.from_dict({"pretrained": str(st), "hidden_act": "quick_gelu",
                                                            "openclip_head_width": HEAD_WIDTH})).eval()
    with torch.no_grad():
        img2, txt2, _, _ = model2(pixels, ids, mask)
    torch.testing.assert_close(img2, ref_img, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(txt2, ref_txt, atol=1e-5, rtol=1e-5)


def test_openclip_errors_name_the_problem(openclip_file, tmp_path):
    sd, path = openclip_file
    with pytest.raises(ConfigError, match="hidden_act"):
        CLIPTowers.from_config(ModelConfig.from_dict({"pretrained": str(path)}))
    bad = dict(sd)
    bad["transformer.resblocks.1.mlp.c_fc.weight"] = bad["transformer.resblocks.1.mlp.c_fc.weight"][:-1]
    torch.save(bad, tmp_path / "bad.pt")
    cfg = {"pretrained": str(tmp_path / "bad.pt"), "hidden_act": "gelu", "openclip_head_width": HEAD_WIDTH}
    with pytest.raises(ValueError, match=r"shape mismatch at transformer\.resblocks\.1\.mlp\.c_fc\.weight"):
        CLIPTowers.from_config(ModelConfig.from_dict(cfg))
    extra = dict(sd, **{"visual.transformer.resblocks.0.ls_1.gamma": torch.ones(16)})
    torch.save(extra, tmp_path / "ls.pt")
    with pytest.raises(ValueError, match="ls_1.gamma"):
        CLIPTowers.from_config(ModelConfig.from_dict(dict(cfg, pretrained=str(tmp_path / "ls.pt"))))
