"""Data pipeline tests on real tar shards written to tmp dirs (no mocks of webdataset)."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from infclip.ops.config import ConfigError
from infclip.pipeline.data.build import build_eval_loader, build_train_loader
from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD, DataConfig
from infclip.pipeline.data.loader import measure_loader_throughput
from infclip.pipeline.data.shard_urls import expand_urls, prepare_shards
from infclip.pipeline.data.shards import EncodedImage, brace_url, folder_samples, write_shards
from infclip.pipeline.data.tokenizer import load_tokenizer

MEAN = torch.tensor(CLIP_MEAN).view(1, 3)
STD = torch.tensor(CLIP_STD).view(1, 3)


@pytest.fixture(scope="module")
def tok(digits_shards):
    return load_tokenizer(digits_shards["tokenizer_dir"])


def _solid(i: int, size: int = 12) -> Image.Image:
    """A solid-colour image whose colour encodes ``i`` (survives any crop and resize)."""
    return Image.new("RGB", (size, size), (i % 256, i // 256, 77))


def _ids(batch) -> list:
    """Recover the ``_solid`` index of each image in a batch."""
    rgb = (batch["pixel_values"][:, :, 0, 0] * STD + MEAN) * 255.0
    rgb = rgb.round().long()
    return (rgb[:, 0] + 256 * rgb[:, 1]).tolist()


def _solid_shards(out: Path, n_shards: int, per_shard: int) -> str:
    samples = ((_solid(i), f"sample number {i}", {"label": i % 10}) for i in range(n_shards * per_shard))
    return brace_url(write_shards(samples, out, samples_per_shard=per_shard, image_format="png"))


def _cfg(url: str, **kw) -> DataConfig:
    base = {"train_shards": url, "workers": 0, "shuffle_buffer": 8, "seed": 3}
    base.update(kw)
    return DataConfig.from_dict(base, source="test.json")


def _train(cfg, tok, **kw):
    args = dict(image_size=8, context_length=16, batch_size=3, rank=0, world_size=1)
    args.update(kw)
    return build_train_loader(cfg, tok, **args)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    _solid(i).save(buf, format="PNG")
    return buf.getvalue()


def test_shard_round_trip(tmp_path, tok):
    images = [Image.fromarray(np.random.default_rng(i).integers(0, 256, (10, 10, 3), dtype=np.uint8))
              for i in range(7)]
    captions = [f"caption {i} with ünïcode" for i in range(7)]
    paths = write_shards(((im, c, {"label": i}) for i, (im, c) in enumerate(zip(images, captions))),
                         tmp_path, samples_per_shard=3, image_format="png")
    assert [Path(p).name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert not list(tmp_path.glob(".*tmp*"))  # atomic write left no temporary file
    with tarfile.open(paths[0]) as tar:
        assert tar.getnames() == ["000000000.png", "000000000.txt", "000000000.json", "000000001.png",
                                  "000000001.txt", "000000001.json", "000000002.png", "000000002.txt",
                                  "000000002.json"]
    loader = build_eval_loader(brace_url(paths), tok, image_size=10, context_length=16, batch_size=4)
    batches = list(loader)
    assert [b["pixel_values"].shape[0] for b in batches] == [4, 3]
    got_caps = [c for b in batches for c in b["caption"]]
    assert got_caps == captions
    assert torch.cat([b["label"] for b in batches]).tolist() == list(range(7))
    pixels = torch.cat([b["pixel_values"] for b in batches])
    want = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255 for im in images])
    want = (want - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    torch.testing.assert_close(pixels, want)
    assert {k: v for k, v in loader.stats.items() if k != "worker_s"} == {"batches": 2, "samples": 7, "skipped": 0}
    assert loader.stats["worker_s"] > 0


def test_brace_expansion(tmp_path):
    assert expand_urls("d/s-{000..002}.tar") == ["d/s-000.tar", "d/s-001.tar", "d/s-002.tar"]
    assert expand_urls(["a-{0..1}.tar", "b.tar"]) == ["a-0.tar", "a-1.tar", "b.tar"]
    paths = [str(tmp_path / f"shard-{i:06d}.tar") for i in range(4, 7)]
    assert expand_urls(brace_url(paths)) == paths


def test_split_by_rank_and_worker_is_disjoint_and_covering(tmp_path, tok):
    url = _solid_shards(tmp_path, n_shards=8, per_shard=6)
    cfg = _cfg(url, workers=2)
    per_rank = []
    for rank in range(2):
        ids = [i for b in _train(cfg, tok, rank=rank, world_size=2) for i in _ids(b)]
        assert len(ids) == len(set(ids)) == 24  # 4 shards x 6 samples, batches of 3: nothing dropped
        per_rank.append(set(ids))
    assert not per_rank[0] & per_rank[1]
    assert per_rank[0] | per_rank[1] == set(range(48))


def test_epoch_shuffle_differs_and_is_deterministic(tmp_path, tok):
    url = _solid_shards(tmp_path, n_shards=4, per_shard=6)
    cfg = _cfg(url)

    def order(**kw):
        return [i for b in _train(cfg, tok, **kw) for i in _ids(b)]

    e0, e0_again, e1 = order(epoch=0), order(epoch=0), order(epoch=1)
    assert e0 == e0_again
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(24))
    assert order(epoch=0, seed=4) != e0
    assert e0 != sorted(e0)  # the shuffle buffer moved samples within the stream


@pytest.mark.parametrize("workers,start", [(0, 5), (2, 7)])
def test_resume_yields_exactly_the_remaining_batches(digits_shards, tok, workers, start):
    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "workers": workers, "shuffle_buffer": 50,
                                "samples_per_epoch": 16 * 14, "crop_scale": [0.5, 1.0]})
    kw = dict(image_size=16, context_length=16, batch_size=16, epoch=2)
    full = list(build_train_loader(cfg, tok, **kw))
    assert len(full) == 14
    resumed = list(build_train_loader(cfg, tok, start_batch=start, **kw))
    assert len(resumed) == len(full) - start
    for a, b in zip(full[start:], resumed):
        assert torch.equal(a["pixel_values"], b["pixel_values"])
        assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(full[start - 1]["pixel_values"], resumed[0]["pixel_values"])


def test_resampled_epoch_length(tmp_path, tok):
    url = _solid_shards(tmp_path, n_shards=2, per_shard=6)
    cfg = _cfg(url, resampled=True, samples_per_epoch=60, workers=2)
    loader = _train(cfg, tok, rank=1, world_size=2)
    assert loader.batches_per_epoch == 10
    batches = list(loader)
    assert len(batches) == 10
    ids = [i for b in batches for i in _ids(b)]
    assert set(ids) <= set(range(12)) and len(ids) > len(set(ids))  # drawn with replacement


def test_corrupt_image_and_missing_caption_are_skipped_and_counted(tmp_path, tok):
    path = tmp_path / "broken-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(7):
            key = f"{i:09d}"
            if i == 2:
                _add(tar, f"{key}.jpg", b"\xff\xd8\xff\xe0 this is not a jpeg")
            else:
                _add(tar, f"{key}.png", _png(i))
            if i != 5:
                _add(tar, f"{key}.txt", f"caption {i}".encode())
    loader = build_eval_loader(str(path), tok, image_size=8, context_length=16, batch_size=10)
    (batch,) = list(loader)
    assert _ids(batch) == [0, 1, 3, 4, 6]
    assert int(batch["num_skipped"]) == 2
    assert loader.stats["skipped"] == 2
    train = _train(_cfg(str(path), shuffle_buffer=0), tok, batch_size=5)
    (tbatch,) = list(train)
    assert sorted(_ids(tbatch)) == [0, 1, 3, 4, 6] and train.stats["skipped"] == 2


def test_a_duplicate_member_is_ignored_with_one_warning_and_skips_nothing(tmp_path, tok, caplog):
    """A sample with two members of one name keeps its first, and is used: nothing counts as
    skipped; one warning a shard names the member."""
    path = tmp_path / "dup-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(4):
            _add(tar, f"{i:09d}.png", _png(i))
            _add(tar, f"{i:09d}.txt", f"caption {i}".encode())
            if i in (1, 3):
                _add(tar, f"{i:09d}.txt", b"a second caption")
    with caplog.at_level("WARNING", logger="infclip.pipeline.data"):
        loader = build_eval_loader(str(path), tok, image_size=8, context_length=16, batch_size=10)
        (batch,) = list(loader)
    assert _ids(batch) == [0, 1, 2, 3] and batch["caption"] == [f"caption {i}" for i in range(4)]
    assert int(batch["num_skipped"]) == 0 and loader.stats["skipped"] == 0 and loader.skipped_by_reason == {}
    warned = [r.getMessage() for r in caplog.records if "duplicate member" in r.getMessage()]
    assert len(warned) == 1 and "000000001.txt" in warned[0]


def test_skip_counts_reach_main_process_from_workers(tmp_path, tok):
    for s in range(2):
        with tarfile.open(tmp_path / f"w-{s}.tar", "w") as tar:
            for i in range(4):
                _add(tar, f"{s}{i:08d}.png", _png(10 * s + i) if i != 1 else b"garbage")
                _add(tar, f"{s}{i:08d}.txt", b"c")
    loader = _train(_cfg(str(tmp_path / "w-{0..1}.tar"), workers=2, shuffle_buffer=0), tok, batch_size=3)
    batches = list(loader)
    assert len(batches) == 2 and loader.stats["skipped"] == 2


def test_resume_does_not_count_the_replayed_skips_again(tmp_path, tok):
    """A resumed worker re-reads the samples of the batches it already made; the skips among them
    were counted by the run that made those batches, so the run's total stays that of the
    uninterrupted run however often it resumes."""
    from infclip.pipeline.train.loop import Batches
    from infclip.pipeline.train.run_state import RunState

    path = tmp_path / "cap-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(12):
            _add(tar, f"{i:09d}.png", _png(i))
            if i not in (1, 4):  # no caption: skipped while making batches 0 and 1
                _add(tar, f"{i:09d}.txt", b"a caption")
    cfg = _cfg(str(path), shuffle_buffer=0)
    full = list(_train(cfg, tok))
    assert [int(b["num_skipped"]) for b in full] == [1, 1, 0]
    for start in (1, 2):
        resumed = list(_train(cfg, tok, start_batch=start))
        assert [_ids(b) for b in resumed] == [_ids(b) for b in full[start:]]
        assert [int(b["num_skipped"]) for b in resumed] == [int(b["num_skipped"]) for b in full[start:]]

    def build(epoch, start):
        return _train(cfg, tok, epoch=epoch, start_batch=start)

    whole = RunState()
    run = Batches(build, whole, max_epochs=1)
    for _ in range(3):
        run.next()
    state = RunState()
    run = Batches(build, state, max_epochs=1)
    run.next()
    for _ in range(2):  # stopped after every batch and resumed from the checkpoint's state
        state = RunState(**vars(state))
        Batches(build, state, max_epochs=1).next()
    assert state.batch_in_epoch == whole.batch_in_epoch == 3
    assert state.skipped_samples == whole.skipped_samples == 2


def test_skips_after_the_last_batch_are_counted(tmp_path, tok):
    """The skips a worker meets after its last full batch reach the loader's stats (and the
    run's total) when its stream ends; the records that carry them are not batches."""
    from infclip.pipeline.train.loop import Batches
    from infclip.pipeline.train.run_state import RunState

    path = tmp_path / "tail-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(9):
            _add(tar, f"{i:09d}.png", _png(i))
            if i < 6:  # 6, 7, 8: no caption, after the second (last) batch
                _add(tar, f"{i:09d}.txt", b"a caption")
    cfg = _cfg(str(path), shuffle_buffer=0, workers=1)
    loader = _train(cfg, tok)
    batches = list(loader)
    assert [_ids(b) for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert all("pixel_values" in b and "_skips" not in b for b in batches)
    assert [int(b["num_skipped"]) for b in batches] == [0, 0]
    assert loader.stats["skipped"] == 3 and loader.skipped_by_reason == {"missing_caption": 3}
    state = RunState()
    run = Batches(lambda e, s: _train(cfg, tok, epoch=e, start_batch=s), state, max_epochs=1)
    assert run.next() is not None and run.next() is not None and run.next() is None
    assert state.skipped_samples == 3


@pytest.mark.parametrize("case", ["image_key", "caption_key", "not_a_tar", "too_few"])
def test_an_epoch_without_a_batch_is_an_error_naming_the_epoch_and_cause(tmp_path, tok, case):
    """No batch at all in an epoch (every sample skipped, or too few for one batch) raises on the
    first ``next()`` naming epoch 0 and the skip counts by reason, also with ``max_epochs`` 1
    (where the run would otherwise end at step 0 and export an untrained model)."""
    from infclip.pipeline.train.loop import Batches
    from infclip.pipeline.train.run_state import RunState

    url = _solid_shards(tmp_path, n_shards=2, per_shard=10)
    kw, want = {
        "image_key": ({"image_key": "jpg"}, r"all 20 samples skipped: missing_image=20; check data\.image_key \(jpg\)"),
        "caption_key": ({"caption_key": "caption"},
                        r"all 20 samples skipped: missing_caption=20; check data\.caption_key \('caption'\)"),
        "not_a_tar": ({}, r"no sample could be read: tar_error=2; shards that cannot be read"),
        "too_few": ({}, r"2 usable sample\(s\), fewer than one micro-batch of 3"),
    }[case]
    if case == "not_a_tar":
        url = [str(tmp_path / f"junk-{i}.tar") for i in range(2)]
        for p in url:
            Path(p).write_bytes(b"<html>404 not found</html>" * 40)
    if case == "too_few":
        url = str(tmp_path / "few.tar")
        with tarfile.open(url, "w") as tar:
            for i in range(2):
                _add(tar, f"{i:09d}.png", _png(i))
                _add(tar, f"{i:09d}.txt", b"a caption")
    cfg = _cfg(url, workers=2, **kw)
    for max_epochs in (1, 3):
        state = RunState()
        with pytest.raises(RuntimeError, match=r"no batch in epoch 0 \(rank 0\): " + want):
            Batches(lambda e, s: _train(cfg, tok, epoch=e, start_batch=s), state, max_epochs).next()
        assert state.epoch == 0 and state.step == 0


@pytest.mark.parametrize("cut", ["member_boundary", "header", "mid_member", "end_blocks"])
def test_a_shard_cut_short_is_one_counted_tar_error(tmp_path, tok, caplog, cut):
    """A shard cut short (an interrupted copy) keeps the samples before the cut and counts one
    ``tar_error`` naming the shard, also where tarfile's stream mode ends quietly: a cut at a
    member boundary or inside a header, or only the end-of-archive blocks missing."""
    good = Path(write_shards(((_solid(i), f"caption {i}", None) for i in range(10)), tmp_path / "good",
                             samples_per_shard=10, image_format="png")[0])
    raw = good.read_bytes()
    with tarfile.open(good) as tar:
        members = tar.getmembers()
    png5, txt5 = members[10], members[11]  # sample 5: png then txt
    end = members[-1].offset_data + -(-members[-1].size // 512) * 512
    keep, at = {"member_boundary": (list(range(5)), txt5.offset),
                "header": (list(range(5)), txt5.offset + 100),
                "mid_member": (list(range(5)), png5.offset_data + png5.size // 2),
                "end_blocks": (list(range(10)), end)}[cut]
    path = tmp_path / "cut-000000.tar"
    path.write_bytes(raw[:at])
    caplog.set_level("WARNING", logger="infclip.pipeline.data")
    ev = build_eval_loader(str(path), tok, image_size=8, context_length=16, batch_size=100)
    assert [int(k) for b in ev for k in b["key"]] == keep
    assert ev.skipped_by_reason == {"tar_error": 1}
    train = _train(_cfg(str(path), shuffle_buffer=0, workers=1), tok, batch_size=1)
    assert sorted(i for b in train for i in _ids(b)) == keep
    assert train.stats["skipped"] == 1 and train.skipped_by_reason == {"tar_error": 1}
    warned = [r.getMessage() for r in caplog.records if "tar_error" in r.getMessage()]
    assert warned and all("cut-000000.tar" in m for m in warned)
    if cut != "mid_member":
        assert "cut short" in warned[0]
    good_loader = build_eval_loader(str(good), tok, image_size=8, context_length=16, batch_size=100)
    assert len([k for b in good_loader for k in b["key"]]) == 10 and good_loader.stats["skipped"] == 0


def test_resume_at_the_end_of_an_epoch_goes_on_with_the_next(tmp_path, tok):
    """A run resumed where an epoch ended (its stream gives no batch from there) is no error: the
    next epoch starts; only an epoch read from its start must give a batch."""
    from infclip.pipeline.train.loop import Batches
    from infclip.pipeline.train.run_state import RunState

    cfg = _cfg(_solid_shards(tmp_path, n_shards=1, per_shard=6), shuffle_buffer=0)

    def build(epoch, start):
        return _train(cfg, tok, epoch=epoch, start_batch=start)

    state = RunState(epoch=0, batch_in_epoch=2)
    batch = Batches(build, state, max_epochs=3).next()
    assert (state.epoch, state.batch_in_epoch) == (1, 1)
    assert _ids(batch) == _ids(next(iter(build(1, 0))))
    assert Batches(build, RunState(epoch=0, batch_in_epoch=2), max_epochs=1).next() is None


def test_shards_not_dividing_over_ranks_warn_once_on_rank_0(tmp_path, tok, caplog):
    """3 shards on 2 ranks: every epoch ends when the rank with 1 shard runs out, so the other
    rank's second shard goes unread; rank 0 says so once (not every epoch), and not when the
    shards divide or are resampled."""
    from infclip.pipeline.data import build as data

    url = _solid_shards(tmp_path, n_shards=3, per_shard=6)
    caplog.set_level("WARNING", logger="infclip.pipeline.data")
    data._WARNED.clear()
    lengths = [[len(list(_train(_cfg(url), tok, rank=r, world_size=2, epoch=e))) for r in range(2)] for e in range(2)]
    assert lengths == [[4, 2], [4, 2]]  # what the warning is about
    warned = [r.getMessage() for r in caplog.records if "do not divide" in r.getMessage()]
    assert len(warned) == 1
    assert "3 training shards do not divide over 2 ranks: 1 rank(s) read 2 shard(s) per epoch, the others 1" in warned[0]
    assert "shortest rank" in warned[0] and "divisible by 2" in warned[0] and "'resampled': true" in warned[0]
    caplog.clear()
    data._WARNED.clear()
    _train(_cfg(url), tok, rank=1, world_size=2)
    _train(_cfg(url), tok, rank=0, world_size=3)
    _train(_cfg(url, resampled=True, samples_per_epoch=12), tok, rank=0, world_size=2)
    assert not [r for r in caplog.records if "do not divide" in r.getMessage()]


def _sized_shards(out: Path, sizes) -> list:
    """Shards holding ``sizes`` samples each; sample i (counted over all shards) is ``_solid(i)``."""
    out.mkdir(parents=True, exist_ok=True)
    paths, i = [], 0
    for n, size in enumerate(sizes):
        path = out / f"shard-{n:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for _ in range(size):
                _add(tar, f"{i:09d}.png", _png(i))
                _add(tar, f"{i:09d}.txt", f"sample number {i}".encode())
                i += 1
        paths.append(str(path))
    return paths


def test_more_workers_than_shards_resume_exactly_and_fill_the_epoch(tmp_path, tok, caplog):
    """4 workers for 3 shards: the loader runs 3 (a worker without a shard broke the round-robin
    that resume relies on, and its quota of a samples_per_epoch epoch went unfilled)."""
    from infclip.pipeline.data import build as data

    paths = _sized_shards(tmp_path, [6, 6, 6])
    caplog.set_level("WARNING", logger="infclip.pipeline.data")
    data._WARNED.clear()  # the warnings come once per process
    cfg = _cfg(paths, workers=4, shuffle_buffer=0, shard_shuffle=False)
    full = [_ids(b) for b in _train(cfg, tok)]
    assert full == [[0, 1, 2], [6, 7, 8], [12, 13, 14], [3, 4, 5], [9, 10, 11], [15, 16, 17]]
    for start in (4, 5):
        assert [_ids(b) for b in _train(cfg, tok, start_batch=start)] == full[start:]
    assert any("3 training shard(s) for 4 loader workers: loading with 3" in r.getMessage() for r in caplog.records)
    capped = _train(_cfg(paths, workers=4, shuffle_buffer=0, shard_shuffle=False, samples_per_epoch=18), tok)
    assert capped.batches_per_epoch == 6 and [_ids(b) for b in capped] == full


def test_workers_with_unequal_data_deliver_every_batch_and_resume_exactly(tmp_path, tok, caplog):
    """5 shards over 3 workers (2/2/1, and a short shard): the round-robin skips a worker once its
    data ran out and goes on with the others, so every full batch is read; the loader's position
    after each batch resumes exactly the rest of the uninterrupted epoch (more in
    test_data_unequal.py); nothing is lost, so there is no warning about it."""
    from infclip.pipeline.data import build as data

    paths = _sized_shards(tmp_path, [6, 6, 6, 6, 3])
    caplog.set_level("WARNING", logger="infclip.pipeline.data")
    data._WARNED.clear()  # the warnings come once per process
    cfg = _cfg(paths, workers=3, shuffle_buffer=0, shard_shuffle=False)
    # worker 0: shards 0 and 3 (4 batches), worker 1: shards 1 and 4 (3), worker 2: shard 2 (2)
    loader = _train(cfg, tok, rank=0, world_size=1)
    full, positions = [], [loader.position()]
    for b in loader:
        full.append(_ids(b))
        positions.append(loader.position())
    assert full == [[0, 1, 2], [6, 7, 8], [12, 13, 14], [3, 4, 5], [9, 10, 11], [15, 16, 17], [18, 19, 20],
                    [24, 25, 26], [21, 22, 23]]  # worker 2 ran out after 2 batches, worker 1 after 3
    assert loader.stats["batches"] == 9 and loader.stats["skipped"] == 0
    assert positions[-1] == {"worker_batches": [4, 3, 2], "next_worker": 1}
    assert not [r for r in caplog.records if "loader worker" in r.getMessage() or "do not divide" in r.getMessage()]
    for start in range(10):
        assert [_ids(b) for b in _train(cfg, tok, start_batch=start, position=positions[start])] == full[start:], start


def test_missing_shard_is_a_clear_error(tmp_path, tok):
    url = _solid_shards(tmp_path, n_shards=2, per_shard=3)
    missing = str(tmp_path / "shard-000002.tar")
    bad = url.replace("000001}", "000002}")
    with pytest.raises(FileNotFoundError, match="shard-000002.tar"):
        _train(_cfg(bad), tok)
    with pytest.raises(FileNotFoundError, match="shard-000002.tar"):
        prepare_shards(_cfg(bad))
    with pytest.raises(FileNotFoundError, match="shard-000002.tar"):
        build_eval_loader([url, missing], tok, image_size=8, context_length=16, batch_size=2)


class _Payload:
    """Unpickling this creates a directory: proof that a loader unpickled a member."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __reduce__(self):
        return (os.mkdir, (self.flag,))


def test_pickle_members_are_never_unpickled(tmp_path, tok):
    probe = tmp_path / "probe_flag"
    pickle.loads(pickle.dumps(_Payload(str(probe))))
    assert probe.is_dir()  # the payload really executes when unpickled
    flag = tmp_path / "unpickled_flag"
    payload = pickle.dumps(_Payload(str(flag)))
    path = tmp_path / "evil-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(4):
            key = f"{i:09d}"
            _add(tar, f"{key}.png", _png(i))
            _add(tar, f"{key}.txt", b"a caption")
            for ext in ("pickle", "pyd", "pth"):
                _add(tar, f"{key}.{ext}", payload)
    ev = list(build_eval_loader(str(path), tok, image_size=8, context_length=16, batch_size=4))
    tr = list(_train(_cfg(str(path), workers=1), tok, batch_size=2))
    assert _ids(ev[0]) == [0, 1, 2, 3] and len(tr) == 2
    assert set(ev[0]) == {"pixel_values", "input_ids", "attention_mask", "num_skipped", "worker_s", "caption", "key",
                          "label"}
    assert not flag.exists()


def test_data_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"shufle_buffer.*did you mean 'shuffle_buffer'.*") as exc:
        DataConfig.from_dict({"train_shards": "x.tar", "shufle_buffer": 3}, source="my_config.json")
    assert "my_config.json" in str(exc.value)
    with pytest.raises(ConfigError, match="train_shards"):
        DataConfig.from_dict({}, source="my_config.json")
    with pytest.raises(ConfigError, match="samples_per_epoch"):
        DataConfig.from_dict({"train_shards": "x.tar", "resampled": True})
    with pytest.raises(ConfigError, match="workers"):
        DataConfig.from_dict({"train_shards": "x.tar", "workers": "two"})


def test_generate_digits_writes_the_configured_shards(tmp_path, tok):
    cfg = DataConfig.from_dict({"train_shards": str(tmp_path / "tr-{0..2}.tar"),
                                "val_shards": str(tmp_path / "va-{0..1}.tar"),
                                "generate_digits": True, "digits_image_size": 16, "workers": 0})
    train = prepare_shards(cfg, "train")
    val = prepare_shards(cfg, "val")
    assert [Path(p).name for p in train] == ["tr-0.tar", "tr-1.tar", "tr-2.tar"]
    assert all(Path(p).is_file() for p in train + val)
    labels = torch.cat([b["label"] for b in build_eval_loader(val, tok, image_size=16, context_length=16,
                                                              batch_size=128)])
    assert len(labels) == 359 and set(labels.tolist()) == set(range(10))
    first = next(iter(_train(cfg, tok, image_size=16, batch_size=8)))
    assert first["pixel_values"].shape == (8, 3, 16, 16)


def test_generate_digits_never_writes_over_shards_that_are_there(tmp_path):
    """A shard list of which some files exist (a user's shards, a URL one off) is refused, every
    file left as it was; the digits go only where no listed file is."""
    mine = [tmp_path / f"mine-{k}.tar" for k in range(2)]
    for k, path in enumerate(mine):
        path.write_bytes(b"a user's shard %d" % k)
    cfg = DataConfig.from_dict({"train_shards": str(tmp_path / "mine-{0..2}.tar"), "generate_digits": True})
    with pytest.raises(ConfigError, match=r"1 of the 3 shards .* are missing .*mine-2.tar.* 2 are there .* not the "
                                          r"digits' own"):
        prepare_shards(cfg, "train")
    assert [p.read_bytes() for p in mine] == [b"a user's shard 0", b"a user's shard 1"]
    assert sorted(os.listdir(tmp_path)) == ["mine-0.tar", "mine-1.tar"]


def test_generate_digits_completes_a_generation_cut_short(tmp_path):
    """Shards the digits generation wrote before it was stopped are recognised (byte for byte) and
    the missing ones written; one that is not the digits' own still refuses the list."""
    cfg = DataConfig.from_dict({"train_shards": str(tmp_path / "tr-{0..2}.tar"), "generate_digits": True,
                                "digits_image_size": 16})
    paths = prepare_shards(cfg, "train")
    whole = [Path(p).read_bytes() for p in paths]
    Path(paths[1]).unlink()
    Path(paths[2]).unlink()
    assert prepare_shards(cfg, "train") == paths and [Path(p).read_bytes() for p in paths] == whole
    assert sorted(os.listdir(tmp_path)) == ["tr-0.tar", "tr-1.tar", "tr-2.tar"]  # no temporary folder left
    Path(paths[0]).write_bytes(b"someone else's shard")
    Path(paths[2]).unlink()
    with pytest.raises(ConfigError, match="not the digits' own"):
        prepare_shards(cfg, "train")
    assert Path(paths[0]).read_bytes() == b"someone else's shard" and not Path(paths[2]).exists()


def test_measure_loader_throughput(digits_shards, tok):
    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "workers": 0})
    rate = measure_loader_throughput(_train(cfg, tok, batch_size=16), num_batches=5)
    assert math.isfinite(rate) and rate > 0


def test_worker_time_is_making_the_batch_not_waiting(digits_shards, tok):
    """``worker_s`` is the time a worker spent making a batch: in the main process (no workers)
    the batches' worker_s add up to the loader's wall time; with a worker and a slow consumer
    (0.3 s per batch) it stays the making time, not the time the batch waited in the queue."""
    import time

    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "workers": 0})
    loader = _train(cfg, tok, batch_size=32, image_size=32)
    t0 = time.perf_counter()
    batches = [b for _, b in zip(range(6), loader)]
    wall = time.perf_counter() - t0
    made = sum(float(b["worker_s"]) for b in batches)
    assert 0.5 * wall <= made <= 1.01 * wall, (made, wall)
    assert loader.stats["worker_s"] == pytest.approx(made)

    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "workers": 1})
    times = []
    for _, b in zip(range(5), _train(cfg, tok, batch_size=32, image_size=32)):
        times.append(float(b["worker_s"]))
        time.sleep(0.3)
    assert all(0 < t < 0.25 for t in times[1:]), times  # the first includes the worker's start-up


def test_folder_samples_caption_sources(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    for i in range(3):
        _solid(i).save(a / f"img{i}.png")
        (a / f"img{i}.txt").write_text(f"side caption {i}\n")
    got = list(folder_samples(a))
    assert [c for _, c, _ in got] == ["side caption 0", "side caption 1", "side caption 2"]
    assert isinstance(got[0][0], EncodedImage) and got[0][0].ext == "png"
    (a / "captions.jsonl").write_text("\n".join(json.dumps({"file": f"img{i}.png", "caption": f"j{i}"})
                                                for i in range(3)))
    assert [c for _, c, _ in folder_samples(a)] == ["j0", "j1", "j2"]
    b = tmp_path / "b"
    b.mkdir()
    _solid(0).save(b / "x.png")
    _solid(1).save(b / "y.png")
    (b / "captions.tsv").write_text("x.png\tan x\n")
    with pytest.raises(ValueError, match="y.png"):
        list(folder_samples(b))


def test_same_shards_in_another_folder_give_the_same_batches(digits_shards, tok, tmp_path):
    """Random crops are seeded from the shard's file name, not its path: copying the shards
    elsewhere reproduces the run; another seed does not."""
    import shutil

    src = expand_urls(digits_shards["train"])[:2]
    dst = []
    for url in src:
        (tmp_path / "moved").mkdir(exist_ok=True)
        dst.append(str(shutil.copy(url, tmp_path / "moved" / os.path.basename(url))))
    assert [os.path.basename(u) for u in src] == ["shard-000000.tar", "shard-000001.tar"]
    src_url, dst_url = (os.path.join(os.path.dirname(u[0]), "shard-{000000..000001}.tar") for u in (src, dst))
    kw = dict(image_size=16, context_length=16, batch_size=16, epoch=1)
    base = {"workers": 0, "shuffle_buffer": 20, "crop_scale": [0.3, 1.0], "samples_per_epoch": 64}
    here = list(build_train_loader(DataConfig.from_dict({**base, "train_shards": src_url}), tok, **kw))
    moved = list(build_train_loader(DataConfig.from_dict({**base, "train_shards": dst_url}), tok, **kw))
    other = list(build_train_loader(DataConfig.from_dict({**base, "train_shards": dst_url, "seed": 9}), tok, **kw))
    assert len(here) == len(moved) == 4
    for a, b in zip(here, moved):
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(a["input_ids"], b["input_ids"])
    assert not all(torch.equal(a["pixel_values"], c["pixel_values"]) for a, c in zip(here, other))


def test_training_crops_travel_as_uint8_and_are_normalised_where_asked(digits_shards, tok):
    """The workers send uint8 crops; the loader normalises them (on the CPU by default, or in the
    model's dtype on the device it is given): the same values either way, up to that dtype."""
    from infclip.pipeline.data.image_ops import normalize_pixels

    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "workers": 1, "shuffle_buffer": 8})
    kw = dict(image_size=16, context_length=16, batch_size=8)
    base = next(iter(build_train_loader(cfg, tok, **kw)))["pixel_values"]
    low = next(iter(build_train_loader(cfg, tok, device=torch.device("cpu"), dtype=torch.bfloat16, **kw)))
    assert base.dtype == torch.float32 and low["pixel_values"].dtype == torch.bfloat16
    torch.testing.assert_close(low["pixel_values"].float(), base, rtol=1e-2, atol=1e-2)
    raw = torch.tensor([[0, 255], [128, 64]], dtype=torch.uint8).expand(1, 3, 2, 2)
    want = (raw.float() / 255 - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(normalize_pixels(raw, CLIP_MEAN, CLIP_STD), want)


def test_uint8_training_crop_matches_a_reference_resize_of_the_same_box():
    """The vectorised uint8 crop is the box crop_box draws, resized bilinearly: within two grey
    levels of PIL's bilinear resize of that box on a smooth image."""
    import random

    import numpy as np

    from infclip.pipeline.data.transforms import _resized_box_uint8, crop_box

    yy, xx = np.mgrid[0:96, 0:80]
    arr = np.stack([xx * 3, yy * 2, (xx + yy)], axis=-1).clip(0, 255).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    x, y, w, h = crop_box(80, 96, [0.5, 0.9], random.Random(7))
    got = _resized_box_uint8(img, (x, y, w, h), 32)
    ref = np.asarray(img.resize((32, 32), Image.BILINEAR, box=(x, y, x + w, y + h)), dtype=np.float32)
    assert got.dtype == torch.uint8 and got.shape == (3, 32, 32)
    assert np.abs(got.permute(1, 2, 0).numpy().astype(np.float32) - ref).max() <= 2.0


def test_the_box_is_drawn_at_the_dct_scale_pil_would_decode_at():
    """draft_factor and the size it gives are PIL's own draft choice, over sizes around each
    scale's edges, so the boxes stay where the earlier draft call put them (on either path)."""
    import io

    from infclip.pipeline.data.transforms import draft_factor

    for w, h, need in [(512, 512, 273), (546, 600, 273), (545, 2000, 273), (1092, 1100, 273), (2184, 3000, 273),
                       (4400, 2300, 273), (100, 90, 273), (64, 40, 20), (79, 80, 20), (161, 170, 20)]:
        buf = io.BytesIO()
        Image.new("RGB", (w, h), (90, 140, 200)).save(buf, format="JPEG")
        with Image.open(io.BytesIO(buf.getvalue())) as img:
            img.draft("RGB", (need, need))
            f = draft_factor((w, h), need)
            assert img.size == (-(-w // f), -(-h // f)), (w, h, need, f, img.size)


@pytest.mark.parametrize("side,box,step", [
    (512, (20, 9, 470, 480), 2),    # a 0.9-1.0 crop of a 512-px JPEG: half scale
    (512, (0, 0, 400, 512), 1),     # shorter side 400 < 0.9 * 224 * 2: decoded whole
    (1024, (15, 3, 480, 500), 2),   # drawn on the half-scale draft, decoded at a quarter
    (200, (0, 0, 200, 200), 1),     # smaller than two crops: whole
])
def test_workers_decode_a_crop_at_the_coarsest_dct_scale_that_keeps_it(side, box, step):
    """A training crop decoded in a worker: the JPEG at the coarsest DCT scale that still leaves
    the box's shorter side 0.9 of the input (``step`` times the scale the box was drawn at, one
    draft call), the box moved to that scale's pixels; the crop is the whole-image crop's region:
    within a few levels of it, while a box moved by two of its pixels is further off on these
    gradients."""
    import io
    import math

    import numpy as np

    from infclip.pipeline.data.transforms import _cpu_crop, _decode_scale, _resized_box_uint8, draft_factor

    yy, xx = np.mgrid[0:side, 0:side]
    arr = np.stack([xx * 255 / side, yy * 255 / side, (xx + yy) * 127 / side], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    need = math.ceil(224 * math.sqrt(4 / 3 / 0.9))  # the scale the box is drawn at (decode_samples)
    first = draft_factor((side, side), need)
    assert _decode_scale(box, first, 224) == first * step
    with Image.open(io.BytesIO(data)) as img:
        got = _cpu_crop(img, box, first, (side, side), 224).float()
        assert round(side / img.size[0]) == first * step  # decoded at that scale
    full = Image.open(io.BytesIO(data))
    whole = [b * first for b in box]
    ref = _resized_box_uint8(full.convert("RGB"), whole, 224).float()
    off = 2 * first * step  # two pixels of the coarse decode
    shifted = _resized_box_uint8(full.convert("RGB"), [whole[0] + off, whole[1] + off, *whole[2:]], 224).float()
    assert (got - ref).abs().mean() < 1.0, (got - ref).abs().mean()
    if step > 1:
        assert (shifted - ref).abs().mean() > 1.0


class _Crops(torch.utils.data.IterableDataset):
    """Batches made as a loader worker makes them, with whether their pixels came out shared."""

    def __iter__(self):
        from infclip.pipeline.data.jpeg_boxes import batch_pixels

        items = [{"pixels": torch.full((3, 4, 4), i, dtype=torch.uint8), "jpeg": None} for i in range(5)]
        pixels = batch_pixels(items, 4)["pixel_values"]
        yield pixels.is_shared(), pixels


def test_a_workers_batch_is_stacked_into_shared_memory_with_the_same_pixels():
    """In a worker process the crops are stacked straight into shared memory (no second copy on the
    way to the training process); in the training process itself, plainly."""
    expected = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 3, 4, 4)
    (shared, pixels), = torch.utils.data.DataLoader(_Crops(), batch_size=None, num_workers=1)
    assert shared and torch.equal(pixels, expected)
    (shared, pixels), = torch.utils.data.DataLoader(_Crops(), batch_size=None, num_workers=0)
    assert not shared and torch.equal(pixels, expected)
