"""Shared fixtures for pipeline tests: small real digits shards and a tokenizer trained on them."""

from __future__ import annotations

import pytest

from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.shards import write_digits_shards
from infclip.pipeline.data.tokenizer import iter_shard_captions, train_bpe_tokenizer


@pytest.fixture(scope="session")
def digits_shards(tmp_path_factory):
    """Digits shards (32 px jpg, 200 samples per shard: 8 train shards, 2 test shards with labels).

    Returns ``{"train": brace URL, "test": brace URL, "dir": folder, "tokenizer_dir": folder of a
    byte-level BPE (vocab <= 400) trained on the train captions}``.
    """
    root = tmp_path_factory.mktemp("digits_shards")
    shards = write_digits_shards(root, image_size=32, samples_per_shard=200)
    tok_dir = root / "tokenizer"
    train_bpe_tokenizer(iter_shard_captions(expand_urls(shards["train"])), tok_dir, vocab_size=400,
                        context_length=16)
    return {"train": shards["train"], "test": shards["test"], "dir": str(root), "tokenizer_dir": str(tok_dir)}
