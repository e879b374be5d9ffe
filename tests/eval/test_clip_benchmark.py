"""CLIP_benchmark's webdataset layout, read as published: ``test/*.tar`` with ``.cls`` labels
(classification, plus ``classnames.txt`` and ``zeroshot_classification_templates.txt`` with
``{c}``) or several captions per image in ``.txt`` (retrieval). The metrics of the real loader and
the command line are checked against a brute-force computation from the same features."""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tarfile

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from infclip.eval.clip_benchmark import clip_benchmark_section
from infclip.pipeline.data.build import build_eval_loader
from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD
from infclip.pipeline.data.tokenizer import tokenize

from .conftest import make_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from launch.zeroshot import main as zeroshot_main  # noqa: E402

CLASSES = ["zero", "one", "two", "three", "four", "five", "six"]
TEMPLATES = ["a photo of the number {c}", "the digit {c} written by hand"]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _image_bytes(rng: np.random.Generator, fmt: str) -> bytes:
    h, w = int(rng.integers(16, 28)), int(rng.integers(16, 28))
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format={"webp": "WEBP", "jpg": "JPEG", "png": "PNG"}[fmt])
    return buf.getvalue()


def _write_tar(path, samples):
    """``samples``: list of (key, {ext: bytes})."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _classification_set(root, n=23):  # unbalanced: classes 0 and 1 have 4 images, the rest 3
    rng = np.random.default_rng(0)
    (root / "test").mkdir(parents=True)
    samples = []
    for i in range(n):
        fmt = "webp" if i % 2 == 0 else "jpg"
        label = i % len(CLASSES)
        samples.append((f"s{i:07d}", {fmt: _image_bytes(rng, fmt), "cls": f"{label}\n".encode()}))
    _write_tar(root / "test" / "0.tar", samples[:12])
    _write_tar(root / "test" / "1.tar", samples[12:])
    (root / "classnames.txt").write_text("".join(f"{c}\n" for c in CLASSES))
    (root / "zeroshot_classification_templates.txt").write_text("".join(f"{t}\n" for t in TEMPLATES))
    return samples


def _retrieval_set(root, n=9):
    rng = np.random.default_rng(1)
    (root / "test").mkdir(parents=True)
    samples = []
    for i in range(n):
        k = int(rng.integers(2, 6))
        caps = [f"the digit {WORDS[int(rng.integers(10))]} {WORDS[int(rng.integers(10))]} by hand" for _ in range(k)]
        samples.append((f"r{i:07d}", {"jpg": _image_bytes(rng, "jpg"), "txt": "\n".join(caps).encode()}))
    _write_tar(root / "test" / "000.tar", samples[:5])
    _write_tar(root / "test" / "001.tar", samples[5:])
    return samples


def _pixels(data: bytes, size: int) -> torch.Tensor:
    """Independent eval preprocessing: largest centred square, bicubic resize, CLIP mean/std."""
    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    w, h = rgb.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    rgb = rgb.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))
    x = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0
    return (x - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)


@torch.no_grad()
def _image_feats(model, samples):
    size = int(model.image_size)
    pv = torch.stack([_pixels(next(v for e, v in m.items() if e in ("webp", "jpg", "png")), size)
                      for _, m in samples])
    return F.normalize(model.encode_image(pv).float(), dim=-1)


@torch.no_grad()
def _text_feats(model, tokenizer, texts):
    ids, mask = tokenize(tokenizer, texts, int(model.context_length))
    return F.normalize(model.encode_text(ids, mask).float(), dim=-1)


def _export(tokenizer, tmp_path):
    model = make_model(tokenizer, seed=3)
    hf = tmp_path / "hf"
    model.save_pretrained(str(hf))
    tokenizer.save_pretrained(str(hf / "tokenizer"))
    return model, hf


def test_loader_reads_cls_labels_without_captions(tmp_path, tokenizer):
    samples = _classification_set(tmp_path / "wds_cls")
    section = clip_benchmark_section(tmp_path / "wds_cls")
    assert section["classnames"] == CLASSES
    assert section["templates"] == [t.replace("{c}", "{}") for t in TEMPLATES]
    loader = build_eval_loader(section["shards"], tokenizer, image_size=16, context_length=12, batch_size=8,
                               require_caption=False)
    labels, keys = [], []
    for batch in loader:
        labels += batch["label"].tolist()
        keys += batch["key"]
    assert keys == [k for k, _ in samples]
    assert labels == [int(m["cls"]) for _, m in samples]
    assert loader.stats["skipped"] == 0
    # by default (and for retrieval) a sample needs a caption: the previous behaviour
    assert sum(1 for _ in build_eval_loader(section["shards"], tokenizer, image_size=16, context_length=12,
                                            batch_size=8)) == 0


def _evaluate_cli(tokenizer, tmp_path, root, batch_size):
    """An exported model, and the report ``launch/zeroshot.py --wds-dir root`` writes for it."""
    model, hf = _export(tokenizer, tmp_path)
    out = tmp_path / f"{root.name}.json"
    assert zeroshot_main(["--checkpoint", str(hf), "--wds-dir", str(root), "--batch-size", str(batch_size),
                          "--out", str(out)]) == 0
    return model, json.loads(out.read_text())


def test_classification_metrics_match_brute_force(tmp_path, tokenizer):
    root = tmp_path / "wds_cls"
    samples = _classification_set(root)
    model, report = _evaluate_cli(tokenizer, tmp_path, root, batch_size=8)
    zs = report["zeroshot"]

    img = _image_feats(model, samples)
    emb = torch.stack([_text_feats(model, tokenizer, [t.replace("{c}", c) for t in TEMPLATES]).mean(0)
                       for c in CLASSES])
    logits = (img @ F.normalize(emb, dim=-1).T).numpy()
    y = np.array([int(m["cls"]) for _, m in samples])
    order = np.argsort(-logits, axis=1, kind="stable")
    pos = np.array([list(order[i]).index(y[i]) for i in range(len(y))])
    pred = order[:, 0]
    acc1, acc5 = float(np.mean(pos < 1)), float(np.mean(pos < 5))
    recall = float(np.mean([np.mean(pred[y == c] == c) for c in range(len(CLASSES))]))

    assert zs["n"] == len(samples) and zs["num_templates"] == 2
    assert math.isclose(zs["acc1"], acc1) and math.isclose(zs["acc5"], acc5)
    assert math.isclose(zs["mean_per_class_recall"], recall)
    assert zs["top1"] == zs["acc1"] and zs["mean_per_class"] == zs["mean_per_class_recall"]
    assert 0.0 < acc1 < acc5 < 1.0 and 0.0 < recall < 1.0  # not trivially all right or all wrong


def test_multi_caption_retrieval_matches_brute_force(tmp_path, tokenizer):
    root = tmp_path / "wds_ret"
    samples = _retrieval_set(root)
    model, report = _evaluate_cli(tokenizer, tmp_path, root, batch_size=4)
    r = report["retrieval"]

    img = _image_feats(model, samples)
    texts, owner = [], []
    for i, (_, m) in enumerate(samples):
        caps = m["txt"].decode().split("\n")
        texts += caps
        owner += [i] * len(caps)
    owner = np.array(owner)
    txt = _text_feats(model, tokenizer, texts)
    sims = (img @ txt.T).numpy()
    # image -> text: position of the first of the image's captions in the sorted texts
    i2t = np.array([np.nonzero(owner[np.argsort(-sims[i], kind="stable")] == i)[0][0] for i in range(len(samples))])
    # text -> image: position of the caption's image in the sorted images
    t2i = np.array([list(np.argsort(-sims[:, t], kind="stable")).index(owner[t]) for t in range(len(texts))])

    assert r["n_pairs"] == len(samples) and r["n_texts"] == len(texts)
    for k in (1, 5, 10):
        assert math.isclose(r[f"text_retrieval_recall@{k}"], float(np.mean(i2t < k))), k
        assert math.isclose(r[f"image_retrieval_recall@{k}"], float(np.mean(t2i < k))), k
        assert r[f"i2t_r{k}"] == r[f"text_retrieval_recall@{k}"] and r[f"t2i_r{k}"] == r[f"image_retrieval_recall@{k}"]
    assert math.isclose(r["image_to_text_mean_rank"], float(i2t.mean()) + 1)
    assert math.isclose(r["text_to_image_mean_rank"], float(t2i.mean()) + 1)
    assert r["image_to_text_median_rank"] == math.floor(np.median(i2t)) + 1
    assert r["text_to_image_median_rank"] == math.floor(np.median(t2i)) + 1
    assert 0.0 < r["text_retrieval_recall@5"] < 1.0 and 0.0 < r["image_retrieval_recall@5"] < 1.0


def test_one_caption_per_image_gives_the_one_to_one_ranks():
    from infclip.eval.retrieval import image_to_text_ranks, retrieval_ranks, text_to_image_ranks

    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(13, 8, generator=g), torch.randn(13, 8, generator=g)
    img[3] = img[5]  # exact ties follow the index rule in both
    txt[7] = txt[2]
    owner = torch.arange(13)
    assert torch.equal(image_to_text_ranks(img, txt, owner, chunk_size=4), retrieval_ranks(img, txt))
    assert torch.equal(text_to_image_ranks(txt, img, owner, chunk_size=5), retrieval_ranks(txt, img))
    ones = torch.ones(6, 4)
    assert image_to_text_ranks(ones, ones, torch.arange(6)).tolist() == list(range(6))
    # two captions for image 0 (rows 0 and 2): the better-placed one counts
    assert image_to_text_ranks(ones[:2], ones[:3], torch.tensor([0, 1, 0])).tolist() == [0, 1]
