"""Kernels compiled for sm_90 ahead of time, without a GPU, in a process without Triton's
interpreter (the test process runs kernels under it): what the interpreter cannot show. A construct
only the interpreter accepts fails to compile here, and registers spilled to local memory show in
the cubin's resource usage."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PRELUDE = """
import json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
_TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def usage(fn, signature, consts, warps):
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in consts}},
                    constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    cubin = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_TOOL, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return {k: int(v) for k, v in re.findall(r"(REG|LOCAL):(\\d+)", out)}


found = {}
"""


def sm90_usage(kernels: str) -> dict:
    """Run ``kernels`` (Python that fills ``found``: a name -> ``usage(fn, signature, consts,
    num_warps)``, the kernel's REG and LOCAL) in such a process; return ``found``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _PRELUDE + kernels + "\nprint(json.dumps(found))"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
