"""Device-only (h200_gl / gm: what P's store costs; gn: deeper wgmma queues, a plain-tile path). What P's store costs the Gluon CLIP gradient block. The op's first block at 32k / 65k
(bench/diag_gluon_grad.FirstBlock), the kernel as is and copies of ops/gluon_kernels.py: P stored into a hot
512 KB region (every row tile onto row block 0: the same bytes through shared memory and the TMA unit, no stream
of 32-64 MiB through L2 to HBM), P stored for every other tile only, P not stored; each alone and followed by the
op's two gradient GEMMs of the block (bf16 into fp32 sums, as _grad_bands), GPU time by replay."""
import importlib.util, os, sys, tempfile
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from infclip.ops import gluon_kernels
import infclip.ops.contrastive_loss_triton as tri
from diag_gluon_grad import graph_timed, FirstBlock
from bench_loss_kernels import inputs

SRC = open(gluon_kernels.__file__).read()
SLOW = '            mask_m = offs_m < M\n            mask_n = offs_n < N\n            r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634\n            c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634\n            rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)\n            pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag\n            t = gl.where(pos, gl.expand_dims(rr, 1), acc)\n            t2 = t * scale2\n            e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))\n            e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))\n            p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)\n            if DSCALE == 2:\n                cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)\n                inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)\n                w_acc += gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))\n                                         + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)\n            _store_tile(p_desc, c_buf, p * coef_p, off_m, off_n)\n'
FAST = '            mask_m = offs_m < M\n            mask_n = offs_n < N\n            r2 = gl.load(row_lse + offs_m, mask=mask_m, other=0.0) * 1.4426950408889634\n            d0 = off_m - off_n\n            plain = (off_m + BM <= M) & (off_n + BN <= N) & ((diag < d0 - BN + 1) | (diag > d0 + BM - 1))\n            if plain:  # no positive, no bound in the tile: the same arithmetic without the selects\n                c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634\n                rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)\n                t2 = acc * scale2\n                e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))\n                e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))\n                p = e_r + e_c - offset\n                if DSCALE == 2:\n                    cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)\n                    w_acc += gl.sum(e_r * (acc - gl.expand_dims(rr, 1)) + e_c * (acc - gl.expand_dims(cr, 0)), axis=1)\n                _store_tile(p_desc, c_buf, p * coef_p, off_m, off_n)\n            else:\n                c2 = gl.load(col_lse + offs_n, mask=mask_n, other=0.0) * 1.4426950408889634\n                rr = gl.load(row_ref + offs_m, mask=mask_m, other=0.0)\n                pos = (gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)) == diag\n                t = gl.where(pos, gl.expand_dims(rr, 1), acc)\n                t2 = t * scale2\n                e_r = gl.exp2(t2 - gl.expand_dims(r2, 1))\n                e_c = gl.exp2(t2 - gl.expand_dims(c2, 0))\n                p = e_r + e_c - (gl.where(pos, diag_value, 0.0) + offset)\n                if DSCALE == 2:\n                    cr = gl.load(col_ref + offs_n, mask=mask_n, other=0.0)\n                    inside = gl.expand_dims(mask_m, 1) & gl.expand_dims(mask_n, 0)\n                    w_acc += gl.sum(gl.where(inside, e_r * (t - gl.expand_dims(rr, 1))\n                                             + e_c * (t - gl.expand_dims(cr, 0)), 0.0), axis=1)\n                _store_tile(p_desc, c_buf, p * coef_p, off_m, off_n)\n'
Q1 = """            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
"""
Q2 = """            acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 2) % STAGES), pred=k > 1)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 2) % STAGES))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
"""
EDITS = {
    "q2": [(Q1, Q2)],
    "fast": [(SLOW, FAST)],
    "q2_fast": [(Q1, Q2), (SLOW, FAST)],
}


def variant(name):
    src = SRC
    for old, new in EDITS[name]:
        assert src.count(old) == 1, (name, old)
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"glk_{name}.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"glk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    import triton
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}, "
          f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB")
    mods = {"as is": gluon_kernels}
    for name in EDITS:
        try:
            mods[name] = variant(name)
        except Exception as exc:
            print("variant", name, "failed:", exc)
    for size in (32768, 65536):
        img, txt, scale, row_shift, col_shift, _ref, _sums = inputs(size, 768)
        rows, cols = torch.zeros(size, device="cuda"), torch.zeros(size, device="cuda")
        for name, mod in mods.items():
            if name in ("as is", "q2"):
                ms = graph_timed(lambda: mod.clip_sums(img, txt, scale.reshape(1), row_shift, col_shift, rows, cols, 0,
                                                       tri._sm_count(img.device)), 5, 3)
                print(f"B={size:<7} forward sums, whole B x B, {name:<10} {ms:7.3f} ms", flush=True)
        del img, txt
        blk = FirstBlock(size, 768)
        p = blk.out()
        acc_a = torch.zeros(blk.rows, 768, device="cuda")
        acc_b = torch.zeros(blk.cols, 768, device="cuda")

        def emit(label, ms):
            print(f"B={size:<7} {blk.rows}x{blk.cols} {label:<40} {ms:7.4f} ms", flush=True)

        def gemms():
            tri._addmm_(acc_a, p, blk.b)
            tri._addmm_(acc_b, p.T, blk.a)

        emit("cublas logits GEMM", graph_timed(lambda: torch.mm(blk.a, blk.b.T, out=p), 9))
        emit("the two gradient GEMMs", graph_timed(gemms, 9))
        for dscale in (2,):
            for name, mod in mods.items():
                def call():
                    mod.clip_grad_block(blk.a, blk.b, p, *blk.args, blk.scratch, *blk.vectors, True, dscale, blk.sms)

                def block():
                    call()
                    gemms()
                try:
                    emit(f"gluon {name} dscale={dscale}", graph_timed(call, 9))
                    emit(f"gluon {name} dscale={dscale} + GEMMs", graph_timed(block, 9))
                except Exception as exc:
                    print("failed", name, dscale, type(exc).__name__, str(exc)[:300], flush=True)


main()
