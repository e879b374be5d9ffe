"""``data.device_cache``: the training set decoded once, served by index (real digits shards)."""

from __future__ import annotations

import pytest
import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.data.build import build_train_loader
from infclip.pipeline.data.config import DataConfig
from infclip.pipeline.data.device_cache import DeviceCache
from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.tokenizer import load_tokenizer

from .test_train import run_inproc, world_of_one  # noqa: F401  (fixture)

CTX = 16


@pytest.fixture(scope="module")
def cached(digits_shards):
    cfg = DataConfig(train_shards=digits_shards["train"], crop_scale=[1.0, 1.0], device_cache=True, workers=0, seed=3)
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    cache = DeviceCache.load(cfg, tok, expand_urls(cfg.train_shards), image_size=32, context_length=CTX,
                             device=torch.device("cpu"))
    return cfg, tok, cache


def test_cache_holds_what_the_streaming_loader_decodes(cached, digits_shards):
    cfg, tok, cache = cached
    plain = DataConfig(train_shards=digits_shards["train"], crop_scale=[1.0, 1.0], workers=0, shuffle_buffer=0,
                       shard_shuffle=False)
    batches = list(build_train_loader(plain, tok, image_size=32, context_length=CTX, batch_size=719))
    stream_px = torch.cat([b["pixel_values"] for b in batches])
    stream_ids = torch.cat([b["input_ids"] for b in batches])
    assert len(cache) == stream_px.shape[0] == 1438  # the digits train split, none dropped
    assert cache.pixels.dtype == torch.uint8
    full = cache.loader(batch_size=len(cache), rank=0, world_size=1, epoch=0, start_batch=0, dtype=torch.float32)
    order = full.order()
    served = next(iter(full))
    # the served batch is the cached rows in the epoch's order, normalised like the shard loader's pixels
    assert torch.equal(served["input_ids"], cache.input_ids[order])
    assert torch.equal(cache.input_ids, stream_ids)  # same shards, same order
    torch.testing.assert_close(served["pixel_values"], stream_px[order], rtol=0, atol=1e-6)
    # read by 2 worker processes: the same samples (batches of the workers interleave)
    two = DeviceCache.load(DataConfig(train_shards=digits_shards["train"], crop_scale=[1.0, 1.0], device_cache=True,
                                      workers=2), tok, expand_urls(cfg.train_shards), image_size=32,
                           context_length=CTX, device=torch.device("cpu"))
    fingerprint = lambda c: torch.sort(c.pixels.sum((1, 2, 3)) * 1000 + c.input_ids.sum(1)).values  # noqa: E731
    assert torch.equal(fingerprint(two), fingerprint(cache))


def test_ranks_split_each_global_batch_and_epochs_reshuffle(cached):
    _, _, cache = cached
    one = [b["input_ids"] for b in cache.loader(batch_size=64, rank=0, world_size=1, epoch=1, start_batch=0,
                                                  dtype=torch.float32)]
    ranks = [[b["input_ids"] for b in cache.loader(batch_size=32, rank=r, world_size=2, epoch=1, start_batch=0,
                                                     dtype=torch.float32)] for r in range(2)]
    assert len(one) == len(ranks[0]) == len(ranks[1]) == 1438 // 64
    for i, whole in enumerate(one):  # rank r holds the r-th half of the one-process global batch
        assert torch.equal(torch.cat([ranks[0][i], ranks[1][i]]), whole)
    order0 = cache.loader(batch_size=64, rank=0, world_size=1, epoch=0, start_batch=0, dtype=torch.float32).order()
    order1 = cache.loader(batch_size=64, rank=0, world_size=1, epoch=1, start_batch=0, dtype=torch.float32).order()
    assert not torch.equal(order0, order1)
    assert torch.equal(torch.sort(order0).values, torch.arange(len(cache)))  # a permutation: each row once


def test_start_batch_continues_the_stream(cached):
    _, _, cache = cached
    kw = dict(batch_size=48, rank=1, world_size=3, epoch=2, dtype=torch.bfloat16)
    full = list(cache.loader(start_batch=0, **kw))
    rest = list(cache.loader(start_batch=5, **kw))
    assert len(rest) == len(full) - 5 == 1438 // 144 - 5
    for a, b in zip(full[5:], rest):
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(a["input_ids"], b["input_ids"])
    assert full[0]["pixel_values"].dtype == torch.bfloat16


def test_samples_per_epoch_shortens_and_a_too_small_set_is_named(cached, digits_shards):
    cfg, tok, cache = cached
    short = DeviceCache(cache.pixels, cache.input_ids, cache.attention_mask,
                        DataConfig(train_shards=digits_shards["train"], crop_scale=[1.0, 1.0], samples_per_epoch=320))
    assert short.loader(batch_size=32, rank=0, world_size=2, epoch=0, start_batch=0,
                        dtype=torch.float32).batches_per_epoch == 5
    with pytest.raises(ConfigError, match="less than one global batch"):
        cache.loader(batch_size=1000, rank=0, world_size=2, epoch=0, start_batch=0, dtype=torch.float32)


def test_the_last_set_is_reused_by_the_next_run(cached, digits_shards):
    cfg, tok, _ = cached
    urls = expand_urls(cfg.train_shards)
    cache = DeviceCache.load(cfg, tok, urls, image_size=32, context_length=CTX, device=torch.device("cpu"))
    again = DeviceCache.load(cfg, tok, urls, image_size=32, context_length=CTX, device=torch.device("cpu"))
    assert again.pixels.data_ptr() == cache.pixels.data_ptr()  # not read a second time
    other = DeviceCache.load(cfg, tok, urls, image_size=16, context_length=CTX, device=torch.device("cpu"))
    assert other.pixels.shape[-1] == 16 and len(other) == len(cache)


def test_random_crops_are_refused_with_the_cache(digits_shards):
    with pytest.raises(ConfigError, match=r"'device_cache'.*'crop_scale'"):
        DataConfig(train_shards=digits_shards["train"], device_cache=True)


def test_training_from_the_cache_learns_and_resumes_exactly(world_of_one, digits_shards, tmp_path):  # noqa: F811
    common = {"data.device_cache": True, "data.crop_scale": [1.0, 1.0], "train.save_every": 3}
    full = run_inproc(digits_shards, tmp_path / "full", 6, **common).losses
    run_inproc(digits_shards, tmp_path / "part", 3, **common)
    resumed = run_inproc(digits_shards, tmp_path / "part", 6, resume="latest", **common).losses
    assert sorted(resumed) == [4, 5, 6]
    assert all(resumed[s] == full[s] for s in (4, 5, 6)), (resumed, full)  # bitwise on CPU
    assert all(torch.isfinite(torch.tensor(v)) for v in full.values())
    with pytest.raises(Exception, match="data.device_cache"):  # a resume with the streaming loader is refused
        run_inproc(digits_shards, tmp_path / "part", 8, resume="latest", **{"data.crop_scale": [1.0, 1.0]})


def test_two_ranks_follow_one_process_on_the_whole_batch(world_of_one, digits_shards, tmp_path):  # noqa: F811
    """With the cache, 2 ranks x 32 (ring loss) and 1 process x 64 (no distributed loss) train on the
    same global batches from the same init: the training curves agree to float rounding (the
    distributed claim at the level of training, against one process on the whole batch)."""
    from .test_train import base_overrides, deepspeed_launch, tb_scalars

    cache = {"data.device_cache": True, "data.crop_scale": [1.0, 1.0], "train.export_final": False}
    one = run_inproc(digits_shards, tmp_path / "one", 4, **cache, **{"train_micro_batch_size_per_gpu": 64}).losses
    out = tmp_path / "two"
    deepspeed_launch(base_overrides(digits_shards, out, 4, **cache, **{"contrastive_loss.distributed": "ring"}),
                     cwd=str(tmp_path))
    two = tb_scalars(out)
    assert sorted(two) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert abs(two[step] - one[step]) < 1e-5 * abs(one[step]), (step, two[step], one[step])
    assert two[4] != two[1]  # the weights moved


def test_nothing_usable_names_the_loaders_skip_counts(tmp_path, digits_shards, caplog):
    """With no usable sample the error gives the loader's skip counts by reason (they travel after
    the last batch, which no batch carries), not "0 skipped"; a set that loads counts them too."""
    import tarfile

    from .test_data import _add, _png, _sized_shards

    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    paths = _sized_shards(tmp_path / "a", [5])
    cfg = DataConfig(train_shards=paths, crop_scale=[1.0, 1.0], device_cache=True, workers=0, caption_key="nope")
    with pytest.raises(ConfigError, match=r"no training sample could be read from 1 shard\(s\): all 5 samples "
                                          r"skipped: missing_caption=5; check data\.caption_key \('nope'\)"):
        DeviceCache.load(cfg, tok, paths, image_size=8, context_length=CTX, device=torch.device("cpu"))
    tail = tmp_path / "tail.tar"
    with tarfile.open(tail, "w") as tar:
        for i in range(8):
            _add(tar, f"{i:09d}.png", _png(i))
            if i < 5:  # 5, 6, 7: no caption, after the last usable sample
                _add(tar, f"{i:09d}.txt", b"a caption")
    caplog.set_level("INFO", logger="infclip.pipeline.data.device_cache")
    cfg = DataConfig(train_shards=[str(tail)], crop_scale=[1.0, 1.0], device_cache=True, workers=1)
    cache = DeviceCache.load(cfg, tok, [str(tail)], image_size=8, context_length=CTX, device=torch.device("cpu"))
    assert len(cache) == 5
    assert any("5 samples (3 skipped)" in r.getMessage() for r in caplog.records)
