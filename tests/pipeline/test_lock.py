"""model.lock_image (LiT): a locked image tower with its last block left trainable, trained
through the real pipeline (DeepSpeed, a gloo world of one) under ZeRO 0 and ZeRO 3: the frozen
weights come out bitwise unchanged, the unlocked ones and the text tower changed."""

from __future__ import annotations

import pytest
import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.engine import engine as engine_mod
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers
from infclip.pipeline.model.param_layout import param_groups
from tests.pipeline.test_chunked import tiny_model
from tests.pipeline.test_train import run_inproc, world_of_one  # noqa: F401 (fixture)


def test_lock_towers_freezes_all_but_the_last_blocks():
    model = tiny_model(0.0)
    model.cfg.lock_text, model.cfg.lock_text_unlocked_blocks = True, 1
    model.cfg.lock_image = True
    frozen = set(model.lock_towers())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.startswith("vision.") for n in trainable)  # unlocked_blocks 0: the whole image tower
    assert "text.text_model.encoder.layers.0.mlp.fc1.weight" in trainable  # the last (only) text block
    assert {"text.text_model.final_layer_norm.weight", "text.text_projection.weight"} <= trainable
    assert "text.text_model.embeddings.token_embedding.weight" in frozen
    grouped = {id(p) for g in param_groups(model) for p in g["params"]}
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}
    with pytest.raises(ConfigError, match="lock_image_unlocked_blocks"):
        ModelConfig.from_dict({"lock_image": True, "lock_image_unlocked_blocks": 13})


@pytest.mark.parametrize("stage", [0, 3])
def test_locked_image_tower_stays_bitwise_frozen(world_of_one, digits_shards, tmp_path, monkeypatch, stage):
    before = {}
    real = engine_mod.param_groups

    def snapshot(model, *args, **kwargs):
        import contextlib

        gather = contextlib.nullcontext()
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(list(model.parameters()))
        with gather:
            before.update({n: (p.detach().float().clone(), p.requires_grad) for n, p in model.named_parameters()})
        groups = real(model, *args, **kwargs)
        assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in model.parameters() if p.requires_grad}
        return groups

    monkeypatch.setattr(engine_mod, "param_groups", snapshot)
    result = run_inproc(digits_shards, tmp_path / f"z{stage}", 2, **{
        "zero_optimization.stage": stage, "model.lock_image": True, "model.lock_image_unlocked_blocks": 1,
        "train.export_final": True, "train.save_final": False, "scheduler.params.warmup_min_ratio": 1.0})
    after = dict(CLIPTowers.from_pretrained(result.final_dir).named_parameters())
    frozen = [n for n, (_, grad) in before.items() if not grad]
    assert "vision.vision_model.encoder.layers.0.self_attn.q_proj.weight" in frozen
    assert "vision.vision_model.embeddings.patch_embedding.weight" in frozen
    assert not any(n.startswith(("vision.vision_model.encoder.layers.1.", "text.")) for n in frozen)
    for name in frozen:
        assert torch.equal(after[name].detach().float(), before[name][0]), name
    for name in ("vision.vision_model.encoder.layers.1.mlp.fc1.weight", "vision.visual_projection.weight",
                 "vision.vision_model.post_layernorm.weight", "text.text_model.encoder.layers.0.mlp.fc1.weight"):
        assert not torch.equal(after[name].detach().float(), before[name][0]), name


def test_unlocked_block_gets_gradients_with_reentrant_checkpointing():
    """Behind frozen embeddings the checkpointed (reentrant) unlocked block still gets its gradient."""
    from tests.pipeline.test_chunked import batch

    model = tiny_model(0.0)
    model.cfg.lock_image, model.cfg.lock_image_unlocked_blocks = True, 1
    model.lock_towers()
    model.cfg.gradient_checkpointing = True
    model.set_gradient_checkpointing(True)
    model.train()
    pv, ids, mask = batch()
    img, txt, scale, _ = model(pv, ids, mask)
    (scale * img @ txt.T).logsumexp(-1).mean().backward()
    block = model.vision.vision_model.encoder.layers[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())
    assert model.vision.vision_model.embeddings.patch_embedding.weight.grad is None


def test_locked_zero1_checkpoint_consolidates_with_its_frozen_weights(world_of_one, digits_shards, tmp_path):
    """ZeRO-1 keeps no record of frozen parameters beside the module state: consolidating its
    checkpoint (what evaluation and export read) must still give every weight."""
    from infclip.eval.checkpoint import consolidate_fp32_state_dict

    out = tmp_path / "z1"
    result = run_inproc(digits_shards, out, 2, **{
        "zero_optimization.stage": 1, "model.lock_image": True, "model.lock_image_unlocked_blocks": 1,
        "train.export_final": True, "train.save_final": True, "scheduler.params.warmup_min_ratio": 1.0})
    sd, info = consolidate_fp32_state_dict(out / "ckpt")
    exported = CLIPTowers.from_pretrained(result.final_dir).state_dict()
    assert info["zero_stage"] == 1 and set(sd) == set(exported)
    name = "vision.vision_model.embeddings.patch_embedding.weight"  # frozen
    torch.testing.assert_close(sd[name], exported[name].float())
