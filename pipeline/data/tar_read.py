"""Reading a shard's members in order, from any byte stream: a local file, a pipe, a download.

Design: the loader workers read every member of every shard they train on, and the standard
library's ``tarfile`` in stream mode spends about 90 us a member doing it on one core of a
2-core CPU machine (a ``TarInfo`` object, every header field parsed, the data through its own
buffered stream): with the JPEGs decoded on the GPU that is most of a worker's time a sample. A
plain tar is 512-byte headers, each followed by its member's data padded to a whole block, so
this module reads the headers itself: the checksum, the name (with the POSIX prefix, GNU long
names and pax ``path`` records), the size (octal, base-256, or a pax ``size`` record) and the
type, and hands over the data with one read (about 5 us a member there; a worker decoding
512-px JPEGs on that machine went from 681-700 to 738-755 images/s, ``python
bench/bench_data.py --workers 1 --size 512``). Compressed shards (gzip, bzip2, xz) still go
through ``tarfile``.

Either way a shard's end is checked (:func:`check_tar_end`): a whole tar ends with two zero blocks
and nothing but zeros after them; a stream that stops at a member or header boundary, or has
data after its end, is reported, where ``tarfile`` ends quietly. A damaged header (its checksum
wrong) is reported where it is met. The members before any damage are given first.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any, Callable, Iterator, Optional, Tuple

__all__ = ["check_tar_end", "tar_members"]

_BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(_BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # regular file, old-style regular file, contiguous file
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz
_POSIX_MAGIC = b"ustar\x0000"
_SEEK_FROM = 1 << 20


def check_tar_end(tar: tarfile.TarFile) -> None:
    """Raise ``tarfile.ReadError`` unless a tar read in stream mode (``"r|*"``) to its last member
    ended as a whole archive does. tarfile's stream mode reads a shard cut at a header or member
    boundary as a quiet end; a whole tar has two zero blocks after its last member, and nothing but
    zeros after them (else a damaged header ended the members early). Reads the rest of the
    uncompressed stream (``tar.fileobj``, so a ``.tar.gz`` is measured after decompression)."""
    rest = tar.fileobj
    _, nonzero = _drain(rest)
    # tar.offset: where the member headers ended (the first end-of-archive block, or the cut)
    _check_end(tar.offset, rest.pos, nonzero)


def _drain(stream: Any) -> Tuple[int, bool]:
    """Read ``stream`` to its end: (the bytes read, whether any of them was not zero)."""
    count, nonzero = 0, False
    while chunk := stream.read(tarfile.RECORDSIZE):
        nonzero = nonzero or chunk.count(0) != len(chunk)
        count += len(chunk)
    return count, nonzero


def _check_end(members_end: int, total: int, nonzero: bool) -> None:
    """Raise ``tarfile.ReadError`` unless a stream of ``total`` bytes whose members ended at
    ``members_end`` has the two end-of-archive blocks there and nothing but zeros after them
    (``nonzero``: something else came after the members)."""
    if total < members_end + 2 * _BLOCK:
        raise tarfile.ReadError(f"cut short: {total} bytes, without the end-of-archive blocks after "
                                f"its members' {members_end}; the samples after the cut are lost")
    if nonzero:
        raise tarfile.ReadError(f"data after the end of its members at byte {members_end} (a damaged "
                                "header, or tars concatenated): the rest is not read")


class _Prefixed:
    """A stream's ``read`` with bytes already taken from it put back in front."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head, self._stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._stream.read(n)
        if n is None or n < 0:
            data, self._head = self._head + self._stream.read(), b""
            return data
        data, self._head = self._head[:n], self._head[n:]
        return data + self._stream.read(n - len(data)) if len(data) < n else data


def _read_exact(stream: Any, n: int) -> bytes:
    """``n`` bytes, or fewer only where the stream ends (a pipe may give less a read)."""
    data = stream.read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n and (more := stream.read(n - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _skip(stream: Any, n: int) -> int:
    """Pass over ``n`` bytes (a seek where the stream can, else reads); the count passed over."""
    if n <= 0:
        return 0
    seekable = getattr(stream, "seekable", None)
    if n >= _SEEK_FROM and seekable is not None and seekable():  # smaller: read through the buffer
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(min(here + n, end))
        return min(n, end - here)
    passed = 0
    while passed < n and (chunk := stream.read(min(n - passed, 1 << 20))):
        passed += len(chunk)
    return passed


def _number(field: bytes, what: str, at: int) -> int:
    """A header's numeric field: octal digits (NUL or space ended), or GNU's base-256."""
    if field[:1] in (b"\x80", b"\xff"):  # base-256, big-endian, the first byte's top bit the flag
        value = int.from_bytes(field[1:], "big")
        return value if field[0] == 0x80 else value - (1 << (8 * (len(field) - 1)))
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise tarfile.ReadError(f"damaged header at byte {at}: its {what} field is {field!r}") from None


def _header_ok(block: bytes, at: int) -> bool:
    """The header's checksum: its bytes summed with the checksum field read as spaces (tarfile also
    takes the sum of signed bytes, which some old writers used)."""
    stored = _number(block[148:156], "checksum", at)
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)
    return stored == signed


def _pax_records(data: bytes, at: int) -> dict:
    """A pax extended header's ``length key=value\\n`` records."""
    records, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise tarfile.ReadError(f"damaged pax header at byte {at}") from None
        if space < 0 or length <= 0 or pos + length > len(data):
            raise tarfile.ReadError(f"damaged pax header at byte {at}")
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value
        pos += length
    return records


def _plain_members(stream: Any, head: bytes, wanted: Callable[[str], bool], max_bytes: Optional[int],
                   too_big: Optional[Callable[[str, int], None]]) -> Iterator[Tuple[str, bytes]]:
    """:func:`tar_members` of an uncompressed tar whose first block (or what there is of it) is
    ``head``, the stream positioned after it."""
    at, block = 0, head
    long_name: Optional[str] = None
    pax: dict = {}
    while True:
        if len(block) < _BLOCK:  # the stream ended at or inside a header
            _check_end(at, at + len(block), False)
        if block == _ZEROS:  # the first end-of-archive block: the second and only zeros must follow
            rest, nonzero = _drain(stream)
            _check_end(at, at + _BLOCK + rest, nonzero)
            return
        if not _header_ok(block, at):
            if at == 0:
                raise tarfile.ReadError("not a tar file: its first block is no tar header")
            raise tarfile.ReadError(f"damaged header at byte {at} (its checksum is wrong): the rest is not read")
        kind = block[156:157]
        size = int(pax["size"]) if "size" in pax else _number(block[124:136], "size", at)
        padded = size + (-size % _BLOCK)
        at += _BLOCK
        if kind in (b"L", b"K", b"x"):  # GNU long name / link name, pax extended header: for the next member
            data = _read_exact(stream, padded)
            if len(data) < padded:
                raise tarfile.ReadError("unexpected end of data")
            if kind == b"L":
                long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            else:
                pax = _pax_records(data[:size], at - _BLOCK)
                if "size" in pax and not pax["size"].isdigit():
                    raise tarfile.ReadError(f"damaged pax header at byte {at - _BLOCK}: size {pax['size']!r}")
            at += padded
            block = _read_exact(stream, _BLOCK)
            continue
        if "path" in pax:
            name = pax["path"].decode("utf-8", "surrogateescape")
        elif long_name is not None:
            name = long_name
        else:
            name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = block[345:500].split(b"\0", 1)[0] if block[257:265] == _POSIX_MAGIC else b""
            if prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        long_name, pax = None, {}
        if kind in _REGULAR and not name.endswith("/") and wanted(name):
            if max_bytes is not None and size > max_bytes:
                if too_big is not None:
                    too_big(name, size)
                if _skip(stream, padded) < padded:
                    raise tarfile.ReadError("unexpected end of data")
            else:
                data = _read_exact(stream, padded)
                if len(data) < size:
                    raise tarfile.ReadError("unexpected end of data")
                yield name, data[:size] if padded != size else data
                if len(data) < padded:  # the last member's padding cut: the end check says so
                    at += len(data)
                    _check_end(at, at, False)
        elif _skip(stream, padded) < padded:
            raise tarfile.ReadError("unexpected end of data")
        at += padded
        block = _read_exact(stream, _BLOCK)


def tar_members(stream: Any, wanted: Callable[[str], bool], max_bytes: Optional[int] = None,
                too_big: Optional[Callable[[str, int], None]] = None) -> Iterator[Tuple[str, bytes]]:
    """``(name, bytes)`` of each regular member of the tar read from ``stream`` (plain or
    compressed) whose name ``wanted`` accepts, in order; the others are passed over unread, and so
    is a wanted member larger than ``max_bytes`` (None: no limit), reported to ``too_big(name,
    size)``. The shard's end is checked (:func:`check_tar_end`). Damage raises ``tarfile.ReadError``
    (or, compressed, ``tarfile.TarError``, ``EOFError``, ``zlib.error`` or ``OSError`` from the
    decompressor) where it is met: the members before it were given."""
    head = _read_exact(stream, _BLOCK)
    if not head.startswith(_COMPRESSED):
        yield from _plain_members(stream, head, wanted, max_bytes, too_big)
        return
    with tarfile.open(fileobj=_Prefixed(head, stream), mode="r|*") as tar:
        for member in tar:
            if member.isreg() and wanted(member.name):
                if max_bytes is not None and member.size > max_bytes:
                    if too_big is not None:
                        too_big(member.name, member.size)
                else:
                    yield member.name, tar.extractfile(member).read()
            tar.members = []  # stream mode keeps every header otherwise
        check_tar_end(tar)
