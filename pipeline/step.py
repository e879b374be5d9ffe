"""One micro-batch's forward and backward through the DeepSpeed engine, and the timer of the loss op.

Design: the towers run forward, the loss runs on detached feature leaves (so it is timed on its
own) and its feature gradients go back through the towers with a linear surrogate via
``engine.backward``; with a chunk size below the micro-batch the chunked backbone runs instead
(:mod:`pipeline.chunked`). Nothing here waits for the GPU: the caller reads the loss once, to
check it is finite, before ``engine.step()``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from .chunked import chunked_forward_backward

__all__ = ["OpTimer", "forward_backward", "grad_norm_zero0"]


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
    bias)``. With ``chunk_size`` < B the chunked backbone runs (:mod:`pipeline.chunked`), else one
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


def grad_norm_zero0(engine) -> Optional[float]:
    """Global gradient 2-norm before the optimizer step where DeepSpeed does not report one
    (ZeRO-0 with a plain torch optimizer: the gradients are all-reduced, full, on every rank)."""
    if engine.zero_optimization_stage() != 0 or engine.get_global_grad_norm() is not None:
        return None
    norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else None
