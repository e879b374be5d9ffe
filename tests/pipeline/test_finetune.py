"""Fine-tuning from a standard transformers CLIP folder through the real pipeline: the run starts
from the folder's weights and logit scale (not a fresh init) and trains them."""

from __future__ import annotations

import math

import torch

from infclip.pipeline.data.tokenizer import load_tokenizer
from infclip.pipeline.model.model import CLIPTowers
from tests.pipeline.test_train import run_inproc, world_of_one  # noqa: F401 (fixture)


def test_finetune_from_a_transformers_clip_folder(world_of_one, digits_shards, tmp_path):
    from transformers import CLIPConfig, CLIPModel

    tokenizer = load_tokenizer(digits_shards["tokenizer_dir"])
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 16, "eos_token_id": 1, "bos_token_id": 2,
            "pad_token_id": 0}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 8}
    torch.manual_seed(0)
    hf = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8, logit_scale_init_value=4.0))
    folder = tmp_path / "hf_clip"
    hf.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    start = CLIPTowers.from_pretrained(str(folder))

    result = run_inproc(digits_shards, tmp_path / "run", 3, **{
        "model.pretrained": str(folder), "data.tokenizer": str(folder), "train.export_final": True,
        "scheduler.params.warmup_min_ratio": 1.0})
    tuned = CLIPTowers.from_pretrained(result.final_dir)
    assert (tuned.image_size, tuned.context_length, tuned.embed_dim) == (16, 16, 8)
    # started from the folder: the logit scale moved a little from its 4.0, not from the default log(1/0.07)
    assert abs(tuned.logit_scale.item() - 4.0) < 0.05 and abs(tuned.logit_scale.item() - math.log(1 / 0.07)) > 0.5
    name = "vision.vision_model.encoder.layers.0.mlp.fc1.weight"
    before, after = start.state_dict()[name], tuned.state_dict()[name]
    assert not torch.equal(before, after)  # trained
    assert (after - before).abs().max() < 0.05 * before.abs().max()  # from these weights, a few small steps


def test_finetune_from_an_openclip_state_dict(world_of_one, digits_shards, tmp_path):
    """An OpenCLIP-named state dict (test_openclip's, with a vocabulary the size of this run's
    tokenizer) trains through the pipeline from its own weights and logit scale (log 50)."""
    from tests.pipeline.test_openclip import HEAD_WIDTH, _openclip_state_dict

    tokenizer_dir = digits_shards["tokenizer_dir"]
    sd = _openclip_state_dict()
    sd["token_embedding.weight"] = torch.randn(len(load_tokenizer(tokenizer_dir)), 24) * 0.2
    path = tmp_path / "open_clip.pt"
    torch.save(sd, path)
    result = run_inproc(digits_shards, tmp_path / "run", 3, **{
        "model.pretrained": str(path), "model.hidden_act": "quick_gelu", "model.openclip_head_width": HEAD_WIDTH,
        "data.tokenizer": tokenizer_dir, "train.export_final": True, "scheduler.params.warmup_min_ratio": 1.0})
    tuned = CLIPTowers.from_pretrained(result.final_dir)
    assert (tuned.image_size, tuned.context_length, tuned.embed_dim) == (12, 8, 12)
    assert abs(tuned.logit_scale.item() - math.log(50.0)) < 0.05
    before = sd["visual.transformer.resblocks.0.mlp.c_fc.weight"]
    after = tuned.state_dict()["vision.vision_model.encoder.layers.0.mlp.fc1.weight"]
    assert not torch.equal(before, after) and (after - before).abs().max() < 0.05 * before.abs().max()


def test_finetune_eval_export_from_an_openclip_model(world_of_one, digits_shards, tmp_path):
    """OpenCLIP's own ViT-B-16 (reduced; text pooled at the run tokenizer's EOS) written the hf-hub
    way: fine-tuned through the pipeline from that file, the run's checkpoint evaluated by
    launch/zeroshot.py (the recorded tokenizer and OpenCLIP file rebuild the model), then exported to
    OpenCLIP, whose own code gives the checkpoint's features."""
    import json

    from infclip.eval.checkpoint import load_model
    from infclip.pipeline.data.tokenizer import tokenize
    from tests._openclip import import_open_clip
    from tests.pipeline.test_openclip import _openclip_model, _reduced
    from launch.zeroshot import main as zeroshot_main

    open_clip = import_open_clip()
    tokenizer_dir = digits_shards["tokenizer_dir"]
    tokenizer = load_tokenizer(tokenizer_dir)
    cfg = _reduced(open_clip, "ViT-B-16")
    cfg["vision_cfg"]["image_size"] = 32
    cfg["text_cfg"].update(vocab_size=len(tokenizer), context_length=16, pool_type="eos", eos_id=tokenizer.eos_token_id)
    start = tmp_path / "start"
    start.mkdir()
    torch.save(_openclip_model(open_clip, cfg).state_dict(), start / "open_clip_pytorch_model.bin")
    (start / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    run = tmp_path / "run"
    run_inproc(digits_shards, run, 2, **{"model.pretrained": str(start / "open_clip_pytorch_model.bin"),
                                          "data.tokenizer": tokenizer_dir, "scheduler.params.warmup_min_ratio": 1.0})

    loaded = load_model(run / "ckpt")  # no tokenizer/ folder in the run: data.tokenizer as recorded
    assert loaded.model.cfg.vision.heads == 2 and loaded.info["global_steps"] == 2
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]))
    assert zeroshot_main(["--checkpoint", str(run / "ckpt"), "--shards", digits_shards["test"], "--classnames",
                          str(classes), "--max-samples", "40", "--out", str(tmp_path / "report.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["zeroshot"]["n"] == 40
    assert zeroshot_main(["--checkpoint", str(run / "ckpt"), "--export-openclip", str(tmp_path / "oc")]) == 0

    oc_model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{tmp_path / 'oc'}")
    oc_model.eval()
    ids, mask = tokenize(tokenizer, ["a photo of the number three", "seven"], 16)
    assert torch.equal(open_clip.get_tokenizer(f"local-dir:{tmp_path / 'oc'}")(["a photo of the number three",
                                                                                "seven"]), ids)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(oc_model.encode_image(pixels, normalize=True), loaded.model.encode_image(pixels),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(oc_model.encode_text(ids, normalize=True), loaded.model.encode_text(ids, mask),
                                   rtol=1e-5, atol=1e-6)
