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


def print_sync_points(run: Callable[[], object], label: str, count: int) -> None:
    """Run ``run()`` (``count`` steps) and print every place where the host waited for the GPU,
    counted by the calling Python lines outside torch: torch's CUDA sync debug mode flags implicit
    waits (``.item()``, ``bool(tensor)``, copies from pageable memory), and explicit
    ``torch.cuda.synchronize`` / ``Stream.synchronize`` / ``Event.synchronize`` calls are counted
    by wrapping them. A step that keeps the GPU fed has none but the ones it means to have."""
    import collections
    import traceback
    import warnings

    counts: collections.Counter = collections.Counter()

    def record(kind: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename
                  and "profile_table" not in f.filename]
        where = " <- ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
        counts[f"{kind}: {where}"] += 1

    def wrap(owner, name: str, kind: str):
        original = getattr(owner, name)

        def waits(*args, **kwargs):
            record(kind)
            return original(*args, **kwargs)

        setattr(owner, name, waits)
        return owner, name, original

    patched = [wrap(torch.cuda, "synchronize", "torch.cuda.synchronize"),
               wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize"),
               wrap(torch.cuda.Event, "synchronize", "Event.synchronize")]
    shown = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *a, **k: (record("implicit sync")
                                                              if "synchroniz" in str(message) else None)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = shown
        for owner, name, original in patched:
            setattr(owner, name, original)
    print(f"# host waits for the GPU, {label}: {sum(counts.values())} in {count} steps", flush=True)
    for where, n in counts.most_common():
        print(f"{n:5d}  {where}", flush=True)


def print_host_profile(run: Callable[[], object], label: str, count: int, rows: int = 30) -> None:
    """Where the host's Python time goes in ``run()`` (cProfile, cumulative time per function)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    print(f"# host Python profile, {label}: {count} steps (by cumulative, then by own time)", flush=True)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(rows)
    pstats.Stats(prof).sort_stats("tottime").print_stats(rows)
