"""Tuning of the loss op: one typed object holding every knob of the kernels' dispatch, tiles and
memory rules, and of the assembly's and sweeps' schedules.

One role: settings. :data:`TUNING` is the process-wide :class:`Tuning`; the launchers
(ops/contrastive_loss_triton.py), the assembly (ops/assembly.py) and the sweeps (ops/sweeps.py)
read its fields at each call, so a change takes effect at the next call (a CUDA graph already
captured replays what it captured: ops/graphs.py). Tests and benchmarks change fields for a block
with :func:`tuning`, which restores them after::

    from infclip.ops.tuning import tuning

    with tuning(strips=False, fused_max_logits=0):
        loss = contrastive_loss(img, txt, scale, impl="triton")

The defaults are the fastest measured on an H200 (bf16, D = 768; bench/bench_loss_kernels.py,
bench/bench_contrastive_loss.py, bench/bench_blocked_loss.py); every default gives the same
numbers within the tolerances of tests/ops, so a knob changes speed and memory, never the math.
Under Triton's interpreter (CPU, :data:`INTERPRET`) the tiles are small: its cost grows with
the tile. Fixed tiles that are not knobs (the band passes', read by grids cached per shape)
are the module constants below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, Optional

import torch

__all__ = ["INTERPRET", "Tuning", "TUNING", "tuning"]

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's interpreter (CPU) runs the kernels: read once at import, as Triton reads it when it
defines the kernels (tests/conftest.py sets it before the first import of ops)."""


def _pick(interpreted, compiled):
    return interpreted if INTERPRET else compiled


# The band passes' tiles (BLOCK_M, BLOCK_N, warps), measured on an H200 over a 1536 x 65536 bf16
# band: rows 2.4 TB/s, columns 1.9 TB/s (one launch runs both, _clip_stats_kernel: the same number
# of warps); the gradient pass 3.5 TB/s (32 x 256 x 8 warps: 2.9).
STATS_M, STATS_N, STATS_WARPS = _pick((16, 16, 4), (32, 128, 4))  # row programs walk along 32 rows
COLS_M, COLS_N, COLS_WARPS = _pick((16, 16, 4), (32, 128, STATS_WARPS))  # columns: down 128
GRAD_M, GRAD_N, GRAD_WARPS = _pick((16, 16, 4), (16, 256, 4))
# The prologue's rows and feature columns a program.
PRO_M, PRO_D = _pick((16, 16), (32, 128))
# The shift kernel's rows (and columns) a program, and the tiles (BLOCK_N = BLOCK_K) of its true
# maxima (loose shifts only, _clip_shift_kernel), one stage: small, so that the rare work of a
# loose shift spreads over B / 32 programs and the kernel holds 96-152 registers a thread with
# no spill on sm_90 (64 x 64 tiles: 238-255 and a spill; bench/bench_kernel_resources.py); the
# common work is each program's read of the ``parts`` largest norms, ~32 MB of L2 at B = 65k.
SHIFT_M, SHIFT_N = _pick((16, 16), (32, 32))


def _gluon_default() -> bool:
    return os.environ.get("INFCLIP_GLUON", "1") != "0"


@dataclasses.dataclass(slots=True)
class Tuning:
    """The loss op's knobs. Tile tuples of the fused kernels: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    num_warps, num_stages), then for TMA kernels programs per SM (persistent programs), then the
    kind's extra meta-parameters (statistics: FAST; CLIP gradient: SPLIT). Sizes in logits are
    elements of the [m, n] block S (m rows times n columns)."""

    # ---- which kernels take a block ---------------------------------------------------------
    fused_max_logits: int = 1 << 28
    """Largest block (logits; 1 << 28 is 16,384^2) whose recompute path takes the fused pointer
    kernels (logit tile by tl.dot in registers); larger blocks go to cuBLAS bands and the Triton
    passes. H200 (op fwd + bwd): fused 1.16 / 1.25 / 1.93 / 4.42 ms at B = 1k / 4k / 8k / 16k
    against 1.66 / 1.80 / 2.19 / 4.86 (fewer launches), but 16.6 / 64.8 ms at 32k / 65k against
    14.9 / 56.8: tl.dot with K = 768 runs at ~290-330 TFLOP/s with the epilogue, cuBLAS at ~660."""

    tma_min_logits: int = 1 << 23
    """Smallest block (logits) whose fused kernels load by TMA tensor descriptors (Hopper and
    later, 16-bit features with 16-byte aligned rows): below, building the descriptors costs more
    host time than the kernel saves."""

    tma_max_logits: dict = dataclasses.field(
        default_factory=lambda: {"stats": 1 << 62, "siglip_stats": 1 << 62, "grad": 1 << 62})
    """Largest block (logits) a TMA kernel takes, per kind ("stats", "siglip_stats", "grad");
    above, cuBLAS bands and Triton passes. The CLIP statistics with the interior fast path took
    17.00 ms against 17.65 for cuBLAS + the passes at 65k; SigLIP's statistics and every
    gradient block are faster fused at every size."""

    tma_force: Optional[bool] = None
    """None: TMA loads by the device and the tensors; True: wherever the rows are aligned (the
    interpreter tests the TMA kernels this way, fp32 included); False: never."""

    strips: bool = True
    """Whether a CLIP forward whose backward sums d scale (one device, nothing kept) takes the
    plain sums by column strips (_clip_sums_strip_kernel, TMA loads) from
    ``strips_min_logits`` on; False: the per-tile statistics kernel with the weighted sums."""

    strips_min_logits: int = 1 << 27
    """Smallest block (logits; B = 11,585 square) whose statistics take the column strips: below,
    the per-tile kernel is as fast or faster end to end (H200, queued: 0.22 / 0.80 ms at B = 4k /
    8k against 0.24 / 0.81 with the strips; 16k-65k: 3.19 / 12.63 / 48.33 against 3.27 / 12.82 /
    50.33)."""

    strip_waves: int = 4
    """Work items a strip program takes at least (count): the strips' CHUNK of row blocks shrinks
    at small B so that every program gets this many."""

    shift_tighten: bool = True
    """Whether the one-device shift launch replaces shifts more than SHIFT_SLACK above their
    positive logit by the true row / column maxima. False only for a bench's A/B of the launch's
    cost: rows whose every logit lies far below the bound then lose their sums to underflow."""

    gluon_grad: bool = dataclasses.field(default_factory=_gluon_default)
    """Whether the CLIP gradient block goes to the warp-specialised Gluon kernel
    (ops/gluon_kernels.clip_grad_block) where it applies: sm_90, TMA loads and store, a Triton
    whose Gluon builds it. Default: on unless the environment sets INFCLIP_GLUON=0. A first launch
    that fails turns it off (with a warning) and the Triton kernel takes the block from then on."""

    gluon_siglip: bool = dataclasses.field(default_factory=_gluon_default)
    """The same for the SigLIP gradient block with its pair losses (a forward whose backward
    follows; gluon_kernels.siglip_grad_block); a failure turns off this switch only."""

    gluon_sums: bool = dataclasses.field(default_factory=_gluon_default)
    """The same for the CLIP forward's column-strip sums (gluon_kernels.clip_sums) where the
    strips apply on sm_90 with features of at most gluon_kernels.SUMS_MAX_DIM."""

    gluon_grad_tiles: Optional[tuple] = None
    """Tiles of the Gluon gradient kernels (CLIP and SigLIP); None: gluon_kernels.GRAD_TILES."""

    gluon_sums_tiles: Optional[tuple] = None
    """Tiles and chunk of the Gluon strip sums; None: gluon_kernels.SUMS_TILES."""

    gluon_sums_options: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments passed on to gluon_kernels.clip_sums (e.g. launch_logits, rotate: a
    bench's A/B); empty by default."""

    gluon_grad_plain: bool = True
    """Whether the Gluon gradient blocks with no positive in whole tiles (the op's off-diagonal
    blocks: 56 of 64 at B = 32k) take the epilogues without selects and masks (PLAIN; CLIP with
    whole 128 x 128 tiles, gluon_kernels.GRAD_PLAIN_TILES). On an H200 a 4,096 x 4,096 block at
    32k 0.049 against 0.054 ms (DSCALE 2), 0.042 against 0.050 (DSCALE 1); the op queued 20 ms,
    CLIP 10.57 / 41.27 / 171.6 / 698.0 against 10.92 / 42.37 / 176.4 / 711.4 ms at 32k / 65k /
    131k / 262k; SigLIP 9.46 / 35.65 / 143.1 / 581.7 against 9.78 / 36.88 / 147.7 / 594.9 ms."""

    gluon_grad_pdl: bool = True
    """Whether the Gluon gradient kernels launch with programmatic dependent launch: a block's
    programs start while the kernel before it (the previous block's cuBLAS GEMM) drains, set up
    their shared memory and barriers, then wait for it before their first load or store. On an
    H200, queued 20 ms: CLIP 2.90 / 11.22 / 43.59 against 2.95 / 11.52 / 43.59 ms at 16k / 32k /
    65k, SigLIP 2.54 / 9.84 against 2.58 / 10.05."""

    gluon_sums_launch_logits: int = 1 << 33
    """The most logits one launch of the Gluon strip sums takes (more: launches over slabs of A's
    rows; 0: one launch). On an H200 the kernel holds 566-590 TFLOP/s in launches of up to 2^33
    logits and falls to 473 / 438-447 in one launch of 2^35 / 2^36 (B = 196k / 262k)."""

    gluon_sums_rotate_items: int = 32
    """Items a program (count) up to which a launch of the Gluon strip sums has each program take
    its items' row tiles from its own offset on, not all programs the same tile at once: on an
    H200 560 -> 647 / 545 -> 608 / 545 -> 584 TFLOP/s at B = 16k / 24k / 32k (8-31 items a
    program); no change at 49k-65k (70-124), slower at 131k."""

    # ---- tiles ----------------------------------------------------------------------------------
    fused_stats: tuple = _pick((16, 16, 16, 2, 4, 1), (128, 64, 64, 8, 4, 4))
    """Tiles of the fused statistics kernels with pointer loads (CLIP and SigLIP): the fastest of
    bench/bench_loss_kernels.py's sweep at B = 16,384 on an H200."""

    fused_grad: tuple = _pick((16, 16, 16, 2, 4, 1), (128, 256, 64, 8, 8, 3))
    """Tiles of the fused gradient kernels with pointer loads (CLIP, and SigLIP without the pair
    losses)."""

    fused_siglip_grad_loss: tuple = _pick((16, 16, 16, 2, 4, 1), (128, 128, 64, 8, 8, 3))
    """Tiles of SigLIP's fused gradient kernel with the pair losses in its epilogue, pointer
    loads: with fused_grad's tiles it spills 4 KB a thread on sm_90 and took 0.045 / 0.065 ms at
    B = 1k / 2k on an H200, with these 0.025 / 0.027."""

    tma_stats: tuple = (128, 64, 64, 8, 4, 4, 2, 1)
    """Tiles of the CLIP statistics kernel with TMA loads; the eighth entry FAST turns on the
    interior-tile fast path (tiles inside the block and off the positives skip both masks):
    1.036 / 4.094 / 17.00 ms at 16k / 32k / 65k against 1.081 / 4.164 / 17.82 without."""

    tma_grad: tuple = (64, 128, 64, 8, 4, 4, 2, 2)
    """Tiles of the CLIP gradient kernel with TMA loads; the eighth entry SPLIT takes the epilogue
    in that many column slices (1, 2 or 4). 64 x 128 tiles (one warpgroup, wgmma N = 128), two
    programs per SM (one's epilogue beside the other's MMA) and two slices (188 registers a
    thread with the d-scale sum, no spill): 0.79 / 3.15 / 12.45 / 47.6 ms at 8k / 16k / 32k / 65k
    (the op, behind queued work) against 0.81 / 3.21 / 12.63 / 47.9 for 128 x 128 with 8 warps."""

    tma_siglip_stats: tuple = (256, 128, 64, 8, 8, 3, 1)
    """Tiles of SigLIP's statistics kernel with TMA loads (rows only reduced: larger tiles,
    8 warps): 0.887 / 14.0 ms at 16k / 65k against 1.06 / 15.4 for cuBLAS + the Triton pass."""

    tma_siglip_grad: tuple = (128, 128, 64, 8, 8, 4, 1)
    """Tiles of SigLIP's gradient kernel with TMA loads: 0.217 / 0.484 ms for the block at 16k /
    65k against 0.257 / 0.481 with the CLIP tiles."""

    tma_siglip_grad_loss: tuple = (128, 128, 64, 8, 8, 4, 1)
    """Tiles of SigLIP's gradient kernel with the pair losses, TMA loads: 0.240 / 0.590 ms at
    16k / 65k."""

    tma_strips: tuple = _pick((16, 16, 16, 4, 1, 1, 2), (128, 128, 64, 8, 4, 1, 32))
    """Tiles of the column-strip sums (_clip_sums_strip_kernel): BLOCK_M, BLOCK_N, BLOCK_K, warps,
    stages, programs per SM, CHUNK row blocks a work item: 13.70 ms at 65k on an H200."""

    vec: int = _pick(64, 1024)
    """Elements a program of the element-wise launches (shifts, fills, the gradients' scaling)."""

    epi: int = _pick(64, 2048)
    """Elements a step of the one-program epilogues (CLIP's loss terms, SigLIP's finish)."""

    # ---- memory rules ---------------------------------------------------------------------------
    band_factor: float = 2
    """Band budget of the forward's cuBLAS bands, in units of max(n d, 2^24) elements: each band
    buffer holds at most that many (O(B D) memory at any B)."""

    overlap: bool = False
    """Two band buffers, a band's Triton pass on a side stream beside the next band's GEMM: no
    gain at B = 16k-65k on an H200 (the GEMMs hold every SM), so off."""

    kept_bands_factor: int = 4
    """Forward bands a backward reading the kept 16-bit bands takes at a time: each band's
    P^T @ A adds into the fp32 [B, D] sum of dT once a band (H200, 32k / 65k: 11.3 -> 10.1 /
    42.2 -> 38.7 ms from 1 to 4, the band buffer 0.3 / 0.56 GiB larger)."""

    grad_block: tuple = (8192, 4096)
    """(rows, columns) of the backward's recompute blocks where the whole block does not fit the
    band budget: blocks of 8,192 rows re-read grad_b's fp32 [B, D] sum 5x less often than
    full-width bands (9.32 / 37.14 ms at 32k / 65k against 9.69 / 39.98). A block and its fp32 row
    sum never take more than a full-width band (_grad_block)."""

    grad_blocks: tuple = ((4096, 4096),)
    """Smaller blocks tried in turn where grad_block does not fit the backward's budget
    (``grad_factor``): the op's peak at 16k / 32k is 116 / 193 MiB (against 136 / 233 MiB) for
    1-2% more time."""

    grad_factor: float = 1.5
    """The backward's budget for a block and its fp32 row sum, in units of max(w d, 2^24)
    elements of the features' dtype (2 would be a full-width band's bytes, as band_rows)."""

    grad_factor_min_n: int = 12288
    """Columns from which ``grad_factor`` and ``grad_blocks`` apply; below, the factor is
    ``band_factor`` and only ``grad_block`` is tried (else full-width bands): at 8k 4,096 x 4,096
    blocks took 0.86 ms against 0.80 with 4,096-row bands."""

    grad_blocks_wide: tuple = ((16384, 8192), (8192, 8192))
    """Larger blocks, tried first where the backward casts its fp32 [N, D] sum of grad_b to the
    features' dtype at the end (a one-device call with 16-bit outputs): the cast's N D of the
    dtype covers them, so the call's peak stays where the cast puts it (CLIP 182 against 188 ms
    at 131k, 742 against 772 at 262k)."""

    bands_min_logits: int = 16384 * 16384
    """Kept bands (ops/assembly.keep_logits) only above this many logits: below, the fused
    recompute kernels are as fast (an H200 at B = 4,096: 1.04 ms recomputing, 1.13 ms kept)."""

    bands_dtypes: tuple = (torch.bfloat16,)
    """The features' dtypes whose logits may be kept as bands in that dtype: not fp16, whose band
    logits would overflow at |I_i . T_j| > 65,504 (bf16 has fp32's range)."""

    # ---- schedules (ops/assembly.py, ops/sweeps.py) -----------------------------------------------
    siglip_grads_in_forward: bool = True
    """Whether SigLIP's forward takes the gradients too when a backward follows (one sweep, not
    two); False: the statistics sweep, then the gradient sweep in the backward
    (bench_contrastive_loss.py --siglip-two-pass times both)."""

    sweeps_sum_dscale: bool = True
    """Whether the distributed sweeps' forwards take the plain sums and the gradient blocks sum
    d loss / d s (as one device does); False: the forwards take the weighted sums, as the
    gathered-rows sweep does (bench/bench_rank_compute.py times both)."""

    sweep_blocks_global: bool = True
    """Whether a sweep's gradient steps size their recompute blocks by the memory budget of the
    global batch (as disco's one step over all B columns does) rather than of the column block in
    hand: at b = 16,384 a rank then takes 8,192 x 4,096 blocks, not 4,096 x 4,096."""

    disco_pipelined: bool = True
    """disco's schedule: True, a step per column block, each block's column partials reduced to
    their owner (an asynchronous reduce) while the next block is computed; False, one step on all
    B columns between a blocking all-gather and a blocking reduce-scatter (the same sums up to
    their order; bench_distributed.py --schemes disco disco_one_step times both)."""

    reduces_in_flight: int = 2
    """Column partials of other owners kept alive while their reduce runs (count, per own block:
    the memory bound of the pipelined disco schedule)."""


TUNING = Tuning()
"""The process-wide settings every launch reads."""


@contextlib.contextmanager
def tuning(**changes) -> Iterator[Tuning]:
    """Sets fields of :data:`TUNING` for a block and restores them after (an unknown field is a
    TypeError naming it). Yields TUNING."""
    fields = {f.name for f in dataclasses.fields(Tuning)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise TypeError(f"tuning: no such field {', '.join(unknown)}; fields: {sorted(fields)}")
    saved = {name: getattr(TUNING, name) for name in changes}
    try:
        for name, value in changes.items():
            setattr(TUNING, name, value)
        yield TUNING
    finally:
        for name, value in saved.items():
            setattr(TUNING, name, value)
