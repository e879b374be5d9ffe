"""The DCT-domain JPEG decoder against nvJPEG's GPU backend: alone, and what each costs a stream of
matrix products running beside it (a training step's SM time).

Design: one batch of ``--batch`` web-like JPEGs (``bench_data.picture``, ``--size`` px, baseline
quality 90). The host's part of the DCT path (:func:`pipeline.data.jpeg_scan.parse_scan` per image,
:func:`pipeline.data.dct_decode.pack_scans` per batch) is timed on one core. Then, per decoder
(``dct/LANES/CHUNK/BITS``: :func:`pipeline.data.dct_decode.decode_scans` at ``1 / --scale`` of the
JPEG's size, with each of ``--lanes``, ``--chunks`` and ``--lookup_bits``;
``nvjpeg``: :class:`pipeline.data.nvjpeg.NvJpeg`'s GPU backend, full size) and per load (none, or
``--load_ms`` of ``N``^3 bf16 products on another stream), the batch is decoded on a high-priority
stream while the load runs: the ms until the batch is decoded, and how much longer the load took
than without a decode beside it (``load_delay_ms``: the SM time the decode took from it). The
median of ``--repeats`` calls. Also the DCT path's pixels against PIL's scaled decode of the same
files (mean and largest difference in levels). One JSONL row per (decoder, load, lanes) in
bench/results/dct_decode.jsonl.

Run (one GPU, the 'gpu' extra installed): ``python bench/bench_dct_decode.py --batch 1024 --size 512
--gemm_sizes 8192 2048``.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from bench_data import jpeg_bytes, picture  # noqa: E402
from gpu_queue import queue_gpu_work  # noqa: E402  (bench/, on sys.path as the script's folder)


def _median(values):
    return sorted(values)[len(values) // 2]


def host_cost(files, k: int, lookup_bits: int, full_chroma: bool) -> tuple:
    """(the packed batch, ms per image to parse, ms to pack the batch) on this host's core."""
    from infclip.pipeline.data.dct_decode import pack_scans
    from infclip.pipeline.data.jpeg_scan import parse_scan

    t0 = time.perf_counter()
    scans = [parse_scan(f) for f in files]
    t1 = time.perf_counter()
    batch = pack_scans(scans, [k] * len(scans), lookup_bits, full_chroma)
    t2 = time.perf_counter()
    return batch, 1e3 * (t1 - t0) / len(files), 1e3 * (t2 - t1)


def beside_load(decode, stream, other, gemm, load_ms) -> tuple:
    """(ms until the batch is decoded, ms the load took) with the decode queued just after the load."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(other):
        start.record(other)
        if gemm:
            queue_gpu_work(load_ms, gemm_size=gemm)
        end.record(other)
    t0 = time.perf_counter()
    if decode is not None:
        with torch.cuda.stream(stream):
            decode()
        stream.synchronize()
    done = 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    return done, start.elapsed_time(end)


def pixel_error(batch, decoded, files, k: int, count: int = 16) -> tuple:
    """(mean, largest) absolute difference in levels between the DCT path's first ``count`` images
    and PIL's decode of the same files at the same scale."""
    from infclip.pipeline.data.dct_decode import image_views

    diffs = []
    for got, f in zip(image_views(batch, decoded.cpu()), files[:count]):
        img = Image.open(io.BytesIO(f))
        if k < 8:
            img.draft("RGB", (img.size[0] * k // 8, img.size[1] * k // 8))
        ref = np.asarray(img.convert("RGB")).transpose(2, 0, 1).astype(np.int16)
        diffs.append(np.abs(got.numpy().astype(np.int16) - ref))
    return float(np.mean([d.mean() for d in diffs])), int(max(d.max() for d in diffs))


def kernel_times(decode, stream, top: int = 8) -> list:
    """(kernel name, launches, GPU ms) of one decode, the longest first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(stream):
            decode()
        torch.cuda.synchronize()
    rows = [(e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[2])[:top]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--size", type=int, default=512, help="the JPEGs' side in pixels")
    p.add_argument("--scale", type=int, default=2, choices=[1, 2, 4, 8], help="the DCT path decodes at 1/scale")
    p.add_argument("--decoders", nargs="+", default=["dct", "nvjpeg"], choices=["dct", "nvjpeg"])
    p.add_argument("--lanes", type=int, nargs="+", default=[32], help="images a Huffman program decodes (dct)")
    p.add_argument("--chunks", type=int, nargs="+", default=[8],
                   help="symbols a lane decodes between two checks for the program's end (dct)")
    p.add_argument("--lookup_bits", type=int, nargs="+", default=[10], help="the Huffman lookup tables' width (dct)")
    p.add_argument("--gemm_sizes", type=int, nargs="*", default=[8192, 2048],
                   help="loads: N^3 bf16 products on another stream (none is always run)")
    p.add_argument("--load_ms", type=float, default=150.0, help="GPU time queued as the load")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--full_chroma", action="store_true", help="the DCT path's chroma at up to 8 pixels a block")
    p.add_argument("--profile", action="store_true", help="each decoder's kernels on an idle GPU, by GPU time")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "dct_decode.jsonl"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_dct_decode needs a CUDA GPU", file=sys.stderr)
        return 2
    from infclip.pipeline.data.dct_decode import decode_scans
    from infclip.pipeline.data.gpu_decode import pack_jpegs
    from infclip.pipeline.data.nvjpeg import load_decoder

    rng = np.random.default_rng(0)
    files = [jpeg_bytes(picture(rng, args.size), i) for i in range(args.batch)]
    k = 8 // args.scale
    device = torch.device("cuda")
    stream, other = torch.cuda.Stream(priority=-1), torch.cuda.Stream()
    decoders = {}
    for bits in args.lookup_bits:
        batch, parse_ms, pack_ms = host_cost(files, k, bits, args.full_chroma)
        print(f"host: parse {parse_ms:.3f} ms an image, pack {pack_ms:.1f} ms a batch of {args.batch}", flush=True)
        for name in ("data", "desc", "lookup", "maxcode", "offset", "symbols", "quant"):
            setattr(batch, name, getattr(batch, name).pin_memory())
        for lanes in args.lanes if "dct" in args.decoders else []:
            for chunk in args.chunks:
                decoders[f"dct/{lanes}/{chunk}/{bits}"] = (
                    lambda batch=batch, lanes=lanes, chunk=chunk: decode_scans(batch, device, lanes=lanes, chunk=chunk))
    if "nvjpeg" in args.decoders:
        nv, why = load_decoder("gpu")
        if nv is None:
            print(f"nvjpeg: cannot be used ({why})", file=sys.stderr)
            return 2
        data, offsets = pack_jpegs(files)
        data = data.pin_memory()
        sizes = torch.tensor([[args.size, args.size]] * args.batch)
        decoders["nvjpeg/gpu"] = lambda: nv.decode(data, offsets, sizes, stream)
    base = {"bench": "dct_decode", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "batch": args.batch, "size": args.size, "scale": args.scale,
            "load_ms": args.load_ms, "parse_ms_per_image": parse_ms, "pack_ms": pack_ms,
            "full_chroma": args.full_chroma}
    # decoder names: dct/LANES/CHUNK/LOOKUP_BITS or nvjpeg/gpu
    rows = []
    with torch.cuda.stream(stream):
        decoded = decode_scans(batch, device) if "dct" in args.decoders else None
    torch.cuda.synchronize()
    if decoded is not None:
        mean, worst = pixel_error(batch, decoded, files, k)
        base.update(dct_mean_error=mean, dct_max_error=worst)
        print(f"dct against PIL at 1/{args.scale}: mean {mean:.2f}, largest {worst} levels", flush=True)
    for name, decode in decoders.items():
        for _ in range(3):
            beside_load(decode, stream, other, None, 0)  # compile, and the decoder's buffers grow
        for gemm in [None, *args.gemm_sizes]:
            alone = _median([beside_load(None, stream, other, gemm, args.load_ms)[1] for _ in range(args.repeats)]) \
                if gemm else 0.0
            runs = [beside_load(decode, stream, other, gemm, args.load_ms) for _ in range(args.repeats)]
            done, took = _median([r[0] for r in runs]), _median([r[1] for r in runs])
            row = {**base, "decoder": name, "load": f"{gemm}^3 gemms" if gemm else "idle", "decoded_ms": done,
                   "load_alone_ms": alone, "load_beside_ms": took if gemm else 0.0,
                   "load_delay_ms": took - alone if gemm else 0.0}
            rows.append(row)
            print(f"{name:>11}, {row['load']:>12}: decoded after {done:7.1f} ms; load {alone:7.1f} ms alone, "
                  f"{row['load_delay_ms']:+6.1f} ms beside", flush=True)
    if args.profile:
        for name, decode in decoders.items():
            print(f"\n{name}: kernels on an idle GPU (count, ms)")
            for kernel, count, ms in kernel_times(decode, stream):
                print(f"  {kernel[:90]:<90} {count:5d} {ms:8.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
