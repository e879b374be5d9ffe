"""Kernel-level view of the loss op on a GPU: the fused GEMM + statistics / gradient kernels of
ops/contrastive_loss_triton.py against cuBLAS computing the same logits, per tile configuration.

For each B (D = --dim, bf16, the op's real inputs: unit rows, scale 14.3):
  cublas_logits   torch.mm of the [R, B] logit block into bf16 (what the cuBLAS band path pays
                  before its Triton passes), R = B for the statistics, R = the op's band height
                  for the gradient block;
  unfused_stats   that GEMM plus the two Triton statistics passes (what the op runs above TUNING.fused_max_logits);
  fused_stats     one _clip_stats_fused_kernel launch over the whole B x B, per tile config;
  unfused_grad    band GEMM plus _clip_grad_kernel (P in place);
  fused_grad      one _clip_grad_fused_kernel launch writing P for the band, per tile config;
  fused_*_tma     the same kernels loading by TMA tensor descriptors, persistent (Hopper; tile
                  configs with a seventh entry, programs per SM).
With --variants (CLIP, TMA): the tile configs of VARIANTS (an eighth entry: the statistics'
interior-tile fast path) over the whole B x B (statistics) and their first seven entries over the
op's backward block (_grad_block: R x C), against cublas_logits / cublas_block_logits and the
unfused paths in the same process; each variant's sums / P are checked against the first
variant's (max relative difference printed as "# check").
Each as median ms of --reps and TFLOP/s counting 2 R B D. The fastest fused configs are printed
and written to --best (JSON: {"stats": [...], "grad": [...]}, read by bench_contrastive_loss.py
--tiles).

    python bench/bench_loss_kernels.py --sizes 16384,65536 --best /tmp/tiles.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from infclip.ops.contrastive_loss import SHIFT_MARGIN  # noqa: E402
import infclip.ops.tuning as tuning_mod  # noqa: E402
from infclip.ops.tuning import TUNING  # noqa: E402

CONFIGS = [  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages
    (128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4),
    (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4), (128, 128, 32, 8, 8, 5),
]
TMA_CONFIGS = [  # ... and programs per SM
    (128, 64, 64, 8, 4, 4, 2), (128, 64, 64, 8, 4, 4, 1), (128, 128, 64, 8, 8, 4, 1),
    (128, 256, 64, 8, 8, 3, 1), (256, 128, 64, 8, 8, 3, 1), (128, 64, 64, 8, 8, 4, 2),
]


VARIANTS = [  # ... programs per SM, FAST (the statistics' interior fast path: 0 off, 1 on)
    (128, 64, 64, 8, 4, 4, 2, 0), (128, 64, 64, 8, 4, 4, 2, 1), (64, 128, 64, 8, 4, 4, 2, 1),
    (128, 128, 64, 8, 8, 4, 1, 1), (128, 64, 64, 8, 4, 3, 2, 1), (128, 64, 128, 8, 4, 2, 2, 1),
    (64, 64, 64, 8, 4, 4, 3, 1),
]


def timed(fn, reps: int) -> float:
    """Median ms of fn() over reps calls, by CUDA events (after two warm-up calls)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def timed_queued(fn, reps: int, calls: int = 20) -> float:
    """Median ms of one fn() over reps runs of ``calls`` back-to-back calls: small kernels whose
    launch costs more host time than they take on the GPU are timed behind each other."""
    return timed(lambda: [fn() for _ in range(calls)], reps) / calls


def inputs(b: int, d: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=gen), dim=-1).bfloat16()
    txt = F.normalize(img.float() + 0.5 * torch.randn(b, d, device="cuda", generator=gen), dim=-1).bfloat16()
    scale = torch.full((), 14.3, device="cuda")
    row_shift, col_shift, aux, sums = tri.clip_prologue_triton(img, txt, scale, SHIFT_MARGIN)
    return img, txt, scale, row_shift, col_shift, aux[:b], sums


def stats_pass(inputs_: tuple, fused: bool, band: int = 0) -> None:
    """The op's CLIP statistics over the whole B x B of ``inputs_`` (:func:`inputs`), into its
    sums (zeroed first): by the fused kernels, or by cuBLAS bands of ``band`` rows (0: by memory)
    and the Triton passes; the kernels' other settings as the caller left them."""
    img, txt, scale, row_shift, col_shift, ref, sums = inputs_
    _limits(1 << 62 if fused else 0)
    sums.zero_()
    tri.clip_stats_triton(img, txt, scale, row_shift, col_shift, ref, ref, 0, out=sums, band=band)


def run_size(b: int, d: int, reps: int, configs, tma_configs, emit) -> None:
    default = _limits()
    given = inputs(b, d)
    img, txt, scale, row_shift, col_shift, ref, sums = given
    band = tri.band_rows(b, b, d)
    flops = lambda rows: 2 * rows * b * d  # noqa: E731
    s_full = torch.empty(b, b, device="cuda", dtype=torch.bfloat16) if b <= 65536 else None

    def stats(fused, tiles=None, tma=False):
        TUNING.tma_force = tma
        if tiles is not None:
            setattr(TUNING, "tma_stats" if tma else "fused_stats", tiles)
        stats_pass(given, fused)

    lse = row_shift + 1.0  # any finite LSEs: the kernels' cost does not depend on them
    p_band = torch.empty(band, b, device="cuda", dtype=torch.bfloat16)
    k = torch.full((), 1e-4, device="cuda")

    def grad_block(fused, tiles=None, tma=False):
        r = lse[:band].contiguous()
        coef, s1 = k.reshape(1), scale.reshape(1)
        # (scale, coef, coef_mul, dscale src / dst, row LSE, column LSE, row ref, diag,
        # diag_value, offset, COEF_SCALE, DSCALE): the op's CLIP backward without smoothing
        args = (s1, coef, 1.0, s1, s1, r, lse, ref[:band], 0, 2.0, 0.0, True, False)
        if fused:
            TUNING.tma_force = tma
            setattr(TUNING, "tma_grad" if tma else "fused_grad", tiles)
            tri._fused(tri._clip_grad_fused_kernel, img[:band], txt, "grad", False, *args, p=p_band)
            return
        torch.mm(img[:band], txt.T, out=p_band)
        tri._clip_grad_kernel[tri._grad_grid(band, b)](
            p_band, p_band, p_band.stride(0), band, b, *args[:-2], BLOCK_M=tuning_mod.GRAD_M,
            BLOCK_N=tuning_mod.GRAD_N, num_warps=tuning_mod.GRAD_WARPS, COEF_SCALE=True, DSCALE=False)

    if s_full is not None:
        emit(b, "cublas_logits", None, timed(lambda: torch.mm(img, txt.T, out=s_full), reps), flops(b))
        del s_full
        torch.cuda.empty_cache()
    emit(b, "unfused_stats", None, timed(lambda: stats(False), reps), flops(b))
    for cfg in configs:
        emit(b, "fused_stats", cfg, _try(lambda: timed(lambda: stats(True, cfg), reps)), flops(b))
    for cfg in tma_configs:
        emit(b, "fused_stats_tma", cfg, _try(lambda: timed(lambda: stats(True, cfg, True), reps)), flops(b))
    emit(b, "cublas_band_logits", None, timed(lambda: torch.mm(img[:band], txt.T, out=p_band), reps), flops(band))
    emit(b, "unfused_grad", None, timed(lambda: grad_block(False), reps), flops(band))
    for cfg in configs:
        emit(b, "fused_grad", cfg, _try(lambda: timed(lambda: grad_block(True, cfg), reps)), flops(band))
    for cfg in tma_configs:
        emit(b, "fused_grad_tma", cfg, _try(lambda: timed(lambda: grad_block(True, cfg, True), reps)), flops(band))
    _limits(*default)
    TUNING.tma_force = None


def run_size_variants(b: int, d: int, reps: int, variants, emit) -> None:
    """The CLIP kernels' TMA variants (VARIANTS) at B = ``b``: statistics over the whole B x B,
    the gradient block over the op's backward block (R x C = _grad_block), with the cuBLAS GEMMs
    of the same logits and the unfused paths as anchors; each variant's outputs are compared with
    the first variant's."""
    default = _limits()
    saved = TUNING.tma_stats, TUNING.tma_grad
    given = inputs(b, d)
    img, txt, scale, row_shift, col_shift, ref, sums = given
    rows, cols = tri._grad_block(b, b, d, 0, img.element_size())
    flops = lambda r, c: 2 * r * c * d  # noqa: E731

    def stats(fused, tiles=None):
        TUNING.tma_force = True if fused else None
        if tiles is not None:
            TUNING.tma_stats = tiles
        stats_pass(given, fused)

    lse = row_shift + 1.0
    p = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
    k = torch.full((1,), 1e-4, device="cuda")
    s1 = scale.reshape(1)
    # (scale, coef, coef_mul, dscale src / dst, row LSE, column LSE, row ref, diag, diag_value,
    # offset, COEF_SCALE, DSCALE): the op's CLIP backward without smoothing, block (0, 0)
    args = (s1, k, 1.0, s1, s1, lse[:rows].contiguous(), lse[:cols].contiguous(), ref[:rows], 0, 2.0, 0.0,
            True, False)

    def grad(fused, tiles=None):
        if fused:
            TUNING.tma_force = True
            TUNING.tma_grad = tiles
            tri._fused(tri._clip_grad_fused_kernel, img[:rows], txt[:cols], "grad", False, *args, p=p)
            return
        torch.mm(img[:rows], txt[:cols].T, out=p)
        tri._clip_grad_kernel[tri._grad_grid(rows, cols)](
            p, p, p.stride(0), rows, cols, *args[:-2], BLOCK_M=tuning_mod.GRAD_M, BLOCK_N=tuning_mod.GRAD_N,
            num_warps=tuning_mod.GRAD_WARPS, COEF_SCALE=True, DSCALE=False)

    def check(what, cfg, got, want):
        if got is None or want is None:
            return
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        print(f"# check B={b} {what} {cfg}: max |diff| / max |first| = {err:.2e}", flush=True)

    s_full = torch.empty(b, b, device="cuda", dtype=torch.bfloat16)
    emit(b, "cublas_logits", None, timed(lambda: torch.mm(img, txt.T, out=s_full), reps), flops(b, b))
    del s_full
    torch.cuda.empty_cache()
    emit(b, "unfused_stats", None, timed(lambda: stats(False), reps), flops(b, b))
    first = None
    for cfg in variants:
        ms = _try(lambda: timed(lambda: stats(True, cfg), reps))
        emit(b, "stats_tma_v", cfg, ms, flops(b, b))
        if ms is not None:
            out = sums.clone()
            first = out if first is None else first
            check("stats", cfg, out, first)
    # (a block takes 0.1-0.3 ms: each call timed behind 9 others, else the launch's host time
    # counts, the TMA kernels' descriptors most)
    emit(b, f"cublas_block_{rows}x{cols}", None,
         timed_queued(lambda: torch.mm(img[:rows], txt[:cols].T, out=p), reps, 10), flops(rows, cols))
    emit(b, "unfused_grad_block", None, timed_queued(lambda: grad(False), reps, 10), flops(rows, cols))
    first = None
    for cfg in dict.fromkeys(v[:7] for v in variants):  # (the gradient kernel takes no FAST)
        ms = _try(lambda: timed_queued(lambda: grad(True, cfg), reps, 10))
        emit(b, "grad_tma_v", cfg, ms, flops(rows, cols))
        if ms is not None:
            out = p.clone()
            first = out if first is None else first
            check("grad", cfg, out, first)
    _limits(*default)
    TUNING.tma_force = None
    TUNING.tma_stats, TUNING.tma_grad = saved


def run_size_bands(b: int, d: int, reps: int, bands, emit) -> None:
    """The CLIP statistics over the whole B x B by cuBLAS bands of R rows (R in ``bands``) and the
    Triton passes, the band buffer in bf16 or fp32 (the GEMM's accumulator, not rounded), on one
    stream or two (TUNING.overlap), against the fused TMA kernel (the op's default) in the same process;
    small bands stay in L2 between the GEMM that writes them and the pass that reads them. Each
    variant's sums are checked against the fused kernel's."""
    default = _limits()
    saved = tri._band_buffers, tri._logits, TUNING.overlap
    given = inputs(b, d)
    sums = given[-1]

    def stats(fused, rows=0):
        stats_pass(given, fused, rows)

    def fp32_bands(on: bool) -> None:
        if not on:
            tri._band_buffers, tri._logits = saved[:2]
            return
        tri._band_buffers = lambda a, n, step, count: [
            torch.empty(step, n, device=a.device, dtype=torch.float32)
            for _ in range(2 if TUNING.overlap and count > 1 else 1)]
        tri._logits = lambda a, bm, out: torch.mm(a, bm.T, out_dtype=out.dtype, out=out)

    emit(b, "stats_fused", None, timed(lambda: stats(True), reps), 2 * b * b * d)
    want = sums.clone()
    for rows in bands:
        for dtype in ("bf16", "fp32"):
            for overlap in (False, True):
                fp32_bands(dtype == "fp32")
                TUNING.overlap = overlap
                ms = _try(lambda: timed(lambda: stats(False, rows), reps))
                emit(b, f"stats_band_{dtype}{'_2s' if overlap else ''}", (rows,), ms, 2 * b * b * d)
                err = ((sums - want).abs() / want.abs().clamp_min(1e-30)).max().item()
                print(f"# check B={b} band {rows} {dtype}: max relative diff of the sums = {err:.2e}", flush=True)
    tri._band_buffers, tri._logits, TUNING.overlap = saved
    _limits(*default)


def _siglip_grad_block(img, txt, scale, bias, k, sums, p, loss: bool, tma=None) -> None:
    """One launch of the op's SigLIP gradient kernel over img x txt^T into ``p`` (scale and bias:
    0-d or [1] device tensors; coefficient ``k``, times the scale in the kernel; ``sums`` = gsum,
    gwsum, row_loss), with the tiles the op's settings hold now; ``loss``: the pair losses too."""
    kind = "siglip_grad_loss" if loss else "siglip_grad"
    tri._fused(tri._siglip_grad_fused_kernel, img, txt, kind, False, scale.reshape(1), bias.reshape(1), k,
               *sums, 0, True, loss, p=p, tma=tma)


POINTER_SIGLIP_CONFIGS = [  # the SigLIP gradient kernel with pointer loads: spill-free tiles first
    (128, 64, 64, 8, 8, 3), (64, 64, 64, 8, 4, 3), (64, 64, 64, 8, 4, 4), (128, 128, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 3),
]


def run_size_siglip(b: int, d: int, reps: int, tma_configs, emit) -> None:
    """The SigLIP kernels with TMA descriptors, per tile config: the statistics over the whole
    B x B (and the cuBLAS band path for them) and the gradient block of one backward band
    (bias -10, scale 14.3), without and with the pair losses summed in the same pass (LOSS: the
    forward of a call whose backward will follow)."""
    default = _limits()
    img, txt, scale, *_ = inputs(b, d)
    bias = torch.full((), -10.0, device="cuda")
    band = tri.band_rows(b, b, d)
    p_band = torch.empty(band, b, device="cuda", dtype=torch.bfloat16)
    gsum, gwsum, row_loss = torch.zeros(3, band, device="cuda").unbind(0)
    k = torch.full((1,), 1e-4, device="cuda")
    _limits(1 << 62)
    TUNING.tma_force = True

    def stats(tiles):
        TUNING.tma_siglip_stats = tiles
        tri.siglip_stats_triton(img, txt, scale, bias, 0)

    def grad(tiles, loss=False):
        TUNING.tma_siglip_grad = TUNING.tma_siglip_grad_loss = tiles
        _siglip_grad_block(img[:band], txt, scale, bias, k, (gsum, gwsum, row_loss), p_band, loss)

    _limits(0)  # cuBLAS bands + the Triton pass, what the op runs above its limit
    emit(b, "siglip_unfused_stats", None, timed(lambda: tri.siglip_stats_triton(img, txt, scale, bias, 0), reps),
         2 * b * b * d)
    _limits(1 << 62)
    for cfg in tma_configs:
        emit(b, "siglip_stats_tma", cfg, _try(lambda: timed(lambda: stats(cfg), reps)), 2 * b * b * d)
    for cfg in tma_configs:
        emit(b, "siglip_grad_tma", cfg, _try(lambda: timed(lambda: grad(cfg), reps)), 2 * band * b * d)
    for cfg in tma_configs:
        emit(b, "siglip_grad_loss_tma", cfg, _try(lambda: timed(lambda: grad(cfg, True), reps)), 2 * band * b * d)
    _limits(*default)
    TUNING.tma_force = None


def run_size_siglip_pointer(b: int, d: int, reps: int, emit) -> None:
    """The SigLIP gradient kernel with pointer loads (what the op runs below TUNING.tma_min_logits and
    on GPUs without TMA) over the whole B x B, per tile config, without and with the pair losses;
    each call timed behind 19 others (timed_queued)."""
    img, txt, scale, *_ = inputs(b, d)
    bias = torch.full((1,), -10.0, device="cuda")
    p = torch.empty(b, b, device="cuda", dtype=torch.bfloat16)
    gsum, gwsum, row_loss = torch.zeros(3, b, device="cuda").unbind(0)
    k = torch.full((1,), 1e-4, device="cuda")
    saved = TUNING.fused_grad, TUNING.fused_siglip_grad_loss

    def grad(tiles, loss):
        TUNING.fused_grad = TUNING.fused_siglip_grad_loss = tiles
        _siglip_grad_block(img, txt, scale, bias, k, (gsum, gwsum, row_loss), p, loss, tma=False)

    for loss in (False, True):
        for cfg in POINTER_SIGLIP_CONFIGS:
            emit(b, "siglip_grad_loss_ptr" if loss else "siglip_grad_ptr", cfg,
                 _try(lambda: timed_queued(lambda: grad(cfg, loss), reps)), 2 * b * b * d)
    TUNING.fused_grad, TUNING.fused_siglip_grad_loss = saved


def _limits(value=None, tma=None):
    """Sets the op's fused-kernel limits (pointer and TMA kernels alike) to ``value`` (or to
    ``value`` and the dict ``tma``); returns the previous (value, dict)."""
    old = (TUNING.fused_max_logits, dict(TUNING.tma_max_logits))
    if value is not None:
        TUNING.fused_max_logits = value
        TUNING.tma_max_logits = dict(tma) if tma is not None else dict.fromkeys(TUNING.tma_max_logits, value)
    return old


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # a config that does not compile (shared memory) is skipped
        print(f"# skipped: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16384,65536")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default="bench/results/loss_kernels.jsonl")
    p.add_argument("--tma", action="store_true", help="also the TMA descriptor kernels (Hopper)")
    p.add_argument("--variants", action="store_true",
                   help="CLIP: the TMA kernels' VARIANTS (interior fast path, tiles)")
    p.add_argument("--bands", default="", help="CLIP statistics by cuBLAS bands of these row counts "
                   "(bf16 / fp32, one or two streams) against the fused kernel")
    p.add_argument("--best", default="", help="write the fastest fused configs here (JSON)")
    p.add_argument("--configs", type=int, default=len(TMA_CONFIGS), help="siglip: the first N TMA configs")
    p.add_argument("--loss", default="clip", choices=("clip", "siglip", "siglip_pointer"),
                   help="siglip: the SigLIP TMA kernels only (statistics, gradient block); "
                        "siglip_pointer: SigLIP's gradient kernel with pointer loads (small B)")
    args = p.parse_args(argv)
    import triton

    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                dim=args.dim, date=time.strftime("%Y-%m-%d"))
    rows = []

    def emit(b, what, cfg, ms, flop):
        row = dict(meta, B=b, what=what, tiles=list(cfg) if cfg else None,
                   ms=None if ms is None else round(ms, 4),
                   tflops=None if ms is None else round(flop / ms / 1e9, 1))
        rows.append(row)
        took = "skipped" if ms is None else f"{ms:8.3f} ms {row['tflops']:7.1f} TFLOP/s"
        print(f"B={b:<7} {what:<19} {str(cfg or ''):<36} {took}", flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    for b in [int(x) for x in args.sizes.split(",") if x]:
        if args.loss == "siglip":
            run_size_siglip(b, args.dim, args.reps, TMA_CONFIGS[:args.configs], emit)
        elif args.loss == "siglip_pointer":
            run_size_siglip_pointer(b, args.dim, args.reps, emit)
        elif args.bands:
            run_size_bands(b, args.dim, args.reps, [int(x) for x in args.bands.split(",")], emit)
        elif args.variants:
            run_size_variants(b, args.dim, args.reps, VARIANTS, emit)
        else:
            run_size(b, args.dim, args.reps, CONFIGS, TMA_CONFIGS if args.tma else [], emit)
    best = {}
    for what, key in (("fused_stats", "stats"), ("fused_grad", "grad"), ("fused_stats_tma", "tma_stats"),
                      ("fused_grad_tma", "tma_grad"), ("stats_tma_v", "tma_stats"), ("grad_tma_v", "tma_grad"),
                      ("siglip_stats_tma", "tma_siglip_stats"),
                      ("siglip_grad_tma", "tma_siglip_grad"), ("siglip_grad_loss_tma", "tma_siglip_grad_loss"),
                      ("siglip_grad_ptr", "siglip_grad"), ("siglip_grad_loss_ptr", "siglip_grad_loss")):
        # the config with the least total time over the sizes measured
        totals = {}
        for r in rows:
            if r["what"] == what:
                t = totals.setdefault(tuple(r["tiles"]), 0.0)
                totals[tuple(r["tiles"])] = t + (r["ms"] if r["ms"] is not None else float("inf"))
        if not totals:
            continue
        best[key] = list(min(totals, key=totals.get))
        print(f"# best {what}: {best[key]} ({totals[tuple(best[key])]:.3f} ms over the sizes)", flush=True)
    if args.best:
        with open(args.best, "w") as f:
            json.dump(best, f)


if __name__ == "__main__":
    main()
