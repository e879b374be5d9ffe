"""The loader workers' stream (:class:`ShardStream`): tar shards -> batches of images and token ids.

Design: a torch ``IterableDataset`` whose ``__iter__`` runs the whole per-worker pipeline as
plain generators, with webdataset used only to open URLs (``gopen``: files, ``http``, ``pipe:``)
and to split member names; the tars are read in tarfile's stream mode (:func:`tar_samples`):

    shard list (brace-expanded; per-epoch shuffle seeded by (seed, epoch); split by rank, then by
    worker; or resampled with replacement) -> tar members -> samples -> structural check (has an
    image member and a non-empty caption) -> shuffle buffer -> [resume skip] -> decode + transform
    (:mod:`pipeline.data.transforms`) -> batch (tokenised in the worker)

Only images (PIL), UTF-8 captions and json are ever decoded; every other member (``.pyd``,
``.pth``, ``.pickle``, ...) stays raw bytes and is dropped, so nothing in a shard is unpickled.
Broken samples (unreadable image, missing/empty caption, tar errors: a shard that cannot be
read, or cut short, counts one ``tar_error`` and keeps its samples before the damage) are
skipped and counted: each batch carries ``num_skipped`` (skips in its worker since that worker's
previous batch). When a worker's stream runs out it sends one last record (not a batch) with the
skips after its last batch, so that a stream that gives no batch at all still says why
(:class:`pipeline.data.loader.ShardLoader` counts them).

A resumed worker skips the raw samples of the batches it already delivered this epoch (no image
decode; the skips among them are not counted again: the run that made those batches reported
them), so a corrupt image inside the skipped prefix shifts the resumed stream by one sample.
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch

from .jpeg_boxes import batch_pixels
from .tar_read import tar_members
from .spec import END_OF_STREAM, SKIPS, WORKER, SkipCounter, StreamSpec, stable_seed
from .tokenizer import tokenize
from .transforms import decode_samples

__all__ = ["ShardStream", "tar_samples"]

logger = logging.getLogger(__name__)


def tar_samples(url: str, on_error: Callable[[str], None]) -> Iterator[Dict[str, Any]]:
    """The samples of one tar shard, in order: dicts of ``{extension: bytes}`` with ``__key__``
    and ``__url__`` (members grouped by the name before the first dot, as webdataset does;
    ``__*__`` metadata members and non-files left out).

    A shard that cannot be read calls ``on_error`` once, naming it, and ends there; the samples
    before the damage are kept and the one it cut short is marked ``__cut__``. Damage includes a
    shard cut short at a header or member boundary, which tarfile's stream mode reads as a quiet
    end (:func:`pipeline.data.tar_read.tar_members`, which the tokenizer's caption pass reads with too).
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



class ShardStream(torch.utils.data.IterableDataset):
    """Yields ready batches (dicts of tensors); see the module docstring for the pipeline."""

    def __init__(self, spec: StreamSpec) -> None:
        super().__init__()
        self.spec = spec

    def _shard_urls(self, logical: int) -> Iterator[str]:
        s = self.spec
        if s.resampled:
            rng = random.Random(stable_seed("resample", s.seed, s.epoch, s.rank, logical))
            while True:
                yield s.urls[rng.randrange(len(s.urls))]
        order = list(s.urls)
        if s.shard_shuffle:
            random.Random(stable_seed("shards", s.seed, s.epoch)).shuffle(order)
        yield from order[s.rank::s.world_size][logical::s.num_logical_workers]

    def _raw_samples(self, logical: int, counter: SkipCounter) -> Iterator[Dict[str, Any]]:
        """Tar samples that have an image member and a non-empty UTF-8 caption (not decoded)."""
        s = self.spec
        since_valid = 0
        for url in self._shard_urls(logical):
            since_valid += 1
            if s.resampled and since_valid > 2 * len(s.urls) + 10:
                raise RuntimeError(f"no valid sample in the last {since_valid} shards drawn "
                                   f"from {s.urls[0]} ...: are the image_key/caption_key right?")
            for sample in tar_samples(url, lambda detail: counter.add("tar_error", detail[:300])):
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

    def _batch(self, items: List[Dict[str, Any]], counter: SkipCounter, t_start: float) -> Dict[str, Any]:
        """The batch of ``items``; ``worker_s`` is the time since ``t_start``, when this worker
        began making it."""
        s = self.spec
        skips = counter.take()
        captions = [it["caption"] for it in items]
        input_ids, attention_mask = tokenize(s.tokenizer, captions, s.context_length)
        batch: Dict[str, Any] = {
            **batch_pixels(items, s.image_size),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "num_skipped": torch.tensor(sum(skips.values()), dtype=torch.long),
            SKIPS: skips,
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
        # round-robin then goes on where the uninterrupted one was (:mod:`pipeline.data.loader`).
        logical = (worker + s.first_worker) % s.num_logical_workers
        skip_batches = s.worker_start[logical]
        # with samples_per_epoch no worker can deliver more than the batches left to the rank (the
        # loader stops there; a worker may make a few ahead that are never read)
        quota = None if s.batches_per_rank is None else skip_batches + s.batches_per_rank - s.start_batch
        if quota is not None and skip_batches >= quota:
            return
        counter = SkipCounter()
        raw: Iterator = self._raw_samples(logical, counter)
        if s.train:
            raw = _shuffled(raw, s.shuffle_buffer, random.Random(stable_seed("buffer", s.seed, s.epoch, s.rank, logical)))
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
        for item in decode_samples(s, raw, counter):
            pending.append(item)
            if len(pending) == s.batch_size:
                yield {**self._batch(pending, counter, t0), WORKER: logical}
                t0 = time.perf_counter()
                pending = []
                made += 1
                if quota is not None and made >= quota:
                    return
        if pending and not s.drop_last:
            yield {**self._batch(pending, counter, t0), WORKER: logical}
            pending = []
        # the stream ran out: a last record, not a batch, with the skips since the last batch (the
        # ShardLoader counts and drops it). Not after the quota: the rank's loader stops at its
        # last batch (samples_per_epoch) and reads no worker's record after it.
        yield {END_OF_STREAM: True, SKIPS: counter.take(), "unbatched": len(pending), WORKER: logical}
