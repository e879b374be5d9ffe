"""The loader workers' side of GPU decoding: which JPEGs nvJPEG takes, their crop boxes in the full
image's pixels, and a batch's images packed for the decode stage (:mod:`pipeline.data.gpu_decode`).

A worker reads only a JPEG's header (size, mode, subsampling, progressive) and draws the crop box
the CPU path would draw; the image itself is decoded in the training process.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
from PIL import Image

__all__ = ["batch_pixels", "gpu_decodable", "scaled_box"]


def gpu_decodable(img: Image.Image, mode: str) -> bool:
    """Whether the GPU path sends this image to nvJPEG: baseline colour JPEGs of the usual chroma
    subsamplings (4:4:4, 4:2:2, 4:2:0), which its batched decoder takes (on Hopper, the hardware
    engines: ~26k 256-px images/s on an H200). Progressive and greyscale JPEGs go through nvJPEG's
    hybrid decoder, one image at a time on one host thread, no faster than PIL (~0.25 ms for
    256 px, 0.6 ms for 512 px): the loader workers decode those, in parallel, and CMYK, PNG and
    WebP, as on the CPU path."""
    if img.format != "JPEG" or mode != "RGB" or img.info.get("progressive"):
        return False
    from PIL import JpegImagePlugin

    return JpegImagePlugin.get_sampling(img) in (0, 1, 2)


def scaled_box(box: Sequence[int], ratio: float, size: Sequence[int]) -> tuple:
    """``box`` (x, y, w, h) drawn on a JPEG at one DCT scale (1, 2, 4 or 8) in its pixels at another:
    ``ratio`` is the first scale over the second, ``size`` the image's (W, H) at the second. Each
    edge goes to the nearest pixel there (exact when the ratio is whole: the GPU path's full-image
    box), inside the image and at least a pixel wide."""
    x, y, w, h = box
    left, top = min(round(x * ratio), size[0] - 1), min(round(y * ratio), size[1] - 1)
    right, bottom = min(round((x + w) * ratio), size[0]), min(round((y + h) * ratio), size[1])
    return left, top, max(1, right - left), max(1, bottom - top)


def _stacked(tensors: List[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``; in a loader worker process, written straight into shared memory,
    where the queue to the training process would otherwise copy it (68 against 50 ms for 256
    uint8 224-px crops on one core of a 2-core CPU machine)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.stack(tensors)
    out = torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype).share_memory_()
    return torch.stack(tensors, out=out)


def batch_pixels(items: List[Dict[str, Any]], size: int) -> Dict[str, Any]:
    """A batch's images: ``pixel_values`` stacked; or, where some are JPEGs left for the GPU
    (a tuple (x, y, w, h, W, H) instead of pixels: the box and the image's size), those packed
    (``pipeline.data.gpu_decode.JPEG_KEYS``: for nvJPEG; ``DCT_KEYS``: those taken apart for the
    DCT-domain decoder, an item's ``scan``) and the rest as uint8 rows of ``pixel_values`` at
    ``cpu_dest``."""
    gpu = [i for i, it in enumerate(items) if it["jpeg"] is not None]
    if not gpu:
        return {"pixel_values": _stacked([it["pixels"] for it in items])}
    from .gpu_decode import pack_jpegs

    jpeg = [i for i in gpu if items[i].get("scan") is None]
    dct = [i for i in gpu if items[i].get("scan") is not None]
    rest = [i for i, it in enumerate(items) if it["jpeg"] is None]
    data, offsets = pack_jpegs([items[i]["jpeg"] for i in jpeg])
    pixels = _stacked([items[i]["pixels"] for i in rest]) if rest else \
        torch.zeros(0, 3, size, size, dtype=torch.uint8)
    out = {"pixel_values": pixels, "cpu_dest": torch.tensor(rest, dtype=torch.long),
           "jpeg_bytes": data, "jpeg_offsets": offsets,
           "jpeg_boxes": torch.tensor([items[i]["pixels"][:4] for i in jpeg], dtype=torch.long).view(-1, 4),
           "jpeg_sizes": torch.tensor([items[i]["pixels"][4:] for i in jpeg], dtype=torch.long).view(-1, 2),
           "jpeg_dest": torch.tensor(jpeg, dtype=torch.long),
           "jpeg_names": [f"{items[i]['url']}:{items[i]['key']}" for i in jpeg]}
    if dct:
        out.update(_dct_part([items[i] for i in dct], dct))
    return out


def _dct_part(items: List[Dict[str, Any]], rows: List[int]) -> Dict[str, Any]:
    """``DCT_KEYS`` of the items whose ``scan`` is (the JPEG taken apart, its DCT scale): the packed
    :class:`~pipeline.data.dct_decode.DctBatch` (as a dict), each crop box in the pixels of its scale,
    and the rows."""
    from .dct_decode import pack_scans, scaled_size

    scans = [it["scan"][0] for it in items]
    ks = [8 // it["scan"][1] for it in items]
    boxes = [scaled_box(it["pixels"][:4], k / 8, scaled_size(*it["pixels"][4:], k)) for it, k in zip(items, ks)]
    return {"dct": pack_scans(scans, ks).as_dict(), "dct_boxes": torch.tensor(boxes, dtype=torch.long),
            "dct_dest": torch.tensor(rows, dtype=torch.long)}
