"""Write webdataset tar shards (img2dataset layout) from the built-in digits, the rendered scenes or an image folder,
or copy existing shards with their images resized.

    python launch/make_shards.py --digits --out data/digits [--image-size 32 --samples-per-shard 256]
    python launch/make_shards.py --image-dir photos/ --out data/photos [--captions captions.tsv] [--resize 256]
    python launch/make_shards.py --shards 'data/laion/{00000..00099}.tar' --resize 256 --out data/laion256
        (the same shard names and samples, each image a baseline JPEG whose shorter side is at most 256)
    python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000
        (what ds_configs/scenes_vitb32.json reads; --scenes counts training pairs, the eval splits come on top)

Thin CLI over :mod:`pipeline.data.shards`; prints the brace URL(s) to put in the config's ``data``
section (``train_shards``, ``val_shards``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional

from infclip.pipeline.data.scenes import write_scenes
from infclip.pipeline.data.shard_urls import check_shards_exist, expand_urls, local_path
from infclip.pipeline.data.shards import (brace_url, folder_samples, resize_shards, shards_written, write_digits_shards,
                                          write_shards)


def _resize_shards(args: argparse.Namespace) -> str:
    """--shards: the shards copied with their images resized; the URL that names the copies."""
    if args.resize is None:
        raise ValueError("--shards copies shards with their images resized: give the side with --resize (256 is what "
                         "the GPU decode path feeds fastest)")
    if args.resume and args.overwrite:
        raise ValueError("--resume keeps the shards already copied, --overwrite replaces them: give one of the two")
    urls = expand_urls(args.shards)
    sources = [local_path(url) for url in urls]
    remote = [url for url, path in zip(urls, sources) if path is None]
    if remote:
        raise ValueError(f"--shards reads local files only, got {remote[0]}")
    check_shards_exist(urls)

    def progress(done: int, total: int, counts: dict) -> None:
        logging.info("%d/%d %s: %d samples, %d images resized, %d already small enough%s", done, total,
                     counts["shard"], counts["samples"], counts["resized"], counts["kept"],
                     f", {counts['unreadable']} that cannot be decoded kept as they were "
                     f"({'; '.join(counts['unreadable_names'])})" if counts["unreadable"] else "")

    results = resize_shards(sources, args.out, args.resize, workers=args.workers, overwrite=args.overwrite,
                            resume=args.resume, progress=progress)
    total = {key: sum(r[key] for r in results) for key in ("samples", "resized", "kept", "no_image", "unreadable")}
    logging.info("%d shards written: %d samples, %d images resized, %d kept as they were, %d without an image, %d that "
                 "cannot be decoded", len(results), total["samples"], total["resized"], total["kept"],
                 total["no_image"], total["unreadable"])
    paths = [os.path.join(args.out, os.path.basename(src)) for src in sources]
    url = os.path.join(args.out, os.path.basename(args.shards))  # braces in the file name: the same pattern there
    return url if expand_urls(url) == paths else json.dumps(paths)  # else the list, as train_shards takes it


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--digits", action="store_true", help="scikit-learn digits: OUT/train and OUT/test")
    source.add_argument("--image-dir", help="folder of images with captions (sidecar .txt or captions.tsv/jsonl)")
    source.add_argument("--shards", metavar="URL", help="existing shards (a brace URL of local tars) copied to --out "
                        "under the same names with every image resized (needs --resize)")
    source.add_argument("--scenes", type=int, metavar="N", help="rendered shape scenes, N training pairs: "
                        "OUT/train, OUT/zeroshot_{shape,colour,count}[_seen], OUT/retrieval (docs/scenes.md)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--captions", help="--image-dir: caption table (.tsv filename<TAB>caption or .jsonl)")
    parser.add_argument("--image-size", type=int, default=32, help="--digits: image side in pixels")
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--resize", type=int, metavar="SIDE", default=None,
                        help="--image-dir, --shards: every image as a baseline JPEG whose shorter side is at most "
                             "SIDE pixels (img2dataset's keep_ratio; larger ones scaled down, EXIF orientation "
                             "applied, baseline RGB JPEGs no larger copied as they are): 256 is what the GPU decode path "
                             "feeds fastest (docs/data.md)")
    parser.add_argument("--image-format", default="jpg", choices=["jpg", "png", "webp"],
                        help="--digits: encoding (folder images are copied as they are)")
    parser.add_argument("--prefix", default="shard", help="shard file name prefix")
    parser.add_argument("--overwrite", action="store_true",
                        help="--image-dir: replace the shards of --prefix an earlier call wrote to --out (the old "
                             "ones the new set does not rewrite are removed once it is written); --shards: replace "
                             "the shards of the same names in --out")
    parser.add_argument("--resume", action="store_true",
                        help="--shards: keep the shards already in --out (each was written whole) and write the "
                             "missing ones: a copy that was stopped goes on")
    parser.add_argument("--debug", action="store_true", help="show the traceback of input errors too")
    scenes = parser.add_argument_group("--scenes")
    scenes.add_argument("--scene-size", type=int, default=256, help="image side in pixels")
    scenes.add_argument("--eval-samples", type=int, default=2000, help="pairs per zero-shot split (6 splits)")
    scenes.add_argument("--retrieval-samples", type=int, default=5000, help="retrieval pairs (groups of 5)")
    scenes.add_argument("--seed", type=int, default=0, help="same seed -> byte-identical shards")
    parser.add_argument("--workers", type=int, default=None,
                        help="--scenes, --shards, and --image-dir with --resize: processes (default: all usable "
                             "cores)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.scenes is not None:
        made = write_scenes(args.out, args.scenes, args.eval_samples, args.retrieval_samples, seed=args.seed,
                            image_size=args.scene_size, samples_per_shard=args.samples_per_shard,
                            workers=args.workers, prefix=args.prefix)
        total = sum(info["samples"] for info in made["splits"].values())
        logging.info("scenes: %d pairs in %.1f s wall, %.1f CPU s in the workers: %.0f images/s per core",
                     total, made["wall_s"], made["cpu_s"], total / max(made["cpu_s"], 1e-9))
        result = {split: info["url"] for split, info in made["splits"].items()}
    elif args.shards is not None:
        result = {"shards": _resize_shards(args)}
    elif args.digits:
        result = write_digits_shards(args.out, image_size=args.image_size, samples_per_shard=args.samples_per_shard,
                                     image_format=args.image_format)
        result = {"train": result["train"], "test": result["test"]}
    else:
        old = shards_written(args.out, args.prefix)
        if old and not args.overwrite:
            raise ValueError(f"{args.out} already holds {len(old)} shard(s) named {args.prefix}-NNNNNN.tar (first: "
                             f"{old[0]}): write to another --out or --prefix, or pass --overwrite to replace them")
        samples = folder_samples(args.image_dir, captions=args.captions, resize=args.resize, workers=args.workers)
        paths = write_shards(samples, args.out, prefix=args.prefix,
                             samples_per_shard=args.samples_per_shard)
        for stale in set(old) - set(paths):  # a smaller set: no old shard left for a glob to pick up
            os.remove(stale)
        result = {"train": brace_url(paths)}
    for split, url in result.items():
        sys.stdout.write(f"{split}: {url}\n")
    return result


if __name__ == "__main__":
    from infclip.pipeline.errors import exit_on_user_error

    # bad input (missing folder, uncaptioned or unreadable images, bad caption table) is one line
    with exit_on_user_error("make_shards.py", "--debug" in sys.argv[1:], errors=(ValueError, OSError)):
        main()
