"""Write webdataset tar shards (img2dataset layout) from the built-in digits or an image folder.

    python launch/make_shards.py --digits --out data/digits [--image-size 32 --samples-per-shard 256]
    python launch/make_shards.py --image-dir photos/ --out data/photos [--captions captions.tsv]

Thin CLI over :mod:`pipeline.shards`; prints the brace URL(s) to put in the config's ``data``
section (``train_shards``, ``val_shards``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from pipeline.shards import brace_url, folder_samples, write_digits_shards, write_shards


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--digits", action="store_true", help="scikit-learn digits: OUT/train and OUT/test")
    source.add_argument("--image-dir", help="folder of images with captions (sidecar .txt or captions.tsv/jsonl)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--captions", help="--image-dir: caption table (.tsv filename<TAB>caption or .jsonl)")
    parser.add_argument("--image-size", type=int, default=32, help="--digits: image side in pixels")
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--image-format", default="jpg", choices=["jpg", "png", "webp"],
                        help="--digits: encoding (folder images are copied as they are)")
    parser.add_argument("--prefix", default="shard", help="shard file name prefix")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.digits:
        result = write_digits_shards(args.out, image_size=args.image_size, samples_per_shard=args.samples_per_shard,
                                     image_format=args.image_format)
        result = {"train": result["train"], "test": result["test"]}
    else:
        paths = write_shards(folder_samples(args.image_dir, captions=args.captions), args.out, prefix=args.prefix,
                             samples_per_shard=args.samples_per_shard)
        result = {"train": brace_url(paths)}
    for split, url in result.items():
        sys.stdout.write(f"{split}: {url}\n")
    return result


if __name__ == "__main__":
    main()
