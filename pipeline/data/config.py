"""The ``data`` section (:class:`DataConfig`): where the shards are and how they are streamed.

A module of its own that imports neither torch nor PIL, so that :mod:`pipeline.config` reads a
run's config without loading the loader.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Union

from infclip.ops.config import ConfigError, parse_section, require_at_least

__all__ = ["CLIP_MEAN", "CLIP_STD", "DataConfig", "GPU_DECODERS"]

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
GPU_DECODERS = ("auto", "nvjpeg", "nvjpeg_hardware", "torchvision")
"""``data.gpu_decoder``'s values."""


@dataclasses.dataclass
class DataConfig:
    """The ``data`` section: where the shards are and how they are streamed."""

    train_shards: Optional[Union[str, List[str]]] = None
    """Training shards: a brace URL (``/data/cc3m/{000000..000331}.tar``) or a list of them.
    Local paths are checked up front; remote (``http://``, ``pipe:``) URLs are not. Required."""
    val_shards: Optional[Union[str, List[str]]] = None
    """Held-out shards for eval (json member with ``label`` for zero-shot); optional."""
    tokenizer: Optional[str] = None
    """Local HF tokenizer folder; ``"openclip"``: OpenCLIP's BPE (the one its models were trained
    with, read from the installed open_clip_torch) written to the run directory; null: train a
    byte-level BPE on the training captions and store it in the run directory."""
    vocab_size: int = 4096
    """Upper bound on the trained BPE's vocabulary (ignored with ``tokenizer``)."""
    tokenizer_train_captions: int = 200_000
    """At most this many training captions are read to train the BPE."""
    shuffle_buffer: int = 1000
    """Sample shuffle buffer per worker (0 or 1: no sample shuffling)."""
    shard_shuffle: bool = True
    """Shuffle the shard order every epoch (seeded by seed and epoch) before splitting by rank."""
    resampled: bool = False
    """Draw shards with replacement, endlessly (each rank and worker its own seeded stream);
    needs ``samples_per_epoch``."""
    samples_per_epoch: Optional[int] = None
    """Nominal epoch size (all ranks together); each rank yields samples_per_epoch //
    (micro_batch * world_size) batches, fewer if all its loader workers run out of data
    first (not with resampled). Null: one pass over the shards (not with resampled)."""
    workers: int = 2
    """DataLoader worker processes per rank (0: load in the training process); without
    ``resampled`` at most the rank's shard count (fewer are started)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (with workers > 0)."""
    seed: int = 0
    """Base seed of shard order, shuffle buffer, resampling and random crops."""
    image_key: str = "jpg;png;webp;jpeg"
    """Image member extensions, ``;``-separated, first present wins."""
    caption_key: str = "txt"
    """Caption member extension (UTF-8 text)."""
    crop_scale: List[float] = dataclasses.field(default_factory=lambda: [0.9, 1.0])
    """Training random-resized-crop area range (fraction of the image); [1, 1]: centre crop."""
    image_mean: List[float] = dataclasses.field(default_factory=lambda: list(CLIP_MEAN))
    """Per-channel normalisation mean (CLIP's by default)."""
    image_std: List[float] = dataclasses.field(default_factory=lambda: list(CLIP_STD))
    """Per-channel normalisation std (CLIP's by default)."""
    decode: str = "auto"
    """Where training JPEGs are decoded: ``"cpu"`` (PIL in the loader workers), ``"gpu"`` (nvJPEG
    on the training GPU, the crop and normalisation there too, overlapped with the step; the
    workers only read, parse headers and tokenise: ``pipeline.data.gpu_decode``; needs the ``gpu``
    extra, torchvision) or ``"auto"``: the GPU when training on CUDA and torchvision is there,
    else the CPU. Other image formats are decoded in the workers either way. Eval is on the CPU."""
    gpu_decode_share: float = 1.0
    """With GPU decoding, the share of the JPEGs decoded there (chosen per sample from a hash of its
    shard name and key: the same samples on every run and resume); the workers decode the rest.
    For hosts whose workers have cores to spare (measured on one H200 with 16 cores, ViT-B/32:
    0.7 was no faster than 1)."""
    gpu_decoder: str = "auto"
    """With GPU decoding, how nvJPEG is called: ``"nvjpeg"`` (the library directly, its GPU
    backend: batched kernels on the decode stage's high-priority stream, into one buffer:
    ``pipeline.data.nvjpeg``), ``"nvjpeg_hardware"`` (the same call on the GPU's JPEG engines,
    which wait on the host once per image and so crawl while a step fills the GPU),
    ``"torchvision"`` (``torchvision.io.decode_jpeg``, the JPEG engines too) or ``"auto"``:
    nvjpeg when the library loads, else torchvision."""
    gpu_decode_scaled: bool = False
    """With GPU decoding, JPEGs whose crop needs at most half their resolution (a 0.9-1.0 crop of a
    JPEG twice the input size or more) are decoded by the project's DCT-domain kernels at the
    coarsest DCT scale that keeps the crop (``pipeline.data.dct_decode``; the loader workers take
    the files apart), the rest by ``gpu_decoder``. The kernels skip the inverse transform of the
    frequencies the crop cannot use and decode each JPEG's Huffman codes in one lane. Off: its cost
    beside a training step has not been measured (docs/data.md). False: every JPEG to
    ``gpu_decoder``."""
    gpu_decode_lanes: int = 1
    """With the direct nvJPEG decoder, how many batches are decoded at once, each in a lane of its
    own (a decoder state, a stream and a host thread). With the GPU backend one lane keeps the
    step fed (measured: waiting under 1% of a ViT-B/32 step); more lanes help the
    ``nvjpeg_hardware`` decoder, whose calls wait on the host."""
    gpu_decode_host_max_pixels: int = 0
    """With the direct nvJPEG decoder, JPEGs of at most this many pixels are decoded on the
    training host's CPU, in the decode lanes' threads (nvJPEG's hybrid backend; their planes are
    copied to the GPU, which crops them with the rest); larger ones are decoded by GPU kernels;
    0: every JPEG on the GPU. Huffman decoding is most of what decode costs the GPU, and a host
    thread decodes about 6,000 256-px JPEGs a second but only 2,400 512-px ones: give small
    images to the host, with 2 lanes (docs/data.md)."""
    gpu_decode_host_interleaved: bool = False
    """The JPEGs decoded on the host (``gpu_decode_host_max_pixels``) written as one plane of
    interleaved RGB pixels each instead of three planes; the crop kernel reads either. The hybrid
    decoder copies each plane to the GPU on its own (three copies an image, each a call into
    the CUDA driver beside the training thread's): this asks for one. Measured no faster in the
    step than the planes (docs/data.md)."""
    gpu_decode_host_copy: str = "plane"
    """How the JPEGs decoded on the host (``gpu_decode_host_max_pixels``) reach the GPU:
    ``"plane"`` (nvJPEG's hybrid decoder writes the GPU buffer itself, one host-to-device copy a
    plane, three an image) or ``"batch"`` (it writes a pinned host buffer, and one copy a batch
    moves all of them: a call into the CUDA driver a batch instead of thousands). Measured slower
    in the step than the planes (docs/data.md)."""
    gpu_decode_host_share: float = 1.0
    """Of each batch's JPEGs, at most this share is decoded on the host (the first of those within
    ``gpu_decode_host_max_pixels``, in batch order), the rest by GPU kernels: splits a batch of
    equal-sized JPEGs between the host threads and the GPU, so each decodes a part of it at once.
    On 16 cores a share of 512-px JPEGs measured no faster than the GPU alone (docs/data.md)."""
    gpu_decode_engine_share: float = 0.0
    """With the direct nvJPEG decoder's GPU backend, this share of each batch's JPEGs goes to the
    GPU's JPEG engines (the hardware decoders of A100, H100 and later), decoded on a stream of their
    own at the same time as the GPU backend's kernels decode the rest: the engines take no SM time
    but for a small colour-conversion kernel an image, and their calls wait on the host, image by
    image. 0: the GPU backend decodes every JPEG. Ignored, with a log line, on GPUs without engines."""
    gpu_decode_priority: str = "high"
    """The decode lanes' CUDA stream priority: ``"high"`` (the decode and crop kernels' blocks go
    ahead of the step's queued ones, so a batch is ready sooner) or ``"normal"`` (the step's
    priority: the decode fills the SM time the step leaves, and waits behind it otherwise)."""
    reserve_training_core: bool = False
    """While the training loader runs, keep the rank's training thread on a physical core of its own
    (all its hyperthreads) and the loader's worker processes and decode threads on the other cores
    (``pipeline.data.cores``; local rank ``r`` of a host takes the ``r``-th core from the end). Left to
    the scheduler otherwise. Linux; skipped, with a log line, where the process may use fewer than
    4 physical cores per local rank. Measured slower on one H100 host with 16 cores (ViT-B/32 at
    micro-batch 256: 82-83% of the synthetic step against 90-92% without), so it is off."""
    device_cache: bool = False
    """Decode every training sample once into device memory and serve batches from there
    (``pipeline.data.device_cache``): for data sets that fit (at most half the free memory), when the
    loader cannot keep up with a small model. Needs ``crop_scale`` [1, 1]; ignores ``resampled``
    (an epoch is a seeded permutation of the cached set)."""
    generate_digits: bool = False
    """If none of the local train/val shards listed is there, write the scikit-learn digits data
    set (train split to ``train_shards``, held-out split with labels to ``val_shards``) at those
    exact paths. Some there and some not: a generation cut short (the files there are the digits'
    own, byte for byte) is completed, any other list is refused; the digits are never written
    over other files."""
    digits_image_size: int = 32
    """Side of the generated digits images (8x8 originals, upscaled)."""

    def __post_init__(self) -> None:
        if not self.train_shards:
            raise ConfigError("'train_shards' is required (a brace URL or a list of them)")
        require_at_least(self, 1, "vocab_size", "tokenizer_train_captions", "prefetch_factor", "digits_image_size")
        if self.vocab_size < 259:
            raise ConfigError(f"'vocab_size' must be >= 259 (256 bytes + 3 special tokens), got {self.vocab_size}")
        require_at_least(self, 0, "workers", "shuffle_buffer", "gpu_decode_host_max_pixels")
        require_at_least(self, 1, "samples_per_epoch", optional=True)
        if self.resampled and self.samples_per_epoch is None:
            raise ConfigError("'resampled': true needs 'samples_per_epoch' (a resampled stream never ends)")
        if len(self.crop_scale) != 2 or not 0.0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0:
            raise ConfigError(f"'crop_scale' must be [lo, hi] with 0 < lo <= hi <= 1, got {self.crop_scale}")
        if self.device_cache and list(self.crop_scale) != [1.0, 1.0]:
            raise ConfigError(f"'device_cache' decodes each image once, so it cannot take random crops: set "
                              f"'crop_scale' to [1, 1] (got {list(self.crop_scale)})")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ConfigError("'image_mean' and 'image_std' must hold 3 numbers, std > 0")
        if not self.image_keys():
            raise ConfigError(f"'image_key' names no extension: {self.image_key!r}")
        if not self.caption_key:
            raise ConfigError("'caption_key' must not be empty")
        if not 0.0 <= self.gpu_decode_share <= 1.0:
            raise ConfigError(f"'gpu_decode_share' must be in [0, 1], got {self.gpu_decode_share}")
        if self.decode not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"'decode' must be \"auto\", \"cpu\" or \"gpu\", got {self.decode!r}")
        require_at_least(self, 1, "gpu_decode_lanes")  # an integer: the section's typed read checks that
        if self.gpu_decode_lanes > 8:
            raise ConfigError(f"'gpu_decode_lanes' must be <= 8, got {self.gpu_decode_lanes}")
        if not 0.0 < self.gpu_decode_host_share <= 1.0:
            raise ConfigError(f"'gpu_decode_host_share' must be in (0, 1], got {self.gpu_decode_host_share}")
        if not 0.0 <= self.gpu_decode_engine_share < 1.0:
            raise ConfigError(f"'gpu_decode_engine_share' must be in [0, 1), got {self.gpu_decode_engine_share}")
        if self.gpu_decode_host_copy not in ("plane", "batch"):
            raise ConfigError(f"'gpu_decode_host_copy' must be \"plane\" or \"batch\", "
                              f"got {self.gpu_decode_host_copy!r}")
        if self.gpu_decode_priority not in ("high", "normal"):
            raise ConfigError(f"'gpu_decode_priority' must be \"high\" or \"normal\", got {self.gpu_decode_priority!r}")
        if self.gpu_decoder not in GPU_DECODERS:
            raise ConfigError(f"'gpu_decoder' must be one of {', '.join(map(repr, GPU_DECODERS))}, "
                              f"got {self.gpu_decoder!r}")

    def image_keys(self) -> List[str]:
        return [k.strip().lower().lstrip(".") for k in self.image_key.split(";") if k.strip()]

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, Any]], source: Optional[str] = None) -> "DataConfig":
        return parse_section(cls, data, "data", source)
