"""Device-only (h200_ft, deleted after): the Gluon sums kernel with parts of its epilogue cut, to
split its time between the MMA with its loads and the epilogue."""
import importlib.util, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import gluon_kernels
from bench_loss_kernels import inputs
from diag_gluon_grad import graph_timed

SRC = open(gluon_kernels.__file__).read()
ATOM = """        gl.atomic_add(row_sum + offs_m, gl.sum(gl.exp2(xs - gl.expand_dims(rs2, 1)), axis=1), mask=mask_m,
                      sem="relaxed")"""
VALID = """        xs = gl.where(valid, acc * scale2, float("-inf"))"""
RET = """        return q_acc + gl.exp2(xs - gl.expand_dims(cs2, 0))"""
assert ATOM in SRC and VALID in SRC and RET in SRC
VARIANTS = {
    "base": SRC,
    "no_row_atomics (row sums into q_acc)": SRC.replace(ATOM, "        q_acc = q_acc + gl.expand_dims(gl.sum(gl.exp2(xs - gl.expand_dims(rs2, 1)), axis=1), 1)"),
    "no_valid_select": SRC.replace(VALID, "        xs = acc * scale2"),
    "one_exp (q only, no row sums)": SRC.replace(ATOM, ""),
    "mma_only (q_acc += acc)": SRC.replace(ATOM, "").replace(VALID, "        xs = acc").replace(RET, "        return q_acc + xs"),
}
mods = {}
for i, (name, src) in enumerate(VARIANTS.items()):
    path = f"/tmp/glk_variant_{i}.py"
    open(path, "w").write(src.replace("from __future__ import annotations", "from __future__ import annotations", 1))
    spec = importlib.util.spec_from_file_location(f"glk_variant_{i}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mods[name] = mod
for size in (32768, 65536):
    img, txt, scale, row_shift, col_shift, _ref, _sums = inputs(size, 768)
    scale_t = scale.reshape(1)
    sms = tri._sm_count(img.device)
    gflop = 2 * size * size * 768 / 1e9
    rows, cols = torch.zeros(size, device="cuda"), torch.zeros(size, device="cuda")
    logits = torch.empty(size, size, device="cuda", dtype=img.dtype)
    ms = graph_timed(lambda: torch.mm(img, txt.T, out=logits), 7)
    print(f"B={size} cublas {ms:.3f} ms {gflop / ms:.0f} TFLOP/s", flush=True)
    for name, mod in mods.items():
        for tiles in ((64, 128, 64, 8, 64),):
            ms = graph_timed(lambda: mod.clip_sums(img, txt, scale_t, row_shift, col_shift, rows, cols, 0, sms, tiles), 7)
            print(f"B={size} {name:<40} {tiles} {ms:.3f} ms {gflop / ms:.0f} TFLOP/s", flush=True)
    pb = torch.empty(8192, 4096, device="cuda", dtype=img.dtype)
    one, zero = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")
    ms = graph_timed(lambda: gluon_kernels.clip_grad_block(img[:8192], txt[:4096], pb, scale_t, one, 1.0, one, zero,
                                                           row_shift, col_shift, row_shift, col_shift, 0, 2.0,
                                                           0.0, True, 2, sms), 7)
    print(f"B={size} gluon grad block 8192x4096 {ms:.3f} ms {2 * 8192 * 4096 * 768 / 1e9 / ms:.0f} TFLOP/s", flush=True)
