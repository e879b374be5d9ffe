"""The contrastive loss: block primitives, a registered torch.library op, distributed schemes.

Public API: :func:`contrastive_loss` (functional), :class:`ContrastiveLoss` (module built
from the ``contrastive_loss`` config section), :class:`ContrastiveLossConfig`.
"""

from .config import ConfigError, ContrastiveLossConfig, parse_section
from .contrastive_loss import ContrastiveLoss, contrastive_loss, contrastive_loss_reference, resolve_impl

__all__ = [
    "ConfigError",
    "ContrastiveLoss",
    "ContrastiveLossConfig",
    "contrastive_loss",
    "contrastive_loss_reference",
    "parse_section",
    "resolve_impl",
]
