"""Tokenizer tests: BPE train/save/load through AutoTokenizer, fixed-length ids with EOS kept."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel

from infclip.ops.config import ConfigError
from infclip.pipeline.data.config import DataConfig
from infclip.pipeline.data.shard_urls import expand_urls
from infclip.pipeline.data.tokenizer import (EOS_TOKEN, ensure_tokenizer, load_tokenizer, special_token_ids, tokenize,
                                             train_bpe_tokenizer)

CORPUS = [f"a photo of the number {w}" for w in ("one", "two", "three", "seven")] * 5 + [
    "the digit seven written by hand", "a handwritten 7", "a small grey image of a nine"]


def test_train_save_load_round_trip(tmp_path):
    tok = train_bpe_tokenizer(CORPUS, tmp_path / "tok", vocab_size=300, context_length=20)
    files = {p.name for p in (tmp_path / "tok").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp folder renamed away
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    text = ["A Photo of the number SEVEN", "the digit 7 written by hand, unseen wörds"]
    assert auto(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert auto.decode(auto("a photo of the number seven", add_special_tokens=False)["input_ids"]).strip() == \
        "a photo of the number seven"
    ids = special_token_ids(auto)
    assert ids["pad_token_id"] == 0 and ids["eos_token_id"] == 1 and ids["bos_token_id"] == 2
    assert auto.convert_ids_to_tokens(1) == EOS_TOKEN
    assert 259 < ids["vocab_size"] <= 300
    assert auto.model_max_length == 20
    assert max(max(r) for r in auto(CORPUS, add_special_tokens=False)["input_ids"]) < ids["vocab_size"]
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(CORPUS, tmp_path / "small", vocab_size=100)


def test_tokenize_shapes_padding_and_eos(digits_shards):
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    L = 12
    texts = ["seven", "a photo of the number seven " * 10, ""]
    ids, mask = tokenize(tok, texts, L)
    assert ids.shape == mask.shape == (3, L) and ids.dtype == mask.dtype == torch.long
    sp = special_token_ids(tok)
    lengths = mask.sum(1)
    assert lengths[1] == L and lengths[2] == 2 and 2 < lengths[0] < L
    for row, n in enumerate(lengths.tolist()):
        assert ids[row, 0] == sp["bos_token_id"]
        assert ids[row, n - 1] == sp["eos_token_id"]  # EOS kept, also when truncated (row 1)
        assert (ids[row, :n - 1] != sp["eos_token_id"]).all()
        assert (ids[row, n:] == sp["pad_token_id"]).all() and (mask[row, n:] == 0).all()
    full = tok("seven", add_special_tokens=False)["input_ids"]
    assert ids[0, 1:1 + len(full)].tolist() == full
    with pytest.raises(ValueError, match="context_length"):
        tokenize(tok, ["x"], 2)


def test_clip_text_tower_pools_at_our_eos(digits_shards):
    """transformers' CLIPTextTransformer pools at the first eos_token_id (legacy argmax if it is 2)."""
    tok = load_tokenizer(digits_shards["tokenizer_dir"])
    sp = special_token_ids(tok)
    config = CLIPTextConfig(vocab_size=sp["vocab_size"], hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, max_position_embeddings=12, pad_token_id=sp["pad_token_id"],
                            bos_token_id=sp["bos_token_id"], eos_token_id=sp["eos_token_id"])
    torch.manual_seed(0)
    model = CLIPTextModel(config).eval()
    ids, mask = tokenize(tok, ["seven", "a photo of the number three written by hand again"], 12)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    eos_pos = mask.sum(1) - 1
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[torch.arange(2), eos_pos])
    assert not torch.allclose(out.pooler_output, out.last_hidden_state[torch.arange(2), ids.argmax(1)])


def test_ensure_tokenizer_trains_once_then_reuses(digits_shards, tmp_path):
    cfg = DataConfig.from_dict({"train_shards": digits_shards["train"], "vocab_size": 320,
                                "tokenizer_train_captions": 300})
    out = tmp_path / "run" / "tokenizer"
    with pytest.raises(TypeError, match="list of URLs"):
        ensure_tokenizer(cfg, digits_shards["train"], out, context_length=16)
    with pytest.raises(ConfigError, match="no training shards"):
        ensure_tokenizer(cfg, None, out, context_length=16)
    assert not (out / "tokenizer.json").exists()
    tok = ensure_tokenizer(cfg, expand_urls(digits_shards["train"]), out, context_length=16)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) <= 320 and special_token_ids(tok)["eos_token_id"] == 1
    stamp = (out / "tokenizer.json").stat().st_mtime_ns
    again = ensure_tokenizer(cfg, None, out, context_length=16)
    assert (out / "tokenizer.json").stat().st_mtime_ns == stamp
    assert again.get_vocab() == tok.get_vocab()
    configured = DataConfig.from_dict({"train_shards": digits_shards["train"],
                                       "tokenizer": digits_shards["tokenizer_dir"]})
    other = ensure_tokenizer(configured, None, tmp_path / "unused", context_length=16)
    assert other.get_vocab() == load_tokenizer(digits_shards["tokenizer_dir"]).get_vocab()
    assert not (tmp_path / "unused").exists()
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        ensure_tokenizer(DataConfig.from_dict({"train_shards": "x.tar", "tokenizer": str(tmp_path / "no_such_folder")}),
                         None, out)


def test_broken_shards_are_skipped_and_named(digits_shards, tmp_path, caplog):
    """A zero-byte shard, a tar cut short and a file that is not a tar: skipped and named in the
    tokenizer pass (the loader skips them too), the good shards still train it."""
    import logging
    import shutil

    from infclip.pipeline.data.shard_urls import expand_urls
    from infclip.pipeline.data.tokenizer import iter_shard_captions

    good = expand_urls(digits_shards["train"])[:2]
    empty, cut, not_tar = tmp_path / "empty.tar", tmp_path / "cut.tar", tmp_path / "not_tar.tar"
    empty.write_bytes(b"")
    data = open(good[0], "rb").read()
    cut.write_bytes(data[: len(data) // 2 + 300])
    not_tar.write_bytes(b"this is not a tar archive\n" * 40)
    shutil.copy(good[1], tmp_path / "good.tar")
    urls = [str(empty), str(cut), str(not_tar), str(tmp_path / "good.tar")]
    broken: list = []
    with caplog.at_level(logging.WARNING, logger="infclip.pipeline.data.tokenizer"):
        captions = list(iter_shard_captions(urls, broken=broken))
    assert broken == [str(empty), str(cut), str(not_tar)]
    assert len(captions) > 200  # the good shard's 200 plus what the cut one held before the cut
    for path in broken:
        assert any(path in r.getMessage() and "broken shard" in r.getMessage() for r in caplog.records), path
    cfg = DataConfig.from_dict({"train_shards": urls, "vocab_size": 300})
    tok = ensure_tokenizer(cfg, urls, tmp_path / "tok", context_length=16)
    assert special_token_ids(tok)["eos_token_id"] == 1
    with pytest.raises(ConfigError, match=r"no 'txt' captions .* in the 2 training shard\(s\) \(2 of them broken"):
        ensure_tokenizer(DataConfig.from_dict({"train_shards": [str(empty), str(not_tar)]}),
                         [str(empty), str(not_tar)], tmp_path / "tok2")



def test_gzipped_shards_are_whole_unless_cut(digits_shards, tmp_path):
    """A .tar.gz shard is checked after decompression: whole, all its captions and not broken; cut
    short (the gzip stream itself cut), broken. Both the loader and this pass use one check."""
    import gzip

    from infclip.pipeline.data.shard_urls import expand_urls
    from infclip.pipeline.data.tokenizer import iter_shard_captions

    tar = open(expand_urls(digits_shards["train"])[0], "rb").read()
    whole, cut = tmp_path / "whole.tar.gz", tmp_path / "cut.tar.gz"
    packed = gzip.compress(tar)
    whole.write_bytes(packed)
    cut.write_bytes(packed[: len(packed) * 3 // 4])
    broken: list = []
    captions = list(iter_shard_captions([str(whole)], broken=broken))
    assert broken == [] and len(captions) == 200
    list(iter_shard_captions([str(cut)], broken=broken))
    assert broken == [str(cut)]

SPELLED = ["a photo of the number seven <|endoftext|> and a large dog on a red sofa",
           "a photo <|pad|> of the number one", "<|startoftext|> the digit two <|endoftext|>"]


def _assert_one_eos_at_the_end(ids, mask, sp, bos=True):
    """Each row: [BOS] text [EOS] [PAD]..., the only EOS at the end of the mask, no PAD/BOS inside."""
    for row, n in enumerate(mask.sum(1).tolist()):
        text = ids[row, 1 if bos else 0:n - 1]
        assert ids[row, n - 1] == sp["eos_token_id"]
        assert (ids[row] == sp["eos_token_id"]).nonzero()[0].item() == n - 1  # the first EOS: where the tower pools
        for special in ("eos_token_id", "pad_token_id", "bos_token_id"):
            assert sp[special] is None or (text != sp[special]).all(), (row, special, ids[row].tolist())


def test_caption_text_spelling_special_tokens_stays_text(tmp_path):
    """A caption containing '<|endoftext|>' or '<|pad|>' is text: no EOS/PAD id mid-row (the model
    pools the first EOS, which would drop the rest of the caption). Training the BPE on such
    captions reads them as text too, and the HF-way call of the saved tokenizer agrees."""
    tok = train_bpe_tokenizer(CORPUS + SPELLED * 4, tmp_path / "tok", vocab_size=320, context_length=40)
    sp = special_token_ids(tok)
    assert [sp["pad_token_id"], sp["eos_token_id"], sp["bos_token_id"]] == [0, 1, 2]
    ids, mask = tokenize(tok, SPELLED, 40)
    assert (ids[:, 0] == sp["bos_token_id"]).all()
    _assert_one_eos_at_the_end(ids, mask, sp)
    for row, (text, n) in enumerate(zip(SPELLED, mask.sum(1).tolist())):
        assert tok.decode(ids[row, 1:n - 1].tolist()).strip() == text.lower()  # nothing lost, nothing special
    plain, _ = tokenize(tok, ["a photo of the number seven"], 40)
    assert not torch.equal(ids[0], plain[0])
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)  # the HF-way call
    hf = auto(SPELLED, padding="max_length", truncation=True, return_tensors="pt")
    assert torch.equal(hf["input_ids"], ids) and torch.equal(hf["attention_mask"], mask)


def _byte_alphabet():
    from tokenizers import pre_tokenizers
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def test_clip_tokenizer_caption_spelling_eos_stays_text(caplog):
    """transformers' CLIPTokenizer (built here from a byte-level vocabulary: nothing downloaded)
    keeps '<|endoftext|>' as one pre-token and matches it as its EOS; a vocabulary missing a
    character maps it to unk, which is CLIP's EOS too: that id is dropped from the text."""
    import logging

    from transformers import CLIPTokenizer

    alphabet = _byte_alphabet()
    words = alphabet + [c + "</w>" for c in alphabet]
    vocab = {w: i for i, w in enumerate(words + ["<|startoftext|>", "<|endoftext|>"])}
    clip = CLIPTokenizer(vocab=vocab, merges=[])
    sp = special_token_ids(clip)
    assert sp["eos_token_id"] == sp["pad_token_id"] == len(words) + 1 and sp["bos_token_id"] == len(words)
    ids, mask = tokenize(clip, SPELLED, 77)
    _assert_one_eos_at_the_end(ids, mask, sp)
    assert clip.decode(ids[0, 1:mask[0].sum() - 1].tolist()).replace(" ", "") == SPELLED[0].replace(" ", "")
    partial = CLIPTokenizer(vocab={w: i for i, w in enumerate([w for w in words if w[0] != "z"]
                                                              + ["<|startoftext|>", "<|endoftext|>"])}, merges=[])
    with caplog.at_level(logging.WARNING, logger="infclip.pipeline.data.tokenizer"):
        ids, mask = tokenize(partial, ["a zebra", "a zebra"], 16)
    _assert_one_eos_at_the_end(ids, mask, special_token_ids(partial))
    assert mask.sum(1).tolist() == [7, 7]  # BOS, "a", "e b r a", EOS: the z's unk (its EOS id) dropped
    assert sum("dropped from the text" in r.getMessage() for r in caplog.records) == 1  # once per tokenizer


def _gpt2_like(tmp_path):
    """transformers' GPT2Tokenizer (BOS = EOS = unk = '<|endoftext|>', no pad token) with the
    project's BPE vocabulary and merges, saved to a folder: built here, nothing downloaded."""
    from transformers import GPT2Tokenizer

    bpe = train_bpe_tokenizer(CORPUS, tmp_path / "bpe", vocab_size=300, context_length=16)
    model = json.loads(bpe.backend_tokenizer.to_str())["model"]
    words = sorted((w for w in model["vocab"] if w not in ("<|pad|>", EOS_TOKEN, "<|startoftext|>")),
                   key=model["vocab"].get)
    vocab = {w: i for i, w in enumerate(words + [EOS_TOKEN])}  # EOS last, as GPT-2's 50256
    gpt2 = GPT2Tokenizer(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                              for m in model["merges"]], add_prefix_space=True)
    gpt2.save_pretrained(str(tmp_path / "gpt2_like"))
    return tmp_path / "gpt2_like"


def test_bos_equal_to_eos_gets_no_bos(tmp_path, caplog):
    """A GPT-2 style tokenizer (its BOS is its EOS): a leading BOS would be the first EOS, where
    the text tower pools, so every caption would get the same embedding. No BOS is prepended."""
    import logging

    folder = _gpt2_like(tmp_path)
    with caplog.at_level(logging.INFO, logger="infclip.pipeline.data.tokenizer"):
        tok = load_tokenizer(folder)
    assert tok.bos_token_id == tok.eos_token_id == len(tok) - 1 and tok.pad_token_id is None
    assert sum("BOS is its EOS" in r.getMessage() for r in caplog.records) == 1
    sp = special_token_ids(tok)
    assert sp["bos_token_id"] is None and sp["pad_token_id"] == sp["eos_token_id"] == len(tok) - 1
    texts = ["seven", "a photo of the number three written by hand again and again", "", "a handwritten 7"]
    L = 12
    ids, mask = tokenize(tok, texts, L)
    _assert_one_eos_at_the_end(ids, mask, sp, bos=False)
    lengths = mask.sum(1).tolist()
    assert lengths[1] == L and lengths[2] == 1 and lengths[0] == 1 + len(tok("seven", add_special_tokens=False)
                                                                          ["input_ids"])
    assert ids[0, :lengths[0] - 1].tolist() == tok("seven", add_special_tokens=False)["input_ids"]
    for row, n in enumerate(lengths):
        assert (ids[row, n:] == sp["pad_token_id"]).all() and (mask[row, n:] == 0).all()
    from infclip.pipeline.data.tokenizer import with_clip_template  # the HF-way call agrees
    hf = with_clip_template(tok, L)(texts, padding="max_length", truncation=True, return_tensors="pt")
    assert torch.equal(hf["input_ids"], ids) and torch.equal(hf["attention_mask"], mask)
    from infclip.pipeline.model.config import ModelConfig
    from infclip.pipeline.model.model import CLIPTowers  # the towers' text config takes the rows' ids

    torch.manual_seed(0)
    towers = CLIPTowers.from_config(ModelConfig.from_dict({
        "embed_dim": 8, "vision": {"image_size": 8, "patch_size": 4, "hidden_size": 16, "layers": 1, "heads": 2},
        "text": {"context_length": L, "hidden_size": 16, "layers": 1, "heads": 2}}), tok)
    config = towers.text.config
    assert (config.vocab_size, config.bos_token_id, config.pad_token_id, config.eos_token_id) == (
        len(tok), None, sp["pad_token_id"], sp["eos_token_id"])
    with torch.no_grad():
        out = CLIPTextModel(config).eval()(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[torch.arange(4), mask.sum(1) - 1])
    assert (out.pooler_output[1:] - out.pooler_output[0]).abs().amax(1).min() > 1e-3  # captions differ


OPENCLIP_CAPTIONS = [
    "A photo of a cat!", "Don't  stop   believin' - it's 2024's best SONG!!", "café au lait, naïve résumé",
    "\u201cCurly quotes\u201d and \u2018single\u2019 ones", "Tom &amp; Jerry &quot;cartoon&quot; &lt;3 &amp;amp;",
    "the \ufb01nal \ufb02ight", "日本語のキャプション 東京", "emoji \U0001f431\U0001f680 test", "word " * 100,
    "numbers 12345 and 3.14159", "", "  leading and trailing \t\n ", "<|endoftext|> <|pad|> spelled out",
    "I'M HERE, YOU'LL SEE; WE'D GO", "!!! ! !"]


def test_openclip_tokenizer_folder_gives_openclips_ids(tmp_path):
    """data.tokenizer "openclip" (and launch/openclip_tokenizer.py) write OpenCLIP's BPE as an HF CLIP
    folder: tokenize(), the folder called the HF way and AutoTokenizer give open_clip.tokenize's rows
    (padding with id 0, "!", which stays text), EOS 49407 for the text tower to pool."""
    from launch.openclip_tokenizer import main
    from tests._openclip import import_open_clip

    open_clip = import_open_clip()
    ref = open_clip.tokenize(OPENCLIP_CAPTIONS)
    tok = ensure_tokenizer(DataConfig(train_shards="x.tar", tokenizer="openclip"), None, tmp_path / "run" / "tokenizer")
    assert (len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (49408, 49406, 49407, 0)
    ids, mask = tokenize(tok, OPENCLIP_CAPTIONS, 77)
    assert torch.equal(ids, ref)
    assert mask.sum(1).tolist() == [int(row.nonzero().max()) + 1 for row in ref]
    assert main(["--out", str(tmp_path / "cli")]) == 0
    for folder in (tmp_path / "run" / "tokenizer", tmp_path / "cli"):
        auto = AutoTokenizer.from_pretrained(str(folder))
        assert torch.equal(auto(OPENCLIP_CAPTIONS, padding="max_length", truncation=True,
                                return_tensors="pt")["input_ids"], ref)
    assert ensure_tokenizer(DataConfig(train_shards="x.tar", tokenizer="openclip"), None, tmp_path / "run" / "tokenizer").eos_token_id == 49407
