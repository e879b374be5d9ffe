"""The rendered scenes data set: deterministic shards, captions that say what the pixels show,
held-out compositions absent from training, near-duplicate retrieval groups, and shards that the
project's loaders read."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import random
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from infclip.eval.templates import fill_template, load_classnames, load_templates
from infclip.pipeline.data import scenes
from infclip.pipeline.data.build import build_eval_loader, build_train_loader
from infclip.pipeline.data.config import DataConfig
from infclip.pipeline.data.scenes import (COLOURS, HELD_OUT_COLOUR_SHAPE, HELD_OUT_COUNT_SHAPE, SHAPES, Group, Scene,
                                          caption, is_held_out, parse_caption, sample_scene, write_scenes)
from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.tokenizer import train_bpe_tokenizer

SIZE = 128  # px: small shapes have a 6-8 px circumradius, enough for the pixel checks
KW = dict(seed=3, image_size=SIZE, samples_per_shard=64)
N_TRAIN, N_EVAL, N_RETRIEVAL = 200, 40, 40


def _read(url):
    """Every sample of the shards as (key, jpg bytes, caption, meta), in order."""
    out = []
    for path in expand_urls(url):
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for key in sorted({n.split(".")[0] for n in members}):
            out.append((key, members[f"{key}.jpg"], members[f"{key}.txt"].decode(),
                        json.loads(members[f"{key}.json"])))
    return out


def _files(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    out = write_scenes(root / "a", N_TRAIN, N_EVAL, N_RETRIEVAL, workers=2, **KW)
    return {"root": root, "dir": root / "a", **out}


def test_same_seed_gives_byte_identical_shards(made):
    root = made["root"]
    write_scenes(root / "b", N_TRAIN, N_EVAL, N_RETRIEVAL, workers=1, **KW)  # one process, not two
    a, b = _files(root / "a"), _files(root / "b")
    assert len(a) == 4 + 6 + 1 + 6 * 2 + 1  # train, zero-shot, retrieval tars; class/template files; scenes.json
    assert a == b
    # the samples do not depend on the shard size; another seed gives other samples
    write_scenes(root / "c", 70, 1, 5, workers=1, **{**KW, "samples_per_shard": 50}, splits=["train"])
    assert [s[1:] for s in _read(made["splits"]["train"]["url"])[:70]] == \
        [s[1:] for s in _read(str(root / "c/train/shard-{000000..000001}.tar"))]
    # a later call with the same settings adds its splits to the manifest
    write_scenes(root / "c", 70, 1, 5, workers=1, **{**KW, "samples_per_shard": 50}, splits=["retrieval"])
    assert set(json.loads((root / "c/scenes.json").read_text())["splits"]) == {"train", "retrieval"}
    other = scenes.scene_sample("train", 0, seed=4, image_size=SIZE)
    assert scenes.scene_sample("train", 0, seed=3, image_size=SIZE)[0].data != other[0].data


def test_caption_grammar_round_trip():
    rng = random.Random(0)
    for _ in range(2000):
        groups = tuple(Group(rng.randint(1, 4), rng.choice(scenes.SIZES), rng.choice(list(COLOURS)),
                             rng.choice(SHAPES)) for _ in range(rng.choice([1, 2])))
        scene = Scene(groups, rng.choice(scenes.RELATIONS) if len(groups) == 2 else None)
        assert parse_caption(caption(scene)) == scene
    assert caption(Scene((Group(2, "small", "red", "triangle"), Group(1, "large", "blue", "circle")), "left of")) \
        == "two small red triangles left of a large blue circle"
    assert parse_caption("three large orange crosses").groups[0] == Group(3, "large", "orange", "cross")
    for bad in ["a small red circles", "two small red circle", "two big red circles", "a small red circle near "
                "a small red circle", "a small red circle left of", "A small red circle", ""]:
        with pytest.raises(ValueError):
            parse_caption(bad)


_AREA = {  # shape area / circumradius^2
    "circle": np.pi, "square": 2.0, "triangle": 3 * np.sqrt(3) / 4, "hexagon": 3 * np.sqrt(3) / 2,
    "star": 5 * 0.45 * np.sin(np.pi / 5), "cross": (8 * 0.38 - 4 * 0.38 ** 2) / (1 + 0.38 ** 2), "diamond": 1.1,
    "semicircle": np.pi / 2 / (1 + (4 / (3 * np.pi)) ** 2)}


def _components(pixels):
    """Per colour name, the connected regions (4-neighbour) of the pixels nearer that colour than
    any other (palette + the background grey): lists of (area, x_min, x_max, y_min, y_max, mask).

    A region counts only if something is left after a 3 x 3 erosion: the blend of a shape's edge
    with the background can be nearest another colour (red on light grey looks pink), but only
    along a line one or two pixels wide.
    """
    from scipy import ndimage

    palette = np.array(list(COLOURS.values()) + [pixels[1, 1].tolist()], dtype=np.float32)
    nearest = ((pixels[:, :, None, :].astype(np.float32) - palette[None, None]) ** 2).sum(-1).argmin(-1)
    out = {}
    for index, name in enumerate(COLOURS):
        labels, n = ndimage.label(nearest == index)
        out[name] = []
        for k in range(1, n + 1):
            mask = labels == k
            if ndimage.binary_erosion(mask).any():
                ys, xs = np.nonzero(mask)
                out[name].append((len(xs), xs.min(), xs.max(), ys.min(), ys.max(), mask))
    return out


def _best_shape(mask, o):
    """The shape whose ideal outline at the object's centre, radius and angle overlaps the
    pixels' region best (intersection over union)."""
    from PIL import ImageDraw

    def iou(shape):
        ideal = Image.new("L", mask.shape[::-1], 0)
        draw = ImageDraw.Draw(ideal)
        cx, cy, r = o["cx"], o["cy"], o["r"]
        if shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=1)
        else:
            draw.polygon(scenes._polygon(shape, cx, cy, r, o["angle"]), fill=1)
        ideal = np.asarray(ideal).astype(bool)
        return (ideal & mask).sum() / (ideal | mask).sum()

    return max(SHAPES, key=iou)


def test_captions_match_rendered_pixels(made):
    """Parse each caption back and check it against the pixels: per colour, as many shapes as
    the caption counts; each shape's centre has its colour; a large shape's region matches the
    caption's shape better than any other shape's outline; the area fits the size word;
    the groups' pixels lie on the sides the relation says."""
    samples = _read(made["splits"]["train"]["url"]) + _read(made["splits"]["retrieval"]["url"])
    checked_relations, shapes_seen = set(), set()
    for key, jpg, text, meta in samples:
        scene = parse_caption(text)
        assert [Group(**g) for g in meta["groups"]] == list(scene.groups) and meta["relation"] == scene.relation
        pixels = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))
        assert pixels.shape == (SIZE, SIZE, 3)
        by_colour = {}
        for g in scene.groups:
            by_colour[g.colour] = by_colour.get(g.colour, 0) + g.count
        comps = _components(pixels)
        for c in COLOURS:
            assert len(comps[c]) == by_colour.get(c, 0), (meta["split"], meta["index"], text, c)
        extents = [[], []]
        for o in meta["objects"]:
            g = scene.groups[o["group"]]
            assert (o["shape"], o["colour"], o["size"]) == (g.shape, g.colour, g.size)
            x, y = int(o["cx"]), int(o["cy"])
            centre = pixels[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3).mean(0)
            nearest = min(COLOURS, key=lambda c: ((np.array(COLOURS[c]) - centre) ** 2).sum())
            assert nearest == g.colour, (meta["split"], meta["index"], text, o)
            comp = next(c for c in comps[g.colour] if c[5][y, x])
            if g.size == "large":  # 12-15 px radius here; a small one is blurred (a cross fills in)
                assert _best_shape(comp[5], o) == g.shape, (meta["split"], meta["index"], text, o)
                shapes_seen.add(g.shape)
            # the area over the shape's own area at unit radius is r^2: below the threshold
            # between the two size ranges for "small", above it for "large" (the JPEG blur and
            # rasterising add a rim, most for thin shapes: stars, small diamonds)
            r2 = comp[0] / _AREA[g.shape] / SIZE ** 2
            threshold = scenes._RADIUS["small"][1] * scenes._RADIUS["large"][0]
            assert (r2 < threshold) == (g.size == "small"), (meta["split"], meta["index"], text, o, comp[0])
            extents[o["group"]].append(comp[1:5])
        assert sum(len(e) for e in extents) == sum(g.count for g in scene.groups)
        if scene.relation is not None:
            (a_x0, a_x1, a_y0, a_y1), (b_x0, b_x1, b_y0, b_y1) = (
                np.array(e).min(0) * [1, 0, 1, 0] + np.array(e).max(0) * [0, 1, 0, 1] for e in extents)
            holds = {"left of": a_x1 < b_x0, "right of": a_x0 > b_x1, "above": a_y1 < b_y0, "below": a_y0 > b_y1}
            assert holds[scene.relation], (meta["split"], meta["index"], text)
            checked_relations.add(scene.relation)
    assert checked_relations == set(scenes.RELATIONS) and shapes_seen == set(SHAPES)


def test_held_out_compositions_never_in_training(made):
    train = _read(made["splits"]["train"]["url"])
    groups = [g for _, _, text, _ in train for g in parse_caption(text).groups]
    objects = [o for *_, meta in train for o in meta["objects"]]
    assert not any(is_held_out(g) for g in groups)
    assert not any((o["colour"], o["shape"]) in HELD_OUT_COLOUR_SHAPE for o in objects)
    # every colour, shape and count is still trained on, with other partners
    assert {g.colour for g in groups} == set(COLOURS) and {g.shape for g in groups} == set(SHAPES)
    assert {g.count for g in groups} == {1, 2, 3, 4}
    # far more scenes than the shards hold (not rendered): still none
    for i in range(20_000):
        assert not any(is_held_out(g) for g in sample_scene("train", i, seed=KW["seed"])[0].groups)
    retrieval = _read(made["splits"]["retrieval"]["url"])
    assert not any(is_held_out(g) for _, _, text, _ in retrieval for g in parse_caption(text).groups)
    # every zero-shot sample holds one (the _seen splits: none), labelled by its task's attribute
    for split in scenes.ZEROSHOT_SPLITS:
        task, held_out = split.split("_")[1], not split.endswith("_seen")
        folder = made["dir"] / split
        classnames, templates = load_classnames(folder / "classnames.txt"), load_templates(folder / "templates.txt")
        assert classnames == scenes.zeroshot_classnames(task)
        labels = set()
        for _, _, text, meta in _read(made["splits"][split]["url"]):
            (g,) = parse_caption(text).groups
            pair = (g.count, g.shape) if task == "count" else (g.colour, g.shape)
            assert (pair in (HELD_OUT_COUNT_SHAPE if task == "count" else HELD_OUT_COLOUR_SHAPE)) == held_out
            assert is_held_out(g) == held_out
            word = scenes.COUNT_WORDS[g.count] if task == "count" else getattr(g, task)
            assert classnames[meta["label"]] == word and meta["held_out"] == held_out
            labels.add(meta["label"])
        assert len(labels) > len(classnames) // 2
        # the prompts are captions of the grammar, so the text tower has seen their form
        for t in templates:
            for name in classnames:
                parse_caption(fill_template(t, name))


def test_retrieval_groups_differ_in_one_attribute(made):
    samples = _read(made["splits"]["retrieval"]["url"])
    assert len(samples) == N_RETRIEVAL
    for start in range(0, len(samples), 5):
        group = samples[start:start + 5]
        assert [m["variant"] for *_, m in group] == list(range(5)) and len({m["group"] for *_, m in group}) == 1
        assert len({text for _, _, text, _ in group}) == 5
        base = parse_caption(group[0][2])
        assert base.relation is not None
        for _, _, text, meta in group[1:]:
            v = parse_caption(text)
            diffs = [("relation", None)] if v.relation != base.relation else []
            diffs += [(f, i) for i in (0, 1) for f in ("count", "size", "colour", "shape")
                      if getattr(v.groups[i], f) != getattr(base.groups[i], f)]
            assert len(diffs) == 1
            assert meta["changed"] == (diffs[0][0] if diffs[0][1] is None else f"{diffs[0][0]}{diffs[0][1]}")


def test_shards_load_through_the_data_pipeline(made, tmp_path):
    urls = made["splits"]
    captions = [text for _, _, text, _ in _read(urls["train"]["url"])]
    tok_dir = tmp_path / "tok"
    train_bpe_tokenizer(captions, tok_dir, vocab_size=300, context_length=24)
    from infclip.pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    batches = list(build_eval_loader(urls["zeroshot_colour"]["url"], tok, image_size=64, context_length=24,
                                     batch_size=16))
    labels = torch.cat([b["label"] for b in batches])
    expected = [m["label"] for *_, m in _read(urls["zeroshot_colour"]["url"])]
    assert labels.tolist() == expected and batches[0]["pixel_values"].shape == (16, 3, 64, 64)
    cfg = DataConfig(train_shards=urls["train"]["url"], workers=0, shuffle_buffer=32, crop_scale=[1.0, 1.0])
    loader = build_train_loader(cfg, tok, image_size=64, context_length=24, batch_size=32)
    got = list(loader)
    assert len(got) == N_TRAIN // 32 and loader.stats["skipped"] == 0
    assert got[0]["pixel_values"].shape == (32, 3, 64, 64) and got[0]["input_ids"].shape == (32, 24)
    assert torch.isfinite(got[0]["pixel_values"]).all()


def test_make_shards_cli(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "make_shards_cli", Path(__file__).resolve().parents[2] / "launch" / "make_shards.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = cli.main(["--scenes", "30", "--out", str(tmp_path / "s"), "--scene-size", "64", "--eval-samples", "8",
                    "--retrieval-samples", "12", "--samples-per-shard", "16", "--workers", "1"])
    assert set(out) == set(scenes.SPLITS)
    assert len(expand_urls(out["train"])) == 2 and len(_read(out["retrieval"])) == 10  # whole groups of 5
    manifest = json.loads((tmp_path / "s" / "scenes.json").read_text())
    assert manifest["splits"]["train"] == {"url": "train/shard-{000000..000001}.tar", "samples": 30}


@pytest.mark.parametrize("name,train,sps,n_eval,n_retrieval", [
    ("scenes_vitb32", 100_000, 1000, 2000, 5000),  # the commands in the presets' _comment and docs/scenes.md
    ("scenes_tiny_cpu", 20_000, 1000, 1000, 1000),
    ("scenes_small", 500_000, 10_000, 2000, 5000),
])
def test_presets_name_the_shards_make_shards_writes(name, train, sps, n_eval, n_retrieval):
    from infclip.eval.config import EvalConfig
    from infclip.pipeline.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "ds_configs" / f"{name}.json"))
    ev = EvalConfig.from_dict(cfg.eval)
    assert cfg.data.crop_scale == [1.0, 1.0]  # a crop could cut a shape off and falsify the count
    folder = Path(cfg.data.train_shards).parent.parent
    expected = {"train": -(-train // sps), "zeroshot": -(-n_eval // sps), "retrieval": -(-n_retrieval // sps)}
    for url, split in [(cfg.data.train_shards, "train"), (ev.shards, "zeroshot"), (ev.retrieval_shards, "retrieval")]:
        urls = expand_urls(url)
        assert len(urls) == expected[split] and Path(urls[0]).parent.parent == folder
        assert urls == [str(Path(urls[0]).parent / f"shard-{k:06d}.tar") for k in range(len(urls))]
    zs = Path(ev.shards).parent
    assert zs.name in scenes.ZEROSHOT_SPLITS
    assert ev.classnames == str(zs / "classnames.txt") and ev.templates == str(zs / "templates.txt")


def test_crowded_scenes_always_fit():
    """Four large shapes on each side of a cut: a layout is found at the smallest side, 64 px."""
    from infclip.pipeline.data.scenes import render_scene

    crowded = Scene((Group(4, "large", "red", "circle"), Group(4, "large", "blue", "square")), "above")
    for i in range(20):
        _, objects = render_scene(crowded, 64, random.Random(i))
        assert len(objects) == 8
        assert all(scenes._RADIUS["large"][0] * 64 - 0.01 <= o["r"] for o in objects)
