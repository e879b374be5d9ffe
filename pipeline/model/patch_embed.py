"""The ViT patch embedding as one GEMM instead of cuDNN's strided convolution.

Why: the patch embedding is a convolution whose kernel equals its stride (no overlap), i.e. a
matrix product of the image's patches with the kernel. cuDNN runs it (bf16, 3 input channels)
with slow generic kernels: on an H200, ViT-B/32 at micro-batch 256 spent 2.1 ms per step in the
forward convolution and 3.0 ms in its weight gradient (``wgrad_alg1_engine``), 12% of a 43 ms
step, for 0.12 TFLOP of work (~0.3 ms at the GEMM rate); at 1,024, 19 ms of 142 ms (profiles of
``bench/bench_pipeline.py --profile``).

How: :func:`use_patch_gemm` gives the tower's ``Conv2d`` a forward that cuts the image into its
patches (one strided copy, ``[B * h * w, C * p * p]``), multiplies them by the kernel viewed as a
``[out, C * p * p]`` matrix, and returns the ``[B, out, h, w]`` result the convolution returns
(a view; transformers' ``flatten(2).transpose(1, 2)`` then costs nothing). The weight stays the
module's own parameter, with its name and shape: state dicts, exports and ZeRO-3's fetch (the
module's hooks run around this forward) are unchanged. Rows and columns of pixels past the last
whole patch are dropped, as the convolution drops them.
"""

from __future__ import annotations

import functools

from torch import Tensor, nn

__all__ = ["patch_gemm", "use_patch_gemm"]


def patch_gemm(conv: nn.Conv2d, pixel_values: Tensor) -> Tensor:
    """``conv(pixel_values)`` for a convolution whose kernel equals its stride, as one GEMM
    (what the GEMM does not cover, an unbatched image or one smaller than the kernel, goes to the
    convolution, which takes or refuses it as it always did)."""
    p, q = conv.kernel_size
    if pixel_values.dim() != 4 or pixel_values.shape[2] < p or pixel_values.shape[3] < q:
        return conv._conv_forward(pixel_values, conv.weight, conv.bias)
    b, c, h, w = pixel_values.shape
    rows, cols = h // p, w // q
    patches = (pixel_values[:, :, :rows * p, :cols * q]
               .reshape(b, c, rows, p, cols, q).permute(0, 2, 4, 1, 3, 5).reshape(b * rows * cols, c * p * q))
    weight = conv.weight.reshape(conv.out_channels, c * p * q)
    out = patches @ weight.T if conv.bias is None else nn.functional.linear(patches, weight, conv.bias)
    return out.view(b, rows, cols, conv.out_channels).permute(0, 3, 1, 2)


def _is_patch_conv(conv: nn.Module) -> bool:
    return (isinstance(conv, nn.Conv2d) and tuple(conv.kernel_size) == tuple(conv.stride)
            and conv.padding in ((0, 0), "valid") and tuple(conv.dilation) == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros")


def use_patch_gemm(tower: nn.Module) -> int:
    """Give every non-overlapping ``Conv2d`` (kernel == stride, no padding, dilation or groups)
    in ``tower`` the GEMM forward :func:`patch_gemm`; returns how many (idempotent)."""
    convs = [m for m in tower.modules() if _is_patch_conv(m)]
    for conv in convs:
        conv.forward = functools.partial(patch_gemm, conv)
    return len(convs)
