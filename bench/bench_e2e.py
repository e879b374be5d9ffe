"""End to end from JPEG shards on disk against the same step on synthetic batches (one GPU).

Design: writes rendered-scene shards (256 px JPEGs, pipeline.data.scenes) to local disk, then runs,
each in its own process on the same GPU: (1) ``bench/bench_pipeline.py`` throughput of the preset
on synthetic batches already on the device, (2) ``launch/pretrain.py`` with the same preset
reading the shards (decode, random crop to 224 and tokenising in DataLoader workers; uint8 to the
GPU). The ratio of the two steady-state rates says whether the loader keeps up. The pretrain
rate is the mean of ``train/samples_per_s`` read back from the run's TensorBoard file, skipping
the first ``--skip`` logged windows (compilation, loader warm-up). One row in
bench/results/e2e.jsonl.

Run: ``python bench/bench_e2e.py --preset ds_configs/vitb32.json --workers 12 --steps 60``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench_pipeline import ZERO3_STEP_WAITS  # noqa: E402  (bench/, on sys.path as the script's folder)
from infclip.pipeline.config import load_config  # noqa: E402
from infclip.pipeline.engine.engine import zero3_kept_waits  # noqa: E402


def run(cmd: list, log: str) -> None:
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{tail}")


def tensorboard_rate(run_dir: str, skip: int) -> tuple[float, int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)
    values = []
    for path in files:
        acc = EventAccumulator(path)
        acc.Reload()
        if "train/samples_per_s" in acc.Tags().get("scalars", []):
            values += [e.value for e in acc.Scalars("train/samples_per_s")]
    if len(values) <= skip:
        raise SystemExit(f"{run_dir}: {len(values)} samples/s points, need more than --skip {skip}")
    kept = values[skip:]
    return sum(kept) / len(kept), len(kept)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="ds_configs/vitb32.json")
    p.add_argument("--scenes", type=int, default=60000, help="training pairs to render")
    p.add_argument("--workers", type=int, default=12, help="data.workers of the pretrain run")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log_every", type=int, default=5)
    p.add_argument("--skip", type=int, default=3, help="logged windows to drop (compile, warm-up)")
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "e2e.jsonl"))
    args = p.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="bench_e2e_")
    os.makedirs(work, exist_ok=True)
    run_cfg = load_config(os.path.join(ROOT, args.preset))
    micro, zero = run_cfg.micro_batch_size, run_cfg.zero_stage
    model = os.path.basename(args.preset).split(".")[0].split("_")[0]  # vitb32_zero3 -> vitb32

    t0 = time.perf_counter()
    run([sys.executable, "launch/make_shards.py", "--scenes", str(args.scenes), "--out", f"{work}/scenes",
         "--scene-size", "256", "--samples-per-shard", "1000", "--eval-samples", "100", "--retrieval-samples", "100"],
        f"{work}/make_shards.log")
    made_s = time.perf_counter() - t0
    train = sorted(glob.glob(f"{work}/scenes/train/*.tar"))

    synth = f"{work}/synthetic.jsonl"
    # the synthetic step with the preset's own settings
    mcfg = run_cfg.model
    arg = lambda v: str(int(v)) if isinstance(v, bool) else v  # noqa: E731  (true/false -> 1/0, strings as they are)
    settings = ["--flat_parameters", arg(mcfg.flat_parameters), "--compile_mode", mcfg.compile_mode,
                "--grad_ckpt", {True: "on", False: "off"}.get(mcfg.gradient_checkpointing, "auto"),
                "--overlap_comm", arg(bool(run_cfg.ds_config["zero_optimization"].get("overlap_comm", True)))]
    if zero == 3:  # the training engine's units and host waits
        step = {waits: str(v) for v, waits in ZERO3_STEP_WAITS.items()}[zero3_kept_waits(mcfg)]
        settings += ["--zero3_leaf", arg(mcfg.zero3_leaf_layers), "--on_device_step", step]
    run([sys.executable, "bench/bench_pipeline.py", "--only", "throughput", "--throughput_model", model,
         "--micro_batch", str(micro), "--zero", str(zero), "--anchors", *settings, "--out", synth],
        f"{work}/synthetic.log")
    with open(synth) as f:
        synthetic = json.loads(f.readlines()[-1])["samples_per_s"]

    out_dir = f"{work}/run"
    overrides = [f"data.train_shards={json.dumps(train)}", f"data.workers={args.workers}",
                 "data.samples_per_epoch=100000000", f"train.steps={args.steps}", f"train.log_every={args.log_every}",
                 "train.save_every=0", "train.save_final=false", "train.export_final=false",
                 f"train.output_dir={out_dir}", f"tensorboard.output_path={out_dir}/ds_tb/"]
    cmd = [sys.executable, "launch/pretrain.py", "--ds_config", args.preset]
    for o in overrides:
        cmd += ["--set", o]
    run(cmd, f"{work}/pretrain.log")
    rate, points = tensorboard_rate(out_dir, args.skip)
    row = {"bench": "e2e", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "preset": args.preset, "micro_batch": micro, "zero": zero, "workers": args.workers,
           "cpu_count": os.cpu_count(), "shards": len(train), "scenes": args.scenes, "render_s": made_s,
           "synthetic_samples_per_s": synthetic, "shards_samples_per_s": rate, "points": points,
           "ratio": rate / synthetic}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{model} micro {micro} ZeRO-{zero}: synthetic {synthetic:.0f} samples/s, from shards {rate:.0f} "
          f"({rate / synthetic:.1%}; {args.workers} loader workers, {os.cpu_count()} cores)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
