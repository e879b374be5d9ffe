"""Where a run stands (step, data position) and its checkpoints: save, resume, refuse a changed setup.

Design: :class:`RunState` is what the loop advances and what a checkpoint's client state holds.
The data position is counted in micro-batches of one rank's stream, a stream fixed by the
micro-batch, the data-parallel world size, the shard list, the data seed, the loader's logical
worker count and the shuffle settings (:mod:`pipeline.data.loader`). A checkpoint records those as its
*data setup*; :meth:`Checkpointer.resume` compares it with the current one and raises
:class:`~pipeline.errors.ResumeMismatchError` listing each change (old -> new) instead of
continuing at the stored batch index in other units. Shards are compared by file name (the crops
are seeded by it, so moving the folder is no change). ``train.seed`` is compared too: a resumed
run restores the RNG, so another seed would be silently ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from typing import Any, Optional, Sequence

import torch.distributed as dist

from ..config import RunConfig
from ..engine.dist import cpu_group, world
from ..errors import CheckpointError, ResumeMismatchError
from .checkpoint import load_checkpoint, read_latest, resolve_resume, save_checkpoint

__all__ = ["RunState", "Checkpointer", "data_setup"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RunState:
    """The run's position: optimizer steps done and the data stream's (epoch, batch)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    """Micro-batches of this epoch already consumed by each rank."""
    skipped_samples: int = 0
    """Broken samples the loader skipped so far (all epochs)."""
    data_position: Optional[dict] = None
    """This rank's loader position in the epoch (:meth:`pipeline.data.loader.ShardLoader.position`: the
    batches each logical loader worker delivered, and the worker the round-robin goes on with),
    which makes a resume exact when the workers hold unequal data. None: at the epoch's start,
    for loaders without one (the device cache), and in checkpoints written before it was kept:
    the balanced split of ``batch_in_epoch`` (exact when every worker had data to that point)."""


def data_setup(run_cfg: RunConfig, shards: Sequence[str], dp_world: int) -> dict:
    """What fixes the meaning of a data position (plain values, stored in the checkpoint)."""
    data = run_cfg.data
    names = "\n".join(os.path.basename(str(u).rstrip("/")) for u in shards)
    return {
        "micro_batch": run_cfg.micro_batch_size,
        "world_size": dp_world,
        "shards": f"{len(shards)} shard(s), names sha256 {hashlib.sha256(names.encode()).hexdigest()[:16]}",
        "data_seed": data.seed,
        "train_seed": run_cfg.train.seed,
        "loader_workers": max(1, data.workers),
        "shuffle_buffer": data.shuffle_buffer,
        "shard_shuffle": data.shard_shuffle,
        "resampled": data.resampled,
        "samples_per_epoch": data.samples_per_epoch,
        "device_cache": data.device_cache,
    }


_LABELS = {"micro_batch": "micro-batch (train_micro_batch_size_per_gpu)", "world_size": "data-parallel world size",
           "shards": "data sources (data.train_shards)", "data_seed": "data.seed", "train_seed": "train.seed",
           "loader_workers": "loader workers (data.workers)", "shuffle_buffer": "data.shuffle_buffer",
           "shard_shuffle": "data.shard_shuffle", "resampled": "data.resampled",
           "samples_per_epoch": "data.samples_per_epoch", "device_cache": "data.device_cache"}
# client states written before the data setup was recorded kept these three
_LEGACY_KEYS = {"micro_batch": "micro_batch", "world_size": "world_size", "data_seed": "data_seed"}


class Checkpointer:
    """Saves and resumes one run's checkpoints in ``<train.output_dir>/ckpt``.

    Args:
        run_cfg: the run's config (``train.keep_last_checkpoints``, ``train.output_dir``).
        setup: :func:`data_setup` of this run.
    """

    def __init__(self, run_cfg: RunConfig, setup: dict) -> None:
        self.ckpt_dir = os.path.join(run_cfg.train.output_dir, "ckpt")
        self.keep_last = run_cfg.train.keep_last_checkpoints
        self.setup = setup

    def resume(self, engine: Any, resume: Optional[str]) -> Optional[RunState]:
        """Load the checkpoint ``resume`` names into ``engine`` (weights-only, RNG included) and
        return its :class:`RunState`; None for a fresh start. Raises ResumeMismatchError when
        the data setup changed, CheckpointError for a file or tag that cannot be used."""
        target = resolve_resume(resume, self.ckpt_dir)
        if target is None:
            return None
        client = load_checkpoint(engine, *target)
        where = os.path.join(*target)
        self._check_setup(client, where)
        try:
            state = RunState(step=int(client["step"]), epoch=int(client["epoch"]),
                             batch_in_epoch=int(client["batch_in_epoch"]),
                             skipped_samples=int(client.get("skipped_samples", 0)),
                             data_position=_own_position(client.get("data_positions")))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: the client state has no usable run position ({exc!r}); "
                                  "was it written by pipeline.train.train?") from None
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", where, state.step, state.epoch,
                    state.batch_in_epoch)
        return state

    def _check_setup(self, client: dict, where: str) -> None:
        stored = client.get("data_setup")
        if not isinstance(stored, dict):
            stored = {key: client[old] for key, old in _LEGACY_KEYS.items() if old in client}
            logger.warning("%s records only %s of its data setup: the rest is not checked", where,
                           ", ".join(sorted(stored)) or "none")
        changed = [f"{_LABELS.get(k, k)} {stored[k]!r} -> {self.setup[k]!r}"
                   for k in self.setup if k in stored and stored[k] != self.setup[k]]
        if changed:
            raise ResumeMismatchError(
                f"cannot resume from {where}: the setup changed since it was saved: {'; '.join(changed)}. The "
                "saved data position counts micro-batches of the old setup, so the run would read other data "
                "than the uninterrupted one. Resume with the old values, or start a new run in another "
                "train.output_dir")

    def _gather(self, position: Optional[dict]) -> list:
        """Every rank's loader position, by rank."""
        size = world()[1]
        if size == 1:
            return [position]
        out: list = [None] * size
        dist.all_gather_object(out, position, group=cpu_group())
        return out

    def save(self, engine: Any, state: RunState) -> str:
        """Save a checkpoint of ``state`` (on every rank at once). DeepSpeed keeps the client state
        of rank 0 only, so every rank's ``data_position`` is gathered into ``data_positions``
        (a list by rank; one collective over a CPU group)."""
        client = dataclasses.asdict(state)
        client.pop("data_position")
        client["data_positions"] = self._gather(state.data_position)
        client["data_setup"] = dict(self.setup)
        try:
            return save_checkpoint(engine, self.ckpt_dir, state.step, client, self.keep_last)
        except (OSError, RuntimeError) as exc:
            # a full disk or a lost mount: torch's writer reports it as a RuntimeError
            if isinstance(exc, RuntimeError) and "write" not in str(exc).lower():
                raise
            what = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise CheckpointError(f"saving the checkpoint of step {state.step} in {self.ckpt_dir} failed ("
                                  f"{what.splitlines()[0][:300]}); latest still names {read_latest(self.ckpt_dir)}"
                                  ", the last complete checkpoint") from None


def _own_position(positions: Any) -> Optional[dict]:
    """This rank's entry of a checkpoint's ``data_positions`` (None when it has none)."""
    rank = world()[0]
    if not isinstance(positions, list) or rank >= len(positions):
        return None
    own = positions[rank]
    return dict(own) if isinstance(own, dict) else None
