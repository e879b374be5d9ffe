"""Which CLIP gradient blocks the Gluon plain kernel takes (ops/gluon_kernels.plain_block): its
epilogue has no select for the positives and no masks for the bounds, so a block it takes must hold
no positive (i - j == diag) and only whole 128 x 128 tiles; any other block goes to the kernel with
both. Checked against the positives the block actually holds, on the CPU."""

import pytest
import torch

from infclip.ops import gluon_kernels


def _holds_a_positive(m: int, n: int, diag: int) -> bool:
    return bool(((torch.arange(m)[:, None] - torch.arange(n)[None, :]) == diag).any())


@pytest.mark.parametrize("m,n", [(256, 384), (128, 128), (384, 256)])
def test_plain_exactly_where_no_positive_lies_in_the_block(m, n):
    for diag in range(-n - 3, m + 4):
        assert gluon_kernels.plain_block(m, n, diag) == (not _holds_a_positive(m, n, diag)), diag


@pytest.mark.parametrize("m,n", [(250, 384), (256, 300), (3001, 2904)])
def test_partial_tiles_never_take_the_plain_kernel(m, n):
    assert not any(gluon_kernels.plain_block(m, n, diag) for diag in (-n - 100, -n, m, m + 100))


def test_the_switch_turns_it_off(monkeypatch):
    assert gluon_kernels.plain_block(256, 256, 1000)
    assert not gluon_kernels.plain_block(256, 256, 1000, plain=False)
    monkeypatch.setattr(gluon_kernels, "GRAD_PLAIN", False)
    assert not gluon_kernels.plain_block(256, 256, 1000)
    assert gluon_kernels.plain_block(256, 256, 1000, plain=True)
