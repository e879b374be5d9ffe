"""The loaders a run and an evaluation build: :func:`build_train_loader` (one rank's training stream
for one epoch, from the ``data`` section) and :func:`build_eval_loader` (one ordered pass over
held-out shards); :func:`decode_on_gpu` decides where training JPEGs are decoded."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from infclip.ops.config import ConfigError

from .config import CLIP_MEAN, CLIP_STD, DataConfig
from .cores import MIN_CORES_PER_RANK, CorePlan, plan_cores
from .image_ops import normalize_pixels
from .loader import ShardLoader, make_loader
from .shard_urls import check_shards_exist, expand_urls, prepare_shards
from .spec import stream_spec

__all__ = ["build_eval_loader", "build_train_loader", "decode_on_gpu"]

logger = logging.getLogger(__name__)

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
    the GPU path's stage on the CPU (PIL, the crop kernel in Triton's interpreter), as the tests do."""
    if cfg.decode == "cpu" or device is None:
        if cfg.decode == "gpu":
            raise ConfigError("'decode': \"gpu\" needs a training device (none was given)")
        return False
    if torch.device(device).type != "cuda":
        if cfg.decode == "gpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError(f"'data.decode': \"gpu\" on a {torch.device(device).type} run: the GPU path's crop kernel "
                              "runs off a GPU only under TRITON_INTERPRET=1 (slow: for tests); use \"auto\" or \"cpu\"")
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
            the conditions in :mod:`pipeline.data.loader`). The stream is a round-robin over the
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
    batches_per_rank = _batches_per_rank(cfg, batch_size, world_size)
    workers = _train_workers(cfg, urls, rank, world_size)
    spec = stream_spec(
        urls, tokenizer, image_size=image_size, context_length=context_length, batch_size=batch_size,
        workers=workers, image_keys=cfg.image_keys(), caption_key=cfg.caption_key, mean=cfg.image_mean,
        std=cfg.image_std, rank=rank, world_size=world_size, train=True, seed=cfg.seed if seed is None else seed,
        epoch=epoch, shard_shuffle=cfg.shard_shuffle, shuffle_buffer=cfg.shuffle_buffer, resampled=cfg.resampled,
        batches_per_rank=batches_per_rank, start_batch=start_batch, crop_scale=cfg.crop_scale, drop_last=True)
    spec.gpu_decode, spec.gpu_share = decode_on_gpu(cfg, device), cfg.gpu_decode_share
    spec.gpu_scaled = spec.gpu_decode and cfg.gpu_decode_scaled
    normalize, stage = _pixel_stage(cfg, spec.gpu_decode, device, dtype)
    loader = make_loader(spec, workers, cfg.prefetch_factor, normalize, stage,
                         cores=_training_cores(cfg) if workers > 0 or stage is not None else None)
    if position is not None:
        loader.seek(position)
    return loader


def _training_cores(cfg: DataConfig) -> Optional[CorePlan]:
    """With ``data.reserve_training_core``, this rank's placement over the host's cores
    (:func:`pipeline.data.cores.plan_cores`, the local rank from the launcher's environment); None
    without it or without room for it (said once)."""
    if not cfg.reserve_training_core:
        return None
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    plan = plan_cores(local_rank, local_world)
    if plan is None:
        _warn_once("cores", "data.reserve_training_core: not applied (needs Linux and at least %d physical cores "
                   "per local rank; %d local rank(s) here)", MIN_CORES_PER_RANK, local_world)
    elif local_rank == 0 and ("cores", plan) not in _WARNED:
        _WARNED.add(("cores", plan))
        logger.info("data.reserve_training_core: training thread on CPU(s) %s, loader on %d CPU(s)",
                    ",".join(map(str, plan.training)), len(plan.loader))
    return plan


def _batches_per_rank(cfg: DataConfig, batch_size: int, world_size: int) -> Optional[int]:
    """Batches each rank yields per epoch under ``samples_per_epoch``; None without it."""
    if cfg.samples_per_epoch is None:
        return None
    batches_per_rank = cfg.samples_per_epoch // (batch_size * world_size)
    if batches_per_rank < 1:
        raise ConfigError(f"'samples_per_epoch' {cfg.samples_per_epoch} is less than one global batch "
                          f"({batch_size} x {world_size} ranks)")
    return batches_per_rank


def _train_workers(cfg: DataConfig, urls: Sequence[str], rank: int, world_size: int) -> int:
    """The loader workers of this rank: ``data.workers``, at most the rank's shard count without
    ``resampled`` (a worker without a shard would only be started to end at once). Refuses fewer
    shards than ranks; warns (once, rank 0) when the shards do not divide over the ranks."""
    workers = cfg.workers
    if cfg.resampled:
        return workers
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
    if workers > per_rank:
        _warn_once(("workers_capped", rank, per_rank, workers),
                   "rank %d has %d training shard(s) for %d loader workers: loading with %d worker(s)",
                   rank, per_rank, workers, per_rank)
        workers = per_rank
    return workers


def _pixel_stage(cfg: DataConfig, gpu_decode: bool, device: Optional[torch.device],
                 dtype: torch.dtype) -> Tuple[Optional[Callable[[torch.Tensor], torch.Tensor]], Any]:
    """(normalize, stage) for a training loader: with GPU decoding the decode stage
    (:class:`pipeline.data.gpu_decode.DecodeStage`) and no normalize; else a normalize that copies
    the workers' uint8 crops to ``device`` and normalises them there into ``dtype``."""
    if gpu_decode:
        from .gpu_decode import DecodeStage

        return None, DecodeStage(device, dtype, cfg.image_mean, cfg.image_std, decoder=cfg.gpu_decoder,
                                 lanes=cfg.gpu_decode_lanes, priority=cfg.gpu_decode_priority,
                                 host_max_pixels=cfg.gpu_decode_host_max_pixels,
                                 host_interleaved=cfg.gpu_decode_host_interleaved,
                                 host_copy=cfg.gpu_decode_host_copy, host_share=cfg.gpu_decode_host_share,
                                 engine_share=cfg.gpu_decode_engine_share)

    def normalize(pixels: torch.Tensor) -> torch.Tensor:
        if device is not None:
            pixels = pixels.to(device, non_blocking=True)
        return normalize_pixels(pixels, cfg.image_mean, cfg.image_std, dtype)

    return normalize, None


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
    spec = stream_spec(
        urls, tokenizer, image_size=image_size, context_length=context_length, batch_size=batch_size,
        workers=workers, image_keys=keys, caption_key=caption_key, mean=image_mean, std=image_std, rank=rank,
        world_size=world_size, with_labels=with_labels, require_caption=require_caption)
    return make_loader(spec, workers, 2)
