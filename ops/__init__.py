"""The contrastive loss: block primitives, Triton kernels, sweeps (one per scheme), the loss
assembly written once against a sweep, one registered torch.library op for every scheme.

Public API: :func:`contrastive_loss` (functional), :func:`distributed_contrastive_loss` (one
scheme spelled out), :class:`ContrastiveLoss` (module built from the ``contrastive_loss``
config section), :class:`ContrastiveLossConfig`. Knobs (kernel choice, tiles, memory rules):
``infclip.ops.tuning`` (one :class:`~infclip.ops.tuning.Tuning` object, ``with tuning(...)``).
"""

from .config import ConfigError, ContrastiveLossConfig, parse_section
from .contrastive_loss import (
    ContrastiveLoss,
    contrastive_loss,
    contrastive_loss_reference,
    distributed_contrastive_loss,
    resolve_impl,
)

__all__ = [
    "ConfigError",
    "ContrastiveLoss",
    "ContrastiveLossConfig",
    "contrastive_loss",
    "contrastive_loss_reference",
    "distributed_contrastive_loss",
    "parse_section",
    "resolve_impl",
]
