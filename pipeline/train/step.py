"""One micro-batch's forward and backward through the DeepSpeed engine, and the timer of the loss op.

Design: the towers run forward, the loss runs on detached feature leaves (so it is timed on its
own) and its feature gradients go back through the towers with a linear surrogate via
``engine.backward``; with a chunk size below the micro-batch the chunked backbone runs instead
(:mod:`pipeline.train.chunked`). Nothing here waits for the GPU: :class:`LossGuard` checks each loss is
finite one micro-step later, so the host stays ahead of the device (a wait per micro-step left the
GPU idle while DeepSpeed's optimizer step was being launched).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable, Optional

import torch

from ..errors import NONFINITE_ADVICE, NonFiniteLossError
from .chunked import chunked_forward_backward

__all__ = ["OpTimer", "LossGuard", "forward_backward"]


class LossGuard:
    """Checks that every micro-step's loss is finite and sums the step losses, without making the
    host wait for the device inside the step.

    On a GPU, :meth:`push` copies the loss into pinned host memory behind an event and checks the
    loss pushed ``lead`` micro-steps before it, waiting only for that copy: by then the host has
    queued the optimizer steps and forwards and backwards since, so the device never idles on the
    host while the host's work a micro-step is shorter than the device's (a larger ``lead`` keeps
    more work queued, so a host slowed for a while does not starve the device). A non-finite loss
    therefore stops the run ``lead`` micro-steps after it happened (the error names the step where
    it happened), after those steps' updates reached the weights in memory;
    the caller calls :meth:`flush` before anything leaves the process (checkpoint, evaluation,
    export, logging), so no state after a non-finite loss is ever written. On the CPU every loss
    is checked as it is pushed.

    ``losses`` maps step -> the sum of its micro-steps' weighted losses, for the checked steps.
    """

    def __init__(self, device: torch.device, lead: int = 1) -> None:
        self._lag = device.type == "cuda"
        self.lead = max(1, int(lead))
        self._pending: deque = deque()
        self.losses: dict = {}

    def push(self, loss: torch.Tensor, step: int, weight: float, where: str) -> None:
        """Queue micro-step ``loss`` (0-dim) of optimizer step ``step``, counted as ``weight`` x
        its value in ``losses[step]``; check the one pushed ``lead`` before it (on the CPU: this one)."""
        if self._lag:
            host = torch.empty((), dtype=torch.float32, pin_memory=True)
            host.copy_(loss.detach().float(), non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            entry = (host, ready, step, weight, where)
        else:
            entry = (loss.detach().float(), None, step, weight, where)
        self._pending.append(entry)
        while len(self._pending) > (self.lead if self._lag else 0):
            self._check(self._pending.popleft())

    def flush(self) -> None:
        """Check the losses still pending (waits for them)."""
        while self._pending:
            self._check(self._pending.popleft())

    def _check(self, entry: tuple) -> None:
        value_t, ready, step, weight, where = entry
        if ready is not None:
            ready.synchronize()
        value = float(value_t)
        if not math.isfinite(value):
            raise NonFiniteLossError(f"non-finite loss ({value}) {where}; {NONFINITE_ADVICE}")
        self.losses[step] = self.losses.get(step, 0.0) + weight * value


class OpTimer:
    """Times a stretch of device work without stopping the host: CUDA events on a GPU (read at
    ``float(timer)``, which waits only for the end event), the wall clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._ms: Optional[float] = None
        if self._cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> "OpTimer":
        if self._cuda:
            self._end.record()
        else:
            self._ms = (time.perf_counter() - self._t0) * 1e3
        return self

    def __float__(self) -> float:
        if self._ms is None:
            self._end.synchronize()
            self._ms = float(self._start.elapsed_time(self._end))
        return self._ms


def forward_backward(engine: Any, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, loss_fn: Callable, chunk_size: Optional[int] = None
                     ) -> tuple[torch.Tensor, Any, Any]:
    """One micro-batch's forward and backward through a DeepSpeed engine (no optimizer step).

    ``pixel_values`` [B,3,H,W], ``input_ids``/``attention_mask`` [B,L]; ``loss_fn(img, txt, scale,
    bias)``. With ``chunk_size`` < B the chunked backbone runs (:mod:`pipeline.train.chunked`), else one
    forward, the loss on detached feature leaves (timed alone), and one surrogate backward.
    Returns ``(loss 0-dim detached, loss-op ms, logit scale multiplier)``; the last two are read
    with ``float()`` (on a GPU the plain step leaves them on the device, so that nothing here
    waits for the GPU). The caller checks the loss is finite before ``engine.step()``.
    """
    if chunk_size is not None and chunk_size < pixel_values.shape[0]:
        res = chunked_forward_backward(engine, pixel_values, input_ids, attention_mask, loss_fn, chunk_size,
                                       engine=engine)
        return res.loss, res.loss_op_ms, res.logit_scale
    return _plain_step(engine, pixel_values, input_ids, attention_mask, loss_fn)


def _plain_step(engine, pv, ids, mask, loss_fn):
    """Forward, loss on detached leaves (timed by :class:`OpTimer`), surrogate backward through
    the engine, with no host-device synchronisation of its own.

    Returns (loss 0-dim, OpTimer, scale [1] detached)."""
    img, txt, scale, bias = engine(pv, ids, mask)
    leaves = [t.detach().requires_grad_(True) for t in (img, txt, scale, bias)]
    timer = OpTimer(engine.device)
    loss = loss_fn(*leaves)
    loss.backward()
    timer.stop()
    surrogate = 0
    for out, leaf in zip((img, txt, scale, bias), leaves):
        if leaf.grad is not None:
            surrogate = surrogate + (out * leaf.grad.to(out.dtype)).sum().float()
    engine.backward(surrogate)
    return loss.detach(), timer, scale.detach().float().reshape(-1)[0]
