"""DeepSpeed's ZeRO-1/2 optimizer step without host waits, and ZeRO-0's with one overflow read.

Design: with bf16 (no loss scaling) the step has no decision to make on the host, yet DeepSpeed
0.19's ZeRO-1/2 optimizer makes the host wait for the GPU twice per parameter group and step:
``mask_nan_or_inf_with_val_inplace`` builds its -1 fill value with ``torch.tensor(-1.0,
device=...)`` (a copy from pageable host memory, which waits for the stream), and
``unscale_and_clip_grads`` tests the gradient norm with ``bool(...)`` before clipping. Each wait
drains the GPU's queue, so the host's launches for the rest of the step and the next forward run
while the GPU idles: at micro-batch 256 (ViT-B/32, one H200) the step is bound by the host.

:func:`keep_step_on_device` replaces those two pieces, for one engine's optimizer, by the same
arithmetic written with device tensors only:

* the norm mask fills with a Python scalar (``masked_fill_(~isfinite, -1.0)``: the same values);
* the clip coefficient takes an invalid norm (non-finite or the -1 sentinel) as +inf with
  ``torch.where`` instead of an ``if``, which is what DeepSpeed's branch computes: the gradients
  are multiplied by ``1 / (clamp((norm / loss_scale + 1e-6) / clip, min=1) * loss_scale)``.

It also replaces the gradient norm's per-tensor loop (``get_grad_norm_direct``: for each
gradient a float64 copy, a norm and a device move, three tensor calls from Python, about 4 ms of
host time a step for ViT-B/32's 63 flat tensors on one H100 host) by one ``torch._foreach_norm``
over the same gradients, chosen by DeepSpeed's rules (padding, pipeline-replicated and
model-parallel parameters), with the norms in DeepSpeed's float64 and then the same sum,
all-reduce, root and mask. On the CPU the values are DeepSpeed's bit for bit; CUDA's fused
kernel sums each tensor's squares in float32 before the float64 result.

It applies only to DeepSpeed's ``DeepSpeedZeroOptimizer`` (ZeRO stages 1 and 2) with bf16 or
fp32 weights and no offload; fp16's dynamic loss scale needs the host to know about an overflow,
and another optimizer is left as DeepSpeed built it. If DeepSpeed's code changes shape (the
functions are not where this module expects them) nothing is replaced and the reason is logged.

ZeRO-0 with bf16 (or fp16) weights steps through DeepSpeed's FP16 optimizer wrapper, whose
overflow check (``CheckOverflow.has_overflow_serial``) reads one inf/nan flag per parameter tensor
on the host: 63 waits on the GPU a step for ViT-B/32 with flat parameters (H200), ``bf16.check_grad_overflow: false``
notwithstanding. :func:`keep_step_on_device` gives that checker the same per-tensor test with the
flags combined on the device and read once (the same answer; the step still skips on overflow,
which needs the host to know).

ZeRO-3's fetch on one rank also synchronises the device once per fetch (DeepSpeed's no-gather
handle). A first attempt at skipping that wait (the partition is already on the device, nothing
was copied) measured slower on an H200 (ViT-B/32 ZeRO-3 with flat parameters: 1,565 samples/s
without the waits against 2,061 with them, same process): the fetch then waited on the host for
its own fetch events (at most two unfinished), which trail the queue once ``wait`` does not
synchronise. ``pipeline.engine.zero3_step`` now skips the wait and lifts that cap on one rank.
"""

from __future__ import annotations

import inspect
import logging
import types
from typing import Any

import torch

__all__ = ["keep_step_on_device", "restore_deepspeed_mask", "mask_nonfinite_", "clip_scale"]

logger = logging.getLogger(__name__)

ONE_CALL_NORM = True
"""Replace ``get_grad_norm_direct`` too (module docstring); False leaves DeepSpeed's loop (for
measuring what it costs: ``bench/bench_stream.py --host_work per_tensor``)."""


def mask_nonfinite_(norm: torch.Tensor, device: Any = None, val: float = -1.0) -> None:
    """``norm`` with NaN and +-inf replaced by ``val`` in place (DeepSpeed's
    ``mask_nan_or_inf_with_val_inplace``, without building ``val`` on the host)."""
    norm.masked_fill_(~torch.isfinite(norm), val)


def clip_scale(total_norm: torch.Tensor, loss_scale: float, clip_grad: float) -> torch.Tensor:
    """The factor DeepSpeed divides the gradients by: ``loss_scale`` times the clip coefficient
    ``max(1, (norm / loss_scale + 1e-6) / clip_grad)``, with a non-finite or negative (DeepSpeed's
    invalid sentinel) norm taken as +inf. On the device, no host wait."""
    norm = torch.as_tensor(total_norm, dtype=torch.float32)
    invalid = ~torch.isfinite(norm) | (norm < 0)
    norm = torch.where(invalid, torch.full_like(norm, float("inf")), norm)
    return torch.clamp((norm / loss_scale + 1e-6) / clip_grad, min=1.0) * loss_scale


def _unscale_and_clip_grads(self, grad_groups_flat, total_norm) -> None:
    """``DeepSpeedZeroOptimizer.unscale_and_clip_grads`` with the clip factor on the device."""
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return
    combined = clip_scale(total_norm, self.loss_scale, self.clip_grad) if self.clip_grad > 0.0 else self.loss_scale
    inverse = 1.0 / combined
    for grad in grad_groups_flat:
        for g in (grad if isinstance(grad, list) else [grad]):
            g.data.mul_(inverse)


def _grad_norm_direct(self, gradients, params, norm_type=2):
    """``DeepSpeedZeroOptimizer.get_grad_norm_direct`` with the 2-norms of all gradients from one
    ``torch._foreach_norm`` (other norms: DeepSpeed's own)."""
    zero12 = _zero12_module()
    if float(norm_type) != 2.0:
        return type(self).get_grad_norm_direct(self, gradients, params, norm_type)
    chosen = []
    for g, p in zip((g for g in gradients if not getattr(g, "_zero_padding", False)), params):
        if hasattr(p, zero12.PIPE_REPLICATED) and p.ds_pipe_replicated:
            continue  # pipeline parallelism may replicate a parameter: counted once
        if zero12.is_model_parallel_parameter(p) or self.model_parallel_rank == 0:
            chosen.append(g.detach())
    if chosen:
        # without offload (refused by _why_not) every gradient is on the optimizer's device: one move
        norms = torch._foreach_norm(chosen, 2.0, dtype=zero12.get_norm_dtype())
        total_norm = torch.stack(norms).to(self.device).pow(2.0).sum().float()
    else:
        total_norm = torch.tensor(0.0, dtype=torch.float32).to(self.device)
    zero12.dist.all_reduce(total_norm, op=zero12.dist.ReduceOp.SUM, group=self.dp_process_group)
    self._model_parallel_all_reduce(tensor=total_norm, op=zero12.dist.ReduceOp.SUM)
    total_norm = total_norm.pow(0.5)
    zero12.mask_nan_or_inf_with_val_inplace(total_norm, device=self.device)
    return total_norm


def _zero12_module():
    from deepspeed.runtime.zero import stage_1_and_2

    return stage_1_and_2


def _why_not(optimizer: Any) -> str:
    """Why the step of ``optimizer`` is left as DeepSpeed wrote it ('' when it can be replaced)."""
    try:
        zero12 = _zero12_module()
    except ImportError as exc:  # pragma: no cover - DeepSpeed is a dependency
        return f"DeepSpeed's ZeRO-1/2 module does not import ({exc})"
    if not isinstance(optimizer, zero12.DeepSpeedZeroOptimizer):
        return f"the optimizer is {type(optimizer).__name__}, not ZeRO-1/2's"
    if getattr(optimizer, "dtype", None) == torch.float16:
        return "fp16 weights (the dynamic loss scale needs the host to see overflows)"
    if getattr(optimizer, "cpu_offload", False):
        return "optimizer offload"
    original = getattr(zero12, "mask_nan_or_inf_with_val_inplace", None)
    # (mask_nonfinite_ itself: an engine built earlier in this process had its step replaced)
    if original is not mask_nonfinite_ and (
            original is None or list(inspect.signature(original).parameters) != ["input", "device", "val"]):
        return "DeepSpeed's mask_nan_or_inf_with_val_inplace is not the one this module replaces"
    for name in ("PIPE_REPLICATED", "is_model_parallel_parameter", "get_norm_dtype", "dist"):
        if not hasattr(zero12, name):
            return f"DeepSpeed's ZeRO-1/2 module has no {name}, which the gradient norm's replacement reads"
    norm = getattr(type(optimizer), "get_grad_norm_direct", None)
    if norm is None or list(inspect.signature(norm).parameters) != ["self", "gradients", "params", "norm_type"]:
        return "DeepSpeed's get_grad_norm_direct is not the one this module replaces"
    method = getattr(type(optimizer), "unscale_and_clip_grads", None)
    if method is None or list(inspect.signature(method).parameters) != ["self", "grad_groups_flat", "total_norm"]:
        return "DeepSpeed's unscale_and_clip_grads is not the one this module replaces"
    return ""


def _has_overflow_serial(self, params) -> bool:
    """``CheckOverflow.has_overflow_serial`` with one host read: DeepSpeed's per-tensor test
    (``_has_inf_or_nan``, a device flag) for every gradient, the flags combined on the device and
    read once, where DeepSpeed reads each flag in turn (stopping at the first set one: the same
    answer)."""
    flags = [self._has_inf_or_nan(p.grad.data, i) for i, p in enumerate(params) if p.grad is not None]
    return bool(torch.stack(flags).any()) if flags else False


def _one_overflow_read(optimizer: Any) -> bool:
    """Give the overflow checker of DeepSpeed's FP16 optimizer wrapper (ZeRO-0 with bf16 or fp16
    weights) :func:`_has_overflow_serial`; whether it did."""
    from deepspeed.runtime.utils import CheckOverflow

    checker = getattr(optimizer, "overflow_checker", None)
    method = getattr(CheckOverflow, "has_overflow_serial", None)
    test = getattr(CheckOverflow, "_has_inf_or_nan", None)
    if (not isinstance(checker, CheckOverflow) or method is None or test is None
            or list(inspect.signature(method).parameters) != ["self", "params"]
            or list(inspect.signature(test).parameters) != ["x", "i"]):
        logger.debug("FP16 wrapper's overflow check left as DeepSpeed wrote it: not the CheckOverflow this module replaces")
        return False
    checker.has_overflow_serial = types.MethodType(_has_overflow_serial, checker)
    return True


def _is_fp16_wrapper(optimizer: Any) -> bool:
    """DeepSpeed's FP16 optimizer wrappers: fused (FusedAdam underneath, the GPU runs) or not
    (any other optimizer, e.g. torch's AdamW on the CPU); both check overflow the same way."""
    try:
        from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
        from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    except ImportError:  # pragma: no cover - DeepSpeed is a dependency
        return False
    return isinstance(optimizer, (FP16_Optimizer, FP16_UnfusedOptimizer))


def keep_step_on_device(engine: Any) -> bool:
    """Replace the host waits of ``engine``'s ZeRO-1/2 optimizer step and its gradient norm's
    per-tensor loop (module docstring); for
    DeepSpeed's FP16 optimizer wrapper (ZeRO-0 with 16-bit weights), read its overflow check
    once instead of once per parameter tensor. Returns whether it did; the reason it did not is
    logged at debug level."""
    optimizer = getattr(engine, "optimizer", None)
    if _is_fp16_wrapper(optimizer):
        return _one_overflow_read(optimizer)
    why = _why_not(optimizer)
    if why:
        logger.debug("ZeRO step left as DeepSpeed wrote it: %s", why)
        return False
    # a module-level name of DeepSpeed's ZeRO-1/2 file, called by get_grad_norm_direct: same
    # values for every caller in the process
    _zero12_module().mask_nan_or_inf_with_val_inplace = mask_nonfinite_
    optimizer.unscale_and_clip_grads = types.MethodType(_unscale_and_clip_grads, optimizer)
    if ONE_CALL_NORM:
        optimizer.get_grad_norm_direct = types.MethodType(_grad_norm_direct, optimizer)
    return True


def restore_deepspeed_mask() -> None:
    """Put DeepSpeed's own norm mask back in its ZeRO-1/2 module (the one process-wide piece
    :func:`keep_step_on_device` replaces): for measuring DeepSpeed's step as written, after an
    engine of the same process had its step kept on the device."""
    from deepspeed.runtime import utils as ds_utils

    _zero12_module().mask_nan_or_inf_with_val_inplace = ds_utils.mask_nan_or_inf_with_val_inplace

