"""CLIPTowers: shapes, normalisation, EOS pooling, logit scale, save/load round trip."""

from __future__ import annotations

import math
import os

import pytest
import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers


def cfg(**over) -> ModelConfig:
    data = {"embed_dim": 16,
            "vision": {"image_size": 16, "patch_size": 8, "hidden_size": 16, "layers": 1, "heads": 2},
            "text": {"context_length": 8, "hidden_size": 16, "layers": 1, "heads": 2, "vocab_size": 40}}
    data.update(over)
    return ModelConfig.from_dict(data, source="test.json")


def inputs(eos=1):
    torch.manual_seed(0)
    pv = torch.randn(3, 3, 16, 16)
    ids = torch.randint(3, 40, (3, 8))
    ids[:, 4] = eos
    ids[:, 5:] = 0
    mask = torch.zeros(3, 8, dtype=torch.long)
    mask[:, :5] = 1
    return pv, ids, mask


def test_forward_shapes_and_norms():
    torch.manual_seed(0)
    model = CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0, bos_token_id=2)
    pv, ids, mask = inputs()
    img, txt, scale, bias = model(pv, ids, mask)
    assert img.shape == txt.shape == (3, 16)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(3))
    assert model.logit_scale.shape == (1,) and model.logit_bias.shape == (1,)
    torch.testing.assert_close(scale, torch.tensor([1 / 0.07]))
    assert bias.item() == -10.0
    with torch.no_grad():
        model.logit_scale.fill_(math.log(1000.0))
    assert model.logit_params()[0].item() == 100.0  # clamped to max_logit_scale


@pytest.mark.parametrize("eos", [1, 2])
def test_text_pools_first_eos_token(eos):
    """Padding after EOS must not change the text feature (HF's eos==2 argmax trap avoided)."""
    torch.manual_seed(0)
    model = CLIPTowers(cfg(), eos_token_id=eos, pad_token_id=0, bos_token_id=3).eval()
    _, ids, mask = inputs(eos)
    ids2 = ids.clone()
    ids2[:, 5:] = 39  # different (high) ids after EOS, masked out
    a = model.encode_text(ids, mask)
    b = model.encode_text(ids2, mask)
    torch.testing.assert_close(a, b)
    ids3 = ids.clone()
    ids3[:, 3] = (ids3[:, 3] + 1 - 3) % 36 + 3  # change a token before EOS: feature changes
    assert not torch.allclose(model.encode_text(ids3, mask), a)


def test_gradient_checkpointing_same_grads():
    pv, ids, mask = inputs()
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = CLIPTowers(cfg(gradient_checkpointing=ckpt), eos_token_id=1, pad_token_id=0).train()
        img, txt, scale, _ = model(pv, ids, mask)
        (scale * (img @ txt.T)).logsumexp(1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, msg=n)


def test_save_and_load_round_trip(tmp_path):
    """One transformers CLIPModel folder (one weights file, the raw logit scale in its config)
    that loads back exactly, that transformers loads as a CLIPModel, and that a run starts from;
    with an EOS id of 2 (which transformers pools by argmax) the two towers' folders instead."""
    from transformers import CLIPModel, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    model = CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0, bos_token_id=2).eval()
    with torch.no_grad():
        model.logit_scale.fill_(3.0)
    model.save_pretrained(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    loaded = CLIPTowers.from_pretrained(str(tmp_path)).eval()
    pv, ids, mask = inputs()
    torch.testing.assert_close(loaded.encode_image(pv), model.encode_image(pv))
    torch.testing.assert_close(loaded.encode_text(ids, mask), model.encode_text(ids, mask))
    assert loaded.logit_scale.item() == 3.0 and loaded.text.config.eos_token_id == 1
    hf = CLIPModel.from_pretrained(str(tmp_path)).eval()
    img = hf.visual_projection(hf.vision_model(pixel_values=pv).pooler_output)
    torch.testing.assert_close(torch.nn.functional.normalize(img, dim=-1), model.encode_image(pv))
    again = CLIPTowers.from_config(cfg(pretrained=str(tmp_path)))  # a run can start from it
    torch.testing.assert_close(again.encode_image(pv), model.encode_image(pv))
    with pytest.raises(FileNotFoundError, match="vision"):
        CLIPTowers.from_pretrained(str(tmp_path / "missing"))

    legacy = tmp_path / "eos2"
    model2 = CLIPTowers(cfg(), eos_token_id=2, pad_token_id=0, bos_token_id=1).eval()
    model2.save_pretrained(str(legacy))
    assert sorted(os.listdir(legacy)) == ["logit_params.json", "text", "vision"]
    hf_vision = CLIPVisionModelWithProjection.from_pretrained(str(legacy / "vision"))
    torch.testing.assert_close(torch.nn.functional.normalize(hf_vision(pixel_values=pv).image_embeds, dim=-1),
                               model2.encode_image(pv))
    torch.testing.assert_close(CLIPTowers.from_pretrained(str(legacy)).eval().encode_text(ids, mask),
                               model2.encode_text(ids, mask))


def test_a_loaded_model_takes_its_towers_sizes(tmp_path):
    """A pretrained start ignores the section's sizes: the model's config then holds the loaded
    towers' own, so the activation estimate, the kept patches and the FLOPs are theirs."""
    from infclip.pipeline.model.config import activation_bytes, forward_flops

    torch.manual_seed(0)
    saved = cfg(vision={"image_size": 24, "patch_size": 4, "hidden_size": 16, "layers": 2, "heads": 2,
                        "intermediate_size": 40},
                text={"context_length": 8, "hidden_size": 16, "layers": 1, "heads": 2, "vocab_size": 40,
                      "intermediate_size": 64})  # HF's configs hold the resolved width
    CLIPTowers(saved, eos_token_id=1, pad_token_id=0, bos_token_id=2).save_pretrained(str(tmp_path))
    start = ModelConfig.from_dict({"pretrained": str(tmp_path), "patch_dropout": 0.5})  # default sizes
    loaded = CLIPTowers.from_config(start)
    assert loaded.cfg.vision == saved.vision and loaded.cfg.text == saved.text
    assert loaded.cfg.embed_dim == 16 and loaded.cfg.patch_dropout == 0.5
    same_sizes = ModelConfig.from_dict({**saved.to_dict(), "patch_dropout": 0.5})
    assert forward_flops(loaded.cfg) == forward_flops(same_sizes) != forward_flops(start)
    assert activation_bytes(loaded.cfg, 8) == activation_bytes(same_sizes, 8)


def test_config_errors():
    with pytest.raises(ConfigError, match="model.text.*unknown key 'layer'"):
        ModelConfig.from_dict({"text": {"layer": 2}}, source="f.json")
    with pytest.raises(ConfigError, match="'heads' 5 must divide"):
        ModelConfig.from_dict({"vision": {"heads": 5}})
    with pytest.raises(ConfigError, match="vocab_size is null"):
        CLIPTowers(ModelConfig.from_dict({"text": {"layers": 1}, "vision": {"layers": 1}}), eos_token_id=1)
    with pytest.raises(ValueError, match="at most 8"):
        CLIPTowers(cfg(), eos_token_id=1).encode_text(torch.zeros(1, 9, dtype=torch.long))
