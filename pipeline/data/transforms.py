"""The loader workers' per-sample work: an image decoded, cropped and resized, its label read.

Training: a random box of ``crop_scale`` of the image's area (seeded by the epoch, the shard's file
name and the sample key, so the same shards in another folder crop the same), drawn on a JPEG's
size at the DCT scale that leaves every possible box at least ``image_size`` wide (PIL's draft
rule: the same box on either decode path), decoded at the coarsest DCT scale that leaves the drawn
box :data:`MIN_DECODED_CROP` of ``image_size`` (PIL's draft mode, one call) and resized by torch's
antialiased bilinear filter to uint8: a quarter of the bytes of float32 through the workers'
queues, normalised by the loader (:mod:`pipeline.data.loader`). With GPU decoding, a JPEG nvJPEG
takes leaves as its box and size instead (:mod:`pipeline.data.jpeg_boxes`), and with
``gpu_decode_scaled`` one whose box fits a coarser DCT scale also taken apart for the DCT-domain
decoder (:mod:`pipeline.data.jpeg_scan`). Eval: the centred
square, bicubic, normalised float32. Images over :data:`MAX_IMAGE_PIXELS` are skipped from their
header, before anything is decoded.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import warnings
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Tuple
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image

from .jpeg_boxes import gpu_decodable, scaled_box
from .jpeg_scan import Scan, ScanError, parse_scan
from .spec import SkipCounter, StreamSpec, stable_seed

__all__ = ["MAX_IMAGE_PIXELS", "MIN_DECODED_CROP", "crop_box", "decode_samples", "draft_factor", "eval_pixels",
           "shard_name"]

#: Images with more pixels are skipped (counted as ``too_many_pixels``) before they are decoded: a
#: small PNG can hold 144 Mpx, 2.8 GB in one loader worker once decoded in full.
MAX_IMAGE_PIXELS = 64 << 20
#: A training crop the workers decode may come out of the JPEG's DCT scaling with its shorter side
#: down to this fraction of ``image_size`` (the resize then enlarges it by at most 1/0.9). With the
#: usual 0.9-1.0 crops, a 512-px JPEG then decodes at half scale: a quarter of the pixels to
#: transform and convert.
MIN_DECODED_CROP = 0.9
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, TypeError, Image.DecompressionBombError)


def shard_name(url: str) -> str:
    """The shard's file name: crops seeded by it do not change when the shards move."""
    return os.path.basename(urlparse(url).path) or url


def _center_crop_resize(img: Image.Image, size: int) -> Image.Image:
    """Largest centred square, resized to ``size`` (= resize shorter side + centre crop)."""
    w, h = img.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    return img.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))


def crop_box(w: int, h: int, scale: Sequence[float], rng: random.Random,
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
    """The training crop as uint8 [3, size, size]: ``box`` (x, y, w, h; :func:`crop_box`) resized
    with torch's antialiased bilinear filter, which has a vectorised uint8 path (about 3x faster
    than PIL's bicubic resize, the largest cost of a worker)."""
    x, y, cw, ch = box
    arr = torch.from_numpy(np.asarray(img, dtype=np.uint8)[y:y + ch, x:x + cw].copy()).permute(2, 0, 1)
    if (ch, cw) == (size, size):
        return arr.contiguous()
    return torch.nn.functional.interpolate(arr[None], size=(size, size), mode="bilinear", antialias=True,
                                           align_corners=False)[0]


def draft_factor(full: Sequence[int], need: int) -> int:
    """The DCT scale (1, 2, 4 or 8) PIL's JPEG ``draft`` picks for a requested (``need``, ``need``):
    the largest that leaves both sides at least ``need``, or 1. The box is drawn on the image's size
    at that scale, whether or not the worker decodes it there."""
    fit = min(full[0] // need, full[1] // need)
    return next(f for f in (8, 4, 2, 1) if fit >= f or f == 1)


def _decode_scale(box: Sequence[int], drawn: int, size: int) -> int:
    """The coarsest DCT scale (a multiple of ``drawn``, at most 8) at which ``box``, drawn at scale
    ``drawn``, keeps its shorter side :data:`MIN_DECODED_CROP` of ``size``."""
    step = 1
    while drawn * step * 2 <= 8 and min(box[2], box[3]) >= MIN_DECODED_CROP * size * step * 2:
        step *= 2
    return drawn * step


def _scan_for_scale(data: bytes, box: Sequence[int], size: int) -> Optional[Tuple[Scan, int]]:
    """(the JPEG taken apart, its DCT scale) when the crop ``box`` (in the full image's pixels) can be
    decoded at half the JPEG's size or less (:func:`_decode_scale`) and the DCT-domain decoder takes
    the file; else None (nvJPEG decodes it)."""
    scale = _decode_scale(box, 1, size)
    if scale == 1:
        return None
    try:
        return parse_scan(data), scale
    except ScanError:
        return None


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


def _cpu_crop(img: Image.Image, box: Sequence[int], drawn: int, full: Sequence[int], size: int) -> torch.Tensor:
    """A training crop decoded in the worker: uint8 [3, size, size]. ``box`` is drawn on the image
    at DCT scale ``drawn``; a JPEG is decoded at its coarsest usable scale (:func:`_decode_scale`,
    one ``draft`` call) and the box moved to that scale's pixels, its edges to the nearest one."""
    if img.format == "JPEG":
        scale = _decode_scale(box, drawn, size)
        if scale > 1:
            img.draft("RGB", (full[0] // scale, full[1] // scale))
    got = max(1, round(full[0] / img.size[0]))  # 1 where PIL declined the draft
    if got != drawn:
        box = scaled_box(box, drawn / got, img.size)
    return _resized_box_uint8(img.convert("RGB"), box, size)


def _open_image(data: bytes) -> Image.Image:
    """PIL's lazy image (header read) without PIL's decompression-bomb warning: the stream's own
    lower limit (:data:`MAX_IMAGE_PIXELS`) skips and counts such images instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def decode_samples(s: StreamSpec, raw: Iterable[Dict[str, Any]], counter: SkipCounter) -> Iterator[Dict[str, Any]]:
    """The samples of ``raw`` (a worker's tar samples that have an image and a caption) with their images
    decoded and cropped for the stream ``s`` (training: uint8 crops, or JPEG boxes left for the GPU;
    eval: normalised float32) and their labels read; undecodable ones counted and skipped."""
    mean = torch.tensor(s.mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(s.std, dtype=torch.float32).view(3, 1, 1)
    # JPEG draft mode decodes at a reduced DCT scale that still leaves every crop at least
    # image_size wide (smallest train crop side: sqrt(scale_lo / max aspect) of the image)
    need = s.image_size if not s.train else math.ceil(s.image_size * math.sqrt(4 / 3 / s.crop_scale[0]))
    for item in raw:
        scan = None
        try:
            with _open_image(item["image"]) as img:
                if img.width * img.height > MAX_IMAGE_PIXELS:  # read from the header: nothing decoded yet
                    counter.add("too_many_pixels", f"{item['url']}:{item['key']}: {img.width}x{img.height}")
                    continue
                full, mode = img.size, img.mode
                if s.train:
                    drawn = draft_factor(full, need) if img.format == "JPEG" else 1
                    on = (-(-full[0] // drawn), -(-full[1] // drawn))  # the size at that scale, as PIL rounds it
                    rng = random.Random(stable_seed("crop", s.seed, s.epoch, shard_name(item["url"]), item["key"]))
                    box = crop_box(*on, s.crop_scale, rng)
                    if s.gpu_decode and gpu_decodable(img, mode) and \
                            stable_seed("decode", shard_name(item["url"]), item["key"]) < s.gpu_share * 2**64:
                        pixels = (*scaled_box(box, drawn, full), *full)  # GPU: box in the full image, size
                        scan = _scan_for_scale(item["image"], pixels[:4], s.image_size) if s.gpu_scaled else None
                    else:  # uint8: a quarter of the bytes through the workers' queues; normalised later
                        pixels = _cpu_crop(img, box, drawn, full, s.image_size)
                else:
                    if img.format == "JPEG":
                        img.draft("RGB", (need, need))
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
        gpu = isinstance(pixels, tuple)
        yield {"pixels": pixels, "caption": item["caption"], "key": item["key"], "label": label,
               "jpeg": item["image"] if gpu else None, "scan": scan if gpu else None, "url": item["url"]}
