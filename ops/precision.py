"""Matmul precision for the loss's GEMMs: exact fp32 unless TF32 is asked for.

One role: a context manager that sets torch's global TF32 switches for the duration of a loss
call and restores them, so ``allow_tf32`` in the loss config never leaks into the caller's
matmuls. Limit: the switches are process-global, so another thread's matmuls during the call
see them too.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["matmul_precision"]


@contextlib.contextmanager
def matmul_precision(allow_tf32: bool):
    """fp32 matmuls exact (ieee) unless ``allow_tf32``; restores the global flags."""
    old_cuda = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_cuda
        torch.backends.cudnn.allow_tf32 = old_cudnn
