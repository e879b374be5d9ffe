"""The data side alone: how many training images per second the shard loader delivers.

Design: writes real img2dataset-layout JPEG shards on local disk (``--size`` px pictures with
smooth colour fields and shapes, baseline JPEG of quality 90, with ``--mixed`` every fifth
progressive and every tenth greyscale), trains the project's BPE
tokenizer on their captions, then times ``pipeline.data.build.build_train_loader`` at several worker
counts, for each ``--decode``: ``cpu`` (decode + random resized crop to 224 + tokenise in the
DataLoader workers, uint8 to the GPU and normalised there) or ``gpu`` (the workers read, parse
headers and tokenise; nvJPEG decode, crop and normalisation on the GPU: ``pipeline.data.gpu_decode``).
Each row gives images/s in all and per worker, so the number of cores a GPU needs follows:
(samples/s of the training step) / (images/s per worker). One JSONL row per (decode, worker
count) in bench/results/data.jsonl.

Limit: the page cache holds the shards after the first pass (a cold network file system is
slower); the rows measure decode and transform, which is what the cores spend.

Run: ``python bench/bench_data.py --workers 1 4 8 14 --decode cpu gpu [--size 512]`` (``gpu``
needs a CUDA device and torchvision).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

WORDS = ("red green blue small large circle square triangle left right above below two three a the of "
         "photo picture drawing bright dark striped dotted").split()


def picture(rng: np.random.Generator, size: int) -> Image.Image:
    """A smooth colour field (bilinear upsampling of a 4 x 4 grid) with a few filled shapes."""
    grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    img = Image.fromarray(grid, "RGB").resize((size, size), Image.BILINEAR)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = (int(v) for v in rng.integers(0, size - 40, 2))
        w, h = (int(v) for v in rng.integers(20, 120, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x0 + w, y0 + h), fill=colour)
    return img


def jpeg_bytes(img: Image.Image, index: int, mixed: bool = False) -> bytes:
    """``img`` as a baseline colour JPEG of quality 90; ``mixed``: as web images come, every fifth
    progressive and every tenth (offset 3) greyscale."""
    buf = io.BytesIO()
    if mixed and index % 10 == 3:
        img = img.convert("L")
    img.save(buf, format="JPEG", quality=90, progressive=mixed and index % 5 == 0)
    return buf.getvalue()


def jpeg_batch(n: int, size: int) -> tuple:
    """``n`` web-like ``size``-px JPEGs as a decoder takes them: (their bytes end to end in pinned
    memory, offsets [n + 1], sizes [n, 2])."""
    from infclip.pipeline.data.gpu_decode import pack_jpegs

    rng = np.random.default_rng(0)
    data, offsets = pack_jpegs([jpeg_bytes(picture(rng, size), i) for i in range(n)])
    return data.pin_memory(), offsets, torch.tensor([[size, size]] * n)


def write_jpeg_shards(out_dir: str, shards: int, per_shard: int, size: int = 256, first_shard: int = 0,
                      seed: int = 0, mixed: bool = False) -> str:
    """``shards`` tar files of ``per_shard`` JPEG + caption pairs under ``out_dir`` (named from
    ``first_shard`` on, so several processes can fill one folder; ``mixed``: see
    :func:`jpeg_bytes`); returns the brace URL."""
    from infclip.pipeline.data.shards import brace_url, write_shards

    rng = np.random.default_rng(seed)

    def samples():
        for i in range(shards * per_shard):
            caption = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 12))))
            yield jpeg_bytes(picture(rng, size), i, mixed), caption, None

    paths = write_shards(samples(), out_dir, prefix=f"web{first_shard:05d}", samples_per_shard=per_shard,
                         image_format="jpg")
    return brace_url(paths)


def measure(url: str, tokenizer, workers: int, batch: int, batches: int, decode: str = "cpu") -> dict:
    from infclip.pipeline.data.build import build_train_loader
    from infclip.pipeline.data.config import DataConfig
    from infclip.pipeline.data.loader import measure_loader_throughput

    cfg = DataConfig(train_shards=url, resampled=True, samples_per_epoch=10**9, workers=workers,
                     shuffle_buffer=1000, prefetch_factor=4, decode=decode)
    # as in training: uint8 crops (or, decoding on the GPU, JPEG files) from the workers, made
    # ready on the GPU (on the CPU without one, where that work in this process can become the limit)
    device = torch.device("cuda") if torch.cuda.is_available() else None
    loader = build_train_loader(cfg, tokenizer, image_size=224, context_length=77, batch_size=batch, device=device,
                                dtype=torch.bfloat16 if device is not None else torch.float32)
    rate = measure_loader_throughput(loader, batches, warmup=2 * max(1, workers))
    return {"workers": workers, "decode": decode, "images_per_s": rate,
            "images_per_s_per_worker": rate / max(workers, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 14])
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--per_shard", type=int, default=512)
    p.add_argument("--size", type=int, default=256, help="side of the pictures in the shards")
    p.add_argument("--mixed", action="store_true", help="a fifth of the JPEGs progressive, a tenth greyscale")
    p.add_argument("--decode", nargs="+", default=["cpu"], choices=["cpu", "gpu"],
                   help="where JPEGs are decoded (gpu: nvJPEG on the training GPU, data.decode)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=20, help="timed batches per worker count (after warm-up)")
    p.add_argument("--dir", default=None, help="where to write the shards (default: a temporary folder)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "data.jsonl"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from infclip.pipeline.data.tokenizer import iter_shard_captions, train_bpe_tokenizer

    work = args.dir or tempfile.mkdtemp(prefix="bench_data_")
    t0 = time.perf_counter()
    url = write_jpeg_shards(os.path.join(work, f"shards{args.size}{'mixed' if args.mixed else ''}"), args.shards,
                            args.per_shard, size=args.size, mixed=args.mixed)
    made = args.shards * args.per_shard / (time.perf_counter() - t0)
    from infclip.pipeline.data.shard_urls import expand_urls

    sizes = [os.path.getsize(u) for u in expand_urls(url)]
    tokenizer = train_bpe_tokenizer(iter_shard_captions(expand_urls(url)), os.path.join(work, "tok"), vocab_size=512)
    base = {"bench": "data", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(), "image_px": args.size, "mixed": args.mixed, "crop_px": 224, "batch": args.batch,
            "kb_per_sample": sum(sizes) / 1024 / (args.shards * args.per_shard)}
    print(f"# wrote {args.shards} x {args.per_shard} samples ({base['kb_per_sample']:.1f} KB each, "
          f"{made:.0f} samples/s one core) to {work}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    for decode in args.decode:
        for w in args.workers:
            row = {**base, **measure(url, tokenizer, w, args.batch, args.batches, decode)}
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{decode} decode, workers {w:>3}: {row['images_per_s']:9.0f} images/s, "
                  f"{row['images_per_s_per_worker']:7.0f} per worker", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
