"""What host JPEG decoding costs another thread's kernel launches, by where the decoder writes.

Design: a training step is a thread that launches kernels; with ``data.gpu_decode_host_max_pixels``
the decode lanes run nvJPEG's hybrid backend beside it, and that decoder copies every image to the
GPU itself, plane by plane, through the CUDA driver the training thread launches through. Here
``--lanes`` threads decode one batch of ``--batch`` web-like JPEGs (``bench_data.picture``,
``--size`` px) over and over, each with its own decoder and stream, while the main thread times
the host side of small kernel launches on a stream of its own (``--seconds`` each). Targets:
``device`` (as the loader does it: the decoder writes the GPU buffer), ``host`` (the decoder
writes a pinned host buffer, then one copy a batch moves it to the GPU) and ``pil`` (no nvJPEG:
PIL decodes each JPEG at half its DCT scale, as the CPU path does when the crop allows it, into
a pinned buffer of interleaved pixels copied once a batch; a quarter of the bytes). Before timing, the
``host`` target's bytes are checked against the ``device`` target's. Reports per (output, target,
lanes): the launch's host time (microseconds, mean and 99th percentile) and the images decoded a
second; ``--lanes 0`` is the launch time with nothing beside it. ``--load_ms`` adds, per value, a
thread that keeps about that many milliseconds of 8,192^3 bf16 products queued on a stream of its
own (0: an idle GPU), as a training step keeps the GPU busy while the lanes decode. One JSONL row
each in bench/results/host_decode.jsonl.

Run (one GPU, torchvision installed: the library is the one its wheel ships):
``python bench/bench_host_decode.py --size 512 --lanes 0 2 4 --targets device host pil``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_data import jpeg_batch  # noqa: E402
from gpu_queue import queue_gpu_work  # noqa: E402


class _Lane(threading.Thread):
    """A thread decoding ``batch`` into its target until ``stop`` is set; ``images`` counts them."""

    def __init__(self, decoder, batch, target: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.decoder, self.batch, self.target, self.stop = decoder, batch, target, stop
        self.stream = torch.cuda.Stream()
        self.images, self.error = 0, None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                decode_once(self.decoder, self.batch, self.target, self.stream)
                self.stream.synchronize()
                self.images += self.batch[1].numel() - 1
        except Exception as exc:  # reported with the row
            self.error = exc


def pil_half_scale(data: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The batch's JPEGs (all of one size) decoded by PIL at half their DCT scale (``draft``, as the
    CPU path decodes a JPEG whose crop allows it) into one pinned buffer of interleaved pixels,
    [n, H / 2, W / 2, 3]."""
    import io

    from PIL import Image

    raw = data.numpy()
    w, h = (int(v) // 2 for v in sizes[0])
    host = torch.empty(offsets.numel() - 1, h, w, 3, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    view = host.numpy()
    for k in range(offsets.numel() - 1):
        with Image.open(io.BytesIO(raw[int(offsets[k]):int(offsets[k + 1])].tobytes())) as im:
            im.draft("RGB", (w, h))
            view[k] = np.asarray(im.convert("RGB"))[:h, :w]
    return host


def decode_once(decoder, batch, target: str, stream: torch.cuda.Stream) -> torch.Tensor:
    """The batch decoded on ``stream`` into a device buffer, directly (``device``), through a
    pinned host buffer and one copy (``host``), or by PIL at half scale into a pinned buffer and
    one copy (``pil``, no decoder); the device buffer (valid once the stream has run)."""
    from infclip.pipeline.data.nvjpeg import plane_buffer

    data, offsets, sizes = batch
    flat, starts = plane_buffer(sizes // 2 if target == "pil" else sizes, stream)
    if target == "device":
        decoder.decode(data, offsets, sizes, stream, out=(flat, starts))
        return flat
    if target == "pil":
        host = pil_half_scale(data, offsets, sizes).view(-1)
    else:
        host = torch.empty(flat.numel(), dtype=torch.uint8, pin_memory=True)
        decoder.decode(data, offsets, sizes, stream, out=(host, starts))
    with torch.cuda.stream(stream):
        flat.copy_(host, non_blocking=True)
    stream.synchronize()  # before the host buffer goes back to the pinned-memory cache
    return flat


class _Load(threading.Thread):
    """A thread keeping about ``ms`` of GEMMs queued on a stream of its own until ``stop`` is set:
    it queues ``ms`` at a time and waits for the chunk before last, so two are in flight."""

    def __init__(self, ms: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.ms, self.stop = ms, stop
        self.stream = torch.cuda.Stream()

    def run(self) -> None:
        pending = []
        with torch.cuda.stream(self.stream):
            while not self.stop.is_set():
                queue_gpu_work(self.ms, gemm_size=8192)
                done = torch.cuda.Event(blocking=True)
                done.record()
                pending.append(done)
                if len(pending) > 1:
                    pending.pop(0).synchronize()
        self.stream.synchronize()


def launch_times(seconds: float, per_sync: int = 64) -> np.ndarray:
    """The host time of each small kernel launch (microseconds) on a stream of this thread's own,
    for ``seconds``; the stream is drained every ``per_sync`` launches, outside the timing."""
    stream = torch.cuda.Stream()
    x = torch.zeros(1, device="cuda")
    times = []
    end = time.perf_counter() + seconds
    with torch.cuda.stream(stream):
        while time.perf_counter() < end:
            for _ in range(per_sync):
                t0 = time.perf_counter()
                x.add_(1.0)
                times.append(time.perf_counter() - t0)
            stream.synchronize()
    return 1e6 * np.asarray(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=512, help="the JPEGs' side in pixels")
    p.add_argument("--lanes", type=int, nargs="+", default=[0, 2, 4], help="decode threads beside the launches")
    p.add_argument("--targets", nargs="+", default=["device", "host", "pil"], choices=["device", "host", "pil"])
    p.add_argument("--outputs", nargs="+", default=["rgb"], choices=["rgb", "rgbi"])
    p.add_argument("--seconds", type=float, default=3.0, help="launch timing per row")
    p.add_argument("--load_ms", type=float, nargs="+", default=[0.0],
                   help="GPU time of 8,192^3 products kept queued on another stream (0: none)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "host_decode.jsonl"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_host_decode needs a CUDA GPU", file=sys.stderr)
        return 2
    from infclip.pipeline.data.nvjpeg import load_decoder

    batch = jpeg_batch(args.batch, args.size)
    base = {"bench": "host_decode", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "cpu_count": os.cpu_count(), "batch": args.batch,
            "size": args.size, "seconds": args.seconds}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    rows = []

    def keep(row: dict) -> None:  # written as it comes: a host destination the library mishandles may end the process
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    for output in args.outputs:
        first, why = load_decoder("hybrid", output)
        if first is None:
            print(f"nvJPEG's hybrid backend cannot be used ({why})", file=sys.stderr)
            return 2
        stream = torch.cuda.Stream()
        reference = decode_once(first, batch, "device", stream)
        stream.synchronize()  # the decode ran on the lane's stream, the copy below runs on the current one
        reference = reference.cpu()
        for target in args.targets:
            row = {**base, "output": output, "target": target}
            if target == "host":
                try:
                    same = torch.equal(decode_once(first, batch, "host", stream).cpu(), reference)
                except Exception as exc:  # the library may refuse a host destination
                    keep({**row, "error": f"{type(exc).__name__}: {exc}"})
                    print(f"{output}, host target: {rows[-1]['error']}", flush=True)
                    continue
                row["same_bytes"] = same
            if target == "pil" and output != args.outputs[0]:
                continue  # no nvJPEG output format: once
            for load_ms, lanes in ((m, n) for m in args.load_ms for n in args.lanes):
                if target != "device" and lanes == 0:
                    continue  # nothing beside the launches: the device row's
                stop = threading.Event()
                load = [_Load(load_ms, stop)] if load_ms else []
                for t in load:
                    t.start()
                threads = [_Lane(first if k == 0 or target == "pil" else first.another(), batch, target, stop)
                           for k in range(lanes)]  # pil: no decoder of its own
                for t in threads:
                    t.start()
                time.sleep(0.5 if lanes or load else 0.0)  # the lanes and the load under way
                n0 = sum(t.images for t in threads)
                t0 = time.perf_counter()
                us = launch_times(args.seconds)
                rate = (sum(t.images for t in threads) - n0) / (time.perf_counter() - t0)
                stop.set()
                for t in threads + load:
                    t.join()
                errors = [repr(t.error) for t in threads if t.error is not None]
                keep({**row, "load_ms": load_ms, "lanes": lanes, "launch_us_mean": float(us.mean()),
                      "launch_us_p99": float(np.percentile(us, 99)), "launches": int(us.size),
                      "images_per_s": rate, **({"errors": errors} if errors else {})})
                r = rows[-1]
                print(f"{output}, decoder writes {target:>6}, load {load_ms:g} ms, {lanes} lanes: "
                      f"launch {r['launch_us_mean']:6.1f} us "
                      f"(p99 {r['launch_us_p99']:7.1f}), {rate:8.0f} images/s"
                      f"{', bytes as the device target' if r.get('same_bytes') else ''}"
                      f"{', errors: ' + '; '.join(errors) if errors else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
