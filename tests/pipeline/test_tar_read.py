"""The shard reader (pipeline/data/tar_read.py) against the standard library's tarfile on the same
archives: every tar format tarfile writes, long and non-ASCII names, members of awkward sizes,
streams that give a few bytes a read, compressed shards, and damage."""

import gzip
import io
import tarfile

import pytest

from infclip.pipeline.data.tar_read import tar_members


class _Trickle:
    """A stream that cannot seek and gives at most ``step`` bytes a read, as a pipe may."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def read(self, n: int = -1) -> bytes:
        n = self._step if n is None or n < 0 else min(n, self._step)
        chunk = self._data[self._pos:self._pos + n]
        self._pos += len(chunk)
        return chunk


def _member(tar, name, data=b"", kind=tarfile.REGTYPE, **kw):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, len(data), 0
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _archive(fmt: int, compress: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w" + (f":{compress}" if compress else ""), format=fmt) as tar:
        _member(tar, "000000000.jpg", bytes(range(256)) * 7)  # 1,792 bytes: padded
        _member(tar, "000000000.txt", b"a caption")
        _member(tar, "000000001.jpg", b"\x01" * 1024)  # a whole number of blocks: no padding
        _member(tar, "000000001.txt", b"")  # empty
        _member(tar, "dir", kind=tarfile.DIRTYPE)
        _member(tar, "link.txt", kind=tarfile.SYMTYPE, linkname="000000000.txt")
        deep = "/".join(["a-rather-long-folder-name"] * 6) + "/000000002.jpg"  # > 100 characters
        _member(tar, deep, b"deep" * 300)
        _member(tar, "photos/café-000000003.json", '{"caption": "crème brûlée"}'.encode())
    return buf.getvalue()


def _tarfile_members(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("compress", ["", "gz"])
@pytest.mark.parametrize("step", [None, 1, 700])
def test_the_members_are_tarfiles_own(fmt, compress, step):
    data = _archive(fmt, compress)  # ustar keeps the long name in its prefix field, GNU and pax in a header before
    stream = io.BytesIO(data) if step is None else _Trickle(data, step)
    got = list(tar_members(stream, lambda name: True))
    assert got == _tarfile_members(data)
    assert [n for n, _ in got][-2:] == ["/".join(["a-rather-long-folder-name"] * 6) + "/000000002.jpg",
                                       "photos/café-000000003.json"]


def test_wanted_and_max_bytes_pass_members_over_seeking_or_reading():
    big = b"x" * (3 << 20)  # passed over by a seek where the stream can
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _member(tar, "0.jpg", big)
        _member(tar, "0.txt", b"zero")
        _member(tar, "1.txt", b"y" * 600)
        _member(tar, "2.txt", b"two")
    data = buf.getvalue()
    for stream in (io.BytesIO(data), _Trickle(data, 4096)):
        over = []
        got = list(tar_members(stream, lambda n: n.endswith(".txt"), max_bytes=512,
                               too_big=lambda n, size: over.append((n, size))))
        assert got == [("0.txt", b"zero"), ("2.txt", b"two")] and over == [("1.txt", 600)]


def test_a_size_in_base_256_is_read():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        _member(tar, "0.txt", b"z" * 700)
    data = bytearray(buf.getvalue())
    data[124:136] = b"\x80" + (700).to_bytes(11, "big")  # GNU's base-256 form of the same size
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    assert _tarfile_members(bytes(data)) == [("0.txt", b"z" * 700)]
    assert list(tar_members(io.BytesIO(bytes(data)), lambda n: True)) == [("0.txt", b"z" * 700)]


def test_damage_is_reported_where_it_is_met_after_the_members_before_it():
    data = _archive(tarfile.USTAR_FORMAT)
    whole = _tarfile_members(data)
    second = 512 + 2048  # the second member's header: after the first's header and 1,792 bytes padded
    assert data[second:second + 13] == b"000000000.txt"
    damaged = data[:second + 5] + b"?" + data[second + 6:]
    got = []
    with pytest.raises(tarfile.ReadError, match=f"damaged header at byte {second}"):
        for member in tar_members(io.BytesIO(damaged), lambda n: True):
            got.append(member)
    assert got == whole[:1]
    with pytest.raises(tarfile.ReadError, match="not a tar file"):
        list(tar_members(io.BytesIO(b"GIF89a" + bytes(600)), lambda n: True))
    with pytest.raises(tarfile.ReadError, match="cut short: 0 bytes"):
        list(tar_members(io.BytesIO(b""), lambda n: True))
    with pytest.raises(tarfile.ReadError, match="data after the end of its members"):
        list(tar_members(io.BytesIO(data + data), lambda n: True))
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        list(tar_members(io.BytesIO(data[:512 + 1000]), lambda n: True))
    cut = gzip.compress(data)[:-40]
    with pytest.raises((tarfile.TarError, EOFError, OSError)):
        list(tar_members(io.BytesIO(cut), lambda n: True))
