"""Test-wide setup. Triton reads TRITON_INTERPRET when kernels are defined, so without a GPU it
must be set before `ops` is imported (tests/run.sh sets it too)."""

import os

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
