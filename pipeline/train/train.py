"""Training: one function, :func:`train`, that puts the run's components together.

Design: each job has its own component, readable alone:
- :mod:`pipeline.engine.dist`: the process group, and "rank 0 first" (:func:`~pipeline.engine.dist.rank_zero_first`)
  for what rank 0 writes and the others reuse (digits shards, the BPE tokenizer);
- :mod:`pipeline.engine.engine`: the towers inside ``deepspeed.initialize`` with the user's DeepSpeed keys
  unchanged (optimizer, scheduler, precision, ZeRO stage, clipping), and the loss over its
  data-parallel group; the final HF export;
- :mod:`pipeline.train.run_state`: the run's position and its checkpoints (save, resume weights-only,
  refuse a resume whose data setup changed);
- :mod:`pipeline.train.metrics`: TensorBoard scalars and the progress line;
- :mod:`pipeline.train.loop`: the micro-batch loop (:func:`pipeline.train.step.forward_backward`), the
  non-finite loss and gradient checks, and when to log, evaluate and save.

Resume restores the engine state, the step, the epoch and batch position of the data stream (with
every rank's loader position: the batches each of its loader workers delivered, so the resume is
exact also when the workers hold unequal data) and every rank's RNG, so a resumed run repeats the
uninterrupted run's losses (bitwise on CPU). Limit: the data position is exact only when the
stream is deterministic for (epoch, rank, position), which ``pipeline.data.loader`` guarantees for the
same data setup; a resume with another one is refused (:class:`~pipeline.errors.ResumeMismatchError`).
Checkpoints written before the loader position was kept resume at the balanced split of the batch
index (exact while every loader worker had data to that point).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Callable, Mapping, Optional

import torch

from ..config import RunConfig, TrainConfig, schedule_warnings
from ..engine.dist import init_distributed, rank_zero_first, single_process_env, world
from ..engine.engine import build_engine, export_final
from ..errors import NonFiniteGradError, NonFiniteLossError
from .loop import Batches, EvalSchedule, TrainLoop
from .metrics import TrainLogger
from .run_folder import claim_run_folder
from .run_state import Checkpointer, RunState, data_setup
from .signals import StopSignals

__all__ = ["TrainConfig", "TrainResult", "train", "NonFiniteLossError", "NonFiniteGradError", "single_process_env"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns (on every rank)."""

    step: int
    losses: dict
    """step -> mean loss of that step (the steps this process ran)."""
    output_dir: str
    final_dir: Optional[str]
    eval_metrics: dict
    stopped_by: Optional[str] = None
    """The stop signal that ended the run early (``train.save_on_signal``) after the checkpoint of
    ``step``; None when it ran to its end."""


def _prepare_data(run_cfg: RunConfig, rank: int, context_length: int):
    """The training shards (digits generated if asked) and the tokenizer (trained if needed)."""
    from ..data.shard_urls import prepare_shards
    from ..data.tokenizer import ensure_tokenizer

    out_dir = run_cfg.train.output_dir
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
    shards = prepare_shards(run_cfg.data, "train")
    tokenizer = ensure_tokenizer(run_cfg.data, shards, os.path.join(out_dir, "tokenizer"),
                                 context_length=context_length)
    return shards, tokenizer


def train(run_cfg: RunConfig, *, resume: Optional[str] = None,
          evaluator: Optional[Callable[[Any, int], Mapping[str, float]]] = None,
          overwrite: bool = False) -> TrainResult:
    """Train the CLIP towers as ``run_cfg`` says.

    Args:
        run_cfg: from :func:`pipeline.config.load_config`.
        resume: None (fresh run), ``"latest"`` (the run's newest checkpoint, or fresh if none),
            or a checkpoint path (see :func:`pipeline.train.checkpoint.resolve_resume`).
        evaluator: ``callable(model, step) -> {name: value}`` with attributes ``every`` (steps;
            0: never periodically) and ``at_end`` (see :class:`pipeline.train.loop.EvalSchedule`);
            ``launch/pretrain.py`` builds it from the config's ``eval`` section.
        overwrite: a fresh run may replace the checkpoints of an earlier run in
            ``train.output_dir`` (see :mod:`pipeline.train.run_folder`); without it that is refused.
    Returns:
        :class:`TrainResult`.
    Raises:
        NonFiniteLossError / NonFiniteGradError: NaN/inf loss or gradient norm (naming the step);
        ResumeMismatchError, CheckpointError: a resume that cannot continue the run exactly;
        RunFolderError: ``train.output_dir`` cannot take this run.
    """
    tcfg = run_cfg.train
    init_distributed()
    rank, _ = world()
    if rank == 0:
        for warning in schedule_warnings(run_cfg):
            logger.warning("%s", warning)
    lock = None
    with StopSignals(tcfg.save_on_signal) as stop:
        try:
            with rank_zero_first("the claim of train.output_dir"):
                if rank == 0:
                    lock = claim_run_folder(tcfg.output_dir, os.path.join(tcfg.output_dir, "ckpt"),
                                            run_cfg.tensorboard_dir, resume=resume, overwrite=overwrite)
            return _train(run_cfg, resume, evaluator, stop)
        finally:
            if lock is not None:
                lock.release()


def _train(run_cfg: RunConfig, resume: Optional[str], evaluator: Any, stop: StopSignals) -> TrainResult:
    from ..data.build import build_train_loader
    from ..data.device_cache import DeviceCache

    tcfg = run_cfg.train
    rank, _ = world()
    with rank_zero_first("data and tokenizer preparation"):
        shards, tokenizer = _prepare_data(run_cfg, rank, run_cfg.model.text.context_length)
    te = build_engine(run_cfg, tokenizer)
    checkpoints = Checkpointer(run_cfg, data_setup(run_cfg, shards, te.dp_world))
    state = checkpoints.resume(te.engine, resume)
    if state is None:
        state = RunState()
        torch.manual_seed(tcfg.seed + 1000 + rank)  # per-rank dropout stream
    start_step = state.step

    cache = DeviceCache.load(run_cfg.data, tokenizer, shards, image_size=te.image_size,
                             context_length=te.context_length, device=te.device) if run_cfg.data.device_cache else None

    def build(epoch: int, start: int):
        if cache is not None:
            return cache.loader(batch_size=run_cfg.micro_batch_size, rank=te.dp_rank, world_size=te.dp_world,
                                epoch=epoch, start_batch=start, dtype=te.input_dtype)
        return build_train_loader(run_cfg.data, tokenizer, image_size=te.image_size, context_length=te.context_length,
                                  batch_size=run_cfg.micro_batch_size, rank=te.dp_rank, world_size=te.dp_world,
                                  epoch=epoch, seed=run_cfg.data.seed, start_batch=start, shards=shards,
                                  device=te.device, dtype=te.input_dtype)

    batches = Batches(build, state, tcfg.epochs)
    log = TrainLogger(run_cfg.tensorboard_dir if rank == 0 else None, total_steps=tcfg.steps, start_step=start_step,
                      micro_batch=run_cfg.micro_batch_size, workers=run_cfg.data.workers, config=run_cfg.raw)
    if rank == 0:
        with open(os.path.join(tcfg.output_dir, "config.json"), "w") as f:
            json.dump(run_cfg.raw, f, indent=2)
    evals = EvalSchedule(evaluator, log)
    final_dir = None
    try:
        try:
            losses = TrainLoop(te, batches, state, tcfg, log, evals, checkpoints, stop).run()
        finally:
            batches.close()  # its loader workers end here, on an error too, not at the interpreter's exit
        if stop.stopped_by is None:  # a stopped run leaves at once: the time left may be short
            evals.finish(te.engine, state.step)
            if tcfg.export_final:
                final_dir = export_final(te.engine, tokenizer, os.path.join(tcfg.output_dir, "final"))
    finally:
        log.close()
    log.done(state.step - start_step)
    return TrainResult(step=state.step, losses=losses, output_dir=tcfg.output_dir, final_dir=final_dir,
                       eval_metrics=evals.metrics, stopped_by=stop.stopped_by)
