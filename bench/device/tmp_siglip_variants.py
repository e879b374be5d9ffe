"""Device-only: the SigLIP gradient block at the op's block shape (32k / 65k) by cuBLAS's GEMM, the
Triton kernel (with / without the pair losses), the Gluon CLIP block and the Gluon SigLIP block with
its epilogue in other orders (copies of ops/gluon_kernels.py with the epilogue replaced), GPU time by graph replay.
As run by h200_gb and h200_gc (h200_ga: with CUTS, lines removed, instead of BODIES), on the kernel of that day, which
still had a LOSS flag (siglip_grad_block(..., coef_scale, loss, sm_count)); the committed kernel always takes the pair
losses, so this file runs against commit ... only."""
import importlib.util, os, sys, tempfile
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import gluon_kernels
from diag_gluon_grad import graph_timed, FirstBlock

SRC = open(gluon_kernels.__file__).read()
HEAD = "            y = acc * scale + bias\n"
TAIL = '            gl.atomic_add(gwsum + offs_m, gl.sum(g * acc, axis=1), mask=mask_m, sem="relaxed")\n'
G_STORE = '''            g = gl.where(inside, gl.where(is_pos, -sig, sig), 0.0)  # -z sig
            tma.store_wait(pendings=0)  # this consumer's previous tile has left its buffer
            c_buf.store((g * coef).to(p_desc.dtype))
            fence_async_shared()
            _tma_store(p_desc, [off_m, off_n], c_buf)  # (the copy engine clips at the bounds)
'''
SIG = '''            y = acc * scale + bias
            t = gl.where(is_pos, -y, y)  # -z y (a sign flip: bit for bit the Triton kernel's product)
            if LOSS:
                e = gl.exp(-gl.abs(t))
                r = 1.0 / (1.0 + e)
                sig = gl.where(t >= 0.0, r, e * r)
            else:
                sig = 1.0 / (1.0 + gl.exp(-t))
'''
LOSS_SUM = '''                sp = gl.maximum(t, 0.0) + _log1p_unit(e)
                sp_sum = gl.sum(gl.where(inside, sp, 0.0) + acc * 0.0, axis=1) + nan_sb
                gl.atomic_add(row_loss + offs_m, sp_sum, mask=mask_m, sem="relaxed")
'''
BODIES = {
    "sp_after_store": SIG + G_STORE + "            if LOSS:\n" + LOSS_SUM
    + '            gl.atomic_add(gsum + offs_m, gl.sum(g, axis=1), mask=mask_m, sem="relaxed")\n' + TAIL,
    "recompute": SIG + '''            g = gl.where(inside, gl.where(is_pos, -sig, sig), 0.0)  # -z sig
            g_sum = gl.sum(g, axis=1)
            gw_sum = gl.sum(g * acc, axis=1)
            tma.store_wait(pendings=0)  # this consumer's previous tile has left its buffer
            c_buf.store((g * coef).to(p_desc.dtype))
            fence_async_shared()
            _tma_store(p_desc, [off_m, off_n], c_buf)  # (the copy engine clips at the bounds)
            if LOSS:
                y = acc * scale + bias
                t = gl.where(is_pos, -y, y)
                e = gl.exp(-gl.abs(t))
''' + LOSS_SUM + '''            gl.atomic_add(gsum + offs_m, g_sum, mask=mask_m, sem="relaxed")
            gl.atomic_add(gwsum + offs_m, gw_sum, mask=mask_m, sem="relaxed")
''',
    "recompute_late_sums": SIG + G_STORE + '''            if LOSS:
                y = acc * scale + bias
                t = gl.where(is_pos, -y, y)
                e = gl.exp(-gl.abs(t))
''' + LOSS_SUM + '            gl.atomic_add(gsum + offs_m, gl.sum(g, axis=1), mask=mask_m, sem="relaxed")\n' + TAIL,
}


def apply(src: str, name: str) -> str:
    i = src.index(HEAD, src.index("def _siglip_consumer("))
    j = src.index(TAIL, i) + len(TAIL)
    return src[:i] + BODIES[name] + src[j:]




def variant(name):
    src = apply(SRC, name)
    path = os.path.join(tempfile.mkdtemp(), f"glk_{name}.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"glk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    mods = {"as is": gluon_kernels}
    for name in BODIES:
        try:
            mods[name] = variant(name)
        except Exception as exc:
            print("variant", name, "failed:", exc)
    print(f"# {torch.cuda.get_device_name()}")
    for size in (32768, 65536):
        if size == 65536 and len(sys.argv) > 1:
            break
        blk = FirstBlock(size, 768)
        rows, cols = blk.rows, blk.cols
        a, b = blk.a, blk.b
        scale = torch.full((1,), 10.0, device="cuda")
        bias = torch.full((1,), -10.0, device="cuda")
        coef = torch.full((1,), 1.0 / size, device="cuda")
        sums = torch.zeros(3, rows, device="cuda")
        p = torch.empty(rows, cols, device="cuda", dtype=a.dtype)
        sms = tri._sm_count(a.device)

        def emit(label, ms):
            print(f"B={size:<7} {rows}x{cols} {label:<40} {ms:7.3f} ms {blk.gflop / ms:6.0f} TFLOP/s", flush=True)

        emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(a, b.T, out=p), 7))
        emit("clip gluon", graph_timed(lambda: blk.gluon(p), 7))
        for loss in (True, False):
            kind = "siglip_grad_loss" if loss else "siglip_grad"
            args = (scale, bias, coef, sums[1], sums[0], sums[2], 0, True, loss)
            emit(f"siglip triton loss={loss}", graph_timed(lambda: tri._fused(tri._siglip_grad_fused_kernel, a, b, kind, False, *args, p=p), 7))
            for name, mod in mods.items():
                if not loss and name != "as is":
                    continue
                try:
                    emit(f"siglip gluon {name} loss={loss}", graph_timed(lambda: mod.siglip_grad_block(a, b, p, *args, sms), 7))
                except Exception as exc:
                    print("failed", name, loss, type(exc).__name__, str(exc)[:300], flush=True)


main()
