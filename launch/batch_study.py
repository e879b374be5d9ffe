"""The batch-size study: zero-shot and retrieval on rendered scenes at a fixed number of samples seen.

    # every (batch, seed) run not done yet, one JSON per run under --out; the defaults are the study
    # of docs/batch_study.md (batches 1,024-65,536, 3 seeds, 2^21 samples seen, ds_configs/scenes_small.json)
    python launch/batch_study.py
    # the same on 2 GPUs: the shared parts once, then one process per GPU
    python launch/batch_study.py --prepare
    for k in 0 1; do CUDA_VISIBLE_DEVICES=$k python launch/batch_study.py --part $k/2 & done; wait
    # mean +- std per batch size: the table in docs/batch_study.md and the plot docs/batch_study.png
    python launch/batch_study.py --report

Design: every run is the project's own training (:func:`pipeline.train.train.train`, a DeepSpeed engine,
the tiled loss, the chunked backbone above ``--chunk`` rows) from one config, changed only where the
study says: the global batch B, the steps (``--samples`` // B), the learning rate (``--lr-rule``
from ``--base-lr`` at ``--base-batch``, capped at ``--max-lr``), the warm-up (``--warmup`` of the
steps) and the seed (model init and data order). The scenes are written once (``--scenes`` pairs at
``--scene-size``), the BPE is trained once, and the training set is decoded once into GPU memory
(``data.device_cache``) and shared by every run of the process. After its last step each run is
evaluated on the three zero-shot splits of held-out compositions (``--seen``: the three of seen
ones too) and the near-duplicate retrieval split, and writes ``<out>/b<B>_s<seed>.json``; runs
whose file exists are skipped, so the command resumes. The report also gives, per batch size, the
share of a batch's rows whose caption occurs again in the same batch (false negatives of the
contrastive loss).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import math
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from infclip.eval.config import EvalConfig  # noqa: E402
from infclip.eval.evaluator import Evaluator  # noqa: E402
from infclip.pipeline.config import load_config  # noqa: E402
from infclip.pipeline.data.scenes import ZEROSHOT_SPLITS, write_scenes  # noqa: E402
from infclip.pipeline.data.shard_urls import expand_urls  # noqa: E402
from infclip.pipeline.data.tokenizer import ensure_tokenizer, iter_shard_captions  # noqa: E402
from infclip.pipeline.train.train import single_process_env, train  # noqa: E402

logger = logging.getLogger("batch_study")

#: The metrics of the table and the plot: (key in a run's JSON, label).
METRICS = (
    ("zeroshot_shape/top1", "zero-shot shape, held-out (%)"),
    ("zeroshot_colour/top1", "zero-shot colour, held-out (%)"),
    ("zeroshot_count/top1", "zero-shot count, held-out (%)"),
    ("retrieval/i2t_r1", "retrieval image->text R@1 (%)"),
    ("retrieval/t2i_r1", "retrieval text->image R@1 (%)"),
    ("final_loss", "final training loss"),
    ("loss_over_chance", "final loss / ln B (1: chance)"),
)
#: The panels of the plot (the raw loss is not comparable across batch sizes: its chance level is ln B).
PLOT_METRICS = tuple(m for m in METRICS if m[0] != "final_loss")
LR_RULES = ("sqrt", "linear", "constant")


@dataclasses.dataclass(frozen=True)
class Run:
    """One point of the study."""

    batch: int
    seed: int
    steps: int
    lr: float
    warmup: int

    @property
    def name(self) -> str:
        return f"b{self.batch}_s{self.seed}"


def scaled_lr(batch: int, base_lr: float, base_batch: int, rule: str, max_lr: Optional[float] = None) -> float:
    """The learning rate at ``batch``: ``base_lr`` x (batch / base_batch) ^ {1/2 (sqrt), 1 (linear), 0},
    at most ``max_lr``."""
    power = {"sqrt": 0.5, "linear": 1.0, "constant": 0.0}[rule]
    lr = base_lr * (batch / base_batch) ** power
    return lr if max_lr is None else min(lr, max_lr)


def plan(batches: Sequence[int], seeds: Sequence[int], samples: int, base_lr: float, base_batch: int,
         rule: str, warmup: float, max_lr: Optional[float] = None) -> List[Run]:
    """Every (batch, seed) run: the same samples seen (``samples`` // batch steps of batch rows)."""
    runs = []
    for batch in batches:
        steps = samples // batch
        if steps < 2:
            raise SystemExit(f"batch_study.py: error: --samples {samples} gives {steps} step(s) at batch {batch}; "
                             "need at least 2")
        for seed in seeds:
            runs.append(Run(batch, seed, steps, scaled_lr(batch, base_lr, base_batch, rule, max_lr),
                            max(1, round(warmup * steps))))
    return runs


def ensure_scenes(data_dir: str, num_train: int, size: int, eval_samples: int, retrieval_samples: int) -> Dict[str, str]:
    """The scenes' split URLs, written first unless ``data_dir/scenes.json`` has these settings."""
    meta_path = Path(data_dir) / "scenes.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        sizes = {split: info["samples"] for split, info in meta["splits"].items()}
        if meta.get("image_size") == size and sizes.get("train") == num_train:
            return {split: os.path.join(data_dir, info["url"]) for split, info in meta["splits"].items()}
        logger.info("%s holds other scenes (%s px, %s training pairs): writing anew", data_dir,
                    meta.get("image_size"), sizes.get("train"))
    made = write_scenes(data_dir, num_train, eval_samples, retrieval_samples, image_size=size,
                        samples_per_shard=10_000)
    total = sum(info["samples"] for info in made["splits"].values())
    logger.info("scenes: %d pairs written in %.1f s (%.0f per CPU second)", total, made["wall_s"],
                total / max(made["cpu_s"], 1e-9))
    return {split: info["url"] for split, info in made["splits"].items()}


def false_negative_share(captions: Sequence[str], batch: int, draws: int = 8, seed: int = 0) -> float:
    """Mean share of rows of a random batch whose caption occurs again in that batch."""
    rng = random.Random(seed)
    shares = []
    for _ in range(min(draws, max(1, len(captions) // batch))):
        picked = rng.sample(range(len(captions)), min(batch, len(captions)))
        counts = Counter(captions[i] for i in picked)
        shares.append(sum(n for n in counts.values() if n > 1) / len(picked))
    return sum(shares) / len(shares)


class StudyEval:
    """The study's evaluation, run by :func:`pipeline.train.train.train` after the last step: the six
    held-out zero-shot splits (and the ``_seen`` ones with ``seen``) and retrieval, as ``{split/metric: value}`` (top-1 and R@k in percent, median ranks)."""

    every = 0
    at_end = True

    def __init__(self, splits: Dict[str, str], data_dir: str, tokenizer, workers: int = 0,
                 seen: bool = False) -> None:
        self.evaluators = {}
        for split in ZEROSHOT_SPLITS if seen else [s for s in ZEROSHOT_SPLITS if not s.endswith("_seen")]:
            cfg = EvalConfig(shards=splits[split], classnames=os.path.join(data_dir, split, "classnames.txt"),
                             templates=os.path.join(data_dir, split, "templates.txt"), batch_size=1024)
            self.evaluators[split] = Evaluator(cfg, tokenizer=tokenizer, workers=workers)
        self.evaluators["retrieval"] = Evaluator(EvalConfig(retrieval_shards=splits["retrieval"], batch_size=1024),
                                                 tokenizer=tokenizer, workers=workers)
        for ev in self.evaluators.values():
            ev.log_table = False
        self.seconds = 0.0

    def __call__(self, model, step: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        out = {}
        for split, ev in self.evaluators.items():
            for key, value in ev(model, step).items():
                if split == "retrieval" and key.startswith("retrieval/") and "rank" not in key:
                    out[key] = 100.0 * value  # R@k, percent
                elif split == "retrieval" and key in ("retrieval/i2t_median_rank", "retrieval/t2i_median_rank"):
                    out[key] = value
                elif key == "zeroshot/top1":
                    out[f"{split}/top1"] = 100.0 * value
        self.seconds = time.perf_counter() - t0
        return out


def run_one(run: Run, args, splits: Dict[str, str], tokenizer_dir: str, evaluator: StudyEval) -> dict:
    """Train and evaluate one run; the row of its JSON."""
    chunk = args.chunk if run.batch > args.chunk else None
    sets = {
        "train_micro_batch_size_per_gpu": run.batch, "gradient_accumulation_steps": 1,
        "optimizer.params.lr": run.lr, "scheduler.params.total_num_steps": run.steps,
        "scheduler.params.warmup_num_steps": run.warmup,
        "data.train_shards": splits["train"], "data.tokenizer": tokenizer_dir, "data.device_cache": True,
        "data.crop_scale": [1.0, 1.0], "data.samples_per_epoch": None, "data.resampled": False, "data.seed": run.seed,
        "train.steps": run.steps, "train.seed": run.seed, "train.chunk_size": chunk, "train.save_every": 0,
        "train.save_final": False, "train.export_final": False, "train.log_every": max(1, run.steps // 20),
        "train.save_on_signal": [],  # a run's JSON is the unit the study resumes: a stopped run must not write one
        "train.output_dir": os.path.join(args.run_dir, run.name), "eval": None,
    }
    if args.loader_workers is not None:
        sets["data.workers"] = args.loader_workers
    run_cfg = load_config(args.config, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    t0 = time.perf_counter()
    result = train(run_cfg, evaluator=evaluator)
    wall = time.perf_counter() - t0
    losses = [result.losses[s] for s in sorted(result.losses)]
    tail = losses[-max(1, len(losses) // 10):]
    train_s = wall - evaluator.seconds
    return {
        "batch": run.batch, "seed": run.seed, "steps": run.steps, "lr": run.lr, "warmup_steps": run.warmup,
        "samples_seen": run.steps * run.batch, "chunk_size": chunk, "lr_rule": args.lr_rule,
        "final_loss": sum(tail) / len(tail), "first_loss": losses[0], "ln_batch": math.log(run.batch),
        "losses": {str(s): result.losses[s] for s in sorted(result.losses)[:: max(1, run.steps // 200)]},
        **result.eval_metrics,
        "train_s": train_s, "samples_per_s": run.steps * run.batch / max(train_s, 1e-9), "eval_s": evaluator.seconds,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "config": args.config, "scenes": args.scenes, "scene_size": args.scene_size,
    }


def prepare(args):
    """The scenes, the BPE and the false-negative shares (what every part shares; run once first
    when parts run in parallel: ``--prepare``). Returns (split URLs, tokenizer folder, tokenizer)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    splits = ensure_scenes(args.data, args.scenes, args.scene_size, args.eval_samples, args.retrieval_samples)
    run_cfg = load_config(args.config, [f"data.train_shards={splits['train']}"])
    tokenizer_dir = os.path.join(args.data, "tokenizer")
    train_urls = expand_urls(splits["train"])
    tokenizer = ensure_tokenizer(run_cfg.data, train_urls, tokenizer_dir, run_cfg.model.text.context_length)
    stats_path = out / "false_negatives.json"
    if not stats_path.exists():
        captions = list(iter_shard_captions(train_urls))
        stats = {str(b): false_negative_share(captions, b) for b in sorted(set(args.batches))}
        stats_path.write_text(json.dumps(stats, indent=1) + "\n")
    return splits, tokenizer_dir, tokenizer


def train_all(args) -> None:
    runs = plan(args.batches, args.seeds, args.samples, args.base_lr, args.base_batch, args.lr_rule, args.warmup,
                args.max_lr)
    k, n = (int(x) for x in args.part.split("/"))
    mine = [r for i, r in enumerate(runs) if i % n == k]
    out = Path(args.out)
    splits, tokenizer_dir, tokenizer = prepare(args)
    evaluator = StudyEval(splits, args.data, tokenizer, args.eval_workers, args.seen)
    for run in mine:
        path = out / f"{run.name}.json"
        if path.exists():
            logger.info("%s: done already (%s)", run.name, path)
            continue
        logger.info("%s: %d steps of %d, lr %.3g, warm-up %d steps", run.name, run.steps, run.batch, run.lr,
                    run.warmup)
        row = run_one(run, args, splits, tokenizer_dir, evaluator)
        path.write_text(json.dumps(row, indent=1) + "\n")
        logger.info("%s: loss %.3f, shape %.1f%%, colour %.1f%%, count %.1f%%, i2t R@1 %.1f%%, %.0f samples/s",
                    run.name, row["final_loss"], row.get("zeroshot_shape/top1", float("nan")),
                    row.get("zeroshot_colour/top1", float("nan")), row.get("zeroshot_count/top1", float("nan")),
                    row.get("retrieval/i2t_r1", float("nan")), row["samples_per_s"])
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- report

def load_rows(out: str) -> List[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob("b*_s*.json"))]


def summarize(rows: Sequence[dict]) -> Dict[int, Dict[str, tuple]]:
    """batch -> {metric: (mean, sample std, runs)} over the seeds."""
    table: Dict[int, Dict[str, tuple]] = {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        table[batch] = {}
        for key, _ in METRICS + (("lr", ""), ("steps", ""), ("samples_per_s", "")):
            if key == "loss_over_chance":
                values = [r["final_loss"] / math.log(r["batch"]) for r in mine]
            else:
                values = [float(r[key]) for r in mine if key in r]
            if values:
                mean = sum(values) / len(values)
                std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
                table[batch][key] = (mean, std, len(values))
    return table


def markdown_table(table: Dict[int, Dict[str, tuple]], false_negatives: Dict[str, float]) -> str:
    head = ["global batch", "steps", "lr", "seeds"] + [label for _, label in METRICS] + ["false-negative rows"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for batch, cols in table.items():
        seeds = cols["final_loss"][2]
        cells = [f"{batch:,}", f"{cols['steps'][0]:.0f}", f"{cols['lr'][0]:.2e}", str(seeds)]
        for key, _ in METRICS:
            mean, std, _ = cols.get(key, (float("nan"), float("nan"), 0))
            cells.append(f"{mean:.3f} ± {std:.3f}" if "loss" in key else f"{mean:.1f} ± {std:.1f}")
        share = false_negatives.get(str(batch))
        cells.append("-" if share is None else f"{100 * share:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: Dict[int, Dict[str, tuple]], path: str, title: str) -> str:
    """Mean +- std per batch size, one panel per metric (matplotlib, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    batches = list(table)
    for ax, (key, label) in zip(axes.flat, PLOT_METRICS):
        means = [table[b].get(key, (math.nan,))[0] for b in batches]
        stds = [table[b].get(key, (0, 0))[1] for b in batches]
        ax.errorbar(batches, means, yerr=stds, marker="o", capsize=4)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [f"{b // 1024}k" for b in batches])
        ax.set_xlabel("global contrastive batch")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: str, docs: str, png: str) -> str:
    """The table into ``docs`` (between the result markers) and the plot; returns the table."""
    rows = load_rows(out)
    if not rows:
        raise SystemExit(f"batch_study.py: error: no run results (b*_s*.json) under {out}")
    fn_path = Path(out) / "false_negatives.json"
    false_negatives = json.loads(fn_path.read_text()) if fn_path.is_file() else {}
    table = summarize(rows)
    md = markdown_table(table, false_negatives)
    first = rows[0]
    plot(table, png, f"{first['config']}, {first['scenes']:,} scenes at {first['scene_size']} px, "
                     f"{first['samples_seen']:,} samples seen, lr rule {first['lr_rule']}, mean ± std over seeds")
    begin, end = "<!-- results: begin (launch/batch_study.py --report) -->", "<!-- results: end -->"
    text = Path(docs).read_text() if Path(docs).is_file() else f"# Batch-size study\n\n{begin}\n{end}\n"
    if begin not in text or end not in text:
        raise SystemExit(f"batch_study.py: error: {docs} lacks the markers {begin} ... {end}")
    head, rest = text.split(begin, 1)
    Path(docs).write_text(f"{head}{begin}\n{md}\n{end}{rest.split(end, 1)[1]}")
    return md


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="ds_configs/scenes_small.json", help="the base run config")
    p.add_argument("--data", default="data/scenes64", help="scenes folder (written if it lacks these scenes)")
    p.add_argument("--scenes", type=int, default=500_000, help="training pairs")
    p.add_argument("--scene-size", type=int, default=64, help="image side (the config's vision image_size)")
    p.add_argument("--eval-samples", type=int, default=2000, help="pairs per zero-shot split")
    p.add_argument("--retrieval-samples", type=int, default=5000, help="retrieval pairs (groups of 5)")
    p.add_argument("--batches", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samples", type=int, default=2 ** 21, help="samples seen by every run")
    p.add_argument("--base-lr", type=float, default=5e-4, help="learning rate at --base-batch")
    p.add_argument("--base-batch", type=int, default=1024)
    p.add_argument("--lr-rule", choices=LR_RULES, default="sqrt", help="lr = base-lr x (B / base-batch)^p, "
                   "p = 1/2, 1 or 0")
    p.add_argument("--max-lr", type=float, default=2e-3, help="cap of the scaled learning rate (0: none)")
    p.add_argument("--warmup", type=float, default=0.2, help="warm-up, as a share of each run's steps")
    p.add_argument("--chunk", type=int, default=16384, help="chunked backbone (GradCache) above this many rows")
    p.add_argument("--eval-workers", type=int, default=0, help="loader processes of the evaluation")
    p.add_argument("--seen", action="store_true", help="also evaluate the zero-shot splits of seen compositions")
    p.add_argument("--loader-workers", type=int, default=None, help="processes that read the training set into "
                   "GPU memory (default: the config's data.workers)")
    p.add_argument("--prepare", action="store_true", help="only write the scenes, the BPE and the false-negative "
                   "shares (before parts run in parallel)")
    p.add_argument("--part", default="0/1", help="K/N: run every N-th run from the K-th (one process per GPU)")
    p.add_argument("--out", default="bench/results/batch_study", help="one JSON per run")
    p.add_argument("--run-dir", default="runs/batch_study", help="the runs' output folders (TensorBoard)")
    p.add_argument("--report", action="store_true", help="only write the table and the plot from --out")
    p.add_argument("--docs", default="docs/batch_study.md", help="--report: the page whose table is rewritten")
    p.add_argument("--png", default="docs/batch_study.png", help="--report: the plot")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.report:
        print(write_report(args.out, args.docs, args.png))
        return 0
    if not _valid_part(args.part):
        p.error(f"--part must be K/N with 0 <= K < N, got {args.part!r}")
    args.max_lr = args.max_lr or None
    if args.prepare:
        prepare(args)
        return 0
    single_process_env()
    train_all(args)
    return 0


def _valid_part(part: str) -> bool:
    try:
        k, n = (int(x) for x in part.split("/"))
    except ValueError:
        return False
    return 0 <= k < n


if __name__ == "__main__":
    sys.exit(main())
