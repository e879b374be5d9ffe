"""infclip: CLIP pretraining on DeepSpeed with a contrastive loss that never builds B x B.

The project's folders ``ops/``, ``pipeline/`` and ``eval/`` sit at the top of the repository and
install as ``infclip.ops``, ``infclip.pipeline`` and ``infclip.eval`` (pyproject.toml maps them),
so nothing with a generic name lands in site-packages. In a checkout that is not installed (the
repository root on ``sys.path``, as ``launch/`` and ``bench/`` arrange), this package's path also
covers the repository root, so the same names resolve to the folders there.

The public API: the loss (``contrastive_loss``, ``ContrastiveLoss``, ``ContrastiveLossConfig``),
the towers (``CLIPTowers``, ``ModelConfig``), a run (``load_config``, ``train``) and evaluation
(``load_model``, ``build_evaluator``, ``export_hf``, ``export_openclip``); the last two groups load on
first use.
"""

from __future__ import annotations

import importlib
import os

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops")) and \
        os.path.isfile(os.path.join(_root, "ops", "__init__.py")):
    __path__.append(_root)  # noqa: F821  (a checkout: infclip.ops -> <root>/ops)

from .ops import ContrastiveLoss, ContrastiveLossConfig, contrastive_loss  # noqa: E402

_LAZY = {
    "CLIPTowers": "infclip.pipeline.model.model", "ModelConfig": "infclip.pipeline.model.config",
    "load_config": "infclip.pipeline.config", "train": "infclip.pipeline.train.train",
    "load_model": "infclip.eval", "build_evaluator": "infclip.eval", "export_hf": "infclip.eval",
    "export_openclip": "infclip.eval",
}

__all__ = ["ContrastiveLoss", "ContrastiveLossConfig", "contrastive_loss", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'infclip' has no attribute {name!r}")
