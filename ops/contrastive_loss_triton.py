"""Host side of the Triton contrastive losses (CLIP InfoNCE and SigLIP) on cuBLAS logit bands:
the dispatch rules (which kernel takes a block), the launchers and the public entry points.

Files: the kernels are in ops/kernels_clip_fwd.py (CLIP prologue, shifts, statistics, epilogue),
ops/kernels_clip_grad.py (CLIP gradient block), ops/kernels_siglip.py (SigLIP statistics,
gradient block, finish) and ops/kernels_common.py (tile helpers, the gradients' scaling); the
knobs, tiles and memory rules' constants in ops/tuning.py (TUNING, read at each call); the
warp-specialised Hopper kernels in ops/gluon_kernels.py.

Design. The matrix work goes to cuBLAS; Triton only does what cuBLAS cannot, reading each
element of S once per direction. For a band of R rows of A (all of A when the whole R x N matrix
fits in the caller's budget) the host computes S' = A_band Bm^T with one GEMM into a buffer in
the features' dtype (bf16 logits, as autocast rounds them), then:
  forward  (_clip_stats_kernel: a row pass and a column pass / _siglip_stats_kernel): the row
           sums and the column partial sums of exp(S - shift) and exp(S - shift) (S' - ref), or
           the SigLIP pair losses, accumulated element-wise in registers and reduced once per
           program (fp32 atomics across programs).
  backward (_clip_grad_kernel / _siglip_grad_kernel): recomputes the block with one GEMM (or
           reads the kept whole matrix), writes P = coef (exp(S - r) + exp(S - c) - labels)
           (SigLIP: coef G) in the features' dtype, and two GEMMs give P @ Bm and P^T @ A_band.
           Where the whole matrix does not fit the band budget its blocks are TUNING.grad_block rows x
           columns (not full-width bands): the fp32 sums of both GEMMs then take few, long
           accumulations (_grad_bands).
  The O(B) prologue (positives, norms, shifts, the sums zeroed) and epilogue (loss terms, LSEs,
  d-scale sums) of the single-device loss are one kernel launch each (_clip_prologue_kernel,
  _clip_shift_kernel, _clip_epilogue_kernel); SigLIP's forward finishes in one launch
  (_siglip_finish_kernel) and its backward is one (_scale_grads_kernel, as is CLIP's fp16 scaling):
  no host sync anywhere, capturable in a CUDA graph. At small B the GPU time is set by the number
  of launches: SigLIP 6 a forward + backward, CLIP 8; on an H200, bf16, D = 768, behind queued
  work, 0.92x / 0.90x the compiled dense losses at B = 1,024 (1.54x / 1.02x with 15 / 11 launches).
Blocks of at most TUNING.fused_max_logits logits (16,384^2) that are not kept take fused kernels
instead: the logit tile comes from tl.dot in registers and the statistics (forward: one launch,
no band buffer) or P (backward: one launch per band, then the two cuBLAS GEMMs) are taken from
it in the same program. Fewer launches win below 32k (B = 1k-16k: 1.16-4.42 ms against
1.66-4.86 ms on an H200); above, cuBLAS's GEMM rate wins (tl.dot at K = 768 with the epilogue:
~300 TFLOP/s against ~660). On Hopper the fused kernels load by TMA tensor descriptors as
persistent programs (_use_tma: 16-bit features, aligned rows, large blocks), which makes the
fused gradient block faster than cuBLAS's GEMM plus a pass at every B, so the backward is fused
there at every size. From TUNING.strips_min_logits on, a CLIP forward whose backward folds its
coefficients (one device, nothing kept) takes only the plain sums, by column strips
(_clip_sums_strip_kernel: the column terms summed in registers down a chunk of row blocks, reduced
across warps once a chunk); its backward's gradient kernel then sums d loss / d s from the final
softmax weights (DSCALE 2): 13.6 against 16.4 ms for the statistics at 65k. On sm_90 the CLIP
gradient block goes to a warp-specialised Gluon kernel instead (ops/gluon_kernels.py, _gluon_grad:
the same P bit for bit, its epilogue beside the MMA; 0.103 against 0.116 ms for the 65k block),
and so do the strip sums (_gluon_sums: each strip's column block of B kept in shared memory;
11.3 against 13.6 ms at 65k) and the SigLIP gradient block with its pair losses (_gluon_grad with
TUNING.gluon_siglip: 0.132 against 0.163 ms for the 65k block).
FLOPs: 8 B^2 D in GEMMs (6 B^2 D when the matrix is kept from forward to backward: whole in fp32
at small B, or, within a larger ``logits_budget_mb``, as the forward's bands in the features'
dtype, read back TUNING.kept_bands_factor bands at a time by the backward). SigLIP's gradient needs no
statistic of the whole row, so a forward whose backward will follow runs the gradient pass itself, the pair losses
summed in the same epilogue (``siglip_grads_triton(with_loss=True)``): 6 B^2 D and no
statistics pass, the backward only scales the result by the incoming gradient. GEMMs run at
cuBLAS's rate or tl.dot's; the Triton kernels are
memory-bound (2-3.5 TB/s on an H200). Bands hold
<= TUNING.band_factor max(N D, 2^24) elements (the backward's P buffer over kept bands TUNING.kept_bands_factor
times that), so the extra memory stays O(B D) at any batch size.
Measured and not used: one stats kernel for both directions (per-tile reductions both ways:
0.3-0.6 TB/s; column strips with per-tile row reductions: 0.9-1.3 TB/s, 2-3% slower end to end
at B = 32k-65k than two kernels) and overlapping a band's Triton kernel with the next band's GEMM
on a second stream (no gain at B = 16k-65k: the GEMMs hold every SM; TUNING.overlap, off).
Limits: band logits are rounded to the features' dtype before the exponentials (as a dense bf16
loss does; a kept whole matrix stays fp32); B = 1k-8k is bound by the host (~1 ms a call:
Python, 5-6 Triton launches, 2-3 cuBLAS calls, two registered-op dispatches); the fp32 atomics make the last bits of the sums depend on the order in which
programs finish (not bitwise deterministic run to run).
Under TRITON_INTERPRET=1 (CPU) the kernels run exactly for fp32/fp16 (the host side does the
GEMMs in fp32 there); bf16 needs a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable, NamedTuple, Optional

import torch

from . import gluon_kernels
from .kernels_clip_fwd import (_clip_epilogue_kernel, _clip_prologue_kernel, _clip_shift_kernel,
                               _clip_stats_fused_kernel, _clip_stats_kernel, _clip_sums_strip_kernel)
from .kernels_clip_grad import _clip_grad_fused_kernel, _clip_grad_kernel
from .kernels_common import _scale_grads_kernel
from .kernels_siglip import (_fill_kernel, _siglip_finish_kernel, _siglip_grad_fused_kernel,
                             _siglip_grad_kernel, _siglip_stats_fused_kernel, _siglip_stats_kernel)
from .precision import matmul_precision
from .tuning import (COLS_M, COLS_N, GRAD_M, GRAD_N, GRAD_WARPS, INTERPRET, PRO_D, PRO_M, SHIFT_M, SHIFT_N,
                     STATS_M, STATS_N, STATS_WARPS, TUNING)

__all__ = [
    "band_rows",
    "clip_prologue_triton",
    "clip_epilogue_triton",
    "clip_stats_triton",
    "clip_grads_triton",
    "siglip_stats_triton",
    "siglip_grads_triton",
    "siglip_loss_grads_triton",
    "scale_grads_triton",
    "sums_in_strips",
    "logit_bound_limit",
]

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------
# Host side (the kernels: ops/kernels_clip_fwd.py, ops/kernels_clip_grad.py, ops/kernels_siglip.py,
# ops/kernels_common.py)
# ----------------------------------------------------------------------------------------------
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: pointer kernels only
    TensorDescriptor = None


class _GluonKernel(NamedTuple):
    """A warp-specialised Gluon kernel the launchers may hand work to: its TUNING switch, its
    tiles (a TUNING field; None there: gluon_kernels' ``default_tiles``), its launch (a
    gluon_kernels function) and the TUNING field of extra keyword arguments, if any."""

    switch: str
    tiles: str
    default_tiles: str
    launch: str
    options: str = ""

    def on(self) -> bool:
        return getattr(TUNING, self.switch) and not gluon_kernels.available()


# The Gluon kernels' switches (TUNING fields), tiles and launches (gluon_kernels' functions, looked
# up at each launch): the CLIP gradient block, the SigLIP gradient block with its pair losses, the
# CLIP forward's strip sums. A launch that fails turns its own switch off (_gluon_launch).
_GLUON = _GluonKernel("gluon_grad", "gluon_grad_tiles", "GRAD_TILES", "clip_grad_block")
_GLUON_SIGLIP = _GluonKernel("gluon_siglip", "gluon_grad_tiles", "GRAD_TILES", "siglip_grad_block")
_GLUON_SUMS = _GluonKernel("gluon_sums", "gluon_sums_tiles", "SUMS_TILES", "clip_sums",
                           "gluon_sums_options")
log = logging.getLogger(__name__)


def _tma_rows(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor's rows can be a TMA descriptor's: unit inner stride, 16-byte aligned
    base and row stride."""
    return (t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


def _use_tma(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the fused kernels load a and b by TMA descriptors."""
    if TUNING.tma_force is not None:
        return TUNING.tma_force and _tma_rows(a) and _tma_rows(b)
    if TensorDescriptor is None or not a.is_cuda or a.dtype not in (torch.bfloat16, torch.float16):
        return False
    if a.shape[0] * b.shape[0] < TUNING.tma_min_logits:
        return False
    return _capability(a.device)[0] >= 9 and _tma_rows(a) and _tma_rows(b)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple:
    """The CUDA device's compute capability (asked once per device)."""
    return torch.cuda.get_device_capability(device)


def _gluon_grad(state: _GluonKernel, a, b, p, args: tuple, checked: Optional[dict] = None,
                descriptors: Optional[dict] = None) -> bool:
    """Whether the gradient block a b^T into ``p`` went to the warp-specialised Gluon kernel of
    ``state`` (_GLUON: CLIP, _GLUON_SIGLIP; ``args``: its launch's between p and sm_count): on
    sm_90 (wgmma) with the TMA loads and a TMA-aligned P, while the state is on. A launch that fails
    (a Triton whose Gluon differs fails at its first build) turns it off, with a warning, and the
    Triton kernel takes the block. ``checked`` and ``descriptors``: dicts kept for the blocks of one
    call (views of the same tensors, so the answer depends on the block's shape only): the checks'
    answer per block shape, and the kernel's TMA descriptors per view."""
    if not state.on():
        return False
    shape = (a.shape[0], b.shape[0], p.shape[1])
    ok = checked.get(shape) if checked is not None else None
    if ok is None:
        ok = a.is_cuda and _use_tma(a, b) and _tma_rows(p) and _capability(a.device) == (9, 0)
        if checked is not None:
            checked[shape] = ok
    return ok and _gluon_launch(state, a, b, p, *args, descriptors=descriptors)


def _gluon_launch(state: _GluonKernel, *args, **kwargs) -> bool:
    """Whether gluon_kernels.``state.launch`` ran on ``args`` (then the device's SM count and the
    state's tiles, and its options if any). A launch that fails (a Triton whose Gluon differs fails
    at its first build) turns the state's TUNING switch off, with a warning, and returns False: the
    caller's Triton kernel takes the work, now and from then on."""
    tiles = getattr(TUNING, state.tiles) or getattr(gluon_kernels, state.default_tiles)
    options = getattr(TUNING, state.options) if state.options else {}
    try:
        getattr(gluon_kernels, state.launch)(*args, _sm_count(args[0].device), tiles, **kwargs,
                                             **options)
    except Exception as exc:  # noqa: BLE001 - any failure of the first build: the Triton kernel
        setattr(TUNING, state.switch, False)
        log.warning("contrastive_loss: the Gluon kernel %s failed (%s: %s); using the Triton kernel "
                    "from now on", state.launch, type(exc).__name__, str(exc)[:200])
        return False
    return True


def _use_fused(m: int, n: int, keep, kind: str = "stats", tma: bool = False) -> bool:
    """Whether an [m, n] block's statistics (kind "stats" / "siglip_stats") or gradient blocks
    ("grad") take the fused kernels (``tma``: loading by descriptors, TUNING.tma_max_logits; else
    TUNING.fused_max_logits)."""
    limit = TUNING.tma_max_logits[kind] if tma else TUNING.fused_max_logits
    return not keep and m * n <= limit



_ROUNDED_BOUND = {torch.bfloat16: 2.0**12, torch.float16: 2.0**14}
"""The largest logit bound |s| max|A| max|B| that logits rounded to 16 bits take: a logit near the
bound rounded up by half an ulp (2^-9 of it in bf16, 2^-11 in fp16) then sits at most 8 above
the shift's margin, e^(64 + 8) a term, finite in a sum of up to 2^24 terms."""


def logit_bound_limit(a: torch.Tensor, b: torch.Tensor, n: int, keep, limit: float) -> float:
    """``limit``, or less where the statistics or the gradient blocks of a x (n rows like b)^T
    take logits rounded to a's 16-bit dtype (_ROUNDED_BOUND): kept bands, or blocks above
    TUNING.fused_max_logits that do not load by TMA (cuBLAS bands). Every other path takes its logits
    from fp32 accumulators."""
    if a.dtype not in _ROUNDED_BOUND:
        return limit
    bands = keep == "bands" or (a.shape[0] * n > TUNING.fused_max_logits and not _use_tma(a, b))
    return min(limit, _ROUNDED_BOUND[a.dtype]) if bands else limit


def sums_in_strips(a: torch.Tensor, b: torch.Tensor, keep) -> bool:
    """Whether the statistics of a x b^T, asked without weighted sums, take the column-strip
    kernel (TMA loads, nothing kept, at least TUNING.strips_min_logits): a forward that does lets its
    backward sum d scale (clip_grads_triton's ``dscale_summed``); both sides ask this of the
    same tensors."""
    return (TUNING.strips and not keep and a.shape[0] * b.shape[0] >= TUNING.strips_min_logits
            and _use_tma(a, b))


@functools.lru_cache(maxsize=64)
def _strips_config(tiles, m: int, n: int, fp32: bool, allow_tf32: bool, programs: int, waves: int):
    """(grid, meta-parameters) of _clip_sums_strip_kernel (tiles: TUNING.tma_strips) over [m, n],
    with at least ``waves`` work items a program (TUNING.strip_waves)."""
    block_m, block_n, block_k, warps, stages, per_sm, chunk = tiles
    if fp32 and not INTERPRET:
        block_k, stages = min(block_k, 32), min(stages, 3)
    grid_m, grid_n = _cdiv(m, block_m), _cdiv(n, block_n)
    # chunks short enough for ``waves`` items a program (small B: down to one row block)
    chunk = max(1, min(chunk, grid_m * grid_n // (waves * per_sm * programs)))
    items = _cdiv(grid_m, chunk) * grid_n
    grid = min(items, per_sm * programs)
    return (grid,), dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, CHUNK=chunk,
                         PRECISION="tf32" if allow_tf32 or not fp32 else "ieee", PROGRAMS=grid,
                         num_warps=warps, num_stages=stages)


def _gluon_sums(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag) -> bool:
    """Whether the column-strip sums went to the warp-specialised Gluon kernel: on sm_90 with
    16-bit features of at most gluon_kernels.SUMS_MAX_DIM, while TUNING.gluon_sums is on (a first launch
    that fails turns it off, _gluon_launch, and the Triton strip kernel takes the sums)."""
    if (not _GLUON_SUMS.on() or a.dtype == torch.float32 or a.shape[1] > gluon_kernels.SUMS_MAX_DIM
            or _capability(a.device) != (9, 0)):
        return False
    return _gluon_launch(_GLUON_SUMS, a, b, scale_t, row_shift, col_shift, row_sum, col_sum, int(diag))


def _clip_sums_strips(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag, allow_tf32):
    if _gluon_sums(a, b, scale_t, row_shift, col_shift, row_sum, col_sum, diag):
        return
    (m, d), n = a.shape, b.shape[0]
    grid, meta = _strips_config(TUNING.tma_strips, m, n, a.dtype == torch.float32, allow_tf32,
                                _sm_count(a.device), TUNING.strip_waves)
    da = TensorDescriptor.from_tensor(a, [meta["BLOCK_M"], meta["BLOCK_K"]])
    db = TensorDescriptor.from_tensor(b, [meta["BLOCK_N"], meta["BLOCK_K"]])
    _clip_sums_strip_kernel[grid](da, db, m, n, d, scale_t, row_shift, col_shift, row_sum, col_sum,
                                  int(diag), **meta)

_SMS: dict = {}


def _sm_count(device: torch.device) -> int:
    """The device's multiprocessors (1 on the CPU: the interpreter runs a handful of programs)."""
    if device.type != "cuda":
        return 1
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def _programs_wanted(device: torch.device) -> int:
    """About four waves of programs on this device (a handful under the interpreter)."""
    return 4 * _sm_count(device)


_SIDE: dict = {}


def band_rows(m: int, n: int, d: int) -> int:
    """Rows per band when the whole matrix is not kept: each band buffer holds at most
    TUNING.band_factor max(n d, 2^24) elements (O(B D) memory)."""
    budget = TUNING.band_factor * max(n * d, 1 << 24)
    return min(m, max(256, budget // max(n, 1)))


def _side_stream(device) -> "torch.cuda.Stream":
    if device not in _SIDE:
        _SIDE[device] = torch.cuda.Stream(device)
    return _SIDE[device]


def _pipeline(bands, a, gemm: Callable, kernel: Callable, bufs):
    """Runs, per band (r0, r1): s = gemm(r0, r1, buf) on the current stream, then kernel(s, r0,
    r1). On CUDA with two buffers the kernel runs on a side stream, so that band i's
    memory-bound kernel overlaps band i+1's GEMM; the streams join at the end (capturable in a
    CUDA graph)."""
    if not (a.is_cuda and len(bufs) == 2 and len(bands) > 1):
        for r0, r1 in bands:
            kernel(gemm(r0, r1, bufs[0]), r0, r1)
        return
    main = torch.cuda.current_stream(a.device)
    side = _side_stream(a.device)
    side.wait_stream(main)
    freed = [None, None]  # per buffer: the event after which it may be overwritten
    for i, (r0, r1) in enumerate(bands):
        j = i % 2
        if freed[j] is not None:
            main.wait_event(freed[j])
        s = gemm(r0, r1, bufs[j])
        made = torch.cuda.Event()
        made.record(main)
        with torch.cuda.stream(side):
            side.wait_event(made)
            kernel(s, r0, r1)
            freed[j] = torch.cuda.Event()
            freed[j].record(side)
    main.wait_stream(side)


def _cdiv(x: int, y: int) -> int:
    """ceil(x / y) for ints (triton.cdiv is a constexpr function: ~1 us a call on the host)."""
    return -(-x // y)


# The tile entries after the seventh, by kind: their meta-parameters' names.
_EXTRA_META = {"stats": ("FAST",), "grad": ("SPLIT",)}


@functools.lru_cache(maxsize=256)
def _fused_config(tiles, m: int, n: int, d: int, fp32: bool, allow_tf32: bool, programs: int,
                  kind: str = "stats"):
    """(grid, meta-parameters) of a fused kernel over an [m, n] block with K = d (per shape,
    computed once). tiles: TUNING.fused_stats / TUNING.fused_grad, or with a seventh entry, programs per
    SM (TMA: persistent programs, at most ``programs`` per SM; else one program per tile); the
    entries after it are ``kind``'s _EXTRA_META."""
    block_m, block_n, block_k, group_m, warps, stages = tiles[:6]
    if fp32 and not INTERPRET:  # fp32 tiles: half the K depth, same shared memory
        block_k, stages = min(block_k, 32), min(stages, 3)
    count = _cdiv(m, block_m) * _cdiv(n, block_n)
    tma = len(tiles) > 6
    grid = (min(count, tiles[6] * programs) if tma else count,)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                EVEN_K=d % block_k == 0, PRECISION="tf32" if allow_tf32 or not fp32 else "ieee",
                TMA=tma, PROGRAMS=grid[0], num_warps=warps, num_stages=stages,
                **{name: int(v) for name, v in zip(_EXTRA_META.get(kind, ()), tiles[7:])})
    return grid, meta


def _descriptor(t: torch.Tensor, block: list, cache: Optional[dict]):
    """A TMA descriptor of ``t`` in ``block`` tiles; with ``cache`` (a dict kept for views that
    stay put meanwhile: the blocks of one backward, :class:`_BlockMemo`) one per view."""
    if cache is None:
        return TensorDescriptor.from_tensor(t, block)
    key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), *block)
    desc = cache.get(key)
    if desc is None:
        desc = cache[key] = TensorDescriptor.from_tensor(t, block)
    return desc


def _fused(kernel, a, b, kind: str, allow_tf32, *args, p=None, tma=None, descriptors=None) -> None:
    """Launches a fused kernel over all tiles of a b^T (a: [M, D], b: [N, D]); kind "stats",
    "grad", "siglip_stats", "siglip_grad" or "siglip_grad_loss" picks the tiles. ``args``
    follow (A, Bm, strides, M, N, D) and, for the gradient kernels, ``p`` (the [M, N] block P,
    then its row stride). With TMA (``tma``, or when None _use_tma(a, b)) A, Bm and an aligned P
    go as tensor descriptors (kept in ``descriptors`` when given, :func:`_descriptor`)."""
    (m, d), n = a.shape, b.shape[0]
    tma = _use_tma(a, b) if tma is None else tma
    tiles = {"stats": (TUNING.fused_stats, TUNING.tma_stats), "grad": (TUNING.fused_grad, TUNING.tma_grad),
             "siglip_stats": (TUNING.fused_stats, TUNING.tma_siglip_stats),
             "siglip_grad": (TUNING.fused_grad, TUNING.tma_siglip_grad),
             "siglip_grad_loss": (TUNING.fused_siglip_grad_loss, TUNING.tma_siglip_grad_loss)}[kind][tma]
    programs = _sm_count(a.device) if tma else 1
    grid, meta = _fused_config(tiles, m, n, d, a.dtype == torch.float32, allow_tf32, programs,
                               kind)
    if tma:
        bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
        a, b = _descriptor(a, [bm, bk], descriptors), _descriptor(b, [bn, bk], descriptors)
    if p is not None:
        store, stride_p = tma and _tma_rows(p), p.stride(0)
        if store:  # (blocks of one epilogue slice: BLOCK_N / SPLIT columns)
            p = _descriptor(p, [bm, bn // meta.get("SPLIT", 1)], descriptors)
        args = (p, stride_p, *args)
        meta = dict(meta, TMA_STORE=store)
    kernel[grid](a, b, a.stride(0) if not tma else 0, b.stride(0) if not tma else 0, m, n, d,
                 *args, **meta)


def _prep(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


_ONES: dict = {}


def _scalar(x, device) -> torch.Tensor:
    """A device fp32 one-element tensor from a tensor or a Python number (no host sync either
    way); an fp32 tensor on ``device`` is passed as it is (the kernels read one element)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.float32 and x.device == device:
            return x
        return x.detach().to(device=device, dtype=torch.float32).reshape(1)
    if x == 1.0:  # coef=None: one cached constant per device, never written
        one = _ONES.get(device)
        if one is None:
            one = _ONES[device] = torch.ones(1, device=device, dtype=torch.float32)
        return one
    return torch.full((1,), float(x), device=device, dtype=torch.float32)


def _precision(a: torch.Tensor, allow_tf32: bool):
    """matmul_precision for fp32 features; a no-op for bf16/fp16 GEMMs, which the TF32 switches
    do not touch (saves setting and restoring four global flags per band loop)."""
    return matmul_precision(allow_tf32) if a.dtype == torch.float32 else contextlib.nullcontext()


def _logits(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[M, N] = a b^T in the features' dtype (cuBLAS, fp32 accumulation; rounded once)."""
    if a.is_cuda:
        return torch.mm(a, b.T, out=out)
    return out.copy_(a.float() @ b.float().T)  # CPU (interpreter tests): fp32, rounded once


def _mm(p: torch.Tensor, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """p @ x with fp32 accumulation, returned in out_dtype."""
    if p.is_cuda:
        if out_dtype == p.dtype:
            return torch.mm(p, x)
        return torch.mm(p, x, out_dtype=out_dtype)
    return (p.float() @ x.float()).to(out_dtype)


def _mm_into(out: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> None:
    """out = p @ x with fp32 accumulation, rounded once to out's dtype (out may be a row slice)."""
    if not p.is_cuda:
        out.copy_(p.float() @ x.float())
    elif out.dtype == p.dtype:
        torch.mm(p, x, out=out)
    else:
        torch.mm(p, x, out_dtype=out.dtype, out=out)


def _addmm_(acc: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> None:
    """acc (fp32) += p @ x."""
    if p.is_cuda and p.dtype != torch.float32:
        torch.addmm(acc, p, x, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(p.float(), x.float())


@functools.lru_cache(maxsize=256)
def _row_grid(m: int, n: int, device) -> tuple[tuple[int, int], int]:
    """Row-stats grid (row blocks, column spans) and the span width (a multiple of the tile)."""
    grid_m = _cdiv(m, STATS_M)
    tiles_n = _cdiv(n, STATS_N)
    spans = max(1, min(tiles_n, _cdiv(_programs_wanted(device), grid_m)))
    cols = _cdiv(tiles_n, spans) * STATS_N
    return (grid_m, _cdiv(n, cols)), cols


@functools.lru_cache(maxsize=256)
def _col_grid(m: int, n: int, device) -> tuple[tuple[int, int], int]:
    """Column-stats grid (column strips, row spans) and the span height."""
    grid_n = _cdiv(n, COLS_N)
    tiles_m = _cdiv(m, COLS_M)
    spans = max(1, min(tiles_m, _cdiv(_programs_wanted(device), grid_n)))
    rows = _cdiv(tiles_m, spans) * COLS_M
    return (grid_n, _cdiv(m, rows)), rows


def _step(m: int, n: int, d: int, keep: bool, band: int) -> int:
    """Rows per band: all of them when the matrix is kept, else ``band`` or the memory rule."""
    if keep:
        return m
    return min(m, band) if band > 0 else band_rows(m, n, d)


def _bands(m: int, step: int):
    for r0 in range(0, m, step):
        yield r0, min(m, r0 + step)


def clip_prologue_triton(a, b, scale, margin, combine_max: Callable | None = None,
                         limit: float = float("inf"), slack: Optional[float] = None,
                         allow_tf32: bool = False):
    """The loss's O(B D) start in two launches: returns (row_shift [B], col_shift [B], aux
    [B + 2], sums [4 B]) fp32, with aux[:B] = ref (the positives' S') and sums zeroed (by the
    first launch) for :func:`clip_stats_triton` (out=) and :func:`clip_epilogue_triton`. Shifts
    as ops/blocks.clip_shifts (NaN where the bound exceeds ``limit``); with ``slack`` (one device,
    a and b all of the batch) those more than ``slack`` above their positive logit become their
    row's or column's true maximum (_clip_shift_kernel's TIGHTEN; their tl.dots' rounding differs
    from the statistics kernels' by ~D 2^-24 |S|, far below ``margin`` while |S| <= ``limit``).
    ``combine_max``: applied in place to the two largest norms ([2] fp32) between the launches (a
    sweep's max over its process group; None on one rank)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    parts = _cdiv(m, PRO_M)
    f32 = dict(device=a.device, dtype=torch.float32)
    sums = torch.empty(4 * m, **f32)
    # one allocation: aux first (an output of the registered op: storage offset 0, as its fake
    # kernel says), then the norms, the shifts and the programs' largest norms
    work = torch.empty(5 * m + 2 + 2 * parts, **f32)
    aux = work[: m + 2]
    norm_a, norm_b, row_shift, col_shift = work[m + 2:5 * m + 2].view(4, m).unbind(0)
    part_max = work[5 * m + 2:]
    _clip_prologue_kernel[(parts,)](
        a, b, a.stride(0), b.stride(0), m, d, aux, norm_a, norm_b, part_max, sums,
        BLOCK_M=PRO_M, BLOCK_D=PRO_D, num_warps=4)
    if combine_max is not None:
        part_max = combine_max(part_max.view(parts, 2).amax(0))
        parts = 1
    fp32 = a.dtype == torch.float32
    tighten = slack is not None and TUNING.shift_tighten
    block = SHIFT_M if tighten else TUNING.vec
    _clip_shift_kernel[(_cdiv(m, block),)](
        _scalar(scale, a.device), aux, norm_a, norm_b, part_max, parts, row_shift, col_shift, m,
        float(margin), float(limit), a, b, a.stride(0), b.stride(0), d,
        float(slack if tighten else 0.0), BLOCK=block, PARTS=TUNING.vec, TIGHTEN=tighten,
        BLOCK_N=SHIFT_N, BLOCK_K=SHIFT_N, PRECISION="tf32" if allow_tf32 or not fp32 else "ieee",
        num_warps=4, num_stages=1)
    return row_shift, col_shift, aux, sums


def clip_epilogue_triton(scale, sums, row_shift, col_shift, aux, count=None):
    """The loss from the complete sums in one launch: returns (loss [], row_lse [B], col_lse [B])
    with loss = the rows' and columns' terms summed / (2 count) (count: B by default; the global
    batch when these B rows are one rank's share); fills aux[B] (sum of the E[S'] - S'_ii terms)
    and aux[B + 1] (sum ref)."""
    m = row_shift.shape[0]
    f32 = dict(device=sums.device, dtype=torch.float32)
    # three buffers, not views of one: the registered op's outputs must not alias
    loss, row_lse, col_lse = torch.empty((), **f32), torch.empty(m, **f32), torch.empty(m, **f32)
    _clip_epilogue_kernel[(1,)](_scalar(scale, sums.device), sums, row_shift, col_shift, aux,
                                row_lse, col_lse, loss, m, float(count or m), BLOCK=TUNING.epi,
                                num_warps=8 if not INTERPRET else 4)
    return loss, row_lse, col_lse


def _run_stats(a, b, keep_logits, band, allow_tf32, kernel: Callable):
    """The forward's band loop: S' by GEMM, then ``kernel(s, r0, r1)``. A kept whole matrix is
    fp32 (the GEMM's accumulator, not rounded: the small-B path is as exact as fp32 logits);
    bands are in the features' dtype, and so is a matrix kept as bands (``keep_logits="bands"``).
    Returns the kept matrix or None."""
    m, d = a.shape
    n = b.shape[0]
    with _precision(a, allow_tf32):
        if keep_logits == "whole":
            s = _mm(a, b.T, torch.float32)
            kernel(s, 0, m)
            return s
        step = _step(m, n, d, False, band)
        bands = list(_bands(m, step))
        if keep_logits == "bands":  # each band's GEMM writes its rows of the kept matrix
            kept = torch.empty(m, n, device=a.device, dtype=a.dtype)
            for r0, r1 in bands:
                kernel(_logits(a[r0:r1], b, kept[r0:r1]), r0, r1)
            return kept
        _pipeline(bands, a, lambda r0, r1, buf: _logits(a[r0:r1], b, buf[: r1 - r0]), kernel,
                  _band_buffers(a, n, step, len(bands)))
    return None


def clip_stats_launch(s, scale_t, row_shift, row_ref, row_sum, row_wsum, col_shift, col_ref,
                      col_sum, col_wsum, diag: int) -> None:
    """Both directions' statistics passes over the [m, n] logits ``s`` in one launch
    (_clip_stats_kernel), adding into the row sums [m] and column sums [n]; the positives at
    i - j == diag."""
    m, n = s.shape
    (grid_m, spans_m), cols = _row_grid(m, n, s.device)
    (grid_n, spans_n), rows = _col_grid(m, n, s.device)
    _clip_stats_kernel[(grid_m * spans_m + grid_n * spans_n,)](
        s, s.stride(0), m, n, cols, rows, grid_m, grid_m * spans_m, grid_n, scale_t, row_shift,
        row_ref, row_sum, row_wsum, col_shift, col_ref, col_sum, col_wsum, diag, ROW_M=STATS_M,
        ROW_N=STATS_N, COL_M=COLS_M, COL_N=COLS_N, num_warps=STATS_WARPS)


def clip_stats_triton(a, b, scale, row_shift, col_shift, row_ref, col_ref, diag=0, *,
                      keep_logits="", band=0, allow_tf32=False, out=None, weighted=True):
    """Partial CLIP statistics of S = scale * a b^T (see ops/blocks.clip_stats).

    a: [M, D], b: [N, D]; scale: fp32 [] tensor; shifts and refs: fp32 [M] / [N]. Returns
    (row_sum, col_sum, row_wsum, col_wsum, logits): fp32 sums without the pairs i - j == diag;
    logits is the kept [M, N] matrix S' when ``keep_logits`` is "whole" (fp32) or "bands" (the
    features' dtype), else None ("").
    band: rows per GEMM band (0: by memory, :func:`band_rows`). out: fp32 buffers to add into,
    either one [2 M + 2 N] (row_sum, row_wsum, col_sum, col_wsum, in that order) or those four
    ([M], [M], [N], [N], contiguous each). ``weighted=False``: the weighted sums are not needed;
    where :func:`sums_in_strips` holds they are not taken (left as they were).
    """
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.zeros(2 * m + 2 * n, device=a.device, dtype=torch.float32)
    if isinstance(out, torch.Tensor):
        out = (out[:m], out[m:2 * m], out[2 * m:2 * m + n], out[2 * m + n:])
    row_sum, row_wsum, col_sum, col_wsum = out
    scale_t = _scalar(scale, a.device)
    shifts = [t.float().contiguous() for t in (row_shift, row_ref, col_shift, col_ref)]
    def kernel(s, r0, r1):
        clip_stats_launch(s, scale_t, shifts[0][r0:r1], shifts[1][r0:r1], row_sum[r0:r1],
                          row_wsum[r0:r1], shifts[2], shifts[3], col_sum, col_wsum, int(diag) - r0)

    if not weighted and sums_in_strips(a, b, keep_logits):
        _clip_sums_strips(a, b, scale_t, shifts[0], shifts[2], row_sum, col_sum, diag, allow_tf32)
        return row_sum, col_sum, row_wsum, col_wsum, None
    tma = _use_tma(a, b)
    if _use_fused(m, n, keep_logits, "stats", tma):
        _fused(_clip_stats_fused_kernel, a, b, "stats", allow_tf32, scale_t, shifts[0],
               shifts[1], shifts[2], shifts[3], row_sum, row_wsum, col_sum, col_wsum, int(diag),
               tma=tma)
        return row_sum, col_sum, row_wsum, col_wsum, None
    logits = _run_stats(a, b, keep_logits, band, allow_tf32, kernel)
    return row_sum, col_sum, row_wsum, col_wsum, logits


def siglip_stats_triton(a, b, scale, bias, diag=0, *, keep_logits="", band=0,
                        allow_tf32=False):
    """Per-row SigLIP pair-loss sums of the block (fp32 [M]) and the kept logits (or None)."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    row_loss = torch.zeros(m, device=a.device, dtype=torch.float32)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    def kernel(s, r0, r1):
        grid, cols = _row_grid(r1 - r0, n, a.device)
        _siglip_stats_kernel[grid](s, s.stride(0), r1 - r0, n, cols, scale_t, bias_t,
                                   row_loss[r0:r1], int(diag) - r0, BLOCK_M=STATS_M,
                                   BLOCK_N=STATS_N, num_warps=STATS_WARPS)

    tma = _use_tma(a, b)
    if _use_fused(m, n, keep_logits, "siglip_stats", tma):
        _fused(_siglip_stats_fused_kernel, a, b, "siglip_stats", allow_tf32, scale_t, bias_t,
               row_loss, int(diag), tma=tma)
        return row_loss, None
    return row_loss, _run_stats(a, b, keep_logits, band, allow_tf32, kernel)


def _grad_block(m: int, n: int, d: int, band: int, itemsize: int, width: int = 0,
                cast: bool = False) -> tuple[int, int]:
    """(rows, columns) of the backward's recompute blocks: the whole [m, n] when it fits the band
    budget (band_rows), full-width bands of ``band`` rows when a band height is forced, else the
    first of TUNING.grad_block, TUNING.grad_blocks whose block and fp32 [rows, D] sum of grad_a take no more
    than TUNING.grad_factor max(w d, 2^24) elements' bytes (below TUNING.grad_factor_min_n columns: TUNING.grad_block
    within 2 max(w d, 2^24)),
    else full-width bands of at most that many bytes; w = max(n, ``width``) from
    TUNING.grad_factor_min_n columns on (else n): a distributed sweep's column block takes the budget
    of the global batch, as disco's one step over all B columns does (below, at
    b = 8,192 of 32,768, 8,192 x 4,096 blocks were no faster than the 4,096-row bands, for 184
    against 160 MiB on an H200). (Capping the rows instead, 5,888 at 8k-16k,
    measured 1.05 / 1.00x the compiled dense loss against 0.96 / 0.99x with bands.) With ``cast``
    (grad_b's fp32 sum is cast to the features' dtype at the end) first the TUNING.grad_blocks_wide
    block whose bytes the cast's n d of the dtype covers."""
    step = _step(m, n, d, False, band)
    if step >= m:
        return m, n
    if band > 0:
        return step, n
    for block in TUNING.grad_blocks_wide if cast else ():
        rows, cols = min(m, block[0]), min(n, block[1])
        if rows < m and rows * (cols * itemsize + d * 4) <= n * d * itemsize:
            return rows, cols
    small = n < TUNING.grad_factor_min_n  # (full-width bands unless TUNING.grad_block fits)
    w = n if small else max(n, width)
    budget = int((TUNING.band_factor if small else TUNING.grad_factor) * max(w * d, 1 << 24)) * itemsize
    for block in (TUNING.grad_block,) if small else (TUNING.grad_block, *TUNING.grad_blocks):
        rows, cols = min(m, block[0]), min(n, block[1])
        if rows * (cols * itemsize + d * 4) <= budget:
            return rows, cols
    return min(step, max(256, budget // max(n * itemsize, 1))), n


class _BlockMemo:
    """What the fused launches of one backward's blocks can share, all views of the same tensors
    (a :func:`_grad_bands` call makes one and drops it with P's buffer): each row band's and
    column block's vector slices, the Gluon kernel's checks per block shape, the TMA descriptors
    per view (_gluon_grad, _fused)."""

    __slots__ = ("rows", "columns", "checked", "descriptors")

    def __init__(self) -> None:
        self.rows, self.columns, self.checked, self.descriptors = {}, {}, {}, {}


def _grad_bands(a, b, logits, band, allow_tf32, fill: Callable, fused_fill: Callable, out_dtype,
                sink_a, width: int = 0):
    """Shared block loop of the backward: per block, the scaled gradient block P, then grad_a
    rows += P @ b_block and grad_b rows += P^T @ a_band. P comes from ``fused_fill(r0, r1, c0,
    c1, p, a_band, b_block, memo)`` (one fused launch, ``memo`` the call's :class:`_BlockMemo`,
    when nothing is kept and the matrix is small enough or loads by TMA: _use_fused) or from S'
    (recomputed by cuBLAS, or the kept ``logits``) and ``fill(s, p, r0, r1, c0, c1)`` (in place,
    p is s, except for the kept logits, which stay untouched: the registered op declares no
    mutation). A kept matrix is read in full-width row bands. With ``sink_a(i0, i1, rows)`` the
    finished fp32 rows of grad_a are handed over instead; a sink that only adds them into an fp32
    [M, D] tensor names it as ``sink_a.into``, and every block's GEMM then accumulates straight
    into its rows (no band sums, no add a band). Returns (grad_a or None, grad_b).

    The views a block needs are made once per row band, column block and block shape, not per
    block: at B = 32,768 (64 blocks) each slice cost ~2.7 us of the host's ~160 us a block, where
    the GPU takes ~140-150 us (H200): made per block, they let the eager call's host pace it on
    an idle GPU."""
    a, b = _prep(a), _prep(b)
    m, d = a.shape
    n = b.shape[0]
    keep = logits is not None
    fused = _use_fused(m, n, keep, "grad", _use_tma(a, b))
    rows, cols = _grad_rows_cols(a, n, logits, band, width, out_dtype)
    grad_a = None if sink_a is not None else torch.empty(m, d, device=a.device, dtype=out_dtype)
    into = getattr(sink_a, "into", None)  # fp32 [m, d] the rows' GEMMs add into
    with _precision(a, allow_tf32):
        buf, acc_a, acc_b, grad_b = _grad_buffers(a, n, rows, cols, out_dtype, into is None)
        # (c0, c1, b's column block, grad_b's rows of it) for every column block
        columns = [(c0, c1, b[c0:c1], grad_b[c0:c1]) for c0, c1 in _bands(n, cols)]
        views: dict = {}  # block shape -> (P, P^T, acc_a's rows)
        memo = _BlockMemo()  # fused_fill's, for this call's blocks (its descriptors hold P)
        for r0, r1 in _bands(m, rows):
            a_band = a[r0:r1]
            for c0, c1, b_block, grad_b_rows in columns:
                shape = (r1 - r0, c1 - c0)
                if shape not in views:
                    p = buf[: shape[0] * shape[1]].view(shape)
                    views[shape] = (p, p.T, acc_a[: shape[0]] if acc_a is not None else None)
                p, p_t, acc_rows = views[shape]
                if keep:  # no GEMM to redo: P from the kept rows (full-width bands)
                    fill(logits[r0:r1], p, r0, r1, 0, n)
                elif fused:
                    fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo)
                else:
                    fill(_logits(a_band, b_block, p), p, r0, r1, c0, c1)
                _add_grad_a(p, b, b_block, r0, r1, c0, grad_a, acc_rows, into, sink_a)
                if acc_b is None:
                    _mm_into(grad_b_rows, p_t, a_band)
                else:
                    _addmm_(grad_b_rows, p_t, a_band)
            if acc_a is not None and sink_a is None:
                grad_a[r0:r1] = acc_a[: r1 - r0]
            elif acc_a is not None:
                sink_a(r0, r1, acc_a[: r1 - r0])
        # before the cast below: the peak holds neither (nor any view of P: the memo's descriptors)
        del buf, p, p_t, acc_rows, views, memo, acc_a
    if acc_b is None or out_dtype == torch.float32:
        return grad_a, grad_b
    return grad_a, acc_b.to(out_dtype)


def _grad_rows_cols(a, n: int, logits, band: int, width: int, out_dtype) -> tuple[int, int]:
    """(rows, columns) of the backward's blocks over a x (n rows)^T: a kept matrix in full-width
    row bands (a kept 16-bit one, the forward's bands, TUNING.kept_bands_factor of them at a time
    unless a band height is forced), else the recompute blocks of :func:`_grad_block`."""
    m, d = a.shape
    if logits is None:
        return _grad_block(m, n, d, band, a.element_size(), width, cast=out_dtype != torch.float32)
    kept_bands = logits.dtype != torch.float32  # the forward's bands, in the features' dtype
    rows = _step(m, n, d, not kept_bands, band)
    if kept_bands and band <= 0:
        rows = min(m, rows * TUNING.kept_bands_factor)
    return rows, n


def _grad_buffers(a, n: int, rows: int, cols: int, out_dtype, sums_a: bool) -> tuple:
    """(P's buffer, acc_a, acc_b, grad_b) of the block loop: fp32 sums where a result takes several
    blocks (acc_a [rows, D] over a row band's column blocks, when ``sums_a``; acc_b [n, D] over
    the row bands, then also grad_b), else None, each block writing its final rows."""
    m, d = a.shape
    dev = a.device
    buf = torch.empty(rows * cols, device=dev, dtype=a.dtype)
    acc_a = torch.empty(rows, d, device=dev, dtype=torch.float32) if cols < n and sums_a else None
    acc_b = torch.zeros(n, d, device=dev, dtype=torch.float32) if rows < m else None
    grad_b = acc_b if acc_b is not None else torch.empty(n, d, device=dev, dtype=out_dtype)
    return buf, acc_a, acc_b, grad_b


def _add_grad_a(p, b, b_block, r0: int, r1: int, c0: int, grad_a, acc_rows, into, sink_a) -> None:
    """grad_a's share of the block P (rows r0:r1, its columns from c0): added into ``into``'s rows
    (the sink's fp32 sum); where the block spans every column (no ``acc_rows``), grad_a's final
    rows, or handed to ``sink_a``; else summed into the row band's fp32 ``acc_rows``."""
    if into is not None:
        _addmm_(into[r0:r1], p, b_block)
    elif acc_rows is None and sink_a is None:
        _mm_into(grad_a[r0:r1], p, b)
    elif acc_rows is None:
        sink_a(r0, r1, _mm(p, b, torch.float32))
    elif c0 == 0:
        _mm_into(acc_rows, p, b_block)
    else:
        _addmm_(acc_rows, p, b_block)


def _band_buffers(a, n, step, count):
    """One band buffer, or two when the bands overlap on two streams (CUDA, several bands)."""
    two = TUNING.overlap and a.is_cuda and count > 1
    return [torch.empty(step, n, device=a.device, dtype=a.dtype) for _ in range(2 if two else 1)]


@functools.lru_cache(maxsize=256)
def _grad_grid(m, n):
    return (_cdiv(m, GRAD_M), _cdiv(n, GRAD_N))


def clip_grads_triton(a, b, scale, row_lse, col_lse, row_ref, *, diag=0, diag_value=0.0,
                      offset=0.0, coef=None, coef_mul=1.0, coef_scale=False, dscale_from=None,
                      dscale_index=0, dscale_summed=False, col_ref=None, dscale_out=None,
                      logits=None, band=0, out_dtype=torch.float32, allow_tf32=False,
                      sink_a=None, width=0):
    """(k P @ b, k P^T @ a) in ``out_dtype`` (see ops/blocks.clip_grads), k folded into
    P before its rounding: k = c scale if ``coef_scale`` else c, c = coef coef_mul.

    coef: None (1) or an fp32 one-element device tensor; logits: the kept [M, N] S' of the
    forward instead of a recompute (read, not written). dscale_from: an fp32 device tensor;
    then the kernel also computes c dscale_from[dscale_index] (the single-device d scale) and
    the result is (grad_a, grad_b, that fp32 [] tensor). ``dscale_summed``: that d scale is
    summed by the gradient kernel instead (the forward took no weighted sums: clip_stats_triton
    with ``weighted=False``; needs the fused kernels, :func:`sums_in_strips`): c times the
    block's share of the E[S'] - S'_ii terms of its rows and columns, added into ``dscale_out``
    (an fp32 [] tensor, then returned) when given. col_ref: the columns' positive S' ([N] fp32)
    for a block whose positives are not on its diagonal (a sweep's column block); None: row_ref,
    on a square block with its positives on the diagonal. width: the blocks' memory budget is
    that of this many columns if more than b's (_grad_block).
    """
    a, b = _prep(a), _prep(b)
    dev = a.device
    scale_t = _scalar(scale, dev)
    coef_t = _scalar(1.0 if coef is None else coef, dev)
    r, c, ref = (t.float().contiguous() for t in (row_lse, col_lse, row_ref))
    cref = ref if col_ref is None else col_ref.float().contiguous()
    if dscale_summed and (not sums_in_strips(a, b, logits is not None) or (
            col_ref is None and (diag != 0 or a.shape != b.shape))):
        raise ValueError("clip_grads_triton: dscale_summed needs the fused TMA kernels, and "
                         "col_ref unless the block is square with its positives on the diagonal")
    src, dst = _dscale_pointers(scale_t, dscale_from, dscale_index, dscale_summed, dscale_out)
    flags = dict(COEF_SCALE=bool(coef_scale),
                 DSCALE=2 if dscale_summed else int(dscale_from is not None))
    label_args = (int(diag), float(diag_value), float(offset))

    # a block of rows r0:r1 and columns c0:c1 holds the positives at local i - j == diag - r0 + c0
    def fill(s, p, r0, r1, c0, c1):
        _clip_grad_kernel[_grad_grid(r1 - r0, c1 - c0)](
            s, p, s.stride(0), r1 - r0, c1 - c0, scale_t, coef_t, float(coef_mul), src, dst,
            r[r0:r1], c[c0:c1], ref[r0:r1], label_args[0] - r0 + c0, *label_args[1:],
            BLOCK_M=GRAD_M, BLOCK_N=GRAD_N, num_warps=GRAD_WARPS, **flags)

    def fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo):
        if r0 not in memo.rows:
            memo.rows[r0] = (r[r0:r1], ref[r0:r1])
        if c0 not in memo.columns:
            memo.columns[c0] = (c[c0:c1], cref[c0:c1])
        (r_rows, ref_rows), (c_cols, ref_cols) = memo.rows[r0], memo.columns[c0]
        args = (scale_t, coef_t, float(coef_mul), src, dst, r_rows, c_cols, ref_rows, ref_cols,
                label_args[0] - r0 + c0, *label_args[1:], *flags.values())
        if not _gluon_grad(_GLUON, a_band, b_block, p, args, memo.checked, memo.descriptors):
            _fused(_clip_grad_fused_kernel, a_band, b_block, "grad", allow_tf32, *args, p=p,
                   descriptors=memo.descriptors)

    grads = _grad_bands(a, b, logits, band, allow_tf32, fill, fused_fill, out_dtype, sink_a, width)
    return grads if dscale_from is None and not dscale_summed else (*grads, dst)


def _dscale_pointers(scale_t, dscale_from, dscale_index: int, summed: bool, out) -> tuple:
    """(src, dst) of the CLIP gradient kernel's d scale: with ``summed`` (DSCALE 2) the kernel adds
    into ``out`` (a new zero fp32 [] tensor if None); with ``dscale_from`` (DSCALE 1) it writes c
    dscale_from[dscale_index] into a new fp32 [] tensor; else neither is touched."""
    f32 = dict(device=scale_t.device, dtype=torch.float32)
    if summed:
        return scale_t, torch.zeros((), **f32) if out is None else out
    if dscale_from is None:
        return scale_t, scale_t
    return dscale_from[dscale_index:], torch.empty((), **f32)


def _sums_and_coef(rows: int, m: int, coef, device) -> tuple:
    """Zeroed fp32 row sums [rows, m] for the SigLIP gradient kernels and their coefficient as a
    device tensor (coef: None for 1, a device tensor, or a Python number). A number other than 1
    is written by the launch that zeroes the sums (as its own tensor, torch.full, it would take a
    launch more)."""
    if coef is None or isinstance(coef, torch.Tensor) or coef == 1.0:
        coef_t = _scalar(1.0 if coef is None else coef, device)
        return torch.zeros(rows, m, device=device, dtype=torch.float32), coef_t
    buf = torch.empty(rows * m + 1, device=device, dtype=torch.float32)
    _fill_kernel[(_cdiv(rows * m + 1, TUNING.vec),)](buf, rows * m, float(coef), BLOCK=TUNING.vec, num_warps=4)
    return buf[: rows * m].view(rows, m), buf[rows * m:]


def _siglip_grad_pass(a, b, scale, bias, diag, coef, coef_scale, logits, band, out_dtype,
                      allow_tf32, sink_a, with_loss, width=0):
    """The gradient pass of :func:`siglip_grads_triton`: (sums, grad_a, grad_b), sums fp32
    [2, M] (row i: sum_j G_ij S'_ij, sum_j G_ij), with the pair losses of row i a third row with
    ``with_loss``. Rows of one buffer: a single reduction sums them all."""
    a, b = _prep(a), _prep(b)
    m = a.shape[0]
    sums, coef_t = _sums_and_coef(3 if with_loss else 2, m, coef, a.device)
    gwsum, gsum = sums[0], sums[1]
    row_loss = sums[2] if with_loss else gsum  # (not touched without LOSS)
    scale_t, bias_t = _scalar(scale, a.device), _scalar(bias, a.device)
    kind = "siglip_grad_loss" if with_loss else "siglip_grad"

    def fill(s, p, r0, r1, c0, c1):  # (positives as in clip_grads_triton's blocks)
        _siglip_grad_kernel[_grad_grid(r1 - r0, c1 - c0)](
            s, p, s.stride(0), r1 - r0, c1 - c0, scale_t, bias_t, coef_t, gsum[r0:r1],
            gwsum[r0:r1], row_loss[r0:r1], int(diag) - r0 + c0, BLOCK_M=GRAD_M, BLOCK_N=GRAD_N,
            num_warps=GRAD_WARPS, COEF_SCALE=bool(coef_scale), LOSS=with_loss)

    def fused_fill(r0, r1, c0, c1, p, a_band, b_block, memo):
        if r0 not in memo.rows:
            memo.rows[r0] = (gsum[r0:r1], gwsum[r0:r1], row_loss[r0:r1])
        args = (scale_t, bias_t, coef_t, *memo.rows[r0], int(diag) - r0 + c0, bool(coef_scale))
        if not (with_loss and _gluon_grad(_GLUON_SIGLIP, a_band, b_block, p, args, memo.checked,
                                          memo.descriptors)):
            _fused(_siglip_grad_fused_kernel, a_band, b_block, kind, allow_tf32, *args, with_loss,
                   p=p, descriptors=memo.descriptors)

    grads = _grad_bands(a, b, logits, band, allow_tf32, fill, fused_fill, out_dtype, sink_a, width)
    return (sums, *grads)


def siglip_grads_triton(a, b, scale, bias, diag=0, *, coef=None, coef_scale=False, logits=None,
                        band=0, out_dtype=torch.float32, allow_tf32=False, sink_a=None,
                        with_loss=False, width=0):
    """(k G @ b, k G^T @ a, sum(G), sum(G * S')): gradients in ``out_dtype``, the two sums
    fp32 [] without k (see ops/blocks.siglip_grads); k = coef (None: 1; a number or a device
    tensor), times scale if ``coef_scale`` (taken in the kernel). ``with_loss``: the same pass also
    sums the pair losses, returned first (fp32 [M], as siglip_stats_triton's). ``width``: as
    clip_grads_triton's."""
    sums, grad_a, grad_b = _siglip_grad_pass(a, b, scale, bias, diag, coef, coef_scale, logits,
                                             band, out_dtype, allow_tf32, sink_a, with_loss, width)
    pair = sums[:2].sum(1)  # (sum G S', sum G): one reduction for both
    grads = (grad_a, grad_b, pair[1], pair[0])
    return (sums[2], *grads) if with_loss else grads


def siglip_loss_grads_triton(a, b, scale, bias, count, *, coef=None, coef_scale=False, band=0,
                             out_dtype=torch.float32, allow_tf32=False):
    """The single-device SigLIP forward whose backward will follow, as :func:`siglip_grads_triton`
    with ``with_loss`` on the block's own positives, finished in one more launch: (loss = the
    pair losses' sum / count [], grad_a, grad_b, pair [2] = (sum G S', sum G)), fp32 scalars,
    each its own tensor."""
    sums, grad_a, grad_b = _siglip_grad_pass(a, b, scale, bias, 0, coef, coef_scale, None, band,
                                             out_dtype, allow_tf32, None, True)
    f32 = dict(device=sums.device, dtype=torch.float32)
    loss, pair = torch.empty((), **f32), torch.empty(2, **f32)
    _siglip_finish_kernel[(1,)](sums, sums.shape[1], pair, loss, float(count), BLOCK=TUNING.epi,
                                num_warps=8 if not INTERPRET else 4)
    return loss, grad_a, grad_b, pair


def scale_grads_triton(grad, a, b, count, *, factor=1.0, scale=None, scalars=(), out_dtype=None):
    """The backward's finish in one launch: (a k, b k, coef s_0, ...) with coef = grad / count *
    factor (fp32, IEEE division) and k = coef scale, or k = grad where ``scale`` is None (the
    coefficients already folded into a and b). a k and b k: fp32 products rounded once to
    ``out_dtype`` (default a's), new tensors; ``scalars``: up to two fp32 one-element tensors,
    each giving a new fp32 [] tensor. grad: an fp32 one-element device tensor."""
    assert a.shape == b.shape and len(scalars) <= 2
    a, b = a.contiguous(), b.contiguous()
    dev = a.device
    grad = _scalar(grad, dev)
    out_a = torch.empty(a.shape, device=dev, dtype=out_dtype or a.dtype)
    out_b = torch.empty(b.shape, device=dev, dtype=out_dtype or a.dtype)
    dst = [torch.empty((), device=dev, dtype=torch.float32) for _ in scalars]
    unused = [grad] * (2 - len(scalars))  # pointers the kernel neither reads nor writes
    _scale_grads_kernel[(_cdiv(a.numel(), TUNING.vec), 2)](
        grad, a, b, out_a, out_b, a.numel(), float(count), float(factor),
        grad if scale is None else _scalar(scale, dev), *scalars, *unused, *dst, *unused,
        FOLDED=scale is None, SCALARS=len(scalars), BLOCK=TUNING.vec, num_warps=4)
    return (out_a, out_b, *dst)
