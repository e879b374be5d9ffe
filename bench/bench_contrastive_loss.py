"""Forward+backward time and peak extra memory of the contrastive loss op against the anchors.

Anchors, all in the same process and run: the dense bf16 matmul rate (for the roofline
8 B^2 D FLOPs), a naive fp32 full-logit loss, open_clip's ClipLoss and inf_cl (two one-
direction calls), the last two imported here only (wheels on the device machine).

    python bench/bench_contrastive_loss.py --out bench/results/contrastive_loss.jsonl

Rows are appended as JSON lines; a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ops import contrastive_loss  # noqa: E402
from pipeline.step import OpTimer  # noqa: E402  (CUDA events, read without a device-wide sync)


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        timer = OpTimer(a.device)
        a @ b
        times.append(float(timer.stop()))
    return 2 * n**3 / (statistics.median(times) * 1e-3) / 1e12


def naive_fp32(img, txt, scale):
    logits = scale * img.float() @ txt.float().T
    labels = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def make_open_clip():
    from open_clip.loss import ClipLoss

    crit = ClipLoss()
    return lambda img, txt, scale: crit(img, txt, scale.to(img.dtype))


def make_inf_cl():
    import torch.distributed as dist
    from inf_cl import cal_inf_loss

    if not dist.is_initialized():  # inf_cl all-reduces its scale gradient: needs a group
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)

    def fn(img, txt, scale):
        s = scale.reshape(())
        return 0.5 * (cal_inf_loss(img, txt, scale=s).mean() + cal_inf_loss(txt, img, scale=s).mean())

    return fn


def ours(dtype_mode):
    def fn(img, txt, scale):
        return contrastive_loss(img, txt, scale, impl="triton", allow_tf32=(dtype_mode == "tf32"),
                                check_finite=False)
    return fn


def measure(fn, b, d, dtype, reps, warmup=2):
    """(median fwd+bwd ms, peak memory above the inputs in GiB, loss), or a status string
    ("oom", "error: ...")."""
    torch.cuda.empty_cache()
    gen = torch.Generator(device="cuda").manual_seed(0)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=gen), dim=-1).to(dtype).requires_grad_()
    txt = F.normalize(torch.randn(b, d, device="cuda", generator=gen), dim=-1).to(dtype).requires_grad_()
    scale = torch.full((1,), 14.3, device="cuda", requires_grad=True)
    try:
        for _ in range(warmup):
            fn(img, txt, scale).backward()
            img.grad = txt.grad = scale.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(reps):
            timer = OpTimer(img.device)
            loss = fn(img, txt, scale)
            loss.backward()
            times.append(float(timer.stop()))
            img.grad = txt.grad = scale.grad = None
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        return statistics.median(times), peak, float(loss.detach())
    except torch.OutOfMemoryError:
        return "oom"
    except Exception as exc:  # an anchor failing must not end the run
        print(f"# error: {type(exc).__name__}: {exc}", flush=True)
        return f"error: {type(exc).__name__}"
    finally:
        del img, txt, scale
        torch.cuda.empty_cache()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4096,16384,32768,65536,262144")
    p.add_argument("--big", default="1048576", help="sizes run for this project only")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--anchor-max", type=int, default=65536, help="largest B for naive/open_clip/inf_cl")
    p.add_argument("--fp32-max", type=int, default=65536, help="largest B for the fp32 modes")
    p.add_argument("--anchors", default="naive,open_clip,inf_cl")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="bench/results/contrastive_loss.jsonl")
    args = p.parse_args(argv)

    dev = torch.cuda.get_device_name()
    import triton

    tflops = matmul_tflops()
    meta = dict(gpu=dev, torch=torch.__version__, triton=triton.__version__, dim=args.dim,
                matmul_tflops=round(tflops, 1), date=time.strftime("%Y-%m-%d"))
    print(f"# {dev}, torch {torch.__version__}, triton {triton.__version__}, bf16 matmul {tflops:.0f} TFLOP/s", flush=True)

    anchors = {}
    for name in [a for a in args.anchors.split(",") if a]:
        try:
            anchors[name] = {"naive": lambda: naive_fp32, "open_clip": make_open_clip,
                             "inf_cl": make_inf_cl}[name]()
        except Exception as exc:  # a missing wheel must not stop the run
            print(f"# anchor {name} unavailable: {exc}", flush=True)

    rows = []
    sizes = [int(x) for x in args.sizes.split(",") if x] + [int(x) for x in args.big.split(",") if x]
    for b in sizes:
        roof = 8 * b * b * args.dim / (tflops * 1e12) * 1e3
        runs = [("ours_bf16", ours("bf16"), torch.bfloat16)]
        if b <= args.fp32_max:
            runs += [("ours_fp32", ours("ieee"), torch.float32), ("ours_tf32", ours("tf32"), torch.float32)]
        if b <= args.anchor_max:
            for name, fn in anchors.items():
                runs.append((name, fn, torch.float32 if name == "naive" else torch.bfloat16))
        for name, fn, dtype in runs:
            reps = args.reps if (b <= 65536 or name.startswith("ours")) else 2
            reps = 3 if b >= 1_000_000 else reps
            res = measure(fn, b, args.dim, dtype, reps, warmup=1 if b >= 262144 else 2)
            row = dict(meta, impl=name, B=b, dtype=str(dtype).replace("torch.", ""),
                       roofline_ms=round(roof, 3))
            if isinstance(res, str):
                row.update(status=res)
            else:
                ms, peak, loss = res
                row.update(status="ok", ms=round(ms, 3), peak_extra_gib=round(peak, 3), loss=loss,
                           x_roofline=round(ms / roof, 2),
                           mem_bar_gib=round((3 * b * args.dim * 4) / 2**30, 3))
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    print("\n| B | impl | dtype | ms | x roofline | peak extra GiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] == "ok":
            print(f"| {r['B']:,} | {r['impl']} | {r['dtype']} | {r['ms']:.1f} | {r['x_roofline']} | {r['peak_extra_gib']:.2f} |")
        else:
            print(f"| {r['B']:,} | {r['impl']} | {r['dtype']} | {r['status']} | | |")


if __name__ == "__main__":
    main()
