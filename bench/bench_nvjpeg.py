"""nvJPEG's batched decode, called directly, on an idle GPU and behind other streams' work.

Design: one batch of ``--batch`` web-like JPEGs (``bench_data.picture``, ``--size`` px, baseline
quality 90) decoded by :class:`pipeline.data.nvjpeg.NvJpeg` on a high-priority stream, once per
backend (``gpu``: the batched kernels; ``hardware``: the JPEG engines; ``hybrid``: the host;
``gpu_device`` and ``hardware_device``: the first two reading the files from device memory) and per load: none, or
about ``--load_ms`` of bf16 matrix products queued on another stream just before the call (``N``
in ``--gemm_sizes``: N^3 products; large ones hold every SM for a millisecond or more, small ones
free their blocks every few microseconds, as a training step's kernels fall between). For each it
reports the host's time inside the call and the time until the batch is decoded. With
``--profile`` it also records each decoder's call under the largest load with ``torch.profiler``
and lists the CUDA runtime calls, kernels and copies it made, by count and time: where the host
waits (the JPEG engines), and what the host-side decoder (``hybrid``) hands the GPU. One JSONL
row per (backend, output, load) in bench/results/nvjpeg.jsonl.

Run (one GPU, torchvision installed: the library is the one its wheel ships):
``python bench/bench_nvjpeg.py --batch 1024 --gemm_sizes 8192 2048 --profile`` (``--outputs rgb yuv``:
the same without the colour conversion asked for; ``--sm_carveout N``: the load's products through
cuBLASLt, told to leave N SMs free, as ``bench_stream.py --sm_carveout`` runs the training step).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_data import jpeg_batch  # noqa: E402
from gpu_queue import carve_sms, queue_gpu_work  # noqa: E402  (bench/, on sys.path as the script's folder)


def queue_gemms(n: int, ms: float, stream: torch.cuda.Stream) -> None:
    """About ``ms`` of n^3 bf16 products on ``stream`` (:func:`gpu_queue.queue_gpu_work`)."""
    with torch.cuda.stream(stream):
        queue_gpu_work(ms, gemm_size=n)


def timed_decode(decoder, data, offsets, sizes, stream) -> tuple:
    """(ms the host spent in the call, ms until the batch was decoded)."""
    t0 = time.perf_counter()
    decoder.decode(data, offsets, sizes, stream)
    t1 = time.perf_counter()
    stream.synchronize()
    return 1e3 * (t1 - t0), 1e3 * (time.perf_counter() - t0)


def profile_summary(decoder, batch, stream, other, gemm: int, load_ms: float, top: int = 12) -> list:
    """The CUDA runtime calls, kernels, copies and memsets of one call behind the load, by total time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        queue_gemms(gemm, load_ms, other)
        timed_decode(decoder, *batch, stream)
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(prefix="nvjpeg_trace_"), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    totals = collections.defaultdict(lambda: [0, 0.0])
    kinds = ("cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in kinds:
            key = (e["cat"], e["name"][:70])
            totals[key][0] += 1
            totals[key][1] += e.get("dur", 0) / 1e3
    return sorted(((k[0], k[1], c, ms) for k, (c, ms) in totals.items()), key=lambda r: -r[3])[:top]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--size", type=int, default=256, help="the JPEGs' side in pixels")
    p.add_argument("--backends", nargs="+", default=["gpu", "hardware"], choices=["gpu", "hardware", "hybrid", "gpu_device", "hardware_device"])
    p.add_argument("--gemm_sizes", type=int, nargs="*", default=[8192, 2048],
                   help="loads: N^3 bf16 products on another stream (none is always run)")
    p.add_argument("--load_ms", type=float, default=400.0, help="GPU time queued as the load")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per (backend, load); the median is kept")
    p.add_argument("--outputs", nargs="+", default=["rgb"], choices=["rgb", "rgbi", "yuv"],
                   help="the decoders' output: rgb (planes), rgbi (interleaved pixels; the crop kernel reads both) or "
                        "yuv (the planes as coded, no colour conversion asked for)")
    p.add_argument("--preallocate", nargs="+", default=["on"], choices=["on", "off"],
                   help="the JPEG engines' buffer pool sized for the batch before the first call (on) or grown by "
                        "the library (off); both: each measured")
    p.add_argument("--profile", action="store_true", help="profile each decoder behind the largest load")
    p.add_argument("--sm_carveout", type=int, default=None, metavar="N",
                   help="the load's matrix products through cuBLASLt, told to leave N SMs free")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "nvjpeg.jsonl"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_nvjpeg needs a CUDA GPU", file=sys.stderr)
        return 2
    from infclip.pipeline.data.nvjpeg import load_decoder

    if args.sm_carveout is not None:
        carve_sms(args.sm_carveout)

    batch = jpeg_batch(args.batch, args.size)
    stream, other = torch.cuda.Stream(priority=-1), torch.cuda.Stream()
    base = {"bench": "nvjpeg", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "batch": args.batch, "size": args.size, "load_ms": args.load_ms,
            "sm_carveout": args.sm_carveout}
    rows = []
    decoders = {}
    combos = [(b, o, pre == "on") for o in args.outputs for b in args.backends
              for pre in (args.preallocate if b.startswith("hardware") else ["on"])]
    for backend, output, pre in combos:
        decoder, why = load_decoder(backend, output, pre)
        if decoder is None:
            print(f"{backend}: nvJPEG cannot be used ({why})", file=sys.stderr)
            return 2
        decoders[backend, output, pre] = decoder
        for _ in range(3):  # the state's buffers grow to the batch
            timed_decode(decoder, *batch, stream)
        for gemm in [None, *args.gemm_sizes]:
            runs = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                if gemm:
                    queue_gemms(gemm, args.load_ms, other)
                runs.append(timed_decode(decoder, *batch, stream))
                torch.cuda.synchronize()
            host, done = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
            row = {**base, "backend": backend, "engines": decoder.hardware, "output": output, "preallocate": pre,
                   "load": f"{gemm}^3 gemms" if gemm else "idle", "host_ms": host, "decoded_ms": done}
            rows.append(row)
            print(f"{backend:>8} ({'JPEG engines' if decoder.hardware else 'kernels'}, {output}"
                  f"{', pool sized' if pre and decoder.hardware else ''}), {row['load']:>12}: "
                  f"host in the call {host:7.1f} ms, decoded after {done:7.1f} ms", flush=True)
    if args.profile and args.gemm_sizes:
        gemm = max(args.gemm_sizes)
        for (backend, output, pre), decoder in decoders.items():
            print(f"\n{backend} backend ({output}{f', preallocate {pre}' if backend.startswith('hardware') else ''}) behind "
                  f"{gemm}^3 gemms: calls by total time (count, ms)")
            for cat, name, count, ms in profile_summary(decoder, batch, stream, other, gemm, args.load_ms):
                print(f"  {cat:<12} {name:<70} {count:6d} {ms:9.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
