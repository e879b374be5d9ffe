"""Evaluation inside training: launch/pretrain.py with an eval section logs eval/zeroshot/* to
TensorBoard through build_evaluator, and the run it leaves evaluates offline the same way.

The slow test is the end-to-end convergence check on data nobody here wrote (scikit-learn's
digits): train the tiny config on the train split, zero-shot classify the held-out split with
prompts that differ from every training caption, and require accuracy far above chance (10%).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# None of these is a training caption (pipeline.data.shards.DIGITS_CAPTION_TEMPLATES).
HELD_OUT_TEMPLATES = ["a drawing of a {}.", "a photo showing the number {}.", "this image is a {}.",
                      "a low resolution {}.", "the numeral {} in grey.", "a picture of the digit {}.",
                      "an example of the number {}.", "a sketch of a {}.", "a close-up of a handwritten {}.",
                      "this is the number {}."]


def _pretrain(tmp_path: Path, steps: int, every: int, extra=()) -> Path:
    """Run launch/pretrain.py in its own process (it owns and closes its process group)."""
    run = tmp_path / "run"
    (tmp_path / "templates.txt").write_text("\n".join(HELD_OUT_TEMPLATES) + "\n")
    eval_section = {"use_val_shards": True, "templates": str(tmp_path / "templates.txt"), "every": every}
    cmd = [sys.executable, str(ROOT / "launch" / "pretrain.py"), "--ds_config", str(ROOT / "ds_configs" / "tiny_cpu.json"),
           "--set", f"train.output_dir={run}", "--set", f"train.steps={steps}", "--set", "train.save_every=0",
           "--set", f"scheduler.params.total_num_steps={steps}",
           # relative shard paths (the process runs in tmp_path): the loader seeds its random crops
           # from the shard URL, so the same string gives the same run wherever tmp_path is
           "--set", "data.train_shards=digits/train-{000000..000007}.tar",
           "--set", "data.val_shards=digits/test-{000000..000001}.tar",
           "--set", f"eval={json.dumps(eval_section)}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run


def _tb_scalars(run: Path, tag: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert tag in acc.Tags()["scalars"], acc.Tags()["scalars"]
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_periodic_eval_logs_to_tensorboard_and_matches_offline(tmp_path, monkeypatch):
    run = _pretrain(tmp_path, steps=6, every=3, extra=["--set", "eval.max_samples=100",
                                                       "--set", "train_micro_batch_size_per_gpu=16"])
    top1 = _tb_scalars(run, "eval/zeroshot/top1")
    assert [s for s, _ in top1] == [3, 6]
    assert all(0.0 <= v <= 1.0 for _, v in top1)
    step6 = json.loads((run / "eval" / "eval_step6.json").read_text())
    assert step6["zeroshot"]["n"] == 100 and (run / "eval" / "eval_step6_confusion.png").is_file()
    assert step6["zeroshot"]["top1"] == pytest.approx(top1[-1][1], abs=1e-6)
    _check_tensorboard_media(run, step6)

    # offline, from the DeepSpeed checkpoint the run left: the run's own eval section is used
    sys.path.insert(0, str(ROOT))
    from launch.zeroshot import main as zeroshot_main

    out = tmp_path / "offline.json"
    monkeypatch.chdir(tmp_path)  # the run's config names its shards relative to where it ran
    assert zeroshot_main(["--checkpoint", str(run), "--out", str(out)]) == 0
    offline = json.loads(out.read_text())
    assert offline["step"] == 6 and offline["zeroshot"]["n"] == 100
    for key in ("top1", "top5", "confusion"):
        assert offline["zeroshot"][key] == step6["zeroshot"][key], key

    # the exported final/ folder and the consolidated checkpoint are the same model
    from infclip.eval.checkpoint import load_model

    ckpt, final = load_model(run), load_model(run / "final")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ckpt.model.encode_image(x), final.model.encode_image(x), rtol=1e-5, atol=1e-6)


def _check_tensorboard_media(run: Path, report: dict) -> None:
    """One event file holds the run's config (text + hparams), each evaluation's confusion matrix
    (the PNG the report names, as an image) and its per-class accuracy (a text table)."""
    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((run / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    images = acc.Images("eval/zeroshot/confusion")
    assert [e.step for e in images] == [3, 6]
    with Image.open(report["zeroshot"]["confusion_png"]) as png:
        want = np.asarray(png.convert("RGB"))
    import io

    got = np.asarray(Image.open(io.BytesIO(images[-1].encoded_image_string)).convert("RGB"))
    assert got.shape == want.shape and np.array_equal(got, want)
    texts = {tag: acc.Tensors(tag) for tag in acc.Tags()["tensors"]}
    table = texts["eval/zeroshot/per_class/text_summary"][-1].tensor_proto.string_val[0].decode()
    for name, value in report["zeroshot"]["per_class"].items():
        assert f"| {name} | {'-' if value is None else f'{value:.4f}'} |" in table
    config = texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    assert json.loads(config.strip("`").removeprefix("json"))["train"]["steps"] == 6
    assert acc.PluginTagToContent("hparams"), "no hparams summary"


@pytest.mark.slow
def test_zeroshot_digits_convergence(tmp_path):
    """~1-3 minutes on 2 CPU cores: 400 steps of the tiny config (batch 64, AdamW, lr 1e-3
    instead of the config's 2e-3, warm-up 20, cosine); held-out top-1 with unseen prompts >= 50%
    (chance: 10%)."""
    run = _pretrain(tmp_path, steps=400, every=50, extra=["--set", "optimizer.params.lr=1e-3"])
    curve = _tb_scalars(run, "eval/zeroshot/top1")
    assert [s for s, _ in curve] == list(range(50, 401, 50))
    final = curve[-1][1]
    assert final >= 0.5, curve
    assert final > curve[0][1] + 0.2, curve  # it learned during the run, not by chance at init
    report = json.loads((run / "eval" / "eval_step400.json").read_text())
    assert report["zeroshot"]["n"] == 359 and report["zeroshot"]["top5"] >= 0.85
