"""launch/zeroshot.py: mistakes in what the user hands over are one line and exit code 2; one
unreadable image is skipped and counted, not fatal."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from infclip.pipeline.data.shards import DIGITS_CLASSNAMES
from infclip.pipeline.errors import UserErrorExit

from .conftest import make_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from launch.zeroshot import main as zeroshot_main  # noqa: E402


@pytest.fixture(scope="module")
def hf_folder(tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("zs") / "hf"
    make_model(tokenizer).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out / "tokenizer"))
    return out


def _lines(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("case, message", [
    ("template", r"template 0 'a photo' must contain '\{\}' exactly once"),
    ("no_templates", r"template file .* is empty"),
    ("no_classnames", r"class-name file .* is empty"),
    ("no_label", r"sample '[0-9]+' has no label: zero-shot shards need a json member"),
    ("empty_folders", r"no images \(.*\) under the class folders of"),
])
def test_zeroshot_user_errors_are_one_line(hf_folder, digits_test, tmp_path, capsys, case, message):
    import re

    classes = _lines(tmp_path / "classes.txt", DIGITS_CLASSNAMES)
    args = ["--checkpoint", str(hf_folder), "--classnames", classes, "--out", str(tmp_path / "r.json"),
            "--shards", digits_test["shards"]]
    if case == "template":
        args += ["--templates", _lines(tmp_path / "t.txt", ["a photo"])]
    elif case == "no_templates":
        args += ["--templates", _lines(tmp_path / "t.txt", [])]
    elif case == "no_classnames":
        args[args.index("--classnames") + 1] = _lines(tmp_path / "c.txt", [])
    elif case == "no_label":  # retrieval-style shards (captions, no labels) given as zero-shot shards
        args[-1] = _unlabelled_shards(tmp_path)
    elif case == "empty_folders":
        for name in DIGITS_CLASSNAMES:
            (tmp_path / "images" / name).mkdir(parents=True)
        args[-2:] = ["--images", str(tmp_path / "images")]
    capsys.readouterr()
    with pytest.raises(UserErrorExit):
        zeroshot_main(args)
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("zeroshot.py: error: ")]
    assert len(errors) == 1 and re.search(message, errors[0]), err[-5:]


def _unlabelled_shards(tmp_path):
    from PIL import Image

    from infclip.pipeline.data.shards import brace_url, write_shards

    samples = ((Image.new("RGB", (16, 16), (i, 0, 0)), f"a caption {i}", None) for i in range(4))
    return brace_url(write_shards(samples, tmp_path / "unlabelled", samples_per_shard=4, image_format="png"))


def test_an_unreadable_image_is_skipped_and_counted(hf_folder, digits_test, tmp_path, caplog):
    images = tmp_path / "images"
    shutil.copytree(digits_test["images"], images)
    broken = sorted((images / DIGITS_CLASSNAMES[3]).iterdir())[0]
    broken.write_bytes(broken.read_bytes()[:40])  # cut short: the header reads, the pixels do not
    args = ["--checkpoint", str(hf_folder), "--classnames", _lines(tmp_path / "classes.txt", DIGITS_CLASSNAMES),
            "--images", str(images), "--out", str(tmp_path / "r.json"), "--batch-size", "100"]
    assert zeroshot_main(args) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["zeroshot"]["n"] == digits_test["n"] - 1
    assert f"skipping unreadable image {broken}" in caplog.text
    assert "skipped 1 unreadable image(s)" in caplog.text


def test_zeroshot_never_follows_a_latest_out_of_its_folder(tmp_path):
    from infclip.eval.checkpoint import find_tag_dir
    from infclip.pipeline.errors import CheckpointError

    (tmp_path / "elsewhere" / "global_step4").mkdir(parents=True)
    (tmp_path / "elsewhere" / "global_step4" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    ckpt = tmp_path / "run" / "ckpt"
    ckpt.mkdir(parents=True)
    for text, message in (("../../elsewhere/global_step4", r"latest holds '\.\./\.\./elsewhere/global_step4', not the "
                                                           r"name of a folder beside it; pass --tag"),
                          ("root:x:0:0:root:/root:/bin/bash\n" * 3, r"latest holds \d+ bytes, not the name")):
        (ckpt / "latest").write_text(text)
        with pytest.raises(CheckpointError, match=message) as exc:
            find_tag_dir(ckpt)
        assert "root:x" not in str(exc.value)
