"""The training loop: micro-batches through the engine, the step's checks, and when to log, eval, save.

Design: :class:`TrainLoop` runs optimizer steps of ``gradient_accumulation_steps`` micro-batches
from :class:`Batches` through :func:`pipeline.train.step.forward_backward`, and at step boundaries asks
the :class:`~pipeline.train.metrics.TrainLogger`, the :class:`EvalSchedule` and the
:class:`~pipeline.train.run_state.Checkpointer`. Nothing in the step waits for the device:

- every micro-step's loss goes to :class:`pipeline.train.step.LossGuard` (on a GPU checked one
  micro-step late, from a pinned copy; on the CPU at once);
- every step's global gradient norm goes to :class:`GradNormWatch`, which notes on the device the
  first step whose norm is NaN/inf: DeepSpeed's own norm from ``engine.step()``
  (``get_global_grad_norm``) or, where DeepSpeed computes none (ZeRO-0 with a plain torch
  optimizer), the norm of the reduced gradients before ``engine.step()``. With fp16 DeepSpeed's
  loss scaler skips overflowing steps itself; they are counted (``train/skipped_steps``).

Both are read where the run's state leaves the process: at log steps, before an evaluation, a
checkpoint and the export, and at the end. A non-finite loss or gradient norm raises
:class:`~pipeline.errors.NonFiniteLossError` / :class:`~pipeline.errors.NonFiniteGradError` naming the
step, so nothing computed after it is ever written. Limit: the run itself goes on until the next
such point (at most ``train.log_every`` steps).

At log steps the loss, logit scale and learning rate, read to the host for the log anyway, also go
to :class:`~pipeline.train.collapse.CollapseWatch` (a loss stuck at chance level with the scale frozen:
one warning, ``train/collapsed``). With ``train.on_collapse: "stop"`` every rank takes rank 0's
verdict (one broadcast over a CPU group per log step, so no rank waits in a collective for a rank
that stopped) and raises :class:`~pipeline.errors.TrainingCollapseError` before that step's
evaluation or checkpoint.

Pre-emption: before each step the loop asks :class:`~pipeline.train.signals.StopSignals` whether any rank
received a stop signal (one all-reduce over the CPU group); if so, every rank leaves the loop there
and saves a checkpoint of the last finished step (unless that step's checkpoint was just written).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist

from ..config import TrainConfig
from ..engine.dist import barrier, cpu_group, world
from ..engine.engine import TrainEngine
from ..errors import NONFINITE_ADVICE, DataError, NonFiniteGradError, NonFiniteLossError, TrainingCollapseError
from .collapse import CollapseWatch, effective_window
from .metrics import TrainLogger
from .run_state import Checkpointer, RunState
from .signals import StopSignals
from .step import LossGuard, forward_backward

__all__ = ["Batches", "EvalSchedule", "GradNormWatch", "TrainLoop"]

logger = logging.getLogger(__name__)


class Batches:
    """The data stream across epochs, with its (epoch, batch_in_epoch) position.

    All ranks switch epochs together: if any rank's stream ends, every rank starts the next epoch
    (a rank's unconsumed batch is dropped), so collectives never wait on a rank without data.
    An epoch read from its start that gives no batch on some rank is an error on every rank (a
    :class:`~pipeline.errors.DataError` naming the epoch and, on that rank, the loader's skip counts by reason),
    never an empty epoch: with ``train.epochs`` a run would otherwise end at step 0. A rank's
    stream gives no batch only when none of its loader workers made one (the loader skips a
    worker whose data ran out and goes on with the others). The skips a loader counts after its
    last batch are added when its stream ends.

    ``state.data_position`` follows the loader's :meth:`~pipeline.data.loader.ShardLoader.position` after
    every batch taken (None for loaders without one, and at an epoch's start); a state resumed
    with one is handed to the new loader's ``seek``, so a resume is exact also when the loader's
    workers hold unequal data. A state without one (an old checkpoint) resumes at the balanced
    split of ``batch_in_epoch``.
    Loading runs under ``torch.random.fork_rng``: creating a DataLoader iterator draws from the
    global torch RNG, and a resumed run creates one at a point where the uninterrupted run did
    not, so the data stream must not touch the RNG that drives dropout (it seeds its own).
    """

    def __init__(self, build: Callable[[int, int], Any], state: RunState, max_epochs: Optional[int]) -> None:
        self.build, self.state, self.max_epochs = build, state, max_epochs
        self._flags: Any = None  # the CPU group for the per-batch agreement (made at first use)
        with torch.random.fork_rng(devices=[]):
            self._open(state.epoch, state.batch_in_epoch, state.data_position)

    def _open(self, epoch: int, start: int, position: Optional[dict] = None) -> None:
        self._loader = self.build(epoch, start)
        seek = getattr(self._loader, "seek", None)
        if position is not None and start > 0 and callable(seek):
            seek(position)
        self._it = iter(self._loader)
        self._counted = 0  # skips of this loader already added to state.skipped_samples
        # an epoch read from its start must give a batch (resumed at its end, it may give none)
        self._fresh = start == 0

    def _all_have(self, have: bool) -> bool:
        """Whether every rank has a batch. Agreed over a CPU (gloo) group: over NCCL the flag's
        ``item()`` would wait for all the GPU work queued before it, once per micro-batch."""
        if world()[1] == 1:
            return have
        if self._flags is None:
            self._flags = cpu_group()
        flag = torch.tensor([1 if have else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._flags)
        return bool(flag.item())

    def close(self) -> None:
        """End the current loader (its worker processes stop now)."""
        close = getattr(self._it, "close", None)
        self._it, self._loader = iter(()), None
        if callable(close):
            close()

    def next(self) -> Optional[dict]:
        """The next micro-batch, or None when ``max_epochs`` epochs are done."""
        with torch.random.fork_rng(devices=[]):
            return self._next()

    def _next(self) -> Optional[dict]:
        state = self.state
        while True:
            batch = next(self._it, None)
            if batch is None:  # this rank's stream ended: count the skips after its last batch
                stats = getattr(self._loader, "stats", None)
                if stats is not None:
                    state.skipped_samples += int(stats["skipped"]) - self._counted
                    self._counted = int(stats["skipped"])
            if self._all_have(batch is not None):
                skipped = int(batch.get("num_skipped", 0))
                state.batch_in_epoch += 1
                position = getattr(self._loader, "position", None)
                state.data_position = position() if callable(position) else None
                state.skipped_samples += skipped
                self._counted += skipped
                self._fresh = False
                return batch
            if self._fresh:
                raise DataError(self._no_batch_message(batch is None))
            state.epoch += 1
            state.batch_in_epoch = 0
            state.data_position = None
            if self.max_epochs is not None and state.epoch >= self.max_epochs:
                return None
            self._open(state.epoch, 0)

    def _no_batch_message(self, mine: bool) -> str:
        epoch = self.state.epoch
        if not mine:
            return (f"the training stream yielded no batch in epoch {epoch} on another rank (this rank had "
                    "data): that rank's error says why")
        rank = world()[0]
        reason = getattr(self._loader, "no_batch_reason", None)
        why = reason() if callable(reason) else "too few samples for the micro-batch and world size?"
        return f"the training stream yielded no batch in epoch {epoch} (rank {rank}): {why}"


class EvalSchedule:
    """When the evaluator runs: every ``evaluator.every`` steps (0 or absent: never) and after the
    last step when ``evaluator.at_end`` (absent: true). The evaluator (``callable(model, step) ->
    {name: value}``) is called on every rank (a ZeRO-3 forward needs all of them) with the
    unwrapped model in eval mode under no_grad; rank 0 logs the values as ``eval/<name>``."""

    def __init__(self, evaluator: Optional[Callable[[Any, int], Mapping[str, float]]], log: TrainLogger) -> None:
        self.evaluator, self.log = evaluator, log
        self.every = int(getattr(evaluator, "every", 0) or 0) if evaluator is not None else 0
        self.at_end = bool(getattr(evaluator, "at_end", True)) if evaluator is not None else False
        self.metrics: dict = {}

    def due(self, step: int) -> bool:
        return self.evaluator is not None and self.every > 0 and step % self.every == 0

    def run(self, engine: Any, step: int) -> None:
        module = engine.module
        was_training = module.training
        module.eval()
        with torch.no_grad():
            self.metrics = {k: float(v) for k, v in dict(self.evaluator(module, step) or {}).items()}
        module.train(was_training)
        self.log.log_eval(step, self.metrics)
        self.log.log_eval_report(step, getattr(self.evaluator, "last_report", None))
        barrier()

    def finish(self, engine: Any, step: int) -> None:
        if self.evaluator is not None and self.at_end and not self.due(step):
            self.run(engine, step)


def _grads_norm(engine: Any) -> Optional[torch.Tensor]:
    """The 2-norm of the (reduced) gradients, on the device, no host wait."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


class GradNormWatch:
    """The first step whose global gradient norm is NaN/inf, noted on the device (no host wait);
    :meth:`check` reads it (one wait) and raises naming that step."""

    def __init__(self) -> None:
        self._first: Optional[tuple[Any, Any]] = None  # (step, norm) of the first bad step, or 0 steps
        self.last: Any = None
        """The last norm noted (tensor or float; for the log)."""

    def note(self, norm: Any, step: int) -> None:
        if norm is None:
            return
        self.last = norm
        if not isinstance(norm, torch.Tensor):  # a host float already: no wait to check it
            if not math.isfinite(norm) and self._first is None:
                self._first = (step, norm)
            return
        norm = norm.detach().reshape(()).float()
        bad = ~torch.isfinite(norm)
        if self._first is None:
            self._first = (torch.where(bad, step, 0), torch.where(bad, norm, 0.0))
        elif isinstance(self._first[0], torch.Tensor):
            seen, value = self._first
            take = bad & (seen == 0)
            self._first = (torch.where(take, step, seen), torch.where(take, norm, value))

    def check(self) -> None:
        if self._first is None:
            return
        step, value = (float(v) for v in self._first)
        if step:
            raise NonFiniteGradError(f"non-finite gradient norm ({value}) at step {int(step)}: the run stops "
                                     f"before anything after it is saved; {NONFINITE_ADVICE}")

    def last_value(self) -> Optional[float]:
        return None if self.last is None else float(self.last)


def _rank0_verdict(flag: bool, group: Any) -> bool:
    """Rank 0's ``flag`` on every rank (one broadcast over ``group``, a CPU group); ``flag`` itself
    without a process group of more than one rank."""
    if group is None:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.broadcast(value, src=dist.get_global_rank(group, 0), group=group)
    return bool(value.item())


class TrainLoop:
    """Runs the optimizer steps of one run (see the module docstring)."""

    def __init__(self, te: TrainEngine, batches: Batches, state: RunState, tcfg: TrainConfig, log: TrainLogger,
                 evals: EvalSchedule, checkpoints: Checkpointer, stop: Optional[StopSignals] = None) -> None:
        self.te, self.batches, self.state, self.tcfg = te, batches, state, tcfg
        self.log, self.evals, self.checkpoints, self.stop = log, evals, checkpoints, stop
        self._saved_at = state.step  # the step of the newest checkpoint (a resumed run's is where it starts)
        engine = te.engine
        self.fp16 = bool(engine.fp16_enabled())
        self.own_norm = not hasattr(engine.optimizer, "_global_grad_norm")  # DeepSpeed computes none
        self.guard = LossGuard(te.device)
        self.norms = GradNormWatch()
        self.scale: Any = None
        rank = world()[0]
        window = effective_window(tcfg.collapse_window, tcfg.steps)
        self.collapse = CollapseWatch(window, loss=te.loss_kind, batch=te.contrastive_batch,
                                      loss_tolerance=tcfg.collapse_loss_tolerance,
                                      scale_tolerance=tcfg.collapse_scale_tolerance, report=rank == 0)
        self.stop_on_collapse = self.collapse.enabled and tcfg.on_collapse == "stop"
        self._verdicts = cpu_group() if self.stop_on_collapse else None  # made now: every rank at once

    def run(self) -> dict:
        """Train until ``train.steps`` (or the data's ``train.epochs``); returns {step: loss}."""
        state, tcfg = self.state, self.tcfg
        self.te.engine.train()
        while state.step < tcfg.steps:
            if self.stop is not None and self.stop.agreed():
                break
            if not self._step():
                break
            state.step += 1
            self._after_step(state.step)
        self._checked()
        stopped = self.stop is not None and self.stop.stopped_by is not None
        if (tcfg.save_final or stopped) and state.step != self._saved_at:
            self._save()
        return self.guard.losses

    def _save(self) -> None:
        self.checkpoints.save(self.te.engine, self.state)
        self._saved_at = self.state.step

    def _checked(self) -> None:
        """Every loss and gradient norm so far is finite (waits for the last ones)."""
        try:
            self.guard.flush()
        except NonFiniteLossError:
            self.norms.check()  # a non-finite gradient before it is the cause: name that step
            raise
        self.norms.check()

    def _after_step(self, step: int) -> None:
        tcfg, engine = self.tcfg, self.te.engine
        if step % tcfg.log_every == 0 or step == tcfg.steps:
            self._checked()
            loss, lr = self.guard.losses[step], engine.get_lr()[0] if engine.get_lr() else float("nan")
            scale = float(self.scale) if self.scale is not None else None
            collapse = self.collapse.observe(step, loss, scale, lr)
            self.log.log_step(step, loss, lr=lr, scale=scale,
                              grad_norm=self.norms.last_value(), skipped_samples=self.state.skipped_samples,
                              skipped_steps=int(getattr(engine, "skipped_steps", 0)) if self.fp16 else 0,
                              device=self.te.device, collapsed=collapse is not None if self.collapse.enabled else None)
            if self.stop_on_collapse and _rank0_verdict(collapse is not None, self._verdicts):
                raise TrainingCollapseError(collapse.message() if collapse is not None else
                                            f"training collapse at step {step}: rank 0 names it in its log")
        if self.evals.due(step):
            self._checked()
            self.evals.run(engine, step)
        if tcfg.save_every and step % tcfg.save_every == 0 and step < tcfg.steps:
            self._checked()
            self._save()

    def _step(self) -> bool:
        """One optimizer step; False when the data ran out before it ended."""
        te, engine, state = self.te, self.te.engine, self.state
        gas = engine.gradient_accumulation_steps()
        for micro_i in range(gas):
            t_data = time.perf_counter()
            batch = self.batches.next()
            data_s = time.perf_counter() - t_data
            if batch is None:
                return False
            pv = batch["pixel_values"].to(te.device, dtype=te.input_dtype, non_blocking=True)
            ids = batch["input_ids"].to(te.device, non_blocking=True)
            mask = batch["attention_mask"].to(te.device, non_blocking=True)
            where = f"at step {state.step + 1} (micro-batch {micro_i}, epoch {state.epoch})"
            try:
                loss, loss_ms, self.scale = forward_backward(engine, pv, ids, mask, te.loss_fn, self.tcfg.chunk_size)
            except FloatingPointError as exc:  # the loss op rejects NaN/Inf features
                self.norms.check()
                raise NonFiniteLossError(f"non-finite loss {where}: {exc}; {NONFINITE_ADVICE}") from exc
            try:
                self.guard.push(loss, state.step + 1, 1.0 / gas, where)
            except NonFiniteLossError:
                self.norms.check()
                raise
            last = micro_i == gas - 1
            if last and self.own_norm:
                self.norms.note(_grads_norm(engine), state.step + 1)
            engine.step()
            if last and not self.own_norm and not self.fp16:  # fp16: DeepSpeed skips overflows itself
                self.norms.note(engine.get_global_grad_norm(), state.step + 1)
            self.log.micro_step(samples=pv.shape[0] * te.dp_world, data_s=data_s,
                                worker_s=float(batch.get("worker_s", 0.0)), loss_ms=loss_ms,
                                decode_ms=batch.get("decode_ms"), stall_ms=batch.get("stall_ms"))
        return True
