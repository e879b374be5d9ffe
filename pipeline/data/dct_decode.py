"""JPEG decoding on the GPU in the DCT domain, at the scale the crop needs: Huffman decoding with
one lane per image, then the reduced inverse DCT and the colour conversion with one lane per pixel.

Why: a crop of 0.9-1.0 of a 512-px JPEG resized to 224 px needs only half the JPEG's resolution.
A JPEG's 8x8 blocks hold that half in their 4x4 lowest frequencies, so a decoder can skip three
quarters of the inverse transform (libjpeg's scaled decoding, PIL's ``draft``). nvJPEG decodes at
full size only, and its batched Huffman kernels spread each image over many threads, taking SM time
from the training step beside it. Here the sequential Huffman decode runs as it does on a CPU, one
image to a lane, 32 images to a warp: a batch of 1,024 is 32 warps, each held as long as its
slowest image takes (what that costs a step beside it: ``bench/bench_dct_decode.py``).

Two kernels a batch (:func:`decode_scans`):
- :func:`_huffman_kernel`: each lane walks its image's MCUs symbol by symbol (a ``2 ** LOOKUP_BITS``
  table for short codes, the canonical code limits for the rest), keeps each block's coefficients
  in its ``K x K`` low-frequency corner (K = 8 / scale) as int16, in a zeroed buffer laid out block by
  block, and skips restart markers;
- :func:`_pixels_kernel`: each output pixel dequantises and inverse-transforms the ``K x K``
  coefficients of its luma block and of its chroma blocks (the chroma repeated over the luma
  sampling), converts YCbCr to RGB and writes uint8 [3, H', W'] planes, the layout the crop kernel
  (:func:`pipeline.data.image_ops.resized_crop_normalize_flat`) reads.

The reduced transform is the ``K``-point inverse DCT of the lowest ``K x K`` coefficients (libjpeg's
scaled decoding computes a variant of its own: the two differ by a level or two on average); the
chroma is repeated, not interpolated. Input that is not
what the header promised decodes to wrong pixels, never out of bounds: reads stop at the image's
last byte plus padding, writes go only to the image's own blocks, and every block ends within 64
symbols.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
import triton
import triton.language as tl

from .image_ops import upload
from .jpeg_scan import HuffmanTable, Scan

__all__ = ["CHUNK", "DctBatch", "LANES", "LOOKUP_BITS", "decode_scans", "image_views", "pack_scans", "scaled_size"]

LOOKUP_BITS = 10
"""Codes of at most this many bits are decoded with one table read; longer ones with the canonical limits."""
_PAD = 8  # zero bytes after each image's data: a lane reads 5 bytes at its position, clamped to the end
LANES = 32
"""Images a Huffman program decodes, one to a lane (32: one warp)."""
CHUNK = 8
"""Symbols each lane decodes between two checks that some lane of the program is still decoding."""
_TILE = 128
# The descriptor's columns, one row an image (:func:`pack_scans`), constexpr so that the kernels read
# them by name (``int(_K)`` on the host). _DC, _AC, _COEF and _QUANT are three columns each, one a
# component; _BW0 / _BW1 are the luma / chroma blocks a row of the component's plane.
_BASE, _NBYTES, _MCUS_X, _N_MCU, _RESTART, _HY, _VY, _NCOMP = (tl.constexpr(i) for i in range(8))
_DC, _AC, _COEF, _BW0, _BW1, _QUANT = (tl.constexpr(i) for i in (8, 11, 14, 17, 18, 19))
_K, _W, _H, _OUT = (tl.constexpr(i) for i in range(22, 26))
_F = tl.constexpr(26)

_ZIGZAG = np.array([0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27,
                    20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58,
                    59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])
"""Zigzag index -> natural (row * 8 + column) position in an 8x8 block."""


def scaled_size(width: int, height: int, k: int) -> Tuple[int, int]:
    """An image's (W, H) decoded at ``k`` / 8 of its size (libjpeg's rounding: up)."""
    return -(-width * k // 8), -(-height * k // 8)


def _slots(side: int) -> np.ndarray:
    """Zigzag index -> position in the ``side x side`` low-frequency corner (row * side + col), -1 outside."""
    row, col = _ZIGZAG // 8, _ZIGZAG % 8
    return np.where((row < side) & (col < side), row * side + col, -1).astype(np.int32)


def _basis() -> np.ndarray:
    """float32 [9, 8, 8]: ``[K, x, u]`` = C(u) cos((2x + 1) u pi / 2K) / 2 for x, u < K (K in 1, 2, 4, 8),
    C(0) = 1 / sqrt(2), C(u) = 1: a pixel is the sum over the block's coefficients F[v, u] of
    basis[K, y, v] * basis[K, x, u] * F[v, u]."""
    out = np.zeros((9, 8, 8), dtype=np.float64)
    for k in (1, 2, 4, 8):
        for x in range(k):
            for u in range(k):
                out[k, x, u] = (math.sqrt(0.5) if u == 0 else 1.0) * math.cos((2 * x + 1) * u * math.pi / (2 * k)) / 2
    return out.astype(np.float32)


@dataclasses.dataclass
class DctBatch:
    """A batch of :class:`Scan` packed for :func:`decode_scans` (CPU tensors)."""

    data: torch.Tensor
    """uint8: each image's entropy-coded data followed by zero padding."""
    desc: torch.Tensor
    """int64 [n, 26]: each image's layout (the ``_`` column constants, ``desc[i, int(_K)]``)."""
    lookup: torch.Tensor
    """int32 [tables, 2 ** LOOKUP_BITS]; ``maxcode`` and ``offset`` int32 [tables, 17]; ``symbols`` int32 [tables, 256]."""
    maxcode: torch.Tensor
    offset: torch.Tensor
    symbols: torch.Tensor
    quant: torch.Tensor
    """float32 [tables, 64]: quantisation tables in zigzag order."""
    lookup_bits: int
    """The Huffman lookup tables' index width."""
    luma_side: int
    """Each luma block keeps its ``luma_side x luma_side`` lowest coefficients (4, or 8 where some ``K`` is 8)."""
    chroma_side: int
    """Each chroma block keeps ``chroma_side x chroma_side`` coefficients (:func:`pack_scans`)."""
    full_chroma: bool
    """Chroma blocks decoded at up to 8 pixels a side, not ``K`` (:func:`pack_scans`)."""
    coefficients: int
    """int16 coefficients the batch's blocks keep."""
    sizes: torch.Tensor
    """int64 [n, 2]: each image's decoded (W', H')."""
    starts: torch.Tensor
    """int64 [n]: where each image's [3, H', W'] planes start in the decoded buffer."""

    @property
    def pixels(self) -> int:
        return int((3 * self.sizes[:, 0] * self.sizes[:, 1]).sum())

    def as_dict(self) -> Dict[str, object]:
        """The fields by name: what a loader worker hands the training process."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, fields: Dict[str, object]) -> "DctBatch":
        return cls(**fields)


def pack_scans(scans: Sequence[Scan], ks: Sequence[int], lookup_bits: int = None, full_chroma: bool = False
               ) -> DctBatch:
    """``scans`` to be decoded at ``ks[i]`` / 8 of their size (each 1, 2, 4 or 8), packed: the
    data end to end, the tables shared by all images that use them (lookup tables of
    ``lookup_bits``, default :data:`LOOKUP_BITS`). A chroma block is decoded at ``K`` pixels a side
    like a luma block and repeated over the luma sampling (the JPEG's own chroma resolution), or with
    ``full_chroma`` at the ``K`` times the sampling it spans, up to 8 (libjpeg's scaled output: at
    half scale a 4:2:0 JPEG's chroma then has the output's resolution, for four times the work)."""
    lookup_bits = LOOKUP_BITS if lookup_bits is None else lookup_bits
    luma_side = 8 if max(ks, default=1) > 4 else 4
    chroma_side = 8 if any((k * max(s.luma_sampling) if full_chroma else k) > 4
                           for s, k in zip(scans, ks) if s.components == 3) else 4
    tables: Dict[HuffmanTable, int] = {}
    quants: Dict[bytes, int] = {}
    rows = []
    base = coef = out = 0
    for s, k in zip(scans, ks):
        hy, vy = s.luma_sampling
        mcus_x, mcus_y = -(-s.width // (8 * hy)), -(-s.height // (8 * vy))
        w, h = scaled_size(s.width, s.height, k)
        tabs, coefs, qs = [0, 0, 0, 0, 0, 0], [0, 0, 0], [0, 0, 0]
        for c in range(s.components):
            tabs[c] = tables.setdefault(s.dc[c], len(tables))
            tabs[3 + c] = tables.setdefault(s.ac[c], len(tables))
            qs[c] = quants.setdefault(s.quant[c].tobytes(), len(quants))
            coefs[c] = coef
            coef += mcus_x * mcus_y * (hy * vy * luma_side ** 2 if c == 0 else chroma_side ** 2)
        rows.append([base, len(s.data), mcus_x, mcus_x * mcus_y, s.restart, hy, vy, s.components, *tabs, *coefs,
                     mcus_x * hy, mcus_x, *qs, k, w, h, out])  # the _ columns, in order
        base += len(s.data) + _PAD
        out += 3 * w * h
    desc = np.array(rows, dtype=np.int64).reshape(len(scans), int(_F))
    data = np.zeros(base, dtype=np.uint8)
    for s, start in zip(scans, desc[:, int(_BASE)].tolist()):
        data[start:start + len(s.data)] = s.data
    arrays = [t.arrays(lookup_bits) for t in tables]
    symbols = np.zeros((len(tables), 256), dtype=np.int32)
    for j, t in enumerate(tables):
        symbols[j, :len(t.symbols)] = np.frombuffer(t.symbols, dtype=np.uint8)
    quant = np.stack([np.frombuffer(q, dtype=np.uint16) for q in quants]).astype(np.float32) if quants else \
        np.zeros((0, 64), dtype=np.float32)

    def stacked(j: int, width: int) -> torch.Tensor:
        return torch.from_numpy(np.stack([a[j] for a in arrays]) if arrays else np.zeros((0, width), np.int32))

    return DctBatch(data=torch.from_numpy(data), desc=torch.from_numpy(desc), lookup=stacked(0, 1 << lookup_bits),
                    maxcode=stacked(1, 17), offset=stacked(2, 17), symbols=torch.from_numpy(symbols),
                    quant=torch.from_numpy(quant), lookup_bits=lookup_bits, luma_side=luma_side,
                    chroma_side=chroma_side, full_chroma=full_chroma, coefficients=coef,
                    sizes=torch.from_numpy(desc[:, [int(_W), int(_H)]].copy()),
                    starts=torch.from_numpy(desc[:, int(_OUT)].copy()))


@triton.jit
def _pick(c, a, b, d):
    return tl.where(c == 0, a, tl.where(c == 1, b, d))


@triton.jit
def _huffman_kernel(data_ptr, desc_ptr, lookup_ptr, maxcode_ptr, offset_ptr, symbols_ptr, slot_ptr, coef_ptr, n,
                    LANES: tl.constexpr, LB: tl.constexpr, LSIDE: tl.constexpr, CSIDE: tl.constexpr,
                    CHUNK: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < n
    row = desc_ptr + lane.to(tl.int64) * _F
    base = tl.load(row + _BASE, mask=live, other=0)
    last = tl.load(row + _NBYTES, mask=live, other=0).to(tl.int32)
    mcus_x = tl.load(row + _MCUS_X, mask=live, other=1).to(tl.int32)
    n_mcu = tl.load(row + _N_MCU, mask=live, other=0).to(tl.int32)
    restart = tl.load(row + _RESTART, mask=live, other=0).to(tl.int32)
    hy = tl.load(row + _HY, mask=live, other=1).to(tl.int32)
    vy = tl.load(row + _VY, mask=live, other=1).to(tl.int32)
    ncomp = tl.load(row + _NCOMP, mask=live, other=1).to(tl.int32)
    dc0 = tl.load(row + _DC, mask=live, other=0).to(tl.int32)
    dc1 = tl.load(row + _DC + 1, mask=live, other=0).to(tl.int32)
    dc2 = tl.load(row + _DC + 2, mask=live, other=0).to(tl.int32)
    ac0 = tl.load(row + _AC, mask=live, other=0).to(tl.int32)
    ac1 = tl.load(row + _AC + 1, mask=live, other=0).to(tl.int32)
    ac2 = tl.load(row + _AC + 2, mask=live, other=0).to(tl.int32)
    cb0 = tl.load(row + _COEF, mask=live, other=0)
    cb1 = tl.load(row + _COEF + 1, mask=live, other=0)
    cb2 = tl.load(row + _COEF + 2, mask=live, other=0)
    bw0 = tl.load(row + _BW0, mask=live, other=1).to(tl.int32)
    bw1 = tl.load(row + _BW1, mask=live, other=1).to(tl.int32)
    luma = hy * vy
    blocks = luma + tl.where(ncomp == 3, 2, 0)
    zero = tl.zeros([LANES], dtype=tl.int32)
    pos, mcu, mx, my, k, z, p0, p1, p2 = zero, zero, zero, zero, zero, zero, zero, zero, zero
    countdown = restart  # MCUs to the next restart marker (none when restart is 0)
    active = live & (mcu < n_mcu)
    left = tl.sum(active.to(tl.int32), 0)
    while left > 0:
        for _ in range(CHUNK):  # symbols between two checks that some lane is still decoding
            comp = tl.where(k < luma, 0, k - luma + 1)
            first = comp == 0
            is_dc = z == 0
            tab = tl.where(is_dc, _pick(comp, dc0, dc1, dc2), _pick(comp, ac0, ac1, ac2))
            src = data_ptr + base + tl.minimum(pos >> 3, last)
            w = tl.load(src, mask=active, other=0).to(tl.int64) << 32
            w = w | (tl.load(src + 1, mask=active, other=0).to(tl.int64) << 24)
            w = w | (tl.load(src + 2, mask=active, other=0).to(tl.int64) << 16)
            w = w | (tl.load(src + 3, mask=active, other=0).to(tl.int64) << 8)
            w = w | tl.load(src + 4, mask=active, other=0).to(tl.int64)
            w = (w << (pos & 7)) & 0xFFFFFFFFFF  # the next 33+ bits of the stream at the top of 40
            look = (w >> 24).to(tl.int32)  # the next 16 bits
            entry = tl.load(lookup_ptr + tab * (1 << LB) + (look >> (16 - LB)), mask=active, other=0x100)
            length = entry >> 8
            sym = entry & 255
            slow = active & (length == 0)
            if tl.sum(slow.to(tl.int32), 0) > 0:  # a code longer than the table: the canonical limits
                lc = tl.arange(0, 16) + 1
                code = look[:, None] >> (16 - lc)[None, :]
                top = tl.load(maxcode_ptr + tab[:, None] * 17 + lc[None, :], mask=slow[:, None], other=-1)
                found_len = tl.min(tl.where(code <= top, lc[None, :], 99), 1)
                found = found_len < 99
                got = tl.where(found, found_len, 16)
                off = tl.load(offset_ptr + tab * 17 + got, mask=slow, other=0)
                at = tl.minimum(tl.maximum(off + (look >> (16 - got)), 0), 255)
                sym = tl.where(slow, tl.load(symbols_ptr + tab * 256 + at, mask=slow & found, other=0), sym)
                length = tl.where(slow, got, length)
            size = tl.where(is_dc, sym, sym & 15)
            run = tl.where(is_dc, 0, sym >> 4)
            bits = (((w >> 8) << length) & 0xFFFFFFFF) >> (32 - size)  # the value's bits (none when size is 0)
            v = bits.to(tl.int32)
            v = tl.where(v < (1 << tl.maximum(size - 1, 0)), v - (1 << size) + 1, v)
            pos += length + size
            pred = _pick(comp, p0, p1, p2) + v
            upd = active & is_dc
            p0 = tl.where(upd & (comp == 0), pred, p0)
            p1 = tl.where(upd & (comp == 1), pred, p1)
            p2 = tl.where(upd & (comp == 2), pred, p2)
            eob = (z > 0) & (sym == 0)
            zpos = tl.where(is_dc, 0, z + run)
            value = tl.where(is_dc, pred, v)
            # slot tables: a 4-side corner's, then an 8-side corner's
            slot = tl.load(slot_ptr + tl.where(first, LSIDE // 8, CSIDE // 8) * 64 + tl.minimum(zpos, 63))
            # the block's place: luma blocks k = dy * h + dx of an MCU (h, v in 1, 2), then Cb, Cr
            bx = tl.where(first, mx * hy + (k & (hy - 1)), mx)
            by = tl.where(first, my * vy + (k >> (hy - 1)), my)
            block = (by * tl.where(first, bw0, bw1) + bx).to(tl.int64)
            addr = _pick(comp, cb0, cb1, cb2) + block * tl.where(first, LSIDE * LSIDE, CSIDE * CSIDE) + slot
            tl.store(coef_ptr + addr, value.to(tl.int16), mask=active & (~eob) & (zpos < 64) & (slot >= 0) & (value != 0))
            nz = tl.where(eob, 64, zpos + 1)
            done = active & (nz >= 64)
            z = tl.where(active, tl.where(done, 0, nz), z)
            k = tl.where(done, k + 1, k)
            wrap = k == blocks
            k = tl.where(wrap, 0, k)
            mcu = tl.where(wrap, mcu + 1, mcu)
            mx = tl.where(wrap, mx + 1, mx)
            row_end = mx == mcus_x
            mx = tl.where(row_end, 0, mx)
            my = tl.where(row_end, my + 1, my)
            countdown = tl.where(wrap, countdown - 1, countdown)
            rst = wrap & (countdown == 0) & (restart > 0) & (mcu < n_mcu)
            countdown = tl.where(rst, restart, countdown)
            pos = tl.where(rst, ((pos + 7) >> 3 << 3) + 16, pos)  # byte-aligned, past the marker
            p0 = tl.where(rst, 0, p0)
            p1 = tl.where(rst, 0, p1)
            p2 = tl.where(rst, 0, p2)
            active = live & (mcu < n_mcu)
        left = tl.sum(active.to(tl.int32), 0)


@triton.jit
def _plane_value(coef_ptr, quant_ptr, basis_ptr, zz_ptr, cb, bw, qid, KX, KY, px, py, mask, SIDE: tl.constexpr):
    """A component's value (level shift not added) at its pixels (``px``, ``py``), decoded at ``KX``
    by ``KY`` pixels a block from the blocks' ``SIDE x SIDE`` coefficients."""
    j = tl.arange(0, SIDE * SIDE)
    fv, fu = j // SIDE, j % SIDE
    block = (py // KY) * bw + px // KX
    c = tl.load(coef_ptr + cb + block[:, None] * (SIDE * SIDE) + j[None, :], mask=mask[:, None], other=0)
    q = tl.load(quant_ptr + qid * 64 + tl.load(zz_ptr + (SIDE - 4) * 4 + j))
    wy = tl.load(basis_ptr + KY * 64 + (py % KY)[:, None] * 8 + fv[None, :])
    wx = tl.load(basis_ptr + KX * 64 + (px % KX)[:, None] * 8 + fu[None, :])
    return tl.sum(c.to(tl.float32) * q[None, :] * wy * wx, 1)


@triton.jit
def _store_channel(out_ptr, at, value, mask):
    tl.store(out_ptr + at, tl.minimum(tl.maximum(value + 128.0 + 0.5, 0.0), 255.0).to(tl.uint8), mask=mask)


@triton.jit
def _pixels_kernel(coef_ptr, desc_ptr, quant_ptr, basis_ptr, zz_ptr, out_ptr, LSIDE: tl.constexpr,
                   CSIDE: tl.constexpr, FULL_CHROMA: tl.constexpr, TILE: tl.constexpr):
    row = desc_ptr + tl.program_id(0).to(tl.int64) * _F
    W = tl.load(row + _W)
    H = tl.load(row + _H)
    p = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = p < W * H
    x, y = p % W, p // W
    K = tl.load(row + _K)
    start = tl.load(row + _OUT)
    luma = _plane_value(coef_ptr, quant_ptr, basis_ptr, zz_ptr, tl.load(row + _COEF), tl.load(row + _BW0),
                        tl.load(row + _QUANT), K, K, x, y, mask, LSIDE)
    plane = W * H
    if tl.load(row + _NCOMP) == 3:
        # a chroma block spans K * h output pixels across: decoded at K (or that many, at most 8), then repeated
        span_x, span_y = K * tl.load(row + _HY), K * tl.load(row + _VY)
        kx, ky = K, K
        if FULL_CHROMA:
            kx, ky = tl.minimum(span_x, 8), tl.minimum(span_y, 8)
        cx, cy = x // (span_x // kx), y // (span_y // ky)
        bw1 = tl.load(row + _BW1)
        cb = _plane_value(coef_ptr, quant_ptr, basis_ptr, zz_ptr, tl.load(row + _COEF + 1), bw1,
                          tl.load(row + _QUANT + 1), kx, ky, cx, cy, mask, CSIDE)
        cr = _plane_value(coef_ptr, quant_ptr, basis_ptr, zz_ptr, tl.load(row + _COEF + 2), bw1,
                          tl.load(row + _QUANT + 2), kx, ky, cx, cy, mask, CSIDE)
        _store_channel(out_ptr, start + p, luma + 1.402 * cr, mask)
        _store_channel(out_ptr, start + plane + p, luma - 0.344136 * cb - 0.714136 * cr, mask)
        _store_channel(out_ptr, start + 2 * plane + p, luma + 1.772 * cb, mask)
    else:
        for c in tl.static_range(3):
            _store_channel(out_ptr, start + c * plane + p, luma, mask)


_CONSTANTS: Dict[str, Tuple[torch.Tensor, ...]] = {}


def _constants(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slot tables int32 [2, 64]: a 4-side and an 8-side corner; basis float32 [9, 8, 8]; the zigzag
    index of each position of a 4-side then an 8-side corner, int32 [16 + 64]) on ``device``, made once."""
    key = str(device)
    if key not in _CONSTANTS:
        inverse = np.argsort(_ZIGZAG)  # natural position -> zigzag index
        zz = [inverse[(j // side) * 8 + j % side] for side in (4, 8) for j in range(side * side)]
        arrays = (np.stack([_slots(4), _slots(8)]), _basis(), np.array(zz, dtype=np.int32))
        _CONSTANTS[key] = tuple(torch.from_numpy(a).to(device) for a in arrays)
    return _CONSTANTS[key]


def decode_scans(batch: DctBatch, device: torch.device, out: torch.Tensor = None, lanes: int = LANES,
                 chunk: int = CHUNK) -> torch.Tensor:
    """The batch's images decoded on ``device`` (the current stream): uint8, image ``i``'s [3, H', W']
    RGB planes at ``batch.starts[i]`` (``out`` if given, at least ``batch.pixels`` long)."""
    slots, basis, zz = _constants(device)
    n = batch.desc.shape[0]
    moved = [upload(t, device) for t in (batch.data, batch.desc, batch.lookup, batch.maxcode, batch.offset,
                                         batch.symbols, batch.quant)]
    data, desc, lookup, maxcode, offset, symbols, quant = moved
    coef = torch.zeros(max(batch.coefficients, 1), dtype=torch.int16, device=device)
    if out is None:
        out = torch.empty(max(batch.pixels, 1), dtype=torch.uint8, device=device)
    if n == 0:
        return out
    _huffman_kernel[(triton.cdiv(n, lanes),)](data, desc, lookup, maxcode, offset, symbols, slots, coef, n,
                                               LANES=lanes, LB=batch.lookup_bits, LSIDE=batch.luma_side,
                                               CSIDE=batch.chroma_side, CHUNK=chunk, num_warps=max(1, lanes // 32))
    most = int((batch.sizes[:, 0] * batch.sizes[:, 1]).max())
    _pixels_kernel[(n, triton.cdiv(most, _TILE))](coef, desc, quant, basis, zz, out,
                                                  LSIDE=batch.luma_side, CSIDE=batch.chroma_side,
                                                  FULL_CHROMA=batch.full_chroma, TILE=_TILE)
    return out


def image_views(batch: DctBatch, decoded: torch.Tensor) -> List[torch.Tensor]:
    """Image ``i`` of a decoded batch as uint8 [3, H', W'] (views)."""
    out = []
    for (w, h), start in zip(batch.sizes.tolist(), batch.starts.tolist()):
        out.append(decoded[start:start + 3 * w * h].view(3, h, w))
    return out
