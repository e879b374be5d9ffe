"""What the loss op holds at its peak: the live CUDA allocations at the moment of the highest
allocated memory during one forward + backward (torch's allocator history, replayed), each with
its size and the innermost frame of this repository that allocated it.

    python bench/diag_loss_memory.py --b 65536
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _where(frames) -> str:
    """The innermost frame inside this repository (else the innermost Python frame)."""
    for f in frames:
        if f["filename"].startswith(ROOT) or "/infclip/" in f["filename"]:
            return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
    named = [f for f in frames if f["filename"].endswith(".py")]
    return f"{named[0]['filename']}:{named[0]['line']}" if named else "?"


def peak_live(trace, base: dict) -> tuple[int, list]:
    """Replays alloc / free events: (peak bytes above the start, live allocations at the peak)."""
    live, total, peak, at_peak = {}, 0, 0, {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    return peak, sorted(at_peak.values(), key=lambda e: -e["size"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--b", type=int, default=65536)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--loss", default="clip", choices=("clip", "siglip"))
    p.add_argument("--set", default="", help="ATTR=VALUE;...: settings of ops/contrastive_loss_triton.py "
                   "for the run (as bench_contrastive_loss.py --variant, without the label)")
    args = p.parse_args(argv)
    if args.set:
        from bench_contrastive_loss import _Settings, parse_variant  # (bench/, the script's folder)

        _Settings(parse_variant("set:" + args.set)[1]).__enter__()
        print(f"# settings: {args.set}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    img = F.normalize(torch.randn(args.b, args.dim, device="cuda", generator=gen), dim=-1).bfloat16()
    txt = F.normalize(img.float() + 0.5 * torch.randn_like(img.float()), dim=-1).bfloat16()
    img.requires_grad_(), txt.requires_grad_()
    scale = torch.full((), 14.3, device="cuda", requires_grad=True)
    bias = torch.full((), -10.0, device="cuda", requires_grad=True) if args.loss == "siglip" else None
    contrastive_loss(img, txt, scale, bias, loss=args.loss, impl="triton").backward()  # warm-up
    img.grad = txt.grad = scale.grad = None
    if bias is not None:
        bias.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    contrastive_loss(img, txt, scale, bias, loss=args.loss, impl="triton").backward()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"B={args.b} {args.loss}: peak above the inputs {(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} MiB")
    trace = [e for t in snap["device_traces"] for e in t]
    peak, live = peak_live(trace, {})
    print(f"replayed peak {peak / 2**20:.1f} MiB; live at the peak:")
    for e in live[:15]:
        print(f"  {e['size'] / 2**20:9.1f} MiB  {_where(e.get('frames', []))}")


if __name__ == "__main__":
    main()
