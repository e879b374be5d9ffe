"""The distributed loss over NCCL on two GPUs (pytest -m multigpu, on the device machine):
every scheme against one device on the whole batch, no host-device wait in a call, and an
uneven local batch as one clear error on both ranks (tests/ops/_nccl_worker.py)."""

from __future__ import annotations

import pytest
import torch

from tests._ranks import run_two_ranks

pytestmark = pytest.mark.multigpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_schemes_over_nccl_match_one_device_and_never_wait():
    done = run_two_ranks(["tests/ops/_nccl_worker.py"], timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: 0 failures" in done.stdout, out[-4000:]
