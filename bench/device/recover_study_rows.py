"""Rebuild launch/batch_study.py's per-run JSON rows from its logs, for runs whose JSON did not come back.

The device tool returns at most 8 files per call; the study's first call wrote 12 run files, and 8 of
them were left on the machine. Every value of a row is also in the part logs (the run's plan line,
its progress lines, the evaluation line and the summary line), so the rows are rebuilt from there;
each carries ``"recovered_from"`` and the final loss as the summary printed it (3 decimals).

    python bench/device/recover_study_rows.py bench/results/batch_study_raw/part*.log --out bench/results/batch_study
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

PLAN = re.compile(r"batch_study: (b(\d+)_s(\d+)): (\d+) steps of \d+, lr ([\d.e-]+), warm-up (\d+) steps")
STEP = re.compile(r"metrics: step (\d+)/\d+ loss ([\d.]+) ")
EVAL = re.compile(r"metrics: eval at step \d+: (.*)$")
DONE = re.compile(r"batch_study: (b\d+_s\d+): loss ([\d.]+),.* ([\d.]+) samples/s")


def rows_from_log(path: Path, chunk: int = 16384) -> dict:
    rows, cur = {}, None
    for line in path.read_text().splitlines():
        if m := PLAN.search(line):
            name, batch, seed, steps, lr, warm = m.groups()
            batch, steps = int(batch), int(steps)
            cur = rows[name] = {
                "batch": batch, "seed": int(seed), "steps": steps, "lr": float(lr), "warmup_steps": int(warm),
                "samples_seen": batch * steps, "chunk_size": chunk if batch > chunk else None, "lr_rule": "sqrt",
                "ln_batch": math.log(batch), "losses": {}, "device": "NVIDIA H200",
                "config": "ds_configs/scenes_small.json", "scenes": 500000, "scene_size": 64,
                "recovered_from": path.name}
        elif cur is not None and (m := STEP.search(line)):
            cur["losses"][m.group(1)] = float(m.group(2))
        elif cur is not None and (m := EVAL.search(line)):
            for item in m.group(1).split(", "):
                key, value = item.rsplit(" ", 1)
                cur[key] = float(value)
        elif m := DONE.search(line):
            row = rows[m.group(1)]
            row["final_loss"], row["samples_per_s"] = float(m.group(2)), float(m.group(3))
            row["first_loss"] = row["losses"][min(row["losses"], key=int)]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    for log in args.logs:
        for name, row in rows_from_log(Path(log)).items():
            path = out / f"{name}.json"
            if path.exists() or "final_loss" not in row:
                continue
            path.write_text(json.dumps(row, indent=1) + "\n")
            print("rebuilt", path)


if __name__ == "__main__":
    main()
