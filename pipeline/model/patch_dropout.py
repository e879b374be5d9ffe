"""Patch dropout: in training, the image tower sees a random subset of each image's patches.

Why: a ViT's cost grows with its token count (linearly in the projections and MLPs, quadratically
in attention), and most of a CLIP step is the image tower. FLIP (Li et al., "Scaling
Language-Image Pre-training via Masking", 2023) trains with 50-75% of the patches removed at a
small cost in accuracy, made up by more samples in the same GPU hours or a short unmasked tuning
at the end; OpenCLIP calls it ``patch_dropout``. ``model.patch_dropout: 0.5`` is the
usual setting.

How: :func:`use_patch_dropout` gives the tower's embedding module a forward that, in training
mode, keeps the class token and :func:`kept_patches` patch tokens of each image, a subset drawn
uniformly without replacement per image, after the position embeddings are added (each kept token
keeps its place in the image). The rest of the tower is unchanged: it takes however many tokens
arrive, and pools the class token. In evaluation mode (zero-shot, retrieval, export) every patch
is seen. The draw uses torch's generator on the images' device, so a resumed run (which restores
each rank's RNG state) and the chunked backbone's second forward (which replays it) draw the same
subsets. Compiled, the draw is inductor's own (seeded from that generator: new subsets each step,
the same from the same seed); replayed as a CUDA graph (``compile_mode: "reduce-overhead"``), each
replay advances the generator's offset by what the capture drew (torch's graph-safe RNG), so replays
draw anew too, and the same from the same seed (tests/pipeline/test_patch_dropout.py, both modes, on
a GPU). The patch embedding still runs over every patch (about 1% of a ViT-B/16's FLOPs).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

__all__ = ["drop_patches", "kept_patches", "use_patch_dropout"]


def kept_patches(patches: int, fraction: float) -> int:
    """Patch tokens an image keeps when ``fraction`` of its ``patches`` are dropped: rounded down,
    and at least one. OpenCLIP also rounds down, but on the float product, so that 100 x (1 - 0.9)
    = 9.999... keeps 9 there; the epsilon here keeps the exact 10."""
    return max(1, math.floor(patches * (1.0 - fraction) + 1e-6))


def drop_patches(tokens: Tensor, keep: int) -> Tensor:
    """[B, 1 + N, D] tokens (class token first) -> [B, 1 + keep, D]: the class token, then ``keep``
    of the N patch tokens, a uniform random subset per row (in a random order: the tower does not
    depend on the order, position embeddings being added already)."""
    b, n, d = tokens.shape
    if keep >= n - 1:
        return tokens
    chosen = torch.rand(b, n - 1, device=tokens.device).topk(keep, dim=1).indices + 1
    patches = tokens.gather(1, chosen.unsqueeze(-1).expand(b, keep, d))
    return torch.cat([tokens[:, :1], patches], dim=1)


def use_patch_dropout(embeddings: nn.Module, fraction: float) -> None:
    """Make ``embeddings`` (a ViT's embedding module: pixels -> [B, 1 + N, D] tokens, class
    token first) return :func:`drop_patches` of its tokens while it is in training mode."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"patch dropout must be in [0, 1), got {fraction}")
    if fraction == 0.0:
        return
    forward: Callable[..., Tensor] = embeddings.forward

    def dropped(*args, **kwargs) -> Tensor:
        tokens = forward(*args, **kwargs)
        if not embeddings.training:
            return tokens
        return drop_patches(tokens, kept_patches(tokens.shape[1] - 1, fraction))

    embeddings.forward = dropped
