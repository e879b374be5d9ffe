"""How a GPU-bound pass's rate changes over a long burst: one callable run back to back for
``--seconds`` (a CUDA event after every call), its TFLOP/s over successive windows, the SM clock,
power and temperature sampled by nvidia-smi meanwhile; then the same calls one at a time with an
idle gap before each. Tells a power or thermal cap (every pass slows alike as the burst goes on)
from a kernel's own behaviour at a size (slow from its first call).

    python bench/diag_sustained.py --what gemm,sums --b 65536,262144 --seconds 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from infclip.ops import gluon_kernels  # noqa: E402
from infclip.pipeline.step import OpTimer  # noqa: E402
from bench_loss_kernels import inputs  # noqa: E402


def passes(b: int, dim: int, names: list) -> dict:
    """name -> (callable, GFLOP a call) at batch ``b`` for each of ``names``: "gemm", cuBLAS's
    GEMM of a 65,536-row band of the logits (bf16 out; the whole matrix above 65k would not fit),
    and "sums", the op's Gluon forward sums over the whole B x B."""
    img, txt, scale, row_shift, col_shift, _ref, _sums = inputs(b, dim)
    found = {}
    if "gemm" in names:
        rows = min(b, 65536)
        band = torch.empty(rows, b, device="cuda", dtype=img.dtype)  # (32 GiB at 262k: made only if asked)
        found["gemm"] = (lambda: torch.mm(img[:rows], txt.T, out=band), 2 * rows * b * dim / 1e9)
    if "sums" in names:
        out = torch.zeros(b, device="cuda"), torch.zeros(b, device="cuda")
        sms = tri._sm_count(img.device)
        found["sums"] = (lambda: gluon_kernels.clip_sums(img, txt, scale.reshape(1), row_shift, col_shift, *out, 0,
                                                         sms), 2 * b * b * dim / 1e9)
    return found


def burst(fn, seconds: float, calls_hint: float) -> list:
    """Per-call GPU ms of ``fn`` run back to back for about ``seconds``."""
    n = max(3, int(seconds * 1000 / calls_hint))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


def spaced(fn, count: int, gap: float) -> list:
    """GPU ms of ``count`` single calls, each after ``gap`` seconds of an idle GPU."""
    times = []
    for _ in range(count):
        time.sleep(gap)
        timer = OpTimer(torch.device("cuda"))
        fn()
        times.append(float(timer.stop()))
    return times


def windows(times: list, gflop: float, parts: int = 5) -> str:
    """TFLOP/s over ``parts`` successive stretches of a burst."""
    size = max(1, len(times) // parts)
    chunks = [times[i:i + size] for i in range(0, len(times), size)][:parts]
    return " / ".join(f"{gflop * len(c) / sum(c):.0f}" for c in chunks)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--what", default="gemm,sums")
    p.add_argument("--b", default="65536,262144")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--gap", type=float, default=1.0, help="idle seconds before each spaced call")
    args = p.parse_args(argv)
    try:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader", "-lms", "200"], stdout=subprocess.PIPE, text=True)
    except OSError as exc:  # (no nvidia-smi: the rates alone)
        print(f"# no nvidia-smi samples: {exc}")
        smi = None
    print(f"# {torch.cuda.get_device_name()}; TFLOP/s over five stretches of each burst, then spaced calls",
          flush=True)
    for b in [int(x) for x in args.b.split(",")]:
        for name, (fn, gflop) in passes(b, args.dim, args.what.split(",")).items():
            first = spaced(fn, 2, args.gap)[-1]
            times = burst(fn, args.seconds, first)
            late = spaced(fn, 3, args.gap)
            print(f"B={b:<7} {name:<5} burst of {len(times)} calls ({sum(times) / 1000:.1f} s): "
                  f"{windows(times, gflop)} TFLOP/s; spaced after {args.gap:.0f} s idle: "
                  f"{' / '.join(f'{gflop / t:.0f}' for t in late)} TFLOP/s ({gflop / first:.0f} before the burst)",
                  flush=True)
    if smi is None:
        return
    smi.terminate()
    samples = smi.communicate()[0].strip().splitlines()
    print(f"# nvidia-smi, every 200 ms ({len(samples)} samples): timestamp, SM MHz, W, C")
    for line in samples[:: max(1, len(samples) // 60)]:
        print(line)


if __name__ == "__main__":
    main()
