"""The GPU decode path's crop kernel: one output pixel a lane (``point``) against a band of output rows
a program with the filter's axes applied in turn (``band``), on the batches the loader gives it.

Design: with GPU decoding, the crop kernel is what is left of the data path on the GPU once the
JPEGs are decoded on the host, and a part of it otherwise; every millisecond it runs beside the
step is shared with the step's own kernels. Here a batch of ``--batch`` decoded images of
``--sizes`` px (their shorter side; 4:3, as web images are) with boxes drawn as the loader draws them,
0.9-1.0 of the area (the data section's default ``crop_scale``), is cropped to 224 px by each kernel, alone on the GPU
(``--load_ms 0``) and behind ``--load_ms`` of 8,192^3 bf16 products on another stream (the time is then
the crop's from its first to its last block, on its own stream, as the decode lanes run it).
Before timing, the two kernels' outputs are compared (they may differ in a level's rounding, at
most one level). One JSONL row per (size, kernel, load) in bench/results/crop_kernel.jsonl.

Run (one GPU): ``python bench/bench_crop_kernel.py --sizes 256 512``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from gpu_queue import queue_gpu_work  # noqa: E402

def crop_batch(n: int, side: int, scale=(0.9, 1.0), seed: int = 0):
    """(flat uint8 planes on the GPU, starts, sizes, boxes, dest): ``n`` random images of ``side``
    x ``4 side / 3`` px with boxes drawn by the loader's own ``crop_box`` (area ``scale``)."""
    from infclip.pipeline.data.transforms import crop_box

    g = torch.Generator().manual_seed(seed)
    h, w = side, side * 4 // 3
    flat = torch.randint(0, 256, (n * 3 * h * w,), dtype=torch.uint8, generator=g).cuda()
    rng = random.Random(seed)
    boxes = torch.tensor([crop_box(w, h, scale, rng) for _ in range(n)], dtype=torch.int64)
    starts = torch.arange(n, dtype=torch.int64) * (3 * h * w)
    sizes = torch.tensor([[w, h]] * n, dtype=torch.int64)
    return flat, starts, sizes, boxes, torch.arange(n, dtype=torch.int64)


def time_crop(batch, out: torch.Tensor, load_ms: float, repeats: int, stream: torch.cuda.Stream) -> float:
    """Mean ms of one crop of ``batch`` into ``out`` on ``stream``, behind ``load_ms`` of GEMMs on the
    current stream each time (0: alone)."""
    from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD
    from infclip.pipeline.data.image_ops import resized_crop_normalize_flat

    times = []
    for _ in range(repeats):
        queue_gpu_work(load_ms, gemm_size=8192)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            resized_crop_normalize_flat(*batch[:4], out, batch[4], CLIP_MEAN, CLIP_STD)
            end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sum(times) / len(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512], help="the decoded images' shorter side")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--out_side", type=int, default=224)
    p.add_argument("--load_ms", type=float, nargs="+", default=[0.0, 40.0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "crop_kernel.jsonl"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_crop_kernel needs a CUDA GPU", file=sys.stderr)
        return 2
    import infclip.pipeline.data.image_ops as image_ops
    from infclip.pipeline.data.config import CLIP_STD

    base = {"bench": "crop_kernel", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "batch": args.batch, "out_side": args.out_side,
            "repeats": args.repeats}
    stream = torch.cuda.Stream(priority=-1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    for side in args.sizes:
        batch = crop_batch(args.batch, side)
        outs = {}
        for kernel in ("point", "band"):  # compared in fp32, timed into the model's bf16
            image_ops.KERNEL = kernel
            outs[kernel] = torch.zeros(args.batch, 3, args.out_side, args.out_side, device="cuda")
            time_crop(batch, outs[kernel], 0.0, 1, stream)
        levels = (outs["band"] - outs["point"]).abs().max().item() * 255 * max(CLIP_STD)
        out = torch.zeros(args.batch, 3, args.out_side, args.out_side, dtype=torch.bfloat16, device="cuda")
        for kernel in ("point", "band"):
            image_ops.KERNEL = kernel
            time_crop(batch, out, 0.0, 2, stream)  # compiles for bf16
        for load_ms in args.load_ms:
            for kernel in ("point", "band"):
                image_ops.KERNEL = kernel
                ms = time_crop(batch, out, load_ms, args.repeats, stream)
                row = {**base, "size": side, "kernel": kernel, "load_ms": load_ms, "crop_ms": ms,
                       "max_diff_levels": levels}
                with open(args.out, "a") as f:  # as it comes: a call cut short keeps its rows
                    f.write(json.dumps(row) + "\n")
                print(f"{side} px, {kernel:>5}, behind {load_ms:g} ms of GEMMs: {ms:7.2f} ms a batch "
                      f"(kernels differ by at most {levels:.2f} levels)", flush=True)
    image_ops.KERNEL = "point"
    return 0


if __name__ == "__main__":
    sys.exit(main())
