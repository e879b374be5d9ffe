"""Training and eval data: webdataset tar shards -> batches of normalised images and token ids.

Design: a torch ``IterableDataset`` whose ``__iter__`` runs the whole per-worker pipeline as
plain generators, with webdataset used only to open URLs (``gopen``: files, ``http``, ``pipe:``)
and to split member names; the tars are read in tarfile's stream mode (:func:`_tar_samples`):

    shard list (brace-expanded; per-epoch shuffle seeded by (seed, epoch); split by rank, then by
    worker; or resampled with replacement) -> tar members -> samples -> structural check (has an
    image member and a non-empty caption) -> shuffle buffer -> [resume skip] -> decode + transform
    -> batch (tokenised in the worker) -> DataLoader (batch_size=None) -> normalise

Training crops leave the workers as uint8 (resized by torch's vectorised bilinear filter) and are
normalised by the loader in the main process, on the training device when it is given one: a
quarter of the bytes through the worker queues and the host-to-device copy, and the float work
off the workers' cores. Eval batches are normalised float32 from the workers (bicubic resize).

Only images (PIL), UTF-8 captions and json are ever decoded; every other member (``.pyd``,
``.pth``, ``.pickle``, ...) stays raw bytes and is dropped, so nothing in a shard is unpickled.
Broken samples (unreadable image, missing/empty caption, tar errors: a shard that cannot be
read, or cut short, counts one ``tar_error`` and keeps its samples before the damage) are
skipped and counted: each batch carries ``num_skipped`` (skips in its worker since that worker's previous batch), and
:class:`ShardLoader` sums them into ``loader.stats`` in the main process, by reason into
``loader.skipped_by_reason``. When a worker's stream runs out it sends one last record (not a
batch) with the skips after its last batch, which the loader counts and drops; so a stream that
gives no batch at all still says why (:meth:`ShardLoader.no_batch_reason`, which
:class:`pipeline.train.loop.Batches` raises with). Not reported: the skips among samples read ahead
(shuffle buffer) when an epoch capped by ``samples_per_epoch`` ends.

Determinism and resume: every random choice is seeded from (seed, epoch, rank, logical worker)
or, for the crop, from (seed, epoch, shard file name, sample key), never from process state or
the shards' location (the same shards in another folder give the same run). The training stream
of a rank is a round-robin over its W logical workers that skips a worker once its data ran out
and goes on with the others (the DataLoader's own order), so an epoch delivers every full batch
every worker can make, also when the workers hold unequal data (shard counts that do not divide,
shards of unequal size, a shard that cannot be read). Without ``resampled``, a rank never runs
more workers than it has shards. A resume needs the loader's :meth:`ShardLoader.position` (the
batches each logical worker delivered this epoch, and the worker the round-robin goes on with;
the run's checkpoint keeps it, :class:`pipeline.train.run_state.RunState`): each logical worker skips
the raw samples of its own delivered batches (no image decode; the skips among them are not
counted again: the run that made those batches reported them), and DataLoader worker d plays
logical worker (d + next_worker) mod W, so the round-robin goes on where it stood; a worker whose
data ran out before that point reads its shards again, finds them spent, and its turn is skipped
as in the uninterrupted stream. Without a position, ``start_batch=k`` assumes the balanced split
(worker r delivered the batches i < k with i mod W = r; next_worker k mod W), which is exact while
every worker had data to that point. Exact when the config (workers, buffer, batch, world size,
seed, shards) is the same; a corrupt image inside the skipped prefix shifts the resumed stream by
one sample (skipping does not decode). With ``samples_per_epoch`` a rank stops after its
``batches_per_epoch`` batches (fewer when all its workers run out before). Ranks may get
different numbers of batches per epoch (:class:`pipeline.train.loop.Batches` ends the epoch for all
when one runs out: a shard count not divisible by the world size is warned about).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import random
import re
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image

from infclip.ops.config import ConfigError, parse_section, require_at_least

from .image_ops import normalize_pixels
from .shards import digits_samples, tar_members, write_shards_to_paths
from .tokenizer import tokenize

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "DataConfig",
    "ShardLoader",
    "build_eval_loader",
    "build_train_loader",
    "check_shards_exist",
    "decode_on_gpu",
    "eval_pixels",
    "expand_urls",
    "measure_loader_throughput",
    "normalize_pixels",
    "prepare_shards",
]

logger = logging.getLogger(__name__)

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_DIGITS_SPLIT_SEED = 0  # fixed, so generated train and val shards never overlap whatever data.seed is
#: Images with more pixels are skipped (counted as ``too_many_pixels``) before they are decoded: a
#: small PNG can hold 144 Mpx, 2.8 GB in one loader worker once decoded in full.
MAX_IMAGE_PIXELS = 64 << 20
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, TypeError, Image.DecompressionBombError)


@dataclasses.dataclass
class DataConfig:
    """The ``data`` section: where the shards are and how they are streamed."""

    train_shards: Optional[Union[str, List[str]]] = None
    """Training shards: a brace URL (``/data/cc3m/{000000..000331}.tar``) or a list of them.
    Local paths are checked up front; remote (``http://``, ``pipe:``) URLs are not. Required."""
    val_shards: Optional[Union[str, List[str]]] = None
    """Held-out shards for eval (json member with ``label`` for zero-shot); optional."""
    tokenizer: Optional[str] = None
    """Local HF tokenizer folder; ``"openclip"``: OpenCLIP's BPE (the one its models were trained
    with, read from the installed open_clip_torch) written to the run directory; null: train a
    byte-level BPE on the training captions and store it in the run directory."""
    vocab_size: int = 4096
    """Upper bound on the trained BPE's vocabulary (ignored with ``tokenizer``)."""
    tokenizer_train_captions: int = 200_000
    """At most this many training captions are read to train the BPE."""
    shuffle_buffer: int = 1000
    """Sample shuffle buffer per worker (0 or 1: no sample shuffling)."""
    shard_shuffle: bool = True
    """Shuffle the shard order every epoch (seeded by seed and epoch) before splitting by rank."""
    resampled: bool = False
    """Draw shards with replacement, endlessly (each rank and worker its own seeded stream);
    needs ``samples_per_epoch``."""
    samples_per_epoch: Optional[int] = None
    """Nominal epoch size (all ranks together); each rank yields samples_per_epoch //
    (micro_batch * world_size) batches, fewer if all its loader workers run out of data
    first (not with resampled). Null: one pass over the shards (not with resampled)."""
    workers: int = 2
    """DataLoader worker processes per rank (0: load in the training process); without
    ``resampled`` at most the rank's shard count (fewer are started)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (with workers > 0)."""
    seed: int = 0
    """Base seed of shard order, shuffle buffer, resampling and random crops."""
    image_key: str = "jpg;png;webp;jpeg"
    """Image member extensions, ``;``-separated, first present wins."""
    caption_key: str = "txt"
    """Caption member extension (UTF-8 text)."""
    crop_scale: List[float] = dataclasses.field(default_factory=lambda: [0.9, 1.0])
    """Training random-resized-crop area range (fraction of the image); [1, 1]: centre crop."""
    image_mean: List[float] = dataclasses.field(default_factory=lambda: list(CLIP_MEAN))
    """Per-channel normalisation mean (CLIP's by default)."""
    image_std: List[float] = dataclasses.field(default_factory=lambda: list(CLIP_STD))
    """Per-channel normalisation std (CLIP's by default)."""
    decode: str = "auto"
    """Where training JPEGs are decoded: ``"cpu"`` (PIL in the loader workers), ``"gpu"`` (nvJPEG
    on the training GPU, the crop and normalisation there too, overlapped with the step; the
    workers only read, parse headers and tokenise: ``pipeline.data.gpu_decode``; needs the ``gpu``
    extra, torchvision) or ``"auto"``: the GPU when training on CUDA and torchvision is there,
    else the CPU. Other image formats are decoded in the workers either way. Eval is on the CPU."""
    gpu_decode_share: float = 1.0
    """With GPU decoding, the share of the JPEGs decoded there (chosen per sample from a hash of its
    shard name and key: the same samples on every run and resume); the workers decode the rest.
    For hosts whose workers have cores to spare (measured on one H200 with 16 cores, ViT-B/32:
    0.7 was no faster than 1)."""
    gpu_decoder: str = "auto"
    """With GPU decoding, how nvJPEG is called: ``"nvjpeg"`` (the library directly: its hardware
    backend where the GPU has JPEG engines, on the decode stage's high-priority stream, into one
    buffer: ``pipeline.data.nvjpeg``), ``"torchvision"`` (``torchvision.io.decode_jpeg``) or
    ``"auto"``: nvjpeg when the library loads, else torchvision."""
    device_cache: bool = False
    """Decode every training sample once into device memory and serve batches from there
    (``pipeline.data.device_cache``): for data sets that fit (at most half the free memory), when the
    loader cannot keep up with a small model. Needs ``crop_scale`` [1, 1]; ignores ``resampled``
    (an epoch is a seeded permutation of the cached set)."""
    generate_digits: bool = False
    """If local train/val shards are missing, write the scikit-learn digits data set (train split
    to ``train_shards``, held-out split with labels to ``val_shards``) at those exact paths."""
    digits_image_size: int = 32
    """Side of the generated digits images (8x8 originals, upscaled)."""

    def __post_init__(self) -> None:
        if not self.train_shards:
            raise ConfigError("'train_shards' is required (a brace URL or a list of them)")
        require_at_least(self, 1, "vocab_size", "tokenizer_train_captions", "prefetch_factor", "digits_image_size")
        if self.vocab_size < 259:
            raise ConfigError(f"'vocab_size' must be >= 259 (256 bytes + 3 special tokens), got {self.vocab_size}")
        require_at_least(self, 0, "workers", "shuffle_buffer")
        require_at_least(self, 1, "samples_per_epoch", optional=True)
        if self.resampled and self.samples_per_epoch is None:
            raise ConfigError("'resampled': true needs 'samples_per_epoch' (a resampled stream never ends)")
        if len(self.crop_scale) != 2 or not 0.0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0:
            raise ConfigError(f"'crop_scale' must be [lo, hi] with 0 < lo <= hi <= 1, got {self.crop_scale}")
        if self.device_cache and list(self.crop_scale) != [1.0, 1.0]:
            raise ConfigError(f"'device_cache' decodes each image once, so it cannot take random crops: set "
                              f"'crop_scale' to [1, 1] (got {list(self.crop_scale)})")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ConfigError("'image_mean' and 'image_std' must hold 3 numbers, std > 0")
        if not self.image_keys():
            raise ConfigError(f"'image_key' names no extension: {self.image_key!r}")
        if not self.caption_key:
            raise ConfigError("'caption_key' must not be empty")
        if not 0.0 <= self.gpu_decode_share <= 1.0:
            raise ConfigError(f"'gpu_decode_share' must be in [0, 1], got {self.gpu_decode_share}")
        if self.decode not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"'decode' must be \"auto\", \"cpu\" or \"gpu\", got {self.decode!r}")
        if self.gpu_decoder not in ("auto", "nvjpeg", "torchvision"):
            raise ConfigError(f"'gpu_decoder' must be \"auto\", \"nvjpeg\" or \"torchvision\", got {self.gpu_decoder!r}")

    def image_keys(self) -> List[str]:
        return [k.strip().lower().lstrip(".") for k in self.image_key.split(";") if k.strip()]

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, Any]], source: Optional[str] = None) -> "DataConfig":
        return parse_section(cls, data, "data", source)


# ----------------------------------------------------------------------------------- shard lists

def expand_urls(urls: Union[str, Sequence[str]]) -> List[str]:
    """Brace-expand one URL or a list of them (``a-{000..002}.tar`` -> 3 URLs), order kept."""
    import braceexpand

    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    out: List[str] = []
    for url in urls:
        out.extend(braceexpand.braceexpand(os.fspath(url)))
    if not out:
        raise ValueError(f"no shard URLs in {urls!r}")
    return out


def _local_path(url: str) -> Optional[str]:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return url
    return None


def check_shards_exist(urls: Sequence[str], what: str = "shard") -> None:
    """Raise ``FileNotFoundError`` naming the local shard files that do not exist.

    Remote URLs (``http://``, ``s3://``, ``pipe:``) are not checked.
    """
    missing = [u for u in urls if (p := _local_path(u)) is not None and not os.path.isfile(p)]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise FileNotFoundError(f"{len(missing)} of {len(urls)} {what} file(s) not found: {shown}")


def resolve_shards(urls: Union[str, Sequence[str]], *, generate_digits_split: Optional[str] = None,
                   digits_image_size: int = 32) -> List[str]:
    """Expand ``urls``; if some local ones are missing and ``generate_digits_split`` is
    ``"train"``/``"test"``, write that digits split to exactly those paths; then check they exist."""
    expanded = expand_urls(urls)
    if generate_digits_split is not None:
        local = [_local_path(u) for u in expanded]
        if any(p is None for p in local):
            raise ConfigError("'generate_digits' needs local shard paths, got a remote URL")
        if not all(os.path.isfile(p) for p in local):
            logger.info("writing digits %s split to %d shard(s): %s", generate_digits_split, len(local), urls)
            write_shards_to_paths(digits_samples(generate_digits_split, seed=_DIGITS_SPLIT_SEED,
                                                 image_size=digits_image_size), local)
    check_shards_exist(expanded)
    return expanded


def prepare_shards(cfg: DataConfig, split: str = "train") -> Optional[List[str]]:
    """The config's expanded, existing shard list for ``split`` (``"train"`` or ``"val"``).

    Generates the digits data set first when ``cfg.generate_digits`` and files are missing.
    Returns None for ``"val"`` when no ``val_shards`` are configured.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    urls = cfg.train_shards if split == "train" else cfg.val_shards
    if not urls:
        return None
    digits_split = ("train" if split == "train" else "test") if cfg.generate_digits else None
    return resolve_shards(urls, generate_digits_split=digits_split, digits_image_size=cfg.digits_image_size)


# ------------------------------------------------------------------------------------ transforms

def _shard_name(url: str) -> str:
    """The shard's file name: crops seeded by it do not change when the shards move."""
    return os.path.basename(urlparse(url).path) or url


def _seed(*parts: Any) -> int:
    """A 64-bit seed from any values, the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _center_crop_resize(img: Image.Image, size: int) -> Image.Image:
    """Largest centred square, resized to ``size`` (= resize shorter side + centre crop)."""
    w, h = img.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    return img.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))


def _crop_box(w: int, h: int, scale: Sequence[float], rng: random.Random,
              ratio: Sequence[float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(left, top, width, height) of a random area fraction in ``scale`` with aspect ratio in
    ``ratio`` (10 tries), else the largest centred square."""
    area = w * h
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    side = min(w, h)
    return (w - side) // 2, (h - side) // 2, side, side


def _resized_box_uint8(img: Image.Image, box: Sequence[int], size: int) -> torch.Tensor:
    """The training crop as uint8 [3, size, size]: ``box`` (x, y, w, h; :func:`_crop_box`) resized
    with torch's antialiased bilinear filter, which has a vectorised uint8 path (about 3x faster
    than PIL's bicubic resize, the largest cost of a worker)."""
    x, y, cw, ch = box
    arr = torch.from_numpy(np.asarray(img, dtype=np.uint8)[y:y + ch, x:x + cw].copy()).permute(2, 0, 1)
    if (ch, cw) == (size, size):
        return arr.contiguous()
    return torch.nn.functional.interpolate(arr[None], size=(size, size), mode="bilinear", antialias=True,
                                           align_corners=False)[0]


def _to_tensor(img: Image.Image, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """PIL RGB (W, H) -> float32 [3, H, W], (x / 255 - mean) / std."""
    arr = np.asarray(img, dtype=np.uint8)
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)
    return t.sub_(mean).div_(std)


def eval_pixels(img: Image.Image, size: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The evaluation preprocessing, shared by the eval loader and image folders: RGB, largest
    centred square resized (bicubic) to ``size``, normalised: float32 [3, size, size]. ``mean``
    and ``std`` are [3, 1, 1] tensors."""
    return _to_tensor(_center_crop_resize(img.convert("RGB"), size), mean, std)


# ------------------------------------------------------------------------------------ the stream

@dataclasses.dataclass
class _StreamSpec:
    urls: List[str]
    tokenizer: Any
    image_size: int
    context_length: int
    batch_size: int
    rank: int
    world_size: int
    epoch: int
    seed: int
    train: bool
    shard_shuffle: bool
    shuffle_buffer: int
    resampled: bool
    batches_per_rank: Optional[int]
    start_batch: int
    num_logical_workers: int
    image_keys: List[str]
    caption_key: str
    with_labels: bool
    crop_scale: List[float]
    mean: List[float]
    std: List[float]
    drop_last: bool
    require_caption: bool = True
    """Skip samples without a caption ("missing_caption"); eval classification sets
    (CLIP_benchmark's: image + ``.cls`` only) set False and get an empty caption."""
    worker_start: Optional[List[int]] = None
    """Resume: batches each logical worker already delivered this epoch (it skips their samples);
    None: the balanced split of ``start_batch`` (see :meth:`ShardLoader.seek`)."""
    first_worker: Optional[int] = None
    """Resume: the logical worker the round-robin goes on with (DataLoader worker 0 plays it);
    None: ``start_batch mod W``."""
    gpu_decode: bool = False
    """Training: JPEGs leave the workers undecoded, with their crop boxes (``pipeline.data.gpu_decode``)."""
    gpu_share: float = 1.0
    """With ``gpu_decode``: the share of JPEGs sent undecoded (by a hash of shard name and key)."""

    def __post_init__(self) -> None:
        w = self.num_logical_workers
        if self.worker_start is None:
            self.worker_start = [_share(self.start_batch, i, w) for i in range(w)]
        if self.first_worker is None:
            self.first_worker = self.start_batch % w


def _stream_spec(urls: Sequence[str], tokenizer: Any, *, image_size: int, context_length: int, batch_size: int,
                 workers: int, image_keys: List[str], caption_key: str, mean: Sequence[float],
                 std: Sequence[float], rank: int = 0, world_size: int = 1, train: bool = False, seed: int = 0,
                 epoch: int = 0, shard_shuffle: bool = False, shuffle_buffer: int = 0, resampled: bool = False,
                 batches_per_rank: Optional[int] = None, start_batch: int = 0,
                 crop_scale: Sequence[float] = (1.0, 1.0), drop_last: bool = False, with_labels: bool = False,
                 require_caption: bool = True) -> _StreamSpec:
    """The spec of one stream, for the training and eval loaders and the device cache. The
    defaults are one ordered pass over ``urls`` (no shard shuffle, buffer or resampling, the
    centre square, the last partial batch kept); ``train`` sends uint8 crops seeded by ``seed``
    and leaves out the eval keys (``caption``, ``key``, ``label``)."""
    return _StreamSpec(
        urls=list(urls), tokenizer=tokenizer, image_size=image_size, context_length=context_length,
        batch_size=batch_size, rank=rank, world_size=world_size, epoch=epoch, seed=seed, train=train,
        shard_shuffle=shard_shuffle, shuffle_buffer=shuffle_buffer, resampled=resampled,
        batches_per_rank=batches_per_rank, start_batch=start_batch, num_logical_workers=max(1, workers),
        image_keys=image_keys, caption_key=caption_key, with_labels=with_labels, crop_scale=list(crop_scale),
        mean=list(mean), std=list(std), drop_last=drop_last, require_caption=require_caption)


_SKIPS = "_skips"  # a worker's record: {reason: count} since its previous record (ShardLoader pops it)
_TAIL = "_end_of_stream"  # marks a worker's last record (not a batch), which ShardLoader drops
_WORKER = "_worker"  # every record: the logical worker that made it (ShardLoader pops it)


def _share(total: int, logical: int, workers: int) -> int:
    """How many of batches 0..total-1, dealt round-robin over ``workers`` workers that all have
    data, belong to logical worker ``logical`` (the balanced split of a resume position)."""
    return max(0, (total - logical + workers - 1) // workers)


class _Counter:
    """Per-worker skip counts by reason; :meth:`take` gives those since its last call.

    A resumed worker re-reads the samples of the batches it already made (``start_batch``); the
    skips among them were reported by the run that made those batches, so :meth:`discard` drops
    them (and ``quiet`` keeps them out of the log)."""

    def __init__(self) -> None:
        self.by_reason: Dict[str, int] = {}
        self._reported: Dict[str, int] = {}
        self._discarded: Dict[str, int] = {}
        self.quiet = False

    def add(self, reason: str, detail: str) -> None:
        n = self.by_reason.get(reason, 0) + 1
        self.by_reason[reason] = n
        if not self.quiet and n - self._discarded.get(reason, 0) <= 5:
            logger.warning("skipping %s: %s", reason, detail)

    def take(self) -> Dict[str, int]:
        """Skips by reason since the last call (reasons with none left out)."""
        out = {r: n - self._reported.get(r, 0) for r, n in sorted(self.by_reason.items())}
        self._reported = dict(self.by_reason)
        return {r: n for r, n in out.items() if n > 0}

    def discard(self) -> None:
        """Forget the skips counted so far: they are never reported."""
        self._discarded = dict(self.by_reason)
        self._reported = dict(self.by_reason)


def _gpu_decodable(img: Image.Image, mode: str) -> bool:
    """Whether the GPU path sends this image to nvJPEG: baseline colour JPEGs of the usual chroma
    subsamplings (4:4:4, 4:2:2, 4:2:0), which its batched decoder takes (on Hopper, the hardware
    engines: ~26k 256-px images/s on an H200). Progressive and greyscale JPEGs go through nvJPEG's
    hybrid decoder, one image at a time on one host thread, no faster than PIL (~0.25 ms for
    256 px, 0.6 ms for 512 px): the loader workers decode those, in parallel, and CMYK, PNG and
    WebP, as on the CPU path."""
    if img.format != "JPEG" or mode != "RGB" or img.info.get("progressive"):
        return False
    from PIL import JpegImagePlugin

    return JpegImagePlugin.get_sampling(img) in (0, 1, 2)


def _full_resolution_box(box: Sequence[int], drafted: Sequence[int], full: Sequence[int]) -> tuple:
    """``box`` drawn on a JPEG's draft size (PIL's DCT scaling by 1, 2, 4 or 8, which the CPU path
    decodes at) in the pixels of the full image, which the GPU decodes: the same region."""
    f = max(1, round(full[0] / drafted[0]))
    x, y, w, h = box
    return x * f, y * f, min(w * f, full[0] - x * f), min(h * f, full[1] - y * f)


def _pixels(items: List[Dict[str, Any]], size: int) -> Dict[str, Any]:
    """A batch's images: ``pixel_values`` stacked; or, where some are JPEGs left for the GPU
    (a tuple (x, y, w, h, W, H) instead of pixels: the box and the image's size), those packed
    (``pipeline.data.gpu_decode.JPEG_KEYS``) and the rest as uint8 rows of ``pixel_values`` at
    ``cpu_dest``."""
    jpeg = [i for i, it in enumerate(items) if it["jpeg"] is not None]
    if not jpeg:
        return {"pixel_values": torch.stack([it["pixels"] for it in items])}
    from .gpu_decode import pack_jpegs

    rest = [i for i, it in enumerate(items) if it["jpeg"] is None]
    data, offsets = pack_jpegs([items[i]["jpeg"] for i in jpeg])
    pixels = torch.stack([items[i]["pixels"] for i in rest]) if rest else \
        torch.zeros(0, 3, size, size, dtype=torch.uint8)
    return {"pixel_values": pixels, "cpu_dest": torch.tensor(rest, dtype=torch.long),
            "jpeg_bytes": data, "jpeg_offsets": offsets,
            "jpeg_boxes": torch.tensor([items[i]["pixels"][:4] for i in jpeg], dtype=torch.long),
            "jpeg_sizes": torch.tensor([items[i]["pixels"][4:] for i in jpeg], dtype=torch.long),
            "jpeg_dest": torch.tensor(jpeg, dtype=torch.long),
            "jpeg_names": [f"{items[i]['url']}:{items[i]['key']}" for i in jpeg]}


def _tar_samples(url: str, on_error: Callable[[str], None]) -> Iterator[Dict[str, Any]]:
    """The samples of one tar shard, in order: dicts of ``{extension: bytes}`` with ``__key__``
    and ``__url__`` (members grouped by the name before the first dot, as webdataset does;
    ``__*__`` metadata members and non-files left out).

    A shard that cannot be read calls ``on_error`` once, naming it, and ends there; the samples
    before the damage are kept and the one it cut short is marked ``__cut__``. Damage includes a
    shard cut short at a header or member boundary, which tarfile's stream mode reads as a quiet
    end (:func:`pipeline.data.shards.tar_members`, which the tokenizer's caption pass reads with too).
    A second member of the same name in a sample is ignored with a warning (once a shard): the
    sample is used, nothing is skipped.
    """
    from webdataset.gopen import gopen
    from webdataset.tariterators import base_plus_ext

    current: Optional[Dict[str, Any]] = None
    duplicates = 0
    try:
        stream = gopen(url, "rb")
    except Exception as exc:  # webdataset's handler takes every Exception too
        on_error(f"{url}: cannot open: {exc!r}")
        return
    done = False
    try:
        for name, data in tar_members(stream, lambda name: bool(name) and not re.match(r"__[^/]*__($|/)", name)):
            prefix, suffix = base_plus_ext(name)
            if prefix is None:
                continue
            if current is None or prefix != current["__key__"]:
                if current is not None:
                    yield current
                current = {"__key__": prefix, "__url__": url}
            suffix = suffix.lower()
            if suffix in current:  # the sample is still used: a warning, not a skip
                if not duplicates:
                    logger.warning("%s: duplicate member %s: the first is used, this and any later "
                                   "duplicate in the shard ignored", url, name)
                duplicates += 1
                continue
            current[suffix] = data
        done = True
        stream.close()  # a pipe (curl, ...) reports its exit status here
    except Exception as exc:
        on_error(f"{url}: {type(exc).__name__}: {str(exc).strip()[:200] or 'unreadable'}")
        if current is not None:
            current["__cut__"] = True
    finally:
        if not done:  # stopped early, or after an error: close without raising a pipe's status
            try:
                stream.close()
            except Exception:
                pass
    if current is not None:
        yield current


def _shuffled(items: Iterable, bufsize: int, rng: random.Random) -> Iterator:
    if bufsize <= 1:
        yield from items
        return
    buf: List = []
    for item in items:
        if len(buf) < bufsize:
            buf.append(item)
            continue
        i = rng.randrange(bufsize)
        yield buf[i]
        buf[i] = item
    rng.shuffle(buf)
    yield from buf


class _ShardStream(torch.utils.data.IterableDataset):
    """Yields ready batches (dicts of tensors); see the module docstring for the pipeline."""

    def __init__(self, spec: _StreamSpec) -> None:
        super().__init__()
        self.spec = spec

    def _shard_urls(self, logical: int) -> Iterator[str]:
        s = self.spec
        if s.resampled:
            rng = random.Random(_seed("resample", s.seed, s.epoch, s.rank, logical))
            while True:
                yield s.urls[rng.randrange(len(s.urls))]
        order = list(s.urls)
        if s.shard_shuffle:
            random.Random(_seed("shards", s.seed, s.epoch)).shuffle(order)
        yield from order[s.rank::s.world_size][logical::s.num_logical_workers]

    def _raw_samples(self, logical: int, counter: _Counter) -> Iterator[Dict[str, Any]]:
        """Tar samples that have an image member and a non-empty UTF-8 caption (not decoded)."""
        s = self.spec
        since_valid = 0
        for url in self._shard_urls(logical):
            since_valid += 1
            if s.resampled and since_valid > 2 * len(s.urls) + 10:
                raise RuntimeError(f"no valid sample in the last {since_valid} shards drawn "
                                   f"from {s.urls[0]} ...: are the image_key/caption_key right?")
            for sample in _tar_samples(url, lambda detail: counter.add("tar_error", detail[:300])):
                where = f"{sample.get('__url__')}:{sample.get('__key__')}"
                image_ext = next((k for k in s.image_keys if k in sample), None)
                caption_bytes = sample.get(s.caption_key)
                try:
                    caption = caption_bytes.decode("utf-8").strip() if caption_bytes is not None else ""
                except UnicodeDecodeError:
                    caption = ""
                if image_ext is None or (not caption and s.require_caption):
                    if not sample.get("__cut__"):  # a sample cut short by a shard's damage: its tar_error counts it
                        counter.add("missing_image" if image_ext is None else "missing_caption", where)
                    continue
                since_valid = 0
                yield {"url": sample["__url__"], "key": sample["__key__"], "image": sample[image_ext],
                       "caption": caption, "json": sample.get("json"), "cls": sample.get("cls")}

    def _decoded(self, raw: Iterable[Dict[str, Any]], counter: _Counter) -> Iterator[Dict[str, Any]]:
        s = self.spec
        mean = torch.tensor(s.mean, dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(s.std, dtype=torch.float32).view(3, 1, 1)
        # JPEG draft mode decodes at a reduced DCT scale that still leaves every crop at least
        # image_size wide (smallest train crop side: sqrt(scale_lo / max aspect) of the image)
        need = s.image_size if not s.train else math.ceil(s.image_size * math.sqrt(4 / 3 / s.crop_scale[0]))
        for item in raw:
            try:
                with Image.open(io.BytesIO(item["image"])) as img:
                    if img.width * img.height > MAX_IMAGE_PIXELS:  # read from the header: nothing decoded yet
                        counter.add("too_many_pixels", f"{item['url']}:{item['key']}: {img.width}x{img.height}")
                        continue
                    full, mode = img.size, img.mode
                    if img.format == "JPEG":
                        img.draft("RGB", (need, need))
                    if s.train:
                        rng = random.Random(_seed("crop", s.seed, s.epoch, _shard_name(item["url"]), item["key"]))
                        box = _crop_box(*img.size, s.crop_scale, rng)
                        if s.gpu_decode and _gpu_decodable(img, mode) and \
                                _seed("decode", _shard_name(item["url"]), item["key"]) < s.gpu_share * 2**64:
                            pixels = (*_full_resolution_box(box, img.size, full), *full)  # GPU: box, size
                        else:  # uint8: a quarter of the bytes through the workers' queues; normalised later
                            pixels = _resized_box_uint8(img.convert("RGB"), box, s.image_size)
                    else:
                        pixels = eval_pixels(img, s.image_size, mean, std)
            except _DECODE_ERRORS as exc:
                counter.add("bad_image", f"{item['url']}:{item['key']}: {exc!r}"[:300])
                continue
            label = -1
            if s.with_labels and item["json"] is not None:
                try:
                    meta = json.loads(item["json"].decode("utf-8"))
                    label = int(meta.get("label", -1)) if isinstance(meta, dict) else -1
                except (ValueError, TypeError, UnicodeDecodeError):
                    counter.add("bad_json", f"{item['url']}:{item['key']}")
            if s.with_labels and label < 0 and item.get("cls") is not None:
                try:  # CLIP_benchmark's layout: the class index as text in a ``.cls`` member
                    label = int(item["cls"].decode("utf-8").strip())
                except (ValueError, UnicodeDecodeError):
                    counter.add("bad_cls", f"{item['url']}:{item['key']}")
            yield {"pixels": pixels, "caption": item["caption"], "key": item["key"], "label": label,
                   "jpeg": item["image"] if isinstance(pixels, tuple) else None, "url": item["url"]}

    def _batch(self, items: List[Dict[str, Any]], counter: _Counter, t_start: float) -> Dict[str, Any]:
        """The batch of ``items``; ``worker_s`` is the time since ``t_start``, when this worker
        began making it."""
        s = self.spec
        skips = counter.take()
        captions = [it["caption"] for it in items]
        input_ids, attention_mask = tokenize(s.tokenizer, captions, s.context_length)
        batch: Dict[str, Any] = {
            **_pixels(items, s.image_size),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "num_skipped": torch.tensor(sum(skips.values()), dtype=torch.long),
            _SKIPS: skips,
            "worker_s": torch.tensor(time.perf_counter() - t_start, dtype=torch.float64),
        }
        if not s.train:
            batch["caption"] = captions
            batch["key"] = [it["key"] for it in items]
            if s.with_labels:
                batch["label"] = torch.tensor([it["label"] for it in items], dtype=torch.long)
        return batch

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        s = self.spec
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None and info.num_workers != s.num_logical_workers:
            raise RuntimeError(f"stream built for {s.num_logical_workers} workers, run with {info.num_workers}")
        # DataLoader worker `worker` plays logical worker (worker + first_worker) % W: the resumed
        # round-robin then goes on where the uninterrupted one was (see module docstring).
        logical = (worker + s.first_worker) % s.num_logical_workers
        skip_batches = s.worker_start[logical]
        # with samples_per_epoch no worker can deliver more than the batches left to the rank (the
        # loader stops there; a worker may make a few ahead that are never read)
        quota = None if s.batches_per_rank is None else skip_batches + s.batches_per_rank - s.start_batch
        if quota is not None and skip_batches >= quota:
            return
        counter = _Counter()
        raw: Iterator = self._raw_samples(logical, counter)
        if s.train:
            raw = _shuffled(raw, s.shuffle_buffer, random.Random(_seed("buffer", s.seed, s.epoch, s.rank, logical)))
        to_skip = skip_batches * s.batch_size
        counter.quiet = True
        while to_skip > 0 and next(raw, None) is not None:
            to_skip -= 1
        counter.quiet = False
        counter.discard()  # the replayed prefix's skips were reported before the interruption
        made = skip_batches
        pending: List[Dict[str, Any]] = []
        # worker_s: this worker's time making the batch (reading, decoding, transforms,
        # tokenising), not the time it sat in the queue: batch size / worker_s is its images/s
        t0 = time.perf_counter()
        for item in self._decoded(raw, counter):
            pending.append(item)
            if len(pending) == s.batch_size:
                yield {**self._batch(pending, counter, t0), _WORKER: logical}
                t0 = time.perf_counter()
                pending = []
                made += 1
                if quota is not None and made >= quota:
                    return
        if pending and not s.drop_last:
            yield {**self._batch(pending, counter, t0), _WORKER: logical}
            pending = []
        # the stream ran out: a last record, not a batch, with the skips since the last batch (the
        # ShardLoader counts and drops it). Not after the quota: the rank's loader stops at its
        # last batch (samples_per_epoch) and reads no worker's record after it.
        yield {_TAIL: True, _SKIPS: counter.take(), "unbatched": len(pending), _WORKER: logical}


class ShardLoader:
    """Iterable over batches (a DataLoader over :class:`_ShardStream`) that sums skip counts.

    Each batch is a dict: ``pixel_values`` [B, 3, H, W] normalised (float32 on the CPU, or, for a
    training loader given a device, the model's dtype on that device: the workers send uint8
    crops, copied and normalised there), ``input_ids`` and
    ``attention_mask`` int64 [B, L], ``num_skipped`` int64 [] (skips since the worker's previous
    batch), ``worker_s`` float64 [] (the worker's seconds making it); eval loaders add ``caption`` (list of B str), ``key`` (list of B str) and, with
    labels, ``label`` int64 [B] (-1 where the sample's json has none).

    ``stats``: ``{"batches", "samples", "skipped", "worker_s"}`` accumulated over iteration in this
    process (``worker_s``: the workers' time spent making those batches); ``skipped`` includes the
    skips after a worker's last batch, counted when its stream ends. ``skipped_by_reason``: the
    same skips by reason (``missing_image``, ``missing_caption``, ``tar_error``, ``bad_image``,
    ...); ``unbatched``: usable samples left over when a worker's stream ended (less than a batch,
    dropped); ``by_worker``: the same per logical worker. :meth:`no_batch_reason` puts them in words.
    ``batches_per_epoch``: batches this rank yields per epoch when known (``samples_per_epoch``
    set; fewer when its workers run out of data first), else None: the loader stops there.
    Iterating again replays the same stream.

    The batches are a round-robin over the ``num_workers`` logical workers that skips a worker
    once its data ran out (the DataLoader's own order), so every full batch of every worker is
    read. :meth:`position` is where the stream stands (batches each logical worker delivered,
    and the worker the round-robin goes on with), which :meth:`seek` on a new loader of the same
    (epoch, rank) resumes from exactly.
    """

    def __init__(self, dataloader: torch.utils.data.DataLoader, spec: _StreamSpec, *,
                 batches_per_epoch: Optional[int], normalize: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 stage: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> None:
        self.dataloader, self._spec = dataloader, spec
        self.normalize = normalize
        self.stage = stage
        """The GPU decode stage (:class:`pipeline.data.gpu_decode.DecodeStage`), run a batch or two
        ahead by a background thread; None: batches as the workers send them."""
        self.batches_per_epoch = batches_per_epoch
        self.epoch, self.start_batch, self.batch_size = spec.epoch, spec.start_batch, spec.batch_size
        self.image_keys, self.caption_key = list(spec.image_keys), spec.caption_key
        self.num_workers, self.rank = spec.num_logical_workers, spec.rank
        self.stats = {"batches": 0, "samples": 0, "skipped": 0, "worker_s": 0.0}
        self.skipped_by_reason: Dict[str, int] = {}
        self.unbatched = 0
        self.by_worker: List[Dict[str, Any]] = [{"batches": 0, "skipped": {}, "unbatched": 0}
                                                for _ in range(self.num_workers)]
        self._worker_batches = list(spec.worker_start)
        self._next_worker = int(spec.first_worker)

    def position(self) -> Dict[str, Any]:
        """Where this epoch's stream stands after the batches yielded so far: ``worker_batches``
        (per logical worker, batches it delivered this epoch, those before ``start_batch``
        included) and ``next_worker`` (the logical worker the round-robin goes on with). Plain
        values, for the run's checkpoint."""
        return {"worker_batches": list(self._worker_batches), "next_worker": self._next_worker}

    def seek(self, position: Dict[str, Any]) -> None:
        """Resume at ``position`` (a :meth:`position` of a loader of the same epoch, rank and data
        setup, whose batch count is this loader's ``start_batch``): each logical worker skips the
        samples of its own delivered batches and the round-robin starts at ``next_worker``. A
        worker whose data ran out before that point finds out by reading its shards again (its
        place in the round-robin is then skipped, as in the uninterrupted stream). Call before
        iterating. Without a seek a loader assumes the balanced split of ``start_batch`` (what
        every worker having data to that point gives)."""
        try:
            counts = [int(c) for c in position["worker_batches"]]
            nxt = int(position["next_worker"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a loader position: {position!r} ({exc!r})") from None
        w = self.num_workers
        misfit = None
        if len(counts) != w or min(counts, default=0) < 0 or sum(counts) != self.start_batch:
            misfit = (f"its worker_batches must be {w} count(s), none negative, summing to start_batch "
                      f"{self.start_batch}")
        elif not 0 <= nxt < w:
            misfit = f"its next_worker must be a worker of the {w}"
        if misfit:
            raise ValueError(f"loader position {position!r} does not fit this stream: {misfit}")
        self._spec.worker_start, self._spec.first_worker = counts, nxt
        self._worker_batches, self._next_worker = list(counts), nxt

    def no_batch_reason(self) -> str:
        """Why the stream gave no batch, in words: the skip counts by reason (with what to check)
        or the usable samples that were too few for a batch, and with several workers each
        worker's counts. Complete once the stream ended."""
        skipped = sum(self.skipped_by_reason.values())
        counts = ", ".join(f"{r}={n}" for r, n in sorted(self.skipped_by_reason.items()))
        if skipped == 0 and self.unbatched == 0:
            head = "no sample was read (are the shards empty?)"
        elif self.unbatched:
            head = (f"{self.unbatched} usable sample(s), fewer than one micro-batch of {self.batch_size} "
                    f"(with the world size and loader workers each rank's worker needs a full micro-batch)")
            if skipped:
                head += f"; skipped: {counts}"
        elif set(self.skipped_by_reason) == {"tar_error"}:
            head = f"no sample could be read: {counts}"
        else:
            head = f"all {skipped} samples skipped: {counts}"
        hints = {
            "missing_image": f"check data.image_key ({';'.join(self.image_keys) or '?'}): no member of those samples "
                             "has one of its extensions",
            "missing_caption": f"check data.caption_key ({self.caption_key!r}): those samples have no non-empty "
                               "caption member of that extension",
            "tar_error": "shards that cannot be read (not tar files, cut short, unreachable URLs): see the "
                         "'skipping tar_error' warnings",
            "bad_image": "images that cannot be decoded: see the 'skipping bad_image' warnings",
        }
        found = [hints[r] for r in sorted(self.skipped_by_reason) if r in hints]
        text = head + ("; " + "; ".join(found) if found else "")
        if self.num_workers > 1:
            text += " (by loader worker: " + "; ".join(
                f"{w}: {self._worker_words(w)}" for w in range(self.num_workers)) + ")"
        return text

    def _worker_words(self, w: int) -> str:
        mine = self.by_worker[w]
        parts = [f"{mine['batches']} batch(es)"] if mine["batches"] else []
        parts += [f"{r}={n}" for r, n in sorted(mine["skipped"].items())]
        if mine["unbatched"]:
            parts.append(f"{mine['unbatched']} usable sample(s) left over")
        return ", ".join(parts) or "no sample"

    def _account(self, record: Dict[str, Any]) -> bool:
        """Count a worker's record's skips; True for the record that ends a worker's stream."""
        mine = self.by_worker[int(record.pop(_WORKER, 0))]
        skips = record.pop(_SKIPS, None) or {}
        for reason, n in skips.items():
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + int(n)
            mine["skipped"][reason] = mine["skipped"].get(reason, 0) + int(n)
        self.stats["skipped"] += sum(int(n) for n in skips.values())
        if _TAIL in record:
            self.unbatched += int(record["unbatched"])
            mine["unbatched"] += int(record["unbatched"])
            return True
        return False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        spec = self._spec
        self._worker_batches, self._next_worker = list(spec.worker_start), int(spec.first_worker)
        left = None if self.batches_per_epoch is None else self.batches_per_epoch - self.start_batch
        if left is not None and left <= 0:
            return
        records: Iterator[Dict[str, Any]] = iter(self.dataloader)  # here: it draws from the global RNG
        if self.stage is not None:
            from .gpu_decode import prefetched

            records = prefetched(records, self.stage, lambda r: _TAIL not in r)
        try:
            yield from self._batches(records, left)
        finally:
            close = getattr(records, "close", None)
            if callable(close):
                close()

    def _batches(self, records: Iterator[Dict[str, Any]], left: Optional[int]) -> Iterator[Dict[str, Any]]:
        for batch in records:
            worker = int(batch.get(_WORKER, 0))
            if self._account(batch):  # a worker's stream ended: its last skips, not a batch
                continue
            self._worker_batches[worker] += 1
            self._next_worker = (worker + 1) % self.num_workers
            self.by_worker[worker]["batches"] += 1
            self.stats["batches"] += 1
            self.stats["samples"] += int(batch["pixel_values"].shape[0])
            self.stats["worker_s"] += float(batch["worker_s"])
            if self.normalize is not None:
                batch["pixel_values"] = self.normalize(batch["pixel_values"])
            ready = batch.pop("ready", None)
            if ready is not None:  # made on the stage's side stream: the step's stream waits for it
                stream = torch.cuda.current_stream(batch["pixel_values"].device)
                stream.wait_event(ready)
                for key in ("pixel_values", "input_ids", "attention_mask"):
                    batch[key].record_stream(stream)
            yield batch
            if left is not None:
                left -= 1
                if left <= 0:  # samples_per_epoch: this rank's share of the epoch is done
                    return


def _ignore_stop_signals(worker_id: int) -> None:
    """In each loader worker: SIGTERM, SIGINT and SIGUSR1 ignored. torch's worker handler ends a
    worker on a SIGTERM from anyone but its parent, so a signal sent to the whole process group
    (SLURM, a Ctrl-C in the terminal) would kill the workers under a run that is stopping with a
    checkpoint (``train.save_on_signal``); the run ends its workers itself, and a worker whose
    parent is gone exits on its own (torch's watchdog)."""
    import signal

    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def _make_loader(spec: _StreamSpec, workers: int, prefetch_factor: int,
                 normalize: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 stage: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> ShardLoader:
    kwargs: Dict[str, Any] = {}
    if workers > 0:
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=False, worker_init_fn=_ignore_stop_signals)
    dl = torch.utils.data.DataLoader(_ShardStream(spec), batch_size=None, num_workers=workers,
                                     pin_memory=torch.cuda.is_available(), **kwargs)
    return ShardLoader(dl, spec, batches_per_epoch=spec.batches_per_rank, normalize=normalize, stage=stage)


_WARNED: set = set()


def _warn_once(key: Any, msg: str, *args: Any) -> None:
    """``logger.warning(msg, *args)`` the first time ``key`` is seen in this process (a loader is
    built every epoch)."""
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(msg, *args)


def decode_on_gpu(cfg: DataConfig, device: Optional[torch.device]) -> bool:
    """Whether training JPEGs are decoded on ``device`` (``data.decode``); "gpu" where it cannot
    be done raises :class:`ConfigError` saying why. A CPU ``device`` with "gpu" decodes with
    the GPU path's stage on the CPU (PIL), as the tests do."""
    if cfg.decode == "cpu" or device is None:
        if cfg.decode == "gpu":
            raise ConfigError("'decode': \"gpu\" needs a training device (none was given)")
        return False
    if torch.device(device).type != "cuda":
        return cfg.decode == "gpu"
    from .gpu_decode import cuda_decode_available

    why = cuda_decode_available()
    if why is not None and cfg.decode == "gpu":
        raise ConfigError(f"'decode': \"gpu\" cannot decode on this machine: {why}")
    if why is not None:
        _warn_once(("decode_cpu", why), "data.decode auto: decoding on the CPU workers (%s)", why)
    return why is None


def build_train_loader(cfg: DataConfig, tokenizer, *, image_size: int, context_length: int, batch_size: int,
                       rank: int = 0, world_size: int = 1, epoch: int = 0, seed: Optional[int] = None,
                       start_batch: int = 0, shards: Optional[Sequence[str]] = None,
                       device: Optional[torch.device] = None, dtype: torch.dtype = torch.float32,
                       position: Optional[Dict[str, Any]] = None) -> ShardLoader:
    """The training stream of one rank for one epoch, as an iterable of batches.

    Args:
        cfg: the ``data`` section.
        tokenizer: from :func:`pipeline.data.tokenizer.ensure_tokenizer` (used in the workers).
        image_size: the vision tower's input side; context_length: the text tower's length.
        batch_size: micro batch per rank (DeepSpeed's ``train_micro_batch_size_per_gpu``);
            partial batches are dropped.
        rank, world_size: data-parallel position (shards split by rank, then by worker; a shard
            count not divisible by ``world_size`` is warned about once on rank 0: the ranks
            with one shard more leave its samples unread each epoch, see :class:`pipeline.train.loop.Batches`).
        epoch: selects the shard order, buffer and crop seeds (a new loader per epoch).
        seed: overrides ``cfg.seed`` when given.
        start_batch: resume: skip this many batches of this (epoch, rank) stream (exact under
            the conditions in the module docstring). The stream is a round-robin over the
            workers that skips a worker once its data ran out.
        shards: already-resolved URLs (default: :func:`prepare_shards` ``(cfg, "train")``).
        device, dtype: where the batches' pixels are normalised and land (default: float32 on
            the CPU); the workers send uint8 crops, so on a GPU the copy is a quarter of the bytes
            and the normalisation runs there.
        position: with ``start_batch``, where the interrupted stream stood
            (:meth:`ShardLoader.position`, which the run's checkpoint keeps): exact also when the
            workers hold unequal data. None: the balanced split of ``start_batch``.
    Returns:
        :class:`ShardLoader` yielding ``pixel_values`` [B, 3, image_size, image_size],
        ``input_ids`` / ``attention_mask`` [B, context_length], ``num_skipped`` [].
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if batch_size < 1 or start_batch < 0 or epoch < 0:
        raise ValueError(f"need batch_size >= 1, start_batch >= 0, epoch >= 0; got {batch_size}, {start_batch}, {epoch}")
    urls = list(shards) if shards is not None else prepare_shards(cfg, "train")
    check_shards_exist(urls)
    batches_per_rank = None
    if cfg.samples_per_epoch is not None:
        batches_per_rank = cfg.samples_per_epoch // (batch_size * world_size)
        if batches_per_rank < 1:
            raise ConfigError(f"'samples_per_epoch' {cfg.samples_per_epoch} is less than one global batch "
                              f"({batch_size} x {world_size} ranks)")
    workers = cfg.workers
    if not cfg.resampled:
        if len(urls) < world_size:
            raise ConfigError(f"{len(urls)} training shard(s) cannot be split over {world_size} ranks; "
                              "write more (smaller) shards or set 'resampled': true")
        if len(urls) % world_size and rank == 0:
            _warn_once(("uneven_ranks", len(urls), world_size),
                       "%d training shards do not divide over %d ranks: %d rank(s) read %d shard(s) per epoch, "
                       "the others %d; every epoch ends for all ranks when the shortest rank's stream runs out, "
                       "so the ranks with more shards leave the rest of theirs unread (about %d shard(s) of data "
                       "per epoch). Use a shard count divisible by %d, or 'resampled': true with "
                       "'samples_per_epoch'", len(urls), world_size, len(urls) % world_size,
                       -(-len(urls) // world_size), len(urls) // world_size, len(urls) % world_size, world_size)
        per_rank = len(urls[rank::world_size])
        if workers > per_rank:  # a worker without a shard would only be started to end at once
            _warn_once(("workers_capped", rank, per_rank, workers),
                       "rank %d has %d training shard(s) for %d loader workers: loading with %d worker(s)",
                       rank, per_rank, workers, per_rank)
            workers = per_rank
    spec = _stream_spec(
        urls, tokenizer, image_size=image_size, context_length=context_length, batch_size=batch_size,
        workers=workers, image_keys=cfg.image_keys(), caption_key=cfg.caption_key, mean=cfg.image_mean,
        std=cfg.image_std, rank=rank, world_size=world_size, train=True, seed=cfg.seed if seed is None else seed,
        epoch=epoch, shard_shuffle=cfg.shard_shuffle, shuffle_buffer=cfg.shuffle_buffer, resampled=cfg.resampled,
        batches_per_rank=batches_per_rank, start_batch=start_batch, crop_scale=cfg.crop_scale, drop_last=True)
    spec.gpu_decode, spec.gpu_share = decode_on_gpu(cfg, device), cfg.gpu_decode_share

    def normalize(pixels: torch.Tensor) -> torch.Tensor:
        if device is not None:
            pixels = pixels.to(device, non_blocking=True)
        return normalize_pixels(pixels, cfg.image_mean, cfg.image_std, dtype)

    stage = None
    if spec.gpu_decode:
        from .gpu_decode import DecodeStage

        stage = DecodeStage(device, dtype, cfg.image_mean, cfg.image_std, decoder=cfg.gpu_decoder)
    loader = _make_loader(spec, workers, cfg.prefetch_factor, None if stage else normalize, stage)
    if position is not None:
        loader.seek(position)
    return loader


def build_eval_loader(shards: Union[str, Sequence[str]], tokenizer, *, image_size: int, context_length: int,
                      batch_size: int, workers: int = 0, with_labels: bool = True,
                      image_key: str = "jpg;png;webp;jpeg", caption_key: str = "txt",
                      image_mean: Sequence[float] = CLIP_MEAN, image_std: Sequence[float] = CLIP_STD,
                      rank: int = 0, world_size: int = 1, require_caption: bool = True) -> ShardLoader:
    """A deterministic pass over ``shards`` (no shuffling; resize + centre crop), last batch kept.

    ``shards`` is a brace URL or list (checked to exist). With ``world_size > 1`` shards are
    split by rank. Batches add ``caption`` and ``key`` (lists of str; a caption keeps its inner
    newlines: CLIP_benchmark's retrieval sets put one caption per line) and, with
    ``with_labels``, ``label`` int64 [B] read from the json member's ``"label"`` or else a
    ``.cls`` member (the class index as text, CLIP_benchmark's layout); -1 when neither.
    ``require_caption`` skips samples without a caption (counted as ``missing_caption``); the
    zero-shot evaluator sets it False, keeping them with an empty caption. With ``workers > 1`` batches from
    different shards interleave, in a fixed order.
    """
    urls = expand_urls(shards)
    check_shards_exist(urls)
    keys = [k.strip().lower().lstrip(".") for k in image_key.split(";") if k.strip()]
    spec = _stream_spec(
        urls, tokenizer, image_size=image_size, context_length=context_length, batch_size=batch_size,
        workers=workers, image_keys=keys, caption_key=caption_key, mean=image_mean, std=image_std, rank=rank,
        world_size=world_size, with_labels=with_labels, require_caption=require_caption)
    return _make_loader(spec, workers, 2)


def measure_loader_throughput(loader: Iterable[Dict[str, Any]], num_batches: int, warmup: int = 1) -> float:
    """Images per second the loader delivers, timed over ``num_batches`` after ``warmup`` batches.

    The warm-up batches absorb worker start-up. Stops early if the loader runs out (then the
    rate is over the batches seen); raises if no batch was timed.
    """
    it = iter(loader)
    for _ in range(warmup):
        if next(it, None) is None:
            raise ValueError("loader ran out during warm-up")
    images, timed = 0, 0
    start = time.perf_counter()
    for batch in it:
        images += int(batch["pixel_values"].shape[0])
        timed += 1
        if timed >= num_batches:
            break
    elapsed = time.perf_counter() - start
    if timed == 0:
        raise ValueError("loader gave no batch after warm-up")
    return images / max(elapsed, 1e-9)
