"""DeepSpeed's ZeRO-1/2 optimizer step without host waits.

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

It applies only to DeepSpeed's ``DeepSpeedZeroOptimizer`` (ZeRO stages 1 and 2) with bf16 or
fp32 weights and no offload; fp16's dynamic loss scale needs the host to know about an overflow,
and another optimizer is left as DeepSpeed built it. If DeepSpeed's code changes shape (the
functions are not where this module expects them) nothing is replaced and the reason is logged.

ZeRO-3 with one rank per partition group (one GPU) fetches a module's parameters without a
gather: the "handle" points each parameter at its own partition (``.to(device)``, no copy when the
partition is on the device already), then its ``wait()`` synchronises the device, once per fetch:
twice per block and step (forward and backward), each draining the GPU's queue.
:func:`keep_fetch_on_device` replaces those two ``wait`` methods (process-wide) by ones that skip
the synchronisation when no parameter of the handle was copied (every partition already on the
parameter's device); with an offloaded partition (a host-to-device copy) they wait as before.
"""

from __future__ import annotations

import inspect
import logging
import types
from typing import Any

import torch

__all__ = ["keep_step_on_device", "restore_deepspeed_mask", "mask_nonfinite_", "clip_scale", "keep_fetch_on_device",
           "restore_deepspeed_fetch"]

logger = logging.getLogger(__name__)


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
    if original is None or list(inspect.signature(original).parameters) != ["input", "device", "val"]:
        return "DeepSpeed's mask_nan_or_inf_with_val_inplace is not the one this module replaces"
    method = getattr(type(optimizer), "unscale_and_clip_grads", None)
    if method is None or list(inspect.signature(method).parameters) != ["self", "grad_groups_flat", "total_norm"]:
        return "DeepSpeed's unscale_and_clip_grads is not the one this module replaces"
    return ""


def keep_step_on_device(engine: Any) -> bool:
    """Replace the host waits of ``engine``'s ZeRO-1/2 optimizer step (module docstring).
    Returns whether it did; the reason it did not is logged at debug level."""
    optimizer = getattr(engine, "optimizer", None)
    why = _why_not(optimizer)
    if why:
        logger.debug("ZeRO step left as DeepSpeed wrote it: %s", why)
        return False
    # a module-level name of DeepSpeed's ZeRO-1/2 file, called by get_grad_norm_direct: same
    # values for every caller in the process
    _zero12_module().mask_nan_or_inf_with_val_inplace = mask_nonfinite_
    optimizer.unscale_and_clip_grads = types.MethodType(_unscale_and_clip_grads, optimizer)
    return True


def restore_deepspeed_mask() -> None:
    """Put DeepSpeed's own norm mask back in its ZeRO-1/2 module (the one process-wide piece
    :func:`keep_step_on_device` replaces): for measuring DeepSpeed's step as written, after an
    engine of the same process had its step kept on the device."""
    from deepspeed.runtime import utils as ds_utils

    _zero12_module().mask_nan_or_inf_with_val_inplace = ds_utils.mask_nan_or_inf_with_val_inplace


# ----------------------------------------------------------------------------------------------
# ZeRO-3 on one rank: the fetch without a device synchronisation
# ----------------------------------------------------------------------------------------------
_DEEPSPEED_WAITS: dict = {}


def _handle_params(handle: Any) -> list:
    """The parameters of one of DeepSpeed's no-gather handles (its private attributes)."""
    one = getattr(handle, "_NoGatherHandle__param", None)
    return [one] if one is not None else list(getattr(handle, "_NoGatherCoalescedHandle__params", ()))


def _completed(handle: Any) -> str:
    return "_NoGatherHandle__complete" if hasattr(handle, "_NoGatherHandle__complete") else \
        "_NoGatherCoalescedHandle__complete"


def _wait_unless_copied(self, **kwargs) -> None:
    """DeepSpeed's no-gather ``wait()``, synchronising the device only when a partition had to be
    copied to it."""
    params = _handle_params(self)
    if not params or any(p.ds_tensor.device != p.data.device for p in params):
        return _DEEPSPEED_WAITS[type(self).__name__](self, **kwargs)
    flag = _completed(self)
    if getattr(self, flag):
        return None
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    for p in params:
        p.ds_status = ZeroParamStatus.AVAILABLE
    setattr(self, flag, True)
    return None


def _no_gather_handles() -> list:
    """DeepSpeed's two no-gather handle classes, if they are where this module expects them."""
    try:
        from deepspeed.runtime.zero import partition_parameters as pp
    except ImportError:  # pragma: no cover - DeepSpeed is a dependency
        return []
    # (a handle whose parameters are not found under the expected private names is left to
    # DeepSpeed's own wait: see _wait_unless_copied)
    classes = [getattr(pp, name, None) for name in ("NoGatherHandle", "NoGatherCoalescedHandle")]
    return [] if any(c is None or not callable(getattr(c, "wait", None)) for c in classes) else classes


def keep_fetch_on_device() -> bool:
    """Replace the device synchronisation of ZeRO-3's one-rank fetch (module docstring), for the
    whole process. Returns whether it did (False when DeepSpeed's handles are not the expected
    ones: nothing is replaced)."""
    classes = _no_gather_handles()
    for cls in classes:
        _DEEPSPEED_WAITS.setdefault(cls.__name__, cls.wait)
        cls.wait = _wait_unless_copied
    if not classes:
        logger.debug("ZeRO-3 fetch left as DeepSpeed wrote it: its no-gather handles are not the expected ones")
    return bool(classes)


def restore_deepspeed_fetch() -> None:
    """Put DeepSpeed's own ``wait()`` back on its no-gather handles."""
    for cls in _no_gather_handles():
        if cls.__name__ in _DEEPSPEED_WAITS:
            cls.wait = _DEEPSPEED_WAITS[cls.__name__]
