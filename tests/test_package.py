"""The package namespace: everything imports as infclip.*, nothing under a generic top-level name."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_infclip_gives_the_api_and_no_generic_top_level_modules():
    """A fresh interpreter imports the whole project (library, launchers' modules, the op) and
    ends with no ``ops``, ``pipeline`` or ``eval`` module of its own: a stray ``from ops import``
    would load a second copy of the op under another name (and register it twice)."""
    code = (
        "import sys, runpy\n"
        "import infclip, infclip.pipeline.train, infclip.eval, infclip.pipeline.scenes\n"
        "from infclip import contrastive_loss, ContrastiveLoss, CLIPTowers, load_config, train, export_hf\n"
        "assert contrastive_loss.__module__ == 'infclip.ops.contrastive_loss', contrastive_loss.__module__\n"
        "assert CLIPTowers.__module__ == 'infclip.pipeline.model'\n"
        "for launcher in ('pretrain', 'zeroshot', 'make_shards'):\n"
        "    runpy.run_path(f'launch/{launcher}.py', run_name='not_main')\n"
        "generic = sorted(m for m in sys.modules if m.split('.')[0] in ('ops', 'pipeline', 'eval'))\n"
        "assert not generic, generic\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
