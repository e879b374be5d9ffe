"""Image and text features of a ``pipeline.model.model.CLIPTowers`` for evaluation.

Design: features are taken through the model's ``forward`` (``model(pixel_values=...)``,
``model(input_ids=..., attention_mask=...)``), not ``encode_image`` / ``encode_text``. Under
ZeRO-3 the root module's forward hook starts DeepSpeed's per-pass parameter bookkeeping; calling
a tower method directly skips it, and HF's CLIP text embeddings then read the shape of a still
partitioned (empty) position table and fail. Through ``forward`` the same code serves a plain
model, a ZeRO-0/1/2 engine's module and a ZeRO-3 one. Limit: one tower per call (the other
input is None), so a ZeRO-3 pass gathers only that tower's weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["image_features", "text_features", "idle_forward"]


def image_features(model, pixel_values: Tensor) -> Tensor:
    """[B,3,H,W] -> L2-normalised [B,E] fp32."""
    return model(pixel_values=pixel_values)[0].float()


def text_features(model, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B,L] ids and mask -> L2-normalised [B,E] fp32."""
    return model(input_ids=input_ids, attention_mask=attention_mask)[1].float()


def idle_forward(model, device, dtype, text: bool = False) -> None:
    """A one-row dummy forward for a rank that ran out of data, so ZeRO-3's parameter-gathering
    collectives stay in step with the ranks still evaluating (image tower, and text if asked)."""
    size = int(model.image_size)
    image_features(model, torch.zeros(1, 3, size, size, device=device, dtype=dtype))
    if text:
        ones = torch.ones(1, 2, dtype=torch.long, device=device)
        text_features(model, ones, ones)
