"""model.zero3_init: the towers built partitioned under deepspeed.zero.Init (2 real gloo ranks)."""

import json
import math

import torch

from infclip.pipeline.model.model import CLIPTowers, _hf_configs, _new_tower
from infclip.pipeline.model.param_layout import param_groups as _param_groups
from tests._ranks import run_two_ranks
from tests.pipeline._zero3_init_worker import checksum as _checksum
from tests.pipeline.test_chunked import tiny_model


def _plain_stats(module):
    return {n: {"mean": p.float().mean().item(), "std": p.float().std(correction=0).item(), "checksum": _checksum(p)}
            for n, p in module.named_parameters()}


def _towers(seed: int):
    """The worker's CLIPTowers, built whole from ``seed``."""
    cfg = tiny_model(0.0).cfg
    torch.manual_seed(seed)
    return CLIPTowers(cfg, eos_token_id=1, pad_token_id=0, bos_token_id=2)


def test_zero3_init_partitions_at_construction_with_transformers_init(tmp_path):
    """Two ranks seeded differently build the towers partitioned (the whole model in bf16): every tower parameter is a
    shard (ceil(numel / 2)) before deepspeed.initialize; the gathered weights are identical on
    both ranks (rank 0's init, broadcast); transformers' init is applied (checked at an unusual
    initializer_factor of 5, against the same tower built whole); weight decay still skips the
    1-D parameters; a training step gives the same weights on both ranks."""
    from transformers import CLIPVisionModelWithProjection

    proc = run_two_ranks(["-m", "tests.pipeline._zero3_init_worker", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    # (a) one tower: sharded at construction, and exactly the weights of a whole build from rank
    # 0's seed (100), on both ranks (rank 1 was seeded 101)
    cfg = tiny_model(0.0).cfg
    vision_cfg, _ = _hf_configs(cfg, 50, {"eos_token_id": 1})
    vision_cfg.initializer_factor = 5.0
    torch.manual_seed(100)
    plain = _plain_stats(_new_tower(CLIPVisionModelWithProjection, vision_cfg, None))
    assert set(r0["tower_shards"]) == set(plain)
    for name, (shard, numel) in r0["tower_shards"].items():
        assert shard == math.ceil(numel / 2), name
    for name, ref in plain.items():
        assert r0["tower"][name]["checksum"] == r1["tower"][name]["checksum"] == ref["checksum"], name
    # transformers' init ran (not torch's defaults): LayerNorms at ones/zeros, the patch embedding
    # at initializer_range * factor = 0.1 (3,072 values), the class embedding at 16^-0.5 * 5
    assert plain["vision_model.pre_layrnorm.weight"]["mean"] == 1.0 and plain["vision_model.pre_layrnorm.weight"]["std"] == 0.0
    assert plain["vision_model.pre_layrnorm.bias"]["mean"] == 0.0 and plain["vision_model.pre_layrnorm.bias"]["std"] == 0.0
    assert abs(plain["vision_model.embeddings.patch_embedding.weight"]["std"] / 0.1 - 1) < 0.1
    assert abs(plain["vision_model.embeddings.class_embedding"]["std"] / 1.25 - 1) < 0.5

    # (b) the pipeline's CLIPTowers: both towers partitioned, logit scale/bias left to initialize
    whole = tiny_model(0.0)
    tower_params = [n for n, _ in whole.named_parameters() if n.startswith(("vision.", "text."))]
    assert r0["model_partitioned"] == sorted(tower_params)
    assert r0["group_sizes"] == [len(g["params"]) for g in _param_groups(whole, decay_1d=False)]
    whole_stats = _plain_stats(_towers(200).to(torch.bfloat16))  # rank 0's seed; the run is bf16
    for name, ref in whole_stats.items():
        assert r0["model"][name]["checksum"] == ref["checksum"], f"{name}: zero.Init build != whole build"
    emb = r0["model"]["text.text_model.embeddings.token_embedding.weight"]
    assert 0.015 < emb["std"] < 0.025  # CLIP's 0.02, not nn.Embedding's N(0, 1)
    for key in ("model", "after_step"):
        for name, st in r0[key].items():
            assert st["checksum"] == r1[key][name]["checksum"], f"{key}: {name} differs between ranks"
    assert all(math.isfinite(r["loss"]) for r in (r0, r1))
    moved = [n for n in r0["model"] if r0["model"][n]["checksum"] != r0["after_step"][n]["checksum"]]
    assert len(moved) > len(tower_params) // 2  # the step updated the partitioned weights
