"""Test programs started as two real processes (torch.distributed.run, gloo on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "LOCAL_WORLD_SIZE")


def run_two_ranks(args: list, timeout: float) -> subprocess.CompletedProcess:
    """``torch.distributed.run --standalone --nproc_per_node 2 *args`` from the repository root,
    with an enclosing launch's variables removed and one OpenMP thread a rank. Returns the
    finished process (output captured as text; its return code is the caller's to check)."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
