"""A baseline JPEG taken apart on the host for the DCT-domain decoder (:mod:`pipeline.data.dct_decode`):
its size, chroma layout, quantisation and Huffman tables, restart interval, and its entropy-coded
data with the stuffed zero bytes removed.

Only what that decoder takes is accepted: 8-bit Huffman-coded sequential JPEGs (SOF0/SOF1) with one
scan of all components, greyscale or YCbCr with the luma sampled 1x1, 2x1, 1x2 or 2x2 and the chroma
1x1. Anything else raises :class:`ScanError` with the reason, and the caller decodes the file another
way. Parsing reads only the headers and one pass of numpy over the data; nothing is decoded here.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import numpy as np

__all__ = ["HuffmanTable", "Scan", "ScanError", "parse_scan"]

_LUMA_SAMPLINGS = ((1, 1), (2, 1), (1, 2), (2, 2))


class ScanError(ValueError):
    """A file the DCT-domain decoder does not take (the message says why)."""


@dataclasses.dataclass(frozen=True)
class HuffmanTable:
    """A Huffman table as coded: code counts by length (1-16) and the symbols in code order."""

    counts: bytes
    symbols: bytes

    def arrays(self, lookup_bits: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lookup int32 [2 ** lookup_bits]: ``length << 8 | symbol`` for codes of at most
        ``lookup_bits`` bits indexed by the next ``lookup_bits`` bits of the stream, 0 where the code is
        longer; maxcode int32 [17]: the largest code of each length, -1 for none; offset int32 [17]:
        a code of length ``l`` is symbol ``offset[l] + code``), the canonical codes of JPEG's Annex C."""
        lookup = np.zeros(1 << lookup_bits, dtype=np.int32)
        maxcode = np.full(17, -1, dtype=np.int32)
        offset = np.zeros(17, dtype=np.int32)
        code, k = 0, 0
        for length in range(1, 17):
            n = self.counts[length - 1]
            if n:
                offset[length] = k - code
                if length <= lookup_bits:
                    shift = lookup_bits - length
                    first, last = code << shift, (code + n) << shift
                    syms = np.frombuffer(self.symbols, dtype=np.uint8, count=n, offset=k).astype(np.int32)
                    lookup[first:last] = np.repeat((length << 8) | syms, 1 << shift)
                code += n
                k += n
                maxcode[length] = code - 1
            code <<= 1
        return lookup, maxcode, offset


@dataclasses.dataclass
class Scan:
    """One JPEG as the DCT-domain decoder takes it."""

    width: int
    height: int
    luma_sampling: Tuple[int, int]
    """(h, v) of the first component; (1, 1) for greyscale."""
    quant: np.ndarray
    """uint16 [components, 64]: each component's quantisation table in zigzag order."""
    dc: List[HuffmanTable]
    ac: List[HuffmanTable]
    restart: int
    """MCUs between restart markers, 0 for none."""
    data: np.ndarray
    """uint8: the entropy-coded data with stuffed zeros removed (restart markers kept)."""

    @property
    def components(self) -> int:
        return self.quant.shape[0]


def _u16(b: bytes, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


def _huffman_tables(seg: bytes, huffman: Dict[Tuple[int, int], HuffmanTable]) -> None:
    """The tables of a DHT segment into ``huffman``, by (class, identifier)."""
    i = 0
    while i < len(seg):
        cls, ident = seg[i] >> 4, seg[i] & 15
        counts = bytes(seg[i + 1:i + 17])
        n = sum(counts)
        if len(counts) < 16 or i + 17 + n > len(seg) or cls > 1:
            raise ScanError("a malformed Huffman table")
        huffman[cls, ident] = HuffmanTable(counts, bytes(seg[i + 17:i + 17 + n]))
        i += 17 + n


def _quant_tables(seg: bytes, quant: Dict[int, np.ndarray]) -> None:
    """The tables of a DQT segment into ``quant``, by identifier (8- or 16-bit entries, zigzag order)."""
    i = 0
    while i < len(seg):
        precision, ident = seg[i] >> 4, seg[i] & 15
        width = 2 if precision else 1
        if i + 1 + 64 * width > len(seg):
            raise ScanError("a malformed quantisation table")
        raw = np.frombuffer(seg, dtype=">u2" if precision else np.uint8, count=64, offset=i + 1)
        quant[ident] = raw.astype(np.uint16)
        i += 1 + 64 * width


def _entropy_data(data: bytes, start: int) -> np.ndarray:
    """The entropy-coded bytes from ``start`` up to the first marker other than a restart marker,
    with each stuffed 0x00 after a 0xFF removed; raises unless that marker is the end of the image."""
    arr = np.frombuffer(data, dtype=np.uint8, offset=start)
    ff = np.flatnonzero(arr[:-1] == 0xFF)
    nxt = arr[ff + 1]
    stops = ff[(nxt != 0) & ((nxt < 0xD0) | (nxt > 0xD7))]
    if not len(stops):
        raise ScanError("truncated data (no end-of-image marker)")
    end = int(stops[0])
    if arr[end + 1] != 0xD9:
        raise ScanError("more than one scan")
    stuffed = ff[(ff < end) & (nxt == 0)] + 1
    return np.delete(arr[:end], stuffed)


def parse_scan(data: bytes) -> Scan:
    """The :class:`Scan` of a JPEG file; :class:`ScanError` when the DCT-domain decoder does not take it."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise ScanError("not a JPEG file")
    huffman: Dict[Tuple[int, int], HuffmanTable] = {}
    quant: Dict[int, np.ndarray] = {}
    frame = None
    restart = 0
    i = 2
    while True:
        while i < len(data) and data[i] == 0xFF and i + 1 < len(data) and data[i + 1] == 0xFF:
            i += 1  # fill bytes
        if i + 4 > len(data) or data[i] != 0xFF:
            raise ScanError("no scan before the end of the file")
        marker = data[i + 1]
        length = _u16(data, i + 2)
        seg = data[i + 4:i + 2 + length]
        if len(seg) != length - 2:
            raise ScanError("a truncated header")
        if marker in (0xC0, 0xC1):
            if seg[0] != 8:
                raise ScanError(f"{seg[0]}-bit samples")
            height, width, count = _u16(seg, 1), _u16(seg, 3), seg[5]
            comps = [(seg[6 + 3 * c], seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15, seg[8 + 3 * c]) for c in range(count)]
            frame = (width, height, comps)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            raise ScanError("progressive" if marker in (0xC2, 0xC6) else "not a Huffman-coded sequential JPEG")
        elif marker == 0xC4:
            _huffman_tables(seg, huffman)
        elif marker == 0xDB:
            _quant_tables(seg, quant)
        elif marker == 0xDD:
            restart = _u16(seg, 0)
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12 and seg[11] == 0:
            raise ScanError("Adobe RGB or CMYK colour transform")
        elif marker == 0xDA:
            return _scan(data, i + 2 + length, seg, frame, huffman, quant, restart)
        i += 2 + length


def _scan(data: bytes, start: int, seg: bytes, frame, huffman, quant, restart: int) -> Scan:
    if frame is None:
        raise ScanError("no frame header before the scan")
    width, height, comps = frame
    if len(comps) not in (1, 3):
        raise ScanError(f"{len(comps)} components")
    if width == 0 or height == 0:
        raise ScanError("no size in the frame header")
    if seg[0] != len(comps):
        raise ScanError("a scan of some of the components")
    if len(comps) == 3:
        sampling = (comps[0][1], comps[0][2])
        if sampling not in _LUMA_SAMPLINGS or any((h, v) != (1, 1) for _, h, v, _ in comps[1:]):
            raise ScanError(f"chroma sampling {[(h, v) for _, h, v, _ in comps]}")
    else:
        sampling = (1, 1)
    ids = [c[0] for c in comps]
    dc, ac = [], []
    for k in range(seg[0]):
        ident, tables = seg[1 + 2 * k], seg[2 + 2 * k]
        if ident != ids[k]:
            raise ScanError("scan components out of frame order")
        try:
            dc.append(huffman[0, tables >> 4])
            ac.append(huffman[1, tables & 15])
        except KeyError:
            raise ScanError("a missing Huffman table") from None
    try:
        q = np.stack([quant[c[3]] for c in comps])
    except KeyError:
        raise ScanError("a missing quantisation table") from None
    return Scan(width, height, sampling, q, dc, ac, restart, _entropy_data(data, start))
