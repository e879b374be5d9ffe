"""Rendered scenes of shapes, captioned compositionally: a built-in image-text data set on which
contrastive batch size can matter.

Design: a scene is one or two *groups* of identical-looking shapes ("two small red triangles"),
two groups joined by a spatial relation ("... left of a large blue circle"). The caption is
generated from the scene by a small grammar (:func:`caption`) and parsed back by
:func:`parse_caption`; the rendering puts each group's shapes in its own region, so the relation
holds for every shape's full extent, and keeps shapes apart, so counts and colours are visible.
Drawing is PIL only (no anti-aliasing), JPEG-encoded.

Every sample is a pure function of (seed, split, index): its RNG is seeded from those alone, so
shards can be written in any order by any number of processes, and the shard size does not change
the samples. Same seed, same machine -> byte-identical shards (the regular polygons' vertices come
from libm's sin/cos, so another platform may differ in the last pixel).

Splits (:func:`write_scenes` writes them all under one folder):

* ``train``: one-group (10%) or two-group scenes, never containing a *held-out composition*:
  a (colour, shape) pair of :data:`HELD_OUT_COLOUR_SHAPE` or a (count, shape) pair of
  :data:`HELD_OUT_COUNT_SHAPE`.
* ``zeroshot_shape`` / ``zeroshot_colour``: one shape whose (colour, shape) pair is held out,
  labelled by shape / by colour; ``zeroshot_count``: one group whose (count, shape) pair is
  held out, labelled by count (two/three/four). Each folder holds ``classnames.txt`` and
  ``templates.txt`` (prompts in the caption grammar, marginalising the other attributes), the
  files ``launch/zeroshot.py --shards`` and the ``eval`` section take.
* ``zeroshot_{shape,colour,count}_seen``: the same tasks on compositions seen in training (new
  samples): whether the model learned the attribute at all, beside whether it generalises it to
  unseen combinations.
* ``retrieval``: groups of ``group_size`` two-group scenes (adjacent keys): a base scene and
  variants that each change exactly one attribute (a group's count, size, colour or shape, or the
  relation); their captions are one another's hard negatives. Allowed compositions only, from a
  seed stream disjoint from training.

Limit: captions that say the same thing two ways ("A left of B" / "B right of A") are different
strings, and the caption space is finite (420 one-group and 705,600 two-group training captions),
so a large batch holds some identical captions (false negatives) as well as the near-duplicates
(rates by batch size in docs/scenes.md).
"""

from __future__ import annotations

import io
import json
import logging
import math
import multiprocessing
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from PIL import Image, ImageDraw

from .shards import EncodedImage, brace_url, usable_cores, write_shards_to_paths

__all__ = [
    "COLOURS",
    "COUNT_WORDS",
    "HELD_OUT_COLOUR_SHAPE",
    "HELD_OUT_COUNT_SHAPE",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "ZEROSHOT_SPLITS",
    "ZEROSHOT_TASKS",
    "Group",
    "Scene",
    "caption",
    "is_held_out",
    "parse_caption",
    "render_scene",
    "sample_scene",
    "scene_sample",
    "write_scenes",
    "zeroshot_classnames",
    "zeroshot_templates",
]

logger = logging.getLogger(__name__)

SHAPES = ["circle", "square", "triangle", "star", "hexagon", "cross", "diamond", "semicircle"]
"""Shape names (singular), index = zero-shot shape label."""
_PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "star": "stars",
            "hexagon": "hexagons", "cross": "crosses", "diamond": "diamonds", "semicircle": "semicircles"}
COLOURS: Dict[str, Tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 230), "yellow": (245, 215, 20),
    "purple": (130, 40, 170), "orange": (250, 135, 10), "pink": (250, 130, 200), "cyan": (20, 210, 220),
    "white": (250, 250, 250), "black": (15, 15, 15),
}
"""Colour names and their RGB fill, insertion order = zero-shot colour label. Backgrounds are
neutral greys 90-190, 60 or more from white and black per channel. No colour is a blend of
another with grey (brown was: red's edge on dark grey looked brown)."""
SIZES = ["small", "large"]
COUNT_WORDS = {1: "a", 2: "two", 3: "three", 4: "four"}
RELATIONS = ["left of", "right of", "above", "below"]
_RADIUS = {"small": (0.045, 0.06), "large": (0.095, 0.12)}  # circumradius as a fraction of the side
_MARGIN = 0.03  # shapes keep this fraction of the side away from the border
_GAP = 0.03  # and at least this much (or 3 px) apart, and from the other group's region

_COLOUR_NAMES = list(COLOURS)
HELD_OUT_COLOUR_SHAPE = frozenset((c, SHAPES[i % len(SHAPES)]) for i, c in enumerate(_COLOUR_NAMES))
"""(colour, shape) pairs never drawn in training: 10 of 80, every colour once, every shape at
least once (each colour and shape is still seen with other partners)."""
HELD_OUT_COUNT_SHAPE = frozenset((2 + i % 3, s) for i, s in enumerate(SHAPES))
"""(count, shape) pairs never drawn in training: 8 of 32, one count in 2..4 per shape."""

ZEROSHOT_TASKS = ("shape", "colour", "count")
ZEROSHOT_SPLITS = tuple(f"zeroshot_{t}{seen}" for seen in ("", "_seen") for t in ZEROSHOT_TASKS)
SPLITS = ("train",) + ZEROSHOT_SPLITS + ("retrieval",)
_ZS_COUNTS = [2, 3, 4]


@dataclass(frozen=True)
class Group:
    """``count`` shapes of one size class, colour and shape: one caption phrase ("two small red
    triangles"); each is drawn with its own radius within the size class and its own rotation."""

    count: int
    size: str
    colour: str
    shape: str

    def phrase(self) -> str:
        noun = self.shape if self.count == 1 else _PLURALS[self.shape]
        return f"{COUNT_WORDS[self.count]} {self.size} {self.colour} {noun}"


@dataclass(frozen=True)
class Scene:
    """One group, or two groups with ``relation`` (groups[0] is ``relation`` groups[1])."""

    groups: Tuple[Group, ...]
    relation: Optional[str] = None

    def __post_init__(self) -> None:
        if len(self.groups) not in (1, 2) or (len(self.groups) == 2) != (self.relation is not None):
            raise ValueError(f"a scene is one group, or two groups with a relation: {self}")


def caption(scene: Scene) -> str:
    """The scene's caption: ``GROUP`` or ``GROUP RELATION GROUP``, with
    ``GROUP = COUNT SIZE COLOUR SHAPE`` (COUNT in a/two/three/four, the shape plural after two+)."""
    if scene.relation is None:
        return scene.groups[0].phrase()
    return f"{scene.groups[0].phrase()} {scene.relation} {scene.groups[1].phrase()}"


_WORD_COUNT = {w: n for n, w in COUNT_WORDS.items()}
_NOUNS = {**{s: (s, False) for s in SHAPES}, **{p: (s, True) for s, p in _PLURALS.items()}}
_GROUP_RE = (rf"({'|'.join(_WORD_COUNT)}) ({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) "
             rf"({'|'.join(sorted(_NOUNS, key=len, reverse=True))})")
_CAPTION_RE = re.compile(rf"^{_GROUP_RE}(?: ({'|'.join(RELATIONS)}) {_GROUP_RE})?$")


def parse_caption(text: str) -> Scene:
    """Invert :func:`caption`; raises ``ValueError`` for text outside the grammar (number
    agreement included: "a" takes the singular, two/three/four the plural)."""
    m = _CAPTION_RE.match(text)
    if m is None:
        raise ValueError(f"not a scene caption: {text!r}")
    parts = m.groups()

    def group(count_word: str, size: str, colour: str, noun: str) -> Group:
        count = _WORD_COUNT[count_word]
        shape, plural = _NOUNS[noun]
        if plural != (count > 1):
            raise ValueError(f"number agreement: {count_word!r} with {noun!r} in {text!r}")
        return Group(count, size, colour, shape)

    if parts[4] is None:
        return Scene((group(*parts[:4]),))
    return Scene((group(*parts[:4]), group(*parts[5:])), parts[4])


def is_held_out(group: Group) -> bool:
    """Whether the group holds a held-out composition (never in training shards)."""
    return ((group.colour, group.shape) in HELD_OUT_COLOUR_SHAPE
            or (group.count, group.shape) in HELD_OUT_COUNT_SHAPE)


# ------------------------------------------------------------------------------ sampling scenes

def _random_group(rng: random.Random) -> Group:
    """A uniformly drawn group with no held-out composition."""
    while True:
        g = Group(rng.randint(1, 4), rng.choice(SIZES), rng.choice(_COLOUR_NAMES), rng.choice(SHAPES))
        if not is_held_out(g):
            return g


def _train_scene(rng: random.Random) -> Scene:
    # one group in 10% of scenes only: the 420 one-group captions repeat within a batch far more
    # than the 705,600 two-group ones (identical captions are false negatives; docs/scenes.md)
    if rng.random() < 0.1:
        return Scene((_random_group(rng),))
    return Scene((_random_group(rng), _random_group(rng)), rng.choice(RELATIONS))


def _zeroshot_scene(task: str, held_out: bool, rng: random.Random) -> Tuple[Scene, int]:
    """A one-group scene and its label for ``task``; the group holds a held-out composition
    (``held_out``) or only seen ones."""
    if task in ("shape", "colour"):
        pairs = sorted(HELD_OUT_COLOUR_SHAPE) if held_out else \
            [(c, s) for c in _COLOUR_NAMES for s in SHAPES if (c, s) not in HELD_OUT_COLOUR_SHAPE]
        colour, shape = rng.choice(pairs)
        g = Group(1, rng.choice(SIZES), colour, shape)
        label = SHAPES.index(shape) if task == "shape" else _COLOUR_NAMES.index(colour)
    elif task == "count":
        pairs = sorted(HELD_OUT_COUNT_SHAPE) if held_out else \
            [(n, s) for n in _ZS_COUNTS for s in SHAPES if (n, s) not in HELD_OUT_COUNT_SHAPE]
        count, shape = rng.choice(pairs)
        colour = rng.choice([c for c in _COLOUR_NAMES if (c, shape) not in HELD_OUT_COLOUR_SHAPE])
        g = Group(count, rng.choice(SIZES), colour, shape)
        label = _ZS_COUNTS.index(count)
    else:
        raise ValueError(f"zero-shot task must be one of {ZEROSHOT_TASKS}, got {task!r}")
    return Scene((g,)), label


_FLIP = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
_VARY = [("relation", None)] + [(attr, i) for i in (0, 1) for attr in ("count", "size", "colour", "shape")]


def _vary(scene: Scene, attr: str, which: Optional[int], rng: random.Random) -> Scene:
    """``scene`` with one attribute changed: the relation flipped, or group ``which``'s ``attr``
    set to another value that makes no held-out group (there always is one)."""
    if attr == "relation":
        return Scene(scene.groups, _FLIP[scene.relation])
    g = scene.groups[which]
    values = {"count": list(COUNT_WORDS), "size": SIZES, "colour": _COLOUR_NAMES, "shape": SHAPES}[attr]
    changed = [Group(**{**g.__dict__, attr: v}) for v in values if v != getattr(g, attr)]
    groups = list(scene.groups)
    groups[which] = rng.choice([c for c in changed if not is_held_out(c)])
    return Scene(tuple(groups), scene.relation)


def _retrieval_group(seed: int, group_index: int, group_size: int) -> List[Tuple[Scene, str]]:
    """A base two-group scene and ``group_size - 1`` variants, each with the attribute changed
    (``"base"`` for the first); every variant changes a different (attribute, group)."""
    rng = random.Random(f"scenes/{seed}/retrieval-group/{group_index}")
    base = Scene((_random_group(rng), _random_group(rng)), rng.choice(RELATIONS))
    out = [(base, "base")]
    options = list(_VARY)
    rng.shuffle(options)
    for attr, which in options[:group_size - 1]:
        out.append((_vary(base, attr, which, rng), attr if which is None else f"{attr}{which}"))
    return out


# ------------------------------------------------------------------------------------- rendering

def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> List[Tuple[float, float]]:
    """Vertices of ``shape`` with circumradius ``r``, centred on (cx, cy), turned by ``angle``."""
    ca, sa = math.cos(angle), math.sin(angle)
    if shape == "star":
        radii, n = [r if k % 2 == 0 else 0.45 * r for k in range(10)], 10
    elif shape == "diamond":  # a rhombus, its short diagonal 0.55 of the long one (a square's is 1)
        pts = [(r, 0), (0, 0.55 * r), (-r, 0), (0, -0.55 * r)]
        return [(cx + x * ca - y * sa, cy + x * sa + y * ca) for x, y in pts]
    elif shape == "semicircle":
        # a half disc of radius R whose centroid (4R/3pi from the chord) is the centre, so the
        # centre is inside; R such that the chord's ends are r from the centre
        d = 4 / (3 * math.pi)
        big = r / math.hypot(1, d)
        pts = [(big * math.cos(math.pi * k / 16), big * (math.sin(math.pi * k / 16) - d)) for k in range(17)]
        return [(cx + x * ca - y * sa, cy + x * sa + y * ca) for x, y in pts]
    elif shape == "cross":
        w = 0.38  # arm half-width over the arm length
        pts = [(w, 1), (w, w), (1, w), (1, -w), (w, -w), (w, -1), (-w, -1), (-w, -w), (-1, -w), (-1, w),
               (-w, w), (-w, 1)]
        s = r / math.hypot(1, w)
        return [(cx + s * (x * ca - y * sa), cy + s * (x * sa + y * ca)) for x, y in pts]
    else:
        n = {"square": 4, "triangle": 3, "hexagon": 6}[shape]
        radii = [r] * n
    return [(cx + rad * math.cos(angle + 2 * math.pi * k / n), cy + rad * math.sin(angle + 2 * math.pi * k / n))
            for k, rad in enumerate(radii)]


def _place(group: Group, gi: int, region: Tuple[float, float, float, float], objects: List[Dict[str, Any]],
           size: int, gap: float, shrink: float, rng: random.Random) -> Optional[Dict[str, Any]]:
    """One shape of ``group`` at a random free spot of ``region`` (None after 100 misses); its
    radius is drawn from the lower ``1 - shrink`` of its size range."""
    x0, y0, x1, y1 = region
    lo, hi = _RADIUS[group.size]
    r = size * rng.uniform(lo, hi - shrink * (hi - lo))
    if x1 - x0 < 2 * r or y1 - y0 < 2 * r:
        return None
    for _ in range(100):
        cx, cy = rng.uniform(x0 + r, x1 - r), rng.uniform(y0 + r, y1 - r)
        if all(math.hypot(cx - o["cx"], cy - o["cy"]) >= r + o["r"] + gap for o in objects):
            return {"group": gi, "shape": group.shape, "colour": group.colour, "size": group.size,
                    "cx": round(cx, 2), "cy": round(cy, 2), "r": round(r, 2),
                    "angle": round(rng.uniform(0, 2 * math.pi), 4)}
    return None


def _layout(scene: Scene, size: int, rng: random.Random) -> List[Dict[str, Any]]:
    """Place every shape: each group inside its region (for two groups, the canvas cut across
    the relation's axis with a gap between), no two shapes closer than the gap.

    A failed attempt starts over; from the 50th on, the radii come from a shrinking upper part of
    their range, down to its lower end by the 250th, where four large shapes fit in half the
    canvas as a 2 x 2 grid (side >= 64 px), so a layout is always found."""
    gap = max(3.0, _GAP * size)
    lo, hi = _MARGIN * size, size - _MARGIN * size
    for attempt in range(1000):
        if scene.relation is None:
            regions = [(lo, lo, hi, hi)]
        else:
            cut = size * rng.uniform(0.45, 0.55)
            if scene.relation in ("left of", "right of"):
                near, far = (lo, lo, cut - gap / 2, hi), (cut + gap / 2, lo, hi, hi)
            else:
                near, far = (lo, lo, hi, cut - gap / 2), (lo, cut + gap / 2, hi, hi)
            # groups[0] is `relation` groups[1]: left of / above -> groups[0] takes the near side
            regions = [near, far] if scene.relation in ("left of", "above") else [far, near]
        objects: List[Dict[str, Any]] = []
        for gi, (group, region) in enumerate(zip(scene.groups, regions)):
            for _ in range(group.count):
                obj = _place(group, gi, region, objects, size, gap, min(1.0, max(0, attempt - 50) / 200), rng)
                if obj is None:
                    break
                objects.append(obj)
        if len(objects) == sum(g.count for g in scene.groups):
            return objects
    raise RuntimeError(f"could not place {caption(scene)!r} on {size} px")


def render_scene(scene: Scene, size: int, rng: random.Random) -> Tuple[Image.Image, List[Dict[str, Any]]]:
    """Draw ``scene`` on a ``size`` x ``size`` RGB canvas (neutral grey background).

    Returns the image and its objects: ``{"group", "shape", "colour", "size", "cx", "cy", "r",
    "angle"}`` (pixel centre, circumradius, rotation in radians); the centre is inside the shape.
    """
    grey = rng.randint(90, 190)
    objects = _layout(scene, size, rng)
    img = Image.new("RGB", (size, size), (grey, grey, grey))
    draw = ImageDraw.Draw(img)
    for o in objects:
        fill = COLOURS[o["colour"]]
        cx, cy, r = o["cx"], o["cy"], o["r"]
        if o["shape"] == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            draw.polygon(_polygon(o["shape"], cx, cy, r, o["angle"]), fill=fill)
    return img, objects


# ------------------------------------------------------------------------------------- samples

def sample_scene(split: str, index: int, seed: int = 0, group_size: int = 5) -> Tuple[Scene, Dict[str, Any]]:
    """The scene of sample ``index`` of ``split`` (not rendered) and its split-specific meta:
    ``{"label", "task", "held_out"}`` for zero-shot, ``{"group", "variant", "changed"}`` for
    retrieval."""
    rng = random.Random(f"scenes/{seed}/{split}/{index}/scene")
    if split == "train":
        return _train_scene(rng), {}
    if split in ZEROSHOT_SPLITS:
        task, held_out = split.split("_")[1], not split.endswith("_seen")
        scene, label = _zeroshot_scene(task, held_out, rng)
        return scene, {"label": label, "task": task, "held_out": held_out}
    if split == "retrieval":
        g, v = divmod(index, group_size)
        scene, changed = _retrieval_group(seed, g, group_size)[v]
        return scene, {"group": g, "variant": v, "changed": changed}
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def scene_sample(split: str, index: int, seed: int = 0, image_size: int = 256, jpeg_quality: int = 90,
                 group_size: int = 5) -> Tuple[EncodedImage, str, Dict[str, Any]]:
    """Sample ``index`` of ``split``: ``(JPEG, caption, meta)``, a function of its arguments only.

    meta: ``{"split", "index", "groups": [{"count", "size", "colour", "shape"}], "relation",
    "objects": [...]}`` (see :func:`render_scene`) and the split's own keys (:func:`sample_scene`).
    """
    scene, extra = sample_scene(split, index, seed, group_size)
    img, objects = render_scene(scene, image_size, random.Random(f"scenes/{seed}/{split}/{index}/render"))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=jpeg_quality)
    meta = {"split": split, "index": index, "groups": [g.__dict__.copy() for g in scene.groups],
            "relation": scene.relation, "objects": objects, **extra}
    return EncodedImage(buf.getvalue(), "jpg"), caption(scene), meta


# ------------------------------------------------------------------------- zero-shot class files

def zeroshot_classnames(task: str) -> List[str]:
    """Class names of a zero-shot task, index = the shards' ``label``."""
    names = {"shape": list(SHAPES), "colour": list(_COLOUR_NAMES), "count": [COUNT_WORDS[c] for c in _ZS_COUNTS]}
    return names[task]


def zeroshot_templates(task: str) -> List[str]:
    """Prompts in the caption grammar with ``{}`` for the class, one per value of the other
    attributes (CLIP's prompt ensembling marginalises them): shape 20, colour 16, count 160."""
    if task == "shape":
        return [f"a {s} {c} {{}}" for s in SIZES for c in _COLOUR_NAMES]
    if task == "colour":
        return [f"a {s} {{}} {sh}" for s in SIZES for sh in SHAPES]
    if task == "count":
        return [f"{{}} {s} {c} {_PLURALS[sh]}" for s in SIZES for c in _COLOUR_NAMES for sh in SHAPES]
    raise ValueError(f"zero-shot task must be one of {ZEROSHOT_TASKS}, got {task!r}")


# ---------------------------------------------------------------------------------- writing shards

@dataclass(frozen=True)
class _ShardJob:
    split: str
    path: str
    start: int
    stop: int
    seed: int
    image_size: int
    jpeg_quality: int
    group_size: int


def _write_job(job: _ShardJob) -> Tuple[str, int, float]:
    t0 = time.process_time()
    samples = (scene_sample(job.split, i, job.seed, job.image_size, job.jpeg_quality, job.group_size)
               for i in range(job.start, job.stop))
    write_shards_to_paths(samples, [job.path])
    return job.path, job.stop - job.start, time.process_time() - t0


def _run_jobs(jobs: List[_ShardJob], workers: int, total: int) -> float:
    """Write every shard job, in ``workers`` processes (one job a task, in any order), logging
    progress by tenths of ``total`` samples; on an error or Ctrl-C the queued jobs are dropped.
    Returns the workers' CPU seconds."""
    cpu_s, done, t0 = 0.0, 0, time.perf_counter()
    if workers <= 1 or len(jobs) == 1:
        results: Iterator = map(_write_job, jobs)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(min(workers, len(jobs)))
        results = pool.imap_unordered(_write_job, jobs)
    finished = False
    try:
        for _path, n, cpu in results:
            cpu_s += cpu
            done += n
            if len(jobs) > 10 and done % max(1, total // 10) < n:
                logger.info("scenes: %d samples written (%.0f/s)", done, done / (time.perf_counter() - t0))
        finished = True
    finally:
        if pool is not None:
            # on an error or Ctrl-C, stop the queued shards instead of waiting for them all
            pool.close() if finished else pool.terminate()
            pool.join()
    return cpu_s


def _write_manifest(out: Path, manifest: Dict[str, Any]) -> None:
    """``out/scenes.json``: ``manifest`` with its URLs relative to ``out`` (the same wherever the
    folder is), keeping the splits an earlier call with the same settings listed."""
    manifest = {**manifest, "splits": {s: {**v, "url": os.path.relpath(v["url"], out)}
                                       for s, v in manifest["splits"].items()}}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scenes.json"
    previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if previous.get("splits") and {**previous, "splits": None} == {**manifest, "splits": None}:
        # the same generator settings: splits written earlier stay listed beside these
        manifest["splits"] = {**previous["splits"], **manifest["splits"]}
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def write_scenes(out_dir: Union[str, Path], num_train: int, num_eval: int = 2000, num_retrieval: int = 5000,
                 *, seed: int = 0, image_size: int = 256, samples_per_shard: int = 1000, jpeg_quality: int = 90,
                 group_size: int = 5, workers: Optional[int] = None, prefix: str = "shard",
                 splits: Sequence[str] = SPLITS) -> Dict[str, Any]:
    """Write the scene splits under ``out_dir/<split>/{prefix}-NNNNNN.tar`` with ``workers``
    processes (default: the cores this process may use), one shard per task, streamed.

    Args:
        num_train: training pairs; num_eval: pairs per zero-shot split; num_retrieval: retrieval
            pairs (rounded down to whole groups of ``group_size``, 2..10).
        samples_per_shard: pairs per tar (the last shard of a split holds the rest).
        splits: which of :data:`SPLITS` to write (the samples do not depend on this).
    Returns ``{"splits": {split: {"url", "samples"}}, "seed", "image_size", "held_out": {...},
    ...}`` plus ``"cpu_s"`` (CPU seconds spent in the workers) and ``"wall_s"``; the same without
    the timings and with URLs relative to ``out_dir`` is written as ``out_dir/scenes.json`` (which
    keeps listing the splits an earlier call with the same settings wrote). Zero-shot folders also
    get ``classnames.txt`` and ``templates.txt``.
    """
    if not 2 <= group_size <= len(_VARY) + 1:
        raise ValueError(f"group_size must be in 2..10 (a base and up to 9 one-attribute variants), "
                         f"got {group_size}")
    if image_size < 64 or samples_per_shard < 1 or jpeg_quality not in range(1, 101):
        raise ValueError(f"need image_size >= 64, samples_per_shard >= 1, jpeg_quality in 1..100; got "
                         f"{image_size}, {samples_per_shard}, {jpeg_quality}")
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; expected some of {SPLITS}")
    out = Path(out_dir)
    counts = {"train": num_train, "retrieval": num_retrieval // group_size * group_size,
              **{s: num_eval for s in ZEROSHOT_SPLITS}}
    jobs: List[_ShardJob] = []
    paths: Dict[str, List[str]] = {}
    for split in splits:
        n = counts[split]
        if n < 1:
            raise ValueError(f"split {split!r} would be empty ({n} samples)")
        paths[split] = []
        for k, start in enumerate(range(0, n, samples_per_shard)):
            path = str(out / split / f"{prefix}-{k:06d}.tar")
            paths[split].append(path)
            jobs.append(_ShardJob(split, path, start, min(n, start + samples_per_shard), seed, image_size,
                                  jpeg_quality, group_size))
    t0 = time.perf_counter()
    cpu_s = _run_jobs(jobs, workers or usable_cores(), sum(counts[s] for s in splits))
    wall_s = time.perf_counter() - t0
    for split in ZEROSHOT_SPLITS:
        if split in splits:
            task, folder = split.split("_")[1], out / split
            (folder / "classnames.txt").write_text("\n".join(zeroshot_classnames(task)) + "\n", encoding="utf-8")
            (folder / "templates.txt").write_text("\n".join(zeroshot_templates(task)) + "\n", encoding="utf-8")
    manifest = {
        "splits": {s: {"url": brace_url(p), "samples": counts[s]} for s, p in paths.items()},
        "seed": seed, "image_size": image_size, "jpeg_quality": jpeg_quality, "group_size": group_size,
        "samples_per_shard": samples_per_shard,
        "held_out": {"colour_shape": sorted(map(list, HELD_OUT_COLOUR_SHAPE)),
                     "count_shape": sorted(map(list, HELD_OUT_COUNT_SHAPE))},
    }
    _write_manifest(out, manifest)
    return {**manifest, "cpu_s": cpu_s, "wall_s": wall_s}
