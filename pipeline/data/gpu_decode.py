"""The GPU decode stage of the training loader: JPEG bytes in, normalised crops on the device out.

Design: with ``data.decode`` "gpu" (``"auto"`` on CUDA) the loader workers only read tar members,
parse each JPEG's header (size, mode) to draw its crop box, and tokenise; a batch leaves them
as the JPEG files laid end to end in one uint8 tensor (a tenth of the bytes of the decoded
crops, through shared memory). In the training process background threads take each batch as
the DataLoader hands it over (batch ``i`` to lane ``i % lanes``, each lane its own thread, decoder
state and stream, :func:`prefetched`) and, on the lane's CUDA side stream, decode its JPEGs with
nvJPEG (:mod:`pipeline.data.nvjpeg`, or ``torchvision.io.decode_jpeg``; one batched call), resize every box with
one kernel (:func:`pipeline.data.image_ops.resized_crop_normalize`) and copies the tokens; the step
waits on the batch's event, not on the host, so decode overlaps the previous step. A thread,
because ``decode_jpeg`` returns only when its batch is decoded: in the training thread that wait
is the step's (measured: 78% of the synthetic step against 88% from the thread, ViT-B/32 at
micro-batch 256); the thread holds the interpreter lock only for a few tensor calls a batch. Members that
are not baseline-decodable JPEGs for nvJPEG (PNG, WebP, CMYK) are decoded and cropped in the
workers as on the CPU path and ride along as uint8 rows.

With ``data.gpu_decode_scaled`` the JPEGs whose crop box fits half their size or less arrive taken
apart by the workers instead (:mod:`pipeline.data.jpeg_scan`) and are decoded at that scale by the
DCT-domain kernels (:mod:`pipeline.data.dct_decode`) on the same lane stream, before nvJPEG's share.

A JPEG that nvJPEG rejects (the batch call raises) is retried alone; one that still fails is
decoded by PIL here; one that PIL cannot decode either is counted as ``bad_image`` (the workers
only read headers, so a broken body is found here) and its row takes the batch's first good
sample, so the batch keeps its size and every rank its share of the global batch.

Stream safety: torchvision's decoder allocates its outputs on the caller's current stream and
writes them on a stream of its own; the stage makes the side stream current and waits for the
side stream's previous batch before each decode, so no block the decoder is handed is still
read by queued work. Every host-to-device copy goes through pinned memory
(:func:`pipeline.data.image_ops.upload`): a copy from pageable memory would wait for the decode
queued before it. The batch's tensors are consumed on the training stream, which waits on
the batch's event and marks them used there (``record_stream``).

The same stage runs on the CPU with a PIL decoder (``decode_fn``): what the tests exercise
without a GPU (packing, boxes, fallbacks, order, the kernel under Triton's interpreter).
"""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from .cores import enter_cores
from .dct_decode import DctBatch, decode_scans
from .image_ops import normalize_pixels, resized_crop_normalize, resized_crop_normalize_flat, upload
from .nvjpeg import NvJpegError, load_decoder, plane_buffer

__all__ = ["DecodeStage", "cuda_decode_available", "pack_jpegs", "pil_decode", "prefetched", "small_first",
           "wait_for_batch"]

logger = logging.getLogger(__name__)

LARGE_AFTER_BATCHES = 8
"""Batches the stage sees before it judges the size of the JPEGs it is given (:meth:`DecodeStage._note_sizes`)."""
LARGE_RATIO = 3.0
"""JPEGs averaging more than this many times the model's input pixels get a warning: the decode pays for
pixels the crop throws away (on one H100 the vitb32 preset streams 512-px JPEGs at 91% of its step, 256-px
ones at 98%)."""

JPEG_KEYS = ("jpeg_bytes", "jpeg_offsets", "jpeg_boxes", "jpeg_sizes", "jpeg_dest", "jpeg_names", "cpu_dest")
"""A worker's GPU-decode batch: the JPEG files for nvJPEG end to end (uint8), offsets [n + 1], boxes
[n, 4] (x, y, w, h in the decoded image's pixels), the images' (W, H) [n, 2] from their headers,
their rows in the batch, their names (``url:key``), and the rows of ``pixel_values`` (uint8 crops
decoded in the worker) in the batch."""
DCT_KEYS = ("dct", "dct_boxes", "dct_dest")
"""Where some JPEGs are decoded in the DCT domain (:mod:`pipeline.data.dct_decode`), also: their
packed :class:`~pipeline.data.dct_decode.DctBatch` (as a dict), their crop boxes in the pixels of the
scale each is decoded at, and their rows."""


def cuda_decode_available() -> Optional[str]:
    """None when nvJPEG decoding through torchvision works here, else why not (one phrase)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # ImportError, or torchvision built for another torch (RuntimeError)
        return f"torchvision cannot be imported ({type(exc).__name__}: {str(exc)[:120]}); install the 'gpu' extra"
    return None


def pack_jpegs(files: Sequence[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """JPEG files -> (uint8 [total] end to end, int64 offsets [n + 1])."""
    lengths = np.fromiter((len(f) for f in files), dtype=np.int64, count=len(files))
    offsets = np.zeros(len(files) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(files), dtype=np.uint8) if files else np.zeros(0, dtype=np.uint8)
    return torch.from_numpy(data.copy()), torch.from_numpy(offsets)


def pil_decode(data: torch.Tensor) -> torch.Tensor:
    """One encoded image (uint8 [n] on the CPU) -> uint8 [3, H, W] RGB on the CPU, decoded by PIL."""
    with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def _nvjpeg_decode(files: List[torch.Tensor], device: torch.device) -> List[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(files, mode=ImageReadMode.RGB, device=device)


class _Elapsed:
    """GPU milliseconds between two recorded events, read (``float``) only when asked: at log steps,
    long after the work ended, so reading them never waits."""

    def __init__(self, start: Any, end: Any) -> None:
        self.start, self.end = start, end

    def __float__(self) -> float:
        if self.start is None:
            return 0.0
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end))


def wait_for_batch(ready: Any, stream: torch.cuda.Stream) -> _Elapsed:
    """Make ``stream`` wait for a decoded batch's ``ready`` event; the GPU time it then stands still
    (the step's loss to the decode: the batch is not decoded when the step reaches it; read with
    ``float`` later). Two timing events around the wait: the first completes when the stream's
    earlier work has run, the second when the batch is ready too."""
    before, after = (torch.cuda.Event(enable_timing=True, blocking=True) for _ in range(2))
    before.record(stream)
    stream.wait_event(ready)
    after.record(stream)
    return _Elapsed(before, after)


class _Lane:
    """Where one batch at a time is decoded: a direct decoder (or None), the direct decoder whose
    decoding runs on the host (or None), the one on the JPEG engines (or None) with a stream of
    its own, a stream of ``priority`` (None on the CPU), and the event after its previous batch."""

    def __init__(self, device: Optional[torch.device], nvjpeg: Any, priority: str = "high", host: Any = None,
                 engines: Any = None) -> None:
        self.nvjpeg, self.host, self.engines = nvjpeg, host, engines
        # high priority (the default): the crop's blocks go ahead of the step's queued ones, so a batch is
        # ready sooner and the lane's next decode, which waits for it, starts sooner (the GPU time is the
        # same); normal: the step's own priority
        level = -1 if priority == "high" else 0
        self.stream = torch.cuda.Stream(device, priority=level) if device is not None else None
        # the engines' share runs beside the GPU backend's kernels, not behind them on the lane's stream
        self.engine_stream = torch.cuda.Stream(device, priority=level) if engines is not None else None
        self.last: Any = None


class DecodeStage:
    """Turns a worker's GPU-decode batch into a training batch on ``device`` (see module docstring).

    Args:
        device: where the batches land; CUDA uses nvJPEG on a side stream, the CPU ``decode_fn``.
        dtype: the pixels' dtype (the model's input dtype).
        mean, std: per-channel normalisation of levels / 255.
        decode_fn: ``(list of uint8 [n] CPU tensors, device) -> list of uint8 [3, H, W]`` on the
            device; default torchvision's nvJPEG on CUDA, PIL elsewhere. The per-file path: the
            batch's when there is no direct decoder, and every file's when the batched call fails.
        decoder: on CUDA, ``"nvjpeg"`` (the library directly with its GPU backend,
            :mod:`pipeline.data.nvjpeg`; an error if it cannot be loaded), ``"nvjpeg_hardware"``
            (the same on the JPEG engines), ``"torchvision"`` (``decode_fn`` only) or ``"auto"``
            (nvjpeg when it loads).
        lanes: batches decoded at once, each in a lane (decoder state, stream, thread).
        priority: the lanes' stream priority, ``"high"`` or ``"normal"`` (``data.gpu_decode_priority``).
        host_max_pixels: with the direct decoder, JPEGs of at most this many pixels have their
            decoding run in the lane's thread on the host (nvJPEG's hybrid backend), larger
            ones theirs on the GPU; 0: none (``data.gpu_decode_host_max_pixels``).
        host_interleaved: the host-decoded JPEGs written as one plane of interleaved pixels each
            instead of three planes (``data.gpu_decode_host_interleaved``).
        host_copy: ``"plane"`` (the hybrid decoder copies each plane to the GPU buffer itself) or
            ``"batch"`` (it writes a pinned host buffer, moved by one copy a batch;
            ``data.gpu_decode_host_copy``).
        host_share: at most this share of a batch's JPEGs is decoded on the host (the first of
            those within ``host_max_pixels``, in batch order); the rest on the GPU
            (``data.gpu_decode_host_share``).
        engine_share: with the direct decoder's GPU backend, this share of the JPEGs the GPU
            decodes goes to the GPU's JPEG engines instead, decoded on a second stream at the same
            time as the rest (``data.gpu_decode_engine_share``); ignored, with a log line, on a
            GPU without engines.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, mean: Sequence[float], std: Sequence[float],
                 decode_fn: Optional[Callable[[List[torch.Tensor], torch.device], List[torch.Tensor]]] = None,
                 decoder: str = "auto", lanes: int = 1, priority: str = "high", host_max_pixels: int = 0,
                 host_interleaved: bool = False, host_copy: str = "plane", host_share: float = 1.0,
                 engine_share: float = 0.0) -> None:
        self.device, self.dtype = torch.device(device), dtype
        self.mean, self.std = list(mean), list(std)
        cuda = self.device.type == "cuda"
        self.decode_fn = decode_fn or (_nvjpeg_decode if cuda else
                                       (lambda files, dev: [pil_decode(f).to(dev) for f in files]))
        if not 0.0 <= engine_share < 1.0:
            raise ValueError(f"engine_share must be in [0, 1), got {engine_share}")
        nvjpeg = host = engines = None
        if cuda and decoder != "torchvision":
            with torch.cuda.device(self.device):
                nvjpeg, why = load_decoder("hardware" if decoder == "nvjpeg_hardware" else "gpu")
                if nvjpeg is not None and host_max_pixels > 0:
                    host, why = load_decoder("hybrid", "rgbi" if host_interleaved else "rgb")
                    if host is None:
                        raise RuntimeError(f"data.gpu_decode_host_max_pixels: nvJPEG's hybrid backend cannot be "
                                           f"used ({why})")
                if nvjpeg is not None and engine_share > 0 and not nvjpeg.hardware:
                    engines, why = load_decoder("hardware")
                    if engines is not None and not engines.hardware:
                        engines, why = None, "this GPU has no JPEG engines"
                    if engines is None:
                        logger.info("data.gpu_decode_engine_share %s ignored: %s", engine_share, why)
            if nvjpeg is None:
                if decoder != "auto":
                    raise RuntimeError(f"data.gpu_decoder {decoder!r}: the library cannot be used ({why})")
                logger.info("nvJPEG cannot be called directly (%s): decoding through torchvision", why)
        # torchvision's decoder (and the CPU) decode one batch at a time: one lane
        self.lanes = max(1, int(lanes)) if nvjpeg is not None else 1
        self.host_max_pixels = int(host_max_pixels) if host is not None else 0
        if host_copy not in ("plane", "batch"):
            raise ValueError(f"host_copy must be 'plane' or 'batch', got {host_copy!r}")
        self.host_copy = host_copy
        if not 0.0 < host_share <= 1.0:
            raise ValueError(f"host_share must be in (0, 1], got {host_share}")
        self.host_share = float(host_share)
        self.engine_share = float(engine_share) if engines is not None else 0.0

        def own(decoder: Any, k: int) -> Any:  # lane k's own handle and state
            return decoder if k == 0 or decoder is None else decoder.another()

        self._lanes = [_Lane(self.device, own(nvjpeg, k), priority, own(host, k), own(engines, k)) if cuda
                       else _Lane(None, None) for k in range(self.lanes)]
        self.nvjpeg = nvjpeg
        self._lock = threading.Lock()
        self.fallbacks = {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}
        """JPEGs decoded by PIL after the GPU decoder rejected them, those nobody could decode, and
        batches the direct decoder's batched call failed on (decoded file by file instead)."""
        self.host_s = {"waiting": 0.0, "queueing": 0.0, "in_nvjpeg": 0.0, "batches": 0}
        """The decode threads' wall time, summed over lanes: waiting for the lane's previous batch's
        GPU work, queueing this one's (the host side of a batch: the decode call, the crop's
        launches, the copies), the part of that spent inside the direct nvJPEG call, and the batch count."""
        self._seen: Optional[List[int]] = [0, 0, 0]  # batches, JPEGs, pixels; None once judged

    @property
    def stream(self) -> Optional[torch.cuda.Stream]:
        """The first lane's stream (None on the CPU)."""
        return self._lanes[0].stream

    def _count(self, what: str) -> int:
        with self._lock:
            self.fallbacks[what] += 1
            return self.fallbacks[what]

    def __call__(self, batch: Dict[str, Any], lane: int = 0) -> Dict[str, Any]:
        """The batch with ``pixel_values`` [B, 3, S, S] in ``dtype`` on the device, tokens moved
        there, ``decode_ms`` (GPU time of decode + crop) and, when it waits on the device,
        ``ready`` (the event the consumer's stream must wait on). ``lane``: which of the stage's
        lanes decodes it (one thread a lane at a time)."""
        run = self._lanes[lane]
        if run.stream is None:
            return self._finish(batch, run)
        t0 = time.perf_counter()
        if run.last is not None:
            run.last.synchronize()
        t1 = time.perf_counter()
        with torch.cuda.stream(run.stream):
            # blocking: the thread sleeps in its waits instead of spinning on a core the step may need
            start, end = (torch.cuda.Event(enable_timing=True, blocking=True) for _ in range(2))
            start.record()
            out = self._finish(batch, run)
            end.record()
        out["decode_ms"] = _Elapsed(start, end)
        out["ready"] = run.last = end
        with self._lock:
            self.host_s["waiting"] += t1 - t0
            self.host_s["queueing"] += time.perf_counter() - t1
            self.host_s["batches"] += 1
        return out

    def _finish(self, batch: Dict[str, Any], run: "_Lane") -> Dict[str, Any]:
        if "jpeg_bytes" not in batch:  # every image of the batch was decoded in a worker
            batch["pixel_values"] = normalize_pixels(upload(batch["pixel_values"], self.device), self.mean, self.std,
                                                     self.dtype)
            for key in ("input_ids", "attention_mask"):
                batch[key] = upload(batch[key], self.device)
            return batch
        data, offsets = batch.pop("jpeg_bytes"), batch.pop("jpeg_offsets")
        boxes, sizes, dest = batch.pop("jpeg_boxes"), batch.pop("jpeg_sizes"), batch.pop("jpeg_dest")
        names, cpu_dest = batch.pop("jpeg_names"), batch.pop("cpu_dest")
        dct, dct_boxes, dct_dest = batch.pop("dct", None), batch.pop("dct_boxes", None), batch.pop("dct_dest", None)
        cpu_pixels = batch.pop("pixel_values")
        size = cpu_pixels.shape[-1]
        rows = len(dest) + cpu_pixels.shape[0] + (len(dct_dest) if dct is not None else 0)
        out = torch.empty(rows, 3, size, size, dtype=self.dtype, device=self.device)
        if dct is not None:  # queued first: the DCT-domain kernels need no host work once queued
            scans = DctBatch.from_dict(dct)
            flat = decode_scans(scans, self.device)
            resized_crop_normalize_flat(flat, scans.starts, scans.sizes, dct_boxes, out, dct_dest, self.mean, self.std)
        bad: List[int] = []
        if len(dest):
            self._note_sizes(sizes, size)
        if len(dest) and not self._decode_batched(run, data, offsets, sizes, boxes, out, dest):
            files = list(torch.split(data, (offsets[1:] - offsets[:-1]).tolist()))
            images = self._decode(files, names)
            failed = [i for i, im in enumerate(images) if im is None]
            bad = dest[failed].tolist()  # their rows in the batch
            if failed:
                keep = torch.tensor([i for i, im in enumerate(images) if im is not None], dtype=torch.long)
                images, boxes, sizes, dest = [images[i] for i in keep.tolist()], boxes[keep], sizes[keep], dest[keep]
            resized_crop_normalize(images, boxes, out, dest, self.mean, self.std, sizes)
        if cpu_pixels.shape[0]:
            out[upload(cpu_dest, self.device)] = normalize_pixels(upload(cpu_pixels, self.device), self.mean, self.std,
                                                                  self.dtype)
        for key in ("input_ids", "attention_mask"):
            batch[key] = upload(batch[key], self.device)
        if bad:
            self._stand_in(batch, out, bad)
        batch["pixel_values"] = out
        batch["decode_ms"] = _Elapsed(None, None)
        return batch

    def _note_sizes(self, sizes: torch.Tensor, side: int) -> None:
        """Once, after the first batches: a warning when their JPEGs are far larger than the model's
        ``side`` x ``side`` input (``LARGE_RATIO``), with the shards that would feed the step faster."""
        with self._lock:
            if self._seen is None:
                return
            self._seen[0] += 1
            self._seen[1] += len(sizes)
            self._seen[2] += int((sizes[:, 0] * sizes[:, 1]).sum())
            if self._seen[0] < LARGE_AFTER_BATCHES:
                return
            _, count, pixels = self._seen
            self._seen = None
        mean = pixels / max(count, 1)
        if mean > LARGE_RATIO * side * side:
            short = round(side * 8 / 7)
            logger.warning("the training JPEGs average %d pixels, %.1f times the model's %d x %d input: decoding "
                           "them costs the step (vitb32 on one H100: 91%% of its synthetic step from 512-px JPEGs, "
                           "98%% from 256-px ones). Shards stored at a shorter side near %d feed it faster: copy "
                           "these with launch/make_shards.py --shards URL --resize %d --out DIR, or write them with "
                           "img2dataset --image_size %d --resize_mode keep_ratio (docs/data.md)", round(mean),
                           mean / (side * side), side, side, short, short, short)

    def _decode_batched(self, run: "_Lane", data: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor,
                        boxes: torch.Tensor, out: torch.Tensor, dest: torch.Tensor) -> bool:
        """The batch's JPEGs decoded by the lane's direct nvJPEG call into one buffer and cropped into
        ``out``; False (nothing written) when there is no direct decoder or the call fails."""
        if run.nvjpeg is None or not len(dest):
            return False
        m = 0
        if run.host is not None:
            cap = None if self.host_share >= 1.0 else round(self.host_share * len(dest))
            data, offsets, sizes, boxes, dest, m = small_first(data, offsets, sizes, boxes, dest, self.host_max_pixels,
                                                               cap)
        try:
            t0 = time.perf_counter()
            flat, starts = self._nvjpeg_decode(run, data, offsets, sizes, m)
            with self._lock:
                self.host_s["in_nvjpeg"] += time.perf_counter() - t0
        except NvJpegError as exc:
            if self._count("batch_retry") <= 5:
                logger.warning("nvJPEG's batched decode failed (%s); decoding the batch file by file", exc)
            return False
        interleaved = None
        if m and run.host.output == "rgbi":
            interleaved = torch.arange(len(dest)) < m
        resized_crop_normalize_flat(flat, starts, sizes, boxes, out, dest, self.mean, self.std, interleaved)
        return True

    def _nvjpeg_decode(self, run: "_Lane", data: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, m: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(buffer, offsets) of the batch's JPEGs decoded by the lane's direct decoders: all but the
        first ``m`` on the GPU (queued first, so the GPU starts at once): with an engine share the
        first ``engine_share`` of those on the JPEG engines, on the lane's second stream, while the
        GPU backend's kernels decode the rest; then the first ``m`` decoded here, on the host, while
        they run: into the buffer, or with ``host_copy`` "batch" into pinned host memory laid out as
        the buffer's start, then copied there at once (the pinned block is reused only after that
        copy has run: torch records it on the stream)."""
        if not data.is_pinned():  # once for all calls
            data = data.pin_memory()
        flat, starts = plane_buffer(sizes, run.stream)
        n = offsets.numel() - 1
        e = round(self.engine_share * (n - m))  # 0 unless the lanes have an engines decoder
        if e:  # the buffer was allocated on the lane's stream; the engines write it from theirs
            run.engine_stream.wait_stream(run.stream)
        if m + e < n:
            run.nvjpeg.decode(data, offsets[m + e:], sizes[m + e:], run.stream, out=(flat, starts[m + e:]))
        if e:  # returns when the engines have decoded them; their colour conversion may still be queued
            run.engines.decode(data, offsets[m:m + e + 1], sizes[m:m + e], run.engine_stream, out=(flat, starts[m:m + e]))
            run.stream.wait_stream(run.engine_stream)
        if m and self.host_copy == "batch":
            head = int(starts[m]) if m < n else flat.numel()  # the small JPEGs' planes come first
            staging = torch.empty(head, dtype=torch.uint8, pin_memory=True)
            run.host.decode(data, offsets[:m + 1], sizes[:m], run.stream, out=(staging, starts[:m]))
            flat[:head].copy_(staging, non_blocking=True)  # on the lane's stream, after the decoder's writes
        elif m:
            run.host.decode(data, offsets[:m + 1], sizes[:m], run.stream, out=(flat, starts[:m]))
        return flat, starts

    def _decode(self, files: List[torch.Tensor], names: List[str]) -> List[Optional[torch.Tensor]]:
        """Every file decoded on the device, or None where neither the decoder nor PIL can."""
        if not files:
            return []
        try:
            return list(self.decode_fn(files, self.device))
        except Exception:  # one file the batched call rejects fails the call: find it alone
            pass
        images: List[Optional[torch.Tensor]] = []
        for f, name in zip(files, names):
            try:
                images.append(self.decode_fn([f], self.device)[0])
                continue
            except Exception as exc:
                gpu_error = exc
            try:
                images.append(pil_decode(f).to(self.device))
                if self._count("cpu_decode") <= 5:
                    logger.warning("%s: the GPU decoder failed (%s); decoded on the CPU", name,
                                   str(gpu_error).strip()[:160])
            except Exception as exc:
                images.append(None)
                if self._count("bad_image") <= 5:
                    logger.warning("skipping bad_image: %s: %r (its row repeats the batch's first good sample)",
                                   name, exc)
        return images

    @staticmethod
    def _stand_in(batch: Dict[str, Any], out: torch.Tensor, bad: List[int]) -> None:
        """Rows ``bad`` (images nobody could decode) take the batch's first good sample."""
        failed = set(bad)
        good = next((r for r in range(out.shape[0]) if r not in failed), None)
        if good is None:
            raise RuntimeError(f"no image of a batch of {out.shape[0]} could be decoded")
        idx = torch.tensor(bad, device=out.device)
        out[idx] = out[good]
        for key in ("input_ids", "attention_mask"):
            batch[key][idx] = batch[key][good]
        batch["num_skipped"] = batch["num_skipped"] + len(bad)
        skips = dict(batch.get("_skips") or {})
        skips["bad_image"] = skips.get("bad_image", 0) + len(bad)
        batch["_skips"] = skips


def small_first(data: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor,
                dest: torch.Tensor, max_pixels: int, max_count: Optional[int] = None) -> tuple:
    """A GPU-decode batch's JPEGs reordered so that those of at most ``max_pixels`` pixels come
    first (each keeping its size, box and row), and their count: ``(data, offsets, sizes, boxes,
    dest, m)``; with ``max_count``, only the first ``max_count`` such JPEGs in batch order count as
    small. A batch already in that order (all small, or none) is returned as it is."""
    small = sizes[:, 0] * sizes[:, 1] <= max_pixels
    if max_count is not None:
        small &= torch.cumsum(small, 0) <= max_count
    m = int(small.sum())
    if bool(small[:m].all()):
        return data, offsets, sizes, boxes, dest, m
    order = torch.cat([small.nonzero().flatten(), (~small).nonzero().flatten()])
    lengths = offsets[1:] - offsets[:-1]
    files = torch.split(data, lengths.tolist())
    data = torch.cat([files[i] for i in order.tolist()])
    offsets = torch.zeros_like(offsets)
    torch.cumsum(lengths[order], 0, out=offsets[1:])
    return data, offsets, sizes[order], boxes[order], dest[order], m


def prefetched(records: Iterable[Dict[str, Any]], finish: Callable[[Dict[str, Any], int], Dict[str, Any]],
               is_batch: Callable[[Dict[str, Any]], bool], depth: int = 2, lanes: int = 1,
               cpus: Optional[Sequence[int]] = None) -> Iterator[Dict[str, Any]]:
    """``records`` with ``finish(record, lane)`` applied to the batches among them, in order. A
    feeding thread reads ``records`` and hands batch ``i`` to lane ``i % lanes``, each lane a
    thread of its own, so ``lanes`` batches are finished at once, up to ``depth`` ahead of the
    consumer. The threads run on ``cpus`` when given. An error in a thread is raised here; closing
    the generator (or leaving it early) stops the threads."""
    lanes = max(1, int(lanes))
    q: "queue.Queue" = queue.Queue(maxsize=depth + lanes - 1)
    stop = threading.Event()
    pools = [ThreadPoolExecutor(1, thread_name_prefix=f"infclip-decode-{k}", initializer=enter_cores,
                                initargs=(cpus,)) for k in range(lanes)]
    _END = object()

    def ready(value: Any = None, error: Optional[BaseException] = None) -> Future:
        done: Future = Future()
        done.set_exception(error) if error is not None else done.set_result(value)
        return done

    def put(item: Future) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def feed() -> None:
        enter_cores(cpus)
        n = 0
        try:
            for record in records:
                if is_batch(record):
                    item, n = pools[n % lanes].submit(finish, record, n % lanes), n + 1
                else:
                    item = ready(record)
                if not put(item):
                    return
            put(ready(_END))
        except BaseException as exc:  # handed to the consumer, which raises it
            put(ready(error=exc))

    thread = threading.Thread(target=feed, name="infclip-decode-feed", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get().result()
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=30)
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
