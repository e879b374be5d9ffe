"""Registers, spill stack and shared memory of the op's fused kernels, compiled for a GPU that
need not be there: Triton compiles to a cubin with its own ptxas and cuobjdump reads the
resources back. A spill stack above a few dozen bytes means the epilogue no longer fits in the
registers beside the accumulator tile. Runs on a CPU-only machine (CUDA target, default sm_90):

    python bench/bench_kernel_resources.py                  # the tiles the op uses now
    python bench/bench_kernel_resources.py --tiles "128,64,64,8,8,4"   # other tiles too
    python bench/bench_kernel_resources.py --match loss=True           # some variants only

(Run without TRITON_INTERPRET: the interpreter's kernels cannot be compiled.) tests/ops/
test_kernel_build.py runs it: a kernel that no longer compiles for the GPU fails on a CPU machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import infclip.ops.contrastive_loss_triton as tri  # noqa: E402
import infclip.ops.gluon_kernels as glk  # noqa: E402
import infclip.ops.tuning as tuning_mod  # noqa: E402
from infclip.ops.tuning import TUNING  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(kernel, types: dict, constexprs: dict, target, warps: int, stages: int) -> dict:
    """Compile ``kernel`` for ``target``; returns its REG / STACK (spills) / shared bytes."""
    sig = {name: "constexpr" if name in constexprs else types[name] for name in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs), target=target,
                              options=dict(num_warps=warps, num_stages=stages))
    return _cubin_resources(compiled)


def _gluon_compiled(kernel, dtype: str, blocks: dict, types: dict, constexprs: dict, target) -> dict:
    """A warp-specialised kernel of ops/gluon_kernels.py compiled for ``target`` as the op
    launches it (4 warps, 168 registers a thread): its TMA descriptor arguments ``blocks`` (name
    -> [rows, cols] of ``dtype``, "bf16" or "fp16"), the other arguments' ``types``; its REG /
    STACK / shared bytes."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    types = dict(types, **{name: f"tensordesc<{dtype}[{b[0]},{b[1]}],{glk._layout(*b, dt)!r}>"
                           for name, b in blocks.items()})
    sig = {name: "constexpr" if name in constexprs else types[name] for name in kernel.arg_names}
    source = GluonASTSource(kernel, sig, {(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=target, options=dict(num_warps=4, maxnreg=168))
    return _cubin_resources(compiled)


def gluon_resources(dtype: str, coef_scale: bool, dscale: int, target, plain: bool = False) -> dict:
    """ops/gluon_kernels.py's warp-specialised CLIP gradient kernel (its tiles, TMA descriptors
    of ``dtype`` "bf16" or "fp16"; ``plain``: with PLAIN, the blocks without positives, and
    GRAD_PLAIN_TILES) compiled for ``target``: its REG / STACK / shared bytes."""
    bm, bn, bk, stages = glk.GRAD_PLAIN_TILES if plain else glk.GRAD_TILES
    f32 = "*fp32"
    types = dict(M="i32", N="i32", D="i32", scale_ptr=f32, coef_ptr=f32, coef_mul="fp32", dscale_src=f32,
                 dscale_dst=f32, row_lse=f32, col_lse=f32, row_ref=f32, col_ref=f32, diag="i32",
                 diag_value="fp32", offset="fp32")
    return _gluon_compiled(glk._clip_grad_ws_kernel, dtype, dict(a_desc=[bm, bk], b_desc=[bn, bk], p_desc=[bm, bn]),
                           types, dict(COEF_SCALE=coef_scale, DSCALE=dscale, PLAIN=plain, STAGES=stages,
                                       PDL=int(TUNING.gluon_grad_pdl)), target)


def gluon_siglip_resources(dtype: str, coef_scale: bool, target, plain: bool = False) -> dict:
    """ops/gluon_kernels.py's warp-specialised SigLIP gradient kernel with the pair losses
    (GRAD_TILES, ``dtype`` descriptors; ``plain``: its epilogue of the blocks without positives)
    compiled for ``target``: its REG / STACK / shared bytes."""
    bm, bn, bk, stages = glk.GRAD_TILES
    f32 = "*fp32"
    types = dict(M="i32", N="i32", D="i32", scale_ptr=f32, bias_ptr=f32, coef_ptr=f32, gsum=f32, gwsum=f32,
                 row_loss=f32, diag="i32")
    return _gluon_compiled(glk._siglip_grad_ws_kernel, dtype, dict(a_desc=[bm, bk], b_desc=[bn, bk], p_desc=[bm, bn]),
                           types, dict(COEF_SCALE=coef_scale, PLAIN=plain, STAGES=stages, PDL=int(TUNING.gluon_grad_pdl)),
                           target)


def gluon_sums_resources(dtype: str, target, tiles=None) -> dict:
    """ops/gluon_kernels.py's warp-specialised CLIP forward sums (column strips; ``tiles`` as
    SUMS_TILES, default the op's) compiled for ``target``: its REG / STACK / shared bytes."""
    bm, bn, bk, stages, chunk = tiles or glk.SUMS_TILES
    itemsize = 2  # (bf16 or fp16)
    f32 = "*fp32"
    types = dict(M="i32", N="i32", D="i32", chunk="i32", rotate="i32", scale_ptr=f32, row_shift=f32, col_shift=f32,
                 row_sum=f32, col_sum=f32, diag="i32")
    constexprs = dict(STAGES=glk.sums_stages(glk.SUMS_MAX_DIM, itemsize, (bm, bn, bk, stages, chunk)),
                      KSTEPS=-(-glk.SUMS_MAX_DIM // bk))
    return _gluon_compiled(glk._clip_sums_ws_kernel, dtype, dict(a_desc=[bm, bk], b_desc=[bn, bk]), types,
                           constexprs, target)


def _cubin_resources(compiled) -> dict:
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    found = dict(re.findall(r"(REG|STACK):(\d+)", out))
    return dict(regs=int(found.get("REG", -1)), stack=int(found.get("STACK", -1)),
                shared=compiled.metadata.shared)


def _fused_types(tiles, tma: bool, store: bool, extra: dict, split: int = 1) -> dict:
    bm, bn, bk = tiles[:3]
    types = dict(A=f"tensordesc<bf16[{bm}, {bk}]>" if tma else "*bf16",
                 Bm=f"tensordesc<bf16[{bn}, {bk}]>" if tma else "*bf16",
                 stride_a="i32", stride_b="i32", M="i32", N="i32", D="i32", diag="i32",
                 P=f"tensordesc<bf16[{bm}, {bn // split}]>" if store else "*bf16", stride_p="i32")
    return dict(types, **extra)


def _fused_constexprs(tiles, tma: bool, **flags) -> dict:
    bm, bn, bk, group, _, _ = tiles[:6]
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, EVEN_K=True, PRECISION="tf32",
                TMA=tma, PROGRAMS=132, **flags)


def variants(siglip_grad_tiles: list, pointer_grad_tiles: list, clip_grad_tiles: list = ()):
    """(name, kernel, types, constexprs, tiles) of each kernel variant to compile. CLIP gradient
    tiles: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, programs per SM, SPLIT)."""
    f32 = "*fp32"
    clip = dict(scale_ptr=f32, coef_ptr=f32, coef_mul="fp32", dscale_src=f32, dscale_dst=f32,
                row_lse=f32, col_lse=f32, row_ref=f32, col_ref=f32, diag_value="fp32", offset="fp32")
    for tiles in clip_grad_tiles:
        split = tiles[7] if len(tiles) > 7 else 1
        for dscale in (1, 2):
            yield (f"clip_grad tma split={split} dscale={dscale}", tri._clip_grad_fused_kernel,
                   _fused_types(tiles, True, True, clip, split),
                   _fused_constexprs(tiles, True, COEF_SCALE=True, DSCALE=dscale, TMA_STORE=True,
                                     SPLIT=split), tiles)
    siglip = dict(scale_ptr=f32, bias_ptr=f32, coef_ptr=f32, gsum=f32, gwsum=f32, row_loss=f32)
    for tiles in siglip_grad_tiles:
        for store in (True, False):
            for loss in (False, True):
                yield (f"siglip_grad tma store={store} loss={loss}", tri._siglip_grad_fused_kernel,
                       _fused_types(tiles, True, store, siglip),
                       _fused_constexprs(tiles, True, COEF_SCALE=True, LOSS=loss, TMA_STORE=store), tiles)
    for tiles in pointer_grad_tiles:
        for loss in (False, True):
            yield (f"siglip_grad pointer loss={loss}", tri._siglip_grad_fused_kernel,
                   _fused_types(tiles, False, False, siglip),
                   _fused_constexprs(tiles, False, COEF_SCALE=True, LOSS=loss, TMA_STORE=False), tiles)
    stats = dict(scale_ptr=f32, bias_ptr=f32, row_loss=f32)
    tiles = TUNING.tma_siglip_stats
    yield ("siglip_stats tma", tri._siglip_stats_fused_kernel, _fused_types(tiles, True, False, stats),
           _fused_constexprs(tiles, True), tiles)
    # the CLIP shift launch with its true maxima of loose shifts (tl.dots over whole rows)
    tiles = shift_tiles()
    for dtype, precision in (("bf16", "tf32"), ("fp16", "tf32"), ("fp32", "ieee")):
        types = dict(scale_ptr=f32, ref=f32, norm_a=f32, norm_b=f32, part_max=f32, parts="i32",
                     row_shift=f32, col_shift=f32, M="i32", margin="fp32", limit="fp32",
                     A=f"*{dtype}", Bm=f"*{dtype}", stride_a="i32", stride_b="i32", D="i32",
                     slack="fp32")
        yield (f"clip_shift tighten {dtype}", tri._clip_shift_kernel, types,
               dict(BLOCK=tiles[0], PARTS=TUNING.vec, TIGHTEN=True, BLOCK_N=tiles[1],
                    BLOCK_K=tiles[2], PRECISION=precision), tiles)


def shift_tiles() -> tuple:
    """The CLIP shift launch's (BLOCK, BLOCK_N, BLOCK_K, -, warps, stages) on a GPU."""
    return (tuning_mod.SHIFT_M, tuning_mod.SHIFT_N, tuning_mod.SHIFT_N, 1, 4, 1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (Hopper)")
    p.add_argument("--tiles", action="append", default=[],
                   help="more TMA SigLIP gradient tiles: BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,stages")
    p.add_argument("--pointer-tiles", action="append", default=[],
                   help="more pointer (pre-Hopper, small block) SigLIP gradient tiles, same form")
    p.add_argument("--clip-tiles", action="append", default=[],
                   help="more TMA CLIP gradient tiles: BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,stages,programs,SPLIT")
    p.add_argument("--match", default="", help="only the variants whose name contains this")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled for a GPU")
    target = GPUTarget("cuda", args.arch, 32)
    grad_tiles = sorted({TUNING.tma_siglip_grad[:6], TUNING.tma_siglip_grad_loss[:6]}) + _parse_tiles(args.tiles)
    pointer_tiles = (sorted({TUNING.fused_grad[:6], TUNING.fused_siglip_grad_loss[:6]})
                     + _parse_tiles(args.pointer_tiles))
    print("| kernel | tiles (M, N, K, group, warps, stages) | registers | spill stack (bytes) | shared (bytes) "
          "| the op's tiles |")
    print("|---|---|---|---|---|---|")
    clip_tiles = [TUNING.tma_grad] + _parse_tiles(args.clip_tiles)
    for name, kernel, types, constexprs, tiles in variants(grad_tiles, pointer_tiles, clip_tiles):
        if args.match not in name:
            continue
        r = resources(kernel, types, constexprs, target, tiles[4], tiles[5])
        ours = _same_tiles(name, tiles, op_tiles(name))
        print(f"| {name} | {tuple(tiles[:6])} | {r['regs']} | {r['stack']} | {r['shared']} | "
              f"{'yes' if ours else ''} |", flush=True)
    if glk.available():
        return
    for label, plain, tiles in (("gluon_clip_grad", False, glk.GRAD_TILES),
                                ("gluon_plain_clip_grad", True, glk.GRAD_PLAIN_TILES)):
        for dtype, coef_scale, dscale in (("bf16", True, 1), ("bf16", True, 2), ("fp16", False, 0)):
            name = f"{label} {dtype} coef_scale={coef_scale} dscale={dscale}"
            if args.match in name:
                r = gluon_resources(dtype, coef_scale, dscale, target, plain)
                print(f"| {name} | {tiles} | {r['regs']} | {r['stack']} | {r['shared']} | yes |", flush=True)
    for dtype, coef_scale, plain in (("bf16", True, False), ("fp16", False, False), ("bf16", True, True),
                                     ("fp16", False, True)):
        name = f"gluon_{'plain_' if plain else ''}siglip_grad {dtype} coef_scale={coef_scale}"
        if args.match in name:
            r = gluon_siglip_resources(dtype, coef_scale, target, plain)
            print(f"| {name} | {glk.GRAD_TILES} | {r['regs']} | {r['stack']} | {r['shared']} | yes |", flush=True)
    for dtype in ("bf16", "fp16"):
        name = f"gluon_clip_sums {dtype}"
        if args.match in name:
            r = gluon_sums_resources(dtype, target)
            print(f"| {name} D={glk.SUMS_MAX_DIM} | {glk.SUMS_TILES} | {r['regs']} | {r['stack']} | {r['shared']} | yes |", flush=True)


def _parse_tiles(given: list) -> list:
    """"128,64,64,8,8,4" strings as tuples of ints."""
    return [tuple(int(x) for x in t.split(",")) for t in given]


def _same_tiles(name: str, tiles, op) -> bool:
    """Whether ``tiles`` are the op's: the CLIP gradient's in full (SPLIT 1 when left out), the
    others by their first six entries."""
    if name.startswith("clip_grad"):
        full = lambda t: tuple(t) + (1,) * (8 - len(t))  # noqa: E731
        return full(tiles) == full(op)
    return tuple(tiles[:6]) == tuple(op[:6])


def op_tiles(name: str) -> tuple:
    """The tiles the op launches the variant ``name`` with on a Hopper GPU."""
    loss = "loss=True" in name
    if name.startswith("clip_shift"):
        return shift_tiles()
    if name.startswith("clip_grad"):
        return TUNING.tma_grad
    if "pointer" in name:
        return TUNING.fused_siglip_grad_loss if loss else TUNING.fused_grad
    if "stats" in name:
        return TUNING.tma_siglip_stats
    return TUNING.tma_siglip_grad_loss if loss else TUNING.tma_siglip_grad


if __name__ == "__main__":
    main()
