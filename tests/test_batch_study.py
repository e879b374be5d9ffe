"""launch/batch_study.py: the plan's arithmetic, and a real (tiny, CPU) study end to end: scenes
written, every run trained through pipeline.train.train with the device cache, evaluated, reported."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launch"))

import batch_study as study  # noqa: E402


def test_lr_rules_and_the_plan_keep_samples_seen_fixed():
    assert study.scaled_lr(4096, 5e-4, 1024, "sqrt") == pytest.approx(1e-3)
    assert study.scaled_lr(4096, 5e-4, 1024, "linear") == pytest.approx(2e-3)
    assert study.scaled_lr(4096, 5e-4, 1024, "constant") == pytest.approx(5e-4)
    assert study.scaled_lr(65536, 5e-4, 1024, "sqrt", max_lr=2e-3) == pytest.approx(2e-3)
    runs = study.plan([1024, 4096, 65536], [0, 1], 4_194_304, 5e-4, 1024, "sqrt", 0.1)
    assert [(r.batch, r.seed) for r in runs] == [(1024, 0), (1024, 1), (4096, 0), (4096, 1), (65536, 0), (65536, 1)]
    assert {r.batch * r.steps for r in runs} == {4_194_304}
    assert [r.warmup for r in runs[::2]] == [410, 102, 6]
    with pytest.raises(SystemExit, match="at least 2"):
        study.plan([65536], [0], 100_000, 5e-4, 1024, "sqrt", 0.1)


def test_false_negative_share_counts_rows_whose_caption_repeats():
    caps = ["a", "a", "b", "c"]
    assert study.false_negative_share(caps, 4) == pytest.approx(0.5)  # both "a" rows
    assert study.false_negative_share(["x"] * 10, 5) == 1.0
    assert study.false_negative_share([str(i) for i in range(100)], 50) == 0.0


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    import infclip.pipeline.train.train  # noqa: F401  (DeepSpeed before the study sets its env)

    tmp = tmp_path_factory.mktemp("study")
    out = tmp / "results"
    argv = ["--config", str(ROOT / "ds_configs" / "scenes_tiny_cpu.json"), "--data", str(tmp / "scenes"),
            "--scenes", "600", "--scene-size", "64", "--eval-samples", "40", "--retrieval-samples", "40",
            "--batches", "32", "64", "--seeds", "0", "1", "--samples", "256", "--chunk", "32",
            "--base-lr", "1e-3", "--base-batch", "32", "--out", str(out), "--run-dir", str(tmp / "runs"),
            "--max-lr", "1.2e-3", "--warmup", "0.1", "--seen"]
    assert study.main(argv) == 0
    return tmp, out, argv


def test_every_run_trains_on_the_same_samples_and_is_evaluated(tiny_study):
    _, out, _ = tiny_study
    rows = {(r["batch"], r["seed"]): r for r in study.load_rows(str(out))}
    assert set(rows) == {(32, 0), (32, 1), (64, 0), (64, 1)}
    for (batch, seed), row in rows.items():
        assert row["samples_seen"] == 256 and row["steps"] == 256 // batch
        assert row["lr"] == pytest.approx(min(1e-3 * math.sqrt(batch / 32), 1.2e-3))
        assert row["chunk_size"] == (32 if batch == 64 else None)  # the chunked backbone above --chunk
        assert row["first_loss"] == pytest.approx(math.log(batch), rel=0.25)  # near chance at the start
        for split in ("zeroshot_shape", "zeroshot_colour", "zeroshot_count", "zeroshot_shape_seen"):
            assert 0.0 <= row[f"{split}/top1"] <= 100.0
        assert 0.0 <= row["retrieval/i2t_r1"] <= 100.0 and 0.0 <= row["retrieval/t2i_r1"] <= 100.0
    assert rows[(32, 0)]["losses"] != rows[(32, 1)]["losses"]  # the seed changes the init and the order
    fn = json.loads((out / "false_negatives.json").read_text())
    assert set(fn) == {"32", "64"} and all(0.0 <= v <= 1.0 for v in fn.values())


def test_a_second_call_skips_the_runs_done(tiny_study, caplog):
    _, out, argv = tiny_study
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("b*_s*.json")}
    with caplog.at_level("INFO", logger="batch_study"):
        assert study.main(argv) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("b*_s*.json")} == before
    assert sum("done already" in r.getMessage() for r in caplog.records) == 4


def test_report_writes_the_table_and_the_plot(tiny_study):
    from PIL import Image

    tmp, out, _ = tiny_study
    docs = tmp / "study.md"
    docs.write_text("# study\n\ntext before\n\n<!-- results: begin (launch/batch_study.py --report) -->\nold\n"
                    "<!-- results: end -->\n\ntext after\n")
    png = tmp / "study.png"
    assert study.main(["--report", "--out", str(out), "--docs", str(docs), "--png", str(png)]) == 0
    text = docs.read_text()
    assert "old" not in text and text.startswith("# study\n\ntext before") and text.endswith("text after\n")
    lines = [line for line in text.splitlines() if line.startswith("| 32 ") or line.startswith("| 64 ")]
    assert len(lines) == 2 and all(line.count("±") == len(study.METRICS) for line in lines)
    assert "| 2 |" in lines[0]  # two seeds each
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] > 800
