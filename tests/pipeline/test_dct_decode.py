"""The DCT-domain JPEG decoder: the header parser's refusals, and the kernels (under Triton's
interpreter here, on the GPU with ``-m gpu``) against a float64 reference decoder written
independently in plain Python, and against PIL (libjpeg) where the two compute the same thing.

The reference reads the entropy-coded data bit by bit from the file (stuffed bytes, restart
markers and all), dequantises in natural order and reconstructs each pixel from the cosine sums,
so a mistake shared with the kernels would have to be made twice in different forms.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from infclip.pipeline.data.dct_decode import decode_scans, pack_scans, image_views
from infclip.pipeline.data.jpeg_scan import ScanError, parse_scan
from tests.pipeline._sm90 import sm90_usage



def _zigzag() -> np.ndarray:
    """Zigzag index -> natural position, walked along the anti-diagonals (JPEG's Figure A.6)."""
    order = []
    for d in range(15):
        cells = [(r, d - r) for r in range(8) if 0 <= d - r < 8]
        order += cells if d % 2 else cells[::-1]  # even diagonals run up and to the right
    return np.array([r * 8 + c for r, c in order])


ZIGZAG = _zigzag()


def _jpeg(w: int, h: int, seed: int, mode: str = "RGB", **save) -> bytes:
    """Colour ramps with noise (every coefficient in play, long codes included), saved by PIL."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1), (xx + yy) * 127 / max(w + h - 2, 1)], -1)
    pixels = np.clip(base + rng.normal(0, 15, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "JPEG", quality=save.pop("quality", 85), **save)
    return buf.getvalue()


# --- an independent reference: Annex F's decoding procedure, in Python ---------------------------------

def _segments(data: bytes):
    i = 2
    while True:
        marker, length = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
        yield marker, data[i + 4:i + 2 + length], i + 2 + length
        if marker == 0xDA:
            return
        i += 2 + length


def _codes(counts, symbols) -> dict:
    table, code, k = {}, 0, 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            table[length, code] = symbols[k]
            code, k = code + 1, k + 1
        code <<= 1
    return table


def reference_decode(data: bytes, k: int, full_chroma: bool = False) -> np.ndarray:
    """float64-reconstructed uint8 [3, H', W'] of a baseline JPEG decoded at ``k`` / 8 of its size, the
    chroma of each output pixel taken from the chroma block over it, decoded at ``k`` pixels a side
    or with ``full_chroma`` at as many as it spans (up to 8), as the kernels do."""
    huff, quant, restart = {}, {}, 0
    for marker, seg, end in _segments(data):
        if marker == 0xC0:
            height, width = int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big")
            comps = [(seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15, seg[8 + 3 * c]) for c in range(seg[5])]
        elif marker == 0xC4:
            j = 0
            while j < len(seg):
                n = sum(seg[j + 1:j + 17])
                huff[seg[j] >> 4, seg[j] & 15] = _codes(seg[j + 1:j + 17], seg[j + 17:j + 17 + n])
                j += 17 + n
        elif marker == 0xDB:
            j = 0
            while j < len(seg):
                quant[seg[j] & 15] = np.frombuffer(seg, np.uint8, 64, j + 1).astype(np.float64)
                j += 65
        elif marker == 0xDD:
            restart = int.from_bytes(seg[:2], "big")
        elif marker == 0xDA:
            tables = [(seg[2 + 2 * c] >> 4, seg[2 + 2 * c] & 15) for c in range(seg[0])]
            pos = end
    if len(comps) == 1:
        comps = [(1, 1, comps[0][2])]
    hmax, vmax = comps[0][0], comps[0][1]
    mx, my = -(-width // (8 * hmax)), -(-height // (8 * vmax))
    blocks = [np.zeros((my * v, mx * h, 64)) for h, v, _ in comps]
    bits = []

    def bit() -> int:
        nonlocal pos
        if not bits:
            byte = data[pos]
            pos += 2 if byte == 0xFF else 1  # a stuffed zero follows a data 0xFF
            bits.extend((byte >> (7 - i)) & 1 for i in range(8))
        return bits.pop(0)

    def receive(n: int) -> int:
        v = 0
        for _ in range(n):
            v = (v << 1) | bit()
        return v

    def symbol(table) -> int:
        code = 0
        for length in range(1, 17):
            code = (code << 1) | bit()
            if (length, code) in table:
                return table[length, code]
        raise ValueError("bad code")

    def extend(v: int, n: int) -> int:
        return v - (1 << n) + 1 if n and v < (1 << (n - 1)) else v

    pred = [0] * len(comps)
    for m in range(mx * my):
        if restart and m and m % restart == 0:
            bits.clear()
            pos += 2  # the restart marker
            pred = [0] * len(comps)
        for c, (h, v, _) in enumerate(comps):
            for dy in range(v):
                for dx in range(h):
                    coef = np.zeros(64)
                    dc_t, ac_t = huff[0, tables[c][0]], huff[1, tables[c][1]]
                    n = symbol(dc_t)
                    pred[c] += extend(receive(n), n)
                    coef[0] = pred[c]
                    z = 1
                    while z < 64:
                        rs = symbol(ac_t)
                        if rs == 0:
                            break
                        z += rs >> 4
                        if z < 64:
                            coef[z] = extend(receive(rs & 15), rs & 15)
                        z += 1
                    nat = np.zeros(64)
                    nat[ZIGZAG] = coef * quant[comps[c][2]]
                    blocks[c][(m // mx) * v + dy, (m % mx) * h + dx] = nat
    w2, h2 = -(-width * k // 8), -(-height * k // 8)

    def value(c: int, x: int, y: int, kx: int, ky: int) -> float:
        f = blocks[c][y // ky, x // kx].reshape(8, 8)
        total = 0.0
        for v in range(ky):
            for u in range(kx):
                cu = math.sqrt(0.5) if u == 0 else 1.0
                cv = math.sqrt(0.5) if v == 0 else 1.0
                total += cu * cv / 4 * f[v, u] * math.cos((2 * (x % kx) + 1) * u * math.pi / (2 * kx)) \
                    * math.cos((2 * (y % ky) + 1) * v * math.pi / (2 * ky))
        return total

    out = np.zeros((3, h2, w2))
    for y in range(h2):
        for x in range(w2):
            lum = value(0, x, y, k, k) + 128
            if len(comps) == 1:
                out[:, y, x] = lum
                continue
            sx, sy = k * hmax, k * vmax
            kx, ky = (min(sx, 8), min(sy, 8)) if full_chroma else (k, k)
            cb = value(1, x // (sx // kx), y // (sy // ky), kx, ky)
            cr = value(2, x // (sx // kx), y // (sy // ky), kx, ky)
            out[:, y, x] = (lum + 1.402 * cr, lum - 0.344136 * cb - 0.714136 * cr, lum + 1.772 * cb)
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)


# --- the tests ---------------------------------------------------------------------------------------

CASES = [  # (w, h, mode, PIL save options, scale k / 8): odd sizes, every sampling, restarts, optimised tables
    (13, 9, "L", {}, 8),
    (20, 11, "RGB", {"subsampling": 0}, 4),
    (19, 21, "RGB", {"subsampling": 2}, 4),
    (27, 10, "RGB", {"subsampling": 1}, 2),
    (25, 17, "RGB", {"subsampling": 2, "restart_marker_blocks": 2}, 8),
    (12, 26, "RGB", {"subsampling": 2, "optimize": True, "quality": 75}, 1),
]


def _decode(files, ks, device="cpu", lookup_bits=None, full_chroma=False, **kw):
    batch = pack_scans([parse_scan(f) for f in files], ks, lookup_bits, full_chroma)
    return batch, image_views(batch, decode_scans(batch, torch.device(device), **kw).cpu())


@pytest.fixture(scope="module")
def cases():
    return [_jpeg(w, h, i, mode, **dict(opts)) for i, (w, h, mode, opts, _) in enumerate(CASES)]


@pytest.mark.parametrize("full_chroma", [False, True])
def test_the_kernels_decode_as_the_float64_reference_at_every_scale_and_sampling(cases, full_chroma):
    """Every case; with ``full_chroma`` the subsampled ones, whose chroma it decodes at more points."""
    chosen = [i for i, (_, _, mode, opts, k) in enumerate(CASES)
              if not full_chroma or (mode == "RGB" and opts.get("subsampling") and k < 8)]
    files, ks = [cases[i] for i in chosen], [CASES[i][-1] for i in chosen]
    _, got = _decode(files, ks, full_chroma=full_chroma)
    for f, k, image in zip(files, ks, got):
        want = reference_decode(f, k, full_chroma)
        assert image.shape == want.shape
        assert int((image.numpy().astype(int) - want).__abs__().max()) <= 1  # fp32 against fp64 rounding


def test_long_codes_take_the_canonical_path(cases):
    """With a 4-bit table nearly every code is longer than the table: the canonical limits decode
    them (here with 16 lanes to a program, checking for the end after every 3 symbols)."""
    files, ks = cases[2:3], [4]
    _, got = _decode(files, ks, lookup_bits=4, lanes=16, chunk=3)
    for f, k, image in zip(files, ks, got):
        assert int((image.numpy().astype(int) - reference_decode(f, k)).__abs__().max()) <= 1


def test_full_scale_greyscale_matches_libjpeg(cases):
    """At full size the transform is libjpeg's (PIL's) up to its integer rounding."""
    _, (image,) = _decode(cases[:1], [8])
    want = np.asarray(Image.open(io.BytesIO(cases[0])))
    assert int(np.abs(image[0].numpy().astype(int) - want).max()) <= 1
    assert torch.equal(image[0], image[1]) and torch.equal(image[0], image[2])


@pytest.mark.parametrize("make, reason", [
    (lambda: _jpeg(16, 16, 0, progressive=True), "progressive"),
    (lambda: _jpeg(16, 16, 0, "CMYK"), "CMYK"),
    (lambda: _jpeg(16, 16, 0)[:-40], "truncated"),
    (lambda: b"\x89PNG\r\n\x1a\n" + bytes(20), "not a JPEG"),
])
def test_the_parser_refuses_what_the_kernels_do_not_take(make, reason):
    with pytest.raises(ScanError, match=reason):
        parse_scan(make())


def test_corrupt_data_decodes_to_pixels_inside_the_batch(cases):
    """Random bytes where the entropy-coded data was: wrong pixels, nothing written past the batch."""
    scan = parse_scan(cases[2])
    scan.data = np.random.default_rng(1).integers(0, 256, scan.data.size, dtype=np.uint8)
    batch = pack_scans([scan, parse_scan(cases[1])], [4, 4])
    out = torch.full((batch.pixels + 64,), 7, dtype=torch.uint8)
    decode_scans(batch, torch.device("cpu"), out=out)
    assert torch.all(out[batch.pixels:] == 7)
    second = image_views(batch, out)[1]
    assert int((second.numpy().astype(int) - reference_decode(cases[1], 4)).__abs__().max()) <= 1


_DCT_KERNELS = """
from infclip.pipeline.data import dct_decode as d
huffman = {"data_ptr": "*u8", "desc_ptr": "*i64", "lookup_ptr": "*i32", "maxcode_ptr": "*i32", "offset_ptr": "*i32",
           "symbols_ptr": "*i32", "slot_ptr": "*i32", "coef_ptr": "*i16", "n": "i32"}
pixels = {"coef_ptr": "*i16", "desc_ptr": "*i64", "quant_ptr": "*fp32", "basis_ptr": "*fp32", "zz_ptr": "*i32",
          "out_ptr": "*u8"}
# the launches' own settings: what decode_scans runs for 512-px JPEGs at half scale
found["huffman"] = usage(d._huffman_kernel, huffman, {"LANES": d.LANES, "LB": d.LOOKUP_BITS, "LSIDE": 4, "CSIDE": 4,
                                                      "CHUNK": d.CHUNK}, 1)
for name, side, full in (("pixels", 4, False), ("pixels_full_chroma", 8, True)):
    found[name] = usage(d._pixels_kernel, pixels, {"LSIDE": 4, "CSIDE": side, "FULL_CHROMA": full, "TILE": d._TILE}, 4)
"""


def test_the_kernels_compile_for_hopper_without_spilling():
    """What Triton's interpreter cannot show: the kernels compile for sm_90 (constructs only the
    interpreter accepts fail here) and keep their lanes' state in registers (:mod:`tests.pipeline._sm90`)."""
    usage = sm90_usage(_DCT_KERNELS)
    assert set(usage) == {"huffman", "pixels", "pixels_full_chroma"}
    for name, use in usage.items():
        assert use["LOCAL"] == 0 and 0 < use["REG"] <= 255, (name, use)


@pytest.mark.gpu
def test_the_kernels_on_the_gpu_decode_as_on_the_interpreter(cases):
    ks = [k for *_, k in CASES]
    _, got = _decode(cases, ks, device="cuda")
    for f, k, image in zip(cases, ks, got):
        assert int((image.numpy().astype(int) - reference_decode(f, k)).__abs__().max()) <= 1
