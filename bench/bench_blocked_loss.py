"""Row bands against two-dimensional blocks for the CLIP op's large-B passes (one GPU, bf16).

The op's forward above 32k runs, per row band of the B x B logits (R = band_rows rows, all B
columns: ~200 MB at B = 65,536), cuBLAS's GEMM into a bf16 buffer and two Triton passes (row and
column sums) that read it back from HBM; its backward writes the gradient block P band by band
and accumulates dT += P^T I_band in fp32, re-reading and re-writing the whole [B, D] fp32 sum once
per band. This measures the same work over R x C blocks: a block small enough to stay in L2
between the GEMM that writes it and the passes (or GEMMs) that read it, and fewer passes over
the fp32 sums (dT once per row band of R rows, dI once per column block).

For each B: the op's forward statistics and backward gradient pass as they run now, then the
blocked versions for each (R, C), each checked against the op's results; median ms of --reps.

    python bench/bench_blocked_loss.py --sizes 32768,65536
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
from bench_loss_kernels import inputs, timed  # noqa: E402  (bench/, on sys.path as the script's folder)

FORWARD_BLOCKS = [(2048, 4096), (4096, 4096), (2048, 8192), (4096, 8192), (8192, 8192), (4096, 16384)]
BACKWARD_BLOCKS = [(4096, 8192), (8192, 8192), (6144, 8192), (12288, 8192), (16384, 4096), (2048, 16384),
                   (4096, 16384)]


def _view(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return buf[: rows * cols].view(rows, cols)


def _blocks(n: int, rows: int, cols: int):
    """(r0, r1, c0, c1) of the rows x cols blocks of an [n, n] matrix, row band by row band."""
    for r0, r1 in tri._bands(n, rows):
        for c0, c1 in tri._bands(n, cols):
            yield r0, r1, c0, c1


def blocked_stats(img, txt, scale, shifts, sums, rows: int, cols: int, buf) -> None:
    """The forward statistics of the op (clip_stats_triton's sums) over rows x cols blocks:
    cuBLAS's GEMM into ``buf`` then the op's statistics launch (both passes) on the block."""
    n = img.shape[0]
    row_shift, row_ref, col_shift, col_ref = shifts
    row_sum, row_wsum, col_sum, col_wsum = sums.view(4, n).unbind(0)
    for r0, r1, c0, c1 in _blocks(n, rows, cols):
        m, k = r1 - r0, c1 - c0
        s = torch.mm(img[r0:r1], txt[c0:c1].T, out=_view(buf, m, k))
        tri.clip_stats_launch(s, scale, row_shift[r0:r1], row_ref[r0:r1], row_sum[r0:r1],
                              row_wsum[r0:r1], col_shift[c0:c1], col_ref[c0:c1], col_sum[c0:c1],
                              col_wsum[c0:c1], c0 - r0)


def blocked_fused_stats(img, txt, scale, shifts, sums, rows: int, cols: int) -> None:
    """The same over blocks, each one fused TMA statistics launch (the op's kernel below 32k)."""
    n = img.shape[0]
    row_shift, row_ref, col_shift, col_ref = shifts
    row_sum, row_wsum, col_sum, col_wsum = sums.view(4, n).unbind(0)
    for r0, r1, c0, c1 in _blocks(n, rows, cols):
        tri._fused(tri._clip_stats_fused_kernel, img[r0:r1], txt[c0:c1], "stats", False,
                   scale, row_shift[r0:r1], row_ref[r0:r1], col_shift[c0:c1], col_ref[c0:c1],
                   row_sum[r0:r1], row_wsum[r0:r1], col_sum[c0:c1], col_wsum[c0:c1], c0 - r0)


def blocked_grads(img, txt, scale, coef, aux, row_lse, col_lse, rows: int, cols: int, buf):
    """The op's CLIP backward (no smoothing: diag_value 2, offset 0; k = coef s / (2B) folded
    into P) over rows x cols blocks: the fused TMA gradient kernel writes each block's P into
    ``buf``, dI rows accumulate over the column blocks in an fp32 [rows, D] buffer, dT in an
    fp32 [B, D] sum once per row band. Returns (d_img, d_txt) in bf16 and d scale."""
    n, d = img.shape
    ref = aux[:n]
    d_img = torch.empty_like(img)
    acc_t = torch.zeros(n, d, device=img.device, dtype=torch.float32)
    acc_i = torch.empty(rows, d, device=img.device, dtype=torch.float32)
    dst = torch.empty((), device=img.device, dtype=torch.float32)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        acc = acc_i[: r1 - r0]
        for c0 in range(0, n, cols):
            c1 = min(n, c0 + cols)
            p = _view(buf, r1 - r0, c1 - c0)
            tri._fused(tri._clip_grad_fused_kernel, img[r0:r1], txt[c0:c1], "grad", False, scale,
                       coef, 1.0 / (2 * n), aux[n:], dst, row_lse[r0:r1], col_lse[c0:c1],
                       ref[r0:r1], c0 - r0, 2.0, 0.0, True, True, p=p)
            if c0 == 0:
                torch.mm(p, txt[c0:c1], out_dtype=torch.float32, out=acc)
            else:
                torch.addmm(acc, p, txt[c0:c1], out_dtype=torch.float32, out=acc)
            torch.addmm(acc_t[c0:c1], p.T, img[r0:r1], out_dtype=torch.float32, out=acc_t[c0:c1])
        d_img[r0:r1] = acc
    return d_img, acc_t.to(img.dtype), dst


def exact_rows(img, txt, scale, coef, aux, row_lse, col_lse, rows: int):
    """fp64 reference for the first ``rows`` rows of dI and of dT: the same bf16-rounded P the
    kernels write (fused kernel on a [rows, B] and a [B, rows] block), multiplied in fp64."""
    n = img.shape[0]
    ref = aux[:n]
    dst = torch.empty((), device=img.device, dtype=torch.float32)
    out = []
    for a, b, r_lse, c_lse, r_ref, other in ((img[:rows], txt, row_lse[:rows], col_lse, ref[:rows], txt),
                                            (img, txt[:rows], row_lse, col_lse[:rows], ref, img)):
        p = torch.empty(a.shape[0], b.shape[0], device=img.device, dtype=img.dtype)
        tri._fused(tri._clip_grad_fused_kernel, a, b, "grad", False, scale, coef, 1.0 / (2 * n),
                   aux[n:], dst, r_lse, c_lse, r_ref, 0, 2.0, 0.0, True, True, p=p)
        out.append(p.double() @ other.double() if a.shape[0] == rows else p.double().T @ other.double())
    return out


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def run_size(b: int, d: int, reps: int, emit, forward: bool = True) -> None:
    img, txt, scale, row_shift, col_shift, ref, sums = inputs(b, d)
    shifts = (row_shift, ref, col_shift, ref)
    aux = torch.cat([ref, torch.zeros(2, device="cuda")])
    coef = torch.ones(1, device="cuda")

    def op_stats():
        sums.zero_()
        tri.clip_stats_triton(img, txt, scale, row_shift, col_shift, ref, ref, 0, out=sums)

    op_stats()
    want = sums.clone()
    loss, row_lse, col_lse = tri.clip_epilogue_triton(scale, sums, row_shift, col_shift, aux)
    emit(b, "op_stats", None, timed(op_stats, reps), 0.0)
    buf = torch.empty(max(r * c for r, c in FORWARD_BLOCKS + BACKWARD_BLOCKS), device="cuda",
                      dtype=img.dtype)
    for rows, cols in FORWARD_BLOCKS if forward else []:
        if rows > b or cols > b:
            continue

        def run():
            sums.zero_()
            blocked_stats(img, txt, scale, shifts, sums, rows, cols, buf)

        run()
        emit(b, "blocked_stats", (rows, cols), timed(run, reps), _err(sums, want))
    for rows, cols in [(16384, 16384), (32768, 32768), (8192, 65536)] if forward else []:
        if rows > b or cols > b:
            continue

        def run_fused():
            sums.zero_()
            blocked_fused_stats(img, txt, scale, shifts, sums, rows, cols)

        run_fused()
        emit(b, "blocked_fused_stats", (rows, cols), timed(run_fused, reps), _err(sums, want))

    def op_grads():
        return tri.clip_grads_triton(img, txt, scale, row_lse, col_lse, ref, diag_value=2.0,
                                     coef=coef, coef_mul=1 / (2 * b), coef_scale=True,
                                     dscale_from=aux, dscale_index=b, out_dtype=img.dtype)

    want_i, want_t, _ = op_grads()
    exact_i, exact_t = exact_rows(img, txt, scale, coef, aux, row_lse, col_lse, 512)

    def exact_err(got_i, got_t) -> float:
        """max |error| / max |exact| over the reference rows of dI and dT."""
        return max(_err(got_i[:512], exact_i), _err(got_t[:512], exact_t))

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    emit(b, "op_grads", None, timed(op_grads, reps), exact_err(want_i, want_t),
         (torch.cuda.max_memory_allocated() - base) / 2**20)
    for rows, cols in BACKWARD_BLOCKS:
        if rows > b or cols > b:
            continue
        if rows * cols > buf.numel():
            continue
        run = lambda: blocked_grads(img, txt, scale, coef, aux, row_lse, col_lse, rows, cols, buf)  # noqa: E731
        got_i, got_t, _ = run()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = timed(run, reps)
        # peak above the inputs: the block buffer (rows x cols) counts as the op's own
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 + rows * cols * 2 / 2**20
        emit(b, "blocked_grads", (rows, cols), ms, exact_err(got_i, got_t), peak)
        del got_i, got_t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32768,65536")
    p.add_argument("--no-forward", action="store_true", help="the backward only")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="bench/results/blocked_loss.jsonl")
    args = p.parse_args(argv)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, dim=args.dim,
                date=time.strftime("%Y-%m-%d"))

    def emit(b, what, blocks, ms, err, peak_mib=None):
        row = dict(meta, B=b, what=what, blocks=list(blocks) if blocks else None,
                   ms=round(ms, 3), max_rel_err=err, peak_mib=peak_mib)
        mem = f"  peak {peak_mib:7.1f} MiB" if peak_mib is not None else ""
        print(f"B={b:<7} {what:<20} {str(blocks or ''):<16} {ms:9.3f} ms  err {err:.2e}{mem}",
              flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    for b in [int(x) for x in args.sizes.split(",") if x]:
        run_size(b, args.dim, args.reps, emit, not args.no_forward)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
