"""The benchmarks' profile summary: where a run's host and device time go (torch.profiler).

Imported by the bench scripts (their folder is on ``sys.path`` when they run as scripts)."""

from __future__ import annotations

from typing import Callable

import torch


def print_profile(run: Callable[[], object], label: str, count: int, show: bool = True) -> None:
    """Profile ``run()`` (``count`` calls or steps) and print two tables, by host time and by
    device time. Every rank of a distributed benchmark must run it (collectives inside);
    ``show=False`` profiles without printing (the other ranks)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    if not show:
        return
    events = prof.key_averages()
    head = f"# profile {label}: {count} calls"
    if cuda:
        # kernels and copies only (device-side events): an op's self device time repeats its kernels'
        busy_ms = sum(e.self_device_time_total for e in events
                      if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
        head += f", device busy {busy_ms / count:.2f} ms per call"
    print(head, flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60), flush=True)
    if cuda:
        print(events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60), flush=True)
