"""GradCache-style chunked backbone: a per-GPU batch far larger than one forward with grad holds.

Design. For a micro-batch of B pairs split into chunks of C:
  (a) every chunk runs through both towers under ``no_grad``; the CPU (and CUDA) RNG state is
      saved before each chunk so dropout draws the same masks when the chunk is replayed;
  (b) the loss runs once on the concatenated [B,E] features, detached into leaves, together with
      detached leaves for the scale and bias: ``loss.backward()`` gives dL/dfeatures (B x E, small)
      and dL/dscale, dL/dbias (the loss itself is the tiled op, so O(B) memory);
  (c) each chunk is re-run with grad (RNG restored) and a surrogate scalar
      ``sum(img_k * g_img_k) + sum(txt_k * g_txt_k)`` is back-propagated; its gradient with
      respect to every parameter equals the chunk's share of dL/dparam, because the surrogate
      is linear in the features. The last chunk's surrogate also carries
      ``sum(scale * g_scale) + sum(bias * g_bias)``, recomputed by the model's forward so the
      gradient flows through exp/clamp into ``logit_scale``.

DeepSpeed. Every surrogate goes through ``engine.backward`` (it applies the fp16 loss scale and
the 1/gradient_accumulation_steps factor, both linear, and runs ZeRO's reduction hooks). The K
chunk backwards of one micro-batch are K gradient-accumulation passes: chunks 1..K-1 run with
``engine.set_gradient_accumulation_boundary(False)`` so ZeRO-0/1 keep the gradients local and
ZeRO-2/3 accumulate their reduced partitions; the last chunk gets the engine's own boundary
value for this micro-step (True unless real gradient accumulation continues), so the reduction
and the following ``engine.step()`` happen once. Checked against the unchunked gradients for
ZeRO 0 and 3 through real engines (tests/pipeline/test_chunked.py).

Limit: peak memory is one chunk's activations plus 2 * B * E features and their gradients; the
towers run twice (about 1.33x the compute of a plain step, like activation checkpointing).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = ["ChunkedResult", "chunked_forward_backward"]


@dataclasses.dataclass
class ChunkedResult:
    """What one chunked step produced (all detached)."""

    loss: Tensor
    """0-dim loss over the (global) batch."""
    image_features: Tensor
    """[B,E] image features of the local batch."""
    text_features: Tensor
    """[B,E] text features of the local batch."""
    loss_op_ms: float
    """Wall time of the loss forward + backward on the full features (step b)."""
    num_chunks: int
    logit_scale: float
    """The logit scale multiplier the loss used."""


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _slices(n: int, chunk: int):
    return [slice(i, min(i + chunk, n)) for i in range(0, n, chunk)]


def _features_without_grad(run: Callable, slices: list, device: torch.device):
    """Step (a): every chunk's features under no_grad, and the RNG state each chunk started from
    (and the state after the last). Returns (states, img [B,E], txt [B,E], scale, bias, end_state)."""
    states, imgs, txts = [], [], []
    with torch.no_grad(), warnings.catch_warnings():
        # activation checkpointing sees inputs without grad here, as intended: it says so per block
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad=True")
        for sl in slices:
            states.append(_rng_state(device))
            img, txt, scale, bias = run(sl)
            imgs.append(img)
            txts.append(txt)
    return states, torch.cat(imgs), torch.cat(txts), scale, bias, _rng_state(device)


def _replay_chunks(run: Callable, slices: list, states: list, grads: tuple, engine: Any,
                   device: torch.device) -> None:
    """Step (c): each chunk again with grad (its RNG state restored), back-propagating the
    surrogate whose parameter gradient is the chunk's share of dL/dparam; the last chunk also
    carries the scale's and bias's terms and the engine's own accumulation boundary."""
    g_img, g_txt, g_scale, g_bias = grads
    boundary = None
    if engine is not None:
        boundary = (engine.micro_steps + 1) % engine.gradient_accumulation_steps() == 0
    for k, (sl, state) in enumerate(zip(slices, states)):
        last = k == len(slices) - 1
        _set_rng_state(state, device)
        img, txt, scale, bias = run(sl)
        surrogate = (img * g_img[sl].to(img.dtype)).sum() + (txt * g_txt[sl].to(txt.dtype)).sum()
        if last and g_scale is not None:
            surrogate = surrogate + (scale * g_scale.to(scale.dtype)).sum()
        if last and g_bias is not None:
            surrogate = surrogate + (bias * g_bias.to(bias.dtype)).sum()
        if engine is not None:
            engine.set_gradient_accumulation_boundary(boundary if last else False)
            engine.backward(surrogate.float())
        else:
            surrogate.backward()
        del img, txt, surrogate


def chunked_forward_backward(model: Callable, pixel_values: Tensor, input_ids: Tensor,
                             attention_mask: Optional[Tensor], loss_fn: Callable[..., Tensor],
                             chunk_size: int, *, engine: Any = None) -> ChunkedResult:
    """Forward and backward of one micro-batch in chunks; gradients land where ``backward`` puts them.

    Args:
        model: callable ``(pixel_values [C,3,H,W], input_ids [C,L], attention_mask [C,L]) ->
            (img [C,E], txt [C,E], scale [1], bias [1])`` (a ``CLIPTowers`` or the DeepSpeed
            engine wrapping one).
        pixel_values, input_ids, attention_mask: the micro-batch, B rows each.
        loss_fn: ``(img [B,E], txt [B,E], scale, bias) -> 0-dim loss`` (a ``ContrastiveLoss``).
        chunk_size: rows per chunk (>= 1; >= B means one chunk).
        engine: a DeepSpeed engine; when given its ``backward`` is used with gradient
            accumulation boundaries set as described in the module docstring. Without it the
            surrogates are back-propagated with plain autograd (gradients accumulate in ``.grad``).
    Returns:
        :class:`ChunkedResult`; call ``engine.step()`` (or the optimizer) afterwards.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n = pixel_values.shape[0]
    if input_ids.shape[0] != n or (attention_mask is not None and attention_mask.shape[0] != n):
        raise ValueError(f"batch mismatch: pixel_values {tuple(pixel_values.shape)}, input_ids "
                         f"{tuple(input_ids.shape)}")
    device = pixel_values.device
    slices = _slices(n, chunk_size)

    def run(sl):
        mask = attention_mask[sl] if attention_mask is not None else None
        return model(pixel_values[sl], input_ids[sl], mask)

    states, img, txt, scale, bias, end_state = _features_without_grad(run, slices, device)

    # (b) the loss on full features, with leaves for everything it differentiates
    img_all, txt_all = img.detach().requires_grad_(True), txt.detach().requires_grad_(True)
    scale_leaf = scale.detach().clone().requires_grad_(True)
    bias_leaf = bias.detach().clone().requires_grad_(True)
    scale_value = float(scale_leaf.detach().float().reshape(-1)[0])
    t0 = time.perf_counter()
    loss = loss_fn(img_all, txt_all, scale_leaf, bias_leaf)
    if not torch.isfinite(loss.detach()).all():
        return ChunkedResult(loss.detach(), img_all.detach(), txt_all.detach(),
                             (time.perf_counter() - t0) * 1e3, len(slices), scale_value)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    loss_op_ms = (time.perf_counter() - t0) * 1e3

    # (c) (the scale's and bias's gradients are None where the loss does not use them)
    grads = (img_all.grad, txt_all.grad, scale_leaf.grad, bias_leaf.grad)
    _replay_chunks(run, slices, states, grads, engine, device)
    _set_rng_state(end_state, device)
    return ChunkedResult(loss.detach(), img_all.detach(), txt_all.detach(), loss_op_ms, len(slices), scale_value)
