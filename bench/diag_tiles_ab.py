"""The op's CLIP forward + backward with two settings of its Gluon gradient tiles, call by call in
turn (the order rotating each round), each call behind queued GPU work as in training: the median
of each and of the per-round ratios. A ratio a few percent from 1 is within what a block of calls
per setting drifts by (the GPU's clock moves with its power draw), which alternation cancels.

    python bench/diag_tiles_ab.py --sizes 16384,32768,65536 --rounds 30 --tiles 64,128,64,6 64,128,64,5

bench/device/h200_eu.sh to h200_ew.sh ran it on 64 x 256 tiles (a version of ops/gluon_kernels.py
with the epilogue on column parts, its tiles BLOCK_M,BLOCK_N,BLOCK_K,STAGES,part width), not kept.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contrastive_loss import inputs, ours, timed_call  # noqa: E402
from infclip.ops import contrastive_loss_triton as tri  # noqa: E402


def call_ms(inputs_: tuple, tiles, queued_ms: float) -> float:
    """ms of the op's CLIP forward + backward on ``inputs_`` (bench_contrastive_loss.inputs) with
    these Gluon tiles."""
    tri._GLUON["tiles"] = tiles
    return timed_call(ours("bf16"), *inputs_, queued_ms)[0]


def kernel_table(inputs_: tuple, tiles, calls: int, queued_ms: float) -> None:
    """GPU ms a call of each kernel of the op (over ``calls`` calls) with these tiles."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call_ms(inputs_, tiles, queued_ms)
    rows = [(e.key, e.self_device_time_total / 1e3 / calls, e.count // calls) for e in prof.key_averages()
            if e.self_device_time_total > 0 and "sleep" not in e.key]
    total = sum(r[1] for r in rows)
    print(f"  B={inputs_[0].shape[0]} tiles {tiles}: kernels {total:.3f} ms a call")
    for name, ms, count in sorted(rows, key=lambda r: -r[1])[:6]:
        print(f"    {ms:8.3f} ms  x{count:<4} {name[:90]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16384,32768,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--queued-ms", type=float, default=20.0)
    p.add_argument("--profile", type=int, default=0,
                   help="also, per size and setting, the kernels' GPU time over this many calls (torch profiler)")
    p.add_argument("--tiles", nargs=2, default=["64,128,64,6", "64,128,64,5"],
                   help="the two settings: BLOCK_M,BLOCK_N,BLOCK_K,STAGES (the first is A)")
    args = p.parse_args(argv)
    settings = [tuple(int(v) for v in s.split(",")) for s in args.tiles]
    default = tri._GLUON["tiles"]
    print(f"# {torch.cuda.get_device_name()}, Gluon on: {tri._GLUON['on']}, queued {args.queued_ms} ms, "
          f"A = {settings[0]}, B = {settings[1]}")
    try:
        for b in [int(x) for x in args.sizes.split(",") if x]:
            given = inputs(b, args.dim, torch.bfloat16)
            for tiles in settings * 2:  # warm-up: both compiled
                call_ms(given, tiles, 0.0)
            times = {s: [] for s in settings}
            ratios = []
            for r in range(args.rounds):
                order = settings if r % 2 == 0 else settings[::-1]
                got = {s: call_ms(given, s, args.queued_ms) for s in order}
                for s in settings:
                    times[s].append(got[s])
                ratios.append(got[settings[0]] / got[settings[1]])
            med = {s: statistics.median(v) for s, v in times.items()}
            print(f"B={b:<7} A {med[settings[0]]:.3f} ms  B {med[settings[1]]:.3f} ms  A/B per round: median "
                  f"{statistics.median(ratios):.3f} (quartiles {statistics.quantiles(ratios, n=4)[0]:.3f} / "
                  f"{statistics.quantiles(ratios, n=4)[2]:.3f}), A faster in "
                  f"{sum(x < 1 for x in ratios)} of {len(ratios)}", flush=True)
            for s in settings if args.profile else ():
                kernel_table(given, s, args.profile, args.queued_ms)
            del given
            torch.cuda.empty_cache()
    finally:
        tri._GLUON["tiles"] = default


if __name__ == "__main__":
    main()
