"""Where ZeRO-3's extra Python calls per step come from, against ZeRO-2 (issue 10's ZeRO-3 bar):
ViT-B/32 at micro-batch 256 with flat parameters, towers as the ZeRO-3 units, CUDA-graphed stacks
and ``overlap_comm`` off (the settings of the README's ZeRO-3 rows), each engine built as
bench_pipeline.py builds it; a cProfile of a few steps, functions by call count per step and by
own time, and who calls the most-called ones. Call counts do not depend on the host's speed.

    python bench/diag_zero3_calls.py --steps 5
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pipeline import build, synthetic_batch, timed_steps  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", type=int, default=45)
    p.add_argument("--callers", type=int, default=12, help="print the callers of this many most-called functions")
    args = p.parse_args(argv)
    import deepspeed

    from infclip.pipeline.train import single_process_env

    single_process_env()
    deepspeed.init_distributed(dist_backend="nccl")
    for zero in (2, 3):
        engine, cfg, loss_fn = build("vitb32", zero, 256, "auto", "triton", {}, "tower" if zero == 3 else False,
                                     "auto", False, "gather", "reduce-overhead", False, True, 2 if zero == 3 else 1)
        batch = synthetic_batch(256, cfg, engine.device, torch.bfloat16)
        timed_steps(engine, loss_fn, batch, 6, None)
        prof = cProfile.Profile()
        prof.enable()
        timed_steps(engine, loss_fn, batch, args.steps, None)
        prof.disable()
        stats = pstats.Stats(prof)
        total = sum(v[1] for v in stats.stats.values())
        print(f"\n# ZeRO-{zero}: {total / args.steps:,.0f} Python calls a step", flush=True)
        stats.sort_stats("ncalls").print_stats(args.rows)
        stats.sort_stats("tottime").print_stats(args.rows // 2)
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])[: args.callers]
        for (file, line, name), _ in top:
            # pstats matches a regex against "file:line(name)", a built-in's as "{name}"
            pattern = (re.escape(f"{os.path.basename(file)}:{line}({name})") if file != "~"
                       else re.escape(name.strip("<>")))
            stats.print_callers(pattern)
        engine.destroy()
        del engine
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
