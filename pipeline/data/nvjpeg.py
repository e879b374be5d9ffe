"""nvJPEG's batched decoder, called directly: JPEG files in host memory -> planar RGB in one device buffer.

Design: the GPU decode stage (:mod:`pipeline.data.gpu_decode`) needs a batch of JPEGs decoded while a
training step runs on the same GPU. Here the library torchvision loads decodes on the caller's
stream (the stage's high-priority one), straight into one flat uint8 buffer laid out as the crop
kernel reads it (image ``k``'s [3, H_k, W_k] planes at ``offsets[k]``). ctypes, not a compiled
extension: the calls are few (one or two a batch) and nothing is built at install time.

Backends (``backend``):

- ``"gpu"`` (nvJPEG's GPU_HYBRID backend, the default): Huffman decoding, IDCT and colour
  conversion run as a few batched kernels on the stream, and the host returns once they are
  queued. Measured on one H100 with a 1,024-image batch of 256-px JPEGs: 14 ms idle, 22 ms while
  another stream's 8,192^3 matrix products fill the GPU.
- ``"hardware"`` (the GPU's JPEG engines, where it has them): the engines decode, then one
  colour-conversion kernel an image runs on the stream, and the host waits on an event per image
  before reusing a staging slot (a profile counts 1,010 waits for 1,024 images). Idle that is
  33 ms a batch; while the GPU is full each of those small kernels waits for a block slot, and the
  same batch takes 454 ms, with the engines' buffer pool sized for the batch beforehand or not.
  ``torchvision.io.decode_jpeg`` uses this backend.
- ``"hybrid"`` (nvJPEG's HYBRID backend): the whole decode on the calling thread's core (the call
  holds it: 162 ms for that batch, 430 ms at 512 px, the same beside GPU load), then a
  host-to-device copy a plane (three an image) on the stream; a profile of a training step shows
  no kernel of its own. What ``data.gpu_decode_host_max_pixels`` uses for small JPEGs: the GPU is
  spared their decode, Huffman kernels (the largest part of the GPU backend's time) included.
  With several lanes decoding 512-px JPEGs beside a training step, those copies spend about 70 us
  each in the CUDA driver and the training thread's launches take ten times as long; beside an
  idle GPU they do not (``bench/bench_host_decode.py``). The cause is not established (docs/data.md).
- ``"gpu_device"`` and ``"hardware_device"``: the first two reading the files from device memory
  (the batch copied there at once). For measurement only (``bench/bench_nvjpeg.py``): the engines
  keep their per-image waits that way (486 against 488 ms for 1,024 512-px JPEGs behind 8,192^3
  products, one H100) and add two copies an image.

The library is found where torchvision's wheel puts it (the ``nvidia`` packages beside torch, or
``torchvision.libs``), or by the system's loader; :func:`load_decoder` says in one phrase why
when it cannot be used, and the stage then keeps torchvision's decoder.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from typing import List, Optional, Tuple

import numpy as np
import torch

__all__ = ["NvJpeg", "NvJpegError", "batch_descriptors", "load_decoder", "plane_buffer"]

_BACKEND_DEFAULT, _BACKEND_HYBRID, _BACKEND_GPU_HYBRID, _BACKEND_HARDWARE = 0, 1, 2, 3
_BACKEND_GPU_HYBRID_DEVICE, _BACKEND_HARDWARE_DEVICE = 4, 5  # the batched call reads the files from device memory
_BACKENDS = {"gpu": _BACKEND_GPU_HYBRID, "hardware": _BACKEND_HARDWARE, "hybrid": _BACKEND_HYBRID,
             "gpu_device": _BACKEND_GPU_HYBRID_DEVICE, "hardware_device": _BACKEND_HARDWARE_DEVICE}
_WITHOUT_ENGINES = {"hardware": _BACKEND_DEFAULT, "hardware_device": _BACKEND_GPU_HYBRID_DEVICE}
"""The engines' backends, and what each falls back to on a GPU without JPEG engines."""
_DEVICE_INPUT = ("gpu_device", "hardware_device")
_OUTPUTS = {"rgb": 3, "yuv": 1, "rgbi": 5}  # nvjpegOutputFormat_t
_STATUS_ARCH_MISMATCH = 7
_MAX_COMPONENT = 4
_CSS_420 = 2  # nvjpegChromaSubsampling_t: what web JPEGs mostly are
_OPTIONAL = ("nvjpegDecodeBatchedPreAllocate",)  # nvJPEG 11.4 and later
MEMORY_PADDING = (0, 0)
"""Bytes nvJPEG adds to each of a handle's device and pinned host allocations
(``nvjpegSetDeviceMemoryPadding``, ``nvjpegSetPinnedMemoryPadding``), so that a larger JPEG than
any before does not make it free and allocate its buffers again: freeing device or pinned memory
waits for the whole GPU."""


class _Image(ctypes.Structure):
    """nvjpegImage_t: a plane pointer and pitch per component."""

    _fields_ = [("channel", ctypes.c_void_p * _MAX_COMPONENT), ("pitch", ctypes.c_size_t * _MAX_COMPONENT)]


class NvJpegError(RuntimeError):
    """An nvJPEG call returned an error status."""


def _library_paths() -> List[str]:
    """Candidate libnvjpeg files: one already loaded in this process first (torchvision's), then
    the pip packages' folders, then the system's loader."""
    found: List[str] = []
    try:
        with open("/proc/self/maps") as maps:
            found += sorted({line.split()[-1] for line in maps if "libnvjpeg" in line and "/" in line})
    except OSError:
        pass
    for site in sys.path:
        for pattern in ("nvidia/*/lib/libnvjpeg.so*", "nvidia/nvjpeg/lib/libnvjpeg.so*", "torchvision.libs/libnvjpeg*.so*",
                        "torch/lib/libnvjpeg*.so*"):
            found += sorted(glob.glob(os.path.join(site, pattern)))
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    found += sorted(glob.glob(os.path.join(cuda_home, "lib64", "libnvjpeg.so*")))
    system = ctypes.util.find_library("nvjpeg")
    if system:
        found.append(system)
    return list(dict.fromkeys(found))


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, vp, i, sz = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "nvjpegCreateEx": [i, vp, vp, ctypes.c_uint, p(vp)],
        "nvjpegJpegStateCreate": [vp, p(vp)],
        "nvjpegDecodeBatchedInitialize": [vp, vp, i, i, i],
        "nvjpegDecodeBatched": [vp, vp, p(vp), p(sz), p(_Image), vp],
        "nvjpegDecodeBatchedPreAllocate": [vp, vp, i, i, i, i, i],
        "nvjpegSetDeviceMemoryPadding": [sz, vp],
        "nvjpegSetPinnedMemoryPadding": [sz, vp],
    }
    for name, args in sigs.items():
        if not hasattr(lib, name) and name in _OPTIONAL:
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


class NvJpeg:
    """One nvJPEG handle and batched-decode state on the current CUDA device (one thread uses it).

    Args:
        lib: the loaded library (:func:`load_decoder` finds it).
        backend: ``"gpu"`` (batched kernels; the host returns once they are queued),
            ``"hybrid"`` (decoded on the calling thread, then copied plane by plane) or
            ``"hardware"`` (the JPEG engines; the call returns when its batch is decoded; the
            library's default backend on GPUs without engines), or ``"gpu_device"`` and
            ``"hardware_device"``: the same two reading the files from device memory (the batch
            is copied there at once, on ``stream``; ``"gpu_device"`` on GPUs without engines).
            See the module docstring.
        output: ``"rgb"`` (three planes an image), ``"rgbi"`` (one plane of interleaved pixels,
            [H, W, 3]; the crop kernel reads both) or ``"yuv"`` (the planes as coded, Y then Cb
            and Cr at the JPEG's chroma sampling, each at pitch W in the same slots: for measuring
            what the colour conversion costs, ``bench/bench_nvjpeg.py --outputs``).
        preallocate: with the JPEG engines, size the engines' buffer pool for the first batch
            (``nvjpegDecodeBatchedPreAllocate``: its count and largest width and height) before
            decoding it, instead of letting the library grow a few staging slots as it goes.
    """

    def __init__(self, lib: ctypes.CDLL, backend: str = "gpu", output: str = "rgb", preallocate: bool = True) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
        if output not in _OUTPUTS:
            raise ValueError(f"output must be one of {sorted(_OUTPUTS)}, got {output!r}")
        self.output, self.preallocate = output, preallocate
        self._lib = _bind(lib)
        self.backend = backend
        self.handle, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        status = lib.nvjpegCreateEx(_BACKENDS[backend], None, None, 0, ctypes.byref(self.handle))
        self.hardware = backend in _WITHOUT_ENGINES and status == 0
        self.device_input = backend in _DEVICE_INPUT
        if backend in _WITHOUT_ENGINES and status == _STATUS_ARCH_MISMATCH:  # no JPEG engines on this GPU
            status = lib.nvjpegCreateEx(_WITHOUT_ENGINES[backend], None, None, 0, ctypes.byref(self.handle))
        self._check(status, "nvjpegCreateEx")
        device_padding, pinned_padding = MEMORY_PADDING
        if device_padding:
            self._check(lib.nvjpegSetDeviceMemoryPadding(device_padding, self.handle), "nvjpegSetDeviceMemoryPadding")
        if pinned_padding:
            self._check(lib.nvjpegSetPinnedMemoryPadding(pinned_padding, self.handle), "nvjpegSetPinnedMemoryPadding")
        self._check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "nvjpegJpegStateCreate")
        # the engines' pool is sized once, before the first batch, where the library can
        self._pooled = not (self.hardware and preallocate and hasattr(lib, _OPTIONAL[0]))
        self._batch = 0
        self._inflight: Tuple = ()  # the host bytes and pointer arrays of the batch the GPU may still read

    def another(self) -> "NvJpeg":
        """A second handle and state on the same library (for a second thread)."""
        return NvJpeg(self._lib, self.backend, self.output, self.preallocate)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise NvJpegError(f"{what} failed with nvJPEG status {status}")

    def decode(self, data: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, stream: Optional[torch.cuda.Stream] = None,
               out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Decode JPEG files laid end to end.

        Args:
            data: uint8 [total] on the CPU (contiguous), the files end to end.
            offsets: int64 [n + 1], file ``k`` is ``data[offsets[k]:offsets[k + 1]]``.
            sizes: int64 [n, 2], each file's (W, H) from its header.
            stream: where the GPU work is queued (default: the current stream); ``data`` must not
                change until the stream has passed this work.
            out: (buffer, int64 [n] offsets) to decode into instead of a new buffer: image ``k``'s
                planes at ``buffer[offsets[k]:]`` (a part of a batch another decoder shares).
        Returns:
            (flat uint8 buffer on the current device, int64 [n] offsets of each image's RGB planes).
        """
        n = offsets.numel() - 1
        stream = stream or torch.cuda.current_stream()
        if not data.is_pinned():  # the library's copy of pageable bytes would wait for the stream
            data = data.pin_memory()
        W, H = sizes[:, 0].to(torch.int64), sizes[:, 1].to(torch.int64)
        plane = W * H
        flat, starts = out if out is not None else plane_buffer(sizes, stream)
        if self.device_input:  # one copy a batch; the library reads the files where the GPU can
            with torch.cuda.stream(stream):
                data = data.to(flat.device, non_blocking=True)
        pointers, lengths, images = batch_descriptors(data.data_ptr(), offsets, W, plane, starts, flat.data_ptr(),
                                                      interleaved=self.output == "rgbi")
        if not self._pooled:
            self._pooled = True
            self._check(self._lib.nvjpegDecodeBatchedPreAllocate(self.handle, self.state, n, int(W.max()), int(H.max()),
                                                                 _CSS_420, _OUTPUTS[self.output]),
                        "nvjpegDecodeBatchedPreAllocate")
        if n != self._batch:
            self._check(self._lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, _OUTPUTS[self.output]),
                        "nvjpegDecodeBatchedInitialize")
            self._batch = n
        status = self._lib.nvjpegDecodeBatched(
            self.handle, self.state, pointers.ctypes.data_as(ctypes.POINTER(ctypes.c_void_p)),
            lengths.ctypes.data_as(ctypes.POINTER(ctypes.c_size_t)), images.ctypes.data_as(ctypes.POINTER(_Image)),
            ctypes.c_void_p(stream.cuda_stream))
        if status != 0:
            self._batch = 0  # a failed batch needs the state initialised again
            self._check(status, "nvjpegDecodeBatched")
        self._inflight = (data, pointers, lengths, images)
        return flat, starts


def plane_buffer(sizes: torch.Tensor, stream: torch.cuda.Stream) -> Tuple[torch.Tensor, torch.Tensor]:
    """(uint8 buffer on the current device, allocated on ``stream``, int64 [n] offsets) for the
    decoded planes of images of ``sizes`` (int64 [n, 2], (W, H)): image ``k``'s [3, H_k, W_k] at
    ``offsets[k]``."""
    numel = 3 * sizes[:, 0].to(torch.int64) * sizes[:, 1].to(torch.int64)
    with torch.cuda.stream(stream):
        flat = torch.empty(int(numel.sum()), dtype=torch.uint8, device=torch.cuda.current_device())
    return flat, torch.cumsum(numel, 0) - numel


def batch_descriptors(host: int, offsets: torch.Tensor, widths: torch.Tensor, planes: torch.Tensor,
                      starts: torch.Tensor, base: int, interleaved: bool = False
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """nvjpegDecodeBatched's arrays for files at ``host + offsets[k]`` decoded to planes at ``base +
    starts[k]`` (each ``planes[k]`` bytes, pitch ``widths[k]``), or with ``interleaved`` to one
    plane of RGB pixels there (pitch ``3 * widths[k]``): the files' addresses and lengths
    (uint64 [n]) and the nvjpegImage_t rows (uint64 [n, 8]: four plane addresses, four pitches).
    Array arithmetic, not a loop over ctypes structures: such a loop holds the interpreter lock for
    about 1.5 ms a 1,024-image batch, time the training thread waits for."""
    u64 = np.uint64
    offs = offsets.numpy().astype(u64)
    first = starts.numpy().astype(u64) + u64(base)
    plane, pitch = planes.numpy().astype(u64), widths.numpy().astype(u64)
    images = np.zeros((len(first), 2 * _MAX_COMPONENT), dtype=u64)
    if interleaved:
        images[:, 0], images[:, _MAX_COMPONENT] = first, u64(3) * pitch
        return offs[:-1] + u64(host), offs[1:] - offs[:-1], images
    for c in range(3):
        images[:, c] = first + u64(c) * plane
        images[:, _MAX_COMPONENT + c] = pitch
    return offs[:-1] + u64(host), offs[1:] - offs[:-1], images


def load_decoder(backend: str = "gpu", output: str = "rgb", preallocate: bool = True
                 ) -> Tuple[Optional[NvJpeg], Optional[str]]:
    """(a decoder with ``backend``, ``output`` and ``preallocate``, None), or (None, why not in one phrase)."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    errors = []
    for path in _library_paths():
        try:
            return NvJpeg(ctypes.CDLL(path), backend, output, preallocate), None
        except (OSError, AttributeError, NvJpegError) as exc:
            errors.append(f"{os.path.basename(path)}: {exc}")
    return None, "; ".join(errors) or "libnvjpeg not found"
