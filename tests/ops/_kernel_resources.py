"""Runs bench/bench_kernel_resources.py for several ``--match`` values in one process (one
start-up of torch and Triton for all of them), for tests/ops/test_kernel_build.py.

    python tests/ops/_kernel_resources.py OUT.json MATCH [MATCH ...]

writes ``{match: {"stdout": the table printed, "error": a traceback or ""}}``; each match runs as
``bench_kernel_resources.py --arch 90 --match MATCH`` would, and a failure in one is recorded
without stopping the others. The file is rewritten after each match, so that a crash of the
process (the compiler runs in it) leaves the matches done before it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(out: str, matches: list) -> None:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_kernel_resources as bench

    results = {}
    for match in matches:
        buf = io.StringIO()
        error = ""
        try:
            with contextlib.redirect_stdout(buf):
                bench.main(["--arch", "90", "--match", match])
        except BaseException:  # SystemExit too: the parent reports it for this match
            error = traceback.format_exc()
        results[match] = {"stdout": buf.getvalue(), "error": error}
        with open(out + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
