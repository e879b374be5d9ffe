"""One stream's spec: which shards a loader's workers read, in which order, into which batches; and
the records the workers send besides batches (skip counts, the end of a worker's stream).

Every random choice of a stream is seeded by :func:`stable_seed` from (seed, epoch, rank, logical
worker) or, for a crop, (seed, epoch, shard file name, sample key): never from process state, so
every process and every resume draws the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["END_OF_STREAM", "SKIPS", "WORKER", "SkipCounter", "StreamSpec", "stable_seed", "stream_spec"]

logger = logging.getLogger(__name__)


def stable_seed(*parts: Any) -> int:
    """A 64-bit seed from any values, the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass
class StreamSpec:
    """What one stream reads and how: shards, split, order, batches, resume point (:func:`stream_spec`)."""

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
    None: the balanced split of ``start_batch`` (see :meth:`pipeline.data.loader.ShardLoader.seek`)."""
    first_worker: Optional[int] = None
    """Resume: the logical worker the round-robin goes on with (DataLoader worker 0 plays it);
    None: ``start_batch mod W``."""
    gpu_decode: bool = False
    """Training: JPEGs leave the workers undecoded, with their crop boxes (``pipeline.data.gpu_decode``)."""
    gpu_share: float = 1.0
    """With ``gpu_decode``: the share of JPEGs sent undecoded (by a hash of shard name and key)."""
    gpu_scaled: bool = False
    """With ``gpu_decode``: JPEGs whose crop can be decoded at half their size or less leave the
    workers taken apart for the DCT-domain decoder (``pipeline.data.dct_decode``)."""

    def __post_init__(self) -> None:
        w = self.num_logical_workers
        if self.worker_start is None:
            self.worker_start = [_share(self.start_batch, i, w) for i in range(w)]
        if self.first_worker is None:
            self.first_worker = self.start_batch % w


def stream_spec(urls: Sequence[str], tokenizer: Any, *, image_size: int, context_length: int, batch_size: int,
                workers: int, image_keys: List[str], caption_key: str, mean: Sequence[float],
                std: Sequence[float], rank: int = 0, world_size: int = 1, train: bool = False, seed: int = 0,
                epoch: int = 0, shard_shuffle: bool = False, shuffle_buffer: int = 0, resampled: bool = False,
                batches_per_rank: Optional[int] = None, start_batch: int = 0,
                crop_scale: Sequence[float] = (1.0, 1.0), drop_last: bool = False, with_labels: bool = False,
                require_caption: bool = True) -> StreamSpec:
    """The spec of one stream, for the training and eval loaders and the device cache. The
    defaults are one ordered pass over ``urls`` (no shard shuffle, buffer or resampling, the
    centre square, the last partial batch kept); ``train`` sends uint8 crops seeded by ``seed``
    and leaves out the eval keys (``caption``, ``key``, ``label``)."""
    return StreamSpec(
        urls=list(urls), tokenizer=tokenizer, image_size=image_size, context_length=context_length,
        batch_size=batch_size, rank=rank, world_size=world_size, epoch=epoch, seed=seed, train=train,
        shard_shuffle=shard_shuffle, shuffle_buffer=shuffle_buffer, resampled=resampled,
        batches_per_rank=batches_per_rank, start_batch=start_batch, num_logical_workers=max(1, workers),
        image_keys=image_keys, caption_key=caption_key, with_labels=with_labels, crop_scale=list(crop_scale),
        mean=list(mean), std=list(std), drop_last=drop_last, require_caption=require_caption)


SKIPS = "_skips"  # a worker's record: {reason: count} since its previous record (ShardLoader pops it)
END_OF_STREAM = "_end_of_stream"  # marks a worker's last record (not a batch), which ShardLoader drops
WORKER = "_worker"  # every record: the logical worker that made it (ShardLoader pops it)


def _share(total: int, logical: int, workers: int) -> int:
    """How many of batches 0..total-1, dealt round-robin over ``workers`` workers that all have
    data, belong to logical worker ``logical`` (the balanced split of a resume position)."""
    return max(0, (total - logical + workers - 1) // workers)


class SkipCounter:
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
