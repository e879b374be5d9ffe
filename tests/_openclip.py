"""OpenCLIP's own code for the tests: ``import_open_clip()`` returns the ``open_clip`` module.

open_clip_torch is installed without its dependencies (``.ci/run``): it imports torchvision when
imported (``FrozenBatchNorm2d``, its image transforms), and PyPI's torchvision does not import on
the CPU torch build the tests run on (an installed but broken torchvision also breaks
transformers' image processors). Where torchvision is not importable, a stand-in module gives
open_clip the names it imports: its model code never calls them, and the transforms it builds only
record their arguments, which the tests read; it is in ``sys.modules`` only while open_clip is
imported. Without open_clip_torch the tests that need it skip.
"""

from __future__ import annotations

import enum
import sys
import types

import pytest


class _Recorded:
    """A torchvision transform that only keeps its arguments (``args``, ``kwargs``)."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _Compose(_Recorded):
    def __init__(self, transforms):
        super().__init__(transforms)
        self.transforms = list(transforms)


def _torchvision_stand_in() -> None:
    names = ("Normalize", "RandomResizedCrop", "ToTensor", "Resize", "CenterCrop", "ColorJitter", "Grayscale")
    transforms = types.ModuleType("torchvision.transforms")
    for name in names:
        setattr(transforms, name, type(name, (_Recorded,), {}))
    transforms.Compose = _Compose
    transforms.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC BOX HAMMING LANCZOS")
    transforms.functional = types.ModuleType("torchvision.transforms.functional")
    ops = types.ModuleType("torchvision.ops")
    ops.misc = types.ModuleType("torchvision.ops.misc")
    ops.misc.FrozenBatchNorm2d = type("FrozenBatchNorm2d", (), {})
    root = types.ModuleType("torchvision")
    root.transforms, root.ops = transforms, ops
    sys.modules.update({"torchvision": root, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": transforms.functional, "torchvision.ops": ops,
                        "torchvision.ops.misc": ops.misc})


def import_open_clip():
    """The ``open_clip`` module (skips the test when open_clip_torch is not installed)."""
    if "open_clip" in sys.modules:
        return sys.modules["open_clip"]
    import importlib.util

    if importlib.util.find_spec("open_clip") is None:
        pytest.skip("open_clip_torch is not installed (pip install --no-deps open_clip_torch==3.3.0 ftfy)")
    import transformers  # noqa: F401  (its torchvision check, cached, runs before any stand-in exists)

    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or installed for another torch build (it raises RuntimeError then)
        _drop_torchvision()
        _torchvision_stand_in()
        try:
            import open_clip
        finally:
            _drop_torchvision()  # open_clip keeps what it imported; nothing else finds the stand-in
    import open_clip

    return open_clip


def _drop_torchvision() -> None:
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
