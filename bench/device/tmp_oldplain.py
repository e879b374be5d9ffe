"""Device-only (deleted in the commit after the one that adds it): bench_contrastive_loss.py with one more
launch in ops/gluon_kernels.py, ``clip_grad_block_old``: clip_grad_block from a copy of the module whose
plain epilogue sums the d-scale terms as before (e_r (S' - rr) + e_c (S' - cr) a logit), so that
``--variant "oldplain:_GLUON={... 'launch': 'clip_grad_block_old'}"`` times it against today's in one process.

    python bench/device/tmp_oldplain.py [bench_contrastive_loss.py's arguments]
"""

import importlib.util
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
NEW = """            w = (gl.sum((e_r + e_c) * acc, axis=1) - gl.sum(e_c * gl.expand_dims(cr, 0), axis=1)
                 - rr * gl.sum(e_r, axis=1))"""
OLD = """            w = gl.sum(e_r * (acc - gl.expand_dims(rr, 1)) + e_c * (acc - gl.expand_dims(cr, 0)), axis=1)"""

src = open(os.path.join(ROOT, "ops", "gluon_kernels.py")).read()
assert src.count(NEW) == 1, "the plain epilogue's d-scale sums moved"
os.makedirs("/tmp/glk_old", exist_ok=True)
with open("/tmp/glk_old/glk_old.py", "w") as f:
    f.write(src.replace(NEW, OLD))
spec = importlib.util.spec_from_file_location("glk_old", "/tmp/glk_old/glk_old.py")
old = importlib.util.module_from_spec(spec)
sys.modules["glk_old"] = old
spec.loader.exec_module(old)

from infclip.ops import gluon_kernels  # noqa: E402

gluon_kernels.clip_grad_block_old = old.clip_grad_block
sys.argv = [os.path.join(ROOT, "bench", "bench_contrastive_loss.py")] + sys.argv[1:]
sys.path.insert(0, os.path.join(ROOT, "bench"))
runpy.run_path(sys.argv[0], run_name="__main__")
