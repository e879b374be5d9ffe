"""The run config: one JSON, DeepSpeed keys kept as-is, project sections parsed strictly."""

from __future__ import annotations

import json
import os

import pytest

from infclip.ops.config import ConfigError
from infclip.pipeline.config import DEEPSPEED_TOP_LEVEL_KEYS, apply_overrides, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = ["tiny_cpu", "vitb32", "vitb32_zero3", "vitb16", "vitl14", "vith14", "vitbigg14"]


def write(tmp_path, data, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def tiny(tmp_path) -> dict:
    with open(os.path.join(ROOT, "ds_configs", "tiny_cpu.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_parse(name):
    cfg = load_config(os.path.join(ROOT, "ds_configs", f"{name}.json"))
    assert "model" not in cfg.ds_config and "train" not in cfg.ds_config
    assert cfg.ds_config["train_micro_batch_size_per_gpu"] == cfg.micro_batch_size
    assert cfg.model.vision.image_size % cfg.model.vision.patch_size == 0
    assert "optimizer" in cfg.ds_config


def test_vit_sizes():
    l14 = load_config(os.path.join(ROOT, "ds_configs", "vitl14.json")).model
    assert (l14.vision.layers, l14.vision.hidden_size, l14.vision.patch_size) == (24, 1024, 14)
    assert (l14.text.layers, l14.text.hidden_size, l14.embed_dim) == (12, 768, 768)
    b32 = load_config(os.path.join(ROOT, "ds_configs", "vitb32.json")).model
    assert (b32.vision.layers, b32.vision.hidden_size, b32.vision.patch_size, b32.vision.image_size) == (12, 768, 32, 224)
    assert (b32.text.hidden_size, b32.embed_dim) == (512, 512)


@pytest.mark.parametrize("preset, name", [("vitb32", "ViT-B-32"), ("vitb16", "ViT-B-16"), ("vitl14", "ViT-L-14"),
                                          ("vith14", "ViT-H-14"), ("vitbigg14", "ViT-bigG-14")])
def test_vit_presets_have_openclips_sizes(preset, name):
    """Each preset is OpenCLIP's model of that name (its model_configs JSON): the same sizes and
    heads per tower, so its weights import into the preset and the preset exports to it."""
    from tests._openclip import import_open_clip

    oc = import_open_clip().get_model_config(name)
    m = load_config(os.path.join(ROOT, "ds_configs", f"{preset}.json")).model
    ov, ot = oc["vision_cfg"], oc["text_cfg"]
    assert m.embed_dim == oc["embed_dim"]
    assert (m.vision.image_size, m.vision.patch_size, m.vision.hidden_size, m.vision.layers) == (
        ov["image_size"], ov["patch_size"], ov["width"], ov["layers"])
    assert m.vision.hidden_size // m.vision.heads == ov.get("head_width", 64)
    assert (m.vision.intermediate_size or 4 * m.vision.hidden_size) == int(ov["width"] * ov.get("mlp_ratio", 4.0))
    assert (m.text.context_length, m.text.hidden_size, m.text.layers, m.text.heads) == (
        ot["context_length"], ot["width"], ot["layers"], ot["heads"])


@pytest.mark.parametrize("bad, good", [("zero_optimisation", "zero_optimization"),
                                       ("contrastive_los", "contrastive_loss"),
                                       ("train_micro_batch_size_per_gpus", "train_micro_batch_size_per_gpu")])
def test_misspelt_top_level_key_names_key_file_and_suggestion(tmp_path, bad, good):
    data = tiny(tmp_path)
    data[bad] = data.pop(good) if good in data else {}
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert f"'{bad}'" in msg and path in msg and f"did you mean '{good}'" in msg


def test_nested_typo_in_project_section(tmp_path):
    data = tiny(tmp_path)
    data["model"]["vision"]["patchsize"] = 4
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=r"model\.vision.*patchsize.*patch_size") as exc:
        load_config(path)
    assert path in str(exc.value)
    data = tiny(tmp_path)
    data["train"]["chunk_sise"] = 4
    with pytest.raises(ConfigError, match="chunk_sise.*did you mean 'chunk_size'"):
        load_config(write(tmp_path, data))


def test_bad_values(tmp_path):
    data = tiny(tmp_path)
    data["model"]["vision"]["patch_size"] = 5
    with pytest.raises(ConfigError, match="multiple of 'patch_size'"):
        load_config(write(tmp_path, data))
    data = tiny(tmp_path)
    data["train"]["steps"] = 0
    with pytest.raises(ConfigError, match="'steps' must be >= 1"):
        load_config(write(tmp_path, data))


def test_overrides(tmp_path):
    path = write(tmp_path, tiny(tmp_path))
    cfg = load_config(path, ["train.steps=7", "train.output_dir=runs/x", "zero_optimization.stage=3",
                             "train.chunk_size=null", "model.vision.layers=1", "eval.every=5"])
    assert cfg.train.steps == 7 and cfg.train.output_dir == "runs/x" and cfg.zero_stage == 3
    assert cfg.train.chunk_size is None and cfg.model.vision.layers == 1
    assert cfg.eval["every"] == 5 and cfg.eval["use_val_shards"] is True and cfg.raw["train"]["steps"] == 7
    assert load_config(path, ["eval=null"]).eval is None
    with pytest.raises(ConfigError, match="zero_optimisation"):
        load_config(path, ["zero_optimisation.stage=2"])
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["train.steps"])


def test_deepspeed_key_list_covers_what_deepspeed_reads():
    """Keys DeepSpeed's own config reads must not be rejected as typos."""
    import deepspeed

    assert deepspeed.__version__.startswith("0.1"), "the key list was collected from deepspeed 0.19"
    for key in ("zero_optimization", "bf16", "fp16", "optimizer", "scheduler", "gradient_clipping",
                "tensorboard", "activation_checkpointing", "wall_clock_breakdown", "flops_profiler",
                "comms_logger", "csv_monitor", "wandb", "checkpoint", "data_types"):
        assert key in DEEPSPEED_TOP_LEVEL_KEYS
    assert not {"model", "data", "train", "eval", "contrastive_loss"} & DEEPSPEED_TOP_LEVEL_KEYS


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_config(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ConfigError, match="bad.json.*not valid JSON"):
        load_config(str(bad))


def test_docs_config_reference_lists_every_key_with_its_default():
    """docs/config.md has one row per key of every project section, with the dataclass default."""
    import dataclasses
    import re

    from infclip.eval.config import EvalConfig
    from infclip.ops.config import ContrastiveLossConfig
    from infclip.pipeline.data.config import DataConfig
    from infclip.pipeline.model.config import ModelConfig, TextTowerConfig, VisionTowerConfig
    from infclip.pipeline.train.train import TrainConfig

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "config.md")
    with open(path) as f:
        doc = f.read()
    sections = dict(re.findall(r"^## `([^`]+)`\n(.*?)(?=^## |\Z)", doc, flags=re.S | re.M))
    for name, cls in [("model", ModelConfig), ("model.vision", VisionTowerConfig), ("model.text", TextTowerConfig),
                      ("data", DataConfig), ("contrastive_loss", ContrastiveLossConfig), ("train", TrainConfig),
                      ("eval", EvalConfig)]:
        rows = dict(re.findall(r"^\| `([^`]+)` \| `?([^|]*?)`? \|", sections[name], flags=re.M))
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        assert set(rows) == set(fields), (name, sorted(set(fields) ^ set(rows)))
        for key, f in fields.items():
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert rows[key] == repr(default), (name, key, rows[key], repr(default))


@pytest.mark.parametrize("override, message", [
    ('optimizer.params.lr="1e-3"', r"'optimizer\.params\.lr' is the string '1e-3'; write the number without quotes"),
    ('zero_optimization.stage="2"', r"'zero_optimization\.stage' is the string '2'"),
    ('optimizer.params.betas=[0.9, "0.98"]', r"'optimizer\.params\.betas\[1\]' is the string '0\.98'"),
    ("train_micro_batch_size_per_gpu=2.5", r"'train_micro_batch_size_per_gpu' must be a whole number >= 1, got 2\.5"),
    ("train_micro_batch_size_per_gpu=0", r"'train_micro_batch_size_per_gpu' must be a whole number >= 1, got 0"),
    ('gradient_accumulation_steps="4"', r"'gradient_accumulation_steps' must be a whole number >= 1, got '4'"),
    ("gradient_clipping=Infinity", r"'gradient_clipping' must be a finite number, got inf"),
    ("model.max_logit_scale=Infinity", r"'model'.*'max_logit_scale' must be a finite number, got inf"),
    ("contrastive_loss.label_smoothing=NaN", r"'contrastive_loss'.*'label_smoothing' must be a finite number"),
])
def test_values_deepspeed_or_the_project_would_take_wrongly(tmp_path, override, message):
    """Quoted numbers in DeepSpeed's sections (a TypeError naming no key inside the optimizer), a
    fractional micro-batch (trains at the floor), Infinity/NaN (disable the logit-scale clamp):
    rejected at load, naming the key and the file."""
    path = write(tmp_path, tiny(tmp_path))
    with pytest.raises(ConfigError, match=message) as exc:
        load_config(path, [override])
    assert path in str(exc.value)


def test_text_keys_in_deepspeed_sections_may_look_numeric(tmp_path):
    cfg = load_config(write(tmp_path, tiny(tmp_path)), ['tensorboard={"enabled": false, "job_name": "2024"}'])
    assert cfg.ds_config["tensorboard"]["job_name"] == "2024" and cfg.micro_batch_size == 64


def test_config_imports_no_part_of_the_run():
    """pipeline.config reads only the sections' dataclasses: nothing it imports, directly or
    through others, is part of the engine or the training run (which import it)."""
    from tests.test_package import _project_imports

    graph = _project_imports()
    seen, todo = set(), ["pipeline.config"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    assert not [m for m in seen if m.startswith(("pipeline.train", "pipeline.engine"))], sorted(seen)
