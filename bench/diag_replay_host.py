"""Where a replayed call of the loss op spends its time on an idle GPU: wall time of one forward +
backward started on an idle stream (synchronised before and after), replayed (the default) and
eager (graph_max_batch 0), CLIP and SigLIP, then a cProfile of the replayed calls (own time per
function), in one process on a CUDA GPU.

    python bench/diag_replay_host.py --sizes 1024,8192 --calls 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_loss_kernels import inputs  # noqa: E402
from infclip.ops import contrastive_loss  # noqa: E402
from profile_table import print_host_profile  # noqa: E402


def one_call(img, txt, scale, bias, loss: str, **kw) -> float:
    """ms of a forward + backward from an idle stream to its end on the GPU."""
    leaves = [x.detach().requires_grad_() for x in (img, txt, scale, bias)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = contrastive_loss(*leaves[:3], leaves[3] if loss == "siglip" else None, loss=loss, **kw)
    out.backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,8192")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}")
    for b in [int(x) for x in args.sizes.split(",")]:
        img, txt, scale, *_ = inputs(b, args.dim)
        bias = torch.full((), -10.0, device="cuda")
        for loss in ("clip", "siglip"):
            for label, kw in (("replayed", {}), ("eager", {"graph_max_batch": 0})):
                times = [one_call(img, txt, scale, bias, loss, **kw) for _ in range(args.calls)]
                print(f"B={b} {loss} {label}: median {statistics.median(times):.3f} ms, "
                      f"p10 {sorted(times)[len(times) // 10]:.3f}", flush=True)
            print_host_profile(lambda: [one_call(img, txt, scale, bias, loss) for _ in range(50)],
                               f"{loss} replayed B = {b}", 50, rows=22)


if __name__ == "__main__":
    main()
