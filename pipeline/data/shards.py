"""Webdataset tar shards in the img2dataset layout, written and read, and the built-in digits data set.

Design: a shard is a plain POSIX tar whose members are ``NNNNNNNNN.jpg`` (or ``.png`` /
``.webp``), ``NNNNNNNNN.txt`` (the caption, UTF-8) and optionally ``NNNNNNNNN.json`` (metadata),
members of one sample adjacent, which is what img2dataset writes and what webdataset reads. The
writer uses the standard library's ``tarfile`` with fixed mtime/uid/gid so that the same samples
give byte-identical shards, and each shard is written under a temporary name and renamed into
place, so that a reader (or a second rank generating the same data) never sees a half-written
shard. Limit: local paths only (no ``s3://`` / ``pipe:`` targets).

The digits data set (scikit-learn's bundled 8x8 ``load_digits``, 1797 images, no download) is
upscaled to RGB and captioned from templates over the digit names, so that a CPU run can train a
real CLIP on real image-text pairs and be evaluated zero-shot on the held-out split (the json
member holds ``{"label": int, "classname": str}``).

Copying: :func:`resize_shards` rewrites existing shards under their own names with each image
resized for training (img2dataset's ``keep_ratio``), the other members kept as they are, a process
a shard.

Reading a shard's members: :mod:`pipeline.data.tar_read`.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import random
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from .tar_read import tar_members

__all__ = [
    "DIGITS_CLASSNAMES",
    "DIGITS_CAPTION_TEMPLATES",
    "DIGITS_ZEROSHOT_TEMPLATES",
    "EncodedImage",
    "IMAGE_EXTENSIONS",
    "brace_url",
    "digits_samples",
    "folder_samples",
    "resize_shards",
    "resized_jpeg",
    "shards_written",
    "usable_cores",
    "write_digits_shards",
    "write_digits_test_shards",
    "write_shards",
    "write_shards_to_paths",
]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
"""Image member extensions the writer and the loader know."""

DIGITS_CLASSNAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
"""Class names of the digits data set, index = label."""

DIGITS_CAPTION_TEMPLATES = [
    "a photo of the number {name}",
    "a handwritten {digit}",
    "the digit {name} written by hand",
    "a blurry picture of the digit {name}",
    "a small grey image of a {name}",
    "the number {digit}",
    "a pixelated drawing of the numeral {name}",
    "a scan of a handwritten {name}",
    "an image showing the digit {digit}",
    "{name}",
]
"""Training caption templates: ``{name}`` is the class name ("seven"), ``{digit}`` the numeral."""

DIGITS_ZEROSHOT_TEMPLATES = [
    "a photo of the number {}",
    "the digit {} written by hand",
    "a handwritten {}",
]
"""Zero-shot prompt templates for the digits classes; ``{}`` takes the class name."""

_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


@dataclass(frozen=True)
class EncodedImage:
    """Already-encoded image bytes and their extension (written as-is, never re-encoded)."""

    data: bytes
    ext: str


ImageLike = Union[Image.Image, bytes, EncodedImage]
Sample = Tuple[ImageLike, str, Optional[Mapping[str, Any]]]


def _encode_image(image: ImageLike, image_format: str) -> Tuple[bytes, str]:
    if isinstance(image, EncodedImage):
        ext = image.ext.lower().lstrip(".")
        if ext not in IMAGE_EXTENSIONS:
            raise ValueError(f"unsupported image extension {image.ext!r}; expected one of {IMAGE_EXTENSIONS}")
        return image.data, ext
    if isinstance(image, (bytes, bytearray)):
        return bytes(image), image_format
    if isinstance(image, Image.Image):
        buf = io.BytesIO()
        img = image.convert("RGB") if image_format in ("jpg", "jpeg") and image.mode != "RGB" else image
        kwargs = {"quality": 95} if image_format in ("jpg", "jpeg", "webp") else {}
        img.save(buf, format=_PIL_FORMATS[image_format], **kwargs)
        return buf.getvalue(), image_format
    raise TypeError(f"image must be a PIL.Image, bytes or EncodedImage, got {type(image).__name__}")


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _write_members_atomic(path: Path, members: Iterable[Tuple[str, bytes]], tar_format: int = tarfile.USTAR_FORMAT
                          ) -> None:
    """Write one shard of ``(name, bytes)`` members under a temporary name, renamed into place
    once whole (an error or a kill leaves no shard under ``path``); gzipped when its name says so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    mode = "w:gz" if path.name.endswith((".gz", ".tgz")) else "w"
    try:
        with tarfile.open(tmp, mode, format=tar_format) as tar:
            for name, data in members:
                _add_member(tar, name, data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_tar_atomic(path: Path, samples: Sequence[Tuple[str, bytes, str, str, Optional[Mapping]]]) -> None:
    """Write one shard; ``samples`` holds (key, image bytes, image ext, caption, meta)."""
    def members() -> Iterator[Tuple[str, bytes]]:
        for key, img, ext, caption, meta in samples:
            yield f"{key}.{ext}", img
            yield f"{key}.txt", caption.encode("utf-8")
            if meta is not None:
                yield f"{key}.json", json.dumps(dict(meta), sort_keys=True).encode("utf-8")

    _write_members_atomic(path, members())


def _prepare(samples: Iterable[Sample], image_format: str, start_key: int
             ) -> Iterator[Tuple[str, bytes, str, str, Optional[Mapping]]]:
    for i, item in enumerate(samples):
        if len(item) != 3:
            raise ValueError(f"sample {i}: expected (image, caption, meta), got {len(item)} items")
        image, caption, meta = item
        if not isinstance(caption, str):
            raise TypeError(f"sample {i}: caption must be str, got {type(caption).__name__}")
        data, ext = _encode_image(image, image_format)
        yield f"{start_key + i:09d}", data, ext, caption, meta


def brace_url(paths: Sequence[Union[str, Path]]) -> str:
    """A brace URL (``dir/shard-{000000..000007}.tar``) naming exactly ``paths``.

    ``paths`` must be consecutive numbered files as :func:`write_shards` makes them; a single
    path is returned as is.
    """
    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("brace_url: no paths")
    if len(paths) == 1:
        return paths[0]
    first, last = Path(paths[0]), Path(paths[-1])
    stem_a, num_a = first.stem.rsplit("-", 1)
    stem_b, num_b = last.stem.rsplit("-", 1)
    if first.parent != last.parent or stem_a != stem_b or int(num_b) - int(num_a) != len(paths) - 1:
        raise ValueError(f"brace_url: {paths[0]} .. {paths[-1]} are not consecutive numbered shards")
    return str(first.parent / f"{stem_a}-{{{num_a}..{num_b}}}{first.suffix}")


def write_shards(samples: Iterable[Sample], out_dir: Union[str, Path], prefix: str = "shard",
                 samples_per_shard: int = 1000, image_format: str = "jpg") -> List[str]:
    """Write ``samples`` into ``out_dir/{prefix}-000000.tar``, ... and return the shard paths.

    Args:
        samples: iterable of ``(image, caption, meta)``; image is a ``PIL.Image`` (encoded as
            ``image_format``), raw ``bytes`` (written as-is with extension ``image_format``) or an
            :class:`EncodedImage`; meta is a JSON-serialisable dict (``.json`` member) or None.
        samples_per_shard: samples per tar; the last shard holds the remainder.
        image_format: ``jpg``, ``png`` or ``webp``.
    Returns:
        the shard paths in order (pass them to :func:`brace_url` for one URL).
    """
    image_format = image_format.lower().lstrip(".")
    if image_format not in _PIL_FORMATS:
        raise ValueError(f"image_format must be one of {sorted(_PIL_FORMATS)}, got {image_format!r}")
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    out_dir = Path(out_dir)
    paths: List[str] = []
    pending: List = []
    for sample in _prepare(samples, image_format, 0):
        pending.append(sample)
        if len(pending) == samples_per_shard:
            paths.append(_flush(out_dir, prefix, len(paths), pending))
            pending = []
    if pending:
        paths.append(_flush(out_dir, prefix, len(paths), pending))
    if not paths:
        raise ValueError("write_shards: no samples to write")
    return paths


def _flush(out_dir: Path, prefix: str, index: int, pending: List) -> str:
    path = out_dir / f"{prefix}-{index:06d}.tar"
    _write_tar_atomic(path, pending)
    return str(path)


def shards_written(out_dir: Union[str, Path], prefix: str) -> List[str]:
    """The shard files :func:`write_shards` names for ``prefix`` (``prefix-NNNNNN.tar``, as
    ``_flush`` writes them) that ``out_dir`` already holds, in order."""
    pattern = glob.escape(prefix) + "-" + "[0-9]" * 6 + ".tar"
    return sorted(glob.glob(os.path.join(glob.escape(str(out_dir)), pattern)))


def write_shards_to_paths(samples: Iterable[Sample], paths: Sequence[Union[str, Path]],
                          image_format: str = "jpg") -> List[str]:
    """Spread ``samples`` evenly (contiguously, in order) over exactly the given shard ``paths``.

    Used when a config names the shards (a brace URL) and asks for them to be generated.
    Raises if there are fewer samples than paths (a shard would be empty).
    """
    image_format = image_format.lower().lstrip(".")
    items = list(_prepare(samples, image_format, 0))
    if len(items) < len(paths):
        raise ValueError(f"{len(items)} samples cannot fill {len(paths)} shards")
    bounds = np.linspace(0, len(items), len(paths) + 1).round().astype(int)
    for path, lo, hi in zip(paths, bounds[:-1], bounds[1:]):
        _write_tar_atomic(Path(path), items[lo:hi])
    return [str(p) for p in paths]


def _digits_split(split: str, seed: int, test_fraction: float) -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    n_test = int(round(len(order) * test_fraction))
    idx = np.sort(order[:n_test] if split == "test" else order[n_test:])
    return digits.images[idx], digits.target[idx]


def digits_samples(split: Literal["train", "test"], seed: int = 0, test_fraction: float = 0.2,
                   image_size: int = 32) -> Iterator[Sample]:
    """Yield ``(PIL RGB image [image_size^2], caption, {"label", "classname"})`` for one split.

    The split is a fixed permutation of the 1797 digits by ``seed`` (test: ``test_fraction`` of
    them, 359 by default); the caption template of each sample is drawn by a RNG seeded from
    ``seed`` and the split, so the same arguments give the same samples.
    """
    images, labels = _digits_split(split, seed, test_fraction)
    rng = random.Random(f"digits-captions-{seed}-{split}")
    for img8, label in zip(images, labels):
        grey = (img8 * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        pil = Image.fromarray(grey, mode="L").resize((image_size, image_size), Image.BILINEAR)
        name = DIGITS_CLASSNAMES[int(label)]
        caption = rng.choice(DIGITS_CAPTION_TEMPLATES).format(name=name, digit=int(label))
        yield pil.convert("RGB"), caption, {"label": int(label), "classname": name}


def write_digits_shards(out_dir: Union[str, Path], image_size: int = 32, samples_per_shard: int = 256,
                        seed: int = 0, test_fraction: float = 0.2, image_format: str = "jpg"
                        ) -> Dict[str, Any]:
    """Write ``out_dir/train/shard-*.tar`` and ``out_dir/test/shard-*.tar`` from the digits.

    Returns ``{"train": brace URL, "test": brace URL, "train_paths": [...], "test_paths": [...],
    "classnames": DIGITS_CLASSNAMES}``; the test shards' json members carry the class label.
    """
    out = {}
    for split in ("train", "test"):
        paths = write_shards(digits_samples(split, seed, test_fraction, image_size), Path(out_dir) / split,
                             samples_per_shard=samples_per_shard, image_format=image_format)
        out[split] = brace_url(paths)
        out[f"{split}_paths"] = paths
    out["classnames"] = list(DIGITS_CLASSNAMES)
    return out


def write_digits_test_shards(out_dir: Union[str, Path], image_size: int = 32, samples_per_shard: int = 256,
                             seed: int = 0, test_fraction: float = 0.2) -> str:
    """Write only the held-out digits split (labelled, for zero-shot eval); returns its brace URL.

    The same ``seed``/``test_fraction`` as the training shards give the same disjoint split.
    """
    paths = write_shards(digits_samples("test", seed, test_fraction, image_size), out_dir,
                         samples_per_shard=samples_per_shard)
    return brace_url(paths)


def _load_caption_table(path: Path) -> Dict[str, str]:
    table: Dict[str, str] = {}
    if path.suffix == ".jsonl":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                table[str(row["file"] if "file" in row else row["filename"])] = str(row["caption"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: expected {{\"file\": ..., \"caption\": ...}} ({exc})") from None
    elif path.suffix == ".tsv":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split("\t", 1)
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: expected 'filename<TAB>caption'")
            table[parts[0].strip()] = parts[1].strip()
    else:
        raise ValueError(f"caption table must be .tsv or .jsonl, got {path}")
    return table


def _is_image(path: Path) -> bool:
    """Whether PIL recognises ``path`` as an image (its header only; nothing is decoded)."""
    try:
        with Image.open(path) as img:
            return img.format is not None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one): the shard
    writers' default process count, and what the loader's advice counts against."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resized_jpeg(data: bytes, side: int) -> Tuple[bytes, Dict[str, int]]:
    """One encoded image made ready for training at ``side`` pixels, as img2dataset's ``keep_ratio``
    resize does: turned upright by its EXIF orientation, its shorter side scaled down to ``side``
    when longer (never up; a JPEG decoded at the smallest DCT scale that still covers the target,
    then a Lanczos filter), and re-encoded as a baseline RGB JPEG of quality 95. A JPEG the GPU
    decode path takes as it is (:func:`~pipeline.data.jpeg_boxes.gpu_decodable`), already no
    larger and upright, is returned as it is (no second lossy encode).
    Returns the bytes and ``{"original_width", "original_height"}``."""
    import math

    from PIL import ImageOps

    from .jpeg_boxes import gpu_decodable

    with Image.open(io.BytesIO(data)) as img:
        original = {"original_width": img.width, "original_height": img.height}
        upright = img.getexif().get(0x0112, 1) in (0, 1)  # 0x0112: EXIF orientation
        scale = side / min(img.size)
        if scale >= 1 and gpu_decodable(img, img.mode) and upright:
            return data, original
        if scale < 1 and img.format == "JPEG":
            img.draft("RGB", (math.ceil(img.width * scale), math.ceil(img.height * scale)))
        img = ImageOps.exif_transpose(img)
        if img.mode != "RGB":  # palette, grey, CMYK, alpha: composed on white, as a browser shows them
            rgba = img.convert("RGBA")
            img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
        w, h = img.size  # drafted and turned upright
        if min(w, h) > side:
            size = (side, max(side, round(h * side / w))) if w <= h else (max(side, round(w * side / h)), side)
            img = img.resize(size, Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=95, progressive=False)
    return buf.getvalue(), original


def _resized_file(args: Tuple[str, int]) -> Tuple[bytes, Dict[str, int]]:
    path, side = args
    try:
        return resized_jpeg(Path(path).read_bytes(), side)
    except (OSError, ValueError, SyntaxError) as exc:  # its header read, its body not: a cut or broken file
        raise ValueError(f"{path}: the image cannot be decoded to resize it ({exc})") from None


def folder_samples(image_dir: Union[str, Path], captions: Optional[Union[str, Path, Mapping[str, str]]] = None,
                   resize: Optional[int] = None, workers: Optional[int] = None) -> Iterator[Sample]:
    """Yield ``(EncodedImage, caption, {"filename": name})`` for the images in ``image_dir``.

    Captions come from ``captions`` (a mapping filename -> caption, or a ``.tsv``
    ``filename<TAB>caption`` / ``.jsonl`` ``{"file", "caption"}`` file), else from
    ``image_dir/captions.tsv`` or ``captions.jsonl`` when present, else from a sidecar
    ``<stem>.txt`` beside each image. Images are copied as encoded (no re-encode), or with
    ``resize`` made baseline JPEGs whose shorter side is at most ``resize`` pixels
    (:func:`resized_jpeg`, in ``workers`` processes, default one a usable core; the metadata then
    also holds the original size); sorted by name.
    Raises ``ValueError`` listing the images that have no caption, or the files that are not images
    (before yielding anything).
    """
    if resize is not None and resize < 1:
        raise ValueError(f"resize must be a side of at least 1 pixel, got {resize}")
    image_dir = Path(image_dir)
    if not image_dir.is_dir():
        raise FileNotFoundError(f"image folder not found: {image_dir}")
    table: Optional[Dict[str, str]] = None
    if isinstance(captions, Mapping):
        table = {str(k): str(v) for k, v in captions.items()}
    elif captions is not None:
        table = _load_caption_table(Path(captions))
    else:
        for name in ("captions.tsv", "captions.jsonl"):
            if (image_dir / name).is_file():
                table = _load_caption_table(image_dir / name)
                break
    files = sorted(p for p in image_dir.iterdir()
                   if p.is_file() and p.suffix.lower().lstrip(".") in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {image_dir}")
    resolved = []
    missing = []
    for path in files:
        if table is not None:
            caption = table.get(path.name, table.get(path.stem))
        else:
            sidecar = path.with_suffix(".txt")
            caption = sidecar.read_text(encoding="utf-8").strip() if sidecar.is_file() else None
        if not caption:
            missing.append(path.name)
        resolved.append((path, caption))
    if missing:
        shown = ", ".join(missing[:10]) + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
        raise ValueError(f"{len(missing)} image(s) in {image_dir} have no caption: {shown}")
    not_images = [path.name for path in files if not _is_image(path)]
    if not_images:
        shown = ", ".join(not_images[:10]) + (f" (+{len(not_images) - 10} more)" if len(not_images) > 10 else "")
        raise ValueError(f"{len(not_images)} file(s) in {image_dir} are not images PIL can read, whatever their "
                         f"extension: {shown}")
    if resize is None:
        for path, caption in resolved:
            yield EncodedImage(path.read_bytes(), path.suffix.lower().lstrip(".")), caption, {"filename": path.name}
        return
    from concurrent.futures import ProcessPoolExecutor

    procs = workers or usable_cores()
    jobs = [(str(path), resize) for path, _ in resolved]
    with ProcessPoolExecutor(max(1, min(procs, len(jobs)))) as pool:
        for (path, caption), (data, original) in zip(resolved, pool.map(_resized_file, jobs, chunksize=16)):
            yield EncodedImage(data, "jpg"), caption, {"filename": path.name, **original}


def _sample_groups(members: Iterable[Tuple[str, bytes]]) -> Iterator[Tuple[Optional[str], List[Tuple[str, bytes]]]]:
    """A shard's members grouped into samples: runs of adjacent members with one key (webdataset's:
    the name up to the first dot of its last part), as ``(key, members)``; a member with no
    extension comes alone, with key None."""
    from webdataset.tariterators import base_plus_ext

    key: Optional[str] = None
    group: List[Tuple[str, bytes]] = []
    for name, data in members:
        prefix, _ = base_plus_ext(name)
        if group and (prefix is None or prefix != key):
            yield key, group
            group = []
        key = prefix
        group.append((name, data))
    if group:
        yield key, group


def _resized_sample(key: str, members: List[Tuple[str, bytes]], side: int, counts: Dict[str, Any]
                    ) -> List[Tuple[str, bytes]]:
    """One sample's members with its image member (the first with an image extension) made ready
    for ``side`` by :func:`resized_jpeg` as ``KEY.jpg``, and the ``width`` / ``height`` of its json
    member, where it has them (img2dataset's), set to the new size; every other member as it is.
    An image that cannot be decoded is kept as it is, and counted with its name."""
    counts["samples"] += 1
    pick = next((i for i, (name, _) in enumerate(members)
                 if name[len(key) + 1:].lower() in IMAGE_EXTENSIONS), None)
    if pick is None:
        counts["no_image"] += 1
        return members
    name, data = members[pick]
    try:
        new, _ = resized_jpeg(data, side)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        counts["unreadable"] += 1
        if len(counts["unreadable_names"]) < 5:
            counts["unreadable_names"].append(f"{name} ({str(exc).strip()[:80]})")
        return members
    new_name = f"{key}.jpg"
    if new is data or (new_name != name and any(n == new_name for n, _ in members)):
        counts["kept"] += 1  # already right; or a second image member holds the name
        return members
    counts["resized"] += 1
    out = list(members)
    out[pick] = (new_name, new)
    for i, (n, d) in enumerate(out):
        if n == f"{key}.json":
            try:
                meta = json.loads(d)
            except ValueError:
                break
            if isinstance(meta, dict) and ("width" in meta or "height" in meta):
                with Image.open(io.BytesIO(new)) as img:
                    meta.update(width=img.width, height=img.height)
                out[i] = (n, json.dumps(meta, sort_keys=True).encode("utf-8"))
            break
    return out


def _resize_shard(job: Tuple[str, str, int]) -> Dict[str, Any]:
    """One shard written to ``dst`` with each sample's image made ready for ``side`` (see
    :func:`resize_shards`); its counts."""
    src, dst, side = job
    counts: Dict[str, Any] = {"shard": dst, "samples": 0, "resized": 0, "kept": 0, "no_image": 0, "unreadable": 0,
                              "unreadable_names": []}

    def members() -> Iterator[Tuple[str, bytes]]:
        with open(src, "rb") as stream:
            for key, group in _sample_groups(tar_members(stream, lambda name: True)):
                yield from (group if key is None else _resized_sample(key, group, side, counts))

    _write_members_atomic(Path(dst), members(), tarfile.PAX_FORMAT)  # PAX: input names of any length
    return counts


def resize_shards(sources: Sequence[Union[str, Path]], out_dir: Union[str, Path], side: int,
                  workers: Optional[int] = None, overwrite: bool = False, resume: bool = False,
                  progress: Optional[Callable[[int, int, Dict[str, Any]], None]] = None) -> List[Dict[str, Any]]:
    """Existing shards rewritten into ``out_dir`` under the same file names, each sample's image made
    a baseline JPEG whose shorter side is at most ``side`` (:func:`resized_jpeg`: what the GPU
    decode path feeds fastest), its other members (caption, json, anything else) kept in order,
    byte for byte but for the json's ``width`` / ``height``. One process a shard (``workers``,
    default one a usable core); each shard is written whole or not at all.

    Refused (``ValueError``, before anything is written): a side below 1, two sources of one file
    name, ``out_dir`` holding a source itself, or (without ``overwrite`` or ``resume``) holding
    shards of those names. With ``resume`` the shards already there are kept (each was written
    whole) and only the missing ones written, after the temporary files that a killed copy left
    under those names are removed. A source that cannot be read to its end (cut short, damaged) is
    not written; the others are, and then a ``ValueError`` names the failures. Returns the counts
    of each shard written (``samples``, ``resized``, ``kept`` as they were, ``no_image``,
    ``unreadable`` images kept as they were), in order; ``progress(done, total, counts)`` after
    each."""
    if side < 1:
        raise ValueError(f"resize must be a side of at least 1 pixel, got {side}")
    out_dir = Path(out_dir)
    dsts = [out_dir / Path(src).name for src in sources]
    seen: Dict[str, str] = {}
    for src, dst in zip(sources, dsts):
        if dst.name in seen:
            raise ValueError(f"{seen[dst.name]} and {src} have one file name: their resized copies would be one file")
        seen[dst.name] = str(src)
        if dst.exists() and os.path.samefile(src, dst):
            raise ValueError(f"{out_dir} holds the shards themselves ({src}): write the resized copies to another "
                             f"folder")
    there = [str(dst) for dst in dsts if dst.exists()]
    if there and not (overwrite or resume):
        raise ValueError(f"{out_dir} already holds {len(there)} of the {len(dsts)} shard names (first: {there[0]}): "
                         f"write to another folder, pass --resume to write only the missing ones, or --overwrite to "
                         f"replace them")
    jobs = [(str(src), str(dst), side) for src, dst in zip(sources, dsts) if not (resume and dst.exists())]
    if resume:
        for dst in dsts:  # what _write_members_atomic leaves when killed: ours, never a whole shard
            for stale in glob.glob(os.path.join(glob.escape(str(out_dir)), f".{glob.escape(dst.name)}.tmp-[0-9]*")):
                os.remove(stale)
        if there:
            logger.info("%d of the %d shards are in %s already: writing the other %d", len(there), len(dsts),
                        out_dir, len(jobs))
    if not jobs:
        return []
    from concurrent.futures import ProcessPoolExecutor

    results: List[Dict[str, Any]] = []
    failed: List[str] = []
    with ProcessPoolExecutor(max(1, min(workers or usable_cores(), len(jobs)))) as pool:
        for k, (job, future) in enumerate(zip(jobs, [pool.submit(_resize_shard, job) for job in jobs])):
            try:
                results.append(future.result())
            except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:  # as tar_members raises
                failed.append(f"{job[0]}: {type(exc).__name__}: {str(exc).strip()[:160]}")
                continue
            if progress is not None:
                progress(k + 1, len(jobs), results[-1])
    if failed:
        raise ValueError(f"{len(failed)} of {len(jobs)} shard(s) could not be read to their end and were not written "
                         f"(the other {len(jobs) - len(failed)} were): {failed[0]}"
                         + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""))
    return results
