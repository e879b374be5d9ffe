"""Training collapse: the loss stuck at chance level while the logit scale stands still, named in the log.

Design: :class:`CollapseWatch` is fed at every log step with what the loop has already read to the
host there (the step's loss, the logit scale multiplier, the learning rate), so it adds no wait for
the device. It keeps the log steps of the last ``train.collapse_window`` optimizer steps and calls
the window collapsed when, over all of them,

- CLIP: the loss stays within ``train.collapse_loss_tolerance`` (relative) of ln B, the loss of
  uniform logits: what collapsed features give (every logit equal, whatever the scale), and what a
  batch of identical captions gives. B is the contrastive batch one loss sees
  (:attr:`pipeline.engine.engine.TrainEngine.contrastive_batch`: the micro-batch times the data-parallel
  world under a distributed scheme, the micro-batch alone with ``distributed: "none"``); label
  smoothing leaves the level at ln B;
- SigLIP (no softmax, so no ln B): the loss is flat (its spread within the tolerance, relative) and
  not below B H(1/B) = ln B - (B - 1) ln(1 - 1/B) (~ ln B + 1), the loss of the best prediction that
  ignores the inputs (one probability 1/B for every pair) -- a collapse with a bias off its best
  value sits above it, a trained model far below;
- and (both) the logit scale moved by less than ``train.collapse_scale_tolerance`` (relative) across
  the window: with collapsed features its gradient is zero.

A converged run (loss far below chance, scale at its clamp) is never flagged. The watch judges only
once its log steps reach back a whole window, so a fresh (or resumed) run has one window to leave
the chance-level plateau every CLIP run starts on. The first collapsed window is named in ONE
warning per run (step, loss, chance level, scale, learning rate, usual causes); the loop writes the
verdict of every log step to TensorBoard as ``train/collapsed`` (0/1), and with
``train.on_collapse: "stop"`` raises :class:`~pipeline.errors.TrainingCollapseError`.

A run shorter than two windows is judged over half its length (at least 10 steps):
:func:`effective_window`.

Limits: judged on the log steps only, so a window spans at least ``train.log_every`` steps; the
SigLIP bias is not read (it lives on the device, partitioned under ZeRO-3), a flat loss with a
frozen scale already says it no longer moves the loss; a warm-up that keeps the learning rate near
0 for a whole window can look the same (the warning shows the learning rate).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import Optional

__all__ = ["Collapse", "CollapseWatch", "COLLAPSE_ADVICE", "chance_loss", "effective_window"]

logger = logging.getLogger(__name__)

#: What the collapse warning (and TrainingCollapseError) advises.
COLLAPSE_ADVICE = ("usual causes: a learning rate too high for the warm-up (lower optimizer.params.lr or lengthen "
                   "the scheduler's warmup_num_steps), every step skipped (fp16 overflow: see train/skipped_steps; "
                   "use bf16), captions or images that are all alike (data.caption_key, a data set of one caption "
                   "template), both towers locked; see docs/training.md, 'Collapse'")


def effective_window(window: int, total_steps: int) -> int:
    """The window a run of ``total_steps`` is judged over: ``window``, or half the run when the run
    is shorter than two windows (at least 10 steps; 0 stays off). A 32-step run at a batch of
    65,536 that collapses at its 4th step is then named at step 16 instead of never."""
    if window <= 0:
        return 0
    return min(window, max(10, total_steps // 2))


def chance_loss(loss: str, batch: int) -> float:
    """The loss a model that ignores its inputs gets at best on a contrastive batch of ``batch``:
    CLIP ln B (uniform logits); SigLIP B H(1/B) = ln B - (B - 1) ln(1 - 1/B) (every pair at 1/B)."""
    if loss == "clip":
        return math.log(batch)
    return math.log(batch) - (batch - 1) * math.log1p(-1.0 / batch)


@dataclasses.dataclass(frozen=True)
class Collapse:
    """A window judged collapsed: what the warning and the error say."""

    step: int
    steps: int
    """Optimizer steps the window spans (its first log step to ``step``)."""
    loss: float
    """The loss at ``step``."""
    loss_kind: str
    batch: int
    level: float
    """The chance level (:func:`chance_loss`)."""
    tolerance: float
    scale: float
    scale_change: float
    """Relative spread of the logit scale over the window."""
    lr: Optional[float]
    lr_zero: bool
    """The learning rate was 0 at every log step of the window."""

    def message(self) -> str:
        tol = f"{100 * self.tolerance:g}%"
        if self.loss_kind == "clip":
            where = (f"the loss ({self.loss:.4f}) has stayed within {tol} of ln({self.batch}) = {self.level:.4f}, "
                     "chance level (uniform logits)")
        else:
            where = (f"the loss ({self.loss:.4f}) has stayed flat (within {tol}) at or above {self.level:.4f}, "
                     f"the loss of a model that ignores its inputs (B H(1/B), B = {self.batch})")
        lr = "" if self.lr is None or not math.isfinite(self.lr) else f"; lr {self.lr:.3g}"
        causes = ("the learning rate was 0 at every log step of the window; other " if self.lr_zero else "") \
            + COLLAPSE_ADVICE
        return (f"training collapse at step {self.step}: {where}, for the last {self.steps} steps, and the logit "
                f"scale is frozen at {self.scale:.4g} (moved {100 * self.scale_change:.3g}% in them){lr}; {causes}")


@dataclasses.dataclass
class _Sample:
    step: int
    loss: float
    scale: Optional[float]
    lr: Optional[float]


class CollapseWatch:
    """Decides, at each log step, whether the last ``window`` steps look collapsed (module docstring).

    Args:
        window: optimizer steps a verdict spans (0: off).
        loss: ``"clip"`` or ``"siglip"``.
        batch: the contrastive batch B one loss sees (< 2: off; a batch of one has loss 0).
        loss_tolerance: CLIP: relative distance to ln B; SigLIP: relative spread of the loss.
        scale_tolerance: relative spread of the logit scale below which it counts as frozen.
        report: log the warning (rank 0); the verdicts are the same without it.
    """

    def __init__(self, window: int, *, loss: str = "clip", batch: int, loss_tolerance: float = 0.01,
                 scale_tolerance: float = 1e-3, report: bool = True) -> None:
        if loss not in ("clip", "siglip"):
            raise ValueError(f"unknown loss {loss!r}; choose 'clip' or 'siglip'")
        self.window, self.loss_kind, self.batch = int(window), loss, int(batch)
        self.loss_tolerance, self.scale_tolerance, self.report = loss_tolerance, scale_tolerance, report
        self.level = chance_loss(loss, self.batch) if self.batch >= 2 else float("nan")
        self._samples: collections.deque = collections.deque()
        self.first: Optional[Collapse] = None
        """The first collapsed window of the run (the one the warning names)."""

    @property
    def enabled(self) -> bool:
        return self.window > 0 and self.batch >= 2

    def observe(self, step: int, loss: float, scale: Optional[float], lr: Optional[float] = None
                ) -> Optional[Collapse]:
        """Add log step ``step``; the :class:`Collapse` when the window ending here is collapsed,
        else None. The first one is warned about (once per run)."""
        if not self.enabled:
            return None
        samples = self._samples
        samples.append(_Sample(step, float(loss), None if scale is None else float(scale),
                               None if lr is None else float(lr)))
        start = step - self.window
        while len(samples) >= 2 and samples[1].step <= start:  # keep one log step at or before the start
            samples.popleft()
        if samples[0].step > start:  # not a whole window yet
            return None
        verdict = self._judge(list(samples))
        if verdict is not None and self.first is None:
            self.first = verdict
            if self.report:
                logger.warning("%s", verdict.message())
        return verdict

    def _judge(self, window: list) -> Optional[Collapse]:
        scales = [s.scale for s in window]
        if any(s is None or not math.isfinite(s) or s <= 0 for s in scales):
            return None
        scale_change = (max(scales) - min(scales)) / max(scales)
        if scale_change > self.scale_tolerance or not self._loss_at_chance([s.loss for s in window]):
            return None
        last = window[-1]
        lrs = [s.lr for s in window]
        return Collapse(step=last.step, steps=last.step - window[0].step, loss=last.loss, loss_kind=self.loss_kind,
                        batch=self.batch, level=self.level, tolerance=self.loss_tolerance, scale=last.scale,
                        scale_change=scale_change, lr=last.lr, lr_zero=all(lr == 0 for lr in lrs))

    def _loss_at_chance(self, losses: list) -> bool:
        tol = self.loss_tolerance
        if self.loss_kind == "clip":
            return all(abs(v - self.level) <= tol * self.level for v in losses)
        high, low = max(losses), min(losses)
        return high - low <= tol * abs(high) and low >= (1 - tol) * self.level
