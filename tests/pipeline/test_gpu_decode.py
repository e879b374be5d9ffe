"""The GPU decode path of the training loader (``data.decode``): the crop kernel against its
fp32 reference, and the whole path against the CPU path on real shards.

On the CPU the path runs as it does on a GPU, with PIL standing in for nvJPEG (the stage's
``decode_fn``) and the kernel under Triton's interpreter: what travels from the workers, the
boxes, the order, the resume position, the fallbacks. The ``gpu`` tests run nvJPEG itself.
"""

from __future__ import annotations

import io
import logging
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from infclip.ops.config import ConfigError
from infclip.pipeline.data.build import build_train_loader
from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD, DataConfig
from infclip.pipeline.data import image_ops
from infclip.pipeline.data.image_ops import resized_crop_normalize, resized_crop_normalize_reference
from infclip.pipeline.data.shards import brace_url, write_shards
from infclip.pipeline.data.tokenizer import load_tokenizer
from tests.pipeline._sm90 import sm90_usage

LEVEL = 1 / 255 / min(CLIP_STD)  # one uint8 level, normalised, at its largest


@pytest.fixture(scope="module")
def tok(digits_shards):
    return load_tokenizer(digits_shards["tokenizer_dir"])


def _picture(i: int, size) -> Image.Image:
    """Smooth gradients (no edge a decoder's scaled IDCT renders differently), a different image a sample."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([xx * 200 / w + i % 50, yy * 200 / h + (i * 7) % 50, (xx + yy) * 150 / (w + h) + (i * 3) % 90], -1)
    return Image.fromarray(arr.astype(np.uint8), "RGB")


def _encoded(img: Image.Image, kind: str) -> bytes:
    buf = io.BytesIO()
    if kind == "png":
        img.save(buf, format="PNG")
    elif kind == "cmyk":
        img.convert("CMYK").save(buf, format="JPEG", quality=95)
    elif kind == "gray":
        img.convert("L").save(buf, format="JPEG", quality=95)
    else:
        img.save(buf, format="JPEG", quality=95, progressive=kind == "progressive")
    return buf.getvalue()


KINDS = ("baseline", "progressive", "gray", "cmyk", "png", "baseline")


def _mixed_shards(out, n: int = 24, per_shard: int = 6) -> str:
    """JPEG (baseline, progressive, grey, CMYK) and PNG members of several sizes."""
    sizes = [(40, 30), (29, 47), (64, 64), (33, 33)]
    samples = ((_encoded(_picture(i, sizes[i % 4]), KINDS[i % 6]), f"sample number {i}", None) for i in range(n))
    paths = write_shards(samples, out, samples_per_shard=per_shard, image_format="jpg")
    return brace_url(paths)


def _loader(url, tok, decode, device="cpu", **kw):
    cfg = DataConfig(train_shards=url, workers=kw.pop("workers", 2), shuffle_buffer=8, seed=5, decode=decode,
                     crop_scale=[0.4, 1.0], gpu_decode_share=kw.pop("share", 1.0),
                     gpu_decoder=kw.pop("decoder", "auto"), gpu_decode_host_max_pixels=kw.pop("host_pixels", 0),
                     gpu_decode_lanes=kw.pop("lanes", 1), gpu_decode_host_interleaved=kw.pop("interleaved", False),
                     gpu_decode_host_copy=kw.pop("host_copy", "plane"),
                     gpu_decode_host_share=kw.pop("host_share", 1.0),
                     gpu_decode_engine_share=kw.pop("engine_share", 0.0),
                     gpu_decode_scaled=kw.pop("scaled", False),
                     reserve_training_core=kw.pop("reserve_training_core", False))
    return build_train_loader(cfg, tok, image_size=16, context_length=16, batch_size=4,
                              device=torch.device(device), **kw)


def _levels(pixels: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (pixels.float().cpu() * std + mean) * 255


@pytest.mark.parametrize("kernel", ["point", "band"])
def test_crop_kernel_equals_the_float_reference_on_awkward_shapes(kernel, monkeypatch):
    """Downscales and upscales, boxes at the edges, images of odd sizes in one launch (grouped
    by taps), rows written where asked and nowhere else, by either kernel (a lane an output pixel,
    or a band of rows with the axes in turn). The kernel's separable product and the reference's
    two passes round differently only at a level's half: at most one level, rarely."""
    monkeypatch.setattr(image_ops, "KERNEL", kernel)
    g = torch.Generator().manual_seed(0)
    shapes = [(37, 41), (20, 50), (64, 64), (9, 13), (100, 23), (5, 5)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in shapes]
    boxes = [(3, 2, 30, 33), (0, 0, 50, 20), (5, 7, 59, 57), (0, 0, 13, 9), (1, 10, 20, 80), (4, 4, 1, 1)]
    dest = [6, 0, 2, 3, 4, 7]
    out = torch.full((8, 3, 12, 12), 99.0)
    resized_crop_normalize(images, boxes, out, dest, CLIP_MEAN, CLIP_STD)
    ref = resized_crop_normalize_reference(images, boxes, 12, CLIP_MEAN, CLIP_STD)
    diff = (out[dest] - ref).abs()
    assert diff.max() <= LEVEL * 1.001
    assert (diff > 1e-5).float().mean() < 0.01
    assert (out[[1, 5]] == 99.0).all()  # rows no image was sent to are untouched


@pytest.mark.parametrize("kernel", ["point", "band"])
def test_crop_kernel_reads_interleaved_images_as_it_reads_planes(kernel, monkeypatch):
    """Images laid as [H, W, 3] pixels (what a decoder's interleaved output gives) beside planar ones
    in one buffer: the same values, bit for bit, as all of them laid as planes."""
    monkeypatch.setattr(image_ops, "KERNEL", kernel)
    from infclip.pipeline.data.image_ops import resized_crop_normalize_flat

    g = torch.Generator().manual_seed(1)
    shapes = [(37, 41), (20, 50), (9, 13), (64, 30)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in shapes]
    boxes = torch.tensor([(3, 2, 30, 33), (0, 0, 50, 20), (0, 0, 13, 9), (2, 5, 27, 59)])
    sizes = torch.tensor([(w, h) for h, w in shapes])
    dest = torch.tensor([2, 0, 3, 1])
    numel = torch.tensor([im.numel() for im in images])
    starts = torch.cumsum(numel, 0) - numel
    mixed = torch.tensor([True, False, True, True])
    planar = torch.zeros(4, 3, 12, 12)
    resized_crop_normalize_flat(torch.cat([im.flatten() for im in images]), starts, sizes, boxes, planar, dest,
                                CLIP_MEAN, CLIP_STD)
    flat = torch.cat([(im.permute(1, 2, 0) if m else im).flatten() for im, m in zip(images, mixed.tolist())])
    out = torch.zeros(4, 3, 12, 12)
    resized_crop_normalize_flat(flat, starts, sizes, boxes, out, dest, CLIP_MEAN, CLIP_STD, interleaved=mixed)
    assert torch.equal(out, planar)
    ref = resized_crop_normalize_reference(images, boxes.tolist(), 12, CLIP_MEAN, CLIP_STD)
    assert (out[dest] - ref).abs().max() <= LEVEL * 1.001


_CROP_KERNELS = """
from infclip.pipeline.data import image_ops
pointers = {"src_ptr": "*u8", "meta_ptr": "*i64", "out_ptr": "*bf16", "mean_ptr": "*fp32", "std_ptr": "*fp32"}
# the launches' own settings: what resized_crop_normalize_flat runs at a 224-px output
for name, fn, extra, warps in (("point", image_ops._resized_crop_kernel, {"BLOCK": image_ops._BLOCK}, 4),
                               ("band", image_ops._resized_crop_band_kernel,
                                {"ROWS": image_ops._ROWS, "COLS": triton.next_power_of_2(224)}, image_ops._BAND_WARPS)):
    for taps in (4, 6):
        found[f"{name}{taps}"] = usage(fn, pointers, {"S": 224, "TAPS": taps, **extra}, warps)
"""


def test_crop_kernels_compile_for_hopper_without_spilling():
    """What Triton's interpreter cannot show: both crop kernels compile for sm_90 (a construct only
    the interpreter accepts fails here), and neither spills registers to local memory at the taps of
    256- and 512-px JPEGs cropped to 224 (:mod:`tests.pipeline._sm90`)."""
    usage = sm90_usage(_CROP_KERNELS)
    assert set(usage) == {"point4", "point6", "band4", "band6"}
    for name, use in usage.items():
        assert use["LOCAL"] == 0 and 0 < use["REG"] <= 255, (name, use)
    assert max(usage["band4"]["REG"], usage["band6"]["REG"]) <= 128, usage  # two blocks of 256 threads resident


def test_crop_kernel_writes_the_model_dtype():
    img = torch.arange(3 * 20 * 20, dtype=torch.int64).remainder(256).to(torch.uint8).view(3, 20, 20)
    out = torch.zeros(1, 3, 8, 8, dtype=torch.float16)
    resized_crop_normalize([img], [(2, 3, 15, 11)], out, [0], CLIP_MEAN, CLIP_STD)
    ref = resized_crop_normalize_reference([img], [(2, 3, 15, 11)], 8, CLIP_MEAN, CLIP_STD, torch.float16)
    assert (out.float() - ref.float()).abs().max() <= LEVEL * 1.01


def test_gpu_path_gives_the_cpu_paths_samples_boxes_and_positions(tmp_path, tok):
    """decode "gpu" (its stage on the CPU, PIL for nvJPEG, the DCT-domain kernels under the
    interpreter for the JPEGs whose crop fits half their size) against decode "cpu" on JPEG,
    progressive, grey, CMYK and PNG members: the same samples in the same order (tokens equal),
    the same crop regions, the same loader positions. Pixels: where one path decodes a JPEG at a
    reduced DCT scale and the other whole, or both at reduced scales by different transforms
    (libjpeg's and the kernels'), the coarse decode puts the box's edges on its nearest pixel, up
    to 2 image pixels off on these gradients of 3-5 levels a pixel (the next sample is about 4
    levels off on average, a box 4 pixels over 12-20); elsewhere within the two resizes' rounding."""
    url = _mixed_shards(tmp_path / "mixed")
    cpu, gpu = _loader(url, tok, "cpu"), _loader(url, tok, "gpu", scaled=True)
    got_cpu, got_gpu = list(cpu), list(gpu)
    assert len(got_cpu) == len(got_gpu) == 6
    for a, b in zip(got_cpu, got_gpu):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert a["pixel_values"].shape == b["pixel_values"].shape and b["pixel_values"].dtype == torch.float32
        diff = (_levels(a["pixel_values"]) - _levels(b["pixel_values"])).abs()
        assert diff.max() <= 10.01 and diff.mean() < 1.5, (diff.max(), diff.mean())
    assert cpu.position() == gpu.position()
    assert cpu.stats["samples"] == gpu.stats["samples"] and cpu.skipped_by_reason == gpu.skipped_by_reason


def test_workers_send_jpeg_files_and_decode_the_rest(tmp_path, tok):
    """What a worker sends on the GPU path: the JPEGs nvJPEG takes as files with the CPU path's
    box (drawn from the same seed on the same draft size) in full-image pixels; progressive,
    grey and CMYK JPEGs and PNGs as uint8 crops; every row of the batch exactly once."""
    import random

    from infclip.pipeline.data.jpeg_boxes import scaled_box
    from infclip.pipeline.data.spec import stable_seed
    from infclip.pipeline.data.transforms import crop_box, shard_name

    url = _mixed_shards(tmp_path / "mixed", n=12, per_shard=12)
    loader = _loader(url, tok, "gpu", workers=0)
    stream = loader.dataloader.dataset
    record = next(iter(stream))
    assert "dct" not in record
    n_jpeg, n_cpu = len(record["jpeg_dest"]), len(record["cpu_dest"])
    assert n_jpeg + n_cpu == 4 and record["pixel_values"].dtype == torch.uint8
    assert sorted(record["jpeg_dest"].tolist() + record["cpu_dest"].tolist()) == [0, 1, 2, 3]
    offsets = record["jpeg_offsets"].tolist()
    spec = stream.spec
    need = int(np.ceil(16 * np.sqrt(4 / 3 / 0.4)))
    for k in range(n_jpeg):
        data = record["jpeg_bytes"][offsets[k]:offsets[k + 1]].numpy().tobytes()
        url, key = record["jpeg_names"][k].rsplit(":", 1)
        with Image.open(io.BytesIO(data)) as img:
            assert img.format == "JPEG" and img.mode == "RGB" and not img.info.get("progressive")
            full = img.size
            img.draft("RGB", (need, need))
            rng = random.Random(stable_seed("crop", spec.seed, spec.epoch, shard_name(url), key))
            want = scaled_box(crop_box(*img.size, spec.crop_scale, rng), round(full[0] / img.size[0]), full)
        x, y, w, h = record["jpeg_boxes"][k].tolist()
        assert (x, y, w, h) == want
        assert 0 <= x and 0 <= y and w >= 1 and h >= 1 and x + w <= full[0] and y + h <= full[1]


def test_workers_take_apart_the_jpegs_whose_crop_fits_a_coarser_scale(tmp_path, tok):
    """With ``gpu_decode_scaled``, a JPEG whose box keeps 0.9 of the input side at half size or less
    leaves its worker taken apart for the DCT-domain decoder, its box moved to that scale's
    pixels; the others go to nvJPEG with their full-size box; every row once."""
    from infclip.pipeline.data.dct_decode import _H, _K, _W, DctBatch, scaled_size
    from infclip.pipeline.data.jpeg_boxes import scaled_box

    url = _mixed_shards(tmp_path / "mixed", n=24, per_shard=24)
    scaled, whole = ((r for r in _loader(url, tok, "gpu", workers=0, scaled=on).dataloader.dataset if "input_ids" in r)
                     for on in (True, False))
    seen = 0
    for a, b in zip(scaled, whole):
        assert torch.equal(a["input_ids"], b["input_ids"])
        if "jpeg_dest" not in b:  # every image decoded in the worker
            assert "jpeg_dest" not in a
            continue
        rows = a["jpeg_dest"].tolist() + a["cpu_dest"].tolist() + (a["dct_dest"].tolist() if "dct" in a else [])
        assert sorted(rows) == [0, 1, 2, 3]
        if "dct" not in a:
            continue
        full = dict(zip(b["jpeg_dest"].tolist(), zip(b["jpeg_boxes"].tolist(), b["jpeg_sizes"].tolist())))
        dct = DctBatch.from_dict(a["dct"])
        for row, box, (k, w, h) in zip(a["dct_dest"].tolist(), a["dct_boxes"].tolist(), dct.desc[:, [int(c) for c in (_K, _W, _H)]].tolist()):
            fbox, (W, H) = full[row]
            assert k in (1, 2, 4) and (w, h) == scaled_size(W, H, k)
            assert min(fbox[2:]) >= 0.9 * 16 * 8 // k
            assert tuple(box) == scaled_box(fbox, k / 8, (w, h))
            seen += 1
    assert seen >= 2


def test_gpu_path_resumes_exactly(tmp_path, tok):
    url = _mixed_shards(tmp_path / "mixed")
    whole = _loader(url, tok, "gpu", share=0.6, scaled=True)
    batches = list(whole)
    first = _loader(url, tok, "gpu", share=0.6, scaled=True)
    it = iter(first)
    head = [next(it) for _ in range(2)]
    position = first.position()
    it.close()
    rest = list(_loader(url, tok, "gpu", share=0.6, scaled=True, start_batch=2, position=position))
    assert len(head) + len(rest) == len(batches)
    for a, b in zip(head + rest, batches):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["pixel_values"], b["pixel_values"])


def _truncated_jpeg_shard(out) -> str:
    """Eight good JPEGs and one whose header is whole but whose body is cut short."""
    samples = [(_encoded(_picture(i, (40, 40)), "baseline"), f"good {i}", None) for i in range(8)]
    broken = _encoded(_picture(9, (40, 40)), "baseline")
    samples.insert(3, (broken[:len(broken) // 3], "broken", None))
    return brace_url(write_shards(samples, out, samples_per_shard=9, image_format="jpg"))


def test_a_jpeg_body_nobody_can_decode_is_counted_and_the_batch_keeps_its_size(tmp_path, tok):
    """The CPU path skips it (bad_image) while decoding; the GPU path finds it only when decoding
    the batch: counted as bad_image too, its row takes the batch's first good sample."""
    url = _truncated_jpeg_shard(tmp_path / "broken")
    cfg = dict(workers=0)
    cpu = _loader(url, tok, "cpu", **cfg)
    gpu = _loader(url, tok, "gpu", **cfg)
    got_cpu, got_gpu = list(cpu), list(gpu)
    assert cpu.skipped_by_reason == {"bad_image": 1}
    assert gpu.skipped_by_reason == {"bad_image": 1}
    assert all(b["pixel_values"].shape[0] == 4 for b in got_gpu) and len(got_gpu) == 2 == len(got_cpu)
    assert sum(int(b["num_skipped"]) for b in got_gpu) == 1


def _size_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "infclip.pipeline.data.gpu_decode" and "training JPEGs average" in r.getMessage()]


def test_jpegs_far_larger_than_the_input_get_one_warning_naming_the_shards_to_make(tmp_path, tok, caplog):
    """The stage judges the JPEGs' size once, after its first batches: here 29 x 47 to 64 x 64
    pixels against a 16 x 16 input (well above 3 times), so one warning, with the side to store
    them at."""
    url = _mixed_shards(tmp_path / "mixed", n=60, per_shard=12)
    caplog.set_level(logging.WARNING, logger="infclip.pipeline.data.gpu_decode")
    assert len(list(_loader(url, tok, "gpu"))) == 15
    (message,) = _size_warnings(caplog)
    assert "times the model's 16 x 16 input" in message and "--resize 18" in message


def test_the_size_warning_waits_for_its_batches_and_spares_jpegs_near_the_input(caplog):
    from infclip.pipeline.data import gpu_decode

    caplog.set_level(logging.WARNING, logger="infclip.pipeline.data.gpu_decode")
    near = gpu_decode.DecodeStage(torch.device("cpu"), torch.float32, CLIP_MEAN, CLIP_STD)
    for _ in range(2 * gpu_decode.LARGE_AFTER_BATCHES):
        near._note_sizes(torch.tensor([[256, 256], [224, 340]]), 224)  # 1.5 times a 224 x 224 input
    assert _size_warnings(caplog) == []
    large = gpu_decode.DecodeStage(torch.device("cpu"), torch.float32, CLIP_MEAN, CLIP_STD)
    for _ in range(gpu_decode.LARGE_AFTER_BATCHES - 1):
        large._note_sizes(torch.tensor([[512, 512], [512, 384]]), 224)  # 4.6 times
    assert _size_warnings(caplog) == []  # not judged before its batches
    for _ in range(3):
        large._note_sizes(torch.tensor([[512, 512]]), 224)
    (message,) = _size_warnings(caplog)
    assert "4.6 times the model's 224 x 224 input" in message and "--image_size 256" in message
    assert "make_shards.py --shards URL --resize 256" in message  # the copy of the shards the user has


def test_decode_setting_is_checked():
    with pytest.raises(ConfigError, match="'decode'"):
        DataConfig(train_shards="x.tar", decode="nvjpeg")
    cfg = DataConfig(train_shards="x.tar", decode="gpu")
    from infclip.pipeline.data.build import decode_on_gpu

    with pytest.raises(ConfigError, match="needs a training device"):
        decode_on_gpu(cfg, None)
    assert decode_on_gpu(DataConfig(train_shards="x.tar"), torch.device("cpu")) is False  # auto on the CPU
    with pytest.raises(ConfigError, match="'gpu_decoder' must be"):
        DataConfig(train_shards="x.tar", gpu_decoder="dali")
    for decoder in ("auto", "nvjpeg", "nvjpeg_hardware", "torchvision"):
        assert DataConfig(train_shards="x.tar", gpu_decoder=decoder).gpu_decoder == decoder
    for lanes, why in ((0, "must be >= 1"), (9, "must be <= 8")):
        with pytest.raises(ConfigError, match=f"'gpu_decode_lanes' {why}"):
            DataConfig(train_shards="x.tar", gpu_decode_lanes=lanes)
    with pytest.raises(ConfigError, match="'gpu_decode_lanes' must be an integer"):
        DataConfig.from_dict({"train_shards": "x.tar", "gpu_decode_lanes": 1.5}, "run.json")
    assert DataConfig(train_shards="x.tar").gpu_decode_lanes == 1
    assert DataConfig(train_shards="x.tar").gpu_decode_priority == "high"
    assert DataConfig(train_shards="x.tar", gpu_decode_priority="normal").gpu_decode_priority == "normal"
    with pytest.raises(ConfigError, match="'gpu_decode_priority' must be \"high\" or \"normal\", got 'low'"):
        DataConfig(train_shards="x.tar", gpu_decode_priority="low")
    assert DataConfig(train_shards="x.tar").gpu_decode_host_copy == "plane"
    with pytest.raises(ConfigError, match="'gpu_decode_host_copy' must be \"plane\" or \"batch\", got 'image'"):
        DataConfig(train_shards="x.tar", gpu_decode_host_copy="image")
    assert DataConfig(train_shards="x.tar").gpu_decode_host_share == 1.0
    for share in (0.0, 1.5):
        with pytest.raises(ConfigError, match=f"'gpu_decode_host_share' must be in \\(0, 1\\], got {share}"):
            DataConfig(train_shards="x.tar", gpu_decode_host_share=share)
    assert DataConfig(train_shards="x.tar").gpu_decode_engine_share == 0.0
    for share in (-0.1, 1.0):
        with pytest.raises(ConfigError, match=f"'gpu_decode_engine_share' must be in \\[0, 1\\), got {share}"):
            DataConfig(train_shards="x.tar", gpu_decode_engine_share=share)


def test_gpu_decode_on_a_cpu_run_needs_tritons_interpreter(monkeypatch):
    """Off a GPU the GPU path's crop kernel runs only in Triton's interpreter: without it "gpu" is
    refused in one line before any worker starts, instead of failing inside the first batch."""
    from infclip.pipeline.data.build import decode_on_gpu

    cfg = DataConfig(train_shards="x.tar", decode="gpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1.*use \"auto\" or \"cpu\""):
        decode_on_gpu(cfg, torch.device("cpu"))
    assert decode_on_gpu(DataConfig(train_shards="x.tar", decode="cpu"), torch.device("cpu")) is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert decode_on_gpu(cfg, torch.device("cpu")) is True


def test_an_error_in_the_stage_ends_the_loader_workers_while_its_traceback_lives(tmp_path, tok):
    """The workers ignore the stop signals, so multiprocessing's terminate() at exit cannot end
    them: an error raised through the loader must end them itself, though the traceback (which
    keeps the loader's frames) is still held, or the interpreter's exit waits on them for ever."""
    import multiprocessing

    url = _mixed_shards(tmp_path / "s", n=48)
    loader = _loader(url, tok, "gpu", workers=2)
    stage, calls = loader.stage, []

    def failing(batch, lane=0):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the second batch fails")
        return stage(batch, lane)

    loader.stage = failing
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="the second batch fails") as info:
        for _ in loader:
            assert len(set(multiprocessing.active_children()) - before) == 2  # the workers run meanwhile
    assert info.tb is not None  # the traceback, and the frames it keeps, are alive here
    assert not set(multiprocessing.active_children()) - before


def test_the_direct_decoders_backend_and_output_are_checked():
    from infclip.pipeline.data.nvjpeg import NvJpeg

    with pytest.raises(ValueError, match=r"backend must be one of \['gpu', 'gpu_device', 'hardware', 'hardware_device', 'hybrid'\], got 'dali'"):
        NvJpeg(None, "dali")
    with pytest.raises(ValueError, match=r"output must be one of \['rgb', 'rgbi', 'yuv'\], got 'bgr'"):
        NvJpeg(None, "gpu", "bgr")


def test_the_direct_decoders_batch_arrays_match_nvjpegs_structures():
    """The addresses, lengths and nvjpegImage_t rows built with arrays equal, byte for byte, what
    ctypes lays out for the same images one structure at a time (uneven sizes, addresses above
    2^32)."""
    import ctypes

    from infclip.pipeline.data.nvjpeg import _Image, batch_descriptors

    rng = np.random.default_rng(3)
    n = 37
    sizes = torch.from_numpy(rng.integers(1, 700, size=(n, 2)))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(rng.integers(100, 30000, size=n))]))
    W, plane = sizes[:, 0], sizes[:, 0] * sizes[:, 1]
    starts = torch.cumsum(3 * plane, 0) - 3 * plane
    host, base = 0x7F12_3456_0000, 0x7E00_0000_0000 + 512
    pointers, lengths, images = batch_descriptors(host, offsets, W, plane, starts, base)
    want = (_Image * n)()
    for k in range(n):
        for c in range(3):
            want[k].channel[c] = base + int(starts[k]) + c * int(plane[k])
            want[k].pitch[c] = int(W[k])
    assert images.tobytes() == bytes(want)
    _, _, one_plane = batch_descriptors(host, offsets, W, plane, starts, base, interleaved=True)
    want = (_Image * n)()  # interleaved pixels: one plane an image, three bytes a pixel
    for k in range(n):
        want[k].channel[0], want[k].pitch[0] = base + int(starts[k]), 3 * int(W[k])
    assert one_plane.tobytes() == bytes(want)
    offs = offsets.tolist()
    assert pointers.tobytes() == bytes((ctypes.c_void_p * n)(*[host + o for o in offs[:-1]]))
    assert lengths.tobytes() == bytes((ctypes.c_size_t * n)(*[b - a for a, b in zip(offs[:-1], offs[1:])]))


def test_the_direct_decoder_says_why_it_cannot_load():
    from infclip.pipeline.data.nvjpeg import load_decoder

    decoder, why = load_decoder()
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the GPU tests load it")
    assert decoder is None and why == "no CUDA device"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["point", "band"])
def test_compiled_crop_kernels_equal_the_float_reference(kernel, monkeypatch):
    """Both crop kernels compiled on the GPU (what the interpreter's tests cannot reach): downscales
    of 256- to 700-px images and upscales of small ones, boxes at the edges, planar and interleaved
    images in one buffer, fp32 and bf16 outputs; within one level of the float reference."""
    from infclip.pipeline.data.image_ops import resized_crop_normalize_flat

    monkeypatch.setattr(image_ops, "KERNEL", kernel)
    g = torch.Generator().manual_seed(3)
    shapes = [(256, 341), (512, 683), (700, 467), (97, 130), (40, 31), (224, 224)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in shapes]
    boxes = torch.tensor([(0, 0, 341, 256), (30, 20, 600, 470), (5, 100, 460, 590), (10, 0, 87, 97), (0, 3, 31, 20),
                          (1, 1, 222, 223)])
    sizes = torch.tensor([(w, h) for h, w in shapes])
    dest = torch.tensor([5, 0, 3, 1, 4, 2])
    mixed = torch.tensor([False, True, False, True, False, False])
    flat = torch.cat([(im.permute(1, 2, 0) if m else im).flatten() for im, m in zip(images, mixed.tolist())]).cuda()
    numel = torch.tensor([im.numel() for im in images])
    ref = resized_crop_normalize_reference(images, boxes.tolist(), 224, CLIP_MEAN, CLIP_STD)
    for dtype, bound in ((torch.float32, LEVEL * 1.001), (torch.bfloat16, LEVEL * 1.001 + 0.02)):
        out = torch.zeros(6, 3, 224, 224, dtype=dtype, device="cuda")
        resized_crop_normalize_flat(flat, torch.cumsum(numel, 0) - numel, sizes, boxes, out, dest, CLIP_MEAN, CLIP_STD,
                                    interleaved=mixed)
        diff = (out[dest.cuda()].float().cpu() - ref).abs()
        assert diff.max() <= bound, (dtype, diff.max())
        if dtype == torch.float32:
            assert (diff > 1e-5).float().mean() < 0.01


@pytest.mark.gpu
def test_nvjpeg_path_matches_the_cpu_path_on_the_gpu(tmp_path, tok):
    """nvJPEG (batched; the baseline colour JPEGs, the rest decoded by the workers) + the kernel against PIL + the
    CPU crop on the same boxes: the decoders' IDCT and chroma upsampling differ by a few levels."""
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    cpu, gpu = _loader(url, tok, "cpu", device="cuda"), _loader(url, tok, "gpu", device="cuda")
    diffs = []
    for a, b in zip(cpu, gpu):
        assert torch.equal(a["input_ids"].cpu(), b["input_ids"].cpu())
        assert b["pixel_values"].is_cuda
        diffs.append((_levels(a["pixel_values"]) - _levels(b["pixel_values"])).abs().flatten())
    d = torch.cat(diffs)
    assert d.mean() < 1.5 and torch.quantile(d, 0.999) <= 12, (d.mean(), d.max())
    assert gpu.stage.fallbacks == {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}


@pytest.mark.gpu
def test_dct_path_matches_the_cpu_path_on_the_gpu(tmp_path, tok):
    """data.gpu_decode_scaled on CUDA: the JPEGs whose crop fits half their size decoded by the
    DCT-domain kernels, the rest by nvJPEG, against PIL (its own scaled decode) and the CPU crop on
    the same boxes."""
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    cpu, gpu = _loader(url, tok, "cpu", device="cuda"), _loader(url, tok, "gpu", device="cuda", scaled=True)
    diffs = []
    for a, b in zip(cpu, gpu):
        assert torch.equal(a["input_ids"].cpu(), b["input_ids"].cpu())
        diffs.append((_levels(a["pixel_values"]) - _levels(b["pixel_values"])).abs().flatten())
    d = torch.cat(diffs)
    assert d.mean() < 1.5 and torch.quantile(d, 0.999) <= 12, (d.mean(), d.max())


@pytest.mark.gpu
def test_direct_nvjpeg_call_gives_torchvisions_batches(tmp_path, tok):
    """data.gpu_decoder "nvjpeg_hardware" (ctypes, the JPEG engines, one buffer) and "torchvision": the
    same library and backend decode, so the batches are equal, pixel for pixel."""
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    direct = _loader(url, tok, "gpu", device="cuda", decoder="nvjpeg_hardware")
    tv = _loader(url, tok, "gpu", device="cuda", decoder="torchvision")
    got = list(zip(direct, tv))
    assert direct.stage.nvjpeg is not None and tv.stage.nvjpeg is None and len(got) == 12
    for a, b in got:
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert torch.equal(a["pixel_values"], b["pixel_values"])
    assert direct.stage.fallbacks == {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}


@pytest.mark.gpu
def test_the_engines_reading_device_memory_decode_as_from_host_memory():
    """nvJPEG's hardware backend reading the files from device memory (the batch copied there at
    once) decodes what it decodes from pinned host memory, pixel for pixel, into the same layout."""
    from infclip.pipeline.data.gpu_decode import pack_jpegs
    from infclip.pipeline.data.nvjpeg import load_decoder

    host, why = load_decoder("hardware")
    device, _ = load_decoder("hardware_device")
    if host is None or not host.hardware:
        pytest.skip(f"no JPEG engines here ({why or 'nvJPEG falls back to its default backend'})")
    assert device.hardware and device.device_input and not host.device_input
    sizes = [(40, 30), (64, 64), (97, 33), (33, 120)] * 3
    files = [_encoded(_picture(i, size), "baseline") for i, size in enumerate(sizes)]
    data, offsets = pack_jpegs(files)
    wh = torch.tensor(sizes, dtype=torch.int64)
    stream = torch.cuda.Stream()
    (a, starts_a), (b, starts_b) = (d.decode(data, offsets, wh, stream) for d in (host, device))
    stream.synchronize()
    assert torch.equal(starts_a, starts_b) and torch.equal(a, b) and a.float().std() > 10


@pytest.mark.gpu
@pytest.mark.parametrize("host_pixels,lanes,interleaved,host_share",
                         [(1300, 2, False, 1.0), (10**6, 3, False, 1.0), (1300, 2, True, 1.0), (10**6, 2, False, 0.5)])
def test_host_decode_gives_the_gpu_backends_batches(tmp_path, tok, host_pixels, lanes, interleaved, host_share):
    """data.gpu_decode_host_max_pixels: the batch's small JPEGs (some of them, interleaved with
    larger ones; or all; or, with a host share, a part of them) decoded on the host (nvJPEG's
    hybrid backend), as planes or as interleaved pixels, into the same buffer as the rest: the
    same samples in the same rows, pixels within a few levels of the GPU backend's (the backends'
    IDCTs round apart)."""
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    gpu = _loader(url, tok, "gpu", device="cuda", decoder="nvjpeg")
    split = _loader(url, tok, "gpu", device="cuda", decoder="nvjpeg", host_pixels=host_pixels, lanes=lanes,
                    interleaved=interleaved, host_share=host_share)
    got = list(zip(gpu, split))
    assert len(got) == 12 and split.stage.host_max_pixels == host_pixels and split.stage.host_share == host_share
    assert all(lane.host is not None for lane in split.stage._lanes) and len(split.stage._lanes) == lanes
    d = torch.cat([(_levels(a["pixel_values"]) - _levels(b["pixel_values"])).abs().flatten() for a, b in got])
    for a, b in got:
        assert torch.equal(a["input_ids"], b["input_ids"])
    assert d.mean() < 0.5 and d.max() <= 4, (d.mean(), d.max())
    assert split.stage.fallbacks == {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}
    assert {lane.host.output for lane in split.stage._lanes} == {"rgbi" if interleaved else "rgb"}


@pytest.mark.gpu
@pytest.mark.parametrize("engine_share,host_pixels,lanes", [(0.5, 0, 2), (0.75, 1300, 3)])
def test_engine_share_gives_the_gpu_backends_batches(tmp_path, tok, engine_share, host_pixels, lanes):
    """data.gpu_decode_engine_share: a share of each batch decoded by the JPEG engines on a second
    stream (alone beside the GPU backend, or with the host taking the small JPEGs too), into the
    same buffer as the rest: the same samples in the same rows, pixels within a few levels of the
    GPU backend's alone."""
    from infclip.pipeline.data.nvjpeg import load_decoder

    probe, why = load_decoder("hardware")
    if probe is None or not probe.hardware:
        pytest.skip(f"no JPEG engines here ({why or 'nvJPEG falls back to its default backend'})")
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    gpu = _loader(url, tok, "gpu", device="cuda", decoder="nvjpeg")
    split = _loader(url, tok, "gpu", device="cuda", decoder="nvjpeg", engine_share=engine_share,
                    host_pixels=host_pixels, lanes=lanes)
    got = list(zip(gpu, split))
    assert len(got) == 12 and split.stage.engine_share == engine_share
    assert all(lane.engines is not None and lane.engines.hardware for lane in split.stage._lanes)
    assert len({id(lane.engines) for lane in split.stage._lanes}) == lanes  # a handle a lane
    d = torch.cat([(_levels(a["pixel_values"]) - _levels(b["pixel_values"])).abs().flatten() for a, b in got])
    for a, b in got:
        assert torch.equal(a["input_ids"], b["input_ids"])
    assert d.mean() < 0.5 and d.max() <= 4, (d.mean(), d.max())
    assert split.stage.fallbacks == {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}


@pytest.mark.gpu
@pytest.mark.parametrize("host_pixels,interleaved", [(1300, False), (10**6, True)])
def test_host_decode_copied_once_a_batch_gives_the_same_batches(tmp_path, tok, host_pixels, interleaved):
    """data.gpu_decode_host_copy "batch": the host-decoded JPEGs written to pinned memory and moved
    by one copy give the batches the decoder's own plane copies give, bit for bit (some JPEGs of a
    batch on the host, or all)."""
    url = _mixed_shards(tmp_path / "mixed", n=48, per_shard=12)
    kw = dict(device="cuda", decoder="nvjpeg", host_pixels=host_pixels, lanes=2, interleaved=interleaved)
    planes, batched = _loader(url, tok, "gpu", **kw), _loader(url, tok, "gpu", host_copy="batch", **kw)
    got = list(zip(planes, batched))
    assert len(got) == 12 and batched.stage.host_copy == "batch"
    for a, b in got:
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert torch.equal(a["pixel_values"], b["pixel_values"])
    assert batched.stage.fallbacks == {"cpu_decode": 0, "bad_image": 0, "batch_retry": 0}


@pytest.mark.gpu
def test_nvjpeg_path_counts_a_body_it_cannot_decode(tmp_path, tok):
    url = _truncated_jpeg_shard(tmp_path / "broken")
    gpu = _loader(url, tok, "gpu", device="cuda", workers=0)
    batches = list(gpu)
    assert len(batches) == 2 and all(b["pixel_values"].shape[0] == 4 for b in batches)
    # a cut body is counted once, in the skip counters and the batches alike
    # (the workers find this one: PIL cannot read its header to the end)
    assert gpu.skipped_by_reason == {"bad_image": 1} and sum(int(b["num_skipped"]) for b in batches) == 1
    assert all(torch.isfinite(b["pixel_values"].float()).all() for b in batches)


@pytest.mark.gpu
def test_the_decode_priority_sets_the_lanes_streams():
    from infclip.pipeline.data.gpu_decode import DecodeStage

    levels = {}
    for priority in ("high", "normal"):
        stage = DecodeStage(torch.device("cuda"), torch.bfloat16, CLIP_MEAN, CLIP_STD, lanes=2, priority=priority)
        levels[priority] = {lane.stream.priority for lane in stage._lanes}
    assert levels["normal"] == {0} and len(levels["high"]) == 1 and min(levels["high"]) < 0


@pytest.mark.gpu
def test_the_stage_queues_a_batch_without_waiting_for_the_gpu(tmp_path, tok):
    """With a long kernel already queued on the stage's stream, handing it a batch returns while that
    kernel still runs: no copy or call in the stage waits for the stream (a copy from pageable
    memory would, and under a training step that wait is about a step). The batch is right once
    its event has passed. The record comes straight from the dataset, unpinned."""
    url = _mixed_shards(tmp_path / "mixed", n=12, per_shard=12)
    loader = _loader(url, tok, "gpu", device="cuda", workers=0, decoder="nvjpeg")
    record = next(iter(loader.dataloader.dataset))
    assert len(record["jpeg_dest"]) and len(record["cpu_dest"])  # both kinds of rows in the batch
    reference = loader.stage(dict(record))["pixel_values"].cpu()
    stage = loader.stage
    stage._lanes[0].last = None
    with torch.cuda.stream(stage.stream):
        torch.cuda._sleep(2_000_000_000)  # a second or more of GPU time on the stage's stream
        busy = torch.cuda.Event()
        busy.record()
    out = stage(dict(record))
    still_busy = not busy.query()
    out["ready"].synchronize()
    assert still_busy, "the stage waited for work already queued on its stream"
    assert torch.equal(out["pixel_values"].cpu(), reference)


@pytest.mark.gpu
def test_the_steps_stall_on_a_batch_is_the_decode_time_left_when_the_step_gets_there():
    """A batch whose decode still runs when the step's stream reaches it: the stall measured is
    about the decode time left (a sleep kernel on the side stream); one already decoded: none."""
    from infclip.pipeline.data.gpu_decode import wait_for_batch

    side, step = torch.cuda.Stream(), torch.cuda.current_stream()
    stalls = []
    for cycles in (0, 500_000_000):  # nothing left, then ~0.25 s at 2 GHz
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            if cycles:
                torch.cuda._sleep(cycles)
            ready = torch.cuda.Event(enable_timing=True)
            ready.record()
        stall = wait_for_batch(ready, step)
        torch.cuda.synchronize()
        stalls.append((float(stall), start.elapsed_time(ready)))
    (idle, _), (waited, decode) = stalls
    assert idle < 1.0, idle
    assert decode > 50 and 0.8 * decode < waited <= decode + 1.0, (waited, decode)


def test_small_first_reorders_files_with_their_sizes_boxes_and_rows():
    from infclip.pipeline.data.gpu_decode import pack_jpegs, small_first

    files = [bytes([k]) * (3 + k) for k in range(6)]
    data, offsets = pack_jpegs(files)
    sizes = torch.tensor([[10, 10], [40, 40], [5, 5], [30, 30], [9, 11], [50, 2]])
    boxes, dest = torch.arange(24).view(6, 4), torch.tensor([7, 3, 5, 0, 1, 2])
    d, o, s, b, r, m = small_first(data, offsets, sizes, boxes, dest, 100)
    order = [0, 2, 4, 5, 1, 3]  # at most 100 pixels first, each group in its order
    assert m == 4 and o[-1] == offsets[-1]
    assert [d[o[k]:o[k + 1]].numpy().tobytes() for k in range(6)] == [files[i] for i in order]
    assert torch.equal(s, sizes[order]) and torch.equal(b, boxes[order]) and torch.equal(r, dest[order])
    ordered = small_first(d, o, s, b, r, 100)
    assert ordered[0] is d and ordered[-1] == 4  # already in order: returned as it is
    assert small_first(data, offsets, sizes, boxes, dest, 0)[-1] == 0
    # a cap on the count: the first small ones in batch order, the rest go with the large
    d, o, s, b, r, m = small_first(data, offsets, sizes, boxes, dest, 100, max_count=2)
    order = [0, 2, 1, 3, 4, 5]
    assert m == 2 and [d[o[k]:o[k + 1]].numpy().tobytes() for k in range(6)] == [files[i] for i in order]
    assert torch.equal(s, sizes[order]) and torch.equal(b, boxes[order]) and torch.equal(r, dest[order])
    assert small_first(data, offsets, sizes, boxes, dest, 10**6, max_count=0)[-1] == 0


def test_the_gpu_share_picks_the_same_samples_every_time(tmp_path, tok):
    """gpu_decode_share: which JPEGs go to the GPU is a function of (shard name, key) alone: the
    same samples at every pass, about the share asked for, none at 0."""
    url = _mixed_shards(tmp_path / "mixed", n=60, per_shard=60)

    def sent(share):
        loader = _loader(url, tok, "gpu", workers=0, share=share)
        return [names for r in loader.dataloader.dataset if "jpeg_names" in r for names in r["jpeg_names"]]

    half = sent(0.5)
    assert half == sent(0.5)
    eligible = len(sent(1.0))  # the baseline colour JPEGs: a third of the 60 samples
    assert eligible == 20 and 4 <= len(half) <= 16 and set(half) <= set(sent(1.0))
    assert sent(0.0) == []


def test_lanes_finish_batches_at_once_and_hand_them_over_in_order():
    """prefetched with three lanes: batch i goes to lane i % 3, lanes run at the same time (lane 0's
    first batch waits until lane 1 has started one), records that are not batches keep their place,
    and the consumer gets everything in the order read."""
    from infclip.pipeline.data.gpu_decode import prefetched

    started = threading.Event()
    seen = []

    def finish(record, lane):
        if record["i"] == 0:
            assert started.wait(10), "lane 1 never ran while lane 0 held its batch"
        if lane == 1:
            started.set()
        seen.append((record["i"], lane))
        time.sleep(0.001 * (record["i"] % 4))
        return {**record, "lane": lane}

    records = [{"i": i} if i % 5 else {"marker": i} for i in range(1, 30)]
    records.insert(0, {"i": 0})
    got = list(prefetched(iter(records), finish, lambda r: "i" in r, lanes=3))
    assert [r.get("i", r.get("marker")) for r in got] == list(range(30))
    batches = [r for r in got if "i" in r]
    assert [r["lane"] for r in batches] == [k % 3 for k in range(len(batches))]
    assert sorted(seen) == sorted((r["i"], r["lane"]) for r in batches)


def test_an_error_in_a_lane_reaches_the_consumer_in_its_place():
    from infclip.pipeline.data.gpu_decode import prefetched

    def finish(record, lane):
        if record["i"] == 4:
            raise ValueError("batch 4 is broken")
        return record

    got = []
    with pytest.raises(ValueError, match="batch 4 is broken"):
        for r in prefetched(iter({"i": i} for i in range(10)), finish, lambda r: True, lanes=2):
            got.append(r["i"])
    assert got == [0, 1, 2, 3]


def test_workers_started_from_a_fork_server_give_the_same_batches(tmp_path, tok, monkeypatch):
    """Once CUDA is in use the loader's workers start from a fork server (the stream is pickled to
    them, not inherited): the same batches, boxes and position as forked workers."""
    import infclip.pipeline.data.loader as loader_module

    url = _mixed_shards(tmp_path / "mixed", n=24, per_shard=6)
    forked = _loader(url, tok, "gpu")
    want = list(forked)
    monkeypatch.setattr(loader_module, "worker_start_method", lambda: "forkserver")
    served = _loader(url, tok, "gpu")
    got = list(served)
    assert served.dataloader.multiprocessing_context is not None and len(got) == len(want) == 6
    for a, b in zip(want, got):
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(a["input_ids"], b["input_ids"])
    assert forked.position() == served.position()
