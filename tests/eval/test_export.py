"""The export as transformers sees it: one folder that CLIPModel, CLIPProcessor and the zero-shot
pipeline load, with the project's features, logit scale, tokenization and image normalisation;
and a standard transformers CLIP folder read back as the project's towers (``model.pretrained``)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
from PIL import Image

from infclip.eval.checkpoint import export_hf, load_model
from infclip.pipeline.data.tokenizer import tokenize
from infclip.pipeline.engine.engine import export_final
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers

from .conftest import TINY_MODEL, make_model, write_run_files
from .test_checkpoint import _train_and_save

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
TEXTS = ["a photo of the number five", "seven", "the digit nine written by hand with many more words"]


def _unit(out):
    """get_*_features gives a tensor (transformers 4) or an output with pooler_output (5)."""
    return torch.nn.functional.normalize(getattr(out, "pooler_output", out), dim=-1)


def _check_transformers_folder(folder, model, tokenizer):
    """CLIPModel / CLIPProcessor / pipeline loaded from ``folder`` reproduce ``model`` (fp32)."""
    from transformers import CLIPModel, CLIPProcessor, pipeline

    hf = CLIPModel.from_pretrained(str(folder)).eval()
    assert hf.config.text_config.eos_token_id == 1 and hf.config.text_config.bos_token_id == 2
    assert hf.config.text_config.pad_token_id == 0
    assert hf.logit_scale.item() == pytest.approx(model.logit_scale.item(), abs=1e-6)
    pixels = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    ids, mask = tokenize(tokenizer, TEXTS, 12)
    assert mask[2].all() and ids[2, -1] == 1  # the long caption is truncated, EOS kept
    with torch.no_grad():
        img, txt = model.encode_image(pixels), model.encode_text(ids, mask)
        torch.testing.assert_close(_unit(hf.get_image_features(pixel_values=pixels)), img, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(_unit(hf.get_text_features(input_ids=ids, attention_mask=mask)), txt,
                                   rtol=1e-5, atol=1e-6)

    processor = CLIPProcessor.from_pretrained(str(folder))
    enc = processor(text=TEXTS, padding="max_length", truncation=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], ids) and torch.equal(enc["attention_mask"], mask)
    plain = processor.tokenizer(["seven"])["input_ids"][0]  # the HF way: BOS ... EOS from the tokenizer itself
    assert plain == ids[1, : int(mask[1].sum())].tolist()
    ip = processor.image_processor
    assert ip.crop_size == {"height": 16, "width": 16} and ip.size == {"shortest_edge": 16}
    assert list(ip.image_mean) == pytest.approx(MEAN) and list(ip.image_std) == pytest.approx(STD)

    # the pipeline on a 16 px image (resize and crop are then the identity): the project's probabilities
    rgb = (np.random.default_rng(0).random((16, 16, 3)) * 255).astype(np.uint8)
    labels = ["five", "seven", "nine"]
    result = pipeline("zero-shot-image-classification", model=str(folder))(
        Image.fromarray(rgb), candidate_labels=labels, hypothesis_template="a photo of the number {}")
    assert {r["label"] for r in result} == set(labels)
    x = (torch.from_numpy(rgb).permute(2, 0, 1).float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) \
        / torch.tensor(STD).view(3, 1, 1)
    with torch.no_grad():
        t_ids, t_mask = tokenize(tokenizer, [f"a photo of the number {w}" for w in labels], 12)
        logits = model.logit_params()[0] * model.encode_image(x[None]) @ model.encode_text(t_ids, t_mask).T
    probs = dict(zip(labels, logits.softmax(-1)[0].tolist()))
    for r in result:
        assert r["score"] == pytest.approx(probs[r["label"]], abs=1e-5)


@pytest.mark.parametrize("flat", [False, "tower"])
def test_export_final_and_export_hf_load_in_transformers(flat, tmp_path, tokenizer, tokenizer_dir, single_rank_env):
    """Also from flat towers (model.flat_parameters "tower"), whose weights the towers' state-dict
    hooks write under transformers' names."""
    run = tmp_path / "run"
    model_cfg = dict(TINY_MODEL, **({"flat_parameters": "tower", "gradient_checkpointing": False} if flat else {}))
    write_run_files(run, tokenizer_dir, model_cfg)
    (run / "config.json").write_text(json.dumps({"model": model_cfg, "data": {"image_mean": MEAN, "image_std": STD}}))
    model = make_model(tokenizer, **{k: v for k, v in model_cfg.items() if k not in TINY_MODEL})
    with torch.no_grad():
        model.logit_scale.fill_(3.3)
    engine = _train_and_save(model, 0, run / "ckpt", tokenizer, steps=1)
    trained = engine.module.eval()
    assert trained.logit_scale.item() != pytest.approx(3.3, abs=1e-4)  # the scale trained too

    final = export_final(engine, tokenizer, str(run / "final"))  # mean/std from run/config.json
    _check_transformers_folder(final, trained, tokenizer)
    exported = export_hf(run, tmp_path / "hf")  # from the checkpoint
    _check_transformers_folder(exported, trained, tokenizer)

    # transformers' layout only (one weights file, one tokenizer, the raw scale in the config),
    # which CLIPTowers, model.pretrained and --checkpoint read back exactly
    pixels = torch.randn(2, 3, 16, 16)
    for folder in (final, exported):
        names = set(os.listdir(folder))
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
        assert not names & {"vision", "text", "tokenizer", "logit_params.json"}, names
        again = load_model(folder)
        assert again.model.logit_scale.item() == trained.logit_scale.item()
        torch.testing.assert_close(again.model.encode_image(pixels), trained.encode_image(pixels))
        tok_ids, _ = tokenize(again.tokenizer, TEXTS, 12)  # the saved template: tokenize() unchanged
        assert torch.equal(tok_ids, tokenize(tokenizer, TEXTS, 12)[0])


def test_saved_tokenizer_adds_bos_eos_and_pads_by_itself(tmp_path, tokenizer):
    """tokenizers' own loader applies tokenizer.json's post-processor, truncation and padding."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    make_model(tokenizer).save_pretrained(str(tmp_path), tokenizer=tokenizer)
    assert not (tmp_path / "tokenizer").exists()  # one tokenizer, at the root
    ids, mask = tokenize(tokenizer, TEXTS, 12)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode_batch(TEXTS)
    assert [e.ids for e in raw] == ids.tolist() and [e.attention_mask for e in raw] == mask.tolist()
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto(["seven"])["input_ids"][0] == ids[1, : int(mask[1].sum())].tolist()
    assert auto.model_max_length == 12


def test_export_prints_no_progress_bar_and_leaves_the_setting(tmp_path, tokenizer, capfd):
    """An export writes no "Writing model shards" bar into the log, and transformers' progress-bar
    setting is as it was afterwards (on stays on, off stays off)."""
    from transformers.utils import logging as hf_logging

    model = make_model(tokenizer)
    assert hf_logging.is_progress_bar_enabled()
    model.save_pretrained(str(tmp_path / "a"), tokenizer=tokenizer)
    assert "Writing model shards" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(tmp_path / "b"))
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_hf_clip_folder_as_pretrained(tmp_path, tokenizer):
    """A standard transformers CLIP folder (a small random CLIPModel + tokenizer) is read by
    CLIPTowers.from_pretrained and model.pretrained with its logit scale and its features."""
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 12, "eos_token_id": 1, "bos_token_id": 2,
            "pad_token_id": 0}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 8}
    hf = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8,
                              logit_scale_init_value=4.605)).eval()
    hf.save_pretrained(str(tmp_path / "clip"))
    tokenizer.save_pretrained(str(tmp_path / "clip"))
    pixels = torch.randn(2, 3, 16, 16)
    ids, mask = tokenize(tokenizer, TEXTS, 12)
    with torch.no_grad():
        ref_img = _unit(hf.get_image_features(pixel_values=pixels))
        ref_txt = _unit(hf.get_text_features(input_ids=ids, attention_mask=mask))
    loaded = CLIPTowers.from_pretrained(str(tmp_path / "clip")).eval()
    started = CLIPTowers.from_config(ModelConfig.from_dict({"pretrained": str(tmp_path / "clip")}), tokenizer).eval()
    for model in (loaded, started):
        assert model.logit_scale.item() == pytest.approx(4.605, abs=1e-6)  # not reset to init_logit_scale
        assert model.image_size == 16 and model.context_length == 12 and model.embed_dim == 8
        with torch.no_grad():
            torch.testing.assert_close(model.encode_image(pixels), ref_img, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model.encode_text(ids, mask), ref_txt, rtol=1e-5, atol=1e-6)
    assert loaded.cfg.vision.hidden_size == 16 and loaded.cfg.text.vocab_size == len(tokenizer)

    # OpenAI's legacy eos_token_id 2 in the config: the folder's tokenizer names the real EOS
    legacy = CLIPModel(CLIPConfig(text_config={**text, "eos_token_id": 2}, vision_config=vision, projection_dim=8))
    legacy.save_pretrained(str(tmp_path / "legacy"))
    tokenizer.save_pretrained(str(tmp_path / "legacy"))
    assert CLIPTowers.from_pretrained(str(tmp_path / "legacy")).eos_token_id == 1


def test_eos_id_2_writes_no_clip_model(tmp_path, caplog):
    """With EOS id 2 transformers would pool argmax(ids): no root CLIPModel, the towers still load."""
    cfg = ModelConfig.from_dict(TINY_MODEL)
    model = CLIPTowers(cfg, vocab_size=40, eos_token_id=2, pad_token_id=0, bos_token_id=1).eval()
    with caplog.at_level(logging.WARNING, logger="infclip.pipeline.model.model"):
        model.save_pretrained(str(tmp_path))
    assert "EOS id is 2" in caplog.text and not (tmp_path / "config.json").exists()
    assert CLIPTowers.from_pretrained(str(tmp_path)).eos_token_id == 2


def test_export_hf_upgrades_an_older_export(tmp_path, tokenizer):
    """A folder in the previous layout (vision/, text/, logit_params.json, tokenizer/ without the
    template, no root CLIPModel) still loads, and export_hf turns it into a transformers folder."""
    import shutil

    from transformers import AutoTokenizer, CLIPModel

    model = make_model(tokenizer)
    old = tmp_path / "old"
    model.vision.save_pretrained(str(old / "vision"))
    model.text.save_pretrained(str(old / "text"))
    (old / "logit_params.json").write_text(json.dumps({
        "logit_scale": model.logit_scale.item(), "logit_bias": model.logit_bias.item(),
        "max_logit_scale": model.max_logit_scale, "model_config": model.cfg.to_dict()}))
    tokenizer.save_pretrained(str(old / "tokenizer"))
    spec = json.loads((old / "tokenizer" / "tokenizer.json").read_text())
    spec.update(post_processor=None, truncation=None, padding=None)  # as train_bpe_tokenizer used to save it
    (old / "tokenizer" / "tokenizer.json").write_text(json.dumps(spec))
    assert AutoTokenizer.from_pretrained(str(old / "tokenizer"))(["seven"])["input_ids"][0][0] != 2  # no BOS
    loaded = load_model(old)
    pixels = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded.model.encode_image(pixels), model.encode_image(pixels))

    (tmp_path / "config.json").write_text(json.dumps({"model": TINY_MODEL, "data": {"image_mean": MEAN,
                                                                                     "image_std": STD}}))
    new = export_hf(old, tmp_path / "new")  # the run's config.json one folder up gives the mean/std
    _check_transformers_folder(new, model, tokenizer)
    shutil.rmtree(old)
    assert CLIPModel.from_pretrained(new).logit_scale.item() == pytest.approx(model.logit_scale.item())


@pytest.mark.parametrize("hidden_act", ["gelu", "quick_gelu"])
def test_openclip_export_loads_in_open_clip_with_the_same_features(hidden_act, tmp_path, tokenizer):
    """export_openclip's folder in OpenCLIP's own code (``local-dir:``): the project's image and text
    features (text pooled at the project tokenizer's EOS, id 1), logit scale, tokenizer rows and
    preprocessing; and read back here (project -> OpenCLIP -> project) the same again."""
    from infclip.eval.checkpoint import export_openclip
    from tests._openclip import import_open_clip

    open_clip = import_open_clip()
    model = make_model(tokenizer, hidden_act=hidden_act)
    with torch.no_grad():
        model.logit_scale.fill_(3.3)
        model.logit_bias.fill_(-7.5)
    model.save_pretrained(str(tmp_path / "run" / "hf"), tokenizer=tokenizer)
    siglip = hidden_act == "quick_gelu"  # the SigLIP run's bias comes along too
    (tmp_path / "run" / "config.json").write_text(json.dumps({
        "model": TINY_MODEL, "data": {"image_mean": MEAN, "image_std": STD},
        "contrastive_loss": {"loss": "siglip" if siglip else "clip"}}))
    out = export_openclip(tmp_path / "run" / "hf", tmp_path / "oc")
    oc_model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{out}")
    oc_model.eval()
    oc_tokenizer = open_clip.get_tokenizer(f"local-dir:{out}")
    ids, mask = tokenize(tokenizer, TEXTS, 12)
    assert torch.equal(oc_tokenizer(TEXTS), ids)
    pixels = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        img, txt = model.encode_image(pixels), model.encode_text(ids, mask)
        torch.testing.assert_close(oc_model.encode_image(pixels, normalize=True), img, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(oc_model.encode_text(ids, normalize=True), txt, rtol=1e-5, atol=1e-6)
    assert oc_model.logit_scale.item() == pytest.approx(3.3, abs=1e-6)
    assert (oc_model.logit_bias.item() if siglip else oc_model.logit_bias) == (pytest.approx(-7.5) if siglip else None)
    pre = open_clip.get_model_preprocess_cfg(oc_model)
    assert pre["size"] in (16, (16, 16)) and (pre["interpolation"], pre["resize_mode"]) == ("bicubic", "shortest")
    assert list(pre["mean"]) == pytest.approx(MEAN) and list(pre["std"]) == pytest.approx(STD)

    again = load_model(out)  # the OpenCLIP folder as --checkpoint (and model.pretrained)
    assert again.model.cfg.hidden_act == hidden_act
    assert torch.equal(tokenize(again.tokenizer, TEXTS, 12)[0], ids)
    with torch.no_grad():
        torch.testing.assert_close(again.model.encode_image(pixels), img, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(again.model.encode_text(ids, mask), txt, rtol=1e-5, atol=1e-6)
