"""Where an eager call of the loss op spends its host time on an idle GPU, at a given B: any call
that waits for the GPU (torch.cuda.set_sync_debug_mode warns on each), the host's time to issue
a forward + backward (no profiler, no sync) against the GPU's span of it (CUDA events; the host
sets the pace where the two are close), and a cProfile of a few forward + backward calls, each
started on an idle stream.

    python bench/diag_loss_host.py --sizes 8192,16384
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_contrastive_loss import inputs, ours  # noqa: E402
from infclip.pipeline.step import OpTimer  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8192,16384")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--loss", default="clip", choices=("clip", "siglip"))
    args = p.parse_args(argv)
    fn = ours("bf16", args.loss)
    for b in [int(x) for x in args.sizes.split(",") if x]:
        img, txt, scale, bias = inputs(b, args.dim, torch.bfloat16)
        for _ in range(3):
            fn(img, txt, scale, bias).backward()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            fn(img, txt, scale, bias).backward()
            torch.cuda.set_sync_debug_mode(0)
        syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
        print(f"# B = {b}: {len(syncs)} host waits in one forward + backward" + "".join(f"\n#   {s}" for s in syncs))
        issue, span = [], []
        for _ in range(max(args.calls, 15)):
            torch.cuda.synchronize()
            timer = OpTimer(img.device)
            t0 = time.perf_counter()
            fn(img, txt, scale, bias).backward()
            issue.append((time.perf_counter() - t0) * 1e3)
            span.append(float(timer.stop()))
        med = lambda xs: sorted(xs)[len(xs) // 2]
        print(f"# B = {b}: host ms to issue a call (median) {med(issue):.2f}, GPU span {med(span):.2f}; "
              f"each: " + " ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(issue, span)), flush=True)
        prof = cProfile.Profile()
        spent = []
        for _ in range(args.calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prof.enable()
            fn(img, txt, scale, bias).backward()
            prof.disable()
            spent.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        print(f"# B = {b}: host ms per call {sorted(spent)}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(22)
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
