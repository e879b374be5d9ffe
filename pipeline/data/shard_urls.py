"""Shard lists: brace URLs expanded, local files checked, the digits data set written where it is missing."""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
import tempfile
from typing import List, Optional, Sequence, Union
from urllib.parse import urlparse

from infclip.ops.config import ConfigError

from .config import DataConfig
from .shards import digits_samples, write_shards_to_paths

__all__ = ["check_shards_exist", "expand_urls", "local_path", "prepare_shards", "resolve_shards"]

logger = logging.getLogger(__name__)

_DIGITS_SPLIT_SEED = 0  # fixed, so generated train and val shards never overlap whatever data.seed is


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


def local_path(url: str) -> Optional[str]:
    """The file a shard URL names on this machine (a path, or ``file://``), None for a remote one."""
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
    missing = [u for u in urls if (p := local_path(u)) is not None and not os.path.isfile(p)]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise FileNotFoundError(f"{len(missing)} of {len(urls)} {what} file(s) not found: {shown}")


def resolve_shards(urls: Union[str, Sequence[str]], *, generate_digits_split: Optional[str] = None,
                   digits_image_size: int = 32) -> List[str]:
    """Expand ``urls``; if every local one is missing and ``generate_digits_split`` is
    ``"train"``/``"test"``, write that digits split to exactly those paths; then check they exist.
    Some there and some missing: an interrupted generation is completed (:func:`_complete_digits`),
    anything else is a ``ConfigError``; the digits are never written over other files."""
    expanded = expand_urls(urls)
    if generate_digits_split is not None:
        local = [local_path(u) for u in expanded]
        if any(p is None for p in local):
            raise ConfigError("'generate_digits' needs local shard paths, got a remote URL")
        there = [p for p in local if os.path.exists(p)]
        if there and len(there) < len(local):
            _complete_digits(local, generate_digits_split, digits_image_size, urls)
        elif not there:
            logger.info("writing digits %s split to %d shard(s): %s", generate_digits_split, len(local), urls)
            write_shards_to_paths(_digits(generate_digits_split, digits_image_size), local)
    check_shards_exist(expanded)
    return expanded


def _digits(split: str, image_size: int):
    return digits_samples(split, seed=_DIGITS_SPLIT_SEED, image_size=image_size)


def _complete_digits(local: List[str], split: str, image_size: int, urls: Union[str, Sequence[str]]) -> None:
    """Some of ``local`` there, some missing: when the ones there are this digits split's own shards
    byte for byte (a generation cut short), write the missing ones; else a ``ConfigError`` naming
    both (a user's shard list that is one file off), every file left as it is. The shards are
    deterministic, so the split is written to a temporary folder beside them and compared."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(local[0]))) as tmp:
        fresh = write_shards_to_paths(_digits(split, image_size), [os.path.join(tmp, f"{k}.tar")
                                                                   for k in range(len(local))])
        there = [(p, f) for p, f in zip(local, fresh) if os.path.exists(p)]
        if not all(os.path.isfile(p) and filecmp.cmp(p, f, shallow=False) for p, f in there):
            missing = [p for p in local if not os.path.exists(p)]
            raise ConfigError(f"'generate_digits': {len(missing)} of the {len(local)} shards in {urls!r} are missing "
                              f"(first: {missing[0]}) and {len(there)} are there (first: {there[0][0]}) that are not "
                              f"the digits' own; the digits are never written over other files: fix the URL, or set "
                              f"'generate_digits' to false")
        logger.info("completing the digits %s split: %d of %d shard(s) were missing", split,
                    len(local) - len(there), len(local))
        for p, f in zip(local, fresh):
            if not os.path.exists(p):
                os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
                shutil.move(f, p)


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
