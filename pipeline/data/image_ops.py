"""Batched resized crop + normalisation of decoded images of any sizes: one Triton kernel a batch.

Design: the training crop of the GPU decode path (:mod:`pipeline.data.gpu_decode`). The decoder gives
one uint8 [3, H_i, W_i] tensor an image, every image its own size, and each image has its own
crop box; a per-image ``interpolate`` would cost the host a few launches an image (thousands a
batch). The images are laid end to end in one flat buffer and a single kernel resamples every
(image, output pixel) pair from its box straight into the batch, rounds to uint8 levels as the
CPU path does, and normalises into the model's dtype. An image in the buffer is three planes or
one plane of interleaved pixels (a decoder's interleaved output); the kernel reads either.

The filter is torch's antialiased bilinear one (``interpolate(mode="bilinear", antialias=True,
align_corners=False)``, PIL's triangle filter): along each axis, with ``scale = box side / size``
and ``support = max(scale, 1)``, output pixel ``i`` has centre ``c = scale (i + 0.5)`` and reads
input pixels ``j`` in ``[floor(c - support + 0.5), floor(c + support + 0.5))`` (clipped to the
box) with weights ``max(0, 1 - |j - c + 0.5| / max(scale, 1))``, normalised to sum 1. The two
axes' weights multiply (the filter is separable), so the kernel's value equals the two passes'
up to fp32 rounding. The CPU path resizes uint8 with torch's fixed-point filter, which rounds
between its two passes: the two paths' levels differ by at most one or two (the CPU tests
compare against the float reference below, exactly, and against the CPU path's own crop).

Two kernels give these values (``KERNEL``). ``"point"``: a lane an output pixel, looping over a
square of taps (``taps`` per axis, from the image's downscale), so its loads grow with the square
of the downscale factor. ``"band"``: a program a band of output rows, each input row the band
reaches filtered along x once and added into the rows it weighs in, so its loads grow with the
factor, not its square; they sum in another order, which may move a level's rounding (at most one
level). ``python bench/bench_crop_kernel.py`` times the two on the loader's batches. Either way,
images are grouped by the taps they need, one launch a group, so one huge photo does not slow the
rest of the batch.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import triton
import triton.language as tl

__all__ = ["normalize_pixels", "resized_crop_normalize", "resized_crop_normalize_flat", "resized_crop_normalize_reference",
           "taps_for", "upload"]

_BLOCK = 256
_ROWS = 8
_BAND_WARPS = 8  # sm_90: 109 registers a thread against 184 with 4 warps, so twice the threads stay resident
KERNEL = "point"


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on ``device``, queued on the current stream without the host waiting.

    On CUDA a copy from pageable memory (``torch.tensor(..., device=...)``, or ``.to`` of an
    unpinned tensor, ``non_blocking`` or not) first waits for everything already queued on the
    stream: on the decode stage's stream that is the batch's decode, which under a training step
    takes about a step. Staged through pinned memory, the copy is only queued (the pinned block is
    kept until the copy has run)."""
    if device.type != "cuda":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


@triton.jit
def _axis_range(i, scale, side):
    """Along one axis: the filter's centre, first input index, end index and inverse width for
    output positions ``i`` of a box of ``side`` input pixels resized by ``scale`` (box / output)."""
    support = tl.maximum(scale, 1.0)
    centre = scale * (i.to(tl.float32) + 0.5)
    lo = tl.maximum(tl.floor(centre - support + 0.5), 0.0).to(tl.int32)
    hi = tl.minimum(tl.floor(centre + support + 0.5).to(tl.int32), side)
    return centre, lo, hi, 1.0 / support


@triton.jit
def _tap_weight(j, centre, inv):
    """The triangle filter's weight of input pixel ``j`` (fp32) for an output pixel of filter centre
    ``centre`` and inverse width ``inv`` (:func:`_axis_range`), before normalisation."""
    return tl.maximum(1.0 - tl.abs((j - centre + 0.5) * inv), 0.0)


@triton.jit
def _meta_row(row):
    """One image's meta row: its offset in the buffer, W, the box (x, y, w, h), its row of the output
    and its channel and pixel steps (the row's H, at ``row + 1``, the steps already hold)."""
    return (tl.load(row), tl.load(row + 2).to(tl.int32), tl.load(row + 3).to(tl.int32), tl.load(row + 4).to(tl.int32),
            tl.load(row + 5).to(tl.int32), tl.load(row + 6).to(tl.int32), tl.load(row + 7), tl.load(row + 8),
            tl.load(row + 9).to(tl.int32))


@triton.jit
def _level(ptr):
    """The uint8 at ``ptr`` as an fp32 level without an integer-to-float conversion instruction
    (a sixteenth of the FMA rate on sm_90, and the point kernel makes three a tap): the byte placed
    in the mantissa of 2^23 and 2^23 taken away, exact for 0-255."""
    bits = tl.load(ptr).to(tl.int32) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _resized_crop_kernel(src_ptr, meta_ptr, out_ptr, mean_ptr, std_ptr, S: tl.constexpr, TAPS: tl.constexpr,
                         BLOCK: tl.constexpr):
    """out[dest, c, oy, ox] = ((round(sum_{y,x} wy wx src[c, by + y, bx + x]) / 255) - mean_c) / std_c
    for one image's BLOCK output pixels; meta row: (offset, H, W, bx, by, bw, bh, dest, channel step,
    pixel step): planar images (3 planes) step H * W bytes between channels and 1 between pixels,
    interleaved ones (RGB RGB ...) 1 and 3.

    The x taps are unrolled, so their weights and offsets are computed once, outside the loop over
    the rows (the compiler hoists them), and a tap past the filter's end reads the last pixel inside
    it with weight 0 rather than a masked load: every load is in the box, none is predicated."""
    base, W, bx, by, bw, bh, dest, cstep, pstep = _meta_row(meta_ptr + tl.program_id(0) * 10)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < S * S
    oy = idx // S
    ox = idx % S
    cy, ylo, yhi, inv_y = _axis_range(oy, bh.to(tl.float32) / S, bh)
    cx, xlo, xhi, inv_x = _axis_range(ox, bw.to(tl.float32) / S, bw)
    acc0 = tl.zeros([BLOCK], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    wy_sum = tl.zeros([BLOCK], dtype=tl.float32)
    wx_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for tx in tl.static_range(TAPS):
        x = xlo + tx
        wx_sum += tl.where(x < xhi, _tap_weight(x.to(tl.float32), cx, inv_x), 0.0)
    src = src_ptr + base
    for ty in range(TAPS):
        y = ylo + ty
        wy = tl.where(y < yhi, _tap_weight(y.to(tl.float32), cy, inv_y), 0.0)
        wy_sum += wy
        line = src + (by + tl.minimum(y, yhi - 1)).to(tl.int64) * W * pstep
        for tx in tl.static_range(TAPS):
            x = xlo + tx
            wx = tl.where(x < xhi, _tap_weight(x.to(tl.float32), cx, inv_x), 0.0)
            w = wy * wx
            ptr = line + (bx + tl.minimum(x, xhi - 1)) * pstep
            acc0 += w * _level(ptr)
            acc1 += w * _level(ptr + cstep)
            acc2 += w * _level(ptr + 2 * cstep)
    norm = 1.0 / tl.maximum(wy_sum * wx_sum, 1e-30)  # lanes past the image's last pixel sum to 0
    out = out_ptr + dest * (3 * S * S) + idx
    _store_level(out, acc0 * norm, mean_ptr, std_ptr, 0, S, inside)
    _store_level(out, acc1 * norm, mean_ptr, std_ptr, 1, S, inside)
    _store_level(out, acc2 * norm, mean_ptr, std_ptr, 2, S, inside)


@triton.jit
def _resized_crop_band_kernel(src_ptr, meta_ptr, out_ptr, mean_ptr, std_ptr, S: tl.constexpr, TAPS: tl.constexpr,
                              ROWS: tl.constexpr, COLS: tl.constexpr):
    """The same values as :func:`_resized_crop_kernel` for ROWS whole output rows of one image,
    the filter's two axes applied in turn: each input row the band's rows reach is filtered along
    x once (TAPS loads an output column), then added into every output row it weighs in. A
    downscale by ``s`` thus reads about ``(ROWS s + 2 s) / ROWS`` input rows' x-sums an output pixel
    instead of ``TAPS`` rows of ``TAPS`` pixels; same meta rows."""
    base, W, bx, by, bw, bh, dest, cstep, pstep = _meta_row(meta_ptr + tl.program_id(0) * 10)
    oy = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    ox = tl.arange(0, COLS)
    row_ok = oy < S
    col_ok = ox < S
    cy, ylo, yhi, inv_y = _axis_range(oy, bh.to(tl.float32) / S, bh)
    cx, xlo, xhi, inv_x = _axis_range(ox, bw.to(tl.float32) / S, bw)
    wx_sum = tl.zeros([COLS], dtype=tl.float32)
    for tx in tl.static_range(TAPS):
        x = xlo + tx
        wx = _tap_weight(x.to(tl.float32), cx, inv_x)
        wx_sum += tl.where(x < xhi, wx, 0.0)
    y_first = tl.min(tl.where(row_ok, ylo, bh), axis=0)
    y_end = tl.max(tl.where(row_ok, yhi, 0), axis=0)
    acc0 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc1 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc2 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    wy_sum = tl.zeros([ROWS], dtype=tl.float32)
    for y in range(y_first, y_end):
        line = base + ((by + y).to(tl.int64) * W + bx) * pstep
        h0 = tl.zeros([COLS], dtype=tl.float32)
        h1 = tl.zeros([COLS], dtype=tl.float32)
        h2 = tl.zeros([COLS], dtype=tl.float32)
        for tx in tl.static_range(TAPS):
            x = xlo + tx
            wx = tl.where(col_ok & (x < xhi), _tap_weight(x.to(tl.float32), cx, inv_x), 0.0)
            ptr = src_ptr + line + tl.minimum(x, xhi - 1) * pstep  # in the box: no predicated load
            h0 += wx * _level(ptr)
            h1 += wx * _level(ptr + cstep)
            h2 += wx * _level(ptr + 2 * cstep)
        wy = _tap_weight(y + 0.0, cy, inv_y)  # y + 0.0: fp32 (a Python int when interpreted)
        wy = tl.where(row_ok & (y >= ylo) & (y < yhi), wy, 0.0)
        wy_sum += wy
        acc0 += wy[:, None] * h0[None, :]
        acc1 += wy[:, None] * h1[None, :]
        acc2 += wy[:, None] * h2[None, :]
    norm = 1.0 / tl.maximum(wy_sum[:, None] * wx_sum[None, :], 1e-30)
    inside = row_ok[:, None] & col_ok[None, :]
    out = out_ptr + dest * (3 * S * S) + oy[:, None] * S + ox[None, :]
    _store_level(out, acc0 * norm, mean_ptr, std_ptr, 0, S, inside)
    _store_level(out, acc1 * norm, mean_ptr, std_ptr, 1, S, inside)
    _store_level(out, acc2 * norm, mean_ptr, std_ptr, 2, S, inside)


@triton.jit
def _store_level(out, value, mean_ptr, std_ptr, c: tl.constexpr, S: tl.constexpr, mask):
    """Round ``value`` to a uint8 level (as the CPU path's uint8 crop is), normalise, store channel c."""
    level = tl.minimum(tl.maximum(tl.floor(value + 0.5), 0.0), 255.0)
    normed = (level / 255.0 - tl.load(mean_ptr + c)) / tl.load(std_ptr + c)
    tl.store(out + c * S * S, normed.to(out.dtype.element_ty), mask=mask)


def normalize_pixels(pixels: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [B, 3, H, W] (on any device) -> ``dtype`` (x / 255 - mean) / std, computed in fp32."""
    m = upload(torch.tensor(mean, dtype=torch.float32), pixels.device).view(1, 3, 1, 1)
    sd = upload(torch.tensor(std, dtype=torch.float32), pixels.device).view(1, 3, 1, 1)
    return pixels.float().div_(255.0).sub_(m).div_(sd).to(dtype)


def taps_for(sides: torch.Tensor, size: int) -> torch.Tensor:
    """Input pixels the filter can span along an axis of ``sides`` pixels resized to ``size``
    (a kernel is compiled per value: a handful, for the downscales a data set has)."""
    return (torch.ceil(2 * torch.clamp(sides.double() / size, min=1.0)) + 1).long()


def resized_crop_normalize(images: Sequence[torch.Tensor], boxes: Any, out: torch.Tensor, dest: Any,
                           mean: Sequence[float], std: Sequence[float], sizes: Optional[torch.Tensor] = None
                           ) -> torch.Tensor:
    """Write image ``k``'s box ``boxes[k]`` = (x, y, w, h), resized to ``out``'s side, rounded to
    uint8 levels and normalised, into ``out[dest[k]]``.

    Args:
        images: uint8 [3, H_k, W_k] tensors on ``out``'s device (contiguous), any sizes.
        boxes: int64 [n, 4] (or n 4-sequences): per image (x, y, w, h) inside it (w, h >= 1).
        out: [B, 3, S, S] float tensor (any float dtype) on the images' device; written in place.
        dest: int64 [n] (or n ints): per image, its row of ``out``.
        mean, std: per-channel normalisation of levels / 255.
        sizes: int64 [n, 2], each image's (W, H) when known (else read from the images); the
            bookkeeping is a few tensor operations whatever n, no Python loop over the images.
    Returns:
        ``out``.
    """
    n = len(images)
    if n == 0:
        return out
    boxes = torch.as_tensor(boxes, dtype=torch.int64).reshape(-1, 4)
    dest = torch.as_tensor(dest, dtype=torch.int64).reshape(-1)
    if sizes is None:
        sizes = torch.tensor([[im.shape[-1], im.shape[-2]] for im in images], dtype=torch.int64)
    if boxes.shape[0] != n or dest.shape[0] != n or sizes.shape != (n, 2):
        raise ValueError(f"{n} images need as many boxes, destinations and sizes, got {boxes.shape[0]}, "
                         f"{dest.shape[0]} and {tuple(sizes.shape)}")
    size = out.shape[-1]
    if out.dim() != 4 or out.shape[1] != 3 or out.shape[2] != size or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [B, 3, S, S] tensor, got {tuple(out.shape)}")
    numel = 3 * sizes[:, 0] * sizes[:, 1]
    flat = torch.cat([im.view(-1) for im in images])
    if flat.dtype != torch.uint8 or flat.numel() != int(numel.sum()):
        raise ValueError("images must be uint8 [3, H, W] tensors of the given sizes")
    return resized_crop_normalize_flat(flat, torch.cumsum(numel, 0) - numel, sizes, boxes, out, dest, mean, std)


def resized_crop_normalize_flat(flat: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor,
                                out: torch.Tensor, dest: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                                interleaved: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`resized_crop_normalize` on images already laid in one buffer: image ``k``'s uint8
    [3, H_k, W_k] planes start at ``flat[starts[k]]`` (int64 [n] on the CPU), or, where
    ``interleaved[k]`` (bool [n]), its [H_k, W_k, 3] pixels; ``sizes``, ``boxes`` and ``dest`` as
    there (int64 CPU tensors)."""
    size = out.shape[-1]
    W, H = sizes.unbind(1)
    x, y, w, h = boxes.unbind(1)
    outside = (x < 0) | (y < 0) | (w < 1) | (h < 1) | (x + w > W) | (y + h > H)
    if bool(outside.any()):
        k = int(outside.nonzero()[0])
        raise ValueError(f"image {k}: box {tuple(boxes[k].tolist())} outside its {int(W[k])} x {int(H[k])} pixels")
    plane = H * W
    if interleaved is None:
        cstep, pstep = plane, torch.ones_like(plane)
    else:
        cstep, pstep = torch.where(interleaved, 1, plane), torch.where(interleaved, 3, 1)
    meta = torch.stack([starts, H, W, x, y, w, h, dest, cstep, pstep], 1)
    taps = taps_for(torch.maximum(w, h), size)
    m = upload(torch.tensor(list(mean), dtype=torch.float32), out.device)
    s = upload(torch.tensor(list(std), dtype=torch.float32), out.device)
    for t in taps.unique().tolist():
        members = taps == t
        part = upload(meta if bool(members.all()) else meta[members], out.device)
        if KERNEL == "band":
            grid = (part.shape[0], triton.cdiv(size, _ROWS))
            _resized_crop_band_kernel[grid](flat, part, out, m, s, S=size, TAPS=t, ROWS=_ROWS,
                                            COLS=triton.next_power_of_2(size), num_warps=_BAND_WARPS)
        else:
            grid = (part.shape[0], triton.cdiv(size * size, _BLOCK))
            _resized_crop_kernel[grid](flat, part, out, m, s, S=size, TAPS=t, BLOCK=_BLOCK)
    return out


def resized_crop_normalize_reference(images: Sequence[torch.Tensor], boxes: Sequence[Sequence[int]], size: int,
                                     mean: Sequence[float], std: Sequence[float],
                                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The same in plain torch, one image at a time: fp32 ``interpolate`` (bilinear, antialias),
    rounded to levels, normalised. [n, 3, size, size] in ``dtype``."""
    m = torch.tensor(list(mean), dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(list(std), dtype=torch.float32).view(3, 1, 1)
    outs = []
    for im, (x, y, w, h) in zip(images, boxes):
        crop = im[:, y:y + h, x:x + w].float().cpu()[None]
        resized = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                                                  align_corners=False)[0]
        level = resized.add(0.5).floor_().clamp_(0, 255)
        outs.append(((level / 255.0 - m) / s).to(dtype))
    return torch.stack(outs) if outs else torch.empty(0, 3, size, size, dtype=dtype)
