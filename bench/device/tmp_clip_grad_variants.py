"""Device-only: where the Gluon CLIP gradient block's time over its MMA goes. The op's block at 32k / 65k
(bench/diag_gluon_grad.FirstBlock) by the Gluon kernel as is and by copies of ops/gluon_kernels.py with parts of the
CLIP consumer's epilogue cut: P not stored, the per-tile LSE / reference loads replaced by zeros, the accumulator stored
instead of P; each with the d-scale sum (DSCALE 2, the op's at these sizes) and without (DSCALE 0), GPU time by replay."""
import importlib.util, os, sys, tempfile
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from infclip.ops import gluon_kernels
from diag_gluon_grad import graph_timed, FirstBlock

SRC = open(gluon_kernels.__file__).read()
STORE = "            c_buf.store((p * coef_p).to(p_desc.dtype))\n"
TMA_STORE = "            _tma_store(p_desc, [off_m, off_n], c_buf)  # (the copy engine clips at the bounds)\n"
LOADS = [("gl.load(row_lse + offs_m, mask=mask_m, other=0.0)", "(offs_m * 0).to(gl.float32)"),
         ("gl.load(col_lse + offs_n, mask=mask_n, other=0.0)", "(offs_n * 0).to(gl.float32)"),
         ("gl.load(row_ref + offs_m, mask=mask_m, other=0.0)", "(offs_m * 0).to(gl.float32)"),
         ("gl.load(col_ref + offs_n, mask=mask_n, other=0.0)", "(offs_n * 0).to(gl.float32)")]
EDITS = {
    "no_store": [(STORE, ""), (TMA_STORE + "        tma.store_wait(pendings=0)\n        if DSCALE == 2:",
                               "        tma.store_wait(pendings=0)\n        if DSCALE == 2:")],
    "no_loads": LOADS,
    "store_acc": [(STORE, "            c_buf.store((acc * coef_p).to(p_desc.dtype))\n")],
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
    mods = {"as is": gluon_kernels}
    for name in EDITS:
        try:
            mods[name] = variant(name)
        except Exception as exc:
            print("variant", name, "failed:", exc)
    print(f"# {torch.cuda.get_device_name()}")
    for size in (32768, 65536):
        blk = FirstBlock(size, 768)
        p = blk.out()

        def emit(label, ms):
            print(f"B={size:<7} {blk.rows}x{blk.cols} {label:<34} {ms:7.3f} ms {blk.gflop / ms:6.0f} TFLOP/s", flush=True)

        emit("cublas_gemm_bf16", graph_timed(lambda: torch.mm(blk.a, blk.b.T, out=p), 7))
        for dscale in (2, 0):
            for name, mod in mods.items():
                def call():
                    mod.clip_grad_block(blk.a, blk.b, p, *blk.args, blk.scratch, *blk.vectors, True, dscale, blk.sms)
                try:
                    emit(f"gluon {name} dscale={dscale}", graph_timed(call, 7))
                except Exception as exc:
                    print("failed", name, dscale, type(exc).__name__, str(exc)[:300], flush=True)


main()
