"""model.pretrained = an OpenCLIP state dict file: converted to the HF towers, checked against a
plain-torch OpenCLIP-style forward computed from the OpenCLIP-named tensors themselves."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from infclip.ops.config import ConfigError
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers

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
    """With a tokenizer's ids (``pipeline.data.tokenizer.special_token_ids``) the text config has them,
    a missing BOS as none (not transformers' 49406); without a tokenizer, OpenAI's EOS (the last id)."""
    from infclip.pipeline.model.openclip import openclip_hf_configs

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
    extra = dict(sd, **{"visual.attn_pool.query": torch.ones(4, 16)})
    torch.save(extra, tmp_path / "pool.pt")
    with pytest.raises(ValueError, match=r"attn_pool\.query"):
        CLIPTowers.from_config(ModelConfig.from_dict(dict(cfg, pretrained=str(tmp_path / "pool.pt"))))


# ------------------------------------------------------------------ against OpenCLIP's own code

FAMILIES = ["ViT-B-32", "ViT-B-16-quickgelu", "ViT-L-14", "ViT-H-14", "ViT-g-14", "ViT-bigG-14", "ViT-e-14",
            "ViT-M-16-alt", "ViT-L-14-worldwide"]
CUSTOM_TEXT = "ViT-B-32 as CustomTextCLIP"  # the text tower's keys under "text."


def _reduced(open_clip, name: str) -> dict:
    """OpenCLIP's config ``name`` at 2 blocks a tower and 2 heads of the widths it sets (the image
    tower's ``head_width``, the text tower's width / heads), small images and vocabulary: the
    same structure, CPU-sized."""
    cfg = open_clip.get_model_config(name.split()[0])
    if name == CUSTOM_TEXT:
        cfg["custom_text"] = True
    v, t = cfg["vision_cfg"], cfg["text_cfg"]
    v.update(layers=2, width=2 * v.get("head_width", 64), image_size=4 * v["patch_size"])
    t.update(layers=2, width=2 * (t["width"] // t["heads"]), heads=2, vocab_size=300, context_length=12)
    t.pop("hf_tokenizer_name", None), t.pop("tokenizer_kwargs", None)
    if t.get("pool_type") == "eos":
        t["eos_id"] = 7
    cfg["embed_dim"] = 24
    return cfg


def _openclip_model(open_clip, cfg: dict, seed: int = 0):
    """OpenCLIP's CLIP from ``cfg``, every parameter randomised (layer norms and layer scales too)."""
    torch.manual_seed(seed)
    cfg = dict(cfg)
    cls = open_clip.model.CustomTextCLIP if cfg.pop("custom_text", False) else open_clip.model.CLIP
    model = cls(**cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _text_rows(cfg: dict, n: int = 3, seed: int = 1):
    """Token rows as OpenCLIP's tokenizer lays them out: [SOT] text [EOT] then zeros, EOT at the
    config's eos_id (pool_type "eos") or the last id (argmax pooling)."""
    t = cfg["text_cfg"]
    eot = t["eos_id"] if t.get("pool_type") == "eos" else t["vocab_size"] - 1
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, t["context_length"], dtype=torch.long)
    for row, length in enumerate([4, t["context_length"], 7][:n]):
        body = torch.randint(10, t["vocab_size"] - 2, (length - 2,), generator=g)
        ids[row, :length] = torch.cat([torch.tensor([t["vocab_size"] - 2]), body, torch.tensor([eot])])
    return ids, (torch.arange(ids.shape[1])[None] < torch.tensor([4, t["context_length"], 7][:n])[:, None]).long()


def _features(open_clip_model, ids, pixels):
    with torch.no_grad():
        return (open_clip_model.encode_image(pixels, normalize=True), open_clip_model.encode_text(ids, normalize=True))


@pytest.mark.parametrize("name", FAMILIES + [CUSTOM_TEXT])
def test_every_openclip_vit_family_imports_with_openclips_features(name, tmp_path):
    """OpenCLIP's own model (its config, reduced) written the hf-hub way (weights + open_clip_config.json):
    model.pretrained gives the same image and text features, the head widths per tower included."""
    from tests._openclip import import_open_clip

    open_clip = import_open_clip()
    cfg = _reduced(open_clip, name)
    ref = _openclip_model(open_clip, cfg)
    torch.save(ref.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    model = CLIPTowers.from_config(ModelConfig.from_dict({"pretrained": str(tmp_path / "open_clip_pytorch_model.bin")}))
    model.eval()
    v, t = cfg["vision_cfg"], cfg["text_cfg"]
    assert model.cfg.vision.heads == 2 and model.cfg.text.heads == 2
    assert model.vision.config.hidden_size // model.vision.config.num_attention_heads == v.get("head_width", 64)
    assert model.cfg.hidden_act == ("quick_gelu" if cfg.get("quick_gelu") else "gelu")
    ids, mask = _text_rows(cfg)
    pixels = torch.randn(2, 3, v["image_size"], v["image_size"], generator=torch.Generator().manual_seed(2))
    ref_img, ref_txt = _features(ref, ids, pixels)
    with torch.no_grad():
        img, txt, scale, _ = model(pixels, ids, mask)
    torch.testing.assert_close(img, ref_img, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(txt, ref_txt, rtol=1e-5, atol=2e-6)
    assert scale.item() == pytest.approx(ref.logit_scale.exp().item(), rel=1e-6)


def test_per_tower_head_widths_inline(tmp_path):
    """A bare ViT-H-14 file (no config beside it): an inline OpenCLIP config with the image tower's
    head width (80) and hidden_act import it exactly, the text tower keeping 64; a config that
    disagrees with the weights, or with hidden_act, is named."""
    from tests._openclip import import_open_clip

    open_clip = import_open_clip()
    cfg = _reduced(open_clip, "ViT-H-14")
    ref = _openclip_model(open_clip, cfg)
    torch.save(ref.state_dict(), tmp_path / "h14.pt")
    inline = {"pretrained": str(tmp_path / "h14.pt"), "openclip_config": {"vision_cfg": {"head_width": 80}},
              "hidden_act": "gelu"}
    model = CLIPTowers.from_config(ModelConfig.from_dict(inline)).eval()
    assert (model.vision.config.num_attention_heads, model.text.config.num_attention_heads) == (2, 2)
    ids, mask = _text_rows(cfg)
    pixels = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        img, txt, _, _ = model(pixels, ids, mask)
    ref_img, ref_txt = _features(ref, ids, pixels)
    torch.testing.assert_close(img, ref_img, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(txt, ref_txt, rtol=1e-5, atol=2e-6)
    bare = CLIPTowers.from_config(ModelConfig.from_dict({"pretrained": str(tmp_path / "h14.pt"), "hidden_act": "gelu",
                                                          "openclip_head_width": 32}))
    assert (bare.vision.config.num_attention_heads, bare.text.config.num_attention_heads) == (5, 4)  # no config
    with pytest.raises(ConfigError, match="vision.width = 1280, the weights 160"):
        CLIPTowers.from_config(ModelConfig.from_dict(dict(inline, openclip_config={"vision_cfg": {"width": 1280}})))
    with pytest.raises(ConfigError, match="says 'gelu'"):
        CLIPTowers.from_config(ModelConfig.from_dict(dict(inline, hidden_act="quick_gelu")))


def test_openclip_configs_the_towers_cannot_express_are_named():
    """Every config OpenCLIP ships is either imported or refused with the key and what is missing;
    all its plain ViT configs are imported."""
    from infclip.pipeline.model.openclip import openclip_spec
    from tests._openclip import import_open_clip

    open_clip = import_open_clip()
    refused = {}
    for name in open_clip.list_models():
        try:
            openclip_spec((open_clip.get_model_config(name), name))
        except ConfigError as exc:
            refused[name] = str(exc)
    for name in FAMILIES + ["ViT-H-14-378-quickgelu", "ViT-bigG-14-quickgelu", "ViT-S-32-alt", "ViT-B-16-plus-240"]:
        assert name not in refused, refused.get(name)
    assert "vision_cfg.no_ln_pre" in refused["ViT-L-14-CLIPA"] and "pre-LayerNorm" in refused["ViT-L-14-CLIPA"]
    assert "ResNet" in refused["RN50"]
    assert "timm_model_name" in refused["ViT-B-16-SigLIP"]
    assert "hf_model_name" in refused["roberta-ViT-B-32"]
    assert "multimodal_cfg" in refused["coca_ViT-B-32"]
    assert all("\n" not in msg for msg in refused.values())
    with pytest.raises(ConfigError, match=r"vision_cfg\.image_size \[224, 256\] is not square"):
        openclip_spec(({"vision_cfg": {"image_size": [224, 256]}}, "wide.json"))
