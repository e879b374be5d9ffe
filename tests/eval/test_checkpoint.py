"""DeepSpeed checkpoint -> fp32 weights -> eval model, for ZeRO 0, 2 (flat parameters) and 3 (real engines, gloo, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from infclip.eval.checkpoint import consolidate_fp32_state_dict, export_hf, find_tag_dir, load_model

from .conftest import TINY_MODEL, make_model, write_run_files


def _train_and_save(model, stage: int, ckpt_dir, tokenizer, steps: int = 2):
    """A real engine on one gloo rank: a few AdamW steps (weights move off init), then save."""
    import deepspeed
    from infclip.pipeline.data.tokenizer import tokenize

    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 6}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    g = torch.Generator().manual_seed(1)
    ids, mask = tokenize(tokenizer, ["a photo of the number one", "two", "the digit three", "four"], 12)
    for _ in range(steps):
        img, txt, scale, _ = engine(torch.randn(4, 3, 16, 16, generator=g), ids, mask)
        loss = torch.nn.functional.cross_entropy(scale * img @ txt.T, torch.arange(4))
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(ckpt_dir), tag=f"global_step{steps}")
    return engine


def _features(model, tokenizer):
    from infclip.pipeline.data.tokenizer import tokenize

    g = torch.Generator().manual_seed(7)
    pixels = torch.randn(3, 3, 16, 16, generator=g)
    ids, mask = tokenize(tokenizer, ["a photo of the number five", "seven", "the digit nine written"], 12)
    with torch.no_grad():
        return model.encode_image(pixels).float(), model.encode_text(ids, mask).float()


@pytest.mark.parametrize("stage, flat", [(0, False), (3, False), (2, True), (2, "tower")])
def test_zero_checkpoint_round_trip(stage, flat, tmp_path, tokenizer, tokenizer_dir, single_rank_env):
    """flat: model.flat_parameters (per block or per tower), whose ZeRO-2 partitions are saved
    under the flat names."""
    run = tmp_path / "run"
    layout = {"flat_parameters": flat, **({"gradient_checkpointing": False} if flat == "tower" else {})}
    write_run_files(run, tokenizer_dir, dict(TINY_MODEL, **layout))
    model = make_model(tokenizer, **layout)
    init_img, _ = _features(model, tokenizer)
    engine = _train_and_save(model, stage, run / "ckpt", tokenizer)
    engine.module.eval()
    ref_img, ref_txt = _features(engine.module, tokenizer)  # ZeRO-3 hooks gather the weights
    assert not torch.allclose(ref_img, init_img, atol=1e-4)  # training moved the weights

    loaded = load_model(run)  # run folder -> ckpt/latest -> tag, config.json and tokenizer/ found
    assert loaded.info["zero_stage"] == stage and loaded.info["global_steps"] == 2
    img, txt = _features(loaded.model, loaded.tokenizer)
    # fp32 training: the consolidated master weights are the weights the engine computes with
    torch.testing.assert_close(img, ref_img, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(txt, ref_txt, rtol=1e-5, atol=1e-6)
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())

    if stage == 3:  # the same tensors as DeepSpeed's own (pickle-based) consolidation
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        ours, _ = consolidate_fp32_state_dict(run / "ckpt")
        ref = get_fp32_state_dict_from_zero_checkpoint(str(run / "ckpt"))
        assert set(ours) == set(ref)
        for name, value in ref.items():
            assert torch.equal(ours[name], value.contiguous().float()), name

    # a different model size: a clear error naming the parameter, not a partial load
    small = json.loads(json.dumps(TINY_MODEL))
    small["vision"]["hidden_size"] = 8
    (run / "other.json").write_text(json.dumps({"model": small}))
    with pytest.raises(ValueError, match=r"shape mismatch for parameter 'vision\.vision_model\.[a-z_.]+': "
                                         r"checkpoint .* has \[.*16.*\], the model has \[.*8.*\]"):
        load_model(run / "ckpt", config=run / "other.json")

    if stage != 3:  # HF export: transformers loads each tower on its own and gives the same features
        from transformers import CLIPTextModelWithProjection, CLIPVisionModelWithProjection
        from infclip.pipeline.data.tokenizer import tokenize

        out = export_hf(run / "ckpt", tmp_path / "hf")
        vision = CLIPVisionModelWithProjection.from_pretrained(out).eval()  # each tower from the CLIPModel folder
        text = CLIPTextModelWithProjection.from_pretrained(out).eval()
        g = torch.Generator().manual_seed(7)
        pixels = torch.randn(3, 3, 16, 16, generator=g)
        ids, mask = tokenize(loaded.tokenizer, ["a photo of the number five", "seven", "the digit nine written"], 12)
        with torch.no_grad():
            hf_img = torch.nn.functional.normalize(vision(pixel_values=pixels).image_embeds, dim=-1)
            hf_txt = torch.nn.functional.normalize(text(input_ids=ids, attention_mask=mask).text_embeds, dim=-1)
        torch.testing.assert_close(hf_img, img, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(hf_txt, txt, rtol=1e-5, atol=1e-6)
        again = load_model(out)  # the exported folder loads for eval too (tokenizer inside it)
        torch.testing.assert_close(_features(again.model, again.tokenizer)[0], img, rtol=1e-5, atol=1e-6)


def test_checkpoint_lookup_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found"):
        find_tag_dir(tmp_path / "nope")
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match="no 'latest' file"):
        find_tag_dir(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "latest").write_text("global_step9")
    with pytest.raises(FileNotFoundError, match="names tag 'global_step9'"):
        find_tag_dir(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="tag 'x' not found"):
        find_tag_dir(tmp_path / "ckpt", tag="x")
