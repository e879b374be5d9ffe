"""The training set decoded once into device memory (``data.device_cache``).

Design: for data sets that fit on the GPU (a batch-size study, a small model on rendered scenes,
a quick ablation), the shard loader's per-sample work (tar parsing, JPEG decoding, tokenising) is
paid once at start-up instead of every epoch. :meth:`DeviceCache.load` reads every training shard
in a fixed order through the same stream as the shard loader (so the same decoder, crop and
tokeniser), keeps the pixels as uint8 [N, 3, S, S] and the token ids on the device, and
:class:`CachedLoader` then serves batches by indexing: each epoch is one pass over a permutation
seeded by (``data.seed``, epoch), cut into global batches of ``micro_batch x world`` rows, of which
rank r takes the r-th slice. Pixels are normalised per batch on the device, as the shard loader's
are. Every rank holds the whole set (no split), so every rank sees the same permutation.

Determinism and resume: a position is (epoch, batch in epoch), and the stream from it is a pure
function of the seed, the world size, the micro-batch and the cached set, so a resumed run reads
exactly what the uninterrupted run read (the run's data setup records ``device_cache``).

Limits: no random crops (each image is decoded once, so ``crop_scale`` must be ``[1, 1]``: the
centre square), no resampling (``resampled`` is ignored: an epoch is a permutation of the cached
set; ``samples_per_epoch``, when set, shortens it). The whole set must fit in device memory with
room to train: at most half the memory free at load time, checked before anything is copied.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

from infclip.ops.config import ConfigError

from .config import DataConfig
from .image_ops import normalize_pixels
from .loader import make_loader
from .spec import stable_seed, stream_spec

__all__ = ["DeviceCache", "CachedLoader"]

logger = logging.getLogger(__name__)

#: The share of the free device memory the cached set may take.
MAX_FREE_FRACTION = 0.5
#: Samples per read batch while loading.
_READ_BATCH = 1024
#: [key, DeviceCache] of the last set loaded in this process (empty: none).
_LAST: list = []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _free_bytes(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


class DeviceCache:
    """Every training sample, decoded: ``pixels`` uint8 [N, 3, S, S], ``input_ids`` and
    ``attention_mask`` int64 [N, L], on ``device``."""

    def __init__(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 cfg: DataConfig) -> None:
        self.pixels, self.input_ids, self.attention_mask, self.cfg = pixels, input_ids, attention_mask, cfg

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def nbytes(self) -> int:
        return _nbytes((self.pixels, self.input_ids, self.attention_mask))

    @classmethod
    def load(cls, cfg: DataConfig, tokenizer: Any, shards: Sequence[str], *, image_size: int,
             context_length: int, device: torch.device) -> "DeviceCache":
        """Read and decode every sample of ``shards`` (``cfg.workers`` processes, at most one a shard)
        onto ``device``.

        The last set loaded stays for the next call that asks for the same one (same shards, sizes,
        member keys, tokenizer folder and device; the pixels are stored before normalisation): a batch-size study trains many
        runs in one process on one cached set.

        Raises:
            ConfigError: no sample was read; the set would take more
                than half the free device memory (naming the sizes).
        """
        key = (tuple(shards), image_size, context_length, str(device), cfg.image_key, cfg.caption_key,
               getattr(tokenizer, "name_or_path", id(tokenizer)))
        if _LAST and _LAST[0] == key:
            return cls(_LAST[1].pixels, _LAST[1].input_ids, _LAST[1].attention_mask, cfg)
        _LAST.clear()  # free the previous set before reading the next
        t0 = time.perf_counter()
        # the defaults' ordered pass (last batch kept, crop_scale [1, 1]: the centre square), as uint8 (``train``)
        workers = min(cfg.workers, len(shards))  # a worker without a shard would start only to end
        spec = stream_spec(
            shards, tokenizer, image_size=image_size, context_length=context_length, batch_size=_READ_BATCH,
            workers=workers, image_keys=cfg.image_keys(), caption_key=cfg.caption_key, mean=cfg.image_mean,
            std=cfg.image_std, train=True, seed=cfg.seed)
        parts: Dict[str, List[torch.Tensor]] = {"pixel_values": [], "input_ids": [], "attention_mask": []}
        reader = make_loader(spec, workers, cfg.prefetch_factor)
        for batch in reader:
            for name, chunks in parts.items():
                chunks.append(batch[name])
        # the loader's count: it includes the skips after each worker's last batch, which no batch carries
        skipped = int(reader.stats["skipped"])
        if not parts["pixel_values"]:
            raise ConfigError(f"'device_cache': no training sample could be read from {len(shards)} shard(s): "
                              f"{reader.no_batch_reason()}")
        host = {name: torch.cat(chunks) for name, chunks in parts.items()}
        need = _nbytes(host.values())
        free = _free_bytes(device)
        if free is not None and need > MAX_FREE_FRACTION * free:
            raise ConfigError(
                f"'device_cache': the {host['pixel_values'].shape[0]:,} training samples take {need / 2**30:.2f} GiB "
                f"on {device}, more than {MAX_FREE_FRACTION:.0%} of the {free / 2**30:.2f} GiB free; set "
                "'device_cache' false (the streaming loader), use fewer or smaller images")
        cache = cls(host["pixel_values"].to(device), host["input_ids"].to(device), host["attention_mask"].to(device), cfg)
        _LAST[:] = [key, cache]
        logger.info("device cache: %d samples (%d skipped), %.2f GiB on %s, read in %.1f s", len(cache), skipped,
                    cache.nbytes / 2**30, device, time.perf_counter() - t0)
        return cache

    def loader(self, *, batch_size: int, rank: int, world_size: int, epoch: int, start_batch: int,
               dtype: torch.dtype) -> "CachedLoader":
        """The stream of one rank for one epoch (see the module docstring)."""
        return CachedLoader(self, batch_size=batch_size, rank=rank, world_size=world_size, epoch=epoch,
                            start_batch=start_batch, dtype=dtype)


class CachedLoader:
    """Batches of one rank for one epoch, indexed out of a :class:`DeviceCache`: the same keys
    as :class:`pipeline.data.loader.ShardLoader` (``num_skipped`` and ``worker_s`` are 0)."""

    def __init__(self, cache: DeviceCache, *, batch_size: int, rank: int, world_size: int, epoch: int,
                 start_batch: int, dtype: torch.dtype) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.cache, self.batch_size, self.rank, self.world_size = cache, batch_size, rank, world_size
        self.epoch, self.start_batch, self.dtype = epoch, start_batch, dtype
        cfg, per_step = cache.cfg, batch_size * world_size
        samples = len(cache) if cfg.samples_per_epoch is None else min(cfg.samples_per_epoch, len(cache))
        self.batches_per_epoch = samples // per_step
        if self.batches_per_epoch < 1:
            raise ConfigError(f"'device_cache': {samples:,} samples per epoch are less than one global batch "
                              f"({batch_size} x {world_size} ranks)")

    def order(self) -> torch.Tensor:
        """This epoch's permutation of the cached rows (the same on every rank)."""
        gen = torch.Generator().manual_seed(stable_seed("device_cache", self.cache.cfg.seed, self.epoch) % 2**63)
        return torch.randperm(len(self.cache), generator=gen)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        cache, cfg = self.cache, self.cache.cfg
        order = self.order().to(cache.pixels.device)
        per_step, lo = self.batch_size * self.world_size, self.rank * self.batch_size
        for i in range(self.start_batch, self.batches_per_epoch):
            rows = order[i * per_step + lo: i * per_step + lo + self.batch_size]
            yield {
                "pixel_values": normalize_pixels(cache.pixels[rows], cfg.image_mean, cfg.image_std, self.dtype),
                "input_ids": cache.input_ids[rows],
                "attention_mask": cache.attention_mask[rows],
                "num_skipped": torch.zeros((), dtype=torch.long),
                "worker_s": torch.zeros((), dtype=torch.float64),
            }
