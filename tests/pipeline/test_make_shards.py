"""The make_shards CLI writes shards that the loaders read back (labels included)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from infclip.pipeline.data.build import build_eval_loader
from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.shards import DIGITS_CLASSNAMES
from infclip.pipeline.data.tokenizer import load_tokenizer

_SPEC = importlib.util.spec_from_file_location(
    "make_shards_cli", Path(__file__).resolve().parents[2] / "launch" / "make_shards.py")
make_shards = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(make_shards)


def test_digits_cli_writes_loadable_labelled_shards(tmp_path, digits_shards):
    out = make_shards.main(["--digits", "--out", str(tmp_path / "d"), "--image-size", "16",
                            "--samples-per-shard", "500"])
    train, test = expand_urls(out["train"]), expand_urls(out["test"])
    assert len(train) == 3 and len(test) == 1 and all(Path(p).is_file() for p in train + test)
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    batches = list(build_eval_loader(out["test"], tok, image_size=16, context_length=16, batch_size=200))
    labels = torch.cat([b["label"] for b in batches])
    captions = [c for b in batches for c in b["caption"]]
    assert len(labels) == 359 and set(labels.tolist()) == set(range(10))
    assert batches[0]["pixel_values"].shape[1:] == (3, 16, 16)
    # every caption names its own digit (by name or numeral)
    for label, caption in zip(labels.tolist(), captions):
        assert DIGITS_CLASSNAMES[label] in caption or str(label) in caption
    n_train = sum(b["pixel_values"].shape[0] for b in build_eval_loader(
        out["train"], tok, image_size=16, context_length=16, batch_size=500, with_labels=False))
    assert n_train == 1797 - 359


def test_image_dir_cli(tmp_path, digits_shards):
    from PIL import Image

    src = tmp_path / "imgs"
    src.mkdir()
    for i in range(5):
        Image.new("RGB", (9, 7), (i * 40, 0, 0)).save(src / f"p{i}.jpg")
    (src / "captions.tsv").write_text("".join(f"p{i}.jpg\tred square {i}\n" for i in range(5)))
    out = make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "s"), "--samples-per-shard", "2"])
    assert len(expand_urls(out["train"])) == 3
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    batches = list(build_eval_loader(out["train"], tok, image_size=7, context_length=16, batch_size=5,
                                     with_labels=False))
    assert [c for b in batches for c in b["caption"]] == [f"red square {i}" for i in range(5)]
    (src / "p5.jpg").write_bytes((src / "p0.jpg").read_bytes())
    with pytest.raises(ValueError, match="p5.jpg"):
        make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "t")])


def test_an_out_folder_holding_shards_is_refused_unless_overwrite_replaces_them(tmp_path):
    from PIL import Image

    src = tmp_path / "imgs"
    src.mkdir()
    for i in range(5):
        Image.new("RGB", (9, 7), (i * 40, 0, 0)).save(src / f"p{i}.jpg")
        (src / f"p{i}.txt").write_text(f"red square {i}")
    out = tmp_path / "s"
    first = expand_urls(make_shards.main(["--image-dir", str(src), "--out", str(out), "--samples-per-shard", "2"])["train"])
    before = {p: Path(p).read_bytes() for p in first}
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(ValueError, match=r"already holds 3 shard\(s\) named shard-NNNNNN.tar .*--overwrite"):
        make_shards.main(["--image-dir", str(src), "--out", str(out), "--samples-per-shard", "1"])
    assert {p: Path(p).read_bytes() for p in first} == before
    # another prefix is another set: allowed beside it
    assert expand_urls(make_shards.main(["--image-dir", str(src), "--out", str(out), "--prefix", "b"])["train"]) == [
        str(out / "b-000000.tar")]
    # --overwrite with fewer, larger shards: the old third shard is gone, the rest rewritten
    again = make_shards.main(["--image-dir", str(src), "--out", str(out), "--samples-per-shard", "3", "--overwrite"])
    assert expand_urls(again["train"]) == first[:2]
    assert sorted(p.name for p in out.iterdir()) == ["b-000000.tar", "notes.txt", "shard-000000.tar", "shard-000001.tar"]


def test_resize_makes_every_image_a_baseline_jpeg_no_larger_than_the_side(tmp_path):
    """--resize 256, as img2dataset's keep_ratio: a large photo's shorter side scaled to 256 (from a
    drafted decode), a PNG with alpha and a progressive JPEG re-encoded as baseline RGB JPEGs, a
    quarter-turned EXIF photo turned upright, a small baseline JPEG copied byte for byte; the
    metadata keeps each original size; the shards' members are what the GPU decode path takes."""
    import io
    import json
    import tarfile

    import numpy as np
    from PIL import Image

    from infclip.pipeline.data.jpeg_boxes import gpu_decodable

    src = tmp_path / "imgs"
    src.mkdir()
    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (600, 900, 3), dtype=np.uint8))
    photo.save(src / "a_wide.jpg", quality=90)
    Image.new("RGBA", (300, 500), (0, 128, 255, 128)).save(src / "b_alpha.png")
    photo.resize((300, 200)).save(src / "c_progressive.jpg", progressive=True)
    photo.resize((200, 120)).save(src / "d_small.jpg", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: shown turned a quarter clockwise
    photo.resize((640, 400)).save(src / "e_turned.jpg", exif=exif)
    (src / "captions.tsv").write_text("".join(f"{p.name}\tcaption {p.stem}\n" for p in sorted(src.glob("*.*"))))
    out = make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "s"), "--resize", "256"])
    members = {}
    for path in expand_urls(out["train"]):
        with tarfile.open(path) as tar:
            members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    images = {json.loads(members[k[:-4] + ".json"])["filename"]: members[k] for k in members if k.endswith(".jpg")}
    metas = {json.loads(v)["filename"]: json.loads(v) for k, v in members.items() if k.endswith(".json")}
    sizes = {}
    for name, data in images.items():
        with Image.open(io.BytesIO(data)) as img:
            sizes[name] = img.size
            assert gpu_decodable(img, img.mode), name
    assert sizes == {"a_wide.jpg": (384, 256), "b_alpha.png": (256, 427), "c_progressive.jpg": (300, 200),
                     "d_small.jpg": (200, 120), "e_turned.jpg": (256, 410)}
    assert images["d_small.jpg"] == (src / "d_small.jpg").read_bytes()
    assert metas["a_wide.jpg"]["original_width"] == 900 and metas["e_turned.jpg"]["original_height"] == 400
    with Image.open(io.BytesIO(images["b_alpha.png"])) as img:  # half-transparent blue on white
        assert np.abs(np.asarray(img, dtype=float).mean((0, 1)) - (127, 191, 255)).max() < 3
    one = make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "one"), "--resize", "256", "--workers", "1"])
    assert [Path(p).read_bytes() for p in expand_urls(one["train"])] == \
        [Path(p).read_bytes() for p in expand_urls(out["train"])]  # the same shards from one process or several
    (src / "f_cut.jpg").write_bytes((src / "a_wide.jpg").read_bytes()[:3000])  # its header whole, its body cut
    with open(src / "captions.tsv", "a") as f:
        f.write("f_cut.jpg\tcaption f_cut\n")
    with pytest.raises(ValueError, match="f_cut.jpg: the image cannot be decoded to resize it"):
        make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "cut"), "--resize", "256"])
    with pytest.raises(ValueError, match="resize must be a side of at least 1 pixel, got 0"):
        make_shards.main(["--image-dir", str(src), "--out", str(tmp_path / "t"), "--resize", "0"])


def _tar(path: Path, members) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _read_tar(path) -> list:
    import tarfile

    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_existing_shards_are_copied_with_their_images_resized(tmp_path, digits_shards):
    """--shards URL --resize 256: every shard written under its own name to --out, its samples in
    order; a large JPEG and a PNG become baseline JPEGs of shorter side 256 (the json's width and
    height follow), a small baseline JPEG, an image nobody can decode and every other member are
    copied byte for byte; the loader reads the same captions from the copies; the originals are
    untouched."""
    import io
    import json

    import numpy as np
    from PIL import Image

    from infclip.pipeline.data.jpeg_boxes import gpu_decodable

    def encoded(img, **kw):
        buf = io.BytesIO()
        img.save(buf, **kw)
        return buf.getvalue()

    rng = np.random.default_rng(1)
    photo = Image.fromarray(rng.integers(0, 256, (512, 768, 3), dtype=np.uint8))
    large = encoded(photo, format="JPEG", quality=90)
    small = encoded(photo.resize((200, 120)), format="JPEG", quality=90)
    png = encoded(Image.new("RGBA", (300, 500), (0, 128, 255, 128)), format="PNG")
    broken = large[:len(large) // 3]  # its header reads, its body is cut
    meta = json.dumps({"width": 768, "height": 512, "original_width": 1536, "url": "http://x/1"}).encode()
    src = tmp_path / "in"
    src.mkdir()
    shards = [
        [("000000000.jpg", large), ("000000000.txt", b"a large photo"), ("000000000.json", meta),
         ("000000001.png", png), ("000000001.txt", b"a png"), ("000000001.cls", b"7"),
         ("000000002.txt", b"a caption without an image")],
        [("000000003.jpg", small), ("000000003.txt", b"a small photo"),
         ("000000004.jpg", broken), ("000000004.txt", b"a broken photo")],
    ]
    for k, members in enumerate(shards):
        _tar(src / f"{k:05d}.tar", members)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    url = str(src / "{00000..00001}.tar")
    out = make_shards.main(["--shards", url, "--resize", "256", "--out", str(tmp_path / "out"), "--workers", "2"])
    assert out == {"shards": str(tmp_path / "out" / "{00000..00001}.tar")}
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before

    first, second = (_read_tar(p) for p in expand_urls(out["shards"]))
    assert [n for n, _ in first] == ["000000000.jpg", "000000000.txt", "000000000.json", "000000001.jpg",
                                     "000000001.txt", "000000001.cls", "000000002.txt"]
    assert second == shards[1]  # already small enough, and undecodable: both as they were
    got = dict(first)
    for name in ("000000000.jpg", "000000001.jpg"):
        with Image.open(io.BytesIO(got[name])) as img:
            assert min(img.size) == 256 and gpu_decodable(img, img.mode), (name, img.size)
    with Image.open(io.BytesIO(got["000000000.jpg"])) as img:
        assert img.size == (384, 256)
    assert json.loads(got["000000000.json"]) == {"width": 384, "height": 256, "original_width": 1536,
                                                 "url": "http://x/1"}
    for name in ("000000000.txt", "000000001.txt", "000000001.cls", "000000002.txt"):
        assert got[name] == dict(shards[0])[name]

    tok = load_tokenizer(digits_shards["tokenizer_dir"])

    def captions(shard_url):
        return [c for b in build_eval_loader(shard_url, tok, image_size=16, context_length=16, batch_size=8,
                                             with_labels=False) for c in b["caption"]]

    assert captions(out["shards"]) == captions(url) == ["a large photo", "a png", "a small photo"]


def test_copying_shards_refuses_what_would_lose_or_replace_files(tmp_path):
    """--shards: no --resize, the shards' own folder as --out, or an --out holding those names
    (without --overwrite) are refused before anything is written; a shard cut short is named
    and not written, the others are."""
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (300, 300), (9, 9, 9)).save(buf, format="JPEG")
    src = tmp_path / "in"
    src.mkdir()
    for k in range(2):
        _tar(src / f"s{k}.tar", [(f"{k:09d}.jpg", buf.getvalue()), (f"{k:09d}.txt", b"grey")])
    url, out = str(src / "s{0..1}.tar"), tmp_path / "out"
    with pytest.raises(ValueError, match="give the side with --resize"):
        make_shards.main(["--shards", url, "--out", str(out)])
    with pytest.raises(ValueError, match="give one of the two"):
        make_shards.main(["--shards", url, "--resize", "256", "--out", str(out), "--resume", "--overwrite"])
    with pytest.raises(ValueError, match="holds the shards themselves"):
        make_shards.main(["--shards", url, "--resize", "256", "--out", str(src)])
    assert not out.exists()
    make_shards.main(["--shards", url, "--resize", "256", "--out", str(out)])
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=r"already holds 2 of the 2 shard names .*--resume .*--overwrite"):
        make_shards.main(["--shards", url, "--resize", "128", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written
    make_shards.main(["--shards", url, "--resize", "128", "--out", str(out), "--overwrite"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} != written

    # a copy that was killed: one shard whole, the other's temporary file; --resume writes the other
    (out / "s1.tar").unlink()
    (out / ".s1.tar.tmp-4242").write_bytes(b"half a shard")
    kept = (out / "s0.tar").stat()
    assert make_shards.main(["--shards", url, "--resize", "256", "--out", str(out), "--resume"]) == {
        "shards": str(out / "s{0..1}.tar")}
    assert sorted(p.name for p in out.iterdir()) == ["s0.tar", "s1.tar"]
    assert (out / "s0.tar").stat().st_mtime_ns == kept.st_mtime_ns
    assert (out / "s1.tar").read_bytes() == written["s1.tar"]

    cut = src / "s1.tar"
    cut.write_bytes(cut.read_bytes()[:700])  # inside the first member
    with pytest.raises(ValueError, match=r"1 of 2 shard\(s\) could not be read to their end .*s1\.tar"):
        make_shards.main(["--shards", url, "--resize", "256", "--out", str(tmp_path / "again")])
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["s0.tar"]


def test_a_gzipped_shard_is_copied_gzipped(tmp_path):
    import gzip
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (400, 300), (9, 90, 9)).save(buf, format="JPEG")
    plain = tmp_path / "s.tar"
    _tar(plain, [("000000000.jpg", buf.getvalue()), ("000000000.txt", b"green")])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "s.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
    out = make_shards.main(["--shards", str(tmp_path / "in" / "s.tar.gz"), "--resize", "100", "--out",
                            str(tmp_path / "out")])
    copy = Path(out["shards"])
    assert copy == tmp_path / "out" / "s.tar.gz" and copy.read_bytes()[:2] == b"\x1f\x8b"
    members = dict(_read_tar(copy))
    assert members["000000000.txt"] == b"green"
    with Image.open(io.BytesIO(members["000000000.jpg"])) as img:
        assert img.size == (133, 100)


def test_a_copy_killed_mid_way_goes_on_with_resume_to_the_same_shards(tmp_path):
    """kill -9 during --shards (after its first shard): --resume completes it, and the shards equal
    those of a copy that was never stopped, byte for byte; no temporary file is left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import numpy as np
    from PIL import Image

    from infclip.pipeline.data.shards import write_shards

    rng = np.random.default_rng(3)
    pictures = ((Image.fromarray(rng.integers(0, 256, (384, 512, 3), dtype=np.uint8)), f"noise {i}", None)
                for i in range(48))
    write_shards(pictures, tmp_path / "in", samples_per_shard=8)
    url = str(tmp_path / "in" / "shard-{000000..000005}.tar")
    cli = [sys.executable, str(Path(make_shards.__file__)), "--shards", url, "--resize", "128", "--workers", "1"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(cli + ["--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None and not (killed / "shard-000000.tar").exists():
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "shard-000005.tar").exists()  # stopped mid-way: one worker, a shard at a time
    subprocess.run(cli + ["--out", str(killed), "--resume"], check=True, capture_output=True)
    subprocess.run(cli + ["--out", str(tmp_path / "whole")], check=True, capture_output=True)
    copies = {p.name: p.read_bytes() for p in killed.iterdir()}
    assert copies == {p.name: p.read_bytes() for p in (tmp_path / "whole").iterdir()}
    assert len(copies) == 6
