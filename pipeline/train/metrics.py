"""What the training run reports: TensorBoard scalars and the progress line (rank 0).

Design: :class:`TrainLogger` accumulates a *window* (the micro-steps since the last log line:
samples, time waiting for data, the loader workers' own time, loss-op times) and at each log step
turns it into rates. Values that live on the device (the loss-op timer, the logit scale) are read
only here, at log time, so the step itself never waits for the GPU. Every rank builds one (they
all call it at the same steps); only rank 0 writes.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import Any, Mapping, Optional

import torch

__all__ = ["TrainLogger", "fmt_time"]

logger = logging.getLogger(__name__)


def fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class TrainLogger:
    """TensorBoard writer (rank 0) and the per-window rates.

    Args:
        tb_dir: TensorBoard folder, or None on ranks other than 0 (nothing written).
        total_steps, start_step: for the ETA.
        micro_batch: rows per micro-batch per rank; workers: loader workers (for data rates).
    """

    def __init__(self, tb_dir: Optional[str], *, total_steps: int, start_step: int, micro_batch: int,
                 workers: int, config: Optional[Mapping[str, Any]] = None) -> None:
        self.writer = None
        if tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(tb_dir)
            if config is not None:
                self._log_config(config)
        self.total_steps, self.start_step = total_steps, start_step
        self.micro_batch, self.workers = micro_batch, max(workers, 1)
        self.t_start = time.perf_counter()
        self._starved_warned = False
        self._stalled_warned = False
        self._new_window(first=True)

    def _new_window(self, first: bool = False) -> None:
        self.window = {"t": time.perf_counter(), "samples": 0, "data_s": 0.0, "worker_s": 0.0, "loss_ms": [],
                       "decode_ms": [], "stall_ms": [], "n": 0, "first": first}

    def micro_step(self, *, samples: int, data_s: float, worker_s: float, loss_ms: Any,
                   decode_ms: Any = None, stall_ms: Any = None) -> None:
        """One micro-batch done: ``samples`` over all ranks, ``data_s`` spent waiting for it,
        ``worker_s`` its worker's time making it, ``loss_ms`` and ``decode_ms`` (the GPU decode
        stage's device time for it, None without one), ``stall_ms`` (the GPU time the step's stream
        waited for the batch's decode to finish, None when it does not wait on the device); the
        three read with ``float`` at log time."""
        w = self.window
        if decode_ms is not None:
            w["decode_ms"].append(decode_ms)
        if stall_ms is not None:
            w["stall_ms"].append(stall_ms)
        w["samples"] += samples
        w["data_s"] += data_s
        w["worker_s"] += worker_s
        w["loss_ms"].append(loss_ms)
        w["n"] += 1

    @property
    def window_empty(self) -> bool:
        return self.window["n"] == 0

    def log_step(self, step: int, loss: float, *, lr: float, scale: Any, grad_norm: Optional[float],
                 skipped_samples: int, skipped_steps: int, device: torch.device,
                 collapsed: Optional[bool] = None) -> None:
        """Write the step's scalars and the progress line; start a new window. ``collapsed``: the
        :class:`~pipeline.train.collapse.CollapseWatch` verdict (``train/collapsed`` 0/1; None: not watched)."""
        w = self.window
        elapsed = max(time.perf_counter() - w["t"], 1e-9)
        samples_per_s = w["samples"] / elapsed
        # the loader: each worker's own rate (images over its time making them), all workers
        # together, and the share of the step the loop waited for a batch (> 0.1: starved)
        per_worker = w["n"] * self.micro_batch / w["worker_s"] if w["worker_s"] > 0 else float("nan")
        images_per_s = per_worker * self.workers
        wait_fraction = w["data_s"] / elapsed
        peak = _peak_mem_gb(device)
        loss_ms = sum(float(t) for t in w["loss_ms"]) / max(len(w["loss_ms"]), 1)
        scale = float(scale) if scale is not None else None
        if self.writer is not None:
            scalars = {"train/loss": loss, "train/lr": lr, "train/samples_per_s": samples_per_s,
                       "train/loss_op_ms": loss_ms, "train/peak_mem_gb": peak,
                       "train/skipped_steps": skipped_steps, "data/skipped_samples": skipped_samples,
                       "data/images_per_s": images_per_s, "data/images_per_s_per_worker": per_worker,
                       "data/wait_fraction": wait_fraction}
            if w["decode_ms"]:  # GPU decode: its device time a batch, and its share of the window's time
                decode = [float(t) for t in w["decode_ms"]]
                scalars["data/gpu_decode_ms"] = sum(decode) / len(decode)
                scalars["data/gpu_decode_fraction"] = sum(decode) / 1e3 / elapsed
            stall_fraction = 0.0
            if w["stall_ms"]:  # the step's stream standing still for a batch not yet decoded (GPU time)
                stall = [float(t) for t in w["stall_ms"]]
                stall_fraction = sum(stall) / 1e3 / elapsed
                scalars["data/gpu_stall_ms"] = sum(stall) / len(stall)
                scalars["data/gpu_stall_fraction"] = stall_fraction
            if scale is not None:
                scalars["train/logit_scale"] = scale
            if grad_norm is not None:
                scalars["train/grad_norm"] = float(grad_norm)
            if collapsed is not None:
                scalars["train/collapsed"] = float(collapsed)
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()
            rate = (time.perf_counter() - self.t_start) / max(step - self.start_step, 1)
            logger.info("step %d/%d loss %.4f lr %.3g scale %s gnorm %s %.1f samples/s loss-op %.1f ms "
                        "mem %.2f GB%s eta %s", step, self.total_steps, loss, lr,
                        f"{scale:.2f}" if scale is not None else "-",
                        f"{float(grad_norm):.3f}" if grad_norm is not None else "-", samples_per_s, loss_ms, peak,
                        f" skipped-steps {skipped_steps}" if skipped_steps else "",
                        fmt_time(rate * (self.total_steps - step)))
            if wait_fraction > 0.1 and not w["first"] and not self._starved_warned:
                self._starved_warned = True  # once per run: the TensorBoard curve has the rest
                from ..data.shards import usable_cores

                cores = usable_cores()
                advice = ("raise data.workers" if self.workers < cores - 1 else
                          f"the workers and the trainer already fill the {cores} cores: the loader needs faster cores, "
                          "smaller images on disk, or a smaller data.workers to leave the trainer a core")
                logger.warning("step %d: %.0f%% of the time went waiting for data (loader: %.0f images/s "
                               "per worker, %d workers); %s", step, 100 * wait_fraction, per_worker, self.workers,
                               advice)
            if stall_fraction > 0.1 and not w["first"] and not self._stalled_warned:
                self._stalled_warned = True
                logger.warning("step %d: the step stood %.0f%% of the time waiting on the GPU for batches still "
                               "being decoded (data/gpu_stall_fraction): raise data.gpu_decode_lanes, or lower "
                               "data.gpu_decode_host_max_pixels if the host decodes large JPEGs", step,
                               100 * stall_fraction)
        self._new_window()

    def _log_config(self, config: Mapping[str, Any]) -> None:
        """The resolved config as text (TEXT tab) and its scalar settings as hparams (HPARAMS tab),
        in the run's one event file."""
        import json

        from torch.utils.tensorboard.summary import hparams

        self.writer.add_text("config", "```json\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
        flat: dict = {}

        def walk(prefix: str, node: Any) -> None:
            for key, value in node.items():
                name = f"{prefix}{key}"
                if isinstance(value, Mapping):
                    walk(name + ".", value)
                elif isinstance(value, (bool, int, float, str)) and not key.startswith("_"):
                    flat[name] = value

        walk("", config)
        writer = self.writer._get_file_writer()
        for summary in hparams(flat, {"train/loss": 0.0}):
            writer.add_summary(summary)

    def log_eval_report(self, step: int, report: Optional[Mapping[str, Any]]) -> None:
        """An evaluator's full report: the zero-shot confusion matrix as an image (IMAGES tab) and
        the per-class accuracy as a table (TEXT tab)."""
        if self.writer is None or not report:
            return
        zeroshot = report.get("zeroshot") or {}
        png = zeroshot.get("confusion_png")
        if png and os.path.exists(png):
            import numpy as np
            from PIL import Image

            with Image.open(png) as img:
                self.writer.add_image("eval/zeroshot/confusion", np.asarray(img.convert("RGB")), step,
                                      dataformats="HWC")
        per_class = zeroshot.get("per_class") or {}
        if per_class:
            rows = "\n".join(f"| {name} | {'-' if acc is None else f'{acc:.4f}'} |" for name, acc in per_class.items())
            self.writer.add_text("eval/zeroshot/per_class", "| class | top-1 |\n|---|---|\n" + rows, step)
        self.writer.flush()

    def log_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(f"eval/{k}", v, step)
            self.writer.flush()
            logger.info("eval at step %d: %s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()

    def done(self, steps_done: int) -> None:
        logger.info("done: %d steps in %s", steps_done, fmt_time(time.perf_counter() - self.t_start))
