"""Fixtures for eval tests: a tiny model config, a tokenizer, digits shards, a DeepSpeed engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infclip.pipeline.data.shards import DIGITS_CLASSNAMES, digits_samples, write_shards
from infclip.pipeline.data.tokenizer import train_bpe_tokenizer
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers

TINY_MODEL = {
    "embed_dim": 16,
    "vision": {"image_size": 16, "patch_size": 8, "hidden_size": 16, "layers": 1, "heads": 2},
    "text": {"context_length": 12, "hidden_size": 16, "layers": 1, "heads": 2},
}
CORPUS = [f"a photo of the number {w}" for w in DIGITS_CLASSNAMES] * 3 + [
    f"the digit {w} written by hand" for w in DIGITS_CLASSNAMES]


def tiny_model_config(**overrides) -> ModelConfig:
    section = json.loads(json.dumps(TINY_MODEL))
    for key, value in overrides.items():
        section[key] = value
    return ModelConfig.from_dict(section)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_tok") / "tokenizer"
    train_bpe_tokenizer(CORPUS, out, vocab_size=300, context_length=12)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from infclip.pipeline.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def make_model(tokenizer, seed: int = 0, **overrides) -> CLIPTowers:
    torch.manual_seed(seed)
    return CLIPTowers.from_config(tiny_model_config(**overrides), tokenizer).eval()


@pytest.fixture(scope="session")
def digits_test(tmp_path_factory):
    """The held-out digits split (359 images, 16 px) as PNG shards with labels and as a class-folder
    tree of the same PNG bytes; returns {"shards": brace URL, "images": folder, "n": count}."""
    root = tmp_path_factory.mktemp("eval_digits")
    samples = list(digits_samples("test", seed=0, image_size=16))
    paths = write_shards(samples, root / "shards", samples_per_shard=128, image_format="png")
    from infclip.pipeline.data.shards import brace_url

    images = root / "images"
    for i, (img, _caption, meta) in enumerate(samples):
        folder = images / meta["classname"]
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{i:05d}.png")
    return {"shards": brace_url(paths), "images": str(images), "n": len(samples)}


@pytest.fixture(scope="session")
def single_rank_env():
    """A one-process gloo world for in-process DeepSpeed engines (DeepSpeed would otherwise try MPI
    discovery). Kept for the session: DeepSpeed caches its process groups, so the world cannot be
    torn down and rebuilt between tests."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        from infclip.pipeline.train.train import single_process_env

        single_process_env()
    yield


def write_run_files(run_dir: Path, tokenizer_dir: Path, model_section: dict) -> None:
    """What pipeline.train.train leaves beside its checkpoints: config.json and tokenizer/."""
    import shutil

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"model": model_section}))
    shutil.copytree(tokenizer_dir, run_dir / "tokenizer", dirs_exist_ok=True)
