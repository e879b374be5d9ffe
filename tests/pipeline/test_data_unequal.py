"""Loader workers holding unequal data (real shards, real DataLoader worker processes): every full
batch of every worker is read, and a resume at any batch continues the uninterrupted stream."""

from __future__ import annotations

import dataclasses
import tarfile
from pathlib import Path

import pytest

from infclip.pipeline.data.tokenizer import load_tokenizer
from infclip.pipeline.train.loop import Batches
from infclip.pipeline.train.run_state import RunState, _own_position

from .test_data import _add, _cfg, _ids, _png, _sized_shards, _train


@pytest.fixture(scope="module")
def tok(digits_shards):
    return load_tokenizer(digits_shards["tokenizer_dir"])


def _junk(path) -> str:
    Path(path).write_bytes(b"<html>404 not found</html>" * 40)
    return str(path)


def _stream(loader):
    """The loader's batches as sample ids, and its position before and after each batch."""
    ids, positions = [], [loader.position()]
    for batch in loader:
        ids.append(_ids(batch))
        positions.append(loader.position())
    return ids, positions


@pytest.mark.parametrize("bad", ["junk", "two_samples"])
@pytest.mark.parametrize("bad_first", [True, False])
def test_one_bad_or_short_shard_costs_only_its_own_samples(tmp_path, tok, bad, bad_first):
    """The review's case: 2 shards on 2 workers, one of 30 samples and one that cannot be read
    (or holds 2 samples, less than the micro-batch of 3). Whichever worker holds the bad shard,
    the epoch gives all 10 batches of the good one and no error; also over epochs with the shard
    order shuffled (the bad shard moves between workers)."""
    good = _sized_shards(tmp_path / "good", [30])[0]
    other = _junk(tmp_path / "junk.tar") if bad == "junk" else _sized_shards(tmp_path / "few", [2])[0]
    for shuffle in (False, True):
        cfg = _cfg([other, good] if bad_first else [good, other], workers=2, shuffle_buffer=0, shard_shuffle=shuffle)
        for epoch in range(3):
            loader = _train(cfg, tok, epoch=epoch)
            ids = [_ids(b) for b in loader]
            if bad == "two_samples":  # the 2-sample shard's samples are 0 and 1 of _sized_shards: ids 0, 1
                assert sorted(i for b in ids for i in b) == list(range(30)) and loader.unbatched == 2
            else:
                assert sorted(i for b in ids for i in b) == list(range(30))
                assert loader.skipped_by_reason == {"tar_error": 1} and loader.stats["skipped"] == 1
            assert len(ids) == 10
        state = RunState()
        run = Batches(lambda e, s: _train(cfg, tok, epoch=e, start_batch=s), state, max_epochs=3)
        taken = 0
        while run.next() is not None:
            taken += 1
        assert taken == 30 and state.epoch == 3
        assert state.skipped_samples == (3 if bad == "junk" else 0)


def test_no_batch_names_every_workers_counts(tmp_path, tok):
    """Only when no worker made a batch is the epoch an error; the reason gives the totals and
    each worker's counts, and does not say that nothing could be read when samples were."""
    few = _sized_shards(tmp_path / "few", [2])[0]
    cfg = _cfg([_junk(tmp_path / "junk.tar"), few], workers=2, shuffle_buffer=0, shard_shuffle=False)
    with pytest.raises(RuntimeError) as exc:
        Batches(lambda e, s: _train(cfg, tok, epoch=e, start_batch=s), RunState(), 1).next()
    msg = str(exc.value)
    assert "no batch in epoch 0 (rank 0): 2 usable sample(s), fewer than one micro-batch of 3" in msg
    assert "skipped: tar_error=1" in msg and "no sample could be read" not in msg
    assert "(by loader worker: 0: tar_error=1; 1: 2 usable sample(s) left over)" in msg


def _unequal(tmp_path) -> list:
    """5 shards for 3 workers, one short: without shard shuffling worker 0 reads shards 0 and 3
    (4 batches of 3), worker 1 shards 1 and 4 (3), worker 2 shard 2 (2)."""
    return _sized_shards(tmp_path, [6, 6, 6, 6, 3])


@pytest.mark.parametrize("setting", [
    {"shuffle_buffer": 0, "shard_shuffle": False},
    {"shuffle_buffer": 4, "shard_shuffle": True, "epoch": 1},
    {"shuffle_buffer": 4, "shard_shuffle": True, "epoch": 2, "samples_per_epoch": 21},
    {"shuffle_buffer": 0, "shard_shuffle": False, "samples_per_epoch": 27},
])
def test_resume_at_every_batch_of_an_unequal_epoch(tmp_path, tok, setting):
    """Resumed at every batch index of the epoch and at its end, with the position the
    uninterrupted loader had there, the stream gives exactly the rest of the uninterrupted
    stream; with samples_per_epoch the cap counts the rank's batches, not each worker's."""
    setting = dict(setting)
    epoch = setting.pop("epoch", 0)
    cfg = _cfg(_unequal(tmp_path), workers=3, **setting)
    full, positions = _stream(_train(cfg, tok, epoch=epoch))
    assert len(full) == {21: 7}.get(cfg.samples_per_epoch, 9)
    if cfg.samples_per_epoch is None:
        assert sorted(i for b in full for i in b) == list(range(27))
    for start in range(len(full) + 1):
        resumed, _ = _stream(_train(cfg, tok, epoch=epoch, start_batch=start, position=positions[start]))
        assert resumed == full[start:], start


def test_a_worker_exhausted_before_the_resume_point_keeps_its_turn_out(tmp_path, tok):
    """Worker 0 holds only a shard that cannot be read and worker 2 a short one: resumed after
    either ran out, the others go on in the uninterrupted order (the balanced split of the batch
    index would not: the positions differ from it), and the skips counted over interrupted runs
    add up to the uninterrupted run's."""
    paths = _sized_shards(tmp_path, [6, 12, 3])
    paths[0] = _junk(tmp_path / "junk.tar")
    cfg = _cfg(paths, workers=3, shuffle_buffer=0, shard_shuffle=False)
    # worker 0: the junk shard (no batch), worker 1: shard 1 (4 batches), worker 2: shard 2 (1)
    full, positions = _stream(_train(cfg, tok))
    assert full == [[6, 7, 8], [18, 19, 20], [9, 10, 11], [12, 13, 14], [15, 16, 17]]
    assert positions[2] == {"worker_batches": [0, 1, 1], "next_worker": 0}  # balanced: [1, 1, 0]
    assert positions[3] == {"worker_batches": [0, 2, 1], "next_worker": 2}  # balanced: [1, 1, 1]
    for start in range(len(full) + 1):
        assert _stream(_train(cfg, tok, start_batch=start, position=positions[start]))[0] == full[start:], start
    _check_interrupted_runs(cfg, tok, len(full))


def _check_interrupted_runs(cfg, tok, per_epoch: int, epochs: int = 2):
    """A run stopped after every batch and resumed from a copy of its state (what a checkpoint
    keeps) reads what the uninterrupted run reads, with the same skip count."""
    def build(epoch, start):
        return _train(cfg, tok, epoch=epoch, start_batch=start)

    whole = RunState()
    run, expected = Batches(build, whole, max_epochs=epochs), []
    while (batch := run.next()) is not None:
        expected.append(_ids(batch))
    assert len(expected) == per_epoch * epochs
    state, got = RunState(), []
    while True:
        state = RunState(**dataclasses.asdict(state))
        batch = Batches(build, state, max_epochs=epochs).next()
        if batch is None:
            break
        got.append(_ids(batch))
    assert got == expected
    assert (state.epoch, state.skipped_samples) == (whole.epoch, whole.skipped_samples)


def test_interrupted_runs_with_shuffled_unequal_workers_read_what_the_whole_run_reads(tmp_path, tok):
    cfg = _cfg(_unequal(tmp_path), workers=3, shuffle_buffer=4, shard_shuffle=True)
    _check_interrupted_runs(cfg, tok, 9)


def test_a_state_without_a_position_resumes_the_balanced_split(tmp_path, tok):
    """Checkpoints written before the position was kept hold no ``data_positions``: their state
    resumes at the balanced split of batch_in_epoch, exact while every worker had data."""
    assert _own_position(None) is None and _own_position([]) is None
    assert _own_position([{"worker_batches": [1, 0], "next_worker": 1}]) == {"worker_batches": [1, 0],
                                                                           "next_worker": 1}
    cfg = _cfg(_sized_shards(tmp_path, [9, 9, 9, 9]), workers=2, shuffle_buffer=4)

    def build(epoch, start):
        return _train(cfg, tok, epoch=epoch, start_batch=start)

    whole = [_ids(b) for b in build(0, 0)]
    for start in range(len(whole) + 1):
        state = RunState(epoch=0, batch_in_epoch=start)  # no data_position: an old checkpoint's state
        run, got = Batches(build, state, max_epochs=1), []
        while (batch := run.next()) is not None:
            got.append(_ids(batch))
        assert got == whole[start:], start


def test_a_position_that_does_not_fit_is_refused(tmp_path, tok):
    cfg = _cfg(_unequal(tmp_path), workers=3, shuffle_buffer=0)
    for bad in ({"worker_batches": [1, 1], "next_worker": 0}, {"worker_batches": [1, 1, 1], "next_worker": 0},
                {"worker_batches": [2, 0, 0], "next_worker": 3}, {"next_worker": 0}):
        with pytest.raises(ValueError, match="position"):
            _train(cfg, tok, start_batch=2, position=bad)


def test_skips_of_a_worker_that_ran_out_count_once_over_a_resume(tmp_path, tok):
    """A worker's skips after its last batch reach the run's count when the rank's stream ends:
    resumed after that worker ran out (it reads its shard again to find out), they count once."""
    path = tmp_path / "tail-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(5):
            _add(tar, f"{100 + i:09d}.png", _png(100 + i))
            if i < 3:
                _add(tar, f"{100 + i:09d}.txt", b"a caption")
    paths = [_sized_shards(tmp_path / "a", [12])[0], str(path)]
    cfg = _cfg(paths, workers=2, shuffle_buffer=0, shard_shuffle=False)
    _check_interrupted_runs(cfg, tok, 5)


def test_a_position_that_does_not_fit_the_stream_is_refused_naming_what(tmp_path, tok):
    """seek() refuses a position of another stream: counts of another worker count, negative, or
    not summing to start_batch, and a next worker out of range, each with what it must be."""
    cfg = _cfg(_sized_shards(tmp_path / "s", [9, 9]), workers=2, shuffle_buffer=0)
    cases = [({"worker_batches": [1, 1, 0], "next_worker": 0}, "must be 2 count"),
             ({"worker_batches": [3, -1], "next_worker": 0}, "none negative"),
             ({"worker_batches": [1, 0], "next_worker": 0}, "summing to start_batch 2"),
             ({"worker_batches": [1, 1], "next_worker": 2}, "next_worker must be a worker of the 2"),
             ({"worker_batches": "x"}, "not a loader position")]
    for position, message in cases:
        with pytest.raises(ValueError, match=message):
            _train(cfg, tok, start_batch=2).seek(position)
    loader = _train(cfg, tok, start_batch=2)
    loader.seek({"worker_batches": [1, 1], "next_worker": 0})
    assert len(list(loader)) == 4  # 6 batches in all, 2 of them before the position
