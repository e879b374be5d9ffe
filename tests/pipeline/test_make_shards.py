"""The make_shards CLI writes shards that the loaders read back (labels included)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from infclip.pipeline.data.build import build_eval_loader
from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.shards import DIGITS_CLASSNAMES
from infclip.pipeline.data.tokenizer import load_tokenizer

_SPEC = importlib.util.spec_from_file_location(
    "make_shards_cli", Path(__file__).resolve().parents[2] / "launch" / "make_shards.py")
make_shards = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(make_shards)


def test_digits_cli_writes_loadable_labelled_shards(tmp_path, digits_shards):
    out = make_shards.main(["--digits", "--out", str(tmp_path / "d"), "--image-size", "16",
                            "--samples-per-shard", "500"])
    train, test = expand_urls(out["train"]), expand_urls(out["test"])
    assert len(train) == 3 and len(test) == 1 and all(Path(p).is_file() for p in train + test)
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    batches = list(build_eval_loader(out["test"], tok, image_size=16, context_length=16, batch_size=200))
    labels = torch.cat([b["label"] for b in batches])
    captions = [c for b in batches for c in b["caption"]]
    assert len(labels) == 359 and set(labels.tolist()) == set(range(10))
    assert batches[0]["pixel_values"].shape[1:] == (3, 16, 16)
    # every caption names its own digit (by name or numeral)
    for label, caption in zip(labels.tolist(), captions):
        assert DIGITS_CLASSNAMES[label] in caption or str(label) in caption
    n_train = sum(b["pixel_values"].shape[0] for b in build_eval_loader(
        out["train"], tok, image_size=16, context_length=16, batch_size=500, with_labels=False))
    assert n_train == 1797 - 359


def test_image_dir_cli(tmp_path, digits_shards):
    from PIL import Image

    src = tmp_path / "imgs"
    src.mkdir()
    for i in range(5):
        Image.new("RGB", (9, 7), (i * 40, 0, 0)).save(src / f"p{i}.jpg")
    (src / "captions.tsv").write_text("".join(f"p{i}.jpg\tred square {i}\n" for i in range(5)))
    out = make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "s"), "--samples-per-shard", "2"])
    assert len(expand_urls(out["train"])) == 3
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    batches = list(build_eval_loader(out["train"], tok, image_size=7, context_length=16, batch_size=5,
                                     with_labels=False))
    assert [c for b in batches for c in b["caption"]] == [f"red square {i}" for i in range(5)]
    (src / "p5.jpg").write_bytes((src / "p0.jpg").read_bytes())
    with pytest.raises(ValueError, match="p5.jpg"):
        make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "t")])
