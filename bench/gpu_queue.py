"""Queued GPU work for the benchmarks' training-like timings (``--queued-ms``).

In training the loss is called behind the towers' forward, so the GPU already has work queued
and the host's launches hide behind it unless a call waits on the GPU. A benchmark reproduces
that by queueing a sleep kernel before each timed call and starting its timer (CUDA events)
behind it. Imported by the bench scripts (their folder is on ``sys.path`` when they run)."""

from __future__ import annotations

import torch


def queue_gpu_work(ms: float, device=None) -> None:
    """Queue about ``ms`` milliseconds of GPU work (a sleep kernel) on the current stream of
    ``device``; nothing when ``ms`` is 0."""
    if ms:
        rate_khz = torch.cuda.get_device_properties(device).clock_rate  # cycles per ms
        torch.cuda._sleep(int(ms * rate_khz))
