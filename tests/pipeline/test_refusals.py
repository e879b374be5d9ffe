"""What used to end in a traceback or pass without a word: one line naming the key, value, file or
step (exit code 2 through launch/), or a warning that names what it saw.

Config checks and data pieces run without training; DeepSpeed's optimizer and scheduler errors
and the data errors go through :func:`pipeline.train.train.train` on a gloo world of one, and through
:func:`pipeline.errors.exit_on_user_error` as launch/ reports them.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tarfile

import pytest
from PIL import Image

from infclip.ops.config import ConfigError
from infclip.pipeline.config import load_config, schedule_warnings
from infclip.pipeline.errors import DataError, UserErrorExit, exit_on_user_error

from .test_train import TINY, run_inproc, world_of_one  # noqa: F401  (fixture)


def _one_line(capsys, fn):
    """``fn()`` under exit_on_user_error: exit code 2 and one stderr line; returns that line."""
    with pytest.raises(UserErrorExit) as exc:
        with exit_on_user_error("pretrain.py"):
            fn()
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pretrain.py: error: "), lines
    return lines[0]


@pytest.mark.parametrize("text, message", [
    ('{"train": {"steps": 5, "steps": 50}}', r"key 'steps' is given twice in one JSON object"),
    ("[" * 100_000 + "]" * 100_000, r"nested too deep to parse"),
    ('{"gradient_clipping": -1, "train_micro_batch_size_per_gpu": 2}', r"'gradient_clipping' must be a number >= 0"),
    ('{"train_micro_batch_size_per_gpu": 2, "data": {"train_shards": "s.tar"}, "train": {"seed": '
     '100000000000000000000000}}', r"'seed' must be in \[0, 2\*\*32\), got 100000000000000000000000"),
    ('{"train_micro_batch_size_per_gpu": 2, "data": {"train_shards": "s.tar"}, "train": {"save_on_signal": '
     '["SIGKILL"]}}', r"'save_on_signal' names 'SIGKILL'; it may hold SIGTERM"),
])
def test_config_refusals_name_key_and_file(tmp_path, capsys, text, message):
    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))
    assert str(path) in _one_line(capsys, lambda: load_config(str(path)))


def test_steps_beyond_the_schedule_are_warned():
    cfg = load_config(TINY, ["train.steps=500", "scheduler.params.total_num_steps=100"])
    (warning,) = schedule_warnings(cfg)
    assert "'train.steps' 500 runs past 'scheduler.params.total_num_steps' 100" in warning
    assert "the last 400 steps train at the schedule's floor learning rate" in warning
    assert not schedule_warnings(load_config(TINY, ["train.steps=100", "scheduler.params.total_num_steps=100"]))


@pytest.mark.parametrize("extra, message", [
    ({"optimizer.params.learning_rate": 1e-3}, r"could not build the optimizer 'AdamW' .*unexpected keyword argument "
                                               r"'learning_rate'"),
    ({"optimizer.params.betas": 0.9}, r"could not build the optimizer 'AdamW' .*'float' object is not subscriptable"),
    ({"scheduler.params.warmup_step": 3}, r"could not build the scheduler 'WarmupCosineLR' .*'warmup_step'"),
    ({"optimizer.type": "Adamm"}, r"DeepSpeed rejected the config: Adamm is not a supported DeepSpeed Optimizer"),
    ({"data.image_key": "png"}, r"no batch in epoch 0 \(rank 0\): all \d+ samples skipped: missing_image=\d+; check "
                                r"data\.image_key \(png\)"),
])
def test_deepspeed_and_data_errors_are_one_line(world_of_one, digits_shards, tmp_path, capsys, extra,  # noqa: F811
                                                message):
    line = _one_line(capsys, lambda: run_inproc(digits_shards, tmp_path / "run", 2, **extra))
    assert re.search(message, line), line


def test_a_huge_image_is_skipped_before_decoding(tmp_path, digits_shards):
    """A 12000 x 12000 PNG of a few hundred KB (144 Mpx: 430 MB once decoded as RGB) is skipped
    from its header and counted as too_many_pixels; the other samples come through (the training
    loader decodes through the same function)."""
    from infclip.pipeline.data.build import build_eval_loader
    from infclip.pipeline.data.tokenizer import load_tokenizer

    path = tmp_path / "big-000000.tar"
    with tarfile.open(path, "w") as tar:
        for key, size in (("000", (8, 8)), ("001", (12000, 12000)), ("002", (8, 8))):
            buf = io.BytesIO()
            Image.new("1", size).save(buf, format="PNG")
            for name, data in ((f"{key}.png", buf.getvalue()), (f"{key}.txt", f"caption {key}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    loader = build_eval_loader(str(path), load_tokenizer(digits_shards["tokenizer_dir"]), image_size=8,
                               context_length=16, batch_size=10)
    (batch,) = list(loader)
    assert batch["pixel_values"].shape[0] == 2 and loader.skipped_by_reason == {"too_many_pixels": 1}


def test_tokenizer_pass_skips_a_huge_caption_member(tmp_path, caplog):
    from infclip.pipeline.data.tokenizer import MAX_CAPTION_BYTES, iter_shard_captions

    path = tmp_path / "captions-000000.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("000.txt", b"a small caption"), ("001.txt", b"x" * (MAX_CAPTION_BYTES + 1)),
                           ("002.txt", b"another one")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with caplog.at_level(logging.WARNING):
        assert list(iter_shard_captions([str(path)])) == ["a small caption", "another one"]
    assert f"skipping 001.txt in {path}: {MAX_CAPTION_BYTES + 1} bytes, more than a caption's limit" in caplog.text


def test_make_shards_refuses_a_file_that_is_not_an_image(tmp_path):
    from infclip.pipeline.data.shards import folder_samples

    Image.new("RGB", (4, 4)).save(tmp_path / "a.jpg")
    (tmp_path / "b.jpg").write_text("not an image at all")
    (tmp_path / "captions.tsv").write_text("a.jpg\tan image\nb.jpg\ta text file\n")
    with pytest.raises(ValueError, match=r"1 file\(s\) in .* are not images PIL can read, whatever their extension: "
                                         r"b\.jpg"):
        list(folder_samples(tmp_path))


def test_data_error_is_a_user_error_with_one_line(capsys):
    def fail():
        raise DataError("the training stream yielded no batch in epoch 0 (rank 0): 10 usable sample(s)")

    assert "no batch in epoch 0" in _one_line(capsys, fail)


class _Payload:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_pickled_weights_in_a_model_folder_are_refused_naming_the_file(tmp_path):
    """An HF folder (model.pretrained, an export) whose weights are a pickle holding code."""
    import torch

    from infclip.pipeline.errors import CheckpointError
    from infclip.pipeline.model.model import CLIPTowers

    from .test_chunked import tiny_model

    folder = tmp_path / "export"
    tiny_model(0.0).save_pretrained(str(folder))
    for f in folder.glob("*.safetensors"):
        f.unlink()
    probe = tmp_path / "code_ran"
    torch.save({"weights": _Payload(probe)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=rf"refused to load {folder / 'pytorch_model.bin'}: it holds "
                                              r"a Python object \(posix\.mkdir\)"):
        CLIPTowers.from_pretrained(str(folder))
    assert not probe.exists()


@pytest.mark.parametrize("text, message", [
    ("nodeA slots=2\nnodeB slot=2\n", r"line 2: 'nodeB slot=2' is not 'HOST slots=N'"),
    ("nodeA slots=2\n# spare\nnodeA slots=4\n", r"line 3: host 'nodeA' is given twice"),
    ("nodeA slots=0\n", r"line 1: host 'nodeA' has slots=0; it needs at least 1"),
    ("# nothing yet\n\n", r"names no host"),
])
def test_hostfile_is_checked_before_launching(tmp_path, capsys, text, message):
    import sys

    from .test_train import ROOT

    sys.path.insert(0, ROOT)
    from launch.pretrain import main

    path = tmp_path / "hostfile"
    path.write_text(text)
    line = _one_line(capsys, lambda: main(["--check-hostfile", str(path)]))
    assert re.search(message, line) and str(path) in line, line
    path.write_text("nodeA slots=2\n# a comment\nnodeB slots=2\n")
    assert main(["--check-hostfile", str(path)]) == 0
    assert "2 host(s), 4 slot(s): nodeA slots=2, nodeB slots=2" in capsys.readouterr().out
