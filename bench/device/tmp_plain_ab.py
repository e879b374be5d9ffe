"""Device-only (deleted in the commit after the one that adds it): the op's plain epilogues against what they
replace, in one process. It loads a copy of ops/gluon_kernels.py as ``glk_old`` with (a) the CLIP plain
kernel's d-scale terms in one sum, as before (e_r (S' - rr) + e_c (S' - cr) a logit), and (b) the forward
sums' items all taking the epilogue with the select, and adds their launches to ops/gluon_kernels.py as
``clip_grad_block_old`` and ``clip_sums_old`` (for bench_contrastive_loss.py's --variant).

    python bench/device/tmp_plain_ab.py bench [bench_contrastive_loss.py's arguments]
    python bench/device/tmp_plain_ab.py sums [diag_gluon_sums.py's arguments]   # today's sums, then glk_old's

(h200_jb / h200_jc ran an earlier form, tmp_oldplain.py, against a regrouped sum, (e_r + e_c) S' - e_c cr -
e_r rr, not kept: it spilled 256 bytes under Triton 3.9.)
"""

import importlib.util
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
SWAPS = [("""            w = (gl.sum(e_r * (acc - gl.expand_dims(rr, 1)), axis=1)
                 + gl.sum(e_c * (acc - gl.expand_dims(cr, 0)), axis=1))""",
          """            w = gl.sum(e_r * (acc - gl.expand_dims(rr, 1)) + e_c * (acc - gl.expand_dims(cr, 0)), axis=1)"""),
         ("""            plain = ((hi * BM <= off_n + diag) | (lo * BM >= off_n + diag + BN)) & (hi * BM <= M) & (off_n + BN <= N)""",
          """            plain = off_n < 0"""),
         ]

src = open(os.path.join(ROOT, "ops", "gluon_kernels.py")).read()
for new, old_text in SWAPS:
    assert src.count(new) == 1, f"not found: {new}"
    src = src.replace(new, old_text)
os.makedirs("/tmp/glk_old", exist_ok=True)
with open("/tmp/glk_old/glk_old.py", "w") as f:
    f.write(src)
spec = importlib.util.spec_from_file_location("glk_old", "/tmp/glk_old/glk_old.py")
old = importlib.util.module_from_spec(spec)
sys.modules["glk_old"] = old
spec.loader.exec_module(old)

from infclip.ops import gluon_kernels  # noqa: E402

gluon_kernels.clip_grad_block_old = old.clip_grad_block
gluon_kernels.clip_sums_old = old.clip_sums
mode, args = sys.argv[1], sys.argv[2:]
if mode == "bench":
    sys.argv = [os.path.join(ROOT, "bench", "bench_contrastive_loss.py")] + args
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    import diag_gluon_sums

    print("# today's sums (plain items)", flush=True)
    diag_gluon_sums.main(args)
    print("# glk_old's sums (every item with the select)", flush=True)
    gluon_kernels.clip_sums = old.clip_sums
    diag_gluon_sums.main(args)
